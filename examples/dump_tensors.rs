//! Dumps the intermediate tensors of one forward pass by llama.cpp's names, for comparing a
//! model's forward pass with llama.cpp's tensor by tensor (`bench/tensors-vs-llama-cpp`).
//!
//! Run: `cargo run --release --example dump_tensors -- MODEL.gguf OUTDIR ID...`
//! Each tensor is written as `OUTDIR/NAME.bin`: four little-endian i64 dimensions (width,
//! tokens, 1, 1), then the f32 rows.
use conductor::runtime::exec::{Driver, InlineDriver, Serial, Session};
use conductor::runtime::model::Model;
use conductor::runtime::plan::ExecutionPlan;
use conductor::runtime::quant::Kernels;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: dump_tensors MODEL.gguf OUTDIR ID...";
    let model = PathBuf::from(args.next().ok_or(usage)?);
    let out = PathBuf::from(args.next().ok_or(usage)?);
    let ids: Vec<u32> = args.map(|a| a.parse()).collect::<Result<_, _>>()?;
    std::fs::create_dir_all(&out)?;
    let model = Arc::new(Model::load(&model)?);
    let mut driver = InlineDriver::new(
        Arc::clone(&model),
        &ExecutionPlan::default(),
        Kernels::best(),
        Serial,
    )?;
    let dir = out.clone();
    driver.set_probe(Some(Box::new(
        move |name: &str, rows: &[f32], width: usize| {
            let path = dir.join(format!("{name}.bin"));
            let write = || -> std::io::Result<()> {
                let mut f = std::fs::File::create(&path)?;
                for d in [width, rows.len() / width.max(1), 1, 1] {
                    f.write_all(&(d as i64).to_le_bytes())?;
                }
                for v in rows {
                    f.write_all(&v.to_le_bytes())?;
                }
                Ok(())
            };
            if let Err(e) = write() {
                eprintln!("{}: {e}", path.display());
            }
        },
    )));
    let mut session = Session::new(&model, ids.len().max(1));
    let logits = driver.eval_last(&mut session, &ids)?;
    let mut f = std::fs::File::create(out.join("result_output.bin"))?;
    for d in [logits.len(), 1, 1, 1] {
        f.write_all(&(d as i64).to_le_bytes())?;
    }
    for v in logits {
        f.write_all(&v.to_le_bytes())?;
    }
    Ok(())
}

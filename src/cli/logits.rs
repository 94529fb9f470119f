//! `conductor logits` (hidden, for bench/logits-vs-llama-cpp): evaluates token ids in one
//! teacher-forced pass and writes every position's logits, as `bench/llama-logits --all`
//! writes llama.cpp's.

use super::{DriverArg, ModelArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

#[derive(Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Token ids, comma-separated, evaluated as they are (no BOS is added).
    #[arg(long = "ids", value_delimiter = ',', required = true)]
    ids: Vec<u32>,
    /// Where the logits go: f32 little endian, `[position][n_vocab]`.
    #[arg(short = 'o', long = "dump-logits")]
    out: PathBuf,
    /// Also write the intermediate tensors (llama.cpp's callback names: attn_norm-0, Qcur-0,
    /// ...) in `bench/llama-logits --tensors`'s format: u32 name length, name, u32 element
    /// count, f32 elements. Runs the inline driver.
    #[arg(long = "tensors")]
    tensors: Option<PathBuf>,
}

/// One record of the `--tensors` format.
fn put_record(out: &mut Vec<u8>, name: &str, data: &[f32]) {
    out.extend_from_slice(&(name.len() as u32).to_le_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    for v in data {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

pub fn run(args: LogitsArgs) -> Result<()> {
    let mut model_args = args.model.clone();
    if model_args.engine.context.is_none() {
        model_args.engine.context = Some(args.ids.len());
    }
    if args.tensors.is_some() {
        model_args.engine.driver = DriverArg::Inline;
    }
    let mut engine = model_args.load(model_args.threads())?;
    let n_vocab = engine.model().config().n_vocab as usize;
    if let Some(bad) = args.ids.iter().find(|&&t| t as usize >= n_vocab) {
        bail!("token id {bad} is outside the model's vocabulary ({n_vocab})");
    }
    let records = Arc::new(Mutex::new(Vec::new()));
    let mut session = engine.session(Some(args.ids.len()))?;
    let mut bytes = Vec::with_capacity(args.ids.len() * n_vocab * 4);
    let mut next = 0;
    let mut on_logits = |start: usize, rows: &[f32]| {
        assert_eq!(start, next, "logits come in position order");
        next += rows.len() / n_vocab;
        for v in rows {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
    };
    if args.tensors.is_some() {
        let sink = Arc::clone(&records);
        let probe = Box::new(move |name: &str, rows: &[f32], _| {
            put_record(&mut sink.lock().expect("probe sink"), name, rows);
        });
        engine.eval_probed(&mut session, &args.ids, 0, &mut on_logits, probe)?;
    } else {
        engine.eval(&mut session, &args.ids, 0, &mut on_logits)?;
    }
    if next != args.ids.len() {
        bail!("logits of {next} of {} positions", args.ids.len());
    }
    let write = |path: &PathBuf, data: &[u8]| -> Result<()> {
        let mut f = std::fs::File::create(path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        f.write_all(data)
            .with_context(|| format!("cannot write {}", path.display()))
    };
    write(&args.out, &bytes)?;
    if let Some(path) = &args.tensors {
        let data = std::mem::take(&mut *records.lock().expect("probe sink"));
        write(path, &data)?;
    }
    Ok(())
}

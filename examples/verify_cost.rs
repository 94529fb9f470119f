//! What checking every read of a neuron store costs: CRC-32 (crc32fast) bytes/s on this CPU,
//! and the store's read path (`BundleFile::load` of every unit: bundles, attention matrices,
//! output rows) with `--verify first` against `--verify always`, through the page cache and
//! with `O_DIRECT`. Prints figures; asserts nothing.
//!
//! `cargo run --release --example verify_cost [STORE] [PASSES]` (default: the default model,
//! converted into `$TMPDIR/conductor-verify-cost/`).

use conductor::runtime::cache::{unit_extents, BundleFile, UnitMap};
use conductor::runtime::convert::{convert, ConvertOptions};
use conductor::runtime::model::{Model, WeightSource};
use conductor::runtime::plan::{ExecutionPlan, Verify};
use std::path::PathBuf;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let passes: usize = args.get(1).map_or(Ok(5), |p| p.parse())?;
    let store = match args.first() {
        Some(p) => PathBuf::from(p),
        None => {
            let dir = std::env::temp_dir().join("conductor-verify-cost");
            std::fs::create_dir_all(&dir)?;
            let store = dir.join("default.store.gguf");
            if !store.exists() {
                let src = conductor::fetch::ensure_default_model(&mut |l| eprintln!("{l}"))?;
                convert(&src, &store, &ConvertOptions::default(), &mut |_, _| {})?;
            }
            store
        }
    };

    let buf: Vec<u8> = (0..64u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let started = Instant::now();
    let mut x = 0;
    for _ in 0..10 {
        x ^= crc32fast::hash(std::hint::black_box(&buf));
    }
    let crc_gbs = 10.0 * buf.len() as f64 / started.elapsed().as_secs_f64() / 1e9;
    println!("crc32fast: {crc_gbs:.2} GB/s on 64 MiB ({x:08x})");

    let model = Model::open(&store, WeightSource::STREAMED)?;
    let layout = &model.store().ok_or("not a neuron store")?.layout;
    let output_rows = 1024;
    let map = UnitMap {
        n_layer: model.config().n_layer,
        ffn_clusters: layout.n_bundles,
        output_clusters: model.config().n_vocab.div_ceil(output_rows),
        attn_units: 4,
    };
    let extents = unit_extents(&model, &map, output_rows);
    let longest = extents.iter().map(|e| e.len).max().unwrap_or(0);
    let mut raw = vec![0u8; longest + 4096];
    let at = raw.as_ptr().align_offset(4096);
    let slot = &mut raw[at..at + longest];
    let units: Vec<(u32, u32)> = (0..map.n_layer)
        .flat_map(|l| (0..map.layer_units()).map(move |c| (l, c)))
        .chain((0..map.output_clusters).map(|c| (map.n_layer, c)))
        .collect();
    println!(
        "{}: {} units, {:.1} MiB a pass",
        store.display(),
        units.len(),
        extents.iter().map(|e| e.len).sum::<usize>() as f64 / (1 << 20) as f64
    );
    for direct in [false, true] {
        for verify in [Verify::First, Verify::Always] {
            let mut storage = ExecutionPlan::default().storage;
            storage.direct_io = direct;
            storage.verify = verify;
            let file = BundleFile::open_with(&store, &model, &map, extents.clone(), &storage)?
                .ok_or("not a neuron store")?;
            // One pass to warm the page cache and check every unit once (`first`'s state).
            for &(l, c) in &units {
                file.load(l, c, slot)?;
            }
            let mut best = f64::MAX;
            for _ in 0..passes {
                let started = Instant::now();
                for &(l, c) in &units {
                    file.load(l, c, slot)?;
                }
                best = best.min(started.elapsed().as_secs_f64());
            }
            let bytes: u64 = units.iter().map(|&(l, c)| file.read_bytes(l, c)).sum();
            println!(
                "{:<12} verify {:<6}: best of {passes} passes {:.1} ms, {:.2} GB/s",
                if direct { "O_DIRECT" } else { "page cache" },
                verify.name(),
                best * 1e3,
                bytes as f64 / best / 1e9
            );
        }
    }
    Ok(())
}

//! `conductor convert`: a model in, a neuron store out (see `docs/formats.md`).

use anyhow::{Context, Result};
use clap::Args;
use conductor::runtime::convert::{convert, ConvertOptions};
use conductor::runtime::quant::GgmlType;
use conductor::runtime::store::{DownLayout, DEFAULT_BUNDLE_NEURONS, DEFAULT_DOWN_TYPE};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct ConvertArgs {
    /// The GGUF model to convert (default: SmolLM2-135M-Instruct Q4_1, fetched on first use).
    #[arg(short = 'm', long = "model")]
    model: Option<PathBuf>,
    /// Where to write the neuron store (never over an existing file without --force).
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Neurons per bundle: one FFN cluster, one read (with --down-layout block-columns, a
    /// multiple of the down projection's block size).
    #[arg(long = "bundle-neurons", default_value_t = DEFAULT_BUNDLE_NEURONS)]
    bundle_neurons: u32,
    /// How bundles hold the down projection: `neuron-columns` (each neuron's down column,
    /// transposed and re-quantized once to --down-type; what sparse decode reads),
    /// `block-columns` (the source's quant blocks bit for bit: exact and fewer bytes, but no
    /// neuron-level sparsity in the down projection), or `auto`: block-columns for models whose
    /// decode is dense by default (all but ReLU's) where the blocks fit the bundle, else
    /// neuron-columns.
    #[arg(long = "down-layout", value_enum, default_value_t = DownLayoutArg::Auto)]
    down_layout: DownLayoutArg,
    /// Type of the re-quantized down columns: q8_0 (default), q4_1, q4_0, f16, f32.
    #[arg(long = "down-type", value_parser = super::parse_down_type, default_value_t = DEFAULT_DOWN_TYPE)]
    down_type: GgmlType,
    /// Keep block-columns bundles in the source's row layout instead of interleaving their
    /// Q4_K and Q6_K parts 8 rows by 8 (the layout decode's kernels read fastest; the same
    /// bytes and the same results, in another order).
    #[arg(long = "no-interleave")]
    no_interleave: bool,
    /// Replace the output file if it exists.
    #[arg(long = "force")]
    force: bool,
}

/// How bundles hold the down projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum DownLayoutArg {
    Auto,
    NeuronColumns,
    BlockColumns,
}

pub fn run(args: ConvertArgs) -> Result<()> {
    let source = conductor::fetch::resolve_model(args.model.as_deref(), &mut |s| eprintln!("{s}"))?;
    std::fs::metadata(&source)
        .with_context(|| format!("cannot read model file {}", source.display()))?;
    let started = Instant::now();
    let mut last_pct = u64::MAX;
    // A bar redrawn in place on a terminal; a line per quarter in a log.
    let step = if std::io::stderr().is_terminal() {
        1
    } else {
        25
    };
    let mut progress = |done: u64, total: u64| {
        let pct = done * 100 / total.max(1) / step * step;
        if pct != last_pct {
            last_pct = pct;
            let filled = (pct / 4) as usize;
            let (start, end) = if step == 1 { ("\r", "") } else { ("", "\n") };
            eprint!(
                "{start}convert: [{}{}] {pct:3}% {:.1}/{:.1} MiB{end}",
                "#".repeat(filled),
                " ".repeat(25 - filled),
                done as f64 / (1 << 20) as f64,
                total as f64 / (1 << 20) as f64
            );
            let _ = end;
            let _ = std::io::stderr().flush();
        }
    };
    let options = ConvertOptions {
        bundle_neurons: args.bundle_neurons,
        down_layout: match args.down_layout {
            DownLayoutArg::Auto => None,
            DownLayoutArg::NeuronColumns => Some(DownLayout::NeuronColumns),
            DownLayoutArg::BlockColumns => Some(DownLayout::BlockColumns),
        },
        down_type: args.down_type,
        interleave: !args.no_interleave,
        overwrite: args.force,
    };
    let summary = convert(&source, &args.output, &options, &mut progress)
        .with_context(|| format!("converting {}", source.display()))?;
    if std::io::stderr().is_terminal() {
        eprintln!();
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let l = &summary.layout;
    let mut down_types: Vec<String> = summary.down_types.iter().map(|t| t.to_string()).collect();
    down_types.sort();
    down_types.dedup();
    eprintln!(
        "convert: wrote {} in {:.1} s: resident {:.1} MiB, bundles {:.1} MiB ({} per layer of {} neurons, {} bytes each with padding; down as {} of {}{}), source crc32 {:08x}",
        args.output.display(),
        started.elapsed().as_secs_f64(),
        mib(summary.resident_bytes),
        mib(summary.bundle_bytes),
        l.n_bundles,
        l.neurons,
        l.stride,
        l.down_layout.name(),
        down_types.join(" and "),
        if l.interleaved {
            "; Q4_K and Q6_K parts interleaved 8 rows by 8"
        } else {
            ""
        },
        summary.source_crc32
    );
    Ok(())
}

//! `conductor profile-hw`: measures this machine's hardware profile (TOML), the input of the
//! simulator and the planner. The measuring is `conductor_planner::hardware::measure`; this
//! file adds the detected topology, the measured messaging costs and the output.

use anyhow::{Context, Result};
use clap::Args;
use conductor::apply_budget;
use conductor::runtime::cache::{unit_extents, MemoryBudget};
use conductor::runtime::gguf::GgufFile;
use conductor::runtime::model::{Model, WeightSource};
use conductor::runtime::plan::ExecutionPlan;
use conductor::runtime::schedule::Scheduler;
use conductor_planner::hardware::{check_options, measure, MeasureOptions};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct ProfileHwArgs {
    /// Write the profile to this file (default: print the TOML to stdout).
    #[arg(short = 'o', long = "out")]
    pub out: Option<PathBuf>,
    /// Fewer repetitions and smaller buffers: seconds instead of about a minute, noisier.
    #[arg(long)]
    pub quick: bool,
    /// Directory for the storage test file, written and removed (default: the temp directory).
    #[arg(long = "storage-dir")]
    pub storage_dir: Option<PathBuf>,
    /// Size of the storage test file in MiB (default: 1024, or 64 with --quick).
    #[arg(long = "storage-mb")]
    pub storage_mb: Option<u64>,
    /// Measure storage by reading this existing file (never written), e.g. the neuron store a
    /// run will read: the device and placement it actually comes from.
    #[arg(long = "storage-file", conflicts_with_all = ["storage_dir", "storage_mb", "no_storage"])]
    pub storage_file: Option<PathBuf>,
    /// With --storage-file: how many distinct buffers the replay of a run's reads lands in
    /// (default: as many as the cache has slots at 50% of the store). 1: one per thread.
    #[arg(long = "replay-buffers", requires = "storage_file")]
    pub replay_buffers: Option<usize>,
    /// Do not measure storage (the profile then holds placeholder storage figures, and says so).
    #[arg(long = "no-storage")]
    pub no_storage: bool,
}

/// The reads a decode of the neuron store at `path` issues, `(offset, length)` in its order,
/// under the smallest of 25%, 50% and 100% of the file that the engine fits (32 tokens of
/// context, so that the KV cache leaves the most to stream): the budget where the most units
/// stream, attention and output projection included when it streams them. With them, how many
/// slots the cache reads into: the most of that budget and 50% (a run's bytes land in its
/// cache's slots, and how many there are changes what a virtual disk gives). Empty and 0 for a
/// file that is not a neuron store.
fn store_reads(path: &Path) -> Result<(Vec<(u64, usize)>, usize)> {
    let is_store = GgufFile::open(path)
        .map(|f| f.tensors().iter().any(|t| t.name.ends_with(".ffn_bundles")))
        .unwrap_or(false);
    if !is_store {
        return Ok((Vec::new(), 0));
    }
    let load = |attention| {
        Model::open(
            path,
            WeightSource::Resident {
                stream_output: true,
                stream_attention: attention,
            },
        )
        .with_context(|| format!("cannot load the neuron store {}", path.display()))
    };
    let model = load(false)?;
    let slots_at = |percent: f64| {
        let mut plan = ExecutionPlan::default();
        apply_budget(&model, &mut plan, MemoryBudget::PercentOfModel(percent), 32)
            .map(|split| split.plan.slots as usize)
            .unwrap_or(0)
    };
    for percent in [25.0, 50.0, 100.0] {
        let mut plan = ExecutionPlan::default();
        let Ok(split) = apply_budget(&model, &mut plan, MemoryBudget::PercentOfModel(percent), 32)
        else {
            continue;
        };
        let slots = (split.plan.slots as usize).max(slots_at(50.0));
        let model = load(split.plan.stream_attention)?;
        let scheduler = Scheduler::new(&model.shape(), &plan)?;
        let Some(map) = scheduler.unit_map() else {
            continue;
        };
        let reads = unit_extents(&model, map, plan.decode.output_rows)
            .iter()
            .map(|e| (e.offset, e.len))
            .collect();
        return Ok((reads, slots));
    }
    Ok((Vec::new(), 0))
}

pub fn run(args: ProfileHwArgs) -> Result<()> {
    let default_mb = if args.quick { 64 } else { 1024 };
    let (storage_reads, storage_replay_buffers) = match &args.storage_file {
        Some(path) if !args.no_storage => store_reads(path)?,
        _ => (Vec::new(), 0),
    };
    let storage_replay_buffers = args.replay_buffers.unwrap_or(storage_replay_buffers);
    let opts = MeasureOptions {
        quick: args.quick,
        storage_dir: args.storage_dir.unwrap_or_else(std::env::temp_dir),
        storage_file_bytes: args
            .storage_mb
            .unwrap_or(default_mb)
            .saturating_mul(1 << 20),
        skip_storage: args.no_storage,
        storage_file: args.storage_file,
        storage_reads,
        storage_replay_buffers,
    };
    // Before the messaging measurement: a bad --storage-dir fails at once.
    check_options(&opts).context("profile-hw")?;
    let topology = conductor::actors::detect_topology();
    eprintln!("profile-hw: measuring messaging costs");
    let messaging = conductor::actors::measure_messaging();
    let mut profile = measure(&opts, &topology, messaging, &mut |line| eprintln!("{line}"))
        .context("profile-hw")?;
    // How decode's phases scale with threads, measured on the worker pool the engine uses.
    let cores: Vec<u32> = topology.cores.iter().map(|(id, _)| *id).collect();
    let (bytes, reps) = if args.quick {
        (32 << 20, 1)
    } else {
        (128 << 20, 5)
    };
    profile.memory.stream_scaling = conductor::actors::measure_decode_scaling(&cores, bytes, reps);
    eprintln!(
        "memory: decode FFN phases on 1..{} worker threads: {:?} x one",
        cores.len(),
        profile
            .memory
            .stream_scaling
            .iter()
            .map(|v| (v * 100.0).round() / 100.0)
            .collect::<Vec<_>>()
    );
    profile.description.push_str(
        " Memory stream_scaling: decode's FFN phases (a streamed SmolLM2-shaped layer in 12 \
         clusters) on the engine's worker pool with 1..N pinned threads, against one.",
    );
    let text = format!(
        "# Hardware profile of this machine, {}.\n# Regenerate with `conductor profile-hw{}`.\n\n{}",
        profile.source,
        if args.quick { " --quick" } else { "" },
        profile.to_toml()
    );
    match &args.out {
        Some(path) => {
            std::fs::write(path, &text)
                .with_context(|| format!("cannot write the profile to {}", path.display()))?;
            eprintln!("profile-hw: wrote {}", path.display());
        }
        None => print!("{text}"),
    }
    Ok(())
}

//! `conductor plan`: the offline planner. Scores candidate execution plans for a model on a
//! hardware profile with the simulator and writes the fastest that meets the user's limits.
//!
//! ```text
//! conductor plan -m STORE.gguf --profile profiles/build-machine.toml --memory 50% -o plan.json
//! conductor plan -m STORE.gguf --profile P --min-speed 8 -o plan.json   # smallest memory for 8 tok/s
//! conductor plan --shape llama-2-7b --profile profiles/oneplus-12.toml --memory 2GiB -o p.json
//! ```
//!
//! The search is `conductor_planner::search`; this file loads the inputs, draws the progress
//! and prints the explanation. Nothing is written when no plan meets the limits.

use super::parse_list;
use anyhow::{bail, Context, Result};
use clap::Args;
use conductor::fetch;
use conductor::runtime::cache::{MemoryBudget, StoreSizes};
use conductor::runtime::model::FfnActivation;
use conductor::runtime::model::{Model, WeightSource};
use conductor::runtime::plan::{HardwareProfile, ModelDescription, ModelIdentity, SparsityPlan};
use conductor::runtime::resolve::ModelFacts;
use conductor::runtime::sparse::operating::OperatingPoint;
use conductor::runtime::sparse::profile::ModelProfile;
use conductor::runtime::sparse::{SparseFfn, SparsityMode};
use conductor::{DEFAULT_SPARSE_DOWN_TYPE, DEFAULT_SPARSITY};
use conductor_planner::search::{
    activity_from_profile, hot_units_from_profile, planned_store_sizes, search, smallest_memory,
    Limits, PlanOutcome, PlanRequest,
};
use conductor_simulator::{named_shape, NAMED_SHAPES};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args)]
pub struct PlanArgs {
    /// Model or neuron store to plan for (default: the default model).
    #[arg(short = 'm', long = "model", conflicts_with = "shape")]
    model: Option<PathBuf>,
    /// A named model shape instead of a file (e.g. llama-2-7b).
    #[arg(long = "shape")]
    shape: Option<String>,
    /// Hardware profile (TOML, as `conductor profile-hw` writes; phones in profiles/).
    #[arg(long = "profile")]
    profile: PathBuf,
    /// Memory budget the plan must fit: bytes (48MiB) or a share of the model file (50%).
    #[arg(long = "memory", conflicts_with = "min_speed")]
    memory: Option<MemoryBudget>,
    /// Decode tokens per second the plan must reach: the planner returns the smallest memory
    /// budget at which some plan does (needs a neuron store or a shape).
    #[arg(long = "min-speed")]
    min_speed: Option<f64>,
    /// Cores the plan may use: class names (big,mid) or core ids (0,1,2), comma-separated
    /// (default: every core of the profile).
    #[arg(long = "cores")]
    cores: Option<String>,
    /// Compute threads of each group (default: one per core).
    #[arg(short = 't', long = "threads")]
    threads: Option<u32>,
    /// Context the budget reserves KV cache for (as `run -c`).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 1024)]
    ctx_size: u32,
    /// Neurons per bundle of the store to plan for, when the model is not a store yet.
    #[arg(long = "bundle-neurons")]
    bundle_neurons: Option<u32>,
    /// Sparse decode the plan carries and is scored with: `threshold` or `predictor` need the
    /// model's activation profile (`conductor profile`); its neuron frequencies drive the
    /// simulated steps and rank the hot segment's bundles. Under --memory with `threshold`,
    /// gate-first reads (`run --gate-first`) are candidates too.
    #[arg(long = "sparsity", value_parser = super::sparsity_mode(), default_value = "dense")]
    sparsity: SparsityMode,
    /// Target share of FFN neurons skipped (default 30% for SwiGLU models, 0 = the natural
    /// zeros for ReLU models).
    #[arg(long = "target-sparsity", value_parser = super::parse_share)]
    target_sparsity: Option<f32>,
    /// With --sparsity predictor: the recall the predictors' cut is calibrated for (one the
    /// profile tabulates, as `run --predictor-recall`; default: the trained cut).
    #[arg(long = "predictor-recall", value_parser = super::parse_share)]
    predictor_recall: Option<f32>,
    /// Activation profile (default: MODEL.profile beside the model, or beside a store's
    /// source).
    #[arg(long = "sparse-profile")]
    sparse_profile: Option<PathBuf>,
    /// Print every candidate's prediction.
    #[arg(long = "candidates")]
    candidates: bool,
    /// Where to write the plan: JSON, TOML (.toml) or bincode (.bin).
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
}

pub fn run(args: PlanArgs) -> Result<()> {
    let started = Instant::now();
    let mut profile = HardwareProfile::from_file(&args.profile)?;
    if let Some(cores) = &args.cores {
        restrict_cores(&mut profile, cores)?;
    }
    if args.threads == Some(0) {
        bail!("-t must be at least 1");
    }
    let loaded = load_model(&args)?;
    let source = loaded.source.clone();
    let needs_store = args.memory.is_some() || args.min_speed.is_some();
    let (model, store) = match (loaded.store, needs_store) {
        (Some(s), _) => (loaded.model, Some(s)),
        (None, true) => {
            let (planned, sizes) = planned_store_sizes(&loaded.model, args.bundle_neurons)
                .map_err(|e| anyhow::anyhow!("cannot plan a neuron store for {source}: {e}"))?;
            if args.shape.is_none() {
                eprintln!(
                    "plan: {source} is not a neuron store; planning for the store `conductor convert{}` makes of it (run that first)",
                    args.bundle_neurons
                        .map(|n| format!(" --bundle-neurons {n}"))
                        .unwrap_or_default()
                );
            }
            (planned, Some(sizes))
        }
        (None, false) => (loaded.model, None),
    };
    let mut request = PlanRequest::new(model, profile);
    request.store = store;
    request.identity = loaded.identity;
    request.threads = args.threads;
    request.n_ctx = args.ctx_size.max(1);
    request.limits = Limits {
        memory: args.memory.map(|m| m.bytes(loaded.file_bytes)),
        min_speed: args.min_speed,
    };
    if let Some(sparse) = loaded.sparse {
        let steps = request.warm_tokens + request.measured_tokens;
        let target = sparse.plan.target.unwrap_or(DEFAULT_SPARSITY);
        request.activity = Some(activity_from_profile(&sparse.profile, target, steps));
        if request.store.is_some() {
            request.hot_units =
                hot_units_from_profile(&sparse.profile, target, request.model.shape.ffn_bundle);
        }
        request.sparsity = Some(sparse.plan);
    }
    let outcome = if args.min_speed.is_some() && request.store.is_some() {
        eprintln!("plan: searching for the smallest memory that reaches the speed");
        smallest_memory(&request, &mut |budget, speed| {
            eprintln!(
                "plan:   {:8.1} MiB -> {}",
                budget as f64 / (1 << 20) as f64,
                speed.map_or("no plan".into(), |s| format!("{s:.2} tokens/s"))
            )
        })?
    } else {
        let mut bar = progress_bar();
        search(&request, &mut bar)?
    };
    report(&outcome, &args, &source, started);
    outcome
        .plan
        .to_file(&args.output)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    println!("plan written to {}", args.output.display());
    Ok(())
}

/// The model as the planner needs it.
struct Loaded {
    model: ModelDescription,
    /// Its store's sizes, when it is a store (sparse decode's resident part included).
    store: Option<StoreSizes>,
    identity: Option<ModelIdentity>,
    /// The file's size: what `--memory 50%` is a share of.
    file_bytes: u64,
    /// A name for messages.
    source: String,
    sparse: Option<Sparse>,
}

/// Sparse decode as planned: the profile and what the plan records.
struct Sparse {
    profile: ModelProfile,
    plan: SparsityPlan,
}

fn load_model(args: &PlanArgs) -> Result<Loaded> {
    if let Some(name) = &args.shape {
        let model = named_shape(name).with_context(|| {
            format!(
                "unknown model shape `{name}` (known: {})",
                NAMED_SHAPES.join(", ")
            )
        })?;
        if args.sparsity.is_sparse() {
            bail!("--sparsity needs a model file with an activation profile, not a shape");
        }
        let file_bytes = model.dense_weight_bytes();
        return Ok(Loaded {
            model,
            store: None,
            identity: None,
            file_bytes,
            source: format!("shape {name}"),
            sparse: None,
        });
    }
    let path = fetch::resolve_model(args.model.as_deref(), &mut |line| eprintln!("{line}"))?;
    std::fs::metadata(&path)
        .with_context(|| format!("cannot read model file {}", path.display()))?;
    let model = Model::open(&path, WeightSource::Mapped)
        .with_context(|| format!("cannot load {}", path.display()))?;
    let (sparse, ffn) = match args.sparsity.is_sparse() {
        false => (None, None),
        true => {
            let (sparse, ffn) = load_sparse(args, &path, &model, args.sparsity)?;
            (Some(sparse), Some(ffn))
        }
    };
    // A store's sizes with the sparse decode's tables among its resident weights, as the
    // engine's budget counts them.
    let facts = ModelFacts::of(&model, ffn.as_ref())?;
    Ok(Loaded {
        model: model.description(),
        store: facts.store,
        identity: Some(facts.identity),
        file_bytes: model.file().file_len(),
        source: path.display().to_string(),
        sparse,
    })
}

/// The activation profile for `--sparsity`, and the sparse decode it gives `model` (whose
/// resident bytes then count against a budget, as the engine counts them).
fn load_sparse(
    args: &PlanArgs,
    path: &Path,
    model: &Model,
    mode: SparsityMode,
) -> Result<(Sparse, SparseFfn)> {
    let beside = ModelProfile::default_path(path);
    let profile_path = args.sparse_profile.clone().unwrap_or_else(|| {
        match model.store() {
            // A store shares its source's identity: the source's profile serves.
            Some(store) if !beside.exists() => {
                ModelProfile::default_path(&path.with_file_name(&store.source_name))
            }
            _ => beside.clone(),
        }
    });
    let identity = ModelIdentity::of(model);
    let profile = ModelProfile::load(&profile_path, &identity).with_context(|| {
        format!(
            "--sparsity needs the model's activation profile (`conductor profile -m {}`)",
            path.display()
        )
    })?;
    let relu = model.config().activation == FfnActivation::Relu;
    let target = args
        .target_sparsity
        .unwrap_or(if relu { 0.0 } else { DEFAULT_SPARSITY });
    let thresholds = match mode.gate_threshold() {
        true => (0..profile.layers.len())
            .map(|l| profile.threshold(l, target))
            .collect::<Result<Vec<f32>, _>>()?,
        false => Vec::new(),
    };
    let point = OperatingPoint {
        mode,
        sparsity: target,
        predictor_recall: args.predictor_recall,
    };
    let ffn = SparseFfn::build_at(model, &profile, &point, DEFAULT_SPARSE_DOWN_TYPE, true)?;
    let sparse = Sparse {
        profile,
        plan: SparsityPlan {
            mode,
            target: Some(target),
            predictor_recall: args.predictor_recall,
            thresholds,
        },
    };
    Ok((sparse, ffn))
}

/// Keeps only the cores `spec` names: class names, or core ids.
fn restrict_cores(profile: &mut HardwareProfile, spec: &str) -> Result<()> {
    let known: Vec<String> = profile
        .core_classes
        .iter()
        .map(|c| c.name.clone())
        .collect();
    if let Ok(ids) = parse_list(spec) {
        let ids: Vec<u32> = ids.0.iter().map(|&i| i as u32).collect();
        for class in &mut profile.core_classes {
            class.cores.retain(|c| ids.contains(c));
        }
        for id in &ids {
            if !profile.core_classes.iter().any(|c| c.cores.contains(id)) {
                bail!("--cores: core {id} is not in the profile");
            }
        }
    } else {
        let names: Vec<&str> = spec.split(',').map(str::trim).collect();
        for n in &names {
            if !known.iter().any(|k| k == n) {
                bail!(
                    "--cores: no core class `{n}` in the profile (classes: {})",
                    known.join(", ")
                );
            }
        }
        profile
            .core_classes
            .retain(|c| names.contains(&c.name.as_str()));
    }
    profile.core_classes.retain(|c| !c.cores.is_empty());
    if profile.core_classes.is_empty() {
        bail!("--cores {spec} leaves no core");
    }
    Ok(())
}

/// A bar redrawn in place on a terminal, a line per quarter in a log.
fn progress_bar() -> impl FnMut(usize, usize) {
    let terminal = std::io::stderr().is_terminal();
    let mut last = usize::MAX;
    move |done, total| {
        let pct = done * 100 / total.max(1);
        let step = if terminal { 1 } else { 25 };
        if pct / step == last / step && last != usize::MAX {
            return;
        }
        last = pct;
        let filled = pct / 4;
        let (start, end) = if terminal && done < total {
            ("\r", "")
        } else if terminal {
            ("\r", "\n")
        } else {
            ("", "\n")
        };
        eprint!(
            "{start}plan: [{}{}] {pct:3}% {done}/{total} candidates{end}",
            "#".repeat(filled),
            " ".repeat(25 - filled)
        );
        let _ = std::io::stderr().flush();
    }
}

fn report(outcome: &PlanOutcome, args: &PlanArgs, source: &str, started: Instant) {
    let p = outcome
        .plan
        .predicted
        .as_ref()
        .expect("the search fills the prediction");
    println!("plan for {source} on {}:", p.profile);
    if let Some(split) = &outcome.chosen.split {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        println!(
            "  memory: {:.1} MiB = resident weights {:.1} + KV {:.1} + scratch {:.1} + runtime {:.1} + neuron cache {:.1} ({} slots, {} hot)",
            mib(split.budget),
            mib(split.resident_weights),
            mib(split.kv_cache),
            mib(split.scratch),
            mib(split.runtime_overhead),
            mib(split.cache),
            split.plan.slots,
            split.plan.hot_slots
        );
    }
    println!(
        "  predicted: {:.2} tokens/s decode, {}-limited",
        p.decode_tok_s, p.limited_by
    );
    println!("  why: {}", p.reason);
    if args.candidates {
        println!("  candidates (fastest first):");
        for s in &outcome.scored {
            println!(
                "    {:8.2} tok/s  {:7.2} MiB/token  compute {:3.0}%  storage {:3.0}%  {}",
                s.decode_tok_s,
                s.bytes_per_token / (1 << 20) as f64,
                100.0 * s.compute_busy,
                100.0 * s.storage_busy,
                s.features.describe()
            );
        }
    }
    println!(
        "  searched {} candidates in {:.1} s",
        outcome.scored.len(),
        started.elapsed().as_secs_f64()
    );
}

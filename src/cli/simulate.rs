//! `conductor simulate`: predict a workload on a hardware profile, or replay a recorded trace.
//!
//! `conductor simulate --profile P [-m MODEL | --shape NAME] -p 512 -n 128 -t 1,2 --json`
//! predicts what `conductor bench` measures and prints it in the same JSON lines, so a script
//! can hold prediction against measurement. `conductor simulate --replay TRACE` feeds a trace's
//! recorded events to a fresh scheduler and checks that it answers with the identical commands.

use super::{parse_list, NumList};
use anyhow::{bail, Context, Result};
use clap::Args;
use conductor::fetch;
use conductor::runtime::cache::{MemoryBudget, StoreSizes};
use conductor::runtime::model::{Model, WeightSource};
use conductor::runtime::plan::{
    ExecutionPlan, HardwareProfile, ModelDescription, ModelIdentity, PlanOverrides, Topology,
};
use conductor::runtime::sparse::profile::ModelProfile;
use conductor::runtime::trace::{StepActivity, Trace};
use conductor::{apply_budget, step_logits_bytes};
use conductor_planner::search::activity_from_profile;
use conductor_simulator::{
    check_trace_model, describe_model_file, named_shape, replay, simulate, DraftWorkload,
    SimOptions, SimReport, Workload, NAMED_SHAPES,
};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args)]
pub struct SimulateArgs {
    /// Hardware profile (TOML, as `conductor profile-hw` writes; phones in profiles/).
    #[arg(long = "profile", required_unless_present = "replay")]
    profile: Option<PathBuf>,
    /// Model whose shape to simulate (default: the default model).
    #[arg(short = 'm', long = "model", conflicts_with = "shape")]
    model: Option<PathBuf>,
    /// A named model shape instead of a file (e.g. llama-2-7b).
    #[arg(long = "shape")]
    shape: Option<String>,
    /// Execution plan (default: the one the engine would fit to the profile's machine).
    #[arg(long = "plan")]
    plan: Option<PathBuf>,
    /// Predict a run under this memory budget (as `run --memory`; needs -m with a neuron store).
    #[arg(long = "memory", requires = "model")]
    memory: Option<MemoryBudget>,
    /// I/O threads (as `--io-threads`).
    #[arg(long = "io-threads")]
    io_threads: Option<u32>,
    /// Gate-first loading (as `--gate-first`; with --memory): the pages read come from
    /// --activity, every page without it.
    #[arg(long = "gate-first", requires = "memory")]
    gate_first: bool,
    /// As `--gate-first-gap`.
    #[arg(long = "gate-first-gap", value_name = "N", requires = "gate_first")]
    gate_first_gap: Option<u32>,
    /// Prompt length (0: no prompt test).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    n_prompt: u32,
    /// Generated tokens (0: no generation test).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    n_gen: u32,
    /// Thread counts, comma-separated, as `conductor bench -t` (default: the plan's).
    #[arg(short = 't', long = "threads", value_parser = parse_list)]
    threads: Option<NumList>,
    /// Activation sets from a recorded trace (`--trace-out` of run or bench).
    #[arg(long = "activity")]
    activity: Option<PathBuf>,
    /// Activation sets synthesized from the model's activation profile (`conductor profile`):
    /// each neuron at its measured frequency, consecutive tokens reusing active neurons as
    /// measured, at --target-sparsity (default: the profile's operating point).
    #[arg(
        long = "sparse-profile",
        requires = "model",
        conflicts_with = "activity"
    )]
    sparse_profile: Option<PathBuf>,
    /// With --sparse-profile: the sparsity whose measured active sets to follow.
    #[arg(long = "target-sparsity", value_parser = super::parse_share, requires = "sparse_profile")]
    target_sparsity: Option<f32>,
    /// Speculative decoding: each decode step verifies this many drafted tokens (what `run
    /// --draft` verifies at most with `--draft-max`), dense.
    #[arg(long = "draft-tokens", value_name = "K", requires = "draft_acceptance")]
    draft_tokens: Option<u32>,
    /// With --draft-tokens: the chance a drafted token is kept, given the ones before it were
    /// (what `run --draft` reports as accepted, e.g. 0.8); the prediction's tokens a step follow.
    #[arg(long = "draft-acceptance", value_name = "A", value_parser = super::parse_share, requires = "draft_tokens")]
    draft_acceptance: Option<f32>,
    /// With --draft-tokens: the target drafts for itself (`run --draft self`), one
    /// resident-only step a drafted token before each verifying step, their time counted.
    #[arg(long = "draft-self", requires = "draft_tokens")]
    draft_self: bool,
    /// Print `conductor bench --json` lines instead of a report.
    #[arg(long = "json")]
    json: bool,
    /// Write the simulated trace (replayable) here, and its Chrome-trace timeline beside it.
    #[arg(long = "trace-out")]
    trace_out: Option<PathBuf>,
    /// Replay this recorded trace instead of simulating.
    #[arg(long = "replay", conflicts_with_all = ["profile", "shape", "json", "activity"])]
    replay: Option<PathBuf>,
}

pub fn run(args: SimulateArgs) -> Result<()> {
    if let Some(path) = &args.replay {
        return run_replay(path, args.model.as_ref());
    }
    let profile_path = args.profile.as_ref().expect("clap requires --profile");
    let profile = HardwareProfile::from_file(profile_path)?;
    let model = model_description(&args)?;
    let mut plan = match &args.plan {
        Some(path) => ExecutionPlan::from_file(path)?,
        None => ExecutionPlan::for_topology(&Topology::of_profile(&profile)),
    };
    // The engine's meaning of these settings. The cache they shape is simulated whether or
    // not --memory sizes it; the workloads simulated here select no clusters (no predictors),
    // so gate-first reads are the gates' pages.
    PlanOverrides {
        io_threads: args.io_threads,
        gate_first: args.gate_first.then_some(true),
        gate_first_gap: args.gate_first_gap,
        ..PlanOverrides::default()
    }
    .apply(&mut plan, true, false)?;
    let draft = match (args.draft_tokens, args.draft_acceptance) {
        (Some(tokens), Some(acceptance)) => Some(DraftWorkload {
            tokens,
            acceptance: f64::from(acceptance),
            resident: args.draft_self,
        }),
        _ => None,
    };
    let mut layer_bundle_bytes = Vec::new();
    if let (Some(memory), Some(path)) = (args.memory, &args.model) {
        let store = Model::open(path, WeightSource::RESIDENT)
            .with_context(|| format!("cannot load {}", path.display()))?;
        if let Ok(sizes) = StoreSizes::of_store(&store) {
            layer_bundle_bytes = sizes.layer_bundle_bytes;
        }
        let n_ctx = args.n_prompt.max(args.n_gen).max(1);
        // A draft's steps return logits for each drafted token: the engine holds them out of
        // the budget, and so does the prediction.
        let rows = draft.map_or(1, |d| d.tokens as usize + 1);
        let memory = MemoryBudget::Bytes(
            memory
                .bytes(store.file().file_len())
                .saturating_sub(step_logits_bytes(&store, rows)),
        );
        let split = apply_budget(&store, &mut plan, memory, n_ctx as usize)?;
        eprintln!(
            "memory: budget {:.1} MiB: {} cache slots ({} hot), output in clusters of {} rows",
            split.budget as f64 / (1 << 20) as f64,
            split.plan.slots,
            split.plan.hot_slots,
            split.output_rows
        );
    }
    if args.n_prompt == 0 && args.n_gen == 0 {
        bail!("nothing to simulate: give a prompt length (-p) or a generation length (-n) above 0");
    }
    let activity = match (&args.activity, &args.sparse_profile) {
        (Some(path), _) => {
            let trace = Trace::load(path)?;
            check_trace_model(&trace, &model)?;
            Some(trace.activity)
        }
        (None, Some(path)) => Some(profile_activity(&args, path)?),
        (None, None) => None,
    };
    let threads: Vec<Option<u32>> = match &args.threads {
        Some(list) => {
            if list.0.contains(&0) {
                bail!("thread counts must be at least 1");
            }
            list.0.iter().map(|&t| Some(t as u32)).collect()
        }
        None => vec![None],
    };
    for t in threads {
        let workload = Workload {
            threads: t,
            activity: activity.clone(),
            draft,
            layer_bundle_bytes: layer_bundle_bytes.clone(),
            ..Workload::new(model.clone(), args.n_prompt, args.n_gen)
        };
        let options = if args.trace_out.is_some() {
            SimOptions::default()
        } else {
            SimOptions::lean()
        };
        let started = Instant::now();
        let report = simulate(&profile, &plan, &workload, &options)?;
        let wall = started.elapsed();
        if args.json {
            for line in report.bench_json_lines() {
                println!("{line}");
            }
        } else {
            print_report(&report, wall);
        }
        if let Some(path) = &args.trace_out {
            super::save_trace(&report.trace, path)?;
        }
    }
    Ok(())
}

/// Decode steps following the activation profile at `path` of the model of `args`.
fn profile_activity(args: &SimulateArgs, path: &Path) -> Result<Vec<StepActivity>> {
    let model_path = args.model.as_ref().expect("clap requires -m");
    let model = Model::open(model_path, WeightSource::Mapped)
        .with_context(|| format!("cannot load {}", model_path.display()))?;
    let profile = ModelProfile::load_for(path, &ModelIdentity::of(&model), Some(model_path))?;
    let sparsity = args
        .target_sparsity
        .or(profile.operating_point.as_ref().map(|c| c.point.sparsity))
        .unwrap_or(profile.reference_sparsity);
    if let Some(stats) = conductor_simulator::measured_stats(&profile, sparsity) {
        eprintln!(
            "activity: {:.1}% of neurons active, 80% of activations in {:.1}% of them, {:.0}% of a token's active neurons active in the token before ({})",
            stats.active_share * 100.0,
            stats.hot_share * 100.0,
            stats.reuse.unwrap_or(0.0) * 100.0,
            stats.sources
        );
    }
    Ok(activity_from_profile(&profile, sparsity, args.n_gen.max(1)))
}

fn model_description(args: &SimulateArgs) -> Result<ModelDescription> {
    if let Some(name) = &args.shape {
        return named_shape(name).with_context(|| {
            format!(
                "unknown model shape `{name}` (known: {})",
                NAMED_SHAPES.join(", ")
            )
        });
    }
    let path = fetch::resolve_model(args.model.as_deref(), &mut |line| eprintln!("{line}"))?;
    Ok(describe_model_file(&path)?)
}

fn run_replay(path: &Path, model: Option<&PathBuf>) -> Result<()> {
    let trace = Trace::load(path)?;
    if let Some(model) = model {
        check_trace_model(&trace, &describe_model_file(model)?)?;
    }
    let report = replay(&trace)?;
    if let Some(m) = &report.first_mismatch {
        bail!(
            "replay of {} differs at record {} of {} (event {:?}): recorded {:?}, a fresh scheduler gave {:?}{}",
            path.display(),
            m.record,
            report.records,
            m.event,
            m.expected,
            m.got,
            m.error
                .as_ref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        );
    }
    println!(
        "replay: {} events, {} commands, written by {} ({} driver, {} threads): identical command stream",
        report.records, report.commands, trace.header.writer, trace.header.driver, trace.header.threads
    );
    Ok(())
}

fn ms(ns: f64) -> f64 {
    ns / 1e6
}

fn print_report(r: &SimReport, wall: std::time::Duration) {
    println!(
        "simulated: {} on {} ({} threads), prompt {} tokens, {} generated",
        r.model, r.profile, r.threads, r.n_prompt, r.n_gen
    );
    if let Some(pp) = r.prompt_tok_s() {
        println!(
            "  prefill      {:10.2} ms  ({:.1} tokens/s)",
            ms(r.prefill_ns as f64),
            pp
        );
        println!("  first token  {:10.2} ms", ms(r.ttft_ns as f64));
    }
    if let Some(tg) = r.gen_tok_s() {
        let t = &r.time_between_tokens;
        println!(
            "  decode       {:10.3} ms per token ({:.1} tokens/s); between tokens median {:.3} ms, p90 {:.3} ms",
            ms(r.decode_ns_per_token),
            tg,
            ms(t.median_ns as f64),
            ms(t.p90_ns as f64)
        );
        if r.decode_steps != r.n_gen {
            println!(
                "  draft        {} verifying steps, {:.2} tokens a step; {} drafting steps",
                r.decode_steps,
                f64::from(r.n_gen) / f64::from(r.decode_steps.max(1)),
                r.drafting_steps
            );
        }
    }
    println!("  busy:");
    for u in &r.utilisation {
        println!("    {:<12} {:5.1}%", u.track, 100.0 * u.fraction());
    }
    println!(
        "  storage: {} bytes read, cache {} hits / {} misses",
        r.bytes_read, r.cache_hits, r.cache_misses
    );
    println!(
        "  {} events in {:.1} ms ({:.2} M events/s)",
        r.events,
        wall.as_secs_f64() * 1e3,
        r.events as f64 / wall.as_secs_f64().max(1e-9) / 1e6
    );
}

//! Command-line interface, modelled on llama.cpp's tools so their users feel at home.

mod bench;
mod chart;
mod chat;
mod check_refs;
mod convert;
mod draft;
mod explore;
mod logits;
mod perplexity;
mod plan;
mod profile;
mod profile_hw;
mod run;
mod serve;
mod simulate;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use conductor::fetch;
use conductor::runtime::cache::MemoryBudget;
use conductor::runtime::plan::CachePolicy;
use conductor::runtime::plan::{ExecutionPlan, IoEngine, Verify};
use conductor::runtime::quant::GgmlType;
use conductor::runtime::sparse::SparsityMode;
use conductor::{DriverKind, Engine, SparsitySettings};
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(
    name = "conductor",
    version,
    about = "LLM inference for devices whose memory is smaller than the model"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it as it comes.
    Run(run::RunArgs),
    /// Serve the OpenAI API (chat and text completions, models, health, metrics) over HTTP.
    Serve(serve::ServeArgs),
    /// Chat with the model in the terminal: history, streaming, /reset, /system, /save.
    Chat(chat::ChatArgs),
    /// Download a model into the cache (done automatically for the default model and for
    /// `-m NAME`).
    Fetch(FetchArgs),
    /// Compare with llama.cpp's reference outputs (greedy tokens, first-token logits).
    CheckRefs(check_refs::CheckRefsArgs),
    /// Perplexity of a text file, the llama-perplexity way.
    Perplexity(perplexity::PerplexityArgs),
    /// Prompt-processing and generation speed, the llama-bench way.
    Bench(bench::BenchArgs),
    /// Predict a workload on a hardware profile (discrete-event simulation), or replay a trace.
    Simulate(simulate::SimulateArgs),
    /// Measure this machine into a hardware profile (TOML).
    ProfileHw(profile_hw::ProfileHwArgs),
    /// Convert a model into a neuron store (bundled FFN neurons, for --memory budgets).
    Convert(convert::ConvertArgs),
    /// Plan how a model runs on a hardware profile under limits (memory, minimum speed):
    /// candidate plans scored by the simulator, the fastest written.
    Plan(plan::PlanArgs),
    /// Sweep budgets, models, hardware profiles and plan features on the simulator: CSV and
    /// charts (or `--paper`: PowerInfer-2's trends beside its numbers).
    Explore(explore::ExploreArgs),
    /// Profile a model's FFN activations over text: sparsity thresholds, hot neurons,
    /// predictors (for --sparsity).
    Profile(profile::ProfileArgs),
    /// Every position's logits for token ids, teacher-forced (bench/logits-vs-llama-cpp).
    #[command(hide = true)]
    Logits(logits::LogitsArgs),
}

#[derive(Args)]
struct FetchArgs {
    /// Which model (default: the default model). `--list` shows the names.
    name: Option<String>,
    /// Print only the model's path (for scripts).
    #[arg(long)]
    print_path: bool,
    /// List the models Conductor can fetch, with their cache paths.
    #[arg(long)]
    list: bool,
}

/// Which driver runs the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum DriverArg {
    /// kameo actors per processor group (the default).
    #[default]
    Actors,
    /// The scheduler and a worker pool on the calling thread (the reference path).
    Inline,
}

impl From<DriverArg> for DriverKind {
    fn from(d: DriverArg) -> DriverKind {
        match d {
            DriverArg::Actors => DriverKind::Actors,
            DriverArg::Inline => DriverKind::Inline,
        }
    }
}

/// Options shared by every command that loads a model.
#[derive(Args, Clone)]
pub struct ModelArgs {
    /// GGUF model file, or the name of a model Conductor fetches on first use
    /// (`conductor fetch --list`; default: SmolLM2-135M-Instruct Q4_1).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Compute threads.
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// How the model runs: driver and execution plan.
#[derive(Args, Clone, Default)]
pub struct EngineArgs {
    /// Which driver carries out the plan.
    #[arg(long = "driver", value_enum, default_value_t = DriverArg::Actors)]
    pub driver: DriverArg,
    /// Execution plan, JSON, TOML (.toml) or bincode (.bin) (an `ExecutionPlan`); one made
    /// for another model is refused. Default: a plan fitted to this
    /// machine's core classes.
    #[arg(long = "plan")]
    pub plan: Option<PathBuf>,
    /// Memory budget for everything the process holds: bytes (48MiB, 100MB, 52428800) or a
    /// share of the model file (50%). Needs a neuron store (`conductor convert`).
    #[arg(long = "memory")]
    pub memory: Option<MemoryBudget>,
    /// How the neuron cache shares its slots under --memory (default: the plan's, else
    /// segmented).
    #[arg(long = "cache-policy", value_enum)]
    pub cache_policy: Option<CachePolicyArg>,
    /// Threads issuing reads of the model file under --memory (default: the plan's, 1).
    #[arg(long = "io-threads")]
    pub io_threads: Option<u32>,
    /// How reads of the model file reach the kernel under --memory: `pread` (positional
    /// reads, as an Android app must) or `uring` (io_uring; builds with the `io-uring` feature,
    /// on by default). Default: the plan's, else pread.
    #[arg(long = "io-engine", value_enum)]
    pub io_engine: Option<IoEngineArg>,
    /// Read the model file into memory instead of mapping it (without --memory): a change to
    /// the file while the engine runs cannot reach it (mapped, a truncated or modified file
    /// fails the next step, and one cut during a step faults).
    #[arg(long = "no-mmap")]
    pub no_mmap: bool,
    /// Keep Q4_K and Q6_K matrices in the file's layout (without --memory): by default they are
    /// interleaved 8 rows by 8 at load, the layout of the faster decode kernel (same results).
    #[arg(long = "no-interleave")]
    pub no_interleave: bool,
    /// The engine only evaluates prompts (`conductor profile`): no decode-only copies.
    #[arg(skip)]
    pub prompts_only: bool,
    /// When reads of a neuron store under --memory are checked against its checksums:
    /// `always` (every read, the default: a CRC-32 of every byte read) or `first` (a unit's
    /// first whole read only). Default: the plan's `storage.verify`, else always.
    #[arg(long = "verify", value_enum)]
    pub verify: Option<VerifyArg>,
    /// Loads kept in flight ahead of compute under --memory: the I/O pipeline's depth
    /// (default: the plan's, else 4; 1: no read-ahead).
    #[arg(long = "max-loads")]
    pub max_loads: Option<u32>,
    /// Under --memory with --sparsity threshold: read each FFN bundle's gate rows first and
    /// then only the pages holding the up rows and down columns of neurons the gate lets
    /// through (PowerInfer-2's two-phase load). Default: the plan's, else off.
    #[arg(long = "gate-first")]
    pub gate_first: bool,
    /// With --gate-first: runs of wanted pages up to N pages (4 KiB) apart are read as one,
    /// the pages between coming along: fewer, larger reads (default: the plan's, else 0).
    #[arg(long = "gate-first-gap", value_name = "N")]
    pub gate_first_gap: Option<u32>,
    /// Loads issued together under --memory (default 1): with `--io-engine uring` up to N
    /// reads in flight at once; with `pread`, adjacent ones merged into one vectored read.
    #[arg(long = "io-batch")]
    pub io_batch: Option<u32>,
    /// Which FFN neurons decode computes (the values below), or `default`: in memory dense
    /// for SwiGLU models such as SmolLM2; for ReLU models (and their neuron stores) with an
    /// activation profile, their natural zeros with the profile's predictors, or threshold
    /// without; a PowerInfer file's own predictors. Under --memory: the operating point
    /// `conductor profile` measured, the fastest within 3% perplexity of dense; dense without
    /// a profile.
    #[arg(long = "sparsity", value_parser = sparsity_setting(), default_value = SparsityMode::DEFAULT_SETTING)]
    pub sparsity: SparsityArg,
    /// Target share of FFN neurons skipped: 0.3 or 30% (default 30% for SwiGLU models, 0 =
    /// the natural zeros for ReLU models).
    #[arg(long = "target-sparsity", value_parser = parse_share)]
    pub target_sparsity: Option<f32>,
    /// With --sparsity predictor: the recall the predictors' cut is calibrated for at the
    /// target sparsity (0.8, 0.85, 0.9, 0.92, 0.95, 0.98, 0.99: the points the profile
    /// tabulates; default: the cut set at training, 0.99 of the trained sparsity's neurons).
    /// Lower recall, fewer gate rows, more perplexity.
    #[arg(long = "predictor-recall", value_parser = parse_share)]
    pub predictor_recall: Option<f32>,
    /// Activation profile (default: MODEL.profile beside the model; `conductor profile`).
    #[arg(long = "sparse-profile")]
    pub sparse_profile: Option<PathBuf>,
    /// Format of the transposed down projection sparse decode reads (q8_0, q4_1, q4_0, f16).
    #[arg(long = "sparse-down-type", value_parser = parse_down_type)]
    pub sparse_down_type: Option<GgmlType>,
    /// Sparse decode for every token, prompt included (set by `perplexity`, which measures
    /// the quality of what sparse decode computes).
    #[arg(skip)]
    pub sparse_all_tokens: bool,
    /// Sparse decode in memory reads the down projections' block columns, never a transposed
    /// copy (set by `profile`, which scores operating points with the numerics of the
    /// block-column store `--memory` runs).
    #[arg(skip)]
    pub sparse_keep_down_layout: bool,
    /// Context the budget reserves KV cache for (set by each command from its own sizes).
    #[arg(skip)]
    pub context: Option<usize>,
    /// The most tokens a step returns logits for (set by `--draft`: the drafted tokens and
    /// one); 0 or 1: one.
    #[arg(skip)]
    pub step_logits: usize,
    /// Sessions generated at once whose KV caches the budget holds (set by `serve` from
    /// `--parallel`).
    #[arg(skip)]
    pub sequences: Option<usize>,
    /// Bytes of --memory held for something else the command keeps in memory, and what (set
    /// by `--draft MODEL`: the draft model).
    #[arg(skip)]
    pub reserve: Option<(u64, String)>,
    /// The output projection over tokens `0..n` only (set for a draft model by
    /// `--draft-vocab`).
    #[arg(skip)]
    pub output_vocab: Option<u32>,
}

/// Which FFN neurons decode computes: a mode, or `None` for the shipped default
/// ([`SparsityMode::setting`] parses it, so a new mode is named in the runtime only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SparsityArg(pub Option<SparsityMode>);

impl SparsityArg {
    pub const DEFAULT: SparsityArg = SparsityArg(None);
    pub const DENSE: SparsityArg = SparsityArg(Some(SparsityMode::Dense));

    fn mode(self) -> Option<SparsityMode> {
        self.0
    }
}

/// Every sparsity mode as a command-line value, with its help.
fn sparsity_modes() -> impl Iterator<Item = clap::builder::PossibleValue> {
    SparsityMode::ALL
        .into_iter()
        .map(|m| clap::builder::PossibleValue::new(m.name()).help(m.describe()))
}

/// `--sparsity`'s values, each with its help, parsed by [`SparsityMode::setting`].
fn sparsity_setting() -> impl clap::builder::TypedValueParser<Value = SparsityArg> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let values = std::iter::once(
        PossibleValue::new(SparsityMode::DEFAULT_SETTING).help("the shipped choice (above)"),
    )
    .chain(sparsity_modes());
    PossibleValuesParser::new(values)
        .map(|text| SparsityArg(SparsityMode::setting(&text).expect("one of the possible values")))
}

/// A sparsity mode by name, `default` aside (`conductor plan --sparsity`).
pub(crate) fn sparsity_mode() -> impl clap::builder::TypedValueParser<Value = SparsityMode> {
    use clap::builder::{PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(sparsity_modes()).map(|text| {
        SparsityMode::setting(&text)
            .ok()
            .flatten()
            .expect("one of the possible values")
    })
}

pub(crate) fn parse_down_type(s: &str) -> Result<GgmlType, String> {
    match s.to_ascii_lowercase().as_str() {
        "q8_0" => Ok(GgmlType::Q8_0),
        "q4_1" => Ok(GgmlType::Q4_1),
        "q4_0" => Ok(GgmlType::Q4_0),
        "f16" => Ok(GgmlType::F16),
        "f32" => Ok(GgmlType::F32),
        _ => Err(format!("`{s}`: one of q8_0, q4_1, q4_0, f16, f32")),
    }
}

/// A share: `0.5` or `50%`, within 0..=1.
pub fn parse_share(s: &str) -> Result<f32, String> {
    let t = s.trim();
    let v = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f32>().map(|v| v / 100.0),
        None => t.parse::<f32>(),
    }
    .map_err(|_| format!("`{s}` is not a share (0.5 or 50%)"))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("`{s}` is outside 0..=100%"));
    }
    Ok(v)
}

/// How the neuron cache shares its slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum CachePolicyArg {
    /// Hot clusters keep reserved slots; the rest stream through a small LRU segment.
    #[default]
    Segmented,
    /// One LRU over every slot (the baseline).
    Lru,
}

/// How reads reach the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum IoEngineArg {
    Pread,
    Uring,
}

/// When reads of a neuron store are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum VerifyArg {
    Always,
    First,
}

impl EngineArgs {
    /// The plan given with `--plan`, if any (otherwise the engine fits its default plan to the
    /// machine).
    pub fn plan(&self) -> Result<Option<ExecutionPlan>> {
        match &self.plan {
            Some(path) => Ok(Some(ExecutionPlan::from_file(path)?)),
            None => Ok(None),
        }
    }
}

impl ModelArgs {
    pub fn threads(&self) -> usize {
        self.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    pub fn load(&self, threads: usize) -> Result<Engine> {
        load_engine(self.model.as_deref(), threads, &self.engine)
    }
}

/// Loads a model for a command: checks the file and the plan, builds the engine.
pub fn load_engine(model: Option<&Path>, threads: usize, engine: &EngineArgs) -> Result<Engine> {
    if threads == 0 {
        bail!("-t must be at least 1");
    }
    // A model's name fetches it; a missing file is named before the GGUF reader says it in its
    // own words.
    let model = fetch::resolve_model(model, &mut |line| eprintln!("{line}"))?;
    std::fs::metadata(&model)
        .with_context(|| format!("cannot read model file {}", model.display()))?;
    let mut builder = Engine::builder()
        .model(model)
        .threads(threads)
        .driver(engine.driver.into())
        .step_logits(engine.step_logits);
    if let Some(plan) = engine.plan()? {
        builder = builder.plan(plan);
    }
    if let Some(memory) = engine.memory {
        builder = builder.memory(memory);
    }
    if let Some((bytes, what)) = &engine.reserve {
        builder = builder.reserve(*bytes, what.clone());
    }
    if let Some(n) = engine.output_vocab {
        builder = builder.output_vocab(n);
    }
    if let Some(policy) = engine.cache_policy {
        builder = builder.cache_policy(match policy {
            CachePolicyArg::Segmented => CachePolicy::Segmented,
            CachePolicyArg::Lru => CachePolicy::Lru,
        });
    }
    if let Some(n) = engine.io_threads {
        if n == 0 {
            bail!("--io-threads must be at least 1");
        }
        builder = builder.io_threads(n);
    }
    if let Some(engine_arg) = engine.io_engine {
        builder = builder.io_engine(match engine_arg {
            IoEngineArg::Pread => IoEngine::Pread,
            IoEngineArg::Uring => IoEngine::Uring,
        });
    }
    if engine.no_mmap {
        builder = builder.mmap(false);
    }
    if engine.no_interleave {
        builder = builder.interleave(false);
    }
    if engine.prompts_only {
        builder = builder.down_blocks(false);
    }
    if let Some(verify) = engine.verify {
        builder = builder.verify(match verify {
            VerifyArg::Always => Verify::Always,
            VerifyArg::First => Verify::First,
        });
    }
    if let Some(n) = engine.max_loads {
        if n == 0 {
            bail!("--max-loads must be at least 1");
        }
        builder = builder.max_loads(n);
    }
    if engine.gate_first {
        builder = builder.gate_first(true);
    }
    if let Some(gap) = engine.gate_first_gap {
        builder = builder.gate_first_gap(gap);
    }
    if let Some(n) = engine.io_batch {
        if n == 0 {
            bail!("--io-batch must be at least 1");
        }
        builder = builder.io_batch(n);
    }
    if let Some(n_ctx) = engine.context {
        builder = builder.context(n_ctx);
    }
    if let Some(n) = engine.sequences {
        builder = builder.sequences(n);
    }
    builder = builder.sparsity(SparsitySettings {
        mode: engine.sparsity.mode(),
        target: engine.target_sparsity,
        predictor_recall: engine.predictor_recall,
        profile: engine.sparse_profile.clone(),
        all_tokens: engine.sparse_all_tokens,
        down_type: engine.sparse_down_type,
        keep_down_layout: engine.sparse_keep_down_layout,
    });
    let engine = builder.build()?;
    if let Some(b) = engine.budget() {
        let mib = |x: u64| x as f64 / (1 << 20) as f64;
        let sessions = if b.sessions > 1 {
            format!(" ({} sessions × {} tokens)", b.sessions, b.n_ctx)
        } else {
            String::new()
        };
        eprintln!(
            "memory: budget {:.1} MiB = resident weights {:.1} + KV {:.1}{sessions} + scratch {:.1} + runtime {:.1} + neuron cache {:.1} ({} slots, {} hot; the FFN is {:.1} MiB)",
            mib(b.budget),
            mib(b.resident_weights),
            mib(b.kv_cache),
            mib(b.scratch),
            mib(b.runtime_overhead),
            mib(b.cache),
            b.plan.slots,
            b.plan.hot_slots,
            mib(b.ffn_bytes)
        );
    }
    Ok(engine)
}

/// Writes a trace for `--trace-out`: the replayable binary trace, and beside it (`.json`) the
/// Chrome-trace / Perfetto timeline.
pub fn save_trace(trace: &conductor::runtime::trace::Trace, path: &Path) -> Result<()> {
    trace
        .save(path)
        .with_context(|| format!("cannot write trace {}", path.display()))?;
    let timeline = path.with_extension("json");
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(&timeline)
            .with_context(|| format!("cannot write {}", timeline.display()))?,
    );
    let process = format!("conductor ({})", trace.header.driver);
    conductor::runtime::trace::write_chrome_trace(&trace.spans, &process, &mut out)?;
    eprintln!(
        "trace: {} events -> {} (replay: conductor simulate --replay), timeline -> {} (ui.perfetto.dev)",
        trace.records.len(),
        path.display(),
        timeline.display()
    );
    Ok(())
}

pub fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Chat(args) => chat::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Fetch(args) => {
            if args.list {
                for m in fetch::KNOWN_MODELS {
                    let have = fetch::model_path(m);
                    let state = if have.is_file() {
                        "fetched"
                    } else {
                        "not fetched"
                    };
                    println!(
                        "{:<19} {:>5} MB  {state:<11}  {}",
                        m.name,
                        m.approx_mb(),
                        have.display()
                    );
                }
                return Ok(());
            }
            let model = match args.name.as_deref() {
                None => &fetch::DEFAULT_MODEL,
                Some(name) => fetch::known_model(name).with_context(|| {
                    let known: Vec<_> = fetch::KNOWN_MODELS.iter().map(|m| m.name).collect();
                    format!("no model called `{name}` (known: {})", known.join(", "))
                })?,
            };
            let path = fetch::ensure_model(model, &mut |line| {
                if !args.print_path {
                    eprintln!("{line}");
                }
            })?;
            println!("{}", path.display());
            Ok(())
        }
        Command::CheckRefs(args) => check_refs::run(args),
        Command::Perplexity(args) => perplexity::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Simulate(args) => simulate::run(args),
        Command::ProfileHw(args) => profile_hw::run(args),
        Command::Profile(args) => profile::run(args),
        Command::Logits(args) => logits::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Explore(args) => explore::run(args),
    }
}

/// A comma-separated list of numbers (`-p 128,512`). A newtype: clap reads a bare `Vec` field
/// as a repeated flag.
#[derive(Clone, Debug)]
pub struct NumList(pub Vec<usize>);

pub fn parse_list(s: &str) -> Result<NumList, String> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .map_err(|_| format!("`{x}` is not a whole number"))
        })
        .collect::<Result<_, _>>()
        .map(NumList)
}

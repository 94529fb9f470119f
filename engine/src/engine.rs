//! The embedding API: load a model once, then evaluate and generate in sessions.

use crate::fetch;
use conductor_actors::{ActorDriver, ActorOptions, PoolConfig, SetupError, WorkerPool};
use conductor_runtime::cache::{
    fit_plan_to_budget_for, BudgetError, BudgetSplit, CacheReport, MemoryBudget, StoreSizes,
};
use conductor_runtime::exec::{Driver, InlineDriver, Session, StepError};
use conductor_runtime::model::{Model, ModelError, WeightSource};
use conductor_runtime::plan::{CachePolicy, OverrideError, PlanOverrides};
use conductor_runtime::plan::{ExecutionPlan, IoEngine, Topology, Verify};
use conductor_runtime::quant::Kernels;
use conductor_runtime::resolve::{
    resolve, BudgetAsk, FittedBudget, ModelFacts, ResolveError, ResolvedPlan, RunSettings,
};
use conductor_runtime::sample::SamplingError;
use conductor_runtime::schedule::ScheduleError;
use conductor_runtime::sparse::{SparseError, SparsityMode};
use conductor_runtime::tokenizer::{
    fallback_chat_template, ChatTemplate, Tokenizer, TokenizerError,
};
use conductor_runtime::trace::Trace;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod generation;
mod memory;
mod sparsity;
mod speculative;

pub use generation::{
    GenerateOptions, Generation, GenerationStats, Piece, SampleHook, StopReason, TokenStream,
    MODEL_FILE_CHECK_PAUSE,
};
pub use memory::release_freed_memory;
use memory::{fit_default_context, physical_memory};
use sparsity::resolve_sparsity;
pub use sparsity::{
    SparsitySettings, DEFAULT_SPARSE_DOWN_TYPE, DEFAULT_SPARSITY, DEFAULT_SPARSITY_MODE,
};
pub use speculative::{
    BadDraftLimits, DraftLimits, Drafter, ModelDrafter, NgramDrafter, Speculation,
    DEFAULT_DRAFT_P_MIN,
};

/// Anything that can go wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Fetch(#[from] fetch::FetchError),
    /// The source error follows in the chain (`{:#}` prints "path: why").
    #[error("{}", path.display())]
    Load { path: PathBuf, source: ModelError },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Step(#[from] StepError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error("cannot start worker threads: {0}")]
    Threads(std::io::Error),
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error("a trace is replayed through the inline driver (this engine runs the actor driver)")]
    ReplayNeedsInline,
    #[error(transparent)]
    Budget(#[from] conductor_runtime::cache::BudgetError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("nothing to generate: the number of tokens to predict must be at least 1")]
    NothingToGenerate,
    #[error(transparent)]
    Sparse(#[from] SparseError),
    #[error("--sparsity {mode} needs an activation profile of the model: none at {} (make one with `conductor profile -m MODEL`)", path.display())]
    NoProfile { mode: &'static str, path: PathBuf },
    #[error("probes see the inline driver's tensors (this engine runs the actor driver)")]
    NoProbe,
    #[error(transparent)]
    Settings(#[from] OverrideError),
    #[error("cannot make a session: {0}")]
    Session(ModelError),
    #[error("the draft model's vocabulary is not the target's ({why}): the target has {target} tokens, the draft {draft}")]
    DraftVocabulary {
        target: usize,
        draft: usize,
        why: String,
    },
    #[error("speculative decoding needs dense decode (a step of several tokens computes every FFN neuron, so sparse decode's bits could not be kept): run with --sparsity dense")]
    DraftNeedsDense,
    #[error("speculative decoding under a memory budget needs room in it for the drafted tokens' logits: build the engine with EngineBuilder::step_logits (the drafts' length and one)")]
    DraftNoRoom,
    #[error("--draft self drafts from what a memory budget keeps resident; without --memory everything is resident and its drafts would cost what the target's steps cost: use --draft ngram or a draft model")]
    DraftSelfInMemory,
    /// A plan the settings cannot give (a budget too small beside a reservation).
    #[error(transparent)]
    Resolve(ResolveError),
    /// A [`SampleHook`] refused to go on (a constraint that cannot continue).
    #[error("{0}")]
    Hook(String),
}

/// Keeps what `session` already holds of `prompt` (their common prefix, short of `prompt`'s last
/// token, whose logits the next step needs) and forgets the rest; returns how many tokens were
/// kept. Then stream `&prompt[kept..]`: a conversation's next turn computes only what is new.
pub fn reuse_prefix(session: &mut Session, prompt: &[u32]) -> usize {
    let kept = session
        .tokens()
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count()
        .min(prompt.len().saturating_sub(1));
    session.truncate(kept);
    kept
}

/// Which driver carries out the scheduler's commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DriverKind {
    /// kameo actors per processor group, pinned to the plan's cores (the default).
    #[default]
    Actors,
    /// Everything on the calling thread plus a worker pool: the reference path.
    Inline,
}

/// Builds an [`Engine`].
pub struct EngineBuilder {
    model: Option<PathBuf>,
    memory: Option<MemoryBudget>,
    context: Option<usize>,
    sequences: usize,
    step_logits: usize,
    /// Bytes of the budget held for something else in the process, and what.
    reserved: Option<(u64, String)>,
    /// The storage and cache settings over the plan's.
    overrides: PlanOverrides,
    mmap: bool,
    interleave: bool,
    down_blocks: bool,
    threads: Option<usize>,
    plan: Option<ExecutionPlan>,
    kernels: Kernels,
    driver: DriverKind,
    topology: Option<Topology>,
    pin_threads: bool,
    sparsity: SparsitySettings,
    output_vocab: Option<u32>,
    say: Box<dyn FnMut(&str)>,
}

impl EngineBuilder {
    /// The GGUF file to load; without it, the default model (fetched on first use).
    pub fn model(mut self, path: impl Into<PathBuf>) -> Self {
        self.model = Some(path.into());
        self
    }

    /// Compute threads of each processor group whose plan does not fix them (default: one
    /// per core of the group).
    /// Bounds what the process holds (the model must be a neuron store): resident weights,
    /// KV cache and scratch first, the neuron cache gets the rest.
    pub fn memory(mut self, budget: MemoryBudget) -> Self {
        self.memory = Some(budget);
        self
    }

    /// Context the memory budget reserves KV cache for (default 1024 tokens), and the default
    /// size of sessions under a budget.
    pub fn context(mut self, n_ctx: usize) -> Self {
        self.context = Some(n_ctx.max(1));
        self
    }

    /// The most tokens one step returns logits for (default 1; speculative decoding verifies
    /// drafted tokens with a step that returns theirs and the pending token's). Under a memory
    /// budget the rows beyond the first are held out of the budget before it is split.
    pub fn step_logits(mut self, rows: usize) -> Self {
        self.step_logits = rows.max(1);
        self
    }

    /// The output projection over tokens `0..n` only, the others never chosen: a draft
    /// model's head over the most frequent tokens of a byte-pair vocabulary (in memory;
    /// [`ExecutionPlan::output_vocab`]).
    pub fn output_vocab(mut self, n: u32) -> Self {
        self.output_vocab = Some(n);
        self
    }

    /// Holds `bytes` of the memory budget for `what` (e.g. "the draft model X"), something
    /// else the process keeps in memory beside this engine: the engine's split gets the rest,
    /// and a budget too small for both says how much both need.
    pub fn reserve(mut self, bytes: u64, what: impl Into<String>) -> Self {
        self.reserved = (bytes > 0).then(|| (bytes, what.into()));
        self
    }

    /// Sessions generated at once (a server's `--parallel` slots; default 1). Under a memory
    /// budget their KV caches all come out of the budget, before the neuron cache (which the
    /// sessions' multi-sequence steps share) gets the rest; where the context was not given
    /// ([`EngineBuilder::context`]) and `n` sessions of the default 1024 tokens do not fit,
    /// each session's context is halved until they do (down to 128 tokens), and said.
    pub fn sequences(mut self, n: usize) -> Self {
        self.sequences = n.max(1);
        self
    }

    /// Threads issuing reads of the model file (default: the plan's, 1 as on a phone).
    pub fn io_threads(mut self, n: u32) -> Self {
        self.overrides.io_threads = Some(n.max(1));
        self
    }

    /// How reads reach the kernel (default: the plan's, positional reads).
    pub fn io_engine(mut self, engine: IoEngine) -> Self {
        self.overrides.io_engine = Some(engine);
        self
    }

    /// Without a memory budget: map the model file (`true`, the default: pages are read as
    /// they are used, and a truncated or modified file fails the next step, though a file cut
    /// during a step faults) or read it into memory (`false`, `--no-mmap`: later changes to
    /// the file cannot reach the engine).
    pub fn mmap(mut self, on: bool) -> Self {
        self.mmap = on;
        self
    }

    /// Without a memory budget: interleave the Q4_K and Q6_K matrices 8 rows by 8 at load (`true`, the
    /// default; `DecodeLayout::interleave`), the layout of the faster decode kernel, or keep the
    /// file's layout (`false`, `--no-interleave`). Results are the same bits either way.
    pub fn interleave(mut self, on: bool) -> Self {
        self.interleave = on;
        self
    }

    /// Without a memory budget: copy each layer's down projection into the contiguous
    /// block-columns decode's clusters read (`true`, the default; `DecodeLayout::down_blocks`),
    /// or not (`false`: an engine that only evaluates prompts, such as `conductor profile`'s,
    /// saves the copy's memory). Results are the same bits either way.
    pub fn down_blocks(mut self, on: bool) -> Self {
        self.down_blocks = on;
        self
    }

    /// When reads of a neuron store are checked against its checksums (default: the plan's,
    /// every read).
    pub fn verify(mut self, verify: Verify) -> Self {
        self.overrides.verify = Some(verify);
        self
    }

    /// Loads issued together (default: the plan's, 1): with io_uring up to `n` reads in
    /// flight at once, with positional reads adjacent ones merged into one vectored read.
    pub fn io_batch(mut self, n: u32) -> Self {
        self.overrides.io_batch = Some(n.max(1));
        self
    }

    /// How the neuron cache shares its slots (default: the plan's, else segmented, hot and
    /// cold).
    pub fn cache_policy(mut self, policy: CachePolicy) -> Self {
        self.overrides.cache_policy = Some(policy);
        self
    }

    /// Loads the scheduler keeps in flight ahead of compute under a budget: the pipeline's
    /// depth (default: the plan's, else 4; 1: no read-ahead).
    pub fn max_loads(mut self, n: u32) -> Self {
        self.overrides.max_loads = Some(n.max(1));
        self
    }

    /// PowerInfer-2's two-phase load under a budget (default: the plan's, else off): decode
    /// reads each FFN bundle's gate rows first, then only the pages holding the up rows and
    /// down columns of neurons whose gate passes the threshold. Needs threshold sparsity.
    pub fn gate_first(mut self, on: bool) -> Self {
        self.overrides.gate_first = Some(on);
        self
    }

    /// Under gate-first loading, runs of wanted pages up to `pages` apart are read as one
    /// (default: the plan's, else [`conductor_runtime::plan::DEFAULT_GATE_FIRST_GAP`]).
    pub fn gate_first_gap(mut self, pages: u32) -> Self {
        self.overrides.gate_first_gap = Some(pages);
        self
    }

    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = Some(threads.max(1));
        self
    }

    /// The execution plan (default: [`ExecutionPlan::for_topology`] of this machine: a CPU
    /// group per core class for decode, the dense backend for prefill).
    pub fn plan(mut self, plan: ExecutionPlan) -> Self {
        self.plan = Some(plan);
        self
    }

    /// Which driver runs the model (default: actors).
    pub fn driver(mut self, driver: DriverKind) -> Self {
        self.driver = driver;
        self
    }

    /// Pin the actors' threads to their groups' cores (default: yes). Unpinned threads let
    /// the OS move them, which can help on a machine busy with other work.
    pub fn pin_threads(mut self, pin: bool) -> Self {
        self.pin_threads = pin;
        self
    }

    /// The machine's cores (default: detected). For tests and for running a plan written for
    /// other core classes on a machine without them.
    pub fn topology(mut self, topology: Topology) -> Self {
        self.topology = Some(topology);
        self
    }

    /// Sparse decode: mode, target sparsity, activation profile (default: see
    /// [`SparsitySettings`]).
    pub fn sparsity(mut self, settings: SparsitySettings) -> Self {
        self.sparsity = settings;
        self
    }

    /// Kernels to use (default: the best this CPU supports).
    pub fn kernels(mut self, kernels: Kernels) -> Self {
        self.kernels = kernels;
        self
    }

    /// Where progress lines go (default: standard error).
    pub fn on_progress(mut self, say: impl FnMut(&str) + 'static) -> Self {
        self.say = Box::new(say);
        self
    }

    pub fn build(mut self) -> Result<Engine, Error> {
        let started = Instant::now();
        let path = fetch::resolve_model(self.model.take().as_deref(), &mut *self.say)?;
        let load = |source| Error::Load {
            path: path.clone(),
            source,
        };
        // What the command line leaves open, the plan decides: its budget and its sparsity.
        let given_plan = self.plan.take();
        let memory = self.memory.or_else(|| {
            given_plan
                .as_ref()
                .and_then(|p| p.memory)
                .map(MemoryBudget::Bytes)
        });
        let mut sparsity = self.sparsity.clone();
        if let (None, Some(planned)) = (
            sparsity.mode,
            given_plan.as_ref().and_then(|p| p.sparsity.as_ref()),
        ) {
            sparsity.mode = Some(planned.mode);
            sparsity.target = sparsity.target.or(planned.target);
            sparsity.predictor_recall = sparsity.predictor_recall.or(planned.predictor_recall);
        }
        // The file's header and norms (an ordinary model mapped, which costs no reading) say
        // what everything below needs; the model decode runs is loaded once, at the end.
        let probe = Model::open(&path, WeightSource::STREAMED).map_err(load)?;
        let sparse = resolve_sparsity(&probe, &path, &sparsity, memory.is_some(), &mut *self.say)?;
        let tokenizer = Tokenizer::from_gguf(probe.file())?;
        let topology = self
            .topology
            .take()
            .unwrap_or_else(conductor_actors::detect_topology);
        let facts = ModelFacts::of(&probe, sparse.as_ref())?;
        let memory = memory.map(|memory| BudgetAsk {
            bytes: memory.bytes(probe.file().file_len()),
            context: self.context,
            sessions: self.sequences,
            step_logits: (
                self.step_logits.saturating_sub(1),
                step_logits_bytes(&probe, self.step_logits),
            ),
            reserved: self.reserved.clone(),
        });
        let settings = RunSettings {
            plan: given_plan,
            overrides: self.overrides.clone(),
            sparsity: sparse.as_ref().map_or(SparsityMode::Dense, |s| s.mode),
            all_tokens: sparsity.all_tokens,
            memory,
            mmap: self.mmap,
            down_blocks: self.down_blocks,
            interleave: self.interleave,
            kernels: self.kernels,
            output_vocab: self.output_vocab,
        };
        let resolved = resolve(settings, &facts, &topology)?;
        for note in &resolved.notes {
            (self.say)(note);
        }
        drop(probe);
        let model = Model::open(&path, resolved.load_options(sparse)).map_err(load)?;
        if resolved.budget.is_some() {
            release_freed_memory();
        }
        let ResolvedPlan {
            plan,
            ffn,
            budget,
            kernels,
            ..
        } = resolved;
        let default_ctx = match &budget {
            Some(fitted) => fitted.n_ctx,
            None => fit_default_context(&model, physical_memory(), &mut *self.say),
        };
        let model = Arc::new(model);
        let (driver, threads) = match self.driver {
            DriverKind::Inline => {
                let threads = self
                    .threads
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
                let pool = WorkerPool::new(PoolConfig::new(threads)).map_err(Error::Threads)?;
                let driver = InlineDriver::new(Arc::clone(&model), &plan, ffn, kernels, pool)?;
                (AnyDriver::Inline(Box::new(driver)), threads)
            }
            DriverKind::Actors => {
                let options = ActorOptions {
                    threads: self.threads.map(|t| t as u32),
                    topology: Some(topology),
                    no_pinning: !self.pin_threads,
                    model_path: Some(path.clone()),
                };
                let driver = ActorDriver::new(Arc::clone(&model), &plan, ffn, kernels, options)?;
                let threads = driver.decode_threads() as usize;
                (AnyDriver::Actors(Box::new(driver)), threads)
            }
        };
        Ok(Engine {
            model,
            tokenizer: Arc::new(tokenizer),
            driver,
            threads,
            path,
            load_time: started.elapsed(),
            budget,
            default_ctx,
            step_logits: self.step_logits,
        })
    }
}

impl From<ResolveError> for Error {
    fn from(e: ResolveError) -> Error {
        match e {
            ResolveError::Plan(e) => ScheduleError::Plan(e).into(),
            ResolveError::Settings(e) => Error::Settings(e),
            ResolveError::Ffn(e) => ScheduleError::from(e).into(),
            ResolveError::Budget(e) => Error::Budget(e),
            other @ (ResolveError::BudgetWithReserved { .. }
            | ResolveError::OutputVocab { .. }
            | ResolveError::OutputVocabWithBudget) => Error::Resolve(other),
        }
    }
}

/// Fits `plan` to a memory budget for a neuron store `model` with `n_ctx` tokens of context:
/// prefill steps of at most 64 tokens (their scratch counts against the budget), the budget
/// split into resident weights, KV cache, scratch, runtime and cache slots, the output
/// projection streamed in clusters sized to a slot. The plan's own cache section (policy,
/// pipeline depth, read grouping, hot units), when it has one, shapes the cache; the budget
/// decides its slots. What the engine does with `--memory`, and what `conductor simulate
/// --memory` and `conductor plan` predict.
pub fn apply_budget(
    model: &Model,
    plan: &mut ExecutionPlan,
    memory: MemoryBudget,
    n_ctx: usize,
) -> Result<BudgetSplit, BudgetError> {
    apply_budget_for(model, plan, memory, n_ctx, 1)
}

/// [`apply_budget`] for `sessions` sessions of `n_ctx` tokens each generated together (a
/// server's slots): the budget holds all their KV caches, and the neuron cache their
/// multi-sequence steps share gets what is left. On error `plan` is as it was.
pub fn apply_budget_for(
    model: &Model,
    plan: &mut ExecutionPlan,
    memory: MemoryBudget,
    n_ctx: usize,
    sessions: usize,
) -> Result<BudgetSplit, BudgetError> {
    let sizes = StoreSizes::of_store(model)?;
    let file_len = model.file().file_len();
    let sessions = u32::try_from(sessions).unwrap_or(u32::MAX);
    let n_ctx = u32::try_from(n_ctx).unwrap_or(u32::MAX);
    fit_plan_to_budget_for(&sizes, plan, memory.bytes(file_len), n_ctx, sessions)
}

/// What a budget holds for steps returning `rows` rows of logits beyond the one every step
/// returns ([`EngineBuilder::step_logits`]; `conductor simulate --draft-tokens` holds it too).
pub fn step_logits_bytes(model: &Model, rows: usize) -> u64 {
    rows.saturating_sub(1) as u64 * u64::from(model.config().n_vocab) * 4 * LOGIT_ROW_COPIES
}

/// Copies of a row of logits a step makes on its way out (the groups' output blocks, the
/// phase's collected logits, the driver's, the spare step's): what each further row a step
/// returns costs ([`EngineBuilder::step_logits`]).
const LOGIT_ROW_COPIES: u64 = 7;

/// The context a budget holds KV cache for when none is given ([`EngineBuilder::context`]).
pub use conductor_runtime::resolve::BUDGET_CONTEXT;

enum AnyDriver {
    Inline(Box<InlineDriver<WorkerPool>>),
    Actors(Box<ActorDriver>),
}

impl AnyDriver {
    fn get(&mut self) -> &mut dyn Driver {
        match self {
            AnyDriver::Inline(d) => &mut **d,
            AnyDriver::Actors(d) => &mut **d,
        }
    }
}

/// A loaded model, its tokenizer and the driver that runs it. Dropping it shuts the driver
/// down cleanly (actors stopped, threads joined).
pub struct Engine {
    model: Arc<Model>,
    /// Shared with whoever tokenizes for this engine on other threads (the server).
    tokenizer: Arc<Tokenizer>,
    driver: AnyDriver,
    threads: usize,
    path: PathBuf,
    load_time: Duration,
    /// How the memory budget was split, and the context it reserved.
    budget: Option<FittedBudget>,
    /// The most tokens a step may return logits for within the budget
    /// ([`EngineBuilder::step_logits`]); without a budget, any.
    step_logits: usize,
    /// Tokens a session holds when none is asked for: the budget's context, else the model's
    /// training context cut to what the machine holds.
    default_ctx: usize,
}

impl Engine {
    pub fn builder() -> EngineBuilder {
        EngineBuilder {
            model: None,
            memory: None,
            context: None,
            sequences: 1,
            step_logits: 1,
            reserved: None,
            overrides: PlanOverrides::default(),
            mmap: true,
            interleave: true,
            down_blocks: true,
            threads: None,
            plan: None,
            kernels: Kernels::best(),
            driver: DriverKind::default(),
            topology: None,
            pin_threads: true,
            sparsity: SparsitySettings::default(),
            output_vocab: None,
            say: Box::new(|line| eprintln!("{line}")),
        }
    }

    /// How the memory budget was split (engines built with one).
    pub fn budget(&self) -> Option<&BudgetSplit> {
        self.budget.as_ref().map(|b| &b.split)
    }

    /// The neuron cache's counters (engines with a memory budget).
    pub fn cache_report(&self) -> Option<CacheReport> {
        match &self.driver {
            AnyDriver::Inline(d) => d.cache_report(),
            AnyDriver::Actors(d) => d.cache_report(),
        }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn model_path(&self) -> &std::path::Path {
        &self.path
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The tokenizer, to share with other threads (it is immutable and `Sync`).
    pub fn shared_tokenizer(&self) -> Arc<Tokenizer> {
        self.tokenizer.clone()
    }

    /// Threads of the decode processor group.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Which driver runs the model.
    pub fn driver_kind(&self) -> DriverKind {
        match self.driver {
            AnyDriver::Inline(_) => DriverKind::Inline,
            AnyDriver::Actors(_) => DriverKind::Actors,
        }
    }

    /// The actor driver, if this engine runs one (placement, fault injection, storage).
    pub fn actor_driver(&mut self) -> Option<&mut ActorDriver> {
        match &mut self.driver {
            AnyDriver::Actors(d) => Some(d),
            AnyDriver::Inline(_) => None,
        }
    }

    /// [`Engine::eval`] with `probe` seeing its intermediate tensors by llama.cpp's names
    /// (inline driver only): what `conductor profile` records activations with and `conductor
    /// logits --tensors` writes. The probe lives for this evaluation only.
    pub fn eval_probed(
        &mut self,
        session: &mut Session,
        tokens: &[u32],
        logits_from: usize,
        on_logits: &mut dyn FnMut(usize, &[f32]),
        probe: conductor_runtime::exec::Probe,
    ) -> Result<(), Error> {
        self.check_model_file()?;
        match &mut self.driver {
            AnyDriver::Inline(d) => {
                Ok(d.eval_probed(session, tokens, logits_from, on_logits, probe)?)
            }
            AnyDriver::Actors(_) => Err(Error::NoProbe),
        }
    }

    /// Sparse decode's counters since the last call: (share of FFN gate rows computed, share
    /// of neurons active); `None` when decode is dense or nothing ran.
    pub fn take_sparsity_stats(&self) -> Option<(f64, f64)> {
        let sparse = self.model.sparse()?;
        sparse.stats.take()
    }

    /// Starts recording a trace.
    pub fn start_trace(&mut self) -> Result<(), Error> {
        match &mut self.driver {
            AnyDriver::Inline(d) => d.start_trace(),
            AnyDriver::Actors(d) => d.start_trace(),
        }
        Ok(())
    }

    /// Stops recording and returns the trace: every scheduler event with the commands it
    /// produced, activation sets and (actor driver) timed spans.
    pub fn take_trace(&mut self) -> Result<Trace, Error> {
        Ok(match &mut self.driver {
            AnyDriver::Inline(d) => d.take_trace(),
            AnyDriver::Actors(d) => d.take_trace(),
        })
    }

    /// Carries `trace` out through this engine's inline driver in a new session, really
    /// computing and reading: step `i` over the tokens `steps[i]`, completions in the trace's
    /// order, and the events finished phases owe derived anew from the data. Returns the
    /// records the dispatch core made, to compare with the trace's: the same events must give
    /// the same commands whichever backend carries them out.
    pub fn replay_trace(
        &mut self,
        trace: &Trace,
        steps: &[&[u32]],
    ) -> Result<Vec<conductor_runtime::trace::TraceRecord>, Error> {
        let mut session = self.session(None)?;
        let AnyDriver::Inline(d) = &mut self.driver else {
            return Err(Error::ReplayNeedsInline);
        };
        Ok(d.replay(&mut session, steps, &trace.records)?.records)
    }

    /// Time `build` took (fetch excluded only when the model was already cached).
    pub fn load_time(&self) -> Duration {
        self.load_time
    }

    /// A new session with room for `n_ctx` tokens (default: the budget's context, else the
    /// model's training context, cut to what half of the machine's memory holds). A context
    /// whose KV cache cannot be reserved is an error.
    pub fn session(&self, n_ctx: Option<usize>) -> Result<Session, Error> {
        let n_ctx = n_ctx.unwrap_or(self.default_ctx);
        Session::new(&self.model, n_ctx.max(1)).map_err(Error::Session)
    }

    /// The most tokens one step may return logits for: [`Engine::max_step_tokens`] without a
    /// budget; under one, what [`EngineBuilder::step_logits`] held room for.
    pub fn max_step_logits(&self) -> usize {
        match self.budget {
            Some(_) => self.step_logits,
            None => self.max_step_tokens(),
        }
    }

    /// The most tokens one step may hold: also the most sequences one multi-sequence step
    /// ([`Engine::step_sequences`]) may hold.
    pub fn max_step_tokens(&self) -> usize {
        match &self.driver {
            AnyDriver::Inline(d) => d.max_step_tokens(),
            AnyDriver::Actors(d) => d.max_step_tokens(),
        }
    }

    /// Tokens a session holds when none is asked for ([`Engine::session`]).
    pub fn default_context(&self) -> usize {
        self.default_ctx
    }

    /// Evaluates `tokens`; see [`Driver::eval`].
    pub fn eval(
        &mut self,
        session: &mut Session,
        tokens: &[u32],
        logits_from: usize,
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), Error> {
        self.check_model_file()?;
        Ok(self
            .driver
            .get()
            .eval(session, tokens, logits_from, on_logits)?)
    }

    /// A multi-sequence step: `tokens[i]` is the next token of `sessions[i]`; returns their
    /// logits, `[sequence][n_vocab]`, each sequence's the bits its own one-token step gives.
    /// See [`Driver::step_sequences`].
    pub fn step_sequences(
        &mut self,
        sessions: &mut [&mut Session],
        tokens: &[u32],
    ) -> Result<&[f32], Error> {
        self.check_model_file()?;
        let driver = self.driver.get();
        driver.step_sequences(sessions, tokens)?;
        Ok(driver.logits())
    }

    /// Another engine computes next on the same cores for a while (a draft model, its
    /// target): this one's threads waiting for a step park now instead of spinning through it.
    pub fn rest(&mut self) {
        self.driver.get().rest();
    }

    /// Evaluates `tokens` and returns the logits of the last one.
    pub fn eval_last(&mut self, session: &mut Session, tokens: &[u32]) -> Result<&[f32], Error> {
        self.check_model_file()?;
        Ok(self.driver.get().eval_last(session, tokens)?)
    }

    /// Before a request's steps, a server's batch step, and a stream's step after a pause
    /// ([`MODEL_FILE_CHECK_PAUSE`]): a memory-mapped model file that was truncated or modified
    /// since it was loaded fails the step (reading a page past a truncated end would raise
    /// `SIGBUS`).
    fn check_model_file(&self) -> Result<(), Error> {
        self.model.check_file().map_err(|source| Error::Load {
            path: self.model_path().to_path_buf(),
            source,
        })
    }

    /// The chat template for this model: the file's own or, for a file without one, its
    /// family's format ([`fallback_chat_template`]), whose name comes back so that callers can
    /// say so. `strftime_now` and the date variables give today's date (UTC).
    pub fn chat_template(&self) -> Result<(ChatTemplate, Option<&'static str>), TokenizerError> {
        let (template, fallback) = match self.tokenizer.chat_template() {
            Err(TokenizerError::NoChatTemplate) => {
                let (name, source) = fallback_chat_template(&self.model.config().arch_name);
                (self.tokenizer.chat_template_from(source)?, Some(name))
            }
            found => (found?, None),
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        Ok((template.with_time(now), fallback))
    }

    /// Tokenizes a prompt the way llama.cpp does for plain text: BOS if the model wants it,
    /// special tokens written in the text (`<|im_start|>`) parsed as such.
    pub fn tokenize(&self, text: &str) -> Vec<u32> {
        self.tokenizer.encode(text, true, true)
    }
}

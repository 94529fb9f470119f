//! A seeded fault-injection harness, after TigerBeetle's VOPR: one `u64` seed drives a
//! deterministic fault schedule (read errors, short reads, bit flips, latency spikes, stuck
//! reads; actor panics and deaths), injected into the real inline and actor drivers (through a
//! fault-injecting reader, [`Injector`], set on the store's [`BundleFile`] at construction, and
//! the actor driver's fault hooks) and into the simulator (on virtual time,
//! [`Fixture::simulate`]), with invariants checked beside every step:
//!
//! - every step gives exactly the fault-free bits (its logits) or fails with an error;
//! - the step after a failure, retried as the API does it (the same token again, or the
//!   prompt from its first token the session does not hold; the actor driver replaces its
//!   actors first), gives the fault-free bits once no fault is scheduled on it;
//! - every step returns within its bound (the plan's step deadline, plus the actors' restart);
//! - no cache slot is held between steps, and no thread outlives a seed's driver;
//! - a seed's schedule is a function of the seed alone (printed with any failure), and on the
//!   inline driver so is everything the run does.
//!
//! `cargo run --release --example fault_injection -- --seeds 1000` runs the figure of
//! `docs/reliability.md`; `tests/fault_injection.rs` runs a few seeds and the regressions.
//!
//! [`BundleFile`]: crate::runtime::cache::BundleFile

use crate::runtime::cache::{ReadFault, ReadFaults};
use crate::runtime::convert::{convert, ConvertOptions};
use crate::runtime::exec::{Driver, InlineDriver, Serial, Session, StepError};
use crate::runtime::model::Model;
use crate::runtime::plan::{CachePlan, CachePolicy, ExecutionPlan, IoEngine, Topology};
use crate::runtime::quant::Kernels;
use crate::runtime::sample::argmax;
use crate::runtime::synthetic::{synthetic_model, SyntheticSpec};
use conductor_actors::{ActorDriver, ActorOptions};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Decode steps per seed.
pub const DECODE_STEPS: u32 = 64;
/// Attempts of one step that may carry faults; the next attempt is always clean.
pub const FAULTY_ATTEMPTS: u32 = 3;

/// The schedule depends on the seed only.
type SplitMix = conductor_runtime::sample::SplitMix64;

/// True with probability `per_mille` in 1/1000ths.
fn chance(rng: &mut SplitMix, per_mille: u64) -> bool {
    rng.below(1000) < per_mille
}

/// What a fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// The read fails (EIO).
    ReadError,
    /// The read returns this share (in 1/1000ths) of its bytes.
    ShortRead(u16),
    /// One bit of what the read returned is flipped (this bit, modulo the bits read).
    BitFlip(u64),
    /// The read takes this many microseconds longer.
    LatencySpike(u32),
    /// The read does not return until cancelled or this many milliseconds past the step
    /// deadline, then fails.
    StuckRead(u32),
    /// The processor group panics in its next compute (actor driver, simulator).
    GroupPanic,
    /// The storage actor panics in its next read (actor driver, simulator).
    StoragePanic,
    /// The processor group's actor is stopped before the step (actor driver, simulator).
    GroupDeath,
    /// The storage actor is stopped before the step (actor driver, simulator).
    StorageDeath,
}

/// Kinds as counted in reports, in this order.
pub const KIND_NAMES: [&str; 9] = [
    "read error",
    "short read",
    "bit flip",
    "latency spike",
    "stuck read",
    "group panic",
    "storage panic",
    "group death",
    "storage death",
];

impl FaultKind {
    /// Index into [`KIND_NAMES`].
    pub fn index(self) -> usize {
        match self {
            FaultKind::ReadError => 0,
            FaultKind::ShortRead(_) => 1,
            FaultKind::BitFlip(_) => 2,
            FaultKind::LatencySpike(_) => 3,
            FaultKind::StuckRead(_) => 4,
            FaultKind::GroupPanic => 5,
            FaultKind::StoragePanic => 6,
            FaultKind::GroupDeath => 7,
            FaultKind::StorageDeath => 8,
        }
    }

    /// Whether it strikes a read (else an actor, before the step).
    pub fn is_read(self) -> bool {
        self.index() <= 4
    }
}

/// One fault of a schedule: at decode step `step` (1-based), attempt `attempt` (0: the
/// first), on the `read`-th read of the store that attempt makes (read faults), or before the
/// attempt starts (actor faults, `read` 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Fault {
    pub step: u32,
    pub attempt: u32,
    pub read: u32,
    pub kind: FaultKind,
}

/// A seed's faults, sorted by (step, attempt, read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub seed: u64,
    pub faults: Vec<Fault>,
}

impl Schedule {
    /// The schedule of `seed` for a run whose prompt makes `reads[0]` reads of the store and
    /// whose decode step `i` (1-based) makes `reads[i]`, when nothing fails (read faults aim
    /// within them).
    ///
    /// Per seed: 0 to 7 fault events on random decode steps; a read event strikes one read
    /// or, one time in three, two reads in a row (a read and its retry: the step then fails);
    /// one event in four repeats on the next attempt. One seed in four also has one or two
    /// events on the prompt (step 0), drawn from a stream of their own, so that the decode
    /// steps' faults are those the seed had before prompts took faults.
    pub fn from_seed(seed: u64, reads: &[u32]) -> Schedule {
        let decode = reads.get(1..).unwrap_or_default();
        let mut rng = SplitMix::new(seed);
        let mut faults = Vec::new();
        for _ in 0..rng.below(8) {
            let step = 1 + rng.below(decode.len().max(1) as u64) as u32;
            let n_reads = decode.get(step as usize - 1).copied().unwrap_or(0);
            push_event(&mut rng, step, n_reads, &mut faults);
        }
        let mut prompt = SplitMix::new(seed ^ PROMPT_STREAM);
        if chance(&mut prompt, 250) {
            for _ in 0..1 + prompt.below(2) {
                let n_reads = reads.first().copied().unwrap_or(0);
                push_event(&mut prompt, 0, n_reads, &mut faults);
            }
        }
        faults.sort();
        faults.dedup_by(|a, b| (a.step, a.attempt, a.read) == (b.step, b.attempt, b.read));
        Schedule { seed, faults }
    }

    /// The faults of attempt `attempt` of step `step` (0: the prompt; then the decode steps).
    pub fn at(&self, step: u32, attempt: u32) -> impl Iterator<Item = &Fault> {
        self.faults
            .iter()
            .filter(move |f| f.step == step && f.attempt == attempt)
    }
}

/// The stream the prompt's faults are drawn from: the seed xor this.
const PROMPT_STREAM: u64 = 0x7072_6f6d_7074_0001;

/// One fault event on `step` (which makes `n_reads` reads when nothing fails): its faults on
/// the first attempt and, one time in four each, on the next ones.
fn push_event(rng: &mut SplitMix, step: u32, n_reads: u32, faults: &mut Vec<Fault>) {
    let n_reads = n_reads.max(1);
    let mut attempt = 0;
    loop {
        let read = rng.below(u64::from(n_reads)) as u32;
        let kind = match rng.below(100) {
            0..=19 => FaultKind::ReadError,
            20..=34 => FaultKind::ShortRead(rng.below(1000) as u16),
            35..=54 => FaultKind::BitFlip(rng.next_u64()),
            55..=74 => FaultKind::LatencySpike(100 + rng.below(20_000) as u32),
            75..=79 => {
                FaultKind::StuckRead(100 + rng.below(STUCK_MAX.as_millis() as u64 - 100) as u32)
            }
            80..=84 => FaultKind::GroupPanic,
            85..=89 => FaultKind::StoragePanic,
            90..=94 => FaultKind::GroupDeath,
            _ => FaultKind::StorageDeath,
        };
        let read = if kind.is_read() { read } else { 0 };
        faults.push(Fault {
            step,
            attempt,
            read,
            kind,
        });
        let double = matches!(
            kind,
            FaultKind::ReadError | FaultKind::ShortRead(_) | FaultKind::BitFlip(_)
        ) && chance(rng, 333);
        if double {
            let kind = match rng.below(3) {
                0 => FaultKind::ReadError,
                1 => FaultKind::ShortRead(rng.below(1000) as u16),
                _ => FaultKind::BitFlip(rng.next_u64()),
            };
            faults.push(Fault {
                step,
                attempt,
                read: read + 1,
                kind,
            });
        }
        attempt += 1;
        if attempt >= FAULTY_ATTEMPTS || !chance(rng, 250) {
            break;
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seed {}: {} faults", self.seed, self.faults.len())?;
        for x in &self.faults {
            write!(
                f,
                "\n  step {} attempt {} read {}: {:?}",
                x.step, x.attempt, x.read, x.kind
            )?;
        }
        Ok(())
    }
}

/// Faults injected, by kind ([`KIND_NAMES`]).
pub type KindCounts = [u64; 9];

/// The fault-injecting reader: set on a store's reads (`InlineDriver::set_read_faults`,
/// `ActorOptions::read_faults`), it counts the reads of the current attempt and strikes the
/// ones the schedule names. A latency spike sleeps; a stuck read waits until [`Injector::cancel`]
/// or the step deadline (plus a margin) and then fails.
#[derive(Debug)]
pub struct Injector {
    state: Mutex<Armed>,
    cancelled: Condvar,
    deadline: Duration,
    /// Faults that struck, by kind.
    fired: [AtomicU64; 9],
}

#[derive(Debug, Default)]
struct Armed {
    /// Reads of the store since [`Injector::arm`].
    reads: u32,
    faults: Vec<(u32, FaultKind)>,
    /// Stuck reads end at once from now on (until the next arm).
    cancelled: bool,
}

impl Injector {
    pub fn new(deadline: Duration) -> Injector {
        Injector {
            state: Mutex::new(Armed::default()),
            cancelled: Condvar::new(),
            deadline,
            fired: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Armed> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new attempt starts: reads count from 0 and `faults` (read index, kind) are armed.
    pub fn arm(&self, faults: impl IntoIterator<Item = (u32, FaultKind)>) {
        let mut s = self.lock();
        s.reads = 0;
        s.faults = faults.into_iter().collect();
        s.cancelled = false;
    }

    /// Reads counted since the last [`Injector::arm`].
    pub fn reads(&self) -> u32 {
        self.lock().reads
    }

    /// Ends every stuck read now (they fail), and disarms what is left.
    pub fn cancel(&self) {
        let mut s = self.lock();
        s.cancelled = true;
        s.faults.clear();
        self.cancelled.notify_all();
    }

    /// Counts an actor fault fired by the harness.
    pub fn count(&self, kind: FaultKind) {
        self.fired[kind.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Faults that struck so far, by kind.
    pub fn fired(&self) -> KindCounts {
        std::array::from_fn(|i| self.fired[i].load(Ordering::Relaxed))
    }
}

impl ReadFaults for Injector {
    fn before_read(&self, _offset: u64, len: usize) -> ReadFault {
        let kind = {
            let mut s = self.lock();
            let k = s.reads;
            s.reads += 1;
            s.faults
                .iter()
                .find(|(r, _)| *r == k)
                .map(|&(_, kind)| kind)
        };
        let Some(kind) = kind else {
            return ReadFault::None;
        };
        self.count(kind);
        match kind {
            FaultKind::ReadError => ReadFault::Fail(std::io::ErrorKind::Other),
            FaultKind::ShortRead(per_mille) => {
                ReadFault::Short(len * usize::from(per_mille) / 1000)
            }
            FaultKind::BitFlip(bit) => ReadFault::Flip(bit),
            FaultKind::LatencySpike(us) => {
                std::thread::sleep(Duration::from_micros(u64::from(us)));
                ReadFault::None
            }
            FaultKind::StuckRead(past) => {
                // Past the step deadline (so that the driver's deadline is what the step
                // meets first), or until cancelled.
                let until = Instant::now() + self.deadline + Duration::from_millis(past.into());
                let mut s = self.lock();
                while !s.cancelled {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    s = self
                        .cancelled
                        .wait_timeout(s, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                ReadFault::Fail(std::io::ErrorKind::TimedOut)
            }
            _ => ReadFault::None,
        }
    }
}

/// Which driver a run uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Which {
    #[default]
    Inline,
    Actors,
    /// The simulator, on virtual time ([`Fixture::simulate`]).
    Simulator,
}

impl Which {
    pub fn name(self) -> &'static str {
        match self {
            Which::Inline => "inline",
            Which::Actors => "actors",
            Which::Simulator => "simulator",
        }
    }
}

/// The model, the plan and the fault-free run the seeds are checked against.
#[derive(Clone)]
pub struct Fixture {
    pub path: PathBuf,
    pub model: Arc<Model>,
    pub plan: ExecutionPlan,
    pub prompt: Vec<u32>,
    pub n_ctx: usize,
    /// Tokens fed at decode steps 1..=64 (greedy on the fault-free logits).
    pub tokens: Vec<u32>,
    /// Fault-free logits (as bits) after the prompt (index 0) and after each decode step.
    pub logits: Vec<Vec<u32>>,
    /// Reads of the store the prompt (index 0) and each decode step make without faults (on
    /// the inline driver).
    pub reads: Vec<u32>,
    /// How the plan's budget was made, for reports.
    pub describe: String,
}

/// The synthetic model the harness runs by default (random weights): 3 layers, 128 wide,
/// 512 FFN neurons in bundles of 64, grouped-query attention, a 320-token vocabulary.
pub fn default_spec() -> SyntheticSpec {
    SyntheticSpec {
        n_layer: 3,
        n_embd: 128,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 2,
        seed: 7,
        ..SyntheticSpec::default()
    }
}

/// The step deadline the harness runs under (the plan's `step_deadline_ms`).
pub const DEADLINE: Duration = Duration::from_millis(500);
/// How long past the deadline a stuck read may stay stuck at most.
pub const STUCK_MAX: Duration = Duration::from_millis(3000);

impl Fixture {
    /// The default model (see [`default_spec`]) written and converted in `dir`, run with
    /// everything that can stream streaming (FFN bundles, attention matrices, output rows) and
    /// a cache of half the units that stream.
    pub fn synthetic(dir: &Path) -> Result<Fixture, String> {
        let err = |e: &dyn fmt::Display| e.to_string();
        std::fs::create_dir_all(dir).map_err(|e| err(&e))?;
        let source = dir.join("fault-source.gguf");
        let store = dir.join("fault-store.gguf");
        if !store.exists() {
            let bytes = synthetic_model(&default_spec())
                .and_then(|w| w.to_bytes())
                .map_err(|e| err(&e))?;
            std::fs::write(&source, bytes).map_err(|e| err(&e))?;
            convert(
                &source,
                &store,
                &ConvertOptions::neuron_columns(64),
                &mut |_, _| {},
            )
            .map_err(|e| err(&e))?;
        }
        let model = Model::load_resident_with(&store, true, true).map_err(|e| err(&e))?;
        let mut plan = ExecutionPlan {
            prefill_max_tokens: 4,
            step_deadline_ms: DEADLINE.as_millis() as u64,
            ..ExecutionPlan::default()
        };
        plan.decode.output_rows = 64;
        plan.prefill.output_rows = 64;
        let c = &model.config;
        let bundles = c.n_ff.div_ceil(64);
        let output = c.n_vocab.div_ceil(64);
        let units = c.n_layer * (bundles + 4) + output;
        plan.cache = Some(CachePlan {
            slots: units / 2,
            hot_slots: units / 8,
            policy: CachePolicy::Segmented,
            max_loads: 4,
            stream_output: true,
            stream_attention: true,
            coalesce: 2,
            ..CachePlan::default()
        });
        plan.storage.direct_io = false;
        let describe = format!(
            "synthetic llama (random weights): {} layers, {} wide, {} FFN neurons, {}-token vocabulary; store {} KiB; a cache of {} of its {units} streamed units (FFN bundles, attention matrices, output rows)",
            c.n_layer,
            c.n_embd,
            c.n_ff,
            c.n_vocab,
            std::fs::metadata(&store).map_or(0, |m| m.len()) >> 10,
            units / 2,
        );
        Fixture::with(store, model, plan, describe)
    }

    /// A neuron store run under `budget` (what `--memory` gives it: `crate::apply_budget`).
    pub fn store(
        path: &Path,
        budget: crate::runtime::cache::MemoryBudget,
    ) -> Result<Fixture, String> {
        let err = |e: &dyn fmt::Display| e.to_string();
        let mut model = Model::load_resident_with(path, true, true).map_err(|e| err(&e))?;
        let mut plan = ExecutionPlan {
            step_deadline_ms: DEADLINE.as_millis() as u64 * 4,
            ..ExecutionPlan::default()
        };
        let n_ctx = 256;
        let split = crate::apply_budget(&model, &mut plan, budget, n_ctx).map_err(|e| err(&e))?;
        if !split.plan.stream_attention {
            model = Model::load_resident_with(path, true, false).map_err(|e| err(&e))?;
        }
        plan.storage.direct_io = false;
        let describe = format!(
            "{} under a budget of {} MiB: {} cache slots, attention {}",
            path.display(),
            split.budget >> 20,
            split.plan.slots,
            if split.plan.stream_attention {
                "streamed"
            } else {
                "resident"
            }
        );
        Fixture::with(path.to_path_buf(), model, plan, describe)
    }

    fn with(
        path: PathBuf,
        model: Model,
        plan: ExecutionPlan,
        describe: String,
    ) -> Result<Fixture, String> {
        let model = Arc::new(model);
        let n_vocab = model.config.n_vocab;
        let prompt: Vec<u32> = [3u32, 17, 42, 5, 99, 120, 7]
            .iter()
            .map(|t| t % n_vocab)
            .collect();
        let mut fixture = Fixture {
            path,
            model,
            plan,
            prompt,
            n_ctx: 128,
            tokens: Vec::new(),
            logits: Vec::new(),
            reads: Vec::new(),
            describe,
        };
        fixture.record()?;
        Ok(fixture)
    }

    /// The same model and budget with reads through `engine` on `io_threads` issuers (the
    /// actor driver's storage actors; the inline driver issues from its own thread), and the
    /// fault-free run made again under them.
    pub fn with_storage(mut self, engine: IoEngine, io_threads: u32) -> Result<Fixture, String> {
        self.plan.storage.engine = engine;
        self.plan.storage.io_threads = io_threads;
        self.describe += &format!("; {engine:?} reads, {io_threads} I/O threads");
        self.tokens.clear();
        self.logits.clear();
        self.reads.clear();
        self.record()?;
        Ok(self)
    }

    /// The fault-free run, on the inline driver, counting each step's reads.
    fn record(&mut self) -> Result<(), String> {
        let fixture = self;
        let injector = Arc::new(Injector::new(DEADLINE));
        let mut driver = fixture.inline(&injector).map_err(|e| e.to_string())?;
        let mut session = Session::new(&fixture.model, fixture.n_ctx).map_err(|e| e.to_string())?;
        injector.arm([]);
        let mut logits = driver
            .eval_last(&mut session, &fixture.prompt)
            .map_err(|e| e.to_string())?
            .to_vec();
        fixture.reads.push(injector.reads());
        fixture.logits.push(bits(&logits));
        for _ in 0..DECODE_STEPS {
            let token = argmax(&logits);
            fixture.tokens.push(token);
            injector.arm([]);
            logits = driver
                .eval_last(&mut session, &[token])
                .map_err(|e| e.to_string())?
                .to_vec();
            fixture.reads.push(injector.reads());
            fixture.logits.push(bits(&logits));
        }
        Ok(())
    }

    fn inline(&self, injector: &Arc<Injector>) -> Result<InlineDriver<Serial>, StepError> {
        let mut d =
            InlineDriver::new(Arc::clone(&self.model), &self.plan, Kernels::best(), Serial)?;
        d.set_read_faults(Some(Arc::clone(injector) as Arc<dyn ReadFaults>));
        Ok(d)
    }

    fn actors(&self, injector: &Arc<Injector>) -> Result<ActorDriver, String> {
        let options = ActorOptions {
            threads: Some(2),
            topology: Some(Topology::uniform(2)),
            no_pinning: true,
            model_path: Some(self.path.clone()),
            read_faults: Some(Arc::clone(injector) as Arc<dyn ReadFaults>),
        };
        ActorDriver::new(
            Arc::clone(&self.model),
            &self.plan,
            Kernels::best(),
            options,
        )
        .map_err(|e| e.to_string())
    }

    /// The plan's step deadline.
    pub fn deadline(&self) -> Duration {
        Duration::from_millis(self.plan.step_deadline_ms)
    }

    /// The name of the plan's first decode group (the actor faults' target).
    fn group(&self) -> String {
        self.plan.decode_on[0].group.clone()
    }

    /// Runs `schedule` on driver `which`: the prompt, then every decode step, each under its
    /// faults, failed attempts retried, each checked.
    pub fn run(&self, which: Which, schedule: &Schedule, watchdog: &Watchdog) -> SeedReport {
        let mut report = SeedReport {
            seed: schedule.seed,
            which,
            ..SeedReport::default()
        };
        let threads_before = count_threads();
        let injector = Arc::new(Injector::new(self.deadline()));
        let run = self.run_steps(which, schedule, watchdog, &injector, &mut report);
        if let Err(why) = run {
            report.violations.push(why);
        }
        injector.cancel();
        report.fired = injector.fired();
        // Every thread the driver started ends with it (a stuck read's thread once its read
        // returns: within the deadline).
        let grace = Instant::now() + self.deadline() + STUCK_MAX + Duration::from_secs(2);
        let mut threads = count_threads();
        while threads > threads_before && Instant::now() < grace {
            std::thread::sleep(Duration::from_millis(5));
            threads = count_threads();
        }
        if threads > threads_before {
            report.leaked_threads = (threads - threads_before) as u64;
            report.violations.push(format!(
                "{} threads outlived the driver",
                threads - threads_before
            ));
        }
        report
    }

    fn run_steps(
        &self,
        which: Which,
        schedule: &Schedule,
        watchdog: &Watchdog,
        injector: &Arc<Injector>,
        report: &mut SeedReport,
    ) -> Result<(), String> {
        let mut driver: Box<dyn Checked> = match which {
            Which::Inline => Box::new(self.inline(injector).map_err(|e| e.to_string())?),
            Which::Actors => Box::new(self.actors(injector)?),
            Which::Simulator => return Err("the simulator runs through Fixture::simulate".into()),
        };
        let mut session = Session::new(&self.model, self.n_ctx).map_err(|e| e.to_string())?;
        // The bound of a step: the deadline, the actors' restart (up to a second per host
        // that does not answer) or on the inline driver, which has no deadline of its own, the
        // longest stuck read; and slack for a loaded machine. The prompt is several steps.
        let bound = self.deadline() + STUCK_MAX + Duration::from_secs(2);
        let prompt_steps = self
            .prompt
            .len()
            .div_ceil(self.plan.prefill_max_tokens.max(1) as usize);
        // Step 0 is the prompt, then the decode steps.
        for step in 0..=DECODE_STEPS {
            let mut attempt = 0;
            loop {
                // A failed prompt is taken up again from the first token the session does not
                // hold: its steps that completed stay (`Driver::eval`).
                let tokens = match step {
                    0 => &self.prompt[session.n_past()..],
                    _ => std::slice::from_ref(&self.tokens[step as usize - 1]),
                };
                let bound = match step {
                    0 => bound * prompt_steps as u32,
                    _ => bound,
                };
                let faults: Vec<&Fault> = schedule.at(step, attempt).collect();
                injector.arm(
                    faults
                        .iter()
                        .filter(|f| f.kind.is_read())
                        .map(|f| (f.read, f.kind)),
                );
                for f in faults.iter().filter(|f| !f.kind.is_read()) {
                    if let Some(actors) = driver.as_actor() {
                        if self.fire_actor_fault(actors, f.kind) {
                            injector.count(f.kind);
                        }
                    }
                }
                watchdog.start(schedule, which, step, attempt);
                let started = Instant::now();
                let result = driver.eval_last(&mut session, tokens).map(bits);
                let took = started.elapsed();
                watchdog.stop();
                // What is left of this attempt's faults does not carry over.
                injector.arm([]);
                report.steps += 1;
                if took > bound {
                    report.hangs += 1;
                    report.violations.push(format!(
                        "step {step} attempt {attempt} took {took:?} (bound {bound:?})"
                    ));
                }
                let held = driver.held_slots();
                if held > 0 {
                    report.leaked_slots += u64::from(held);
                    report.violations.push(format!(
                        "step {step} attempt {attempt}: {held} cache slots held after the step"
                    ));
                }
                match result {
                    Ok(got) if got == self.logits[step as usize] => break,
                    Ok(_) => {
                        report.wrong += 1;
                        report.violations.push(format!(
                            "step {step} attempt {attempt}: logits differ from the fault-free run"
                        ));
                        break;
                    }
                    Err(e) => {
                        report.failed += 1;
                        if step == 0 {
                            report.failed_prompt += 1;
                        }
                        if attempt >= FAULTY_ATTEMPTS {
                            report.unrecovered += 1;
                            return Err(format!(
                                "step {step}: attempt {attempt} had no fault and failed: {e}"
                            ));
                        }
                        attempt += 1;
                    }
                }
            }
        }
        Ok(())
    }

    /// Fires an actor fault on the actor driver; whether it struck.
    fn fire_actor_fault(&self, d: &ActorDriver, kind: FaultKind) -> bool {
        match kind {
            FaultKind::GroupPanic => d.inject_panic(&self.group()),
            FaultKind::StoragePanic => d.inject_storage_panic(0),
            FaultKind::GroupDeath => d.kill_group(&self.group()),
            FaultKind::StorageDeath => d.kill_storage(0),
            _ => false,
        }
    }
}

/// What the harness needs of a driver besides [`Driver`].
trait Checked: Driver {
    fn held_slots(&self) -> u32;
    fn as_actor(&self) -> Option<&ActorDriver>;
}

impl Checked for InlineDriver<Serial> {
    fn held_slots(&self) -> u32 {
        self.held_cache_slots().unwrap_or(0)
    }

    fn as_actor(&self) -> Option<&ActorDriver> {
        None
    }
}

impl Checked for ActorDriver {
    /// The scheduler that will serve the next step: after a failed step the driver replaces
    /// its actors (and the scheduler with its cache directory), so only a healthy one counts.
    fn held_slots(&self) -> u32 {
        if self.needs_restart() {
            return 0;
        }
        self.held_cache_slots().unwrap_or(0)
    }

    fn as_actor(&self) -> Option<&ActorDriver> {
        Some(self)
    }
}

/// What one seed on one driver did.
#[derive(Clone, Debug, Default)]
pub struct SeedReport {
    pub seed: u64,
    pub which: Which,
    /// Step attempts run, and those that failed with an error.
    pub steps: u64,
    pub failed: u64,
    /// Of those, attempts of the prompt.
    pub failed_prompt: u64,
    /// Violations of the invariants.
    pub wrong: u64,
    pub hangs: u64,
    pub leaked_slots: u64,
    pub leaked_threads: u64,
    /// Clean attempts (after a failure) that failed.
    pub unrecovered: u64,
    pub fired: KindCounts,
    pub violations: Vec<String>,
}

impl SeedReport {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// What the run did, for comparing two runs of a seed: attempts, failures, faults struck.
    pub fn outcome(&self) -> (u64, u64, KindCounts) {
        (self.steps, self.failed, self.fired)
    }
}

/// Fails a run that does not return: a step still running after [`Watchdog::LIMIT`] prints
/// the seed, its schedule and the step, and ends the process (a hung thread cannot be
/// joined, and a hang must not hang CI).
pub struct Watchdog {
    current: Arc<Mutex<Option<(Instant, String)>>>,
}

impl Watchdog {
    pub const LIMIT: Duration = Duration::from_secs(60);

    pub fn new() -> Watchdog {
        let current: Arc<Mutex<Option<(Instant, String)>>> = Arc::default();
        let watched = Arc::clone(&current);
        std::thread::Builder::new()
            .name("fault-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(250));
                let now = watched.lock().unwrap_or_else(|e| e.into_inner()).clone();
                if let Some((since, what)) = now {
                    if since.elapsed() > Watchdog::LIMIT {
                        eprintln!("HANG: {what} did not return within {:?}", Watchdog::LIMIT);
                        std::process::exit(3);
                    }
                }
            })
            .expect("the watchdog thread starts");
        Watchdog { current }
    }

    fn start(&self, schedule: &Schedule, which: Which, step: u32, attempt: u32) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some((
            Instant::now(),
            format!(
                "{} driver, step {step} attempt {attempt}, {schedule}",
                which.name()
            ),
        ));
    }

    fn stop(&self) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl Default for Watchdog {
    fn default() -> Self {
        Watchdog::new()
    }
}

/// Threads of this process now (`/proc/self/task`; 0 where there is none).
pub fn count_threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

fn bits(logits: &[f32]) -> Vec<u32> {
    logits.iter().map(|x| x.to_bits()).collect()
}

/// Totals over many seeds.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    pub seeds: u64,
    pub steps: u64,
    pub failed: u64,
    /// Of those, attempts of the prompt.
    pub failed_prompt: u64,
    pub wrong: u64,
    pub hangs: u64,
    pub leaked_slots: u64,
    pub leaked_threads: u64,
    pub unrecovered: u64,
    pub fired: KindCounts,
    /// Seeds with a violation, with what it was.
    pub failing: Vec<(u64, String)>,
}

impl Totals {
    pub fn add(&mut self, r: &SeedReport) {
        self.seeds += 1;
        self.steps += r.steps;
        self.failed += r.failed;
        self.failed_prompt += r.failed_prompt;
        self.wrong += r.wrong;
        self.hangs += r.hangs;
        self.leaked_slots += r.leaked_slots;
        self.leaked_threads += r.leaked_threads;
        self.unrecovered += r.unrecovered;
        for (t, f) in self.fired.iter_mut().zip(r.fired) {
            *t += f;
        }
        if !r.ok() {
            self.failing.push((r.seed, r.violations.join("; ")));
        }
    }

    /// One line per count.
    pub fn summary(&self) -> String {
        let fired: Vec<String> = KIND_NAMES
            .iter()
            .zip(self.fired)
            .map(|(n, c)| format!("{n} {c}"))
            .collect();
        format!(
            "{} seeds, {} step attempts ({} failed with an error, {} of them the prompt's); faults injected: {}; wrong outputs {}, hangs {}, leaked slots {}, leaked threads {}, unrecovered {}",
            self.seeds,
            self.steps,
            self.failed,
            self.failed_prompt,
            fired.join(", "),
            self.wrong,
            self.hangs,
            self.leaked_slots,
            self.leaked_threads,
            self.unrecovered,
        )
    }
}

/// The seed's schedule on the simulator: read faults on the reads the simulator issues (a
/// run read as one counts once), actor faults on the next compute or read.
struct SimInjector<'s> {
    schedule: &'s Schedule,
    faults: Vec<(u32, FaultKind)>,
    fired: KindCounts,
}

impl conductor_simulator::SimFaults for SimInjector<'_> {
    fn before_step(
        &mut self,
        index: usize,
        decode: Option<u32>,
        attempt: u32,
    ) -> conductor_simulator::SimActorFaults {
        let mut actors = conductor_simulator::SimActorFaults::default();
        self.faults.clear();
        // Decode steps are numbered from 1 here, as in the real drivers' schedule; the
        // prompt's faults (step 0) strike its first prefill step.
        let step = match decode {
            Some(i) => i + 1,
            None if index == 0 => 0,
            None => return actors,
        };
        for f in self.schedule.at(step, attempt) {
            match f.kind {
                FaultKind::GroupPanic | FaultKind::GroupDeath => actors.group = true,
                FaultKind::StoragePanic | FaultKind::StorageDeath => actors.storage = true,
                kind => {
                    self.faults.push((f.read, kind));
                    continue;
                }
            }
            self.fired[f.kind.index()] += 1;
        }
        actors
    }

    fn read(&mut self, read: u32) -> conductor_simulator::SimReadFault {
        use conductor_simulator::SimReadFault;
        let Some(&(_, kind)) = self.faults.iter().find(|(r, _)| *r == read) else {
            return SimReadFault::None;
        };
        self.fired[kind.index()] += 1;
        match kind {
            FaultKind::ReadError | FaultKind::ShortRead(_) | FaultKind::BitFlip(_) => {
                SimReadFault::Bad
            }
            FaultKind::LatencySpike(us) => SimReadFault::Delay(u64::from(us) * 1000),
            FaultKind::StuckRead(_) => SimReadFault::Stuck,
            _ => SimReadFault::None,
        }
    }
}

/// The hardware profile the simulator runs the seeds on (this repository's build machine).
pub fn sim_profile() -> crate::runtime::plan::HardwareProfile {
    crate::runtime::plan::HardwareProfile::from_toml(include_str!("../profiles/build-machine.toml"))
        .expect("the repository's build-machine profile parses")
}

impl Fixture {
    /// Runs `schedule` on the simulator (virtual time, the plan's deadline in virtual
    /// nanoseconds), twice: the invariants are checked on the first run, and the second must
    /// be the same run.
    pub fn simulate(
        &self,
        profile: &crate::runtime::plan::HardwareProfile,
        schedule: &Schedule,
    ) -> SeedReport {
        let mut report = SeedReport {
            seed: schedule.seed,
            which: Which::Simulator,
            ..SeedReport::default()
        };
        let workload = conductor_simulator::Workload::new(
            self.model.description(),
            self.prompt.len() as u32,
            DECODE_STEPS,
        );
        let deadline_ns = self.deadline().as_nanos() as u64;
        let run = |fired: &mut KindCounts| {
            let mut injector = SimInjector {
                schedule,
                faults: Vec::new(),
                fired: KindCounts::default(),
            };
            let run = conductor_simulator::simulate_with_faults(
                profile,
                &self.plan,
                &workload,
                &mut injector,
                deadline_ns,
            );
            *fired = injector.fired;
            run
        };
        let first = run(&mut report.fired);
        let mut again_fired = KindCounts::default();
        let again = run(&mut again_fired);
        let run = match first {
            Ok(run) => run,
            Err(e) => {
                report.unrecovered += 1;
                report
                    .violations
                    .push(format!("the simulation failed: {e}"));
                return report;
            }
        };
        if again.as_ref().ok() != Some(&run) || again_fired != report.fired {
            report
                .violations
                .push("a second simulation of the seed differs from the first".into());
        }
        for a in &run.attempts {
            report.steps += 1;
            if a.end_ns - a.start_ns > deadline_ns {
                report.hangs += 1;
                report.violations.push(format!(
                    "step {} attempt {} took {} ns of virtual time",
                    a.index,
                    a.attempt,
                    a.end_ns - a.start_ns
                ));
            }
            if let Some(why) = &a.failed {
                report.failed += 1;
                if a.decode.is_none() {
                    report.failed_prompt += 1;
                }
                if a.attempt >= FAULTY_ATTEMPTS {
                    report.unrecovered += 1;
                    report.violations.push(format!(
                        "step {} attempt {} had no fault and failed: {why}",
                        a.index, a.attempt
                    ));
                }
            }
        }
        if run.held_slots > 0 {
            report.leaked_slots += u64::from(run.held_slots);
            report
                .violations
                .push(format!("{} cache slots held after the run", run.held_slots));
        }
        report
    }
}

/// Keeps the panics the harness injects (their message says "injected fault") off stderr;
/// every other panic is reported as before.
pub fn quiet_injected_panics() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if !message.contains("injected fault") {
            previous(info);
        }
    }));
}

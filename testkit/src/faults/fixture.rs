//! The fixture the seeds run on: the model, its plan, and the fault-free run every step is
//! checked against; and the drivers made for it, with the injector set on their reads.

use super::{bits, Injector, DEADLINE, DECODE_STEPS};
use conductor::runtime::cache::ReadFaults;
use conductor::runtime::convert::{convert, ConvertOptions};
use conductor::runtime::exec::{ffn_plan_of, Driver, InlineDriver, Serial, Session};
use conductor::runtime::model::{LoadOptions, Model, WeightSource};
use conductor::runtime::plan::{CachePlan, CachePolicy, ExecutionPlan, IoEngine, Topology};
use conductor::runtime::quant::Kernels;
use conductor::runtime::sample::argmax;
use conductor::runtime::synthetic::{synthetic_model, SyntheticSpec};
use conductor_actors::{ActorDriver, ActorOptions};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The model, the plan and the fault-free run the seeds are checked against.
#[derive(Clone)]
pub struct Fixture {
    pub path: PathBuf,
    /// The model loaded without faults (the drivers get one loaded with the injector:
    /// [`Fixture::model_with`]).
    pub model: Arc<Model>,
    /// How the model is loaded.
    pub source: WeightSource,
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

/// The synthetic model the harness runs by default (random weights): [`crate::small_spec`]
/// of seed 7, its FFN in bundles of 64.
pub fn default_spec() -> SyntheticSpec {
    crate::small_spec(7)
}

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
        let model = Model::open(&store, WeightSource::STREAMED).map_err(|e| err(&e))?;
        let mut plan = ExecutionPlan {
            prefill_max_tokens: 4,
            step_deadline_ms: DEADLINE.as_millis() as u64,
            ..ExecutionPlan::default()
        };
        plan.decode.output_rows = 64;
        plan.prefill.output_rows = 64;
        let c = model.config();
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
        Fixture::with(store, WeightSource::STREAMED, model, plan, describe)
    }

    /// A neuron store run under `budget` (what `--memory` gives it: `conductor::apply_budget`).
    pub fn store(
        path: &Path,
        budget: conductor::runtime::cache::MemoryBudget,
    ) -> Result<Fixture, String> {
        let err = |e: &dyn fmt::Display| e.to_string();
        let mut source = WeightSource::STREAMED;
        let mut model = Model::open(path, source).map_err(|e| err(&e))?;
        let mut plan = ExecutionPlan {
            step_deadline_ms: DEADLINE.as_millis() as u64 * 4,
            ..ExecutionPlan::default()
        };
        let n_ctx = 256;
        let split =
            conductor::apply_budget(&model, &mut plan, budget, n_ctx).map_err(|e| err(&e))?;
        if !split.plan.stream_attention {
            source = WeightSource::RESIDENT;
            model = Model::open(path, source).map_err(|e| err(&e))?;
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
        Fixture::with(path.to_path_buf(), source, model, plan, describe)
    }

    fn with(
        path: PathBuf,
        source: WeightSource,
        model: Model,
        plan: ExecutionPlan,
        describe: String,
    ) -> Result<Fixture, String> {
        let model = Arc::new(model);
        let n_vocab = model.config().n_vocab;
        let prompt: Vec<u32> = [3u32, 17, 42, 5, 99, 120, 7]
            .iter()
            .map(|t| t % n_vocab)
            .collect();
        let mut fixture = Fixture {
            path,
            model,
            source,
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

    pub(super) fn inline(&self, injector: &Arc<Injector>) -> Result<InlineDriver<Serial>, String> {
        let model = self.model_with(injector)?;
        let ffn = ffn_plan_of(&model, &self.plan).map_err(|e| e.to_string())?;
        InlineDriver::new(model, &self.plan, ffn, Kernels::best(), Serial)
            .map_err(|e| e.to_string())
    }

    /// The fixture's model loaded again with `injector` on its reads (the embedding rows', and
    /// through it the drivers' store reads).
    pub(super) fn model_with(&self, injector: &Arc<Injector>) -> Result<Arc<Model>, String> {
        let options = LoadOptions {
            source: self.source,
            read_faults: Some(Arc::clone(injector) as Arc<dyn ReadFaults>),
            ..LoadOptions::default()
        };
        Model::open(&self.path, options)
            .map(Arc::new)
            .map_err(|e| e.to_string())
    }

    pub(super) fn actors(&self, injector: &Arc<Injector>) -> Result<ActorDriver, String> {
        let options = ActorOptions {
            threads: Some(2),
            topology: Some(Topology::uniform(2)),
            no_pinning: true,
            model_path: Some(self.path.clone()),
        };
        let model = self.model_with(injector)?;
        let ffn = ffn_plan_of(&model, &self.plan).map_err(|e| e.to_string())?;
        ActorDriver::new(model, &self.plan, ffn, Kernels::best(), options)
            .map_err(|e| e.to_string())
    }

    /// The plan's step deadline.
    pub fn deadline(&self) -> Duration {
        Duration::from_millis(self.plan.step_deadline_ms)
    }

    /// The name of the plan's first decode group (the actor faults' target).
    pub(super) fn group(&self) -> String {
        self.plan.decode_on[0].group.clone()
    }
}

//! The inline driver: the dispatch core and the executor on the calling thread.
//!
//! Its backend computes a `Compute` at once (its clusters spread over the runner's workers),
//! finishes phases in place and reads loads as they come; the core feeds the completions back
//! in order. The command stream is exactly what the actor driver and the simulator carry out
//! for the same events. Every group's work runs here, on the one runner: the inline driver is
//! the reference for numerics.

use super::{ClusterRunner, Driver, GroupOutput, Session, StepError, StepState, WholeMatmul};
use crate::cache::{read_slots, unit_extents, BundleFile, LoadError, SlotArena, SlotRead, UnitMap};
use crate::dispatch::{Backend, Dispatcher, Done, Finish, UnitLoad};
use crate::model::{KvCache, Model};
use crate::plan::ExecutionPlan;
use crate::quant::Kernels;
use crate::schedule::{
    Activity, Awaited, ClusterWork, Event, PageMap, Program, ScheduleError, StepId, StepRequest,
    StepShape, XpuId,
};
use std::sync::{Arc, Mutex};

pub struct InlineDriver<R: ClusterRunner> {
    model: Arc<Model>,
    /// The plan it follows (for trace headers).
    plan: ExecutionPlan,
    /// A store's cache slots and the file its bundles are read from (plans with a cache).
    cache: Option<(Arc<SlotArena>, BundleFile)>,
    io: IoCounters,
    dispatcher: Dispatcher,
    programs: [Arc<Program>; 2],
    state: StepState,
    outputs: Vec<Mutex<GroupOutput>>,
    runner: R,
    next_step: StepId,
    /// Scratch of reads: a run's units and their results.
    reads: Vec<SlotRead>,
    results: Vec<Result<u64, LoadError>>,
    /// The sequences' KV caches while a multi-sequence step borrows them.
    kvs: Vec<KvCache>,
}

/// Units and bytes read so far.
#[derive(Default)]
struct IoCounters {
    loads: u64,
    reads: u64,
    bytes_read: u64,
    /// Bytes read per layer (the output projection last).
    layer_bytes: Vec<u64>,
}

impl<R: ClusterRunner> InlineDriver<R> {
    /// A driver computing `model` as `plan` says, decode's FFN as `ffn` says (the engine's
    /// [`crate::resolve::ResolvedPlan`] holds both; [`super::ffn_plan_of`] resolves one for a
    /// model and plan alone).
    pub fn new(
        model: Arc<Model>,
        plan: &ExecutionPlan,
        ffn: crate::plan::FfnPlan,
        kernels: Kernels,
        runner: R,
    ) -> Result<Self, ScheduleError> {
        let scheduler = super::scheduler_for(&model, plan, ffn)?;
        let cache = open_cache(&model, plan, scheduler.unit_map())?;
        let state = StepState::reading(
            kernels,
            cache.as_ref().map(|(arena, _)| Arc::clone(arena)),
            ffn,
        );
        Ok(InlineDriver {
            plan: plan.clone(),
            cache,
            io: IoCounters {
                layer_bytes: vec![0; model.config().n_layer as usize + 1],
                ..IoCounters::default()
            },
            outputs: (0..scheduler.n_groups())
                .map(|_| Mutex::default())
                .collect(),
            programs: [
                Arc::clone(scheduler.program(StepShape::Decode)),
                Arc::clone(scheduler.program(StepShape::Prefill)),
            ],
            dispatcher: Dispatcher::new(scheduler),
            state,
            model,
            runner,
            next_step: 0,
            reads: Vec::new(),
            results: Vec::new(),
            kvs: Vec::new(),
        })
    }

    /// The neuron cache's counters per layer (plans with a cache).
    pub fn cache_stats(&self) -> Option<&[crate::cache::LayerCacheStats]> {
        self.dispatcher.scheduler().cache_stats()
    }

    /// The cache's counters and the bytes read (plans with a cache).
    pub fn cache_report(&self) -> Option<crate::cache::CacheReport> {
        let (_, file) = self.cache.as_ref()?;
        let layers = self.dispatcher.scheduler().cache_stats()?.to_vec();
        Some(crate::cache::CacheReport {
            layer_bytes: self.io.layer_bytes.clone(),
            layers,
            loads: self.io.loads,
            reads: self.io.reads,
            bytes_read: self.io.bytes_read,
            issued: file.issued(),
            io_ns: 0,
            decode_compute_ns: 0,
        })
    }

    /// Cache slots held now (plans with a cache): 0 between steps, done or failed; more is a
    /// leak ([`crate::cache::CacheDirectory::held_slots`]).
    pub fn held_cache_slots(&self) -> Option<u32> {
        self.dispatcher.scheduler().cache_held_slots()
    }

    pub fn runner(&self) -> &R {
        &self.runner
    }

    fn run_multi_step(
        &mut self,
        sessions: &mut [&mut Session],
        tokens: &[u32],
    ) -> Result<(), StepError> {
        let (request, positions, n_ctx) =
            super::multi_step_request(self.next_step, sessions, tokens)?;
        self.next_step += 1;
        self.state
            .begin_multi_step(&self.model, &request, tokens, &positions, n_ctx)?;
        // Lend every sequence's cache to the step, in token order.
        let mut kvs = std::mem::take(&mut self.kvs);
        kvs.resize_with(sessions.len(), KvCache::default);
        for (session, kv) in sessions.iter_mut().zip(kvs.iter_mut()) {
            session.swap_kv(kv);
        }
        let result = self.feed_step(&mut kvs, request);
        for (session, kv) in sessions.iter_mut().zip(kvs.iter_mut()) {
            session.swap_kv(kv);
        }
        self.kvs = kvs;
        result?;
        for (session, &token) in sessions.iter_mut().zip(tokens) {
            session.push(&[token]);
        }
        Ok(())
    }

    /// Feeds a begun step's request and checks that it completed.
    fn feed_step(&mut self, kv: &mut [KvCache], request: StepRequest) -> Result<(), StepError> {
        let (dispatcher, mut backend) = self.split(kv);
        dispatcher.feed(&mut backend, Event::StepRequested(request))?;
        if !backend.done {
            // Everything is carried out at once here: a step not done is a scheduler bug.
            dispatcher.abort();
            return Err(StepError::Stalled);
        }
        Ok(())
    }

    fn run_step(
        &mut self,
        session: &mut Session,
        tokens: &[u32],
        logits_from: u32,
        resident_only: bool,
    ) -> Result<(), StepError> {
        let request = StepRequest {
            step: self.next_step,
            n_tokens: tokens.len() as u32,
            n_past: session.n_past() as u32,
            logits_from,
            sequences: 1,
            resident_only,
        };
        self.next_step += 1;
        self.state
            .begin_step(&self.model, &request, tokens, session.n_ctx())?;
        self.feed_step(std::slice::from_mut(&mut session.kv), request)?;
        session.push(tokens);
        Ok(())
    }

    /// The dispatch core, and the backend over this driver's other parts for one step with
    /// `kv`.
    fn split<'a>(
        &'a mut self,
        kv: &'a mut [KvCache],
    ) -> (&'a mut Dispatcher, InlineBackend<'a, R>) {
        let backend = InlineBackend {
            model: &self.model,
            kv,
            state: &mut self.state,
            outputs: &self.outputs,
            runner: &self.runner,
            programs: &self.programs,
            cache: self.cache.as_ref(),
            io: &mut self.io,
            reads: &mut self.reads,
            results: &mut self.results,
            done: false,
        };
        (&mut self.dispatcher, backend)
    }

    /// Starts recording a trace of every event and command, and the decode steps' activity.
    pub fn start_trace(&mut self) {
        self.dispatcher.start_recording(self.model.config().n_layer);
    }

    /// Stops recording and returns the trace (no timed spans: everything runs on one thread).
    pub fn take_trace(&mut self) -> crate::trace::Trace {
        let recording = self.dispatcher.take_recording();
        crate::trace::Trace {
            header: crate::trace::TraceHeader {
                version: crate::trace::TRACE_FORMAT_VERSION,
                model: self.model.description(),
                plan: self.plan.clone(),
                ffn: self.dispatcher.scheduler().ffn(),
                driver: "inline".into(),
                threads: self.runner.workers() as u32,
                writer: format!("conductor {}", env!("CARGO_PKG_VERSION")),
            },
            records: recording.records,
            activity: recording.activity,
            spans: Vec::new(),
        }
    }

    /// Carries out a recorded trace's events through this driver's backend (really computing
    /// and reading), step `i` over `tokens[i]`, with the completions the trace recorded (the
    /// events a finished phase owes are derived again, not taken from the trace), and returns
    /// what the dispatch core recorded: the commands this backend received for the same
    /// events, to compare with the trace's.
    pub fn replay(
        &mut self,
        session: &mut Session,
        tokens: &[&[u32]],
        records: &[crate::trace::TraceRecord],
    ) -> Result<crate::dispatch::Recording, StepError> {
        self.dispatcher.begin_replay(self.model.config().n_layer);
        let result = self.replay_records(session, tokens, records);
        let recording = self.dispatcher.end_replay();
        result.map(|()| recording)
    }

    fn replay_records(
        &mut self,
        session: &mut Session,
        tokens: &[&[u32]],
        records: &[crate::trace::TraceRecord],
    ) -> Result<(), StepError> {
        let mut steps = tokens.iter();
        let mut current: &[u32] = &[];
        for record in records.iter().filter(|r| !r.event.is_owed()) {
            if let Event::StepRequested(request) = &record.event {
                current = steps.next().ok_or(StepError::NoTokens)?;
                self.state
                    .begin_step(&self.model, request, current, session.n_ctx())?;
            }
            let (dispatcher, mut backend) = self.split(std::slice::from_mut(&mut session.kv));
            dispatcher.feed(&mut backend, record.event.clone())?;
            if backend.done {
                session.push(current);
            }
        }
        Ok(())
    }
}

/// The inline driver's backend for one step.
struct InlineBackend<'a, R: ClusterRunner> {
    model: &'a Model,
    /// The step's KV cache, or one per sequence of a multi-sequence step.
    kv: &'a mut [KvCache],
    state: &'a mut StepState,
    outputs: &'a [Mutex<GroupOutput>],
    runner: &'a R,
    programs: &'a [Arc<Program>; 2],
    cache: Option<&'a (Arc<SlotArena>, BundleFile)>,
    io: &'a mut IoCounters,
    reads: &'a mut Vec<SlotRead>,
    results: &'a mut Vec<Result<u64, LoadError>>,
    done: bool,
}

impl<R: ClusterRunner> InlineBackend<'_, R> {
    fn program(&self, shape: StepShape) -> &Program {
        match shape {
            StepShape::Decode => &self.programs[0],
            StepShape::Prefill => &self.programs[1],
        }
    }
}

impl<R: ClusterRunner> Backend for InlineBackend<'_, R> {
    type Error = StepError;

    fn now_ns(&self) -> u64 {
        0
    }

    fn compute(&mut self, xpu: XpuId, work: &ClusterWork) -> Result<Done, StepError> {
        let program = match work.shape {
            StepShape::Decode => &self.programs[0],
            StepShape::Prefill => &self.programs[1],
        };
        let out = &mut *self.outputs[usize::from(xpu.0)]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        self.state.compute(
            self.model,
            self.kv,
            program,
            work,
            self.runner,
            &WholeMatmul,
            out,
        );
        Ok(Done::Now)
    }

    fn finish_phase(
        &mut self,
        f: &Finish,
        awaited: Option<Awaited>,
        activity: &mut Activity,
    ) -> Result<(), StepError> {
        let program = match f.shape {
            StepShape::Decode => &self.programs[0],
            StepShape::Prefill => &self.programs[1],
        };
        self.state
            .finish_phase(self.model, self.kv, program, f.layer, f.phase, self.outputs);
        if let Some(awaited) = awaited {
            self.state
                .fill_activity(self.model, self.program(f.shape), awaited, activity);
        }
        Ok(())
    }

    fn page_map(&self) -> Option<&dyn PageMap> {
        self.model.store().map(|s| &s.layout as &dyn PageMap)
    }

    fn read(&mut self, _: StepId, run: &[UnitLoad]) -> Result<Done, StepError> {
        let Some((arena, file)) = self.cache else {
            return Err(StepError::NoCache);
        };
        self.reads.clear();
        for u in run {
            let read = SlotRead::assign(
                arena,
                (u.layer, u.cluster),
                u.slot,
                u.evicted,
                u.pages.clone(),
                u.top_up,
            );
            self.reads.push(read);
        }
        // Nothing else reads these slots on this thread: never stale.
        let results = &mut *self.results;
        results.clear();
        results.resize_with(run.len(), || Ok(0));
        read_slots(arena, file, self.reads, |i, result| results[i] = result);
        self.io.reads += 1;
        for (u, result) in run.iter().zip(self.results.drain(..)) {
            match result {
                Ok(bytes) => {
                    self.io.loads += 1;
                    self.io.bytes_read += bytes;
                    self.io.layer_bytes[u.layer as usize] += bytes;
                }
                Err(e) => {
                    arena.forget(u.layer, u.cluster);
                    return Err(e.into());
                }
            }
        }
        Ok(Done::Now)
    }

    fn step_done(&mut self, _: StepId) -> Result<(), StepError> {
        self.done = true;
        Ok(())
    }
}

/// The slots and bundle file a plan with a cache needs (`None` without one); `map` is the
/// scheduler's ([`crate::schedule::Scheduler::unit_map`]).
pub fn open_cache(
    model: &Model,
    plan: &ExecutionPlan,
    map: Option<&UnitMap>,
) -> Result<Option<(Arc<SlotArena>, BundleFile)>, ScheduleError> {
    let (Some(c), Some(map)) = (&plan.cache, map) else {
        return Ok(None);
    };
    let io = |why: String| ScheduleError::Plan(crate::plan::PlanError::Parse(why));
    let path = model
        .path()
        .ok_or_else(|| io("the neuron cache needs the store's file path".into()))?;
    let extents = unit_extents(model, map, plan.decode.output_rows);
    let arena = SlotArena::new(c.slots, &crate::cache::hot_segment(c, map), map, &extents)
        .map_err(io)?
        .with_resident_step_units(crate::cache::resident_step_units(c, map));
    let file = BundleFile::open_with(path, model, map, extents, &plan.storage)
        .map_err(|e| io(e.to_string()))?
        .ok_or(ScheduleError::CacheWithoutStore)?;
    Ok(Some((Arc::new(arena), file)))
}

impl<R: ClusterRunner + Send> InlineDriver<R> {
    /// [`Driver::eval`] with `probe` seeing its intermediate tensors (see [`super::Probe`]);
    /// the probe is dropped when the evaluation ends, done or failed.
    pub fn eval_probed(
        &mut self,
        session: &mut Session,
        tokens: &[u32],
        logits_from: usize,
        on_logits: &mut dyn FnMut(usize, &[f32]),
        probe: super::Probe,
    ) -> Result<(), StepError> {
        self.state.probe = Some(probe);
        let result = self.eval(session, tokens, logits_from, on_logits);
        self.state.probe = None;
        result
    }
}

impl<R: ClusterRunner + Send> Driver for InlineDriver<R> {
    fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn rest(&self) {
        self.runner.rest();
    }

    fn max_step_tokens(&self) -> usize {
        self.dispatcher.scheduler().max_step_tokens() as usize
    }

    fn step(
        &mut self,
        session: &mut Session,
        tokens: &[u32],
        logits_from: u32,
    ) -> Result<(), StepError> {
        self.run_step(session, tokens, logits_from, false)
    }

    fn step_resident(&mut self, session: &mut Session, token: u32) -> Result<(), StepError> {
        self.run_step(session, &[token], 0, true)
    }

    fn step_many_sequences(
        &mut self,
        sessions: &mut [&mut Session],
        tokens: &[u32],
    ) -> Result<(), StepError> {
        self.run_multi_step(sessions, tokens)
    }

    fn logits(&self) -> &[f32] {
        self.state.logits()
    }
}

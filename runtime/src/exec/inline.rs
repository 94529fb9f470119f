//! The inline driver: the scheduler and the executor on the calling thread.
//!
//! It feeds the scheduler a `StepRequested`, then carries out commands in order: a `Compute` is
//! executed at once (its clusters spread over the runner's workers) and answered with
//! `ClusterDone`; a `FinishPhase` combines the phase's outputs. The command stream is exactly
//! what the actor driver and the simulator receive for the same events. Every group's work runs
//! here, on the one runner: the inline driver is the reference for numerics.

use super::{ClusterRunner, Driver, GroupOutput, Session, StepError, StepState, WholeMatmul};
use crate::cache::{unit_extents, BundleFile, SlotArena, UnitMap};
use crate::model::Model;
use crate::plan::ExecutionPlan;
use crate::quant::Kernels;
use crate::schedule::{Command, Event, ScheduleError, Scheduler, StepId, StepRequest};
use std::sync::{Arc, Mutex};

pub struct InlineDriver<R: ClusterRunner> {
    model: Arc<Model>,
    /// A store's cache slots and the file its bundles are read from (plans with a cache).
    cache: Option<(Arc<SlotArena>, BundleFile)>,
    /// Units read so far, and their bytes.
    loads: u64,
    bytes_read: u64,
    /// Bytes read per layer (the output projection last).
    layer_bytes: Vec<u64>,
    scheduler: Scheduler,
    state: StepState,
    outputs: Vec<Mutex<GroupOutput>>,
    runner: R,
    next_step: StepId,
    commands: Vec<Command>,
}

impl<R: ClusterRunner> InlineDriver<R> {
    pub fn new(
        model: Arc<Model>,
        plan: &ExecutionPlan,
        kernels: Kernels,
        runner: R,
    ) -> Result<Self, ScheduleError> {
        let scheduler = super::scheduler_for(&model, plan)?;
        let cache = open_cache(&model, plan, scheduler.unit_map())?;
        let mut state = StepState::new(kernels);
        state.set_cache(cache.as_ref().map(|(arena, _)| Arc::clone(arena)));
        state.set_page_reads(scheduler.reads_predicted_pages());
        Ok(InlineDriver {
            cache,
            loads: 0,
            bytes_read: 0,
            layer_bytes: vec![0; model.config.n_layer as usize + 1],
            outputs: (0..scheduler.n_groups())
                .map(|_| Mutex::default())
                .collect(),
            scheduler,
            state,
            model,
            runner,
            next_step: 0,
            commands: Vec::new(),
        })
    }

    /// Installs a probe that sees intermediate tensors (see [`super::Probe`]).
    pub fn set_probe(&mut self, probe: Option<super::Probe>) {
        self.state.set_probe(probe);
    }

    /// The neuron cache's counters per layer (plans with a cache).
    pub fn cache_stats(&self) -> Option<&[crate::cache::LayerCacheStats]> {
        self.scheduler.cache_stats()
    }

    /// The cache's counters and the bytes read (plans with a cache).
    pub fn cache_report(&self) -> Option<crate::cache::CacheReport> {
        self.cache.as_ref()?;
        let layers = self.scheduler.cache_stats()?.to_vec();
        Some(crate::cache::CacheReport {
            layer_bytes: self.layer_bytes.clone(),
            layers,
            loads: self.loads,
            reads: self.loads,
            bytes_read: self.bytes_read,
            io_ns: 0,
            decode_compute_ns: 0,
        })
    }

    pub fn runner(&self) -> &R {
        &self.runner
    }

    fn run_step(
        &mut self,
        session: &mut Session,
        tokens: &[u32],
        logits_from: u32,
    ) -> Result<(), StepError> {
        let request = StepRequest {
            step: self.next_step,
            n_tokens: tokens.len() as u32,
            n_past: session.n_past() as u32,
            logits_from,
        };
        self.next_step += 1;
        let model = &*self.model;
        self.state.begin_step(model, &request, tokens)?;
        let program = self
            .scheduler
            .program(self.scheduler.shape_for(request.n_tokens))
            .clone();
        self.commands.clear();
        self.scheduler
            .on_event(Event::StepRequested(request), &mut self.commands)?;
        let mut next = 0;
        while next < self.commands.len() {
            let command = self.commands[next].clone();
            next += 1;
            match command {
                Command::Compute { xpu, work } => {
                    let out = &mut *self.outputs[usize::from(xpu.0)]
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    self.state.compute(
                        model,
                        &session.kv,
                        &program,
                        &work,
                        &self.runner,
                        &WholeMatmul,
                        out,
                    );
                    if let Err(e) = self
                        .scheduler
                        .on_event(Event::ClusterDone(work), &mut self.commands)
                    {
                        self.scheduler.abort();
                        return Err(e.into());
                    }
                }
                Command::FinishPhase {
                    step, layer, phase, ..
                } => {
                    self.state.finish_phase(
                        model,
                        &mut session.kv,
                        &program,
                        layer,
                        phase,
                        &self.outputs,
                    );
                    let event = event_after_phase(
                        &self.scheduler,
                        &self.state,
                        &program,
                        step,
                        layer,
                        phase,
                    );
                    if let Some(event) = event {
                        if let Err(e) = self.scheduler.on_event(event, &mut self.commands) {
                            self.scheduler.abort();
                            return Err(e.into());
                        }
                    }
                }
                Command::StepDone { .. } => {
                    session.push(tokens);
                }
                Command::Load {
                    step,
                    layer,
                    cluster,
                    slot,
                    evicted,
                    pages,
                    top_up,
                } => {
                    let Some((arena, file)) = &self.cache else {
                        self.scheduler.abort();
                        return Err(StepError::NoCache);
                    };
                    if !top_up {
                        arena.assign(layer, cluster, slot, evicted);
                    }
                    let loaded =
                        file.load_part(layer, cluster, pages, arena.write(slot).bytes_mut());
                    let bytes = match loaded {
                        Ok(bytes) => bytes,
                        Err(e) => {
                            arena.forget(layer, cluster);
                            self.scheduler.abort();
                            return Err(e.into());
                        }
                    };
                    self.loads += 1;
                    self.bytes_read += bytes;
                    self.layer_bytes[layer as usize] += bytes;
                    let event = Event::Loaded {
                        step,
                        layer,
                        cluster,
                    };
                    if let Err(e) = self.scheduler.on_event(event, &mut self.commands) {
                        self.scheduler.abort();
                        return Err(e.into());
                    }
                }
            }
        }
        Ok(())
    }
}

/// The slots and bundle file a plan with a cache needs (`None` without one); `map` is the
/// scheduler's ([`Scheduler::unit_map`]).
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
        .path
        .as_deref()
        .ok_or_else(|| io("the neuron cache needs the store's file path".into()))?;
    let extents = unit_extents(model, map, plan.decode.output_rows);
    let arena = SlotArena::new(c.slots, map, &extents);
    let file = BundleFile::open(
        path,
        model,
        map,
        extents,
        plan.storage.direct_io,
        plan.storage.engine,
    )
    .map_err(|e| io(e.to_string()))?
    .ok_or(ScheduleError::CacheWithoutStore)?;
    Ok(Some((Arc::new(arena), file)))
}

impl<R: ClusterRunner + Send> Driver for InlineDriver<R> {
    fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn max_step_tokens(&self) -> usize {
        self.scheduler.max_step_tokens() as usize
    }

    fn step(
        &mut self,
        session: &mut Session,
        tokens: &[u32],
        logits_from: u32,
    ) -> Result<(), StepError> {
        self.run_step(session, tokens, logits_from)
    }

    fn logits(&self) -> &[f32] {
        self.state.logits()
    }
}

/// The event a finished phase owes the scheduler, if any: after a gate phase the pages the
/// gates let through; after a decode step's attention output, with predictors under a cache,
/// the layer's predictions (as pages when the scheduler reads predicted neurons page by page).
/// Both drivers feed it the same, so their event streams stay alike.
pub fn event_after_phase(
    scheduler: &Scheduler,
    state: &StepState,
    program: &crate::schedule::Program,
    step: StepId,
    layer: u32,
    phase: crate::neuron::Phase,
) -> Option<Event> {
    use crate::neuron::Phase;
    let awaits_predictions = scheduler.awaits_predictions()
        && program.shape == crate::schedule::StepShape::Decode
        && phase == Phase::AttnOutRows;
    if phase == Phase::FfnGateRows || (awaits_predictions && scheduler.reads_predicted_pages()) {
        let mut pages = Vec::new();
        state.ffn_pages(&mut pages);
        Some(Event::FfnPages { step, layer, pages })
    } else if awaits_predictions {
        let mut needed = Vec::new();
        state.ffn_needed(&mut needed);
        Some(Event::FfnPredicted {
            step,
            layer,
            needed,
        })
    } else {
        None
    }
}

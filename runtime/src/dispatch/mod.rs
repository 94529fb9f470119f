//! The dispatch core: what every driver does around the scheduler, written once.
//!
//! The [`Scheduler`] turns events into commands; a [`Dispatcher`] owns it and carries the
//! commands out through a [`Backend`], which is all a driver supplies: compute a command's
//! clusters, finish a phase (and say which neurons were active), read a run of units. The
//! core decides everything else the same way for the inline driver, the actor driver, the
//! simulator and the scheduler's tests:
//!
//! - the event a finished phase owes ([`owed_event`], from the active neurons the backend
//!   reports), fed before the rest of the phase's batch;
//! - which loads one read carries (the scheduler's `with_previous`), handed to the backend as
//!   one run;
//! - completions a backend made at once, fed in order after the batch;
//! - the trace: every event with its time and the commands it produced, and the active
//!   neurons of each decode step.
//!
//! The core is generic over its backend, so the hot path is statically dispatched.

mod recorder;

pub use recorder::Recording;

use crate::neuron::Phase;
use crate::schedule::{
    owed_event, Activity, Awaited, ClusterWork, Command, Event, PageMap, ScheduleError, Scheduler,
    StepId, StepRequest, StepShape, XpuId,
};
use recorder::Recorder;
use std::collections::VecDeque;
use std::ops::Range;

/// Whether a backend finished what it was asked before returning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Done {
    /// Finished: the core feeds the completion itself.
    Now,
    /// It will be reported later, as an event fed to [`Dispatcher::feed`].
    Later,
}

/// One unit of a read run, as the scheduler's `Load` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitLoad {
    pub layer: u32,
    pub cluster: u32,
    pub slot: u32,
    /// What the slot held until now (its unit is forgotten).
    pub evicted: Option<(u32, u32)>,
    /// Only these pages (`None`: the whole unit).
    pub pages: Option<Range<u32>>,
    /// The slot keeps its unit and the pages it has.
    pub top_up: bool,
}

/// A phase to finish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finish {
    pub step: StepId,
    pub shape: StepShape,
    pub layer: u32,
    pub phase: Phase,
}

/// What a driver supplies: the work itself.
pub trait Backend {
    type Error: From<ScheduleError>;

    /// Nanoseconds since the trace began (virtual in a simulation), for trace records.
    fn now_ns(&self) -> u64;

    /// A step is requested (before the scheduler sees it).
    fn step_requested(&mut self, _request: &StepRequest) -> Result<(), Self::Error> {
        Ok(())
    }

    /// Computes the clusters of `work` on processor group `xpu`.
    fn compute(&mut self, xpu: XpuId, work: &ClusterWork) -> Result<Done, Self::Error>;

    /// Combines a finished phase's clusters. When the step waits for an event after it
    /// (`awaited`), fills `activity` with the layer's active neurons, from which the core
    /// derives the event.
    fn finish_phase(
        &mut self,
        finish: &Finish,
        awaited: Option<Awaited>,
        activity: &mut Activity,
    ) -> Result<(), Self::Error>;

    /// Where a store's bundles keep their neurons' rows, for page events.
    fn page_map(&self) -> Option<&dyn PageMap>;

    /// Reads one run of units of step `step` (into their slots).
    fn read(&mut self, step: StepId, run: &[UnitLoad]) -> Result<Done, Self::Error>;

    /// The step is complete.
    fn step_done(&mut self, step: StepId) -> Result<(), Self::Error>;
}

/// Where the completions of the backend's work come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completions {
    /// From the backend: what it did at once is fed by the core.
    Backend,
    /// From a recorded trace, fed by the caller in the recorded order: the backend's own
    /// are dropped (replaying a trace through a backend).
    Replayed,
}

/// The scheduler and everything around it (see the module comment).
pub struct Dispatcher {
    scheduler: Scheduler,
    /// Command buffers by depth: an owed event's commands are carried out while its finish's
    /// batch waits.
    buffers: Vec<Vec<Command>>,
    /// The read being gathered, and its step.
    run: Vec<UnitLoad>,
    run_step: StepId,
    /// Completions the backend made at once, fed after the batch.
    completions: VecDeque<Event>,
    mode: Completions,
    activity: Activity,
    scratch: Vec<u32>,
    recorder: Option<Recorder>,
    /// The shape of the step in flight.
    shape: StepShape,
}

impl Dispatcher {
    /// A dispatch core whose completions come from its backend.
    pub fn new(scheduler: Scheduler) -> Dispatcher {
        Dispatcher::with_completions(scheduler, Completions::Backend)
    }

    /// A dispatch core whose completions come from where `mode` says (a trace's replay feeds
    /// the recorded ones: [`Completions::Replayed`]).
    pub fn with_completions(scheduler: Scheduler, mode: Completions) -> Dispatcher {
        Dispatcher {
            scheduler,
            buffers: Vec::new(),
            run: Vec::new(),
            run_step: 0,
            completions: VecDeque::new(),
            mode,
            activity: Activity::default(),
            scratch: Vec::new(),
            recorder: None,
            shape: StepShape::Decode,
        }
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// The scheduler, its core done with.
    pub fn into_scheduler(self) -> Scheduler {
        self.scheduler
    }

    /// Starts replaying a recorded trace through the backend: completions come from the
    /// trace (the backend's own are dropped) and what the core sends is recorded, until
    /// [`Dispatcher::end_replay`].
    pub fn begin_replay(&mut self, n_layer: u32) {
        self.mode = Completions::Replayed;
        self.start_recording(n_layer);
    }

    /// Ends a replay: completions come from the backend again; returns what was recorded.
    pub fn end_replay(&mut self) -> Recording {
        self.mode = Completions::Backend;
        self.take_recording()
    }

    /// Starts recording (clears what was recorded). `n_layer` sizes the decode steps'
    /// activity.
    pub fn start_recording(&mut self, n_layer: u32) {
        self.recorder = Some(Recorder::new(n_layer));
    }

    /// As [`Dispatcher::start_recording`], with room for `events` records.
    pub fn start_recording_with_capacity(&mut self, n_layer: u32, events: usize) {
        self.recorder = Some(Recorder::with_capacity(n_layer, events));
    }

    /// Stops recording and hands over what was recorded.
    pub fn take_recording(&mut self) -> Recording {
        self.recorder
            .take()
            .map(Recorder::finish)
            .unwrap_or_default()
    }

    /// Forgets the step in flight and everything pending (a failed step).
    pub fn abort(&mut self) {
        self.scheduler.abort();
        self.completions.clear();
        self.run.clear();
        if let Some(r) = self.recorder.as_mut() {
            r.abort_step();
        }
    }

    /// Feeds `event` and carries out what follows through `backend`, then the completions the
    /// backend made at once, until none is left. On error the step is forgotten
    /// ([`Dispatcher::abort`]).
    pub fn feed<B: Backend>(&mut self, backend: &mut B, event: Event) -> Result<(), B::Error> {
        let mut result = self.feed_one(backend, event);
        while result.is_ok() {
            let Some(event) = self.completions.pop_front() else {
                break;
            };
            result = self.feed_one(backend, event);
        }
        if result.is_err() {
            self.abort();
        }
        result
    }

    /// Feeds one event and carries out its batch.
    fn feed_one<B: Backend>(&mut self, backend: &mut B, event: Event) -> Result<(), B::Error> {
        let t_ns = backend.now_ns();
        if let Event::StepRequested(r) = &event {
            self.shape = self.scheduler.shape_of(r);
            backend.step_requested(r)?;
        }
        let mut batch = self.buffers.pop().unwrap_or_default();
        batch.clear();
        let recorded = self.recorder.is_some().then(|| event.clone());
        if let Err(e) = self.scheduler.on_event(event, &mut batch) {
            self.buffers.push(batch);
            return Err(e.into());
        }
        if let (Some(r), Some(event)) = (self.recorder.as_mut(), recorded) {
            r.record(t_ns, event, &batch);
        }
        let result = self.carry_out(backend, &batch);
        self.buffers.push(batch);
        result
    }

    fn carry_out<B: Backend>(
        &mut self,
        backend: &mut B,
        batch: &[Command],
    ) -> Result<(), B::Error> {
        for command in batch {
            match command {
                Command::Compute { xpu, work } => {
                    if backend.compute(*xpu, work)? == Done::Now {
                        self.completed(Event::ClusterDone(work.clone()));
                    }
                }
                Command::FinishPhase {
                    step,
                    shape,
                    layer,
                    phase,
                    then,
                } => {
                    self.flush_run(backend)?;
                    let finish = Finish {
                        step: *step,
                        shape: *shape,
                        layer: *layer,
                        phase: *phase,
                    };
                    self.activity.clear();
                    backend.finish_phase(&finish, *then, &mut self.activity)?;
                    if let Some(awaited) = *then {
                        let event = self.owed(backend, &finish, awaited);
                        self.feed_one(backend, event)?;
                    }
                }
                Command::Load {
                    step,
                    layer,
                    cluster,
                    slot,
                    evicted,
                    pages,
                    top_up,
                    with_previous,
                } => {
                    if !with_previous {
                        self.flush_run(backend)?;
                    }
                    self.run_step = *step;
                    self.run.push(UnitLoad {
                        layer: *layer,
                        cluster: *cluster,
                        slot: *slot,
                        evicted: *evicted,
                        pages: pages.clone(),
                        top_up: *top_up,
                    });
                }
                Command::StepDone { step } => {
                    self.flush_run(backend)?;
                    if let Some(r) = self.recorder.as_mut() {
                        r.step_done(*step, self.shape);
                    }
                    backend.step_done(*step)?;
                }
            }
        }
        self.flush_run(backend)
    }

    /// The event `awaited` asks after `finish`, from the activity the backend reported.
    fn owed<B: Backend>(&mut self, backend: &B, finish: &Finish, awaited: Awaited) -> Event {
        let program = self.scheduler.program(finish.shape);
        let units = program.ffn_selection_units();
        if let Some(r) = self.recorder.as_mut() {
            r.layer_activity(finish.layer, &self.activity, &mut self.scratch);
        }
        owed_event(
            awaited,
            finish.step,
            finish.layer,
            units,
            &self.activity,
            backend.page_map(),
            &mut self.scratch,
        )
    }

    /// Hands the run gathered so far to the backend.
    fn flush_run<B: Backend>(&mut self, backend: &mut B) -> Result<(), B::Error> {
        if self.run.is_empty() {
            return Ok(());
        }
        let done = backend.read(self.run_step, &self.run);
        if done? == Done::Now && self.mode == Completions::Backend {
            for u in &self.run {
                self.completions.push_back(Event::Loaded {
                    step: self.run_step,
                    layer: u.layer,
                    cluster: u.cluster,
                });
            }
        }
        self.run.clear();
        Ok(())
    }

    fn completed(&mut self, event: Event) {
        if self.mode == Completions::Backend {
            self.completions.push_back(event);
        }
    }
}

#[cfg(test)]
mod tests;

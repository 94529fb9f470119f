//! The scheduler actor: the pure [`Scheduler`] with real groups behind its commands.
//!
//! It lives on the host of the decode group, so the messages of the latency-critical path are
//! local. Events arrive as messages (`RunStep` from the driver, `ClusterDone` from groups); the
//! commands they produce are carried out at once: `Compute` becomes a message to the group,
//! `FinishPhase` runs here (it combines the groups' blocks in cluster order), `StepDone`
//! answers the driver. With recording on, every event is stored with its time and the commands
//! it produced — the trace `conductor simulate --replay` checks.

use crate::group::Compute;
use crate::step::{read, write, StepShared};
use crate::storage::{LoadClusters, LoadItem, QueuedLoads, Storage};
use conductor_runtime::cache::{LayerCacheStats, LoadError};
use conductor_runtime::exec::{event_after_phase, StepError};
use conductor_runtime::neuron::Phase;
use conductor_runtime::schedule::{
    ClusterWork, Command, Event, ScheduleError, Scheduler, StepId, StepRequest, StepShape, XpuId,
};
use conductor_runtime::trace::{ActiveSet, Span, StepActivity, TraceRecord};
use kameo::actor::{Actor, ActorRef, Recipient, WeakActorRef};
use kameo::error::{ActorStopReason, Infallible, PanicError};
use kameo::message::{Context, Message};
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;
use std::sync::Arc;

/// Run one step; the outcome goes to `reply`.
pub struct RunStep {
    pub request: StepRequest,
    pub reply: SyncSender<Result<(), StepError>>,
}

/// A group finished a `Compute`.
pub struct ClusterDone {
    pub xpu: XpuId,
    pub work: ClusterWork,
    /// When it started and finished (trace epoch, ns; 0 when not recording).
    pub started_ns: u64,
    pub finished_ns: u64,
}

/// The storage actor finished (or failed) one unit of a [`LoadClusters`].
pub struct ClusterLoaded {
    pub step: StepId,
    pub layer: u32,
    pub cluster: u32,
    pub result: Result<(), LoadError>,
    pub started_ns: u64,
    pub finished_ns: u64,
}

/// Hand over the neuron cache's counters per layer (empty without a cache).
pub struct TakeCacheStats(pub SyncSender<Vec<LayerCacheStats>>);

/// A group failed (panicked, or stopped) while computing for `step`, or stopped idle.
pub struct GroupFailed {
    pub xpu: XpuId,
    pub step: Option<StepId>,
    pub why: String,
}

/// Start recording a trace (clears what was recorded).
pub struct StartRecording;

/// Stop recording and hand over what was recorded.
pub struct TakeRecording(pub SyncSender<Recording>);

/// What the scheduler actor recorded.
#[derive(Default)]
pub struct Recording {
    pub records: Vec<TraceRecord>,
    pub activity: Vec<StepActivity>,
    pub spans: Vec<Span>,
}

struct Flight {
    step: StepId,
    shape: StepShape,
    reply: SyncSender<Result<(), StepError>>,
}

pub struct SchedulerActor {
    scheduler: Scheduler,
    shared: Arc<StepShared>,
    /// Group names and mailboxes, by `XpuId`.
    groups: Vec<(String, Recipient<Compute>)>,
    /// The I/O threads' storage actors, each with its count of loads not yet done: a load goes
    /// to the one with the fewest (ties: the next after the last one chosen).
    storage: Vec<(ActorRef<Storage>, QueuedLoads)>,
    next_io: usize,
    /// Loads of the command batch being carried out, merged while they continue each other.
    pending_loads: Option<LoadClusters>,
    flight: Option<Flight>,
    commands: Vec<Command>,
    recording: Option<Recording>,
    /// While recording: the active neurons of each layer of the decode step in flight, where
    /// gate-first loading decided them (the other layers count as all active).
    step_active: Vec<ActiveSet>,
}

pub struct SchedulerArgs {
    pub(crate) scheduler: Scheduler,
    pub(crate) shared: Arc<StepShared>,
    pub(crate) groups: Vec<(String, Recipient<Compute>)>,
    pub(crate) storage: Vec<(ActorRef<Storage>, QueuedLoads)>,
}

impl SchedulerActor {
    /// Feeds one event to the scheduler and carries out the commands it answers with.
    fn feed(&mut self, event: Event) {
        self.commands.clear();
        let recorded = self.recording.is_some().then(|| event.clone());
        if let Err(e) = self.scheduler.on_event(event, &mut self.commands) {
            self.fail(StepError::Schedule(e));
            return;
        }
        if let (Some(rec), Some(event)) = (self.recording.as_mut(), recorded) {
            rec.records.push(TraceRecord {
                t_ns: self.shared.now_ns(),
                event,
                commands: self.commands.clone(),
            });
        }
        let mut commands = std::mem::take(&mut self.commands);
        let mut ok = true;
        for command in commands.drain(..) {
            if !self.carry_out(command) {
                ok = false;
                break;
            }
        }
        if ok {
            self.flush_loads();
        } else {
            self.pending_loads = None;
        }
        self.commands = commands;
    }

    /// Sends the loads gathered so far to the storage actor with the fewest loads not yet
    /// done. False if none runs.
    fn flush_loads(&mut self) -> bool {
        let Some(loads) = self.pending_loads.take() else {
            return true;
        };
        let storage = &self.storage;
        self.next_io = least_queued(storage.len(), self.next_io, |i| {
            storage.get(i).map_or(u32::MAX, |(_, queued)| queued.get())
        });
        let sent = self
            .storage
            .get(self.next_io)
            .is_some_and(|(actor, queued)| {
                queued.add();
                let sent = actor.tell(loads).try_send().is_ok();
                if !sent {
                    queued.done();
                }
                sent
            });
        if !sent {
            self.fail(StepError::Actor {
                actor: "storage".into(),
                why: "not running".into(),
            });
        }
        sent
    }

    /// Returns false when the step failed.
    fn carry_out(&mut self, command: Command) -> bool {
        match command {
            Command::Compute { xpu, work } => {
                let (name, group) = &self.groups[usize::from(xpu.0)];
                if group.tell(Compute(work)).try_send().is_err() {
                    let why = format!("group `{name}` is not running");
                    self.fail(StepError::Actor {
                        actor: name.clone(),
                        why,
                    });
                    return false;
                }
            }
            Command::FinishPhase {
                step,
                shape,
                layer,
                phase,
            } => {
                let shared = Arc::clone(&self.shared);
                let started = self.recording.is_some().then(|| shared.now_ns());
                {
                    let mut state = write(&shared.state);
                    let mut kv = write(&shared.kv);
                    state.finish_phase(
                        &shared.model,
                        &mut kv,
                        shared.program(shape),
                        layer,
                        phase,
                        &shared.outputs,
                    );
                }
                if let (Some(rec), Some(start)) = (self.recording.as_mut(), started) {
                    rec.spans.push(Span {
                        track: "scheduler".into(),
                        name: format!("L{layer} {} finish", phase.name()),
                        start_ns: start,
                        dur_ns: shared.now_ns() - start,
                    });
                }
                let event = {
                    let state = read(&shared.state);
                    let event = event_after_phase(
                        &self.scheduler,
                        &state,
                        shared.program(shape),
                        step,
                        layer,
                        phase,
                    );
                    // Gate-first traces record the neurons each gate phase let through.
                    if phase == Phase::FfnGateRows && self.recording.is_some() {
                        let n = shared.model.layers.len();
                        self.step_active.resize(n, ActiveSet::All);
                        if let Some(slot) = self.step_active.get_mut(layer as usize) {
                            *slot = ActiveSet::Neurons(state.ffn_active().to_vec());
                        }
                    }
                    event
                };
                if let Some(event) = event {
                    self.feed(event);
                    if self.flight.is_none() {
                        return false;
                    }
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
            } => {
                let Some((arena, file)) = &self.shared.cache else {
                    self.fail(StepError::NoCache);
                    return false;
                };
                // A top-up reads more pages into a slot that keeps its unit (and generation).
                let generation = if top_up {
                    arena.generation(slot)
                } else {
                    arena.assign(layer, cluster, slot, evicted)
                };
                let item = LoadItem {
                    layer,
                    cluster,
                    slot,
                    generation,
                    pages,
                };
                // Join the pending request when one read can take both (see `can_batch`);
                // runs of pages of bundles join each other where they can be in flight
                // together (io_uring), never whole units.
                if let Some(pending) = self.pending_loads.as_mut() {
                    let last = pending.items.last();
                    let parts = item.pages.is_some()
                        && last.is_some_and(|l| l.pages.is_some())
                        && file.batches_parts();
                    let last = last
                        .filter(|i| i.pages.is_none())
                        .map(|i| (i.layer, i.cluster));
                    let whole = item.pages.is_none()
                        && last.is_some_and(|l| file.can_batch(l, (layer, cluster)));
                    let joins = pending.step == step
                        && pending.items.len() < self.scheduler.coalesce() as usize
                        && (parts || whole);
                    if joins {
                        pending.items.push(item);
                        return true;
                    }
                }
                if !self.flush_loads() {
                    return false;
                }
                self.pending_loads = Some(LoadClusters {
                    step,
                    items: vec![item],
                });
            }
            Command::StepDone { step } => {
                if let Some(flight) = self.flight.take() {
                    debug_assert_eq!(flight.step, step);
                    if let Some(rec) = self.recording.as_mut() {
                        if flight.shape == StepShape::Decode {
                            // The layers whose active neurons gate-first loading decided;
                            // every neuron of the others (dense, or decided inside clusters).
                            let n = self.shared.model.layers.len();
                            let mut layers = std::mem::take(&mut self.step_active);
                            layers.resize(n, ActiveSet::All);
                            rec.activity.push(StepActivity { step, layers });
                        }
                    }
                    let _ = flight.reply.send(Ok(()));
                }
            }
        }
        true
    }

    /// Fails the step in flight (if any) with `error`; the scheduler forgets it.
    fn fail(&mut self, error: StepError) {
        self.scheduler.abort();
        self.step_active.clear();
        if let Some(flight) = self.flight.take() {
            let _ = flight.reply.send(Err(error));
        }
    }

    fn is_current(&self, step: StepId) -> bool {
        self.flight.as_ref().is_some_and(|f| f.step == step)
    }
}

impl Actor for SchedulerActor {
    type Args = SchedulerArgs;
    type Error = Infallible;

    async fn on_start(args: SchedulerArgs, _: ActorRef<Self>) -> Result<Self, Infallible> {
        Ok(SchedulerActor {
            scheduler: args.scheduler,
            shared: args.shared,
            groups: args.groups,
            storage: args.storage,
            next_io: 0,
            pending_loads: None,
            flight: None,
            commands: Vec::new(),
            recording: None,
            step_active: Vec::new(),
        })
    }

    /// A panic here (in a phase's finish) fails the step in flight; the actor carries on.
    async fn on_panic(
        &mut self,
        _: WeakActorRef<Self>,
        err: PanicError,
    ) -> Result<ControlFlow<ActorStopReason>, Infallible> {
        let why = err
            .with_str(|s| format!("panicked: {s}"))
            .unwrap_or_else(|| format!("{err:?}"));
        self.fail(StepError::Actor {
            actor: "scheduler".into(),
            why,
        });
        Ok(ControlFlow::Continue(()))
    }
}

impl Message<RunStep> for SchedulerActor {
    type Reply = ();

    async fn handle(&mut self, msg: RunStep, _: &mut Context<Self, ()>) {
        if let Some(flight) = &self.flight {
            let _ = msg.reply.send(Err(StepError::Schedule(ScheduleError::Busy {
                running: flight.step,
                new: msg.request.step,
            })));
            return;
        }
        self.flight = Some(Flight {
            step: msg.request.step,
            shape: self.scheduler.shape_for(msg.request.n_tokens),
            reply: msg.reply,
        });
        self.feed(Event::StepRequested(msg.request));
    }
}

impl Message<ClusterDone> for SchedulerActor {
    type Reply = ();

    async fn handle(&mut self, msg: ClusterDone, _: &mut Context<Self, ()>) {
        if !self.is_current(msg.work.step) {
            return; // a failed step's leftovers
        }
        if let Some(rec) = self.recording.as_mut() {
            let w = &msg.work;
            rec.spans.push(Span {
                track: self.groups[usize::from(msg.xpu.0)].0.clone(),
                name: format!("L{} {} {:?}", w.layer, w.phase.name(), w.clusters),
                start_ns: msg.started_ns,
                dur_ns: msg.finished_ns.saturating_sub(msg.started_ns),
            });
        }
        self.feed(Event::ClusterDone(msg.work));
    }
}

impl Message<ClusterLoaded> for SchedulerActor {
    type Reply = ();

    async fn handle(&mut self, msg: ClusterLoaded, _: &mut Context<Self, ()>) {
        if !self.is_current(msg.step) {
            return; // a failed step's leftovers
        }
        if let Err(e) = msg.result {
            if let Some((arena, _)) = &self.shared.cache {
                arena.forget(msg.layer, msg.cluster);
            }
            self.fail(StepError::Load(e));
            return;
        }
        if let Some(rec) = self.recording.as_mut() {
            rec.spans.push(Span {
                track: "storage".into(),
                name: format!("L{} load {}", msg.layer, msg.cluster),
                start_ns: msg.started_ns,
                dur_ns: msg.finished_ns.saturating_sub(msg.started_ns),
            });
        }
        self.feed(Event::Loaded {
            step: msg.step,
            layer: msg.layer,
            cluster: msg.cluster,
        });
    }
}

impl Message<TakeCacheStats> for SchedulerActor {
    type Reply = ();

    async fn handle(&mut self, msg: TakeCacheStats, _: &mut Context<Self, ()>) {
        let stats = self.scheduler.cache_stats().map(<[_]>::to_vec);
        let _ = msg.0.send(stats.unwrap_or_default());
    }
}

impl Message<GroupFailed> for SchedulerActor {
    type Reply = ();

    async fn handle(&mut self, msg: GroupFailed, _: &mut Context<Self, ()>) {
        // A failure during another step, or while idle, does not concern the step in flight.
        let concerns_flight = match msg.step {
            Some(step) => self.is_current(step),
            None => self.flight.is_some(),
        };
        if concerns_flight {
            let actor = self.groups[usize::from(msg.xpu.0)].0.clone();
            self.fail(StepError::Actor {
                actor,
                why: msg.why,
            });
        }
    }
}

impl Message<StartRecording> for SchedulerActor {
    type Reply = ();

    async fn handle(&mut self, _: StartRecording, _: &mut Context<Self, ()>) {
        self.shared.recording.store(true, Ordering::Relaxed);
        self.recording = Some(Recording::default());
    }
}

impl Message<TakeRecording> for SchedulerActor {
    type Reply = ();

    async fn handle(&mut self, msg: TakeRecording, _: &mut Context<Self, ()>) {
        self.shared.recording.store(false, Ordering::Relaxed);
        let _ = msg.0.send(self.recording.take().unwrap_or_default());
    }
}

/// Which of `n` storage actors gets the next load: the one with the fewest loads not yet done
/// (`queued(i)`), looking from the one after `last` so that ties go round-robin.
fn least_queued(n: usize, last: usize, queued: impl Fn(usize) -> u32) -> usize {
    let n = n.max(1);
    (1..=n)
        .map(|k| (last + k) % n)
        .min_by_key(|&i| queued(i))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::least_queued;

    #[test]
    fn loads_go_to_the_least_queued_storage_actor() {
        // Ties go round-robin from the last one chosen.
        assert_eq!(least_queued(2, 0, |_| 0), 1);
        assert_eq!(least_queued(2, 1, |_| 0), 0);
        assert_eq!(least_queued(3, 2, |_| 1), 0);
        // A thread still busy with two loads is passed over, whoever's turn it is.
        let queued = [2, 0, 1];
        assert_eq!(least_queued(3, 0, |i| queued[i]), 1);
        assert_eq!(least_queued(3, 1, |i| queued[i]), 1);
        let queued = [0, 3];
        assert_eq!(least_queued(2, 0, |i| queued[i]), 0);
        // One actor (or none): always the first.
        assert_eq!(least_queued(1, 0, |_| 5), 0);
        assert_eq!(least_queued(0, 0, |_| 5), 0);
    }
}

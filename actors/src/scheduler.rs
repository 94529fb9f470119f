//! The scheduler actor: the dispatch core with real groups and storage behind its backend.
//!
//! It lives on the host of the decode group, so the messages of the latency-critical path are
//! local. Events arrive as messages (`RunStep` from the driver, `ClusterDone` from groups,
//! `ClusterLoaded` from storage) and go to the [`Dispatcher`]; its backend here turns a
//! `Compute` into a message to the group, finishes phases on this host, and sends each read run
//! to the storage actor with the fewest loads not yet done. With recording on, the core keeps
//! every event with the commands it produced and this actor the timed spans.

use crate::protocol::{
    ClusterDone, ClusterLoaded, Compute, GroupFailed, LoadClusters, Recording, RunStep,
    StartRecording, TakeCacheStats, TakeRecording,
};
use crate::step::{read, write, StepShared};
use crate::storage::{QueuedLoads, Storage};
use conductor_runtime::cache::SlotRead;
use conductor_runtime::dispatch::{Backend, Dispatcher, Done, Finish, UnitLoad};
use conductor_runtime::exec::StepError;
use conductor_runtime::schedule::{
    Activity, Awaited, ClusterWork, Event, PageMap, ScheduleError, Scheduler, StepId, XpuId,
};
use conductor_runtime::trace::Span;
use kameo::actor::{Actor, ActorRef, Recipient, WeakActorRef};
use kameo::error::{ActorStopReason, Infallible, PanicError};
use kameo::message::{Context, Message};
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;
use std::sync::Arc;

pub struct SchedulerActor {
    dispatcher: Dispatcher,
    parts: Parts,
}

/// Everything the backend works with (all of the actor but the dispatch core).
struct Parts {
    shared: Arc<StepShared>,
    /// Group names and mailboxes, by `XpuId`.
    groups: Vec<(String, Recipient<Compute>)>,
    /// The I/O threads' storage actors, each with its count of loads not yet done: a run goes
    /// to the one with the fewest (ties: the next after the last one chosen).
    storage: Vec<(ActorRef<Storage>, QueuedLoads)>,
    next_io: usize,
    /// The step in flight and where its outcome goes.
    flight: Option<(StepId, SyncSender<Result<(), StepError>>)>,
    /// Timed spans, while recording.
    spans: Option<Vec<Span>>,
}

pub struct SchedulerArgs {
    pub(crate) scheduler: Scheduler,
    pub(crate) shared: Arc<StepShared>,
    pub(crate) groups: Vec<(String, Recipient<Compute>)>,
    pub(crate) storage: Vec<(ActorRef<Storage>, QueuedLoads)>,
}

impl Backend for Parts {
    type Error = StepError;

    fn now_ns(&self) -> u64 {
        self.shared.now_ns()
    }

    fn compute(&mut self, xpu: XpuId, work: &ClusterWork) -> Result<Done, StepError> {
        let (name, group) = &self.groups[usize::from(xpu.0)];
        if group.tell(Compute(work.clone())).try_send().is_err() {
            return Err(StepError::Actor {
                actor: name.clone(),
                why: format!("group `{name}` is not running"),
            });
        }
        Ok(Done::Later)
    }

    fn finish_phase(
        &mut self,
        f: &Finish,
        awaited: Option<Awaited>,
        activity: &mut Activity,
    ) -> Result<(), StepError> {
        let shared = &*self.shared;
        let started = self.spans.is_some().then(|| shared.now_ns());
        {
            let mut state = write(&shared.state);
            let mut kv = write(&shared.kv);
            let program = shared.program(f.shape);
            state.finish_phase(
                &shared.model,
                &mut kv,
                program,
                f.layer,
                f.phase,
                &shared.outputs,
            );
        }
        if let (Some(spans), Some(start)) = (self.spans.as_mut(), started) {
            spans.push(Span {
                track: "scheduler".into(),
                name: format!("L{} {} finish", f.layer, f.phase.name()),
                start_ns: start,
                dur_ns: shared.now_ns() - start,
            });
        }
        if let Some(awaited) = awaited {
            let state = read(&shared.state);
            state.fill_activity(&shared.model, shared.program(f.shape), awaited, activity);
        }
        Ok(())
    }

    fn page_map(&self) -> Option<&dyn PageMap> {
        let store = self.shared.model.store.as_ref()?;
        Some(&store.layout)
    }

    fn read(&mut self, step: StepId, run: &[UnitLoad]) -> Result<Done, StepError> {
        let Some((arena, _)) = &self.shared.cache else {
            return Err(StepError::NoCache);
        };
        let items = run
            .iter()
            .map(|u| {
                let unit = (u.layer, u.cluster);
                SlotRead::assign(arena, unit, u.slot, u.evicted, u.pages.clone(), u.top_up)
            })
            .collect();
        let storage = &self.storage;
        self.next_io = least_queued(storage.len(), self.next_io, |i| {
            storage.get(i).map_or(u32::MAX, |(_, queued)| queued.get())
        });
        let sent = self
            .storage
            .get(self.next_io)
            .is_some_and(|(actor, queued)| {
                queued.add();
                let sent = actor.tell(LoadClusters { step, items }).try_send().is_ok();
                if !sent {
                    queued.done();
                }
                sent
            });
        if !sent {
            return Err(StepError::Actor {
                actor: "storage".into(),
                why: "not running".into(),
            });
        }
        Ok(Done::Later)
    }

    fn step_done(&mut self, step: StepId) -> Result<(), StepError> {
        if let Some((id, reply)) = self.flight.take() {
            debug_assert_eq!(id, step);
            let _ = reply.send(Ok(()));
        }
        Ok(())
    }
}

impl SchedulerActor {
    /// Feeds one event to the dispatch core; a failure fails the step in flight.
    fn feed(&mut self, event: Event) {
        if let Err(e) = self.dispatcher.feed(&mut self.parts, event) {
            self.fail(e);
        }
    }

    /// Fails the step in flight (if any) with `error`; the scheduler forgets it.
    fn fail(&mut self, error: StepError) {
        self.dispatcher.abort();
        if let Some((_, reply)) = self.parts.flight.take() {
            let _ = reply.send(Err(error));
        }
    }

    fn is_current(&self, step: StepId) -> bool {
        self.parts.flight.as_ref().is_some_and(|f| f.0 == step)
    }
}

impl Actor for SchedulerActor {
    type Args = SchedulerArgs;
    type Error = Infallible;

    async fn on_start(args: SchedulerArgs, _: ActorRef<Self>) -> Result<Self, Infallible> {
        Ok(SchedulerActor {
            dispatcher: Dispatcher::new(args.scheduler),
            parts: Parts {
                shared: args.shared,
                groups: args.groups,
                storage: args.storage,
                next_io: 0,
                flight: None,
                spans: None,
            },
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
        if let Some((running, _)) = &self.parts.flight {
            let _ = msg.reply.send(Err(StepError::Schedule(ScheduleError::Busy {
                running: *running,
                new: msg.request.step,
            })));
            return;
        }
        self.parts.flight = Some((msg.request.step, msg.reply));
        self.feed(Event::StepRequested(msg.request));
    }
}

impl Message<ClusterDone> for SchedulerActor {
    type Reply = ();

    async fn handle(&mut self, msg: ClusterDone, _: &mut Context<Self, ()>) {
        if !self.is_current(msg.work.step) {
            return; // a failed step's leftovers
        }
        if let Some(spans) = self.parts.spans.as_mut() {
            let w = &msg.work;
            spans.push(Span {
                track: self.parts.groups[usize::from(msg.xpu.0)].0.clone(),
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
            if let Some((arena, _)) = &self.parts.shared.cache {
                arena.forget(msg.layer, msg.cluster);
            }
            self.fail(StepError::Load(e));
            return;
        }
        if let Some(spans) = self.parts.spans.as_mut() {
            spans.push(Span {
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
        let stats = self.dispatcher.scheduler().cache_stats().map(<[_]>::to_vec);
        let _ = msg.0.send(stats.unwrap_or_default());
    }
}

impl Message<GroupFailed> for SchedulerActor {
    type Reply = ();

    async fn handle(&mut self, msg: GroupFailed, _: &mut Context<Self, ()>) {
        // A failure during another step, or while idle, does not concern the step in flight.
        let concerns_flight = match msg.step {
            Some(step) => self.is_current(step),
            None => self.parts.flight.is_some(),
        };
        if concerns_flight {
            let actor = self.parts.groups[usize::from(msg.xpu.0)].0.clone();
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
        self.parts.shared.recording.store(true, Ordering::Relaxed);
        self.parts.spans = Some(Vec::new());
        let n_layer = self.parts.shared.model.config.n_layer;
        self.dispatcher.start_recording(n_layer);
    }
}

impl Message<TakeRecording> for SchedulerActor {
    type Reply = ();

    async fn handle(&mut self, msg: TakeRecording, _: &mut Context<Self, ()>) {
        self.parts.shared.recording.store(false, Ordering::Relaxed);
        let kept = self.dispatcher.take_recording();
        let _ = msg.0.send(Recording {
            records: kept.records,
            activity: kept.activity,
            spans: self.parts.spans.take().unwrap_or_default(),
        });
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

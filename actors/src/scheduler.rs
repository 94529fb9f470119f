//! The scheduler actor: the dispatch core with real groups and storage behind it.
//!
//! It lives on the host of the decode group, so the messages of the latency-critical path are
//! local. Events arrive as messages (`RunStep` from the driver, `ClusterDone` from groups,
//! `ClusterLoaded` from storage) and go to the [`Dispatcher`], which carries out the
//! scheduler's commands through the actors' backend ([`ActorBackend`]). With recording on,
//! the core keeps every event with the commands it produced and the backend the timed spans.

use crate::backend::ActorBackend;
use crate::protocol::{
    ClusterDone, ClusterLoaded, Compute, GroupFailed, Recording, RunStep, StartRecording,
    StorageFailed, TakeCacheStats, TakeHeldSlots, TakeRecording,
};
use crate::step::StepShared;
use crate::storage::{QueuedLoads, Storage};
use conductor_runtime::dispatch::Dispatcher;
use conductor_runtime::exec::StepError;
use conductor_runtime::schedule::{Event, ScheduleError, Scheduler, StepId};
use conductor_runtime::trace::Span;
use kameo::actor::{Actor, ActorRef, Recipient, WeakActorRef};
use kameo::error::{ActorStopReason, Infallible, PanicError};
use kameo::message::{Context, Message};
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub struct SchedulerActor {
    dispatcher: Dispatcher,
    parts: ActorBackend,
}

pub struct SchedulerArgs {
    pub(crate) scheduler: Scheduler,
    pub(crate) shared: Arc<StepShared>,
    pub(crate) groups: Vec<(String, Recipient<Compute>)>,
    pub(crate) storage: Vec<(ActorRef<Storage>, QueuedLoads)>,
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
            parts: ActorBackend {
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

impl Message<TakeHeldSlots> for SchedulerActor {
    type Reply = ();

    async fn handle(&mut self, msg: TakeHeldSlots, _: &mut Context<Self, ()>) {
        let _ = msg.0.send(self.dispatcher.scheduler().cache_held_slots());
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

impl Message<StorageFailed> for SchedulerActor {
    type Reply = ();

    /// Loads given to a failed storage actor may never be answered: the step in flight (if
    /// any) fails now rather than waiting for them.
    async fn handle(&mut self, msg: StorageFailed, _: &mut Context<Self, ()>) {
        if self.parts.flight.is_some() {
            self.fail(StepError::Actor {
                actor: "storage".into(),
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
        let n_layer = self.parts.shared.model.config().n_layer;
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

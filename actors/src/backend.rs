//! The actors' backend of the dispatch core: a `Compute` becomes a message to its group, a
//! phase's finish runs on the scheduler's host, and each read run goes to the storage actor
//! with the fewest loads not yet done.

use crate::protocol::{Compute, LoadClusters};
use crate::step::{read, write, StepShared};
use crate::storage::{QueuedLoads, Storage};
use conductor_runtime::cache::SlotRead;
use conductor_runtime::dispatch::{Backend, Done, Finish, UnitLoad};
use conductor_runtime::exec::StepError;
use conductor_runtime::schedule::{Activity, Awaited, ClusterWork, PageMap, StepId, XpuId};
use conductor_runtime::trace::Span;
use kameo::actor::{ActorRef, Recipient};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;

/// Everything the backend works with (all of the actor but the dispatch core).
pub(crate) struct ActorBackend {
    pub shared: Arc<StepShared>,
    /// Group names and mailboxes, by `XpuId`.
    pub groups: Vec<(String, Recipient<Compute>)>,
    /// The I/O threads' storage actors, each with its count of loads not yet done: a run goes
    /// to the one with the fewest (ties: the next after the last one chosen).
    pub storage: Vec<(ActorRef<Storage>, QueuedLoads)>,
    pub next_io: usize,
    /// The step in flight and where its outcome goes.
    pub flight: Option<(StepId, SyncSender<Result<(), StepError>>)>,
    /// Timed spans, while recording.
    pub spans: Option<Vec<Span>>,
}

impl Backend for ActorBackend {
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
            if self.flight.as_ref().map(|f| f.0) != Some(state.request().step) {
                // The driver gave the step up: its inputs are gone.
                return Err(StepError::Actor {
                    actor: "scheduler".into(),
                    why: "the step was given up".into(),
                });
            }
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
        let store = self.shared.model.store()?;
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

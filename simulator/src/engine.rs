//! The discrete-event loop: the dispatch core on virtual nanoseconds.
//!
//! Pending completions wait in a min-heap ordered by `(time, seq)`; `seq` grows with every
//! push, so equal times pop in push order and a run is a pure function of its inputs. Two
//! kinds of completion exist: a processor group finishing a `Compute`, and an event reaching
//! the scheduler's host (after the message latency).
//!
//! Hosts are threads: groups on the same cores share one (`hosts_of`), the scheduler runs on
//! the host of the first `decode_on` group, and a host does one thing at a time. So a
//! `Compute` starts when its message has arrived and its host is free; the scheduler handles an
//! event when it has arrived and the scheduler's host is free, and the dispatch core carries
//! out the answer in order through [`SimBackend`]: a finish (and a step's start) costs time on
//! the host and delays what follows it, `Compute` messages leave at the host's time, read runs
//! go to the storage model, and `StepDone` ends the step, whereupon the next step of the
//! workload is requested at once.

use crate::backend::{Load, Machine, SimBackend, Spans};
use crate::devices::storage::Access;
use crate::faults::{Attempt, FaultRun, FaultState, SimReadFault, MAX_ATTEMPTS};
use crate::report::StepTiming;
use crate::workload::{PlannedStep, Workload};
use crate::{SimError, SimOptions};
use conductor_runtime::dispatch::Dispatcher;
use conductor_runtime::neuron::Phase;
use conductor_runtime::schedule::{ClusterWork, Event, Scheduler, StepShape, XpuId};
use conductor_runtime::trace::{Span, TraceRecord};
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::sync::Arc;

enum PendingKind {
    /// An event reaches the scheduler's host.
    Arrive(Event),
    /// A processor group finished the clusters of a `Compute`.
    GroupDone { xpu: XpuId, work: ClusterWork },
    /// Runs with faults: the deadline of attempt `serial` of a step.
    Deadline { serial: u64 },
    /// Runs with faults: the step in flight fails.
    Fail(String),
}

struct Pending {
    time: u64,
    seq: u64,
    /// Runs with faults: what a failed attempt left pending is of an older epoch, and
    /// ignored (always 0 without faults).
    epoch: u64,
    kind: PendingKind,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.time, self.seq) == (other.time, other.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.time, self.seq).cmp(&(other.time, other.seq))
    }
}

/// How many events and spans a run makes.
#[derive(Clone, Copy, Debug, Default)]
struct RunSize {
    events: usize,
    spans: usize,
}

impl RunSize {
    /// Counted from the programs: per step, one request, one completion per `Compute` (one per
    /// group's part of every phase), and a span per `Compute`, per `FinishPhase` and per step.
    fn of(scheduler: &Scheduler, steps: &[PlannedStep]) -> RunSize {
        let mut size = RunSize::default();
        for step in steps {
            let r = &step.request;
            let program = scheduler.program(scheduler.shape_of(r));
            let n_layer = program.n_layer as usize;
            let parts: usize = program.layer_phases.iter().map(|p| p.parts.len()).sum();
            let (mut computes, mut finishes) =
                (n_layer * parts, n_layer * program.layer_phases.len());
            if r.wants_logits() {
                computes += program.output.parts.len();
                finishes += 1;
            }
            size.events += 1 + computes;
            size.spans += 1 + computes + finishes;
        }
        size
    }
}

/// What a run leaves behind.
pub(crate) struct Outcome {
    pub timings: Vec<StepTiming>,
    pub group_busy_ns: Vec<u64>,
    pub scheduler_busy_ns: u64,
    pub end_ns: u64,
    pub events: u64,
    pub records: Vec<TraceRecord>,
    pub spans: Vec<Span>,
    pub storage_busy_ns: u64,
    pub storage_active_ns: u64,
    pub bytes_read: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
}

pub(crate) struct Engine<'a> {
    dispatcher: Dispatcher,
    backend: SimBackend<'a>,
    next_step: usize,
    /// When each host thread is next free; an idle host has been idle since then.
    host_free: Vec<u64>,
    heap: BinaryHeap<Reverse<Pending>>,
    seq: u64,
    group_busy_ns: Vec<u64>,
    scheduler_busy_ns: u64,
    /// Runs with faults only.
    faults: Option<FaultState<'a>>,
    epoch: u64,
}

impl<'a> Engine<'a> {
    pub fn new(
        scheduler: Scheduler,
        machine: Machine,
        workload: &'a Workload,
        options: &SimOptions,
    ) -> Engine<'a> {
        let steps = workload.steps(scheduler.max_step_tokens());
        let size = if options.record_records || options.record_spans {
            RunSize::of(&scheduler, &steps)
        } else {
            RunSize::default()
        };
        let n_groups = machine.groups.len();
        let n_hosts = machine.n_hosts;
        let programs = [
            Arc::clone(scheduler.program(StepShape::Decode)),
            Arc::clone(scheduler.program(StepShape::Prefill)),
        ];
        let decode_max_tokens = (1..=scheduler.max_step_tokens())
            .take_while(|&n| scheduler.shape_for(n) == StepShape::Decode)
            .last()
            .unwrap_or(0);
        let spans = Spans::new(
            options.record_spans,
            workload.model.shape.n_layer,
            size.spans,
        );
        let backend = SimBackend::new(
            workload,
            steps,
            machine,
            scheduler.ffn(),
            programs,
            decode_max_tokens,
            spans,
        );
        let mut dispatcher = Dispatcher::new(scheduler);
        if options.record_records {
            dispatcher.start_recording_with_capacity(workload.model.shape.n_layer, size.events);
        }
        Engine {
            dispatcher,
            backend,
            next_step: 0,
            host_free: vec![0; n_hosts],
            heap: BinaryHeap::with_capacity(64),
            seq: 0,
            group_busy_ns: vec![0; n_groups],
            scheduler_busy_ns: 0,
            faults: None,
            epoch: 0,
        }
    }

    /// Runs with `faults` (see `crate::faults`).
    pub fn with_faults(mut self, faults: FaultState<'a>) -> Engine<'a> {
        self.faults = Some(faults);
        self
    }

    fn push(&mut self, time: u64, kind: PendingKind) {
        self.heap.push(Reverse(Pending {
            time,
            seq: self.seq,
            epoch: self.epoch,
            kind,
        }));
        self.seq += 1;
    }

    fn request_next_step(&mut self, at: u64) {
        if self.next_step < self.backend.steps.len() {
            self.next_step += 1;
            if let Some(f) = self.faults.as_mut() {
                f.attempt = 0;
            }
            self.request_attempt(at);
        }
    }

    /// Requests the current step (again, after a failed attempt), with its faults.
    fn request_attempt(&mut self, at: u64) {
        let planned = &self.backend.steps[self.next_step - 1];
        let request = planned.request.clone();
        let (index, decode) = (self.next_step - 1, planned.decode_index);
        if let Some(f) = self.faults.as_mut() {
            f.reads = 0;
            f.started_ns = at;
            f.serial += 1;
            f.actors = f.hook.before_step(index, decode, f.attempt);
            let (serial, deadline) = (f.serial, at + f.deadline_ns);
            self.push(deadline, PendingKind::Deadline { serial });
        }
        self.push(at, PendingKind::Arrive(Event::StepRequested(request)));
    }

    /// Runs with faults: the current attempt failed at `t` (its step is abandoned and
    /// requested again).
    fn fail_attempt(&mut self, t: u64, why: String) -> Result<(), SimError> {
        self.dispatcher.abort();
        self.epoch += 1;
        let index = self.next_step - 1;
        let decode = self.backend.steps[index].decode_index;
        let f = self.faults.as_mut().expect("runs with faults");
        f.attempts.push(Attempt {
            index,
            decode,
            attempt: f.attempt,
            start_ns: f.started_ns,
            end_ns: t,
            failed: Some(why),
        });
        f.attempt += 1;
        if f.attempt >= MAX_ATTEMPTS {
            return Err(SimError::Stalled {
                step: index as u64,
                t_ns: t,
            });
        }
        let sched = self.backend.machine.sched_host;
        let at = t.max(self.host_free[sched]);
        self.request_attempt(at);
        Ok(())
    }

    /// [`Engine::run`] with faults: every attempt of every step, and the slots held at the
    /// end.
    pub fn run_with_faults(mut self) -> Result<FaultRun, SimError> {
        self.request_next_step(0);
        while let Some(Reverse(pending)) = self.heap.pop() {
            if pending.epoch != self.epoch {
                continue; // a failed attempt's leftovers
            }
            match pending.kind {
                PendingKind::Deadline { serial } => {
                    let f = self.faults.as_ref().expect("runs with faults");
                    if serial == f.serial {
                        let why = format!("past the step deadline ({} ns)", f.deadline_ns);
                        self.fail_attempt(pending.time, why)?;
                    }
                }
                PendingKind::Fail(why) => self.fail_attempt(pending.time, why)?,
                kind => self.pop(pending.time, kind)?,
            }
        }
        let held_slots = self.dispatcher.scheduler().cache_held_slots().unwrap_or(0);
        let end_ns = self.host_free.iter().copied().max().unwrap_or(0);
        let b = &self.backend;
        if b.timings.len() != b.steps.len() {
            return Err(SimError::Stalled {
                step: b.step_id,
                t_ns: end_ns,
            });
        }
        let f = self.faults.expect("runs with faults");
        Ok(FaultRun {
            attempts: f.attempts,
            held_slots,
            end_ns,
        })
    }

    /// Carries out what arrived at `time` (a completion or an event).
    fn pop(&mut self, time: u64, kind: PendingKind) -> Result<(), SimError> {
        match kind {
            PendingKind::Arrive(event) => self.handle(time, event)?,
            PendingKind::GroupDone { xpu, work } => {
                let m = &self.backend.machine;
                let sched = m.sched_host;
                let same = m.group_host[usize::from(xpu.0)] == sched;
                let latency = m.messages.latency_ns(same, time, self.host_free[sched]);
                self.push(
                    time + latency,
                    PendingKind::Arrive(Event::ClusterDone(work)),
                );
            }
            PendingKind::Deadline { .. } | PendingKind::Fail(_) => {}
        }
        Ok(())
    }

    pub fn run(mut self) -> Result<Outcome, SimError> {
        self.request_next_step(0);
        let mut now = 0;
        while let Some(Reverse(pending)) = self.heap.pop() {
            now = pending.time;
            self.pop(pending.time, pending.kind)?;
        }
        let b = self.backend;
        if b.timings.len() != b.steps.len() {
            return Err(SimError::Stalled {
                step: b.step_id,
                t_ns: now,
            });
        }
        let end_ns = self
            .host_free
            .iter()
            .copied()
            .chain(b.timings.last().map(|t| t.end_ns))
            .max()
            .unwrap_or(0);
        let stats = self.dispatcher.scheduler().cache_stats();
        let (cache_hits, cache_misses) = stats.map_or((0, 0), |s| {
            s.iter()
                .fold((0, 0), |(h, m), l| (h + l.hits, m + l.misses))
        });
        Ok(Outcome {
            timings: b.timings,
            group_busy_ns: self.group_busy_ns,
            scheduler_busy_ns: self.scheduler_busy_ns,
            end_ns,
            events: b.events,
            records: self.dispatcher.take_recording().records,
            spans: b.spans.spans.unwrap_or_default(),
            storage_busy_ns: b.machine.storage.busy_ns(),
            storage_active_ns: b.machine.storage.active_ns(),
            bytes_read: b.machine.storage.bytes_read(),
            cache_hits,
            cache_misses,
        })
    }

    /// The scheduler's host handles one event that arrived at `arrived`.
    fn handle(&mut self, arrived: u64, event: Event) -> Result<(), SimError> {
        let sched = self.backend.machine.sched_host;
        let t0 = arrived.max(self.host_free[sched]);
        self.backend.events += 1;
        self.backend.t = t0;
        self.backend.step_done = None;
        self.dispatcher.feed(&mut self.backend, event)?;
        let t = self.backend.t;
        self.scheduler_busy_ns += t - t0;
        self.host_free[sched] = t;
        self.submit_loads();
        let mut sends = std::mem::take(&mut self.backend.sends);
        for (xpu, work, sent) in sends.drain(..) {
            self.send_compute(xpu, work, sent);
        }
        self.backend.sends = sends;
        if let Some(done) = self.backend.step_done {
            if let Some(f) = self.faults.as_mut() {
                f.attempts.push(Attempt {
                    index: self.next_step - 1,
                    decode: self.backend.steps[self.next_step - 1].decode_index,
                    attempt: f.attempt,
                    start_ns: f.started_ns,
                    end_ns: done,
                    failed: None,
                });
                // The attempt's deadline no longer applies.
                f.serial += 1;
            }
            self.request_next_step(done);
        }
        Ok(())
    }

    /// The read runs of one batch (the scheduler decided which loads one read carries): one
    /// issuer on its own host; a read starts when the device is free and its completion
    /// travels back as messages. A run is one read, unless its reads are in flight together
    /// (io_uring), then each is its own.
    fn submit_loads(&mut self) {
        let loads = std::mem::take(&mut self.backend.loads);
        let mut i = 0;
        while i < loads.len() {
            let together = self.backend.machine.in_flight_together;
            let mut end = i + 1;
            while !together && end < loads.len() && !loads[end].starts_run {
                end += 1;
            }
            self.submit_read(&loads[i..end]);
            i = end;
        }
        self.backend.loads = loads;
        self.backend.loads.clear();
    }

    /// One read of `run` (units of one layer region, or one unit).
    fn submit_read(&mut self, run: &[Load]) {
        let first = run[0];
        let kind = self.unit_kind(first.layer, first.cluster);
        let m = &mut self.backend.machine;
        let sched = m.sched_host;
        // An attention matrix and some pages of a bundle are reads of their own; runs merge
        // whole bundles only.
        let (bytes, parts) = match (first.pages, kind) {
            (_, UnitKind::Attention(m_bytes)) => (m_bytes, 1),
            (Some(pages), _) => ((pages * 4096).min(m.bundle_bytes_of(first.layer)), 1),
            (None, UnitKind::Bundle) => (
                run.iter().map(|l| m.bundle_bytes_of(l.layer)).sum(),
                m.reads_per_bundle.max(1),
            ),
        };
        let m = &mut self.backend.machine;
        let mut read = m.storage.submit(first.at, bytes / parts, Access::Random);
        for _ in 1..parts {
            let next = m.storage.submit(first.at, bytes / parts, Access::Random);
            read.end_ns = read.end_ns.max(next.end_ns);
        }
        if let Some(f) = self.faults.as_mut() {
            // A bad read is read again once (the reader's retry), a second bad one fails
            // the step; a stuck one never answers (the deadline fails the step).
            if std::mem::take(&mut f.actors.storage) {
                // The storage actor fails on the read (it reports at once).
                self.push(first.at, PendingKind::Fail("storage failed".into()));
                return;
            }
            let mut bad = 0;
            let outcome = loop {
                let k = f.reads;
                f.reads += 1;
                let fault = f.hook.read(k);
                match fault {
                    SimReadFault::None => break None,
                    SimReadFault::Delay(ns) => {
                        read.end_ns += ns;
                        break None;
                    }
                    SimReadFault::Stuck => break Some(None),
                    SimReadFault::Bad if bad == 1 => {
                        break Some(Some(format!(
                            "read of layer {} cluster {} failed twice",
                            first.layer, first.cluster
                        )))
                    }
                    SimReadFault::Bad => {
                        bad += 1;
                        let storage = &mut self.backend.machine.storage;
                        read.end_ns = storage.submit(read.end_ns, bytes, Access::Random).end_ns;
                    }
                }
            };
            match outcome {
                None => {}
                Some(None) => return,
                Some(Some(why)) => {
                    self.push(read.end_ns, PendingKind::Fail(why));
                    return;
                }
            }
        }
        let latency =
            self.backend
                .machine
                .messages
                .latency_ns(false, read.end_ns, self.host_free[sched]);
        let (layer, cluster, more) = (first.layer, first.cluster, run.len() - 1);
        self.backend.spans.span(
            "storage",
            |_| format!("L{layer} load {cluster} (+{more})"),
            read.start_ns,
            read.end_ns,
        );
        for l in run {
            self.push(
                read.end_ns + latency,
                PendingKind::Arrive(Event::Loaded {
                    step: l.step,
                    layer: l.layer,
                    cluster: l.cluster,
                }),
            );
        }
    }

    /// Whether unit `(layer, cluster)` is a streamed attention matrix (and its bytes) or a
    /// bundle (or a cluster of the output projection, read as a bundle's bytes).
    fn unit_kind(&self, layer: u32, cluster: u32) -> UnitKind {
        let m = &self.backend.machine;
        match self
            .dispatcher
            .scheduler()
            .unit_map()
            .map(|u| u.phase_cluster(layer, cluster))
        {
            Some((Phase::QkvHeads, q)) => UnitKind::Attention(m.attention_bytes[q as usize]),
            Some((Phase::AttnOutRows, _)) => UnitKind::Attention(m.attention_bytes[3]),
            _ => UnitKind::Bundle,
        }
    }

    /// A `Compute` message sent at `sent`: the group computes once the message has arrived
    /// and its host is free.
    fn send_compute(&mut self, xpu: XpuId, work: ClusterWork, sent: u64) {
        let g = usize::from(xpu.0);
        let m = &self.backend.machine;
        let host = m.group_host[g];
        let same = host == m.sched_host;
        let latency = m.messages.latency_ns(same, sent, self.host_free[host]);
        let start = (sent + latency).max(self.host_free[host]);
        let duration = self.backend.compute_ns(g, &work);
        let end = start + duration;
        self.host_free[host] = end;
        self.group_busy_ns[g] += duration;
        let i = Spans::name_index(work.layer, work.phase);
        let b = &mut self.backend;
        let track = &b.machine.group_names[g];
        b.spans
            .span(track, |r| r.compute_names[i].clone(), start, end);
        if let Some(f) = self.faults.as_mut() {
            if std::mem::take(&mut f.actors.group) {
                let why = format!("group {} failed", b.machine.group_names[g]);
                self.push(end, PendingKind::Fail(why));
                return;
            }
        }
        self.push(end, PendingKind::GroupDone { xpu, work });
    }
}

enum UnitKind {
    Attention(u64),
    Bundle,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{named_shape, simulate};
    use conductor_runtime::plan::{CoreSet, ExecutionPlan, GroupPlan, HardwareProfile, Share};

    #[test]
    fn run_size_counts_what_a_run_records() {
        let profile = HardwareProfile::from_toml(include_str!("../tests/data/pc.toml")).unwrap();
        let mut split = ExecutionPlan::default();
        split.groups[0].cores = CoreSet::Ids(vec![0, 1, 2, 3]);
        split.groups.push(GroupPlan {
            cores: CoreSet::Ids(vec![4, 5, 6, 7]),
            name: "cpu2".into(),
            ..split.groups[0].clone()
        });
        split.decode_on.push(Share {
            group: "cpu2".into(),
            weight: 1,
        });
        for plan in [ExecutionPlan::default(), split] {
            let w = Workload::new(named_shape("smollm2-135m").unwrap(), 700, 3);
            let r = simulate(&profile, &plan, &w, &SimOptions::default()).unwrap();
            let scheduler = Scheduler::new(&w.model.shape, &plan).unwrap();
            let size = RunSize::of(&scheduler, &w.steps(scheduler.max_step_tokens()));
            assert_eq!(size.events, r.trace.records.len());
            assert_eq!(size.spans, r.trace.spans.len());
        }
    }

    #[test]
    fn equal_times_pop_in_push_order() {
        let mut heap = BinaryHeap::new();
        for (seq, time) in [(0, 5), (1, 3), (2, 5), (3, 3)] {
            heap.push(Reverse(Pending {
                time,
                seq,
                epoch: 0,
                kind: PendingKind::Arrive(Event::StepRequested(
                    conductor_runtime::schedule::StepRequest {
                        step: seq,
                        n_tokens: 1,
                        n_past: 0,
                        logits_from: 0,
                        sequences: 1,
                        resident_only: false,
                    },
                )),
            }));
        }
        let order: Vec<u64> = std::iter::from_fn(|| heap.pop().map(|Reverse(p)| p.seq)).collect();
        assert_eq!(order, vec![1, 3, 0, 2]);
    }
}

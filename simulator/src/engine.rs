//! The discrete-event loop: the real `Scheduler` on virtual nanoseconds.
//!
//! Pending completions wait in a min-heap ordered by `(time, seq)`; `seq` grows with every
//! push, so equal times pop in push order and a run is a pure function of its inputs. Two
//! kinds of completion exist: a processor group finishing a `Compute`, and an event reaching
//! the scheduler's host (after the message latency).
//!
//! Hosts are threads: groups on the same cores share one (`hosts_of`), the scheduler runs on
//! the host of the first `decode_on` group, and a host does one thing at a time. So a
//! `Compute` starts when its message has arrived and its host is free; the scheduler handles an
//! event when it has arrived and the scheduler's host is free, then carries out the answer in
//! order: `FinishPhase` on the host (its cost delays the commands after it), `Compute`
//! messages sent at the host's time, `StepDone` ending the step, whereupon the next step of the
//! workload is requested at once.

use crate::devices::host::{FinishModel, MessageModel};
use crate::devices::storage::{Access, StorageModel};
use crate::devices::{GroupModel, ModelCosts, StepCtx};
use crate::report::StepTiming;
use crate::workload::{PlannedStep, Workload};
use crate::{SimError, SimOptions};
use conductor_runtime::neuron::Phase;
use conductor_runtime::schedule::{
    ClusterWork, Command, Event, Program, Scheduler, StepShape, XpuId,
};
use conductor_runtime::trace::{ActiveSet, Span, StepActivity, TraceRecord};
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::ops::Range;
use std::sync::Arc;

/// Phases per layer kind, for per-(group, phase) tables.
const PHASES: usize = 8;
const UNKNOWN: u64 = u64::MAX;

enum PendingKind {
    /// An event reaches the scheduler's host.
    Arrive(Event),
    /// A processor group finished the clusters of a `Compute`.
    GroupDone { xpu: XpuId, work: ClusterWork },
}

struct Pending {
    time: u64,
    seq: u64,
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

/// The hosts and devices of one simulation, built by `simulate`.
pub(crate) struct Machine {
    pub groups: Vec<GroupModel>,
    pub group_names: Vec<String>,
    /// Host of each group.
    pub group_host: Vec<usize>,
    pub sched_host: usize,
    pub n_hosts: usize,
    pub finish: FinishModel,
    pub messages: MessageModel,
    /// The storage device, serving the scheduler's loads of FFN bundles.
    pub storage: StorageModel,
    /// Bytes one load reads (a bundle's stride); 0 when the model is not a neuron store.
    pub bundle_bytes: u64,
    /// Reads per bundle: 1 bundled, 3 when gate, up and down lie apart (`Workload::bundled`).
    pub reads_per_bundle: u64,
    /// Bytes one load of each streamed attention matrix reads (q, k, v, output; 4 KiB
    /// aligned), when the plan streams attention.
    pub attention_bytes: [u64; 4],
    /// Gate-first loading: where a bundle's rows lie (which pages an active neuron's up row
    /// and down column take); `None` without it.
    pub gate_layout: Option<conductor_runtime::store::BundleLayout>,
}

/// Spans and records, when asked for.
struct Recorder {
    records: Option<Vec<TraceRecord>>,
    spans: Option<Vec<Span>>,
    /// Span names by (layer, phase), built once: `L3 ffn`, `output`.
    compute_names: Vec<String>,
    finish_names: Vec<String>,
}

pub(crate) const SCHEDULER_TRACK: &str = "scheduler";

impl Recorder {
    fn new(options: &SimOptions, n_layer: u32, size: RunSize) -> Recorder {
        let mut compute_names = Vec::new();
        let mut finish_names = Vec::new();
        if options.record_spans {
            for layer in 0..=n_layer {
                for phase in ALL_PHASES {
                    let name = if phase == Phase::OutputRows {
                        "output".to_string()
                    } else {
                        format!("L{layer} {}", phase.name())
                    };
                    finish_names.push(format!("finish {name}"));
                    compute_names.push(name);
                }
            }
        }
        // Sized up front: growing vectors of this size showed as copying and page faults.
        Recorder {
            records: options
                .record_records
                .then(|| Vec::with_capacity(size.events)),
            spans: options.record_spans.then(|| Vec::with_capacity(size.spans)),
            compute_names,
            finish_names,
        }
    }

    fn name_index(layer: u32, phase: Phase) -> usize {
        layer as usize * PHASES + phase as usize
    }

    fn span(&mut self, track: &str, name: impl FnOnce(&Self) -> String, start: u64, end: u64) {
        if self.spans.is_some() {
            let name = name(self);
            if let Some(spans) = self.spans.as_mut() {
                spans.push(Span {
                    track: track.to_string(),
                    name,
                    start_ns: start,
                    dur_ns: end - start,
                });
            }
        }
    }
}

const ALL_PHASES: [Phase; PHASES] = [
    Phase::QkvHeads,
    Phase::AttnHeads,
    Phase::AttnOutRows,
    Phase::FfnNeurons,
    Phase::FfnGateRows,
    Phase::FfnGateUpRows,
    Phase::FfnDownRows,
    Phase::OutputRows,
];

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
            let program = scheduler.program(scheduler.shape_for(r.n_tokens));
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
    scheduler: Scheduler,
    workload: &'a Workload,
    steps: Vec<PlannedStep>,
    next_step: usize,
    costs: ModelCosts,
    machine: Machine,
    /// When each host thread is next free; an idle host has been idle since then.
    host_free: Vec<u64>,
    heap: BinaryHeap<Reverse<Pending>>,
    seq: u64,
    commands: Vec<Command>,
    sends: Vec<(XpuId, ClusterWork, u64)>,
    // The step in flight.
    ctx: StepCtx<'a>,
    step_id: u64,
    step_start: u64,
    program: Arc<Program>,
    /// Duration of each (group, phase) in this step with the cluster range it was for (a
    /// plan may list a group twice); phases whose cost varies by layer (FFN neurons under an
    /// activity) are not kept.
    memo: Vec<(Range<u32>, u64)>,
    // Results.
    timings: Vec<StepTiming>,
    group_busy_ns: Vec<u64>,
    scheduler_busy_ns: u64,
    events: u64,
    recorder: Recorder,
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
        let program = Arc::clone(scheduler.program(StepShape::Decode));
        Engine {
            steps,
            next_step: 0,
            costs: ModelCosts {
                gate_first: scheduler.program(StepShape::Decode).is_gate_first(),
                ..ModelCosts::new(&workload.model)
            },
            host_free: vec![0; machine.n_hosts],
            heap: BinaryHeap::with_capacity(64),
            seq: 0,
            commands: Vec::with_capacity(64),
            sends: Vec::with_capacity(8),
            ctx: StepCtx {
                shape: StepShape::Decode,
                n_tokens: 1,
                n_past: 0,
                n_out: 1,
                activity: None,
            },
            step_id: 0,
            step_start: 0,
            program,
            memo: vec![(0..0, UNKNOWN); n_groups * PHASES],
            timings: Vec::new(),
            group_busy_ns: vec![0; n_groups],
            scheduler_busy_ns: 0,
            events: 0,
            recorder: Recorder::new(options, workload.model.shape.n_layer, size),
            scheduler,
            workload,
            machine,
        }
    }

    fn push(&mut self, time: u64, kind: PendingKind) {
        self.heap.push(Reverse(Pending {
            time,
            seq: self.seq,
            kind,
        }));
        self.seq += 1;
    }

    fn request_next_step(&mut self, at: u64) {
        if let Some(step) = self.steps.get(self.next_step) {
            let request = step.request.clone();
            self.next_step += 1;
            self.push(at, PendingKind::Arrive(Event::StepRequested(request)));
        }
    }

    pub fn run(mut self) -> Result<Outcome, SimError> {
        self.request_next_step(0);
        let mut now = 0;
        while let Some(Reverse(pending)) = self.heap.pop() {
            now = pending.time;
            match pending.kind {
                PendingKind::Arrive(event) => self.handle(pending.time, event)?,
                PendingKind::GroupDone { xpu, work } => {
                    let sched = self.machine.sched_host;
                    let same = self.machine.group_host[usize::from(xpu.0)] == sched;
                    let latency =
                        self.machine
                            .messages
                            .latency_ns(same, pending.time, self.host_free[sched]);
                    self.push(
                        pending.time + latency,
                        PendingKind::Arrive(Event::ClusterDone(work)),
                    );
                }
            }
        }
        if self.timings.len() != self.steps.len() {
            return Err(SimError::Stalled {
                step: self.step_id,
                t_ns: now,
            });
        }
        let end_ns = self
            .host_free
            .iter()
            .copied()
            .chain(self.timings.last().map(|t| t.end_ns))
            .max()
            .unwrap_or(0);
        Ok(Outcome {
            timings: self.timings,
            group_busy_ns: self.group_busy_ns,
            scheduler_busy_ns: self.scheduler_busy_ns,
            end_ns,
            events: self.events,
            records: self.recorder.records.unwrap_or_default(),
            spans: self.recorder.spans.unwrap_or_default(),
            storage_busy_ns: self.machine.storage.busy_ns(),
            storage_active_ns: self.machine.storage.active_ns(),
            bytes_read: self.machine.storage.bytes_read(),
            cache_hits: self
                .scheduler
                .cache_stats()
                .map_or(0, |s| s.iter().map(|l| l.hits).sum()),
            cache_misses: self
                .scheduler
                .cache_stats()
                .map_or(0, |s| s.iter().map(|l| l.misses).sum()),
        })
    }

    fn begin_step(&mut self, step: usize, at: u64) {
        let planned = &self.steps[step];
        let r = &planned.request;
        let shape = self.scheduler.shape_for(r.n_tokens);
        self.ctx = StepCtx {
            shape,
            n_tokens: r.n_tokens,
            n_past: r.n_past,
            n_out: r.n_tokens - r.logits_from.min(r.n_tokens),
            activity: planned
                .decode_index
                .and_then(|i| self.workload.activity_of(i)),
        };
        self.step_id = r.step;
        self.step_start = at;
        self.program = Arc::clone(self.scheduler.program(shape));
        self.memo.fill((0..0, UNKNOWN));
    }

    /// The scheduler's host handles one event that arrived at `arrived`.
    fn handle(&mut self, arrived: u64, event: Event) -> Result<(), SimError> {
        let sched = self.machine.sched_host;
        let t0 = arrived.max(self.host_free[sched]);
        self.events += 1;
        let requested = matches!(event, Event::StepRequested(_));
        if let Event::StepRequested(r) = &event {
            // Step ids are indices into the workload's steps (see `Workload::steps`).
            self.begin_step(r.step as usize, t0);
        }
        let recorded = self.recorder.records.is_some().then(|| event.clone());
        self.commands.clear();
        self.scheduler.on_event(event, &mut self.commands)?;

        let mut t = t0;
        if requested {
            let d = self.machine.finish.begin_ns(&self.ctx).round() as u64;
            let step = self.step_id;
            self.recorder
                .span(SCHEDULER_TRACK, |_| format!("begin step {step}"), t, t + d);
            t += d;
        }
        let mut step_done = None;
        let mut predictions = Vec::new();
        let mut landed = Vec::new();
        let mut loads: Vec<Load> = Vec::new();
        for command in &self.commands {
            match command {
                Command::Compute { xpu, work } => self.sends.push((*xpu, work.clone(), t)),
                Command::FinishPhase {
                    step, layer, phase, ..
                } => {
                    let (mut clusters, parts) = self
                        .program
                        .phase(*phase)
                        .map_or((0, 0), |p| (p.clusters.len(), p.parts.len()));
                    if *phase == Phase::FfnNeurons && self.workload.predicted {
                        // Skipped clusters add nothing to the sum of partial outputs.
                        clusters = computed_clusters(
                            self.program.clusters(Phase::FfnNeurons),
                            self.ctx.activity,
                            *layer,
                        );
                    }
                    let d = self
                        .machine
                        .finish
                        .finish_ns(*phase, *layer, clusters, parts, &self.ctx)
                        .round() as u64;
                    let i = Recorder::name_index(*layer, *phase);
                    self.recorder
                        .span(SCHEDULER_TRACK, |r| r.finish_names[i].clone(), t, t + d);
                    t += d;
                    if *phase == Phase::FfnGateRows {
                        // Drivers feed the pages the gate let through right after this finish.
                        let pages = active_pages(
                            self.machine.gate_layout.as_ref(),
                            self.scheduler.bundle_pages(),
                            self.program.clusters(Phase::FfnNeurons),
                            self.ctx.activity,
                            *layer,
                            false,
                        );
                        predictions.push((
                            t,
                            Event::FfnPages {
                                step: *step,
                                layer: *layer,
                                pages,
                            },
                        ));
                    }
                    if *phase == Phase::AttnOutRows
                        && self.ctx.shape == StepShape::Decode
                        && self.scheduler.awaits_predictions()
                    {
                        // The drivers feed the layer's predictions right after this finish;
                        // nothing moves the scheduler's load cursor in between.
                        let clusters = self.program.clusters(Phase::FfnNeurons);
                        let event = if self.scheduler.reads_predicted_pages() {
                            Event::FfnPages {
                                step: *step,
                                layer: *layer,
                                pages: active_pages(
                                    self.machine.gate_layout.as_ref(),
                                    self.scheduler.bundle_pages(),
                                    clusters,
                                    self.ctx.activity,
                                    *layer,
                                    true,
                                ),
                            }
                        } else {
                            Event::FfnPredicted {
                                step: *step,
                                layer: *layer,
                                needed: needed_clusters(clusters, self.ctx.activity, *layer),
                            }
                        };
                        predictions.push((t, event));
                    }
                }
                Command::Load {
                    step,
                    layer,
                    cluster,
                    pages,
                    ..
                } => loads.push(Load {
                    at: t,
                    step: *step,
                    layer: *layer,
                    cluster: *cluster,
                    pages: pages.as_ref().map(|p| p.len() as u64),
                }),
                Command::StepDone { step } => {
                    self.timings.push(StepTiming {
                        step: *step,
                        n_tokens: self.ctx.n_tokens,
                        n_past: self.ctx.n_past,
                        shape: self.ctx.shape,
                        start_ns: self.step_start,
                        end_ns: t,
                    });
                    step_done = Some(t);
                }
            }
        }
        if let (Some(records), Some(event)) = (self.recorder.records.as_mut(), recorded) {
            records.push(TraceRecord {
                t_ns: t0,
                event,
                commands: self.commands.clone(),
            });
        }
        self.scheduler_busy_ns += t - t0;
        self.host_free[sched] = t;

        self.submit_loads(&loads, &mut landed);
        for (at, event) in predictions.into_iter().chain(landed) {
            self.push(at, PendingKind::Arrive(event));
        }
        let mut sends = std::mem::take(&mut self.sends);
        for (xpu, work, sent) in sends.drain(..) {
            self.send_compute(xpu, work, sent);
        }
        self.sends = sends;
        if let Some(done) = step_done {
            self.request_next_step(done);
        }
        Ok(())
    }

    /// The loads of one command batch, merged as the actor driver merges them (adjacent
    /// bundles, at most the plan's `coalesce` per read): one issuer on its own host, a read
    /// starts when the device is free and its completion travels back as messages.
    fn submit_loads(&mut self, loads: &[Load], landed: &mut Vec<(u64, Event)>) {
        let sched = self.machine.sched_host;
        let coalesce = self.scheduler.coalesce().max(1) as usize;
        let Some(map) = self.scheduler.unit_map().cloned() else {
            return;
        };
        let mut i = 0;
        while i < loads.len() {
            let Load {
                at: t,
                step,
                layer,
                cluster,
                pages,
            } = loads[i];
            let mut end = i + 1;
            while end < loads.len()
                && pages.is_none()
                && end - i < coalesce
                && loads[end].step == step
                && loads[end].pages.is_none()
                && map.adjacent(
                    map.unit(loads[end - 1].layer, loads[end - 1].cluster),
                    map.unit(loads[end].layer, loads[end].cluster),
                )
            {
                end += 1;
            }
            // Reads merge bundles only: an attention matrix is one read of its own; some pages
            // of a bundle (gate-first loading) are one read of their own.
            let (bytes, parts) = match map.phase_cluster(layer, cluster) {
                (Phase::QkvHeads, m) => (self.machine.attention_bytes[m as usize], 1),
                (Phase::AttnOutRows, _) => (self.machine.attention_bytes[3], 1),
                _ if pages.is_some() => (
                    (pages.unwrap_or(0) * 4096).min(self.machine.bundle_bytes),
                    1,
                ),
                _ => (
                    self.machine.bundle_bytes * (end - i) as u64,
                    self.machine.reads_per_bundle.max(1),
                ),
            };
            let mut read = self
                .machine
                .storage
                .submit(t, bytes / parts, Access::Random);
            for _ in 1..parts {
                let next = self
                    .machine
                    .storage
                    .submit(t, bytes / parts, Access::Random);
                read.end_ns = read.end_ns.max(next.end_ns);
            }
            let latency =
                self.machine
                    .messages
                    .latency_ns(false, read.end_ns, self.host_free[sched]);
            self.recorder.span(
                "storage",
                |_| format!("L{layer} load {cluster} (+{})", end - i - 1),
                read.start_ns,
                read.end_ns,
            );
            for &Load {
                step,
                layer,
                cluster,
                ..
            } in &loads[i..end]
            {
                landed.push((
                    read.end_ns + latency,
                    Event::Loaded {
                        step,
                        layer,
                        cluster,
                    },
                ));
            }
            i = end;
        }
    }

    /// A `Compute` message sent at `sent`: the group computes once the message has arrived
    /// and its host is free.
    fn send_compute(&mut self, xpu: XpuId, work: ClusterWork, sent: u64) {
        let g = usize::from(xpu.0);
        let host = self.machine.group_host[g];
        let same = host == self.machine.sched_host;
        let latency = self
            .machine
            .messages
            .latency_ns(same, sent, self.host_free[host]);
        let start = (sent + latency).max(self.host_free[host]);
        let duration = self.compute_ns(g, &work);
        let end = start + duration;
        self.host_free[host] = end;
        self.group_busy_ns[g] += duration;
        let i = Recorder::name_index(work.layer, work.phase);
        let track = &self.machine.group_names[g];
        self.recorder
            .span(track, |r| r.compute_names[i].clone(), start, end);
        self.push(end, PendingKind::GroupDone { xpu, work });
    }

    fn compute_ns(&mut self, g: usize, work: &ClusterWork) -> u64 {
        let phase = work.phase;
        let keep = !(phase == Phase::FfnNeurons && self.ctx.activity.is_some());
        let key = g * PHASES + phase as usize;
        if keep && self.memo[key].1 != UNKNOWN && self.memo[key].0 == work.clusters {
            return self.memo[key].1;
        }
        let range = work.clusters.start as usize..work.clusters.end as usize;
        let clusters = &self.program.clusters(phase)[range];
        let ns = self.machine.groups[g]
            .phase_ns(&self.costs, phase, work.layer, clusters, &self.ctx)
            .round() as u64;
        if keep {
            self.memo[key] = (work.clusters.clone(), ns);
        }
        ns
    }
}

/// A `Load` command as the storage model sees it: when it was issued, what it reads and how
/// many pages (`None`: the whole unit).
#[derive(Clone, Copy)]
struct Load {
    at: u64,
    step: u64,
    layer: u32,
    cluster: u32,
    pages: Option<u64>,
}

/// Gate-first loading: the pages of each FFN cluster's bundle the neurons active in `layer`
/// read, as the executor marks them for one token: their up rows (every up row when more than
/// half the cluster fires) and down columns after a gate phase, or with predictors (`predicted`)
/// their gate rows, up rows and down columns. Every page of every bundle without a layout or
/// an activity.
fn active_pages(
    layout: Option<&conductor_runtime::store::BundleLayout>,
    bundle_pages: u32,
    clusters: &[Range<u32>],
    activity: Option<&StepActivity>,
    layer: u32,
    predicted: bool,
) -> Vec<u64> {
    let per = bundle_pages as usize;
    let mut words = vec![0u64; (clusters.len() * per).div_ceil(64)];
    let active = match activity.and_then(|a| a.layers.get(layer as usize)) {
        Some(ActiveSet::Neurons(v)) => Some(v.as_slice()),
        _ => None,
    };
    let (Some(layout), Some(active)) = (layout, active) else {
        (0..clusters.len() * per).for_each(|i| words[i / 64] |= 1 << (i % 64));
        return words;
    };
    let mut local = Vec::new();
    for (c, r) in clusters.iter().enumerate() {
        let from = active.partition_point(|&n| n < r.start);
        let to = active.partition_point(|&n| n < r.end);
        local.clear();
        local.extend(active[from..to].iter().map(|&n| n - r.start));
        let (b, first) = (c as u32, c * per);
        if predicted {
            layout.mark_neuron_pages(b, &local, &mut words, first);
        } else if !local.is_empty() {
            let whole = local.len() * 2 > r.len();
            layout.mark_active_pages(b, &local, whole, &mut words, first);
        }
    }
    words
}

/// Indices of the FFN clusters (`clusters`, ascending ranges) that hold an active neuron of
/// `layer` in `activity` (all of them when every neuron is active).
fn active_clusters<'a>(
    clusters: &'a [Range<u32>],
    activity: Option<&'a StepActivity>,
    layer: u32,
) -> Option<impl Iterator<Item = usize> + 'a> {
    let Some(ActiveSet::Neurons(active)) = activity.and_then(|a| a.layers.get(layer as usize))
    else {
        return None;
    };
    let mut c = 0;
    let mut last = usize::MAX;
    Some(active.iter().filter_map(move |&n| {
        while c < clusters.len() && clusters[c].end <= n {
            c += 1;
        }
        (c < clusters.len() && clusters[c].start <= n && c != last).then(|| {
            last = c;
            c
        })
    }))
}

/// How many FFN clusters of `layer` compute (the others are skipped: no active neuron).
fn computed_clusters(
    clusters: &[Range<u32>],
    activity: Option<&StepActivity>,
    layer: u32,
) -> usize {
    active_clusters(clusters, activity, layer).map_or(clusters.len(), |it| it.count())
}

/// The predictions a driver feeds for `layer`: bit `c` set for each cluster with an active
/// neuron.
fn needed_clusters(
    clusters: &[Range<u32>],
    activity: Option<&StepActivity>,
    layer: u32,
) -> Vec<u64> {
    let mut words = vec![0u64; clusters.len().div_ceil(64)];
    match active_clusters(clusters, activity, layer) {
        Some(it) => it.for_each(|c| words[c / 64] |= 1 << (c % 64)),
        None => (0..clusters.len()).for_each(|c| words[c / 64] |= 1 << (c % 64)),
    }
    words
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
                kind: PendingKind::Arrive(Event::StepRequested(
                    conductor_runtime::schedule::StepRequest {
                        step: seq,
                        n_tokens: 1,
                        n_past: 0,
                        logits_from: 0,
                    },
                )),
            }));
        }
        let order: Vec<u64> = std::iter::from_fn(|| heap.pop().map(|Reverse(p)| p.seq)).collect();
        assert_eq!(order, vec![1, 3, 0, 2]);
    }
}

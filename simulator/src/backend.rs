//! The simulator's backend of the dispatch core: the commands the core carries out cost
//! virtual time on the scheduler's host (finishes, the step's start), or are noted to be
//! timed by the engine once the batch is out (computes sent to groups, read runs submitted to
//! storage). The active neurons a finished phase owes come from the workload's activity.

use crate::devices::host::{FinishModel, MessageModel};
use crate::devices::storage::StorageModel;
use crate::devices::{GroupModel, ModelCosts, StepCtx};
use crate::report::StepTiming;
use crate::workload::{PlannedStep, Workload};
use crate::SimError;
use conductor_runtime::dispatch::{Backend, Done, Finish, UnitLoad};
use conductor_runtime::neuron::Phase;
use conductor_runtime::plan::FfnPlan;
use conductor_runtime::schedule::{
    Activity, Awaited, ClusterWork, PageMap, Program, StepId, StepRequest, StepShape, XpuId,
};
use conductor_runtime::store::BundleLayout;
use conductor_runtime::trace::{ActiveSet, Span, StepActivity};
use std::ops::Range;
use std::sync::Arc;

/// Phases per layer kind, for per-(group, phase) tables.
pub(crate) const PHASES: usize = 8;
const UNKNOWN: u64 = u64::MAX;
pub(crate) const SCHEDULER_TRACK: &str = "scheduler";

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
    /// Bytes a bundle of each layer reads where they differ (`Workload::layer_bundle_bytes`);
    /// a layer not listed (or the output projection) reads `bundle_bytes`.
    pub layer_bundle_bytes: Vec<u64>,
    /// Reads per bundle: 1 bundled, 3 when gate, up and down lie apart (`Workload::bundled`).
    pub reads_per_bundle: u64,
    /// Bytes one load of each streamed attention matrix reads (q, k, v, output; 4 KiB
    /// aligned), when the plan streams attention.
    pub attention_bytes: [u64; 4],
    /// Page reads: where a bundle's rows lie (which pages an active neuron's rows take);
    /// `None` without them.
    pub gate_layout: Option<BundleLayout>,
    /// Reads of one run are each their own, in flight together (io_uring); otherwise a run
    /// is one read.
    pub in_flight_together: bool,
}

impl Machine {
    /// Bytes a whole bundle of `layer` reads.
    pub fn bundle_bytes_of(&self, layer: u32) -> u64 {
        self.layer_bundle_bytes
            .get(layer as usize)
            .map_or(self.bundle_bytes, |&b| b.min(self.bundle_bytes))
    }
}

/// A unit of a read run, as the storage model sees it: when it was issued, what it reads and
/// how many pages (`None`: the whole unit), and whether it starts a run.
#[derive(Clone, Copy)]
pub(crate) struct Load {
    pub at: u64,
    pub step: StepId,
    pub layer: u32,
    pub cluster: u32,
    pub pages: Option<u64>,
    pub starts_run: bool,
}

/// Spans, when asked for, with their names built once.
pub(crate) struct Spans {
    pub spans: Option<Vec<Span>>,
    /// Span names by (layer, phase): `L3 ffn`, `output`.
    pub compute_names: Vec<String>,
    pub finish_names: Vec<String>,
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

impl Spans {
    pub fn new(record: bool, n_layer: u32, capacity: usize) -> Spans {
        let mut compute_names = Vec::new();
        let mut finish_names = Vec::new();
        if record {
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
        Spans {
            spans: record.then(|| Vec::with_capacity(capacity)),
            compute_names,
            finish_names,
        }
    }

    pub fn name_index(layer: u32, phase: Phase) -> usize {
        layer as usize * PHASES + phase as usize
    }

    pub fn span(&mut self, track: &str, name: impl FnOnce(&Self) -> String, start: u64, end: u64) {
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

/// The backend: the scheduler host's clock and what the batch sent out.
pub(crate) struct SimBackend<'a> {
    pub workload: &'a Workload,
    pub steps: Vec<PlannedStep>,
    pub costs: ModelCosts,
    pub machine: Machine,
    /// Programs by [`StepShape`] (decode, prefill), and the largest decode step.
    pub programs: [Arc<Program>; 2],
    pub decode_max_tokens: u32,
    /// The scheduler's host time while a batch is carried out.
    pub t: u64,
    /// Computes sent (group, work, when) and loads issued by the batch.
    pub sends: Vec<(XpuId, ClusterWork, u64)>,
    pub loads: Vec<Load>,
    /// When the step in flight ended, if it did in this batch.
    pub step_done: Option<u64>,
    /// The step in flight.
    pub ctx: StepCtx<'a>,
    pub step_id: StepId,
    pub step_start: u64,
    pub program: Arc<Program>,
    /// Duration of each (group, phase) in this step with the cluster range it was for (a
    /// plan may list a group twice); phases whose cost varies by layer (FFN neurons under an
    /// activity) are not kept.
    memo: Vec<(Range<u32>, u64)>,
    pub timings: Vec<StepTiming>,
    pub events: u64,
    pub spans: Spans,
}

impl<'a> SimBackend<'a> {
    pub fn new(
        workload: &'a Workload,
        steps: Vec<PlannedStep>,
        machine: Machine,
        ffn: FfnPlan,
        programs: [Arc<Program>; 2],
        decode_max_tokens: u32,
        spans: Spans,
    ) -> SimBackend<'a> {
        let n_groups = machine.groups.len();
        SimBackend {
            costs: ModelCosts {
                ffn,
                ..ModelCosts::new(&workload.model)
            },
            workload,
            steps,
            machine,
            program: Arc::clone(&programs[0]),
            programs,
            decode_max_tokens,
            t: 0,
            sends: Vec::with_capacity(8),
            loads: Vec::new(),
            step_done: None,
            ctx: StepCtx {
                shape: StepShape::Decode,
                n_tokens: 1,
                n_past: 0,
                n_out: 1,
                activity: None,
            },
            step_id: 0,
            step_start: 0,
            memo: vec![(0..0, UNKNOWN); n_groups * PHASES],
            timings: Vec::new(),
            events: 0,
            spans,
        }
    }

    /// The duration of `work` on group `g`.
    pub fn compute_ns(&mut self, g: usize, work: &ClusterWork) -> u64 {
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

impl Backend for SimBackend<'_> {
    type Error = SimError;

    fn now_ns(&self) -> u64 {
        self.t
    }

    /// Sets up the step (step ids index the workload's steps, see `Workload::steps`) and
    /// charges its start on the scheduler's host.
    fn step_requested(&mut self, r: &StepRequest) -> Result<(), SimError> {
        let shape = if r.n_tokens <= self.decode_max_tokens {
            StepShape::Decode
        } else {
            StepShape::Prefill
        };
        let workload = self.workload;
        self.ctx = StepCtx {
            shape,
            n_tokens: r.n_tokens,
            n_past: r.n_past,
            n_out: r.n_tokens - r.logits_from.min(r.n_tokens),
            activity: self
                .steps
                .get(r.step as usize)
                .and_then(|p| p.decode_index)
                .and_then(|i| workload.activity_of(i)),
        };
        self.step_id = r.step;
        self.step_start = self.t;
        self.program = Arc::clone(&self.programs[shape as usize]);
        self.memo.fill((0..0, UNKNOWN));
        let d = self.machine.finish.begin_ns(&self.ctx).round() as u64;
        let (step, t) = (r.step, self.t);
        self.spans
            .span(SCHEDULER_TRACK, |_| format!("begin step {step}"), t, t + d);
        self.t += d;
        Ok(())
    }

    fn compute(&mut self, xpu: XpuId, work: &ClusterWork) -> Result<Done, SimError> {
        self.sends.push((xpu, work.clone(), self.t));
        Ok(Done::Later)
    }

    fn finish_phase(
        &mut self,
        f: &Finish,
        awaited: Option<Awaited>,
        activity: &mut Activity,
    ) -> Result<(), SimError> {
        let (mut clusters, parts) = self
            .program
            .phase(f.phase)
            .map_or((0, 0), |p| (p.clusters.len(), p.parts.len()));
        if f.phase == Phase::FfnNeurons && self.costs.ffn.selects_clusters() {
            // Skipped clusters add nothing to the sum of partial outputs.
            clusters = computed_clusters(
                self.program.clusters(Phase::FfnNeurons),
                self.ctx.activity,
                f.layer,
            );
        }
        let d = self
            .machine
            .finish
            .finish_ns(f.phase, f.layer, clusters, parts, &self.ctx)
            .round() as u64;
        let i = Spans::name_index(f.layer, f.phase);
        let t = self.t;
        self.spans
            .span(SCHEDULER_TRACK, |r| r.finish_names[i].clone(), t, t + d);
        self.t += d;
        if awaited.is_some() {
            // The owed event reaches the scheduler right after this finish.
            self.events += 1;
            fill_activity(self.ctx.activity, f.layer, activity);
        }
        Ok(())
    }

    fn page_map(&self) -> Option<&dyn PageMap> {
        self.machine.gate_layout.as_ref().map(|l| l as &dyn PageMap)
    }

    fn read(&mut self, step: StepId, run: &[UnitLoad]) -> Result<Done, SimError> {
        for (i, u) in run.iter().enumerate() {
            self.loads.push(Load {
                at: self.t,
                step,
                layer: u.layer,
                cluster: u.cluster,
                pages: u.pages.as_ref().map(|p| p.len() as u64),
                starts_run: i == 0,
            });
        }
        Ok(Done::Later)
    }

    fn step_done(&mut self, step: StepId) -> Result<(), SimError> {
        self.timings.push(StepTiming {
            step,
            n_tokens: self.ctx.n_tokens,
            n_past: self.ctx.n_past,
            shape: self.ctx.shape,
            start_ns: self.step_start,
            end_ns: self.t,
        });
        self.step_done = Some(self.t);
        Ok(())
    }
}

/// The active neurons of `layer` in a step's activity: every neuron without one.
pub(crate) fn fill_activity(step: Option<&StepActivity>, layer: u32, into: &mut Activity) {
    match step.and_then(|a| a.layers.get(layer as usize)) {
        Some(ActiveSet::Neurons(v)) => {
            into.clear();
            into.push_token(v.iter().copied());
        }
        _ => into.set_all(),
    }
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

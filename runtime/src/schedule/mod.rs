//! The scheduler: a pure state machine that turns events into neuron-cluster commands.
//!
//! It knows the plan and which work is in flight; it never sees activations or weights, never
//! reads a clock and iterates no hash maps, so the same events always give the same commands.
//! Drivers (inline, actors, simulator) feed it [`Event`]s and carry out its [`Command`]s.
//!
//! A step is one forward pass over `n_tokens` tokens. Each layer is a fixed sequence of phases
//! (see [`Program`]); a phase's clusters may run in any order and on any thread, and the next
//! phase starts only after [`Command::FinishPhase`] has combined them in cluster order.

mod program;

pub use program::{ffn_clusters, split_by_weight, PhaseClusters, Program, StepShape};

use crate::cache::{
    Acquired, CacheDirectory, LayerCacheStats, PagesAcquired, UnitMap, Want, ATTN_UNITS,
};
use crate::neuron::Phase;
use crate::plan::{ExecutionPlan, ModelShape, PlanError, Share};
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::sync::Arc;

/// Identifies one forward pass.
pub type StepId = u64;

/// A processor group (a set of cores, or an accelerator) that computes clusters: the index of
/// its group in the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct XpuId(pub u8);

/// A forward pass to run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRequest {
    pub step: StepId,
    /// Tokens in this step (≥ 1).
    pub n_tokens: u32,
    /// Tokens already in the KV cache before this step (its first token's position).
    pub n_past: u32,
    /// Tokens with index ≥ `logits_from` within the step get logits; `n_tokens` means none.
    pub logits_from: u32,
}

impl StepRequest {
    /// Whether any token of the step needs logits.
    pub fn wants_logits(&self) -> bool {
        self.logits_from < self.n_tokens
    }
}

/// Some clusters of one phase, sent to one processor group in one message.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClusterWork {
    pub step: StepId,
    pub shape: StepShape,
    /// Layer index; `n_layer` stands for the output projection.
    pub layer: u32,
    pub phase: Phase,
    /// Indices into the program's cluster list for this phase.
    pub clusters: Range<u32>,
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    StepRequested(StepRequest),
    /// A processor group finished the clusters of a [`Command::Compute`].
    ClusterDone(ClusterWork),
    /// The bundle of FFN cluster `cluster` of `layer` is in the slot a [`Command::Load`] named.
    Loaded {
        step: StepId,
        layer: u32,
        cluster: u32,
    },
    /// Decode with predictors ([`Scheduler::await_predictions`]): the FFN clusters of `layer`
    /// the step needs, bit `c % 64` of word `c / 64` for cluster `c`. The others are neither
    /// loaded nor given a slot; they compute to zero.
    FfnPredicted {
        step: StepId,
        layer: u32,
        needed: Vec<u64>,
    },
    /// Gate-first loading ([`crate::cache::CachePlan::gate_first`]), once a decode step's
    /// `FfnGateRows` of `layer` is finished: the pages of each FFN cluster's bundle that its
    /// `FfnNeurons` compute reads, bit `c * bundle_pages + p` (words of 64) for page `p` of
    /// cluster `c`'s bundle. A cluster with no page is skipped; the others read the pages their
    /// slots lack, then compute.
    FfnPages {
        step: StepId,
        layer: u32,
        pages: Vec<u64>,
    },
}

/// What to do next. Commands of one batch are carried out in order; `Compute` may run
/// asynchronously, `FinishPhase` runs on the driver before the commands after it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    Compute {
        xpu: XpuId,
        work: ClusterWork,
    },
    /// Every cluster of the phase is done: reduce their outputs in cluster order into the
    /// residual stream (or gather them) and prepare the input of the next phase.
    FinishPhase {
        step: StepId,
        shape: StepShape,
        layer: u32,
        phase: Phase,
    },
    /// The step is complete; its logits, if any were asked for, are ready.
    StepDone {
        step: StepId,
    },
    /// Read the bundle of FFN cluster `cluster` of `layer` into cache slot `slot`, which held
    /// `evicted` (layer, cluster) until now; answer with [`Event::Loaded`].
    Load {
        step: StepId,
        layer: u32,
        cluster: u32,
        slot: u32,
        evicted: Option<(u32, u32)>,
        /// Gate-first loading: only these pages of the unit (4096 bytes each, from its start);
        /// `None`: all of it.
        pages: Option<Range<u32>>,
        /// The slot already holds this unit in part and keeps the pages it has (nothing is
        /// evicted, the slot is not given anew).
        top_up: bool,
    },
}

/// An event the scheduler cannot accept. Drivers treat it as a bug in themselves or a
/// corrupted trace: the step fails, nothing is computed twice.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScheduleError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("step {new} requested while step {running} is still running")]
    Busy { running: StepId, new: StepId },
    #[error("a step needs at least one token")]
    EmptyStep,
    #[error("step of {n_tokens} tokens is larger than the plan's largest prefill step ({max})")]
    StepTooLarge { n_tokens: u32, max: u32 },
    #[error("completion of work that is not in flight: {0:?}")]
    UnexpectedCompletion(ClusterWork),
    #[error("model shape field `{0}` is 0: nothing to schedule")]
    EmptyShape(&'static str),
    #[error("the plan has {0} processor groups; at most 255 are supported")]
    TooManyGroups(usize),
    #[error("the plan has a neuron cache, but the model is not a neuron store (make one with `conductor convert`)")]
    CacheWithoutStore,
    #[error("FFN predictions for layer {layer} of step {step}, which does not wait for them")]
    UnexpectedPrediction { step: StepId, layer: u32 },
    #[error("FFN pages for layer {layer} of step {step}, which is not waiting for them")]
    UnexpectedPages { step: StepId, layer: u32 },
    #[error("the plan loads gate rows first, but the model is not a neuron store with gate rows first in its bundles")]
    GateFirstWithoutStore,
    #[error("gate-first loading keeps a layer's {need} bundles in slots at once, but the cache has {cold} slots for them (a larger budget, or fewer hot slots)")]
    GateFirstSlots { need: u32, cold: u32 },
    #[error(
        "load completion for layer {layer} cluster {cluster} of step {step}, which is not loading"
    )]
    UnexpectedLoad {
        step: StepId,
        layer: u32,
        cluster: u32,
    },
}

struct InFlight {
    request: StepRequest,
    shape: StepShape,
    layer: u32,
    /// Index into the program's layer phases; `program.layer_phases.len()` means the output.
    phase_index: usize,
    /// Cluster ranges sent out for the current phase and not yet reported done.
    outstanding: Outstanding,
    /// Clusters of the current phase not sent yet: waiting for their bundles.
    waiting: u32,
}

/// The cluster ranges of one phase sent out and not yet done, found by their first cluster:
/// thousands can be out at once (one per bundle under a cache), and completions come back in
/// any order, so a lookup must not scan them.
#[derive(Default)]
struct Outstanding {
    /// `end_of[start]`: the end of the range starting at cluster `start`, 0 when none is out
    /// (a range is never empty, so its end is never 0).
    end_of: Vec<u32>,
    count: u32,
}

impl Outstanding {
    fn with_clusters(n: usize) -> Outstanding {
        Outstanding {
            end_of: vec![0; n],
            count: 0,
        }
    }

    fn insert(&mut self, range: Range<u32>) {
        let start = range.start as usize;
        if start >= self.end_of.len() {
            // Sized for the largest phase up front; grows only if a phase is larger.
            self.end_of.resize(start + 1, 0);
        }
        debug_assert!(self.end_of[start] == 0 && range.end > range.start);
        self.end_of[start] = range.end;
        self.count += 1;
    }

    /// Takes `range` off; false when it is not out (a stray or repeated completion).
    fn remove(&mut self, range: &Range<u32>) -> bool {
        match self.end_of.get_mut(range.start as usize) {
            Some(end) if *end != 0 && *end == range.end => {
                *end = 0;
                self.count -= 1;
                true
            }
            _ => false,
        }
    }

    fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn clear(&mut self) {
        if self.count > 0 {
            self.end_of.fill(0);
            self.count = 0;
        }
    }
}

/// Where one FFN cluster of the step in flight stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum UnitState {
    NotAcquired,
    Loading,
    Ready,
    Sent,
    /// Not needed by this step (predicted inactive): computed without a slot.
    Skipped,
    /// Gate-first loading: its gate rows are computed; it keeps its slot until the step's
    /// [`Event::FfnPages`] says which of its pages the rest of the compute reads.
    Gated,
}

/// The neuron cache as the scheduler drives it: every FFN cluster of a step is acquired in
/// order (layer by layer) as far ahead as free slots and the load depth allow, so reads run
/// ahead of compute; a cluster is computed as soon as its bundle is in.
struct CacheFlow {
    directory: CacheDirectory,
    max_loads: u32,
    coalesce: u32,
    loads_in_flight: u32,
    map: UnitMap,
    /// Next unit (in [`UnitMap`] order, the order a step needs them) to acquire, and the end of
    /// this step's units.
    cursor: u32,
    cursor_end: u32,
    /// Decode steps with predictors: the cursor stops here until the layer it enters has its
    /// predictions ([`Event::FfnPredicted`]).
    gate: u32,
    units: Vec<UnitState>,
    /// Reads in flight per unit (gate-first loading reads a bundle in several runs of pages).
    pending: Vec<u32>,
    /// Gate-first loading: the plan asks for it, the step in flight does it (decode), pages
    /// a bundle's gate rows take, pages per bundle.
    gate_first: bool,
    two_phase: bool,
    /// The step in flight waits for predictions (decode with predictors).
    gated_step: bool,
    gate_pages: u32,
    bundle_pages: u32,
    /// Gate-first loading with predictors: decode reads the predicted neurons' pages (gate,
    /// up and down rows) in one phase, no gate phase first; `layer_pages` are the pages of the
    /// layer whose FFN the cursor acquires ([`Event::FfnPages`] in place of `FfnPredicted`).
    page_predicted: bool,
    layer_pages: Vec<u64>,
    /// Slots units without a hot slot share: a gate phase keeps a layer's bundles pinned,
    /// so it needs a layer's worth.
    cold_slots: u32,
    /// Scratch: units a pump found ready; runs of pages to read.
    newly_ready: Vec<u32>,
    runs: Vec<Range<u32>>,
}

/// The scheduler state machine.
pub struct Scheduler {
    decode: Arc<Program>,
    prefill: Arc<Program>,
    decode_max_tokens: u32,
    prefill_max_tokens: u32,
    n_groups: usize,
    in_flight: Option<InFlight>,
    /// The last finished step's `outstanding`, kept for the next one: steps allocate nothing.
    spare_outstanding: Outstanding,
    cache: Option<CacheFlow>,
    /// Decode steps wait for each layer's FFN predictions before loading its clusters.
    await_predictions: bool,
}

impl Scheduler {
    /// A scheduler for a model of `shape` following `plan`: decode phases shared among the
    /// plan's `decode_on` groups, prefill phases among its `prefill_on` groups.
    pub fn new(shape: &ModelShape, plan: &ExecutionPlan) -> Result<Scheduler, ScheduleError> {
        plan.validate()?;
        for (field, value) in [
            ("n_layer", shape.n_layer),
            ("n_embd", shape.n_embd),
            ("n_ff", shape.n_ff),
            ("n_head", shape.n_head),
            ("n_head_kv", shape.n_head_kv),
            ("head_dim", shape.head_dim),
            ("n_vocab", shape.n_vocab),
        ] {
            if value == 0 {
                return Err(ScheduleError::EmptyShape(field));
            }
        }
        if plan.groups.len() > usize::from(u8::MAX) {
            return Err(ScheduleError::TooManyGroups(plan.groups.len()));
        }
        let resolve = |shares: &[Share]| -> Vec<(XpuId, u32)> {
            shares
                .iter()
                .map(|s| {
                    let index = plan.group_index(&s.group).expect("validated plan");
                    (XpuId(index as u8), s.weight)
                })
                .collect()
        };
        let decode_shares = resolve(&plan.decode_on);
        let prefill_shares = resolve(&plan.prefill_on);
        let cache = match &plan.cache {
            None => None,
            Some(_) if shape.ffn_bundle == 0 => return Err(ScheduleError::CacheWithoutStore),
            Some(c) => {
                let output_clusters = |sizes: &crate::plan::ClusterSizes| {
                    shape.n_vocab.div_ceil(sizes.output_rows.max(1))
                };
                if c.stream_output && plan.decode.output_rows != plan.prefill.output_rows {
                    return Err(ScheduleError::Plan(PlanError::Parse(
                        "a streamed output projection needs decode.output_rows == prefill.output_rows".into(),
                    )));
                }
                let map = UnitMap {
                    n_layer: shape.n_layer,
                    ffn_clusters: shape.n_ff.div_ceil(shape.ffn_bundle),
                    output_clusters: if c.stream_output {
                        output_clusters(&plan.decode)
                    } else {
                        0
                    },
                    attn_units: if c.stream_attention { ATTN_UNITS } else { 0 },
                };
                let n_units = map.n_units() as usize;
                let page = crate::store::STORE_ALIGN;
                let bundle_pages = (shape.ffn_bundle_stride / page) as u32;
                let gate_pages = shape.ffn_bundle_gate_bytes.div_ceil(page) as u32;
                if c.gate_first && (gate_pages == 0 || gate_pages > bundle_pages) {
                    return Err(ScheduleError::GateFirstWithoutStore);
                }
                let mut directory = CacheDirectory::new(c, &map);
                let cold_slots = directory.cold_slots();
                if c.gate_first {
                    directory = directory.with_pages(bundle_pages);
                }
                Some(CacheFlow {
                    directory,
                    max_loads: c.max_loads,
                    coalesce: c.coalesce.max(1),
                    loads_in_flight: 0,
                    map,
                    cursor: n_units as u32,
                    cursor_end: n_units as u32,
                    gate: u32::MAX,
                    units: vec![UnitState::NotAcquired; n_units],
                    pending: vec![0; n_units],
                    gate_first: c.gate_first,
                    two_phase: false,
                    gated_step: false,
                    gate_pages,
                    bundle_pages,
                    page_predicted: false,
                    layer_pages: Vec::new(),
                    cold_slots,
                    newly_ready: Vec::new(),
                    runs: Vec::new(),
                })
            }
        };
        let mut decode = Program::new(shape, &plan.decode, StepShape::Decode, &decode_shares);
        let mut prefill = Program::new(shape, &plan.prefill, StepShape::Prefill, &prefill_shares);
        if cache.as_ref().is_some_and(|c| c.map.attn_units > 0) {
            decode.stream_attention(shape, &decode_shares);
            prefill.stream_attention(shape, &prefill_shares);
        }
        if cache.as_ref().is_some_and(|c| c.gate_first) {
            decode.gate_first(&decode_shares);
        }
        let most_clusters = [&decode, &prefill]
            .iter()
            .flat_map(|p| p.layer_phases.iter().chain(std::iter::once(&p.output)))
            .map(|p| p.clusters.len())
            .max()
            .unwrap_or(0);
        Ok(Scheduler {
            cache,
            decode: Arc::new(decode),
            prefill: Arc::new(prefill),
            decode_max_tokens: plan.decode_max_tokens,
            prefill_max_tokens: plan.prefill_max_tokens,
            n_groups: plan.groups.len(),
            in_flight: None,
            spare_outstanding: Outstanding::with_clusters(most_clusters),
            await_predictions: false,
        })
    }

    /// Makes decode steps under a cache wait, layer by layer, for [`Event::FfnPredicted`]
    /// before loading the layer's FFN clusters, and load only the predicted ones. Reads no
    /// longer run ahead of a layer's attention, but skip every cluster no token needs. The
    /// driver must then send the event for every layer of every decode step.
    ///
    /// Under gate-first loading (`cache.gate_first`) the predictions come as
    /// [`Event::FfnPages`] instead: the pages of the predicted neurons' rows, read in one
    /// phase (the decode program then has no `FfnGateRows`). Set once, before the first step
    /// and before drivers take the programs.
    pub fn await_predictions(&mut self, on: bool) {
        self.await_predictions = on;
        let Some(cache) = self.cache.as_mut().filter(|c| c.gate_first) else {
            return;
        };
        cache.page_predicted = on;
        if on {
            Arc::make_mut(&mut self.decode)
                .layer_phases
                .retain(|p| p.phase != Phase::FfnGateRows);
        }
    }

    /// Whether decode steps read the predicted neurons' pages ([`Event::FfnPages`] after each
    /// layer's attention) rather than whole predicted bundles.
    pub fn reads_predicted_pages(&self) -> bool {
        self.await_predictions && self.cache.as_ref().is_some_and(|c| c.page_predicted)
    }

    /// Whether decode steps wait for FFN predictions (under a cache).
    pub fn awaits_predictions(&self) -> bool {
        self.await_predictions && self.cache.is_some()
    }

    /// Processor groups of the plan (`XpuId(0..n)`).
    pub fn n_groups(&self) -> usize {
        self.n_groups
    }

    /// The cluster layout of steps of the given shape (shared with the drivers).
    pub fn program(&self, shape: StepShape) -> &Arc<Program> {
        match shape {
            StepShape::Decode => &self.decode,
            StepShape::Prefill => &self.prefill,
        }
    }

    /// The shape a step of `n_tokens` tokens runs in.
    pub fn shape_for(&self, n_tokens: u32) -> StepShape {
        if n_tokens <= self.decode_max_tokens {
            StepShape::Decode
        } else {
            StepShape::Prefill
        }
    }

    /// The largest step the plan allows.
    pub fn max_step_tokens(&self) -> u32 {
        self.prefill_max_tokens.max(self.decode_max_tokens)
    }

    /// Whether a step is running.
    pub fn is_busy(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Forgets the step in flight (after a driver failed it); the next request starts clean.
    pub fn abort(&mut self) {
        if let Some(flight) = self.in_flight.take() {
            self.keep_spare(flight);
        }
        if let Some(cache) = self.cache.as_mut() {
            cache.directory.abort();
            cache.loads_in_flight = 0;
            cache.pending.fill(0);
            cache.cursor = cache.units.len() as u32;
        }
    }

    /// At most how many adjacent loads a driver may merge into one read (1 without a cache).
    pub fn coalesce(&self) -> u32 {
        self.cache.as_ref().map_or(1, |c| c.coalesce)
    }

    /// How the cache numbers its units, if the plan has a cache.
    pub fn unit_map(&self) -> Option<&UnitMap> {
        self.cache.as_ref().map(|c| &c.map)
    }

    /// The neuron cache's counters per layer, if the plan has a cache.
    pub fn cache_stats(&self) -> Option<&[LayerCacheStats]> {
        self.cache.as_ref().map(|c| c.directory.stats())
    }

    /// Starts from the cache a long run leaves behind (`CacheDirectory::warm`), before the
    /// first step; `plan` is the plan's cache section. Returns the units made resident (0
    /// without a cache, or once a step has run).
    pub fn warm_cache(&mut self, plan: &crate::cache::CachePlan) -> u32 {
        match (&mut self.cache, &self.in_flight) {
            (Some(c), None) => c.directory.warm(plan),
            _ => 0,
        }
    }

    /// Feeds one event; appends the resulting commands to `out`.
    pub fn on_event(&mut self, event: Event, out: &mut Vec<Command>) -> Result<(), ScheduleError> {
        let result = self.handle(event, out);
        if result.is_ok() {
            self.pump(out);
        }
        result
    }

    /// Lets the cache acquire and load ahead after an event.
    fn pump(&mut self, out: &mut Vec<Command>) {
        let (Some(flight), Some(cache)) = (self.in_flight.as_mut(), self.cache.as_mut()) else {
            return;
        };
        let program = match flight.shape {
            StepShape::Decode => &self.decode,
            StepShape::Prefill => &self.prefill,
        };
        pump(flight, program, cache, out);
    }

    fn handle(&mut self, event: Event, out: &mut Vec<Command>) -> Result<(), ScheduleError> {
        match event {
            Event::StepRequested(request) => self.start_step(request, out),
            Event::ClusterDone(work) => self.cluster_done(work, out),
            Event::Loaded {
                step,
                layer,
                cluster,
            } => self.loaded(step, layer, cluster, out),
            Event::FfnPredicted {
                step,
                layer,
                needed,
            } => self.predicted(step, layer, &needed, out),
            Event::FfnPages { step, layer, pages } => self.pages(step, layer, &pages, out),
        }
    }

    fn start_step(
        &mut self,
        request: StepRequest,
        out: &mut Vec<Command>,
    ) -> Result<(), ScheduleError> {
        if let Some(running) = &self.in_flight {
            return Err(ScheduleError::Busy {
                running: running.request.step,
                new: request.step,
            });
        }
        if request.n_tokens == 0 {
            return Err(ScheduleError::EmptyStep);
        }
        if request.n_tokens > self.max_step_tokens() {
            return Err(ScheduleError::StepTooLarge {
                n_tokens: request.n_tokens,
                max: self.max_step_tokens(),
            });
        }
        let shape = self.shape_for(request.n_tokens);
        if let Some(c) = self.cache.as_ref() {
            let gate_phase = c.gate_first && !c.page_predicted && shape == StepShape::Decode;
            if gate_phase && c.cold_slots < c.map.ffn_clusters {
                return Err(ScheduleError::GateFirstSlots {
                    need: c.map.ffn_clusters,
                    cold: c.cold_slots,
                });
            }
        }
        let request_wants_logits = request.wants_logits();
        self.in_flight = Some(InFlight {
            request,
            shape,
            layer: 0,
            phase_index: 0,
            outstanding: std::mem::take(&mut self.spare_outstanding),
            waiting: 0,
        });
        let wants_logits = request_wants_logits;
        let gated = self.await_predictions && shape == StepShape::Decode;
        if let Some(cache) = self.cache.as_mut() {
            cache.units.fill(UnitState::NotAcquired);
            cache.two_phase =
                cache.gate_first && !cache.page_predicted && shape == StepShape::Decode;
            cache.gated_step = gated;
            cache.gate = if gated {
                cache.map.unit(0, 0)
            } else {
                u32::MAX
            };
            cache.cursor = 0;
            cache.cursor_end = if wants_logits {
                cache.map.n_units()
            } else {
                cache.map.n_layer_units()
            };
        }
        self.issue_current_phase(out);
        Ok(())
    }

    fn cluster_done(
        &mut self,
        work: ClusterWork,
        out: &mut Vec<Command>,
    ) -> Result<(), ScheduleError> {
        let Some(flight) = self.in_flight.as_mut() else {
            return Err(ScheduleError::UnexpectedCompletion(work));
        };
        let program = match flight.shape {
            StepShape::Decode => &self.decode,
            StepShape::Prefill => &self.prefill,
        };
        let expected_phase = program.phase_at(flight.phase_index);
        let matches = work.step == flight.request.step
            && work.shape == flight.shape
            && work.layer == flight.layer
            && work.phase == expected_phase;
        if !matches || !flight.outstanding.remove(&work.clusters) {
            return Err(ScheduleError::UnexpectedCompletion(work));
        }
        if let Some(cache) = self.cache.as_mut().filter(|c| c.map.streams(work.phase)) {
            for c in work.clusters.clone() {
                let c = cache.map.unit_cluster(work.phase, c);
                let u = cache.unit(work.layer, c);
                // Gate-first: the bundle stays pinned for the rest of the cluster's compute.
                if work.phase == Phase::FfnGateRows {
                    cache.units[u] = UnitState::Gated;
                    continue;
                }
                // A skipped cluster never held a slot.
                if cache.units[u] != UnitState::Skipped {
                    cache.directory.release(work.layer, c);
                }
            }
        }
        self.finish_phase_if_done(out)
    }

    /// Once nothing of the current phase is out or waiting: `FinishPhase`, then the next
    /// phase (or the end of the step).
    fn finish_phase_if_done(&mut self, out: &mut Vec<Command>) -> Result<(), ScheduleError> {
        let Some(flight) = self.in_flight.as_mut() else {
            return Ok(());
        };
        if !flight.outstanding.is_empty() || flight.waiting > 0 {
            return Ok(());
        }
        let program = match flight.shape {
            StepShape::Decode => &self.decode,
            StepShape::Prefill => &self.prefill,
        };
        out.push(Command::FinishPhase {
            step: flight.request.step,
            shape: flight.shape,
            layer: flight.layer,
            phase: program.phase_at(flight.phase_index),
        });
        let n_layer = program.n_layer;
        let per_layer = program.layer_phases.len();
        let at_output = flight.phase_index == per_layer;
        if at_output {
            return self.finish_step(out);
        }
        flight.phase_index += 1;
        if flight.phase_index == per_layer {
            if flight.layer + 1 < n_layer {
                flight.layer += 1;
                flight.phase_index = 0;
            } else if flight.request.wants_logits() {
                flight.layer = n_layer;
            } else {
                return self.finish_step(out);
            }
        }
        self.issue_current_phase(out);
        Ok(())
    }

    fn finish_step(&mut self, out: &mut Vec<Command>) -> Result<(), ScheduleError> {
        if let Some(flight) = self.in_flight.take() {
            out.push(Command::StepDone {
                step: flight.request.step,
            });
            self.keep_spare(flight);
        }
        Ok(())
    }

    fn keep_spare(&mut self, flight: InFlight) {
        let mut outstanding = flight.outstanding;
        outstanding.clear();
        self.spare_outstanding = outstanding;
    }

    /// Sends the current phase's clusters to the processor groups: one message per group,
    /// each a contiguous share fixed by the plan.
    fn issue_current_phase(&mut self, out: &mut Vec<Command>) {
        let flight = self.in_flight.as_mut().expect("a step is in flight");
        let program = match flight.shape {
            StepShape::Decode => &self.decode,
            StepShape::Prefill => &self.prefill,
        };
        let layout = program.phase_layout_at(flight.phase_index);
        let phase = layout.phase;
        flight.outstanding.clear();
        flight.waiting = 0;
        if let Some(cache) = self.cache.as_mut().filter(|c| c.map.streams(phase)) {
            // Runs of clusters whose bundles are in go out at once; the rest when they land.
            for (xpu, range) in &layout.parts {
                let mut run_start = None;
                for c in range.clone().chain(std::iter::once(range.end)) {
                    let unit = |c| cache.unit(flight.layer, cache.map.unit_cluster(phase, c));
                    let state = (c < range.end).then(|| cache.units[unit(c)]);
                    let ready = matches!(state, Some(UnitState::Ready | UnitState::Skipped));
                    match (ready, run_start) {
                        (true, None) => run_start = Some(c),
                        (false, Some(s)) => {
                            flight.outstanding.insert(s..c);
                            out.push(Command::Compute {
                                xpu: *xpu,
                                work: ClusterWork {
                                    step: flight.request.step,
                                    shape: flight.shape,
                                    layer: flight.layer,
                                    phase,
                                    clusters: s..c,
                                },
                            });
                            run_start = None;
                        }
                        _ => {}
                    }
                    if c < range.end {
                        let u = unit(c);
                        if state == Some(UnitState::Ready) {
                            cache.units[u] = UnitState::Sent;
                        } else if !ready {
                            flight.waiting += 1;
                        }
                    }
                }
            }
            return;
        }
        for (xpu, range) in &layout.parts {
            let (xpu, range) = (*xpu, range.clone());
            flight.outstanding.insert(range.clone());
            out.push(Command::Compute {
                xpu,
                work: ClusterWork {
                    step: flight.request.step,
                    shape: flight.shape,
                    layer: flight.layer,
                    phase,
                    clusters: range,
                },
            });
        }
    }
}

impl Scheduler {
    /// Marks the clusters of `layer` that no token needs as skipped (sending them at once when
    /// their phase is computing), and lets the cache load the layer's others.
    fn predicted(
        &mut self,
        step: StepId,
        layer: u32,
        needed: &[u64],
        out: &mut Vec<Command>,
    ) -> Result<(), ScheduleError> {
        let unexpected = ScheduleError::UnexpectedPrediction { step, layer };
        let bit = |c: u32| {
            needed
                .get(c as usize / 64)
                .is_some_and(|w| w >> (c % 64) & 1 == 1)
        };
        self.take_predictions(step, layer, bit, unexpected, out)
    }

    /// The predictions of decode step `step` for `layer`, `needed(c)` for each FFN cluster:
    /// the others are skipped, and the cursor moves on to the next layer's predictions.
    fn take_predictions(
        &mut self,
        step: StepId,
        layer: u32,
        needed: impl Fn(u32) -> bool,
        unexpected: ScheduleError,
        out: &mut Vec<Command>,
    ) -> Result<(), ScheduleError> {
        let (Some(flight), Some(cache)) = (self.in_flight.as_mut(), self.cache.as_mut()) else {
            return Err(unexpected);
        };
        if flight.request.step != step
            || layer >= cache.map.n_layer
            || cache.map.unit(layer, 0) != cache.gate
            || cache.cursor != cache.gate
        {
            return Err(unexpected);
        }
        let program = match flight.shape {
            StepShape::Decode => &self.decode,
            StepShape::Prefill => &self.prefill,
        };
        let current = program.phase_layout_at(flight.phase_index);
        // The layer's FFN phase already waits for its clusters (it went out with the layer's
        // attention finish): a skipped one no longer counts as waiting, and is not sent: it
        // would add nothing, and drivers sum only the clusters a step needs.
        let waits = flight.layer == layer && current.phase == Phase::FfnNeurons;
        for c in (0..cache.map.ffn_clusters).filter(|&c| !needed(c)) {
            let u = cache.unit(layer, c);
            let state = std::mem::replace(&mut cache.units[u], UnitState::Skipped);
            if waits && !matches!(state, UnitState::Sent | UnitState::Skipped) {
                flight.waiting -= 1;
            }
        }
        cache.gate = if layer + 1 < cache.map.n_layer {
            cache.map.unit(layer + 1, 0)
        } else {
            u32::MAX
        };
        // Every cluster left may have been skipped.
        self.finish_phase_if_done(out)
    }

    /// Gate-first loading: the pages each FFN cluster of `layer` still needs. Clusters that
    /// need none are skipped (their slots released); those whose pages are all in go to
    /// compute at once; the others read the runs of pages their slots lack. With predictors
    /// they are the layer's predictions: the cursor then acquires the clusters with pages.
    fn pages(
        &mut self,
        step: StepId,
        layer: u32,
        pages: &[u64],
        out: &mut Vec<Command>,
    ) -> Result<(), ScheduleError> {
        let unexpected = ScheduleError::UnexpectedPages { step, layer };
        let Some(cache) = self.cache.as_mut() else {
            return Err(unexpected);
        };
        let per = cache.bundle_pages as usize;
        let bit = |i: usize| pages.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1);
        if cache.page_predicted {
            cache.layer_pages.clear();
            cache.layer_pages.extend_from_slice(pages);
            let needed = |c: u32| (c as usize * per..(c as usize + 1) * per).any(bit);
            return self.take_predictions(step, layer, needed, unexpected, out);
        }
        let Some(flight) = self.in_flight.as_mut() else {
            return Err(unexpected);
        };
        let program = match flight.shape {
            StepShape::Decode => &self.decode,
            StepShape::Prefill => &self.prefill,
        };
        let current = program.phase_layout_at(flight.phase_index).phase;
        let all_gated = (0..cache.map.ffn_clusters)
            .all(|c| cache.units[cache.unit(layer, c)] == UnitState::Gated);
        if flight.request.step != step
            || !cache.two_phase
            || flight.layer != layer
            || current != Phase::FfnNeurons
            || !all_gated
        {
            return Err(unexpected);
        }
        let mut runs = std::mem::take(&mut cache.runs);
        for c in 0..cache.map.ffn_clusters {
            let u = cache.unit(layer, c);
            let first = c as usize * per;
            if !(first..first + per).any(bit) {
                cache.units[u] = UnitState::Skipped;
                cache.directory.release(layer, c);
                flight.waiting -= 1;
                continue;
            }
            runs.clear();
            let wanted = |p: u32| bit(first + p as usize);
            let Some(slot) = cache.directory.top_up(layer, c, wanted, &mut runs) else {
                cache.runs = runs;
                return Err(unexpected);
            };
            if runs.is_empty() {
                cache.units[u] = UnitState::Ready;
                dispatch_if_current(flight, program, cache, layer, c, out);
                continue;
            }
            cache.units[u] = UnitState::Loading;
            cache.pending[u] = runs.len() as u32;
            cache.loads_in_flight += runs.len() as u32;
            for r in &runs {
                out.push(Command::Load {
                    step,
                    layer,
                    cluster: c,
                    slot,
                    evicted: None,
                    pages: Some(r.clone()),
                    top_up: true,
                });
            }
        }
        cache.runs = runs;
        // Every cluster may have been skipped.
        self.finish_phase_if_done(out)
    }

    /// Whether decode steps load FFN gate rows first ([`Event::FfnPages`] after each layer's
    /// `FfnGateRows`).
    pub fn gate_first(&self) -> bool {
        self.cache.as_ref().is_some_and(|c| c.gate_first)
    }

    /// Pages per FFN bundle under gate-first loading (0 otherwise).
    pub fn bundle_pages(&self) -> u32 {
        self.cache
            .as_ref()
            .filter(|c| c.gate_first)
            .map_or(0, |c| c.bundle_pages)
    }

    fn loaded(
        &mut self,
        step: StepId,
        layer: u32,
        cluster: u32,
        out: &mut Vec<Command>,
    ) -> Result<(), ScheduleError> {
        let unexpected = ScheduleError::UnexpectedLoad {
            step,
            layer,
            cluster,
        };
        let (Some(flight), Some(cache)) = (self.in_flight.as_mut(), self.cache.as_mut()) else {
            return Err(unexpected);
        };
        let clusters = if layer == cache.map.n_layer {
            cache.map.output_clusters
        } else {
            cache.map.ffn_clusters + cache.map.attn_units
        };
        if flight.request.step != step || layer > cache.map.n_layer || cluster >= clusters {
            return Err(unexpected);
        }
        let u = cache.unit(layer, cluster);
        if cache.units[u] != UnitState::Loading || cache.pending[u] == 0 {
            return Err(unexpected);
        }
        cache.loads_in_flight -= 1;
        cache.pending[u] -= 1;
        if cache.pending[u] > 0 {
            return Ok(()); // more runs of its pages to come
        }
        if !cache.directory.loaded(layer, cluster) {
            return Err(unexpected);
        }
        cache.units[u] = UnitState::Ready;
        let program = match flight.shape {
            StepShape::Decode => &self.decode,
            StepShape::Prefill => &self.prefill,
        };
        dispatch_if_current(flight, program, cache, layer, cluster, out);
        Ok(())
    }
}

/// Acquires what the cache allows, then sends clusters of the current phase that became ready.
fn pump(flight: &mut InFlight, program: &Program, cache: &mut CacheFlow, out: &mut Vec<Command>) {
    let mut ready = std::mem::take(&mut cache.newly_ready);
    ready.clear();
    cache.pump(flight.request.step, &mut ready, out);
    for &u in &ready {
        let (layer, cluster) = cache.directory.split_unit(u);
        dispatch_if_current(flight, program, cache, layer, cluster, out);
    }
    cache.newly_ready = ready;
}

/// Sends the cluster that reads unit `(layer, cluster)`, now ready (or skipped), if its phase
/// is the one computing and it waits; otherwise it goes out with its phase.
fn dispatch_if_current(
    flight: &mut InFlight,
    program: &Program,
    cache: &mut CacheFlow,
    layer: u32,
    cluster: u32,
    out: &mut Vec<Command>,
) {
    let current = program.phase_layout_at(flight.phase_index);
    let u = cache.unit(layer, cluster);
    let (mut phase, cluster) = cache.map.phase_cluster(layer, cluster);
    // Gate-first: a bundle's first read serves the gate phase, its later ones the neurons'.
    if phase == Phase::FfnNeurons && current.phase == Phase::FfnGateRows {
        phase = Phase::FfnGateRows;
    }
    if flight.layer != layer || current.phase != phase {
        return;
    }
    let Some((xpu, _)) = current.parts.iter().find(|(_, r)| r.contains(&cluster)) else {
        return;
    };
    // A skipped cluster stays marked so: it holds no slot to release.
    if cache.units[u] != UnitState::Skipped {
        cache.units[u] = UnitState::Sent;
    }
    flight.waiting -= 1;
    flight.outstanding.insert(cluster..cluster + 1);
    out.push(Command::Compute {
        xpu: *xpu,
        work: ClusterWork {
            step: flight.request.step,
            shape: flight.shape,
            layer,
            phase: current.phase,
            clusters: cluster..cluster + 1,
        },
    });
}

impl CacheFlow {
    fn unit(&self, layer: u32, cluster: u32) -> usize {
        self.map.unit(layer, cluster) as usize
    }

    /// Acquires clusters in step order while slots and the load depth allow; issues the loads.
    fn pump(&mut self, step: StepId, ready: &mut Vec<u32>, out: &mut Vec<Command>) {
        // Start loading only with room for a whole group of adjacent reads (or when nothing
        // is in flight), so drivers can merge them into one request.
        let room = self.max_loads.saturating_sub(self.loads_in_flight);
        if self.loads_in_flight > 0 && room < self.coalesce.min(self.max_loads) {
            return;
        }
        while self.cursor < self.cursor_end.min(self.gate) && self.loads_in_flight < self.max_loads
        {
            let (layer, cluster) = self.directory.split_unit(self.cursor);
            let u = self.cursor as usize;
            if self.units[u] == UnitState::Skipped {
                self.cursor += 1;
                continue;
            }
            let ffn_unit = layer < self.map.n_layer && cluster < self.map.ffn_clusters;
            if self.page_predicted && self.gated_step && ffn_unit {
                // The predicted neurons' pages (the cursor is in the layer they are for).
                let first = cluster as usize * self.bundle_pages as usize;
                let bits = &self.layer_pages;
                let wanted = |p: u32| {
                    let i = first + p as usize;
                    bits.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1)
                };
                let mut runs = std::mem::take(&mut self.runs);
                runs.clear();
                let got = self
                    .directory
                    .acquire_pages(layer, cluster, wanted, &mut runs);
                let Some(PagesAcquired {
                    slot,
                    evicted,
                    fresh,
                }) = got
                else {
                    self.runs = runs;
                    break;
                };
                if runs.is_empty() {
                    self.units[u] = if self.directory.is_ready(layer, cluster) {
                        ready.push(self.cursor);
                        UnitState::Ready
                    } else {
                        UnitState::Loading
                    };
                } else {
                    self.units[u] = UnitState::Loading;
                    self.pending[u] = runs.len() as u32;
                    self.loads_in_flight += runs.len() as u32;
                    for (i, r) in runs.iter().enumerate() {
                        // The first run gives the slot to the unit; the others add pages.
                        let gives = fresh && i == 0;
                        out.push(Command::Load {
                            step,
                            layer,
                            cluster,
                            slot,
                            evicted: evicted
                                .filter(|_| gives)
                                .map(|e| self.directory.split_unit(e)),
                            pages: Some(r.clone()),
                            top_up: !gives,
                        });
                    }
                }
                self.runs = runs;
                self.cursor += 1;
                continue;
            }
            let want = if self.two_phase && ffn_unit {
                Want::Prefix(self.gate_pages)
            } else {
                Want::Whole
            };
            // One read otherwise: the unit's slot (its prefix or whole), or the pages it lacks.
            let (slot, evicted, pages, top_up) =
                match self.directory.acquire_part(layer, cluster, want) {
                    Acquired::Full => break,
                    Acquired::Hit => {
                        self.units[u] = if self.directory.is_ready(layer, cluster) {
                            ready.push(self.cursor);
                            UnitState::Ready
                        } else {
                            UnitState::Loading
                        };
                        self.cursor += 1;
                        continue;
                    }
                    Acquired::Load { slot, evicted } => {
                        let pages = match want {
                            Want::Prefix(n) => Some(0..n),
                            Want::Whole => None,
                        };
                        (slot, evicted, pages, false)
                    }
                    Acquired::TopUp { slot, pages } => (slot, None, Some(pages), true),
                };
            self.units[u] = UnitState::Loading;
            self.pending[u] = 1;
            self.loads_in_flight += 1;
            out.push(Command::Load {
                step,
                layer,
                cluster,
                slot,
                evicted: evicted.map(|e| self.directory.split_unit(e)),
                pages,
                top_up,
            });
            self.cursor += 1;
        }
    }
}

#[cfg(test)]
mod tests;

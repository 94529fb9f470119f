//! The state machine: a step's phases in order, each phase's clusters sent to the processor
//! groups and counted back, and (under a cache) each cluster sent when its unit is in.

use super::cache_flow::{settle_unit, CacheFlow};
use super::{
    Awaited, ClusterWork, Command, Event, Program, ReadGeometry, ScheduleError, StepId,
    StepRequest, StepShape, XpuId,
};
use crate::cache::{CacheDirectory, LayerCacheStats, UnitMap};
use crate::neuron::Phase;
use crate::plan::{ExecutionPlan, FfnPlan, ModelShape, Share};
use std::ops::Range;
use std::sync::Arc;

pub(super) struct InFlight {
    pub request: StepRequest,
    pub shape: StepShape,
    pub layer: u32,
    /// Index into the program's layer phases; `program.layer_phases.len()` means the output.
    pub phase_index: usize,
    /// Cluster ranges sent out for the current phase and not yet reported done.
    pub outstanding: Outstanding,
    /// Clusters of the current phase not sent yet: waiting for their bundles.
    pub waiting: u32,
}

/// The cluster ranges of one phase sent out and not yet done, found by their first cluster:
/// thousands can be out at once (one per bundle under a cache), and completions come back in
/// any order, so a lookup must not scan them.
#[derive(Default)]
pub(super) struct Outstanding {
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

    pub fn insert(&mut self, range: Range<u32>) {
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

/// The scheduler state machine.
pub struct Scheduler {
    decode: Arc<Program>,
    prefill: Arc<Program>,
    decode_max_tokens: u32,
    prefill_max_tokens: u32,
    n_groups: usize,
    ffn: FfnPlan,
    in_flight: Option<InFlight>,
    /// The last finished step's `outstanding`, kept for the next one: steps allocate nothing.
    spare_outstanding: Outstanding,
    cache: Option<CacheFlow>,
}

impl Scheduler {
    /// A scheduler for a model of `shape` following `plan` with the FFN plan its reads imply
    /// ([`FfnPlan::implied`]: dense, unless its reads need a selection).
    pub fn new(shape: &ModelShape, plan: &ExecutionPlan) -> Result<Scheduler, ScheduleError> {
        Scheduler::with_ffn(shape, plan, FfnPlan::implied(plan, shape))
    }

    /// A scheduler for a model of `shape` following `plan`: decode phases shared among the
    /// plan's `decode_on` groups, prefill phases among its `prefill_on` groups, decode's FFN
    /// computed and read as `ffn` says (fixed for its life; [`FfnPlan::resolve`] makes one).
    pub fn with_ffn(
        shape: &ModelShape,
        plan: &ExecutionPlan,
        ffn: FfnPlan,
    ) -> Result<Scheduler, ScheduleError> {
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
        shape.check_limits().map_err(ScheduleError::ShapeTooLarge)?;
        if plan.groups.len() > usize::from(u8::MAX) {
            return Err(ScheduleError::TooManyGroups(plan.groups.len()));
        }
        // The FFN plan must be one its plan and shape resolve to (a trace or a caller may
        // bring any): a selection its reads cannot serve is refused by name.
        let resolved = FfnPlan::with_select(plan, shape, ffn.select)?;
        if resolved != ffn {
            return Err(ScheduleError::FfnPlanMismatch { ffn, resolved });
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
                if c.stream_output && plan.decode.output_rows != plan.prefill.output_rows {
                    return Err(ScheduleError::Plan(crate::plan::PlanError::Parse(
                        "a streamed output projection needs decode.output_rows == prefill.output_rows".into(),
                    )));
                }
                let map = UnitMap {
                    n_layer: shape.n_layer,
                    ffn_clusters: shape.n_ff.div_ceil(shape.ffn_bundle),
                    output_clusters: if c.stream_output {
                        shape.n_vocab.div_ceil(plan.decode.output_rows.max(1))
                    } else {
                        0
                    },
                    attn_units: if c.stream_attention {
                        crate::cache::ATTN_UNITS
                    } else {
                        0
                    },
                };
                let page = crate::store::STORE_ALIGN;
                let bundle_pages = (shape.ffn_bundle_stride / page) as u32;
                let gate_pages = shape.ffn_bundle_gate_bytes.div_ceil(page) as u32;
                let pages = ffn.reads.reads_pages();
                if pages && (gate_pages == 0 || gate_pages > bundle_pages) {
                    return Err(ScheduleError::GateFirstWithoutStore);
                }
                let mut directory = CacheDirectory::new(c, &map);
                let resident = crate::cache::resident_step_units(c, &map);
                let cold_slots = directory.cold_slots();
                if pages {
                    directory = directory.with_pages(bundle_pages);
                }
                Some(CacheFlow::new(
                    directory,
                    map,
                    c.max_loads,
                    ReadGeometry::of(plan),
                    ffn.reads,
                    gate_pages,
                    bundle_pages,
                    cold_slots,
                    resident,
                ))
            }
        };
        // A cluster computes once all its bundles are in, so under a cache it may read no more
        // bundles than the cold segment holds at once (or it would wait forever).
        let fitted = |sizes: &crate::plan::ClusterSizes| {
            let mut sizes = sizes.clone();
            if let Some(c) = &cache {
                let most = u64::from(c.cold_slots.max(1)) * u64::from(shape.ffn_bundle);
                sizes.ffn_neurons = sizes.ffn_neurons.min(most.min(u64::from(u32::MAX)) as u32);
            }
            sizes
        };
        let mut decode = Program::new(
            shape,
            &fitted(&plan.decode),
            StepShape::Decode,
            &decode_shares,
        );
        // Prefill sums the FFN's down projection over decode's neuron clusters (a store's
        // runs of bundles, or `ffn_sums`): one reduction order, so a position gets the same
        // bits whether prefill or decode computed it.
        let prefill_sizes = crate::plan::ClusterSizes {
            ffn_neurons: fitted(&plan.decode).ffn_neurons,
            ..fitted(&plan.prefill)
        };
        let mut prefill = Program::new(shape, &prefill_sizes, StepShape::Prefill, &prefill_shares);
        if cache.as_ref().is_some_and(|c| c.map.attn_units > 0) {
            decode.stream_attention(shape, &decode_shares);
            prefill.stream_attention(shape, &prefill_shares);
        }
        if cache.is_some() && ffn.gate_first() {
            decode.gate_first(&decode_shares);
        }
        if let Some(n) = plan.output_vocab {
            // `resolve` refuses these with the model's words; a plan given to the scheduler
            // directly (the simulator's) is checked here.
            if n == 0 || n > shape.n_vocab || cache.is_some() {
                return Err(ScheduleError::Plan(crate::plan::PlanError::Parse(format!(
                    "output_vocab {n}: needs 1 to {} tokens, in memory",
                    shape.n_vocab
                ))));
            }
            decode.limit_output(n, &decode_shares);
            prefill.limit_output(n, &prefill_shares);
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
            ffn,
            in_flight: None,
            spare_outstanding: Outstanding::with_clusters(most_clusters),
        })
    }

    /// How it schedules decode's FFN (fixed at construction).
    pub fn ffn(&self) -> FfnPlan {
        self.ffn
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

    /// The shape `request` runs in: a multi-sequence step always in the decode shape (each
    /// sequence computes as its own decode step would), others by their size.
    pub fn shape_of(&self, request: &StepRequest) -> StepShape {
        if request.is_multi_sequence() {
            StepShape::Decode
        } else {
            self.shape_for(request.n_tokens)
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
            cache.abort();
        }
    }

    /// How the cache numbers its units, if the plan has a cache.
    pub fn unit_map(&self) -> Option<&UnitMap> {
        self.cache.as_ref().map(|c| &c.map)
    }

    /// Leaves cache slot `slot` out of the cache ([`crate::cache::CacheDirectory::retire`]),
    /// between steps: for a slot a read from replaced actors still holds.
    pub fn retire_cache_slot(&mut self, slot: u32) {
        if let (Some(cache), None) = (self.cache.as_mut(), &self.in_flight) {
            cache.directory.retire(slot);
        }
    }

    /// Cache slots a step holds now ([`crate::cache::CacheDirectory::held_slots`]): 0
    /// between steps, if the plan has a cache.
    pub fn cache_held_slots(&self) -> Option<u32> {
        self.cache.as_ref().map(|c| c.directory.held_slots())
    }

    /// The neuron cache's counters per layer, if the plan has a cache.
    pub fn cache_stats(&self) -> Option<&[LayerCacheStats]> {
        self.cache.as_ref().map(|c| c.directory.stats())
    }

    /// Starts from the cache a long run leaves behind (`CacheDirectory::warm`), before the
    /// first step; `plan` is the plan's cache section. Returns the units made resident (0
    /// without a cache, or once a step has run).
    pub fn warm_cache(&mut self, plan: &crate::plan::CachePlan) -> u32 {
        match (&mut self.cache, &self.in_flight) {
            (Some(c), None) => c.directory.warm(plan),
            _ => 0,
        }
    }

    /// Feeds one event; appends the resulting commands to `out`.
    pub fn on_event(&mut self, event: Event, out: &mut Vec<Command>) -> Result<(), ScheduleError> {
        if let Some(cache) = self.cache.as_mut() {
            cache.begin_batch();
        }
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
        cache.pump_and_dispatch(flight, program, out);
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
        if request.sequences == 0
            || (request.is_multi_sequence() && request.sequences != request.n_tokens)
        {
            return Err(ScheduleError::BadSequences {
                n_tokens: request.n_tokens,
                sequences: request.sequences,
            });
        }
        let shape = self.shape_of(&request);
        if request.resident_only && (shape != StepShape::Decode || request.n_tokens != 1) {
            return Err(ScheduleError::ResidentOnlyShape {
                n_tokens: request.n_tokens,
            });
        }
        let selected = self.ffn.selects_clusters() && shape == StepShape::Decode;
        if let Some(cache) = self.cache.as_mut() {
            let resident = request.resident_only;
            cache.start_step(shape, selected, request.wants_logits(), resident)?;
        }
        self.in_flight = Some(InFlight {
            request,
            shape,
            layer: 0,
            phase_index: 0,
            outstanding: std::mem::take(&mut self.spare_outstanding),
            waiting: 0,
        });
        self.issue_current_phase(out)
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
            cache.computed(&work, program);
        }
        self.finish_phase_if_done(out)
    }

    /// What the step waits for once `phase` of a step of `shape` is finished, if anything.
    fn awaited_after(&self, shape: StepShape, phase: Phase) -> Option<Awaited> {
        self.cache.as_ref()?;
        let selected = shape == StepShape::Decode && self.ffn.selects_clusters();
        match phase {
            Phase::FfnGateRows => Some(Awaited::GatedPages),
            Phase::AttnOutRows if selected && self.ffn.predicted_pages() => {
                Some(Awaited::PredictedPages)
            }
            Phase::AttnOutRows if selected => Some(Awaited::Clusters),
            _ => None,
        }
    }

    /// Once nothing of the current phase is out or waiting: `FinishPhase`, then the next
    /// phase (or the end of the step).
    fn finish_phase_if_done(&mut self, out: &mut Vec<Command>) -> Result<(), ScheduleError> {
        let Some(flight) = self.in_flight.as_ref() else {
            return Ok(());
        };
        if !flight.outstanding.is_empty() || flight.waiting > 0 {
            return Ok(());
        }
        let program = Arc::clone(self.program(flight.shape));
        let phase = program.phase_at(flight.phase_index);
        let then = self.awaited_after(flight.shape, phase);
        let flight = self.in_flight.as_mut().expect("checked above");
        out.push(Command::FinishPhase {
            step: flight.request.step,
            shape: flight.shape,
            layer: flight.layer,
            phase,
            then,
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
        self.issue_current_phase(out)
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
    fn issue_current_phase(&mut self, out: &mut Vec<Command>) -> Result<(), ScheduleError> {
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
            cache.issue_phase(flight, program, layout, out);
            // Every cluster may have been skipped (a resident-only step's).
            return self.finish_phase_if_done(out);
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
        Ok(())
    }

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
        if self.ffn.predicted_pages() {
            return Err(unexpected);
        }
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
        if flight.request.step != step || !cache.awaits_layer(layer) {
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
        cache.skip_unneeded(flight, program, layer, needed, waits, out);
        // Every cluster left may have been skipped.
        self.finish_phase_if_done(out)
    }

    /// Pages each FFN cluster of `layer` reads. After a gate phase ([`ReadPolicy::GateFirst`]):
    /// clusters that need none are skipped (their slots released); those whose pages are all
    /// in go to compute at once; the others read the runs of pages their slots lack. As
    /// predictions ([`ReadPolicy::PredictedPages`]): the cursor then acquires the clusters
    /// with those pages.
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
        if self.ffn.predicted_pages() {
            cache.set_layer_pages(pages);
            let needed = |c: u32| (c as usize * per..(c as usize + 1) * per).any(bit);
            self.take_predictions(step, layer, needed, unexpected, out)
        } else if self.ffn.gate_first() {
            let Some(flight) = self.in_flight.as_mut() else {
                return Err(unexpected);
            };
            let program = match flight.shape {
                StepShape::Decode => &self.decode,
                StepShape::Prefill => &self.prefill,
            };
            let current = program.phase_layout_at(flight.phase_index).phase;
            if flight.request.step != step || flight.layer != layer || current != Phase::FfnNeurons
            {
                return Err(unexpected);
            }
            cache.top_up_gated(flight, program, layer, pages, unexpected, out)?;
            // Every cluster may have been skipped.
            self.finish_phase_if_done(out)
        } else {
            Err(unexpected)
        }
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
        if flight.request.step != step {
            return Err(unexpected);
        }
        match cache.loaded(layer, cluster) {
            None => return Err(unexpected),
            Some(false) => return Ok(()), // more runs of its pages to come
            Some(true) => {}
        }
        let program = match flight.shape {
            StepShape::Decode => &self.decode,
            StepShape::Prefill => &self.prefill,
        };
        settle_unit(flight, program, cache, layer, cluster, out);
        Ok(())
    }
}

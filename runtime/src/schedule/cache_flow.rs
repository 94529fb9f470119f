//! The neuron cache as the scheduler drives it: every unit of a step is acquired in order
//! (layer by layer) as far ahead as free slots and the load depth allow, so reads run ahead of
//! compute; a cluster is computed as soon as its units are in (an FFN cluster reads a run of
//! bundles, [`Program::units_of_cluster`]). Which loads one read carries is
//! decided here too, against the [`ReadGeometry`], so every driver reads the same runs.

use super::scheduler::InFlight;
use super::{
    ClusterWork, Command, PhaseClusters, Program, ReadGeometry, ReadPolicy, ScheduleError, StepId,
    StepShape,
};
use crate::cache::{Acquired, CacheDirectory, PagesAcquired, UnitMap, Want};
use crate::neuron::Phase;
use std::ops::Range;

/// Where one unit of the step in flight stands.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum UnitState {
    NotAcquired,
    Loading,
    Ready,
    Sent,
    /// Not needed by this step (predicted inactive): computed without a slot.
    Skipped,
    /// Gate-first loading: its gate rows are computed; it keeps its slot until the step's
    /// [`super::Event::FfnPages`] says which of its pages the rest of the compute reads.
    Gated,
}

/// The last load of the batch being built: what a next load may join.
#[derive(Clone, Copy)]
enum RunTail {
    /// A whole unit (the unit's number).
    Whole(u32),
    /// Some pages of a unit.
    Pages,
}

pub(super) struct CacheFlow {
    pub directory: CacheDirectory,
    pub map: UnitMap,
    max_loads: u32,
    geometry: ReadGeometry,
    reads: ReadPolicy,
    loads_in_flight: u32,
    /// Next unit (in [`UnitMap`] order, the order a step needs them) to acquire, and the end of
    /// this step's units.
    cursor: u32,
    cursor_end: u32,
    /// Decode steps that select their clusters: the cursor stops here until the layer it
    /// enters has its selection (predictions, or predicted pages).
    gate: u32,
    pub units: Vec<UnitState>,
    /// Reads in flight per unit (page reads may read a bundle in several runs of pages).
    pending: Vec<u32>,
    /// The step in flight is a decode step with a gate phase (gate-first loading).
    two_phase: bool,
    /// The step in flight waits for each layer's selection.
    selected_step: bool,
    gate_pages: u32,
    pub bundle_pages: u32,
    /// Predicted pages: the pages of the layer whose FFN the cursor acquires.
    layer_pages: Vec<u64>,
    /// Slots units without a hot slot share: a gate phase keeps a layer's bundles pinned,
    /// so it needs a layer's worth; an FFN cluster's bundles must fit at once.
    pub cold_slots: u32,
    /// The units a resident-only step computes ([`crate::cache::resident_step_units`]).
    resident: Vec<bool>,
    /// The batch's last load and how many loads its run has.
    run: Option<(RunTail, u32)>,
    /// Per cluster of the phase computing: its units not in yet (it goes out at 0).
    missing: Vec<u32>,
    /// Scratch: units a pump found ready; runs of pages to read.
    newly_ready: Vec<u32>,
    runs: Vec<Range<u32>>,
}

impl CacheFlow {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        directory: CacheDirectory,
        map: UnitMap,
        max_loads: u32,
        geometry: ReadGeometry,
        reads: ReadPolicy,
        gate_pages: u32,
        bundle_pages: u32,
        cold_slots: u32,
        resident: Vec<bool>,
    ) -> CacheFlow {
        let n_units = map.n_units();
        CacheFlow {
            directory,
            max_loads,
            geometry,
            reads,
            loads_in_flight: 0,
            cursor: n_units,
            cursor_end: n_units,
            gate: u32::MAX,
            units: vec![UnitState::NotAcquired; n_units as usize],
            pending: vec![0; n_units as usize],
            two_phase: false,
            selected_step: false,
            gate_pages,
            bundle_pages,
            layer_pages: Vec::new(),
            cold_slots,
            resident,
            run: None,
            missing: Vec::new(),
            newly_ready: Vec::new(),
            runs: Vec::new(),
            map,
        }
    }

    pub fn unit(&self, layer: u32, cluster: u32) -> usize {
        self.map.unit(layer, cluster) as usize
    }

    /// The units (named as in the map: a bundle's index, or an attention matrix's) that
    /// cluster `c` of streamed `phase` reads.
    fn cluster_units(&self, program: &Program, phase: Phase, c: u32) -> Range<u32> {
        match phase {
            Phase::FfnNeurons | Phase::FfnGateRows => program.units_of_cluster(phase, c),
            _ => {
                let u = self.map.unit_cluster(phase, c);
                u..u + 1
            }
        }
    }

    pub fn abort(&mut self) {
        self.directory.abort();
        self.loads_in_flight = 0;
        self.pending.fill(0);
        self.cursor = self.units.len() as u32;
    }

    /// A new batch of commands starts: its first load starts a read of its own.
    pub fn begin_batch(&mut self) {
        self.run = None;
    }

    /// A step of `shape` starts; `selected`: it waits for each layer's selection;
    /// `resident_only`: the units it would read are left out (skipped from the start).
    pub fn start_step(
        &mut self,
        shape: StepShape,
        selected: bool,
        wants_logits: bool,
        resident_only: bool,
    ) -> Result<(), ScheduleError> {
        let two_phase = self.reads.gate_first() && shape == StepShape::Decode;
        if two_phase && self.cold_slots < self.map.ffn_clusters {
            return Err(ScheduleError::GateFirstSlots {
                need: self.map.ffn_clusters,
                cold: self.cold_slots,
            });
        }
        self.units.fill(UnitState::NotAcquired);
        if resident_only {
            for (state, &kept) in self.units.iter_mut().zip(&self.resident) {
                if !kept {
                    *state = UnitState::Skipped;
                }
            }
        }
        self.two_phase = two_phase;
        self.selected_step = selected;
        self.gate = if selected {
            self.map.unit(0, 0)
        } else {
            u32::MAX
        };
        self.cursor = 0;
        self.cursor_end = if wants_logits {
            self.map.n_units()
        } else {
            self.map.n_layer_units()
        };
        Ok(())
    }

    /// The clusters of `work` are computed: their units' slots are released (a gate phase's
    /// stay pinned for the rest of the clusters' compute).
    pub fn computed(&mut self, work: &ClusterWork, program: &Program) {
        for c in work.clusters.clone() {
            for unit in self.cluster_units(program, work.phase, c) {
                let u = self.unit(work.layer, unit);
                if work.phase == Phase::FfnGateRows {
                    self.units[u] = UnitState::Gated;
                    continue;
                }
                // A skipped unit never held a slot.
                if self.units[u] != UnitState::Skipped {
                    self.directory.release(work.layer, unit);
                }
            }
        }
    }

    /// Sends the clusters of a streamed phase whose units are all in (in runs, one message per
    /// run); the others go out one by one as their last unit lands.
    pub fn issue_phase(
        &mut self,
        flight: &mut InFlight,
        program: &Program,
        layout: &PhaseClusters,
        out: &mut Vec<Command>,
    ) {
        let phase = layout.phase;
        self.missing.clear();
        self.missing.resize(layout.clusters.len(), 0);
        for (xpu, range) in &layout.parts {
            let mut run_start = None;
            for c in range.clone().chain(std::iter::once(range.end)) {
                // A cluster whose every unit is skipped adds nothing: neither sent nor
                // waited for (drivers sum only the clusters a step needs).
                let (mut ready, mut skipped) = (false, false);
                if c < range.end {
                    let mut missing = 0;
                    skipped = true;
                    for unit in self.cluster_units(program, phase, c) {
                        let u = self.unit(flight.layer, unit);
                        match self.units[u] {
                            UnitState::Skipped => {}
                            UnitState::Ready => skipped = false,
                            _ => (missing, skipped) = (missing + 1, false),
                        }
                    }
                    self.missing[c as usize] = missing;
                    ready = missing == 0 && !skipped;
                }
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
                if ready {
                    for unit in self.cluster_units(program, phase, c) {
                        let u = self.unit(flight.layer, unit);
                        if self.units[u] == UnitState::Ready {
                            self.units[u] = UnitState::Sent;
                        }
                    }
                } else if c < range.end && !skipped {
                    flight.waiting += 1;
                }
            }
        }
    }

    /// Whether the cursor waits at `layer` for its selection.
    pub fn awaits_layer(&self, layer: u32) -> bool {
        layer < self.map.n_layer && self.map.unit(layer, 0) == self.gate && self.cursor == self.gate
    }

    /// Marks the FFN units (bundles) of `layer` that are not `needed` as skipped (settled
    /// for their clusters when `waits`: the layer's FFN phase is computing) and opens the next
    /// layer's gate.
    pub fn skip_unneeded(
        &mut self,
        flight: &mut InFlight,
        program: &Program,
        layer: u32,
        needed: impl Fn(u32) -> bool,
        waits: bool,
        out: &mut Vec<Command>,
    ) {
        for c in (0..self.map.ffn_clusters).filter(|&c| !needed(c)) {
            let u = self.unit(layer, c);
            let state = std::mem::replace(&mut self.units[u], UnitState::Skipped);
            let counted = !matches!(
                state,
                UnitState::Ready | UnitState::Sent | UnitState::Skipped
            );
            if waits && counted {
                settle_unit(flight, program, self, layer, c, out);
            }
        }
        self.gate = if layer + 1 < self.map.n_layer {
            self.map.unit(layer + 1, 0)
        } else {
            u32::MAX
        };
    }

    /// Predicted pages: the pages of the layer the cursor enters next.
    pub fn set_layer_pages(&mut self, pages: &[u64]) {
        self.layer_pages.clear();
        self.layer_pages.extend_from_slice(pages);
    }

    /// After a gate phase of `layer`: skips clusters with no wanted page, sends those whose
    /// slot holds every wanted page, and reads the runs of pages the others lack.
    pub fn top_up_gated(
        &mut self,
        flight: &mut InFlight,
        program: &Program,
        layer: u32,
        pages: &[u64],
        unexpected: ScheduleError,
        out: &mut Vec<Command>,
    ) -> Result<(), ScheduleError> {
        let all_gated =
            (0..self.map.ffn_clusters).all(|c| self.units[self.unit(layer, c)] == UnitState::Gated);
        if !self.two_phase || !all_gated {
            return Err(unexpected);
        }
        let per = self.bundle_pages as usize;
        let bit = |i: usize| pages.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1);
        let step = flight.request.step;
        let mut runs = std::mem::take(&mut self.runs);
        for c in 0..self.map.ffn_clusters {
            let u = self.unit(layer, c);
            let first = c as usize * per;
            if !(first..first + per).any(bit) {
                self.units[u] = UnitState::Skipped;
                self.directory.release(layer, c);
                settle_unit(flight, program, self, layer, c, out);
                continue;
            }
            runs.clear();
            let wanted = |p: u32| bit(first + p as usize);
            let Some(slot) = self.directory.top_up(layer, c, wanted, &mut runs) else {
                self.runs = runs;
                return Err(unexpected);
            };
            if runs.is_empty() {
                self.units[u] = UnitState::Ready;
                settle_unit(flight, program, self, layer, c, out);
                continue;
            }
            self.units[u] = UnitState::Loading;
            self.pending[u] = runs.len() as u32;
            self.loads_in_flight += runs.len() as u32;
            for r in &runs {
                self.push_load(out, step, (layer, c), slot, None, Some(r.clone()), true);
            }
        }
        self.runs = runs;
        Ok(())
    }

    /// A read of `(layer, cluster)` landed. `None`: no such read is in flight; `Some(ready)`:
    /// whether the unit is now wholly in (its last run of pages).
    pub fn loaded(&mut self, layer: u32, cluster: u32) -> Option<bool> {
        let clusters = if layer == self.map.n_layer {
            self.map.output_clusters
        } else {
            self.map.ffn_clusters + self.map.attn_units
        };
        if layer > self.map.n_layer || cluster >= clusters {
            return None;
        }
        let u = self.unit(layer, cluster);
        if self.units[u] != UnitState::Loading || self.pending[u] == 0 {
            return None;
        }
        self.loads_in_flight -= 1;
        self.pending[u] -= 1;
        if self.pending[u] > 0 {
            return Some(false);
        }
        if !self.directory.loaded(layer, cluster) {
            return None;
        }
        self.units[u] = UnitState::Ready;
        Some(true)
    }

    /// Acquires what the cache allows, then sends clusters of the current phase that became
    /// ready.
    pub fn pump_and_dispatch(
        &mut self,
        flight: &mut InFlight,
        program: &Program,
        out: &mut Vec<Command>,
    ) {
        let mut ready = std::mem::take(&mut self.newly_ready);
        ready.clear();
        self.pump(flight.request.step, &mut ready, out);
        for &u in &ready {
            let (layer, cluster) = self.directory.split_unit(u);
            settle_unit(flight, program, self, layer, cluster, out);
        }
        self.newly_ready = ready;
    }

    /// Pushes a `Load`, joined to the batch's previous one where the read geometry lets one
    /// read carry both: whole bundles back to back in the store (or any whole units read in
    /// flight together), or runs of pages in flight together; at most `max_units` a read.
    #[allow(clippy::too_many_arguments)]
    fn push_load(
        &mut self,
        out: &mut Vec<Command>,
        step: StepId,
        (layer, cluster): (u32, u32),
        slot: u32,
        evicted: Option<(u32, u32)>,
        pages: Option<Range<u32>>,
        top_up: bool,
    ) {
        let unit = self.map.unit(layer, cluster);
        let g = self.geometry;
        let joins = match self.run {
            Some((tail, len)) if len < g.max_units => match (tail, pages.is_some()) {
                (RunTail::Whole(prev), false) => {
                    g.in_flight_together || self.map.adjacent(prev, unit)
                }
                (RunTail::Pages, true) => g.in_flight_together,
                _ => false,
            },
            _ => false,
        };
        let tail = if pages.is_some() {
            RunTail::Pages
        } else {
            RunTail::Whole(unit)
        };
        let len = if joins {
            self.run.map_or(0, |r| r.1)
        } else {
            0
        };
        self.run = Some((tail, len + 1));
        out.push(Command::Load {
            step,
            layer,
            cluster,
            slot,
            evicted,
            pages,
            top_up,
            with_previous: joins,
        });
    }

    /// Acquires units in step order while slots and the load depth allow; issues the loads.
    fn pump(&mut self, step: StepId, ready: &mut Vec<u32>, out: &mut Vec<Command>) {
        // Start loading only with room for a whole run of reads (or when nothing is in
        // flight), so runs reach the length one read may carry.
        let room = self.max_loads.saturating_sub(self.loads_in_flight);
        if self.loads_in_flight > 0 && room < self.geometry.max_units.min(self.max_loads) {
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
            if self.reads.predicted_pages() && self.selected_step && ffn_unit {
                if !self.acquire_predicted_pages(step, layer, cluster, ready, out) {
                    break;
                }
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
            let evicted = evicted.map(|e| self.directory.split_unit(e));
            self.push_load(out, step, (layer, cluster), slot, evicted, pages, top_up);
            self.cursor += 1;
        }
    }

    /// Acquires `(layer, cluster)` with the predicted neurons' pages (the cursor is in the
    /// layer they are for) and reads the runs its slot lacks. False when no slot is free.
    fn acquire_predicted_pages(
        &mut self,
        step: StepId,
        layer: u32,
        cluster: u32,
        ready: &mut Vec<u32>,
        out: &mut Vec<Command>,
    ) -> bool {
        let u = self.cursor as usize;
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
            return false;
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
                let evicted = evicted
                    .filter(|_| gives)
                    .map(|e| self.directory.split_unit(e));
                self.push_load(
                    out,
                    step,
                    (layer, cluster),
                    slot,
                    evicted,
                    Some(r.clone()),
                    !gives,
                );
            }
        }
        self.runs = runs;
        true
    }
}

/// Unit `(layer, unit)` of the step in flight is now in (or skipped). If its phase is the one
/// computing, the cluster reading it has one unit less to wait for, and goes out with its last
/// one; a cluster whose every unit was skipped adds nothing and is not sent (drivers sum only
/// the clusters a step needs). Otherwise it goes out with its phase.
pub(super) fn settle_unit(
    flight: &mut InFlight,
    program: &Program,
    cache: &mut CacheFlow,
    layer: u32,
    unit: u32,
    out: &mut Vec<Command>,
) {
    let current = program.phase_layout_at(flight.phase_index);
    let (mut phase, local) = cache.map.phase_cluster(layer, unit);
    // Gate-first: a bundle's first read serves the gate phase, its later ones the neurons'.
    if phase == Phase::FfnNeurons && current.phase == Phase::FfnGateRows {
        phase = Phase::FfnGateRows;
    }
    if flight.layer != layer || current.phase != phase {
        return;
    }
    let cluster = match phase {
        Phase::FfnNeurons | Phase::FfnGateRows => program.cluster_of_unit(phase, local),
        _ => local,
    };
    let Some((xpu, _)) = current.parts.iter().find(|(_, r)| r.contains(&cluster)) else {
        return;
    };
    let missing = &mut cache.missing[cluster as usize];
    debug_assert!(*missing > 0, "unit {unit} of layer {layer} settled twice");
    *missing = missing.saturating_sub(1);
    if *missing > 0 {
        return;
    }
    flight.waiting -= 1;
    let mut computes = false;
    for unit in cache.cluster_units(program, phase, cluster) {
        let u = cache.unit(layer, unit);
        // A skipped unit stays marked so: it holds no slot to release.
        if cache.units[u] != UnitState::Skipped {
            cache.units[u] = UnitState::Sent;
            computes = true;
        }
    }
    if !computes {
        return;
    }
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

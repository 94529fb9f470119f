//! The neuron cache: loads run ahead of compute, slots, evictions, the hot segment, counters.

use super::*;
use crate::cache::UnitMap;
use crate::plan::{CachePlan, CachePolicy};
use std::sync::Arc;

/// The test model as a neuron store: its FFN clusters are bundles of `ffn_bundle` neurons.
pub(super) fn store_shape(n_layer: u32, ffn_bundle: u32) -> ModelShape {
    ModelShape {
        n_layer,
        ffn_bundle,
        ..shape()
    }
}

/// A plan for the store model with a cache; both shapes cut the output projection alike.
pub(super) fn cached_plan(
    base: ExecutionPlan,
    output_rows: u32,
    cache: CachePlan,
) -> ExecutionPlan {
    let mut plan = base;
    plan.decode.output_rows = output_rows;
    plan.prefill.output_rows = output_rows;
    plan.cache = Some(cache);
    plan
}

/// The slot `CacheDirectory::new` reserves for each hot unit, and how many slots are hot.
fn hot_slots_of(cache: &CachePlan, map: &UnitMap) -> (Vec<Option<u32>>, u32) {
    let n_units = map.n_units();
    let mut hot = match cache.policy {
        CachePolicy::Segmented => cache.hot_slots.min(cache.slots).min(n_units),
        CachePolicy::Lru => 0,
    };
    if hot < n_units && hot == cache.slots {
        hot = hot.saturating_sub(1);
    }
    let mut slot_of = vec![None; n_units as usize];
    for (slot, unit) in map.hot_order().into_iter().take(hot as usize).enumerate() {
        slot_of[unit as usize] = Some(slot as u32);
    }
    (slot_of, hot)
}

/// Rebuilds the cache's contents from the `Load` commands alone and checks, at every command:
/// - phases run in program order, every cluster of every phase is computed exactly once, and a
///   phase is finished only when all of its clusters are done;
/// - a streamed cluster (FFN, and the output projection when it streams) is computed only while
///   its units are in (an FFN cluster's run of bundles): loaded (`Loaded` received) and not
///   evicted since;
/// - a load is for a unit the step needs, not resident, not yet loaded or computed in this
///   step, into a slot no other load in flight uses, names as evicted what the slot held,
///   evicts no unit that this step loaded or is computing and has not finished, keeps hot units
///   in their reserved slots, and at most `max_loads` loads are in flight;
/// - a load joins the one before it in a read only where the read geometry allows (adjacent
///   bundles, at most `coalesce` a read);
/// - every step ends with no load in flight, and every unit it loaded computed;
/// - at the end ([`CacheChecks::finish`]), the cache's counters agree: hits + misses = streamed
///   units the steps needed, misses = loads, evictions = loads that evicted something.
struct CacheChecks {
    cache: CachePlan,
    map: UnitMap,
    plan: ExecutionPlan,
    hot_slot: Vec<Option<u32>>,
    n_hot: u32,
    slot_owner: Vec<Option<u32>>,
    resident: Vec<bool>,
    loading: Vec<(u32, u32)>,
    needed: Vec<u64>,
    loads: Vec<u64>,
    evictions: Vec<u64>,
    /// The last load and the length of its read.
    run: Option<(u32, u32)>,
    // The step in flight.
    req: StepRequest,
    shape: StepShape,
    allowed: Vec<XpuId>,
    program: Option<Arc<Program>>,
    expected: Vec<(u32, Phase, u32)>,
    pos: usize,
    seen: Vec<bool>,
    computing: Vec<ClusterWork>,
    loaded_now: Vec<bool>,
    held: Vec<bool>,
    computed: Vec<bool>,
    done: bool,
}

impl CacheChecks {
    fn new(s: &Scheduler, plan: &ExecutionPlan) -> CacheChecks {
        let cache = plan.cache.clone().expect("a plan with a cache");
        let map = s.unit_map().expect("a scheduler with a cache").clone();
        let n_units = map.n_units() as usize;
        let n_layer = map.n_layer as usize;
        let (hot_slot, n_hot) = hot_slots_of(&cache, &map);
        CacheChecks {
            slot_owner: vec![None; cache.slots as usize],
            resident: vec![false; n_units],
            loading: Vec::new(),
            needed: vec![0; n_layer + 1],
            loads: vec![0; n_layer + 1],
            evictions: vec![0; n_layer + 1],
            run: None,
            hot_slot,
            n_hot,
            cache,
            map,
            plan: plan.clone(),
            req: request(0, 1, 0),
            shape: StepShape::Decode,
            allowed: Vec::new(),
            program: None,
            expected: Vec::new(),
            pos: 0,
            seen: Vec::new(),
            computing: Vec::new(),
            loaded_now: Vec::new(),
            held: Vec::new(),
            computed: Vec::new(),
            done: false,
        }
    }

    /// A step starts.
    fn begin(&mut self, s: &Scheduler, req: &StepRequest) {
        let map = &self.map;
        let n_layer = map.n_layer;
        let n_units = map.n_units() as usize;
        let shape = s.shape_of(req);
        let program = Arc::clone(s.program(shape));
        let on = match shape {
            StepShape::Decode => &self.plan.decode_on,
            StepShape::Prefill => &self.plan.prefill_on,
        };
        self.allowed = on
            .iter()
            .map(|sh| XpuId(self.plan.group_index(&sh.group).unwrap() as u8))
            .collect();
        self.expected.clear();
        for layer in 0..n_layer {
            for p in &program.layer_phases {
                self.expected
                    .push((layer, p.phase, p.clusters.len() as u32));
            }
        }
        if req.wants_logits() {
            self.expected.push((
                n_layer,
                Phase::OutputRows,
                program.output.clusters.len() as u32,
            ));
        }
        // Every FFN phase streams: its units are the bundles the cache numbers, its clusters
        // runs of them.
        assert_eq!(program.ffn_units.len() as u32, map.ffn_clusters);
        let clusters = program.clusters(Phase::FfnNeurons);
        assert!(clusters.len() <= program.ffn_units.len());
        for (c, r) in clusters.iter().enumerate() {
            let units = program.units_of_cluster(Phase::FfnNeurons, c as u32);
            assert_eq!(program.ffn_units[units.start as usize].start, r.start);
            assert_eq!(program.ffn_units[units.end as usize - 1].end, r.end);
        }
        for n in self.needed.iter_mut().take(n_layer as usize) {
            *n += u64::from(map.ffn_clusters + map.attn_units);
        }
        // Streamed attention: one cluster per matrix, each reading its own unit.
        if map.attn_units > 0 {
            assert_eq!(program.clusters(Phase::QkvHeads).len(), 3);
            assert_eq!(program.clusters(Phase::AttnOutRows).len(), 1);
        }
        if map.output_clusters > 0 {
            assert_eq!(program.output.clusters.len() as u32, map.output_clusters);
            if req.wants_logits() {
                self.needed[n_layer as usize] += u64::from(map.output_clusters);
            }
        }
        self.program = Some(program);
        self.req = req.clone();
        self.shape = shape;
        self.pos = 0;
        self.seen = vec![false; self.expected[0].2 as usize];
        self.computing.clear();
        self.loaded_now = vec![false; n_units];
        self.held = vec![false; n_units];
        self.computed = vec![false; n_units];
        self.done = false;
    }

    /// The counters agree with what the checks saw.
    fn finish(&self, s: &Scheduler) {
        let stats = s.cache_stats().expect("a scheduler with a cache");
        assert_eq!(stats.len(), self.map.n_layer as usize + 1);
        for (l, st) in stats.iter().enumerate() {
            assert_eq!(
                st.hits + st.misses,
                self.needed[l],
                "layer {l}: hits + misses are not the units needed"
            );
            assert_eq!(
                st.misses, self.loads[l],
                "layer {l}: misses are not the loads"
            );
            assert_eq!(st.evictions, self.evictions[l], "layer {l}: evictions");
        }
    }
}

impl CacheChecks {
    /// The units cluster `c` of `phase` reads (none when the phase does not stream).
    fn units_of(&self, layer: u32, phase: Phase, c: u32) -> Vec<usize> {
        let map = &self.map;
        if !map.streams(phase) {
            return Vec::new();
        }
        let program = self.program.as_ref().expect("a step in flight");
        let units = match phase {
            Phase::FfnNeurons | Phase::FfnGateRows => program.units_of_cluster(phase, c),
            _ => map.unit_cluster(phase, c)..map.unit_cluster(phase, c) + 1,
        };
        units.map(|u| map.unit(layer, u) as usize).collect()
    }
}

impl Checker for CacheChecks {
    fn command(&mut self, cmd: &Command) {
        let (map, req, shape) = (&self.map, &self.req, self.shape);
        let n_layer = map.n_layer;
        assert!(!self.done, "{cmd:?} after StepDone");
        if !matches!(cmd, Command::Load { .. }) {
            self.run = None;
        }
        match cmd {
            Command::Compute { xpu, work } => {
                assert!(
                    self.allowed.contains(xpu),
                    "{xpu:?} has no share of {shape:?}"
                );
                let &(layer, phase, n) = self
                    .expected
                    .get(self.pos)
                    .unwrap_or_else(|| panic!("{work:?} after the last phase"));
                assert_eq!(
                    (work.step, work.shape, work.layer, work.phase),
                    (req.step, shape, layer, phase),
                    "compute out of phase order"
                );
                assert!(!work.clusters.is_empty() && work.clusters.end <= n);
                for c in work.clusters.clone() {
                    assert!(
                        !self.seen[c as usize],
                        "cluster {c} of {phase:?} layer {layer} computed twice"
                    );
                    self.seen[c as usize] = true;
                    for u in self.units_of(layer, phase, c) {
                        assert!(
                            self.resident[u],
                            "layer {layer} {phase:?} cluster {c} computed while unit {u} is not in"
                        );
                        self.held[u] = true;
                    }
                }
                self.computing.push(work.clone());
            }
            Command::FinishPhase {
                step,
                shape: s,
                layer: l,
                phase: p,
                then,
            } => {
                let &(layer, phase, _) = self
                    .expected
                    .get(self.pos)
                    .unwrap_or_else(|| panic!("{cmd:?} after the last phase"));
                assert_eq!(
                    (*step, *s, *l, *p, *then),
                    (req.step, shape, layer, phase, None)
                );
                assert!(
                    self.seen.iter().all(|&x| x),
                    "{phase:?} of layer {layer} finished incomplete"
                );
                assert!(self.computing.is_empty(), "finished with work in flight");
                self.pos += 1;
                self.seen = vec![false; self.expected.get(self.pos).map_or(0, |e| e.2) as usize];
            }
            Command::StepDone { step } => {
                assert_eq!(*step, req.step);
                assert_eq!(
                    self.pos,
                    self.expected.len(),
                    "step done before its last phase"
                );
                assert!(self.computing.is_empty() && self.loading.is_empty());
                assert!(self.held.iter().all(|&h| !h));
                let n_units = map.n_units() as usize;
                assert!((0..n_units).all(|u| !self.loaded_now[u] || self.computed[u]));
                self.done = true;
            }
            &Command::Load {
                step,
                layer,
                cluster,
                slot,
                evicted,
                ref pages,
                top_up,
                with_previous,
            } => {
                assert_eq!(step, req.step);
                assert!(
                    pages.is_none() && !top_up,
                    "{cmd:?}: a part without page reads"
                );
                let needs = if layer < n_layer {
                    cluster < map.ffn_clusters + map.attn_units
                } else {
                    layer == n_layer && req.wants_logits() && cluster < map.output_clusters
                };
                assert!(needs, "{cmd:?}: the step does not need that unit");
                let u = map.unit(layer, cluster) as usize;
                assert!(!self.loaded_now[u], "{cmd:?}: loaded twice in one step");
                assert!(!self.computed[u], "{cmd:?}: loaded after it was computed");
                assert!(!self.resident[u], "{cmd:?}: the unit is in already");
                assert!(slot < self.cache.slots, "{cmd:?}: no such slot");
                assert!(
                    self.loading.iter().all(|&(_, s)| s != slot),
                    "{cmd:?}: another load in flight targets that slot"
                );
                let victim = evicted.map(|(l, c)| map.unit(l, c));
                assert_eq!(
                    self.slot_owner[slot as usize], victim,
                    "{cmd:?}: evicted is not what the slot held"
                );
                match self.hot_slot[u] {
                    Some(h) => assert_eq!(slot, h, "{cmd:?}: hot unit out of its slot"),
                    None => assert!(slot >= self.n_hot, "{cmd:?}: cold unit in a hot slot"),
                }
                let run = match (with_previous, self.run) {
                    (true, Some((prev, len))) => {
                        assert!(
                            map.adjacent(prev, u as u32),
                            "{cmd:?}: joins a read it does not continue"
                        );
                        len + 1
                    }
                    (true, None) => panic!("{cmd:?}: joins no read"),
                    (false, _) => 1,
                };
                assert!(run <= self.cache.coalesce, "{cmd:?}: a read of {run} units");
                self.run = Some((u as u32, run));
                if let Some(v) = victim {
                    let v = v as usize;
                    assert!(
                        !self.held[v],
                        "{cmd:?}: evicts a unit this step still needs after acquiring it"
                    );
                    assert!(self.hot_slot[v].is_none(), "{cmd:?}: evicts a hot unit");
                    self.resident[v] = false;
                    self.evictions[layer as usize] += 1;
                }
                self.slot_owner[slot as usize] = Some(u as u32);
                self.loaded_now[u] = true;
                self.held[u] = true;
                self.loading.push((u as u32, slot));
                assert!(
                    self.loading.len() <= self.cache.max_loads as usize,
                    "more than {} loads in flight",
                    self.cache.max_loads
                );
                self.loads[layer as usize] += 1;
            }
        }
    }

    fn completing(&mut self, event: &Event) {
        let map = &self.map;
        match event {
            Event::Loaded { layer, cluster, .. } => {
                let u = map.unit(*layer, *cluster);
                let at = self.loading.iter().position(|&(v, _)| v == u).unwrap();
                let (_, slot) = self.loading.swap_remove(at);
                assert_eq!(self.slot_owner[slot as usize], Some(u));
                self.resident[u as usize] = true;
            }
            Event::ClusterDone(work) => {
                let at = self.computing.iter().position(|w| w == work).unwrap();
                self.computing.swap_remove(at);
                for c in work.clusters.clone() {
                    for u in self.units_of(work.layer, work.phase, c) {
                        self.held[u] = false;
                        self.computed[u] = true;
                    }
                }
            }
            _ => unreachable!("{event:?}"),
        }
    }
}

/// Drives `steps` one after the other through a scheduler whose plan has a neuron cache,
/// delivering the completions in the order `picks` chooses, with [`CacheChecks`] watching.
/// Returns every command and every event fed, in order, and the scheduler.
fn run_cached_steps(
    s: Scheduler,
    model: &ModelShape,
    plan: &ExecutionPlan,
    steps: &[StepRequest],
    picks: &[usize],
) -> (Vec<Command>, Vec<Event>, Scheduler) {
    let mut checks = CacheChecks::new(&s, plan);
    let mut h = Harness::new(s, model);
    let mut pick = picks.iter().copied().cycle();
    for req in steps {
        checks.begin(h.s(), req);
        h.run_step(req.clone(), &all_active, &mut pick, &mut checks);
    }
    checks.finish(h.s());
    let (cmds, events) = h.take();
    (cmds, events, h.d.into_scheduler())
}

#[test]
fn a_cache_holding_every_unit_loads_nothing_after_the_first_step() {
    // 2 layers of 5 bundles of 32 neurons, and an output projection of 2 clusters of 50 rows:
    // 12 units.
    let model = store_shape(2, 32);
    for (policy, slots) in [
        (CachePolicy::Segmented, 12),
        (CachePolicy::Segmented, 16),
        (CachePolicy::Lru, 12),
    ] {
        let cache = CachePlan {
            slots,
            hot_slots: slots,
            policy,
            max_loads: 3,
            stream_output: true,
            stream_attention: false,
            coalesce: 2,
            hot_units: Vec::new(),
            reads: ReadPolicy::Bundles,
            gate_first_gap: 0,
        };
        let plan = cached_plan(ExecutionPlan::default(), 50, cache);
        let s = Scheduler::new(&model, &plan).unwrap();
        assert_eq!(s.unit_map().unwrap().n_units(), 12);
        // A prefill step with logits, then decode steps with and without.
        let steps = [request(1, 6, 5), request(2, 1, 0), request(3, 1, 1)];
        let (cmds, _, s) = run_cached_steps(s, &model, &plan, &steps, &[0, 3, 1]);
        let first_done = cmds
            .iter()
            .position(|c| matches!(c, Command::StepDone { .. }))
            .unwrap();
        let is_load = |c: &&Command| matches!(c, Command::Load { .. });
        let loads: Vec<&Command> = cmds[..first_done].iter().filter(is_load).collect();
        assert_eq!(
            loads.len(),
            12,
            "{policy:?} {slots}: the first step loads every unit"
        );
        assert!(loads
            .iter()
            .all(|c| matches!(c, Command::Load { evicted: None, .. })));
        // Adjacent bundles go in reads of two.
        assert!(loads.iter().any(|c| matches!(
            c,
            Command::Load {
                with_previous: true,
                ..
            }
        )));
        assert_eq!(
            cmds[first_done..].iter().filter(is_load).count(),
            0,
            "{policy:?} {slots}: a later step loaded"
        );
        let stats = s.cache_stats().unwrap();
        let hits: u64 = stats.iter().map(|l| l.hits).sum();
        let misses: u64 = stats.iter().map(|l| l.misses).sum();
        assert_eq!((hits, misses), (10 + 10 + 2, 12));
        assert_eq!(stats[0].misses, 5);
        assert_eq!(stats[2].misses, 2);
    }
}

/// A resident-only step (`--draft self`'s drafts) reads nothing: the units it computes are the
/// hot segment's, loaded by the steps before it, and it sends no compute for a cluster whose
/// units it leaves out but still finishes every phase. A step of more than one token cannot
/// be resident-only.
#[test]
fn a_resident_only_step_reads_nothing_and_computes_what_the_cache_keeps() {
    // 2 layers of 5 bundles and 2 output clusters: 12 units, 6 of them hot.
    let model = store_shape(2, 32);
    let cache = CachePlan {
        slots: 8,
        hot_slots: 6,
        policy: CachePolicy::Segmented,
        max_loads: 3,
        stream_output: true,
        stream_attention: false,
        coalesce: 1,
        hot_units: Vec::new(),
        reads: ReadPolicy::Bundles,
        gate_first_gap: 0,
    };
    let plan = cached_plan(ExecutionPlan::default(), 50, cache.clone());
    let s = Scheduler::new(&model, &plan).unwrap();
    let map = s.unit_map().unwrap().clone();
    let resident = crate::cache::resident_step_units(&cache, &map);
    let (hot_slot, n_hot) = hot_slots_of(&cache, &map);
    assert_eq!(n_hot, 6);
    for (u, &kept) in resident.iter().enumerate() {
        assert_eq!(kept, hot_slot[u].is_some(), "unit {u}");
    }
    let mut h = Harness::new(s, &model);
    let mut pick = [0, 2, 1].into_iter().cycle();
    h.run_step(request(1, 6, 5), &all_active, &mut pick, &mut NoChecks);
    h.take();
    let mut resident_step = request(2, 1, 0);
    resident_step.resident_only = true;
    h.run_step(resident_step, &all_active, &mut pick, &mut NoChecks);
    let (cmds, _) = h.take();
    assert!(
        !cmds.iter().any(|c| matches!(c, Command::Load { .. })),
        "{cmds:?}"
    );
    assert!(matches!(cmds.last(), Some(Command::StepDone { step: 2 })));
    let s = h.d.scheduler();
    let program = s.program(StepShape::Decode);
    let mut computed = vec![false; map.n_units() as usize];
    for c in &cmds {
        if let Command::Compute { work, .. } = c {
            let streamed = matches!(work.phase, Phase::FfnNeurons | Phase::OutputRows);
            for cluster in work.clusters.clone().filter(|_| streamed) {
                let units = match work.phase {
                    Phase::FfnNeurons => program.units_of_cluster(work.phase, cluster),
                    _ => cluster..cluster + 1,
                };
                for unit in units {
                    computed[map.unit(work.layer, unit) as usize] = true;
                }
            }
        }
    }
    // Every cluster it sends has a unit it keeps (bundles of one cluster here).
    assert_eq!(computed, resident);
    let finished = cmds
        .iter()
        .filter(|c| matches!(c, Command::FinishPhase { .. }))
        .count();
    assert_eq!(finished, program.layer_phases.len() * 2 + 1);
    // One token, decode: nothing else is resident-only.
    let mut h = Harness::new(Scheduler::new(&model, &plan).unwrap(), &model);
    let mut two = request(1, 2, 1);
    two.resident_only = true;
    let err = h.feed(Event::StepRequested(two), &all_active, &mut NoChecks);
    assert_eq!(err, Err(ScheduleError::ResidentOnlyShape { n_tokens: 2 }));
}

#[test]
fn io_uring_reads_carry_any_loads_and_positional_reads_adjacent_ones() {
    let model = store_shape(2, 32);
    let cache = CachePlan {
        slots: 12,
        hot_slots: 0,
        policy: CachePolicy::Lru,
        max_loads: 4,
        stream_output: true,
        stream_attention: true,
        coalesce: 4,
        hot_units: Vec::new(),
        reads: ReadPolicy::Bundles,
        gate_first_gap: 0,
    };
    let mut plan = cached_plan(ExecutionPlan::default(), 50, cache);
    let joined = |plan: &ExecutionPlan| {
        let s = Scheduler::new(&model, plan).unwrap();
        let mut h = Harness::new(s, &model);
        h.run_step(
            request(1, 1, 0),
            &all_active,
            &mut std::iter::empty(),
            &mut NoChecks,
        );
        let (cmds, _) = h.take();
        let map = h.s().unit_map().unwrap().clone();
        let mut prev = None;
        let mut joins = (0, 0);
        for c in &cmds {
            if let Command::Load {
                layer,
                cluster,
                with_previous,
                ..
            } = *c
            {
                let u = map.unit(layer, cluster);
                if with_previous {
                    let adjacent = prev.is_some_and(|p| map.adjacent(p, u));
                    if adjacent {
                        joins.0 += 1
                    } else {
                        joins.1 += 1
                    }
                }
                prev = Some(u);
            }
        }
        joins
    };
    // Positional reads: only adjacent bundles (attention matrices never join).
    let (adjacent, other) = joined(&plan);
    assert!(adjacent > 0);
    assert_eq!(other, 0);
    // io_uring: an attention matrix joins the read before it too.
    plan.storage.engine = crate::plan::IoEngine::Uring;
    let (_, other) = joined(&plan);
    assert!(other > 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Several steps (prefill and decode, with and without logits) through a scheduler with a
    /// random neuron cache, completing computes and loads in a random order: see
    /// [`CacheChecks`] for what is checked. Replaying the same events on a fresh scheduler
    /// gives the identical commands.
    #[test]
    fn cached_steps_keep_the_invariants_in_any_completion_order(
        decode in sizes(),
        prefill in sizes(),
        output_rows in 20u32..120,
        n_groups in 1usize..4,
        decode_mask in 1u32..8,
        prefill_mask in 1u32..8,
        weights in prop::collection::vec(1u32..5, 3),
        n_layer in 1u32..4,
        ffn_bundle in 24u32..170,
        slots_pick in 0u32..64,
        hot_pick in 0u32..64,
        lru in any::<bool>(),
        max_loads in 1u32..=6,
        coalesce in 1u32..=5,
        stream_output in any::<bool>(),
        stream_attention in any::<bool>(),
        steps in prop::collection::vec((any::<bool>(), 2u32..12, 0u32..3), 1..6),
        picks in prop::collection::vec(0usize..32, 1..96),
    ) {
        let model = store_shape(n_layer, ffn_bundle);
        let ffn_clusters = model.n_ff.div_ceil(ffn_bundle);
        let output_clusters = if stream_output { model.n_vocab.div_ceil(output_rows) } else { 0 };
        let attn_units = if stream_attention { crate::cache::ATTN_UNITS } else { 0 };
        let n_units = n_layer * (ffn_clusters + attn_units) + output_clusters;
        let slots = 1 + slots_pick % (n_units + 2);
        let cache = CachePlan {
            slots,
            hot_slots: hot_pick % (slots + 1),
            policy: if lru { CachePolicy::Lru } else { CachePolicy::Segmented },
            max_loads,
            stream_output,
            stream_attention,
            coalesce,
            hot_units: Vec::new(),
            reads: ReadPolicy::Bundles,
            gate_first_gap: 0,
        };
        let base = ExecutionPlan {
            decode,
            prefill,
            ..multi_group_plan(n_groups, decode_mask, prefill_mask, &weights)
        };
        let plan = cached_plan(base, output_rows, cache);
        let mut n_past = 0;
        let steps: Vec<StepRequest> = steps
            .iter()
            .enumerate()
            .map(|(i, &(is_decode, prefill_tokens, logits))| {
                let n_tokens = if is_decode { 1 } else { prefill_tokens };
                let logits_from = match logits {
                    0 => n_tokens,
                    1 => n_tokens - 1,
                    _ => 0,
                };
                let req = StepRequest { step: i as StepId + 1, n_tokens, n_past, logits_from, sequences: 1, resident_only: false };
                n_past += n_tokens;
                req
            })
            .collect();
        let s = Scheduler::new(&model, &plan).unwrap();
        prop_assert_eq!(s.unit_map().unwrap().n_units(), n_units);
        let (cmds, events, s) = run_cached_steps(s, &model, &plan, &steps, &picks);

        // Replay: the recorded events fed to a fresh scheduler give the identical commands.
        let mut fresh = Scheduler::new(&model, &plan).unwrap();
        let mut replayed = Vec::new();
        for e in events {
            fresh.on_event(e, &mut replayed).unwrap();
        }
        prop_assert_eq!(replayed, cmds);
        prop_assert_eq!(fresh.cache_stats(), s.cache_stats());
    }
}

//! Page-granular reads: gate-first loading (gate rows, then the pages of the neurons that
//! fire) and predicted pages (the pages of the predicted neurons, in one phase).

use super::cache::{cached_plan, store_shape};
use super::*;
use crate::plan::{CachePlan, CachePolicy, FfnPlan, FfnSelect};

/// A 3-layer store of 5 bundles of 8 pages, its gate rows on the first 2 (the last page of
/// the gate shares the up rows' first bytes), for gate-first loading.
fn gate_first_shape() -> ModelShape {
    ModelShape {
        ffn_bundle_stride: 8 * 4096,
        ffn_bundle_gate_bytes: 2 * 4096 - 100,
        ..store_shape(3, 32)
    }
}

fn gate_first_plan(
    slots: u32,
    hot_slots: u32,
    max_loads: u32,
    stream_attention: bool,
    gap: u32,
) -> ExecutionPlan {
    let cache = CachePlan {
        slots,
        hot_slots,
        policy: CachePolicy::Segmented,
        max_loads,
        stream_output: true,
        stream_attention,
        coalesce: 1,
        hot_units: Vec::new(),
        reads: ReadPolicy::GateFirst,
        gate_first_gap: gap,
    };
    cached_plan(ExecutionPlan::default(), 50, cache)
}

/// What a driver's slots hold, as the loads it carries out leave them: each slot's unit and
/// pages. Checks that every cluster is computed only once the pages it reads (`wanted`) are in
/// its slot, and that a decode step reads no page its slot holds.
struct PageChecks<'a> {
    map: crate::cache::UnitMap,
    /// The decode and prefill programs (an FFN cluster's bundles).
    programs: [std::sync::Arc<Program>; 2],
    bundle_pages: u32,
    wanted: &'a dyn Fn(u32, u32, u32) -> bool,
    decode: bool,
    slot_unit: Vec<Option<u32>>,
    slot_pages: Vec<std::collections::BTreeSet<u32>>,
    /// Pages read, over the checker's life.
    pages_read: u64,
    gap: u32,
    /// The FFN bundles computed, per phase, as (layer, bundle, phase).
    computed: Vec<(u32, u32, Phase)>,
}

impl<'a> PageChecks<'a> {
    fn new(h: &Harness, slots: u32, gap: u32, wanted: &'a dyn Fn(u32, u32, u32) -> bool) -> Self {
        PageChecks {
            map: h.s().unit_map().unwrap().clone(),
            programs: [StepShape::Decode, StepShape::Prefill]
                .map(|shape| std::sync::Arc::clone(h.s().program(shape))),
            bundle_pages: 8,
            wanted,
            decode: true,
            gap,
            slot_unit: vec![None; slots as usize],
            slot_pages: vec![Default::default(); slots as usize],
            pages_read: 0,
            computed: Vec::new(),
        }
    }

    fn slot_of(&self, unit: u32) -> Option<usize> {
        self.slot_unit.iter().position(|&u| u == Some(unit))
    }

    /// Runs one step to its end; returns the FFN clusters computed.
    fn run_step(
        &mut self,
        h: &mut Harness,
        req: StepRequest,
        pick: &mut dyn Iterator<Item = usize>,
    ) -> Vec<(u32, u32, Phase)> {
        self.decode = req.n_tokens == 1;
        self.computed.clear();
        let wanted = self.wanted;
        h.run_step(req, wanted, pick, self);
        h.take();
        std::mem::take(&mut self.computed)
    }
}

impl Checker for PageChecks<'_> {
    fn command(&mut self, cmd: &Command) {
        let (map, per) = (&self.map, self.bundle_pages);
        let gate_pages = 2;
        match cmd {
            &Command::Load {
                layer,
                cluster,
                slot,
                evicted,
                ref pages,
                top_up,
                ..
            } => {
                let unit = map.unit(layer, cluster);
                let slot = slot as usize;
                if top_up {
                    assert_eq!(self.slot_unit[slot], Some(unit), "top-up of another unit");
                    assert!(evicted.is_none());
                } else {
                    self.slot_unit[slot] = Some(unit);
                    self.slot_pages[slot].clear();
                }
                let is_bundle = layer < map.n_layer && cluster < map.ffn_clusters;
                let pages = pages.clone().unwrap_or(0..if is_bundle { per } else { 1 });
                assert!(pages.start < pages.end && pages.end <= per.max(1));
                if self.decode && top_up && self.gap == 0 {
                    // A decode step reads only pages its slot lacks (unless the pages between
                    // two runs come along).
                    for p in pages.clone() {
                        assert!(
                            !self.slot_pages[slot].contains(&p),
                            "page {p} of {layer}/{cluster} read again"
                        );
                    }
                }
                self.pages_read += pages.len() as u64;
                self.slot_pages[slot].extend(pages);
            }
            Command::Compute { work, .. } if map.streams(work.phase) => {
                let ffn = matches!(work.phase, Phase::FfnNeurons | Phase::FfnGateRows);
                let units: Vec<u32> =
                    work.clusters
                        .clone()
                        .flat_map(|c| match ffn {
                            true => self.programs[usize::from(!self.decode)]
                                .units_of_cluster(work.phase, c),
                            false => {
                                map.unit_cluster(work.phase, c)..map.unit_cluster(work.phase, c) + 1
                            }
                        })
                        .collect();
                for c in units {
                    let unit = map.unit(work.layer, c);
                    if ffn && self.decode && work.phase == Phase::FfnNeurons {
                        // A bundle of a cluster that no page of wants was never read.
                        if !(0..per).any(|p| (self.wanted)(work.layer, c, p)) {
                            continue;
                        }
                    }
                    let slot = self.slot_of(unit).expect("computed without a slot");
                    let have = &self.slot_pages[slot];
                    if work.phase == Phase::FfnGateRows {
                        assert!(
                            (0..gate_pages).all(|p| have.contains(&p)),
                            "{work:?}: gate pages missing"
                        );
                    } else if ffn && self.decode {
                        for p in (0..per).filter(|&p| (self.wanted)(work.layer, c, p)) {
                            assert!(have.contains(&p), "{work:?}: page {p} missing");
                        }
                    } else if ffn {
                        assert!(
                            (0..per).all(|p| have.contains(&p)),
                            "{work:?}: prefill of a partial bundle"
                        );
                    }
                    if ffn {
                        self.computed.push((work.layer, c, work.phase));
                    }
                }
            }
            _ => {}
        }
    }
}

/// A harness of `shape` and `plan` whose decode selects as `select` says, reading pages as
/// that selection does: the gate's threshold reads gate-first, predictions their pages.
fn harness(shape: &ModelShape, plan: &ExecutionPlan, select: FfnSelect) -> Harness {
    let mut plan = plan.clone();
    plan.cache.as_mut().expect("a cached plan").reads = match select {
        FfnSelect::Predicted => ReadPolicy::PredictedPages,
        _ => ReadPolicy::GateFirst,
    };
    let ffn = FfnPlan::with_select(&plan, shape, select).unwrap();
    Harness::new(Scheduler::with_ffn(shape, &plan, ffn).unwrap(), shape)
}

#[test]
fn gate_first_reads_gate_pages_then_only_the_wanted_ones() {
    let shape = gate_first_shape();
    // 5 bundles a layer: 6 slots, 1 hot; 3 loads ahead.
    let plan = gate_first_plan(6, 1, 3, false, 0);
    let mut h = harness(&shape, &plan, FfnSelect::Threshold);
    assert_eq!(h.s().ffn().reads, ReadPolicy::GateFirst);
    let decode = h.s().program(StepShape::Decode);
    let phases: Vec<Phase> = decode.layer_phases.iter().map(|p| p.phase).collect();
    assert_eq!(
        phases,
        [
            Phase::QkvHeads,
            Phase::AttnHeads,
            Phase::AttnOutRows,
            Phase::FfnGateRows,
            Phase::FfnNeurons
        ]
    );
    // Prefill has no gate phase: it reads bundles whole.
    assert!(!h.s().program(StepShape::Prefill).is_gate_first());
    // Cluster 1 of every layer wants nothing; the others their odd pages past the gate.
    let wanted = |_l: u32, c: u32, p: u32| c != 1 && p >= 2 && p % 2 == 1;
    let mut d = PageChecks::new(&h, 6, 0, &wanted);
    let computed = d.run_step(&mut h, request(1, 1, 0), &mut std::iter::empty());
    for l in 0..3 {
        for c in 0..5 {
            assert!(computed.contains(&(l, c, Phase::FfnGateRows)));
            assert_eq!(
                computed.contains(&(l, c, Phase::FfnNeurons)),
                c != 1,
                "layer {l} cluster {c}"
            );
        }
    }
    // 2 gate pages and 3 wanted pages of 4 clusters, 2 gate pages of the skipped one, a page
    // per output cluster (2 of 50 rows).
    assert_eq!(d.pages_read, 3 * (5 * 2 + 4 * 3) + 2);
    // With runs a page apart read as one, the pages between come along: 3, 5 and 7 become
    // one read of 3..8 per cluster.
    let mut h = harness(
        &shape,
        &gate_first_plan(6, 1, 3, false, 1),
        FfnSelect::Threshold,
    );
    let mut d = PageChecks::new(&h, 6, 1, &wanted);
    d.run_step(&mut h, request(1, 1, 0), &mut std::iter::empty());
    assert_eq!(d.pages_read, 3 * (5 * 2 + 4 * 5) + 2);
    // A prefill step after it reads every bundle whole (tops up the partial ones).
    let before = d.pages_read;
    let computed = d.run_step(&mut h, request(2, 4, 1), &mut std::iter::empty());
    assert_eq!(computed.len(), 15);
    assert!(d.pages_read > before);
    // Unexpected pages are an error, not a hang.
    let mut s = h.d.into_scheduler();
    let mut out = Vec::new();
    s.on_event(Event::StepRequested(request(3, 1, 5)), &mut out)
        .unwrap();
    let early = Event::FfnPages {
        step: 3,
        layer: 0,
        pages: vec![u64::MAX],
    };
    assert_eq!(
        s.on_event(early, &mut out),
        Err(ScheduleError::UnexpectedPages { step: 3, layer: 0 })
    );
}

#[test]
fn gate_first_refuses_too_few_cold_slots_and_models_without_gate_pages() {
    let shape = gate_first_shape();
    // 5 bundles a layer need 5 cold slots; 6 slots with 2 hot leave 4: a decode step is
    // refused (not a deadlock). Prefill runs; so does a decode reading predicted pages (no
    // gate phase).
    let plan = gate_first_plan(6, 2, 1, false, 0);
    let mut h = harness(&shape, &plan, FfnSelect::Threshold);
    assert_eq!(
        h.feed(
            Event::StepRequested(request(1, 1, 0)),
            &all_active,
            &mut NoChecks
        ),
        Err(ScheduleError::GateFirstSlots { need: 5, cold: 4 })
    );
    let mut d = PageChecks::new(&h, 6, 0, &all_active);
    d.run_step(&mut h, request(2, 4, 0), &mut std::iter::empty());
    let mut h = harness(&shape, &plan, FfnSelect::Predicted);
    let first_three = |_: u32, _: u32, p: u32| p < 3;
    let mut d = PageChecks::new(&h, 6, 0, &first_three);
    d.run_step(&mut h, request(3, 1, 4), &mut std::iter::empty());
    let plain = store_shape(3, 32);
    assert_eq!(
        Scheduler::new(&plain, &gate_first_plan(8, 0, 1, false, 0)).err(),
        Some(ScheduleError::GateFirstWithoutStore)
    );
}

/// About a third of the (layer, cluster, page)s, chosen by `seed`.
fn hashed_pick(seed: u64, l: u32, c: u32, p: u32) -> bool {
    let h = (u64::from(l) * 131 + u64::from(c) * 31 + u64::from(p)).wrapping_mul(seed | 1);
    (h >> 17) % 3 == 0
}

/// Decode, decode, prefill, decode; after each decode step every cluster with a wanted page
/// computed its neurons exactly once (and, with a gate phase, every cluster its gate rows).
fn run_four_steps(
    h: &mut Harness,
    d: &mut PageChecks<'_>,
    pick: &mut dyn Iterator<Item = usize>,
    gate_phase: bool,
) -> Result<(), TestCaseError> {
    let wanted = d.wanted;
    let steps = [
        request(1, 1, 0),
        request(2, 1, 1),
        request(3, 6, 2),
        request(4, 1, 8),
    ];
    for (step, req) in steps.into_iter().enumerate() {
        let computed = d.run_step(h, req.clone(), pick);
        if req.n_tokens > 1 {
            continue;
        }
        for l in 0..3 {
            for c in 0..5 {
                let needs = (0..8).any(|p| wanted(l, c, p));
                if gate_phase {
                    prop_assert!(computed.contains(&(l, c, Phase::FfnGateRows)));
                }
                prop_assert_eq!(
                    computed
                        .iter()
                        .filter(|&&x| x == (l, c, Phase::FfnNeurons))
                        .count(),
                    usize::from(needs),
                    "step {} layer {} cluster {}",
                    step,
                    l,
                    c
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any slots, hot segment, depth, streamed attention, wanted pages and completion order:
    /// steps finish, clusters compute only with their pages in, decode reads no page twice,
    /// and a later decode of the same wants reads nothing its slots already hold.
    #[test]
    fn gate_first_is_correct_for_any_completion_order(
        extra_slots in 0u32..12,
        hot in 0u32..6,
        max_loads in 1u32..5,
        stream_attention in any::<bool>(),
        gap in 0u32..3,
        seed in any::<u64>(),
        picks in proptest::collection::vec(any::<usize>(), 0..400),
    ) {
        let shape = gate_first_shape();
        let slots = 5 + hot + extra_slots.max(1);
        let plan = gate_first_plan(slots, hot, max_loads, stream_attention, gap);
        let mut h = harness(&shape, &plan, FfnSelect::Threshold);
        let wanted = |l: u32, c: u32, p: u32| p >= 2 && hashed_pick(seed, l, c, p);
        let mut d = PageChecks::new(&h, slots, gap, &wanted);
        let mut pick = picks.iter().copied().cycle();
        run_four_steps(&mut h, &mut d, &mut pick, true)?;
        // With every unit in a slot of its own, a repeated decode reads nothing.
        let all = 3 * 5 + 2 + if stream_attention { 12 } else { 0 };
        let plan = gate_first_plan(all, all, max_loads, stream_attention, gap);
        let mut h = harness(&shape, &plan, FfnSelect::Threshold);
        let mut d = PageChecks::new(&h, all, gap, &wanted);
        d.run_step(&mut h, request(1, 1, 0), &mut pick);
        let first = d.pages_read;
        d.run_step(&mut h, request(2, 1, 1), &mut pick);
        prop_assert_eq!(d.pages_read, first);
    }
}

#[test]
fn predicted_pages_are_read_in_one_phase() {
    let shape = gate_first_shape();
    let mut h = harness(
        &shape,
        &gate_first_plan(6, 1, 3, false, 0),
        FfnSelect::Predicted,
    );
    assert_eq!(h.s().ffn().reads, ReadPolicy::PredictedPages);
    // No gate phase: the predicted neurons' pages come with the predictions.
    assert!(!h.s().program(StepShape::Decode).is_gate_first());
    // Cluster 2 of every layer has no predicted neuron; the others pages 1 and 6.
    let wanted = |_l: u32, c: u32, p: u32| c != 2 && (p == 1 || p == 6);
    let mut d = PageChecks::new(&h, 6, 0, &wanted);
    let computed = d.run_step(&mut h, request(1, 1, 0), &mut std::iter::empty());
    for l in 0..3 {
        for c in 0..5 {
            assert_eq!(computed.contains(&(l, c, Phase::FfnNeurons)), c != 2);
            assert!(!computed.contains(&(l, c, Phase::FfnGateRows)));
        }
    }
    // 2 pages of 4 clusters a layer, a page per output cluster.
    assert_eq!(d.pages_read, 3 * 4 * 2 + 2);
    // A prefill reads whole bundles; a decode after it finds its pages in.
    d.run_step(&mut h, request(2, 4, 1), &mut std::iter::empty());
    let before = d.pages_read;
    d.run_step(&mut h, request(3, 1, 5), &mut std::iter::empty());
    assert!(d.pages_read - before <= 3 * 4 * 2 + 2);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Predicted pages under any slots, depth, gap and completion order: steps finish and
    /// clusters compute only with their pages in.
    #[test]
    fn predicted_pages_are_correct_for_any_completion_order(
        extra_slots in 1u32..12,
        hot in 0u32..6,
        max_loads in 1u32..5,
        stream_attention in any::<bool>(),
        gap in 0u32..3,
        seed in any::<u64>(),
        picks in proptest::collection::vec(any::<usize>(), 0..400),
    ) {
        let shape = gate_first_shape();
        let slots = 5 + hot + extra_slots;
        let plan = gate_first_plan(slots, hot, max_loads, stream_attention, gap);
        let mut h = harness(&shape, &plan, FfnSelect::Predicted);
        let wanted = |l: u32, c: u32, p: u32| hashed_pick(seed, l, c, p);
        let mut d = PageChecks::new(&h, slots, gap, &wanted);
        let mut pick = picks.iter().copied().cycle();
        run_four_steps(&mut h, &mut d, &mut pick, false)?;
    }
}

//! Decode steps that wait for each layer's selection (predictors, a router) and read only the
//! clusters it names.

use super::cache::{cached_plan, store_shape};
use super::*;
use crate::plan::{CachePlan, CachePolicy, FfnPlan, FfnSelect, SparsityMode};

/// Runs one step completing in the core's order; after each layer's attention the clusters
/// `needed(layer, cluster)` hold the active neurons. Returns every command.
fn run_predicted_step(
    h: &mut Harness,
    req: StepRequest,
    needed: &dyn Fn(u32, u32) -> bool,
) -> Vec<Command> {
    let active = |l: u32, c: u32, _: u32| needed(l, c);
    h.run_step(req, &active, &mut std::iter::empty(), &mut NoChecks);
    h.take().0
}

/// An LRU cache of `slots` slots for the 3-layer store model, no output streaming, selecting
/// its clusters: the predicted-decode tests' scheduler.
fn predicting_harness(slots: u32, max_loads: u32, stream_attention: bool) -> Harness {
    let cache = CachePlan {
        slots,
        hot_slots: 0,
        policy: CachePolicy::Lru,
        max_loads,
        stream_output: false,
        stream_attention,
        coalesce: 1,
        hot_units: Vec::new(),
        reads: ReadPolicy::Bundles,
        gate_first_gap: 0,
    };
    let plan = cached_plan(ExecutionPlan::default(), 50, cache);
    let shape = store_shape(3, 32);
    let ffn = FfnPlan::resolve(&plan, &shape, SparsityMode::Predictor).unwrap();
    Harness::new(Scheduler::with_ffn(&shape, &plan, ffn).unwrap(), &shape)
}

/// The (layer, cluster) of every `Load` in `cmds`, in order.
fn loaded_units(cmds: &[Command]) -> Vec<(u32, u32)> {
    cmds.iter()
        .filter_map(|c| match c {
            Command::Load { layer, cluster, .. } => Some((*layer, *cluster)),
            _ => None,
        })
        .collect()
}

#[test]
fn streamed_attention_is_loaded_every_layer_and_predictions_gate_only_the_ffn() {
    // 3 layers of 5 bundles and 4 attention units each; 3 slots: the attention matrices pass
    // through the cache like bundles, one unit per matrix.
    let mut h = predicting_harness(3, 1, true);
    assert_eq!(h.s().unit_map().unwrap().n_units(), 3 * (5 + 4));
    let needed = |layer: u32, c: u32| (layer + c).is_multiple_of(2);
    let cmds = run_predicted_step(&mut h, request(1, 1, 0), &needed);
    check_stream_skipping(h.s(), &request(1, 1, 0), &cmds, &|l, c| !needed(l, c));
    let loaded = loaded_units(&cmds);
    // Per layer: q, k, v, the attention output, then the predicted bundles.
    let expected: Vec<(u32, u32)> = (0..3)
        .flat_map(|l| {
            (5..9)
                .map(move |c| (l, c))
                .chain((0..5).map(move |c| (l, c)))
        })
        .filter(|&(l, c)| c >= 5 || needed(l, c))
        .collect();
    assert_eq!(loaded, expected);
    // Each attention cluster is computed after its own unit landed, never before.
    let map = h.s().unit_map().unwrap();
    for (i, c) in cmds.iter().enumerate() {
        let Command::Compute { work, .. } = c else {
            continue;
        };
        if matches!(work.phase, Phase::QkvHeads | Phase::AttnOutRows) {
            for k in work.clusters.clone() {
                let unit = map.unit_cluster(work.phase, k);
                let load = cmds.iter().position(|c| {
                    matches!(c, Command::Load { layer, cluster, .. } if *layer == work.layer && *cluster == unit)
                });
                assert!(load.is_some_and(|p| p < i), "{work:?} before its load");
            }
        }
    }
    assert!(!h.s().is_busy());
}

#[test]
fn decode_with_predictions_loads_only_the_predicted_clusters() {
    // 3 layers of 5 bundles of 32 neurons; 4 slots, no hot segment: every needed cluster misses.
    let mut h = predicting_harness(4, 2, false);
    assert_eq!(h.s().ffn().select, FfnSelect::Predicted);
    let needed = |layer: u32, c: u32| (layer + c).is_multiple_of(3);
    let cmds = run_predicted_step(&mut h, request(1, 1, 0), &needed);
    // Every needed cluster computed once, the skipped ones never, phases in order (loads
    // aside).
    check_stream_skipping(h.s(), &request(1, 1, 0), &cmds, &|l, c| !needed(l, c));
    let loaded = loaded_units(&cmds);
    let expected: Vec<(u32, u32)> = (0..3)
        .flat_map(|l| (0..5).map(move |c| (l, c)))
        .filter(|&(l, c)| needed(l, c))
        .collect();
    assert_eq!(loaded, expected, "only predicted clusters are read");
    // A layer's loads come after its prediction, never before; the finish says it owes it.
    for (i, c) in cmds.iter().enumerate() {
        if let Command::Load { layer, .. } = c {
            let predicted_at = cmds.iter().position(|c| {
                matches!(c, Command::FinishPhase { layer: l, phase: Phase::AttnOutRows, then: Some(Awaited::Clusters), .. } if l == layer)
            });
            assert!(
                predicted_at.is_some_and(|p| p < i),
                "load {c:?} before its prediction"
            );
        }
    }
    // A layer whose clusters are all skipped finishes its FFN phase on the prediction alone.
    let half_but_layer_1 = |l: u32, c: u32| l != 1 && c.is_multiple_of(2);
    let cmds = run_predicted_step(&mut h, request(10, 1, 1), &half_but_layer_1);
    check_stream_skipping(h.s(), &request(10, 1, 1), &cmds, &|l, c| {
        !half_but_layer_1(l, c)
    });
    assert!(!h.s().is_busy());
    // Prefill steps do not wait: every cluster is acquired (loaded, or found in), no
    // prediction asked for.
    let acquired = |h: &Harness| -> u64 {
        let stats = h.s().cache_stats().unwrap();
        stats.iter().map(|l| l.hits + l.misses).sum()
    };
    let before = acquired(&h);
    let cmds = run_predicted_step(&mut h, request(2, 6, 5), &|_, _| false);
    assert_eq!(acquired(&h) - before, 15);
    check_stream(h.s(), &request(2, 6, 5), &cmds);
    assert!(!cmds
        .iter()
        .any(|c| matches!(c, Command::FinishPhase { then: Some(_), .. })));
    // A prediction out of turn is an error, not a hang or a panic.
    let mut s = h.d.into_scheduler();
    let mut out = Vec::new();
    s.on_event(Event::StepRequested(request(3, 1, 0)), &mut out)
        .unwrap();
    let wrong = Event::FfnPredicted {
        step: 3,
        layer: 1,
        needed: vec![u64::MAX],
    };
    assert!(matches!(
        s.on_event(wrong, &mut out),
        Err(ScheduleError::UnexpectedPrediction { step: 3, layer: 1 })
    ));
}

#[test]
fn an_ffn_plan_its_reads_cannot_serve_is_refused() {
    let shape = ModelShape {
        ffn_bundle_stride: 8 * 4096,
        ffn_bundle_gate_bytes: 4096,
        ..store_shape(3, 32)
    };
    let reading = |reads| {
        let cache = CachePlan {
            slots: 8,
            max_loads: 1,
            reads,
            ..CachePlan::default()
        };
        cached_plan(ExecutionPlan::default(), 50, cache)
    };
    // Reads that need another selection: refused by what they need.
    for (reads, select) in [
        (ReadPolicy::PredictedPages, FfnSelect::Dense),
        (ReadPolicy::GateFirst, FfnSelect::Predicted),
    ] {
        assert!(matches!(
            Scheduler::with_ffn(&shape, &reading(reads), FfnPlan { select, reads }),
            Err(ScheduleError::Ffn(_))
        ));
    }
    // An FFN plan whose reads are not the plan's own.
    let ffn = FfnPlan {
        select: FfnSelect::Predicted,
        reads: ReadPolicy::PredictedPages,
    };
    let err = Scheduler::with_ffn(&shape, &reading(ReadPolicy::Bundles), ffn).err();
    assert!(
        matches!(err, Some(ScheduleError::FfnPlanMismatch { resolved, .. })
            if resolved == FfnPlan { select: FfnSelect::Predicted, reads: ReadPolicy::Bundles }),
        "{err:?}"
    );
}

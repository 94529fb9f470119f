//! The plan search on the profiles in `profiles/`: it picks the fastest candidate, its
//! prediction is what the simulator says of the plan it writes, budgets and speeds it cannot
//! meet are errors naming the limit, and the smallest memory for a speed is the smallest.

use conductor_planner::search::{
    candidates, planned_store_sizes, search, smallest_memory, Limits, PlanRequest, SearchError,
    RESOLUTION,
};
use conductor_runtime::plan::CachePolicy;
use conductor_runtime::plan::HardwareProfile;
use conductor_simulator::{named_shape, simulate, SimOptions, Workload};
use std::path::Path;

fn profile(file: &str) -> HardwareProfile {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles");
    HardwareProfile::from_file(&dir.join(file)).unwrap()
}

/// SmolLM2's shape as the store `conductor convert` makes, on `file`'s machine, under
/// `memory` bytes.
fn request(file: &str, memory: Option<u64>) -> PlanRequest {
    let (model, sizes) = planned_store_sizes(&named_shape("smollm2-135m").unwrap(), None).unwrap();
    let mut r = PlanRequest::new(model, profile(file));
    r.store = Some(sizes);
    r.n_ctx = 64;
    r.limits.memory = memory;
    r.warm_tokens = 4;
    r.measured_tokens = 6;
    r
}

const MIB: u64 = 1 << 20;

#[test]
fn the_chosen_plan_is_the_fastest_candidate_and_its_prediction_replays() {
    let r = request("build-machine.toml", Some(48 * MIB));
    let mut calls = Vec::new();
    let outcome = search(&r, &mut |done, total| calls.push((done, total))).unwrap();
    let n = outcome.scored.len();
    assert_eq!(calls.last(), Some(&(n, n)));
    assert!(n > 10, "{n} candidates");
    // Sorted fastest first; the chosen plan is within the resolution of the first, and no
    // candidate the grid lists earlier is.
    assert!(outcome
        .scored
        .windows(2)
        .all(|w| w[0].decode_tok_s >= w[1].decode_tok_s));
    let p = outcome.plan.predicted.as_ref().unwrap();
    let fastest = outcome.scored[0].decode_tok_s;
    assert_eq!(p.decode_tok_s, outcome.chosen.decode_tok_s);
    assert!(p.decode_tok_s * (1.0 + RESOLUTION) >= fastest);
    let order = candidates(&r.model, &r.profile, true, false);
    let at = order
        .iter()
        .position(|c| c.features == outcome.chosen.features)
        .unwrap();
    for earlier in &order[..at] {
        let s = outcome
            .scored
            .iter()
            .find(|s| s.features == earlier.features)
            .unwrap();
        assert!(s.decode_tok_s * (1.0 + RESOLUTION) < fastest);
    }
    assert!(["io", "compute"].contains(&p.limited_by.as_str()));
    assert!(p.reason.contains("48.0 MiB"), "{}", p.reason);
    // The written plan carries its budget and a cache sized to it, and validates.
    let plan = &outcome.plan;
    plan.validate().unwrap();
    assert_eq!(plan.memory, Some(48 * MIB));
    let cache = plan.cache.as_ref().unwrap();
    let split = outcome.chosen.split.as_ref().unwrap();
    assert_eq!(cache.slots, split.plan.slots);
    assert_eq!(cache.hot_slots, split.plan.hot_slots);
    assert!(cache.slots > 2);
    // Simulating the written plan again gives the same tokens per second (deterministic).
    let workload = Workload::new(r.model.clone(), 0, r.warm_tokens + r.measured_tokens);
    let report = simulate(&r.profile, plan, &workload, &SimOptions::lean()).unwrap();
    let tail = &report.steps[r.warm_tokens as usize..];
    let ns: u64 = tail.iter().map(|s| s.end_ns - s.start_ns).sum();
    let replayed = tail.len() as f64 * 1e9 / ns as f64;
    assert!((replayed - p.decode_tok_s).abs() < 1e-9 * replayed);
    // And the same search gives the same plan.
    let again = search(&r, &mut |_, _| {}).unwrap();
    assert_eq!(again.plan, outcome.plan);
}

#[test]
fn under_a_tight_budget_the_segmented_cache_beats_lru_and_io_limits() {
    let outcome = search(
        &request("build-machine.toml", Some(48 * MIB)),
        &mut |_, _| {},
    )
    .unwrap();
    let best = |policy| {
        outcome
            .scored
            .iter()
            .filter(|s| s.features.policy == Some(policy))
            .map(|s| s.decode_tok_s)
            .fold(0.0, f64::max)
    };
    // A cyclic sweep over more bundles than slots: LRU evicts each just before its reuse.
    assert!(best(CachePolicy::Segmented) > best(CachePolicy::Lru));
    assert_eq!(outcome.chosen.limited_by(), "io");
    // With the whole model in memory the same machine is compute-limited.
    let free = search(&request("build-machine.toml", None), &mut |_, _| {}).unwrap();
    assert_eq!(free.chosen.limited_by(), "compute");
    assert!(free.plan.memory.is_none() && free.plan.cache.is_none());
    assert!(free.chosen.decode_tok_s > outcome.chosen.decode_tok_s);
}

#[test]
fn limits_no_plan_meets_are_errors_that_say_by_how_much() {
    let err = search(
        &request("build-machine.toml", Some(10 * MIB)),
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(matches!(err, SearchError::Memory(_)));
    let text = err.to_string();
    // The error names the least budget that works: a search under it finds a plan.
    let least: u64 = text
        .split("give at least ")
        .nth(1)
        .and_then(|t| t.split(" MiB").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(text.contains("budget of 10 MiB") && least > 10, "{text}");
    search(
        &request("build-machine.toml", Some(least * MIB)),
        &mut |_, _| {},
    )
    .unwrap_or_else(|e| panic!("{least} MiB, as `{text}` said: {e}"));

    let mut r = request("build-machine.toml", None);
    r.limits.min_speed = Some(1e6);
    let err = search(&r, &mut |_, _| {}).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, SearchError::TooSlow { .. }));
    assert!(
        text.contains("1000000.00 tokens/s") && text.contains("short"),
        "{text}"
    );

    r.limits.min_speed = Some(-1.0);
    assert!(matches!(
        search(&r, &mut |_, _| {}),
        Err(SearchError::Limit(_))
    ));

    // A budget for a model without store sizes.
    let mut r = PlanRequest::new(
        named_shape("llama-2-7b").unwrap(),
        profile("oneplus-12.toml"),
    );
    r.limits = Limits {
        memory: Some(2 << 30),
        min_speed: None,
    };
    assert!(matches!(
        search(&r, &mut |_, _| {}),
        Err(SearchError::NotAStore)
    ));
}

#[test]
fn the_smallest_memory_for_a_speed_reaches_it_and_less_does_not() {
    let mut r = request("build-machine.toml", None);
    // Halfway between the speed at the least memory and at all of it.
    let least = search(
        &request("build-machine.toml", Some(45 * MIB)),
        &mut |_, _| {},
    )
    .unwrap()
    .chosen
    .decode_tok_s;
    // Enough for every unit to have a slot (the store's 105.6 MiB and the fixed segment).
    let most = search(
        &request("build-machine.toml", Some(160 * MIB)),
        &mut |_, _| {},
    )
    .unwrap()
    .chosen
    .decode_tok_s;
    assert!(most > least * 1.2, "{least} .. {most}");
    let wanted = (least + most) / 2.0;
    r.limits.min_speed = Some(wanted);
    let mut tried = Vec::new();
    let outcome = smallest_memory(&r, &mut |b, s| tried.push((b, s))).unwrap();
    let budget = outcome.plan.memory.unwrap();
    assert!(outcome.chosen.decode_tok_s >= wanted);
    assert!(tried.len() >= 4, "{tried:?}");
    // 2% less memory does not reach the speed.
    let mut less = r.clone();
    less.limits.memory = Some(budget - budget / 50);
    assert!(matches!(
        search(&less, &mut |_, _| {}),
        Err(SearchError::TooSlow { .. })
    ));
    // A speed beyond what all the memory gives: an error naming the best.
    r.limits.min_speed = Some(most * 3.0);
    let got = smallest_memory(&r, &mut |_, _| {});
    assert!(
        matches!(got, Err(SearchError::TooSlow { .. })),
        "{:?}",
        got.map(|o| o.chosen.decode_tok_s)
    );
}

#[test]
fn a_phone_profile_gets_a_plan_over_its_core_classes() {
    let (model, sizes) = planned_store_sizes(&named_shape("llama-2-7b").unwrap(), None).unwrap();
    let mut r = PlanRequest::new(model, profile("oneplus-12.toml"));
    r.store = Some(sizes);
    // Room for the whole model: decode is bound by compute and memory bandwidth, not by reads
    // (under 2 GiB the phone's NEON rates leave every layout waiting on storage alike).
    r.limits.memory = Some(6 << 30);
    r.warm_tokens = 1;
    r.measured_tokens = 2;
    let outcome = search(&r, &mut |_, _| {}).unwrap();
    // Four layouts of groups were tried on a three-class phone.
    let layouts: std::collections::BTreeSet<_> = outcome
        .scored
        .iter()
        .map(|s| s.features.groups.name())
        .collect();
    assert_eq!(layouts.len(), 4);
    // Sharing decode by speed beats sharing it by core count there: the little cores no
    // longer finish every phase last.
    let best = |layout: &str| {
        outcome
            .scored
            .iter()
            .filter(|s| s.features.groups.name() == layout)
            .map(|s| s.decode_tok_s)
            .fold(0.0, f64::max)
    };
    assert!(
        best("a group per core class, shares by speed") > best("a group per core class"),
        "by speed {} vs by cores {}",
        best("a group per core class, shares by speed"),
        best("a group per core class")
    );
    outcome.plan.validate().unwrap();
    assert!(outcome.chosen.decode_tok_s > 0.0);
}

#[test]
fn with_threshold_sparsity_gate_first_reads_are_scored_and_skipped_where_they_do_not_fit() {
    use conductor_planner::search::ReadPolicy;
    use conductor_runtime::plan::SparsityPlan;
    use conductor_runtime::sparse::SparsityMode;
    let sparse = |memory| {
        let mut r = request("build-machine.toml", Some(memory));
        r.sparsity = Some(SparsityPlan {
            mode: SparsityMode::Threshold,
            target: Some(0.3),
            predictor_recall: None,
            thresholds: Vec::new(),
        });
        r
    };
    let gate_first = |o: &conductor_planner::search::PlanOutcome| {
        o.scored
            .iter()
            .filter(|s| s.features.read != ReadPolicy::Whole)
            .count()
    };
    // A roomy budget: every gate-first candidate is scored, with the plan it describes.
    let roomy = search(&sparse(48 * MIB), &mut |_, _| {}).unwrap();
    let all = gate_first(&roomy);
    let whole = roomy.scored.len() - all;
    assert!(whole > 10, "{whole} whole-bundle candidates");
    assert_eq!(
        all,
        2 * whole,
        "two gaps beside every whole-bundle candidate"
    );
    for s in &roomy.scored {
        let cache = s.plan.cache.as_ref().unwrap();
        match s.features.read {
            ReadPolicy::Whole => {
                assert_eq!(cache.reads, conductor_runtime::plan::ReadPolicy::Bundles)
            }
            ReadPolicy::GateFirst { gap } => {
                assert_eq!(cache.reads, conductor_runtime::plan::ReadPolicy::GateFirst);
                assert_eq!(cache.gate_first_gap, gap);
            }
        }
    }
    // Dense decode has no gate phase: no gate-first candidates.
    let dense = search(
        &request("build-machine.toml", Some(48 * MIB)),
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(gate_first(&dense), 0);
    // The least budget a plan fits: gate-first needs a layer's bundles in the cold segment, so
    // some of its candidates do not fit there; they are left out, and the search still answers.
    let mut budget = 16 * MIB;
    let tight = loop {
        match search(&sparse(budget), &mut |_, _| {}) {
            Ok(o) => break o,
            Err(_) => budget += MIB / 4,
        }
        assert!(budget < 48 * MIB, "no budget under 48 MiB fits");
    };
    assert!(
        gate_first(&tight) < all,
        "at {budget} bytes {} of {all} gate-first candidates fit",
        gate_first(&tight)
    );
}

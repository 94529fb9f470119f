use super::*;
use crate::plan::{CachePlan, CachePolicy, ReadPolicy};

fn plan(slots: u32, hot: u32, policy: CachePolicy) -> CachePlan {
    CachePlan {
        slots,
        hot_slots: hot,
        policy,
        max_loads: 2,
        stream_output: false,
        stream_attention: false,
        coalesce: 1,
        hot_units: Vec::new(),
        reads: ReadPolicy::Bundles,
        gate_first_gap: 0,
    }
}

fn map(n_layer: u32, ffn_clusters: u32) -> UnitMap {
    UnitMap {
        n_layer,
        ffn_clusters,
        output_clusters: 0,
        attn_units: 0,
    }
}

#[test]
fn hot_clusters_are_never_evicted_and_cold_ones_go_least_recently_used_first() {
    // 2 layers x 4 clusters; 3 hot slots (L0C0, L1C0, L0C1), 2 cold.
    let mut d = CacheDirectory::new(&plan(5, 3, CachePolicy::Segmented), &map(2, 4));
    for (l, c) in [(0, 0), (1, 0), (0, 1)] {
        assert!(matches!(
            d.acquire(l, c),
            Acquired::Load { evicted: None, .. }
        ));
        assert!(d.loaded(l, c));
        d.release(l, c);
    }
    // Cold: L0C2 then L0C3 fill the two cold slots; L1C1 evicts the older, L0C2.
    for (l, c) in [(0, 2), (0, 3)] {
        assert!(matches!(
            d.acquire(l, c),
            Acquired::Load { evicted: None, .. }
        ));
        d.loaded(l, c);
        d.release(l, c);
    }
    let unit = |l: u32, c: u32| l * 4 + c;
    assert_eq!(
        d.acquire(1, 1),
        Acquired::Load {
            slot: 3,
            evicted: Some(unit(0, 2))
        }
    );
    // Both cold slots are now pinned or... L1C1 pinned, L0C3 free: L1C2 evicts L0C3.
    assert!(matches!(d.acquire(1, 2), Acquired::Load { evicted: Some(u), .. } if u == unit(0, 3)));
    // Nothing left to evict while both are pinned.
    assert_eq!(d.acquire(1, 3), Acquired::Full);
    // Hot ones still hit.
    for (l, c) in [(0, 0), (1, 0), (0, 1)] {
        assert_eq!(d.acquire(l, c), Acquired::Hit);
    }
    assert_eq!(d.stats()[0].evictions + d.stats()[1].evictions, 2);
}

#[test]
fn a_hit_refreshes_recency_and_abort_frees_loading_slots() {
    let mut d = CacheDirectory::new(&plan(2, 0, CachePolicy::Lru), &map(1, 4));
    for c in [0, 1] {
        d.acquire(0, c);
        d.loaded(0, c);
        d.release(0, c);
    }
    // Touch 0 again: now 1 is the least recently used.
    assert_eq!(d.acquire(0, 0), Acquired::Hit);
    d.release(0, 0);
    assert_eq!(
        d.acquire(0, 2),
        Acquired::Load {
            slot: 1,
            evicted: Some(1)
        }
    );
    d.abort();
    assert!(!d.is_ready(0, 2), "a load in flight is forgotten");
    assert!(d.is_ready(0, 0), "a completed load survives an abort");
    // The slot of the forgotten load is reused first.
    assert!(matches!(
        d.acquire(0, 3),
        Acquired::Load {
            slot: 1,
            evicted: None
        }
    ));
}

/// A retired slot (one a stuck read of replaced actors still holds) is never given out again,
/// not even after an abort; its hot unit competes for cold slots; it is not counted as held.
#[test]
fn a_retired_slot_is_never_given_out_and_is_not_a_leak() {
    // 1 layer x 4 clusters; slot 0 hot (L0C0), slots 1 and 2 cold.
    let mut d = CacheDirectory::new(&plan(3, 1, CachePolicy::Segmented), &map(1, 4));
    assert_eq!(d.held_slots(), 0);
    d.retire(0);
    d.retire(1);
    assert_eq!((d.retired_slots(), d.held_slots()), (2, 0));
    for round in 0..2 {
        for c in 0..4 {
            assert_eq!(
                d.acquire(0, c),
                Acquired::Load {
                    slot: 2,
                    evicted: (c > 0 || round > 0).then_some((c + 3) % 4),
                },
                "round {round} cluster {c}"
            );
            // Every slot left is in use: the next unit waits.
            assert_eq!(d.acquire(0, (c + 1) % 4), Acquired::Full);
            assert!(d.loaded(0, c));
            assert_eq!(d.held_slots(), 1);
            d.release(0, c);
        }
        d.abort();
        assert_eq!(d.held_slots(), 0);
    }
}

#[test]
fn a_cache_with_every_slot_hot_keeps_one_cold_slot_when_clusters_remain() {
    let mut d = CacheDirectory::new(&plan(2, 2, CachePolicy::Segmented), &map(1, 4));
    // L0C0 is hot (slot 0); the others share slot 1.
    for c in 0..4 {
        assert!(!matches!(d.acquire(0, c), Acquired::Full), "cluster {c}");
        d.loaded(0, c);
        d.release(0, c);
    }
}

#[test]
fn budgets_parse_in_the_units_people_write() {
    let p = |s: &str| s.parse::<MemoryBudget>();
    assert_eq!(p("48MiB"), Ok(MemoryBudget::Bytes(48 << 20)));
    assert_eq!(p("100MB"), Ok(MemoryBudget::Bytes(100_000_000)));
    assert_eq!(p("52428800"), Ok(MemoryBudget::Bytes(52_428_800)));
    assert_eq!(p("1.5GiB"), Ok(MemoryBudget::Bytes(3 << 29)));
    assert_eq!(p("50%"), Ok(MemoryBudget::PercentOfModel(50.0)));
    assert_eq!(MemoryBudget::PercentOfModel(25.0).bytes(1000), 250);
    for bad in ["", "lots", "-5MB", "0%", "12XB", "0"] {
        assert!(p(bad).is_err(), "{bad}");
    }
}

#[test]
fn units_follow_the_order_a_step_needs_them() {
    let m = UnitMap {
        n_layer: 2,
        ffn_clusters: 3,
        output_clusters: 4,
        attn_units: 0,
    };
    assert_eq!(m.n_units(), 10);
    for u in 0..m.n_units() {
        let (l, c) = m.layer_cluster(u);
        assert_eq!(m.unit(l, c), u);
    }
    assert_eq!(
        m.layer_cluster(7),
        (2, 1),
        "output clusters come last, as layer n_layer"
    );
    let mut hot = m.hot_order();
    assert_eq!(
        &hot[..3],
        &[0, 3, 6],
        "first cluster of every layer, then of the output"
    );
    hot.sort_unstable();
    assert_eq!(hot, (0..10).collect::<Vec<_>>());
}

#[test]
fn a_plans_hot_units_take_the_hot_slots_before_the_round_robin_order() {
    // 2 layers x 4 clusters, 3 hot slots. The plan ranks L1C3 and L0C2 hottest (and names
    // L1C3 twice and a unit that does not exist): they get the first two hot slots, the
    // round-robin order (L0C0 …) the third.
    let ranked = CachePlan {
        hot_units: vec![7, 2, 7, 99],
        ..plan(5, 3, CachePolicy::Segmented)
    };
    let mut d = CacheDirectory::new(&ranked, &map(2, 4));
    for (l, c, slot) in [(1, 3, 0), (0, 2, 1), (0, 0, 2)] {
        assert_eq!(
            d.acquire(l, c),
            Acquired::Load {
                slot,
                evicted: None
            },
            "L{l}C{c}"
        );
        d.loaded(l, c);
        d.release(l, c);
    }
    // L1C0, hot without a ranking, is cold here: it takes a cold slot (3 or 4).
    assert!(matches!(
        d.acquire(1, 0),
        Acquired::Load {
            slot: 3 | 4,
            evicted: None
        }
    ));
    // The LRU policy has no hot segment: the ranking changes nothing.
    let lru = CachePlan {
        hot_units: vec![7, 2],
        ..plan(5, 3, CachePolicy::Lru)
    };
    let mut d = CacheDirectory::new(&lru, &map(2, 4));
    assert!(matches!(d.acquire(1, 3), Acquired::Load { slot: 0, .. }));
}

/// A 4-layer store of 8 bundles of 64 KiB per layer, with `resident` bytes resident, of
/// which `attention` are attention matrices (the longest read `attention_unit` bytes).
fn small_store(resident: u64, attention: u64, attention_unit: u64) -> StoreSizes {
    StoreSizes {
        resident_weights: resident,
        n_layer: 4,
        n_embd: 256,
        n_ff: 1024,
        q_dim: 256,
        kv_dim: 64,
        n_vocab: 1000,
        bundles_per_layer: 8,
        bundle_stride: 64 << 10,
        output_row_bytes: 288,
        attention_bytes: attention,
        attention_unit_bytes: attention_unit,
        layer_bundle_bytes: Vec::new(),
    }
}

#[test]
fn a_deeper_pipeline_keeps_more_cold_slots() {
    let sizes = small_store(10 << 20, 0, 0);
    // About 17 slots beside a fixed segment of the runtime plus 12 MiB.
    let budget = runtime_overhead(&sizes, 0) + (13 << 20);
    let split = |max_loads| {
        split_sizes(
            &sizes,
            budget,
            128,
            64,
            &CachePlan {
                max_loads,
                policy: CachePolicy::Lru,
                ..CachePlan::default()
            },
        )
        .unwrap()
    };
    let (shallow, deep) = (split(1), split(8));
    assert_eq!(shallow.plan.slots, deep.plan.slots);
    assert_eq!(shallow.plan.slots - shallow.plan.hot_slots, 3);
    assert_eq!(deep.plan.slots - deep.plan.hot_slots, 10);
    // The plan's shape is kept, its slot counts are the budget's.
    assert_eq!(deep.plan.policy, CachePolicy::Lru);
    assert_eq!(deep.plan.max_loads, 8);
    // Too small: the error names what is needed.
    let err = split_sizes(&sizes, 12 << 20, 128, 64, &CachePlan::default()).unwrap_err();
    assert!(err.to_string().contains("give at least"), "{err}");
}

/// Bytes the slots of `split` take in an arena for a store of `sizes`: each hot slot its own
/// unit's read (an output cluster's with a page of slack), each cold slot the longest unit's
/// and a page.
fn slot_bytes_taken(sizes: &StoreSizes, split: &BudgetSplit) -> u64 {
    let p = &split.plan;
    let map = UnitMap {
        n_layer: sizes.n_layer,
        ffn_clusters: sizes.bundles_per_layer,
        output_clusters: sizes.n_vocab.div_ceil(split.output_rows),
        attn_units: if p.stream_attention { ATTN_UNITS } else { 0 },
    };
    let page = SLOT_ALIGN as u64;
    let bundle = |l: u32| {
        sizes
            .layer_bundle_bytes
            .get(l as usize)
            .copied()
            .unwrap_or(sizes.bundle_stride)
    };
    let hot: u64 = hot_segment(p, &map)
        .iter()
        .map(|&unit| match map.layer_cluster(unit) {
            (l, c) if l == sizes.n_layer => {
                let rows = split.output_rows.min(sizes.n_vocab - c * split.output_rows);
                (u64::from(rows) * sizes.output_row_bytes).div_ceil(page) * page + page
            }
            (_, c) if c >= sizes.bundles_per_layer => sizes.attention_unit_bytes,
            (l, _) => bundle(l),
        })
        .sum();
    let longest = if p.stream_attention {
        sizes.bundle_stride.max(sizes.attention_unit_bytes)
    } else {
        sizes.bundle_stride
    };
    hot + u64::from(p.slots - p.hot_slots) * (longest + page)
}

/// Where layers' bundles differ in length (a Q4_K_M store's Q4_K and Q6_K down columns), each
/// hot slot is as long as its own unit: the same budget holds more hot units than slots of
/// the longest unit would, never more bytes than the cache was given, with as many cold
/// slots.
#[test]
fn hot_slots_sized_to_their_units_hold_more_of_a_mixed_store() {
    let uniform = small_store(10 << 20, 0, 0);
    let mixed = StoreSizes {
        layer_bundle_bytes: vec![64 << 10, 40 << 10, 64 << 10, 40 << 10],
        ..uniform.clone()
    };
    // About 17 slots of the longest unit beside the fixed segment (as above).
    let budget = runtime_overhead(&uniform, 0) + (13 << 20);
    let split = |s: &StoreSizes| split_sizes(s, budget, 128, 64, &CachePlan::default()).unwrap();
    let (u, m) = (split(&uniform), split(&mixed));
    assert_eq!(u.cache, m.cache);
    let cold = |p: &CachePlan| p.slots - p.hot_slots;
    assert_eq!(cold(&u.plan), cold(&m.plan));
    assert!(
        m.plan.hot_slots > u.plan.hot_slots,
        "{} against {} hot slots",
        m.plan.hot_slots,
        u.plan.hot_slots
    );
    // What the slots take fits the cache, and one more hot unit would not have.
    assert!(slot_bytes_taken(&mixed, &m) <= m.cache);
    let one_more = BudgetSplit {
        plan: CachePlan {
            slots: m.plan.slots + 1,
            hot_slots: m.plan.hot_slots + 1,
            ..m.plan.clone()
        },
        ..m.clone()
    };
    assert!(slot_bytes_taken(&mixed, &one_more) > m.cache);
    let n_units = 4 * 8 + 1000u32.div_ceil(m.output_rows);
    // A budget that holds every unit in a slot of its own size makes all of them hot.
    let all = split_sizes(&mixed, budget + (4 << 20), 128, 64, &CachePlan::default()).unwrap();
    assert_eq!((all.plan.slots, all.plan.hot_slots), (n_units, n_units));
}

#[test]
fn streamed_attention_units_come_before_their_layers_bundles() {
    // 3 layers of 5 bundles and 4 attention matrices, 2 output clusters: 29 units.
    let m = UnitMap {
        n_layer: 3,
        ffn_clusters: 5,
        output_clusters: 2,
        attn_units: ATTN_UNITS,
    };
    assert_eq!(m.n_units(), 29);
    for u in 0..m.n_units() {
        let (l, c) = m.layer_cluster(u);
        assert_eq!(m.unit(l, c), u, "unit {u}");
    }
    // Step order: a layer's q, k, v and output matrices, then its bundles, then the next layer.
    let order: Vec<(u32, u32)> = (0..m.n_units()).map(|u| m.layer_cluster(u)).collect();
    let expected: Vec<(u32, u32)> = (0..3)
        .flat_map(|l| (5..9).chain(0..5).map(move |c| (l, c)))
        .chain([(3, 0), (3, 1)])
        .collect();
    assert_eq!(order, expected);
    // Each streamed phase's cluster reads one unit, and the unit names it back.
    for (phase, clusters) in [
        (Phase::QkvHeads, 0..3),
        (Phase::AttnOutRows, 0..1),
        (Phase::FfnNeurons, 0..5),
    ] {
        assert!(m.streams(phase));
        for c in clusters {
            assert_eq!(m.phase_cluster(1, m.unit_cluster(phase, c)), (phase, c));
        }
    }
    assert_eq!(m.phase_cluster(3, 1), (Phase::OutputRows, 1));
    assert!(!m.streams(Phase::AttnHeads));
    // A plan's ranking numbers bundles as if attention did not stream.
    assert_eq!(m.from_plain(2 * 5 + 3), Some(m.unit(2, 3)));
    assert_eq!(m.from_plain(15 + 1), Some(m.unit(3, 1)));
    assert_eq!(m.from_plain(15 + 2), None);
    // Reads merge bundles only: never an attention matrix, never across a layer.
    assert!(m.adjacent(m.unit(0, 1), m.unit(0, 2)));
    assert!(!m.adjacent(m.unit(0, 4), m.unit(1, 5)));
    assert!(!m.adjacent(m.unit(1, 8), m.unit(1, 0)));
    // Hot slots go to attention first (every token reads all of it), then bundles.
    let mut hot = m.hot_order();
    assert!(hot[..12].iter().all(|&u| m
        .phase_cluster(m.layer_cluster(u).0, m.layer_cluster(u).1)
        .0
        != Phase::FfnNeurons));
    hot.sort_unstable();
    assert_eq!(hot, (0..29).collect::<Vec<_>>());
    // What every token reads whatever its predictions: all attention, then the output.
    let every: Vec<(u32, u32)> = m.every_token_units().map(|u| m.layer_cluster(u)).collect();
    assert_eq!(every.len(), 14);
    assert!(every[..12].iter().all(|&(l, c)| l < 3 && c >= 5));
    assert_eq!(&every[12..], &[(3, 0), (3, 1)]);
}

#[test]
fn attention_streams_only_when_the_budget_cannot_hold_it() {
    let sizes = small_store(12 << 20, 8 << 20, 80 << 10);
    let fit = |budget: u64| {
        let mut plan = crate::plan::ExecutionPlan::default();
        fit_plan_to_budget(&sizes, &mut plan, budget, 128).map(|split| (split, plan))
    };
    // Room for everything resident: attention stays, prefill steps of 64 tokens.
    let (split, plan) = fit(64 << 20).unwrap();
    assert!(!split.plan.stream_attention);
    assert_eq!(split.resident_weights, 12 << 20);
    assert_eq!(plan.prefill_max_tokens, 64);
    // Just too small for 64-token prefill steps: shorter steps, attention still resident.
    let need_64 = split.resident_weights
        + split.kv_cache
        + split.scratch
        + split.runtime_overhead
        + 2 * (sizes.bundle_stride + SLOT_ALIGN as u64);
    let (split, plan) = fit(need_64 - 1).unwrap();
    assert!(!split.plan.stream_attention);
    assert!(plan.prefill_max_tokens < 64);
    // Too small for resident attention at any step: it streams, its bytes leave the fixed
    // segment, slots hold the longest unit, and the units count the matrices.
    let (split, plan) = fit(need_64 - (4 << 20)).unwrap();
    assert!(split.plan.stream_attention);
    assert!(plan.cache.as_ref().unwrap().stream_attention);
    assert_eq!(split.resident_weights, 4 << 20);
    assert!(split.plan.slots >= 2);
    assert!(slot_bytes_taken(&sizes, &split) <= split.cache);
    // Below even that: the error gives the least budget, the one with attention streamed.
    let err = fit(runtime_overhead(&sizes, 0) - (1 << 20)).unwrap_err();
    let BudgetError::TooSmall { weights, .. } = err else {
        panic!("{err}")
    };
    assert_eq!(weights, 4 << 20);
}

#[test]
fn the_runtime_overhead_grows_with_the_vocabulary_and_the_units() {
    let sizes = small_store(4 << 20, 0, 0);
    let base = runtime_overhead(&sizes, 100);
    let wide = StoreSizes {
        n_vocab: sizes.n_vocab + 100_000,
        ..sizes.clone()
    };
    assert_eq!(
        runtime_overhead(&wide, 100),
        base + 100_000 * RUNTIME_PER_TOKEN
    );
    assert_eq!(
        runtime_overhead(&sizes, 50_100),
        base + 50_000 * RUNTIME_PER_UNIT
    );
    // SmolLM2-135M's 49k vocabulary and a few hundred units: the 13 MiB it was measured at.
    let smol = StoreSizes {
        n_vocab: 49152,
        ..sizes.clone()
    };
    let mib = runtime_overhead(&smol, 300) as f64 / (1 << 20) as f64;
    assert!((12.5..13.5).contains(&mib), "{mib:.2} MiB");
    // The split counts its own units: more bundles per layer, more overhead.
    let split = |s: &StoreSizes| {
        split_sizes(s, 1 << 30, 128, 64, &CachePlan::default())
            .unwrap()
            .runtime_overhead
    };
    let more_units = StoreSizes {
        bundles_per_layer: 800,
        ..sizes.clone()
    };
    assert_eq!(
        split(&more_units) - split(&sizes),
        4 * (800 - 8) * RUNTIME_PER_UNIT
    );
    assert!(split(&wide) > split(&sizes));
}

#[test]
fn a_budget_too_small_says_how_much_is_enough() {
    for resident in [4 << 20, (4 << 20) + 12345, (7 << 20) + 999_999] {
        let sizes = small_store(resident, 0, 0);
        let err = split_sizes(&sizes, 1 << 20, 128, 64, &CachePlan::default()).unwrap_err();
        let text = err.to_string();
        let need: u64 = text
            .split("give at least ")
            .nth(1)
            .and_then(|t| t.strip_suffix(" MiB"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{text}"));
        // That many MiB works, and one MiB less does not.
        split_sizes(&sizes, need << 20, 128, 64, &CachePlan::default())
            .unwrap_or_else(|e| panic!("{need} MiB, as `{text}` said: {e}"));
        assert!(split_sizes(&sizes, (need - 1) << 20, 128, 64, &CachePlan::default()).is_err());
    }
}

/// Several sessions generated together (a server's slots): the budget holds each one's KV
/// cache and a logits row more per session, the neuron cache shrinks by as much, and a budget
/// that holds one session but not four says so, naming the sessions.
#[test]
fn the_budget_holds_every_sessions_kv_cache() {
    let sizes = small_store(10 << 20, 0, 0);
    // Room for the fixed segment of four sessions and 20 slots: one session's cache holds the
    // whole store (its slots capped at the units), four sessions' does not.
    let fixed = |sessions| {
        let s = split_sizes_for(
            &sizes,
            u64::MAX / 4,
            1024,
            sessions,
            64,
            &CachePlan::default(),
        )
        .unwrap();
        s.resident_weights + s.kv_cache + s.scratch + s.runtime_overhead
    };
    let budget = fixed(4) + 20 * ((64 << 10) + SLOT_ALIGN as u64);
    let one = split_sizes(&sizes, budget, 1024, 64, &CachePlan::default()).unwrap();
    let same = split_sizes_for(&sizes, budget, 1024, 1, 64, &CachePlan::default()).unwrap();
    assert_eq!(one, same);
    assert_eq!((one.sessions, one.n_ctx), (1, 1024));
    let four = split_sizes_for(&sizes, budget, 1024, 4, 64, &CachePlan::default()).unwrap();
    assert_eq!((four.sessions, four.n_ctx), (4, 1024));
    assert_eq!(four.kv_cache, 4 * one.kv_cache);
    assert_eq!(four.scratch, one.scratch + 3 * 4 * u64::from(sizes.n_vocab));
    let extra = four.kv_cache + four.scratch - one.kv_cache - one.scratch;
    assert_eq!(four.cache, one.cache - extra);
    // 20 slots of the longest unit's size, and a hot slot more: hot slots are their unit's
    // read long, without the page of slack a slot for any unit keeps.
    assert_eq!(four.plan.slots, 21);
    assert!(slot_bytes_taken(&sizes, &four) <= four.cache);
    assert!(four.plan.slots < one.plan.slots, "{}", one.plan.slots);
    // 1 MiB of KV per session of 1024 tokens here: 64 sessions do not fit.
    let err = split_sizes_for(&sizes, budget, 1024, 64, 64, &CachePlan::default()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("64 sessions of 1024 tokens") && text.contains("give at least"),
        "{text}"
    );
    // Through the plan fit too.
    let mut plan = crate::plan::ExecutionPlan::default();
    let fitted = fit_plan_to_budget_for(&sizes, &mut plan, budget, 1024, 4).unwrap();
    assert_eq!(fitted.sessions, 4);
    assert_eq!(
        plan.cache.as_ref().map(|c| c.slots),
        Some(fitted.plan.slots)
    );
}

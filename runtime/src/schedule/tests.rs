use super::*;
use crate::plan::ClusterSizes;
use proptest::prelude::*;

fn shape() -> ModelShape {
    ModelShape {
        n_layer: 3,
        n_embd: 64,
        n_ff: 160,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 16,
        n_vocab: 100,
        ffn_granule: 32,
        ffn_bundle: 0,
        ffn_bundle_stride: 0,
        ffn_bundle_gate_bytes: 0,
        n_expert: 0,
        n_expert_used: 0,
    }
}

fn request(step: StepId, n_tokens: u32, logits_from: u32) -> StepRequest {
    StepRequest {
        step,
        n_tokens,
        n_past: 0,
        logits_from,
    }
}

/// Runs one step to completion the way a driver does, completing each Compute right away.
/// Returns every command in order.
fn run_step(s: &mut Scheduler, req: StepRequest) -> Vec<Command> {
    let mut all = Vec::new();
    let mut pending = Vec::new();
    s.on_event(Event::StepRequested(req), &mut pending).unwrap();
    while !pending.is_empty() {
        let batch = std::mem::take(&mut pending);
        for cmd in &batch {
            if let Command::Compute { work, .. } = cmd {
                s.on_event(Event::ClusterDone(work.clone()), &mut pending)
                    .unwrap();
            }
        }
        all.extend(batch);
    }
    all
}

/// Checks the invariants of one step's command stream: every cluster of every phase of every
/// layer is computed exactly once, phases run in program order, a phase is finished only after
/// all its clusters, and the step ends exactly once.
fn check_stream(s: &Scheduler, req: &StepRequest, cmds: &[Command]) {
    check_stream_skipping(s, req, cmds, &|_, _| false);
}

/// As [`check_stream`], but FFN clusters `skipped(layer, cluster)` are never computed (and
/// their phase still finishes).
fn check_stream_skipping(
    s: &Scheduler,
    req: &StepRequest,
    cmds: &[Command],
    skipped: &dyn Fn(u32, u32) -> bool,
) {
    let shape = s.shape_for(req.n_tokens);
    let program = s.program(shape);
    let mut expected = Vec::new();
    for layer in 0..program.n_layer {
        for p in &program.layer_phases {
            expected.push((layer, p.phase, p.clusters.len() as u32));
        }
    }
    if req.wants_logits() {
        expected.push((
            program.n_layer,
            Phase::OutputRows,
            program.output.clusters.len() as u32,
        ));
    }
    let mut i = 0;
    for (layer, phase, n_clusters) in expected {
        let mut seen = vec![false; n_clusters as usize];
        while let Some(Command::Compute { work, .. }) = cmds.get(i) {
            assert_eq!((work.layer, work.phase, work.shape), (layer, phase, shape));
            for c in work.clusters.clone() {
                assert!(!seen[c as usize], "cluster {c} of {phase:?} computed twice");
                seen[c as usize] = true;
            }
            i += 1;
        }
        for (c, &computed) in seen.iter().enumerate() {
            let skip = phase == Phase::FfnNeurons && skipped(layer, c as u32);
            assert_eq!(
                computed, !skip,
                "cluster {c} of {phase:?} of layer {layer}: computed {computed}, skipped {skip}"
            );
        }
        assert_eq!(
            cmds.get(i),
            Some(&Command::FinishPhase {
                step: req.step,
                shape,
                layer,
                phase
            })
        );
        i += 1;
    }
    assert_eq!(cmds.get(i), Some(&Command::StepDone { step: req.step }));
    assert_eq!(cmds.len(), i + 1);
}

#[test]
fn decode_step_runs_every_phase_of_every_layer_then_the_output() {
    let mut s = Scheduler::new(&shape(), &ExecutionPlan::default()).unwrap();
    let req = request(1, 1, 0);
    let cmds = run_step(&mut s, req.clone());
    check_stream(&s, &req, &cmds);
    assert!(cmds
        .iter()
        .any(|c| matches!(c, Command::Compute { work, .. } if work.phase == Phase::FfnNeurons)));
    assert!(!s.is_busy());
}

#[test]
fn prefill_without_logits_skips_the_output_projection() {
    let mut s = Scheduler::new(&shape(), &ExecutionPlan::default()).unwrap();
    let req = request(7, 12, 12);
    let cmds = run_step(&mut s, req.clone());
    check_stream(&s, &req, &cmds);
    assert!(!cmds
        .iter()
        .any(|c| matches!(c, Command::Compute { work, .. } if work.phase == Phase::OutputRows)));
    assert!(cmds
        .iter()
        .any(|c| matches!(c, Command::Compute { work, .. } if work.phase == Phase::FfnDownRows)));
}

#[test]
fn bad_events_are_errors_not_panics() {
    let mut s = Scheduler::new(&shape(), &ExecutionPlan::default()).unwrap();
    let mut out = Vec::new();
    assert_eq!(
        s.on_event(Event::StepRequested(request(1, 0, 0)), &mut out),
        Err(ScheduleError::EmptyStep)
    );
    assert!(matches!(
        s.on_event(Event::StepRequested(request(1, 100_000, 0)), &mut out),
        Err(ScheduleError::StepTooLarge { .. })
    ));
    s.on_event(Event::StepRequested(request(1, 1, 0)), &mut out)
        .unwrap();
    assert_eq!(
        s.on_event(Event::StepRequested(request(2, 1, 0)), &mut out),
        Err(ScheduleError::Busy { running: 1, new: 2 })
    );
    let Some(Command::Compute { work, .. }) = out.first().cloned() else {
        panic!("first command is a Compute");
    };
    let wrong_layer = ClusterWork {
        layer: 2,
        ..work.clone()
    };
    assert!(matches!(
        s.on_event(Event::ClusterDone(wrong_layer), &mut out),
        Err(ScheduleError::UnexpectedCompletion(_))
    ));
    out.clear();
    s.on_event(Event::ClusterDone(work.clone()), &mut out)
        .unwrap();
    // The same completion twice would compute the next phase on stale data: refused.
    assert!(matches!(
        s.on_event(Event::ClusterDone(work), &mut out),
        Err(ScheduleError::UnexpectedCompletion(_))
    ));
    s.abort();
    assert!(!s.is_busy());
}

fn sizes() -> impl Strategy<Value = ClusterSizes> {
    (1u32..6, 1u32..5, 1u32..80, 1u32..200, 1u32..200, 1u32..120).prop_map(
        |(qkv_heads, attn_heads, attn_out_rows, ffn_neurons, ffn_rows, output_rows)| ClusterSizes {
            qkv_heads,
            attn_heads,
            attn_out_rows,
            ffn_neurons,
            ffn_rows,
            output_rows,
        },
    )
}

/// A plan with `n_groups` CPU groups; decode and prefill each on a non-empty subset of them
/// (bit masks), with the given weights.
fn multi_group_plan(
    n_groups: usize,
    decode_mask: u32,
    prefill_mask: u32,
    weights: &[u32],
) -> ExecutionPlan {
    use crate::plan::{CoreSet, GroupPlan, Share, XpuKind};
    let mut plan = ExecutionPlan {
        groups: (0..n_groups)
            .map(|g| GroupPlan {
                name: format!("g{g}"),
                kind: if g % 2 == 0 {
                    XpuKind::Cpu
                } else {
                    XpuKind::Npu
                },
                cores: CoreSet::Class("all".into()),
                threads: 0,
            })
            .collect(),
        ..ExecutionPlan::default()
    };
    let shares = |mask: u32| -> Vec<Share> {
        let mask = if mask.is_multiple_of(1 << n_groups) {
            1
        } else {
            mask % (1 << n_groups)
        };
        (0..n_groups)
            .filter(|g| mask & (1 << g) != 0)
            .map(|g| Share {
                group: format!("g{g}"),
                weight: weights[g],
            })
            .collect()
    };
    plan.decode_on = shares(decode_mask);
    plan.prefill_on = shares(prefill_mask);
    plan
}

/// Drives one step, completing in-flight Computes in the order `picks` chooses (each pick
/// selects one of the outstanding ones), and checks at every command that nothing runs
/// before its inputs and that no group ever holds more than one message.
fn run_step_in_random_order(
    s: &mut Scheduler,
    req: StepRequest,
    allowed: &[XpuId],
    picks: &[usize],
) -> (Vec<Command>, Vec<Event>) {
    let mut all = Vec::new();
    let mut events = vec![Event::StepRequested(req.clone())];
    let mut out = Vec::new();
    s.on_event(events[0].clone(), &mut out).unwrap();
    let mut outstanding: Vec<(XpuId, ClusterWork)> = Vec::new();
    let mut pick = picks.iter().cycle();
    loop {
        for cmd in out.drain(..) {
            match &cmd {
                Command::Compute { xpu, work } => {
                    assert!(
                        allowed.contains(xpu),
                        "{xpu:?} is not assigned this step's phases"
                    );
                    assert!(
                        outstanding.iter().all(|(x, _)| x != xpu),
                        "{xpu:?} got a second message while one is in flight"
                    );
                    assert!(
                        outstanding
                            .iter()
                            .all(|(_, w)| (w.layer, w.phase) == (work.layer, work.phase)),
                        "a phase started while an earlier one was still computing"
                    );
                    outstanding.push((*xpu, work.clone()));
                }
                Command::FinishPhase { .. } | Command::StepDone { .. } => {
                    assert!(outstanding.is_empty(), "finished with work still in flight");
                }
                Command::Load { .. } => panic!("a plan without a cache loads nothing"),
            }
            all.push(cmd);
        }
        if outstanding.is_empty() {
            break;
        }
        let i = pick.next().copied().unwrap_or(0) % outstanding.len();
        let (_, work) = outstanding.swap_remove(i);
        let event = Event::ClusterDone(work);
        events.push(event.clone());
        s.on_event(event, &mut out).unwrap();
    }
    (all, events)
}

#[test]
fn phases_are_shared_among_groups_by_weight() {
    let plan = multi_group_plan(3, 0b011, 0b110, &[3, 1, 1]);
    let s = Scheduler::new(&shape(), &plan).unwrap();
    let ffn = s
        .program(StepShape::Decode)
        .phase(Phase::FfnNeurons)
        .unwrap();
    // 160 neurons in clusters of 128 (a multiple of the granule 32) -> 2 clusters, 3:1.
    assert_eq!(ffn.parts, vec![(XpuId(0), 0..2)]);
    let qkv = s.program(StepShape::Decode).phase(Phase::QkvHeads).unwrap();
    // 8 head clusters, 3:1 -> 6 and 2.
    assert_eq!(qkv.parts, vec![(XpuId(0), 0..6), (XpuId(1), 6..8)]);
    let out = s
        .program(StepShape::Decode)
        .phase(Phase::AttnOutRows)
        .unwrap();
    // 64 rows in clusters of 64 -> 1 cluster: all of it to the heavier group.
    assert_eq!(out.parts, vec![(XpuId(0), 0..1)]);
    let qkv = s
        .program(StepShape::Prefill)
        .phase(Phase::QkvHeads)
        .unwrap();
    // 8 head clusters shared 1:1 between groups 1 and 2.
    assert_eq!(qkv.parts, vec![(XpuId(1), 0..4), (XpuId(2), 4..8)]);
}

proptest! {
    #[test]
    fn any_plan_and_step_computes_every_cluster_exactly_once(
        decode in sizes(),
        prefill in sizes(),
        n_layer in 1u32..5,
        n_tokens in 1u32..40,
        logits_at in 0u32..41,
    ) {
        let model = ModelShape { n_layer, ..shape() };
        let plan = ExecutionPlan { decode, prefill, ..ExecutionPlan::default() };
        let mut s = Scheduler::new(&model, &plan).unwrap();
        let req = request(3, n_tokens, logits_at.min(n_tokens));
        let first = run_step(&mut s, req.clone());
        check_stream(&s, &req, &first);
        // Same events, same commands.
        let mut again = Scheduler::new(&model, &plan).unwrap();
        prop_assert_eq!(run_step(&mut again, req), first);
    }

    /// Several groups complete their shares in any order: every cluster is still computed
    /// exactly once per layer and phase, no phase starts before the previous one is finished,
    /// no group holds two messages, and replaying the same events gives the same commands.
    #[test]
    fn random_completion_orders_keep_the_invariants(
        decode in sizes(),
        prefill in sizes(),
        n_groups in 1usize..5,
        decode_mask in 1u32..16,
        prefill_mask in 1u32..16,
        weights in prop::collection::vec(1u32..5, 4),
        n_layer in 1u32..4,
        n_tokens in 1u32..30,
        logits_at in 0u32..31,
        picks in prop::collection::vec(0usize..8, 1..64),
    ) {
        let model = ModelShape { n_layer, ..shape() };
        let plan = ExecutionPlan {
            decode,
            prefill,
            ..multi_group_plan(n_groups, decode_mask, prefill_mask, &weights)
        };
        let mut s = Scheduler::new(&model, &plan).unwrap();
        let req = request(5, n_tokens, logits_at.min(n_tokens));
        let on = if s.shape_for(n_tokens) == StepShape::Decode { &plan.decode_on } else { &plan.prefill_on };
        let allowed: Vec<XpuId> = on
            .iter()
            .map(|sh| XpuId(plan.group_index(&sh.group).unwrap() as u8))
            .collect();
        let (cmds, events) = run_step_in_random_order(&mut s, req.clone(), &allowed, &picks);
        check_stream(&s, &req, &cmds);
        prop_assert!(!s.is_busy());

        // Replay: the recorded events fed to a fresh scheduler give the identical commands.
        let mut fresh = Scheduler::new(&model, &plan).unwrap();
        let mut replayed = Vec::new();
        for e in events {
            fresh.on_event(e, &mut replayed).unwrap();
        }
        prop_assert_eq!(replayed, cmds);
    }
}

// ---- The neuron cache ----

use crate::cache::{CachePlan, CachePolicy};

/// The test model as a neuron store: its FFN clusters are bundles of `ffn_bundle` neurons.
fn store_shape(n_layer: u32, ffn_bundle: u32) -> ModelShape {
    ModelShape {
        n_layer,
        ffn_bundle,
        ..shape()
    }
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

/// Drives `steps` one after the other through a scheduler whose plan has a neuron cache,
/// delivering the outstanding completions (`ClusterDone` and `Loaded`) in the order `picks`
/// chooses (each pick selects one of them). Rebuilds the cache's contents from the `Load`
/// commands alone and checks, at every command:
/// - phases run in program order, every cluster of every phase is computed exactly once, and a
///   phase is finished only when all of its clusters are done;
/// - a streamed cluster (FFN, and the output projection when it streams) is computed only while
///   its bundle is in: loaded (`Loaded` received) and not evicted since;
/// - a load is for a unit the step needs, not resident, not yet loaded or computed in this
///   step, into a slot no other load in flight uses, names as evicted what the slot held,
///   evicts no unit that this step loaded or is computing and has not finished, keeps hot units
///   in their reserved slots, and at most `max_loads` loads are in flight;
/// - every step ends (no deadlock: something is always in flight until `StepDone`) with no
///   load in flight, and every unit it loaded computed;
/// - at the end, the cache's counters agree: hits + misses = streamed units the steps needed,
///   misses = loads, evictions = loads that evicted something (per layer).
///
/// Returns every command and every event fed, in order.
fn run_cached_steps(
    s: &mut Scheduler,
    plan: &ExecutionPlan,
    steps: &[StepRequest],
    picks: &[usize],
) -> (Vec<Command>, Vec<Event>) {
    let cache = plan.cache.clone().expect("a plan with a cache");
    let map = s.unit_map().expect("a scheduler with a cache").clone();
    let n_units = map.n_units() as usize;
    let n_layer = map.n_layer;
    let (hot_slot, n_hot) = hot_slots_of(&cache, &map);
    let mut slot_owner: Vec<Option<u32>> = vec![None; cache.slots as usize];
    let mut resident = vec![false; n_units];
    let mut loading: Vec<(u32, u32)> = Vec::new();
    let mut needed = vec![0u64; n_layer as usize + 1];
    let mut loads = vec![0u64; n_layer as usize + 1];
    let mut evictions = vec![0u64; n_layer as usize + 1];

    let mut all = Vec::new();
    let mut events = Vec::new();
    let mut pick = picks.iter().cycle();
    for req in steps {
        let shape = s.shape_for(req.n_tokens);
        let program = Arc::clone(s.program(shape));
        let on = match shape {
            StepShape::Decode => &plan.decode_on,
            StepShape::Prefill => &plan.prefill_on,
        };
        let allowed: Vec<XpuId> = on
            .iter()
            .map(|sh| XpuId(plan.group_index(&sh.group).unwrap() as u8))
            .collect();
        let mut expected = Vec::new();
        for layer in 0..n_layer {
            for p in &program.layer_phases {
                expected.push((layer, p.phase, p.clusters.len() as u32));
            }
        }
        if req.wants_logits() {
            expected.push((
                n_layer,
                Phase::OutputRows,
                program.output.clusters.len() as u32,
            ));
        }
        // Every FFN phase streams: its clusters are the bundles the cache numbers.
        assert_eq!(
            program.clusters(Phase::FfnNeurons).len() as u32,
            map.ffn_clusters
        );
        for n in needed.iter_mut().take(n_layer as usize) {
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
                needed[n_layer as usize] += u64::from(map.output_clusters);
            }
        }

        let mut pos = 0;
        let mut seen = vec![false; expected[0].2 as usize];
        let mut computing: Vec<ClusterWork> = Vec::new();
        // Per unit, in this step: a Load was issued; it is loaded-or-loading or computing and
        // not done yet; it was computed.
        let mut loaded_now = vec![false; n_units];
        let mut held = vec![false; n_units];
        let mut computed = vec![false; n_units];
        let mut pending: Vec<Event> = Vec::new();
        let mut done = false;

        let first = Event::StepRequested(req.clone());
        events.push(first.clone());
        let mut out = Vec::new();
        s.on_event(first, &mut out).unwrap();
        loop {
            for cmd in out.drain(..) {
                assert!(!done, "{cmd:?} after StepDone");
                match &cmd {
                    Command::Compute { xpu, work } => {
                        assert!(allowed.contains(xpu), "{xpu:?} has no share of {shape:?}");
                        let &(layer, phase, n) = expected
                            .get(pos)
                            .unwrap_or_else(|| panic!("{work:?} after the last phase"));
                        assert_eq!(
                            (work.step, work.shape, work.layer, work.phase),
                            (req.step, shape, layer, phase),
                            "compute out of phase order"
                        );
                        assert!(!work.clusters.is_empty() && work.clusters.end <= n);
                        for c in work.clusters.clone() {
                            assert!(
                                !seen[c as usize],
                                "cluster {c} of {phase:?} layer {layer} computed twice"
                            );
                            seen[c as usize] = true;
                            if map.streams(phase) {
                                let u = map.unit(layer, map.unit_cluster(phase, c)) as usize;
                                assert!(
                                    resident[u],
                                    "layer {layer} {phase:?} cluster {c} computed while its unit is not in"
                                );
                                held[u] = true;
                            }
                        }
                        computing.push(work.clone());
                        pending.push(Event::ClusterDone(work.clone()));
                    }
                    Command::FinishPhase { .. } => {
                        let &(layer, phase, _) = expected
                            .get(pos)
                            .unwrap_or_else(|| panic!("{cmd:?} after the last phase"));
                        assert_eq!(
                            cmd,
                            Command::FinishPhase {
                                step: req.step,
                                shape,
                                layer,
                                phase
                            }
                        );
                        assert!(
                            seen.iter().all(|&x| x),
                            "{phase:?} of layer {layer} finished incomplete"
                        );
                        assert!(computing.is_empty(), "finished with work in flight");
                        pos += 1;
                        seen = vec![false; expected.get(pos).map_or(0, |e| e.2) as usize];
                    }
                    Command::StepDone { step } => {
                        assert_eq!(*step, req.step);
                        assert_eq!(pos, expected.len(), "step done before its last phase");
                        assert!(computing.is_empty() && loading.is_empty());
                        assert!(held.iter().all(|&h| !h));
                        assert!((0..n_units).all(|u| !loaded_now[u] || computed[u]));
                        done = true;
                    }
                    &Command::Load {
                        step,
                        layer,
                        cluster,
                        slot,
                        evicted,
                        ref pages,
                        top_up,
                    } => {
                        assert_eq!(step, req.step);
                        assert!(
                            pages.is_none() && !top_up,
                            "{cmd:?}: a part without gate-first"
                        );
                        let needs = if layer < n_layer {
                            cluster < map.ffn_clusters + map.attn_units
                        } else {
                            layer == n_layer && req.wants_logits() && cluster < map.output_clusters
                        };
                        assert!(needs, "{cmd:?}: the step does not need that unit");
                        let u = map.unit(layer, cluster) as usize;
                        assert!(!loaded_now[u], "{cmd:?}: loaded twice in one step");
                        assert!(!computed[u], "{cmd:?}: loaded after it was computed");
                        assert!(!resident[u], "{cmd:?}: the unit is in already");
                        assert!(slot < cache.slots, "{cmd:?}: no such slot");
                        assert!(
                            loading.iter().all(|&(_, s)| s != slot),
                            "{cmd:?}: another load in flight targets that slot"
                        );
                        let victim = evicted.map(|(l, c)| map.unit(l, c));
                        assert_eq!(
                            slot_owner[slot as usize], victim,
                            "{cmd:?}: evicted is not what the slot held"
                        );
                        match hot_slot[u] {
                            Some(h) => assert_eq!(slot, h, "{cmd:?}: hot unit out of its slot"),
                            None => assert!(slot >= n_hot, "{cmd:?}: cold unit in a hot slot"),
                        }
                        if let Some(v) = victim {
                            let v = v as usize;
                            assert!(
                                !held[v],
                                "{cmd:?}: evicts a unit this step still needs after acquiring it"
                            );
                            assert!(hot_slot[v].is_none(), "{cmd:?}: evicts a hot unit");
                            resident[v] = false;
                            evictions[layer as usize] += 1;
                        }
                        slot_owner[slot as usize] = Some(u as u32);
                        loaded_now[u] = true;
                        held[u] = true;
                        loading.push((u as u32, slot));
                        assert!(
                            loading.len() <= cache.max_loads as usize,
                            "more than {} loads in flight",
                            cache.max_loads
                        );
                        loads[layer as usize] += 1;
                        pending.push(Event::Loaded {
                            step,
                            layer,
                            cluster,
                        });
                    }
                }
                all.push(cmd);
            }
            if done {
                break;
            }
            assert!(
                !pending.is_empty(),
                "deadlock: step {} waits with nothing in flight",
                req.step
            );
            let i = pick.next().copied().unwrap_or(0) % pending.len();
            let event = pending.swap_remove(i);
            match &event {
                Event::Loaded { layer, cluster, .. } => {
                    let u = map.unit(*layer, *cluster);
                    let at = loading.iter().position(|&(v, _)| v == u).unwrap();
                    let (_, slot) = loading.swap_remove(at);
                    assert_eq!(slot_owner[slot as usize], Some(u));
                    resident[u as usize] = true;
                }
                Event::ClusterDone(work) => {
                    let at = computing.iter().position(|w| w == work).unwrap();
                    computing.swap_remove(at);
                    if map.streams(work.phase) {
                        for c in work.clusters.clone() {
                            let u = map.unit(work.layer, map.unit_cluster(work.phase, c)) as usize;
                            held[u] = false;
                            computed[u] = true;
                        }
                    }
                }
                Event::StepRequested(_) | Event::FfnPredicted { .. } | Event::FfnPages { .. } => {
                    unreachable!()
                }
            }
            events.push(event.clone());
            s.on_event(event, &mut out).unwrap();
        }
        assert!(!s.is_busy());
    }

    let stats = s.cache_stats().expect("a scheduler with a cache");
    assert_eq!(stats.len(), n_layer as usize + 1);
    for (l, st) in stats.iter().enumerate() {
        assert_eq!(
            st.hits + st.misses,
            needed[l],
            "layer {l}: hits + misses are not the units needed"
        );
        assert_eq!(st.misses, loads[l], "layer {l}: misses are not the loads");
        assert_eq!(st.evictions, evictions[l], "layer {l}: evictions");
    }
    (all, events)
}

/// A plan for the store model with a cache; both shapes cut the output projection alike.
fn cached_plan(base: ExecutionPlan, output_rows: u32, cache: CachePlan) -> ExecutionPlan {
    let mut plan = base;
    plan.decode.output_rows = output_rows;
    plan.prefill.output_rows = output_rows;
    plan.cache = Some(cache);
    plan
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
            gate_first: false,
            gate_first_gap: 0,
        };
        let plan = cached_plan(ExecutionPlan::default(), 50, cache);
        let mut s = Scheduler::new(&model, &plan).unwrap();
        assert_eq!(s.unit_map().unwrap().n_units(), 12);
        // A prefill step with logits, then decode steps with and without.
        let steps = [request(1, 6, 5), request(2, 1, 0), request(3, 1, 1)];
        let (cmds, _) = run_cached_steps(&mut s, &plan, &steps, &[0, 3, 1]);
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Several steps (prefill and decode, with and without logits) through a scheduler with a
    /// random neuron cache, completing computes and loads in a random order: see
    /// [`run_cached_steps`] for what is checked. Replaying the same events on a fresh scheduler
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
            gate_first: false,
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
                let req = StepRequest { step: i as StepId + 1, n_tokens, n_past, logits_from };
                n_past += n_tokens;
                req
            })
            .collect();
        let mut s = Scheduler::new(&model, &plan).unwrap();
        prop_assert_eq!(s.unit_map().unwrap().n_units(), n_units);
        let (cmds, events) = run_cached_steps(&mut s, &plan, &steps, &picks);

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

/// Runs one step of a scheduler awaiting predictions the way a driver does: commands in order,
/// computes and loads completed at once, and after each layer's attention output the clusters
/// `needed(layer, cluster)` says. Returns every command.
fn run_predicted_step(
    s: &mut Scheduler,
    req: StepRequest,
    needed: &dyn Fn(u32, u32) -> bool,
) -> Vec<Command> {
    let n_clusters = s.unit_map().unwrap().ffn_clusters;
    let mut all = Vec::new();
    let mut queue = std::collections::VecDeque::new();
    let mut out = Vec::new();
    s.on_event(Event::StepRequested(req.clone()), &mut out)
        .unwrap();
    queue.extend(out.drain(..));
    while let Some(cmd) = queue.pop_front() {
        let event = match &cmd {
            Command::Compute { work, .. } => Some(Event::ClusterDone(work.clone())),
            Command::Load {
                step,
                layer,
                cluster,
                ..
            } => Some(Event::Loaded {
                step: *step,
                layer: *layer,
                cluster: *cluster,
            }),
            Command::FinishPhase {
                step, layer, phase, ..
            } if *phase == Phase::AttnOutRows && s.shape_for(req.n_tokens) == StepShape::Decode => {
                let mut bits = vec![0u64; (n_clusters as usize).div_ceil(64)];
                for c in (0..n_clusters).filter(|&c| needed(*layer, c)) {
                    bits[c as usize / 64] |= 1 << (c % 64);
                }
                Some(Event::FfnPredicted {
                    step: *step,
                    layer: *layer,
                    needed: bits,
                })
            }
            _ => None,
        };
        all.push(cmd);
        if let Some(event) = event {
            s.on_event(event, &mut out).unwrap();
            queue.extend(out.drain(..));
        }
    }
    all
}

/// The commands other than loads (what `check_stream` checks).
fn without_loads(cmds: &[Command]) -> Vec<Command> {
    cmds.iter()
        .filter(|c| !matches!(c, Command::Load { .. }))
        .cloned()
        .collect()
}

/// An LRU cache of `slots` slots for the 3-layer store model, no output streaming, awaiting
/// predictions: the predicted-decode tests' scheduler.
fn predicting_scheduler(slots: u32, max_loads: u32, stream_attention: bool) -> Scheduler {
    let cache = CachePlan {
        slots,
        hot_slots: 0,
        policy: CachePolicy::Lru,
        max_loads,
        stream_output: false,
        stream_attention,
        coalesce: 1,
        hot_units: Vec::new(),
        gate_first: false,
        gate_first_gap: 0,
    };
    let plan = cached_plan(ExecutionPlan::default(), 50, cache);
    let mut s = Scheduler::new(&store_shape(3, 32), &plan).unwrap();
    s.await_predictions(true);
    s
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
    let mut s = predicting_scheduler(3, 1, true);
    assert_eq!(s.unit_map().unwrap().n_units(), 3 * (5 + 4));
    let needed = |layer: u32, c: u32| (layer + c).is_multiple_of(2);
    let cmds = run_predicted_step(&mut s, request(1, 1, 0), &needed);
    let computes = without_loads(&cmds);
    check_stream_skipping(&s, &request(1, 1, 0), &computes, &|l, c| !needed(l, c));
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
    for (i, c) in cmds.iter().enumerate() {
        let Command::Compute { work, .. } = c else {
            continue;
        };
        let map = s.unit_map().unwrap();
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
    assert!(!s.is_busy());
}

#[test]
fn decode_with_predictions_loads_only_the_predicted_clusters() {
    // 3 layers of 5 bundles of 32 neurons; 4 slots, no hot segment: every needed cluster misses.
    let mut s = predicting_scheduler(4, 2, false);
    assert!(s.awaits_predictions());
    let needed = |layer: u32, c: u32| (layer + c).is_multiple_of(3);
    let cmds = run_predicted_step(&mut s, request(1, 1, 0), &needed);
    // Every needed cluster computed once, the skipped ones never, phases in order (loads
    // aside).
    let computes = without_loads(&cmds);
    check_stream_skipping(&s, &request(1, 1, 0), &computes, &|l, c| !needed(l, c));
    let loaded = loaded_units(&cmds);
    let expected: Vec<(u32, u32)> = (0..3)
        .flat_map(|l| (0..5).map(move |c| (l, c)))
        .filter(|&(l, c)| needed(l, c))
        .collect();
    assert_eq!(loaded, expected, "only predicted clusters are read");
    // A layer's loads come after its prediction, never before.
    for (i, c) in cmds.iter().enumerate() {
        if let Command::Load { layer, .. } = c {
            let predicted_at = cmds.iter().position(|c| {
                matches!(c, Command::FinishPhase { layer: l, phase: Phase::AttnOutRows, .. } if l == layer)
            });
            assert!(
                predicted_at.is_some_and(|p| p < i),
                "load {c:?} before its prediction"
            );
        }
    }
    // A layer whose clusters are all skipped finishes its FFN phase on the prediction alone.
    let half_but_layer_1 = |l: u32, c: u32| l != 1 && c.is_multiple_of(2);
    let cmds = run_predicted_step(&mut s, request(10, 1, 1), &half_but_layer_1);
    let computes = without_loads(&cmds);
    check_stream_skipping(&s, &request(10, 1, 1), &computes, &|l, c| {
        !half_but_layer_1(l, c)
    });
    assert!(!s.is_busy());
    // Prefill steps do not wait: every cluster is loaded, no prediction asked for.
    let cmds = run_predicted_step(&mut s, request(2, 6, 5), &|_, _| false);
    let loads = cmds
        .iter()
        .filter(|c| matches!(c, Command::Load { .. }))
        .count();
    assert_eq!(loads, 15);
    // A prediction out of turn is an error, not a hang or a panic.
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
        gate_first: true,
        gate_first_gap: gap,
    };
    cached_plan(ExecutionPlan::default(), 50, cache)
}

/// What a driver's slots hold, as the loads it carries out leave them: each slot's unit and
/// pages. It answers the scheduler's commands (completions in the order `pick` says), feeds
/// `FfnPages` from `wanted` after each `FfnGateRows` finish, and checks that every cluster is
/// computed only once the pages it reads are in its slot.
struct PageDriver {
    bundle_pages: u32,
    slot_unit: Vec<Option<u32>>,
    slot_pages: Vec<std::collections::BTreeSet<u32>>,
    /// Pages read, over the driver's life.
    pages_read: u64,
    gap: u32,
}

impl PageDriver {
    fn new(slots: u32, bundle_pages: u32, gap: u32) -> PageDriver {
        PageDriver {
            gap,
            bundle_pages,
            slot_unit: vec![None; slots as usize],
            slot_pages: vec![Default::default(); slots as usize],
            pages_read: 0,
        }
    }

    fn slot_of(&self, unit: u32) -> Option<usize> {
        self.slot_unit.iter().position(|&u| u == Some(unit))
    }

    /// Runs one step to its end; returns the FFN clusters computed per phase as
    /// (layer, cluster, phase).
    fn run_step(
        &mut self,
        s: &mut Scheduler,
        req: StepRequest,
        wanted: &dyn Fn(u32, u32, u32) -> bool,
        pick: &mut dyn Iterator<Item = usize>,
    ) -> Vec<(u32, u32, Phase)> {
        let map = s.unit_map().unwrap().clone();
        let gate_pages = 2;
        let per = self.bundle_pages;
        let mut computed = Vec::new();
        let mut pending: Vec<Event> = Vec::new();
        let mut out = Vec::new();
        s.on_event(Event::StepRequested(req.clone()), &mut out)
            .unwrap();
        let mut done = false;
        loop {
            for cmd in std::mem::take(&mut out) {
                match cmd {
                    Command::Load {
                        step,
                        layer,
                        cluster,
                        slot,
                        evicted,
                        pages,
                        top_up,
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
                        let pages = pages.unwrap_or(0..if is_bundle { per } else { 1 });
                        assert!(pages.start < pages.end && pages.end <= per.max(1));
                        if req.n_tokens == 1 && top_up && self.gap == 0 {
                            // A decode step reads only pages its slot lacks (unless the
                            // pages between two runs come along).
                            for p in pages.clone() {
                                assert!(
                                    !self.slot_pages[slot].contains(&p),
                                    "page {p} of {layer}/{cluster} read again"
                                );
                            }
                        }
                        self.pages_read += pages.len() as u64;
                        self.slot_pages[slot].extend(pages);
                        pending.push(Event::Loaded {
                            step,
                            layer,
                            cluster,
                        });
                    }
                    Command::Compute { work, .. } => {
                        if map.streams(work.phase) {
                            for c in work.clusters.clone() {
                                let uc = map.unit_cluster(work.phase, c);
                                let unit = map.unit(work.layer, uc);
                                let slot = self.slot_of(unit).expect("computed without a slot");
                                let have = &self.slot_pages[slot];
                                let ffn =
                                    matches!(work.phase, Phase::FfnNeurons | Phase::FfnGateRows);
                                if work.phase == Phase::FfnGateRows {
                                    assert!(
                                        (0..gate_pages).all(|p| have.contains(&p)),
                                        "{work:?}: gate pages missing"
                                    );
                                } else if ffn && req.n_tokens == 1 {
                                    for p in (0..per).filter(|&p| wanted(work.layer, c, p)) {
                                        assert!(have.contains(&p), "{work:?}: page {p} missing");
                                    }
                                } else if ffn {
                                    assert!(
                                        (0..per).all(|p| have.contains(&p)),
                                        "{work:?}: prefill of a partial bundle"
                                    );
                                }
                                if ffn {
                                    computed.push((work.layer, c, work.phase));
                                }
                            }
                        }
                        pending.push(Event::ClusterDone(work));
                    }
                    Command::FinishPhase {
                        step, layer, phase, ..
                    } if phase == Phase::FfnGateRows
                        || (phase == Phase::AttnOutRows
                            && req.n_tokens == 1
                            && s.reads_predicted_pages()) =>
                    {
                        let mut bits = vec![0u64; (map.ffn_clusters * per).div_ceil(64) as usize];
                        for c in 0..map.ffn_clusters {
                            for p in (0..per).filter(|&p| wanted(layer, c, p)) {
                                let i = (c * per + p) as usize;
                                bits[i / 64] |= 1 << (i % 64);
                            }
                        }
                        // The pages come right after the finish, before any other event.
                        let event = Event::FfnPages {
                            step,
                            layer,
                            pages: bits,
                        };
                        let mut more = Vec::new();
                        s.on_event(event, &mut more).unwrap();
                        out.extend(more);
                    }
                    Command::StepDone { .. } => done = true,
                    Command::FinishPhase { .. } => {}
                }
            }
            if !out.is_empty() {
                continue;
            }
            if done {
                break;
            }
            assert!(!pending.is_empty(), "deadlock in step {}", req.step);
            let i = pick.next().unwrap_or(0) % pending.len();
            let event = pending.swap_remove(i);
            s.on_event(event, &mut out).unwrap();
        }
        assert!(!s.is_busy());
        computed
    }
}

#[test]
fn gate_first_reads_gate_pages_then_only_the_wanted_ones() {
    let shape = gate_first_shape();
    // 5 bundles a layer: 6 slots, 1 hot; 3 loads ahead.
    let plan = gate_first_plan(6, 1, 3, false, 0);
    let mut s = Scheduler::new(&shape, &plan).unwrap();
    assert!(s.gate_first());
    assert_eq!(s.bundle_pages(), 8);
    let decode = s.program(StepShape::Decode);
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
    assert!(!s.program(StepShape::Prefill).is_gate_first());
    let mut d = PageDriver::new(6, 8, 0);
    // Cluster 1 of every layer wants nothing; the others their odd pages past the gate.
    let wanted = |_l: u32, c: u32, p: u32| c != 1 && p >= 2 && p % 2 == 1;
    let computed = d.run_step(&mut s, request(1, 1, 0), &wanted, &mut std::iter::empty());
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
    let mut s = Scheduler::new(&shape, &gate_first_plan(6, 1, 3, false, 1)).unwrap();
    let mut d = PageDriver::new(6, 8, 1);
    d.run_step(&mut s, request(1, 1, 0), &wanted, &mut std::iter::empty());
    assert_eq!(d.pages_read, 3 * (5 * 2 + 4 * 5) + 2);
    // A prefill step after it reads every bundle whole (tops up the partial ones).
    let before = d.pages_read;
    let computed = d.run_step(&mut s, request(2, 4, 1), &wanted, &mut std::iter::empty());
    assert_eq!(computed.len(), 15);
    assert!(d.pages_read > before);
    // Unexpected pages are an error, not a hang.
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
    // refused (not a deadlock). Prefill, and predicted pages (no gate phase), run.
    let mut s = Scheduler::new(&shape, &gate_first_plan(6, 2, 1, false, 0)).unwrap();
    let mut out = Vec::new();
    assert_eq!(
        s.on_event(Event::StepRequested(request(1, 1, 0)), &mut out),
        Err(ScheduleError::GateFirstSlots { need: 5, cold: 4 })
    );
    let mut d = PageDriver::new(6, 8, 0);
    d.run_step(
        &mut s,
        request(2, 4, 0),
        &|_, _, _| true,
        &mut std::iter::empty(),
    );
    s.await_predictions(true);
    d.run_step(
        &mut s,
        request(3, 1, 4),
        &|_, _, p| p < 3,
        &mut std::iter::empty(),
    );
    let plain = store_shape(3, 32);
    assert_eq!(
        Scheduler::new(&plain, &gate_first_plan(8, 0, 1, false, 0)).err(),
        Some(ScheduleError::GateFirstWithoutStore)
    );
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
        let mut s = Scheduler::new(&shape, &plan).unwrap();
        let mut d = PageDriver::new(slots, 8, gap);
        let wanted = |l: u32, c: u32, p: u32| {
            let h = (u64::from(l) * 131 + u64::from(c) * 31 + u64::from(p)).wrapping_mul(seed | 1);
            p >= 2 && (h >> 17) % 3 == 0
        };
        let mut pick = picks.iter().copied().cycle();
        for (step, req) in [request(1, 1, 0), request(2, 1, 1), request(3, 6, 2), request(4, 1, 8)]
            .into_iter()
            .enumerate()
        {
            let computed = d.run_step(&mut s, req.clone(), &wanted, &mut pick);
            if req.n_tokens == 1 {
                for l in 0..3 {
                    for c in 0..5 {
                        let needs = (0..8).any(|p| wanted(l, c, p));
                        prop_assert!(computed.contains(&(l, c, Phase::FfnGateRows)));
                        prop_assert_eq!(
                            computed.iter().filter(|&&x| x == (l, c, Phase::FfnNeurons)).count(),
                            usize::from(needs),
                            "step {} layer {} cluster {}", step, l, c
                        );
                    }
                }
            }
        }
        // With every unit in a slot of its own, a repeated decode reads nothing.
        let all = 3 * 5 + 2 + if stream_attention { 12 } else { 0 };
        let plan = gate_first_plan(all, all, max_loads, stream_attention, gap);
        let mut s = Scheduler::new(&shape, &plan).unwrap();
        let mut d = PageDriver::new(all, 8, gap);
        d.run_step(&mut s, request(1, 1, 0), &wanted, &mut pick);
        let first = d.pages_read;
        d.run_step(&mut s, request(2, 1, 1), &wanted, &mut pick);
        prop_assert_eq!(d.pages_read, first);
    }
}

#[test]
fn predicted_pages_are_read_in_one_phase() {
    let shape = gate_first_shape();
    let mut s = Scheduler::new(&shape, &gate_first_plan(6, 1, 3, false, 0)).unwrap();
    s.await_predictions(true);
    assert!(s.reads_predicted_pages());
    // No gate phase: the predicted neurons' pages come with the predictions.
    assert!(!s.program(StepShape::Decode).is_gate_first());
    let mut d = PageDriver::new(6, 8, 0);
    // Cluster 2 of every layer has no predicted neuron; the others pages 1 and 6.
    let wanted = |_l: u32, c: u32, p: u32| c != 2 && (p == 1 || p == 6);
    let computed = d.run_step(&mut s, request(1, 1, 0), &wanted, &mut std::iter::empty());
    for l in 0..3 {
        for c in 0..5 {
            assert_eq!(computed.contains(&(l, c, Phase::FfnNeurons)), c != 2);
            assert!(!computed.contains(&(l, c, Phase::FfnGateRows)));
        }
    }
    // 2 pages of 4 clusters a layer, a page per output cluster.
    assert_eq!(d.pages_read, 3 * 4 * 2 + 2);
    // A prefill reads whole bundles; a decode after it finds its pages in.
    d.run_step(&mut s, request(2, 4, 1), &wanted, &mut std::iter::empty());
    let before = d.pages_read;
    d.run_step(&mut s, request(3, 1, 5), &wanted, &mut std::iter::empty());
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
        let mut s = Scheduler::new(&shape, &plan).unwrap();
        s.await_predictions(true);
        let mut d = PageDriver::new(slots, 8, gap);
        let wanted = |l: u32, c: u32, p: u32| {
            let h = (u64::from(l) * 131 + u64::from(c) * 31 + u64::from(p)).wrapping_mul(seed | 1);
            (h >> 17) % 3 == 0
        };
        let mut pick = picks.iter().copied().cycle();
        for req in [request(1, 1, 0), request(2, 1, 1), request(3, 6, 2), request(4, 1, 8)] {
            let computed = d.run_step(&mut s, req.clone(), &wanted, &mut pick);
            if req.n_tokens == 1 {
                for l in 0..3 {
                    for c in 0..5 {
                        let needs = (0..8).any(|p| wanted(l, c, p));
                        prop_assert_eq!(
                            computed.iter().filter(|&&x| x == (l, c, Phase::FfnNeurons)).count(),
                            usize::from(needs)
                        );
                    }
                }
            }
        }
    }
}

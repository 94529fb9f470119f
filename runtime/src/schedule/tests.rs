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
        assert!(
            seen.iter().all(|&x| x),
            "{phase:?} of layer {layer} incomplete"
        );
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

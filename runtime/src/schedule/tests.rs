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
}

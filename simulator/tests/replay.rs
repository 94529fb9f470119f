//! Replay: a simulated trace replays to identical commands; a tampered one says where.

mod common;

use common::{pc, phone, phone_plan, run, workload};
use conductor_runtime::plan::ExecutionPlan;
use conductor_runtime::schedule::{Command, Event, ScheduleError};
use conductor_simulator::{check_trace_model, named_shape, replay, ReplayError};
use proptest::prelude::*;

#[test]
fn a_simulated_trace_replays_identically() {
    for (profile, plan) in [(pc(), ExecutionPlan::default()), (phone(), phone_plan())] {
        let r = run(&profile, &plan, &workload("smollm2-135m", 600, 5));
        let rep = replay(&r.trace).unwrap();
        assert!(rep.is_identical(), "{:?}", rep.first_mismatch);
        assert_eq!(rep.records, r.trace.records.len());
        assert_eq!(rep.matched, rep.records);
        assert_eq!(
            rep.commands,
            r.trace
                .records
                .iter()
                .map(|x| x.commands.len())
                .sum::<usize>()
        );
    }
}

#[test]
fn a_tampered_command_is_reported_where_it_is() {
    let r = run(
        &pc(),
        &ExecutionPlan::default(),
        &workload("smollm2-135m", 10, 2),
    );
    let mut t = r.trace.clone();
    let (index, command) = t
        .records
        .iter_mut()
        .enumerate()
        .filter_map(|(i, rec)| {
            rec.commands
                .iter_mut()
                .find(|c| matches!(c, Command::Compute { .. }))
                .map(|c| (i, c))
        })
        .nth(7)
        .unwrap();
    let Command::Compute { work, .. } = command else {
        unreachable!()
    };
    work.clusters.end += 1;
    let expected = t.records[index].commands.clone();
    let rep = replay(&t).unwrap();
    assert!(!rep.is_identical());
    assert_eq!(rep.mismatched, 1, "only the tampered record differs");
    let m = rep.first_mismatch.unwrap();
    assert_eq!(m.record, index);
    assert_eq!(m.expected, expected);
    assert_eq!(m.got, r.trace.records[index].commands);
    assert_eq!(m.error, None);

    // A dropped command.
    let mut t = r.trace.clone();
    t.records[3].commands.pop();
    let m = replay(&t).unwrap().first_mismatch.unwrap();
    assert_eq!(m.record, 3);
}

#[test]
fn a_tampered_event_is_refused_and_reported() {
    let r = run(
        &pc(),
        &ExecutionPlan::default(),
        &workload("smollm2-135m", 0, 2),
    );
    let mut t = r.trace.clone();
    let Event::ClusterDone(work) = &mut t.records[5].event else {
        panic!("record 5 is a completion")
    };
    work.layer += 1;
    let rep = replay(&t).unwrap();
    let m = rep.first_mismatch.unwrap();
    assert_eq!(m.record, 5);
    assert!(matches!(
        m.error,
        Some(ScheduleError::UnexpectedCompletion(_))
    ));
    assert!(m.got.is_empty());
    assert!(rep.mismatched >= 1);
}

#[test]
fn a_trace_with_an_unusable_plan_is_an_error() {
    let r = run(
        &pc(),
        &ExecutionPlan::default(),
        &workload("smollm2-135m", 0, 1),
    );
    let mut t = r.trace.clone();
    t.header.plan.decode.ffn_neurons = 0;
    let e = replay(&t).unwrap_err();
    assert!(matches!(e, ReplayError::Header(_)));
    assert!(e.to_string().contains("decode.ffn_neurons"), "{e}");
}

#[test]
fn a_trace_for_another_model_is_named() {
    let r = run(
        &pc(),
        &ExecutionPlan::default(),
        &workload("smollm2-135m", 0, 1),
    );
    check_trace_model(&r.trace, &named_shape("smollm2-135m").unwrap()).unwrap();
    let mut renamed = named_shape("smollm2-135m").unwrap();
    renamed.name = "SmolLM2 135M Instruct".into();
    check_trace_model(&r.trace, &renamed).expect("names may differ");
    let e = check_trace_model(&r.trace, &named_shape("llama-2-7b").unwrap()).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("`smollm2-135m`") && msg.contains("`llama-2-7b`"),
        "{msg}"
    );
    assert!(
        msg.starts_with("the trace was recorded for model `smollm2-135m`"),
        "{msg}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Any plan the scheduler accepts, any threads: the simulated trace replays identically
    /// and runs every step.
    #[test]
    fn random_plans_simulate_and_replay(
        ffn in 1u32..700, rows in 1u32..600, out in 1u32..30_000, qkv in 1u32..8,
        attn in 1u32..10, prefill_max in 2u32..80, threads in 1u32..12,
        decode_weights in (1u32..5, 1u32..5), phone_machine in any::<bool>(),
        p in 0u32..150, n in 1u32..4,
    ) {
        let (profile, mut plan) = if phone_machine {
            (phone(), phone_plan())
        } else {
            (pc(), ExecutionPlan::default())
        };
        for s in [&mut plan.decode, &mut plan.prefill] {
            s.ffn_neurons = ffn;
            s.ffn_rows = rows;
            s.attn_out_rows = rows;
            s.output_rows = out;
            s.qkv_heads = qkv;
            s.attn_heads = attn;
        }
        plan.prefill_max_tokens = prefill_max;
        if phone_machine {
            plan.decode_on[0].weight = decode_weights.0;
            plan.decode_on[1].weight = decode_weights.1;
        }
        let mut w = workload("smollm2-135m", p, n);
        w.threads = Some(threads);
        let r = run(&profile, &plan, &w);
        prop_assert_eq!(r.steps.len() as u32, p.div_ceil(prefill_max) + n);
        let rep = replay(&r.trace).unwrap();
        prop_assert!(rep.is_identical(), "{:?}", rep.first_mismatch);
        prop_assert!(r.trace.records.windows(2).all(|w| w[0].t_ns <= w[1].t_ns));
    }
}

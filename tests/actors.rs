//! The actor driver as a system: supervision (a failing actor fails the request in flight and
//! the engine serves the next one, never a hang), trace recording and replay, and the storage
//! actor's reads.

use conductor::actors::{ActorDriver, ActorOptions};
use conductor::runtime::exec::{ffn_plan_of, Driver, Session, StepError};
use conductor::runtime::gguf::GgufFile;
use conductor::runtime::model::Model;
use conductor::runtime::plan::{ExecutionPlan, Topology};
use conductor::runtime::quant::Kernels;
use conductor::runtime::schedule::{Event, Scheduler};
use conductor::runtime::synthetic::{synthetic_model, SyntheticSpec};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

fn spec() -> SyntheticSpec {
    SyntheticSpec {
        n_layer: 2,
        n_embd: 128,
        n_ff: 256,
        n_head: 4,
        n_head_kv: 2,
        ..SyntheticSpec::default()
    }
}

/// The synthetic model, written to a file (the storage actor reads files).
fn model_file() -> (PathBuf, Arc<Model>) {
    let bytes = synthetic_model(&spec()).unwrap().to_bytes().unwrap();
    let path = std::env::temp_dir().join(format!("conductor-actors-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let model = Arc::new(Model::from_gguf(GgufFile::from_bytes(bytes).unwrap()).unwrap());
    (path, model)
}

fn driver(model: &Arc<Model>, path: Option<PathBuf>) -> ActorDriver {
    ActorDriver::new(
        Arc::clone(model),
        &ExecutionPlan::default(),
        ffn_plan_of(model, &ExecutionPlan::default()).unwrap(),
        Kernels::best(),
        ActorOptions {
            threads: Some(2),
            topology: Some(Topology::uniform(2)),
            no_pinning: true,
            model_path: path,
        },
    )
    .unwrap()
}

/// Runs `f` on another thread and fails the test if it does not finish in time: a hang is a
/// failure, not a stuck CI job.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(value) => value,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("{what} hung"),
        // The body panicked: fail with its message.
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Err(payload) => std::panic::resume_unwind(payload),
            Ok(()) => unreachable!("the body returned without sending"),
        },
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const PROMPT: [u32; 5] = [3, 17, 42, 5, 99];

#[test]
fn a_panicking_group_fails_the_step_and_the_engine_serves_the_next() {
    within("supervision after a panic", || {
        let (path, model) = model_file();
        let mut d = driver(&model, None);
        let mut session = Session::new(&model, 64).unwrap();
        let expected = bits(d.eval_last(&mut session, &PROMPT).unwrap());

        let mut session = Session::new(&model, 64).unwrap();
        assert!(d.inject_panic("cpu"));
        let err = d.eval_last(&mut session, &[7]).unwrap_err();
        assert!(
            matches!(&err, StepError::Actor { actor, why } if actor == "cpu" && why.contains("injected fault")),
            "{err}"
        );
        assert_eq!(
            session.n_past(),
            0,
            "a failed step leaves the session as it was"
        );
        // The next request is served, with the same numbers as before.
        let again = bits(d.eval_last(&mut session, &PROMPT).unwrap());
        assert_eq!(again, expected);

        // The dense backend's actor too (prefill runs there).
        let mut session = Session::new(&model, 64).unwrap();
        assert!(d.inject_panic("npu"));
        assert!(d.eval_last(&mut session, &PROMPT).is_err());
        assert_eq!(bits(d.eval_last(&mut session, &PROMPT).unwrap()), expected);
        let _ = std::fs::remove_file(path);
    });
}

/// A step that outlives the plan's deadline (here: its host held by a stuck future) fails
/// instead of hanging; the stuck host is let go, the next step runs on a fresh one and gives
/// the same bits.
#[test]
fn a_step_past_its_deadline_fails_and_a_stuck_host_is_replaced() {
    within("a stuck host", || {
        let (path, model) = model_file();
        let plan = ExecutionPlan {
            step_deadline_ms: 300,
            ..ExecutionPlan::default()
        };
        let mut d = ActorDriver::new(
            Arc::clone(&model),
            &plan,
            ffn_plan_of(&model, &plan).unwrap(),
            Kernels::best(),
            ActorOptions {
                threads: Some(2),
                topology: Some(Topology::uniform(2)),
                no_pinning: true,
                model_path: None,
            },
        )
        .unwrap();
        let mut session = Session::new(&model, 64).unwrap();
        let expected = bits(d.eval_last(&mut session, &PROMPT).unwrap());
        let mut session = Session::new(&model, 64).unwrap();
        // The host stays stuck until `release` says: every answer below that comes while it is
        // still held came without waiting for it.
        let (release, held) = std::sync::mpsc::channel();
        d.stall_group_host("cpu", held).unwrap();
        let err = d.eval_last(&mut session, &PROMPT).unwrap_err();
        assert!(
            matches!(&err, StepError::Actor { why, .. } if why.contains("did not finish within 300 ms")),
            "{err}"
        );
        assert_eq!(session.n_past(), 0);
        // The host is still stuck: the restart replaces it rather than waiting for it.
        assert_eq!(bits(d.eval_last(&mut session, &PROMPT).unwrap()), expected);
        release.send(()).unwrap_or(()); // the abandoned host may be gone already
        let _ = std::fs::remove_file(path);
    });
}

/// Plans written before `step_deadline_ms` existed load with the generous default.
#[test]
fn plans_without_a_deadline_get_the_default() {
    let mut json = serde_json::to_value(ExecutionPlan::default()).unwrap();
    json.as_object_mut().unwrap().remove("step_deadline_ms");
    let plan: ExecutionPlan = serde_json::from_value(json).unwrap();
    assert_eq!(
        plan.step_deadline_ms,
        conductor::runtime::plan::DEFAULT_STEP_DEADLINE_MS
    );
}

#[test]
fn a_killed_group_fails_the_step_instead_of_hanging_and_is_replaced() {
    within("supervision after a kill", || {
        let (path, model) = model_file();
        let mut d = driver(&model, None);
        let mut session = Session::new(&model, 64).unwrap();
        let expected = bits(d.eval_last(&mut session, &PROMPT).unwrap());
        let mut session = Session::new(&model, 64).unwrap();
        assert!(d.kill_group("cpu"));
        std::thread::sleep(Duration::from_millis(20));
        // One token: a decode step, which runs on the CPU group.
        let err = d.eval_last(&mut session, &[1]).unwrap_err();
        assert!(matches!(err, StepError::Actor { .. }), "{err}");
        assert_eq!(bits(d.eval_last(&mut session, &PROMPT).unwrap()), expected);
        assert!(!d.kill_group("gpu"), "no such group");
        let _ = std::fs::remove_file(path);
    });
}

#[test]
fn a_recorded_trace_replays_to_the_identical_command_stream() {
    within("trace recording", || {
        let (path, model) = model_file();
        let mut d = driver(&model, None);
        let mut session = Session::new(&model, 64).unwrap();
        d.start_trace();
        d.eval_last(&mut session, &PROMPT).unwrap();
        for t in [4, 8, 15] {
            d.eval_last(&mut session, &[t]).unwrap();
        }
        let trace = d.take_trace();
        // 1 prefill + 3 decode steps, each: a request, then one completion per compute.
        let requests = trace
            .records
            .iter()
            .filter(|r| matches!(r.event, Event::StepRequested(_)))
            .count();
        assert_eq!(requests, 4);
        assert_eq!(
            trace.activity.len(),
            3,
            "one activity record per decode step"
        );
        assert!(
            trace.spans.iter().any(|s| s.track == "npu"),
            "prefill ran on the NPU"
        );
        assert!(
            trace.spans.iter().any(|s| s.track == "cpu"),
            "decode ran on the CPU group"
        );
        assert!(trace.spans.iter().any(|s| s.track == "scheduler"));
        assert!(trace.records.windows(2).all(|w| w[0].t_ns <= w[1].t_ns));
        assert_eq!(trace.header.model, model.description());

        let mut fresh = Scheduler::new(&trace.header.model.shape, &trace.header.plan).unwrap();
        for r in &trace.records {
            let mut out = Vec::new();
            fresh.on_event(r.event.clone(), &mut out).unwrap();
            assert_eq!(out, r.commands);
        }
        // And through the file format.
        let file = std::env::temp_dir().join(format!("conductor-trace-{}.bin", std::process::id()));
        trace.save(&file).unwrap();
        let back = conductor::runtime::trace::Trace::load(&file).unwrap();
        assert_eq!(back.records, trace.records);
        let _ = std::fs::remove_file(file);
        let _ = std::fs::remove_file(path);
    });
}

#[test]
fn the_storage_actor_reads_the_model_file() {
    within("storage reads", || {
        let (path, model) = model_file();
        let d = driver(&model, Some(path.clone()));
        let file = std::fs::read(&path).unwrap();
        for (offset, len) in [(0usize, 4usize), (100, 5000), (file.len() - 10, 10)] {
            let got = d.read_model_bytes(offset as u64, len).unwrap();
            assert_eq!(got, file[offset..offset + len]);
        }
        let err = d.read_model_bytes(file.len() as u64 - 4, 100).unwrap_err();
        assert!(err.to_string().contains("storage"), "{err}");
        let without = driver(&model, None);
        assert!(without.read_model_bytes(0, 4).is_err());
        let _ = std::fs::remove_file(path);
    });
}

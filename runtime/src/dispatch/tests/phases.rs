//! Steps, phases and processor groups, without a cache.

use super::*;

#[test]
fn decode_step_runs_every_phase_of_every_layer_then_the_output() {
    let s = Scheduler::new(&shape(), &ExecutionPlan::default()).unwrap();
    let req = request(1, 1, 0);
    let (cmds, s) = run_step(s, &shape(), req.clone());
    check_stream(&s, &req, &cmds);
    assert!(cmds
        .iter()
        .any(|c| matches!(c, Command::Compute { work, .. } if work.phase == Phase::FfnNeurons)));
    assert!(!s.is_busy());
}

/// A multi-sequence step (one token per sequence) runs in the decode shape however many
/// tokens it has, with logits for every token; one that is not one token per sequence is
/// refused and leaves the scheduler free.
#[test]
fn a_multi_sequence_step_runs_in_the_decode_shape_whatever_its_size() {
    let s = Scheduler::new(&shape(), &ExecutionPlan::default()).unwrap();
    assert_eq!(s.shape_for(12), StepShape::Prefill);
    let req = StepRequest {
        sequences: 12,
        resident_only: false,
        ..request(3, 12, 0)
    };
    assert_eq!(s.shape_of(&req), StepShape::Decode);
    let (cmds, mut s) = run_step(s, &shape(), req.clone());
    check_stream(&s, &req, &cmds);
    assert!(cmds
        .iter()
        .any(|c| matches!(c, Command::Compute { work, .. }
        if work.phase == Phase::FfnNeurons && work.shape == StepShape::Decode)));
    assert!(!cmds
        .iter()
        .any(|c| matches!(c, Command::Compute { work, .. } if work.phase == Phase::FfnDownRows)));
    assert!(cmds
        .iter()
        .any(|c| matches!(c, Command::Compute { work, .. } if work.phase == Phase::OutputRows)));
    let mut out = Vec::new();
    for sequences in [0, 5] {
        let bad = StepRequest {
            sequences,
            resident_only: false,
            ..request(4, 12, 0)
        };
        assert_eq!(
            s.on_event(Event::StepRequested(bad), &mut out),
            Err(ScheduleError::BadSequences {
                n_tokens: 12,
                sequences
            })
        );
        assert!(out.is_empty() && !s.is_busy());
    }
}

#[test]
fn prefill_without_logits_skips_the_output_projection() {
    let s = Scheduler::new(&shape(), &ExecutionPlan::default()).unwrap();
    let req = request(7, 12, 12);
    let (cmds, s) = run_step(s, &shape(), req.clone());
    check_stream(&s, &req, &cmds);
    assert!(!cmds
        .iter()
        .any(|c| matches!(c, Command::Compute { work, .. } if work.phase == Phase::OutputRows)));
    assert!(cmds
        .iter()
        .any(|c| matches!(c, Command::Compute { work, .. } if work.phase == Phase::FfnDownRows)));
}

/// A shape from a trace or a description file whose widths are each small but whose product
/// wraps a u32 (65536 heads of 65536 dimensions), or with absurd layer counts, is refused
/// naming the field, before any program is cut.
#[test]
fn shapes_beyond_the_limits_are_refused_naming_the_field() {
    let plan = ExecutionPlan::default();
    let refused = |s: ModelShape| match Scheduler::new(&s, &plan) {
        Err(ScheduleError::ShapeTooLarge(why)) => why,
        other => panic!("{:?}", other.map(|_| ())),
    };
    let why = refused(ModelShape {
        n_head: 1 << 16,
        n_head_kv: 1 << 16,
        head_dim: 1 << 16,
        ..shape()
    });
    assert!(why.contains("n_head x head_dim"), "{why}");
    let why = refused(ModelShape {
        n_layer: u32::MAX,
        ..shape()
    });
    assert!(why.contains("n_layer"), "{why}");
    let why = refused(ModelShape {
        n_vocab: u32::MAX,
        ..shape()
    });
    assert!(why.contains("n_vocab"), "{why}");
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

#[test]
fn the_dispatch_core_forgets_a_step_its_backend_failed() {
    /// Fails its second compute.
    struct Failing(u32);
    impl Backend for Failing {
        type Error = ScheduleError;
        fn now_ns(&self) -> u64 {
            0
        }
        fn compute(&mut self, _: XpuId, _: &ClusterWork) -> Result<Done, ScheduleError> {
            self.0 += 1;
            if self.0 == 2 {
                return Err(ScheduleError::EmptyStep);
            }
            Ok(Done::Now)
        }
        fn finish_phase(
            &mut self,
            _: &Finish,
            _: Option<Awaited>,
            _: &mut Activity,
        ) -> Result<(), ScheduleError> {
            Ok(())
        }
        fn page_map(&self) -> Option<&dyn PageMap> {
            None
        }
        fn read(&mut self, _: StepId, _: &[UnitLoad]) -> Result<Done, ScheduleError> {
            Ok(Done::Now)
        }
        fn step_done(&mut self, _: StepId) -> Result<(), ScheduleError> {
            Ok(())
        }
    }
    let mut d = Dispatcher::new(Scheduler::new(&shape(), &ExecutionPlan::default()).unwrap());
    let mut b = Failing(0);
    assert_eq!(
        d.feed(&mut b, Event::StepRequested(request(1, 1, 0))),
        Err(ScheduleError::EmptyStep)
    );
    assert!(!d.scheduler().is_busy(), "the failed step is forgotten");
    // The next step runs to its end, every completion fed by the core.
    d.feed(&mut b, Event::StepRequested(request(2, 1, 0)))
        .unwrap();
    assert!(!d.scheduler().is_busy());
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

/// Nothing runs before its inputs and no group ever holds more than one message.
struct GroupChecks<'a> {
    allowed: &'a [XpuId],
    outstanding: Vec<(XpuId, ClusterWork)>,
}

impl Checker for GroupChecks<'_> {
    fn command(&mut self, cmd: &Command) {
        match cmd {
            Command::Compute { xpu, work } => {
                assert!(
                    self.allowed.contains(xpu),
                    "{xpu:?} is not assigned this step's phases"
                );
                assert!(
                    self.outstanding.iter().all(|(x, _)| x != xpu),
                    "{xpu:?} got a second message while one is in flight"
                );
                assert!(
                    self.outstanding
                        .iter()
                        .all(|(_, w)| (w.layer, w.phase) == (work.layer, work.phase)),
                    "a phase started while an earlier one was still computing"
                );
                self.outstanding.push((*xpu, work.clone()));
            }
            Command::FinishPhase { .. } | Command::StepDone { .. } => {
                assert!(
                    self.outstanding.is_empty(),
                    "finished with work still in flight"
                );
            }
            Command::Load { .. } => panic!("a plan without a cache loads nothing"),
        }
    }

    fn completing(&mut self, event: &Event) {
        if let Event::ClusterDone(work) = event {
            self.outstanding.retain(|(_, w)| w != work);
        }
    }
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
        let s = Scheduler::new(&model, &plan).unwrap();
        let req = request(3, n_tokens, logits_at.min(n_tokens));
        let (first, s) = run_step(s, &model, req.clone());
        check_stream(&s, &req, &first);
        // Same events, same commands.
        let again = Scheduler::new(&model, &plan).unwrap();
        prop_assert_eq!(run_step(again, &model, req).0, first);
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
        let s = Scheduler::new(&model, &plan).unwrap();
        let req = request(5, n_tokens, logits_at.min(n_tokens));
        let on = if s.shape_for(n_tokens) == StepShape::Decode { &plan.decode_on } else { &plan.prefill_on };
        let allowed: Vec<XpuId> = on
            .iter()
            .map(|sh| XpuId(plan.group_index(&sh.group).unwrap() as u8))
            .collect();
        let mut h = Harness::new(s, &model);
        let mut checks = GroupChecks { allowed: &allowed, outstanding: Vec::new() };
        h.run_step(req.clone(), &all_active, &mut picks.iter().copied().cycle(), &mut checks);
        let (cmds, events) = h.take();
        check_stream(h.s(), &req, &cmds);
        prop_assert!(!h.s().is_busy());

        // Replay: the recorded events fed to a fresh scheduler give the identical commands.
        prop_assert_eq!(replayed(Scheduler::new(&model, &plan).unwrap(), events), cmds);
    }
}

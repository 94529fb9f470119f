//! Replay: feed a trace's events to a fresh scheduler and check it answers with the recorded
//! commands, record by record. Any driver's trace (actors, inline, simulator) replays the same
//! way, because the scheduler is a pure function of the events.

use conductor_runtime::plan::ModelDescription;
use conductor_runtime::schedule::{Command, Event, ScheduleError, Scheduler};
use conductor_runtime::trace::Trace;

/// A trace that cannot be replayed at all.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The header's model shape or plan is unusable.
    #[error("trace header: {0}")]
    Header(#[from] ScheduleError),
    #[error(
        "the trace was recorded for model `{trace_model}` ({trace_shape}), not `{model}` ({shape})"
    )]
    ModelMismatch {
        trace_model: String,
        trace_shape: String,
        model: String,
        shape: String,
    },
}

/// The first record whose commands differ from the recorded ones.
#[derive(Debug, PartialEq)]
pub struct Mismatch {
    /// Index into `trace.records`.
    pub record: usize,
    pub event: Event,
    pub expected: Vec<Command>,
    pub got: Vec<Command>,
    /// The scheduler refused the event (then `got` is empty).
    pub error: Option<ScheduleError>,
}

/// What a replay found.
#[derive(Debug, PartialEq)]
pub struct ReplayReport {
    /// Records fed to the scheduler (all of them).
    pub records: usize,
    /// Commands the trace holds.
    pub commands: usize,
    /// Records whose commands matched exactly.
    pub matched: usize,
    /// Records that did not match (a refused event counts).
    pub mismatched: usize,
    pub first_mismatch: Option<Mismatch>,
}

impl ReplayReport {
    pub fn is_identical(&self) -> bool {
        self.mismatched == 0
    }
}

/// Replays `trace` on a fresh scheduler built from its header's model shape and plan. Keeps
/// going after a mismatch (the scheduler's state may have diverged; later counts say how far).
pub fn replay(trace: &Trace) -> Result<ReplayReport, ReplayError> {
    let mut scheduler = Scheduler::new(&trace.header.model.shape, &trace.header.plan)?;
    // A predictor-mode run's decode steps waited for predictions: so must the replay. Under
    // gate-first loading they came as the predicted neurons' pages (`FfnPages` without a gate
    // phase).
    let event = |f: fn(&Event) -> bool| trace.records.iter().any(|r| f(&r.event));
    let gate_phase = trace.records.iter().flat_map(|r| &r.commands).any(|c| {
        matches!(c, conductor_runtime::schedule::Command::Compute { work, .. }
            if work.phase == conductor_runtime::neuron::Phase::FfnGateRows)
    });
    let predicted = event(|e| matches!(e, Event::FfnPredicted { .. }))
        || (!gate_phase && event(|e| matches!(e, Event::FfnPages { .. })));
    scheduler.await_predictions(predicted);
    let mut report = ReplayReport {
        records: trace.records.len(),
        commands: trace.records.iter().map(|r| r.commands.len()).sum(),
        matched: 0,
        mismatched: 0,
        first_mismatch: None,
    };
    let mut got = Vec::new();
    for (i, record) in trace.records.iter().enumerate() {
        got.clear();
        let result = scheduler.on_event(record.event.clone(), &mut got);
        let error = result.err();
        if error.is_none() && got == record.commands {
            report.matched += 1;
            continue;
        }
        report.mismatched += 1;
        if report.first_mismatch.is_none() {
            report.first_mismatch = Some(Mismatch {
                record: i,
                event: record.event.clone(),
                expected: record.commands.clone(),
                got: got.clone(),
                error,
            });
        }
    }
    Ok(report)
}

/// Checks that `trace` was recorded for `model` (same shape and weight types; names may
/// differ between a file and a named shape). The error names both models.
pub fn check_trace_model(trace: &Trace, model: &ModelDescription) -> Result<(), ReplayError> {
    let recorded = &trace.header.model;
    if recorded.shape == model.shape && recorded.types == model.types {
        return Ok(());
    }
    let describe = |d: &ModelDescription| {
        let s = &d.shape;
        format!(
            "{} layers, n_embd {}, n_ff {}, {} heads, {} kv heads, vocab {}, ffn {}",
            s.n_layer, s.n_embd, s.n_ff, s.n_head, s.n_head_kv, s.n_vocab, d.types.ffn_up
        )
    };
    Err(ReplayError::ModelMismatch {
        trace_model: recorded.name.clone(),
        trace_shape: describe(recorded),
        model: model.name.clone(),
        shape: describe(model),
    })
}

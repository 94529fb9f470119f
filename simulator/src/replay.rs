//! Replay: feed a trace's events through the dispatch core to a fresh scheduler and check it
//! answers with the recorded commands, record by record. Any driver's trace (actors, inline,
//! simulator) replays the same way, because the scheduler is a pure function of the events and
//! the events phases owe are a pure function of the recorded activity.

use conductor_runtime::dispatch::{Backend, Completions, Dispatcher, Done, Finish, UnitLoad};
use conductor_runtime::plan::ModelDescription;
use conductor_runtime::schedule::{
    Activity, Awaited, ClusterWork, Command, Event, PageMap, ScheduleError, Scheduler, StepId,
    StepRequest, XpuId,
};
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

/// Replays `trace` through the dispatch core on a fresh scheduler built from its header's
/// model shape, plan and FFN plan: the recorded completions are fed in their order, and the
/// events a finished phase owes are derived again from the trace's activity (as a simulation
/// derives them), so a match says both the scheduler and that derivation agree with the run.
/// Keeps going after a mismatch (the scheduler's state may have diverged; later counts say how
/// far).
pub fn replay(trace: &Trace) -> Result<ReplayReport, ReplayError> {
    let header = &trace.header;
    let scheduler = Scheduler::with_ffn(&header.model.shape, &header.plan, header.ffn)?;
    let mut dispatcher = Dispatcher::with_completions(scheduler, Completions::Replayed);
    let mut backend = ReplayBackend {
        trace,
        layout: header
            .ffn
            .reads
            .reads_pages()
            .then(|| crate::gate_first_layout(&header.model))
            .flatten(),
        step: None,
    };
    let mut report = ReplayReport {
        records: trace.records.len(),
        commands: trace.records.iter().map(|r| r.commands.len()).sum(),
        matched: 0,
        mismatched: 0,
        first_mismatch: None,
    };
    let mut i = 0;
    while i < trace.records.len() {
        let record = &trace.records[i];
        // The external event, then the events the phases it finished owe.
        let owed = trace.records[i + 1..]
            .iter()
            .take_while(|r| r.event.is_owed())
            .count();
        dispatcher.start_recording(header.model.shape.n_layer);
        let error = dispatcher.feed(&mut backend, record.event.clone()).err();
        let got = dispatcher.take_recording().records;
        for (k, expected) in trace.records[i..=i + owed].iter().enumerate() {
            let produced = got.get(k);
            if produced
                .is_some_and(|p| p.event == expected.event && p.commands == expected.commands)
            {
                report.matched += 1;
                continue;
            }
            report.mismatched += 1;
            if report.first_mismatch.is_none() {
                report.first_mismatch = Some(Mismatch {
                    record: i + k,
                    event: expected.event.clone(),
                    expected: expected.commands.clone(),
                    got: produced.map(|p| p.commands.clone()).unwrap_or_default(),
                    error: error.clone(),
                });
            }
        }
        i += owed + 1;
    }
    Ok(report)
}

/// Carries out nothing: a replay compares commands only. The activity a finished phase owes
/// comes from the trace.
struct ReplayBackend<'a> {
    trace: &'a Trace,
    layout: Option<conductor_runtime::store::BundleLayout>,
    /// The step in flight's activity.
    step: Option<&'a conductor_runtime::trace::StepActivity>,
}

impl Backend for ReplayBackend<'_> {
    type Error = ScheduleError;

    fn now_ns(&self) -> u64 {
        0
    }

    fn step_requested(&mut self, r: &StepRequest) -> Result<(), ScheduleError> {
        self.step = self.trace.activity.iter().find(|a| a.step == r.step);
        Ok(())
    }

    fn compute(&mut self, _: XpuId, _: &ClusterWork) -> Result<Done, ScheduleError> {
        Ok(Done::Later)
    }

    fn finish_phase(
        &mut self,
        f: &Finish,
        awaited: Option<Awaited>,
        activity: &mut Activity,
    ) -> Result<(), ScheduleError> {
        if awaited.is_some() {
            crate::backend::fill_activity(self.step, f.layer, activity);
        }
        Ok(())
    }

    fn page_map(&self) -> Option<&dyn PageMap> {
        self.layout.as_ref().map(|l| l as &dyn PageMap)
    }

    fn read(&mut self, _: StepId, _: &[UnitLoad]) -> Result<Done, ScheduleError> {
        Ok(Done::Later)
    }

    fn step_done(&mut self, _: StepId) -> Result<(), ScheduleError> {
        Ok(())
    }
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

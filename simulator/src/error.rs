//! What can go wrong before or during a simulation. Every input error names the field.

use conductor_runtime::model::ModelError;
use conductor_runtime::plan::{PlacementError, ProfileError};
use conductor_runtime::quant::GgmlType;
use conductor_runtime::schedule::ScheduleError;

/// A simulation that cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Profile(#[from] ProfileError),
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// The plan or the model shape is unusable, or (a bug) the scheduler refused an event.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error("hardware profile core class `{class}` (core_classes[{index}].kernels) has no rates for {ty}")]
    MissingRates {
        class: String,
        index: usize,
        ty: GgmlType,
    },
    #[error("workload field `{field}`: {why}")]
    Workload { field: String, why: String },
    #[error("activity field `{field}`: {why}")]
    Activity { field: String, why: String },
    /// The source error follows in the chain.
    #[error("model file {path}")]
    Model { path: String, source: ModelError },
    /// A bug in the simulator: the event heap ran dry before the step finished.
    #[error("simulation stalled at {t_ns} ns: step {step} never finished")]
    Stalled { step: u64, t_ns: u64 },
}

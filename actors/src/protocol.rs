//! Every message the actors exchange, in one place: the driver talks to the scheduler actor,
//! the scheduler actor to the processor groups and the storage actors, and they answer it.
//! Groups and storage know the scheduler only as recipients of their answers, never as a type.
//!
//! ```text
//!   driver ──RunStep──► scheduler ──Compute──► group ──ClusterDone / GroupFailed──► scheduler
//!                                 ──LoadClusters──► storage ──ClusterLoaded / StorageFailed──► scheduler
//! ```

use conductor_runtime::cache::{LayerCacheStats, LoadError, SlotRead};
use conductor_runtime::exec::StepError;
use conductor_runtime::schedule::{ClusterWork, StepId, StepRequest, XpuId};
use conductor_runtime::trace::{Span, StepActivity, TraceRecord};
use kameo::actor::Recipient;
use std::path::PathBuf;
use std::sync::mpsc::SyncSender;

/// Run one step; the outcome goes to `reply`.
pub struct RunStep {
    pub request: StepRequest,
    pub reply: SyncSender<Result<(), StepError>>,
}

/// Compute these clusters (to a processor group).
pub struct Compute(pub ClusterWork);

/// Panic inside the next handler (tests of supervision).
pub struct InjectPanic;

/// A group finished a [`Compute`].
pub struct ClusterDone {
    pub xpu: XpuId,
    pub work: ClusterWork,
    /// When it started and finished (trace epoch, ns; 0 when not recording).
    pub started_ns: u64,
    pub finished_ns: u64,
}

/// A group failed (panicked, or stopped) while computing for `step`, or stopped idle.
pub struct GroupFailed {
    pub xpu: XpuId,
    pub step: Option<StepId>,
    pub why: String,
}

/// A storage actor failed (panicked while reading, or stopped): the loads it was given may
/// never be answered, so the step in flight fails rather than waiting for them.
pub struct StorageFailed {
    pub why: String,
}

/// Read these units (one run the scheduler decided: adjacent bundles in one vectored read,
/// or reads in flight together) and answer each with a [`ClusterLoaded`].
pub struct LoadClusters {
    pub step: StepId,
    pub items: Vec<SlotRead>,
}

/// The storage actor finished (or failed) one unit of a [`LoadClusters`].
pub struct ClusterLoaded {
    pub step: StepId,
    pub layer: u32,
    pub cluster: u32,
    pub result: Result<(), LoadError>,
    pub started_ns: u64,
    pub finished_ns: u64,
}

/// Read `len` bytes at `offset` of the model file (to a storage actor).
pub struct ReadAt {
    pub offset: u64,
    pub len: usize,
    pub reply: SyncSender<Result<Vec<u8>, StorageError>>,
}

/// Hand over the neuron cache's counters per layer (empty without a cache).
pub struct TakeCacheStats(pub SyncSender<Vec<LayerCacheStats>>);

/// Asks the scheduler how many cache slots are held now (`None`: no cache); 0 between steps.
pub struct TakeHeldSlots(pub SyncSender<Option<u32>>);

/// Start recording a trace (clears what was recorded).
pub struct StartRecording;

/// Stop recording and hand over what was recorded.
pub struct TakeRecording(pub SyncSender<Recording>);

/// What the scheduler actor recorded.
#[derive(Default)]
pub struct Recording {
    pub records: Vec<TraceRecord>,
    pub activity: Vec<StepActivity>,
    pub spans: Vec<Span>,
}

/// Where a group sends its answers.
#[derive(Clone)]
pub struct GroupReplies {
    pub done: Recipient<ClusterDone>,
    pub failed: Recipient<GroupFailed>,
}

/// Why a [`ReadAt`] (or opening the model file for it) failed.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("storage has no file to read (the model was not loaded from a file)")]
    NoFile,
    #[error("cannot open {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("read of {len} bytes at offset {offset} of {path} failed twice: {source}")]
    Read {
        path: PathBuf,
        offset: u64,
        len: usize,
        source: std::io::Error,
    },
    #[error("read of {len} bytes at offset {offset} of {path} returned {got} bytes twice (file truncated?)")]
    Short {
        path: PathBuf,
        offset: u64,
        len: usize,
        got: usize,
    },
}

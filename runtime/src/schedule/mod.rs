//! The scheduler: a pure state machine that turns events into neuron-cluster commands.
//!
//! It knows the plan and which work is in flight; it never sees activations or weights, never
//! reads a clock and iterates no hash maps, so the same events always give the same commands.
//! Drivers feed it [`Event`]s and carry out its [`Command`]s through the dispatch core
//! ([`crate::dispatch`]), which every driver (inline, actors, simulator) shares.
//!
//! A step is one forward pass over `n_tokens` tokens. Each layer is a fixed sequence of phases
//! (see [`Program`]); a phase's clusters may run in any order and on any thread, and the next
//! phase starts only after [`Command::FinishPhase`] has combined them in cluster order.
//!
//! - `scheduler.rs`: the state machine (steps, phases, clusters in flight);
//! - `cache_flow.rs`: the neuron cache as the scheduler drives it (acquire ahead, loads,
//!   which loads one read carries);
//! - `awaited.rs`: what a step waits for after a phase, and the one place that turns an active
//!   set into the event owed ([`owed_event`]);
//! - `program.rs`: the cluster layout of a step.

mod awaited;
mod cache_flow;
mod program;
mod scheduler;

pub use awaited::{owed_event, reads_whole_up_rows, Activity, Awaited, PageMap};
pub use program::{ffn_clusters, split_by_weight, PhaseClusters, Program, StepShape};
pub use scheduler::Scheduler;

use crate::neuron::Phase;
pub use crate::plan::ReadPolicy;
use crate::plan::{ExecutionPlan, IoEngine, PlanError};
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// Identifies one forward pass.
pub type StepId = u64;

/// A processor group (a set of cores, or an accelerator) that computes clusters: the index of
/// its group in the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct XpuId(pub u8);

/// A forward pass to run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRequest {
    pub step: StepId,
    /// Tokens in this step (≥ 1).
    pub n_tokens: u32,
    /// Tokens already in the KV cache before this step (its first token's position).
    pub n_past: u32,
    /// Tokens with index ≥ `logits_from` within the step get logits; `n_tokens` means none.
    pub logits_from: u32,
    /// Sequences the step's tokens belong to: 1 (consecutive tokens of one sequence, the
    /// first at position `n_past`), or `n_tokens` for a **multi-sequence step** (continuous
    /// batching): token `t` is the next token of sequence `t`, at that sequence's own position
    /// and against its own KV cache (the driver knows which; the scheduler sees sizes only).
    /// A multi-sequence step always runs in the decode shape, whatever its size, so that each
    /// sequence computes exactly what its own decode step would; `n_past` is then unused (0).
    pub sequences: u32,
    /// A one-token decode step computed from what the plan keeps resident for good, reading
    /// nothing (`--draft self`): attention and norms, and of the units that stream through
    /// the neuron cache those of its hot segment ([`crate::cache::hot_segment`]; streamed
    /// attention is read all the same, a layer cannot do without it). An FFN bundle left out
    /// adds nothing; a token whose output rows are left out gets minus infinity. Without a
    /// cache everything is resident and the step is an ordinary one.
    #[serde(default)]
    pub resident_only: bool,
}

impl StepRequest {
    /// Whether any token of the step needs logits.
    pub fn wants_logits(&self) -> bool {
        self.logits_from < self.n_tokens
    }

    /// Whether each token belongs to its own sequence (see [`StepRequest::sequences`]).
    pub fn is_multi_sequence(&self) -> bool {
        self.sequences > 1
    }
}

/// Some clusters of one phase, sent to one processor group in one message.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClusterWork {
    pub step: StepId,
    pub shape: StepShape,
    /// Layer index; `n_layer` stands for the output projection.
    pub layer: u32,
    pub phase: Phase,
    /// Indices into the program's cluster list for this phase.
    pub clusters: Range<u32>,
}

/// Which loads one read may carry, decided by the scheduler ([`Command::Load`]'s
/// `with_previous`) so that every driver reads, and the simulator charges, the same reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadGeometry {
    /// Units one read carries at most (the plan's `cache.coalesce`).
    pub max_units: u32,
    /// Any loads may go together, each its own read in flight at once (io_uring); otherwise
    /// only whole bundles lying back to back in the store, read as one vectored read.
    pub in_flight_together: bool,
}

impl ReadGeometry {
    /// The geometry `plan` asks for.
    pub fn of(plan: &ExecutionPlan) -> ReadGeometry {
        ReadGeometry {
            max_units: plan.cache.as_ref().map_or(1, |c| c.coalesce.max(1)),
            in_flight_together: plan.storage.engine == IoEngine::Uring,
        }
    }
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    StepRequested(StepRequest),
    /// A processor group finished the clusters of a [`Command::Compute`].
    ClusterDone(ClusterWork),
    /// Unit `cluster` of `layer` (an FFN bundle, or a streamed matrix or output cluster: see
    /// [`crate::cache::UnitMap`]) is in the slot a [`Command::Load`] named.
    Loaded {
        step: StepId,
        layer: u32,
        cluster: u32,
    },
    /// Owed after a phase finished with [`Awaited::Clusters`]: the FFN units of `layer` the
    /// step needs ([`Program::ffn_selection_units`]: a store's bundles), bit `c % 64` of word
    /// `c / 64` for unit `c`. The others are neither loaded nor given a slot; a cluster none of
    /// whose units is needed is not computed.
    FfnPredicted {
        step: StepId,
        layer: u32,
        needed: Vec<u64>,
    },
    /// Owed after a phase finished with [`Awaited::GatedPages`] or
    /// [`Awaited::PredictedPages`]: the pages of each FFN bundle that the `FfnNeurons`
    /// compute reads, bit `c * bundle_pages + p` (words of 64) for page `p` of bundle `c`. A
    /// bundle with no page is skipped; the others read the pages their slots lack, and a
    /// cluster computes once its bundles are in.
    FfnPages {
        step: StepId,
        layer: u32,
        pages: Vec<u64>,
    },
}

impl Event {
    /// Whether a finished phase owes this event ([`Command::FinishPhase`]'s `then`): the
    /// dispatch core derives it from the phase's active neurons, so a replay derives it again
    /// rather than feeding the recorded one.
    pub fn is_owed(&self) -> bool {
        matches!(self, Event::FfnPredicted { .. } | Event::FfnPages { .. })
    }
}

/// What to do next. Commands of one batch are carried out in order; `Compute` may run
/// asynchronously, `FinishPhase` runs on the driver before the commands after it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    Compute {
        xpu: XpuId,
        work: ClusterWork,
    },
    /// Every cluster of the phase is done: reduce their outputs in cluster order into the
    /// residual stream (or gather them) and prepare the input of the next phase. With `then`,
    /// the step waits for the event that phase owes (derived by [`owed_event`] from the
    /// phase's active neurons), fed before the commands after this one.
    FinishPhase {
        step: StepId,
        shape: StepShape,
        layer: u32,
        phase: Phase,
        then: Option<Awaited>,
    },
    /// The step is complete; its logits, if any were asked for, are ready.
    StepDone {
        step: StepId,
    },
    /// Read unit `cluster` of `layer` (an FFN bundle, or a streamed matrix or output cluster)
    /// into cache slot `slot`, which held unit `evicted` (layer, cluster) until now; answer
    /// with [`Event::Loaded`].
    Load {
        step: StepId,
        layer: u32,
        cluster: u32,
        slot: u32,
        evicted: Option<(u32, u32)>,
        /// Only these pages of the unit (4096 bytes each, from its start); `None`: all of it.
        pages: Option<Range<u32>>,
        /// The slot already holds this unit in part and keeps the pages it has (nothing is
        /// evicted, the slot is not given anew).
        top_up: bool,
        /// Read together with the `Load` before it in this batch (one run, see
        /// [`ReadGeometry`]).
        with_previous: bool,
    },
}

/// An event the scheduler cannot accept. Drivers treat it as a bug in themselves or a
/// corrupted trace: the step fails, nothing is computed twice.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScheduleError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("step {new} requested while step {running} is still running")]
    Busy { running: StepId, new: StepId },
    #[error("a step needs at least one token")]
    EmptyStep,
    #[error("a resident-only step is one decode token, not {n_tokens}")]
    ResidentOnlyShape { n_tokens: u32 },
    #[error("a step of {n_tokens} tokens in {sequences} sequences: a multi-sequence step has one token per sequence")]
    BadSequences { n_tokens: u32, sequences: u32 },
    #[error("step of {n_tokens} tokens is larger than the plan's largest prefill step ({max})")]
    StepTooLarge { n_tokens: u32, max: u32 },
    #[error("completion of work that is not in flight: {0:?}")]
    UnexpectedCompletion(ClusterWork),
    #[error("model shape field `{0}` is 0: nothing to schedule")]
    EmptyShape(&'static str),
    /// A shape (from a trace or a description file) beyond the limits of
    /// [`crate::plan::ModelShape::check_limits`].
    #[error("{0}")]
    ShapeTooLarge(String),
    #[error("the plan has {0} processor groups; at most 255 are supported")]
    TooManyGroups(usize),
    #[error("the plan has a neuron cache, but the model is not a neuron store (make one with `conductor convert`)")]
    CacheWithoutStore,
    #[error("FFN predictions for layer {layer} of step {step}, which does not wait for them")]
    UnexpectedPrediction { step: StepId, layer: u32 },
    #[error("FFN pages for layer {layer} of step {step}, which is not waiting for them")]
    UnexpectedPages { step: StepId, layer: u32 },
    #[error("the plan reads bundles page by page, but the model is not a neuron store with gate rows first in its bundles")]
    GateFirstWithoutStore,
    #[error("{0}")]
    Ffn(#[from] crate::plan::FfnPlanError),
    #[error(
        "the FFN plan ({} neurons, {} reads) is not the one the plan and model resolve to ({}, {})",
        .ffn.select.name(), .ffn.reads.name(), .resolved.select.name(), .resolved.reads.name()
    )]
    FfnPlanMismatch {
        ffn: crate::plan::FfnPlan,
        resolved: crate::plan::FfnPlan,
    },
    #[error("the FFN plan selects {ffn} neurons, but the model's sparse decode is {model}")]
    FfnOfAnotherDecode {
        ffn: &'static str,
        model: &'static str,
    },
    #[error("gate-first loading keeps a layer's {need} bundles in slots at once, but the cache has {cold} slots for them (a larger budget, or fewer hot slots)")]
    GateFirstSlots { need: u32, cold: u32 },
    #[error(
        "load completion for layer {layer} cluster {cluster} of step {step}, which is not loading"
    )]
    UnexpectedLoad {
        step: StepId,
        layer: u32,
        cluster: u32,
    },
}

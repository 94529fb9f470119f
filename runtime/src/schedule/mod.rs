//! The scheduler: a pure state machine that turns events into neuron-cluster commands.
//!
//! It knows the plan and which work is in flight; it never sees activations or weights, never
//! reads a clock and iterates no hash maps, so the same events always give the same commands.
//! Drivers (inline, actors, simulator) feed it [`Event`]s and carry out its [`Command`]s.
//!
//! A step is one forward pass over `n_tokens` tokens. Each layer is a fixed sequence of phases
//! (see [`Program`]); a phase's clusters may run in any order and on any thread, and the next
//! phase starts only after [`Command::FinishPhase`] has combined them in cluster order.

mod program;

pub use program::{split_by_weight, PhaseClusters, Program, StepShape};

use crate::neuron::Phase;
use crate::plan::{ExecutionPlan, ModelShape, PlanError, Share};
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::sync::Arc;

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
}

impl StepRequest {
    /// Whether any token of the step needs logits.
    pub fn wants_logits(&self) -> bool {
        self.logits_from < self.n_tokens
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

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    StepRequested(StepRequest),
    /// A processor group finished the clusters of a [`Command::Compute`].
    ClusterDone(ClusterWork),
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
    /// residual stream (or gather them) and prepare the input of the next phase.
    FinishPhase {
        step: StepId,
        shape: StepShape,
        layer: u32,
        phase: Phase,
    },
    /// The step is complete; its logits, if any were asked for, are ready.
    StepDone {
        step: StepId,
    },
}

/// An event the scheduler cannot accept. Drivers treat it as a bug in themselves or a
/// corrupted trace: the step fails, nothing is computed twice.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScheduleError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("step {new} requested while step {running} is still running")]
    Busy { running: StepId, new: StepId },
    #[error("a step needs at least one token")]
    EmptyStep,
    #[error("step of {n_tokens} tokens is larger than the plan's largest prefill step ({max})")]
    StepTooLarge { n_tokens: u32, max: u32 },
    #[error("completion of work that is not in flight: {0:?}")]
    UnexpectedCompletion(ClusterWork),
    #[error("model shape field `{0}` is 0: nothing to schedule")]
    EmptyShape(&'static str),
    #[error("the plan has {0} processor groups; at most 255 are supported")]
    TooManyGroups(usize),
}

struct InFlight {
    request: StepRequest,
    shape: StepShape,
    layer: u32,
    /// Index into the program's layer phases; `program.layer_phases.len()` means the output.
    phase_index: usize,
    /// Cluster ranges sent out for the current phase and not yet reported done.
    outstanding: Vec<(XpuId, Range<u32>)>,
}

/// The scheduler state machine.
pub struct Scheduler {
    decode: Arc<Program>,
    prefill: Arc<Program>,
    decode_max_tokens: u32,
    prefill_max_tokens: u32,
    n_groups: usize,
    in_flight: Option<InFlight>,
}

impl Scheduler {
    /// A scheduler for a model of `shape` following `plan`: decode phases shared among the
    /// plan's `decode_on` groups, prefill phases among its `prefill_on` groups.
    pub fn new(shape: &ModelShape, plan: &ExecutionPlan) -> Result<Scheduler, ScheduleError> {
        plan.validate()?;
        for (field, value) in [
            ("n_layer", shape.n_layer),
            ("n_embd", shape.n_embd),
            ("n_ff", shape.n_ff),
            ("n_head", shape.n_head),
            ("n_head_kv", shape.n_head_kv),
            ("head_dim", shape.head_dim),
            ("n_vocab", shape.n_vocab),
        ] {
            if value == 0 {
                return Err(ScheduleError::EmptyShape(field));
            }
        }
        if plan.groups.len() > usize::from(u8::MAX) {
            return Err(ScheduleError::TooManyGroups(plan.groups.len()));
        }
        let resolve = |shares: &[Share]| -> Vec<(XpuId, u32)> {
            shares
                .iter()
                .map(|s| {
                    let index = plan.group_index(&s.group).expect("validated plan");
                    (XpuId(index as u8), s.weight)
                })
                .collect()
        };
        let decode_shares = resolve(&plan.decode_on);
        let prefill_shares = resolve(&plan.prefill_on);
        Ok(Scheduler {
            decode: Arc::new(Program::new(
                shape,
                &plan.decode,
                StepShape::Decode,
                &decode_shares,
            )),
            prefill: Arc::new(Program::new(
                shape,
                &plan.prefill,
                StepShape::Prefill,
                &prefill_shares,
            )),
            decode_max_tokens: plan.decode_max_tokens,
            prefill_max_tokens: plan.prefill_max_tokens,
            n_groups: plan.groups.len(),
            in_flight: None,
        })
    }

    /// Processor groups of the plan (`XpuId(0..n)`).
    pub fn n_groups(&self) -> usize {
        self.n_groups
    }

    /// The cluster layout of steps of the given shape (shared with the drivers).
    pub fn program(&self, shape: StepShape) -> &Arc<Program> {
        match shape {
            StepShape::Decode => &self.decode,
            StepShape::Prefill => &self.prefill,
        }
    }

    /// The shape a step of `n_tokens` tokens runs in.
    pub fn shape_for(&self, n_tokens: u32) -> StepShape {
        if n_tokens <= self.decode_max_tokens {
            StepShape::Decode
        } else {
            StepShape::Prefill
        }
    }

    /// The largest step the plan allows.
    pub fn max_step_tokens(&self) -> u32 {
        self.prefill_max_tokens.max(self.decode_max_tokens)
    }

    /// Whether a step is running.
    pub fn is_busy(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Forgets the step in flight (after a driver failed it); the next request starts clean.
    pub fn abort(&mut self) {
        self.in_flight = None;
    }

    /// Feeds one event; appends the resulting commands to `out`.
    pub fn on_event(&mut self, event: Event, out: &mut Vec<Command>) -> Result<(), ScheduleError> {
        match event {
            Event::StepRequested(request) => self.start_step(request, out),
            Event::ClusterDone(work) => self.cluster_done(work, out),
        }
    }

    fn start_step(
        &mut self,
        request: StepRequest,
        out: &mut Vec<Command>,
    ) -> Result<(), ScheduleError> {
        if let Some(running) = &self.in_flight {
            return Err(ScheduleError::Busy {
                running: running.request.step,
                new: request.step,
            });
        }
        if request.n_tokens == 0 {
            return Err(ScheduleError::EmptyStep);
        }
        if request.n_tokens > self.max_step_tokens() {
            return Err(ScheduleError::StepTooLarge {
                n_tokens: request.n_tokens,
                max: self.max_step_tokens(),
            });
        }
        let shape = self.shape_for(request.n_tokens);
        self.in_flight = Some(InFlight {
            request,
            shape,
            layer: 0,
            phase_index: 0,
            outstanding: Vec::with_capacity(self.n_groups),
        });
        self.issue_current_phase(out);
        Ok(())
    }

    fn cluster_done(
        &mut self,
        work: ClusterWork,
        out: &mut Vec<Command>,
    ) -> Result<(), ScheduleError> {
        let Some(flight) = self.in_flight.as_mut() else {
            return Err(ScheduleError::UnexpectedCompletion(work));
        };
        let program = match flight.shape {
            StepShape::Decode => &self.decode,
            StepShape::Prefill => &self.prefill,
        };
        let expected_phase = program.phase_at(flight.phase_index);
        let position = flight
            .outstanding
            .iter()
            .position(|(_, range)| *range == work.clusters);
        let matches = work.step == flight.request.step
            && work.shape == flight.shape
            && work.layer == flight.layer
            && work.phase == expected_phase;
        let Some(position) = position.filter(|_| matches) else {
            return Err(ScheduleError::UnexpectedCompletion(work));
        };
        flight.outstanding.swap_remove(position);
        if !flight.outstanding.is_empty() {
            return Ok(());
        }

        out.push(Command::FinishPhase {
            step: flight.request.step,
            shape: flight.shape,
            layer: flight.layer,
            phase: expected_phase,
        });
        let n_layer = program.n_layer;
        let per_layer = program.layer_phases.len();
        let at_output = flight.phase_index == per_layer;
        if at_output {
            return self.finish_step(out);
        }
        flight.phase_index += 1;
        if flight.phase_index == per_layer {
            if flight.layer + 1 < n_layer {
                flight.layer += 1;
                flight.phase_index = 0;
            } else if flight.request.wants_logits() {
                flight.layer = n_layer;
            } else {
                return self.finish_step(out);
            }
        }
        self.issue_current_phase(out);
        Ok(())
    }

    fn finish_step(&mut self, out: &mut Vec<Command>) -> Result<(), ScheduleError> {
        if let Some(flight) = self.in_flight.take() {
            out.push(Command::StepDone {
                step: flight.request.step,
            });
        }
        Ok(())
    }

    /// Sends the current phase's clusters to the processor groups: one message per group,
    /// each a contiguous share fixed by the plan.
    fn issue_current_phase(&mut self, out: &mut Vec<Command>) {
        let flight = self.in_flight.as_mut().expect("a step is in flight");
        let program = match flight.shape {
            StepShape::Decode => &self.decode,
            StepShape::Prefill => &self.prefill,
        };
        let layout = program.phase_layout_at(flight.phase_index);
        let phase = layout.phase;
        flight.outstanding.clear();
        for (xpu, range) in &layout.parts {
            let (xpu, range) = (*xpu, range.clone());
            flight.outstanding.push((xpu, range.clone()));
            out.push(Command::Compute {
                xpu,
                work: ClusterWork {
                    step: flight.request.step,
                    shape: flight.shape,
                    layer: flight.layer,
                    phase,
                    clusters: range,
                },
            });
        }
    }
}

#[cfg(test)]
mod tests;

//! The inline driver: the scheduler and the executor on the calling thread.
//!
//! It feeds the scheduler a `StepRequested`, then carries out commands in order: a `Compute` is
//! executed at once (its clusters spread over the runner's workers) and answered with
//! `ClusterDone`; a `FinishPhase` combines the phase's outputs. The command stream is exactly
//! what the actor driver and the simulator receive for the same events.

use super::{ClusterRunner, Executor, Session, StepError};
use crate::model::Model;
use crate::plan::ExecutionPlan;
use crate::quant::Kernels;
use crate::schedule::{Command, Event, ScheduleError, Scheduler, StepId, StepRequest};
use std::sync::Arc;

pub struct InlineDriver<R: ClusterRunner> {
    model: Arc<Model>,
    scheduler: Scheduler,
    executor: Executor,
    runner: R,
    next_step: StepId,
    commands: Vec<Command>,
}

impl<R: ClusterRunner> InlineDriver<R> {
    pub fn new(
        model: Arc<Model>,
        plan: &ExecutionPlan,
        kernels: Kernels,
        runner: R,
    ) -> Result<Self, ScheduleError> {
        let shape = model.config.shape(model.ffn_granule());
        Ok(InlineDriver {
            scheduler: Scheduler::new(&shape, plan)?,
            executor: Executor::new(kernels),
            model,
            runner,
            next_step: 0,
            commands: Vec::new(),
        })
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Installs a probe that sees intermediate tensors (see [`super::Probe`]).
    pub fn set_probe(&mut self, probe: Option<super::Probe>) {
        self.executor.set_probe(probe);
    }

    pub fn runner(&self) -> &R {
        &self.runner
    }

    /// Evaluates `tokens` after what `session` holds, in steps no larger than the plan allows.
    /// For every step that computes logits — tokens at index `logits_from` or later —
    /// `on_logits(first, rows)` receives them: `rows` holds `[token][n_vocab]` for the tokens
    /// starting at index `first` of `tokens`.
    ///
    /// On error the session keeps the tokens of the steps that completed.
    pub fn eval(
        &mut self,
        session: &mut Session,
        tokens: &[u32],
        logits_from: usize,
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), StepError> {
        if tokens.is_empty() {
            return Err(StepError::NoTokens);
        }
        session.check_room(tokens.len())?;
        let max = self.scheduler.max_step_tokens() as usize;
        let mut start = 0;
        while start < tokens.len() {
            let chunk = &tokens[start..(start + max).min(tokens.len())];
            let local_from = logits_from.saturating_sub(start).min(chunk.len());
            self.step(session, chunk, local_from as u32)?;
            if local_from < chunk.len() {
                on_logits(start + local_from, self.executor.logits());
            }
            start += chunk.len();
        }
        Ok(())
    }

    /// Evaluates `tokens` and returns the logits of the last one.
    pub fn eval_last(
        &mut self,
        session: &mut Session,
        tokens: &[u32],
    ) -> Result<&[f32], StepError> {
        self.eval(
            session,
            tokens,
            tokens.len().saturating_sub(1),
            &mut |_, _| {},
        )?;
        Ok(self.executor.logits())
    }

    fn step(
        &mut self,
        session: &mut Session,
        tokens: &[u32],
        logits_from: u32,
    ) -> Result<(), StepError> {
        let request = StepRequest {
            step: self.next_step,
            n_tokens: tokens.len() as u32,
            n_past: session.n_past() as u32,
            logits_from,
        };
        self.next_step += 1;
        let model = &*self.model;
        self.executor.begin_step(model, &request, tokens)?;
        let program = self
            .scheduler
            .program(self.scheduler.shape_for(request.n_tokens))
            .clone();
        self.commands.clear();
        self.scheduler
            .on_event(Event::StepRequested(request), &mut self.commands)?;
        let mut next = 0;
        while next < self.commands.len() {
            let command = self.commands[next].clone();
            next += 1;
            match command {
                Command::Compute { work, .. } => {
                    self.executor
                        .compute(model, &session.kv, &program, &work, &self.runner);
                    if let Err(e) = self
                        .scheduler
                        .on_event(Event::ClusterDone(work), &mut self.commands)
                    {
                        self.scheduler.abort();
                        return Err(e.into());
                    }
                }
                Command::FinishPhase { layer, phase, .. } => {
                    self.executor
                        .finish_phase(model, &mut session.kv, &program, layer, phase);
                }
                Command::StepDone { .. } => {
                    session.push(tokens);
                }
            }
        }
        Ok(())
    }
}

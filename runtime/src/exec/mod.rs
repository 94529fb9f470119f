//! Carrying out the scheduler's commands on real data.
//!
//! - [`StepState`] computes one [`crate::schedule::Command`] at a time: the clusters of a phase
//!   into a processor group's [`GroupOutput`] (through a [`ClusterRunner`], which may spread
//!   them over threads, and a [`DenseBackend`] for many-token products), or a phase's finish.
//! - [`InlineDriver`] runs the dispatch core ([`crate::dispatch`]) and the executor on the
//!   calling thread: the reference path for numerics, and the baseline the actor driver is
//!   measured against.
//! - [`Session`] is one conversation's state: its KV cache and position.

use crate::quant::{Kernels, MatRef};

mod attention;
mod blocks;
mod compute;
mod executor;
mod experts;
mod inline;
mod neurons;
mod rows;
mod selection;
mod session;
mod sparse_ffn;
#[cfg(test)]
mod tests;
mod weights;

pub use executor::{GroupOutput, Probe, StepState};
pub use inline::{open_cache, InlineDriver};
pub use session::{Session, StepError};

use crate::model::Model;
use crate::plan::{FfnPlan, FfnSelect};
use std::sync::Arc;

/// How `model` computes and reads decode's FFN under `plan`: its sparse decode's selection
/// (dense without one; a mixture's router) and the plan's read policy, refused where they
/// disagree ([`FfnPlan::resolve`]). What the engine's resolved plan holds
/// ([`crate::resolve::ResolvedPlan::ffn`]), for callers that build a driver without one.
pub fn ffn_plan_of(
    model: &Model,
    plan: &crate::plan::ExecutionPlan,
) -> Result<FfnPlan, crate::plan::FfnPlanError> {
    let sparsity = model.sparse().map_or(Default::default(), |s| s.mode);
    FfnPlan::resolve(plan, &model.shape(), sparsity)
}

/// The scheduler for `model` under `plan`, computing and reading decode's FFN as `ffn` says.
/// Refused where the model's sparse decode is not the one `ffn` selects with (the executor
/// takes its thresholds and predictors from the model), or where the plan's reads cannot
/// serve it.
pub fn scheduler_for(
    model: &Model,
    plan: &crate::plan::ExecutionPlan,
    ffn: FfnPlan,
) -> Result<crate::schedule::Scheduler, crate::schedule::ScheduleError> {
    let decodes = model.sparse().map_or(Default::default(), |s| s.mode);
    if FfnSelect::of(&model.shape(), decodes).ok() != Some(ffn.select) {
        return Err(crate::schedule::ScheduleError::FfnOfAnotherDecode {
            ffn: ffn.select.name(),
            model: decodes.name(),
        });
    }
    crate::schedule::Scheduler::with_ffn(&model.shape(), plan, ffn)
}

/// What the facade needs of a driver (inline, actors): evaluate tokens in a session.
pub trait Driver: Send {
    fn model(&self) -> &Arc<Model>;

    /// The most tokens one step may hold.
    fn max_step_tokens(&self) -> usize;

    /// Runs one step of `tokens` (at most [`Driver::max_step_tokens`]) after what `session`
    /// holds; tokens from index `logits_from` on get logits. On success the session holds the
    /// tokens; on error it is as it was.
    fn step(
        &mut self,
        session: &mut Session,
        tokens: &[u32],
        logits_from: u32,
    ) -> Result<(), StepError>;

    /// A one-token decode step of `token` after what `session` holds, computed from what the
    /// plan keeps resident and reading nothing
    /// ([`crate::schedule::StepRequest::resident_only`]): a draft of `--draft self`. Its
    /// logits ([`Driver::logits`]) are minus infinity for tokens whose output rows are not
    /// resident. On success the session holds the token, with KV entries computed from the
    /// resident weights alone: truncate it before the step that verifies the drafts.
    fn step_resident(&mut self, session: &mut Session, token: u32) -> Result<(), StepError>;

    /// A multi-sequence decode step (continuous batching): `tokens[i]` is the next token of
    /// `sessions[i]`, each at its own position against its own KV cache, all in one step
    /// whose every weight read serves them all. Every token gets logits
    /// ([`Driver::logits`]: `[sequence][n_vocab]`), and each sequence's are the bits its own
    /// one-token step would give. The sessions must have the same context size. On success
    /// each session holds its token; on error every session is as it was.
    fn step_sequences(
        &mut self,
        sessions: &mut [&mut Session],
        tokens: &[u32],
    ) -> Result<(), StepError> {
        match sessions {
            [] => Err(StepError::NoTokens),
            [one] => self.step(one, tokens, 0),
            _ => self.step_many_sequences(sessions, tokens),
        }
    }

    /// [`Driver::step_sequences`] of two sequences or more: the drivers' own multi-sequence
    /// step.
    fn step_many_sequences(
        &mut self,
        sessions: &mut [&mut Session],
        tokens: &[u32],
    ) -> Result<(), StepError>;

    /// The cores go to other work for a while (another engine's steps): threads waiting for
    /// the next step park now instead of spinning ([`ClusterRunner::rest`]).
    fn rest(&self) {}

    /// Logits of the last step that computed any, `[token][n_vocab]`.
    fn logits(&self) -> &[f32];

    /// Evaluates `tokens` after what `session` holds, in steps no larger than the plan allows.
    /// For every step that computes logits — tokens at index `logits_from` or later —
    /// `on_logits(first, rows)` receives them: `rows` holds `[token][n_vocab]` for the tokens
    /// starting at index `first` of `tokens`.
    ///
    /// On error the session keeps the tokens of the steps that completed.
    fn eval(
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
        let max = self.max_step_tokens();
        let mut start = 0;
        while start < tokens.len() {
            let chunk = &tokens[start..(start + max).min(tokens.len())];
            let local_from = logits_from.saturating_sub(start).min(chunk.len());
            self.step(session, chunk, local_from as u32)?;
            if local_from < chunk.len() {
                on_logits(start + local_from, self.logits());
            }
            start += chunk.len();
        }
        Ok(())
    }

    /// Evaluates `tokens` and returns the logits of the last one.
    fn eval_last(&mut self, session: &mut Session, tokens: &[u32]) -> Result<&[f32], StepError> {
        self.eval(
            session,
            tokens,
            tokens.len().saturating_sub(1),
            &mut |_, _| {},
        )?;
        Ok(self.logits())
    }
}
/// The request of multi-sequence step `step` over `sessions` (one token each), the
/// sequences' positions and their (common) context size; checks that every sequence has room.
pub fn multi_step_request(
    step: crate::schedule::StepId,
    sessions: &[&mut Session],
    tokens: &[u32],
) -> Result<(crate::schedule::StepRequest, Vec<u32>, usize), StepError> {
    if tokens.is_empty() || tokens.len() != sessions.len() {
        return Err(StepError::NoTokens);
    }
    let n_ctx = sessions[0].n_ctx();
    for s in sessions.iter() {
        s.check_room(1)?;
        if s.n_ctx() != n_ctx {
            return Err(StepError::MixedContexts);
        }
    }
    let n = tokens.len() as u32;
    let request = crate::schedule::StepRequest {
        step,
        n_tokens: n,
        n_past: 0,
        logits_from: 0,
        sequences: n,
        resident_only: false,
    };
    let positions = sessions.iter().map(|s| s.n_past() as u32).collect();
    Ok((request, positions, n_ctx))
}

/// Runs the clusters of one phase, possibly on several threads.
///
/// Each cluster writes only its own output block, handed to it as `&mut`, so clusters can run
/// in any order on any thread without changing a single bit of the result.
pub trait ClusterRunner: Sync {
    /// How many workers may call `f` at once; `f` receives a worker index below this.
    fn workers(&self) -> usize;

    /// Calls `f(worker, i, outs[i])` exactly once for every `i`, and returns when all are done.
    fn run(&self, outs: &mut [&mut [f32]], f: &(dyn Fn(usize, usize, &mut [f32]) + Sync));

    /// The cores go to other work for a while (another engine's steps: a draft model's):
    /// workers waiting for the next job park now instead of spinning. The next job wakes them.
    fn rest(&self) {}
}

/// Runs every cluster on the calling thread, in order.
pub struct Serial;

impl ClusterRunner for Serial {
    fn workers(&self) -> usize {
        1
    }

    fn run(&self, outs: &mut [&mut [f32]], f: &(dyn Fn(usize, usize, &mut [f32]) + Sync)) {
        for (i, out) in outs.iter_mut().enumerate() {
            f(0, i, out);
        }
    }
}

/// Multiplies a weight matrix with many tokens' activations: what a prefill phase asks of its
/// processor. An NPU would run fixed-shape graphs; here implementations call the quantized GEMM.
///
/// Every implementation must compute each output element exactly as [`Kernels::matmul`] does
/// (the kernels' results do not depend on how tokens are batched), so that the choice of
/// backend never changes a bit of the result.
pub trait DenseBackend: Sync {
    /// `out[t * out_stride + r]` = row `r` of `w` restricted to the columns `cols` ·
    /// activation row `t`, for `n_tokens` rows of `acts` (`cols.len()` elements each,
    /// quantized for `w`'s type): [`Kernels::matmul_cols`].
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &self,
        kernels: &Kernels,
        w: MatRef<'_>,
        cols: std::ops::Range<usize>,
        acts: &[u8],
        n_tokens: usize,
        out: &mut [f32],
        out_stride: usize,
    );
}

/// One GEMM call for all tokens.
pub struct WholeMatmul;

impl DenseBackend for WholeMatmul {
    fn matmul(
        &self,
        kernels: &Kernels,
        w: MatRef<'_>,
        cols: std::ops::Range<usize>,
        acts: &[u8],
        n_tokens: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        kernels.matmul_cols(w, cols, acts, n_tokens, out, out_stride);
    }
}

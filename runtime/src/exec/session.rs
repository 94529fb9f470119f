//! One conversation's state: its KV cache and how far it has got.

use crate::model::{KvCache, Model, ModelError};
use crate::schedule::ScheduleError;

/// A sequence being evaluated: the tokens so far and their keys and values.
pub struct Session {
    pub(crate) kv: KvCache,
    tokens: Vec<u32>,
}

/// Why a step could not run. The session is left as it was before the call.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("the context holds {n_ctx} tokens: {have} are in use and {adding} more do not fit")]
    ContextFull {
        n_ctx: usize,
        have: usize,
        adding: usize,
    },
    #[error("nothing to evaluate: no tokens given")]
    NoTokens,
    #[error("a multi-sequence step needs sessions of one context size")]
    MixedContexts,
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Load(#[from] crate::cache::LoadError),
    #[error("the scheduler asked for a load, but the driver has no neuron cache")]
    NoCache,
    #[error("scheduler: {0}")]
    Schedule(#[from] ScheduleError),
    /// Every command was carried out and the step never ended (a bug in the scheduler).
    #[error("the step stopped before its end: the scheduler issued nothing more")]
    Stalled,
    /// A processor group, the scheduler or the storage failed while computing the step (a
    /// panic or an error in an actor). The step is abandoned; the driver serves the next one.
    #[error("actor `{actor}` failed: {why}")]
    Actor { actor: String, why: String },
}

impl Session {
    /// A session able to hold `n_ctx` tokens of `model`. Memory for positions not yet used is
    /// reserved, not touched. A context too large to reserve is an error
    /// ([`crate::model::KvCacheError`]).
    pub fn new(model: &Model, n_ctx: usize) -> Result<Session, ModelError> {
        let c = model.config();
        Ok(Session {
            kv: KvCache::new(
                c.n_layer as usize,
                c.n_head_kv as usize,
                c.head_dim as usize,
                n_ctx,
            )?,
            tokens: Vec::new(),
        })
    }

    /// Tokens evaluated so far (their keys and values are cached).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Positions in use.
    pub fn n_past(&self) -> usize {
        self.tokens.len()
    }

    /// The most tokens this session holds.
    pub fn n_ctx(&self) -> usize {
        self.kv.capacity()
    }

    /// Forgets everything: the next token is at position 0.
    pub fn clear(&mut self) {
        self.tokens.clear();
    }

    /// Forgets tokens from position `n` on (to rewind or to reuse a common prefix).
    pub fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
    }

    /// Exchanges the session's KV cache with `kv`. For drivers that lend the cache to other
    /// threads during a step; they must give it back before the session is used again.
    pub fn swap_kv(&mut self, kv: &mut KvCache) {
        std::mem::swap(&mut self.kv, kv);
    }

    /// Fails unless `adding` more tokens fit in the context.
    pub fn check_room(&self, adding: usize) -> Result<(), StepError> {
        if self.n_past() + adding > self.n_ctx() {
            return Err(StepError::ContextFull {
                n_ctx: self.n_ctx(),
                have: self.n_past(),
                adding,
            });
        }
        Ok(())
    }

    /// Records that `tokens` were evaluated: their keys and values are in the cache. For
    /// drivers, after a step completed.
    pub fn push(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
    }
}

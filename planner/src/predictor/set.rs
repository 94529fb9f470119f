//! The training data of one layer ([`TrainingSet`]): FFN inputs and their true active sets,
//! with the shape checks that [`train_layer`](super::train_layer) repeats on every call.

use conductor_runtime::sparse::predictor::{bitset_words, PredictorError, BLOCK};

/// What one layer's predictor learns from: `T` FFN inputs and their true active sets.
#[derive(Clone, Copy, Debug)]
pub struct TrainingSet<'a> {
    /// `T × n_embd` FFN inputs, row-major.
    pub x: &'a [f32],
    /// `T` bitset rows of [`bitset_words`]`(n_ff)` words; bit `n % 64` of word `n / 64` is
    /// neuron `n`. Bits past `n_ff` are ignored.
    pub active: &'a [u64],
    pub n_embd: usize,
    pub n_ff: usize,
}

impl<'a> TrainingSet<'a> {
    /// Checks the shapes: `n_embd` a positive multiple of 32, `n_ff > 0`, `x` a whole number of
    /// rows, `active` exactly one bitset row per token.
    pub fn new(
        x: &'a [f32],
        active: &'a [u64],
        n_embd: usize,
        n_ff: usize,
    ) -> Result<Self, PredictorError> {
        let s = TrainingSet {
            x,
            active,
            n_embd,
            n_ff,
        };
        s.check()?;
        Ok(s)
    }

    pub(super) fn check(&self) -> Result<usize, PredictorError> {
        if self.n_embd == 0 || !self.n_embd.is_multiple_of(BLOCK) {
            return Err(PredictorError::EmbdNotBlockMultiple(self.n_embd));
        }
        if self.n_ff == 0 {
            return Err(PredictorError::NoNeurons);
        }
        if !self.x.len().is_multiple_of(self.n_embd) {
            return Err(PredictorError::Length {
                what: "x (a whole number of n_embd rows)",
                expected: self.x.len() / self.n_embd * self.n_embd,
                got: self.x.len(),
            });
        }
        let tokens = self.x.len() / self.n_embd;
        let words = tokens
            .checked_mul(bitset_words(self.n_ff))
            .ok_or(PredictorError::Empty)?;
        if self.active.len() != words {
            return Err(PredictorError::Length {
                what: "active bitset words (tokens x ceil(n_ff / 64))",
                expected: words,
                got: self.active.len(),
            });
        }
        if tokens == 0 {
            return Err(PredictorError::Empty);
        }
        Ok(tokens)
    }

    /// Number of tokens.
    pub fn tokens(&self) -> usize {
        self.x.len().checked_div(self.n_embd).unwrap_or(0)
    }

    /// Whether neuron `n` is active for token `t`.
    pub fn is_active(&self, t: usize, n: usize) -> bool {
        let w = self.active[t * bitset_words(self.n_ff) + n / 64];
        (w >> (n % 64)) & 1 == 1
    }

    pub(super) fn row(&self, t: usize) -> &'a [f32] {
        &self.x[t * self.n_embd..(t + 1) * self.n_embd]
    }
}

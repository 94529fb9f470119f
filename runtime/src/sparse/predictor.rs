//! Per-layer activation predictors (PowerInfer): which FFN neurons a token will need, guessed
//! from the FFN input before any FFN weight is read.
//!
//! A predictor is a small MLP `logits = fc2 · ReLU(fc1 · x + b1) + b2` with `x` the FFN input
//! (after the FFN RMS norm, `n_embd` floats), one logit per neuron (`n_ff`), and a hidden size
//! (rank) chosen per layer. A neuron is predicted active when its logit is `>=` the predictor's
//! decision threshold.
//!
//! This is the inference side; training (profiling-time work) is in `conductor-planner`
//! (`conductor_planner::predictor::train_layer`), which builds predictors through
//! [`Predictor::quantized`] and scores them with [`Predictor::logits_rows`].
//!
//! # Inference ([`Predictor::predict`])
//! Exactly the decode path: `x` quantized with [`Kernels::quantize_activations`] (Q8_0),
//! `matvec` with fc1, `+ b1`, ReLU, the hidden vector quantized the same way, `matvec` with fc2,
//! `+ b2`, compared with the threshold. No allocation once the [`PredictorScratch`] is sized.

use crate::quant::{quantize_row, row_bytes, GgmlType, Kernels, MatRef};
use serde::{Deserialize, Serialize};

/// The weight format of a predictor (and of its activations).
pub const WEIGHT_TYPE: GgmlType = GgmlType::Q8_0;
/// Q8_0 block: `n_embd` and every rank must be a multiple of it.
pub const BLOCK: usize = 32;
/// Minimum tokens of each part of a training set's split (training: `conductor-planner`).
pub const MIN_TRAIN_TOKENS: usize = 32;
pub const MIN_CALIB_TOKENS: usize = 16;
pub const MIN_HELD_OUT_TOKENS: usize = 16;
/// Tokens per quantized evaluation chunk.
const EVAL_CHUNK: usize = 64;

/// Errors of training and loading predictors.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PredictorError {
    #[error("{what}: expected {expected}, got {got}")]
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("n_embd {0} is not a positive multiple of 32 (Q8_0 blocks)")]
    EmbdNotBlockMultiple(usize),
    #[error("n_ff must be positive")]
    NoNeurons,
    #[error("the training set holds no token")]
    Empty,
    #[error(
        "{tokens} tokens are too few to split into {train} training (min {MIN_TRAIN_TOKENS}), \
         {calib} calibration (min {MIN_CALIB_TOKENS}) and {held_out} held-out \
         (min {MIN_HELD_OUT_TOKENS}) tokens"
    )]
    TooFewTokens {
        tokens: usize,
        train: usize,
        calib: usize,
        held_out: usize,
    },
    #[error("non-finite value in the FFN inputs (token {token})")]
    NonFinite { token: usize },
    #[error("invalid predictor config: {0}")]
    Config(String),
    #[error(
        "predictor made for n_embd {pred_embd} x n_ff {pred_ff} cannot serve a layer with \
         n_embd {n_embd} x n_ff {n_ff}"
    )]
    ShapeMismatch {
        pred_embd: usize,
        pred_ff: usize,
        n_embd: usize,
        n_ff: usize,
    },
    #[error("malformed predictor: {0}")]
    Malformed(String),
}

/// `u64` words of one token's active-set bitset.
pub fn bitset_words(n_ff: usize) -> usize {
    n_ff.div_ceil(64)
}

/// A layer's predictor in its inference form: Q8_0 weights, f32 biases, decision threshold.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Predictor {
    n_embd: usize,
    n_ff: usize,
    rank: usize,
    /// `rank × n_embd`, Q8_0 rows.
    fc1: Vec<u8>,
    b1: Vec<f32>,
    /// `n_ff × rank`, Q8_0 rows.
    fc2: Vec<u8>,
    b2: Vec<f32>,
    /// A neuron is predicted active when its logit is `>=` this.
    threshold: f32,
}

/// Reusable buffers of [`Predictor::predict`]; one can serve predictors of any shape (it grows
/// to the largest seen, allocating only then).
#[derive(Clone, Debug, Default)]
pub struct PredictorScratch {
    act: Vec<u8>,
    hidden: Vec<f32>,
    logits: Vec<f32>,
}

impl PredictorScratch {
    /// Buffers sized for `p` (so the first `predict` does not allocate).
    pub fn new(p: &Predictor) -> Self {
        let mut s = PredictorScratch::default();
        s.fit(p);
        s
    }

    fn fit(&mut self, p: &Predictor) {
        let act = row_bytes(WEIGHT_TYPE, p.n_embd.max(p.rank)).unwrap_or(0);
        self.act.resize(act, 0);
        self.hidden.resize(p.rank, 0.0);
        self.logits.resize(p.n_ff, 0.0);
    }
}

impl Predictor {
    pub fn n_embd(&self) -> usize {
        self.n_embd
    }

    pub fn n_ff(&self) -> usize {
        self.n_ff
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn threshold(&self) -> f32 {
        self.threshold
    }

    /// Bytes of weights held (quantized matrices and f32 biases).
    pub fn bytes(&self) -> usize {
        self.fc1.len() + self.fc2.len() + 4 * (self.b1.len() + self.b2.len())
    }

    /// Checks that this predictor serves a layer of `n_embd × n_ff` and is internally consistent
    /// (call it after loading one: `predict` panics on a malformed predictor).
    pub fn validate(&self, n_embd: usize, n_ff: usize) -> Result<(), PredictorError> {
        if self.n_embd != n_embd || self.n_ff != n_ff {
            return Err(PredictorError::ShapeMismatch {
                pred_embd: self.n_embd,
                pred_ff: self.n_ff,
                n_embd,
                n_ff,
            });
        }
        let bad = |m: String| Err(PredictorError::Malformed(m));
        if self.n_embd == 0 || !self.n_embd.is_multiple_of(BLOCK) {
            return bad(format!("n_embd {} not a multiple of 32", self.n_embd));
        }
        if self.rank == 0 || !self.rank.is_multiple_of(BLOCK) || self.n_ff == 0 {
            return bad(format!("rank {} / n_ff {}", self.rank, self.n_ff));
        }
        let fc1 = row_bytes(WEIGHT_TYPE, self.n_embd)
            .ok()
            .and_then(|b| b.checked_mul(self.rank));
        let fc2 = row_bytes(WEIGHT_TYPE, self.rank)
            .ok()
            .and_then(|b| b.checked_mul(self.n_ff));
        if fc1 != Some(self.fc1.len()) || fc2 != Some(self.fc2.len()) {
            return bad(format!(
                "weight bytes fc1 {} / fc2 {} for rank {}",
                self.fc1.len(),
                self.fc2.len(),
                self.rank
            ));
        }
        if self.b1.len() != self.rank || self.b2.len() != self.n_ff {
            return bad(format!(
                "bias lengths {} / {}",
                self.b1.len(),
                self.b2.len()
            ));
        }
        if self.b1.iter().chain(&self.b2).any(|v| !v.is_finite()) || self.threshold.is_nan() {
            return bad("non-finite bias or NaN threshold".into());
        }
        Ok(())
    }

    /// Predicts the active set of one token: bit `n` of `active` (a bitset of [`bitset_words`]`(n_ff)` words: bit `n % 64` of
    /// word `n / 64` is neuron `n`)
    /// is set when neuron `n`'s logit is `>=` the threshold; bits past `n_ff` are cleared.
    ///
    /// # Panics
    /// If `x.len() != n_embd`, `active.len() != bitset_words(n_ff)`, or the predictor is
    /// malformed (see [`Predictor::validate`]).
    pub fn predict(
        &self,
        kernels: &Kernels,
        x: &[f32],
        scratch: &mut PredictorScratch,
        active: &mut [u64],
    ) {
        assert_eq!(
            active.len(),
            bitset_words(self.n_ff),
            "predict: active bitset words"
        );
        let logits = self.logits(kernels, x, scratch);
        set_bits(logits, self.threshold, active);
    }

    /// The logits of one token (what [`Predictor::predict`] compares with the threshold).
    ///
    /// # Panics
    /// As [`Predictor::predict`].
    pub fn logits<'s>(
        &self,
        kernels: &Kernels,
        x: &[f32],
        scratch: &'s mut PredictorScratch,
    ) -> &'s [f32] {
        assert_eq!(x.len(), self.n_embd, "predict: x length");
        scratch.fit(self);
        let (fc1, fc2) = self.mats();
        let xa = row_bytes(WEIGHT_TYPE, self.n_embd).expect("validated n_embd");
        let ha = row_bytes(WEIGHT_TYPE, self.rank).expect("validated rank");
        kernels.quantize_activations(WEIGHT_TYPE, x, &mut scratch.act[..xa]);
        kernels.matvec(fc1, 0..self.n_embd, &scratch.act[..xa], &mut scratch.hidden);
        bias_relu(&mut scratch.hidden, &self.b1);
        kernels.quantize_activations(WEIGHT_TYPE, &scratch.hidden, &mut scratch.act[..ha]);
        kernels.matvec(fc2, 0..self.rank, &scratch.act[..ha], &mut scratch.logits);
        add_bias(&mut scratch.logits, &self.b2);
        &scratch.logits
    }

    fn mats(&self) -> (MatRef<'_>, MatRef<'_>) {
        let fc1 = MatRef::new(WEIGHT_TYPE, &self.fc1, self.rank, self.n_embd)
            .unwrap_or_else(|e| panic!("malformed predictor fc1: {e}"));
        let fc2 = MatRef::new(WEIGHT_TYPE, &self.fc2, self.n_ff, self.rank)
            .unwrap_or_else(|e| panic!("malformed predictor fc2: {e}"));
        (fc1, fc2)
    }

    /// A predictor from given f32 weights (PowerInfer's `fc1`/`fc2`, say), quantized to the
    /// inference form: `fc1` is `rank × n_embd` and `fc2` `n_ff × rank`, both row-major; `b1`
    /// has `rank` values and `b2` `n_ff`. A `rank` that is not a multiple of 32 is zero-padded
    /// to the next one (zero `fc1` rows and `b1` entries, zero `fc2` columns): the padded hidden
    /// units are `ReLU(0) = 0` and meet zero weights, and zeros change no Q8_0 block scale, so
    /// the logits are those of the unpadded network as quantized.
    ///
    /// # Errors
    /// [`PredictorError::EmbdNotBlockMultiple`] unless `n_embd` is a positive multiple of 32,
    /// [`PredictorError::NoNeurons`] for `n_ff == 0`, [`PredictorError::Config`] for
    /// `rank == 0`, [`PredictorError::Length`] for a slice of the wrong length, and
    /// [`PredictorError::Malformed`] for a non-finite weight or bias or a NaN threshold.
    #[allow(clippy::too_many_arguments)]
    pub fn from_weights(
        n_embd: usize,
        n_ff: usize,
        rank: usize,
        fc1: &[f32],
        b1: Vec<f32>,
        fc2: &[f32],
        b2: Vec<f32>,
        threshold: f32,
    ) -> Result<Predictor, PredictorError> {
        if n_embd == 0 || !n_embd.is_multiple_of(BLOCK) {
            return Err(PredictorError::EmbdNotBlockMultiple(n_embd));
        }
        if n_ff == 0 {
            return Err(PredictorError::NoNeurons);
        }
        if rank == 0 {
            return Err(PredictorError::Config("rank must be positive".into()));
        }
        let len = |what: &'static str, expected: Option<usize>, got: usize| match expected {
            Some(e) if e == got => Ok(()),
            e => Err(PredictorError::Length {
                what,
                expected: e.unwrap_or(usize::MAX),
                got,
            }),
        };
        len("fc1 (rank x n_embd)", rank.checked_mul(n_embd), fc1.len())?;
        len("b1 (rank)", Some(rank), b1.len())?;
        len("fc2 (n_ff x rank)", n_ff.checked_mul(rank), fc2.len())?;
        len("b2 (n_ff)", Some(n_ff), b2.len())?;
        if fc1.iter().chain(fc2).any(|v| !v.is_finite()) {
            return Err(PredictorError::Malformed("non-finite weight".into()));
        }
        let padded = rank.div_ceil(BLOCK) * BLOCK;
        let quant = |rows: usize, cols: usize, row: &dyn Fn(usize, &mut [f32])| {
            let rb = row_bytes(WEIGHT_TYPE, cols)
                .map_err(|e| PredictorError::Malformed(e.to_string()))?;
            let mut out = vec![0u8; rows * rb];
            let mut src = vec![0f32; cols];
            for (r, dst) in out.chunks_exact_mut(rb).enumerate() {
                src.fill(0.0);
                row(r, &mut src);
                quantize_row(WEIGHT_TYPE, &src, dst)
                    .map_err(|e| PredictorError::Malformed(e.to_string()))?;
            }
            Ok::<_, PredictorError>(out)
        };
        let q1 = quant(padded, n_embd, &|r, dst| {
            if r < rank {
                dst.copy_from_slice(&fc1[r * n_embd..(r + 1) * n_embd]);
            }
        })?;
        let q2 = quant(n_ff, padded, &|r, dst| {
            dst[..rank].copy_from_slice(&fc2[r * rank..(r + 1) * rank]);
        })?;
        let mut b1 = b1;
        b1.resize(padded, 0.0);
        let p = Predictor {
            n_embd,
            n_ff,
            rank: padded,
            fc1: q1,
            b1,
            fc2: q2,
            b2,
            threshold,
        };
        p.validate(n_embd, n_ff)?;
        Ok(p)
    }

    /// A trained f32 network quantized to the inference form, threshold 0 (set it with
    /// [`Predictor::set_threshold`]): `fc1` is `rank × n_embd` and `fc2` `n_ff × rank`,
    /// row-major, `rank` and `n_embd` multiples of 32 (panics otherwise). Unlike
    /// [`Predictor::from_weights`] nothing is checked or padded: training's own path.
    pub fn quantized(
        n_embd: usize,
        n_ff: usize,
        rank: usize,
        fc1: &[f32],
        b1: &[f32],
        fc2: &[f32],
        b2: &[f32],
    ) -> Predictor {
        let (r, d, f) = (rank, n_embd, n_ff);
        let quant = |w: &[f32], cols: usize| {
            let rb = row_bytes(WEIGHT_TYPE, cols).expect("multiple of 32");
            let mut out = vec![0u8; w.len() / cols * rb];
            for (src, dst) in w.chunks_exact(cols).zip(out.chunks_exact_mut(rb)) {
                quantize_row(WEIGHT_TYPE, src, dst).expect("row geometry");
            }
            out
        };
        Predictor {
            n_embd: d,
            n_ff: f,
            rank: r,
            fc1: quant(fc1, d),
            b1: b1.to_vec(),
            fc2: quant(fc2, r),
            b2: b2.to_vec(),
            threshold: 0.0,
        }
    }

    /// Sets the decision threshold (a neuron is predicted active when its logit is `>=` it).
    pub fn set_threshold(&mut self, threshold: f32) {
        self.threshold = threshold;
    }

    /// Logits of the contiguous tokens `tokens` of `x` (`n_embd` floats a token), `EVAL_CHUNK`
    /// at a time, with `matmul` (bit-identical to [`Predictor::logits`] per token), handed to
    /// `sink(first token, logits rows)`.
    pub fn logits_rows(
        &self,
        kernels: &Kernels,
        x: &[f32],
        tokens: std::ops::Range<usize>,
        mut sink: impl FnMut(usize, &[f32]),
    ) {
        let (fc1, fc2) = self.mats();
        let (d, r, f) = (self.n_embd, self.rank, self.n_ff);
        let xa = row_bytes(WEIGHT_TYPE, d).expect("validated n_embd");
        let ha = row_bytes(WEIGHT_TYPE, r).expect("validated rank");
        let mut act = vec![0u8; EVAL_CHUNK * xa.max(ha)];
        let mut hidden = vec![0f32; EVAL_CHUNK * r];
        let mut logits = vec![0f32; EVAL_CHUNK * f];
        let mut t0 = tokens.start;
        while t0 < tokens.end {
            let n = EVAL_CHUNK.min(tokens.end - t0);
            let x = &x[t0 * d..(t0 + n) * d];
            for (src, dst) in x.chunks_exact(d).zip(act.chunks_exact_mut(xa)) {
                kernels.quantize_activations(WEIGHT_TYPE, src, dst);
            }
            kernels.matmul(fc1, &act[..n * xa], n, &mut hidden[..n * r], r);
            for h in hidden[..n * r].chunks_exact_mut(r) {
                bias_relu(h, &self.b1);
            }
            for (src, dst) in hidden[..n * r]
                .chunks_exact(r)
                .zip(act.chunks_exact_mut(ha))
            {
                kernels.quantize_activations(WEIGHT_TYPE, src, dst);
            }
            kernels.matmul(fc2, &act[..n * ha], n, &mut logits[..n * f], f);
            for l in logits[..n * f].chunks_exact_mut(f) {
                add_bias(l, &self.b2);
            }
            sink(t0, &logits[..n * f]);
            t0 += n;
        }
    }
}

/// `v += b`, element by element.
pub fn add_bias(v: &mut [f32], b: &[f32]) {
    for (v, b) in v.iter_mut().zip(b) {
        *v += b;
    }
}

fn bias_relu(v: &mut [f32], b: &[f32]) {
    for (v, b) in v.iter_mut().zip(b) {
        *v = (*v + b).max(0.0);
    }
}

/// The active-set bitset of one token's logits: bit `n` set when `logits[n] >= threshold`.
pub fn set_bits(logits: &[f32], threshold: f32, active: &mut [u64]) {
    active.fill(0);
    for (word, chunk) in active.iter_mut().zip(logits.chunks(64)) {
        let mut bits = 0u64;
        for (i, &z) in chunk.iter().enumerate() {
            bits |= u64::from(z >= threshold) << i;
        }
        *word = bits;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A predictor of `d × f` at rank 32 from deterministic weights.
    fn predictor(d: usize, f: usize) -> Predictor {
        let r = 32;
        let w = |n: usize, k: u32| -> Vec<f32> {
            (0..n)
                .map(|i| {
                    ((i as u32).wrapping_mul(2_654_435_761) ^ k) as f32 / u32::MAX as f32 - 0.5
                })
                .collect()
        };
        Predictor::from_weights(d, f, r, &w(r * d, 1), w(r, 2), &w(f * r, 3), w(f, 4), 0.1).unwrap()
    }

    #[test]
    fn validate_catches_other_shapes_and_corruption() {
        let (d, f) = (64, 80);
        let p = predictor(d, f);
        p.validate(d, f).unwrap();
        let msg = p.validate(576, 1536).unwrap_err().to_string();
        assert!(msg.contains("n_embd 64 x n_ff 80") && msg.contains("n_embd 576 x n_ff 1536"));
        assert!(p.validate(d, f + 1).is_err());
        assert_eq!(p.bytes(), 32 * 2 * 34 + 80 * 34 + 4 * (32 + 80));
        let mut bad = p.clone();
        bad.fc2.pop();
        assert!(matches!(
            bad.validate(d, f),
            Err(PredictorError::Malformed(_))
        ));
        let mut bad = p.clone();
        bad.set_threshold(f32::NAN);
        assert!(bad.validate(d, f).is_err());
    }

    #[test]
    fn batched_logits_are_the_per_token_logits() {
        let (d, f) = (64, 80);
        let p = predictor(d, f);
        let x: Vec<f32> = (0..100 * d)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        for kernels in Kernels::available() {
            let mut scratch = PredictorScratch::default();
            let mut rows = Vec::new();
            p.logits_rows(&kernels, &x, 3..100, |_, l| rows.extend_from_slice(l));
            for (i, t) in (3..100).enumerate() {
                let l = p.logits(&kernels, &x[t * d..(t + 1) * d], &mut scratch);
                let want: Vec<u32> = rows[i * f..(i + 1) * f]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                let got: Vec<u32> = l.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{}", kernels.isa());
            }
        }
    }
}

//! Training of the per-layer activation predictors (`conductor_runtime::sparse::predictor`):
//! profiling-time work, run by `conductor profile`. The runtime keeps the inference form
//! ([`Predictor`]: loading, validation, `predict`).
//!
//! # Training ([`train_layer`])
//! The tokens of a [`TrainingSet`] are split, in order, into a training part, a calibration
//! slice (the tail of the training part, not used for gradient steps) and a held-out part (the
//! last `held_out_fraction` of the tokens, contiguous, so held-out text is unseen). For each rank
//! candidate the f32 network is trained with Adam on recall-weighted BCE (positives weigh
//! `positive_weight`), then quantized to the inference form ([`Predictor`], Q8_0 weights), and
//! the threshold is chosen on the *quantized* calibration logits so that calibration recall is at
//! least `target_recall + recall_margin`. Recall, precision and the predicted fraction are then
//! measured on the held-out tokens with the same quantized path that decode runs, and the rank
//! with the lowest expected per-token cost among those meeting the target is kept. Candidates
//! are trained ascending; the search stops once a rank meets the target without costing less
//! than a smaller one that met it, since larger ranks then buy precision too slowly to pay for
//! their own work (on SmolLM2 this trains 2 of the 4 default ranks in 29 of 30 layers).
//!
//! Training is single-threaded and deterministic: the initialisation and shuffling come from a
//! seeded splitmix64, and every float sum is computed in a fixed order (the f32 products use the
//! crate's F32 dot kernels, which are bit-identical across ISAs), so the same set, config and
//! seed give a bit-identical predictor. Layers are independent; a driver may train several on
//! its own threads.

mod points;

use conductor_runtime::quant::{GgmlType, Kernels, MatRef};
use conductor_runtime::sparse::predictor::{
    add_bias, bitset_words, set_bits, Predictor, PredictorError, BLOCK, MIN_CALIB_TOKENS,
    MIN_HELD_OUT_TOKENS, MIN_TRAIN_TOKENS,
};
pub use points::operating_points;
use serde::{Deserialize, Serialize};

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

    fn check(&self) -> Result<usize, PredictorError> {
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

    fn row(&self, t: usize) -> &'a [f32] {
        &self.x[t * self.n_embd..(t + 1) * self.n_embd]
    }
}

/// How [`train_layer`] trains and chooses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PredictorConfig {
    /// Hidden sizes to try, each a positive multiple of 32 (tried ascending).
    pub ranks: Vec<usize>,
    /// Held-out recall a predictor must reach (share of truly active neuron-tokens predicted).
    pub target_recall: f32,
    /// The threshold is set for `target_recall + recall_margin` on the calibration slice, so
    /// that held-out recall lands at or above the target.
    pub recall_margin: f32,
    pub epochs: usize,
    /// Tokens per Adam step.
    pub batch: usize,
    /// Adam's initial step size (decays linearly to a tenth over the run).
    pub learning_rate: f32,
    /// Weight of an active neuron's BCE term (inactive ones weigh 1).
    pub positive_weight: f32,
    /// AdamW's decoupled weight decay of fc1/fc2 (per unit of learning rate).
    pub weight_decay: f32,
    /// Share of the tokens (the last ones, contiguous) held out for the reported figures.
    pub held_out_fraction: f32,
    /// Share of the remaining tokens (their tail) kept out of the gradient steps to calibrate
    /// the threshold.
    pub calibration_fraction: f32,
    pub seed: u64,
}

impl Default for PredictorConfig {
    fn default() -> Self {
        PredictorConfig {
            ranks: vec![32, 64, 128, 256],
            target_recall: 0.99,
            recall_margin: 0.003,
            epochs: 12,
            batch: 32,
            learning_rate: 1e-2,
            positive_weight: 2.0,
            weight_decay: 1.0,
            held_out_fraction: 0.2,
            calibration_fraction: 0.15,
            seed: 0x5eed_c0de,
        }
    }
}

impl PredictorConfig {
    fn check(&self) -> Result<(), PredictorError> {
        let bad = |m: String| Err(PredictorError::Config(m));
        if self.ranks.is_empty() {
            return bad("no rank candidate".into());
        }
        if let Some(r) = self
            .ranks
            .iter()
            .find(|&&r| r == 0 || !r.is_multiple_of(BLOCK))
        {
            return bad(format!("rank {r} is not a positive multiple of 32"));
        }
        if !(self.target_recall > 0.0 && self.target_recall <= 1.0) {
            return bad(format!(
                "target_recall {} outside (0, 1]",
                self.target_recall
            ));
        }
        if !(self.recall_margin >= 0.0 && self.recall_margin < 1.0) {
            return bad(format!(
                "recall_margin {} outside [0, 1)",
                self.recall_margin
            ));
        }
        if self.epochs == 0 || self.batch == 0 {
            return bad("epochs and batch must be positive".into());
        }
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0) {
            return bad(format!("learning_rate {}", self.learning_rate));
        }
        if !(self.positive_weight.is_finite() && self.positive_weight > 0.0) {
            return bad(format!("positive_weight {}", self.positive_weight));
        }
        if !(self.weight_decay >= 0.0 && self.learning_rate * self.weight_decay < 1.0) {
            return bad(format!("weight_decay {}", self.weight_decay));
        }
        for (name, f) in [
            ("held_out_fraction", self.held_out_fraction),
            ("calibration_fraction", self.calibration_fraction),
        ] {
            if !(f > 0.0 && f < 1.0) {
                return bad(format!("{name} {f} outside (0, 1)"));
            }
        }
        Ok(())
    }
}

/// The figures of one rank candidate, measured on the held-out tokens with the quantized
/// inference path.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankReport {
    pub rank: usize,
    /// Held-out recall: predicted-and-active / active.
    pub recall: f32,
    /// Held-out precision: predicted-and-active / predicted.
    pub precision: f32,
    /// Share of the held-out neuron-tokens predicted active.
    pub predicted_fraction: f32,
    /// Expected weights touched per token: `rank·(n_embd + n_ff) + predicted_fraction · n_ff ·
    /// 3 · n_embd` (the predictor, then gate/up/down of the predicted neurons).
    pub cost: f64,
    /// Recall on the calibration slice at the chosen threshold.
    pub calibration_recall: f32,
    pub threshold: f32,
}

/// The result of [`train_layer`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainedPredictor {
    /// The chosen predictor.
    pub predictor: Predictor,
    /// The chosen rank's figures (also in `tried`).
    pub chosen: RankReport,
    /// Whether the chosen predictor reaches `target_recall` on the held-out tokens; when no rank
    /// does, the one with the best held-out recall is chosen and this is false.
    pub meets_target: bool,
    /// Every rank trained, ascending.
    pub tried: Vec<RankReport>,
    /// Ranks not trained because even a perfect predictor of that rank would cost more than
    /// the best one already meeting the target.
    pub skipped: Vec<usize>,
    /// Ranks not trained because the rank before them met the target without costing less
    /// than the best smaller one: returns are taken as diminishing from there on (a larger
    /// rank buys a few points of precision for more predictor work per token).
    pub stopped: Vec<usize>,
    /// Share of held-out neuron-tokens truly active.
    pub base_rate: f32,
    /// Dense per-token cost (`n_ff · 3 · n_embd`), for comparison with `chosen.cost`.
    pub dense_cost: f64,
    pub train_tokens: usize,
    pub calibration_tokens: usize,
    pub held_out_tokens: usize,
}

/// Deterministic generator for initialisation and shuffling.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[-a, a)`.
    fn uniform(&mut self, a: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        (2.0 * u - 1.0) * a
    }

    /// Uniform in `0..n` (n > 0; the modulo bias is irrelevant here).
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// The f32 network's geometry; its parameters live in one vector `[w1 | b1 | w2 | b2]` so Adam
/// runs over them in one loop.
struct Net {
    r: usize,
    d: usize,
    f: usize,
}

impl Net {
    fn len(&self) -> usize {
        self.r * self.d + self.r + self.f * self.r + self.f
    }
    fn split(&self) -> [usize; 3] {
        let b1 = self.r * self.d;
        let w2 = b1 + self.r;
        let b2 = w2 + self.f * self.r;
        [b1, w2, b2]
    }
    fn w1<'p>(&self, p: &'p [f32]) -> &'p [f32] {
        &p[..self.split()[0]]
    }
    fn b1<'p>(&self, p: &'p [f32]) -> &'p [f32] {
        let s = self.split();
        &p[s[0]..s[1]]
    }
    fn w2<'p>(&self, p: &'p [f32]) -> &'p [f32] {
        let s = self.split();
        &p[s[1]..s[2]]
    }
    fn b2<'p>(&self, p: &'p [f32]) -> &'p [f32] {
        &p[self.split()[2]..]
    }
    fn parts_mut<'p>(&self, p: &'p mut [f32]) -> [&'p mut [f32]; 4] {
        let [s0, s1, s2] = self.split();
        let (w1, rest) = p.split_at_mut(s0);
        let (b1, rest) = rest.split_at_mut(s1 - s0);
        let (w2, b2) = rest.split_at_mut(s2 - s1);
        [w1, b1, w2, b2]
    }
}

/// Little-endian bytes of `src` into `dst` (the F32 layout of the quant kernels).
fn put_f32(dst: &mut [u8], src: &[f32]) {
    for (d, s) in dst.chunks_exact_mut(4).zip(src) {
        d.copy_from_slice(&s.to_le_bytes());
    }
}

/// The transpose of the `rows × cols` matrix `src`, as F32 bytes (`cols × rows`).
fn put_transposed(dst: &mut [u8], src: &[f32], rows: usize, cols: usize) {
    const TILE: usize = 16;
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    let o = 4 * (c * rows + r);
                    dst[o..o + 4].copy_from_slice(&src[r * cols + c].to_le_bytes());
                }
            }
        }
    }
}

/// `out[i * out_stride + j] = dot(a row i, w row j)` for `m` rows `a` and `n` rows `w` of `k`
/// F32 values (as bytes), tiled so that a block of `w` rows stays in cache across tokens. Each
/// output is one F32 dot of the quant kernels (a fixed reduction order).
#[allow(clippy::too_many_arguments)]
fn mm_nt(
    kernels: &Kernels,
    w: &[u8],
    n: usize,
    a: &[u8],
    m: usize,
    k: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let rb = (32 * 1024 / (4 * k)).clamp(4, n.max(4));
    let tb = (256 * 1024 / (4 * k)).clamp(1, m.max(1));
    for j0 in (0..n).step_by(rb) {
        let j1 = (j0 + rb).min(n);
        let mat = MatRef::new(GgmlType::F32, &w[4 * k * j0..4 * k * j1], j1 - j0, k)
            .expect("F32 block geometry");
        for i0 in (0..m).step_by(tb) {
            let i1 = (i0 + tb).min(m);
            kernels.matmul(
                mat,
                &a[4 * k * i0..4 * k * i1],
                i1 - i0,
                &mut out[i0 * out_stride + j0..],
                out_stride,
            );
        }
    }
}

/// Buffers of one training run (one rank).
struct Trainer<'s, 'a> {
    set: &'s TrainingSet<'a>,
    kernels: Kernels,
    net: Net,
    params: Vec<f32>,
    grad: Vec<f32>,
    adam_m: Vec<f32>,
    adam_v: Vec<f32>,
    step: u64,
    /// F32 bytes of w1 (`r × d`), w2 (`f × r`) and w2ᵀ (`r × f`), refreshed after each step.
    w1b: Vec<u8>,
    w2b: Vec<u8>,
    w2tb: Vec<u8>,
    // Per-batch buffers (`bsz` tokens).
    xb: Vec<u8>,
    xtb: Vec<u8>,
    hpre: Vec<f32>,
    hb: Vec<u8>,
    htb: Vec<u8>,
    z: Vec<f32>,
    gb: Vec<u8>,
    gtb: Vec<u8>,
    dh: Vec<f32>,
    dhtb: Vec<u8>,
    xrows: Vec<f32>,
}

impl<'s, 'a> Trainer<'s, 'a> {
    fn new(set: &'s TrainingSet<'a>, r: usize, batch: usize, prior: &[f32], seed: u64) -> Self {
        let (d, f) = (set.n_embd, set.n_ff);
        let net = Net { r, d, f };
        let mut params = vec![0f32; net.len()];
        let mut rng = SplitMix64(seed ^ (r as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
        {
            let [w1, b1, w2, b2] = net.parts_mut(&mut params);
            let a1 = 1.0 / (d as f32).sqrt();
            w1.iter_mut().for_each(|w| *w = rng.uniform(a1));
            b1.iter_mut().for_each(|b| *b = rng.uniform(0.1));
            let a2 = 1.0 / (r as f32).sqrt();
            w2.iter_mut().for_each(|w| *w = rng.uniform(a2));
            // Start every neuron at its base rate.
            for (b, &p) in b2.iter_mut().zip(prior) {
                let p = p.clamp(1e-3, 1.0 - 1e-3);
                *b = (p / (1.0 - p)).ln();
            }
        }
        let n = net.len();
        let mut t = Trainer {
            set,
            kernels: Kernels::best(),
            net,
            params,
            grad: vec![0.0; n],
            adam_m: vec![0.0; n],
            adam_v: vec![0.0; n],
            step: 0,
            w1b: vec![0; 4 * r * d],
            w2b: vec![0; 4 * f * r],
            w2tb: vec![0; 4 * r * f],
            xb: vec![0; 4 * batch * d],
            xtb: vec![0; 4 * batch * d],
            hpre: vec![0.0; batch * r],
            hb: vec![0; 4 * batch * r],
            htb: vec![0; 4 * batch * r],
            z: vec![0.0; batch * f],
            gb: vec![0; 4 * batch * f],
            gtb: vec![0; 4 * batch * f],
            dh: vec![0.0; batch * r],
            dhtb: vec![0; 4 * batch * r],
            xrows: vec![0.0; batch * d],
        };
        t.refresh_weights();
        t
    }

    fn refresh_weights(&mut self) {
        let Net { r, f, .. } = self.net;
        put_f32(&mut self.w1b, self.net.w1(&self.params));
        let w2 = self.net.w2(&self.params);
        put_f32(&mut self.w2b, w2);
        put_transposed(&mut self.w2tb, w2, f, r);
    }

    /// One Adam step on the tokens `idx`.
    fn step(&mut self, idx: &[usize], lr: f32, pos_weight: f32, weight_decay: f32) {
        let Net { r, d, f } = self.net;
        let b = idx.len();
        let k = &self.kernels;
        // Gather the batch rows.
        for (row, &t) in self.xrows.chunks_exact_mut(d).zip(idx) {
            row.copy_from_slice(self.set.row(t));
        }
        let xrows = &self.xrows[..b * d];
        put_f32(&mut self.xb[..4 * b * d], xrows);
        put_transposed(&mut self.xtb[..4 * b * d], xrows, b, d);

        // Forward: hpre = x·w1ᵀ + b1, h = ReLU(hpre), z = h·w2ᵀ + b2.
        let hpre = &mut self.hpre[..b * r];
        mm_nt(k, &self.w1b, r, &self.xb, b, d, hpre, r);
        let b1 = self.net.b1(&self.params);
        for row in hpre.chunks_exact_mut(r) {
            add_bias(row, b1);
        }
        for (dst, &v) in self.hb.chunks_exact_mut(4).zip(hpre.iter()) {
            dst.copy_from_slice(&v.max(0.0).to_le_bytes());
        }
        let hb = &self.hb[..4 * b * r];
        let z = &mut self.z[..b * f];
        mm_nt(k, &self.w2b, f, hb, b, r, z, f);
        let b2 = self.net.b2(&self.params);
        // dL/dz of the weighted BCE, mean over tokens: w_y · (σ(z) − y) / b.
        let (wp, wn) = (pos_weight / b as f32, 1.0 / b as f32);
        let words = bitset_words(f);
        for (zrow, &t) in z.chunks_exact_mut(f).zip(idx) {
            let bits = &self.set.active[t * words..(t + 1) * words];
            for (n, (zv, bias)) in zrow.iter_mut().zip(b2).enumerate() {
                let y = (bits[n / 64] >> (n % 64)) & 1 == 1;
                let s = 1.0 / (1.0 + (-(*zv + bias)).exp());
                *zv = if y { (s - 1.0) * wp } else { s * wn };
            }
        }
        let g = &*z;
        put_f32(&mut self.gb[..4 * b * f], g);
        put_transposed(&mut self.gtb[..4 * b * f], g, b, f);
        // hᵀ (the ReLU of hpre, transposed).
        for ti in 0..b {
            for j in 0..r {
                let v = self.hpre[ti * r + j].max(0.0);
                let o = 4 * (j * b + ti);
                self.htb[o..o + 4].copy_from_slice(&v.to_le_bytes());
            }
        }

        // Backward.
        let [s0, s1, s2] = self.net.split();
        let (gw1, rest) = self.grad.split_at_mut(s0);
        let (gb1, rest) = rest.split_at_mut(s1 - s0);
        let (gw2, gb2) = rest.split_at_mut(s2 - s1);
        // db2 = Σ_t g[t], dw2[n][j] = Σ_t g[t][n] h[t][j].
        gb2.fill(0.0);
        for row in g.chunks_exact(f) {
            add_bias(gb2, row);
        }
        mm_nt(k, &self.htb, r, &self.gtb, f, b, gw2, r);
        // dh = g·w2, masked by the ReLU; db1 = Σ_t dh[t]; dw1[j][i] = Σ_t dh[t][j] x[t][i].
        let dh = &mut self.dh[..b * r];
        mm_nt(k, &self.w2tb, r, &self.gb[..4 * b * f], b, f, dh, r);
        for (dv, &hp) in dh.iter_mut().zip(self.hpre.iter()) {
            if hp <= 0.0 {
                *dv = 0.0;
            }
        }
        gb1.fill(0.0);
        for row in dh.chunks_exact(r) {
            add_bias(gb1, row);
        }
        put_transposed(&mut self.dhtb[..4 * b * r], dh, b, r);
        mm_nt(k, &self.xtb, d, &self.dhtb[..4 * b * r], r, b, gw1, d);

        // AdamW (decoupled weight decay on fc1/fc2, not on the biases).
        self.step += 1;
        let (b1c, b2c) = (0.9f32, 0.999f32);
        let bc1 = 1.0 - b1c.powi(self.step.min(1 << 20) as i32);
        let bc2 = 1.0 - b2c.powi(self.step.min(1 << 20) as i32);
        let lr_t = lr * bc2.sqrt() / bc1;
        let bounds = [0, s0, s1, s2, self.params.len()];
        for part in 0..4 {
            let range = bounds[part]..bounds[part + 1];
            let keep = if part % 2 == 0 {
                1.0 - lr * weight_decay
            } else {
                1.0
            };
            for (((p, &g), m), v) in self.params[range.clone()]
                .iter_mut()
                .zip(&self.grad[range.clone()])
                .zip(&mut self.adam_m[range.clone()])
                .zip(&mut self.adam_v[range])
            {
                *m = b1c * *m + (1.0 - b1c) * g;
                *v = b2c * *v + (1.0 - b2c) * g * g;
                *p = *p * keep - lr_t * *m / (v.sqrt() + 1e-8);
            }
        }
        self.refresh_weights();
    }
}

/// Token ranges of the split: training, calibration, held-out.
fn split(
    tokens: usize,
    cfg: &PredictorConfig,
) -> Result<[std::ops::Range<usize>; 3], PredictorError> {
    let held = ((tokens as f64) * f64::from(cfg.held_out_fraction)).ceil() as usize;
    let held = held.min(tokens);
    let rest = tokens - held;
    let calib = (((rest as f64) * f64::from(cfg.calibration_fraction)).ceil() as usize).min(rest);
    let train = rest - calib;
    if train < MIN_TRAIN_TOKENS || calib < MIN_CALIB_TOKENS || held < MIN_HELD_OUT_TOKENS {
        return Err(PredictorError::TooFewTokens {
            tokens,
            train,
            calib,
            held_out: held,
        });
    }
    Ok([0..train, train..rest, rest..tokens])
}

/// Trains one layer's predictor: the rank candidates ascending, skipping those that cannot beat
/// the best so far and stopping once a rank that meets the target costs no less than a smaller
/// one that met it (see [`TrainedPredictor::stopped`]), each quantized and calibrated, and
/// keeps the cheapest one whose held-out recall meets the target (see the module docs). `progress` gets the share of the work done,
/// in `[0, 1]`, after every epoch.
pub fn train_layer(
    set: &TrainingSet,
    cfg: &PredictorConfig,
    progress: &mut dyn FnMut(f32),
) -> Result<TrainedPredictor, PredictorError> {
    let tokens = set.check()?;
    cfg.check()?;
    if let Some(t) = set
        .x
        .chunks_exact(set.n_embd)
        .position(|row| row.iter().any(|v| !v.is_finite()))
    {
        return Err(PredictorError::NonFinite { token: t });
    }
    let [train, calib, held] = split(tokens, cfg)?;
    let (d, f) = (set.n_embd, set.n_ff);
    let kernels = Kernels::best();

    let mut ranks = cfg.ranks.clone();
    ranks.sort_unstable();
    ranks.dedup();

    // Per-neuron base rates on the training tokens (initial b2) and the held-out base rate.
    let mut counts = vec![0u32; f];
    for t in train.clone() {
        for (n, c) in counts.iter_mut().enumerate() {
            *c += u32::from(set.is_active(t, n));
        }
    }
    let prior: Vec<f32> = counts
        .iter()
        .map(|&c| c as f32 / train.len() as f32)
        .collect();
    let held_active: u64 = held.clone().map(|t| active_count(set, t)).sum::<u64>();
    let base_rate = held_active as f32 / (held.len() * f) as f32;
    let neuron_cost = (f * 3 * d) as f64;
    let cost_of = |r: usize, frac: f32| (r * (d + f)) as f64 + f64::from(frac) * neuron_cost;

    let batch = cfg.batch.min(train.len());
    let steps_per_epoch = train.len().div_ceil(batch);
    let total_work: f64 = ranks.iter().map(|&r| (r * cfg.epochs) as f64).sum();
    let mut done_work = 0f64;

    let mut tried: Vec<RankReport> = Vec::new();
    let mut skipped = Vec::new();
    let mut best: Option<(RankReport, Predictor)> = None;
    let mut stopped = Vec::new();
    let mut best_meeting_cost = f64::INFINITY;
    let mut diminishing = false;
    for &r in &ranks {
        if diminishing {
            stopped.push(r);
            done_work += (r * cfg.epochs) as f64;
            progress((done_work / total_work) as f32);
            continue;
        }
        // A predictor meeting the target predicts at least target · base_rate of the neurons.
        if cost_of(r, cfg.target_recall * base_rate) > best_meeting_cost {
            skipped.push(r);
            done_work += (r * cfg.epochs) as f64;
            progress((done_work / total_work) as f32);
            continue;
        }
        let mut tr = Trainer::new(set, r, batch, &prior, cfg.seed);
        let mut rng = SplitMix64(cfg.seed.wrapping_add(0x0bad_5eed));
        let mut order: Vec<usize> = train.clone().collect();
        let total_steps = (cfg.epochs * steps_per_epoch) as f32;
        for _ in 0..cfg.epochs {
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
            for idx in order.chunks(batch) {
                let lr = cfg.learning_rate * (1.0 - 0.9 * tr.step as f32 / total_steps);
                tr.step(idx, lr, cfg.positive_weight, cfg.weight_decay);
            }
            done_work += r as f64;
            progress((done_work / total_work) as f32);
        }
        let net = &tr.net;
        let mut p = Predictor::quantized(
            net.d,
            net.f,
            net.r,
            net.w1(&tr.params),
            net.b1(&tr.params),
            net.w2(&tr.params),
            net.b2(&tr.params),
        );
        drop(tr);

        // Threshold: the calibration recall target on the quantized logits.
        let mut cal_logits = Vec::with_capacity(calib.len() * f);
        p.logits_rows(&kernels, set.x, calib.clone(), |_, l| {
            cal_logits.extend_from_slice(l)
        });
        let want = (cfg.target_recall + cfg.recall_margin).min(1.0);
        let (threshold, calibration_recall) = calibrate(
            &cal_logits,
            |i| set.is_active(calib.start + i / f, i % f),
            want,
        );
        p.set_threshold(threshold);
        drop(cal_logits);

        // Held-out figures with the same path.
        let (mut tp, mut fp, mut fneg) = (0u64, 0u64, 0u64);
        let words = bitset_words(f);
        let mut pred = vec![0u64; words];
        p.logits_rows(&kernels, set.x, held.clone(), |t0, logits| {
            for (i, row) in logits.chunks_exact(f).enumerate() {
                set_bits(row, p.threshold(), &mut pred);
                let truth = &set.active[(t0 + i) * words..(t0 + i + 1) * words];
                for (wi, (&pw, &tw)) in pred.iter().zip(truth).enumerate() {
                    let tw = tw & word_mask(f, wi);
                    tp += u64::from((pw & tw).count_ones());
                    fp += u64::from((pw & !tw).count_ones());
                    fneg += u64::from((!pw & tw).count_ones());
                }
            }
        });
        let recall = if tp + fneg == 0 {
            1.0
        } else {
            tp as f32 / (tp + fneg) as f32
        };
        let precision = if tp + fp == 0 {
            1.0
        } else {
            tp as f32 / (tp + fp) as f32
        };
        let predicted_fraction = (tp + fp) as f32 / (held.len() * f) as f32;
        let report = RankReport {
            rank: r,
            recall,
            precision,
            predicted_fraction,
            cost: cost_of(r, predicted_fraction),
            calibration_recall,
            threshold: p.threshold(),
        };
        tried.push(report.clone());
        let meets = recall >= cfg.target_recall;
        if meets {
            // Doubling the rank did not pay for itself: stop searching upwards.
            diminishing = report.cost >= best_meeting_cost;
            best_meeting_cost = best_meeting_cost.min(report.cost);
        }
        let better = match &best {
            None => true,
            Some((b, _)) => {
                let b_meets = b.recall >= cfg.target_recall;
                match (meets, b_meets) {
                    (true, false) => true,
                    (false, true) => false,
                    (true, true) => report.cost < b.cost,
                    (false, false) => report.recall > b.recall,
                }
            }
        };
        if better {
            best = Some((report, p));
        }
    }
    progress(1.0);
    let (chosen, predictor) = best.expect("at least one rank is trained");
    Ok(TrainedPredictor {
        predictor,
        meets_target: chosen.recall >= cfg.target_recall,
        chosen,
        tried,
        skipped,
        stopped,
        base_rate,
        dense_cost: neuron_cost,
        train_tokens: train.len(),
        calibration_tokens: calib.len(),
        held_out_tokens: held.len(),
    })
}

/// Mask of the neurons `< n_ff` in bitset word `wi`.
fn word_mask(n_ff: usize, wi: usize) -> u64 {
    let valid = n_ff.saturating_sub(wi * 64).min(64);
    if valid == 64 {
        u64::MAX
    } else {
        (1u64 << valid) - 1
    }
}

fn active_count(set: &TrainingSet, t: usize) -> u64 {
    let words = bitset_words(set.n_ff);
    set.active[t * words..(t + 1) * words]
        .iter()
        .enumerate()
        .map(|(wi, &w)| u64::from((w & word_mask(set.n_ff, wi)).count_ones()))
        .sum()
}

/// The decision threshold for calibration logits `logits` (`tokens × n_ff`, truth `is_pos`):
/// the largest `τ` at which the share of positive logits `>= τ` is at least `want`, then lowered
/// to the smallest positive logit above every negative logit under it (recall for free: no
/// calibration negative is added). `+∞` when there is no positive (nothing needs predicting).
/// Returns the threshold and the calibration recall at it.
fn calibrate(logits: &[f32], is_pos: impl Fn(usize) -> bool, want: f32) -> (f32, f32) {
    let mut pos: Vec<f32> = Vec::new();
    for (i, &z) in logits.iter().enumerate() {
        if is_pos(i) {
            pos.push(z);
        }
    }
    if pos.is_empty() {
        return (f32::INFINITY, 1.0);
    }
    let tq = recall_threshold(&mut pos, want);
    let neg_below = logits
        .iter()
        .enumerate()
        .filter(|&(i, &z)| z < tq && !is_pos(i))
        .map(|(_, &z)| z)
        .fold(f32::NEG_INFINITY, f32::max);
    // `pos` is sorted: the first positive above `neg_below` (at most `tq`).
    let first = pos.partition_point(|&z| z <= neg_below);
    let t = pos[first.min(pos.len() - 1)].min(tq);
    let kept = pos.len() - pos.partition_point(|&z| z < t);
    (t, kept as f32 / pos.len() as f32)
}

/// The largest threshold `τ` such that the share of `pos` logits `>= τ` is at least `want`
/// (`+∞` when `pos` is empty). Sorts `pos`.
fn recall_threshold(pos: &mut [f32], want: f32) -> f32 {
    if pos.is_empty() {
        return f32::INFINITY;
    }
    pos.sort_unstable_by(f32::total_cmp);
    let n = pos.len() as f64;
    // The fewest kept positives with kept / n >= want (the tolerance absorbs want's f32
    // rounding, e.g. 0.99f32 = 0.99000001).
    let keep = ((f64::from(want) * n * (1.0 - 1e-7)).ceil() as usize).clamp(1, pos.len());
    pos[pos.len() - keep]
}

#[cfg(test)]
mod tests {
    use super::*;
    use conductor_runtime::sparse::predictor::PredictorScratch;

    /// Synthetic layer: x Gaussian-ish with `n_embd` dims, active_j = (A·x)_j > c_j for a random
    /// rank-`k` A (`n_ff × n_embd`), c_j set for an active share around `share`.
    fn synthetic(
        tokens: usize,
        n_embd: usize,
        n_ff: usize,
        k: usize,
        share: f32,
        seed: u64,
    ) -> (Vec<f32>, Vec<u64>) {
        let mut rng = SplitMix64(seed);
        let gauss = |rng: &mut SplitMix64| {
            (0..4).map(|_| rng.uniform(1.0)).sum::<f32>() * (3.0f32 / 4.0).sqrt()
        };
        let u: Vec<f32> = (0..n_ff * k).map(|_| gauss(&mut rng)).collect();
        let v: Vec<f32> = (0..k * n_embd).map(|_| gauss(&mut rng)).collect();
        let x: Vec<f32> = (0..tokens * n_embd).map(|_| gauss(&mut rng)).collect();
        // Gaussian z ~ N(0, σ²): threshold at the quantile for `share` (probit approximation).
        let q = {
            // Inverse normal CDF at 1 - share (Acklam-lite: good enough for a share).
            let p = 1.0 - share as f64;
            let t = (-2.0 * (p.min(1.0 - p)).ln()).sqrt();
            let z = t
                - (2.515517 + 0.802853 * t + 0.010328 * t * t)
                    / (1.0 + 1.432788 * t + 0.189269 * t * t + 0.001308 * t * t * t);
            if p >= 0.5 {
                z
            } else {
                -z
            }
        } as f32;
        let words = bitset_words(n_ff);
        let mut active = vec![0u64; tokens * words];
        let mut vx = vec![0f32; k];
        for t in 0..tokens {
            let xr = &x[t * n_embd..(t + 1) * n_embd];
            for (j, o) in vx.iter_mut().enumerate() {
                *o = v[j * n_embd..(j + 1) * n_embd]
                    .iter()
                    .zip(xr)
                    .map(|(a, b)| a * b)
                    .sum();
            }
            let sd = ((k * n_embd) as f32).sqrt();
            for n in 0..n_ff {
                let z: f32 = u[n * k..(n + 1) * k]
                    .iter()
                    .zip(&vx)
                    .map(|(a, b)| a * b)
                    .sum::<f32>()
                    / sd;
                if z > q {
                    active[t * words + n / 64] |= 1 << (n % 64);
                }
            }
        }
        (x, active)
    }

    fn small_cfg() -> PredictorConfig {
        PredictorConfig {
            ranks: vec![32, 64],
            epochs: 8,
            ..PredictorConfig::default()
        }
    }

    #[test]
    fn learns_a_low_rank_rule() {
        let (d, f) = (128, 320);
        let (x, active) = synthetic(3000, d, f, 8, 0.3, 7);
        let set = TrainingSet::new(&x, &active, d, f).unwrap();
        let mut calls = 0;
        let mut last = 0.0;
        let tp = train_layer(&set, &small_cfg(), &mut |p| {
            assert!(p >= last && p <= 1.0);
            last = p;
            calls += 1;
        })
        .unwrap();
        eprintln!("{tp:#?}");
        assert!(calls > 1 && last == 1.0);
        assert!(tp.meets_target, "{:?}", tp.tried);
        assert!(tp.chosen.recall >= 0.99);
        assert!(
            tp.chosen.precision > 0.7 && tp.chosen.precision > 2.0 * tp.base_rate,
            "precision {} vs base rate {}",
            tp.chosen.precision,
            tp.base_rate
        );
        assert!(tp.chosen.predicted_fraction < 0.4);
        assert_eq!(
            tp.train_tokens + tp.calibration_tokens + tp.held_out_tokens,
            3000
        );
        tp.predictor.validate(d, f).unwrap();
    }

    #[test]
    fn stops_once_a_larger_rank_does_not_pay() {
        // A rank-4 rule blurred by random extra actives, which no rank can predict: a recall
        // of 0.99 needs nearly every neuron predicted at any rank, so the cost bound does not
        // skip 64, and rank 64 meets the target for more predictor work per token; 96 and 128
        // are not trained.
        let (d, f) = (128, 256);
        let (x, mut active) = synthetic(1500, d, f, 4, 0.3, 11);
        let mut rng = SplitMix64(5);
        for w in active.iter_mut() {
            for _ in 0..6 {
                *w |= 1 << rng.below(64);
            }
        }
        let set = TrainingSet::new(&x, &active, d, f).unwrap();
        let cfg = PredictorConfig {
            ranks: vec![128, 32, 96, 64],
            epochs: 6,
            ..PredictorConfig::default()
        };
        let tp = train_layer(&set, &cfg, &mut |_| {}).unwrap();
        let tried: Vec<usize> = tp.tried.iter().map(|r| r.rank).collect();
        assert_eq!(tried, [32, 64], "{tp:#?}");
        assert!(tp.tried.iter().all(|r| r.recall >= 0.99), "{:?}", tp.tried);
        assert!(tp.tried[1].cost >= tp.tried[0].cost);
        assert_eq!(tp.stopped, [96, 128]);
        assert!(tp.skipped.is_empty());
        assert_eq!(tp.chosen.rank, 32);
    }

    #[test]
    fn predict_matches_the_reported_figures() {
        // `predict` (matvec per token) reproduces the batched evaluation bit for bit, so the
        // held-out figures are those of the inference path.
        let (d, f) = (64, 100);
        let (x, active) = synthetic(600, d, f, 4, 0.4, 3);
        let set = TrainingSet::new(&x, &active, d, f).unwrap();
        let cfg = PredictorConfig {
            ranks: vec![32],
            epochs: 3,
            ..PredictorConfig::default()
        };
        let tp = train_layer(&set, &cfg, &mut |_| {}).unwrap();
        let p = &tp.predictor;
        let held = 600 - tp.held_out_tokens..600;
        let words = bitset_words(f);
        for kernels in Kernels::available() {
            let mut scratch = PredictorScratch::new(p);
            let mut bits = vec![0u64; words];
            let (mut tp_n, mut pos, mut predicted) = (0u64, 0u64, 0u64);
            let mut batched = Vec::new();
            p.logits_rows(&kernels, set.x, held.clone(), |_, l| {
                batched.extend_from_slice(l)
            });
            for (i, t) in held.clone().enumerate() {
                let l = p.logits(&kernels, set.row(t), &mut scratch).to_vec();
                let want: Vec<u32> = batched[i * f..(i + 1) * f]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                let got: Vec<u32> = l.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{}", kernels.isa());
                p.predict(&kernels, set.row(t), &mut scratch, &mut bits);
                assert_eq!(bits[words - 1] >> (f % 64), 0, "bits past n_ff");
                for n in 0..f {
                    let a = set.is_active(t, n);
                    let b = (bits[n / 64] >> (n % 64)) & 1 == 1;
                    tp_n += u64::from(a && b);
                    pos += u64::from(a);
                    predicted += u64::from(b);
                }
            }
            let recall = tp_n as f32 / pos as f32;
            let frac = predicted as f32 / (tp.held_out_tokens * f) as f32;
            assert_eq!(recall, tp.chosen.recall);
            assert_eq!(frac, tp.chosen.predicted_fraction);
        }
    }

    #[test]
    fn training_is_deterministic() {
        let (d, f) = (64, 96);
        let (x, active) = synthetic(500, d, f, 4, 0.5, 11);
        let set = TrainingSet::new(&x, &active, d, f).unwrap();
        let cfg = PredictorConfig {
            ranks: vec![32, 64],
            epochs: 3,
            ..PredictorConfig::default()
        };
        let enc = |p: &TrainedPredictor| {
            bincode::serde::encode_to_vec(p, bincode::config::standard()).unwrap()
        };
        let a = train_layer(&set, &cfg, &mut |_| {}).unwrap();
        let b = train_layer(&set, &cfg, &mut |_| {}).unwrap();
        assert_eq!(enc(&a), enc(&b));
        // Concurrent trainings (as a driver training layers on threads) give the same bits.
        let c = std::thread::scope(|s| {
            let h: Vec<_> = (0..2)
                .map(|_| s.spawn(|| train_layer(&set, &cfg, &mut |_| {}).unwrap()))
                .collect();
            h.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        });
        for c in &c {
            assert_eq!(enc(c), enc(&a));
        }
        // Another seed gives another predictor.
        let other = PredictorConfig { seed: 1, ..cfg };
        let d2 = train_layer(&set, &other, &mut |_| {}).unwrap();
        assert_ne!(enc(&d2), enc(&a));
    }

    #[test]
    fn bad_input_is_an_error() {
        let (d, f) = (64, 70);
        let words = bitset_words(f);
        let x = vec![0.5f32; 200 * d];
        let active = vec![1u64; 200 * words];
        assert!(matches!(
            TrainingSet::new(&x[..d * 10 + 3], &active[..10 * words], d, f),
            Err(PredictorError::Length { .. })
        ));
        assert!(matches!(
            TrainingSet::new(&x[..d * 10], &active[..10 * words - 1], d, f),
            Err(PredictorError::Length { .. })
        ));
        assert!(matches!(
            TrainingSet::new(&x[..0], &active[..0], d, f),
            Err(PredictorError::Empty)
        ));
        assert!(matches!(
            TrainingSet::new(&x[..48 * 10], &active[..10 * words], 48, f),
            Err(PredictorError::EmbdNotBlockMultiple(48))
        ));
        assert!(matches!(
            TrainingSet::new(&x[..d], &[], d, 0),
            Err(PredictorError::NoNeurons)
        ));
        // Too few tokens for the split.
        let set = TrainingSet::new(&x[..60 * d], &active[..60 * words], d, f).unwrap();
        let e = train_layer(&set, &small_cfg(), &mut |_| {}).unwrap_err();
        assert!(
            matches!(e, PredictorError::TooFewTokens { tokens: 60, .. }),
            "{e}"
        );
        // A hand-made set bypassing the constructor is checked again.
        let raw = TrainingSet {
            x: &x[..d * 150],
            active: &active[..149 * words],
            n_embd: d,
            n_ff: f,
        };
        assert!(train_layer(&raw, &small_cfg(), &mut |_| {}).is_err());
        // Non-finite inputs and bad configs.
        let mut xn = x.clone();
        xn[d * 7 + 1] = f32::NAN;
        let set = TrainingSet::new(&xn, &active, d, f).unwrap();
        assert_eq!(
            train_layer(&set, &small_cfg(), &mut |_| {}).unwrap_err(),
            PredictorError::NonFinite { token: 7 }
        );
        let set = TrainingSet::new(&x, &active, d, f).unwrap();
        for cfg in [
            PredictorConfig {
                ranks: vec![],
                ..small_cfg()
            },
            PredictorConfig {
                ranks: vec![48],
                ..small_cfg()
            },
            PredictorConfig {
                target_recall: 1.5,
                ..small_cfg()
            },
            PredictorConfig {
                held_out_fraction: 0.0,
                ..small_cfg()
            },
            PredictorConfig {
                epochs: 0,
                ..small_cfg()
            },
            PredictorConfig {
                learning_rate: f32::NAN,
                ..small_cfg()
            },
        ] {
            assert!(matches!(
                train_layer(&set, &cfg, &mut |_| {}),
                Err(PredictorError::Config(_))
            ));
        }
    }

    #[test]
    fn all_active_or_none_active_do_not_break() {
        let (d, f) = (32, 64);
        let words = bitset_words(f);
        let (x, _) = synthetic(300, d, f, 2, 0.5, 5);
        let cfg = PredictorConfig {
            ranks: vec![32],
            epochs: 2,
            ..PredictorConfig::default()
        };
        for fill in [0u64, u64::MAX] {
            let active = vec![fill; 300 * words];
            let set = TrainingSet::new(&x, &active, d, f).unwrap();
            let tp = train_layer(&set, &cfg, &mut |_| {}).unwrap();
            assert!(tp.meets_target, "{tp:?}");
            if fill == u64::MAX {
                assert!(tp.chosen.recall >= 0.99);
                assert_eq!(tp.chosen.precision, 1.0);
            } else {
                assert_eq!(tp.chosen.recall, 1.0);
                assert_eq!(tp.chosen.predicted_fraction, 0.0);
            }
        }
    }

    #[test]
    fn validate_rejects_other_shapes_and_serde_round_trips() {
        let (d, f) = (64, 80);
        let (x, active) = synthetic(400, d, f, 4, 0.4, 9);
        let set = TrainingSet::new(&x, &active, d, f).unwrap();
        let cfg = PredictorConfig {
            ranks: vec![32],
            epochs: 1,
            ..PredictorConfig::default()
        };
        let p = train_layer(&set, &cfg, &mut |_| {}).unwrap().predictor;
        p.validate(d, f).unwrap();
        let e = p.validate(576, 1536).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("n_embd 64 x n_ff 80") && msg.contains("n_embd 576 x n_ff 1536"));
        assert!(p.validate(d, f + 1).is_err());
        assert_eq!(p.bytes(), 32 * 2 * 34 + 80 * 34 + 4 * (32 + 80));

        let bytes = bincode::serde::encode_to_vec(&p, bincode::config::standard()).unwrap();
        let (q, used): (Predictor, usize) =
            bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(q, p);
        q.validate(d, f).unwrap();
        let kernels = Kernels::best();
        let (mut s1, mut s2) = (PredictorScratch::default(), PredictorScratch::new(&q));
        let (mut a1, mut a2) = (vec![0u64; 2], vec![0u64; 2]);
        p.predict(&kernels, &x[..d], &mut s1, &mut a1);
        q.predict(&kernels, &x[..d], &mut s2, &mut a2);
        assert_eq!(a1, a2);

        // A corrupted predictor: `validate`'s own test, in the runtime.
    }

    #[test]
    fn threshold_meets_the_wanted_recall() {
        let mut v: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        let t = recall_threshold(&mut v, 0.99);
        assert_eq!(t, 10.0);
        assert_eq!(v.iter().filter(|&&z| z >= t).count(), 990);
        let mut v = vec![1.0f32; 5];
        assert_eq!(recall_threshold(&mut v, 1.0), 1.0);
        assert_eq!(recall_threshold(&mut [], 0.99), f32::INFINITY);
        // Lowered to just above the highest negative under the quantile threshold.
        let logits = [5.0, -1.0, 0.5, 1.0, 2.0, 3.0, 0.7];
        let pos = [true, false, true, true, true, true, false];
        let (t, r) = calibrate(&logits, |i| pos[i], 0.8);
        assert_eq!((t, r), (1.0, 0.8));
        let pos = [true, false, true, true, true, true, true];
        let (t, r) = calibrate(&logits, |i| pos[i], 0.8);
        assert_eq!((t, r), (0.5, 1.0));
        assert_eq!(calibrate(&logits, |_| false, 0.99), (f32::INFINITY, 1.0));
    }
}

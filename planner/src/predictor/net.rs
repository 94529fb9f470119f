//! The f32 network being trained (`fc2 · ReLU(fc1 · x)`) and one rank's training run: its
//! seeded initialisation, forward and backward passes on the f32 GEMM, and AdamW steps.
//! Kept apart from the rank search in `train.rs`, which only drives it.

use super::TrainingSet;
use conductor_runtime::quant::{F32Matrix, Kernels};
use conductor_runtime::sample::SplitMix64;
use conductor_runtime::sparse::predictor::{add_bias, bitset_words};

/// Uniform in `[-a, a)` (the bits of `(2u - 1) · a`, u from the top 24 bits).
pub(super) fn uniform(rng: &mut SplitMix64, a: f32) -> f32 {
    rng.signed_unit() * a
}

/// The f32 network's geometry; its parameters live in one vector `[w1 | b1 | w2 | b2]` so Adam
/// runs over them in one loop.
pub(super) struct Net {
    pub(super) r: usize,
    pub(super) d: usize,
    pub(super) f: usize,
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
    pub(super) fn w1<'p>(&self, p: &'p [f32]) -> &'p [f32] {
        &p[..self.split()[0]]
    }
    pub(super) fn b1<'p>(&self, p: &'p [f32]) -> &'p [f32] {
        let s = self.split();
        &p[s[0]..s[1]]
    }
    pub(super) fn w2<'p>(&self, p: &'p [f32]) -> &'p [f32] {
        let s = self.split();
        &p[s[1]..s[2]]
    }
    pub(super) fn b2<'p>(&self, p: &'p [f32]) -> &'p [f32] {
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

/// `dst` (`cols × rows`) = the transpose of the `rows × cols` matrix `src`, in tiles that stay
/// in cache.
fn transpose_into(dst: &mut [f32], src: &[f32], rows: usize, cols: usize) {
    const TILE: usize = 16;
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    dst[c * rows + r] = src[r * cols + c];
                }
            }
        }
    }
}

/// Buffers of one training run (one rank).
pub(super) struct Trainer<'s, 'a> {
    set: &'s TrainingSet<'a>,
    kernels: Kernels,
    pub(super) net: Net,
    pub(super) params: Vec<f32>,
    grad: Vec<f32>,
    adam_m: Vec<f32>,
    adam_v: Vec<f32>,
    pub(super) step: u64,
    // Per-batch buffers (`bsz` tokens). The products run with the tokens as columns
    // (`w · xᵀ`), so that the weights, the largest operands, are used as they are stored and
    // only activations are transposed.
    /// The inputs, token by token (`b × d`), and transposed (`d × b`).
    x: Vec<f32>,
    xt: Vec<f32>,
    /// fc1 before and after the ReLU (`r × b`), and h again token by token (`b × r`).
    hpre_t: Vec<f32>,
    h_t: Vec<f32>,
    h: Vec<f32>,
    /// fc2's output, then its gradient (`f × b`).
    z_t: Vec<f32>,
    /// The gradient at the hidden layer (`b × r`).
    dh: Vec<f32>,
}

impl<'s, 'a> Trainer<'s, 'a> {
    pub(super) fn new(
        set: &'s TrainingSet<'a>,
        r: usize,
        batch: usize,
        prior: &[f32],
        seed: u64,
    ) -> Self {
        let (d, f) = (set.n_embd, set.n_ff);
        let net = Net { r, d, f };
        let mut params = vec![0f32; net.len()];
        let mut rng = SplitMix64::new(seed ^ (r as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
        {
            let [w1, b1, w2, b2] = net.parts_mut(&mut params);
            let a1 = 1.0 / (d as f32).sqrt();
            w1.iter_mut().for_each(|w| *w = uniform(&mut rng, a1));
            b1.iter_mut().for_each(|b| *b = uniform(&mut rng, 0.1));
            let a2 = 1.0 / (r as f32).sqrt();
            w2.iter_mut().for_each(|w| *w = uniform(&mut rng, a2));
            // Start every neuron at its base rate.
            for (b, &p) in b2.iter_mut().zip(prior) {
                let p = p.clamp(1e-3, 1.0 - 1e-3);
                *b = (p / (1.0 - p)).ln();
            }
        }
        let n = net.len();
        Trainer {
            set,
            kernels: Kernels::best(),
            net,
            params,
            grad: vec![0.0; n],
            adam_m: vec![0.0; n],
            adam_v: vec![0.0; n],
            step: 0,
            x: vec![0.0; batch * d],
            xt: vec![0.0; d * batch],
            hpre_t: vec![0.0; r * batch],
            h_t: vec![0.0; r * batch],
            h: vec![0.0; batch * r],
            z_t: vec![0.0; f * batch],
            dh: vec![0.0; batch * r],
        }
    }

    /// One Adam step on the tokens `idx`. Every product is one [`Kernels::gemm_f32`] (each
    /// output a fixed chain of fmas, the same bits on every ISA).
    pub(super) fn step(&mut self, idx: &[usize], lr: f32, pos_weight: f32, weight_decay: f32) {
        let Net { r, d, f } = self.net;
        let b = idx.len();
        let k = &self.kernels;
        // Gather the batch rows.
        for (row, &t) in self.x.chunks_exact_mut(d).zip(idx) {
            row.copy_from_slice(self.set.row(t));
        }
        let x = &self.x[..b * d];
        let xt = &mut self.xt[..d * b];
        transpose_into(xt, x, b, d);

        // Forward: hpreᵀ = w1·xᵀ + b1, h = ReLU(hpre), zᵀ = w2·hᵀ + b2.
        let (w1, w2) = (self.net.w1(&self.params), self.net.w2(&self.params));
        let hpre_t = &mut self.hpre_t[..r * b];
        k.gemm_f32(F32Matrix::rows(w1, r, d), F32Matrix::rows(xt, d, b), hpre_t);
        for (row, &bias) in hpre_t.chunks_exact_mut(b).zip(self.net.b1(&self.params)) {
            row.iter_mut().for_each(|v| *v += bias);
        }
        let h_t = &mut self.h_t[..r * b];
        for (h, &v) in h_t.iter_mut().zip(hpre_t.iter()) {
            *h = v.max(0.0);
        }
        let h = &mut self.h[..b * r];
        transpose_into(h, h_t, r, b);
        let z_t = &mut self.z_t[..f * b];
        k.gemm_f32(F32Matrix::rows(w2, f, r), F32Matrix::rows(h_t, r, b), z_t);
        // dL/dz of the weighted BCE, mean over tokens: w_y · (σ(z) − y) / b.
        let (wp, wn) = (pos_weight / b as f32, 1.0 / b as f32);
        let words = bitset_words(f);
        for (n, (zrow, bias)) in z_t
            .chunks_exact_mut(b)
            .zip(self.net.b2(&self.params))
            .enumerate()
        {
            for (zv, &t) in zrow.iter_mut().zip(idx) {
                let y = (self.set.active[t * words + n / 64] >> (n % 64)) & 1 == 1;
                let s = 1.0 / (1.0 + (-(*zv + bias)).exp());
                *zv = if y { (s - 1.0) * wp } else { s * wn };
            }
        }
        let g_t = &*z_t;

        // Backward.
        let [s0, s1, s2] = self.net.split();
        let (gw1, rest) = self.grad.split_at_mut(s0);
        let (gb1, rest) = rest.split_at_mut(s1 - s0);
        let (gw2, gb2) = rest.split_at_mut(s2 - s1);
        // db2 = Σ_t g[t] (in token order), dw2 = gᵀ·h.
        for (sum, row) in gb2.iter_mut().zip(g_t.chunks_exact(b)) {
            *sum = row.iter().fold(0.0, |acc, &v| acc + v);
        }
        k.gemm_f32(F32Matrix::rows(g_t, f, b), F32Matrix::rows(h, b, r), gw2);
        // dh = g·w2, masked by the ReLU; db1 = Σ_t dh[t]; dw1 = dhᵀ·x.
        let dh = &mut self.dh[..b * r];
        k.gemm_f32(F32Matrix::columns(g_t, b, f), F32Matrix::rows(w2, f, r), dh);
        for (t, row) in dh.chunks_exact_mut(r).enumerate() {
            for (j, dv) in row.iter_mut().enumerate() {
                if hpre_t[j * b + t] <= 0.0 {
                    *dv = 0.0;
                }
            }
        }
        gb1.fill(0.0);
        for row in dh.chunks_exact(r) {
            add_bias(gb1, row);
        }
        k.gemm_f32(F32Matrix::columns(dh, r, b), F32Matrix::rows(x, b, d), gw1);

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
    }
}

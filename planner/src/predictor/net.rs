//! The f32 network being trained (`fc2 · ReLU(fc1 · x)`) and one rank's training run: its
//! seeded initialisation, forward and backward passes on the F32 dot kernels, and AdamW steps.
//! Kept apart from the rank search in `train.rs`, which only drives it.

use super::TrainingSet;
use conductor_runtime::quant::{GgmlType, Kernels, MatRef};
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
pub(super) struct Trainer<'s, 'a> {
    set: &'s TrainingSet<'a>,
    kernels: Kernels,
    pub(super) net: Net,
    pub(super) params: Vec<f32>,
    grad: Vec<f32>,
    adam_m: Vec<f32>,
    adam_v: Vec<f32>,
    pub(super) step: u64,
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
    pub(super) fn step(&mut self, idx: &[usize], lr: f32, pos_weight: f32, weight_decay: f32) {
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

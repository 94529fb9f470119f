//! Scalar reference for Q2_K, Q3_K, Q5_K and IQ4_XS (256-element super-blocks dotted with Q8_K
//! activations), and BF16. Numerics as Q4_K/Q6_K: per super-block exact integer sums, then
//! `acc = fma(d * da, sumi, acc)` (and, for the types with mins, `accm = fma(dmin * da, summ,
//! accm)`, result `acc - accm`), following the integer structure of ggml's `vec_dot`s.
//!
//! The quantizers are simple (per sub-block min/max or absmax, scales quantized relative to the
//! super-block's largest, quants chosen against the stored scales), not ggml's search-based
//! ones: they are for tests and synthetic files.

use super::super::blocks::*;
use super::{
    iq4_fit, iq4_nearest, q4k_pack_scales, q4k_scale_min, rne_i32, signed_absmax, KScales,
};
use half::f16;

fn f16r(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

// ---------------------------------------------------------------- Q2_K

/// Simple Q2_K quantizer: per 16 elements x = d_j * q - m_j with q in 0..=3 fitted by least
/// squares ([`fit_scale_min`]); d_j and m_j as 4-bit multiples of the super-block's d and dmin,
/// the neighbouring pair with the smallest error.
pub(crate) fn quantize_q2_k(x: &[f32], y: &mut [BlockQ2K]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut scales = [0f32; 16];
        let mut mins = [0f32; 16];
        for (j, sb) in xb.chunks_exact(16).enumerate() {
            (scales[j], mins[j]) = fit_scale_min(sb, 3);
        }
        let max_scale = scales.iter().fold(0f32, |a, &v| a.max(v));
        let max_min = mins.iter().fold(0f32, |a, &v| a.max(v));
        let (d, dmin) = (max_scale / 15.0, max_min / 15.0);
        let (d16, dmin16) = (f16r(d), f16r(dmin));
        yb.d = f16_bytes(d);
        yb.dmin = f16_bytes(dmin);
        let mut q = [0u8; QK_K];
        for (j, sb) in xb.chunks_exact(16).enumerate() {
            // The 4-bit scale and min: of the neighbouring pairs around the fitted values, the
            // one whose quants (chosen against it) give the smallest squared error.
            let around = |v: f32, unit: f32| -> [i32; 2] {
                if unit > 0.0 {
                    let f = (v / unit).floor() as i32;
                    [f.clamp(0, 15), (f + 1).clamp(0, 15)]
                } else {
                    [0, 0]
                }
            };
            let mut best = (f32::INFINITY, 0i32, 0i32);
            for ls in around(scales[j], d16) {
                for lm in around(mins[j], dmin16) {
                    let (step, off) = (d16 * ls as f32, dmin16 * lm as f32);
                    let inv = if step > 0.0 { 1.0 / step } else { 0.0 };
                    let e: f32 = sb
                        .iter()
                        .map(|&v| {
                            let qv = rne_i32((v + off) * inv).clamp(0, 3) as f32;
                            (v - (step * qv - off)).powi(2)
                        })
                        .sum();
                    if e < best.0 {
                        best = (e, ls, lm);
                    }
                }
            }
            let (_, ls, lm) = best;
            yb.scales[j] = (ls | (lm << 4)) as u8;
            let (step, off) = (d16 * ls as f32, dmin16 * lm as f32);
            let inv = if step > 0.0 { 1.0 / step } else { 0.0 };
            for (l, &v) in sb.iter().enumerate() {
                q[16 * j + l] = rne_i32((v + off) * inv).clamp(0, 3) as u8;
            }
        }
        yb.qs = [0; QK_K / 4];
        for (e, &qe) in q.iter().enumerate() {
            let (n, j, l) = (e / 128, e % 128 / 32, e % 32);
            yb.qs[32 * n + l] |= qe << (2 * j);
        }
    }
}

/// A scale and (non-negative) min for `x ≈ scale * q - min` with q in 0..=nmax: from the range,
/// then a few rounds of least squares on the chosen quants, keeping the best.
fn fit_scale_min(x: &[f32], nmax: i32) -> (f32, f32) {
    let lo = x.iter().fold(f32::MAX, |a, &v| a.min(v)).min(0.0);
    let hi = x.iter().fold(-f32::MAX, |a, &v| a.max(v));
    let (mut scale, mut min) = ((hi - lo) / nmax as f32, -lo);
    let err = |scale: f32, min: f32| -> f32 {
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        x.iter()
            .map(|&v| {
                let q = rne_i32((v + min) * inv).clamp(0, nmax) as f32;
                (v - (scale * q - min)).powi(2)
            })
            .sum()
    };
    let mut best = err(scale, min);
    for _ in 0..6 {
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let q: Vec<f32> = x
            .iter()
            .map(|&v| rne_i32((v + min) * inv).clamp(0, nmax) as f32)
            .collect();
        let n = x.len() as f32;
        let (sq, sx) = (q.iter().sum::<f32>(), x.iter().sum::<f32>());
        let sqq: f32 = q.iter().map(|v| v * v).sum();
        let sqx: f32 = q.iter().zip(x).map(|(a, b)| a * b).sum();
        let det = n * sqq - sq * sq;
        if det <= 0.0 {
            break;
        }
        let mut a = (n * sqx - sq * sx) / det;
        let mut b = (sx - a * sq) / n;
        if b > 0.0 {
            // The format's min only subtracts: refit the scale through the origin.
            b = 0.0;
            a = if sqq > 0.0 { sqx / sqq } else { 0.0 };
        }
        if a <= 0.0 {
            break;
        }
        let e = err(a, -b);
        if e >= best {
            break;
        }
        (scale, min, best) = (a, -b, e);
    }
    (scale, min)
}

/// A scale for `x ≈ scale * q` with q in lo..=hi: starting from the largest magnitude mapped to
/// either end, a few rounds of least squares on the chosen quants; the smallest squared error.
fn fit_scale_sym(x: &[f32], lo: i32, hi: i32) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax == 0.0 {
        return 0.0;
    }
    let quants = |s: f32| -> Vec<f32> {
        x.iter()
            .map(|&v| rne_i32(v / s).clamp(lo, hi) as f32)
            .collect()
    };
    let err =
        |s: f32, q: &[f32]| -> f32 { x.iter().zip(q).map(|(v, q)| (v - s * q).powi(2)).sum() };
    let (mut best_s, mut best_e) = (0.0f32, f32::INFINITY);
    for start in [max / lo as f32, -max / lo as f32, max / hi as f32] {
        let mut s = start;
        for _ in 0..4 {
            let q = quants(s);
            let e = err(s, &q);
            if e < best_e {
                (best_s, best_e) = (s, e);
            }
            let (sqx, sqq) = q
                .iter()
                .zip(x)
                .fold((0f32, 0f32), |(a, b), (q, v)| (a + q * v, b + q * q));
            if sqq == 0.0 || sqx == 0.0 {
                break;
            }
            s = sqx / sqq;
        }
    }
    best_s
}

/// The 2-bit quant of element `e` of a Q2_K/Q3_K `qs`.
#[inline(always)]
pub(crate) fn q2_bits(qs: &[u8; 64], e: usize) -> u8 {
    let (n, j, l) = (e / 128, e % 128 / 32, e % 32);
    (qs[32 * n + l] >> (2 * j)) & 3
}

pub(crate) fn dequantize_q2_k(x: &[BlockQ2K], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
        for (j, ys) in yb.chunks_exact_mut(16).enumerate() {
            let sc = b.scales[j];
            let dl = d * (sc & 0xF) as f32;
            let ml = dmin * (sc >> 4) as f32;
            for (l, o) in ys.iter_mut().enumerate() {
                *o = dl * q2_bits(&b.qs, 16 * j + l) as f32 - ml;
            }
        }
    }
}

/// Q2_K · Q8_K: sumi = Σ_j (sc_j & 15) Σ q y, summ = Σ_j (sc_j >> 4) bsum_j;
/// acc = fma(d * da, sumi, acc), accm = fma(dmin * da, summ, accm); acc - accm.
pub(crate) fn dot_q2_k_q8_k(w: &[BlockQ2K], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0.0f32;
    let mut accm = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let (mut sumi, mut summ) = (0i32, 0i32);
        for j in 0..16 {
            let s: i32 = (16 * j..16 * j + 16)
                .map(|e| q2_bits(&bw.qs, e) as i32 * ba.qs[e] as i8 as i32)
                .sum();
            sumi += (bw.scales[j] & 0xF) as i32 * s;
            summ += (bw.scales[j] >> 4) as i32 * ba.bsum(j);
        }
        let da = ba.d();
        acc = (f16_le(bw.d) * da).mul_add(sumi as f32, acc);
        accm = (f16_le(bw.dmin) * da).mul_add(summ as f32, accm);
    }
    acc - accm
}

// ---------------------------------------------------------------- Q3_K

/// The 16 signed scales (6-bit value - 32) of a Q3_K block: scale j has its low 4 bits in
/// nibble j / 8 of byte j % 8 and its high 2 bits at bit 2 * (j / 4) of byte 8 + j % 4.
#[inline(always)]
pub(crate) fn q3k_scales(s: &[u8; 12]) -> [i8; 16] {
    std::array::from_fn(|j| {
        let lo = (s[j % 8] >> (4 * (j / 8))) & 0xF;
        let hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        (lo | (hi << 4)) as i8 - 32
    })
}

fn q3k_pack_scales(ls: &[i8; 16]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for (j, &v) in ls.iter().enumerate() {
        let u = (v as i32 + 32) as u8;
        s[j % 8] |= (u & 0xF) << (4 * (j / 8));
        s[8 + j % 4] |= (u >> 4) << (2 * (j / 4));
    }
    s
}

/// The unsigned 3-bit quant u (value u - 4) of element `e`: 2 bits in qs, the third in hmask
/// (bit e / 32 of hmask[e % 32]).
#[inline(always)]
pub(crate) fn q3k_quant(b: &BlockQ3K, e: usize) -> u8 {
    q2_bits(&b.qs, e) | (((b.hmask[e % 32] >> (e / 32)) & 1) << 2)
}

/// Simple Q3_K quantizer: per 16 elements a signed scale ([`fit_scale_sym`] over -4..=3), the
/// scales as 6-bit signed multiples of the super-block's (as Q6_K's simple quantizer).
pub(crate) fn quantize_q3_k(x: &[f32], y: &mut [BlockQ3K]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut scales = [0f32; 16];
        for (j, sb) in xb.chunks_exact(16).enumerate() {
            scales[j] = fit_scale_sym(sb, -4, 3);
        }
        let (smax, samax) = signed_absmax(&scales);
        let mut ls = [0i8; 16];
        let mut u = [4u8; QK_K];
        if samax == 0.0 {
            yb.d = [0; 2];
        } else {
            let iscale = -32.0 / smax;
            let d = 1.0 / iscale;
            let d16 = f16r(d);
            yb.d = f16_bytes(d);
            for (j, sb) in xb.chunks_exact(16).enumerate() {
                ls[j] = rne_i32(iscale * scales[j]).clamp(-32, 31) as i8;
                let step = d16 * ls[j] as f32;
                let inv = if step != 0.0 { 1.0 / step } else { 0.0 };
                for (l, &v) in sb.iter().enumerate() {
                    u[16 * j + l] = (rne_i32(v * inv).clamp(-4, 3) + 4) as u8;
                }
            }
        }
        yb.scales = q3k_pack_scales(&ls);
        yb.qs = [0; QK_K / 4];
        yb.hmask = [0; QK_K / 8];
        for (e, &ue) in u.iter().enumerate() {
            let (n, j, l) = (e / 128, e % 128 / 32, e % 32);
            yb.qs[32 * n + l] |= (ue & 3) << (2 * j);
            yb.hmask[l] |= (ue >> 2) << (e / 32);
        }
    }
}

pub(crate) fn dequantize_q3_k(x: &[BlockQ3K], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        let sc = q3k_scales(&b.scales);
        for (j, ys) in yb.chunks_exact_mut(16).enumerate() {
            let dl = d * sc[j] as f32;
            for (l, o) in ys.iter_mut().enumerate() {
                *o = dl * (q3k_quant(b, 16 * j + l) as i32 - 4) as f32;
            }
        }
    }
}

/// Q3_K · Q8_K: sumi = Σ_j s_j Σ (u - 4) y; acc = fma(d * da, sumi, acc).
pub(crate) fn dot_q3_k_q8_k(w: &[BlockQ3K], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let sc = q3k_scales(&bw.scales);
        let mut sumi = 0i32;
        for (j, &s) in sc.iter().enumerate() {
            let p: i32 = (16 * j..16 * j + 16)
                .map(|e| (q3k_quant(bw, e) as i32 - 4) * ba.qs[e] as i8 as i32)
                .sum();
            sumi += s as i32 * p;
        }
        acc = (f16_le(bw.d) * ba.d()).mul_add(sumi as f32, acc);
    }
    acc
}

// ---------------------------------------------------------------- Q5_K

/// The 5-bit quant of element `e` of a Q5_K block.
#[inline(always)]
pub(crate) fn q5k_quant(b: &BlockQ5K, e: usize) -> u8 {
    let (j, l) = (e / 32, e % 32);
    let byte = b.qs[32 * (j / 2) + l];
    let lo = if j % 2 == 0 { byte & 0xF } else { byte >> 4 };
    lo | (((b.qh[l] >> j) & 1) << 4)
}

/// Simple Q5_K quantizer: as the simple Q4_K one with 31 levels.
pub(crate) fn quantize_q5_k(x: &[f32], y: &mut [BlockQ5K]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let KScales {
            d,
            dmin,
            d16,
            dmin16,
            ls,
            lm,
        } = KScales::fit(xb, 31.0);
        yb.d = f16_bytes(d);
        yb.dmin = f16_bytes(dmin);
        yb.scales = q4k_pack_scales(&ls, &lm);
        yb.qs = [0; QK_K / 2];
        yb.qh = [0; QK_K / 8];
        for (j, sb) in xb.chunks_exact(32).enumerate() {
            let (step, off) = (d16 * ls[j] as f32, dmin16 * lm[j] as f32);
            let inv = if step > 0.0 { 1.0 / step } else { 0.0 };
            for (l, &v) in sb.iter().enumerate() {
                let q = rne_i32((v + off) * inv).clamp(0, 31) as u8;
                yb.qs[32 * (j / 2) + l] |= (q & 0xF) << (4 * (j % 2));
                yb.qh[l] |= (q >> 4) << j;
            }
        }
    }
}

pub(crate) fn dequantize_q5_k(x: &[BlockQ5K], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
        for (j, ys) in yb.chunks_exact_mut(32).enumerate() {
            let (sc, m) = q4k_scale_min(j, &b.scales);
            let (dl, ml) = (d * sc as f32, dmin * m as f32);
            for (l, o) in ys.iter_mut().enumerate() {
                *o = dl * q5k_quant(b, 32 * j + l) as f32 - ml;
            }
        }
    }
}

/// Q5_K · Q8_K: as Q4_K with 5-bit quants.
pub(crate) fn dot_q5_k_q8_k(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0.0f32;
    let mut accm = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let (mut sumi, mut summ) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = q4k_scale_min(j, &bw.scales);
            let s: i32 = (32 * j..32 * j + 32)
                .map(|e| q5k_quant(bw, e) as i32 * ba.qs[e] as i8 as i32)
                .sum();
            sumi += sc as i32 * s;
            summ += m as i32 * (ba.bsum(2 * j) + ba.bsum(2 * j + 1));
        }
        let da = ba.d();
        acc = (f16_le(bw.d) * da).mul_add(sumi as f32, acc);
        accm = (f16_le(bw.dmin) * da).mul_add(summ as f32, accm);
    }
    acc - accm
}

// ---------------------------------------------------------------- IQ4_XS

/// The 6-bit scale minus 32 of IQ4_XS sub-block `j`.
#[inline(always)]
pub(crate) fn iq4xs_scale(b: &BlockIQ4XS, j: usize) -> i32 {
    let lo = (b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF;
    let hi = (u16::from_le_bytes(b.scales_h) >> (2 * j)) & 3;
    (lo as i32 | ((hi as i32) << 4)) - 32
}

/// IQ4_XS: per 32 elements an IQ4 grid fit ([`iq4_fit`], unrounded), the 8 scales as 6-bit
/// signed multiples of the super-block's, quants chosen against the stored scales.
pub(crate) fn quantize_iq4_xs(x: &[f32], y: &mut [BlockIQ4XS]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let scales: [f32; 8] = std::array::from_fn(|j| iq4_fit(&xb[32 * j..32 * j + 32], |d| d).0);
        let (smax, samax) = signed_absmax(&scales);
        let (d, iscale) = if samax == 0.0 {
            (0.0, 0.0)
        } else {
            let iscale = -32.0 / smax;
            (1.0 / iscale, iscale)
        };
        let d16 = f16r(d);
        yb.d = f16_bytes(d);
        let mut sh = 0u16;
        yb.scales_l = [0; 4];
        for (j, sb) in xb.chunks_exact(32).enumerate() {
            let ls = rne_i32(iscale * scales[j]).clamp(-32, 31);
            let u = (ls + 32) as u16;
            yb.scales_l[j / 2] |= ((u & 0xF) as u8) << (4 * (j % 2));
            sh |= (u >> 4) << (2 * j);
            let step = d16 * ls as f32;
            let inv = if step != 0.0 { 1.0 / step } else { 0.0 };
            let q: [u8; 32] = std::array::from_fn(|l| iq4_nearest(sb[l] * inv));
            for l in 0..16 {
                yb.qs[16 * j + l] = q[l] | (q[l + 16] << 4);
            }
        }
        yb.scales_h = sh.to_le_bytes();
    }
}

pub(crate) fn dequantize_iq4_xs(x: &[BlockIQ4XS], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for (j, ys) in yb.chunks_exact_mut(32).enumerate() {
            let dl = d * iq4xs_scale(b, j) as f32;
            let qs = &b.qs[16 * j..16 * j + 16];
            for l in 0..16 {
                ys[l] = dl * IQ4_VALUES[(qs[l] & 0xF) as usize] as f32;
                ys[l + 16] = dl * IQ4_VALUES[(qs[l] >> 4) as usize] as f32;
            }
        }
    }
}

/// IQ4_XS · Q8_K: sumi = Σ_j (ls_j - 32) Σ grid[q] y; acc = fma(d * da, sumi, acc).
pub(crate) fn dot_iq4_xs_q8_k(w: &[BlockIQ4XS], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let mut sumi = 0i32;
        for j in 0..8 {
            let s = super::idot_iq4(&bw.qs[16 * j..16 * j + 16], &ba.qs[32 * j..32 * j + 32]);
            sumi += iq4xs_scale(bw, j) * s;
        }
        acc = (f16_le(bw.d) * ba.d()).mul_add(sumi as f32, acc);
    }
    acc
}

// ---------------------------------------------------------------- BF16

/// ggml's f32 -> bf16: round to nearest even; NaNs kept quiet (bit 6 of the result set).
#[inline(always)]
pub(crate) fn bf16_from_f32(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u as u64 + 0x7fff + ((u >> 16) & 1) as u64) >> 16) as u16
}

/// BF16 element `i` of little-endian bytes (exact).
#[inline(always)]
pub(crate) fn bf16_at(b: &[u8], i: usize) -> f32 {
    f32::from_bits((u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as u32) << 16)
}

/// BF16 weights (bytes) · f32 activations (bytes), with the lanes of `dot_f32_lanes`.
pub(crate) fn dot_bf16(n: usize, w: &[u8], x: &[u8]) -> f32 {
    super::dot_f32_lanes(n, |i| bf16_at(w, i), |i| super::f32_at(x, i))
}

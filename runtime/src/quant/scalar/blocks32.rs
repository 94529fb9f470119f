//! Scalar reference for the 32-element formats added after the first three: Q5_0, Q5_1 and
//! IQ4_NL (quantize, dequantize, dot). Same numerics as Q4_0/Q4_1: per block an exact integer
//! sum, then `acc = fma(dw * da, isum, acc)` (Q5_1's min term in a second chain).

use super::super::blocks::*;
use super::{isum_i8, signed_absmax};
use half::f16;

/// The 32 five-bit quants of a Q5_0/Q5_1 block, in element order.
#[inline(always)]
pub(crate) fn q5_quants(qs: &[u8; 16], qh: [u8; 4]) -> [u8; 32] {
    let h = u32::from_le_bytes(qh);
    std::array::from_fn(|e| {
        let lo = if e < 16 { qs[e] & 0xF } else { qs[e - 16] >> 4 };
        lo | ((((h >> e) & 1) as u8) << 4)
    })
}

/// Packs 32 quants (0..=31) into Q5's `qs` and `qh`.
fn q5_pack(q: &[u8; 32]) -> ([u8; 16], [u8; 4]) {
    let mut qs = [0u8; 16];
    let mut h = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0xF) | ((q[j + 16] & 0xF) << 4);
        h |= (((q[j] >> 4) & 1) as u32) << j;
        h |= (((q[j + 16] >> 4) & 1) as u32) << (j + 16);
    }
    (qs, h.to_le_bytes())
}

/// ggml's `quantize_row_q5_0_ref`: d = max / -16 (max the signed value of largest magnitude),
/// q = min(31, trunc(x / d + 16.5)).
pub(crate) fn quantize_q5_0(x: &[f32], y: &mut [BlockQ5_0]) {
    for (xb, yb) in x.chunks_exact(QK5_0).zip(y.iter_mut()) {
        let (max, _) = signed_absmax(xb);
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: [u8; 32] = std::array::from_fn(|j| ((xb[j] * id + 16.5) as i32).clamp(0, 31) as u8);
        (yb.qs, yb.qh) = q5_pack(&q);
        yb.d = f16_bytes(d);
    }
}

/// ggml's `quantize_row_q5_1_ref`: d = (max - min) / 31, m = min, q = trunc((x - min) / d + 0.5).
pub(crate) fn quantize_q5_1(x: &[f32], y: &mut [BlockQ5_1]) {
    for (xb, yb) in x.chunks_exact(QK5_1).zip(y.iter_mut()) {
        let mut min = f32::MAX;
        let mut max = -f32::MAX;
        for &v in xb {
            min = if v < min { v } else { min };
            max = if v > max { v } else { max };
        }
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: [u8; 32] =
            std::array::from_fn(|j| (((xb[j] - min) * id + 0.5) as i32).clamp(0, 31) as u8);
        (yb.qs, yb.qh) = q5_pack(&q);
        yb.d = f16_bytes(d);
        yb.m = f16_bytes(min);
    }
}

/// Index of the IQ4 grid value nearest to `v` (in grid units; the lower one on ties).
#[inline]
pub(crate) fn iq4_nearest(v: f32) -> u8 {
    let mut best = 0usize;
    for (i, &g) in IQ4_VALUES.iter().enumerate().skip(1) {
        if (v - g as f32).abs() < (v - IQ4_VALUES[best] as f32).abs() {
            best = i;
        }
    }
    best as u8
}

/// A scale for `x` on the IQ4 grid and its quants: starting from d = max / -127 (the value of
/// largest magnitude on the grid's end), a few nearby scales are tried and each refined by least
/// squares; the one with the smallest squared error wins. Not ggml's quantizer (which also weights
/// by importance), but the same idea. Returns (d, quants) with the quants chosen against `d`
/// rounded through `round_d`, so the stored values are self-consistent.
pub(crate) fn iq4_fit(x: &[f32], round_d: impl Fn(f32) -> f32) -> (f32, Vec<u8>) {
    let (max, amax) = signed_absmax(x);
    if amax == 0.0 {
        return (0.0, vec![8; x.len()]);
    }
    let quants = |d: f32| -> Vec<u8> {
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        x.iter().map(|&v| iq4_nearest(v * id)).collect()
    };
    let err = |d: f32, q: &[u8]| -> f32 {
        x.iter()
            .zip(q)
            .map(|(&v, &qi)| (v - d * IQ4_VALUES[qi as usize] as f32).powi(2))
            .sum()
    };
    let mut best_d = round_d(max / -127.0);
    let mut best_q = quants(best_d);
    let mut best_e = err(best_d, &best_q);
    for itry in -7i32..=7 {
        let d0 = max / (-127.0 + itry as f32);
        let q = quants(d0);
        let (mut sxg, mut sgg) = (0f32, 0f32);
        for (&v, &qi) in x.iter().zip(&q) {
            let g = IQ4_VALUES[qi as usize] as f32;
            sxg += v * g;
            sgg += g * g;
        }
        if sgg == 0.0 {
            continue;
        }
        let d = round_d(sxg / sgg);
        let q = quants(d);
        let e = err(d, &q);
        if e < best_e {
            (best_d, best_q, best_e) = (d, q, e);
        }
    }
    (best_d, best_q)
}

/// IQ4_NL: per block, [`iq4_fit`] with the scale rounded to f16.
pub(crate) fn quantize_iq4_nl(x: &[f32], y: &mut [BlockIQ4NL]) {
    for (xb, yb) in x.chunks_exact(QK4_NL).zip(y.iter_mut()) {
        let (d, q) = iq4_fit(xb, |d| f16::from_f32(d).to_f32());
        yb.d = f16_bytes(d);
        for j in 0..16 {
            yb.qs[j] = q[j] | (q[j + 16] << 4);
        }
    }
}

pub(crate) fn dequantize_q5_0(x: &[BlockQ5_0], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK5_0)) {
        let d = f16_le(b.d);
        for (o, q) in yb.iter_mut().zip(q5_quants(&b.qs, b.qh)) {
            *o = (q as i32 - 16) as f32 * d;
        }
    }
}

pub(crate) fn dequantize_q5_1(x: &[BlockQ5_1], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK5_1)) {
        let (d, m) = (f16_le(b.d), f16_le(b.m));
        for (o, q) in yb.iter_mut().zip(q5_quants(&b.qs, b.qh)) {
            // As Q4_1: x*d + m in two roundings.
            *o = q as f32 * d + m;
        }
    }
}

pub(crate) fn dequantize_iq4_nl(x: &[BlockIQ4NL], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK4_NL)) {
        let d = f16_le(b.d);
        for j in 0..16 {
            yb[j] = d * IQ4_VALUES[(b.qs[j] & 0xF) as usize] as f32;
            yb[j + 16] = d * IQ4_VALUES[(b.qs[j] >> 4) as usize] as f32;
        }
    }
}

/// Q5_0 · Q8_0: per block acc = fma(dw * da, sum((q - 16) * y), acc).
pub(crate) fn dot_q5_0_q8_0(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
    let mut acc = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let q = q5_quants(&bw.qs, bw.qh);
        let s: i32 = q
            .iter()
            .zip(&ba.qs)
            .map(|(&q, &y)| q as i32 * y as i8 as i32)
            .sum();
        let isum = s - 16 * isum_i8(&ba.qs);
        acc = (f16_le(bw.d) * f16_le(ba.d)).mul_add(isum as f32, acc);
    }
    acc
}

/// Q5_1 · Q8_1: acc = fma(dw * da, sum(q * y), acc); accm = fma(m, s, accm); acc + accm.
pub(crate) fn dot_q5_1_q8_1(w: &[BlockQ5_1], a: &[BlockQ8_1]) -> f32 {
    let mut acc = 0.0f32;
    let mut accm = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let q = q5_quants(&bw.qs, bw.qh);
        let isum: i32 = q
            .iter()
            .zip(&ba.qs)
            .map(|(&q, &y)| q as i32 * y as i8 as i32)
            .sum();
        acc = (f16_le(bw.d) * f16_le(ba.d)).mul_add(isum as f32, acc);
        accm = f16_le(bw.m).mul_add(f16_le(ba.s), accm);
    }
    acc + accm
}

/// Integer dot of the IQ4 grid values of 16 nibble bytes (Q4_0 order) with 32 signed bytes.
#[inline(always)]
pub(crate) fn idot_iq4(qs: &[u8], y: &[u8]) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        s += IQ4_VALUES[(qs[j] & 0xF) as usize] as i32 * y[j] as i8 as i32;
        s += IQ4_VALUES[(qs[j] >> 4) as usize] as i32 * y[j + 16] as i8 as i32;
    }
    s
}

/// IQ4_NL · Q8_0: acc = fma(dw * da, sum(grid[q] * y), acc).
pub(crate) fn dot_iq4_nl_q8_0(w: &[BlockIQ4NL], a: &[BlockQ8_0]) -> f32 {
    let mut acc = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let isum = idot_iq4(&bw.qs, &ba.qs);
        acc = (f16_le(bw.d) * f16_le(ba.d)).mul_add(isum as f32, acc);
    }
    acc
}

/// The values `axpy_rows` uses (exactly `dequantize_row`'s): Q5_0 `d * (q - 16)`, IQ4_NL
/// `d * grid[q]` (both exact products), Q5_1 `fma(d, q, m)` (equal to `d * q + m`, as `d * q` is
/// exact).
pub(crate) fn axpy_values_q5_0(b: &BlockQ5_0) -> [f32; 32] {
    let d = f16_le(b.d);
    let q = q5_quants(&b.qs, b.qh);
    std::array::from_fn(|e| d * (q[e] as i32 - 16) as f32)
}

pub(crate) fn axpy_values_q5_1(b: &BlockQ5_1) -> [f32; 32] {
    let (d, m) = (f16_le(b.d), f16_le(b.m));
    let q = q5_quants(&b.qs, b.qh);
    std::array::from_fn(|e| d.mul_add(q[e] as f32, m))
}

pub(crate) fn axpy_values_iq4_nl(b: &BlockIQ4NL) -> [f32; 32] {
    let d = f16_le(b.d);
    std::array::from_fn(|e| {
        let q = if e < 16 {
            b.qs[e] & 0xF
        } else {
            b.qs[e - 16] >> 4
        };
        d * IQ4_VALUES[q as usize] as f32
    })
}

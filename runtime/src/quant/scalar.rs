//! Portable reference: quantize, dequantize and the dot products, for every target.
//!
//! The dot products here *define* the result every optimized kernel must reproduce bit for bit
//! (see "Numerics" in `mod.rs`): integer sums per block are exact, so only the float steps are
//! fixed, and they are written out below in the order the SIMD code performs them.

use super::blocks::*;
use half::f16;

mod blocks32;
mod kquants;
pub(crate) use blocks32::*;
pub(crate) use kquants::*;

// ---------------------------------------------------------------- weight quantizers

/// ggml's `quantize_row_q4_0_ref`: scale from the signed value of largest magnitude, so that
/// value maps to q = 0 exactly.
pub(crate) fn quantize_q4_0(x: &[f32], y: &mut [BlockQ4_0]) {
    for (xb, yb) in x.chunks_exact(QK4_0).zip(y.iter_mut()) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16_bytes(d);
        for j in 0..QK4_0 / 2 {
            // ggml truncates (x + 8.5) toward zero, i.e. rounds half up; the clamp only matters
            // for the value mapping to 16.5 (the negated extreme).
            let q0 = ((xb[j] * id + 8.5) as i32).clamp(0, 15) as u8;
            let q1 = ((xb[j + 16] * id + 8.5) as i32).clamp(0, 15) as u8;
            yb.qs[j] = q0 | (q1 << 4);
        }
    }
}

/// ggml's `quantize_row_q4_1_ref`: d = (max - min) / 15, m = min.
pub(crate) fn quantize_q4_1(x: &[f32], y: &mut [BlockQ4_1]) {
    for (xb, yb) in x.chunks_exact(QK4_1).zip(y.iter_mut()) {
        let mut min = f32::MAX;
        let mut max = -f32::MAX;
        for &v in xb {
            min = if v < min { v } else { min };
            max = if v > max { v } else { max };
        }
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16_bytes(d);
        yb.m = f16_bytes(min);
        for j in 0..QK4_1 / 2 {
            let q0 = (((xb[j] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
            let q1 = (((xb[j + 16] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
            yb.qs[j] = q0 | (q1 << 4);
        }
    }
}

/// Round to nearest, ties to even: what `vroundps`/`vcvtps2dq` (default MXCSR) and ggml's
/// `nearest_int` compute. Out-of-range values saturate (only reachable with non-finite input).
#[inline(always)]
pub(crate) fn rne_i32(v: f32) -> i32 {
    v.round_ties_even() as i32
}

/// Q8_0 with the numerics of ggml's x86/ARM `quantize_row_q8_0` (the code llama.cpp actually runs
/// on activations): d = amax / 127, multiplier 127 / amax, round to nearest even. ggml's `_ref`
/// variant uses 1/d and rounds ties away from zero; the two differ only on exact .5 ties and by
/// one ulp in the multiplier.
pub(crate) fn quantize_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    for (xb, yb) in x.chunks_exact(QK8_0).zip(y.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        yb.d = f16_bytes(d);
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = rne_i32(v * id).clamp(-128, 127) as i8 as u8;
        }
    }
}

/// Q8_1, same numerics as [`quantize_q8_0`]; s = d * sum(q) with the f32 d (before its f16
/// rounding), as ggml does.
pub(crate) fn quantize_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    for (xb, yb) in x.chunks_exact(QK8_1).zip(y.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            let qi = rne_i32(v * id).clamp(-128, 127);
            sum += qi;
            *q = qi as i8 as u8;
        }
        yb.d = f16_bytes(d);
        yb.s = f16_bytes(d * sum as f32);
    }
}

/// Signed value of largest magnitude (first one on ties) and its magnitude.
#[inline]
pub(crate) fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// ggml's `quantize_row_q8_K_ref` (also what x86 llama.cpp runs): iscale = -127 / max, where max
/// is the signed value of largest magnitude; q = min(127, nearest(iscale * x)); d = 1 / iscale.
pub(crate) fn quantize_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let (max, amax) = signed_absmax(xb);
        if amax == 0.0 {
            *yb = BlockQ8K {
                d: [0; 4],
                qs: [0; QK_K],
                bsums: [[0; 2]; QK_K / 16],
            };
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = rne_i32(iscale * v).clamp(-128, 127) as i8 as u8;
        }
        q8k_finish(yb, iscale);
    }
}

/// Fills bsums and d of a Q8_K block whose quants are set (shared with the SIMD quantizer).
#[inline]
pub(crate) fn q8k_finish(yb: &mut BlockQ8K, iscale: f32) {
    for j in 0..QK_K / 16 {
        let s: i32 = yb.qs[16 * j..16 * j + 16]
            .iter()
            .map(|&q| q as i8 as i32)
            .sum();
        yb.bsums[j] = (s as i16).to_le_bytes();
    }
    yb.d = (1.0 / iscale).to_le_bytes();
}

/// Packs 6-bit scales and mins into Q4_K's 12 bytes (inverse of [`q4k_scale_min`]).
pub(crate) fn q4k_pack_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4);
    }
    q
}

/// Scale and min (6 bits each) of Q4_K sub-block `j` (ggml's `get_scale_min_k4`).
#[inline(always)]
pub(crate) fn q4k_scale_min(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// A Q4_K/Q5_K super-block's scales as the simple quantizers fit them: per sub-block of 32 the
/// range over `levels` steps and the minimum (as a positive offset, x = d*q - m), then 6-bit
/// scales and mins against the super-block maxima, chosen against the f16-rounded super-scales
/// (what dequantization sees); mins round up so that x + m stays ≥ 0.
pub(crate) struct KScales {
    pub d: f32,
    pub dmin: f32,
    pub d16: f32,
    pub dmin16: f32,
    pub ls: [u8; 8],
    pub lm: [u8; 8],
}

impl KScales {
    pub(crate) fn fit(xb: &[f32], levels: f32) -> KScales {
        let mut scales = [0f32; 8];
        let mut mins = [0f32; 8];
        for (j, sb) in xb.chunks_exact(32).enumerate() {
            let lo = sb.iter().fold(f32::MAX, |a, &v| a.min(v)).min(0.0);
            let hi = sb.iter().fold(-f32::MAX, |a, &v| a.max(v));
            scales[j] = (hi - lo) / levels;
            mins[j] = -lo;
        }
        let max_scale = scales.iter().fold(0f32, |a, &v| a.max(v));
        let max_min = mins.iter().fold(0f32, |a, &v| a.max(v));
        let (d, dmin) = (max_scale / 63.0, max_min / 63.0);
        let (d16, dmin16) = (f16::from_f32(d).to_f32(), f16::from_f32(dmin).to_f32());
        let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
        for j in 0..8 {
            if d16 > 0.0 {
                ls[j] = rne_i32(scales[j] / d16).clamp(0, 63) as u8;
            }
            if dmin16 > 0.0 {
                lm[j] = ((mins[j] / dmin16).ceil() as i32).clamp(0, 63) as u8;
            }
        }
        KScales {
            d,
            dmin,
            d16,
            dmin16,
            ls,
            lm,
        }
    }
}

/// Simple Q4_K quantizer (not ggml's search-based one): per sub-block min/max, 6-bit scales and
/// mins relative to the super-block maxima, then nearest quants against the *quantized* scales so
/// the stored values are self-consistent. For tests and file generation.
pub(crate) fn quantize_q4_k(x: &[f32], y: &mut [BlockQ4K]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let KScales {
            d,
            dmin,
            d16,
            dmin16,
            ls,
            lm,
        } = KScales::fit(xb, 15.0);
        yb.d = f16_bytes(d);
        yb.dmin = f16_bytes(dmin);
        yb.scales = q4k_pack_scales(&ls, &lm);
        let mut q = [0u8; QK_K];
        for (j, sb) in xb.chunks_exact(32).enumerate() {
            let step = d16 * ls[j] as f32;
            let off = dmin16 * lm[j] as f32;
            let inv = if step > 0.0 { 1.0 / step } else { 0.0 };
            for (l, &v) in sb.iter().enumerate() {
                q[32 * j + l] = rne_i32((v + off) * inv).clamp(0, 15) as u8;
            }
        }
        for c in 0..4 {
            for l in 0..32 {
                yb.qs[32 * c + l] = q[64 * c + l] | (q[64 * c + 32 + l] << 4);
            }
        }
    }
}

/// The 6-bit quant (0..=63) of element `e` of a Q6_K block, per ggml's layout.
#[inline(always)]
pub(crate) fn q6k_quant(b: &BlockQ6K, e: usize) -> u8 {
    let (n, r) = (e / 128, e % 128);
    let (quarter, l) = (r / 32, r % 32);
    let ql = b.ql[64 * n + l + 32 * (quarter & 1)];
    let lo = if quarter < 2 { ql & 0xF } else { ql >> 4 };
    let hi = (b.qh[32 * n + l] >> (2 * quarter)) & 3;
    lo | (hi << 4)
}

/// Simple Q6_K quantizer: per 16-element sub-block, a signed scale mapping the largest-magnitude
/// value to -32 (as Q4_0 does), scales stored as i8 relative to the super-block scale.
pub(crate) fn quantize_q6_k(x: &[f32], y: &mut [BlockQ6K]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut scales = [0f32; 16];
        for (j, sb) in xb.chunks_exact(16).enumerate() {
            scales[j] = signed_absmax(sb).0 / -32.0;
        }
        let (smax, samax) = signed_absmax(&scales);
        let mut q = [32u8; QK_K];
        if samax == 0.0 {
            *yb = BlockQ6K {
                ql: [0; QK_K / 2],
                qh: [0; QK_K / 4],
                scales: [0; 16],
                d: [0; 2],
            };
        } else {
            let iscale = -128.0 / smax;
            let d = 1.0 / iscale;
            let d16 = f16::from_f32(d).to_f32();
            yb.d = f16_bytes(d);
            for (j, sb) in xb.chunks_exact(16).enumerate() {
                let ls = rne_i32(iscale * scales[j]).clamp(-128, 127);
                yb.scales[j] = ls as i8 as u8;
                let step = d16 * ls as f32;
                let inv = if step != 0.0 { 1.0 / step } else { 0.0 };
                for (l, &v) in sb.iter().enumerate() {
                    q[16 * j + l] = (rne_i32(v * inv).clamp(-32, 31) + 32) as u8;
                }
            }
        }
        yb.ql = [0; QK_K / 2];
        yb.qh = [0; QK_K / 4];
        for (e, &qe) in q.iter().enumerate() {
            let (n, r) = (e / 128, e % 128);
            let (quarter, l) = (r / 32, r % 32);
            let qi = 64 * n + l + 32 * (quarter & 1);
            yb.ql[qi] |= if quarter < 2 {
                qe & 0xF
            } else {
                (qe & 0xF) << 4
            };
            yb.qh[32 * n + l] |= (qe >> 4) << (2 * quarter);
        }
    }
}

// ---------------------------------------------------------------- dequantize

pub(crate) fn dequantize_q4_0(x: &[BlockQ4_0], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK4_0)) {
        let d = f16_le(b.d);
        for j in 0..16 {
            yb[j] = ((b.qs[j] & 0xF) as i32 - 8) as f32 * d;
            yb[j + 16] = ((b.qs[j] >> 4) as i32 - 8) as f32 * d;
        }
    }
}

pub(crate) fn dequantize_q4_1(x: &[BlockQ4_1], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK4_1)) {
        let (d, m) = (f16_le(b.d), f16_le(b.m));
        for j in 0..16 {
            // ggml writes x*d + m; as a C expression under -ffp-contract this may fuse, but the
            // generic C compiles to mul then add on x86 (no FMA contraction across statements).
            yb[j] = (b.qs[j] & 0xF) as f32 * d + m;
            yb[j + 16] = (b.qs[j] >> 4) as f32 * d + m;
        }
    }
}

pub(crate) fn dequantize_q8_0(x: &[BlockQ8_0], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK8_0)) {
        let d = f16_le(b.d);
        for (o, &q) in yb.iter_mut().zip(&b.qs) {
            *o = q as i8 as f32 * d;
        }
    }
}

pub(crate) fn dequantize_q8_1(x: &[BlockQ8_1], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK8_1)) {
        let d = f16_le(b.d);
        for (o, &q) in yb.iter_mut().zip(&b.qs) {
            *o = q as i8 as f32 * d;
        }
    }
}

pub(crate) fn dequantize_q8_k(x: &[BlockQ8K], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (o, &q) in yb.iter_mut().zip(&b.qs) {
            *o = d * q as i8 as f32;
        }
    }
}

pub(crate) fn dequantize_q4_k(x: &[BlockQ4K], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
        for c in 0..4 {
            let (sc1, m1) = q4k_scale_min(2 * c, &b.scales);
            let (sc2, m2) = q4k_scale_min(2 * c + 1, &b.scales);
            let (d1, mm1) = (d * sc1 as f32, dmin * m1 as f32);
            let (d2, mm2) = (d * sc2 as f32, dmin * m2 as f32);
            for l in 0..32 {
                let q = b.qs[32 * c + l];
                yb[64 * c + l] = d1 * (q & 0xF) as f32 - mm1;
                yb[64 * c + 32 + l] = d2 * (q >> 4) as f32 - mm2;
            }
        }
    }
}

pub(crate) fn dequantize_q6_k(x: &[BlockQ6K], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for (e, o) in yb.iter_mut().enumerate() {
            let sc = b.scales[e / 16] as i8 as f32;
            // ggml: d * sc * q, evaluated left to right.
            *o = d * sc * (q6k_quant(b, e) as i32 - 32) as f32;
        }
    }
}

// ---------------------------------------------------------------- dot products

/// Integer dot of 32 unsigned 4-bit (as bytes 0..=15, element order) with 32 signed bytes.
#[inline(always)]
fn idot_q4(qs: &[u8; 16], y: &[u8; 32]) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        s += (qs[j] & 0xF) as i32 * y[j] as i8 as i32;
        s += (qs[j] >> 4) as i32 * y[j + 16] as i8 as i32;
    }
    s
}

#[inline(always)]
pub(crate) fn isum_i8(y: &[u8]) -> i32 {
    y.iter().map(|&v| v as i8 as i32).sum()
}

/// Q4_0 · Q8_0: per block acc = fma(dw * da, sum((q - 8) * y), acc).
pub(crate) fn dot_q4_0_q8_0(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    let mut acc = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let isum = idot_q4(&bw.qs, &ba.qs) - 8 * isum_i8(&ba.qs);
        acc = (f16_le(bw.d) * f16_le(ba.d)).mul_add(isum as f32, acc);
    }
    acc
}

/// Q4_1 · Q8_1: acc = fma(dw * da, sum(q * y), acc); accm = fma(m, s, accm); result acc + accm.
pub(crate) fn dot_q4_1_q8_1(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
    let mut acc = 0.0f32;
    let mut accm = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let isum = idot_q4(&bw.qs, &ba.qs);
        acc = (f16_le(bw.d) * f16_le(ba.d)).mul_add(isum as f32, acc);
        accm = f16_le(bw.m).mul_add(f16_le(ba.s), accm);
    }
    acc + accm
}

/// Q8_0 · Q8_0: acc = fma(dw * da, sum(w * y), acc).
pub(crate) fn dot_q8_0_q8_0(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    let mut acc = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let isum: i32 = bw
            .qs
            .iter()
            .zip(&ba.qs)
            .map(|(&x, &y)| x as i8 as i32 * y as i8 as i32)
            .sum();
        acc = (f16_le(bw.d) * f16_le(ba.d)).mul_add(isum as f32, acc);
    }
    acc
}

/// Integer parts of a Q4_K · Q8_K super-block: (sum_j sc_j * sum(q * y), sum_j m_j * sum(y)).
#[inline(always)]
pub(crate) fn q4k_isums(bw: &BlockQ4K, ba: &BlockQ8K) -> (i32, i32) {
    let mut sumi = 0i32;
    let mut summ = 0i32;
    for c in 0..4 {
        for half in 0..2 {
            let j = 2 * c + half;
            let (sc, m) = q4k_scale_min(j, &bw.scales);
            let mut s = 0i32;
            for l in 0..32 {
                let q = bw.qs[32 * c + l];
                let q = if half == 0 { q & 0xF } else { q >> 4 };
                s += q as i32 * ba.qs[32 * j + l] as i8 as i32;
            }
            sumi += sc as i32 * s;
            summ += m as i32 * (ba.bsum(2 * j) + ba.bsum(2 * j + 1));
        }
    }
    (sumi, summ)
}

/// Q4_K · Q8_K: acc = fma(d * da, sumi, acc); accm = fma(dmin * da, summ, accm); acc - accm.
pub(crate) fn dot_q4_k_q8_k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0.0f32;
    let mut accm = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        let (sumi, summ) = q4k_isums(bw, ba);
        let da = ba.d();
        acc = (f16_le(bw.d) * da).mul_add(sumi as f32, acc);
        accm = (f16_le(bw.dmin) * da).mul_add(summ as f32, accm);
    }
    acc - accm
}

/// Q6_K · Q8_K: acc = fma(d * da, sum_j sc_j * (sum(q * y) - 32 * bsum_j), acc).
pub(crate) fn dot_q6_k_q8_k(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0.0f32;
    for (bw, ba) in w.iter().zip(a) {
        // Walk ggml's layout directly (4 quants per ql/qh byte pair) rather than decoding each
        // element; the integer sums are exact, so the order does not matter.
        let mut sums = [0i32; 16];
        for n in 0..2 {
            let (ql, qh) = (&bw.ql[64 * n..64 * n + 64], &bw.qh[32 * n..32 * n + 32]);
            let y = &ba.qs[128 * n..128 * n + 128];
            for l in 0..32 {
                let h = qh[l] as i32;
                let q0 = (ql[l] & 0xF) as i32 | ((h & 3) << 4);
                let q1 = (ql[l + 32] & 0xF) as i32 | (((h >> 2) & 3) << 4);
                let q2 = (ql[l] >> 4) as i32 | (((h >> 4) & 3) << 4);
                let q3 = (ql[l + 32] >> 4) as i32 | (((h >> 6) & 3) << 4);
                let s = 8 * n + l / 16;
                sums[s] += q0 * y[l] as i8 as i32;
                sums[s + 2] += q1 * y[l + 32] as i8 as i32;
                sums[s + 4] += q2 * y[l + 64] as i8 as i32;
                sums[s + 6] += q3 * y[l + 96] as i8 as i32;
            }
        }
        acc = q6k_block_step(bw, ba, &sums, acc);
    }
    acc
}

/// One Q6_K super-block's float step from its 16 sub-block sums of unsigned quants times
/// activations: every ISA's twin ends each block with exactly this.
#[inline(always)]
pub(crate) fn q6k_block_step(bw: &BlockQ6K, ba: &BlockQ8K, sums: &[i32; 16], acc: f32) -> f32 {
    let mut sumi = 0i32;
    for (j, s) in sums.iter().enumerate() {
        sumi += bw.scales[j] as i8 as i32 * (s - 32 * ba.bsum(j));
    }
    (f16_le(bw.d) * ba.d()).mul_add(sumi as f32, acc)
}

/// Horizontal sum of 8 lanes in the order the AVX code reduces a `__m256`.
#[inline(always)]
pub(crate) fn hsum8(v: &[f32; 8]) -> f32 {
    let a = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
    (a[0] + a[2]) + (a[1] + a[3])
}

/// The float dot product every path uses for F32/F16 data: 32 lanes, lane k accumulating
/// elements i = k (mod 32) with fma, reduced as ((l0..7 + l8..15) + (l16..23 + l24..31)) then
/// [`hsum8`], then the n % 32 tail added in order with fma.
#[inline(always)]
pub(crate) fn dot_f32_lanes(n: usize, w: impl Fn(usize) -> f32, x: impl Fn(usize) -> f32) -> f32 {
    let mut acc = [0f32; 32];
    let full = n / 32 * 32;
    for base in (0..full).step_by(32) {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = w(base + k).mul_add(x(base + k), *a);
        }
    }
    let mut s = [0f32; 8];
    for k in 0..8 {
        s[k] = (acc[k] + acc[k + 8]) + (acc[k + 16] + acc[k + 24]);
    }
    let mut r = hsum8(&s);
    for i in full..n {
        r = w(i).mul_add(x(i), r);
    }
    r
}

#[inline(always)]
pub(crate) fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

#[inline(always)]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_le([b[2 * i], b[2 * i + 1]])
}

/// F32 weights (bytes) · f32 activations (bytes).
pub(crate) fn dot_f32(n: usize, w: &[u8], x: &[u8]) -> f32 {
    dot_f32_lanes(n, |i| f32_at(w, i), |i| f32_at(x, i))
}

/// F16 weights (bytes) · f32 activations (bytes).
pub(crate) fn dot_f16(n: usize, w: &[u8], x: &[u8]) -> f32 {
    dot_f32_lanes(n, |i| f16_at(w, i), |i| f32_at(x, i))
}

// ---------------------------------------------------------------- f16 helpers (KV cache)

pub(crate) fn f32_to_f16_row(src: &[f32], dst: &mut [f16]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f16::from_f32(s);
    }
}

pub(crate) fn f16_to_f32_row(src: &[f16], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

pub(crate) fn dot_f32_f16(x: &[f32], y: &[f16]) -> f32 {
    dot_f32_lanes(x.len(), |i| y[i].to_f32(), |i| x[i])
}

/// y += a * x, each element one fma.
pub(crate) fn axpy_f16(a: f32, x: &[f16], y: &mut [f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = a.mul_add(v.to_f32(), *o);
    }
}

// ---------------------------------------------------------------- sparse FFN rows (axpy_rows)

/// `out += Σ_k coefs[k] · row(neurons[k])`, the definition every ISA reproduces bit for bit.
///
/// Float steps, per output element i (starting from `out[i]` as given):
/// `for k in order: out[i] = fma(coefs[k], x, out[i])`, with x the weight value of row
/// `neurons[k]`, column i:
/// * Q8_0: `d * (q as f32)`; Q4_0: `d * ((q - 8) as f32)` (q - 8 in integers). Both products
///   are exact (11 significant bits of the f16 scale times at most 8 bits of quant).
/// * Q4_1: `fma(d, q as f32, m)`. Since `d * q` is exact this is the same value as ggml's (and
///   [`dequantize_row`](super::dequantize_row)'s) `d * q + m` in two roundings, including for
///   infinite or NaN scales (up to NaN payloads).
/// * Q5_0: `d * ((q - 16) as f32)`, IQ4_NL: `d * (grid[q] as f32)` (exact products, as Q4_0);
///   Q5_1: `fma(d, q as f32, m)` (as Q4_1).
/// * F16/BF16: the exact f32 of the half; F32: the value.
///
/// So x is exactly `dequantize_row`'s value and the result equals "dequantize each row, then one
/// fma per element per neuron in neuron order" (the tests check this). The caller validated the geometry: `data` holds rows of `stride`
/// bytes, every neuron indexes a row, `coefs.len() == neurons.len()`, and `out.len()` elements
/// (a whole number of blocks) fill a row.
pub(crate) fn axpy_rows(
    ty: super::GgmlType,
    data: &[u8],
    stride: usize,
    neurons: &[u32],
    coefs: &[f32],
    out: &mut [f32],
) {
    use super::GgmlType;
    fn blocks<B: Block>(row: &[u8]) -> &[B] {
        view::<B>(row).expect("whole blocks")
    }
    for (&n, &c) in neurons.iter().zip(coefs) {
        let row = &data[n as usize * stride..][..stride];
        match ty {
            GgmlType::Q8_0 => {
                for (b, o) in blocks::<BlockQ8_0>(row)
                    .iter()
                    .zip(out.chunks_exact_mut(32))
                {
                    let d = f16_le(b.d);
                    for (o, &q) in o.iter_mut().zip(&b.qs) {
                        *o = c.mul_add(d * q as i8 as f32, *o);
                    }
                }
            }
            GgmlType::Q4_0 => {
                for (b, o) in blocks::<BlockQ4_0>(row)
                    .iter()
                    .zip(out.chunks_exact_mut(32))
                {
                    let d = f16_le(b.d);
                    for j in 0..16 {
                        let lo = d * ((b.qs[j] & 0xF) as i32 - 8) as f32;
                        let hi = d * ((b.qs[j] >> 4) as i32 - 8) as f32;
                        o[j] = c.mul_add(lo, o[j]);
                        o[j + 16] = c.mul_add(hi, o[j + 16]);
                    }
                }
            }
            GgmlType::Q4_1 => {
                for (b, o) in blocks::<BlockQ4_1>(row)
                    .iter()
                    .zip(out.chunks_exact_mut(32))
                {
                    let (d, m) = (f16_le(b.d), f16_le(b.m));
                    for j in 0..16 {
                        let lo = d.mul_add((b.qs[j] & 0xF) as f32, m);
                        let hi = d.mul_add((b.qs[j] >> 4) as f32, m);
                        o[j] = c.mul_add(lo, o[j]);
                        o[j + 16] = c.mul_add(hi, o[j + 16]);
                    }
                }
            }
            GgmlType::Q5_0 => axpy_blocks(blocks::<BlockQ5_0>(row), c, out, axpy_values_q5_0),
            GgmlType::Q5_1 => axpy_blocks(blocks::<BlockQ5_1>(row), c, out, axpy_values_q5_1),
            GgmlType::IQ4_NL => axpy_blocks(blocks::<BlockIQ4NL>(row), c, out, axpy_values_iq4_nl),
            GgmlType::F16 => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = c.mul_add(f16_at(row, i), *o);
                }
            }
            GgmlType::F32 => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = c.mul_add(f32_at(row, i), *o);
                }
            }
            GgmlType::BF16 => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = c.mul_add(bf16_at(row, i), *o);
                }
            }
            ty => panic!("axpy_rows: {ty} is not supported"),
        }
    }
}

/// One neuron's term of [`axpy_rows`] for a 32-element format whose values `values` gives.
#[inline(always)]
fn axpy_blocks<B>(row: &[B], c: f32, out: &mut [f32], values: impl Fn(&B) -> [f32; 32]) {
    for (b, o) in row.iter().zip(out.chunks_exact_mut(32)) {
        for (o, x) in o.iter_mut().zip(values(b)) {
            *o = c.mul_add(x, *o);
        }
    }
}

//! NEON activation quantizers (Q8_0, Q8_1, Q8_K): ggml's rounding and scales, bit for bit.

use super::*;
/// Max |x| of 32 floats (`fmaxnm`, as `f32::max`: a NaN is ignored; max is exact, so the order
/// is irrelevant).
#[inline(always)]
pub(super) unsafe fn absmax32(v: &[float32x4_t; 8]) -> f32 {
    let mut m = vabsq_f32(v[0]);
    for x in &v[1..] {
        m = vmaxnmq_f32(m, vabsq_f32(*x));
    }
    // 0.0 first, as the scalar fold starts from it (matters only for all-NaN input).
    0.0f32.max(vmaxnmvq_f32(m))
}

#[inline(always)]
pub(super) unsafe fn load_f32x32(x: &[f32]) -> [float32x4_t; 8] {
    assert!(x.len() >= 32);
    // SAFETY: 32 floats are in bounds (asserted).
    std::array::from_fn(|k| vld1q_f32(x.as_ptr().add(4 * k)))
}

/// `rne(v * m)` clamped to -128..=127 (the saturating narrows are the clamp), stored in element
/// order into `q`; returns the sum of the stored quants.
#[inline(always)]
pub(super) unsafe fn round_pack(v: &[float32x4_t; 8], m: f32, q: &mut [u8; 32]) -> i32 {
    let i: [int32x4_t; 8] = std::array::from_fn(|k| vcvtnq_s32_f32(vmulq_n_f32(v[k], m)));
    let h: [int16x8_t; 4] =
        std::array::from_fn(|k| vcombine_s16(vqmovn_s32(i[2 * k]), vqmovn_s32(i[2 * k + 1])));
    let b0 = vcombine_s8(vqmovn_s16(h[0]), vqmovn_s16(h[1]));
    let b1 = vcombine_s8(vqmovn_s16(h[2]), vqmovn_s16(h[3]));
    // SAFETY: writes exactly the 32 bytes of `q`, 16 at a time.
    vst1q_s8(q.as_mut_ptr().cast(), b0);
    vst1q_s8(q.as_mut_ptr().add(16).cast(), b1);
    vaddlvq_s8(b0) as i32 + vaddlvq_s8(b1) as i32
}

#[inline(always)]
pub(super) unsafe fn quantize_q8_0_impl(x: &[f32], y: &mut [BlockQ8_0]) {
    for (xb, yb) in x.chunks_exact(32).zip(y.iter_mut()) {
        let v = load_f32x32(xb);
        let amax = absmax32(&v);
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        round_pack(&v, id, &mut yb.qs);
        yb.d = f16_bytes(d);
    }
}

#[inline(always)]
pub(super) unsafe fn quantize_q8_1_impl(x: &[f32], y: &mut [BlockQ8_1]) {
    for (xb, yb) in x.chunks_exact(32).zip(y.iter_mut()) {
        let v = load_f32x32(xb);
        let amax = absmax32(&v);
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let sum = round_pack(&v, id, &mut yb.qs);
        yb.d = f16_bytes(d);
        yb.s = f16_bytes(d * sum as f32);
    }
}

#[inline(always)]
pub(super) unsafe fn quantize_q8_k_impl(x: &[f32], y: &mut [BlockQ8K]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        // The signed value of largest magnitude, first one on ties, NaN ignored: exactly
        // `scalar::signed_absmax` (a vector max then a scan for its first occurrence).
        let mut amax = 0.0f32;
        for c in xb.chunks_exact(32) {
            amax = amax.max(absmax32(&load_f32x32(c)));
        }
        if amax == 0.0 {
            scalar::quantize_q8_k(xb, std::slice::from_mut(yb));
            continue;
        }
        let max = *xb.iter().find(|v| v.abs() == amax).unwrap_or(&amax);
        let iscale = -127.0 / max;
        for (c, xc) in xb.chunks_exact(32).enumerate() {
            let q: &mut [u8; 32] = (&mut yb.qs[32 * c..32 * c + 32])
                .try_into()
                .expect("32 bytes");
            round_pack(&load_f32x32(xc), iscale, q);
        }
        scalar::q8k_finish(yb, iscale);
    }
}

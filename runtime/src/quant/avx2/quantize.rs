//! AVX2 activation quantizers (Q8_0, Q8_1, Q8_K), bit-identical to their `scalar.rs` twins,
//! under the safety contract of `avx2.rs`.

use super::*;

// ---------------------------------------------------------------- activation quantization

/// Max |x| of 32 floats, reduced like ggml's AVX code (max is exact, so order is irrelevant).
#[inline(always)]
unsafe fn absmax32(v: [__m256; 4]) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_andnot_ps(sign, v[0]);
    for x in &v[1..] {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *x));
    }
    let m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    _mm_cvtss_f32(m4)
}

/// Rounds (ties to even) and packs 32 floats to 32 i8 with saturation, in element order.
#[inline(always)]
unsafe fn round_pack(v: [__m256; 4]) -> (__m256i, [__m256i; 4]) {
    let i: [__m256i; 4] = std::array::from_fn(|k| {
        _mm256_cvtps_epi32(_mm256_round_ps(
            v[k],
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        ))
    });
    let a = _mm256_packs_epi32(i[0], i[1]);
    let b = _mm256_packs_epi32(i[2], i[3]);
    let p = _mm256_packs_epi16(a, b);
    // The packs work per 128-bit half; this permutation restores element order.
    (
        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)),
        i,
    )
}

#[inline(always)]
unsafe fn load32(x: &[f32]) -> [__m256; 4] {
    assert!(x.len() >= 32);
    // SAFETY: 32 floats are in bounds (asserted).
    std::array::from_fn(|k| _mm256_loadu_ps(x.as_ptr().add(8 * k)))
}

#[inline(always)]
pub(super) unsafe fn quantize_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    for (xb, yb) in x.chunks_exact(32).zip(y.iter_mut()) {
        let v = load32(xb);
        let amax = absmax32(v);
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let m = _mm256_set1_ps(id);
        let (q, _) = round_pack(v.map(|x| _mm256_mul_ps(x, m)));
        _mm256_storeu_si256(yb.qs.as_mut_ptr().cast(), q);
        yb.d = f16_bytes(d);
    }
}

#[inline(always)]
pub(super) unsafe fn quantize_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    for (xb, yb) in x.chunks_exact(32).zip(y.iter_mut()) {
        let v = load32(xb);
        let amax = absmax32(v);
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let m = _mm256_set1_ps(id);
        let (q, i) = round_pack(v.map(|x| _mm256_mul_ps(x, m)));
        _mm256_storeu_si256(yb.qs.as_mut_ptr().cast(), q);
        let s = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        let sum = _mm_cvtsi128_si32(reduce::<1>([s]));
        yb.d = f16_bytes(d);
        yb.s = f16_bytes(d * sum as f32);
    }
}

#[inline(always)]
pub(super) unsafe fn quantize_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut amax = 0.0f32;
        for c in xb.chunks_exact(32) {
            amax = amax.max(absmax32(load32(c)));
        }
        if amax == 0.0 {
            scalar::quantize_q8_k(xb, std::slice::from_mut(yb));
            continue;
        }
        // The sign of the scale comes from the first element of largest magnitude.
        let max = *xb.iter().find(|v| v.abs() == amax).unwrap_or(&amax);
        let iscale = -127.0 / max;
        let m = _mm256_set1_ps(iscale);
        for (c, xc) in xb.chunks_exact(32).enumerate() {
            let (q, _) = round_pack(load32(xc).map(|x| _mm256_mul_ps(m, x)));
            _mm256_storeu_si256(yb.qs[32 * c..].as_mut_ptr().cast(), q);
        }
        scalar::q8k_finish(yb, iscale);
    }
}

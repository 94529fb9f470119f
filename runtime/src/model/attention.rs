//! Attention of one query over one KV head of the f16 cache.
//!
//! One numerics for every query, llama.cpp's CPU flash-attention vector path (its decode): the
//! query is rounded to f16, scores are f16·f16 dot products accumulated in f32, and the
//! weighted sum of values is accumulated in an f16 vector with online softmax. Prefill uses it
//! too (llama.cpp switches to f32 tiles from 64 queries; we do not), so a position's output
//! never depends on how many queries shared its step.
//!
//! The f16 helpers have an AVX2+F16C path and a scalar twin that computes bit-identical results
//! (same lanes, same fused multiply-adds, same reduction tree); tests hold one against the other.

use crate::quant::Kernels;
use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

/// Scratch vectors reused across calls (one per worker thread).
#[derive(Default)]
pub struct AttnScratch {
    q16: Vec<f16>,
    acc16: Vec<u16>,
}

/// Attends `q` (f32, `head_dim`) over the first `n_kv` positions of `keys`/`values`
/// (`[position][head_dim]` f16 bits), writing `head_dim` outputs. llama.cpp's vector path.
#[allow(clippy::too_many_arguments)]
pub fn attend_vec(
    kernels: &Kernels,
    q: &[f32],
    keys: &[u16],
    values: &[u16],
    n_kv: usize,
    scale: f32,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let hd = q.len();
    let f = F16Ops::detect();
    scratch.q16.resize(hd, f16::ZERO);
    scratch.acc16.clear();
    scratch.acc16.resize(hd, 0);
    kernels.f32_to_f16(q, &mut scratch.q16);
    let q16: &[u16] = scratch.q16.reinterpret_cast();
    let (mut sum, mut max) = (0.0f32, f32::NEG_INFINITY);
    for pos in 0..n_kv {
        let row = pos * hd..(pos + 1) * hd;
        let s = f.dot_f16(&keys[row.clone()], q16) * scale;
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if s > max {
            let old = max;
            max = s;
            ms = (old - max).exp();
            f.scale_f16(&mut scratch.acc16, ms);
        } else {
            vs = (s - max).exp();
        }
        f.mad_f16(&mut scratch.acc16, &values[row], vs);
        sum = sum * ms + vs;
    }
    kernels.f16_to_f32(scratch.acc16.reinterpret_cast(), out);
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    out.iter_mut().for_each(|o| *o *= inv);
}

/// f16 vector operations, dispatched once to AVX2+F16C, NEON or the scalar twin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum F16Ops {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
    Neon,
}

impl F16Ops {
    pub fn detect() -> F16Ops {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            return F16Ops::Avx2;
        }
        #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
        if std::arch::is_aarch64_feature_detected!("neon") {
            return F16Ops::Neon;
        }
        F16Ops::Scalar
    }

    /// Dot product of two f16 vectors, accumulated in f32 over 4×8 lanes (ggml's order).
    pub fn dot_f16(self, a: &[u16], b: &[u16]) -> f32 {
        assert_eq!(a.len(), b.len());
        match self {
            F16Ops::Scalar => scalar::dot_f16(a, b),
            // SAFETY: as in `f32_to_f16`.
            #[cfg(target_arch = "x86_64")]
            F16Ops::Avx2 => unsafe { avx2::dot_f16(a, b) },
            // SAFETY: NEON detected by `detect`, the only way to get `Neon`.
            #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
            F16Ops::Neon => unsafe { neon::dot_f16(a, b) },
        }
    }

    /// `acc[i] = f16(fma(v[i], s, acc[i]))`.
    pub fn mad_f16(self, acc: &mut [u16], v: &[u16], s: f32) {
        assert_eq!(acc.len(), v.len());
        match self {
            F16Ops::Scalar => scalar::mad_f16(acc, v, s),
            // SAFETY: as in `f32_to_f16`.
            #[cfg(target_arch = "x86_64")]
            F16Ops::Avx2 => unsafe { avx2::mad_f16(acc, v, s) },
            // SAFETY: as in `dot_f16`.
            #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
            F16Ops::Neon => unsafe { neon::mad_f16(acc, v, s) },
        }
    }

    /// `acc[i] = f16(acc[i] * s)`.
    pub fn scale_f16(self, acc: &mut [u16], s: f32) {
        match self {
            F16Ops::Scalar => scalar::scale_f16(acc, s),
            // SAFETY: as in `f32_to_f16`.
            #[cfg(target_arch = "x86_64")]
            F16Ops::Avx2 => unsafe { avx2::scale_f16(acc, s) },
            // SAFETY: as in `dot_f16`.
            #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
            F16Ops::Neon => unsafe { neon::scale_f16(acc, s) },
        }
    }
}

/// Lanes per step of the f16 dot product: 4 accumulators of 8 f32 lanes.
const STEP: usize = 32;

mod scalar {
    use super::{f16, STEP};

    fn h(x: u16) -> f32 {
        f16::from_bits(x).to_f32()
    }

    fn to_h(x: f32) -> u16 {
        f16::from_f32(x).to_bits()
    }

    pub fn dot_f16(a: &[u16], b: &[u16]) -> f32 {
        let mut acc = [[0.0f32; 8]; 4];
        let main = a.len() / STEP * STEP;
        for base in (0..main).step_by(STEP) {
            for (j, lanes) in acc.iter_mut().enumerate() {
                for (l, lane) in lanes.iter_mut().enumerate() {
                    let i = base + j * 8 + l;
                    *lane = h(a[i]).mul_add(h(b[i]), *lane);
                }
            }
        }
        // Reduction tree of ggml's AVX path: (0+2), (1+3), then (0+1); then 8 lanes → 1.
        let [a0, a1, a2, a3] = &mut acc;
        for (((x0, x1), x2), x3) in a0
            .iter_mut()
            .zip(a1.iter_mut())
            .zip(a2.iter())
            .zip(a3.iter())
        {
            *x0 += x2;
            *x1 += x3;
            *x0 += *x1;
        }
        let x = acc[0];
        let t0 = [x[0] + x[4], x[1] + x[5], x[2] + x[6], x[3] + x[7]];
        let t1 = [t0[0] + t0[1], t0[2] + t0[3]];
        let mut sum = (t1[0] + t1[1]) as f64;
        for i in main..a.len() {
            sum += (h(a[i]) * h(b[i])) as f64;
        }
        sum as f32
    }

    pub fn mad_f16(acc: &mut [u16], v: &[u16], s: f32) {
        for (a, &x) in acc.iter_mut().zip(v) {
            *a = to_h(h(x).mul_add(s, h(*a)));
        }
    }

    pub fn scale_f16(acc: &mut [u16], s: f32) {
        for a in acc.iter_mut() {
            *a = to_h(h(*a) * s);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{scalar, STEP};
    use std::arch::x86_64::*;

    // All functions: callers guarantee avx2, fma and f16c are available (see `F16Ops::detect`).
    // Pointer arithmetic stays inside the slices: every vector access covers
    // `[i, i + 8)` with `i + 8 <= len` by the loop bounds, and tails go to the scalar twin.

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_h(p: *const u16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16(a: &[u16], b: &[u16]) -> f32 {
        let main = a.len() / STEP * STEP;
        let mut acc = [_mm256_setzero_ps(); 4];
        for base in (0..main).step_by(STEP) {
            for (j, lane) in acc.iter_mut().enumerate() {
                let i = base + j * 8;
                *lane =
                    _mm256_fmadd_ps(load_h(a.as_ptr().add(i)), load_h(b.as_ptr().add(i)), *lane);
            }
        }
        let a02 = _mm256_add_ps(acc[0], acc[2]);
        let a13 = _mm256_add_ps(acc[1], acc[3]);
        let x = _mm256_add_ps(a02, a13);
        let t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
        let t1 = _mm_hadd_ps(t0, t0);
        let mut sum = _mm_cvtss_f32(_mm_hadd_ps(t1, t1)) as f64;
        for i in main..a.len() {
            let p = half::f16::from_bits(a[i]).to_f32() * half::f16::from_bits(b[i]).to_f32();
            sum += p as f64;
        }
        sum as f32
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn mad_f16(acc: &mut [u16], v: &[u16], s: f32) {
        let main = acc.len() / 8 * 8;
        let vs = _mm256_set1_ps(s);
        for i in (0..main).step_by(8) {
            let y = _mm256_fmadd_ps(load_h(v.as_ptr().add(i)), vs, load_h(acc.as_ptr().add(i)));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(y);
            _mm_storeu_si128(acc.as_mut_ptr().add(i) as *mut __m128i, h);
        }
        scalar::mad_f16(&mut acc[main..], &v[main..], s);
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scale_f16(acc: &mut [u16], s: f32) {
        let main = acc.len() / 8 * 8;
        let vs = _mm256_set1_ps(s);
        for i in (0..main).step_by(8) {
            let y = _mm256_mul_ps(load_h(acc.as_ptr().add(i)), vs);
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(y);
            _mm_storeu_si128(acc.as_mut_ptr().add(i) as *mut __m128i, h);
        }
        scalar::scale_f16(&mut acc[main..], s);
    }
}

/// The scalar twin's operations on 4 f32 lanes a register: f16 converted exactly (`fcvtl`), the
/// same fused multiply-adds lane for lane, rounded back to f16 to nearest even (`fcvtn`).
#[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
mod neon {
    use super::{scalar, STEP};
    use crate::quant::neon::{f16x4_to_f32, f32x4_to_f16};
    use std::arch::aarch64::*;

    // All functions: callers guarantee NEON (see `F16Ops::detect`). Pointer arithmetic stays
    // inside the slices: every vector access covers `[i, i + 4)` with `i + 4 <= len` by the loop
    // bounds, and tails go to the scalar twin.

    #[inline(always)]
    unsafe fn load_h(p: *const u16) -> float32x4_t {
        f16x4_to_f32(vld1_u16(p))
    }

    pub unsafe fn dot_f16(a: &[u16], b: &[u16]) -> f32 {
        let main = a.len() / STEP * STEP;
        // acc[2j] and acc[2j + 1]: lanes 0..4 and 4..8 of the scalar twin's accumulator j.
        let mut acc = [vdupq_n_f32(0.0); 8];
        for base in (0..main).step_by(STEP) {
            for (k, lane) in acc.iter_mut().enumerate() {
                let i = base + 4 * k;
                *lane = vfmaq_f32(*lane, load_h(a.as_ptr().add(i)), load_h(b.as_ptr().add(i)));
            }
        }
        // The twin's tree: x = (a0 + a2) + (a1 + a3) per lane, then x[l] + x[l + 4], pairs,
        // and the last pair.
        let lo = vaddq_f32(vaddq_f32(acc[0], acc[4]), vaddq_f32(acc[2], acc[6]));
        let hi = vaddq_f32(vaddq_f32(acc[1], acc[5]), vaddq_f32(acc[3], acc[7]));
        let t0 = vaddq_f32(lo, hi);
        let t1 = vpaddq_f32(t0, t0);
        let mut sum = (vgetq_lane_f32::<0>(t1) + vgetq_lane_f32::<1>(t1)) as f64;
        for i in main..a.len() {
            let p = half::f16::from_bits(a[i]).to_f32() * half::f16::from_bits(b[i]).to_f32();
            sum += p as f64;
        }
        sum as f32
    }

    pub unsafe fn mad_f16(acc: &mut [u16], v: &[u16], s: f32) {
        let main = acc.len() / 4 * 4;
        let vs = vdupq_n_f32(s);
        for i in (0..main).step_by(4) {
            let y = vfmaq_f32(load_h(acc.as_ptr().add(i)), load_h(v.as_ptr().add(i)), vs);
            vst1_u16(acc.as_mut_ptr().add(i), f32x4_to_f16(y));
        }
        scalar::mad_f16(&mut acc[main..], &v[main..], s);
    }

    pub unsafe fn scale_f16(acc: &mut [u16], s: f32) {
        let main = acc.len() / 4 * 4;
        let vs = vdupq_n_f32(s);
        for i in (0..main).step_by(4) {
            let y = vmulq_f32(load_h(acc.as_ptr().add(i)), vs);
            vst1_u16(acc.as_mut_ptr().add(i), f32x4_to_f16(y));
        }
        scalar::scale_f16(&mut acc[main..], s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn to_bits(v: &[f32]) -> Vec<u16> {
        v.iter().map(|&x| f16::from_f32(x).to_bits()).collect()
    }

    /// Softmax attention in f64 on the f16-rounded inputs: the exact answer the path approaches.
    fn reference(q: &[f32], k: &[u16], v: &[u16], n_kv: usize, scale: f32) -> Vec<f64> {
        let hd = q.len();
        let h = |x: u16| f16::from_bits(x).to_f32() as f64;
        let scores: Vec<f64> = (0..n_kv)
            .map(|p| (0..hd).map(|d| q[d] as f64 * h(k[p * hd + d])).sum::<f64>() * scale as f64)
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let total: f64 = w.iter().sum();
        (0..hd)
            .map(|d| (0..n_kv).map(|p| w[p] * h(v[p * hd + d])).sum::<f64>() / total)
            .collect()
    }

    fn vectors(n: usize) -> impl Strategy<Value = Vec<f32>> {
        proptest::collection::vec(-4.0f32..4.0, n)
    }

    /// Every aarch64 CPU has NEON, so the proptest below compares the NEON path there.
    #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
    #[test]
    fn aarch64_takes_the_neon_f16_path() {
        assert_eq!(F16Ops::detect(), F16Ops::Neon);
    }

    proptest! {
        #[test]
        fn simd_f16_ops_equal_their_scalar_twin(a in vectors(77), b in vectors(77), s in -3.0f32..3.0) {
            let simd = F16Ops::detect();
            let scalar = F16Ops::Scalar;
            let (ha, hb) = (to_bits(&a), to_bits(&b));
            prop_assert_eq!(simd.dot_f16(&ha, &hb).to_bits(), scalar.dot_f16(&ha, &hb).to_bits());
            let (mut x, mut y) = (ha.clone(), ha.clone());
            simd.mad_f16(&mut x, &hb, s);
            scalar.mad_f16(&mut y, &hb, s);
            prop_assert_eq!(&x, &y);
            simd.scale_f16(&mut x, s);
            scalar.scale_f16(&mut y, s);
            prop_assert_eq!(&x, &y);
        }

        #[test]
        fn attention_matches_exact_softmax_attention_on_every_kernel_set(
            q in vectors(64), kv in vectors(64 * 150), vv in vectors(64 * 150), n_kv in 1usize..150,
        ) {
            let (k, v) = (to_bits(&kv), to_bits(&vv));
            let scale = 0.125;
            let exact = reference(&q, &k, &v, n_kv, scale);
            let mut scratch = AttnScratch::default();
            let mut first: Option<Vec<f32>> = None;
            for kernels in Kernels::available() {
                let mut a = vec![0.0; 64];
                attend_vec(&kernels, &q, &k, &v, n_kv, scale, &mut scratch, &mut a);
                for d in 0..64 {
                    // q and the accumulator are rounded to f16 (≈ 1e-3 relative per step).
                    prop_assert!((a[d] as f64 - exact[d]).abs() < 2e-2, "{d}: {} vs {}", a[d], exact[d]);
                }
                // The same bits whatever the kernel set.
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                match &first {
                    Some(f) => prop_assert_eq!(bits(f), bits(&a)),
                    None => first = Some(a),
                }
            }
        }
    }

    #[test]
    fn a_single_position_returns_its_value() {
        let q = vec![0.3f32; 64];
        let k = to_bits(&[0.5f32; 64]);
        let v = to_bits(&(0..64).map(|i| i as f32 / 8.0).collect::<Vec<_>>());
        let mut scratch = AttnScratch::default();
        let mut out = vec![0.0; 64];
        attend_vec(
            &Kernels::best(),
            &q,
            &k,
            &v,
            1,
            0.125,
            &mut scratch,
            &mut out,
        );
        for (i, o) in out.iter().enumerate() {
            assert_eq!(*o, i as f32 / 8.0);
        }
    }
}

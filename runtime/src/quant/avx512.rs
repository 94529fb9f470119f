//! AVX512-VNNI kernels: the 16-row prefill GEMM on 512-bit vectors, and the 256-bit kernels of
//! `avx2.rs` with the EVEX `vpdpbusd` (so CPUs with AVX512-VNNI but without AVX-VNNI, e.g. Ice
//! Lake-SP or Zen 4, get VNNI too).
//!
//! Why 512 bits only for the GEMM: measured here (Sapphire Rapids VM), `vpdpbusd` on zmm does
//! ~1.7x the int8 MACs per second of ymm, and the row-interleaved GEMM is bound by exactly that
//! instruction. Decode (matvec) is bound by reductions and memory, where wider vectors do not help.
//!
//! Same numerics as everywhere: exact integer block sums, then the scalar twin's float steps per
//! (row, token) lane; results are bit-identical to `scalar.rs`.
//!
//! Safety: same contract as `avx2.rs` (the only precondition of these `unsafe fn`s is CPU
//! support for their target features; all loads/stores are from fixed-size arrays or
//! bounds-checked slices).

use super::avx2::{entry_idot, matmul_impl, matvec_impl, vec_dot_impl, IDot, Rows, WeightBlock};
use super::gemm::{f16f, tables, transpose8};
use std::arch::x86_64::*;

/// `vpdpbusd` with the AVX512-VL encoding on 256-bit vectors.
pub(crate) struct Vnni512;

impl IDot for Vnni512 {
    #[inline(always)]
    unsafe fn dp(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, a, b)
    }
    #[inline(always)]
    unsafe fn ss_prep(y: __m256i) -> __m256i {
        // -128 * (sum of each 4 y), as in `avx2::Vnni`.
        let c = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(-128), y);
        _mm256_sub_epi32(_mm256_setzero_si256(), c)
    }
    #[inline(always)]
    unsafe fn ss(w: __m256i, y: __m256i, prep: __m256i) -> __m256i {
        let wu = _mm256_xor_si256(w, _mm256_set1_epi8(-128));
        _mm256_dpbusd_epi32(prep, wu, y)
    }
}

/// The 256-bit kernels (matvec, small matmul, vec_dot) with [`Vnni512`].
pub(crate) mod narrow {
    use super::*;

    entry_idot!(
        "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
        Vnni512
    );
}

/// One repacked block of 16 rows: `w[g]` lane r (32-bit) = row r's unsigned quants 4g..4g+4.
#[derive(Clone, Copy)]
#[repr(C)]
struct Packed16 {
    w: [[u8; 64]; 8],
    d: [f32; 16],
    m: [f32; 16],
}

#[inline(always)]
unsafe fn pack16<W: WeightBlock>(rows: [&[W]; 16], nb: usize, dst: &mut [Packed16]) {
    for (b, p) in dst.iter_mut().enumerate().take(nb) {
        for half in 0..2 {
            let u: [__m256i; 8] = std::array::from_fn(|r| rows[8 * half + r][b].unsigned_quants());
            for (g, v) in transpose8(u).into_iter().enumerate() {
                _mm256_storeu_si256(p.w[g][32 * half..].as_mut_ptr().cast(), v);
            }
        }
        for (r, row) in rows.iter().enumerate() {
            let dm = row[b].wdm();
            p.d[r] = f16f([dm[0], dm[1]]);
            p.m[r] = f16f([dm[2], dm[3]]);
        }
    }
}

#[inline(always)]
unsafe fn bcast4(y: &[u8; 32], g: usize) -> __m512i {
    _mm512_set1_epi32(i32::from_le_bytes([
        y[4 * g],
        y[4 * g + 1],
        y[4 * g + 2],
        y[4 * g + 3],
    ]))
}

/// Row-interleaved GEMM, 16 rows x 4 tokens per step (see `gemm.rs` for the scheme).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn matmul_packed16<W: WeightBlock>(
    m: Rows<'_>,
    acts: &[W::Act],
    n_tokens: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let nb = m.nb;
    assert!(acts.len() >= n_tokens * nb && n_tokens > 0);
    let (da, sa, corr) = tables::<W>(&acts[..n_tokens * nb]);
    let empty = Packed16 {
        w: [[0; 64]; 8],
        d: [0.0; 16],
        m: [0.0; 16],
    };
    let mut packed = vec![empty; nb];
    let mut r0 = 0;
    while r0 < m.rows {
        let n = (m.rows - r0).min(16);
        // A short last group repeats its last row; lanes are independent.
        let rows: [&[W]; 16] = std::array::from_fn(|k| m.row::<W>(r0 + k.min(n - 1)));
        pack16(rows, nb, &mut packed);
        let mut t0 = 0;
        while t0 < n_tokens {
            let toks: [usize; 4] = std::array::from_fn(|j| (t0 + j).min(n_tokens - 1));
            let mut acc = [_mm512_setzero_ps(); 4];
            for (b, p) in packed.iter().enumerate() {
                let idx: [usize; 4] = std::array::from_fn(|j| toks[j] * nb + b);
                let ys = idx.map(|i| W::act_qs(&acts[i]));
                let mut s: [__m512i; 4] = std::array::from_fn(|j| _mm512_set1_epi32(corr[idx[j]]));
                for (g, wg) in p.w.iter().enumerate() {
                    let wg = _mm512_loadu_si512(wg.as_ptr().cast());
                    for j in 0..4 {
                        s[j] = _mm512_dpbusd_epi32(s[j], wg, bcast4(ys[j], g));
                    }
                }
                let dw = _mm512_loadu_ps(p.d.as_ptr());
                for j in 0..4 {
                    let d = _mm512_mul_ps(dw, _mm512_set1_ps(da[idx[j]]));
                    acc[j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s[j]), acc[j]);
                }
            }
            if W::HAS_MIN {
                // The separate m * s chain of the scalar twin.
                let mut accm = [_mm512_setzero_ps(); 4];
                for (b, p) in packed.iter().enumerate() {
                    let mw = _mm512_loadu_ps(p.m.as_ptr());
                    for j in 0..4 {
                        let s = _mm512_set1_ps(sa[toks[j] * nb + b]);
                        accm[j] = _mm512_fmadd_ps(mw, s, accm[j]);
                    }
                }
                for j in 0..4 {
                    acc[j] = _mm512_add_ps(acc[j], accm[j]);
                }
            }
            for (j, v) in acc.iter().enumerate() {
                if t0 + j >= n_tokens {
                    break;
                }
                let mut tmp = [0f32; 16];
                _mm512_storeu_ps(tmp.as_mut_ptr(), *v);
                let o = (t0 + j) * out_stride + r0;
                out[o..o + n].copy_from_slice(&tmp[..n]);
            }
            t0 += 4;
        }
        r0 += 16;
    }
}

//! Prefill GEMM for the 32-element formats with row-interleaved weights (AVX2: 4- and 5-bit
//! weights; AVX-VNNI: all).
//!
//! The 4x4 tile kernel in `avx2.rs` must reduce each (row, token, block) product vector across
//! its 8 lanes (`vphaddd` trees), which costs more than the multiply itself. Here each group of
//! 8 weight rows is first repacked, once per call, so that for block b and element group g
//! (elements 4g..4g+4) one register holds, in 32-bit lane r, those 4 bytes of row r. Broadcasting
//! the token's 4 activation bytes of group g and multiply-accumulating over the 8 groups leaves
//! row r's exact block sum in lane r: no horizontal reduction, and the repack is amortized over
//! all tokens.
//!
//! The float steps per (row, token) are exactly the scalar twin's (acc = fma(dw * da, isum, acc)
//! block by block, the Q4_1 min chain separately), so results are bit-identical to `scalar.rs`.
//!
//! Safety: same contract as `avx2.rs` (the only precondition of these `unsafe fn`s is CPU
//! support for their target features; all loads/stores are from fixed-size arrays or
//! bounds-checked slices).

use super::avx2::{reduce, Rows, WeightBlock};
use super::blocks::*;
use std::arch::x86_64::*;

/// One repacked block of 8 rows.
#[derive(Clone, Copy)]
#[repr(C)]
struct Packed {
    /// `w[g]`: lane r = row r's unsigned quants 4g..4g+4 (see `WeightBlock::unsigned_quants`).
    w: [[u8; 32]; 8],
    d: [f32; 8],
    m: [f32; 8],
}

/// How a packed block is multiplied with the activation blocks of 4 tokens.
pub(crate) trait PackedDot {
    /// Per token j and row lane: sum_g sum_{4 bytes} w[g] * y_j[4g..] + corr[j] (exact in i32).
    /// Each w[g] is loaded once and used for the 4 tokens; the 4 chains are independent.
    unsafe fn block4(w: &[[u8; 32]; 8], y: [&[u8; 32]; 4], corr: [i32; 4]) -> [__m256i; 4];
}

#[inline(always)]
unsafe fn bcast4(y: &[u8; 32], g: usize) -> __m256i {
    _mm256_set1_epi32(i32::from_le_bytes([
        y[4 * g],
        y[4 * g + 1],
        y[4 * g + 2],
        y[4 * g + 3],
    ]))
}

#[inline(always)]
unsafe fn loadw(w: &[u8; 32]) -> __m256i {
    _mm256_loadu_si256(w.as_ptr().cast())
}

/// AVX2: `vpmaddubsw`, summed in i16 over G groups at a time, then one `vpmaddwd` per G
/// groups. Each i16 lane then sums 2G products of an unsigned quant and |y| <= 128, which must
/// stay <= 32767: G = 8 for 4-bit weights (16 * 15 * 128 = 30720), 4 for 5-bit (8 * 31 * 128 =
/// 31744); see [`i16_groups`]. 8-bit weights do not fit one `vpmaddubsw` (2 * 255 * 128).
pub(crate) struct MaddPacked<const G: usize>;

/// How many 4-byte groups of unsigned quants <= `max` an i16 lane can sum exactly (0: not one).
pub(crate) const fn i16_groups(max: i32) -> usize {
    let g = 32767 / (256 * max);
    if g >= 8 {
        8
    } else if g >= 4 {
        4
    } else if g >= 2 {
        2
    } else {
        g as usize
    }
}

/// Each of `corr` in every lane of its register. A loop, not `array::map`: a closure does not
/// inherit the caller's target features, so the intrinsic inside it would be a call.
#[inline(always)]
unsafe fn splat4(corr: [i32; 4]) -> [__m256i; 4] {
    let mut s = [_mm256_setzero_si256(); 4];
    for (s, c) in s.iter_mut().zip(corr) {
        *s = _mm256_set1_epi32(c);
    }
    s
}

impl<const G: usize> PackedDot for MaddPacked<G> {
    #[inline(always)]
    unsafe fn block4(w: &[[u8; 32]; 8], y: [&[u8; 32]; 4], corr: [i32; 4]) -> [__m256i; 4] {
        let mut s32 = splat4(corr);
        for chunk in 0..8 / G {
            let mut s = [_mm256_setzero_si256(); 4];
            for (g, wg) in w.iter().enumerate().skip(chunk * G).take(G) {
                let wg = loadw(wg);
                for j in 0..4 {
                    s[j] = _mm256_add_epi16(s[j], _mm256_maddubs_epi16(wg, bcast4(y[j], g)));
                }
            }
            for j in 0..4 {
                let p = _mm256_madd_epi16(s[j], _mm256_set1_epi16(1));
                s32[j] = _mm256_add_epi32(s32[j], p);
            }
        }
        s32
    }
}

/// AVX-VNNI: `vpdpbusd` straight into i32, starting from the correction.
pub(crate) struct VnniPacked;

impl PackedDot for VnniPacked {
    #[inline(always)]
    unsafe fn block4(w: &[[u8; 32]; 8], y: [&[u8; 32]; 4], corr: [i32; 4]) -> [__m256i; 4] {
        let mut s = splat4(corr);
        for (g, wg) in w.iter().enumerate() {
            let wg = loadw(wg);
            for j in 0..4 {
                s[j] = _mm256_dpbusd_avx_epi32(s[j], wg, bcast4(y[j], g));
            }
        }
        s
    }
}

/// Transposes 8 rows of 8 u32 (one register each) into 8 registers of 8 rows.
#[inline(always)]
pub(crate) unsafe fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
    let t0 = _mm256_unpacklo_epi32(r[0], r[1]);
    let t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    let t2 = _mm256_unpacklo_epi32(r[2], r[3]);
    let t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    let t4 = _mm256_unpacklo_epi32(r[4], r[5]);
    let t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    let t6 = _mm256_unpacklo_epi32(r[6], r[7]);
    let t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    // u_k: element k of rows 0..4 in the low half, element k + 4 in the high half.
    let u0 = _mm256_unpacklo_epi64(t0, t2);
    let u1 = _mm256_unpackhi_epi64(t0, t2);
    let u2 = _mm256_unpacklo_epi64(t1, t3);
    let u3 = _mm256_unpackhi_epi64(t1, t3);
    let u4 = _mm256_unpacklo_epi64(t4, t6);
    let u5 = _mm256_unpackhi_epi64(t4, t6);
    let u6 = _mm256_unpacklo_epi64(t5, t7);
    let u7 = _mm256_unpackhi_epi64(t5, t7);
    [
        _mm256_permute2x128_si256(u0, u4, 0x20),
        _mm256_permute2x128_si256(u1, u5, 0x20),
        _mm256_permute2x128_si256(u2, u6, 0x20),
        _mm256_permute2x128_si256(u3, u7, 0x20),
        _mm256_permute2x128_si256(u0, u4, 0x31),
        _mm256_permute2x128_si256(u1, u5, 0x31),
        _mm256_permute2x128_si256(u2, u6, 0x31),
        _mm256_permute2x128_si256(u3, u7, 0x31),
    ]
}

#[inline(always)]
pub(crate) fn f16f(b: [u8; 2]) -> f32 {
    f16_le(b)
}

/// Repacks rows `rows[0..8]` (all `nb` blocks) into `dst`.
#[inline(always)]
unsafe fn pack<W: WeightBlock>(rows: [&[W]; 8], nb: usize, dst: &mut [Packed]) {
    for (b, p) in dst.iter_mut().enumerate().take(nb) {
        // A loop, not `array::from_fn`: a closure does not inherit the caller's target
        // features, so the intrinsics inside it would be calls, not instructions.
        let mut u = [_mm256_setzero_si256(); 8];
        for (u, row) in u.iter_mut().zip(rows) {
            *u = row[b].unsigned_quants();
        }
        let t = transpose8(u);
        for (dst, v) in p.w.iter_mut().zip(t) {
            _mm256_storeu_si256(dst.as_mut_ptr().cast(), v);
        }
        for (r, row) in rows.iter().enumerate() {
            let dm = row[b].wdm();
            p.d[r] = f16f([dm[0], dm[1]]);
            p.m[r] = f16f([dm[2], dm[3]]);
        }
    }
}

/// Sum of the 32 activation quants of a block (exact).
#[inline(always)]
unsafe fn qsum(y: &[u8; 32]) -> i32 {
    let p16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), _mm256_loadu_si256(y.as_ptr().cast()));
    let p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
    _mm_cvtsi128_si32(reduce::<1>([p32]))
}

/// Per (token, block) tables shared by every row group: f32 d, f32 s (Q4_1) and the Σy
/// correction `W::CORR * sum(y)`.
#[inline(always)]
pub(crate) unsafe fn tables<W: WeightBlock>(acts: &[W::Act]) -> (Vec<f32>, Vec<f32>, Vec<i32>) {
    let n = acts.len();
    let mut da = vec![0f32; n];
    let mut sa = vec![0f32; if W::HAS_MIN { n } else { 0 }];
    let mut corr = vec![0i32; n];
    for (i, a) in acts.iter().enumerate() {
        let ds = a.ds();
        da[i] = f16f([ds[0], ds[1]]);
        if W::HAS_MIN {
            sa[i] = f16f([ds[2], ds[3]]);
        }
        if W::CORR != 0 {
            corr[i] = W::CORR * qsum(a.qs());
        }
    }
    (da, sa, corr)
}

/// `out[t * out_stride + r]` for all rows and tokens. Bit-identical to the scalar vec_dot.
#[inline(always)]
pub(crate) unsafe fn matmul_packed<W: WeightBlock, P: PackedDot>(
    m: Rows<'_>,
    acts: &[W::Act],
    n_tokens: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let nb = m.nb;
    assert!(acts.len() >= n_tokens * nb && n_tokens > 0);
    let (da, sa, corr) = tables::<W>(&acts[..n_tokens * nb]);
    let empty = Packed {
        w: [[0; 32]; 8],
        d: [0.0; 8],
        m: [0.0; 8],
    };
    let mut packed = vec![empty; nb];
    let mut r0 = 0;
    while r0 < m.rows {
        let n = (m.rows - r0).min(8);
        // A short last group repeats its last row; lanes are independent.
        let rows: [&[W]; 8] = std::array::from_fn(|k| m.row::<W>(r0 + k.min(n - 1)));
        pack(rows, nb, &mut packed);
        let mut t0 = 0;
        while t0 < n_tokens {
            // 4 tokens at a time (a short last group repeats its last token).
            let toks: [usize; 4] = std::array::from_fn(|j| (t0 + j).min(n_tokens - 1));
            let mut acc = [_mm256_setzero_ps(); 4];
            for (b, p) in packed.iter().enumerate() {
                let idx: [usize; 4] = std::array::from_fn(|j| toks[j] * nb + b);
                let ys = idx.map(|i| acts[i].qs());
                let isum = P::block4(&p.w, ys, idx.map(|i| corr[i]));
                let dw = _mm256_loadu_ps(p.d.as_ptr());
                for j in 0..4 {
                    let d = _mm256_mul_ps(dw, _mm256_set1_ps(da[idx[j]]));
                    acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum[j]), acc[j]);
                }
            }
            if W::HAS_MIN {
                // The separate m * s chain of the scalar twin.
                let mut accm = [_mm256_setzero_ps(); 4];
                for (b, p) in packed.iter().enumerate() {
                    let mw = _mm256_loadu_ps(p.m.as_ptr());
                    for j in 0..4 {
                        let s = _mm256_set1_ps(sa[toks[j] * nb + b]);
                        accm[j] = _mm256_fmadd_ps(mw, s, accm[j]);
                    }
                }
                for j in 0..4 {
                    acc[j] = _mm256_add_ps(acc[j], accm[j]);
                }
            }
            for (j, v) in acc.iter().enumerate() {
                if t0 + j >= n_tokens {
                    break;
                }
                let mut tmp = [0f32; 8];
                _mm256_storeu_ps(tmp.as_mut_ptr(), *v);
                let o = (t0 + j) * out_stride + r0;
                out[o..o + n].copy_from_slice(&tmp[..n]);
            }
            t0 += 4;
        }
        r0 += 8;
    }
}

/// AVX2 + FMA + F16C entry: the packed GEMM for 4- and 5-bit weights (see [`MaddPacked`]), the
/// 4x4 tile kernel for 8-bit ones.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matmul_avx2<W: WeightBlock>(
    m: Rows<'_>,
    acts: &[W::Act],
    n_tokens: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    match i16_groups(W::UNSIGNED_MAX) {
        8 => matmul_packed::<W, MaddPacked<8>>(m, acts, n_tokens, out, out_stride),
        4 => matmul_packed::<W, MaddPacked<4>>(m, acts, n_tokens, out, out_stride),
        _ => super::avx2::plain::matmul::<W>(m, acts, n_tokens, out, out_stride),
    }
}

/// AVX-VNNI entry (all three formats).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(crate) unsafe fn matmul_vnni<W: WeightBlock>(
    m: Rows<'_>,
    acts: &[W::Act],
    n_tokens: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    matmul_packed::<W, VnniPacked>(m, acts, n_tokens, out, out_stride)
}

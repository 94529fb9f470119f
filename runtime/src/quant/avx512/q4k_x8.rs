//! Q4_K matvec and prefill over rows interleaved 8 by 8 ([`BlockQ4Kx8`]) on 512-bit vectors:
//! `vpdpbusd` multiplies 64 weight bytes (two 4-byte chunks of each of the 8 rows) with a
//! token's 8 activation bytes, up to 4 tokens per weight load. Under the safety contract of
//! `avx2.rs`.
//!
//! Lanes: the 64 loaded bytes hold chunk k of rows 0..8, then chunk k + 1; one `vpermd` puts
//! row r's two chunks side by side (i32 lanes 2r, 2r + 1), so one broadcast 8-byte activation
//! word serves every lane. Each lane then sums 16 products of a quant <= 15 and |y| <= 128 over
//! the 4 chunk pairs of a sub-block (at most 30720, exact in i16): `vpackssdw` of the low- and
//! high-nibble sums (sub-blocks 2c, 2c + 1) is exact, and one `vpdpwssd` by the rows' scales
//! (each in both i16 halves of a pair) adds each row's scaled sub-block sums in i32. The mins
//! term is a `vpdpwssd` of the rows' mins with the sub-blocks' bsum pairs. So per row the
//! integer sums are exactly `scalar::q4k_isums`'s (exact integer arithmetic in any order), and
//! the float steps are `scalar::dot_q4_k_q8_k`'s, in 16 lanes: d and dmin side by side.

use super::super::avx2::q4k_x8::scales_mins;
use super::super::blocks::{BlockQ4Kx8, BlockQ8K};
use super::super::interleave::GroupKernel;
use super::{bcast8, load_table};
use std::arch::x86_64::*;

/// The 512-bit VNNI Q4_K kernel (AVX512F, BW, VNNI).
pub(crate) struct Q4KVnni512;

/// `vpermd` indices: row r's chunks k (lane r) and k + 1 (lane 8 + r) to lanes 2r, 2r + 1.
pub(super) const PAIR_CHUNKS: [i32; 16] = [0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15];

/// `vpshufb` tables for the scales (or mins) of sub-blocks 2c, 2c + 1 (p = c % 2), per 128-bit
/// lane L holding rows 2L and 2L + 1's words (bytes 0..4 and 4..8): as i16, [row 2L's, its
/// copy, row 2L + 1's, its copy] for sub-block 2c, then the same for 2c + 1, the order in which
/// `vpackssdw` leaves the sums (see the module doc).
const SUB_PAIRS: [[i8; 64]; 2] = {
    let mut t = [[0i8; 64]; 2];
    let mut p = 0;
    while p < 2 {
        let src = [0, 0, 4, 4, 1, 1, 5, 5];
        let mut i = 0;
        while i < 64 {
            t[p][i] = if i % 2 == 0 {
                (src[(i % 16) / 2] + 2 * p) as i8
            } else {
                -128
            };
            i += 1;
        }
        p += 1;
    }
    t
};

/// `vpermd` indices that gather the folded sums: lanes 0..8 the rows' sumi, 8..16 their summ.
pub(super) const GATHER: [i32; 16] = [0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15];

/// The 8 rows' bytes of `v` (one row word per i32 lane of a 256-bit vector) as the i16 operand
/// of sub-blocks 2c, 2c + 1's `vpdpwssd` (see [`SUB_PAIRS`]).
#[inline(always)]
pub(super) unsafe fn per_sub_pair(v: __m256i, c: usize) -> __m512i {
    // 128-bit lane L = bytes 8L..8L + 16 of `v` twice: rows 2L and 2L + 1 in its low 8 bytes.
    let wide = _mm512_permutexvar_epi64(
        _mm512_setr_epi64(0, 0, 1, 1, 2, 2, 3, 3),
        _mm512_castsi256_si512(v),
    );
    _mm512_shuffle_epi8(wide, load_table(&SUB_PAIRS[c % 2]))
}

impl GroupKernel<BlockQ4Kx8> for Q4KVnni512 {
    type Lanes = __m256;

    #[inline(always)]
    unsafe fn group_dot<const T: usize>(w: &[BlockQ4Kx8], a: [&[BlockQ8K]; T]) -> [__m256; T] {
        for t in &a {
            assert!(t.len() >= w.len());
        }
        let pair = load_table(&PAIR_CHUNKS);
        let gather = load_table(&GATHER);
        let m4 = _mm512_set1_epi8(0x0f);
        // Lanes 0..8: the scalar twin's acc per row; 8..16: its accm.
        let mut acc = [_mm512_setzero_ps(); T];
        for (b, x) in w.iter().enumerate() {
            let ys: [&BlockQ8K; T] = std::array::from_fn(|t| &a[t][b]);
            let [sc_lo, sc_hi, mn_lo, mn_hi] = scales_mins(x);
            let mut sumi = [_mm512_setzero_si512(); T];
            for c in 0..4 {
                let sc = per_sub_pair(if c < 2 { sc_lo } else { sc_hi }, c);
                let mut lo = [_mm512_setzero_si512(); T];
                let mut hi = [_mm512_setzero_si512(); T];
                for k in (0..8).step_by(2) {
                    let q: &[[u8; 4]; 16] = x.qs[8 * (8 * c + k)..8 * (8 * c + k) + 16]
                        .try_into()
                        .expect("16 chunks");
                    // SAFETY (load): exactly the 64 bytes of 16 chunks.
                    let v = _mm512_loadu_si512(q.as_ptr().cast());
                    let v = _mm512_permutexvar_epi32(pair, v);
                    let ql = _mm512_and_si512(v, m4);
                    let qh = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                    let at = 64 * c + 4 * k;
                    for t in 0..T {
                        let ya = bcast8(&ys[t].qs, at);
                        let yb = bcast8(&ys[t].qs, at + 32);
                        lo[t] = _mm512_dpbusd_epi32(lo[t], ql, ya);
                        hi[t] = _mm512_dpbusd_epi32(hi[t], qh, yb);
                    }
                }
                for t in 0..T {
                    let s16 = _mm512_packs_epi32(lo[t], hi[t]);
                    sumi[t] = _mm512_dpwssd_epi32(sumi[t], s16, sc);
                }
            }
            // (No closures over intrinsics: they would not inherit the caller's target features.)
            let mn = [
                per_sub_pair(mn_lo, 0),
                per_sub_pair(mn_lo, 1),
                per_sub_pair(mn_hi, 2),
                per_sub_pair(mn_hi, 3),
            ];
            // SAFETY (loads): exactly the 16 bytes of the 8 f16 d, then of the 8 dmin.
            let d = _mm_loadu_si128(x.d.as_ptr().cast());
            let dmin = _mm_loadu_si128(x.dmin.as_ptr().cast());
            let dd = _mm512_cvtph_ps(_mm256_set_m128i(dmin, d));
            for t in 0..T {
                let bsums: &[u8; 32] = ys[t].bsums.as_flattened().try_into().expect("32 bytes");
                let mut summ = _mm512_setzero_si512();
                for (c, mn) in mn.iter().enumerate() {
                    // Per 128-bit lane: the bsum pairs of sub-blocks 2c, 2c, 2c + 1, 2c + 1.
                    let bs = bcast8(bsums, 8 * c);
                    let bs = _mm512_shuffle_epi32::<_MM_PERM_BBAA>(bs);
                    summ = _mm512_dpwssd_epi32(summ, *mn, bs);
                }
                // Per 128-bit lane: [sumi 2L, sumi 2L + 1, summ 2L, summ 2L + 1] (each row's
                // even and odd sub-blocks added), then gathered row by row.
                let s = _mm512_add_epi32(sumi[t], _mm512_shuffle_epi32::<_MM_PERM_BADC>(sumi[t]));
                let m = _mm512_add_epi32(summ, _mm512_shuffle_epi32::<_MM_PERM_BADC>(summ));
                let sums = _mm512_permutexvar_epi32(gather, _mm512_unpacklo_epi64(s, m));
                let dda = _mm512_mul_ps(dd, _mm512_set1_ps(ys[t].d()));
                acc[t] = _mm512_fmadd_ps(dda, _mm512_cvtepi32_ps(sums), acc[t]);
            }
        }
        let mut out = [_mm256_setzero_ps(); T];
        for (o, acc) in out.iter_mut().zip(acc) {
            let lo = _mm512_castps512_ps256(acc);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
            *o = _mm256_sub_ps(lo, hi);
        }
        out
    }
}

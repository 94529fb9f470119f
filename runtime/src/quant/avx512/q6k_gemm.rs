//! Q6_K's unpacking and block kernel for prefill with weights unpacked once a call
//! (`unpacked.rs`). Under the safety contract of `avx2.rs`.
//!
//! One unpacked super-block of a group: the 6-bit quants (0..=63, a byte each) of half n, k
//! pair (k, k + 1) and quarter qq, row r's two k in i32 lanes 2r and 2r + 1 (the lane order of
//! `q6k_x8.rs`); then the 16 sub-blocks' scale operands ([scale, 0] in each of a row's lanes);
//! then the 4 operands of the -32 offset term; then the 8 rows' d as f32. The sums and float
//! steps are those of `q6k_x8.rs`.

use super::super::blocks::{BlockQ6Kx8, BlockQ8K};
use super::q6k_x8::{offset_scales, quants, scale_words, sub_block_scale, EVEN};
use super::unpacked::{load, store, super_block, super_blocks, Line, UnpackOnce};
use super::{bcast8, bsum_words, load_table};
use std::arch::x86_64::*;

/// Line of half n, k pair (2p, 2p + 1), quarter qq.
const fn q(n: usize, p: usize, qq: usize) -> usize {
    16 * n + 4 * p + qq
}
/// Line of sub-block j's scale operand.
const SC: usize = 32;
/// Line of word i's offset operand.
const OFFSET: usize = 48;
/// Line of the rows' d (lanes 0..8).
const D: usize = 52;

impl UnpackOnce for BlockQ6Kx8 {
    const LINES: usize = 53;

    #[inline(always)]
    unsafe fn unpack(x: &Self, u: &mut [Line]) {
        let u: &mut [Line; 53] = u.try_into().expect("53 lines");
        for n in 0..2 {
            for p in 0..4 {
                let qs = quants(x, n, 2 * p);
                for (qq, v) in qs.into_iter().enumerate() {
                    store(&mut u[q(n, p, qq)], v);
                }
            }
        }
        let words = scale_words(x);
        for j in 0..16 {
            store(&mut u[SC + j], sub_block_scale(&words, j));
        }
        for i in 0..4 {
            store(&mut u[OFFSET + i], offset_scales(&words, i));
        }
        // SAFETY (load): exactly the 16 bytes of the 8 f16 d.
        let d = _mm256_cvtph_ps(_mm_loadu_si128(x.d.as_ptr().cast()));
        store(&mut u[D], _mm512_castps_si512(_mm512_castps256_ps512(d)));
    }

    // (`b` indexes the groups' unpacked lines and the tokens' blocks alike.)
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    unsafe fn block_dot<const T: usize, const G: usize>(
        u: [&[Line]; G],
        a: [&[BlockQ8K]; T],
    ) -> [[__m256; G]; T] {
        let nb = super_blocks::<Self, T, G>(&u, &a);
        let even = load_table(&EVEN);
        let mut acc = [[_mm256_setzero_ps(); G]; T];
        for b in 0..nb {
            let ub = super_block::<Self, G>(&u, b);
            // Two accumulators a token and group (even and odd quarters): shorter chains.
            let mut sumi = [[[_mm512_setzero_si512(); 2]; G]; T];
            for n in 0..2 {
                for half in 0..2 {
                    for p in [2 * half, 2 * half + 1] {
                        for qq in 0..4 {
                            let j = 8 * n + 2 * qq + half;
                            let mut w = [_mm512_setzero_si512(); G];
                            let mut sc = [_mm512_setzero_si512(); G];
                            for g in 0..G {
                                w[g] = load(&ub[g][q(n, p, qq)]);
                                sc[g] = load(&ub[g][SC + j]);
                            }
                            for t in 0..T {
                                let y = bcast8(&a[t][b].qs, 128 * n + 32 * qq + 8 * p);
                                for g in 0..G {
                                    let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[g], y);
                                    let sumi = &mut sumi[t][g][qq % 2];
                                    *sumi = _mm512_dpwssd_epi32(*sumi, s, sc[g]);
                                }
                            }
                        }
                    }
                }
            }
            for t in 0..T {
                let y = &a[t][b];
                let bs = bsum_words(y);
                let yd = _mm256_set1_ps(y.d());
                for g in 0..G {
                    // As in `q6k_x8.rs`: Σ_j sc_j * bsum_j, subtracted 32 times; row r's total
                    // in lane 2r, then the 8 rows in the low half.
                    let mut corr = _mm512_setzero_si512();
                    for (i, bs) in bs.iter().enumerate() {
                        corr = _mm512_dpwssd_epi32(corr, load(&ub[g][OFFSET + i]), *bs);
                    }
                    let s = _mm512_add_epi32(sumi[t][g][0], sumi[t][g][1]);
                    let s = _mm512_sub_epi32(s, _mm512_slli_epi32(corr, 5));
                    let s = _mm512_add_epi32(s, _mm512_shuffle_epi32::<_MM_PERM_CDAB>(s));
                    let rows = _mm512_castsi512_si256(_mm512_permutexvar_epi32(even, s));
                    let d = _mm512_castps512_ps256(_mm512_castsi512_ps(load(&ub[g][D])));
                    let dda = _mm256_mul_ps(d, yd);
                    acc[t][g] = _mm256_fmadd_ps(dda, _mm256_cvtepi32_ps(rows), acc[t][g]);
                }
            }
        }
        acc
    }
}

//! Q4_K's unpacking and block kernel for prefill with weights unpacked once a call
//! (`unpacked.rs`). Under the safety contract of `avx2.rs`.
//!
//! One unpacked super-block of a group: for sub-block pair c and chunk pair i, the low nibbles
//! then the high nibbles (bytes 0..16), row r's two chunks in i32 lanes 2r and 2r + 1 (the lane
//! order of `q4k_x8.rs`); then the `vpdpwssd` operands of the rows' scales and mins per
//! sub-block pair; then the 8 rows' d and dmin as f32. The sums and float steps are those of
//! `q4k_x8.rs`.

use super::super::avx2::q4k_x8::scales_mins;
use super::super::blocks::{BlockQ4Kx8, BlockQ8K};
use super::q4k_x8::{per_sub_pair, GATHER, PAIR_CHUNKS};
use super::unpacked::{load, store, super_block, super_blocks, Line, UnpackOnce};
use super::{bcast8, bsum_words, load_table};
use std::arch::x86_64::*;

/// Line of sub-block pair c, chunk pair i: its low nibbles, then (+ 1) its high nibbles.
const fn q(c: usize, i: usize) -> usize {
    2 * (4 * c + i)
}
/// Line of the scales' operand of sub-block pair c.
const SC: usize = 32;
/// Line of the mins' operand of sub-block pair c.
const MN: usize = 36;
/// Line of the rows' d (lanes 0..8) and dmin (8..16).
const DD: usize = 40;

impl UnpackOnce for BlockQ4Kx8 {
    const LINES: usize = 41;

    #[inline(always)]
    unsafe fn unpack(x: &Self, u: &mut [Line]) {
        let u: &mut [Line; 41] = u.try_into().expect("41 lines");
        let pair = load_table(&PAIR_CHUNKS);
        let m4 = _mm512_set1_epi8(0x0f);
        for c in 0..4 {
            for i in 0..4 {
                let k = 8 * c + 2 * i;
                let qs: &[[u8; 4]; 16] = x.qs[8 * k..8 * k + 16].try_into().expect("16 chunks");
                // SAFETY (load): exactly the 64 bytes of 16 chunks.
                let v = _mm512_permutexvar_epi32(pair, _mm512_loadu_si512(qs.as_ptr().cast()));
                store(&mut u[q(c, i)], _mm512_and_si512(v, m4));
                store(
                    &mut u[q(c, i) + 1],
                    _mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
                );
            }
        }
        let [sc_lo, sc_hi, mn_lo, mn_hi] = scales_mins(x);
        for c in 0..4 {
            let (sc, mn) = if c < 2 {
                (sc_lo, mn_lo)
            } else {
                (sc_hi, mn_hi)
            };
            store(&mut u[SC + c], per_sub_pair(sc, c));
            store(&mut u[MN + c], per_sub_pair(mn, c));
        }
        // SAFETY (loads): exactly the 16 bytes of the 8 f16 d, then of the 8 dmin.
        let d = _mm_loadu_si128(x.d.as_ptr().cast());
        let dmin = _mm_loadu_si128(x.dmin.as_ptr().cast());
        let dd = _mm512_cvtph_ps(_mm256_set_m128i(dmin, d));
        store(&mut u[DD], _mm512_castps_si512(dd));
    }

    // (`b` indexes the groups' unpacked lines and the tokens' blocks alike.)
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    unsafe fn block_dot<const T: usize, const G: usize>(
        u: [&[Line]; G],
        a: [&[BlockQ8K]; T],
    ) -> [[__m256; G]; T] {
        let nb = super_blocks::<Self, T, G>(&u, &a);
        let gather = load_table(&GATHER);
        // Lanes 0..8: the scalar twin's acc per row; 8..16: its accm.
        let mut acc = [[_mm512_setzero_ps(); G]; T];
        for b in 0..nb {
            let ub = super_block::<Self, G>(&u, b);
            let mut sumi = [[_mm512_setzero_si512(); G]; T];
            for c in 0..4 {
                let mut lo = [[_mm512_setzero_si512(); G]; T];
                let mut hi = [[_mm512_setzero_si512(); G]; T];
                for i in 0..4 {
                    let at = 64 * c + 8 * i;
                    let mut wl = [_mm512_setzero_si512(); G];
                    let mut wh = [_mm512_setzero_si512(); G];
                    for g in 0..G {
                        wl[g] = load(&ub[g][q(c, i)]);
                        wh[g] = load(&ub[g][q(c, i) + 1]);
                    }
                    for t in 0..T {
                        let ya = bcast8(&a[t][b].qs, at);
                        let yb = bcast8(&a[t][b].qs, at + 32);
                        for g in 0..G {
                            lo[t][g] = _mm512_dpbusd_epi32(lo[t][g], wl[g], ya);
                            hi[t][g] = _mm512_dpbusd_epi32(hi[t][g], wh[g], yb);
                        }
                    }
                }
                for g in 0..G {
                    let sc = load(&ub[g][SC + c]);
                    for t in 0..T {
                        let s16 = _mm512_packs_epi32(lo[t][g], hi[t][g]);
                        sumi[t][g] = _mm512_dpwssd_epi32(sumi[t][g], s16, sc);
                    }
                }
            }
            for t in 0..T {
                let y = &a[t][b];
                // Per 128-bit lane: the bsum pairs of sub-blocks 2c, 2c, 2c + 1, 2c + 1.
                let mut bs = bsum_words(y);
                for bs in &mut bs {
                    *bs = _mm512_shuffle_epi32::<_MM_PERM_BBAA>(*bs);
                }
                let yd = _mm512_set1_ps(y.d());
                for g in 0..G {
                    let mut summ = _mm512_setzero_si512();
                    for (c, bs) in bs.iter().enumerate() {
                        summ = _mm512_dpwssd_epi32(summ, load(&ub[g][MN + c]), *bs);
                    }
                    // As in `q4k_x8.rs`: each row's even and odd sub-blocks added, then
                    // gathered row by row (sumi in lanes 0..8, summ in 8..16).
                    let s = sumi[t][g];
                    let s = _mm512_add_epi32(s, _mm512_shuffle_epi32::<_MM_PERM_BADC>(s));
                    let m = _mm512_add_epi32(summ, _mm512_shuffle_epi32::<_MM_PERM_BADC>(summ));
                    let sums = _mm512_permutexvar_epi32(gather, _mm512_unpacklo_epi64(s, m));
                    let dda = _mm512_mul_ps(_mm512_castsi512_ps(load(&ub[g][DD])), yd);
                    acc[t][g] = _mm512_fmadd_ps(dda, _mm512_cvtepi32_ps(sums), acc[t][g]);
                }
            }
        }
        let mut out = [[_mm256_setzero_ps(); G]; T];
        for t in 0..T {
            for g in 0..G {
                let acc = acc[t][g];
                let lo = _mm512_castps512_ps256(acc);
                let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
                out[t][g] = _mm256_sub_ps(lo, hi);
            }
        }
        out
    }
}

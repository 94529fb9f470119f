//! Q6_K matvec and prefill over rows interleaved 8 by 8 ([`BlockQ6Kx8`]) on 512-bit vectors,
//! the Q4_K kernel's scheme (`q4k_x8.rs`) for 16-element sub-blocks. Under the safety contract
//! of `avx2.rs`.
//!
//! Per k pair (k, k + 1) of a half n, three 64-byte loads hold the two k's ql, ql and qh chunks
//! of the 8 rows (`interleave::q6k_part`'s order); three `vpermt2d` put row r's two chunks of
//! each part side by side (i32 lanes 2r, 2r + 1), and the 6-bit quants of the four quarters are
//! joined as in `avx2/q6k_x8.rs`. `vpdpbusd` with the token's 8 broadcast activation bytes
//! leaves 4 products of a quant <= 63 and |y| <= 128 per lane (at most 32256: exact in the
//! lane's low i16, its high i16 the sign), so one `vpdpwssd` by the row's sub-block scale in the
//! low i16 of each lane (zero in the high one) adds scale * sum exactly. The -32 offset is
//! `scalar::q6k_block_step`'s `32 * bsum_j` term: `vpdpwssd` of each row's 4-byte scale words
//! with 4 bsums. So per row the integer sum is exactly the scalar twin's `sumi` (exact integer
//! arithmetic in any order), and the float step is its `acc = fma(d * da, sumi, acc)`.

use super::super::blocks::{BlockQ6Kx8, BlockQ8K};
use super::super::interleave::{q6k_part, GroupKernel, GROUP_ROWS};
use super::{bcast8, load_table};
use std::arch::x86_64::*;

/// The 512-bit VNNI Q6_K kernel (AVX512F, BW, VNNI).
pub(crate) struct Q6KVnni512;

/// `vpermt2d` indices: lanes 2r, 2r + 1 = lane r of the first source and lane 8 + r of the
/// second (one part's chunk of row r for k, then for k + 1).
const LOW_HIGH: [i32; 16] = [0, 24, 1, 25, 2, 26, 3, 27, 4, 28, 5, 29, 6, 30, 7, 31];
/// The same from lanes 8 + r of the first source and r of the second.
const HIGH_LOW: [i32; 16] = [8, 16, 9, 17, 10, 18, 11, 19, 12, 20, 13, 21, 14, 22, 15, 23];
/// `vpermd` indices: row r's word (lane r of a 256-bit vector) to lanes 2r and 2r + 1.
const ROW_TWICE: [i32; 16] = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7];
/// `vpermd` indices that gather the even lanes (each row's total) into the low 8.
pub(super) const EVEN: [i32; 16] = [0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0];

/// `vpshufb` tables, one per byte b of a row's scale word (in both lanes of the row): byte b into
/// the high byte of each lane's low i16, zeroes elsewhere (an arithmetic shift of the i16 halves
/// by 8 then gives [scale b, 0]).
const SCALE_BYTE: [[i8; 64]; 4] = {
    let mut t = [[-128i8; 64]; 4];
    let mut b = 0;
    while b < 4 {
        let mut lane = 0;
        while lane < 16 {
            t[b][4 * lane + 1] = (4 * (lane % 4) + b) as i8;
            lane += 1;
        }
        b += 1;
    }
    t
};

/// `vpshufb` table for the offset term: even lanes [byte 0, byte 1], odd lanes [byte 2, byte 3]
/// of the row's word, each in the high byte of an i16 (sign-extended by a shift of 8).
const SCALE_PAIRS: [i8; 64] = {
    let mut t = [-128i8; 64];
    let mut lane = 0;
    while lane < 16 {
        let base = 4 * (lane % 4) + 2 * (lane % 2);
        t[4 * lane + 1] = base as i8;
        t[4 * lane + 3] = (base + 1) as i8;
        lane += 1;
    }
    t
};

/// Word i of each row's scales (scales 4i..4i + 4) in both of the row's lanes.
#[inline(always)]
pub(super) unsafe fn scale_words(x: &BlockQ6Kx8) -> [__m512i; 4] {
    let twice = load_table(&ROW_TWICE);
    let mut words = [_mm512_setzero_si512(); 4];
    for (i, word) in words.iter_mut().enumerate() {
        let s: &[[u8; 4]; 8] = x.scales[8 * i..8 * i + 8].try_into().expect("8 words");
        // SAFETY (load): exactly the 32 bytes of 8 words.
        let v = _mm256_loadu_si256(s.as_ptr().cast());
        *word = _mm512_permutexvar_epi32(twice, _mm512_castsi256_si512(v));
    }
    words
}

/// Sub-block j's scale as the `vpdpwssd` operand of the products' sums: [scale, 0] in each of
/// a row's lanes.
#[inline(always)]
pub(super) unsafe fn sub_block_scale(words: &[__m512i; 4], j: usize) -> __m512i {
    _mm512_srai_epi16(
        _mm512_shuffle_epi8(words[j / 4], load_table(&SCALE_BYTE[j % 4])),
        8,
    )
}

/// Word i's scales as the operand of the -32 offset term (see [`SCALE_PAIRS`]).
#[inline(always)]
pub(super) unsafe fn offset_scales(words: &[__m512i; 4], i: usize) -> __m512i {
    _mm512_srai_epi16(_mm512_shuffle_epi8(words[i], load_table(&SCALE_PAIRS)), 8)
}

/// The 64 bytes of 16 chunks starting at chunk group `g` (8 chunks a group).
#[inline(always)]
unsafe fn load_groups(w: &BlockQ6Kx8, g: usize) -> __m512i {
    let c: &[[u8; 4]; 16] = w.q[GROUP_ROWS * g..GROUP_ROWS * g + 16]
        .try_into()
        .expect("16 chunks");
    // SAFETY (load): exactly the 64 bytes of 16 chunks.
    _mm512_loadu_si512(c.as_ptr().cast())
}

/// The rows' quants (0..=63) of positions 4k..4k + 8 of the four quarters of half n, row r's
/// k and k + 1 in lanes 2r, 2r + 1.
#[inline(always)]
pub(super) unsafe fn quants(w: &BlockQ6Kx8, n: usize, k: usize) -> [__m512i; 4] {
    // Parts (ql low, ql high, qh) of k, then of k + 1: 6 groups of 8 chunks, in 3 loads.
    let g = q6k_part(n, k, 0);
    let (z0, z1, z2) = (
        load_groups(w, g),
        load_groups(w, g + 2),
        load_groups(w, g + 4),
    );
    let (lh, hl) = (load_table(&LOW_HIGH), load_table(&HIGH_LOW));
    // z0 = [ql0(k) | ql1(k)], z1 = [qh(k) | ql0(k + 1)], z2 = [ql1(k + 1) | qh(k + 1)].
    let l0 = _mm512_permutex2var_epi32(z0, lh, z1);
    let l1 = _mm512_permutex2var_epi32(z0, hl, z2);
    let h = _mm512_permutex2var_epi32(z1, lh, z2);
    let m4 = _mm512_set1_epi8(0x0f);
    let m30 = _mm512_set1_epi8(0x30);
    // Bits 2qq..2qq + 2 of each qh byte to bits 4..6 (16-bit shifts: the masks keep each
    // byte's own bits).
    let h0 = _mm512_and_si512(_mm512_slli_epi16(h, 4), m30);
    let h1 = _mm512_and_si512(_mm512_slli_epi16(h, 2), m30);
    let h2 = _mm512_and_si512(h, m30);
    let h3 = _mm512_and_si512(_mm512_srli_epi16(h, 2), m30);
    [
        _mm512_or_si512(_mm512_and_si512(l0, m4), h0),
        _mm512_or_si512(_mm512_and_si512(l1, m4), h1),
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4), h2),
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4), h3),
    ]
}

impl GroupKernel<BlockQ6Kx8> for Q6KVnni512 {
    type Lanes = __m256;

    #[inline(always)]
    unsafe fn group_dot<const T: usize>(w: &[BlockQ6Kx8], a: [&[BlockQ8K]; T]) -> [__m256; T] {
        for t in &a {
            assert!(t.len() >= w.len());
        }
        let even = load_table(&EVEN);
        let mut acc = [_mm256_setzero_ps(); T];
        for (b, x) in w.iter().enumerate() {
            let ys: [&BlockQ8K; T] = std::array::from_fn(|t| &a[t][b]);
            let words = scale_words(x);
            // Two accumulators a token (even and odd quarters): shorter dependency chains.
            let mut sumi = [[_mm512_setzero_si512(); 2]; T];
            for n in 0..2 {
                for half in 0..2 {
                    // Quarter qq's positions 16 * half.. are sub-block j = 8n + 2qq + half.
                    let mut sc = [_mm512_setzero_si512(); 4];
                    for (qq, sc) in sc.iter_mut().enumerate() {
                        *sc = sub_block_scale(&words, 8 * n + 2 * qq + half);
                    }
                    for k in [4 * half, 4 * half + 2] {
                        let q = quants(x, n, k);
                        for t in 0..T {
                            for qq in 0..4 {
                                let y = bcast8(&ys[t].qs, 128 * n + 32 * qq + 4 * k);
                                let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[qq], y);
                                sumi[t][qq % 2] = _mm512_dpwssd_epi32(sumi[t][qq % 2], p, sc[qq]);
                            }
                        }
                    }
                }
            }
            let sc4: [__m512i; 4] = [
                offset_scales(&words, 0),
                offset_scales(&words, 1),
                offset_scales(&words, 2),
                offset_scales(&words, 3),
            ];
            // SAFETY (load): exactly the 16 bytes of the 8 f16 d.
            let d = _mm256_cvtph_ps(_mm_loadu_si128(x.d.as_ptr().cast()));
            for t in 0..T {
                let bsums: &[u8; 32] = ys[t].bsums.as_flattened().try_into().expect("32 bytes");
                // Σ_j sc_j * bsum_j: word i's scales with bsums 4i..4i + 4 (lane 2r: j = 4i,
                // 4i + 1; lane 2r + 1: 4i + 2, 4i + 3).
                let mut corr = _mm512_setzero_si512();
                for (i, sc) in sc4.iter().enumerate() {
                    let bs = bcast8(bsums, 8 * i);
                    corr = _mm512_dpwssd_epi32(corr, *sc, bs);
                }
                let s = _mm512_add_epi32(sumi[t][0], sumi[t][1]);
                let s = _mm512_sub_epi32(s, _mm512_slli_epi32(corr, 5));
                // Row r's total in lane 2r, then the 8 rows in the low half.
                let s = _mm512_add_epi32(s, _mm512_shuffle_epi32::<_MM_PERM_CDAB>(s));
                let rows = _mm512_castsi512_si256(_mm512_permutexvar_epi32(even, s));
                let dda = _mm256_mul_ps(d, _mm256_set1_ps(ys[t].d()));
                acc[t] = _mm256_fmadd_ps(dda, _mm256_cvtepi32_ps(rows), acc[t]);
            }
        }
        acc
    }
}

//! Q6_K over rows interleaved 8 by 8 ([`BlockQ6Kx8`], `interleave.rs`), dotted with Q8_K
//! activations. Under the safety contract of `avx2.rs`; the loops are `x8.rs`'s.
//!
//! Each i32 lane is one row. Per 4 positions of the four 32-element quarters of a 128-element
//! half, three 32-byte loads (side by side: the block is read in order) of `ql` and `qh` hold the 8 rows' 4-bit and 2-bit parts; they
//! are joined into the 6-bit quants (0..=63) of the four quarters, and each quarter's 4
//! activation bytes are broadcast to every lane: `vpmaddubsw` gives each row two i16 pair sums. Two of them add up exactly in i16 (4
//! products of a quant <= 63 and |y| <= 128: at most 32256), then one `vpmaddwd` by the row's
//! sub-block scale (sign-extended into both i16 halves) makes exact i32 lanes. The -32 offset
//! is `scalar::q6k_block_step`'s `32 * bsum_j` term, summed as `vpmaddwd` of two rows' scales
//! with two bsums. So per row the integer sum is exactly the scalar twin's `sumi` (exact integer
//! arithmetic in any order), and the float step is its `acc = fma(d * da, sumi, acc)` in 8 lanes.

use super::*;
use crate::quant::interleave::{q6k_part, Kernel8, GROUP_ROWS};

/// Per 128-bit half, i32 lane p: bytes [-, 4p + a, -, 4p + b] (`-` zeroes): bytes a and b of
/// each lane's word into the high bytes of its two i16 halves, which an arithmetic shift right
/// by 8 then sign-extends.
const fn pick_table(a: usize, b: usize) -> [i8; 32] {
    let mut t = [0i8; 32];
    let mut i = 0;
    while i < 32 {
        let p = (i % 16) / 4;
        t[i] = match i % 4 {
            1 => (4 * p + a) as i8,
            3 => (4 * p + b) as i8,
            _ => -128,
        };
        i += 1;
    }
    t
}

/// Byte t in both halves (one sub-block's scale), t = 0..4.
const PICK1: [[i8; 32]; 4] = [
    pick_table(0, 0),
    pick_table(1, 1),
    pick_table(2, 2),
    pick_table(3, 3),
];
/// Bytes 2h and 2h + 1 (two sub-blocks' scales), h = 0..2.
const PICK2: [[i8; 32]; 2] = [pick_table(0, 1), pick_table(2, 3)];

/// The signed bytes that `table` picks from each lane's word of `v`, as i16 halves.
#[inline(always)]
unsafe fn pick_i8(v: __m256i, table: &[i8; 32]) -> __m256i {
    // SAFETY (load): exactly the 32 bytes of `table`.
    let t = _mm256_loadu_si256(table.as_ptr().cast());
    _mm256_srai_epi16(_mm256_shuffle_epi8(v, t), 8)
}

/// The 32 bytes of 8 chunks (one per row).
#[inline(always)]
unsafe fn load8(c: &[[u8; 4]]) -> __m256i {
    let c: &[[u8; 4]; GROUP_ROWS] = c.try_into().expect("8 chunks");
    // SAFETY (load): exactly the 32 bytes of 8 chunks.
    _mm256_loadu_si256(c.as_ptr().cast())
}

/// The 4 activation bytes at `at` as an i32 in every lane.
#[inline(always)]
unsafe fn bcast(a: &BlockQ8K, at: usize) -> __m256i {
    let b: [u8; 4] = a.qs[at..at + 4].try_into().expect("4 bytes");
    _mm256_set1_epi32(i32::from_le_bytes(b))
}

/// The 8 rows' quants (0..=63) of positions 4k..4k + 4 of the four 32-element quarters of half
/// `n` (quarter qq: elements 128n + 32qq + 4k..): the layout of `scalar::q6k_quant`, ql and qh
/// chunks side by side.
#[inline(always)]
unsafe fn quants(w: &BlockQ6Kx8, n: usize, k: usize) -> [__m256i; 4] {
    let m4 = _mm256_set1_epi8(0x0f);
    let m30 = _mm256_set1_epi8(0x30);
    let part = |p: usize| GROUP_ROWS * q6k_part(n, k, p);
    let l0 = load8(&w.q[part(0)..part(0) + GROUP_ROWS]);
    let l1 = load8(&w.q[part(1)..part(1) + GROUP_ROWS]);
    let h = load8(&w.q[part(2)..part(2) + GROUP_ROWS]);
    // Bits 2qq..2qq + 2 of each qh byte to bits 4..6 (16-bit shifts: the masks keep each
    // byte's own bits).
    // (No closures: they would not inherit the caller's target features.)
    let h0 = _mm256_and_si256(_mm256_slli_epi16(h, 4), m30);
    let h1 = _mm256_and_si256(_mm256_slli_epi16(h, 2), m30);
    let h2 = _mm256_and_si256(h, m30);
    let h3 = _mm256_and_si256(_mm256_srli_epi16(h, 2), m30);
    [
        _mm256_or_si256(_mm256_and_si256(l0, m4), h0),
        _mm256_or_si256(_mm256_and_si256(l1, m4), h1),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), h2),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), h3),
    ]
}

/// The 8 rows' `sumi` of one super-block against the activation blocks of T tokens, one row
/// per lane: the weights are unpacked once for all T.
#[inline(always)]
unsafe fn isums<const T: usize>(w: &BlockQ6Kx8, a: [&BlockQ8K; T]) -> [__m256i; T] {
    let mut words = [_mm256_setzero_si256(); 4];
    for (i, word) in words.iter_mut().enumerate() {
        *word = load8(&w.scales[8 * i..8 * i + 8]);
    }
    let mut sumi = [_mm256_setzero_si256(); T];
    // Σ_j sc_j * bsum_j, two sub-blocks per `vpmaddwd` (sc <= 128 and any i16 bsums: exact).
    let mut corr = [_mm256_setzero_si256(); T];
    for (i, &word) in words.iter().enumerate() {
        for (h, table) in PICK2.iter().enumerate() {
            let sc = pick_i8(word, table);
            let j = 4 * i + 2 * h;
            for t in 0..T {
                let b = &a[t].bsums;
                let v = [b[j][0], b[j][1], b[j + 1][0], b[j + 1][1]];
                let bs = _mm256_set1_epi32(i32::from_le_bytes(v));
                corr[t] = _mm256_add_epi32(corr[t], _mm256_madd_epi16(sc, bs));
            }
        }
    }
    for n in 0..2 {
        for half in 0..2 {
            // Quarter qq's positions 16 * half.. are sub-block 8n + 2qq + half.
            let mut sc = [_mm256_setzero_si256(); 4];
            for (qq, sc) in sc.iter_mut().enumerate() {
                let j = 8 * n + 2 * qq + half;
                *sc = pick_i8(words[j / 4], &PICK1[j % 4]);
            }
            for pair in 0..2 {
                let k0 = 4 * half + 2 * pair;
                let (q0, q1) = (quants(w, n, k0), quants(w, n, k0 + 1));
                for t in 0..T {
                    for qq in 0..4 {
                        let at = 128 * n + 32 * qq + 4 * k0;
                        let p0 = _mm256_maddubs_epi16(q0[qq], bcast(a[t], at));
                        let p1 = _mm256_maddubs_epi16(q1[qq], bcast(a[t], at + 4));
                        let p = _mm256_madd_epi16(_mm256_add_epi16(p0, p1), sc[qq]);
                        sumi[t] = _mm256_add_epi32(sumi[t], p);
                    }
                }
            }
        }
    }
    for t in 0..T {
        sumi[t] = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(corr[t], 5));
    }
    sumi
}

impl Kernel8 for BlockQ6Kx8 {
    type Lanes = __m256;

    /// The scalar twin's float steps per lane (no min term).
    #[inline(always)]
    unsafe fn group_dot<const T: usize>(w: &[BlockQ6Kx8], a: [&[BlockQ8K]; T]) -> [__m256; T] {
        for t in &a {
            assert!(t.len() >= w.len());
        }
        let mut acc = [_mm256_setzero_ps(); T];
        for (b, x) in w.iter().enumerate() {
            let sums = isums::<T>(x, std::array::from_fn(|t| &a[t][b]));
            let flat: &[[u8; 2]; 8] = &x.d;
            // SAFETY (load): exactly the 16 bytes of the 8 f16 d.
            let d = _mm256_cvtph_ps(_mm_loadu_si128(flat.as_ptr().cast()));
            for t in 0..T {
                let da = _mm256_set1_ps(a[t][b].d());
                acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(sums[t]), acc[t]);
            }
        }
        acc
    }
}

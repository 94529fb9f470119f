//! Q4_K matvec over rows interleaved 8 by 8 ([`BlockQ4Kx8`], `interleave.rs`), dotted with Q8_K
//! activations. Under the safety contract of `avx2.rs`.
//!
//! Each i32 lane is one row. Per 4 elements of a sub-block, one 32-byte load holds the 8 rows'
//! quants of two sub-blocks (low and high nibbles) and the 4 activation bytes are broadcast to
//! every lane: `vpmaddubsw` gives each row two i16 pair sums, which add up over the sub-block's
//! 32 elements in i16 (16 products of a quant <= 15 and |y| <= 128: at most 30720, exact), then
//! one `vpmaddwd` by the rows' sub-block scales makes exact i32 lanes. The mins term is
//! `vpmaddwd` of each row's min (in both i16 halves) with the two 16-element bsums of the
//! sub-block: m * (bsum_2j + bsum_2j+1), exact for any bsums. So per row the integer sums are
//! exactly `scalar::q4k_isums`'s, and the float steps are `scalar::dot_q4_k_q8_k`'s in 8 lanes:
//! `acc = fma(d * da, sumi, acc)`, `accm = fma(dmin * da, summ, accm)`, `acc - accm`.

use super::*;
use crate::quant::interleave::Kernel8;

/// Per 128-bit half, i32 lane p: bytes [4p + t, -, 4p + t, -] (`-` zeroes): byte t of each
/// lane's word in both of its i16 halves.
const PICK: [[i8; 32]; 4] = {
    let mut t = [[0i8; 32]; 4];
    let mut k = 0;
    while k < 4 {
        let mut i = 0;
        while i < 32 {
            let p = (i % 16) / 4;
            t[k][i] = if i % 2 == 0 { (4 * p + k) as i8 } else { -128 };
            i += 1;
        }
        k += 1;
    }
    t
};

/// Byte `t` (0..4) of each i32 lane of `v`, zero-extended into both i16 halves of the lane.
#[inline(always)]
unsafe fn pick(v: __m256i, t: usize) -> __m256i {
    // SAFETY (load): exactly the 32 bytes of one `PICK` row.
    _mm256_shuffle_epi8(v, _mm256_loadu_si256(PICK[t].as_ptr().cast()))
}

/// The 4 bytes as an i32 in every lane.
#[inline(always)]
fn bcast(b: &[u8]) -> [u8; 4] {
    b[..4].try_into().expect("4 bytes")
}

/// The 8 rows' 6-bit scales and mins as bytes, one row per i32 lane: [scales of sub-blocks
/// 0..4, 4..8, mins of 0..4, 4..8] (the layout of `scalar::q4k_scale_min`).
#[inline(always)]
pub(crate) unsafe fn scales_mins(w: &BlockQ4Kx8) -> [__m256i; 4] {
    let word = |i: usize| {
        let s: &[[u8; 4]; 8] = w.scales[8 * i..8 * i + 8].try_into().expect("8 words");
        // SAFETY (load): exactly the 32 bytes of 8 words.
        _mm256_loadu_si256(s.as_ptr().cast())
    };
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let m6 = _mm256_set1_epi8(0x3f);
    let m4 = _mm256_set1_epi8(0x0f);
    let m2 = _mm256_set1_epi8(0x03);
    // 32-bit shifts: the masks keep each byte's own bits.
    let sc_lo = _mm256_and_si256(w0, m6);
    let sc_hi = _mm256_or_si256(
        _mm256_and_si256(w2, m4),
        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w0, 6), m2), 4),
    );
    let mn_lo = _mm256_and_si256(w1, m6);
    let mn_hi = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi32(w2, 4), m4),
        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w1, 6), m2), 4),
    );
    [sc_lo, sc_hi, mn_lo, mn_hi]
}

/// The 8 rows' (sumi, summ) of one super-block against the activation blocks of T tokens, one
/// row per lane: the weights are unpacked once for all T.
#[inline(always)]
unsafe fn isums<const T: usize>(w: &BlockQ4Kx8, a: [&BlockQ8K; T]) -> [(__m256i, __m256i); T] {
    let [sc_lo, sc_hi, mn_lo, mn_hi] = scales_mins(w);
    let m4 = _mm256_set1_epi8(0x0f);
    let mut sums = [(_mm256_setzero_si256(), _mm256_setzero_si256()); T];
    for c in 0..4 {
        // Sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles).
        let mut lo = [_mm256_setzero_si256(); T];
        let mut hi = [_mm256_setzero_si256(); T];
        for k in 0..8 {
            let q: &[[u8; 4]; 8] = w.qs[8 * (8 * c + k)..8 * (8 * c + k) + 8]
                .try_into()
                .expect("8 chunks");
            // SAFETY (load): exactly the 32 bytes of 8 chunks.
            let x = _mm256_loadu_si256(q.as_ptr().cast());
            let ql = _mm256_and_si256(x, m4);
            let qh = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
            for t in 0..T {
                let at = 64 * c + 4 * k;
                let ya = _mm256_set1_epi32(i32::from_le_bytes(bcast(&a[t].qs[at..])));
                let yb = _mm256_set1_epi32(i32::from_le_bytes(bcast(&a[t].qs[at + 32..])));
                lo[t] = _mm256_add_epi16(lo[t], _mm256_maddubs_epi16(ql, ya));
                hi[t] = _mm256_add_epi16(hi[t], _mm256_maddubs_epi16(qh, yb));
            }
        }
        let (sc, mn) = if c < 2 {
            (sc_lo, mn_lo)
        } else {
            (sc_hi, mn_hi)
        };
        let (t0, t1) = ((2 * c) % 4, (2 * c + 1) % 4);
        let (s0, s1, m0, m1) = (pick(sc, t0), pick(sc, t1), pick(mn, t0), pick(mn, t1));
        for t in 0..T {
            let (sumi, summ) = &mut sums[t];
            *sumi = _mm256_add_epi32(*sumi, _mm256_madd_epi16(lo[t], s0));
            *sumi = _mm256_add_epi32(*sumi, _mm256_madd_epi16(hi[t], s1));
            let bs = |j: usize| {
                let b = &a[t].bsums;
                let v = [b[2 * j][0], b[2 * j][1], b[2 * j + 1][0], b[2 * j + 1][1]];
                _mm256_set1_epi32(i32::from_le_bytes(v))
            };
            *summ = _mm256_add_epi32(*summ, _mm256_madd_epi16(m0, bs(2 * c)));
            *summ = _mm256_add_epi32(*summ, _mm256_madd_epi16(m1, bs(2 * c + 1)));
        }
    }
    sums
}

impl Kernel8 for BlockQ4Kx8 {
    type Lanes = __m256;

    /// The scalar twin's float steps per lane. No software prefetch: the
    /// groups are one sequential stream, which the hardware prefetchers serve best alone (a
    /// non-temporal prefetch 2 KiB ahead, as the 4-row kernels use, made streamed 1B-class shapes
    /// 10-35% slower here).
    #[inline(always)]
    unsafe fn group_dot<const T: usize>(w: &[BlockQ4Kx8], a: [&[BlockQ8K]; T]) -> [__m256; T] {
        for t in &a {
            assert!(t.len() >= w.len());
        }
        let mut acc = [_mm256_setzero_ps(); T];
        let mut accm = [_mm256_setzero_ps(); T];
        for (b, x) in w.iter().enumerate() {
            let sums = isums::<T>(x, std::array::from_fn(|t| &a[t][b]));
            let flat: &[[u8; 2]; 8] = &x.d;
            // SAFETY (loads): exactly the 16 bytes of the 8 f16 d, then of the 8 dmin.
            let d = _mm256_cvtph_ps(_mm_loadu_si128(flat.as_ptr().cast()));
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(x.dmin.as_ptr().cast()));
            for t in 0..T {
                let da = _mm256_set1_ps(a[t][b].d());
                let (sumi, summ) = sums[t];
                acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(sumi), acc[t]);
                accm[t] =
                    _mm256_fmadd_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(summ), accm[t]);
            }
        }
        std::array::from_fn(|t| _mm256_sub_ps(acc[t], accm[t]))
    }
}

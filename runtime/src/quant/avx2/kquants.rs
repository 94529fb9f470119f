//! The K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_XS on AVX2, dotted with Q8_K activations:
//! vec_dot, and multi-row tiles for matvec (4 rows per pass, reductions shared), matvec_rows and
//! matmul (4 rows x 4 tokens, each weight super-block unpacked once per 4 tokens). Under the
//! safety contract of `avx2.rs`.
//!
//! Per super-block each row's integer sums come out as 8 i32 lanes whose total is exactly the
//! scalar twin's `sumi` (and `summ` for the types with mins): `vpmaddubsw` of unsigned quants with
//! the activation bytes (pair sums fit i16 for quants up to 6 bits), then `vpmaddwd` by the 16-bit
//! sub-block scale. Float steps per (row, token) lane are those of `scalar.rs`:
//! `acc = fma(d * da, sumi, acc)`, `accm = fma(dmin * da, summ, accm)`, `acc - accm`.
//!
//! The integer multiply is `vpmaddubsw` on every SIMD ISA: the sub-block scale multiply rides on
//! its `vpmaddwd`, which `vpdpbusd` would have to replace with a slower `vpmulld`.

use super::blocks32::iq4_values;
use super::*;

/// A K-quant super-block format as the tiles read it.
pub(crate) trait KBlock: Block {
    /// Whether the format has a min term (`dmin * summ` in a second chain).
    const HAS_MIN: bool;
    /// The weights unpacked once for several tokens.
    type Unpacked: Copy;
    /// f16 bytes of d, then of dmin (zeros without mins).
    fn dm(&self) -> [u8; 4];
    unsafe fn unpack(&self) -> Self::Unpacked;
    /// (lanes summing to sumi, lanes summing to summ) against one activation block.
    unsafe fn isums(u: &Self::Unpacked, a: &BlockQ8K) -> (__m256i, __m256i);
}

#[inline(always)]
unsafe fn y32(a: &BlockQ8K, at: usize) -> __m256i {
    let y: &[u8; 32] = a.qs[at..at + 32].try_into().expect("32 bytes");
    load256(y)
}

/// The 16 bsums as i16 lanes.
#[inline(always)]
unsafe fn bsums16(a: &BlockQ8K) -> __m256i {
    // SAFETY (for callers): reads exactly the 32 bytes of `bsums`.
    _mm256_loadu_si256(a.bsums.as_ptr().cast())
}

/// `vpmaddubsw(q, y)` then `vpmaddwd` by `scale` (i16 lanes): exact i32 lanes.
#[inline(always)]
unsafe fn scaled(q: __m256i, y: __m256i, scale: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), scale)
}

/// The Q4_K/Q5_K 6-bit scales and mins of a block, decoded with 32-bit masks (the layout of
/// `scalar::q4k_scale_min`): (the 8 scales as i16 lanes in both 128-bit halves, the 8 mins each
/// in the two i16 lanes of i32 lane j).
#[inline(always)]
unsafe fn scales_mins(s: &[u8; 12]) -> (__m256i, __m256i) {
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (w0, w1, w2) = (w(0), w(1), w(2));
    let (m6, m4, m2) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
    // Bytes: sc 0..4 | sc 4..8 | m 0..4 | m 4..8.
    let sc_lo = w0 & m6;
    let sc_hi = (w2 & m4) | (((w0 >> 6) & m2) << 4);
    let m_lo = w1 & m6;
    let m_hi = ((w2 >> 4) & m4) | (((w1 >> 6) & m2) << 4);
    let v = _mm256_cvtepu8_epi16(_mm_setr_epi32(
        sc_lo as i32,
        sc_hi as i32,
        m_lo as i32,
        m_hi as i32,
    ));
    let sc = _mm256_permute2x128_si256(v, v, 0x00);
    let m = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(v, 1));
    (sc, _mm256_or_si256(m, _mm256_slli_epi32(m, 16)))
}

/// i16 lane `j` (0..8) of each 128-bit half of `v`, in every i16 lane.
#[inline(always)]
unsafe fn bcast16(v: __m256i, j: usize) -> __m256i {
    let b = (2 * j) as i8;
    _mm256_shuffle_epi8(
        v,
        _mm256_set1_epi16(i16::from_le_bytes([b as u8, b as u8 + 1])),
    )
}

// ---------------------------------------------------------------- Q4_K

#[derive(Clone, Copy)]
pub(crate) struct UQ4K {
    q: [__m256i; 8],
    /// The 8 scales as i16 lanes (both halves).
    sc: __m256i,
    /// m_j in i16 lanes 2j and 2j + 1, against the bsums of sub-block j's two halves.
    mins: __m256i,
}

impl KBlock for BlockQ4K {
    const HAS_MIN: bool = true;
    type Unpacked = UQ4K;
    #[inline(always)]
    fn dm(&self) -> [u8; 4] {
        [self.d[0], self.d[1], self.dmin[0], self.dmin[1]]
    }
    #[inline(always)]
    unsafe fn unpack(&self) -> UQ4K {
        let m4 = _mm256_set1_epi8(0x0F);
        let mut q = [_mm256_setzero_si256(); 8];
        for c in 0..4 {
            let b: &[u8; 32] = self.qs[32 * c..32 * c + 32].try_into().expect("32 bytes");
            let x = load256(b);
            q[2 * c] = _mm256_and_si256(x, m4);
            q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
        }
        let (sc, mins) = scales_mins(&self.scales);
        UQ4K { q, sc, mins }
    }
    #[inline(always)]
    unsafe fn isums(u: &UQ4K, a: &BlockQ8K) -> (__m256i, __m256i) {
        let mut s = _mm256_setzero_si256();
        for j in 0..8 {
            let p = scaled(u.q[j], y32(a, 32 * j), bcast16(u.sc, j));
            s = _mm256_add_epi32(s, p);
        }
        (s, _mm256_madd_epi16(bsums16(a), u.mins))
    }
}

// ---------------------------------------------------------------- Q5_K

impl KBlock for BlockQ5K {
    const HAS_MIN: bool = true;
    type Unpacked = UQ4K;
    #[inline(always)]
    fn dm(&self) -> [u8; 4] {
        [self.d[0], self.d[1], self.dmin[0], self.dmin[1]]
    }
    #[inline(always)]
    unsafe fn unpack(&self) -> UQ4K {
        let m4 = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        let qh = load256(&self.qh);
        let mut q = [_mm256_setzero_si256(); 8];
        for c in 0..4 {
            let b: &[u8; 32] = self.qs[32 * c..32 * c + 32].try_into().expect("32 bytes");
            let x = load256(b);
            for h in 0..2 {
                let j = 2 * c + h;
                let lo = _mm256_and_si256(_mm256_srl_epi16(x, _mm_cvtsi32_si128(4 * h as i32)), m4);
                // Bit j of each qh byte, moved to bit 4 (16-bit shifts: the AND keeps bit 0 of
                // every byte only).
                let hb = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j as i32)), one);
                q[j] = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4));
            }
        }
        let (sc, mins) = scales_mins(&self.scales);
        UQ4K { q, sc, mins }
    }
    #[inline(always)]
    unsafe fn isums(u: &UQ4K, a: &BlockQ8K) -> (__m256i, __m256i) {
        BlockQ4K::isums(u, a)
    }
}

// ---------------------------------------------------------------- Q6_K, Q3_K, Q2_K

/// Unsigned quants of 8 groups of 32 elements, with the i16 scales of their 16-element halves,
/// and the per-16 bsum correction: sumi = Σ scaled(q, y) - corr_mul * Σ_j s_j bsum_j (Q6_K: 32,
/// Q3_K: 4), or summ = Σ_j m_j bsum_j (Q2_K).
#[derive(Clone, Copy)]
pub(crate) struct U16s {
    q: [__m256i; 8],
    sc: [__m256i; 8],
    /// The 16 sub-block scales (Q6_K, Q3_K) or mins (Q2_K) as i16 lanes.
    corr: __m256i,
}

/// For group g of 32 elements (sub-blocks 2g and 2g + 1 of 16): scale 2g in the lower 128-bit
/// half's i16 lanes, 2g + 1 in the upper, from the 16 scales as i16 lanes of `s16`.
#[inline(always)]
unsafe fn pair16(s16: __m256i, g: usize) -> __m256i {
    // Both sub-blocks lie in the same 128-bit half of `s16` (lanes 2g % 8 and 2g % 8 + 1).
    let half = if g < 4 {
        _mm256_permute2x128_si256(s16, s16, 0x00)
    } else {
        _mm256_permute2x128_si256(s16, s16, 0x11)
    };
    let (a, b) = ((4 * (g % 4)) as u8, (4 * (g % 4) + 2) as u8);
    let lo = i16::from_le_bytes([a, a + 1]);
    let hi = i16::from_le_bytes([b, b + 1]);
    let idx = _mm256_setr_m128i(_mm_set1_epi16(lo), _mm_set1_epi16(hi));
    _mm256_shuffle_epi8(half, idx)
}

/// sumi lanes of 8 groups of 32.
#[inline(always)]
unsafe fn isum16(u: &U16s, a: &BlockQ8K) -> __m256i {
    let mut s = _mm256_setzero_si256();
    for g in 0..8 {
        s = _mm256_add_epi32(s, scaled(u.q[g], y32(a, 32 * g), u.sc[g]));
    }
    s
}

impl KBlock for BlockQ6K {
    const HAS_MIN: bool = false;
    type Unpacked = U16s;
    #[inline(always)]
    fn dm(&self) -> [u8; 4] {
        [self.d[0], self.d[1], 0, 0]
    }
    #[inline(always)]
    unsafe fn unpack(&self) -> U16s {
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(0x03);
        let mut q = [_mm256_setzero_si256(); 8];
        let mut sc = [_mm256_setzero_si256(); 8];
        // SAFETY (load): exactly the 16 bytes of `scales`.
        let corr = _mm256_cvtepi8_epi16(_mm_loadu_si128(self.scales.as_ptr().cast()));
        for n in 0..2 {
            let l0: &[u8; 32] = self.ql[64 * n..64 * n + 32].try_into().expect("32 bytes");
            let l1: &[u8; 32] = self.ql[64 * n + 32..64 * n + 64]
                .try_into()
                .expect("32 bytes");
            let hb: &[u8; 32] = self.qh[32 * n..32 * n + 32].try_into().expect("32 bytes");
            let (ql0, ql1, qh) = (load256(l0), load256(l1), load256(hb));
            let lows = [
                _mm256_and_si256(ql0, m4),
                _mm256_and_si256(ql1, m4),
                _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
            ];
            let highs = [
                _mm256_and_si256(qh, m2),
                _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2),
                _mm256_and_si256(_mm256_srli_epi16(qh, 4), m2),
                _mm256_and_si256(_mm256_srli_epi16(qh, 6), m2),
            ];
            for k in 0..4 {
                let g = 4 * n + k;
                q[g] = _mm256_or_si256(lows[k], _mm256_slli_epi16(highs[k], 4));
                sc[g] = pair16(corr, g);
            }
        }
        U16s { q, sc, corr }
    }
    #[inline(always)]
    unsafe fn isums(u: &U16s, a: &BlockQ8K) -> (__m256i, __m256i) {
        // q <= 63, |y| <= 128: pair sums <= 16128, no i16 saturation.
        let c = _mm256_madd_epi16(bsums16(a), u.corr);
        let s = _mm256_sub_epi32(isum16(u, a), _mm256_slli_epi32(c, 5));
        (s, _mm256_setzero_si256())
    }
}

/// The 2-bit fields of a Q2_K/Q3_K `qs` as 8 groups of 32 (group 4n + j: bits 2j of
/// qs[32n..32n + 32]).
#[inline(always)]
unsafe fn bits2(qs: &[u8; 64]) -> [__m256i; 8] {
    let m2 = _mm256_set1_epi8(3);
    let mut q = [_mm256_setzero_si256(); 8];
    for n in 0..2 {
        let b: &[u8; 32] = qs[32 * n..32 * n + 32].try_into().expect("32 bytes");
        let x = load256(b);
        q[4 * n] = _mm256_and_si256(x, m2);
        q[4 * n + 1] = _mm256_and_si256(_mm256_srli_epi16(x, 2), m2);
        q[4 * n + 2] = _mm256_and_si256(_mm256_srli_epi16(x, 4), m2);
        q[4 * n + 3] = _mm256_and_si256(_mm256_srli_epi16(x, 6), m2);
    }
    q
}

impl KBlock for BlockQ3K {
    const HAS_MIN: bool = false;
    type Unpacked = U16s;
    #[inline(always)]
    fn dm(&self) -> [u8; 4] {
        [self.d[0], self.d[1], 0, 0]
    }
    #[inline(always)]
    unsafe fn unpack(&self) -> U16s {
        let mut q = bits2(&self.qs);
        let hm = load256(&self.hmask);
        let one = _mm256_set1_epi8(1);
        let s = scalar::q3k_scales(&self.scales);
        // SAFETY (load): `s` has exactly 16 bytes.
        let corr = _mm256_cvtepi8_epi16(_mm_loadu_si128(s.as_ptr().cast()));
        let mut sc = [_mm256_setzero_si256(); 8];
        for (g, q) in q.iter_mut().enumerate() {
            // u = low | h << 2 with h bit g of hmask[l].
            let h = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(g as i32)), one);
            *q = _mm256_or_si256(*q, _mm256_slli_epi16(h, 2));
            sc[g] = pair16(corr, g);
        }
        U16s { q, sc, corr }
    }
    #[inline(always)]
    unsafe fn isums(u: &U16s, a: &BlockQ8K) -> (__m256i, __m256i) {
        // Σ s_j Σ (u - 4) y = Σ s_j Σ u y - 4 Σ s_j bsum_j.
        let c = _mm256_madd_epi16(bsums16(a), u.corr);
        let s = _mm256_sub_epi32(isum16(u, a), _mm256_slli_epi32(c, 2));
        (s, _mm256_setzero_si256())
    }
}

impl KBlock for BlockQ2K {
    const HAS_MIN: bool = true;
    type Unpacked = U16s;
    #[inline(always)]
    fn dm(&self) -> [u8; 4] {
        [self.d[0], self.d[1], self.dmin[0], self.dmin[1]]
    }
    #[inline(always)]
    unsafe fn unpack(&self) -> U16s {
        let q = bits2(&self.qs);
        // SAFETY (load): exactly the 16 bytes of `scales`.
        let raw = _mm_loadu_si128(self.scales.as_ptr().cast());
        let s16 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, _mm_set1_epi8(0x0F)));
        let mut sc = [_mm256_setzero_si256(); 8];
        for (g, sc) in sc.iter_mut().enumerate() {
            *sc = pair16(s16, g);
        }
        let mins = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F));
        U16s {
            q,
            sc,
            corr: _mm256_cvtepu8_epi16(mins),
        }
    }
    #[inline(always)]
    unsafe fn isums(u: &U16s, a: &BlockQ8K) -> (__m256i, __m256i) {
        (isum16(u, a), _mm256_madd_epi16(bsums16(a), u.corr))
    }
}

// ---------------------------------------------------------------- IQ4_XS

#[derive(Clone, Copy)]
pub(crate) struct UIQ4XS {
    /// |grid value| per element, and the grid values (for their signs).
    abs: [__m256i; 8],
    val: [__m256i; 8],
    sc: [i16; 8],
}

impl KBlock for BlockIQ4XS {
    const HAS_MIN: bool = false;
    type Unpacked = UIQ4XS;
    #[inline(always)]
    fn dm(&self) -> [u8; 4] {
        [self.d[0], self.d[1], 0, 0]
    }
    #[inline(always)]
    unsafe fn unpack(&self) -> UIQ4XS {
        let mut abs = [_mm256_setzero_si256(); 8];
        let mut val = [_mm256_setzero_si256(); 8];
        for j in 0..8 {
            let b: &[u8; 16] = self.qs[16 * j..16 * j + 16].try_into().expect("16 bytes");
            val[j] = iq4_values(b);
            abs[j] = _mm256_sign_epi8(val[j], val[j]);
        }
        let sc = std::array::from_fn(|j| scalar::iq4xs_scale(self, j) as i16);
        UIQ4XS { abs, val, sc }
    }
    #[inline(always)]
    unsafe fn isums(u: &UIQ4XS, a: &BlockQ8K) -> (__m256i, __m256i) {
        let mut s = _mm256_setzero_si256();
        for j in 0..8 {
            // |g| <= 127 and |y| <= 127 (Q8_K never holds -128): pair sums <= 32258.
            let y = _mm256_sign_epi8(y32(a, 32 * j), u.val[j]);
            s = _mm256_add_epi32(s, scaled(u.abs[j], y, _mm256_set1_epi16(u.sc[j])));
        }
        (s, _mm256_setzero_si256())
    }
}

// ---------------------------------------------------------------- tiles

/// R weight rows (1 or 4) times T activation rows over `nb` super-blocks: per token the R
/// results in lanes 0..R, each lane the scalar twin's float steps.
#[inline(always)]
unsafe fn ktile<K: KBlock, const R: usize, const T: usize>(
    w: [&[K]; R],
    a: [&[BlockQ8K]; T],
    nb: usize,
) -> [__m128; T] {
    for r in &w {
        assert!(r.len() >= nb);
    }
    for t in &a {
        assert!(t.len() >= nb);
    }
    let mut acc = [_mm_setzero_ps(); T];
    let mut accm = [_mm_setzero_ps(); T];
    for b in 0..nb {
        let mut dm = [[0u8; 4]; R];
        for k in 0..R {
            dm[k] = w[k][b].dm();
        }
        let (dw, mw) = dm_lanes::<R>(dm);
        let mut p = [[_mm256_setzero_si256(); R]; T];
        let mut q = [[_mm256_setzero_si256(); R]; T];
        for k in 0..R {
            let u = w[k][b].unpack();
            for t in 0..T {
                (p[t][k], q[t][k]) = K::isums(&u, &a[t][b]);
            }
        }
        for t in 0..T {
            kblock_step::<K, R>((dw, mw), a[t][b].d(), p[t], q[t], &mut acc[t], &mut accm[t]);
        }
    }
    if K::HAS_MIN {
        for t in 0..T {
            acc[t] = _mm_sub_ps(acc[t], accm[t]);
        }
    }
    acc
}

/// Super-blocks per pass of [`ktile_seq`] (8192 columns).
const KSEQ_BLOCKS: usize = 32;

/// One super-block's float steps for R rows (lanes) and one token with activation scale `da`,
/// given the rows' integer sums as lanes: `acc = fma(d * da, sumi, acc)`, `accm = fma(dmin *
/// da, summ, accm)`.
#[inline(always)]
unsafe fn kblock_step_sums<K: KBlock>(
    (dw, mw): (__m128, __m128),
    da: f32,
    (isum, msum): (__m128i, __m128i),
    acc: &mut __m128,
    accm: &mut __m128,
) {
    let da = _mm_set1_ps(da);
    *acc = _mm_fmadd_ps(_mm_mul_ps(dw, da), _mm_cvtepi32_ps(isum), *acc);
    if K::HAS_MIN {
        *accm = _mm_fmadd_ps(_mm_mul_ps(mw, da), _mm_cvtepi32_ps(msum), *accm);
    }
}

/// [`kblock_step_sums`] on the 8-lane integer sums of R rows.
#[inline(always)]
unsafe fn kblock_step<K: KBlock, const R: usize>(
    dm: (__m128, __m128),
    da: f32,
    p: [__m256i; R],
    q: [__m256i; R],
    acc: &mut __m128,
    accm: &mut __m128,
) {
    let msum = if K::HAS_MIN {
        reduce::<R>(q)
    } else {
        _mm_setzero_si128()
    };
    kblock_step_sums::<K>(dm, da, (reduce::<R>(p), msum), acc, accm);
}

/// [`ktile`] for one token (decode) and 4 rows, in the order of `avx2::tile_seq`: each row's
/// super-blocks in address order before the next row's, the float steps block by block after
/// them (the same bits). What the float steps need of a block (its integer sums and its f16
/// scales) waits in a small scratch during the pass, so they never touch the weights again: the
/// stream is read once, non-temporally, and a long row's blocks may have left L1 by then. A
/// format with mins folds each block's (sumi, summ) to one 128-bit vector; the others keep sumi's
/// 8 lanes (cheaper here than folding). `ahead`: the rows are a dense group, whose stream
/// continues past them.
#[inline(always)]
unsafe fn ktile_seq<K: KBlock>(w: [&[K]; 4], a: &[BlockQ8K], nb: usize, ahead: bool) -> __m128 {
    for r in &w {
        assert!(r.len() >= nb);
    }
    assert!(a.len() >= nb);
    let mut acc = _mm_setzero_ps();
    let mut accm = _mm_setzero_ps();
    // Written by each pass before its float steps read them (`folded` with mins, `sumi`
    // without).
    let mut folded = [[std::mem::MaybeUninit::<__m128i>::uninit(); 4]; KSEQ_BLOCKS];
    let mut sumi = [[std::mem::MaybeUninit::<__m256i>::uninit(); 4]; KSEQ_BLOCKS];
    let mut dms = [std::mem::MaybeUninit::<[[u8; 4]; 4]>::uninit(); KSEQ_BLOCKS];
    let mut b0 = 0;
    while b0 < nb {
        let n = (nb - b0).min(KSEQ_BLOCKS);
        for k in 0..4 {
            for i in 0..n {
                let blk = &w[k][b0 + i];
                if ahead {
                    prefetch_ahead(blk);
                }
                let (p, q) = K::isums(&blk.unpack(), &a[b0 + i]);
                if K::HAS_MIN {
                    folded[i][k].write(fold_pair(p, q));
                } else {
                    sumi[i][k].write(p);
                }
                (*dms[i].as_mut_ptr())[k] = blk.dm();
            }
        }
        for i in 0..n {
            // SAFETY: the pass above wrote folded[i][k] (with mins) or sumi[i][k] (without)
            // for every k, and each of dms[i]'s 4 entries.
            let sums = if K::HAS_MIN {
                unfold_pair(folded[i].map(|v| v.assume_init()))
            } else {
                (
                    reduce::<4>(sumi[i].map(|v| v.assume_init())),
                    _mm_setzero_si128(),
                )
            };
            let dm = dm_lanes::<4>(dms[i].assume_init());
            kblock_step_sums::<K>(dm, a[b0 + i].d(), sums, &mut acc, &mut accm);
        }
        b0 += n;
    }
    if K::HAS_MIN {
        acc = _mm_sub_ps(acc, accm);
    }
    acc
}

#[inline(always)]
pub(crate) unsafe fn kvec_dot<K: KBlock>(w: &[K], a: &[BlockQ8K]) -> f32 {
    let nb = w.len().min(a.len());
    let [v] = ktile::<K, 1, 1>([w], [a], nb);
    _mm_cvtss_f32(v)
}

/// All rows times one activation vector, 4 rows per pass (a short last group repeats its last
/// row; lanes are independent).
#[inline(always)]
pub(crate) unsafe fn kmatvec<K: KBlock>(m: Rows<'_>, act: &[BlockQ8K], out: &mut [f32]) {
    assert!(out.len() >= m.rows && act.len() >= m.nb);
    let mut r = 0;
    while r < m.rows {
        let n = (m.rows - r).min(4);
        let rows: [&[K]; 4] = std::array::from_fn(|k| m.row::<K>(r + k.min(n - 1)));
        let v = if m.long_rows::<K>() {
            ktile_seq::<K>(rows, act, m.nb, true)
        } else {
            m.prefetch::<K>(r + PREFETCH_ROWS, 4);
            ktile::<K, 4, 1>(rows, [act], m.nb)[0]
        };
        let mut tmp = [0f32; 4];
        store_lanes::<4>(v, &mut tmp);
        out[r..r + n].copy_from_slice(&tmp[..n]);
        r += n;
    }
}

/// The rows `pick` times one activation vector, 4 picked rows per pass.
#[inline(always)]
pub(crate) unsafe fn kmatvec_rows<K: KBlock>(
    m: Rows<'_>,
    pick: &[u32],
    act: &[BlockQ8K],
    out: &mut [f32],
) {
    assert!(out.len() >= pick.len() && act.len() >= m.nb);
    let mut k = 0;
    while k < pick.len() {
        let n = (pick.len() - k).min(4);
        for &r in pick.iter().skip(k + PREFETCH_ROWS).take(4) {
            m.prefetch::<K>(r as usize, 1);
        }
        let rows: [&[K]; 4] = std::array::from_fn(|j| m.row::<K>(pick[k + j.min(n - 1)] as usize));
        let v = if m.long_rows::<K>() {
            ktile_seq::<K>(rows, act, m.nb, false)
        } else {
            ktile::<K, 4, 1>(rows, [act], m.nb)[0]
        };
        let mut tmp = [0f32; 4];
        store_lanes::<4>(v, &mut tmp);
        out[k..k + n].copy_from_slice(&tmp[..n]);
        k += n;
    }
}

/// 4 rows x 4 tokens tiles; `acts` holds `n_tokens` rows of `nb` activation blocks.
#[inline(always)]
pub(crate) unsafe fn kmatmul<K: KBlock>(
    m: Rows<'_>,
    acts: &[BlockQ8K],
    n_tokens: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    assert!(acts.len() >= n_tokens * m.nb);
    let tok = |t: usize| &acts[t * m.nb..(t + 1) * m.nb];
    let mut r = 0;
    while r < m.rows {
        let n = (m.rows - r).min(4);
        let rows: [&[K]; 4] = std::array::from_fn(|k| m.row::<K>(r + k.min(n - 1)));
        let mut t = 0;
        while t + 4 <= n_tokens {
            let res = ktile::<K, 4, 4>(rows, [tok(t), tok(t + 1), tok(t + 2), tok(t + 3)], m.nb);
            for (j, v) in res.iter().enumerate() {
                let o = (t + j) * out_stride + r;
                let mut tmp = [0f32; 4];
                store_lanes::<4>(*v, &mut tmp);
                out[o..o + n].copy_from_slice(&tmp[..n]);
            }
            t += 4;
        }
        while t < n_tokens {
            let [v] = ktile::<K, 4, 1>(rows, [tok(t)], m.nb);
            let o = t * out_stride + r;
            let mut tmp = [0f32; 4];
            store_lanes::<4>(v, &mut tmp);
            out[o..o + n].copy_from_slice(&tmp[..n]);
            t += 1;
        }
        r += 4;
    }
}

/// AVX2 + FMA + F16C entry points (used by every SIMD ISA; see the module docs).
pub(crate) mod entry {
    use super::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn vec_dot<K: KBlock>(w: &[K], a: &[BlockQ8K]) -> f32 {
        kvec_dot(w, a)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn matvec<K: KBlock>(m: Rows<'_>, act: &[BlockQ8K], out: &mut [f32]) {
        kmatvec::<K>(m, act, out)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn matvec_rows<K: KBlock>(
        m: Rows<'_>,
        pick: &[u32],
        act: &[BlockQ8K],
        out: &mut [f32],
    ) {
        kmatvec_rows::<K>(m, pick, act, out)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn matmul<K: KBlock>(
        m: Rows<'_>,
        acts: &[BlockQ8K],
        n_tokens: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        kmatmul::<K>(m, acts, n_tokens, out, out_stride)
    }
}

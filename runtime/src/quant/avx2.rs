//! AVX2 + FMA + F16C kernels, and (through the [`IDot`] parameter) their AVX-VNNI variants.
//!
//! Each kernel reproduces the float steps of its `scalar.rs` twin exactly; integer block sums are
//! exact whatever the instruction order, so results are bit-identical to the scalar path.
//!
//! Structure: the row/token loops are written once as `#[inline(always)]` generic functions; the
//! `entry!` macro stamps out `#[target_feature]` entry points per ISA so the generics (and the
//! intrinsics inside them) are compiled with those features.
//!
//! # Safety contract
//! Every function here is an `unsafe fn` whose only precondition is that the CPU supports the
//! features of its entry point (`Kernels` selects an ISA only after `is_x86_feature_detected!`
//! confirmed it). Memory accesses are not part of the contract: vector loads and stores go through
//! references to fixed-size arrays of exactly the accessed size (`&[u8; 32]`, slices of block
//! fields with at least the accessed length), or through pointers into slices whose lengths are
//! asserted right before the loop; rows come from `Rows::row`, which slices with bounds checks.

use super::blocks::*;
use super::scalar;
use half::f16;
use std::arch::x86_64::*;

mod axpy;
mod blocks32;
pub(crate) mod kquants;
pub(crate) mod q4k_x8;
mod q6k_x8;
mod quantize;
pub(crate) mod x8;

use axpy::axpy_rows_float;
pub(crate) use axpy::{axpy_rows_impl, dm_chunk, AxpyBlock, AXPY_CHUNK, AXPY_GROUP, AXPY_PREFETCH};
pub(crate) use blocks32::{iq4_values_table, q5_quants};
use quantize::{quantize_q8_0, quantize_q8_1, quantize_q8_k};

// ---------------------------------------------------------------- integer dot flavours

/// The integer multiply-accumulate step, per ISA.
pub(crate) trait IDot {
    /// `acc` plus, per i32 lane, the sum of the 4 products u8(a) * i8(b) of that lane's bytes.
    /// Exact when each adjacent byte pair's sum fits i16 (true for 4-bit or 6-bit `a`).
    unsafe fn dp(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
    /// Per-activation-block precomputation for [`IDot::ss`].
    unsafe fn ss_prep(y: __m256i) -> __m256i;
    /// Per i32 lane, the sum of 4 products i8(w) * i8(y); `prep` is `ss_prep(y)`.
    /// Exact for y in -127..=127 (all quantizers here produce that range).
    unsafe fn ss(w: __m256i, y: __m256i, prep: __m256i) -> __m256i;
}

/// AVX2: `vpmaddubsw` (u8*i8 pairs to i16) then `vpmaddwd` with ones (pairs to i32).
pub(crate) struct Madd;

impl IDot for Madd {
    #[inline(always)]
    unsafe fn dp(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        let p16 = _mm256_maddubs_epi16(a, b);
        _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
    }
    #[inline(always)]
    unsafe fn ss_prep(_y: __m256i) -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn ss(w: __m256i, y: __m256i, _prep: __m256i) -> __m256i {
        // |w| as unsigned times y with w's sign moved onto it: |w| <= 128, |y| <= 127, so each
        // pair sum is at most 32512 and `vpmaddubsw` does not saturate.
        let aw = _mm256_sign_epi8(w, w);
        let sy = _mm256_sign_epi8(y, w);
        Self::dp(_mm256_setzero_si256(), aw, sy)
    }
}

/// AVX-VNNI: `vpdpbusd` (u8*i8 quads straight into i32, no i16 saturation).
pub(crate) struct Vnni;

impl IDot for Vnni {
    #[inline(always)]
    unsafe fn dp(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(acc, a, b)
    }
    #[inline(always)]
    unsafe fn ss_prep(y: __m256i) -> __m256i {
        // -128 * (sum of each 4 y): the correction for using w + 128 as the unsigned operand.
        let c = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(-128), y);
        _mm256_sub_epi32(_mm256_setzero_si256(), c)
    }
    #[inline(always)]
    unsafe fn ss(w: __m256i, y: __m256i, prep: __m256i) -> __m256i {
        // (w xor 0x80) read as u8 is w + 128; sum((w + 128) * y) - 128 * sum(y) = sum(w * y).
        let wu = _mm256_xor_si256(w, _mm256_set1_epi8(-128));
        _mm256_dpbusd_avx_epi32(prep, wu, y)
    }
}

// ---------------------------------------------------------------- small helpers

#[inline(always)]
pub(crate) unsafe fn load256(p: &[u8; 32]) -> __m256i {
    // SAFETY (for callers): reads exactly the 32 bytes of the referenced array.
    _mm256_loadu_si256(p.as_ptr().cast())
}

/// 16 bytes of nibbles to 32 bytes 0..=15 in element order (low nibbles then high nibbles).
#[inline(always)]
pub(crate) unsafe fn unpack_nibbles(qs: &[u8; 16]) -> __m256i {
    let x = _mm256_broadcastsi128_si256(_mm_loadu_si128(qs.as_ptr().cast()));
    // Shift only the upper 128-bit half by 4: a variable 64-bit shift avoids a port-5 insert.
    let x = _mm256_srlv_epi64(x, _mm256_set_epi64x(4, 4, 0, 0));
    _mm256_and_si256(x, _mm256_set1_epi8(0x0F))
}

/// Reduces R (1 or 4) vectors of i32 lanes to one exact sum each, in lanes 0..R.
#[inline(always)]
pub(crate) unsafe fn reduce<const R: usize>(p: [__m256i; R]) -> __m128i {
    if R == 4 {
        let h01 = _mm256_hadd_epi32(p[0], p[1]);
        let h23 = _mm256_hadd_epi32(p[2], p[3]);
        let h = _mm256_hadd_epi32(h01, h23);
        _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1))
    } else {
        let s = _mm_add_epi32(
            _mm256_castsi256_si128(p[0]),
            _mm256_extracti128_si256(p[0], 1),
        );
        let s = _mm_hadd_epi32(s, s);
        _mm_hadd_epi32(s, s)
    }
}

/// Horizontal sum of 8 floats in the order of `scalar::hsum8`.
#[inline(always)]
unsafe fn hsum8(v: __m256) -> f32 {
    let a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let b = _mm_add_ps(a, _mm_movehl_ps(a, a));
    let c = _mm_add_ss(b, _mm_movehdup_ps(b));
    _mm_cvtss_f32(c)
}

#[inline(always)]
unsafe fn store_lanes<const R: usize>(v: __m128, out: &mut [f32]) {
    let mut tmp = [0f32; 4];
    _mm_storeu_ps(tmp.as_mut_ptr(), v);
    out[..R].copy_from_slice(&tmp[..R]);
}

// ---------------------------------------------------------------- 32-element block formats

/// What differs between Q4_0, Q4_1 and Q8_0 weights in the shared tile loop.
pub(crate) trait WeightBlock: Block {
    type Act: ActBlock;
    /// Per-activation-block precomputation (shared by all rows of a tile).
    unsafe fn prep<V: IDot>(y: __m256i) -> __m256i;
    /// The exact integer dot of one weight block with activation quants `y`, as i32 lanes.
    unsafe fn idot<V: IDot>(&self, y: __m256i, prep: __m256i) -> __m256i;
    /// Q4_1: the block has a min `m`, dotted with the activation's `s` in a second chain.
    const HAS_MIN: bool;
    /// Scale bytes then min bytes (zeros without a min): one 4-byte read per row.
    fn wdm(&self) -> [u8; 4];
    /// For the row-interleaved GEMM (`gemm.rs`): the block as 32 unsigned bytes u, in element
    /// order, such that sum(w * y) = sum(u * y) + CORR * sum(y).
    unsafe fn unsigned_quants(&self) -> __m256i;
    const CORR: i32;
    /// The largest of those unsigned quants: how many `vpmaddubsw` sums an i16 lane holds.
    const UNSIGNED_MAX: i32;
}

impl WeightBlock for BlockQ4_0 {
    type Act = BlockQ8_0;
    const HAS_MIN: bool = false;
    const CORR: i32 = -8;
    const UNSIGNED_MAX: i32 = 15;
    #[inline(always)]
    unsafe fn unsigned_quants(&self) -> __m256i {
        unpack_nibbles(&self.qs)
    }
    #[inline(always)]
    unsafe fn prep<V: IDot>(y: __m256i) -> __m256i {
        // -8 * sum(y) per lane, so that dp(prep, q, y) = sum((q - 8) * y).
        let c = V::dp(_mm256_setzero_si256(), _mm256_set1_epi8(8), y);
        _mm256_sub_epi32(_mm256_setzero_si256(), c)
    }
    #[inline(always)]
    unsafe fn idot<V: IDot>(&self, y: __m256i, prep: __m256i) -> __m256i {
        V::dp(prep, unpack_nibbles(&self.qs), y)
    }
    #[inline(always)]
    fn wdm(&self) -> [u8; 4] {
        [self.d[0], self.d[1], 0, 0]
    }
}

impl WeightBlock for BlockQ4_1 {
    type Act = BlockQ8_1;
    const HAS_MIN: bool = true;
    const CORR: i32 = 0;
    const UNSIGNED_MAX: i32 = 15;
    #[inline(always)]
    unsafe fn unsigned_quants(&self) -> __m256i {
        unpack_nibbles(&self.qs)
    }
    #[inline(always)]
    unsafe fn prep<V: IDot>(_y: __m256i) -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn idot<V: IDot>(&self, y: __m256i, _prep: __m256i) -> __m256i {
        V::dp(_mm256_setzero_si256(), unpack_nibbles(&self.qs), y)
    }
    #[inline(always)]
    fn wdm(&self) -> [u8; 4] {
        [self.d[0], self.d[1], self.m[0], self.m[1]]
    }
}

impl WeightBlock for BlockQ8_0 {
    type Act = BlockQ8_0;
    const HAS_MIN: bool = false;
    const CORR: i32 = -128;
    const UNSIGNED_MAX: i32 = 255;
    #[inline(always)]
    unsafe fn unsigned_quants(&self) -> __m256i {
        // w xor 0x80 read as u8 is w + 128.
        _mm256_xor_si256(load256(&self.qs), _mm256_set1_epi8(-128))
    }
    #[inline(always)]
    unsafe fn prep<V: IDot>(y: __m256i) -> __m256i {
        V::ss_prep(y)
    }
    #[inline(always)]
    unsafe fn idot<V: IDot>(&self, y: __m256i, prep: __m256i) -> __m256i {
        V::ss(load256(&self.qs), y, prep)
    }
    #[inline(always)]
    fn wdm(&self) -> [u8; 4] {
        [self.d[0], self.d[1], 0, 0]
    }
}

/// R weight rows (1 or 4) times T activation rows over `nb` blocks: returns, per token, the R
/// results in lanes 0..R. Per (row, token) lane this performs exactly the scalar twin's steps:
/// acc = fma(dw * da, isum, acc) block by block (plus, for Q4_1, the separate m * s chain).
#[inline(always)]
unsafe fn tile<W: WeightBlock, V: IDot, const R: usize, const T: usize>(
    w: [&[W]; R],
    a: [&[W::Act]; T],
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
            dm[k] = w[k][b].wdm();
        }
        let (dw, mw) = dm_lanes::<R>(dm);
        for t in 0..T {
            let ab = &a[t][b];
            let y = load256(ab.qs());
            let prep = W::prep::<V>(y);
            let mut p = [_mm256_setzero_si256(); R];
            for k in 0..R {
                p[k] = w[k][b].idot::<V>(y, prep);
            }
            block_step::<W, R>((dw, mw), ab, p, &mut acc[t], &mut accm[t]);
        }
    }
    if W::HAS_MIN {
        for t in 0..T {
            acc[t] = _mm_add_ps(acc[t], accm[t]);
        }
    }
    acc
}

/// One block's float steps for R rows (lanes) and one token, given the rows' integer sums `p`:
/// `acc = fma(dw * da, isum, acc)`, and for a format with mins `accm = fma(mw, sa, accm)`.
#[inline(always)]
unsafe fn block_step<W: WeightBlock, const R: usize>(
    dm: (__m128, __m128),
    ab: &W::Act,
    p: [__m256i; R],
    acc: &mut __m128,
    accm: &mut __m128,
) {
    block_step_sums::<W>(dm, ab, reduce::<R>(p), acc, accm);
}

/// [`block_step`] given the rows' exact integer sums as lanes.
#[inline(always)]
unsafe fn block_step_sums<W: WeightBlock>(
    (dw, mw): (__m128, __m128),
    ab: &W::Act,
    isum: __m128i,
    acc: &mut __m128,
    accm: &mut __m128,
) {
    let isum = _mm_cvtepi32_ps(isum);
    let ds = _mm_cvtph_ps(_mm_set1_epi32(i32::from_le_bytes(ab.ds())));
    let da = _mm_permute_ps(ds, 0b00_00_00_00);
    *acc = _mm_fmadd_ps(_mm_mul_ps(dw, da), isum, *acc);
    if W::HAS_MIN {
        let sa = _mm_permute_ps(ds, 0b01_01_01_01);
        *accm = _mm_fmadd_ps(mw, sa, *accm);
    }
}

/// Blocks per pass of [`tile_seq`]: 8192 columns, so that a 1B-class FFN down projection's
/// rows are whole passes (a shorter pass makes 4 interleaved streams again). Even: the sums
/// are folded in pairs of blocks.
const SEQ_BLOCKS: usize = 256;

/// [`tile`] for one token (decode) and 4 rows, reading each row's blocks in address order
/// before the next row's, `SEQ_BLOCKS` at a time: the 4 rows of a dense group are then one
/// sequential stream. Side by side, block by block, they were 4 interleaved streams that this
/// machine's hardware prefetchers served at a third of the bandwidth (docs/benchmarks.md,
/// 1B-class decode). What the float steps need of a block (its integer sums, folded to 4 lanes,
/// and its f16 scales) waits in a small scratch for the pass's float steps, which run block by
/// block as in [`tile`]: the same bits, and the weights are never touched twice (a long row's
/// blocks, read non-temporally, may have left L1 by then).
#[inline(always)]
unsafe fn tile_seq<W: WeightBlock, V: IDot>(
    w: [&[W]; 4],
    a: &[W::Act],
    nb: usize,
    ahead: bool,
) -> __m128 {
    for r in &w {
        assert!(r.len() >= nb);
    }
    assert!(a.len() >= nb);
    let mut acc = _mm_setzero_ps();
    let mut accm = _mm_setzero_ps();
    // Per pair of blocks, the 4 rows' integer sums folded to 4 lanes ([`fold_pair`]); per
    // block, the rows' f16 scales. Both are written by the pass before its float steps read
    // them.
    let mut sums = [[std::mem::MaybeUninit::<__m128i>::uninit(); 4]; SEQ_BLOCKS / 2];
    let mut dms = [std::mem::MaybeUninit::<[[u8; 4]; 4]>::uninit(); SEQ_BLOCKS];
    let mut b0 = 0;
    while b0 < nb {
        let n = (nb - b0).min(SEQ_BLOCKS);
        for k in 0..4 {
            let mut i = 0;
            while i < n {
                let mut p = [_mm256_setzero_si256(); 2];
                for (j, pj) in p.iter_mut().enumerate().take(n - i) {
                    let blk = &w[k][b0 + i + j];
                    if ahead {
                        prefetch_ahead(blk);
                    }
                    let y = load256(a[b0 + i + j].qs());
                    *pj = blk.idot::<V>(y, W::prep::<V>(y));
                    (*dms[i + j].as_mut_ptr())[k] = blk.wdm();
                }
                sums[i / 2][k].write(fold_pair(p[0], p[1]));
                i += 2;
            }
        }
        for i in (0..n).step_by(2) {
            // SAFETY: the pass above wrote sums[i / 2][k] for every k, and dms[i] and (when
            // i + 1 < n) dms[i + 1] for every k: each of their 4 entries.
            let (first, second) = unfold_pair(sums[i / 2].map(|v| v.assume_init()));
            let dm = dm_lanes::<4>(dms[i].assume_init());
            block_step_sums::<W>(dm, &a[b0 + i], first, &mut acc, &mut accm);
            if i + 1 < n {
                let dm = dm_lanes::<4>(dms[i + 1].assume_init());
                block_step_sums::<W>(dm, &a[b0 + i + 1], second, &mut acc, &mut accm);
            }
        }
        b0 += n;
    }
    if W::HAS_MIN {
        acc = _mm_add_ps(acc, accm);
    }
    acc
}

/// One row's integer sums of two blocks (8 i32 lanes each) folded to 4 lanes: [first, first,
/// second, second] parts of the two exact totals.
#[inline(always)]
pub(crate) unsafe fn fold_pair(p: __m256i, q: __m256i) -> __m128i {
    let h = _mm256_hadd_epi32(p, q);
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1))
}

/// 4 rows' [`fold_pair`]s as (the first block's 4 totals, the second's), one row per lane.
#[inline(always)]
pub(crate) unsafe fn unfold_pair(f: [__m128i; 4]) -> (__m128i, __m128i) {
    // [first0 second0 first1 second1], [first2 second2 first3 second3]
    let lo = _mm_castsi128_ps(_mm_hadd_epi32(f[0], f[1]));
    let hi = _mm_castsi128_ps(_mm_hadd_epi32(f[2], f[3]));
    (
        _mm_castps_si128(_mm_shuffle_ps::<0b10_00_10_00>(lo, hi)),
        _mm_castps_si128(_mm_shuffle_ps::<0b11_01_11_01>(lo, hi)),
    )
}

/// How far ahead of a dense matvec's reads [`prefetch_ahead`] asks for the stream: the rows of
/// a group, and the groups, follow each other in memory.
pub(crate) const PREFETCH_AHEAD: usize = 2048;

/// Hints the cache to fetch the memory `PREFETCH_AHEAD` bytes past the block at `at`, as
/// non-temporal: decode reads each weight once a token (3% faster than into every level here).
#[inline(always)]
pub(crate) fn prefetch_ahead<B>(at: &B) {
    let p = (at as *const B as *const i8).wrapping_add(PREFETCH_AHEAD);
    for line in 0..std::mem::size_of::<B>().div_ceil(64) {
        // SAFETY: `_mm_prefetch` only hints the cache and never faults, whatever the address;
        // the pointer is never dereferenced.
        unsafe { _mm_prefetch::<_MM_HINT_NTA>(p.wrapping_add(64 * line)) };
    }
}

/// Scales and mins of R rows (each 4 bytes: f16 d, f16 m) as lanes of two `__m128`.
#[inline(always)]
unsafe fn dm_lanes<const R: usize>(dm: [[u8; 4]; R]) -> (__m128, __m128) {
    let mut q = [0u64; 2];
    for (k, v) in dm.iter().enumerate() {
        q[k / 2] |= (u32::from_le_bytes(*v) as u64) << (32 * (k % 2));
    }
    let f = _mm256_cvtph_ps(_mm_set_epi64x(q[1] as i64, q[0] as i64));
    // [d0 m0 d1 m1 d2 m2 d3 m3] -> [d0 d1 d2 d3 | m0 m1 m2 m3]
    let f = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    (_mm256_castps256_ps128(f), _mm256_extractf128_ps(f, 1))
}

/// Matrix geometry already validated by the caller (`mod.rs`): `data` holds `rows` rows of
/// `stride` bytes; the column range starts `off` bytes into each row and spans `nb` blocks.
#[derive(Clone, Copy)]
pub(crate) struct Rows<'a> {
    pub data: &'a [u8],
    pub stride: usize,
    pub off: usize,
    pub nb: usize,
    pub rows: usize,
}

/// Decode reads each weight once, straight from memory: for short rows, read 4 side by side,
/// asking for the rows a few groups ahead keeps enough cache misses in flight to overlap the
/// kernel's arithmetic with memory (decode of SmolLM2 on 1 thread went from 60 to ~95 tokens/s;
/// see docs/benchmarks.md). Long rows are read one after another ([`Rows::long_rows`]), with
/// [`prefetch_ahead`] instead: asking for whole rows ahead stalled on full miss queues there.
pub(crate) const PREFETCH_ROWS: usize = 16;

/// From this many bytes of a row in the column range, decode reads rows one at a time
/// ([`Rows::long_rows`]).
const SEQ_MIN_ROW_BYTES: usize = 1024;

impl<'a> Rows<'a> {
    /// Hints the cache to fetch rows `first..first + count` (column range only); rows past the
    /// end are ignored. Prefetching never faults, but we stay inside `data` anyway.
    #[inline(always)]
    pub(crate) fn prefetch<B: Block>(&self, first: usize, count: usize) {
        let len = self.nb * std::mem::size_of::<B>();
        for r in first..(first + count).min(self.rows) {
            let start = r * self.stride + self.off;
            let row = &self.data[start..start + len];
            for line in row.chunks(64) {
                // SAFETY: `_mm_prefetch` only hints the cache; the address is inside `row`.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr() as *const i8) };
            }
        }
    }

    /// Whether decode reads these rows one after another ([`tile_seq`]) rather than 4 side by
    /// side ([`tile`]). Side by side, 4 rows of a few hundred bytes lie within a few cache lines
    /// of each other and the prefetch of the rows ahead keeps memory busy (SmolLM2 and
    /// Gemma-3-270M decode 7-12% faster that way); from about a kilobyte a row (a 2048-wide
    /// Q4_K row is 1152 bytes) they are 4 streams that the hardware prefetchers serve at a third
    /// of the bandwidth, and one stream at a time is 2-3x faster (the 1B-class decode of
    /// docs/benchmarks.md).
    #[inline(always)]
    pub(crate) fn long_rows<B: Block>(&self) -> bool {
        self.nb * std::mem::size_of::<B>() >= SEQ_MIN_ROW_BYTES
    }

    /// Row `r`'s blocks of the column range (safe slicing: panics rather than reading outside).
    #[inline(always)]
    pub(crate) fn row<B: Block>(&self, r: usize) -> &'a [B] {
        let start = r * self.stride + self.off;
        let bytes = &self.data[start..start + self.nb * std::mem::size_of::<B>()];
        view::<B>(bytes).expect("whole blocks")
    }
}

/// Decode shape: all rows times one activation vector, 4 rows per pass. A trailing group of fewer
/// than 4 rows repeats its last row in the unused lanes (lanes are independent, so the stored
/// results are the same as in a full group).
#[inline(always)]
pub(crate) unsafe fn matvec_impl<W: WeightBlock, V: IDot>(
    m: Rows<'_>,
    act: &[W::Act],
    out: &mut [f32],
) {
    assert!(out.len() >= m.rows && act.len() >= m.nb);
    let mut r = 0;
    while r < m.rows {
        let n = (m.rows - r).min(4);
        let rows: [&[W]; 4] = std::array::from_fn(|k| m.row::<W>(r + k.min(n - 1)));
        let v = if m.long_rows::<W>() {
            tile_seq::<W, V>(rows, act, m.nb, true)
        } else {
            m.prefetch::<W>(r + PREFETCH_ROWS, 4);
            tile::<W, V, 4, 1>(rows, [act], m.nb)[0]
        };
        let mut tmp = [0f32; 4];
        store_lanes::<4>(v, &mut tmp);
        out[r..r + n].copy_from_slice(&tmp[..n]);
        r += n;
    }
}

/// Sparse decode: the rows `pick` (any order, repeats allowed) times one activation vector,
/// 4 picked rows per pass: `out[k]` = dot(row `pick[k]`). Each lane is the same arithmetic as
/// the row's own [`vec_dot_impl`], so the results are the same bits.
#[inline(always)]
pub(crate) unsafe fn matvec_rows_impl<W: WeightBlock, V: IDot>(
    m: Rows<'_>,
    pick: &[u32],
    act: &[W::Act],
    out: &mut [f32],
) {
    assert!(out.len() >= pick.len() && act.len() >= m.nb);
    let mut k = 0;
    while k < pick.len() {
        let n = (pick.len() - k).min(4);
        // The rows picked a few passes ahead, as `matvec_impl` asks for its next rows: picked
        // rows are scattered, so only the hint keeps several cache misses in flight.
        for &r in pick.iter().skip(k + PREFETCH_ROWS).take(4) {
            m.prefetch::<W>(r as usize, 1);
        }
        let rows: [&[W]; 4] = std::array::from_fn(|j| m.row::<W>(pick[k + j.min(n - 1)] as usize));
        let v = if m.long_rows::<W>() {
            tile_seq::<W, V>(rows, act, m.nb, false)
        } else {
            tile::<W, V, 4, 1>(rows, [act], m.nb)[0]
        };
        let mut tmp = [0f32; 4];
        store_lanes::<4>(v, &mut tmp);
        out[k..k + n].copy_from_slice(&tmp[..n]);
        k += n;
    }
}

/// Prefill shape: 4 rows x 4 tokens tiles, weight blocks unpacked once per 4 tokens.
/// `acts` holds `n_tokens` rows of `nb` activation blocks.
#[inline(always)]
pub(crate) unsafe fn matmul_impl<W: WeightBlock, V: IDot>(
    m: Rows<'_>,
    acts: &[W::Act],
    n_tokens: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    assert!(acts.len() >= n_tokens * m.nb);
    let tok = |t: usize| &acts[t * m.nb..(t + 1) * m.nb];
    let mut r = 0;
    while r < m.rows {
        let n = (m.rows - r).min(4);
        let rows: [&[W]; 4] = std::array::from_fn(|k| m.row::<W>(r + k.min(n - 1)));
        let mut t = 0;
        while t + 4 <= n_tokens {
            let res = tile::<W, V, 4, 4>(rows, [tok(t), tok(t + 1), tok(t + 2), tok(t + 3)], m.nb);
            for (j, v) in res.iter().enumerate() {
                let o = (t + j) * out_stride + r;
                let mut tmp = [0f32; 4];
                store_lanes::<4>(*v, &mut tmp);
                out[o..o + n].copy_from_slice(&tmp[..n]);
            }
            t += 4;
        }
        while t < n_tokens {
            let [v] = tile::<W, V, 4, 1>(rows, [tok(t)], m.nb);
            let o = t * out_stride + r;
            let mut tmp = [0f32; 4];
            store_lanes::<4>(v, &mut tmp);
            out[o..o + n].copy_from_slice(&tmp[..n]);
            t += 1;
        }
        r += 4;
    }
}

#[inline(always)]
pub(crate) unsafe fn vec_dot_impl<W: WeightBlock, V: IDot>(w: &[W], a: &[W::Act]) -> f32 {
    let nb = w.len().min(a.len());
    let [v] = tile::<W, V, 1, 1>([w], [a], nb);
    _mm_cvtss_f32(v)
}

// ---------------------------------------------------------------- float dots and f16 helpers

/// The 32-lane float dot of `scalar::dot_f32_lanes`, with `load(i)` giving 8 f32 at element i.
#[inline(always)]
unsafe fn dot_lanes(
    n: usize,
    load_w: impl Fn(usize) -> __m256,
    load_x: impl Fn(usize) -> __m256,
    tail: impl Fn(usize) -> (f32, f32),
) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let full = n / 32 * 32;
    let mut i = 0;
    while i < full {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(load_w(i + 8 * k), load_x(i + 8 * k), *a);
        }
        i += 32;
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut r = hsum8(s);
    for j in full..n {
        let (w, x) = tail(j);
        r = w.mul_add(x, r);
    }
    r
}

/// F32 weights · f32 activations, both as little-endian bytes of at least 4n.
#[inline(always)]
unsafe fn dot_f32(n: usize, w: &[u8], x: &[u8]) -> f32 {
    assert!(w.len() >= 4 * n && x.len() >= 4 * n);
    // SAFETY (loads): i + 8 <= 32 * (n / 32) <= n, so 32 bytes at byte 4i are inside both slices.
    dot_lanes(
        n,
        |i| _mm256_loadu_ps(w.as_ptr().add(4 * i).cast()),
        |i| _mm256_loadu_ps(x.as_ptr().add(4 * i).cast()),
        |j| (scalar::f32_at(w, j), scalar::f32_at(x, j)),
    )
}

/// F16 weights · f32 activations.
#[inline(always)]
unsafe fn dot_f16(n: usize, w: &[u8], x: &[u8]) -> f32 {
    assert!(w.len() >= 2 * n && x.len() >= 4 * n);
    // SAFETY (loads): as in `dot_f32`; 16 bytes at byte 2i of `w` are inside it.
    dot_lanes(
        n,
        |i| _mm256_cvtph_ps(_mm_loadu_si128(w.as_ptr().add(2 * i).cast())),
        |i| _mm256_loadu_ps(x.as_ptr().add(4 * i).cast()),
        |j| (scalar::f16_at(w, j), scalar::f32_at(x, j)),
    )
}

/// 8 BF16 values (16 bytes at `p`) as f32 lanes (exact: the bits moved up by 16).
#[inline(always)]
pub(crate) unsafe fn bf16x8(p: *const u8) -> __m256 {
    let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
    _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
}

/// BF16 weights · f32 activations.
#[inline(always)]
unsafe fn dot_bf16(n: usize, w: &[u8], x: &[u8]) -> f32 {
    assert!(w.len() >= 2 * n && x.len() >= 4 * n);
    // SAFETY (loads): as in `dot_f16`.
    dot_lanes(
        n,
        |i| bf16x8(w.as_ptr().add(2 * i)),
        |i| _mm256_loadu_ps(x.as_ptr().add(4 * i).cast()),
        |j| (scalar::bf16_at(w, j), scalar::f32_at(x, j)),
    )
}

#[inline(always)]
unsafe fn dot_f32_f16(x: &[f32], y: &[f16]) -> f32 {
    let n = x.len();
    assert!(y.len() >= n);
    // SAFETY (loads): 8 elements at i < 32 * (n / 32) are inside both slices.
    dot_lanes(
        n,
        |i| _mm256_cvtph_ps(_mm_loadu_si128(y.as_ptr().add(i).cast())),
        |i| _mm256_loadu_ps(x.as_ptr().add(i)),
        |j| (y[j].to_f32(), x[j]),
    )
}

#[inline(always)]
unsafe fn f32_to_f16_row(src: &[f32], dst: &mut [f16]) {
    let n = src.len().min(dst.len());
    let full = n / 8 * 8;
    let mut i = 0;
    while i < full {
        // SAFETY: i + 8 <= n <= both lengths.
        let v = _mm256_loadu_ps(src.as_ptr().add(i));
        let h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), h);
        i += 8;
    }
    scalar::f32_to_f16_row(&src[full..n], &mut dst[full..n]);
}

#[inline(always)]
unsafe fn f16_to_f32_row(src: &[f16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let full = n / 8 * 8;
    let mut i = 0;
    while i < full {
        // SAFETY: i + 8 <= n <= both lengths.
        let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    scalar::f16_to_f32_row(&src[full..n], &mut dst[full..n]);
}

#[inline(always)]
unsafe fn axpy_f16(a: f32, x: &[f16], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let full = n / 8 * 8;
    let av = _mm256_set1_ps(a);
    let mut i = 0;
    while i < full {
        // SAFETY: i + 8 <= n <= both lengths.
        let xv = _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(i).cast()));
        let yp = y.as_mut_ptr().add(i);
        _mm256_storeu_ps(yp, _mm256_fmadd_ps(av, xv, _mm256_loadu_ps(yp)));
        i += 8;
    }
    scalar::axpy_f16(a, &x[full..n], &mut y[full..n]);
}

// ---------------------------------------------------------------- entry points

/// Stamps out the `#[target_feature]` entry points of the kernels generic over [`IDot`].
macro_rules! entry_idot {
    ($features:literal, $V:ty) => {
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn matvec<W: WeightBlock>(m: Rows<'_>, act: &[W::Act], out: &mut [f32]) {
            matvec_impl::<W, $V>(m, act, out)
        }

        #[target_feature(enable = $features)]
        pub(crate) unsafe fn matmul<W: WeightBlock>(
            m: Rows<'_>,
            acts: &[W::Act],
            n_tokens: usize,
            out: &mut [f32],
            out_stride: usize,
        ) {
            matmul_impl::<W, $V>(m, acts, n_tokens, out, out_stride)
        }

        #[target_feature(enable = $features)]
        pub(crate) unsafe fn matvec_rows<W: WeightBlock>(
            m: Rows<'_>,
            pick: &[u32],
            act: &[W::Act],
            out: &mut [f32],
        ) {
            matvec_rows_impl::<W, $V>(m, pick, act, out)
        }

        #[target_feature(enable = $features)]
        pub(crate) unsafe fn vec_dot<W: WeightBlock>(w: &[W], a: &[W::Act]) -> f32 {
            vec_dot_impl::<W, $V>(w, a)
        }
    };
}

pub(crate) use entry_idot;

/// Entry points needing AVX2 + FMA + F16C.
pub(crate) mod plain {
    use super::*;

    entry_idot!("avx2,fma,f16c", Madd);

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn dot_f32(n: usize, w: &[u8], x: &[u8]) -> f32 {
        super::dot_f32(n, w, x)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn dot_f16(n: usize, w: &[u8], x: &[u8]) -> f32 {
        super::dot_f16(n, w, x)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn dot_bf16(n: usize, w: &[u8], x: &[u8]) -> f32 {
        super::dot_bf16(n, w, x)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn dot_f32_f16(x: &[f32], y: &[f16]) -> f32 {
        super::dot_f32_f16(x, y)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn f32_to_f16_row(src: &[f32], dst: &mut [f16]) {
        super::f32_to_f16_row(src, dst)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn f16_to_f32_row(src: &[f16], dst: &mut [f32]) {
        super::f16_to_f32_row(src, dst)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn axpy_f16(a: f32, x: &[f16], y: &mut [f32]) {
        super::axpy_f16(a, x, y)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn axpy_rows<B: AxpyBlock>(
        m: Rows<'_>,
        neurons: &[u32],
        coefs: &[f32],
        out: &mut [f32],
    ) {
        super::axpy_rows_impl::<B>(m, neurons, coefs, out)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn axpy_rows_f32(
        data: &[u8],
        stride: usize,
        neurons: &[u32],
        coefs: &[f32],
        out: &mut [f32],
    ) {
        super::axpy_rows_float::<{ axpy::F32 }>(data, stride, neurons, coefs, out)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn axpy_rows_f16(
        data: &[u8],
        stride: usize,
        neurons: &[u32],
        coefs: &[f32],
        out: &mut [f32],
    ) {
        super::axpy_rows_float::<{ axpy::F16 }>(data, stride, neurons, coefs, out)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn axpy_rows_bf16(
        data: &[u8],
        stride: usize,
        neurons: &[u32],
        coefs: &[f32],
        out: &mut [f32],
    ) {
        super::axpy_rows_float::<{ axpy::BF16 }>(data, stride, neurons, coefs, out)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn quantize_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
        super::quantize_q8_0(x, y)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn quantize_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
        super::quantize_q8_1(x, y)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn quantize_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
        super::quantize_q8_k(x, y)
    }
}

/// Entry points needing AVX2 + FMA + F16C + AVX-VNNI (only the 32-element formats change).
pub(crate) mod vnni {
    use super::*;

    entry_idot!("avx2,fma,f16c,avxvnni", Vnni);
}

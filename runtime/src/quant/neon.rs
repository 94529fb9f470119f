//! AArch64 NEON kernels, and (through the [`IDot`] parameter) their dotprod (`sdot`) and i8mm
//! (`smmla`) variants.
//!
//! Each kernel reproduces the float steps of its `scalar.rs` twin exactly; integer block sums are
//! exact whatever the instruction order, so results are bit-identical to the scalar path (and so
//! to the x86 paths). Covered here: the activation quantizers (Q8_0, Q8_1, Q8_K); the dot
//! product, matvec, sparse matvec, matmul and `axpy_rows` of the 32-element formats (Q4_0,
//! Q4_1, Q8_0, Q5_0, Q5_1, IQ4_NL); the F32/F16/BF16 dots and the f16 helpers. Float
//! `axpy_rows` stays on `scalar.rs`. `kquants.rs`: the dot and matmul of Q2_K..Q6_K and IQ4_XS
//! (one row by up to 4 tokens; `smmla` 2 x 2 tiles with i8mm; matvec is the per-row loop of
//! `mod.rs` over the dot). `x8.rs`: the dotprod matvec and matmul of Q4_K and Q6_K rows
//! interleaved 8 by 8 (`sdot` by element).
//!
//! Structure (as `avx2.rs`): the row/token loops are `#[inline(always)]` generic functions; the
//! `entry!` macro stamps out entry points per ISA, with `#[target_feature]` so the inline-asm
//! `sdot` (`vdotq_s32` is not stable) assembles in the dotprod variant. The i8mm ISA adds the
//! matmuls (`mm::matmul`, `kquants::mm::matmul`): for the 32-element formats its 4 rows x 4
//! (or 2) tokens tiles are 2x2 `smmla` tiles per block (`tile_mm`, inline asm: no stable
//! intrinsic); everything else is the dotprod code. The f16
//! block scales are converted by `blocks::f16_le`, an inline `fcvt` on aarch64 (no call).
//!
//! # Safety contract
//! Every function here is an `unsafe fn` whose only precondition is that the CPU supports the
//! features of its entry point (NEON is part of the aarch64 baseline; `Kernels` selects the
//! dotprod ISA only after `is_aarch64_feature_detected!("dotprod")`, the i8mm one only after
//! that and `is_aarch64_feature_detected!("i8mm")`). Memory accesses are not
//! part of the contract: every vector load and store goes through a reference to a fixed-size
//! array of exactly the accessed size, or a slice whose length is asserted right before; rows
//! come from `Rows::row`, which slices with bounds checks.

use super::blocks::*;
use super::scalar;
use half::f16;
use std::arch::aarch64::*;
use std::arch::asm;

mod floats;
pub(crate) mod kquants;
mod quantize;
pub(crate) mod x8;

use floats::*;
use quantize::*;

// ---------------------------------------------------------------- integer dot flavours

/// The integer multiply-accumulate step, per ISA.
pub(crate) trait IDot {
    /// `acc` plus, per i32 lane, the sum of the 4 products i8(a) * i8(b) of that lane's bytes
    /// (exact: every product fits i16 and every sum i32).
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;

    /// The matmul's 4 rows x T (2 or 4) tokens tile (`tile`'s contract); by default 8T `dot`s
    /// per block.
    #[inline(always)]
    unsafe fn tile4xt<W: WeightBlock, const T: usize>(
        w: [&[W]; 4],
        a: [&[W::Act]; T],
        nb: usize,
    ) -> [float32x4_t; T]
    where
        Self: Sized,
    {
        tile::<W, Self, 4, T>(w, a, nb)
    }
}

/// Plain NEON: `smull`/`smull2` (i8 x i8 to i16, exact) then `sadalp` (pairs into i32).
pub(crate) struct Widen;

impl IDot for Widen {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        let hi = vmull_high_s8(a, b);
        // Lane i of `lo` + pairs gives bytes 2i, 2i+1; the grouping into i32 lanes differs from
        // `sdot`'s, but only the total of all lanes is ever used.
        vpadalq_s16(vpadalq_s16(acc, lo), hi)
    }
}

/// ARMv8.2 dotprod: `sdot` (i8 x i8 quads straight into i32).
pub(crate) struct Sdot;

impl IDot for Sdot {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let mut acc = acc;
        // SAFETY: `sdot` only reads the three vector registers and writes `acc`; no memory, no
        // flags. Callers are compiled with `target_feature(enable = "dotprod")` and run only on a
        // CPU that reported dotprod.
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
        acc
    }
}

/// ARMv8.6 i8mm, used only by `mm::matmul`: `smmla` 2x2 tiles for its 4 rows x 4 (or 2) tokens
/// tiles (`tile_mm`), `sdot` for a last odd token (an i8mm `Kernels` is only built on a CPU
/// with dotprod too).
/// Every other kernel of the i8mm ISA is the dotprod one (`dot::`).
pub(crate) struct Mmla;

impl IDot for Mmla {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        Sdot::dot(acc, a, b)
    }

    #[inline(always)]
    unsafe fn tile4xt<W: WeightBlock, const T: usize>(
        w: [&[W]; 4],
        a: [&[W::Act]; T],
        nb: usize,
    ) -> [float32x4_t; T] {
        tile_mm(w, a, nb)
    }
}

/// `acc` plus the 2x2 matrix product of `a` (2 rows of 8 signed bytes) and `b` transposed (2
/// rows of 8): lane 2i + j gets the exact dot of row i of `a` with row j of `b`.
#[inline(always)]
unsafe fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: `smmla` only reads the three vector registers and writes `acc`; no memory, no
    // flags. Callers are compiled with `target_feature(enable = "i8mm")` and run only on a CPU
    // that reported i8mm.
    asm!(
        "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

// ---------------------------------------------------------------- small helpers

#[inline(always)]
unsafe fn load16(p: &[u8; 16]) -> int8x16_t {
    // SAFETY (for callers): reads exactly the 16 bytes of the referenced array.
    vreinterpretq_s8_u8(vld1q_u8(p.as_ptr()))
}

/// The two 16-byte halves of a 32-byte array.
#[inline(always)]
unsafe fn load32(p: &[u8; 32]) -> (int8x16_t, int8x16_t) {
    let (a, b) = p.split_at(16);
    (
        load16(a.try_into().expect("16 bytes")),
        load16(b.try_into().expect("16 bytes")),
    )
}

/// 16 bytes of nibbles to (low nibbles, high nibbles) as bytes 0..=15: elements 0..16, 16..32.
#[inline(always)]
unsafe fn nibbles(qs: &[u8; 16]) -> (uint8x16_t, uint8x16_t) {
    let x = vld1q_u8(qs.as_ptr());
    (vandq_u8(x, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(x))
}

/// Bit 4 of each Q5 quant: 0x10 in byte e where bit e of `qh` (little-endian u32) is set,
/// for elements 0..16 and 16..32.
#[inline(always)]
unsafe fn q5_high_bits(qh: [u8; 4]) -> (uint8x16_t, uint8x16_t) {
    let h = vreinterpret_u8_u32(vdup_n_u32(u32::from_le_bytes(qh)));
    // Byte e of the result takes qh byte e / 8 and tests its bit e % 8.
    let idx_lo = vcombine_u8(vdup_n_u8(0), vdup_n_u8(1));
    let idx_hi = vcombine_u8(vdup_n_u8(2), vdup_n_u8(3));
    const BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let bits = vld1q_u8(BITS.as_ptr());
    let hq = vcombine_u8(h, h);
    let lo = vtstq_u8(vqtbl1q_u8(hq, idx_lo), bits);
    let hi = vtstq_u8(vqtbl1q_u8(hq, idx_hi), bits);
    let b4 = vdupq_n_u8(0x10);
    (vandq_u8(lo, b4), vandq_u8(hi, b4))
}

/// Reduces R (1 or 4) vectors of i32 lanes to one exact sum each, in lanes 0..R.
#[inline(always)]
unsafe fn reduce<const R: usize>(p: [int32x4_t; R]) -> int32x4_t {
    if R == 4 {
        vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]))
    } else {
        vsetq_lane_s32::<0>(vaddvq_s32(p[0]), vdupq_n_s32(0))
    }
}

#[inline(always)]
unsafe fn lanes(v: float32x4_t) -> [f32; 4] {
    let mut tmp = [0f32; 4];
    // SAFETY: writes exactly the 4 floats of `tmp`.
    vst1q_f32(tmp.as_mut_ptr(), v);
    tmp
}

#[inline(always)]
unsafe fn from_lanes(v: [f32; 4]) -> float32x4_t {
    // SAFETY: reads exactly the 4 floats of `v`.
    vld1q_f32(v.as_ptr())
}

// ---------------------------------------------------------------- 32-element block formats

/// An activation block's d and s (0 without s), as f32.
#[inline(always)]
fn act_ds<A: ActBlock>(a: &A) -> (f32, f32) {
    let [d0, d1, s0, s1] = a.ds();
    (f16_le([d0, d1]), f16_le([s0, s1]))
}

/// What differs between the 32-element weight formats in the shared tile loop.
pub(crate) trait WeightBlock: Block {
    type Act: ActBlock;
    /// Q4_1/Q5_1: the block has a min `m`, dotted with the activation's `s` in a second chain.
    const HAS_MIN: bool;
    /// The 32 weights as signed bytes (elements 0..16, 16..32) whose integer dot with the
    /// activation quants is exactly the scalar twin's block sum.
    unsafe fn values(&self) -> (int8x16_t, int8x16_t);
    /// Scale and min (0 without a min), as f32.
    fn dm(&self) -> (f32, f32);
}

impl WeightBlock for BlockQ4_0 {
    type Act = BlockQ8_0;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn values(&self) -> (int8x16_t, int8x16_t) {
        // q - 8 in -8..=7: sum((q - 8) * y) is the scalar's idot - 8 * sum(y).
        let (lo, hi) = nibbles(&self.qs);
        let e = vdupq_n_s8(8);
        (
            vsubq_s8(vreinterpretq_s8_u8(lo), e),
            vsubq_s8(vreinterpretq_s8_u8(hi), e),
        )
    }
    #[inline(always)]
    fn dm(&self) -> (f32, f32) {
        (f16_le(self.d), 0.0)
    }
}

impl WeightBlock for BlockQ4_1 {
    type Act = BlockQ8_1;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn values(&self) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = nibbles(&self.qs);
        (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
    }
    #[inline(always)]
    fn dm(&self) -> (f32, f32) {
        (f16_le(self.d), f16_le(self.m))
    }
}

impl WeightBlock for BlockQ8_0 {
    type Act = BlockQ8_0;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn values(&self) -> (int8x16_t, int8x16_t) {
        load32(&self.qs)
    }
    #[inline(always)]
    fn dm(&self) -> (f32, f32) {
        (f16_le(self.d), 0.0)
    }
}

impl WeightBlock for BlockQ5_0 {
    type Act = BlockQ8_0;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn values(&self) -> (int8x16_t, int8x16_t) {
        // q - 16 in -16..=15: sum((q - 16) * y) is the scalar's s - 16 * sum(y).
        let (lo, hi) = nibbles(&self.qs);
        let (hlo, hhi) = q5_high_bits(self.qh);
        let e = vdupq_n_s8(16);
        (
            vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, hlo)), e),
            vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(hi, hhi)), e),
        )
    }
    #[inline(always)]
    fn dm(&self) -> (f32, f32) {
        (f16_le(self.d), 0.0)
    }
}

impl WeightBlock for BlockQ5_1 {
    type Act = BlockQ8_1;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn values(&self) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = nibbles(&self.qs);
        let (hlo, hhi) = q5_high_bits(self.qh);
        (
            vreinterpretq_s8_u8(vorrq_u8(lo, hlo)),
            vreinterpretq_s8_u8(vorrq_u8(hi, hhi)),
        )
    }
    #[inline(always)]
    fn dm(&self) -> (f32, f32) {
        (f16_le(self.d), f16_le(self.m))
    }
}

impl WeightBlock for BlockIQ4NL {
    type Act = BlockQ8_0;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn values(&self) -> (int8x16_t, int8x16_t) {
        // The grid values (i8) looked up by nibble.
        let grid = vld1q_s8(IQ4_VALUES.as_ptr());
        let (lo, hi) = nibbles(&self.qs);
        (vqtbl1q_s8(grid, lo), vqtbl1q_s8(grid, hi))
    }
    #[inline(always)]
    fn dm(&self) -> (f32, f32) {
        (f16_le(self.d), 0.0)
    }
}

/// R weight rows (1 or 4) times T activation rows over `nb` blocks: returns, per token, the R
/// results in lanes 0..R. Per (row, token) lane this performs exactly the scalar twin's steps:
/// acc = fma(dw * da, isum, acc) block by block (plus, with a min, the separate m * s chain,
/// added at the end).
#[inline(always)]
unsafe fn tile<W: WeightBlock, V: IDot, const R: usize, const T: usize>(
    w: [&[W]; R],
    a: [&[W::Act]; T],
    nb: usize,
) -> [float32x4_t; T] {
    for r in &w {
        assert!(r.len() >= nb);
    }
    for t in &a {
        assert!(t.len() >= nb);
    }
    let zero = vdupq_n_s32(0);
    let mut acc = [vdupq_n_f32(0.0); T];
    let mut accm = [vdupq_n_f32(0.0); T];
    for b in 0..nb {
        let (mut d, mut m) = ([0f32; 4], [0f32; 4]);
        let mut vals = [(vdupq_n_s8(0), vdupq_n_s8(0)); R];
        for k in 0..R {
            (d[k], m[k]) = w[k][b].dm();
            vals[k] = w[k][b].values();
        }
        let (dw, mw) = (from_lanes(d), from_lanes(m));
        for t in 0..T {
            let ab = &a[t][b];
            let (y0, y1) = load32(ab.qs());
            let mut p = [zero; R];
            for k in 0..R {
                p[k] = V::dot(V::dot(zero, vals[k].0, y0), vals[k].1, y1);
            }
            let isum = vcvtq_f32_s32(reduce::<R>(p));
            let (da, sa) = act_ds(ab);
            acc[t] = vfmaq_f32(acc[t], vmulq_n_f32(dw, da), isum);
            if W::HAS_MIN {
                accm[t] = vfmaq_f32(accm[t], mw, vdupq_n_f32(sa));
            }
        }
    }
    if W::HAS_MIN {
        for t in 0..T {
            acc[t] = vaddq_f32(acc[t], accm[t]);
        }
    }
    acc
}

/// Two rows' 32 bytes (each as the halves elements 0..16, 16..32) as the 4 `smmla` operands of
/// 8-element chunks: chunk c is [x[8c..8c + 8], y[8c..8c + 8]].
#[inline(always)]
unsafe fn pair_chunks(x: (int8x16_t, int8x16_t), y: (int8x16_t, int8x16_t)) -> [int8x16_t; 4] {
    let z = |p: int8x16_t, q: int8x16_t| {
        let (p, q) = (vreinterpretq_s64_s8(p), vreinterpretq_s64_s8(q));
        (
            vreinterpretq_s8_s64(vzip1q_s64(p, q)),
            vreinterpretq_s8_s64(vzip2q_s64(p, q)),
        )
    };
    let (c0, c1) = z(x.0, y.0);
    let (c2, c3) = z(x.1, y.1);
    [c0, c1, c2, c3]
}

/// `tile::<W, _, 4, T>` with `smmla`, T = 2 or 4: per block, rows (0, 1) and (2, 3) times the
/// token pairs (0, 1) and (2, 3) are 2x2 integer tiles of 4 `smmla` each (8 instead of 16
/// `sdot` per row pair and token pair). Each lane is one (row, token) block sum, exact;
/// `uzp1`/`uzp2` regroup them into one vector of the 4 rows per token, and the float steps are
/// `tile`'s, in its order.
#[inline(always)]
unsafe fn tile_mm<W: WeightBlock, const T: usize>(
    w: [&[W]; 4],
    a: [&[W::Act]; T],
    nb: usize,
) -> [float32x4_t; T] {
    assert!(T == 2 || T == 4);
    for r in &w {
        assert!(r.len() >= nb);
    }
    for t in &a {
        assert!(t.len() >= nb);
    }
    let zero = vdupq_n_s32(0);
    let mut acc = [vdupq_n_f32(0.0); T];
    let mut accm = [vdupq_n_f32(0.0); T];
    for b in 0..nb {
        let (mut d, mut m) = ([0f32; 4], [0f32; 4]);
        let mut vals = [(vdupq_n_s8(0), vdupq_n_s8(0)); 4];
        for k in 0..4 {
            (d[k], m[k]) = w[k][b].dm();
            vals[k] = w[k][b].values();
        }
        let (dw, mw) = (from_lanes(d), from_lanes(m));
        let wp = [pair_chunks(vals[0], vals[1]), pair_chunks(vals[2], vals[3])];
        // p[rp][tp] lanes: (row 2rp, token 2tp), (2rp, 2tp + 1), (2rp + 1, 2tp), (2rp + 1, 2tp + 1).
        let mut p = [[zero; 2]; 2];
        for tp in 0..T / 2 {
            let ap = pair_chunks(load32(a[2 * tp][b].qs()), load32(a[2 * tp + 1][b].qs()));
            for (rp, prow) in p.iter_mut().enumerate() {
                for c in 0..4 {
                    prow[tp] = smmla(prow[tp], wp[rp][c], ap[c]);
                }
            }
        }
        for (t, acc) in acc.iter_mut().enumerate() {
            // Token t's sums of rows 0..4: the even (t even) or odd lanes of its token pair.
            let (lo, hi) = (p[0][t / 2], p[1][t / 2]);
            let isum = if t % 2 == 0 {
                vuzp1q_s32(lo, hi)
            } else {
                vuzp2q_s32(lo, hi)
            };
            let (da, sa) = act_ds(&a[t][b]);
            *acc = vfmaq_f32(*acc, vmulq_n_f32(dw, da), vcvtq_f32_s32(isum));
            if W::HAS_MIN {
                accm[t] = vfmaq_f32(accm[t], mw, vdupq_n_f32(sa));
            }
        }
    }
    if W::HAS_MIN {
        for t in 0..T {
            acc[t] = vaddq_f32(acc[t], accm[t]);
        }
    }
    acc
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

impl<'a> Rows<'a> {
    /// Row `r`'s blocks of the column range (safe slicing: panics rather than reading outside).
    #[inline(always)]
    pub(crate) fn row<B: Block>(&self, r: usize) -> &'a [B] {
        let start = r * self.stride + self.off;
        let bytes = &self.data[start..start + self.nb * std::mem::size_of::<B>()];
        view::<B>(bytes).expect("whole blocks")
    }
}

/// Decode shape: all rows times one activation vector, 4 rows per pass. A trailing group of fewer
/// than 4 rows repeats its last row in the unused lanes (lanes are independent).
#[inline(always)]
unsafe fn matvec_impl<W: WeightBlock, V: IDot>(m: Rows<'_>, act: &[W::Act], out: &mut [f32]) {
    assert!(out.len() >= m.rows && act.len() >= m.nb);
    let mut r = 0;
    while r < m.rows {
        let n = (m.rows - r).min(4);
        let rows: [&[W]; 4] = std::array::from_fn(|k| m.row::<W>(r + k.min(n - 1)));
        let [v] = tile::<W, V, 4, 1>(rows, [act], m.nb);
        out[r..r + n].copy_from_slice(&lanes(v)[..n]);
        r += n;
    }
}

/// Sparse decode: the rows `pick` (any order, repeats allowed), 4 per pass.
#[inline(always)]
unsafe fn matvec_rows_impl<W: WeightBlock, V: IDot>(
    m: Rows<'_>,
    pick: &[u32],
    act: &[W::Act],
    out: &mut [f32],
) {
    assert!(out.len() >= pick.len() && act.len() >= m.nb);
    let mut k = 0;
    while k < pick.len() {
        let n = (pick.len() - k).min(4);
        let rows: [&[W]; 4] = std::array::from_fn(|j| m.row::<W>(pick[k + j.min(n - 1)] as usize));
        let [v] = tile::<W, V, 4, 1>(rows, [act], m.nb);
        out[k..k + n].copy_from_slice(&lanes(v)[..n]);
        k += n;
    }
}

/// Prefill shape: 4 rows x 4 tokens tiles, weight blocks unpacked once per 4 tokens (then
/// once for 2, then one token at a time).
#[inline(always)]
unsafe fn matmul_impl<W: WeightBlock, V: IDot>(
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
        // Token t + j's results for rows r..r + n are lanes 0..n of res[j].
        let mut put = |t: usize, res: &[float32x4_t]| {
            for (j, v) in res.iter().enumerate() {
                let o = (t + j) * out_stride + r;
                out[o..o + n].copy_from_slice(&lanes(*v)[..n]);
            }
        };
        while t + 4 <= n_tokens {
            put(
                t,
                &V::tile4xt::<W, 4>(rows, [tok(t), tok(t + 1), tok(t + 2), tok(t + 3)], m.nb),
            );
            t += 4;
        }
        // 2 or 3 tokens left (a batched decode step of 2 or 3 sequences, or the end of a
        // prompt): two more in one pass.
        if t + 2 <= n_tokens {
            put(t, &V::tile4xt::<W, 2>(rows, [tok(t), tok(t + 1)], m.nb));
            t += 2;
        }
        while t < n_tokens {
            put(t, &tile::<W, V, 4, 1>(rows, [tok(t)], m.nb));
            t += 1;
        }
        r += 4;
    }
}

#[inline(always)]
unsafe fn vec_dot_impl<W: WeightBlock, V: IDot>(w: &[W], a: &[W::Act]) -> f32 {
    let nb = w.len().min(a.len());
    let [v] = tile::<W, V, 1, 1>([w], [a], nb);
    vgetq_lane_f32::<0>(v)
}

#[inline(always)]
fn sub16(qs: &[u8], at: usize) -> &[u8; 16] {
    qs[at..at + 16].try_into().expect("16 bytes")
}

// ---------------------------------------------------------------- sparse FFN rows (axpy_rows)

/// The 32 signed bytes `v` of a block as 8 vectors of f32 (exact).
#[inline(always)]
unsafe fn i8x32_to_f32(v: (int8x16_t, int8x16_t)) -> [float32x4_t; 8] {
    let h = [
        vmovl_s8(vget_low_s8(v.0)),
        vmovl_high_s8(v.0),
        vmovl_s8(vget_low_s8(v.1)),
        vmovl_high_s8(v.1),
    ];
    std::array::from_fn(|k| {
        let w = if k % 2 == 0 {
            vmovl_s16(vget_low_s16(h[k / 2]))
        } else {
            vmovl_high_s16(h[k / 2])
        };
        vcvtq_f32_s32(w)
    })
}

/// `scalar::axpy_rows` for a 32-element format: per neuron in order, per element
/// `out = fma(c, x, out)` with x `d * v` (an exact product; v = q - 8, q - 16, q or grid[q]) or,
/// with a min, `fma(d, q, m)`: exactly the scalar's values and steps.
#[inline(always)]
unsafe fn axpy_rows_impl<W: WeightBlock>(
    m: Rows<'_>,
    neurons: &[u32],
    coefs: &[f32],
    out: &mut [f32],
) {
    assert!(out.len() >= 32 * m.nb);
    for (&n, &c) in neurons.iter().zip(coefs) {
        let row = m.row::<W>(n as usize);
        let cv = vdupq_n_f32(c);
        for (b, o) in row.iter().zip(out.chunks_exact_mut(32)) {
            let (d, mn) = b.dm();
            let q = i8x32_to_f32(b.values());
            let (dv, mv) = (vdupq_n_f32(d), vdupq_n_f32(mn));
            for (k, qk) in q.iter().enumerate() {
                let x = if W::HAS_MIN {
                    vfmaq_f32(mv, dv, *qk)
                } else {
                    vmulq_f32(dv, *qk)
                };
                // SAFETY: `o` has 32 floats (chunks_exact); 4 at 4k are inside it.
                let p = o.as_mut_ptr().add(4 * k);
                vst1q_f32(p, vfmaq_f32(vld1q_f32(p), cv, x));
            }
        }
    }
}

// ---------------------------------------------------------------- entry points

/// Stamps out the entry points of the kernels generic over [`IDot`].
macro_rules! entry {
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

/// Entry points needing only NEON (the aarch64 baseline), and the activation quantizers.
pub(crate) mod plain {
    use super::*;

    entry!("neon", Widen);

    #[target_feature(enable = "neon")]
    pub(crate) unsafe fn quantize_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
        quantize_q8_0_impl(x, y)
    }

    #[target_feature(enable = "neon")]
    pub(crate) unsafe fn quantize_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
        quantize_q8_1_impl(x, y)
    }

    #[target_feature(enable = "neon")]
    pub(crate) unsafe fn quantize_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
        quantize_q8_k_impl(x, y)
    }

    #[target_feature(enable = "neon")]
    pub(crate) unsafe fn axpy_rows<W: WeightBlock>(
        m: Rows<'_>,
        neurons: &[u32],
        coefs: &[f32],
        out: &mut [f32],
    ) {
        axpy_rows_impl::<W>(m, neurons, coefs, out)
    }

    #[target_feature(enable = "neon")]
    pub(crate) unsafe fn dot_f32(n: usize, w: &[u8], x: &[u8]) -> f32 {
        dot_f32_impl(n, w, x)
    }

    #[target_feature(enable = "neon")]
    pub(crate) unsafe fn dot_f16(n: usize, w: &[u8], x: &[u8]) -> f32 {
        dot_f16_impl(n, w, x)
    }

    #[target_feature(enable = "neon")]
    pub(crate) unsafe fn dot_bf16(n: usize, w: &[u8], x: &[u8]) -> f32 {
        dot_bf16_impl(n, w, x)
    }

    #[target_feature(enable = "neon")]
    pub(crate) unsafe fn dot_f32_f16(x: &[f32], y: &[f16]) -> f32 {
        dot_f32_f16_impl(x, y)
    }

    #[target_feature(enable = "neon")]
    pub(crate) unsafe fn f32_to_f16_row(src: &[f32], dst: &mut [f16]) {
        f32_to_f16_row_impl(src, dst)
    }

    #[target_feature(enable = "neon")]
    pub(crate) unsafe fn f16_to_f32_row(src: &[f16], dst: &mut [f32]) {
        f16_to_f32_row_impl(src, dst)
    }

    #[target_feature(enable = "neon")]
    pub(crate) unsafe fn axpy_f16(a: f32, x: &[f16], y: &mut [f32]) {
        axpy_f16_impl(a, x, y)
    }
}

/// Entry points needing NEON + dotprod (`sdot`).
pub(crate) mod dot {
    use super::*;

    entry!("neon,dotprod", Sdot);
}

/// Entry points needing NEON + dotprod + i8mm: the matmul, whose 4x4 and 4x2 tiles use `smmla`
/// (its other paths are the dotprod ones, which `mod.rs` calls from `dot`).
pub(crate) mod mm {
    use super::*;

    #[target_feature(enable = "neon,dotprod,i8mm")]
    pub(crate) unsafe fn matmul<W: WeightBlock>(
        m: Rows<'_>,
        acts: &[W::Act],
        n_tokens: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        matmul_impl::<W, Mmla>(m, acts, n_tokens, out, out_stride)
    }
}

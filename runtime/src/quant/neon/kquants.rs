//! The K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_XS in the file layout on NEON, dotted
//! with Q8_K activations, under the safety contract of `neon.rs`. One super-block loop serves
//! every format: [`KBlock`] says how a format's 256 quants become signed bytes and what its
//! integer scales are.
//!
//! - `dot` (and so matvec, the per-row loop of `mod.rs`): one row, one token.
//! - `matmul`: one row by 4 tokens per pass, each super-block unpacked and its scales decoded
//!   once per pass ([`IDot`]: plain NEON or `sdot`); with i8mm, 2 rows x 2 tokens per
//!   `smmla`, on activations zipped once per call.
//!
//! Each sub-block's products go into one accumulator; four accumulators are folded into the
//! lanes of one vector (`addp`), multiplied by the four scales (`mla`) and summed once per
//! super-block (`addv`). The scales are decoded with vector or 32-bit word operations (for
//! Q4_K/Q5_K the masks of ggml's layout), not one byte at a time.
//!
//! Bit identity: per (row, token, super-block) the integer sums `sumi` (sum over sub-blocks of
//! scale x (quants . activations)) and `summ` (mins . bsums) are exact in any order, and the
//! float steps are those of `scalar.rs` for every format: `acc = fma(d * da, sumi, acc)`, and
//! with mins `accm = fma(dmin * da, summ, accm)`, the result `acc - accm`. Q6_K's `- 32` is a
//! bsum correction, as in its scalar twin (so the bits agree even on blocks whose bsums are not
//! the sums of their quants).

use super::*;
use std::ops::Range;

/// The integer coefficients of one super-block, as vector lanes.
pub(crate) struct Coefs {
    /// The scale of each sub-block of `SUB` elements, 4 per vector (the first `256 / SUB`).
    sc: [int32x4_t; 4],
    /// The coefficient of each 16 elements' bsum: in `summ` (the min) for formats with mins,
    /// in `sumi` (Q6_K: -32 x scale) for corrected ones, else unused.
    mb: [int16x8_t; 2],
}

/// A 256-element super-block format as the NEON loops read it.
pub(crate) trait KBlock: Block {
    /// Elements per scale: 32 (Q4_K, Q5_K, IQ4_XS) or 16 (Q2_K, Q3_K, Q6_K).
    const SUB: usize;
    /// Whether the format subtracts `dmin * summ` (Q2_K, Q4_K, Q5_K).
    const HAS_MINS: bool;
    /// Whether `sumi` has a bsum correction (Q6_K).
    const CORRECTED: bool = false;
    /// The 256 quants as signed bytes, vector `i` holding elements `16i..16i + 16`.
    unsafe fn quants(&self) -> [int8x16_t; 16];
    /// Its scales and bsum coefficients.
    unsafe fn coefs(&self) -> Coefs;
    /// (d, dmin) as f32 (dmin is 0 without mins).
    fn dm(&self) -> (f32, f32);
}

/// 16 signed bytes as 4 vectors of i32 lanes.
#[inline(always)]
unsafe fn widen(v: int8x16_t) -> [int32x4_t; 4] {
    let (lo, hi) = (vmovl_s8(vget_low_s8(v)), vmovl_high_s8(v));
    [
        vmovl_s16(vget_low_s16(lo)),
        vmovl_high_s16(lo),
        vmovl_s16(vget_low_s16(hi)),
        vmovl_high_s16(hi),
    ]
}

/// Q4_K/Q5_K's 8 scales and 8 mins (6 bits each; the layout of `scalar::q4k_scale_min`),
/// decoded 4 at a time from the three little-endian words of `s`, the mins repeated for the
/// two 16-element halves of their sub-block.
#[inline(always)]
unsafe fn q4k_coefs(s: &[u8; 12]) -> Coefs {
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes(s[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    let (u0, u1, u2) = (word(0), word(1), word(2));
    // Sub-blocks 0..4 take 6 bits of bytes 0..4 (scales) and 4..8 (mins); 4..8 take a nibble
    // of bytes 8..12 and the top 2 bits of bytes 0..4 (scales) or 4..8 (mins).
    let scales = (u0 & LOW6) as u64 | (((u2 & LOW4) | (((u0 >> 6) & LOW2) << 4)) as u64) << 32;
    let mins = (u1 & LOW6) as u64 | ((((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4)) as u64) << 32;
    let sc = widen(vcombine_s8(vcreate_s8(scales), vdup_n_s8(0)));
    let m = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(mins)));
    Coefs {
        sc,
        mb: [vzip1q_s16(m, m), vzip2q_s16(m, m)],
    }
}

/// Coefficients from up to 16 signed scales, without bsum terms.
#[inline(always)]
unsafe fn plain_coefs(sc: &[i8; 16]) -> Coefs {
    Coefs {
        sc: widen(vld1q_s8(sc.as_ptr())),
        mb: [vdupq_n_s16(0); 2],
    }
}

impl KBlock for BlockQ4K {
    const SUB: usize = 32;
    const HAS_MINS: bool = true;

    /// Element 64c + l is the low nibble of qs[32c + l], element 64c + 32 + l the high one.
    #[inline(always)]
    unsafe fn quants(&self) -> [int8x16_t; 16] {
        let mut q = [vdupq_n_s8(0); 16];
        for c in 0..4 {
            let (l0, h0) = nibbles(sub16(&self.qs, 32 * c));
            let (l1, h1) = nibbles(sub16(&self.qs, 32 * c + 16));
            q[4 * c] = vreinterpretq_s8_u8(l0);
            q[4 * c + 1] = vreinterpretq_s8_u8(l1);
            q[4 * c + 2] = vreinterpretq_s8_u8(h0);
            q[4 * c + 3] = vreinterpretq_s8_u8(h1);
        }
        q
    }

    #[inline(always)]
    unsafe fn coefs(&self) -> Coefs {
        q4k_coefs(&self.scales)
    }

    #[inline(always)]
    fn dm(&self) -> (f32, f32) {
        (f16_le(self.d), f16_le(self.dmin))
    }
}

impl KBlock for BlockQ5K {
    const SUB: usize = 32;
    const HAS_MINS: bool = true;

    /// As Q4_K's nibbles (element 32j + l: nibble of qs[32 (j / 2) + l], low for even j), plus
    /// bit j of qh[l] as 16.
    #[inline(always)]
    unsafe fn quants(&self) -> [int8x16_t; 16] {
        let b4 = vdupq_n_u8(0x10);
        let qh = [
            vld1q_u8(sub16(&self.qh, 0).as_ptr()),
            vld1q_u8(sub16(&self.qh, 16).as_ptr()),
        ];
        let mut q = [vdupq_n_s8(0); 16];
        for j in 0..8 {
            let bit = vdupq_n_u8(1 << j);
            for (h, &qhh) in qh.iter().enumerate() {
                let (lo, hi) = nibbles(sub16(&self.qs, 32 * (j / 2) + 16 * h));
                let n = if j % 2 == 0 { lo } else { hi };
                q[2 * j + h] = vreinterpretq_s8_u8(vorrq_u8(n, vandq_u8(vtstq_u8(qhh, bit), b4)));
            }
        }
        q
    }

    #[inline(always)]
    unsafe fn coefs(&self) -> Coefs {
        q4k_coefs(&self.scales)
    }

    #[inline(always)]
    fn dm(&self) -> (f32, f32) {
        (f16_le(self.d), f16_le(self.dmin))
    }
}

impl KBlock for BlockQ6K {
    const SUB: usize = 16;
    const HAS_MINS: bool = false;
    const CORRECTED: bool = true;

    /// Element 128n + 32k + l (k = 0..4): the low (k < 2) or high nibble of
    /// ql[64n + 32 (k % 2) + l] with bits 2k of qh[32n + l] above it (0..=63; the `- 32` is
    /// the bsum correction).
    #[inline(always)]
    unsafe fn quants(&self) -> [int8x16_t; 16] {
        let m4 = vdupq_n_u8(0x0F);
        let m2 = vdupq_n_u8(0x03);
        let mut q = [vdupq_n_s8(0); 16];
        for n in 0..2 {
            for h in 0..2 {
                let la = vld1q_u8(sub16(&self.ql, 64 * n + 16 * h).as_ptr());
                let lb = vld1q_u8(sub16(&self.ql, 64 * n + 32 + 16 * h).as_ptr());
                let qh = vld1q_u8(sub16(&self.qh, 32 * n + 16 * h).as_ptr());
                let u = [
                    vorrq_u8(vandq_u8(la, m4), vshlq_n_u8::<4>(vandq_u8(qh, m2))),
                    vorrq_u8(
                        vandq_u8(lb, m4),
                        vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<2>(qh), m2)),
                    ),
                    vorrq_u8(
                        vshrq_n_u8::<4>(la),
                        vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<4>(qh), m2)),
                    ),
                    vorrq_u8(vshrq_n_u8::<4>(lb), vshlq_n_u8::<4>(vshrq_n_u8::<6>(qh))),
                ];
                for (k, uk) in u.into_iter().enumerate() {
                    q[8 * n + 2 * k + h] = vreinterpretq_s8_u8(uk);
                }
            }
        }
        q
    }

    #[inline(always)]
    unsafe fn coefs(&self) -> Coefs {
        let sc = vreinterpretq_s8_u8(vld1q_u8(self.scales.as_ptr()));
        let (lo, hi) = (vmovl_s8(vget_low_s8(sc)), vmovl_high_s8(sc));
        Coefs {
            sc: widen(sc),
            mb: [vmulq_n_s16(lo, -32), vmulq_n_s16(hi, -32)],
        }
    }

    #[inline(always)]
    fn dm(&self) -> (f32, f32) {
        (f16_le(self.d), 0.0)
    }
}

/// The four 2-bit fields of 16 bytes: field j (bits 2j..2j + 2) of each byte, j = 0..4.
#[inline(always)]
unsafe fn crumbs(q: uint8x16_t) -> [uint8x16_t; 4] {
    let m3 = vdupq_n_u8(3);
    [
        vandq_u8(q, m3),
        vandq_u8(vshrq_n_u8::<2>(q), m3),
        vandq_u8(vshrq_n_u8::<4>(q), m3),
        vshrq_n_u8::<6>(q),
    ]
}

/// Q2_K/Q3_K's low 2 bits: element 128n + 32j + l is field j of qs[32n + l], so the 16 bytes
/// at 32n + 16h hold, field by field, the 16-element groups 8n + 2j + h. `f(n, j, h, field)`
/// turns each into its signed quants.
#[inline(always)]
unsafe fn q2_groups(
    qs: &[u8; 64],
    mut f: impl FnMut(usize, usize, usize, uint8x16_t) -> int8x16_t,
) -> [int8x16_t; 16] {
    let mut q = [vdupq_n_s8(0); 16];
    for n in 0..2 {
        for h in 0..2 {
            let c = crumbs(vld1q_u8(sub16(qs, 32 * n + 16 * h).as_ptr()));
            for (j, cj) in c.into_iter().enumerate() {
                q[8 * n + 2 * j + h] = f(n, j, h, cj);
            }
        }
    }
    q
}

impl KBlock for BlockQ2K {
    const SUB: usize = 16;
    const HAS_MINS: bool = true;

    #[inline(always)]
    unsafe fn quants(&self) -> [int8x16_t; 16] {
        q2_groups(&self.qs, |_, _, _, c| vreinterpretq_s8_u8(c))
    }

    #[inline(always)]
    unsafe fn coefs(&self) -> Coefs {
        let s = vld1q_u8(self.scales.as_ptr());
        let m = vshrq_n_u8::<4>(s);
        Coefs {
            sc: widen(vreinterpretq_s8_u8(vandq_u8(s, vdupq_n_u8(0x0F)))),
            mb: [
                vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(m))),
                vreinterpretq_s16_u16(vmovl_high_u8(m)),
            ],
        }
    }

    #[inline(always)]
    fn dm(&self) -> (f32, f32) {
        (f16_le(self.d), f16_le(self.dmin))
    }
}

impl KBlock for BlockQ3K {
    const SUB: usize = 16;
    const HAS_MINS: bool = false;

    /// The low bits as Q2_K's; the value is those minus 4 where bit 4n + j of hmask[16h + l]
    /// is clear.
    #[inline(always)]
    unsafe fn quants(&self) -> [int8x16_t; 16] {
        let four = vdupq_n_u8(4);
        let hm = [
            vld1q_u8(sub16(&self.hmask, 0).as_ptr()),
            vld1q_u8(sub16(&self.hmask, 16).as_ptr()),
        ];
        q2_groups(&self.qs, |n, j, h, c| {
            let clear = vbicq_u8(four, vtstq_u8(hm[h], vdupq_n_u8(1 << (4 * n + j))));
            vsubq_s8(vreinterpretq_s8_u8(c), vreinterpretq_s8_u8(clear))
        })
    }

    #[inline(always)]
    unsafe fn coefs(&self) -> Coefs {
        plain_coefs(&scalar::q3k_scales(&self.scales))
    }

    #[inline(always)]
    fn dm(&self) -> (f32, f32) {
        (f16_le(self.d), 0.0)
    }
}

impl KBlock for BlockIQ4XS {
    const SUB: usize = 32;
    const HAS_MINS: bool = false;

    /// Elements 32j..32j + 16 are the grid values of the low nibbles of qs[16j..16j + 16],
    /// 32j + 16.. those of the high nibbles.
    #[inline(always)]
    unsafe fn quants(&self) -> [int8x16_t; 16] {
        let grid = vld1q_s8(IQ4_VALUES.as_ptr());
        let mut q = [vdupq_n_s8(0); 16];
        for j in 0..8 {
            let (lo, hi) = nibbles(sub16(&self.qs, 16 * j));
            q[2 * j] = vqtbl1q_s8(grid, lo);
            q[2 * j + 1] = vqtbl1q_s8(grid, hi);
        }
        q
    }

    #[inline(always)]
    unsafe fn coefs(&self) -> Coefs {
        // The 8 scales are -32..=31.
        let mut sc = [0i8; 16];
        for (j, s) in sc.iter_mut().take(8).enumerate() {
            *s = scalar::iq4xs_scale(self, j) as i8;
        }
        plain_coefs(&sc)
    }

    #[inline(always)]
    fn dm(&self) -> (f32, f32) {
        (f16_le(self.d), 0.0)
    }
}

// ---------------------------------------------------------------- integer sums

/// Sum over the 16 groups of `mb` x bsum, in i32 lanes (wrapping, as the scalar twins' i32
/// sums; |products| <= 2^27).
#[inline(always)]
unsafe fn bsum_dot(mb: &[int16x8_t; 2], a: &BlockQ8K) -> i32 {
    // SAFETY (for the loads): `bsums` is 16 little-endian i16 (32 bytes), read as 2 x 8 lanes.
    let bs: &[u8; 32] = a.bsums.as_flattened().try_into().expect("32 bytes");
    let b0 = vreinterpretq_s16_u8(vld1q_u8(bs.as_ptr()));
    let b1 = vreinterpretq_s16_u8(vld1q_u8(bs[16..].as_ptr()));
    let [m0, m1] = *mb;
    let p = vmull_s16(vget_low_s16(m0), vget_low_s16(b0));
    let p = vmlal_high_s16(p, m0, b0);
    let p = vmlal_s16(p, vget_low_s16(m1), vget_low_s16(b1));
    vaddvq_s32(vmlal_high_s16(p, m1, b1))
}

/// (`sumi`, `summ`) of one super-block (quants `q`, coefficients `c`) against one token.
#[inline(always)]
unsafe fn isums<K: KBlock, V: IDot>(q: &[int8x16_t; 16], c: &Coefs, a: &BlockQ8K) -> (i32, i32) {
    let per = K::SUB / 16;
    let mut v = vdupq_n_s32(0);
    // Four sub-blocks at a time: their sums in the lanes of one vector, times their scales.
    for (g, &scales) in c.sc.iter().take(4 / per).enumerate() {
        let mut s = [vdupq_n_s32(0); 4];
        for (k, sk) in s.iter_mut().enumerate() {
            let j = 4 * g + k;
            for (i, &qi) in q.iter().enumerate().skip(per * j).take(per) {
                *sk = V::dot(*sk, qi, load16(sub16(&a.qs, 16 * i)));
            }
        }
        v = vmlaq_s32(v, reduce(s), scales);
    }
    let sumi = vaddvq_s32(v);
    match (K::HAS_MINS, K::CORRECTED) {
        (true, _) => (sumi, bsum_dot(&c.mb, a)),
        (false, true) => (sumi.wrapping_add(bsum_dot(&c.mb, a)), 0),
        (false, false) => (sumi, 0),
    }
}

/// One super-block's float step into the accumulators `[acc, accm]` (`scalar.rs`'s):
/// `acc = fma(d * da, sumi, acc)`, with mins `accm = fma(dmin * da, summ, accm)`.
#[inline(always)]
fn step<K: KBlock>(acc: &mut [f32; 2], (d, dmin): (f32, f32), da: f32, (sumi, summ): (i32, i32)) {
    acc[0] = (d * da).mul_add(sumi as f32, acc[0]);
    if K::HAS_MINS {
        acc[1] = (dmin * da).mul_add(summ as f32, acc[1]);
    }
}

/// The float result from the accumulators (`scalar.rs`'s last step).
#[inline(always)]
fn finish<K: KBlock>([acc, accm]: [f32; 2]) -> f32 {
    if K::HAS_MINS {
        acc - accm
    } else {
        acc
    }
}

// ---------------------------------------------------------------- one row, one or 4 tokens

/// `out[t]` = row `w` . token `acts[t]`, each super-block unpacked and its scales decoded once
/// for the 4 tokens.
#[inline(always)]
unsafe fn row_by_4<K: KBlock, V: IDot>(w: &[K], acts: [&[BlockQ8K]; 4], out: &mut [f32; 4]) {
    let mut acc = [[0f32; 2]; 4];
    for (b, bw) in w.iter().enumerate() {
        let q = bw.quants();
        let c = bw.coefs();
        for (t, acc) in acc.iter_mut().enumerate() {
            let a = &acts[t][b];
            step::<K>(acc, bw.dm(), a.d(), isums::<K, V>(&q, &c, a));
        }
    }
    for (o, acc) in out.iter_mut().zip(acc) {
        *o = finish::<K>(acc);
    }
}

/// Row `w` dotted with `a`.
#[inline(always)]
unsafe fn dot_impl<K: KBlock, V: IDot>(w: &[K], a: &[BlockQ8K]) -> f32 {
    let mut acc = [0f32; 2];
    for (bw, ba) in w.iter().zip(a) {
        step::<K>(
            &mut acc,
            bw.dm(),
            ba.d(),
            isums::<K, V>(&bw.quants(), &bw.coefs(), ba),
        );
    }
    finish::<K>(acc)
}

/// `out[t * out_stride + r]` for rows `rows` and tokens `tokens`, one row by 4 tokens per
/// pass (the last 1-3 tokens by the dot).
#[inline(always)]
unsafe fn matmul_rows<K: KBlock, V: IDot>(
    m: Rows<'_>,
    rows: Range<usize>,
    acts: &[BlockQ8K],
    tokens: Range<usize>,
    out: &mut [f32],
    out_stride: usize,
) {
    let tok = |t: usize| &acts[t * m.nb..(t + 1) * m.nb];
    for r in rows {
        let w = m.row::<K>(r);
        let mut t = tokens.start;
        while t + 4 <= tokens.end {
            let mut o = [0f32; 4];
            row_by_4::<K, V>(w, [tok(t), tok(t + 1), tok(t + 2), tok(t + 3)], &mut o);
            for (j, v) in o.into_iter().enumerate() {
                out[(t + j) * out_stride + r] = v;
            }
            t += 4;
        }
        while t < tokens.end {
            out[t * out_stride + r] = dot_impl::<K, V>(w, tok(t));
            t += 1;
        }
    }
}

#[inline(always)]
unsafe fn matmul_impl<K: KBlock, V: IDot>(
    m: Rows<'_>,
    acts: &[BlockQ8K],
    n_tokens: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    assert!(acts.len() >= n_tokens * m.nb);
    matmul_rows::<K, V>(m, 0..m.rows, acts, 0..n_tokens, out, out_stride);
}

// ---------------------------------------------------------------- i8mm: 2 rows x 2 tokens

/// For `smmla`, 16 elements of two rows (or tokens) `x`, `y` as two vectors: their first 8
/// bytes side by side, then their last 8.
#[inline(always)]
unsafe fn zip8(x: int8x16_t, y: int8x16_t) -> [int8x16_t; 2] {
    let (x, y) = (vreinterpretq_s64_s8(x), vreinterpretq_s64_s8(y));
    [
        vreinterpretq_s8_s64(vzip1q_s64(x, y)),
        vreinterpretq_s8_s64(vzip2q_s64(x, y)),
    ]
}

/// `[x, x, y, y]`: a row pair's value in its tokens' lanes.
#[inline(always)]
unsafe fn per_row(x: f32, y: f32) -> float32x4_t {
    vcombine_f32(vdup_n_f32(x), vdup_n_f32(y))
}

/// Rows `2p, 2p + 1` by tokens `2u, 2u + 1` with `smmla`: per 16 elements of a super-block,
/// two `smmla` give the exact sums of the 4 (row, token) pairs, lane `2 row + token`.
#[inline(always)]
unsafe fn matmul_mm_impl<K: KBlock>(
    m: Rows<'_>,
    acts: &[BlockQ8K],
    n_tokens: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    assert!(acts.len() >= n_tokens * m.nb);
    let nb = m.nb;
    let (row_pairs, tok_pairs) = (m.rows / 2, n_tokens / 2);
    // Token pairs' activations zipped once: for pair u, super-block b, the 32 vectors of
    // `zip8` per 16 elements; and [da0, da1, da0, da1].
    let mut az = vec![vdupq_n_s8(0); tok_pairs * nb * 32];
    let mut adv = vec![vdupq_n_f32(0.0); tok_pairs * nb];
    for u in 0..tok_pairs {
        for b in 0..nb {
            let (a0, a1) = (&acts[2 * u * nb + b], &acts[(2 * u + 1) * nb + b]);
            let z = &mut az[(u * nb + b) * 32..(u * nb + b + 1) * 32];
            for i in 0..16 {
                let [lo, hi] = zip8(load16(sub16(&a0.qs, 16 * i)), load16(sub16(&a1.qs, 16 * i)));
                z[2 * i] = lo;
                z[2 * i + 1] = hi;
            }
            // [da0, da1, da0, da1]: a token pair's value in its rows' lanes.
            let da = vset_lane_f32::<1>(a1.d(), vdup_n_f32(a0.d()));
            adv[u * nb + b] = vcombine_f32(da, da);
        }
    }
    let per = K::SUB / 16;
    let mut acc = vec![vdupq_n_f32(0.0); tok_pairs];
    let mut accm = vec![vdupq_n_f32(0.0); tok_pairs];
    for p in 0..row_pairs {
        let (w0, w1) = (m.row::<K>(2 * p), m.row::<K>(2 * p + 1));
        acc.fill(vdupq_n_f32(0.0));
        accm.fill(vdupq_n_f32(0.0));
        for b in 0..nb {
            let (q0, q1) = (w0[b].quants(), w1[b].quants());
            let mut wz = [vdupq_n_s8(0); 32];
            for i in 0..16 {
                let [lo, hi] = zip8(q0[i], q1[i]);
                wz[2 * i] = lo;
                wz[2 * i + 1] = hi;
            }
            let (c0, c1) = (w0[b].coefs(), w1[b].coefs());
            // Sub-block j's scales of the two rows in their lanes: [s0, s0, s1, s1].
            let mut scv = [vdupq_n_s32(0); 16];
            for g in 0..4 / per {
                let (x, y) = (c0.sc[g], c1.sc[g]);
                for (h, (xx, yy)) in [
                    (vzip1q_s32(x, x), vzip1q_s32(y, y)),
                    (vzip2q_s32(x, x), vzip2q_s32(y, y)),
                ]
                .into_iter()
                .enumerate()
                {
                    scv[4 * g + 2 * h] = vcombine_s32(vget_low_s32(xx), vget_low_s32(yy));
                    scv[4 * g + 2 * h + 1] = vcombine_s32(vget_high_s32(xx), vget_high_s32(yy));
                }
            }
            let ((d0, dmin0), (d1, dmin1)) = (w0[b].dm(), w1[b].dm());
            let (dv, dminv) = (per_row(d0, d1), per_row(dmin0, dmin1));
            for u in 0..tok_pairs {
                let z = &az[(u * nb + b) * 32..(u * nb + b + 1) * 32];
                let mut v = vdupq_n_s32(0);
                for (j, &scj) in scv.iter().take(16 / per).enumerate() {
                    let mut s = vdupq_n_s32(0);
                    for k in 2 * per * j..2 * per * (j + 1) {
                        s = smmla(s, wz[k], z[k]);
                    }
                    v = vmlaq_s32(v, s, scj);
                }
                let da = adv[u * nb + b];
                // The bsum terms of the 4 (row, token) lanes: mins or correction.
                let bsums = || {
                    let (a0, a1) = (&acts[2 * u * nb + b], &acts[(2 * u + 1) * nb + b]);
                    let t = [
                        bsum_dot(&c0.mb, a0),
                        bsum_dot(&c0.mb, a1),
                        bsum_dot(&c1.mb, a0),
                        bsum_dot(&c1.mb, a1),
                    ];
                    vld1q_s32(t.as_ptr())
                };
                if K::CORRECTED {
                    v = vaddq_s32(v, bsums());
                }
                acc[u] = vfmaq_f32(acc[u], vmulq_f32(dv, da), vcvtq_f32_s32(v));
                if K::HAS_MINS {
                    let sv = vcvtq_f32_s32(bsums());
                    accm[u] = vfmaq_f32(accm[u], vmulq_f32(dminv, da), sv);
                }
            }
        }
        for u in 0..tok_pairs {
            let res = if K::HAS_MINS {
                vsubq_f32(acc[u], accm[u])
            } else {
                acc[u]
            };
            let l = lanes(res);
            for (k, v) in l.into_iter().enumerate() {
                out[(2 * u + k % 2) * out_stride + 2 * p + k / 2] = v;
            }
        }
    }
    // The odd row and the odd token, if any, through `sdot`.
    matmul_rows::<K, Sdot>(m, 2 * row_pairs..m.rows, acts, 0..n_tokens, out, out_stride);
    matmul_rows::<K, Sdot>(
        m,
        0..2 * row_pairs,
        acts,
        2 * tok_pairs..n_tokens,
        out,
        out_stride,
    );
}

// ---------------------------------------------------------------- entry points

/// Stamps out the entry points per ISA.
macro_rules! entry {
    ($features:literal, $V:ty) => {
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn dot<K: KBlock>(w: &[K], a: &[BlockQ8K]) -> f32 {
            dot_impl::<K, $V>(w, a)
        }

        #[target_feature(enable = $features)]
        pub(crate) unsafe fn matmul<K: KBlock>(
            m: Rows<'_>,
            acts: &[BlockQ8K],
            n_tokens: usize,
            out: &mut [f32],
            out_stride: usize,
        ) {
            matmul_impl::<K, $V>(m, acts, n_tokens, out, out_stride)
        }
    };
}

/// NEON only.
pub(crate) mod plain {
    use super::*;

    entry!("neon", Widen);
}

/// NEON + dotprod.
pub(crate) mod dot {
    use super::*;

    entry!("neon,dotprod", Sdot);
}

/// NEON + dotprod + i8mm: the matmul (`dot` is the dotprod one).
pub(crate) mod mm {
    use super::*;

    #[target_feature(enable = "neon,dotprod,i8mm")]
    pub(crate) unsafe fn matmul<K: KBlock>(
        m: Rows<'_>,
        acts: &[BlockQ8K],
        n_tokens: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        matmul_mm_impl::<K>(m, acts, n_tokens, out, out_stride)
    }
}

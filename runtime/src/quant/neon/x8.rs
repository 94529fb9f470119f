//! Q4_K and Q6_K over rows interleaved 8 by 8 ([`BlockQ4Kx8`], [`BlockQ6Kx8`], `interleave.rs`),
//! dotted with Q8_K activations: the NEON + dotprod twins of `avx2/q4k_x8.rs` and
//! `avx2/q6k_x8.rs`, under the safety contract of `neon.rs`.
//!
//! Each i32 lane is one row; a group's 8 rows are two vectors (rows 0..4 and 4..8). The layout
//! holds the 8 rows' 4-byte chunks of one position side by side, so one 16-byte load is 4 rows'
//! 4 quants, and `sdot` by element (`sdot v.4s, w.16b, a.4b[i]`) multiplies each row's 4 bytes
//! by the same 4 activation bytes (chunk i of a 16-byte activation load): 16 multiply-adds per
//! instruction with no shuffles and no horizontal sums. Per row the integer sums are exactly
//! the scalar twin's (`scalar::q4k_isums`, `scalar::dot_q6_k_q8_k`'s sums; exact integer
//! arithmetic in any order), and the float steps are its own, lane by lane. Only the dotprod
//! ISAs use these (`Kernels::has_interleaved_kernels`); plain NEON takes rows back out.

use super::*;
use crate::quant::interleave::{
    matmul_groups, matvec_groups, q6k_part, Kernel8, Lanes8, GROUP_ROWS, X8,
};

/// `acc` plus, per i32 lane, the dot of that lane's 4 bytes of `w` with bytes 4i..4i + 4 of `a`.
#[inline(always)]
unsafe fn sdot_by(acc: int32x4_t, w: uint8x16_t, a: int8x16_t, i: usize) -> int32x4_t {
    let mut acc = acc;
    let w = vreinterpretq_s8_u8(w);
    // SAFETY: `sdot` (by element) only reads the three vector registers and writes `acc`; no
    // memory, no flags. Callers are compiled with `target_feature(enable = "dotprod")` and run
    // only on a CPU that reported dotprod. The index is an immediate, hence one arm per lane
    // (callers' loops are unrolled, so the match folds away).
    macro_rules! by {
        ($i:literal) => {
            asm!(
                concat!("sdot {acc:v}.4s, {w:v}.16b, {a:v}.4b[", $i, "]"),
                acc = inout(vreg) acc,
                w = in(vreg) w,
                a = in(vreg) a,
                options(pure, nomem, nostack, preserves_flags)
            )
        };
    }
    match i {
        0 => by!(0),
        1 => by!(1),
        2 => by!(2),
        _ => by!(3),
    }
    acc
}

/// The 8 rows' 4-byte chunks (one per row) as rows 0..4 and 4..8.
#[inline(always)]
unsafe fn rows8(c: &[[u8; 4]]) -> [uint8x16_t; 2] {
    let c: &[[u8; 4]; GROUP_ROWS] = c.try_into().expect("8 chunks");
    let b = c.as_flattened();
    [bytes16(b, 0), bytes16(b, 16)]
}

/// The 8 rows' f16 `d` (or `dmin`) as f32, rows 0..4 and 4..8 (exact).
#[inline(always)]
unsafe fn f16x8(d: &[[u8; 2]; GROUP_ROWS]) -> [float32x4_t; 2] {
    let b = d.as_flattened();
    [
        f16x4_to_f32(vreinterpret_u16_u8(bytes8(b, 0))),
        f16x4_to_f32(vreinterpret_u16_u8(bytes8(b, 8))),
    ]
}

/// Byte `t` (0..4) of each u32 lane, zero-extended.
#[inline(always)]
unsafe fn byte_of(v: uint8x16_t, t: usize) -> int32x4_t {
    let shifted = vshlq_u32(vreinterpretq_u32_u8(v), vdupq_n_s32(-8 * t as i32));
    vreinterpretq_s32_u32(vandq_u32(shifted, vdupq_n_u32(0xFF)))
}

/// Byte `t` (0..4) of each i32 lane, sign-extended.
#[inline(always)]
unsafe fn sbyte_of(v: uint8x16_t, t: usize) -> int32x4_t {
    let top = vshlq_s32(vreinterpretq_s32_u8(v), vdupq_n_s32(24 - 8 * t as i32));
    vshlq_s32(top, vdupq_n_s32(-24))
}

/// Q4_K's 12 scale bytes of 4 rows, as the words (bytes 0..4, 4..8, 8..12) of each row in its
/// lane, decoded the way of `scalar::q4k_scale_min`: the 4 rows' scales of sub-blocks 0..4 and
/// 4..8 and mins of 0..4 and 4..8, byte j % 4 of each lane for sub-block j.
#[inline(always)]
unsafe fn q4k_scales_mins(w: [uint8x16_t; 3]) -> [uint8x16_t; 4] {
    let (m6, m4) = (vdupq_n_u8(0x3F), vdupq_n_u8(0x0F));
    let [w0, w1, w2] = w;
    [
        vandq_u8(w0, m6),
        vorrq_u8(vandq_u8(w2, m4), vshlq_n_u8::<4>(vshrq_n_u8::<6>(w0))),
        vandq_u8(w1, m6),
        vorrq_u8(vshrq_n_u8::<4>(w2), vshlq_n_u8::<4>(vshrq_n_u8::<6>(w1))),
    ]
}

/// A group's results as rows 0..4 and 4..8.
impl Lanes8 for [float32x4_t; 2] {
    #[inline(always)]
    unsafe fn to_array(self) -> [f32; GROUP_ROWS] {
        let (lo, hi) = (lanes(self[0]), lanes(self[1]));
        [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
    }
}

/// Q4_K: the 8 rows' (sumi, summ) of one super-block against T tokens (rows 0..4, 4..8).
#[inline(always)]
unsafe fn q4k_isums<const T: usize>(
    w: &BlockQ4Kx8,
    a: [&BlockQ8K; T],
) -> [[(int32x4_t, int32x4_t); 2]; T] {
    let m4 = vdupq_n_u8(0x0F);
    let words = w.scales.as_flattened();
    let mut sc = [[vdupq_n_u8(0); 2]; 2];
    let mut mn = [[vdupq_n_u8(0); 2]; 2];
    for h in 0..2 {
        let word = |i: usize| bytes16(words, 32 * i + 16 * h);
        [sc[0][h], sc[1][h], mn[0][h], mn[1][h]] = q4k_scales_mins([word(0), word(1), word(2)]);
    }
    let zero = vdupq_n_s32(0);
    let mut sums = [[(zero, zero); 2]; T];
    for c in 0..4 {
        // Sub-blocks 2c (low nibbles, activations 64c..) and 2c + 1 (high, 64c + 32..).
        let mut lo = [[zero; 2]; T];
        let mut hi = [[zero; 2]; T];
        // Token t's 64 activations of the two sub-blocks, 16 at a time.
        let y: [[int8x16_t; 4]; T] = std::array::from_fn(|t| {
            std::array::from_fn(|i| load16(sub16(&a[t].qs, 64 * c + 16 * i)))
        });
        for k in 0..8 {
            let x = rows8(&w.qs[8 * (8 * c + k)..8 * (8 * c + k) + 8]);
            let (ql, qh) = (x.map(|v| vandq_u8(v, m4)), x.map(|v| vshrq_n_u8::<4>(v)));
            for t in 0..T {
                let (ya, yb) = (y[t][k / 4], y[t][2 + k / 4]);
                for h in 0..2 {
                    lo[t][h] = sdot_by(lo[t][h], ql[h], ya, k % 4);
                    hi[t][h] = sdot_by(hi[t][h], qh[h], yb, k % 4);
                }
            }
        }
        let (j0, j1) = (2 * c, 2 * c + 1);
        for h in 0..2 {
            let (s0, s1) = (byte_of(sc[c / 2][h], j0 % 4), byte_of(sc[c / 2][h], j1 % 4));
            let (n0, n1) = (byte_of(mn[c / 2][h], j0 % 4), byte_of(mn[c / 2][h], j1 % 4));
            for t in 0..T {
                let b = a[t];
                let (sumi, summ) = &mut sums[t][h];
                *sumi = vmlaq_s32(vmlaq_s32(*sumi, lo[t][h], s0), hi[t][h], s1);
                *summ = vmlaq_n_s32(*summ, n0, b.bsum(2 * j0) + b.bsum(2 * j0 + 1));
                *summ = vmlaq_n_s32(*summ, n1, b.bsum(2 * j1) + b.bsum(2 * j1 + 1));
            }
        }
    }
    sums
}

impl Kernel8 for BlockQ4Kx8 {
    type Lanes = [float32x4_t; 2];

    /// `scalar::dot_q4_k_q8_k`'s float steps per lane: acc = fma(d * da, sumi, acc),
    /// accm = fma(dmin * da, summ, accm), acc - accm.
    #[inline(always)]
    unsafe fn group_dot<const T: usize>(
        w: &[BlockQ4Kx8],
        a: [&[BlockQ8K]; T],
    ) -> [[float32x4_t; 2]; T] {
        for t in &a {
            assert!(t.len() >= w.len());
        }
        let zero = vdupq_n_f32(0.0);
        let mut acc = [[zero; 2]; T];
        let mut accm = [[zero; 2]; T];
        for (b, x) in w.iter().enumerate() {
            let sums = q4k_isums::<T>(x, std::array::from_fn(|t| &a[t][b]));
            let (d, dmin) = (f16x8(&x.d), f16x8(&x.dmin));
            for t in 0..T {
                let da = vdupq_n_f32(a[t][b].d());
                for h in 0..2 {
                    let (sumi, summ) = sums[t][h];
                    acc[t][h] = vfmaq_f32(acc[t][h], vmulq_f32(d[h], da), vcvtq_f32_s32(sumi));
                    let dm = vmulq_f32(dmin[h], da);
                    accm[t][h] = vfmaq_f32(accm[t][h], dm, vcvtq_f32_s32(summ));
                }
            }
        }
        std::array::from_fn(|t| std::array::from_fn(|h| vsubq_f32(acc[t][h], accm[t][h])))
    }
}

/// Q6_K: the 8 rows' `sumi` of one super-block against T tokens (rows 0..4, 4..8): Σ_j sc_j *
/// (s_j - 32 * bsum_j), as `scalar::q6k_block_step`.
#[inline(always)]
unsafe fn q6k_isums<const T: usize>(w: &BlockQ6Kx8, a: [&BlockQ8K; T]) -> [[int32x4_t; 2]; T] {
    let words = w.scales.as_flattened();
    // Sub-block j's signed scale per row: byte j % 4 of word j / 4.
    let scale = |j: usize, h: usize| sbyte_of(bytes16(words, 32 * (j / 4) + 16 * h), j % 4);
    let zero = vdupq_n_s32(0);
    let mut sumi = [[zero; 2]; T];
    let mut corr = [[zero; 2]; T];
    for j in 0..16 {
        for (t, ct) in corr.iter_mut().enumerate() {
            for (h, c) in ct.iter_mut().enumerate() {
                *c = vmlaq_n_s32(*c, scale(j, h), a[t].bsum(j));
            }
        }
    }
    let (m4, m30) = (vdupq_n_u8(0x0F), vdupq_n_u8(0x30));
    for n in 0..2 {
        for half in 0..2 {
            // Quarter qq's positions 16 * half.. (chunks k = 4 * half..) are sub-block
            // 8n + 2qq + half: its activations are the 16 bytes at 128n + 32qq + 16 * half.
            let mut s = [[[zero; 2]; T]; 4];
            let y: [[int8x16_t; 4]; T] = std::array::from_fn(|t| {
                std::array::from_fn(|qq| load16(sub16(&a[t].qs, 128 * n + 32 * qq + 16 * half)))
            });
            for kk in 0..4 {
                let k = 4 * half + kk;
                let part = |p: usize| {
                    let at = GROUP_ROWS * q6k_part(n, k, p);
                    rows8(&w.q[at..at + GROUP_ROWS])
                };
                let (l0, l1, hb) = (part(0), part(1), part(2));
                for (qq, sq) in s.iter_mut().enumerate() {
                    // Quarter qq: the low (qq < 2) or high nibbles of ql part qq % 2, and bits
                    // 2qq..2qq + 2 of qh moved to bits 4..6 (the layout of `scalar::q6k_quant`).
                    let l = if qq % 2 == 0 { l0 } else { l1 };
                    let q: [uint8x16_t; 2] = std::array::from_fn(|h| {
                        let low = if qq < 2 {
                            vandq_u8(l[h], m4)
                        } else {
                            vshrq_n_u8::<4>(l[h])
                        };
                        let high = vshlq_u8(hb[h], vdupq_n_s8(4 - 2 * qq as i8));
                        vorrq_u8(low, vandq_u8(high, m30))
                    });
                    for t in 0..T {
                        for h in 0..2 {
                            sq[t][h] = sdot_by(sq[t][h], q[h], y[t][qq], kk);
                        }
                    }
                }
            }
            for (qq, sq) in s.iter().enumerate() {
                let j = 8 * n + 2 * qq + half;
                for h in 0..2 {
                    let sc = scale(j, h);
                    for t in 0..T {
                        sumi[t][h] = vmlaq_s32(sumi[t][h], sq[t][h], sc);
                    }
                }
            }
        }
    }
    for (st, ct) in sumi.iter_mut().zip(&corr) {
        for (s, &c) in st.iter_mut().zip(ct) {
            *s = vsubq_s32(*s, vshlq_n_s32::<5>(c));
        }
    }
    sumi
}

impl Kernel8 for BlockQ6Kx8 {
    type Lanes = [float32x4_t; 2];

    /// `scalar::q6k_block_step`'s float step per lane: acc = fma(d * da, sumi, acc).
    #[inline(always)]
    unsafe fn group_dot<const T: usize>(
        w: &[BlockQ6Kx8],
        a: [&[BlockQ8K]; T],
    ) -> [[float32x4_t; 2]; T] {
        for t in &a {
            assert!(t.len() >= w.len());
        }
        let mut acc = [[vdupq_n_f32(0.0); 2]; T];
        for (b, x) in w.iter().enumerate() {
            let sums = q6k_isums::<T>(x, std::array::from_fn(|t| &a[t][b]));
            let d = f16x8(&x.d);
            for t in 0..T {
                let da = vdupq_n_f32(a[t][b].d());
                for h in 0..2 {
                    let sumi = vcvtq_f32_s32(sums[t][h]);
                    acc[t][h] = vfmaq_f32(acc[t][h], vmulq_f32(d[h], da), sumi);
                }
            }
        }
        acc
    }
}

/// NEON + dotprod entry points (the dotprod and i8mm ISAs).
pub(crate) mod entry {
    use super::*;

    #[target_feature(enable = "neon,dotprod")]
    pub(crate) unsafe fn matvec<G: Kernel8>(m: X8<'_, G>, act: &[BlockQ8K], out: &mut [f32]) {
        matvec_groups(m, act, out)
    }

    #[target_feature(enable = "neon,dotprod")]
    pub(crate) unsafe fn matmul<G: Kernel8>(
        m: X8<'_, G>,
        acts: &[BlockQ8K],
        n_tokens: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        // 2 tokens per pass: with 8 rows per group, more would not stay in the 32 vector
        // registers.
        matmul_groups::<G, 2>(m, acts, n_tokens, out, out_stride)
    }
}

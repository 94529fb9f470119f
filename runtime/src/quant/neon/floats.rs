//! NEON float dots (F32, F16, BF16 weights, the 32-lane order of `scalar::dot_f32_lanes`) and
//! the f16 helpers of attention's KV cache.

use super::*;
/// 4 f16 (bits) to f32, exact (`fcvtl`; the f16 vector types of the intrinsics are unstable).
#[inline(always)]
pub(crate) unsafe fn f16x4_to_f32(h: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: a register-to-register conversion (base ARMv8 FP), no memory, no flags.
    asm!(
        "fcvtl {o:v}.4s, {i:v}.4h",
        o = lateout(vreg) out,
        i = in(vreg) h,
        options(pure, nomem, nostack, preserves_flags)
    );
    out
}

/// 4 f32 to f16 (bits), round to nearest even (`fcvtn` under the default FPCR).
#[inline(always)]
pub(crate) unsafe fn f32x4_to_f16(v: float32x4_t) -> uint16x4_t {
    let out: uint16x4_t;
    // SAFETY: as in `f16x4_to_f32`.
    asm!(
        "fcvtn {o:v}.4h, {i:v}.4s",
        o = lateout(vreg) out,
        i = in(vreg) v,
        options(pure, nomem, nostack, preserves_flags)
    );
    out
}

/// The 32-lane float dot of `scalar::dot_f32_lanes`, with `load_w(i)`/`load_x(i)` giving 4 f32
/// at element i: lane k of the 32 accumulates elements i = k (mod 32) with fma, then
/// ((l0..7 + l8..15) + (l16..23 + l24..31)), `scalar::hsum8`, and the tail in order.
#[inline(always)]
pub(super) unsafe fn dot_lanes(
    n: usize,
    load_w: impl Fn(usize) -> float32x4_t,
    load_x: impl Fn(usize) -> float32x4_t,
    tail: impl Fn(usize) -> (f32, f32),
) -> f32 {
    let mut acc = [vdupq_n_f32(0.0); 8];
    let full = n / 32 * 32;
    let mut i = 0;
    while i < full {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = vfmaq_f32(*a, load_w(i + 4 * k), load_x(i + 4 * k));
        }
        i += 32;
    }
    // s[0..4] and s[4..8] of the scalar reduction.
    let s_lo = vaddq_f32(vaddq_f32(acc[0], acc[2]), vaddq_f32(acc[4], acc[6]));
    let s_hi = vaddq_f32(vaddq_f32(acc[1], acc[3]), vaddq_f32(acc[5], acc[7]));
    let a = lanes(vaddq_f32(s_lo, s_hi));
    let mut r = (a[0] + a[2]) + (a[1] + a[3]);
    for j in full..n {
        let (w, x) = tail(j);
        r = w.mul_add(x, r);
    }
    r
}

/// 16 bytes at byte `at` of `b` (the caller keeps `at + 16 <= b.len()`).
#[inline(always)]
pub(super) unsafe fn bytes16(b: &[u8], at: usize) -> uint8x16_t {
    vld1q_u8(b[at..at + 16].as_ptr())
}

#[inline(always)]
pub(super) unsafe fn bytes8(b: &[u8], at: usize) -> uint8x8_t {
    vld1_u8(b[at..at + 8].as_ptr())
}

/// F32 weights · f32 activations, both as little-endian bytes of at least 4n.
#[inline(always)]
pub(super) unsafe fn dot_f32_impl(n: usize, w: &[u8], x: &[u8]) -> f32 {
    dot_lanes(
        n,
        |i| vreinterpretq_f32_u8(bytes16(w, 4 * i)),
        |i| vreinterpretq_f32_u8(bytes16(x, 4 * i)),
        |j| (scalar::f32_at(w, j), scalar::f32_at(x, j)),
    )
}

/// F16 weights · f32 activations.
#[inline(always)]
pub(super) unsafe fn dot_f16_impl(n: usize, w: &[u8], x: &[u8]) -> f32 {
    dot_lanes(
        n,
        |i| f16x4_to_f32(vreinterpret_u16_u8(bytes8(w, 2 * i))),
        |i| vreinterpretq_f32_u8(bytes16(x, 4 * i)),
        |j| (scalar::f16_at(w, j), scalar::f32_at(x, j)),
    )
}

/// BF16 weights · f32 activations (bf16 to f32 is the bits moved up by 16: exact).
#[inline(always)]
pub(super) unsafe fn dot_bf16_impl(n: usize, w: &[u8], x: &[u8]) -> f32 {
    dot_lanes(
        n,
        |i| {
            let h = vmovl_u16(vreinterpret_u16_u8(bytes8(w, 2 * i)));
            vreinterpretq_f32_u32(vshlq_n_u32::<16>(h))
        },
        |i| vreinterpretq_f32_u8(bytes16(x, 4 * i)),
        |j| (scalar::bf16_at(w, j), scalar::f32_at(x, j)),
    )
}

/// 4 f16 at element `at` of `y` as f32 (the caller keeps `at + 4 <= y.len()`).
#[inline(always)]
pub(super) unsafe fn f16s(y: &[f16], at: usize) -> float32x4_t {
    let h: &[f16; 4] = y[at..at + 4].try_into().expect("4 halves");
    // SAFETY: reads exactly the 8 bytes of `h` (f16 is 2 bytes, alignment 2, as u16).
    f16x4_to_f32(vld1_u16(h.as_ptr().cast()))
}

#[inline(always)]
pub(super) unsafe fn f32s(x: &[f32], at: usize) -> float32x4_t {
    let v: &[f32; 4] = x[at..at + 4].try_into().expect("4 floats");
    // SAFETY: reads exactly the 16 bytes of `v`.
    vld1q_f32(v.as_ptr())
}

#[inline(always)]
pub(super) unsafe fn dot_f32_f16_impl(x: &[f32], y: &[f16]) -> f32 {
    dot_lanes(
        x.len(),
        |i| f16s(y, i),
        |i| f32s(x, i),
        |j| (y[j].to_f32(), x[j]),
    )
}

#[inline(always)]
pub(super) unsafe fn f32_to_f16_row_impl(src: &[f32], dst: &mut [f16]) {
    let n = src.len().min(dst.len());
    let full = n / 4 * 4;
    for i in (0..full).step_by(4) {
        let h = f32x4_to_f16(f32s(src, i));
        let d: &mut [f16; 4] = (&mut dst[i..i + 4]).try_into().expect("4 halves");
        // SAFETY: writes exactly the 8 bytes of `d`.
        vst1_u16(d.as_mut_ptr().cast(), h);
    }
    scalar::f32_to_f16_row(&src[full..n], &mut dst[full..n]);
}

#[inline(always)]
pub(super) unsafe fn f16_to_f32_row_impl(src: &[f16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let full = n / 4 * 4;
    for i in (0..full).step_by(4) {
        let d: &mut [f32; 4] = (&mut dst[i..i + 4]).try_into().expect("4 floats");
        // SAFETY: writes exactly the 16 bytes of `d`.
        vst1q_f32(d.as_mut_ptr(), f16s(src, i));
    }
    scalar::f16_to_f32_row(&src[full..n], &mut dst[full..n]);
}

/// y += a * x, each element one fma (`scalar::axpy_f16`).
#[inline(always)]
pub(super) unsafe fn axpy_f16_impl(a: f32, x: &[f16], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let full = n / 4 * 4;
    let av = vdupq_n_f32(a);
    for i in (0..full).step_by(4) {
        let xv = f16s(x, i);
        let d: &mut [f32; 4] = (&mut y[i..i + 4]).try_into().expect("4 floats");
        // SAFETY: reads and writes exactly the 16 bytes of `d`.
        vst1q_f32(d.as_mut_ptr(), vfmaq_f32(vld1q_f32(d.as_ptr()), av, xv));
    }
    scalar::axpy_f16(a, &x[full..n], &mut y[full..n]);
}

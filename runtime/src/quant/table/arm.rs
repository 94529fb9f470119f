//! The aarch64 tables: NEON (the baseline), NEON + dotprod, NEON + dotprod + i8mm. Each ISA
//! has its integer multiply's kernels where it has them and the plainer ISA's elsewhere.

use super::*;
use crate::quant::neon::kquants::{dot as kq_dot, mm as kq_mm, plain as kq_plain};
use crate::quant::neon::{dot, mm, plain};
use crate::quant::{f32_gemm, neon};

/// Fills `t` with what `isa` (a NEON ISA) runs.
pub(super) fn fill(isa: Isa, t: &mut Table) {
    let sdot = matches!(isa, Isa::NeonDot | Isa::NeonI8mm);

    each!(ONE Q8_0, t.quantize => |s, d| plain::quantize_q8_0(s, blocks_of_mut(d)));
    each!(ONE Q8_1, t.quantize => |s, d| plain::quantize_q8_1(s, blocks_of_mut(d)));
    each!(ONE Q8_K, t.quantize => |s, d| plain::quantize_q8_k(s, blocks_of_mut(d)));

    // Decode: dots of every quantized format; matrix-vector tiles for the 32-element ones (the
    // K-quants' matvecs go row by row over their dots).
    if sdot {
        each!(BLOCK32, t.dot, B => |_, w, a| dot::vec_dot::<B>(blocks_of(w), blocks_of(a)));
        each!(KQUANT, t.dot, B => |_, w, a| kq_dot::dot::<B>(blocks_of(w), blocks_of(a)));
        each!(BLOCK32, t.matvec, B =>
            |g, a, o| dot::matvec::<B>(g.neon_rows(), blocks_of(a), o));
        each!(BLOCK32, t.matvec_rows, B =>
            |g, p, a, o| dot::matvec_rows::<B>(g.neon_rows(), p, blocks_of(a), o));
    } else {
        each!(BLOCK32, t.dot, B => |_, w, a| plain::vec_dot::<B>(blocks_of(w), blocks_of(a)));
        each!(KQUANT, t.dot, B => |_, w, a| kq_plain::dot::<B>(blocks_of(w), blocks_of(a)));
        each!(BLOCK32, t.matvec, B =>
            |g, a, o| plain::matvec::<B>(g.neon_rows(), blocks_of(a), o));
        each!(BLOCK32, t.matvec_rows, B =>
            |g, p, a, o| plain::matvec_rows::<B>(g.neon_rows(), p, blocks_of(a), o));
    }
    each!(ONE F32, t.dot => |n, w, a| plain::dot_f32(n, w, a));
    each!(ONE F16, t.dot => |n, w, a| plain::dot_f16(n, w, a));
    each!(ONE BF16, t.dot => |n, w, a| plain::dot_bf16(n, w, a));

    // Prefill's 4x4 tiles: `smmla` with i8mm, `sdot` with dotprod, else `smull`/`sadalp`.
    match isa {
        Isa::NeonI8mm => {
            each!(BLOCK32, t.matmul, B =>
                |g, a, n, o, s| mm::matmul::<B>(g.neon_rows(), blocks_of(a), n, o, s));
            each!(KQUANT, t.matmul, B =>
                |g, a, n, o, s| kq_mm::matmul::<B>(g.neon_rows(), blocks_of(a), n, o, s));
        }
        Isa::NeonDot => {
            each!(BLOCK32, t.matmul, B =>
                |g, a, n, o, s| dot::matmul::<B>(g.neon_rows(), blocks_of(a), n, o, s));
            each!(KQUANT, t.matmul, B =>
                |g, a, n, o, s| kq_dot::matmul::<B>(g.neon_rows(), blocks_of(a), n, o, s));
        }
        _ => {
            each!(BLOCK32, t.matmul, B =>
                |g, a, n, o, s| plain::matmul::<B>(g.neon_rows(), blocks_of(a), n, o, s));
            each!(KQUANT, t.matmul, B =>
                |g, a, n, o, s| kq_plain::matmul::<B>(g.neon_rows(), blocks_of(a), n, o, s));
        }
    }

    // Q4_K and Q6_K interleaved 8 by 8: `sdot` by element, so dotprod only.
    if sdot {
        use neon::x8::entry as x8;
        each!(X8, t.matvec_x8, G =>
            |w, (off, nb), a, o| x8::matvec(interleave::x8_of::<G>(w, off, nb), blocks_of(a), o));
        each!(X8, t.matmul_x8, G => |w, (off, nb), a, n, o, s| {
            x8::matmul(interleave::x8_of::<G>(w, off, nb), blocks_of(a), n, o, s)
        });
    }

    // Sparse rows of the 32-element formats (float rows are scaled and added in scalar code).
    each!(BLOCK32, t.axpy_rows, B =>
        |g, i, c, o| plain::axpy_rows::<B>(g.neon_rows(), i, c, o));

    t.gemm_f32 = Some(f32_gemm::arm::gemm_neon);
    t.f16 = F16Fns {
        f32_to_f16: plain::f32_to_f16_row,
        f16_to_f32: plain::f16_to_f32_row,
        dot_f32_f16: plain::dot_f32_f16,
        axpy_f16: plain::axpy_f16,
    };
}

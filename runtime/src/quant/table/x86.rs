//! The x86-64 tables: AVX2, AVX-VNNI and AVX-512 VNNI (each implies AVX2 + FMA + F16C, so
//! every ISA here shares the AVX2 kernels where it has nothing wider).

use super::*;
use crate::quant::avx2::kquants::entry as kq;
use crate::quant::avx2::{plain, vnni};
use crate::quant::avx512::narrow;
use crate::quant::{avx2, avx512, f32_gemm, gemm};

/// Fills `t` with what `isa` (an x86-64 SIMD ISA) runs.
pub(super) fn fill(isa: Isa, t: &mut Table) {
    let wide = isa == Isa::Avx512Vnni;

    each!(ONE Q8_0, t.quantize => |s, d| plain::quantize_q8_0(s, blocks_of_mut(d)));
    each!(ONE Q8_1, t.quantize => |s, d| plain::quantize_q8_1(s, blocks_of_mut(d)));
    each!(ONE Q8_K, t.quantize => |s, d| plain::quantize_q8_k(s, blocks_of_mut(d)));

    // Decode's dots and matrix-vector products: the 32-element formats on the ISA's int8
    // multiply, the Q8_K-dotted ones on `vpmaddubsw` everywhere.
    match isa {
        Isa::AvxVnni => {
            each!(BLOCK32, t.dot, B => |_, w, a| vnni::vec_dot::<B>(blocks_of(w), blocks_of(a)));
            each!(BLOCK32, t.matvec, B => |g, a, o| vnni::matvec::<B>(g.rows(), blocks_of(a), o));
            each!(BLOCK32, t.matvec_rows, B =>
                |g, p, a, o| vnni::matvec_rows::<B>(g.rows(), p, blocks_of(a), o));
        }
        Isa::Avx512Vnni => {
            each!(BLOCK32, t.dot, B => |_, w, a| narrow::vec_dot::<B>(blocks_of(w), blocks_of(a)));
            each!(BLOCK32, t.matvec, B =>
                |g, a, o| narrow::matvec::<B>(g.rows(), blocks_of(a), o));
            each!(BLOCK32, t.matvec_rows, B =>
                |g, p, a, o| narrow::matvec_rows::<B>(g.rows(), p, blocks_of(a), o));
        }
        _ => {
            each!(BLOCK32, t.dot, B => |_, w, a| plain::vec_dot::<B>(blocks_of(w), blocks_of(a)));
            each!(BLOCK32, t.matvec, B => |g, a, o| plain::matvec::<B>(g.rows(), blocks_of(a), o));
            each!(BLOCK32, t.matvec_rows, B =>
                |g, p, a, o| plain::matvec_rows::<B>(g.rows(), p, blocks_of(a), o));
        }
    }
    each!(KQUANT, t.dot, B => |_, w, a| kq::vec_dot::<B>(blocks_of(w), blocks_of(a)));
    each!(KQUANT, t.matvec, B => |g, a, o| kq::matvec::<B>(g.rows(), blocks_of(a), o));
    each!(KQUANT, t.matvec_rows, B =>
        |g, p, a, o| kq::matvec_rows::<B>(g.rows(), p, blocks_of(a), o));
    each!(ONE F32, t.dot => |n, w, a| plain::dot_f32(n, w, a));
    each!(ONE F16, t.dot => |n, w, a| plain::dot_f16(n, w, a));
    each!(ONE BF16, t.dot => |n, w, a| plain::dot_bf16(n, w, a));

    // Prefill: the packed GEMMs from PACKED_MIN_TOKENS tokens on, the 4x4 tiles below.
    match isa {
        Isa::Avx512Vnni => each!(BLOCK32, t.matmul, B => |g, a, n, o, s| {
            if n >= PACKED_MIN_TOKENS {
                avx512::matmul_packed16::<B>(g.rows(), blocks_of(a), n, o, s)
            } else {
                narrow::matmul::<B>(g.rows(), blocks_of(a), n, o, s)
            }
        }),
        Isa::AvxVnni => each!(BLOCK32, t.matmul, B => |g, a, n, o, s| {
            if n >= PACKED_MIN_TOKENS {
                gemm::matmul_vnni::<B>(g.rows(), blocks_of(a), n, o, s)
            } else {
                vnni::matmul::<B>(g.rows(), blocks_of(a), n, o, s)
            }
        }),
        // Without VNNI the packed scheme sums in i16: 4- and 5-bit weights only
        // (`gemm::i16_groups`); 8-bit ones take the 4x4 tiles there.
        _ => each!(BLOCK32, t.matmul, B => |g, a, n, o, s| {
            if n >= PACKED_MIN_TOKENS {
                gemm::matmul_avx2::<B>(g.rows(), blocks_of(a), n, o, s)
            } else {
                plain::matmul::<B>(g.rows(), blocks_of(a), n, o, s)
            }
        }),
    }
    each!(KQUANT, t.matmul, B => |g, a, n, o, s| kq::matmul::<B>(g.rows(), blocks_of(a), n, o, s));
    if wide {
        // Q4_K and Q6_K in file layout take the interleaved kernels' unpacked blocks, their
        // rows packed into groups on the way (the same bits).
        each!(ONE Q4_K, t.matmul => |g, a, n, o, s| if n >= avx512::UNPACK_ONCE_FROM {
            avx512::x8::matmul_rows::<BlockQ4Kx8>(g.rows(), blocks_of(a), n, o, s)
        } else {
            kq::matmul::<BlockQ4K>(g.rows(), blocks_of(a), n, o, s)
        });
        each!(ONE Q6_K, t.matmul => |g, a, n, o, s| if n >= avx512::UNPACK_ONCE_FROM {
            avx512::x8::matmul_rows::<BlockQ6Kx8>(g.rows(), blocks_of(a), n, o, s)
        } else {
            kq::matmul::<BlockQ6K>(g.rows(), blocks_of(a), n, o, s)
        });
    }

    // Q4_K and Q6_K interleaved 8 by 8.
    if wide {
        use avx512::x8;
        each!(X8, t.matvec_x8, G =>
            |w, (off, nb), a, o| x8::matvec(interleave::x8_of::<G>(w, off, nb), blocks_of(a), o));
        each!(X8, t.matmul_x8, G => |w, (off, nb), a, n, o, s| {
            x8::matmul(interleave::x8_of::<G>(w, off, nb), blocks_of(a), n, o, s)
        });
    } else {
        use avx2::x8::entry as x8;
        each!(X8, t.matvec_x8, G =>
            |w, (off, nb), a, o| x8::matvec(interleave::x8_of::<G>(w, off, nb), blocks_of(a), o));
        each!(X8, t.matmul_x8, G => |w, (off, nb), a, n, o, s| {
            x8::matmul(interleave::x8_of::<G>(w, off, nb), blocks_of(a), n, o, s)
        });
    }

    // Sparse rows, scaled and added.
    if wide {
        each!(BLOCK32, t.axpy_rows, B => |g, i, c, o| avx512::axpy_rows::<B>(g.rows(), i, c, o));
    } else {
        each!(BLOCK32, t.axpy_rows, B => |g, i, c, o| plain::axpy_rows::<B>(g.rows(), i, c, o));
    }
    each!(ONE F32, t.axpy_rows => |g, i, c, o| plain::axpy_rows_f32(g.data, g.stride, i, c, o));
    each!(ONE F16, t.axpy_rows => |g, i, c, o| plain::axpy_rows_f16(g.data, g.stride, i, c, o));
    each!(ONE BF16, t.axpy_rows =>
        |g, i, c, o| plain::axpy_rows_bf16(g.data, g.stride, i, c, o));

    t.gemm_f32 = Some(if wide {
        f32_gemm::x86::gemm_avx512
    } else {
        f32_gemm::x86::gemm_avx2
    });
    t.f16 = F16Fns {
        f32_to_f16: plain::f32_to_f16_row,
        f16_to_f32: plain::f16_to_f32_row,
        dot_f32_f16: plain::dot_f32_f16,
        axpy_f16: plain::axpy_f16,
    };
}

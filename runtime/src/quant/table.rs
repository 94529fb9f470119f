//! The kernel table: for each (operation, type), the function this CPU runs, filled once per
//! ISA (`table/x86.rs`, `table/arm.rs`) and shared by every [`Kernels`] of that ISA.
//!
//! [`Kernels`]'s safe methods check sizes and then call the table's entry. An empty entry means
//! the ISA has no kernel of its own for that pair: the method takes its generic path (row by
//! row dots, or the scalar code), which gives the same bits, only slower, and records it
//! (`audit.rs`), so `tests/coverage.rs` fails on a pair that falls back unlisted. The f16
//! helpers of attention have an entry on every ISA (the scalar functions on `Scalar`).
//!
//! Entries are `unsafe fn`: they may use instructions the CPU must have. A table is only
//! reachable through a `Kernels` built for an ISA this CPU was detected to have
//! ([`Kernels::with_isa`]), and only after the safe wrapper checked every length the entry
//! reads, which is what makes each call sound.

use super::*;
use std::sync::OnceLock;

#[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
mod arm;
#[cfg(all(target_arch = "x86_64", not(conductor_portable)))]
mod x86;

/// Quantizes activations: f32 in, the activation type's blocks (as bytes) out.
pub(super) type QuantizeFn = unsafe fn(&[f32], &mut [u8]);
/// `vec_dot(n, weights, activations)`.
pub(super) type DotFn = unsafe fn(usize, &[u8], &[u8]) -> f32;
/// `matvec(rows, activations, out)`.
pub(super) type MatvecFn = unsafe fn(Geometry<'_>, &[u8], &mut [f32]);
/// `matvec_rows(rows, picked rows, activations, out)`.
pub(super) type RowsFn = unsafe fn(Geometry<'_>, &[u32], &[u8], &mut [f32]);
/// `matmul(rows, activations, n_tokens, out, out_stride)`.
pub(super) type MatmulFn = unsafe fn(Geometry<'_>, &[u8], usize, &mut [f32], usize);
/// `matvec` of an interleaved matrix: (matrix, its super-blocks `(off, nb)`, act, out).
pub(super) type X8MatvecFn = unsafe fn(&MatRef<'_>, (usize, usize), &[u8], &mut [f32]);
/// `matmul` of an interleaved matrix: as [`X8MatvecFn`] with `n_tokens` and `out_stride`.
pub(super) type X8MatmulFn =
    unsafe fn(&MatRef<'_>, (usize, usize), &[u8], usize, &mut [f32], usize);
/// `axpy_rows_add(rows, neurons, coefs, out)`.
pub(super) type AxpyFn = unsafe fn(Geometry<'_>, &[u32], &[f32], &mut [f32]);
/// `gemm_f32(shape, a, b's data, c)` with `b` row-major.
pub(super) type GemmF32Fn = unsafe fn(f32_gemm::Shape, F32Matrix<'_>, &[f32], &mut [f32]);

/// Number of [`GgmlType`] variants: the length of a per-type row.
const TYPES: usize = GgmlType::Q2_0 as usize + 1;

/// One operation's entries, indexed by type.
pub(super) struct PerType<F>([Option<F>; TYPES]);

impl<F: Copy> PerType<F> {
    const EMPTY: Self = PerType([None; TYPES]);

    /// The entry for `ty`, if the ISA has one.
    #[inline(always)]
    pub(super) fn get(&self, ty: GgmlType) -> Option<F> {
        self.0[ty as usize]
    }

    #[cfg_attr(
        not(all(
            any(target_arch = "x86_64", target_arch = "aarch64"),
            not(conductor_portable)
        )),
        allow(dead_code)
    )]
    fn set(&mut self, ty: GgmlType, f: F) {
        self.0[ty as usize] = Some(f);
    }
}

/// Attention's f16 helpers (no type to index by: one function each).
#[derive(Clone, Copy)]
pub(super) struct F16Fns {
    pub(super) f32_to_f16: unsafe fn(&[f32], &mut [f16]),
    pub(super) f16_to_f32: unsafe fn(&[f16], &mut [f32]),
    pub(super) dot_f32_f16: unsafe fn(&[f32], &[f16]) -> f32,
    pub(super) axpy_f16: unsafe fn(f32, &[f16], &mut [f32]),
}

/// What one ISA runs for each operation.
pub(super) struct Table {
    /// Indexed by the activation type (Q8_0, Q8_1, Q8_K).
    pub(super) quantize: PerType<QuantizeFn>,
    pub(super) dot: PerType<DotFn>,
    pub(super) matvec: PerType<MatvecFn>,
    pub(super) matvec_rows: PerType<RowsFn>,
    pub(super) matmul: PerType<MatmulFn>,
    pub(super) matvec_x8: PerType<X8MatvecFn>,
    pub(super) matmul_x8: PerType<X8MatmulFn>,
    pub(super) axpy_rows: PerType<AxpyFn>,
    pub(super) gemm_f32: Option<GemmF32Fn>,
    pub(super) f16: F16Fns,
}

impl Table {
    /// No kernel of its own for any pair: every operation takes its generic path.
    fn generic() -> Table {
        Table {
            quantize: PerType::EMPTY,
            dot: PerType::EMPTY,
            matvec: PerType::EMPTY,
            matvec_rows: PerType::EMPTY,
            matmul: PerType::EMPTY,
            matvec_x8: PerType::EMPTY,
            matmul_x8: PerType::EMPTY,
            axpy_rows: PerType::EMPTY,
            gemm_f32: None,
            f16: F16Fns {
                f32_to_f16: scalar::f32_to_f16_row,
                f16_to_f32: scalar::f16_to_f32_row,
                dot_f32_f16: scalar::dot_f32_f16,
                axpy_f16: scalar::axpy_f16,
            },
        }
    }

    /// The table of `isa`, built on first use. The caller has checked that this CPU has `isa`.
    pub(super) fn of(isa: Isa) -> &'static Table {
        const ISAS: usize = 7;
        static TABLES: [OnceLock<Table>; ISAS] = [const { OnceLock::new() }; ISAS];
        TABLES[isa as usize].get_or_init(|| {
            #[allow(unused_mut)] // filled in only on the targets with SIMD kernels
            let mut table = Table::generic();
            #[cfg(all(target_arch = "x86_64", not(conductor_portable)))]
            if isa != Isa::Scalar {
                x86::fill(isa, &mut table);
            }
            #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
            if isa != Isa::Scalar {
                arm::fill(isa, &mut table);
            }
            table
        })
    }
}

/// `$slot.set(ty, |args| unsafe { body })` for each type of a family, with `$B` naming that
/// type's block in the body: `each!(BLOCK32, table.dot, B => |_, w, a| plain::vec_dot::<B>(..))`.
/// The families: `BLOCK32` (the 32-element formats, generic kernels over the block), `KQUANT`
/// (dotted with Q8_K: the K-quants and IQ4_XS), `X8` (the interleaved groups of Q4_K, Q6_K).
///
/// The `unsafe` block each entry gets is sound as the module documentation says: an entry is
/// called only through a `Kernels` of a detected ISA, after its wrapper checked the sizes.
#[cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(conductor_portable)
))]
macro_rules! each {
    (@set $slot:expr, $ty:ident, $block:ty, $B:ident, |$($arg:pat_param),*| $body:expr) => {{
        type $B = $block;
        $slot.set(GgmlType::$ty, |$($arg),*| unsafe { $body });
    }};
    (BLOCK32, $slot:expr, $B:ident => $($f:tt)*) => {{
        each!(@set $slot, Q4_0, BlockQ4_0, $B, $($f)*);
        each!(@set $slot, Q4_1, BlockQ4_1, $B, $($f)*);
        each!(@set $slot, Q8_0, BlockQ8_0, $B, $($f)*);
        each!(@set $slot, Q5_0, BlockQ5_0, $B, $($f)*);
        each!(@set $slot, Q5_1, BlockQ5_1, $B, $($f)*);
        each!(@set $slot, IQ4_NL, BlockIQ4NL, $B, $($f)*);
    }};
    (KQUANT, $slot:expr, $B:ident => $($f:tt)*) => {{
        each!(@set $slot, Q2_K, BlockQ2K, $B, $($f)*);
        each!(@set $slot, Q3_K, BlockQ3K, $B, $($f)*);
        each!(@set $slot, Q4_K, BlockQ4K, $B, $($f)*);
        each!(@set $slot, Q5_K, BlockQ5K, $B, $($f)*);
        each!(@set $slot, Q6_K, BlockQ6K, $B, $($f)*);
        each!(@set $slot, IQ4_XS, BlockIQ4XS, $B, $($f)*);
    }};
    (X8, $slot:expr, $B:ident => $($f:tt)*) => {{
        each!(@set $slot, Q4_K, BlockQ4Kx8, $B, $($f)*);
        each!(@set $slot, Q6_K, BlockQ6Kx8, $B, $($f)*);
    }};
    (ONE $ty:ident, $slot:expr => |$($arg:pat_param),*| $body:expr) => {{
        $slot.set(GgmlType::$ty, |$($arg),*| unsafe { $body });
    }};
}
#[cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(conductor_portable)
))]
use each;

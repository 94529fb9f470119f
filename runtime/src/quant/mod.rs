//! Block formats and the kernels that compute with them.
//!
//! Weight types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL (32-element blocks),
//! Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS (256-element super-blocks). Each quantized weight type
//! is dotted with activations quantized to [`activation_type`] (Q8_0, Q8_1 or Q8_K, as ggml's
//! `vec_dot_type`); F16/BF16/F32 weights dot with f32 activations (passed as little-endian
//! bytes).
//!
//! # Numerics
//! * Activation quantization reproduces ggml's (x86/ARM SIMD) `quantize_row_q8_0/q8_1` and
//!   `quantize_row_q8_K_ref` bit for bit: Q8_0/Q8_1 d = amax/127, q = round-half-even(x * 127/amax),
//!   Q8_1 s = d * sum(q) with the f32 d; Q8_K d = 1/iscale with iscale = -127/max (max the signed
//!   value of largest magnitude), bsums per 16.
//! * Every dot product is defined by its `scalar.rs` function: per block an exact integer sum,
//!   then `acc = fma(dw * da, isum, acc)` block by block (Q4_1, Q5_1, Q2_K, Q4_K and Q5_K keep
//!   their min term in a second chain). All ISA paths, `vec_dot`, `matvec` and `matmul` reproduce those float steps,
//!   so results are bit-identical across ISAs, across row groupings and token counts.
//! * F32/F16/BF16 dots use 32 fma lanes with a fixed reduction tree (`scalar::dot_f32_lanes`).
//! * [`Kernels::axpy_rows`] (sparse FFN decode) is defined by `scalar::axpy_rows`: per output
//!   element one `fma(coef, x, acc)` per neuron in neuron order from +0.0, x exactly
//!   `dequantize_row`'s value (computed as exact `d * q`, Q4_1/Q5_1 `fma(d, q, m)`); every ISA
//!   gives the same bits.
//!
//! # Files
//! `format.rs`: the format API (`quantize_row`, `dequantize_row`, `row_bytes`,
//! [`activation_type`], `transpose_requantize`). `matrix.rs`: [`MatRef`] and its [`Layout`].
//! `isa.rs`: [`Isa`] and its detection. `table.rs`: the kernel table, for each (operation,
//! type) the function an ISA runs, built once per ISA (`table/x86.rs`, `table/arm.rs`). This
//! file: [`Kernels`], whose safe methods check sizes and call the table's entry: the decode
//! dots here, the rest in `dispatch/` (prefill's `matmul`, the interleaved layout's products,
//! sparse rows' `axpy_rows`, the f16 helpers). `audit.rs`: where an empty entry sent an
//! operation down its generic path, held to a written list by `tests/coverage.rs`.
//!
//! # ISA paths (files)
//! * `scalar.rs`: portable reference; the only path on targets other than x86-64 and aarch64
//!   (and with `--cfg conductor_portable`, which builds the crate as those targets see it). Q5_0, Q5_1
//!   and IQ4_NL in `scalar/blocks32.rs`; Q2_K, Q3_K, Q5_K, IQ4_XS and BF16 in
//!   `scalar/kquants.rs`.
//! * `avx2.rs`: AVX2+FMA+F16C kernels (activation quantizers, float dots, f16 helpers) and the
//!   4-row matvec / 4x4 matmul tiles of the 32-element formats, generic over the int8 multiply: AVX2
//!   `vpmaddubsw`, AVX-VNNI `vpdpbusd`, or its EVEX form (`avx512.rs`); its sparse rows
//!   (`axpy_rows`) in `avx2/axpy.rs`, its activation quantizers in `avx2/quantize.rs`; Q5_0,
//!   Q5_1 and IQ4_NL join the 32-element tiles and sparse rows through `avx2/blocks32.rs`
//!   (and `avx512/blocks32.rs` for the 512-bit sparse rows). The Q8_K-dotted formats (K-quants,
//!   IQ4_XS) have their own 4-row matvec / 4x4 matmul tiles in `avx2/kquants.rs` (`vpmaddubsw`
//!   on every SIMD ISA). Decode reads rows of a kilobyte or more one after another, not 4 side
//!   by side (`Rows::long_rows`, `tile_seq`, `ktile_seq`), and keep what the float steps need
//!   (folded integer sums, f16 scales) in a small scratch so the weights are read once: the same
//!   bits, 2-3x the bandwidth on 1B-class matrices.
//! * `interleave.rs` + `avx2/q4k_x8.rs`, `avx2/q6k_x8.rs` (the row and token loops in
//!   `interleave.rs`, shared with `neon/x8.rs`): Q4_K and Q6_K rows interleaved 8 by 8
//!   ([`Layout::X8`], the same bytes rearranged; a model does it in place at load,
//!   `Model::laid_out`). One i32 lane per row: a 32-byte load holds 8
//!   rows' quants, each 4 activation bytes are broadcast, the scales are decoded for 8 rows at
//!   once; no per-row shuffles or reductions. Q4_K about twice the in-cache rate of the 4-row
//!   kernel, Q6_K about 1.1-1.2x; the same bits (each lane does its row's scalar steps).
//!   With AVX-512 VNNI, their matvec and matmul are `avx512/q4k_x8.rs`, `avx512/q6k_x8.rs`:
//!   64-byte loads of two chunks of the 8 rows, `vpdpbusd` on zmm, the sub-block sums scaled
//!   in i16 by `vpdpwssd`.
//!   On aarch64 with dotprod, `neon/x8.rs` does the same with `sdot` by element (4 rows' 4
//!   quants per 16-byte load, times one broadcast activation chunk). Without such a kernel
//!   (scalar, plain NEON, `matvec_rows`) rows are taken back out of the groups and dotted as
//!   usual, and the engine does not interleave ([`Kernels::has_interleaved_kernels`]).
//! * `gemm.rs`: prefill GEMM on row-interleaved repacked weights (8 rows per ymm), used from
//!   8 tokens on (on plain AVX2 for the 4- and 5-bit formats, whose products fit its i16
//!   sums, 4 or 8 groups at a time). `avx512.rs`: the same with 16 rows per zmm.
//! * `f16_rows.rs`: attention's products over a tile of f16 cache rows (the same bits).
//! * `f32_gemm.rs`: [`Kernels::gemm_f32`], the float GEMM the predictors train with (AVX2,
//!   AVX-512 and NEON tiles; each output one fma chain in order, so every ISA gives the same
//!   bits).
//! * `neon.rs` (aarch64): activation quantizers (Q8_0, Q8_1, Q8_K); dot, 4-row matvec, sparse
//!   rows, 4x4 matmul tiles and `axpy_rows` of the 32-element formats; Q2_K, Q3_K, Q4_K, Q5_K,
//!   Q6_K and IQ4_XS dots (their matvec and matmul are the per-row loop over those dots, but
//!   for Q4_K and Q6_K interleaved, above); the float dots and f16 helpers. Generic over the
//!   int8 multiply: plain NEON `smull`/`sadalp`, or dotprod `sdot` (inline asm; `vdotq_s32` is
//!   not stable); with i8mm the 32-element formats' 4x4 matmul tiles are `smmla` 2x2 tiles
//!   (inline asm). Float `axpy_rows` stays scalar there.
//!
//! [`Kernels::best`] picks AVX512-VNNI, else AVX-VNNI, else AVX2, else scalar on x86-64; on
//! aarch64 NEON+dotprod+i8mm, else NEON+dotprod, else NEON; the table of that ISA is built
//! then, once.
//!
//! # Contracts
//! Format functions ([`quantize_row`], [`dequantize_row`]) return [`QuantError`] on unsupported
//! types or wrong lengths. The [`Kernels`] methods are on the hot path and *panic* on a contract
//! violation (wrong lengths, unaligned column range, unsupported type); the checks are O(1) per
//! call. No length is ever trusted without a check, so a violation cannot read out of bounds.

mod blocks;
mod f16_rows;
mod f32_gemm;
mod format;
mod ggml_type;
pub mod interleave;
mod isa;
mod matrix;
mod scalar;

#[cfg(all(target_arch = "x86_64", not(conductor_portable)))]
mod avx2;
#[cfg(all(target_arch = "x86_64", not(conductor_portable)))]
mod avx512;
#[cfg(all(target_arch = "x86_64", not(conductor_portable)))]
mod gemm;
#[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
pub(crate) mod neon;

/// From this many tokens on, `matmul` repacks weight rows (see `gemm.rs`); below it the repack
/// is not amortized and the 4x4 tile kernel is used. Both give identical bits.
#[cfg(all(target_arch = "x86_64", not(conductor_portable)))]
const PACKED_MIN_TOKENS: usize = 8;

mod audit;
mod dispatch;
mod table;
#[cfg(test)]
mod tests;

pub use blocks::{
    BlockIQ4NL, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4Kx8, BlockQ4_0, BlockQ4_1,
    BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ6Kx8, BlockQ8K, BlockQ8_0, BlockQ8_1,
};
pub use f32_gemm::F32Matrix;
pub use format::{
    activation_type, dequantize_row, quantize_row, row_bytes, transpose_requantize,
    transpose_requantize_cols, try_activation_type, QuantError,
};
pub use ggml_type::GgmlType;
pub use isa::Isa;
pub use matrix::{Layout, MatRef};

#[cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(conductor_portable)
))]
use format::blocks_of_mut;
use format::{axpy_type, blocks_of};

use blocks::as_bytes;
use half::f16;
use std::ops::Range;

/// The compute kernels, bound to one ISA: its kernel table (`table.rs`), built once, holds the
/// function this CPU runs for each (operation, type). Copy it freely; construction is the only
/// place the CPU is checked, so a `Kernels` with a SIMD ISA exists only on a CPU that has it.
#[derive(Clone, Copy)]
pub struct Kernels {
    isa: Isa,
    table: &'static table::Table,
}

impl PartialEq for Kernels {
    fn eq(&self, other: &Kernels) -> bool {
        self.isa == other.isa
    }
}

impl Eq for Kernels {}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels").field("isa", &self.isa).finish()
    }
}

/// Validated matvec/matmul geometry, shared by all ISAs.
#[derive(Clone, Copy)]
struct Geometry<'a> {
    ty: GgmlType,
    data: &'a [u8],
    stride: usize,
    off: usize,
    nb: usize,
    ncols: usize,
    #[cfg_attr(
        not(all(
            any(target_arch = "x86_64", target_arch = "aarch64"),
            not(conductor_portable)
        )),
        allow(dead_code)
    )]
    rows: usize,
}

impl<'a> Geometry<'a> {
    fn row(&self, r: usize) -> &'a [u8] {
        let start = r * self.stride + self.off;
        let len = self.ty.type_size() * self.nb;
        &self.data[start..start + len]
    }

    #[cfg(all(target_arch = "x86_64", not(conductor_portable)))]
    fn rows(&self) -> avx2::Rows<'a> {
        avx2::Rows {
            data: self.data,
            stride: self.stride,
            off: self.off,
            nb: self.nb,
            rows: self.rows,
        }
    }

    #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
    fn neon_rows(&self) -> neon::Rows<'a> {
        neon::Rows {
            data: self.data,
            stride: self.stride,
            off: self.off,
            nb: self.nb,
            rows: self.rows,
        }
    }
}

impl Kernels {
    /// The fastest ISA this CPU supports (detected once).
    pub fn best() -> Kernels {
        static BEST: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            [
                Isa::Avx512Vnni,
                Isa::AvxVnni,
                Isa::Avx2,
                #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
                Isa::NeonI8mm,
                #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
                Isa::NeonDot,
                #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
                Isa::Neon,
            ]
            .into_iter()
            .find_map(Kernels::with_isa)
            .unwrap_or_else(Kernels::scalar)
        })
    }

    /// The portable reference kernels.
    pub fn scalar() -> Kernels {
        Kernels {
            isa: Isa::Scalar,
            table: table::Table::of(Isa::Scalar),
        }
    }

    /// Kernels for `isa`, if this CPU supports it.
    pub fn with_isa(isa: Isa) -> Option<Kernels> {
        isa.is_available().then(|| Kernels {
            isa,
            table: table::Table::of(isa),
        })
    }

    /// Every ISA this CPU supports (for tests and benchmarks).
    pub fn available() -> Vec<Kernels> {
        [
            Isa::Scalar,
            Isa::Avx2,
            Isa::AvxVnni,
            Isa::Avx512Vnni,
            #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
            Isa::Neon,
            #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
            Isa::NeonDot,
            #[cfg(all(target_arch = "aarch64", not(conductor_portable)))]
            Isa::NeonI8mm,
        ]
        .into_iter()
        .filter_map(Kernels::with_isa)
        .collect()
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Whether these kernels read [`Layout::X8`] matrices with an interleaved kernel (x86-64
    /// SIMD, NEON with dotprod): the gate of `matvec_x8`/`matmul_x8`, and of the engine's
    /// interleaving at load. Elsewhere each row is taken back out of its group per product,
    /// which is slower than the file's layout: a model is interleaved at load only where this
    /// holds (the results are the same bits either way).
    pub fn has_interleaved_kernels(&self) -> bool {
        self.table.matvec_x8.get(GgmlType::Q4_K).is_some()
    }

    /// Quantizes an activation vector into `activation_type(weight)` (f32 bytes for F16/F32).
    ///
    /// # Panics
    /// If `weight` is unsupported, `src.len()` is not a whole number of activation blocks, or
    /// `dst.len()` is not exactly the activation row size.
    pub fn quantize_activations(&self, weight: GgmlType, src: &[f32], dst: &mut [u8]) {
        let at = activation_type(weight);
        let bytes = row_bytes(at, src.len()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(dst.len(), bytes, "activation buffer size for {weight}");
        if let Some(quantize) = self.table.quantize.get(at) {
            // SAFETY: the table is this CPU's (`table.rs`); `dst` was checked to hold exactly
            // the activation blocks of `src`, a whole number of them.
            return unsafe { quantize(src, dst) };
        }
        if at != GgmlType::F32 {
            audit::fallback(self.isa, "quantize_activations", weight);
        }
        quantize_row(at, src, dst).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Dot product of `n` weights (`w`, layout `weight`) with `n` activations (`act`, layout
    /// `activation_type(weight)`, as made by [`Kernels::quantize_activations`]).
    ///
    /// Activation quants must lie in -127..=127 (the quantizers guarantee it); with -128 the AVX2
    /// Q8_0 path may differ from the scalar one (never out of bounds).
    ///
    /// # Panics
    /// If `weight` is unsupported, `n` is not a whole number of blocks, or a length is wrong.
    pub fn vec_dot(&self, weight: GgmlType, n: usize, w: &[u8], act: &[u8]) -> f32 {
        let at = activation_type(weight);
        let wb = row_bytes(weight, n).unwrap_or_else(|e| panic!("{e}"));
        let ab = row_bytes(at, n).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w.len(), wb, "vec_dot weight bytes for {weight} x {n}");
        assert_eq!(act.len(), ab, "vec_dot activation bytes for {at} x {n}");
        self.dot_dispatch(weight, n, w, act)
    }

    /// The dispatch behind `vec_dot`, with lengths already checked.
    fn dot_dispatch(&self, weight: GgmlType, n: usize, w: &[u8], act: &[u8]) -> f32 {
        if let Some(dot) = self.table.dot.get(weight) {
            // SAFETY: the table is this CPU's (`table.rs`); the caller checked both lengths
            // against `n`.
            return unsafe { dot(n, w, act) };
        }
        audit::fallback(self.isa, "vec_dot", weight);
        match weight {
            GgmlType::Q4_0 => scalar::dot_q4_0_q8_0(blocks_of(w), blocks_of(act)),
            GgmlType::Q4_1 => scalar::dot_q4_1_q8_1(blocks_of(w), blocks_of(act)),
            GgmlType::Q8_0 => scalar::dot_q8_0_q8_0(blocks_of(w), blocks_of(act)),
            GgmlType::Q4_K => scalar::dot_q4_k_q8_k(blocks_of(w), blocks_of(act)),
            GgmlType::Q6_K => scalar::dot_q6_k_q8_k(blocks_of(w), blocks_of(act)),
            GgmlType::Q5_0 => scalar::dot_q5_0_q8_0(blocks_of(w), blocks_of(act)),
            GgmlType::Q5_1 => scalar::dot_q5_1_q8_1(blocks_of(w), blocks_of(act)),
            GgmlType::IQ4_NL => scalar::dot_iq4_nl_q8_0(blocks_of(w), blocks_of(act)),
            GgmlType::Q2_K => scalar::dot_q2_k_q8_k(blocks_of(w), blocks_of(act)),
            GgmlType::Q3_K => scalar::dot_q3_k_q8_k(blocks_of(w), blocks_of(act)),
            GgmlType::Q5_K => scalar::dot_q5_k_q8_k(blocks_of(w), blocks_of(act)),
            GgmlType::IQ4_XS => scalar::dot_iq4_xs_q8_k(blocks_of(w), blocks_of(act)),
            GgmlType::BF16 => scalar::dot_bf16(n, w, act),
            GgmlType::F32 => scalar::dot_f32(n, w, act),
            GgmlType::F16 => scalar::dot_f16(n, w, act),
            ty => panic!("vec_dot: {ty} is not supported"),
        }
    }

    fn geometry<'a>(w: &MatRef<'a>, cols: Range<usize>) -> Geometry<'a> {
        let stride = w.validate().unwrap_or_else(|e| panic!("{e}"));
        let bs = w.ty.block_size();
        assert!(
            cols.start <= cols.end && cols.end <= w.cols,
            "column range {cols:?} outside 0..{}",
            w.cols
        );
        assert!(
            cols.start.is_multiple_of(bs) && cols.end.is_multiple_of(bs),
            "column range {cols:?} not aligned to {} blocks of {bs}",
            w.ty
        );
        Geometry {
            ty: w.ty,
            data: w.data,
            stride,
            off: cols.start / bs * w.ty.type_size(),
            nb: (cols.end - cols.start) / bs,
            ncols: cols.end - cols.start,
            rows: w.rows,
        }
    }

    /// Decode: `out[r]` = dot(row r of `w` restricted to `cols`, `act`), where `act` holds the
    /// activation blocks of those columns only. `cols` must be block aligned.
    ///
    /// # Panics
    /// On a malformed `w`, an unaligned or out-of-range `cols`, `act.len()` not the activation
    /// size of `cols.len()` elements, or `out.len() != w.rows`.
    pub fn matvec(&self, w: MatRef<'_>, cols: Range<usize>, act: &[u8], out: &mut [f32]) {
        if let Layout::X8 { .. } = w.layout {
            return self.matvec_x8(w, cols, act, out);
        }
        let g = Self::geometry(&w, cols);
        let at = activation_type(w.ty);
        let ab = row_bytes(at, g.ncols).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(act.len(), ab, "matvec activation bytes");
        assert_eq!(out.len(), w.rows, "matvec output length");
        if let Some(matvec) = self.table.matvec.get(w.ty) {
            // SAFETY: the table is this CPU's (`table.rs`); `g` was validated by `geometry`
            // (every row it hands out is a bounds-checked slice), `act` has exactly `nb`
            // activation blocks and `out` `rows` elements.
            return unsafe { matvec(g, act, out) };
        }
        audit::fallback(self.isa, "matvec", w.ty);
        for (r, o) in out.iter_mut().enumerate() {
            *o = self.dot_dispatch(w.ty, g.ncols, g.row(r), act);
        }
    }

    /// Sparse decode: `out[k]` = dot(row `pick[k]` of `w`, `act`) over all columns, the same
    /// bits as [`Kernels::vec_dot`] of that row, several rows per pass (a per-row dot product
    /// costs several times more per row than this on AVX2).
    ///
    /// # Panics
    /// On a malformed `w`, a row index past `w.rows`, `act.len()` not the activation size of a
    /// row, or `out.len() != pick.len()`.
    pub fn matvec_rows(&self, w: MatRef<'_>, pick: &[u32], act: &[u8], out: &mut [f32]) {
        if let Layout::X8 { .. } = w.layout {
            return self.matvec_rows_x8(w, pick, act, out);
        }
        let g = Self::geometry(&w, 0..w.cols);
        let ab = row_bytes(activation_type(w.ty), g.ncols).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(act.len(), ab, "matvec_rows activation bytes");
        assert_eq!(out.len(), pick.len(), "matvec_rows output length");
        if let Some(&r) = pick.iter().find(|&&r| r as usize >= w.rows) {
            panic!("matvec_rows: row {r} outside 0..{}", w.rows);
        }
        if let Some(matvec_rows) = self.table.matvec_rows.get(w.ty) {
            // SAFETY: the table is this CPU's (`table.rs`); every picked row was checked above
            // and is sliced with bounds checks, `act` has exactly `nb` activation blocks and
            // `out` one element per pick.
            return unsafe { matvec_rows(g, pick, act, out) };
        }
        audit::fallback(self.isa, "matvec_rows", w.ty);
        for (&r, o) in pick.iter().zip(out.iter_mut()) {
            *o = self.dot_dispatch(w.ty, g.ncols, g.row(r as usize), act);
        }
    }
}

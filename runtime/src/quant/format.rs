//! The format API: what a type's rows are in bytes, quantizing and dequantizing them, the
//! activation type each weight type is dotted with, and transposing a matrix into
//! requantized columns (the sparse FFN's down projection).

use super::blocks::{self, view, view_mut, Block};
use super::{scalar, GgmlType, MatRef};
use std::ops::Range;

/// Errors of the format functions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("type {ty} is not supported by {op}")]
    Unsupported { ty: GgmlType, op: &'static str },
    #[error("{n} elements is not a whole number of {ty} blocks ({block} each)")]
    NotBlockMultiple {
        ty: GgmlType,
        n: usize,
        block: usize,
    },
    #[error("{what}: expected {expected} bytes/elements, got {got}")]
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
}

/// The activation format a weight type is dotted with (ggml's `vec_dot_type`).
///
/// # Panics
/// For a type the kernels do not support (see [`GgmlType::is_supported`]); use
/// [`try_activation_type`] to get an error instead.
pub fn activation_type(weight: GgmlType) -> GgmlType {
    try_activation_type(weight).unwrap_or_else(|e| panic!("{e}"))
}

/// [`activation_type`], as a `Result`.
pub fn try_activation_type(weight: GgmlType) -> Result<GgmlType, QuantError> {
    Ok(match weight {
        GgmlType::Q4_0 | GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::IQ4_NL => GgmlType::Q8_0,
        GgmlType::Q4_1 | GgmlType::Q5_1 => GgmlType::Q8_1,
        GgmlType::Q2_K
        | GgmlType::Q3_K
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q6_K
        | GgmlType::IQ4_XS => GgmlType::Q8_K,
        GgmlType::F16 | GgmlType::BF16 | GgmlType::F32 => GgmlType::F32,
        ty => {
            return Err(QuantError::Unsupported {
                ty,
                op: "activation_type",
            })
        }
    })
}

/// Bytes of `n` elements of `ty`, checking that `n` is a whole number of blocks.
pub fn row_bytes(ty: GgmlType, n: usize) -> Result<usize, QuantError> {
    ty.bytes_for(n as u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or(QuantError::NotBlockMultiple {
            ty,
            n,
            block: ty.block_size(),
        })
}

pub(super) fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), QuantError> {
    if expected == got {
        Ok(())
    } else {
        Err(QuantError::Length {
            what,
            expected,
            got,
        })
    }
}

pub(super) fn blocks_of<B: Block>(bytes: &[u8]) -> &[B] {
    view::<B>(bytes).expect("length checked by the caller")
}

pub(super) fn blocks_of_mut<B: Block>(bytes: &mut [u8]) -> &mut [B] {
    view_mut::<B>(bytes).expect("length checked by the caller")
}

/// Quantizes `src` into `dst` (the file layout of `ty`). Supported: every weight type of the
/// module docs, and Q8_1, Q8_K. The K-quants and the IQ4 types use simple (not ggml's
/// search-based, importance-weighted) quantizers; all other types give exactly ggml's reference
/// bytes (Q8_0 with the numerics described in the module docs).
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let n = src.len();
    check_len("quantize_row dst", row_bytes(ty, n)?, dst.len())?;
    match ty {
        GgmlType::F32 => {
            for (d, s) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&s.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (d, s) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&blocks::f16_bytes(*s));
            }
        }
        GgmlType::BF16 => {
            for (d, s) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&scalar::bf16_from_f32(*s).to_le_bytes());
            }
        }
        GgmlType::Q4_0 => scalar::quantize_q4_0(src, blocks_of_mut(dst)),
        GgmlType::Q4_1 => scalar::quantize_q4_1(src, blocks_of_mut(dst)),
        GgmlType::Q8_0 => scalar::quantize_q8_0(src, blocks_of_mut(dst)),
        GgmlType::Q8_1 => scalar::quantize_q8_1(src, blocks_of_mut(dst)),
        GgmlType::Q4_K => scalar::quantize_q4_k(src, blocks_of_mut(dst)),
        GgmlType::Q6_K => scalar::quantize_q6_k(src, blocks_of_mut(dst)),
        GgmlType::Q8_K => scalar::quantize_q8_k(src, blocks_of_mut(dst)),
        GgmlType::Q5_0 => scalar::quantize_q5_0(src, blocks_of_mut(dst)),
        GgmlType::Q5_1 => scalar::quantize_q5_1(src, blocks_of_mut(dst)),
        GgmlType::IQ4_NL => scalar::quantize_iq4_nl(src, blocks_of_mut(dst)),
        GgmlType::Q2_K => scalar::quantize_q2_k(src, blocks_of_mut(dst)),
        GgmlType::Q3_K => scalar::quantize_q3_k(src, blocks_of_mut(dst)),
        GgmlType::Q5_K => scalar::quantize_q5_k(src, blocks_of_mut(dst)),
        GgmlType::IQ4_XS => scalar::quantize_iq4_xs(src, blocks_of_mut(dst)),
        ty => {
            return Err(QuantError::Unsupported {
                ty,
                op: "quantize_row",
            })
        }
    }
    Ok(())
}

/// Dequantizes `src` (the file layout of `ty`) into `dst`; `dst.len()` elements are read.
/// Supports the same types as [`quantize_row`].
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let n = dst.len();
    check_len("dequantize_row src", row_bytes(ty, n)?, src.len())?;
    match ty {
        GgmlType::F32 => {
            for (i, d) in dst.iter_mut().enumerate() {
                *d = scalar::f32_at(src, i);
            }
        }
        GgmlType::F16 => {
            for (i, d) in dst.iter_mut().enumerate() {
                *d = scalar::f16_at(src, i);
            }
        }
        GgmlType::BF16 => {
            for (i, d) in dst.iter_mut().enumerate() {
                *d = scalar::bf16_at(src, i);
            }
        }
        GgmlType::Q4_0 => scalar::dequantize_q4_0(blocks_of(src), dst),
        GgmlType::Q4_1 => scalar::dequantize_q4_1(blocks_of(src), dst),
        GgmlType::Q8_0 => scalar::dequantize_q8_0(blocks_of(src), dst),
        GgmlType::Q8_1 => scalar::dequantize_q8_1(blocks_of(src), dst),
        GgmlType::Q4_K => scalar::dequantize_q4_k(blocks_of(src), dst),
        GgmlType::Q6_K => scalar::dequantize_q6_k(blocks_of(src), dst),
        GgmlType::Q8_K => scalar::dequantize_q8_k(blocks_of(src), dst),
        GgmlType::Q5_0 => scalar::dequantize_q5_0(blocks_of(src), dst),
        GgmlType::Q5_1 => scalar::dequantize_q5_1(blocks_of(src), dst),
        GgmlType::IQ4_NL => scalar::dequantize_iq4_nl(blocks_of(src), dst),
        GgmlType::Q2_K => scalar::dequantize_q2_k(blocks_of(src), dst),
        GgmlType::Q3_K => scalar::dequantize_q3_k(blocks_of(src), dst),
        GgmlType::Q5_K => scalar::dequantize_q5_k(blocks_of(src), dst),
        GgmlType::IQ4_XS => scalar::dequantize_iq4_xs(blocks_of(src), dst),
        ty => {
            return Err(QuantError::Unsupported {
                ty,
                op: "dequantize_row",
            })
        }
    }
    Ok(())
}

/// The transpose of `w` (rows × cols) as a `cols × rows` matrix quantized row-wise in `ty`
/// (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, F16, BF16 or F32): dequantize, transpose, quantize with
/// [`quantize_row`].
/// For the sparse FFN: the down projection (`n_embd` rows of `n_ff`) becomes one row of
/// `n_embd` per neuron, the layout [`Kernels::axpy_rows`](super::Kernels::axpy_rows) reads.
///
/// Works in strips of output rows, so the scratch is O(strip * rows) floats, not the whole
/// matrix. `w` may be of any type [`dequantize_row`] supports.
///
/// # Errors
/// [`QuantError::Unsupported`] for another `ty` or an undequantizable `w.ty`,
/// [`QuantError::NotBlockMultiple`] when `w.rows` (the new row length) is not a whole number of
/// `ty` blocks, and any geometry error of `w` (as [`MatRef::new`]).
pub fn transpose_requantize(w: MatRef<'_>, ty: GgmlType) -> Result<Vec<u8>, QuantError> {
    check_transpose_type(ty)?;
    let out_row = row_bytes(ty, w.rows)?;
    let total = out_row.checked_mul(w.cols).ok_or(QuantError::Length {
        what: "transpose_requantize output",
        expected: usize::MAX,
        got: 0,
    })?;
    let mut out = vec![0u8; total];
    transpose_requantize_cols(w, 0..w.cols, ty, &mut out)?;
    Ok(out)
}

/// Rows `cols` of [`transpose_requantize`]'s result (the transposes of columns `cols` of `w`),
/// written into `out` (`cols.len()` rows of `ty`): the same bytes, made from only those
/// columns, so a caller can transpose a large matrix piece by piece in bounded memory.
///
/// # Errors
/// As [`transpose_requantize`], and [`QuantError::Length`] when `cols` runs past `w.cols` or
/// `out` is not exactly `cols.len()` rows.
pub fn transpose_requantize_cols(
    w: MatRef<'_>,
    cols: Range<usize>,
    ty: GgmlType,
    out: &mut [u8],
) -> Result<(), QuantError> {
    check_transpose_type(ty)?;
    let stride = w.validate()?;
    let out_row = row_bytes(ty, w.rows)?;
    if cols.start > cols.end || cols.end > w.cols {
        return Err(QuantError::Length {
            what: "transpose_requantize columns",
            expected: w.cols,
            got: cols.end,
        });
    }
    check_len(
        "transpose_requantize output",
        out_row.saturating_mul(cols.len()),
        out.len(),
    )?;
    if w.rows == 0 || cols.is_empty() {
        return Ok(());
    }
    // Strips of input columns (output rows): block aligned for `w.ty`, at least 64 wide.
    let bs = w.ty.block_size();
    let strip = bs * 64usize.div_ceil(bs);
    let (first, last) = (
        cols.start / bs * bs,
        (cols.end.div_ceil(bs) * bs).min(w.cols),
    );
    let mut src = vec![0f32; strip];
    let mut t = vec![0f32; strip * w.rows];
    for c0 in (first..last).step_by(strip) {
        let c1 = (c0 + strip).min(last);
        let n = c1 - c0;
        let (b0, b1) = (row_bytes(w.ty, c0)?, row_bytes(w.ty, c1)?);
        for r in 0..w.rows {
            let row = &w.data[r * stride..(r + 1) * stride];
            dequantize_row(w.ty, &row[b0..b1], &mut src[..n])?;
            for (j, &v) in src[..n].iter().enumerate() {
                t[j * w.rows + r] = v;
            }
        }
        for j in 0..n {
            let c = c0 + j;
            if !cols.contains(&c) {
                continue;
            }
            let at = (c - cols.start) * out_row;
            quantize_row(
                ty,
                &t[j * w.rows..(j + 1) * w.rows],
                &mut out[at..at + out_row],
            )?;
        }
    }
    Ok(())
}

/// The types [`Kernels::axpy_rows`](super::Kernels::axpy_rows) reads and
/// [`transpose_requantize`] writes: the 32-element formats and the float ones.
pub(super) fn axpy_type(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q8_0
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::IQ4_NL
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::F32
    )
}

/// The types [`transpose_requantize`] can quantize into.
pub(super) fn check_transpose_type(ty: GgmlType) -> Result<(), QuantError> {
    match ty {
        ty if axpy_type(ty) => Ok(()),
        _ => Err(QuantError::Unsupported {
            ty,
            op: "transpose_requantize",
        }),
    }
}

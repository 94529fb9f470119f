//! Tensor descriptors and the shape rules shared by the reader and the writer, so that every file
//! the reader accepts can be written back and vice versa.

use super::GgufError;
use crate::quant::GgmlType;

/// Most dimensions a tensor may have (ggml's limit).
pub const MAX_DIMS: usize = 4;

/// One tensor's descriptor from the file header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// Sizes in ggml order: `dims[0]` is the row length (the contiguous dimension).
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Byte offset of the data, relative to the start of the data section.
    pub offset: u64,
    /// Product of `dims`.
    pub n_elements: u64,
    /// Bytes of data (`ty`'s block size divides the row length, so this is exact).
    pub n_bytes: u64,
}

/// Checks a shape against the rules (1 to 4 dims, none zero, element count fits in an `i64`, rows
/// made of whole blocks) and returns `(n_elements, n_bytes)`.
pub(crate) fn check_shape(name: &str, dims: &[u64], ty: GgmlType) -> Result<(u64, u64), GgufError> {
    if dims.is_empty() || dims.len() > MAX_DIMS {
        return Err(GgufError::BadDimCount {
            tensor: name.to_owned(),
            n_dims: dims.len() as u32,
        });
    }
    if let Some(dim) = dims.iter().position(|&d| d == 0) {
        return Err(GgufError::ZeroDim {
            tensor: name.to_owned(),
            dim,
        });
    }
    // ggml counts elements in an i64; stay within that so other tools agree with us.
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| GgufError::ElementCountOverflow {
            tensor: name.to_owned(),
            dims: dims.to_vec(),
        })?;
    let block = ty.block_size();
    if !dims[0].is_multiple_of(block as u64) {
        return Err(GgufError::RowNotBlockMultiple {
            tensor: name.to_owned(),
            ty,
            row: dims[0],
            block,
        });
    }
    // 8-byte element types can still overflow a u64 byte count.
    let n_bytes = ty
        .bytes_for(n_elements)
        .ok_or_else(|| GgufError::ElementCountOverflow {
            tensor: name.to_owned(),
            dims: dims.to_vec(),
        })?;
    Ok((n_elements, n_bytes))
}

/// `x` rounded up to a multiple of `align` (a power of two), or `None` on overflow.
pub(crate) fn align_up(x: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    x.checked_add(align - 1).map(|v| v & !(align - 1))
}

/// Default alignment of the data section and of each tensor, when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Largest alignment accepted. The format allows any power of two in a u32; more than this is
/// only plausible in a crafted file, and would pad each tensor by that much.
pub const MAX_ALIGNMENT: u64 = 1 << 24;

/// Checks an alignment value (from `general.alignment` or given to the writer).
pub(crate) fn check_alignment(alignment: u64) -> Result<(), GgufError> {
    let reason = if alignment == 0 {
        "it is zero"
    } else if !alignment.is_power_of_two() {
        "it is not a power of two"
    } else if alignment > MAX_ALIGNMENT {
        "it is larger than 16 MiB"
    } else {
        return Ok(());
    };
    Err(GgufError::BadAlignment { alignment, reason })
}

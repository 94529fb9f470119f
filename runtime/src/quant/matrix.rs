//! [`MatRef`]: a weight matrix as the kernels read it, in the file's row layout or with Q4_K and
//! Q6_K rows interleaved 8 by 8 ([`Layout::X8`]).

use super::format::{check_len, row_bytes, QuantError};
use super::{interleave, GgmlType};
use std::ops::Range;

/// How the rows of a [`MatRef`] lie in its bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// The file's layout: row after row, [`MatRef::stride`] bytes each.
    #[default]
    Rows,
    /// Q4_K or Q6_K rows interleaved 8 by 8 ([`interleave`]): `data` holds whole groups of 8 rows
    /// (each group its super-blocks in column order, one
    /// [`BlockQ4Kx8`](super::BlockQ4Kx8) or [`BlockQ6Kx8`](super::BlockQ6Kx8) each), and the
    /// matrix is rows `skip..skip + rows` of them (`skip < 8`; the last group may be used in
    /// part).
    X8 { skip: usize },
}

/// A weight matrix: `rows` rows of `cols` elements, row stride `ty.bytes_for(cols)` bytes in the
/// file's layout ([`Layout::Rows`]), no alignment requirement.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
    pub layout: Layout,
}

impl<'a> MatRef<'a> {
    /// Checks the geometry (supported type, whole blocks, `data.len() == rows * stride`) of a
    /// matrix in the file's layout.
    pub fn new(ty: GgmlType, data: &'a [u8], rows: usize, cols: usize) -> Result<Self, QuantError> {
        let m = MatRef {
            ty,
            data,
            rows,
            cols,
            layout: Layout::Rows,
        };
        m.validate()?;
        Ok(m)
    }

    /// Bytes per row.
    pub fn stride(&self) -> usize {
        row_bytes(self.ty, self.cols).unwrap_or(0)
    }

    /// Rows `rows` of the matrix (which must lie within it), in the same layout.
    ///
    /// # Panics
    /// If `rows` is not within `0..self.rows`.
    pub fn sub_rows(&self, rows: Range<usize>) -> MatRef<'a> {
        assert!(
            rows.start <= rows.end && rows.end <= self.rows,
            "rows {rows:?} outside 0..{}",
            self.rows
        );
        let stride = self.stride();
        let (data, layout) = match self.layout {
            Layout::Rows => (
                &self.data[rows.start * stride..rows.end * stride],
                Layout::Rows,
            ),
            Layout::X8 { skip } => {
                let g = interleave::GROUP_ROWS;
                let (first, end) = (skip + rows.start, skip + rows.end);
                let (g0, g1) = (first / g, end.div_ceil(g).max(first / g));
                let group = g * stride;
                (
                    &self.data[g0 * group..g1 * group],
                    Layout::X8 { skip: first % g },
                )
            }
        };
        MatRef {
            data,
            rows: rows.len(),
            layout,
            ..*self
        }
    }

    /// The row stride of a valid matrix in the file's layout; an error for another layout
    /// (the operations that read rows one by one).
    pub(super) fn validate(&self) -> Result<usize, QuantError> {
        if self.layout != Layout::Rows {
            return Err(QuantError::Unsupported {
                ty: self.ty,
                op: "an interleaved matrix",
            });
        }
        self.validate_any()
    }

    /// The row stride (of the file layout) of a valid matrix in either layout.
    pub(super) fn validate_any(&self) -> Result<usize, QuantError> {
        if !self.ty.is_supported() {
            return Err(QuantError::Unsupported {
                ty: self.ty,
                op: "MatRef",
            });
        }
        let stride = row_bytes(self.ty, self.cols)?;
        let rows = match self.layout {
            Layout::Rows => self.rows,
            Layout::X8 { skip } => {
                if !interleave::interleavable(self.ty) || skip >= interleave::GROUP_ROWS {
                    return Err(QuantError::Unsupported {
                        ty: self.ty,
                        op: "Layout::X8 (Q4_K or Q6_K, skip < 8)",
                    });
                }
                (skip + self.rows).next_multiple_of(interleave::GROUP_ROWS)
            }
        };
        let total = stride.checked_mul(rows).ok_or(QuantError::Length {
            what: "MatRef data",
            expected: usize::MAX,
            got: self.data.len(),
        })?;
        check_len("MatRef data", total, self.data.len())?;
        Ok(stride)
    }
}

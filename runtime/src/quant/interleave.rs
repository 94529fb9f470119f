//! Q4_K rows interleaved 8 by 8 ([`Layout::X8`]), the layout decode's Q4_K matvec reads
//! fastest: per super-block, one [`BlockQ4Kx8`] holds the 8 rows' blocks, their scales as
//! row-per-lane words and their quants in 4-byte chunks, so one 32-byte load feeds 8 rows and one
//! broadcast activation word serves them all (no per-row shuffles or horizontal sums; see
//! `avx2/q4k_x8.rs`). The bytes are the 8 rows' blocks rearranged: the same size, so a model can
//! interleave a matrix in place ([`interleave_in_place`]).
//!
//! Every result is the scalar Q4_K dot of the row (`scalar::dot_q4_k_q8_k`), bit for bit: the
//! kernels only read the same numbers from other places. Rows can always be taken back out
//! ([`row_blocks`]), which is how the paths without an interleaved kernel compute.

use super::blocks::{view, view_mut, BlockQ4K, BlockQ4Kx8};
use super::{row_bytes, GgmlType, Layout, MatRef, QuantError};

/// Rows per interleaved group.
pub const GROUP_ROWS: usize = 8;

/// The interleaved bytes of the matrix `w` (file layout, Q4_K): its rows in groups of 8, a
/// short last group padded with zero rows. View them as `MatRef { layout: Layout::X8 { skip: 0
/// }, ..w }`.
///
/// # Errors
/// A type other than Q4_K, a malformed `w`, or `w` already interleaved.
pub fn interleave(w: MatRef<'_>) -> Result<Vec<u8>, QuantError> {
    check_q4k(w.ty)?;
    let stride = w.validate()?;
    let groups = w.rows.div_ceil(GROUP_ROWS);
    let mut out = vec![0u8; groups * GROUP_ROWS * stride];
    let mut rows = vec![0u8; GROUP_ROWS * stride];
    for g in 0..groups {
        let first = g * GROUP_ROWS;
        let n = (w.rows - first).min(GROUP_ROWS);
        rows.fill(0);
        rows[..n * stride].copy_from_slice(&w.data[first * stride..(first + n) * stride]);
        pack_group(
            &rows,
            &mut out[g * GROUP_ROWS * stride..(g + 1) * GROUP_ROWS * stride],
        );
    }
    Ok(out)
}

/// Interleaves `rows` Q4_K rows of `cols` columns held in `data` (file layout) where they lie:
/// afterwards `data` is [`Layout::X8`] bytes of the same matrix, the same size.
///
/// # Errors
/// A type other than Q4_K, `rows` not a multiple of 8, or `data` not `rows` rows.
pub fn interleave_in_place(
    ty: GgmlType,
    data: &mut [u8],
    rows: usize,
    cols: usize,
) -> Result<(), QuantError> {
    check_q4k(ty)?;
    MatRef::new(ty, data, rows, cols)?;
    if !rows.is_multiple_of(GROUP_ROWS) {
        return Err(QuantError::Length {
            what: "interleave_in_place rows (a multiple of 8)",
            expected: rows.next_multiple_of(GROUP_ROWS),
            got: rows,
        });
    }
    let group = GROUP_ROWS * row_bytes(ty, cols)?;
    let mut scratch = vec![0u8; group];
    for chunk in data.chunks_exact_mut(group) {
        scratch.copy_from_slice(chunk);
        pack_group(&scratch, chunk);
    }
    Ok(())
}

fn check_q4k(ty: GgmlType) -> Result<(), QuantError> {
    match ty {
        GgmlType::Q4_K => Ok(()),
        ty => Err(QuantError::Unsupported {
            ty,
            op: "interleave",
        }),
    }
}

/// 8 rows (file layout, back to back) into one group of [`BlockQ4Kx8`]s.
fn pack_group(rows: &[u8], out: &mut [u8]) {
    let stride = rows.len() / GROUP_ROWS;
    let src: [&[BlockQ4K]; GROUP_ROWS] = std::array::from_fn(|r| {
        view::<BlockQ4K>(&rows[r * stride..(r + 1) * stride]).expect("whole blocks")
    });
    let dst = view_mut::<BlockQ4Kx8>(out).expect("whole groups");
    for (b, x) in dst.iter_mut().enumerate() {
        for (r, row) in src.iter().enumerate() {
            let blk = &row[b];
            x.d[r] = blk.d;
            x.dmin[r] = blk.dmin;
            for i in 0..3 {
                x.scales[8 * i + r].copy_from_slice(&blk.scales[4 * i..4 * i + 4]);
            }
            for q in 0..32 {
                x.qs[GROUP_ROWS * q + r].copy_from_slice(&blk.qs[4 * q..4 * q + 4]);
            }
        }
    }
}

/// Row `r` (0..8) of an interleaved super-block, as its file-layout block.
#[inline]
pub(crate) fn unpack(x: &BlockQ4Kx8, r: usize) -> BlockQ4K {
    let mut blk = BlockQ4K {
        d: x.d[r],
        dmin: x.dmin[r],
        scales: [0; 12],
        qs: [0; 128],
    };
    for i in 0..3 {
        blk.scales[4 * i..4 * i + 4].copy_from_slice(&x.scales[8 * i + r]);
    }
    for q in 0..32 {
        blk.qs[4 * q..4 * q + 4].copy_from_slice(&x.qs[GROUP_ROWS * q + r]);
    }
    blk
}

/// An interleaved matrix's geometry, validated: `groups` groups of `nb_row` super-blocks each
/// (a whole row), of which the matrix uses super-blocks `off..off + nb` (a column range) and
/// rows `skip..skip + rows` (counted from the first group's first row).
#[derive(Clone, Copy)]
pub(crate) struct X8<'a> {
    pub(crate) blocks: &'a [BlockQ4Kx8],
    pub(crate) nb_row: usize,
    pub(crate) off: usize,
    pub(crate) nb: usize,
    pub(crate) skip: usize,
    pub(crate) rows: usize,
}

impl<'a> X8<'a> {
    /// Group `g`'s super-blocks of the column range.
    #[inline(always)]
    pub(crate) fn group(&self, g: usize) -> &'a [BlockQ4Kx8] {
        let start = g * self.nb_row + self.off;
        &self.blocks[start..start + self.nb]
    }

    /// Groups holding the matrix's rows.
    #[cfg_attr(
        not(all(target_arch = "x86_64", not(conductor_portable))),
        allow(dead_code)
    )]
    pub(crate) fn groups(&self) -> usize {
        (self.skip + self.rows).div_ceil(GROUP_ROWS)
    }

    /// Row `r` of the matrix (column range only) in file layout, into `out` (`nb` blocks).
    pub(crate) fn row_blocks(&self, r: usize, out: &mut Vec<BlockQ4K>) {
        let at = self.skip + r;
        out.clear();
        out.extend(
            self.group(at / GROUP_ROWS)
                .iter()
                .map(|x| unpack(x, at % GROUP_ROWS)),
        );
    }
}

/// The geometry of an interleaved `w` restricted to super-blocks `off..off + nb`.
///
/// # Panics
/// If `w` is not a valid [`Layout::X8`] matrix (checked by the caller's validation).
pub(crate) fn x8_of<'a>(w: &MatRef<'a>, off: usize, nb: usize) -> X8<'a> {
    let Layout::X8 { skip } = w.layout else {
        panic!("x8_of: a file-layout matrix");
    };
    X8 {
        blocks: view::<BlockQ4Kx8>(w.data).expect("validated: whole groups"),
        nb_row: w.cols / 256,
        off,
        nb,
        skip,
        rows: w.rows,
    }
}

/// Row `r` of an interleaved matrix (all columns) in file layout, the bytes of
/// [`interleave`]'s input row (for tests and for paths without an interleaved kernel).
pub fn row_bytes_of(w: MatRef<'_>, r: usize) -> Result<Vec<u8>, QuantError> {
    let nb = w.cols / 256;
    w.validate_any()?;
    assert!(r < w.rows, "row {r} outside 0..{}", w.rows);
    let mut blocks = Vec::new();
    x8_of(&w, 0, nb).row_blocks(r, &mut blocks);
    Ok(blocks
        .iter()
        .flat_map(|b| {
            let mut v = Vec::with_capacity(144);
            v.extend_from_slice(&b.d);
            v.extend_from_slice(&b.dmin);
            v.extend_from_slice(&b.scales);
            v.extend_from_slice(&b.qs);
            v
        })
        .collect())
}

//! Q4_K and Q6_K rows interleaved 8 by 8 ([`Layout::X8`]), the layout decode's K-quant matvec
//! reads fastest: per super-block, one [`BlockQ4Kx8`] (or [`BlockQ6Kx8`]) holds the 8 rows'
//! blocks, their scales as row-per-lane words and their quants in 4-byte chunks, so one 32-byte
//! load feeds 8 rows and one broadcast activation word serves them all (no per-row shuffles or
//! horizontal sums; see `avx2/q4k_x8.rs`, `avx2/q6k_x8.rs`). The bytes are the 8 rows' blocks
//! rearranged: the same size, so a model can interleave a matrix in place
//! ([`interleave_in_place`]).
//!
//! Every result is the scalar dot of the row (`scalar::dot_q4_k_q8_k`, `dot_q6_k_q8_k`), bit for
//! bit: the kernels only read the same numbers from other places. Rows can always be taken back
//! out ([`X8::row_blocks`]), which is how the paths without an interleaved kernel compute.

#[cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(conductor_portable)
))]
use super::blocks::BlockQ8K;
use super::blocks::{as_bytes, view, view_mut, Block, BlockQ4K, BlockQ4Kx8, BlockQ6K, BlockQ6Kx8};
use super::{row_bytes, GgmlType, Layout, MatRef, QuantError};

/// Rows per interleaved group.
pub const GROUP_ROWS: usize = 8;

/// Whether `ty` has an interleaved layout (Q4_K, Q6_K).
pub fn interleavable(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K)
}

/// A super-block of 8 rows interleaved, and the file-layout block of one row it holds.
pub(crate) trait Group: Block {
    type Row: Block;
    /// The 8 rows' blocks into one group.
    fn pack(rows: [&Self::Row; GROUP_ROWS]) -> Self;
    /// Row `r` (0..8) back out, as its file-layout block.
    fn unpack(&self, r: usize) -> Self::Row;
}

/// `n` 4-byte chunks of each row's `src`, chunk-major: `dst[8 * c + r]` is row r's chunk c.
#[inline(always)]
fn chunks_in(dst: &mut [[u8; 4]], r: usize, src: &[u8]) {
    for (c, s) in src.chunks_exact(4).enumerate() {
        dst[GROUP_ROWS * c + r].copy_from_slice(s);
    }
}

/// The inverse of [`chunks_in`] for row r.
#[inline(always)]
fn chunks_out(src: &[[u8; 4]], r: usize, dst: &mut [u8]) {
    for (c, d) in dst.chunks_exact_mut(4).enumerate() {
        d.copy_from_slice(&src[GROUP_ROWS * c + r]);
    }
}

impl Group for BlockQ4Kx8 {
    type Row = BlockQ4K;
    fn pack(rows: [&BlockQ4K; GROUP_ROWS]) -> Self {
        let mut x = BlockQ4Kx8 {
            d: [[0; 2]; 8],
            dmin: [[0; 2]; 8],
            scales: [[0; 4]; 24],
            qs: [[0; 4]; 256],
        };
        for (r, blk) in rows.iter().enumerate() {
            x.d[r] = blk.d;
            x.dmin[r] = blk.dmin;
            chunks_in(&mut x.scales, r, &blk.scales);
            chunks_in(&mut x.qs, r, &blk.qs);
        }
        x
    }
    #[inline]
    fn unpack(&self, r: usize) -> BlockQ4K {
        let mut blk = BlockQ4K {
            d: self.d[r],
            dmin: self.dmin[r],
            scales: [0; 12],
            qs: [0; 128],
        };
        chunks_out(&self.scales, r, &mut blk.scales);
        chunks_out(&self.qs, r, &mut blk.qs);
        blk
    }
}

/// Where part p (0: `ql` chunk 16n + k, 1: `ql` chunk 16n + 8 + k, 2: `qh` chunk 8n + k) of
/// each (half n, k) lies among a [`BlockQ6Kx8`]'s `q` chunk groups: in the kernel's reading
/// order.
#[inline(always)]
pub(crate) const fn q6k_part(n: usize, k: usize, p: usize) -> usize {
    3 * (8 * n + k) + p
}

/// The 4-byte chunk c of a Q6_K row's `ql` (`qh` when `high`), as (half n, k, part).
fn q6k_chunk(c: usize, high: bool) -> usize {
    if high {
        q6k_part(c / 8, c % 8, 2)
    } else {
        q6k_part(c / 16, c % 8, (c % 16) / 8)
    }
}

impl Group for BlockQ6Kx8 {
    type Row = BlockQ6K;
    fn pack(rows: [&BlockQ6K; GROUP_ROWS]) -> Self {
        let mut x = BlockQ6Kx8 {
            d: [[0; 2]; 8],
            scales: [[0; 4]; 32],
            q: [[0; 4]; 384],
        };
        for (r, blk) in rows.iter().enumerate() {
            x.d[r] = blk.d;
            chunks_in(&mut x.scales, r, &blk.scales);
            for (c, s) in blk.ql.chunks_exact(4).enumerate() {
                x.q[GROUP_ROWS * q6k_chunk(c, false) + r].copy_from_slice(s);
            }
            for (c, s) in blk.qh.chunks_exact(4).enumerate() {
                x.q[GROUP_ROWS * q6k_chunk(c, true) + r].copy_from_slice(s);
            }
        }
        x
    }
    #[inline]
    fn unpack(&self, r: usize) -> BlockQ6K {
        let mut blk = BlockQ6K {
            ql: [0; 128],
            qh: [0; 64],
            scales: [0; 16],
            d: self.d[r],
        };
        chunks_out(&self.scales, r, &mut blk.scales);
        for (c, d) in blk.ql.chunks_exact_mut(4).enumerate() {
            d.copy_from_slice(&self.q[GROUP_ROWS * q6k_chunk(c, false) + r]);
        }
        for (c, d) in blk.qh.chunks_exact_mut(4).enumerate() {
            d.copy_from_slice(&self.q[GROUP_ROWS * q6k_chunk(c, true) + r]);
        }
        blk
    }
}

/// The interleaved bytes of the matrix `w` (file layout, Q4_K or Q6_K): its rows in groups of
/// 8, a short last group padded with zero rows. View them as `MatRef { layout: Layout::X8 {
/// skip: 0 }, ..w }`.
///
/// # Errors
/// Another type, a malformed `w`, or `w` already interleaved.
pub fn interleave(w: MatRef<'_>) -> Result<Vec<u8>, QuantError> {
    check_type(w.ty)?;
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
            w.ty,
            &rows,
            &mut out[g * GROUP_ROWS * stride..(g + 1) * GROUP_ROWS * stride],
        );
    }
    Ok(out)
}

/// Interleaves `rows` Q4_K or Q6_K rows of `cols` columns held in `data` (file layout) where
/// they lie: afterwards `data` is [`Layout::X8`] bytes of the same matrix, the same size.
///
/// # Errors
/// Another type, `rows` not a multiple of 8, or `data` not `rows` rows.
pub fn interleave_in_place(
    ty: GgmlType,
    data: &mut [u8],
    rows: usize,
    cols: usize,
) -> Result<(), QuantError> {
    check_type(ty)?;
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
        pack_group(ty, &scratch, chunk);
    }
    Ok(())
}

fn check_type(ty: GgmlType) -> Result<(), QuantError> {
    if interleavable(ty) {
        Ok(())
    } else {
        Err(QuantError::Unsupported {
            ty,
            op: "interleave",
        })
    }
}

/// 8 rows (file layout, back to back) into one group of interleaved super-blocks.
fn pack_group(ty: GgmlType, rows: &[u8], out: &mut [u8]) {
    match ty {
        GgmlType::Q4_K => pack_rows::<BlockQ4Kx8>(rows, out),
        GgmlType::Q6_K => pack_rows::<BlockQ6Kx8>(rows, out),
        ty => unreachable!("checked: {ty} has no interleaved layout"),
    }
}

fn pack_rows<G: Group>(rows: &[u8], out: &mut [u8]) {
    let stride = rows.len() / GROUP_ROWS;
    let src: [&[G::Row]; GROUP_ROWS] = std::array::from_fn(|r| {
        view::<G::Row>(&rows[r * stride..(r + 1) * stride]).expect("whole blocks")
    });
    let dst = view_mut::<G>(out).expect("whole groups");
    for (b, x) in dst.iter_mut().enumerate() {
        *x = G::pack(std::array::from_fn(|r| &src[r][b]));
    }
}

/// An interleaved matrix's geometry, validated: `groups` groups of `nb_row` super-blocks each
/// (a whole row), of which the matrix uses super-blocks `off..off + nb` (a column range) and
/// rows `skip..skip + rows` (counted from the first group's first row).
#[derive(Clone, Copy)]
pub(crate) struct X8<'a, G> {
    pub(crate) blocks: &'a [G],
    pub(crate) nb_row: usize,
    pub(crate) off: usize,
    pub(crate) nb: usize,
    pub(crate) skip: usize,
    pub(crate) rows: usize,
}

impl<'a, G: Group> X8<'a, G> {
    /// Group `g`'s super-blocks of the column range.
    #[inline(always)]
    pub(crate) fn group(&self, g: usize) -> &'a [G] {
        let start = g * self.nb_row + self.off;
        &self.blocks[start..start + self.nb]
    }

    /// Groups holding the matrix's rows.
    #[cfg_attr(
        not(all(
            any(target_arch = "x86_64", target_arch = "aarch64"),
            not(conductor_portable)
        )),
        allow(dead_code)
    )]
    pub(crate) fn groups(&self) -> usize {
        (self.skip + self.rows).div_ceil(GROUP_ROWS)
    }

    /// Group `g`'s 8 results (`v[i]`: its row i) into the matrix rows they hold (`out[r]` for
    /// row r): the first group starts `skip` rows early, the last may be short.
    #[cfg_attr(
        not(all(
            any(target_arch = "x86_64", target_arch = "aarch64"),
            not(conductor_portable)
        )),
        allow(dead_code)
    )]
    #[inline(always)]
    pub(crate) fn scatter(&self, g: usize, v: &[f32; GROUP_ROWS], out: &mut [f32]) {
        let first = (g * GROUP_ROWS).max(self.skip);
        let end = ((g + 1) * GROUP_ROWS).min(self.skip + self.rows);
        if end - first == GROUP_ROWS {
            // All 8 rows are the matrix's: one copy, not a loop of 8 (a cost a pass can see).
            out[first - self.skip..end - self.skip].copy_from_slice(v);
            return;
        }
        for at in first..end {
            out[at - self.skip] = v[at - g * GROUP_ROWS];
        }
    }

    /// Row `r` of the matrix (column range only) in file layout, into `out` (`nb` blocks).
    pub(crate) fn row_blocks(&self, r: usize, out: &mut Vec<G::Row>) {
        let at = self.skip + r;
        out.clear();
        out.extend(
            self.group(at / GROUP_ROWS)
                .iter()
                .map(|x| x.unpack(at % GROUP_ROWS)),
        );
    }
}

/// A group's 8 results as a SIMD kernel holds them (one `__m256`; two `float32x4_t`).
#[cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(conductor_portable)
))]
pub(crate) trait Lanes8: Copy {
    /// Lane r (row r of the group) at index r.
    unsafe fn to_array(self) -> [f32; GROUP_ROWS];
}

/// An interleaved super-block type with a SIMD kernel over its 8 rows (`avx2/q4k_x8.rs`,
/// `avx2/q6k_x8.rs`, `neon/x8.rs`): what the row and token loops below need.
#[cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(conductor_portable)
))]
pub(crate) trait Kernel8: Group {
    type Lanes: Lanes8;
    /// One group's 8 results for each of T tokens over its super-blocks `w`; `a[t]` holds token
    /// t's activation blocks (at least `w.len()`). Each lane is its row's scalar dot, bit for
    /// bit.
    unsafe fn group_dot<const T: usize>(w: &[Self], a: [&[BlockQ8K]; T]) -> [Self::Lanes; T];
}

/// `out[r]` = row r of `m` times `act` (the column range's activation blocks). Inlined into
/// each ISA's `#[target_feature]` entry point, as is `group_dot`.
#[cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(conductor_portable)
))]
#[inline(always)]
pub(crate) unsafe fn matvec_groups<G: Kernel8>(m: X8<'_, G>, act: &[BlockQ8K], out: &mut [f32]) {
    matvec_groups_with::<G, G>(m, act, out)
}

/// [`matvec_groups`] by kernel `K`.
#[cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(conductor_portable)
))]
#[inline(always)]
pub(crate) unsafe fn matvec_groups_with<G: Group, K: GroupKernel<G>>(
    m: X8<'_, G>,
    act: &[BlockQ8K],
    out: &mut [f32],
) {
    assert!(out.len() >= m.rows && act.len() >= m.nb);
    for g in 0..m.groups() {
        let [v] = K::group_dot::<1>(m.group(g), [&act[..m.nb]]);
        m.scatter(g, &v.to_array(), out);
    }
}

/// A kernel over interleaved super-blocks `G` other than their own [`Kernel8`] (a wider ISA's
/// prefill GEMM, `avx512/q4k_x8.rs`): the same contract as [`Kernel8::group_dot`].
#[cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(conductor_portable)
))]
pub(crate) trait GroupKernel<G> {
    type Lanes: Lanes8;
    unsafe fn group_dot<const T: usize>(w: &[G], a: [&[BlockQ8K]; T]) -> [Self::Lanes; T];
}

/// Every block type's own kernel is one.
#[cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(conductor_portable)
))]
impl<G: Kernel8> GroupKernel<G> for G {
    type Lanes = G::Lanes;
    #[inline(always)]
    unsafe fn group_dot<const T: usize>(w: &[G], a: [&[BlockQ8K]; T]) -> [Self::Lanes; T] {
        <G as Kernel8>::group_dot::<T>(w, a)
    }
}

/// [`matmul_groups_with`] the block type's own kernel.
#[cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(conductor_portable)
))]
#[inline(always)]
pub(crate) unsafe fn matmul_groups<G: Kernel8, const P: usize>(
    m: X8<'_, G>,
    acts: &[BlockQ8K],
    n_tokens: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    matmul_groups_with::<G, G, P>(m, acts, n_tokens, out, out_stride)
}

/// `out[t * out_stride + r]` = row r of `m` times token t of `acts` (`nb` blocks per token),
/// by kernel `K`: P tokens per pass over a group (as many as the ISA's registers hold), then
/// the rest in one pass of 3 or 2 where P is larger, and one token at a time last. A few tokens
/// (a draft's verification, a short prompt) thus read and unpack each group's weights once, not
/// once a token; every lane is its row's scalar dot whatever the pass, so the bits are the same.
#[cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(conductor_portable)
))]
#[inline(always)]
pub(crate) unsafe fn matmul_groups_with<G: Group, K: GroupKernel<G>, const P: usize>(
    m: X8<'_, G>,
    acts: &[BlockQ8K],
    n_tokens: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    assert!(acts.len() >= n_tokens * m.nb);
    for g in 0..m.groups() {
        let mut t = 0;
        while t + P <= n_tokens {
            group_pass::<G, K, P>(&m, g, acts, t, out, out_stride);
            t += P;
        }
        if P > 3 && t + 3 <= n_tokens {
            group_pass::<G, K, 3>(&m, g, acts, t, out, out_stride);
            t += 3;
        }
        if P > 2 && t + 2 <= n_tokens {
            group_pass::<G, K, 2>(&m, g, acts, t, out, out_stride);
            t += 2;
        }
        while t < n_tokens {
            group_pass::<G, K, 1>(&m, g, acts, t, out, out_stride);
            t += 1;
        }
    }
}

/// Group `g`'s rows times tokens `t..t + T` of `acts`, into their rows of `out`.
#[cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(conductor_portable)
))]
#[inline(always)]
unsafe fn group_pass<G: Group, K: GroupKernel<G>, const T: usize>(
    m: &X8<'_, G>,
    g: usize,
    acts: &[BlockQ8K],
    t: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let tok = |j: usize| &acts[(t + j) * m.nb..(t + j + 1) * m.nb];
    let v = K::group_dot::<T>(m.group(g), std::array::from_fn(tok));
    for (j, v) in v.into_iter().enumerate() {
        let o = (t + j) * out_stride;
        m.scatter(g, &v.to_array(), &mut out[o..o + m.rows]);
    }
}

/// The geometry of an interleaved `w` restricted to super-blocks `off..off + nb`, its groups
/// viewed as `G` (which must be `w.ty`'s).
///
/// # Panics
/// If `w` is not a valid [`Layout::X8`] matrix (checked by the caller's validation).
pub(crate) fn x8_of<'a, G: Group>(w: &MatRef<'a>, off: usize, nb: usize) -> X8<'a, G> {
    let Layout::X8 { skip } = w.layout else {
        panic!("x8_of: a file-layout matrix");
    };
    X8 {
        blocks: view::<G>(w.data).expect("validated: whole groups"),
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
    w.validate_any()?;
    assert!(r < w.rows, "row {r} outside 0..{}", w.rows);
    Ok(match w.ty {
        GgmlType::Q4_K => row_of::<BlockQ4Kx8>(&w, r),
        GgmlType::Q6_K => row_of::<BlockQ6Kx8>(&w, r),
        ty => unreachable!("validated: {ty} has no interleaved layout"),
    })
}

fn row_of<G: Group>(w: &MatRef<'_>, r: usize) -> Vec<u8> {
    let mut blocks = Vec::new();
    x8_of::<G>(w, 0, w.cols / 256).row_blocks(r, &mut blocks);
    as_bytes(&blocks).to_vec()
}

//! Prefill over interleaved K-quant groups ([`super::super::interleave`]) with each block of
//! groups unpacked once a call, not once a pass of tokens. Under the safety contract of
//! `avx2.rs`.
//!
//! Why: on a Xeon with AVX-512 VNNI, the 512-bit ports sustain about 1.6 operations a cycle,
//! shared by `vpdpbusd`, the unpacking of packed quants (`vpermd`, `vpand`, shifts) and the
//! broadcast loads of the activations. The pass kernels (`q4k_x8.rs`, `q6k_x8.rs`) unpack a
//! group's weights on every pass of 4 tokens and broadcast one activation word per
//! `vpdpbusd`, so fewer than half of those operations multiply. Here a block of [`GROUPS`]
//! groups is unpacked once into a per-thread scratch buffer, in the lane order and with the
//! scale operands of the pass kernel; every pass of [`TOKENS`] tokens then only loads them, and
//! one broadcast activation word serves every group of the block. Each type's unpacking and
//! block kernel is in [`UnpackOnce`] (`q4k_gemm.rs`, `q6k_gemm.rs`); their integer sums and
//! float steps per row are the pass kernel's, so the bits are the same.
//!
//! The groups come from a matrix interleaved at load ([`X8`]) or from one in file layout
//! ([`FileRows`]: a neuron store's matrices, the sparse FFN's, `--no-interleave`), whose rows
//! are packed 8 at a time just before they are unpacked.

use super::super::avx2::Rows;
use super::super::blocks::BlockQ8K;
use super::super::interleave::{Group, GROUP_ROWS, X8};
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Groups unpacked and multiplied together: each broadcast activation word serves this many.
pub(super) const GROUPS: usize = 2;

/// Tokens per pass over a block: each weight load serves this many. With [`GROUPS`], Q4_K's
/// pass (2 x 8 sub-block sums, 8 super-block sums, 4 weights and 2 broadcasts) fills 30 of the
/// 32 registers.
pub(super) const TOKENS: usize = 4;

/// One 64-byte vector, aligned for `vmovdqa64`.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct Line([u8; 64]);

/// Line `l` as a vector.
#[inline(always)]
pub(super) unsafe fn load(l: &Line) -> __m512i {
    // SAFETY (load): the 64 aligned bytes of `l`.
    _mm512_load_si512(l.0.as_ptr().cast())
}

/// `v` into line `l`.
#[inline(always)]
pub(super) unsafe fn store(l: &mut Line, v: __m512i) {
    // SAFETY (store): the 64 aligned bytes of `l`.
    _mm512_store_si512(l.0.as_mut_ptr().cast(), v)
}

/// An interleaved K-quant type whose prefill unpacks each block of groups once.
pub(crate) trait UnpackOnce: Group {
    /// Lines of one unpacked super-block of a group.
    const LINES: usize;

    /// Super-block `x` of a group into `u` ([`Self::LINES`] lines).
    unsafe fn unpack(x: &Self, u: &mut [Line]);

    /// The rows of G unpacked groups (`u[g]`: [`Self::LINES`] lines per super-block) times T
    /// tokens: `[t][g]` holds group g's 8 results for token t.
    unsafe fn block_dot<const T: usize, const G: usize>(
        u: [&[Line]; G],
        a: [&[BlockQ8K]; T],
    ) -> [[__m256; G]; T];
}

/// Super-blocks per group in `u` ([`UnpackOnce::LINES`] lines each), checking that the groups
/// agree and that every token of `a` has as many activation blocks.
#[inline(always)]
pub(super) fn super_blocks<K: UnpackOnce, const T: usize, const G: usize>(
    u: &[&[Line]; G],
    a: &[&[BlockQ8K]; T],
) -> usize {
    let nb = u[0].len() / K::LINES;
    for g in u {
        assert_eq!(g.len(), nb * K::LINES);
    }
    for t in a {
        assert!(t.len() >= nb);
    }
    nb
}

/// Super-block `b` of each group in `u`: its [`UnpackOnce::LINES`] lines.
#[inline(always)]
pub(super) fn super_block<'a, K: UnpackOnce, const G: usize>(
    u: &[&'a [Line]; G],
    b: usize,
) -> [&'a [Line]; G] {
    let mut ub = [&u[0][..0]; G];
    for (ub, u) in ub.iter_mut().zip(u) {
        *ub = &u[b * K::LINES..(b + 1) * K::LINES];
    }
    ub
}

thread_local! {
    /// Each thread's unpacked block, grown to the widest matrix it has multiplied and reused.
    static SCRATCH: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
}

/// Where prefill's groups of 8 rows come from.
pub(super) trait Groups<K: UnpackOnce> {
    /// Super-blocks of a row (of the column range).
    fn nb(&self) -> usize;
    /// Groups holding the matrix's rows.
    fn groups(&self) -> usize;
    /// Group `g`'s super-blocks unpacked into `lines` ([`UnpackOnce::LINES`] each).
    unsafe fn unpack_group(&self, g: usize, lines: &mut [Line]);
    /// Group `g`'s 8 results into the rows they hold (`out[r]` for row r).
    fn scatter(&self, g: usize, v: &[f32; GROUP_ROWS], out: &mut [f32]);
}

impl<K: UnpackOnce> Groups<K> for X8<'_, K> {
    fn nb(&self) -> usize {
        self.nb
    }

    fn groups(&self) -> usize {
        X8::groups(self)
    }

    #[inline(always)]
    unsafe fn unpack_group(&self, g: usize, lines: &mut [Line]) {
        for (x, u) in self.group(g).iter().zip(lines.chunks_exact_mut(K::LINES)) {
            <K as UnpackOnce>::unpack(x, u);
        }
    }

    fn scatter(&self, g: usize, v: &[f32; GROUP_ROWS], out: &mut [f32]) {
        X8::scatter(self, g, v, out)
    }
}

/// A matrix in file layout: group g is rows 8g..8g + 8, packed as [`Group::pack`] interleaves
/// them at load (a last group short of rows repeats its last row; its results there are not
/// stored).
pub(super) struct FileRows<'a>(pub(super) Rows<'a>);

impl<K: UnpackOnce> Groups<K> for FileRows<'_> {
    fn nb(&self) -> usize {
        self.0.nb
    }

    fn groups(&self) -> usize {
        self.0.rows.div_ceil(GROUP_ROWS)
    }

    #[inline(always)]
    unsafe fn unpack_group(&self, g: usize, lines: &mut [Line]) {
        let last = self.0.rows - 1;
        let rows: [&[K::Row]; GROUP_ROWS] =
            std::array::from_fn(|i| self.0.row::<K::Row>((g * GROUP_ROWS + i).min(last)));
        for (b, u) in lines.chunks_exact_mut(K::LINES).enumerate() {
            <K as UnpackOnce>::unpack(&K::pack(rows.map(|r| &r[b])), u);
        }
    }

    fn scatter(&self, g: usize, v: &[f32; GROUP_ROWS], out: &mut [f32]) {
        let first = g * GROUP_ROWS;
        let n = (self.0.rows - first).min(GROUP_ROWS);
        out[first..first + n].copy_from_slice(&v[..n]);
    }
}

/// `out[t * out_stride + r]` = row r of `m` times token t of `acts` (`m.nb()` blocks a token).
#[inline(always)]
pub(super) unsafe fn matmul<K: UnpackOnce, M: Groups<K>>(
    m: M,
    acts: &[BlockQ8K],
    n_tokens: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let nb = m.nb();
    assert!(acts.len() >= n_tokens * nb);
    let group_lines = nb * K::LINES;
    // Taken out and put back, not borrowed in a closure: a closure would not inherit this
    // function's target features, and the kernels inlined into it would lose them.
    let mut scratch = SCRATCH.take();
    if scratch.len() < GROUPS * group_lines {
        scratch.resize(GROUPS * group_lines, Line([0; 64]));
    }
    let groups = m.groups();
    let mut g0 = 0;
    while g0 < groups {
        let n = (groups - g0).min(GROUPS);
        for g in 0..n {
            m.unpack_group(g0 + g, &mut scratch[g * group_lines..(g + 1) * group_lines]);
        }
        let u = &scratch[..n * group_lines];
        const { assert!(GROUPS == 2, "one arm below per block size") };
        match n {
            2 => block_tokens::<K, M, 2>(&m, g0, u, acts, n_tokens, out, out_stride),
            _ => block_tokens::<K, M, 1>(&m, g0, u, acts, n_tokens, out, out_stride),
        }
        g0 += n;
    }
    SCRATCH.set(scratch);
}

/// Groups `g0..g0 + G` (unpacked in `u`) times every token: passes of [`TOKENS`], then one of
/// 3, 2 or 1.
#[inline(always)]
unsafe fn block_tokens<K: UnpackOnce, M: Groups<K>, const G: usize>(
    m: &M,
    g0: usize,
    u: &[Line],
    acts: &[BlockQ8K],
    n_tokens: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let group_lines = m.nb() * K::LINES;
    let mut us = [&u[..0]; G];
    for (g, us) in us.iter_mut().enumerate() {
        *us = &u[g * group_lines..(g + 1) * group_lines];
    }
    let mut t = 0;
    while t + TOKENS <= n_tokens {
        pass::<K, M, TOKENS, G>(m, g0, us, acts, t, out, out_stride);
        t += TOKENS;
    }
    match n_tokens - t {
        3 => pass::<K, M, 3, G>(m, g0, us, acts, t, out, out_stride),
        2 => pass::<K, M, 2, G>(m, g0, us, acts, t, out, out_stride),
        1 => pass::<K, M, 1, G>(m, g0, us, acts, t, out, out_stride),
        _ => {}
    }
}

/// Groups `g0..g0 + G` (`us`) times tokens `t..t + T` of `acts`, into their output rows.
#[inline(always)]
unsafe fn pass<K: UnpackOnce, M: Groups<K>, const T: usize, const G: usize>(
    m: &M,
    g0: usize,
    us: [&[Line]; G],
    acts: &[BlockQ8K],
    t: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let nb = m.nb();
    let mut a = [&acts[..0]; T];
    for (j, a) in a.iter_mut().enumerate() {
        *a = &acts[(t + j) * nb..(t + j + 1) * nb];
    }
    let v = K::block_dot::<T, G>(us, a);
    for (j, v) in v.into_iter().enumerate() {
        put::<K, M, G>(m, g0, v, &mut out[(t + j) * out_stride..]);
    }
}

/// Groups `g0..g0 + G`'s results for one token into its output row `out`.
#[inline(always)]
unsafe fn put<K: UnpackOnce, M: Groups<K>, const G: usize>(
    m: &M,
    g0: usize,
    v: [__m256; G],
    out: &mut [f32],
) {
    for (g, v) in v.into_iter().enumerate() {
        let mut rows = [0f32; GROUP_ROWS];
        // SAFETY (store): exactly the 32 bytes of `rows`.
        _mm256_storeu_ps(rows.as_mut_ptr(), v);
        m.scatter(g0 + g, &rows, out);
    }
}

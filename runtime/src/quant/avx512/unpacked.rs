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

/// `out[t * out_stride + r]` = row r of `m` times token t of `acts` (`m.nb` blocks a token).
#[inline(always)]
pub(super) unsafe fn matmul<K: UnpackOnce>(
    m: X8<'_, K>,
    acts: &[BlockQ8K],
    n_tokens: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    assert!(acts.len() >= n_tokens * m.nb);
    let group_lines = m.nb * K::LINES;
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
            let lines = &mut scratch[g * group_lines..(g + 1) * group_lines];
            for (x, u) in m.group(g0 + g).iter().zip(lines.chunks_exact_mut(K::LINES)) {
                <K as UnpackOnce>::unpack(x, u);
            }
        }
        let u = &scratch[..n * group_lines];
        const { assert!(GROUPS == 2, "one arm below per block size") };
        match n {
            2 => block_tokens::<K, 2>(&m, g0, u, acts, n_tokens, out, out_stride),
            _ => block_tokens::<K, 1>(&m, g0, u, acts, n_tokens, out, out_stride),
        }
        g0 += n;
    }
    SCRATCH.set(scratch);
}

/// Groups `g0..g0 + G` (unpacked in `u`) times every token: passes of [`TOKENS`], then one of
/// 3, 2 or 1.
#[inline(always)]
unsafe fn block_tokens<K: UnpackOnce, const G: usize>(
    m: &X8<'_, K>,
    g0: usize,
    u: &[Line],
    acts: &[BlockQ8K],
    n_tokens: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let nb = m.nb;
    let group_lines = nb * K::LINES;
    let mut us = [&u[..0]; G];
    for (g, us) in us.iter_mut().enumerate() {
        *us = &u[g * group_lines..(g + 1) * group_lines];
    }
    let mut t = 0;
    while t + TOKENS <= n_tokens {
        pass::<K, TOKENS, G>(m, g0, us, acts, t, out, out_stride);
        t += TOKENS;
    }
    match n_tokens - t {
        3 => pass::<K, 3, G>(m, g0, us, acts, t, out, out_stride),
        2 => pass::<K, 2, G>(m, g0, us, acts, t, out, out_stride),
        1 => pass::<K, 1, G>(m, g0, us, acts, t, out, out_stride),
        _ => {}
    }
}

/// Groups `g0..g0 + G` (`us`) times tokens `t..t + T` of `acts`, into their output rows.
#[inline(always)]
unsafe fn pass<K: UnpackOnce, const T: usize, const G: usize>(
    m: &X8<'_, K>,
    g0: usize,
    us: [&[Line]; G],
    acts: &[BlockQ8K],
    t: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let nb = m.nb;
    let mut a = [&acts[..0]; T];
    for (j, a) in a.iter_mut().enumerate() {
        *a = &acts[(t + j) * nb..(t + j + 1) * nb];
    }
    let v = K::block_dot::<T, G>(us, a);
    for (j, v) in v.into_iter().enumerate() {
        put(m, g0, v, &mut out[(t + j) * out_stride..]);
    }
}

/// Groups `g0..g0 + G`'s results for one token into its output row `out`.
#[inline(always)]
unsafe fn put<K: Group, const G: usize>(m: &X8<'_, K>, g0: usize, v: [__m256; G], out: &mut [f32]) {
    for (g, v) in v.into_iter().enumerate() {
        let mut rows = [0f32; GROUP_ROWS];
        // SAFETY (store): exactly the 32 bytes of `rows`.
        _mm256_storeu_ps(rows.as_mut_ptr(), v);
        m.scatter(g0 + g, &rows, &mut out[..m.rows]);
    }
}

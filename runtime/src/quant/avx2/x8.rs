//! The row and token loops over K-quant rows interleaved 8 by 8 (`interleave.rs`), shared by
//! `q4k_x8.rs` and `q6k_x8.rs`. Under the safety contract of `avx2.rs`.

use super::*;
use crate::quant::interleave::{Group, GROUP_ROWS, X8};

/// An interleaved super-block type with an 8-lane kernel.
pub(crate) trait Kernel8: Group {
    /// One group's 8 results (lane r: row r) for each of T tokens over its super-blocks `w`;
    /// `a[t]` holds token t's activation blocks (at least `w.len()`). Each lane is its row's
    /// scalar dot, bit for bit.
    unsafe fn group_dot<const T: usize>(w: &[Self], a: [&[BlockQ8K]; T]) -> [__m256; T];
}

/// Group `g`'s 8 results into the matrix rows they hold (`out[r]` for row r).
#[inline(always)]
unsafe fn store_group<G: Group>(m: &X8<'_, G>, g: usize, v: __m256, out: &mut [f32]) {
    let mut tmp = [0f32; GROUP_ROWS];
    _mm256_storeu_ps(tmp.as_mut_ptr(), v);
    m.scatter(g, &tmp, out);
}

/// `out[r]` = row r of `m` times `act` (the column range's activation blocks).
#[inline(always)]
unsafe fn matvec_x8<G: Kernel8>(m: X8<'_, G>, act: &[BlockQ8K], out: &mut [f32]) {
    assert!(out.len() >= m.rows && act.len() >= m.nb);
    for g in 0..m.groups() {
        let [v] = G::group_dot::<1>(m.group(g), [&act[..m.nb]]);
        store_group(&m, g, v, out);
    }
}

/// `out[t * out_stride + r]` = row r of `m` times token t of `acts` (`nb` blocks per token):
/// 4 tokens per pass over a group, then one at a time.
#[inline(always)]
unsafe fn matmul_x8<G: Kernel8>(
    m: X8<'_, G>,
    acts: &[BlockQ8K],
    n_tokens: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    assert!(acts.len() >= n_tokens * m.nb);
    let tok = |t: usize| &acts[t * m.nb..(t + 1) * m.nb];
    for g in 0..m.groups() {
        let w = m.group(g);
        let mut t = 0;
        while t + 4 <= n_tokens {
            let v = G::group_dot::<4>(w, [tok(t), tok(t + 1), tok(t + 2), tok(t + 3)]);
            for (j, v) in v.into_iter().enumerate() {
                let o = (t + j) * out_stride;
                store_group(&m, g, v, &mut out[o..o + m.rows]);
            }
            t += 4;
        }
        while t < n_tokens {
            let [v] = G::group_dot::<1>(w, [tok(t)]);
            store_group(&m, g, v, &mut out[t * out_stride..t * out_stride + m.rows]);
            t += 1;
        }
    }
}

/// AVX2 + FMA + F16C entry points (every SIMD ISA).
pub(crate) mod entry {
    use super::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn matvec<G: Kernel8>(m: X8<'_, G>, act: &[BlockQ8K], out: &mut [f32]) {
        matvec_x8(m, act, out)
    }

    /// `out[t * out_stride + r]`, 4 tokens per pass over each group.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn matmul<G: Kernel8>(
        m: X8<'_, G>,
        acts: &[BlockQ8K],
        n_tokens: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        matmul_x8(m, acts, n_tokens, out, out_stride)
    }
}

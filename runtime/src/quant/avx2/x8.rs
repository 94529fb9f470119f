//! The entry points of the AVX2 kernels over K-quant rows interleaved 8 by 8
//! (`q4k_x8.rs`, `q6k_x8.rs`); the row and token loops are `interleave.rs`'s. Under the safety
//! contract of `avx2.rs`.

use super::*;
use crate::quant::interleave::{matmul_groups, matvec_groups, Kernel8, Lanes8, GROUP_ROWS, X8};

impl Lanes8 for __m256 {
    #[inline(always)]
    unsafe fn to_array(self) -> [f32; GROUP_ROWS] {
        let mut tmp = [0f32; GROUP_ROWS];
        _mm256_storeu_ps(tmp.as_mut_ptr(), self);
        tmp
    }
}

/// AVX2 + FMA + F16C entry points (every SIMD ISA).
pub(crate) mod entry {
    use super::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn matvec<G: Kernel8>(m: X8<'_, G>, act: &[BlockQ8K], out: &mut [f32]) {
        matvec_groups(m, act, out)
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
        matmul_groups::<G, 4>(m, acts, n_tokens, out, out_stride)
    }
}

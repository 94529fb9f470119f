//! The dense backend of the `Npu` actor.
//!
//! An NPU runs precompiled graphs of fixed shape, so a prefill is cut into launches of a fixed
//! number of tokens (the plan's `dense.token_chunk`) against row blocks fixed by the plan's
//! cluster sizes. This machine has no NPU: [`ChunkedGemm`] keeps that shape discipline and runs
//! each launch as the int8 GEMM of the quantized kernels on the group's CPU cores. No benchmark
//! here measures a real NPU. A QNN or GPU backend plugs in behind the same trait.

use conductor_runtime::exec::DenseBackend;
use conductor_runtime::quant::{activation_type, Kernels, MatRef};
use std::ops::Range;

/// Launches of at most `token_chunk` tokens, each a GEMM on the CPU.
pub struct ChunkedGemm {
    pub token_chunk: usize,
}

impl DenseBackend for ChunkedGemm {
    fn matmul(
        &self,
        kernels: &Kernels,
        w: MatRef<'_>,
        cols: Range<usize>,
        acts: &[u8],
        n_tokens: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        let row_bytes = activation_type(w.ty)
            .bytes_for(cols.len() as u64)
            .expect("activation rows are whole blocks") as usize;
        let chunk = self.token_chunk.max(1);
        let mut t0 = 0;
        while t0 < n_tokens {
            let n = chunk.min(n_tokens - t0);
            let out_end = ((t0 + n - 1) * out_stride + w.rows).min(out.len());
            kernels.matmul_cols(
                w,
                cols.clone(),
                &acts[t0 * row_bytes..(t0 + n) * row_bytes],
                n,
                &mut out[t0 * out_stride..out_end],
                out_stride,
            );
            t0 += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use conductor_runtime::exec::WholeMatmul;
    use conductor_runtime::quant::{quantize_row, GgmlType, Layout};

    fn matrix(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
        let row_bytes = ty.bytes_for(cols as u64).unwrap() as usize;
        let mut data = vec![0u8; rows * row_bytes];
        for (r, dst) in data.chunks_exact_mut(row_bytes).enumerate() {
            let src: Vec<f32> = (0..cols)
                .map(|i| (((r * 31 + i * 17) % 23) as f32 - 11.0) / 7.0)
                .collect();
            quantize_row(ty, &src, dst).unwrap();
        }
        data
    }

    #[test]
    fn chunked_launches_give_the_bits_of_one_gemm() {
        let kernels = Kernels::best();
        let (rows, cols) = (40, 128);
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_0] {
            let data = matrix(ty, rows, cols);
            let w = MatRef {
                ty,
                data: &data,
                rows,
                cols,
                layout: Layout::Rows,
            };
            let at = activation_type(ty);
            let row_bytes = at.bytes_for(cols as u64).unwrap() as usize;
            let n = 70;
            let mut acts = vec![0u8; n * row_bytes];
            for t in 0..n {
                let x: Vec<f32> = (0..cols)
                    .map(|i| ((i * 7 + t * 13) % 17) as f32 - 8.0)
                    .collect();
                kernels.quantize_activations(ty, &x, &mut acts[t * row_bytes..(t + 1) * row_bytes]);
            }
            let stride = rows + 3;
            let mut whole = vec![0f32; n * stride];
            WholeMatmul.matmul(&kernels, w, 0..cols, &acts, n, &mut whole, stride);
            for chunk in [1, 16, 64, 128] {
                let mut chunked = vec![0f32; n * stride];
                ChunkedGemm { token_chunk: chunk }.matmul(
                    &kernels,
                    w,
                    0..cols,
                    &acts,
                    n,
                    &mut chunked,
                    stride,
                );
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&chunked), bits(&whole), "{ty} chunk {chunk}");
            }
        }
    }
}

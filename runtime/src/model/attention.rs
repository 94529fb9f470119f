//! Attention of one query over one KV head of the f16 cache.
//!
//! One numerics for every query, however many a step holds (issue 41: a position's output
//! never depends on how its prompt was split, reused or batched): llama.cpp's tiled CPU
//! flash-attention path, f32 query, keys and values widened from the f16 cache, tiles of 64
//! positions, f32 accumulation. llama.cpp itself takes it for batches of 64 queries or more and
//! an f16-accumulating vector path below; the tiled one is the more accurate of the two.
//! The tile's products (`Kernels::dot_f32_f16_rows`, `Kernels::axpy_f16_rows`: each output the
//! bits of the one-row `dot_f32_f16` / `axpy_f16` in row order) are bit-identical to their
//! scalar twins on every ISA.

use crate::quant::Kernels;
use half::f16;
use half::slice::HalfBitsSliceExt;

/// Positions per tile in [`attend`] (llama.cpp's `GGML_FA_TILE_KV`).
const KV_TILE: usize = 64;

/// Scratch vectors reused across calls (one per worker thread).
#[derive(Default)]
pub struct AttnScratch {
    scores: Vec<f32>,
}

/// Attends `q` (f32, `head_dim`) over the first `n_kv` positions of `keys`/`values`
/// (`[position][head_dim]` f16 bits), writing `head_dim` outputs: f32 accumulation over tiles
/// of 64 positions with online softmax. Keys and values are read from the f16 cache directly
/// by the SIMD dot/axpy kernels.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    kernels: &Kernels,
    q: &[f32],
    keys: &[u16],
    values: &[u16],
    n_kv: usize,
    scale: f32,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let hd = q.len();
    let keys: &[f16] = keys.reinterpret_cast();
    let values: &[f16] = values.reinterpret_cast();
    out.iter_mut().for_each(|o| *o = 0.0);
    scratch.scores.resize(KV_TILE, 0.0);
    let (mut sum, mut max) = (0.0f32, f32::NEG_INFINITY);
    for tile in (0..n_kv).step_by(KV_TILE) {
        let len = KV_TILE.min(n_kv - tile);
        let rows = tile * hd..(tile + len) * hd;
        kernels.dot_f32_f16_rows(q, &keys[rows.clone()], &mut scratch.scores[..len]);
        let mut tile_max = f32::NEG_INFINITY;
        for s in &mut scratch.scores[..len] {
            *s *= scale;
            tile_max = tile_max.max(*s);
        }
        let new_max = max.max(tile_max);
        if new_max > max {
            let ms = (max - new_max).exp();
            out.iter_mut().for_each(|o| *o *= ms);
            sum *= ms;
        }
        max = new_max;
        let mut tile_sum = 0.0f64;
        for s in &mut scratch.scores[..len] {
            *s = (*s - max).exp();
            tile_sum += *s as f64;
        }
        sum += tile_sum as f32;
        kernels.axpy_f16_rows(&scratch.scores[..len], &values[rows], out);
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    out.iter_mut().for_each(|o| *o *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn to_bits(v: &[f32]) -> Vec<u16> {
        v.iter().map(|&x| f16::from_f32(x).to_bits()).collect()
    }

    /// Softmax attention in f64 on the f16-rounded inputs: the exact answer.
    fn reference(q: &[f32], k: &[u16], v: &[u16], n_kv: usize, scale: f32) -> Vec<f64> {
        let hd = q.len();
        let h = |x: u16| f16::from_bits(x).to_f32() as f64;
        let scores: Vec<f64> = (0..n_kv)
            .map(|p| (0..hd).map(|d| q[d] as f64 * h(k[p * hd + d])).sum::<f64>() * scale as f64)
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let total: f64 = w.iter().sum();
        (0..hd)
            .map(|d| (0..n_kv).map(|p| w[p] * h(v[p * hd + d])).sum::<f64>() / total)
            .collect()
    }

    fn vectors(n: usize) -> impl Strategy<Value = Vec<f32>> {
        proptest::collection::vec(-4.0f32..4.0, n)
    }

    proptest! {
        #[test]
        fn attention_matches_exact_softmax_attention_with_the_same_bits_on_every_kernel_set(
            q in vectors(64), kv in vectors(64 * 150), vv in vectors(64 * 150), n_kv in 1usize..150,
        ) {
            let (k, v) = (to_bits(&kv), to_bits(&vv));
            let scale = 0.125;
            let exact = reference(&q, &k, &v, n_kv, scale);
            let mut scratch = AttnScratch::default();
            let mut first: Option<Vec<u32>> = None;
            for kernels in Kernels::available() {
                let mut a = vec![0.0; 64];
                attend(&kernels, &q, &k, &v, n_kv, scale, &mut scratch, &mut a);
                for d in 0..64 {
                    prop_assert!((a[d] as f64 - exact[d]).abs() < 1e-4, "{d}: {} vs {}", a[d], exact[d]);
                }
                let bits: Vec<u32> = a.iter().map(|x| x.to_bits()).collect();
                match &first {
                    Some(f) => prop_assert_eq!(f, &bits, "{}", kernels.isa()),
                    None => first = Some(bits),
                }
            }
        }
    }

    #[test]
    fn a_single_position_returns_its_value() {
        let q = vec![0.3f32; 64];
        let k = to_bits(&[0.5f32; 64]);
        let v = to_bits(&(0..64).map(|i| i as f32 / 8.0).collect::<Vec<_>>());
        let mut scratch = AttnScratch::default();
        let mut out = vec![0.0; 64];
        attend(
            &Kernels::best(),
            &q,
            &k,
            &v,
            1,
            0.125,
            &mut scratch,
            &mut out,
        );
        for (i, o) in out.iter().enumerate() {
            assert_eq!(*o, i as f32 / 8.0);
        }
    }
}

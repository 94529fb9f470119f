//! How decode's phases speed up with worker threads on this machine (for `conductor
//! profile-hw`): the simulator's `memory.stream_scaling`.
//!
//! Measured on the pattern decode runs, not on a kernel alone: FFN phases of a SmolLM2-shaped
//! layer (1536×576 Q4_1; 12 clusters of 128 neurons: gate and up rows, SiLU·up, down columns),
//! each phase a fresh copy of the layer streamed from DRAM, the clusters spread over a
//! `WorkerPool` of `k` pinned threads exactly as the executor spreads them. Two cores streaming
//! at once slow each other down, and small phases lose time to handing out and joining work:
//! both show here.

use crate::pool::{PoolConfig, WorkerPool};
use conductor_runtime::exec::ClusterRunner;
use conductor_runtime::model::ops::gated_activation;
use conductor_runtime::model::FfnActivation;
use conductor_runtime::quant::{activation_type, quantize_row, GgmlType, Kernels, MatRef};
use std::time::Instant;

const FF: usize = 1536;
const EMBD: usize = 576;
const CLUSTER: usize = 128;
const TY: GgmlType = GgmlType::Q4_1;

fn matrix(rows: usize, cols: usize, seed: usize) -> Vec<u8> {
    let row_bytes = TY.bytes_for(cols as u64).expect("whole blocks") as usize;
    let mut out = vec![0u8; rows * row_bytes];
    for (r, dst) in out.chunks_exact_mut(row_bytes).enumerate() {
        let src: Vec<f32> = (0..cols)
            .map(|i| (((r + seed) * 31 + i * 17) % 29) as f32 / 14.0 - 1.0)
            .collect();
        quantize_row(TY, &src, dst).expect("a supported type");
    }
    out
}

/// Phases per second of FFN phases on `threads` workers pinned to `cores`.
fn phases_per_second(layers: &[(Vec<u8>, Vec<u8>, Vec<u8>)], cores: &[u32], rounds: usize) -> f64 {
    let threads = cores.len();
    // A thread of its own: the pool pins its calling thread as worker 0.
    std::thread::scope(|s| {
        s.spawn(|| {
            let pool = WorkerPool::new(PoolConfig {
                cores: cores.iter().map(|&c| c as usize).collect(),
                ..PoolConfig::new(threads)
            })
            .expect("worker threads");
            let kernels = Kernels::best();
            let x: Vec<f32> = (0..EMBD).map(|i| (i % 13) as f32 / 6.0 - 1.0).collect();
            let act_bytes = activation_type(TY)
                .bytes_for(EMBD as u64)
                .expect("whole blocks");
            let mut act = vec![0u8; act_bytes as usize];
            kernels.quantize_activations(TY, &x, &mut act);
            let hidden_bytes = activation_type(TY)
                .bytes_for(CLUSTER as u64)
                .expect("whole blocks") as usize;
            let row_bytes = TY.bytes_for(EMBD as u64).expect("whole blocks") as usize;
            let mut blocks = vec![0f32; FF / CLUSTER * EMBD];
            let mut phase = |layer: &(Vec<u8>, Vec<u8>, Vec<u8>)| {
                let mut outs: Vec<&mut [f32]> = blocks.chunks_mut(EMBD).collect();
                pool.run(&mut outs, &|_, c, out| {
                    let rows = c * CLUSTER..(c + 1) * CLUSTER;
                    let bytes = rows.start * row_bytes..rows.end * row_bytes;
                    let (mut gate, mut up) = (vec![0f32; CLUSTER], vec![0f32; CLUSTER]);
                    let g =
                        MatRef::new(TY, &layer.0[bytes.clone()], CLUSTER, EMBD).expect("geometry");
                    let u = MatRef::new(TY, &layer.1[bytes], CLUSTER, EMBD).expect("geometry");
                    kernels.matvec(g, 0..EMBD, &act, &mut gate);
                    kernels.matvec(u, 0..EMBD, &act, &mut up);
                    gated_activation(FfnActivation::Silu, &mut gate, &up);
                    let mut hidden = vec![0u8; hidden_bytes];
                    kernels.quantize_activations(TY, &gate, &mut hidden);
                    let d = MatRef::new(TY, &layer.2, EMBD, FF).expect("geometry");
                    kernels.matvec(d, rows, &hidden, out);
                });
            };
            for layer in layers.iter().take(4) {
                phase(layer); // warm up the threads
            }
            let start = Instant::now();
            for i in 0..rounds {
                phase(&layers[i % layers.len()]);
            }
            rounds as f64 / start.elapsed().as_secs_f64()
        })
        .join()
        .expect("the measuring thread")
    })
}

/// Element `k - 1`: decode's FFN phases on `k` of `cores` (in order) per second, against one.
/// Median of `reps` measurements each; the layer copies total about `stream_bytes`.
pub fn measure_decode_scaling(cores: &[u32], stream_bytes: usize, reps: usize) -> Vec<f64> {
    let layer_bytes = 3 * TY.bytes_for((FF * EMBD) as u64).expect("whole blocks") as usize;
    let copies = stream_bytes.div_ceil(layer_bytes).max(4);
    let layers: Vec<_> = (0..copies)
        .map(|c| {
            (
                matrix(FF, EMBD, 3 * c),
                matrix(FF, EMBD, 3 * c + 1),
                matrix(EMBD, FF, 3 * c + 2),
            )
        })
        .collect();
    let rounds = 4 * copies;
    let median = |k: usize| {
        let mut v: Vec<f64> = (0..reps.max(1))
            .map(|_| phases_per_second(&layers, &cores[..k], rounds))
            .collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let one = median(1);
    (1..=cores.len())
        .map(|k| if k == 1 { 1.0 } else { median(k) / one })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_core_is_the_unit_and_every_count_is_measured() {
        let s = measure_decode_scaling(&[0, 0], 8 << 20, 1);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0], 1.0);
        assert!(s[1] > 0.0 && s[1].is_finite());
    }
}

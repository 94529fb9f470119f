//! One core's compute rates, through the runtime's public kernels: quantized matvec (weights in
//! cache and streamed from DRAM), matmul, attention, and the per-element "finish" work.

use super::peak::{int8_peak, Int8Peak};
use super::timing::{secs_per_call, signed_units, Effort};
use conductor_runtime::model::attention::{attend, AttnScratch};
use conductor_runtime::model::ops::{gated_activation, rms_norm};
use conductor_runtime::model::FfnActivation;
use conductor_runtime::plan::{KernelRates, FEW_TOKENS};
use conductor_runtime::quant::{activation_type, quantize_row, GgmlType, Kernels, MatRef};
use conductor_runtime::sample::SplitMix64;
use half::f16;
use std::hint::black_box;

/// Weight types profiled, in the order they appear in the profile (kept if the kernels support
/// them): every type a Q4_K_M-style file mixes in. F16 and BF16 are there for the odd float
/// tensor in GGUF files (outputs, embeddings).
pub const WEIGHT_TYPES: [GgmlType; 14] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::F16,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q5_K,
    GgmlType::IQ4_XS,
    GgmlType::BF16,
];

/// SmolLM2-135M's FFN shape: n_ff 1536 × n_embd 576.
const BIG: usize = 1536;
const SMALL: usize = 576;
/// Tokens of the prefill matmul: one launch of the default plan's dense backend.
pub const MATMUL_TOKENS: usize = 256;
/// Rows of the prefill matmul: one cluster of the default plan's prefill phases.
pub const MATMUL_ROWS: usize = 128;
/// Attention geometry: SmolLM2's head_dim over a modest context.
pub const HEAD_DIM: usize = 64;
pub const CACHED_POSITIONS: usize = 512;
/// Row width of the finish measurement (SmolLM2's n_embd).
pub const FINISH_WIDTH: usize = 576;

/// `(rows, cols)` of the profiled matrix: 1536×576 (an up/gate projection), or 576×1536 (the
/// down projection, same MACs) for types whose blocks do not divide 576 (K-quants: 256).
pub fn shape(ty: GgmlType) -> (usize, usize) {
    if SMALL.is_multiple_of(ty.block_size()) {
        (BIG, SMALL)
    } else {
        (SMALL, BIG)
    }
}

/// What one core measured.
pub struct CoreRates {
    pub kernels: Vec<KernelRates>,
    /// The int8 multiply-add peak (`peak.rs`), where this build measures one.
    pub int8_peak: Option<Int8Peak>,
    pub activation_ns_per_element: f64,
    pub attn_decode_ns_per_head_pos: f64,
    pub attn_prefill_gflops: f64,
    pub finish_ns_per_element: f64,
}

/// `rows × cols` weights of type `ty` in the file layout, from pseudo-random values.
fn quantized(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    let rb = ty
        .bytes_for(cols as u64)
        .expect("profiled shapes are whole blocks") as usize;
    let mut out = vec![0u8; rows * rb];
    let mut row = vec![0f32; cols];
    for dst in out.chunks_mut(rb) {
        row.iter_mut().for_each(|v| *v = rng.signed_unit());
        quantize_row(ty, &row, dst).expect("supported type, whole blocks");
    }
    out
}

/// Activation rows for `n` tokens of `cols` elements, as the kernels take them for `ty`.
fn activations(k: &Kernels, ty: GgmlType, cols: usize, n: usize, seed: u64) -> Vec<u8> {
    let arow = activation_type(ty)
        .bytes_for(cols as u64)
        .expect("whole blocks") as usize;
    let mut rng = SplitMix64::new(seed);
    let mut acts = vec![0u8; arow * n];
    for dst in acts.chunks_mut(arow) {
        k.quantize_activations(ty, &signed_units(&mut rng, cols), dst);
    }
    acts
}

/// Matvec in cache, matvec streamed over `stream_bytes` of weight copies, and matmul, for `ty`.
pub fn kernel_rates(k: &Kernels, ty: GgmlType, stream_bytes: u64, effort: &Effort) -> KernelRates {
    let (rows, cols) = shape(ty);
    let macs = (rows * cols) as f64;
    let w = quantized(ty, rows, cols, 1 + ty.id() as u64);
    let act = activations(k, ty, cols, 1, 2);
    let mut out = vec![0f32; rows];

    let hot = secs_per_call(effort, || {
        let m = MatRef::new(ty, &w, rows, cols).expect("valid geometry");
        k.matvec(m, 0..cols, black_box(&act), &mut out);
        black_box(&out);
    });

    // Copies of the matrix back to back, visited in turn: each call finds its weights evicted
    // from every cache level, as in decoding a model larger than the LLC.
    let copies = (stream_bytes as usize).div_ceil(w.len()).max(2);
    let mut copies_buf = Vec::with_capacity(w.len() * copies);
    for _ in 0..copies {
        copies_buf.extend_from_slice(&w);
    }
    let mut i = 0;
    let stream = secs_per_call(effort, || {
        i = (i + 1) % copies;
        let data = &copies_buf[i * w.len()..(i + 1) * w.len()];
        let m = MatRef::new(ty, data, rows, cols).expect("valid geometry");
        k.matvec(m, 0..cols, black_box(&act), &mut out);
        black_box(&out);
    });

    // As the executor calls it in prefill: one cluster of rows against one launch of tokens,
    // the clusters of the whole matrix in turn (so the weight repacking per call is counted).
    let acts = activations(k, ty, cols, MATMUL_TOKENS, 3);
    let mut outs = vec![0f32; MATMUL_ROWS * MATMUL_TOKENS];
    let row_bytes = w.len() / rows;
    let mut cluster = 0;
    let matmul = secs_per_call(effort, || {
        cluster = (cluster + 1) % (rows / MATMUL_ROWS);
        let block = &w[cluster * MATMUL_ROWS * row_bytes..(cluster + 1) * MATMUL_ROWS * row_bytes];
        let m = MatRef::new(ty, block, MATMUL_ROWS, cols).expect("valid geometry");
        k.matmul(m, black_box(&acts), MATMUL_TOKENS, &mut outs, MATMUL_ROWS);
        black_box(&outs);
    });

    // A verified draft: a few tokens against the whole matrix, streamed (the copies again).
    let few_acts = activations(k, ty, cols, FEW_TOKENS, 4);
    let mut few_out = vec![0f32; rows * FEW_TOKENS];
    let mut i = 0;
    let few = secs_per_call(effort, || {
        i = (i + 1) % copies;
        let data = &copies_buf[i * w.len()..(i + 1) * w.len()];
        let m = MatRef::new(ty, data, rows, cols).expect("valid geometry");
        k.matmul(m, black_box(&few_acts), FEW_TOKENS, &mut few_out, rows);
        black_box(&few_out);
    });
    drop(copies_buf);

    KernelRates {
        ty,
        matvec_gmacs: macs / hot / 1e9,
        matvec_stream_gmacs: macs / stream / 1e9,
        matmul_gmacs: (MATMUL_ROWS * cols * MATMUL_TOKENS) as f64 / matmul / 1e9,
        ffn_cluster_stream_gmacs: ffn_cluster_rate(k, ty, stream_bytes, effort),
        matmul_few_gmacs: Some(macs * FEW_TOKENS as f64 / few / 1e9),
    }
}

/// Neurons per FFN cluster in the default plan.
pub const FFN_CLUSTER: usize = 128;

/// Decode's FFN neuron clusters, streamed: a 1536×576 FFN swept cluster by cluster (128
/// neurons: the gate and up rows, SiLU·up, the hidden values quantized, the down projection over
/// those neurons' columns held as the cluster's own contiguous block-column, as the engine lays
/// it out at load (`DownBlocks`) — exactly what the executor does per cluster), each call a fresh
/// copy of the layer, as decode reaches every layer's weights from DRAM. `None` for types whose
/// blocks do not divide the 576-wide rows (K-quants).
fn ffn_cluster_rate(k: &Kernels, ty: GgmlType, stream_bytes: u64, effort: &Effort) -> Option<f64> {
    if !SMALL.is_multiple_of(ty.block_size()) || !FFN_CLUSTER.is_multiple_of(ty.block_size()) {
        return None;
    }
    let (ff, embd) = (BIG, SMALL);
    let layer_bytes = 3 * ty.bytes_for((ff * embd) as u64)? as usize;
    // Copies of (gate, up, down) visited in turn, as decode visits layers.
    let copies = (stream_bytes as usize).div_ceil(layer_bytes).max(2);
    // One layer quantized, then copied: the copies only have to live at other addresses (some
    // quantizers, IQ4_NL's, search per block and would take minutes over 128 MiB).
    let layer = (
        quantized(ty, ff, embd, 100),
        quantized(ty, ff, embd, 101),
        // The down projection as the engine holds it in memory (`DownBlocks`): one
        // contiguous block-column of n_embd rows per cluster, in cluster order.
        quantized(ty, embd * (ff / FFN_CLUSTER), FFN_CLUSTER, 102),
    );
    let layers = vec![layer; copies];
    let act = activations(k, ty, embd, 1, 4);
    let hidden_bytes = activation_type(ty).bytes_for(FFN_CLUSTER as u64)? as usize;
    let mut hidden = vec![0u8; hidden_bytes];
    let (mut gate, mut up) = (vec![0f32; FFN_CLUSTER], vec![0f32; FFN_CLUSTER]);
    let mut out = vec![0f32; embd];
    let clusters = ff / FFN_CLUSTER;
    let row_bytes = ty.bytes_for(embd as u64).expect("whole blocks") as usize;
    let block = embd * ty.bytes_for(FFN_CLUSTER as u64).expect("whole blocks") as usize;
    let mut i = 0;
    let secs = secs_per_call(effort, || {
        i += 1;
        let (g, u, d) = &layers[i % copies];
        for c in 0..clusters {
            let rows = c * FFN_CLUSTER..(c + 1) * FFN_CLUSTER;
            let bytes = rows.start * row_bytes..rows.end * row_bytes;
            let gm = MatRef::new(ty, &g[bytes.clone()], FFN_CLUSTER, embd).expect("valid geometry");
            let um = MatRef::new(ty, &u[bytes], FFN_CLUSTER, embd).expect("valid geometry");
            k.matvec(gm, 0..embd, black_box(&act), &mut gate);
            k.matvec(um, 0..embd, black_box(&act), &mut up);
            gated_activation(FfnActivation::Silu, &mut gate, &up);
            k.quantize_activations(ty, &gate, &mut hidden);
            let dm = MatRef::new(ty, &d[c * block..(c + 1) * block], embd, FFN_CLUSTER)
                .expect("valid geometry");
            k.matvec(dm, 0..FFN_CLUSTER, &hidden, &mut out);
            black_box(&out);
        }
    });
    Some((3 * ff * embd) as f64 / secs / 1e9)
}

fn f16_bits(rng: &mut SplitMix64, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| f16::from_f32(rng.signed_unit()).to_bits())
        .collect()
}

/// Decode attention (ns per query head and cached position, `attend`) and prefill attention
/// (GFLOP/s, `attend` causally, 4·head_dim flops per query·key pair), over an f16 KV cache:
/// one attention for every step.
pub fn attention_rates(k: &Kernels, effort: &Effort) -> (f64, f64) {
    let mut rng = SplitMix64::new(11);
    let keys = f16_bits(&mut rng, HEAD_DIM * CACHED_POSITIONS);
    let values = f16_bits(&mut rng, HEAD_DIM * CACHED_POSITIONS);
    let q = signed_units(&mut rng, HEAD_DIM);
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();
    let mut scratch = AttnScratch::default();
    let mut out = vec![0f32; HEAD_DIM];
    let decode = secs_per_call(effort, || {
        attend(
            k,
            black_box(&q),
            &keys,
            &values,
            CACHED_POSITIONS,
            scale,
            &mut scratch,
            &mut out,
        );
        black_box(&out);
    });
    // Prefill attends causally, as the executor does: query t over positions 0..=t.
    let prefill = secs_per_call(effort, || {
        for t in 0..CACHED_POSITIONS {
            attend(
                k,
                black_box(&q),
                &keys,
                &values,
                t + 1,
                scale,
                &mut scratch,
                &mut out,
            );
            black_box(&out);
        }
    });
    let decode_ns = decode * 1e9 / CACHED_POSITIONS as f64;
    let pairs = (CACHED_POSITIONS * (CACHED_POSITIONS + 1) / 2) as f64;
    let flops = 4.0 * HEAD_DIM as f64 * pairs;
    (decode_ns, flops / prefill / 1e9)
}

/// The work between phases, per element: residual add, RMSNorm, and quantizing the result
/// for the next matvec (Q8_1, the activations of the default model's Q4_1 weights).
pub fn finish_ns_per_element(k: &Kernels, effort: &Effort) -> f64 {
    let (rows, n) = (effort.finish_rows, FINISH_WIDTH);
    let mut rng = SplitMix64::new(13);
    let x = signed_units(&mut rng, rows * n);
    let residual = signed_units(&mut rng, rows * n);
    let weight = signed_units(&mut rng, n);
    let ty = GgmlType::Q4_1;
    let arow = activation_type(ty)
        .bytes_for(n as u64)
        .expect("whole blocks") as usize;
    let mut sum = vec![0f32; n];
    let mut normed = vec![0f32; n];
    let mut act = vec![0u8; arow];
    let secs = secs_per_call(effort, || {
        for (xr, rr) in x.chunks(n).zip(residual.chunks(n)) {
            for ((s, a), b) in sum.iter_mut().zip(xr).zip(rr) {
                *s = a + b;
            }
            rms_norm(black_box(&sum), &weight, 1e-5, &mut normed);
            k.quantize_activations(ty, &normed, &mut act);
            black_box(&act);
        }
    });
    // Three passes over each element (add, norm, quantize): the simulator counts passes.
    secs * 1e9 / (3 * rows * n) as f64
}

/// The FFN's gated activation, SiLU(gate)·up, over a prefill cluster's worth of elements:
/// nanoseconds per element.
pub fn activation_ns_per_element(effort: &Effort) -> f64 {
    let n = 128 * 256;
    let mut rng = SplitMix64::new(17);
    let gate = signed_units(&mut rng, n);
    let up = signed_units(&mut rng, n);
    let mut work = gate.clone();
    let secs = secs_per_call(effort, || {
        work.copy_from_slice(&gate);
        gated_activation(FfnActivation::Silu, black_box(&mut work), &up);
        black_box(&work);
    });
    secs * 1e9 / n as f64
}

/// Everything one core measures, with a progress line per step.
pub fn measure_core(
    k: &Kernels,
    stream_bytes: u64,
    effort: &Effort,
    say: &mut dyn FnMut(String),
) -> CoreRates {
    let mut kernels = Vec::new();
    for ty in WEIGHT_TYPES.into_iter().filter(|t| t.is_supported()) {
        let r = kernel_rates(k, ty, stream_bytes, effort);
        let (rows, cols) = shape(ty);
        say(format!(
            "  {ty:<5} {rows}x{cols}: matvec {:.1} GMAC/s in cache, {:.1} streamed; matmul x{MATMUL_TOKENS} {:.1} GMAC/s, x{FEW_TOKENS} streamed {:.1}; FFN cluster streamed {}",
            r.matvec_gmacs,
            r.matvec_stream_gmacs,
            r.matmul_gmacs,
            r.matmul_few_gmacs.unwrap_or(0.0),
            r.ffn_cluster_stream_gmacs.map_or("-".into(), |v| format!("{v:.1} GMAC/s"))
        ));
        kernels.push(r);
    }
    let peak = int8_peak(effort);
    match &peak {
        Some(p) => say(format!(
            "  int8 peak: {:.1} GMAC/s ({}); exact i32 (vpmaddubsw + vpmaddwd): {:.1} GMAC/s{}",
            p.gmacs,
            p.how,
            p.i32_gmacs,
            match p.unmeasured.is_empty() {
                true => String::new(),
                false => format!("; not measured: {}", p.unmeasured.join(", ")),
            }
        )),
        None => say("  int8 peak: not measured on this CPU".into()),
    }
    let (decode_ns, prefill_gflops) = attention_rates(k, effort);
    say(format!(
        "  attention (head_dim {HEAD_DIM}, {CACHED_POSITIONS} positions, f16 KV): decode {decode_ns:.2} ns per head·position, prefill {prefill_gflops:.1} GFLOP/s"
    ));
    let finish = finish_ns_per_element(k, effort);
    say(format!(
        "  finish (add + rms_norm + quantize, {FINISH_WIDTH} wide): {finish:.3} ns per element and pass"
    ));
    let activation = activation_ns_per_element(effort);
    say(format!(
        "  gated activation (SiLU(gate)·up): {activation:.2} ns per element"
    ));
    CoreRates {
        kernels,
        int8_peak: peak,
        activation_ns_per_element: activation,
        attn_decode_ns_per_head_pos: decode_ns,
        attn_prefill_gflops: prefill_gflops,
        finish_ns_per_element: finish,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiled_shapes_are_whole_blocks() {
        for ty in WEIGHT_TYPES {
            let (rows, cols) = shape(ty);
            assert_eq!(rows * cols, BIG * SMALL, "{ty}");
            assert!(ty.bytes_for(cols as u64).is_some(), "{ty}");
            assert!(ty.is_supported(), "{ty}");
        }
        assert_eq!(shape(GgmlType::Q4_K), (576, 1536));
        assert_eq!(shape(GgmlType::Q4_1), (1536, 576));
    }
}

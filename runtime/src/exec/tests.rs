//! Unit tests of the executor: the block layout, the prediction bits, the FFN clusters a step
//! needs, and that a phase gives the same bits however its clusters are split into commands,
//! ordered and spread over workers (on small synthetic models).

use super::blocks::{gather_row_blocks, part_span, row_blocks, split_blocks, INLINE_BLOCKS};
use super::compute::Activations;
use super::selection::any_predicted;
use super::{ClusterRunner, GroupOutput, Serial, StepState, WholeMatmul};
use crate::gguf::GgufFile;
use crate::model::{FfnActivation, KvCache, Model};
use crate::neuron::Phase;
use crate::plan::ClusterSizes;
use crate::quant::{activation_type, GgmlType, Kernels, Layout};
use crate::schedule::{ClusterWork, Program, StepRequest, StepShape, XpuId};
use crate::sparse::{SparseFfn, SparseLayer, SparsityMode};
use crate::synthetic::{synthetic_model, SyntheticSpec};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

#[test]
fn split_blocks_gives_disjoint_blocks_of_the_asked_lengths() {
    // More blocks than are kept inline, so the spill to the heap is covered too.
    let lens: Vec<usize> = [3, 0, 5, 1, 2, 7, 4, 0, 6, 2, 3, 1]
        .into_iter()
        .cycle()
        .take(INLINE_BLOCKS + 5)
        .collect();
    assert!(lens.len() > INLINE_BLOCKS);
    let total: usize = lens.iter().sum();
    let mut buf: Vec<f32> = (0..total + 4).map(|v| v as f32).collect();
    {
        let mut blocks = split_blocks(&mut buf[..total], lens.iter().copied());
        assert_eq!(blocks.len(), lens.len());
        let mut at = 0;
        for (block, &len) in blocks.iter().zip(&lens) {
            assert_eq!(block.len(), len);
            // Consecutive: each block starts where the previous one ended.
            let want: Vec<f32> = (at..at + len).map(|v| v as f32).collect();
            assert_eq!(&**block, want.as_slice());
            at += len;
        }
        for (i, block) in blocks.iter_mut().enumerate() {
            block.fill(-(i as f32) - 1.0);
        }
    }
    // Every value belongs to exactly the block it was in; the tail is untouched.
    let mut at = 0;
    for (i, &len) in lens.iter().enumerate() {
        assert!(buf[at..at + len].iter().all(|&v| v == -(i as f32) - 1.0));
        at += len;
    }
    let tail: Vec<f32> = (total..total + 4).map(|v| v as f32).collect();
    assert_eq!(&buf[total..], tail.as_slice());
}

#[test]
fn row_blocks_place_each_cluster_at_n_times_its_first_row() {
    let (n, total_rows) = (3, 12);
    // A group's part: clusters 1 and 2 of a phase cut 0..4, 4..7, 7..12.
    let clusters = [4..7, 7..12];
    let mut buf = Vec::new();
    {
        let mut blocks = row_blocks(&mut buf, &clusters, n, total_rows);
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0].len(), n * 3);
        assert_eq!(blocks[1].len(), n * 5);
        blocks[0].fill(1.0);
        blocks[1].fill(2.0);
    }
    assert_eq!(buf.len(), n * total_rows);
    assert!(buf[..n * 4].iter().all(|&v| v == 0.0));
    assert!(buf[n * 4..n * 7].iter().all(|&v| v == 1.0));
    assert!(buf[n * 7..].iter().all(|&v| v == 2.0));
    // Buffers never shrink.
    buf.resize(100, 7.0);
    drop(row_blocks(&mut buf, &clusters, 1, total_rows));
    assert_eq!(buf.len(), 100);
}

#[test]
fn gather_row_blocks_inverts_the_row_layout() {
    // Rows 0..5 cut 0..2, 2..5, for 3 tokens: `[cluster][token][rows]`.
    let (n, width) = (3, 5);
    let clusters = [0..2, 2..5];
    let value = |t: usize, r: usize| (t * 10 + r) as f32;
    let mut blocks = Vec::new();
    for c in &clusters {
        for t in 0..n {
            for r in c.start as usize..c.end as usize {
                blocks.push(value(t, r));
            }
        }
    }
    let mut out = vec![0.0; n * width];
    gather_row_blocks(&blocks, &clusters, n, width, &mut out);
    for t in 0..n {
        for r in 0..width {
            assert_eq!(out[t * width + r], value(t, r), "token {t} row {r}");
        }
    }
}

#[test]
fn any_predicted_looks_only_at_the_cluster_and_the_tokens_asked() {
    let (n_ff, n) = (200usize, 2);
    let words = n_ff.div_ceil(64);
    let mut bits = vec![0u64; n * words];
    let mut set = |t: usize, i: usize| bits[t * words + i / 64] |= 1 << (i % 64);
    set(0, 5);
    set(1, 130);
    assert!(any_predicted(&bits, words, n, &(0..6)));
    assert!(!any_predicted(&bits, words, n, &(0..5)));
    assert!(!any_predicted(&bits, words, n, &(6..130)));
    assert!(any_predicted(&bits, words, n, &(128..160)));
    // Token 1's prediction is not looked at for a step of one token.
    assert!(!any_predicted(&bits, words, 1, &(128..160)));
    assert!(!any_predicted(&bits, words, n, &(131..200)));
}

#[test]
fn activations_are_quantized_once_per_activation_format() {
    let kernels = Kernels::best();
    let cols = 64;
    let src: Vec<f32> = (0..2 * cols)
        .map(|i| ((i * 37) % 19) as f32 - 9.0)
        .collect();
    let mut acts = Activations::default();
    // Two weight types sharing an activation format, one with another.
    let types = [GgmlType::Q4_1, GgmlType::Q4_1, GgmlType::Q8_0];
    acts.prepare(&kernels, &src, cols, &types);
    for ty in types {
        let at = activation_type(ty);
        let row = at.bytes_for(cols as u64).unwrap() as usize;
        let mut want = vec![0u8; 2 * row];
        for (s, d) in src.chunks_exact(cols).zip(want.chunks_exact_mut(row)) {
            kernels.quantize_activations(ty, s, d);
        }
        assert_eq!(acts.get(ty), want.as_slice(), "{ty:?}");
    }
}

fn model(spec: &SyntheticSpec) -> Model {
    let bytes = synthetic_model(spec).unwrap().to_bytes().unwrap();
    Model::from_gguf(GgufFile::from_bytes(bytes).unwrap()).unwrap()
}

/// Several clusters in every phase of the default synthetic shape.
fn sizes() -> ClusterSizes {
    ClusterSizes {
        qkv_heads: 3,
        attn_heads: 1,
        attn_out_rows: 16,
        ffn_neurons: 32,
        ffn_rows: 48,
        output_rows: 100,
    }
}

/// Runs every cluster, last first, alternating two workers: a phase's bits must not depend
/// on the order or on which worker computes a cluster.
struct Backwards;

impl ClusterRunner for Backwards {
    fn workers(&self) -> usize {
        2
    }

    fn run(&self, outs: &mut [&mut [f32]], f: &(dyn Fn(usize, usize, &mut [f32]) + Sync)) {
        for (i, out) in outs.iter_mut().enumerate().rev() {
            f(i % 2, i, out);
        }
    }
}

/// How a phase's clusters are sent: as one command, or one command per cluster, last first.
#[derive(Clone, Copy, PartialEq)]
enum Split {
    Whole,
    OneByOne,
}

/// What a run of steps computed: every phase's output span, then the logits, as bits.
#[derive(Debug, PartialEq)]
struct Run {
    phases: Vec<(u32, Phase, Vec<u32>)>,
    logits: Vec<u32>,
}

/// A step state for `model` in memory, its FFN computed as its sparse decode says.
fn state_for(model: &Model, kernels: Kernels) -> StepState {
    let ffn = super::ffn_plan_of(model, &crate::plan::ExecutionPlan::default()).unwrap();
    StepState::reading(kernels, None, ffn)
}

/// Runs `steps` (several tokens: prefill; one: decode) on one executor and KV cache.
fn run(model: &Model, steps: &[&[u32]], split: Split) -> Run {
    run_with(model, steps, split, Kernels::best())
}

/// [`run`] with the given kernels.
fn run_with(model: &Model, steps: &[&[u32]], split: Split, kernels: Kernels) -> Run {
    let c = model.config();
    let shape = model.shape();
    let mut state = state_for(model, kernels);
    let mut kv = KvCache::new(
        c.n_layer as usize,
        c.n_head_kv as usize,
        c.head_dim as usize,
        64,
    )
    .unwrap();
    let outputs = [Mutex::new(GroupOutput::default())];
    let mut result = Run {
        phases: Vec::new(),
        logits: Vec::new(),
    };
    let mut n_past = 0;
    for (step, tokens) in steps.iter().enumerate() {
        let step_shape = if tokens.len() == 1 {
            StepShape::Decode
        } else {
            StepShape::Prefill
        };
        let program = Program::new(&shape, &sizes(), step_shape, &[(XpuId(0), 1)]);
        let request = StepRequest {
            step: step as u64,
            n_tokens: tokens.len() as u32,
            n_past,
            logits_from: 0,
            sequences: 1,
            resident_only: false,
        };
        state
            .begin_step(model, &request, tokens, model.config().n_ctx_train as usize)
            .unwrap();
        for layer in 0..=program.n_layer {
            let phases = if layer < program.n_layer {
                program.layer_phases.iter().collect::<Vec<_>>()
            } else {
                vec![&program.output]
            };
            for p in phases {
                let k = p.clusters.len() as u32;
                assert!(k > 1, "{:?} has one cluster: nothing to split", p.phase);
                let work = |clusters: Range<u32>| ClusterWork {
                    step: step as u64,
                    shape: step_shape,
                    layer,
                    phase: p.phase,
                    clusters,
                };
                let mut out = outputs[0].lock().unwrap();
                match split {
                    Split::Whole => {
                        let w = work(0..k);
                        state.compute(
                            model,
                            std::slice::from_ref(&kv),
                            &program,
                            &w,
                            &Serial,
                            &WholeMatmul,
                            &mut out,
                        );
                    }
                    Split::OneByOne => {
                        for i in (0..k).rev() {
                            let w = work(i..i + 1);
                            let runner = &Backwards;
                            state.compute(
                                model,
                                std::slice::from_ref(&kv),
                                &program,
                                &w,
                                runner,
                                &WholeMatmul,
                                &mut out,
                            );
                        }
                    }
                }
                let n = state.rows_in(p.phase);
                let span = part_span(model, &program, p.phase, n, &(0..k));
                let bits = out.buf[span].iter().map(|v| v.to_bits()).collect();
                result.phases.push((layer, p.phase, bits));
                drop(out);
                state.finish_phase(
                    model,
                    std::slice::from_mut(&mut kv),
                    &program,
                    layer,
                    p.phase,
                    &outputs,
                );
            }
        }
        result
            .logits
            .extend(state.logits().iter().map(|v| v.to_bits()));
        n_past += tokens.len() as u32;
    }
    result
}

/// The same bits whether each phase's clusters are computed as one range or one by one; and
/// the run computed something (finite logits that differ between tokens).
fn assert_split_invariant(model: &Model, steps: &[&[u32]]) -> Run {
    let whole = run(model, steps, Split::Whole);
    let vocab = model.config().n_vocab as usize;
    let n_tokens: usize = steps.iter().map(|s| s.len()).sum();
    assert_eq!(whole.logits.len(), n_tokens * vocab);
    let logits: Vec<f32> = whole.logits.iter().map(|&b| f32::from_bits(b)).collect();
    assert!(logits.iter().all(|v| v.is_finite()));
    assert_ne!(logits[..vocab], logits[vocab..2 * vocab]);
    let one_by_one = run(model, steps, Split::OneByOne);
    assert_eq!(whole.phases.len(), one_by_one.phases.len());
    for (a, b) in whole.phases.iter().zip(&one_by_one.phases) {
        assert_eq!(a, b, "layer {} phase {:?}", a.0, a.1);
    }
    assert_eq!(whole.logits, one_by_one.logits);
    whole
}

const PREFILL: &[u32] = &[5, 80, 17, 260, 33];

#[test]
fn dense_phases_give_the_same_bits_however_the_clusters_are_split() {
    let model = model(&SyntheticSpec::default());
    let run = assert_split_invariant(&model, &[PREFILL, &[42], &[7]]);
    // Prefill ran row phases, decode neuron clusters.
    let phases: Vec<Phase> = run.phases.iter().map(|p| p.1).collect();
    assert!(phases.contains(&Phase::FfnGateUpRows));
    assert!(phases.contains(&Phase::FfnNeurons));
}

#[test]
fn decode_clusters_with_their_own_down_block_columns_split_alike() {
    let mut model = model(&SyntheticSpec {
        arch: "qwen2",
        seed: 3,
        ..SyntheticSpec::default()
    });
    model.cluster_down_projections(sizes().ffn_neurons as usize);
    assert_split_invariant(&model, &[PREFILL, &[42]]);
}

/// A Q4_K_M model (Q4_K matrices, Q6_K on some) wide enough for Q4_K rows.
fn q4k_model(seed: u64, tied_output: bool) -> Model {
    model(&SyntheticSpec {
        arch: "llama3",
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 2,
        mix: crate::synthetic::TypeMix::Q4KM,
        weight_type: GgmlType::Q4_K,
        embd_type: GgmlType::Q4_K,
        tied_output,
        seed,
        ..SyntheticSpec::default()
    })
}

#[test]
fn interleaved_kquant_weights_give_the_file_layouts_bits() {
    let x8 = |l: Layout| matches!(l, Layout::X8 { .. });
    for tied in [false, true] {
        let plain = q4k_model(13, tied);
        let want = run(&plain, &[PREFILL, &[42], &[7]], Split::Whole);
        let mut model = q4k_model(13, tied);
        let bytes = model.interleave_kquants().unwrap();
        assert!(bytes > 0);
        assert!(x8(model.layers()[0].wq.layout));
        // Q6_K matrices too (attn_v and ffn_down on some layers); Q5_K ones stay.
        let mut q6 = 0;
        for l in model.layers() {
            for t in [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down] {
                let want_x8 = matches!(t.ty, GgmlType::Q4_K | GgmlType::Q6_K);
                assert_eq!(x8(t.layout), want_x8, "{} {}", t.name, t.ty);
                q6 += usize::from(t.ty == GgmlType::Q6_K);
            }
        }
        assert!(q6 > 0, "no Q6_K matrix in the layers");
        // The embeddings (Q4_K here, also the output when tied) are read a row at a time; an
        // untied output (Q6_K) is interleaved.
        assert_eq!(model.tok_embd().layout, Layout::Rows);
        if !tied {
            assert_eq!(model.output().ty, GgmlType::Q6_K);
        }
        assert_eq!(x8(model.output().layout), !tied, "tied {tied}");
        let got = assert_split_invariant(&model, &[PREFILL, &[42], &[7]]);
        assert_eq!(got.phases, want.phases, "tied {tied}");
        assert_eq!(got.logits, want.logits, "tied {tied}");
        // Interleaving twice changes nothing more.
        assert_eq!(model.interleave_kquants().unwrap(), 0);
    }
    // With decode's down block-columns (Q4_K and Q6_K), interleaved too.
    let x8 = |l: Layout| matches!(l, Layout::X8 { .. });
    let mut model = q4k_model(17, false);
    let want = run(&model, &[PREFILL, &[42]], Split::Whole);
    model.cluster_down_projections(sizes().ffn_neurons as usize);
    model.interleave_kquants().unwrap();
    let blocks = model.down_blocks().unwrap();
    for (l, layer) in model.layers().iter().enumerate() {
        assert!(x8(blocks.layouts[l]), "layer {l}: {}", layer.down.ty);
    }
    let types: Vec<GgmlType> = model.layers().iter().map(|l| l.down.ty).collect();
    assert!(types.contains(&GgmlType::Q4_K) && types.contains(&GgmlType::Q6_K));
    assert_eq!(
        run(&model, &[PREFILL, &[42]], Split::Whole).logits,
        want.logits
    );
    // Computed with the scalar kernels (rows taken back out of the groups): the same bits.
    assert_eq!(
        run_with(&model, &[PREFILL, &[42]], Split::Whole, Kernels::scalar()).logits,
        want.logits
    );
}

#[test]
fn sparse_decode_interleaves_attention_and_the_head_but_not_the_ffn() {
    let x8 = |l: Layout| matches!(l, Layout::X8 { .. });
    let sparse = |m: Model| {
        let s = threshold_sparse(&m, 0.05);
        m.with_sparse(Some(s))
    };
    let plain = sparse(q4k_model(19, false));
    let want = run(&plain, &[PREFILL, &[42], &[7]], Split::Whole);
    let mut model = sparse(q4k_model(19, false));
    assert!(model.interleave_kquants().unwrap() > 0);
    for l in model.layers() {
        for t in [&l.wq, &l.wk, &l.wv, &l.wo] {
            let want_x8 = matches!(t.ty, GgmlType::Q4_K | GgmlType::Q6_K);
            assert_eq!(x8(t.layout), want_x8, "{} {}", t.name, t.ty);
        }
        // Sparse decode picks single rows of these.
        for t in [&l.gate, &l.up, &l.down] {
            assert_eq!(t.layout, Layout::Rows, "{} {}", t.name, t.ty);
        }
    }
    assert!(x8(model.output().layout));
    let got = assert_split_invariant(&model, &[PREFILL, &[42], &[7]]);
    assert_eq!(got.phases, want.phases);
    assert_eq!(got.logits, want.logits);
    let stats = &model.sparse().unwrap().stats;
    let (neurons, active) = (
        stats.neurons.load(Ordering::Relaxed),
        stats.active.load(Ordering::Relaxed),
    );
    assert!(0 < active && active < neurons, "{active} of {neurons}");
}

#[test]
fn expert_phases_give_the_same_bits_however_the_clusters_are_split() {
    let model = model(&SyntheticSpec {
        n_ff: 64,
        n_expert: 4,
        n_expert_used: 2,
        seed: 5,
        ..SyntheticSpec::default()
    });
    assert!(model.config().is_moe());
    assert_split_invariant(&model, &[PREFILL, &[42], &[300]]);
}

/// Threshold sparsity on every layer: about `keep` of the neurons of a SiLU model fire.
fn threshold_sparse(model: &Model, threshold: f32) -> SparseFfn {
    let ff = model.config().n_ff as usize;
    SparseFfn {
        mode: SparsityMode::Threshold,
        sparsity: 0.5,
        layers: (0..model.layers().len())
            .map(|_| SparseLayer {
                threshold,
                importance: vec![1.0; ff],
                predictor: None,
                down_t: None,
            })
            .collect(),
        down_type: GgmlType::Q8_0,
        activation: FfnActivation::Silu,
        predictor_sees_residual: false,
        stats: Default::default(),
    }
}

/// A random-weight model decoding with threshold sparsity that skips some neurons.
fn threshold_model() -> Model {
    let model = model(&SyntheticSpec {
        seed: 9,
        ..SyntheticSpec::default()
    });
    let sparse = threshold_sparse(&model, 0.05);
    model.with_sparse(Some(sparse))
}

#[test]
fn sparse_decode_gives_the_same_bits_however_the_clusters_are_split() {
    let model = threshold_model();
    assert_split_invariant(&model, &[PREFILL, &[42], &[7]]);
    // The threshold did skip neurons, and not all of them.
    let stats = &model.sparse().unwrap().stats;
    let (neurons, active) = (
        stats.neurons.load(Ordering::Relaxed),
        stats.active.load(Ordering::Relaxed),
    );
    assert!(0 < active && active < neurons, "{active} of {neurons}");
}

#[test]
fn a_driver_refuses_an_ffn_plan_that_is_not_its_models_sparse_decode() {
    use crate::plan::{ExecutionPlan, FfnPlan, FfnSelect};
    let model = std::sync::Arc::new(threshold_model());
    let plan = ExecutionPlan::default();
    let resolved = super::ffn_plan_of(&model, &plan).unwrap();
    assert_eq!(resolved.select, FfnSelect::Threshold);
    let new = |ffn| {
        super::InlineDriver::new(
            std::sync::Arc::clone(&model),
            &plan,
            ffn,
            Kernels::best(),
            Serial,
        )
    };
    assert!(new(resolved).is_ok());
    for select in [FfnSelect::Dense, FfnSelect::Predicted] {
        let err = new(FfnPlan { select, ..resolved }).err().expect("refused");
        assert!(
            matches!(
                err,
                crate::schedule::ScheduleError::FfnOfAnotherDecode { .. }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("threshold"), "{err}");
    }
}

/// The needed bits of `clusters` for predictions `bits` of `n` tokens, decided directly.
fn expected_needed(bits: &[u64], words: usize, n: usize, clusters: &[Range<u32>]) -> Vec<u64> {
    let mut needed = vec![0u64; clusters.len().div_ceil(64)];
    for (c, r) in clusters.iter().enumerate() {
        let named = (0..n).any(|t| {
            (r.start as usize..r.end as usize)
                .any(|i| bits[t * words + i / 64] >> (i % 64) & 1 == 1)
        });
        if named {
            needed[c / 64] |= 1 << (c % 64);
        }
    }
    needed
}

#[test]
fn ffn_needed_marks_exactly_the_clusters_holding_predicted_neurons() {
    let model = model(&SyntheticSpec::default());
    let program = Program::new(
        &model.shape(),
        &sizes(),
        StepShape::Decode,
        &[(XpuId(0), 1)],
    );
    let clusters = program.clusters(Phase::FfnNeurons);
    assert_eq!(clusters.len(), 4);
    let words = (model.config().n_ff as usize).div_ceil(64);
    let mut state = state_for(&model, Kernels::best());
    let n = 2;
    state.request.n_tokens = n as u32;
    let mut needed = Vec::new();
    // Token 0 names neuron 5 (cluster 0), token 1 neurons 100 and 127 (cluster 3).
    let mut bits = vec![0u64; n * words];
    for (t, i) in [(0, 5), (1, 100), (1, 127)] {
        bits[t * words + i / 64] |= 1 << (i % 64);
    }
    state.predicted = bits.clone();
    let mut found = Vec::new();
    state.find_ffn_needed(&model, &program, &mut found);
    assert_eq!(found, vec![0b1001]);
    assert_eq!(found, expected_needed(&bits, words, n, clusters));
    // The activity the scheduler's event is derived from names the same neurons, token by
    // token, and gives the same clusters.
    let mut activity = crate::schedule::Activity::default();
    state.fill_activity(
        &model,
        &program,
        crate::schedule::Awaited::Clusters,
        &mut activity,
    );
    let tokens: Vec<&[u32]> = activity.tokens().collect();
    assert_eq!(tokens, [&[5u32][..], &[100, 127][..]]);
    let event = crate::schedule::owed_event(
        crate::schedule::Awaited::Clusters,
        0,
        0,
        clusters,
        &activity,
        None,
        &mut Vec::new(),
    );
    let crate::schedule::Event::FfnPredicted {
        needed: derived, ..
    } = event
    else {
        panic!("{event:?}");
    };
    assert_eq!(derived, found);
    // Pseudo-random predictions.
    let mut rng = crate::sample::SplitMix64::new(1);
    for _ in 0..50 {
        for b in bits.iter_mut() {
            let x = rng.next_u64();
            // Sparse: about one neuron in 16 of each word.
            *b = x & (x >> 1) & (x >> 2) & (x >> 3);
        }
        state.predicted = bits.clone();
        state.find_ffn_needed(&model, &program, &mut needed);
        assert_eq!(needed, expected_needed(&bits, words, n, clusters));
    }
    // Nothing predicted (dense, threshold, a layer without a predictor): every cluster.
    state.predicted.clear();
    state.find_ffn_needed(&model, &program, &mut needed);
    assert_eq!(needed, vec![0b1111]);
    // Predictions are for decode: a prefill of neuron clusters (a store's) needs them all.
    state.predicted = vec![0; n * words];
    let prefill = Program {
        shape: StepShape::Prefill,
        ..program.clone()
    };
    state.find_ffn_needed(&model, &prefill, &mut needed);
    assert_eq!(needed, vec![0b1111]);
}

#[test]
fn ffn_needed_leaves_out_experts_no_token_chose() {
    let model = model(&SyntheticSpec {
        n_ff: 64,
        n_expert: 4,
        n_expert_used: 2,
        ..SyntheticSpec::default()
    });
    let program = Program::new(
        &model.shape(),
        &sizes(),
        StepShape::Decode,
        &[(XpuId(0), 1)],
    );
    let clusters = program.clusters(Phase::FfnNeurons);
    let per_expert = model.config().ffn_per_expert();
    assert_eq!(clusters.len(), 8, "two clusters per expert");
    let mut state = state_for(&model, Kernels::best());
    state.request.n_tokens = 1;
    state.moe.used = vec![false, true, false, true];
    let mut needed = Vec::new();
    state.find_ffn_needed(&model, &program, &mut needed);
    let want = clusters
        .iter()
        .enumerate()
        .filter(|(_, r)| [1, 3].contains(&(r.start / per_expert)))
        .fold(0u64, |w, (c, _)| w | 1 << c);
    assert_eq!(needed, vec![want]);
    assert_eq!(want, 0b1100_1100);
}

//! The synthetic models through the public API: streamed chunks are the in-memory model's
//! bytes, and planted firing frequencies are what a forward pass measures (random weights:
//! these say nothing about quality).

mod common;

use common::raw_rows as rows;
use conductor_runtime::exec::{ffn_plan_of, InlineDriver, Serial, Session};
use conductor_runtime::gguf::GgufFile;
use conductor_runtime::model::Model;
use conductor_runtime::plan::{ExecutionPlan, FfnActivation};
use conductor_runtime::quant::{GgmlType, Kernels};
use conductor_runtime::synthetic::{synthetic_model, SyntheticModel, SyntheticSpec};
use std::sync::{Arc, Mutex};

/// A fixed scatter of keys (Fibonacci hashing), for choosing hot neurons and prompt tokens.
fn mix(key: u64) -> u64 {
    key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 17
}

/// A small ReLU model with planted frequencies: a fifth of the neurons hot (`hot`), the rest
/// `cold`; `n_expert` experts of `n_ff` neurons when above 0.
fn planted(n_expert: u32, hot: f32, cold: f32) -> SyntheticSpec {
    let (n_layer, n_ff) = (6, 512);
    let per_layer = n_ff * n_expert.max(1);
    let freq = (0..n_layer)
        .map(|l| {
            (0..per_layer)
                .map(|i| {
                    if mix(u64::from(l * 7919 + i)).is_multiple_of(5) {
                        hot
                    } else {
                        cold
                    }
                })
                .collect()
        })
        .collect();
    SyntheticSpec {
        name: Some("planted".into()),
        n_layer,
        n_embd: 256,
        n_ff,
        n_head: 4,
        n_head_kv: 2,
        weight_type: GgmlType::Q4_0,
        embd_type: GgmlType::Q4_0,
        output_type: Some(GgmlType::Q6_K),
        tied_output: false,
        activation: FfnActivation::Relu,
        ffn_frequencies: Some(freq),
        n_expert,
        n_expert_used: if n_expert > 0 { 2 } else { 0 },
        seed: 11,
        ..SyntheticSpec::default()
    }
}

#[test]
fn chunks_in_any_order_are_the_in_memory_models_bytes() {
    for spec in [
        SyntheticSpec {
            relu_active_share: Some(0.1),
            activation: FfnActivation::Relu,
            ..SyntheticSpec::default()
        },
        planted(4, 0.4, 0.025),
    ] {
        let whole = synthetic_model(&spec).unwrap().to_bytes().unwrap();
        let model = SyntheticModel::new(&spec).unwrap();
        // Small chunks, made last first, then put in file order.
        let chunks = model.chunks(700);
        assert!(chunks.len() > 2 * model.header().tensors().len());
        let mut made: Vec<(usize, Vec<u8>)> = chunks
            .iter()
            .enumerate()
            .rev()
            .map(|(i, c)| (i, model.chunk_data(c)))
            .collect();
        made.sort_by_key(|m| m.0);
        let mut streamed = Vec::new();
        let mut stream = model.header().write_header(&mut streamed).unwrap();
        for (_, data) in &made {
            stream.write_chunk(data).unwrap();
        }
        stream.finish().unwrap();
        assert!(streamed == whole, "{:?}", spec.name);
        // write_data with progress gives the same bytes and counts every byte once.
        let mut again = Vec::new();
        let mut stream = model.header().write_header(&mut again).unwrap();
        let mut last = (0, 0);
        model
            .write_data(&mut stream, &mut |done, total| last = (done, total))
            .unwrap();
        stream.finish().unwrap();
        assert!(again == whole);
        assert_eq!(last, (model.data_bytes(), model.data_bytes()));
    }
}

#[test]
fn same_spec_same_bytes_and_the_seed_matters() {
    let spec = planted(0, 0.4, 0.025);
    let a = synthetic_model(&spec).unwrap().to_bytes().unwrap();
    assert!(a == synthetic_model(&spec).unwrap().to_bytes().unwrap());
    let other = SyntheticSpec { seed: 12, ..spec };
    assert!(a != synthetic_model(&other).unwrap().to_bytes().unwrap());
}

#[test]
fn frequencies_of_the_wrong_shape_are_refused() {
    let mut spec = planted(0, 0.4, 0.025);
    spec.n_ff = 256;
    let e = SyntheticModel::new(&spec).err().expect("refused");
    assert!(e.to_string().contains("need 6 layers of 256"), "{e}");
}

/// Every layer's FFN input (after its norm) over `chunks` prompts of `len` random tokens.
fn ffn_inputs(model: &Arc<Model>, chunks: usize, len: usize) -> Vec<Vec<f32>> {
    let n_layer = model.config().n_layer as usize;
    let inputs = Arc::new(Mutex::new(vec![Vec::new(); n_layer]));
    let mut driver = InlineDriver::new(
        Arc::clone(model),
        &ExecutionPlan::default(),
        ffn_plan_of(model, &ExecutionPlan::default()).unwrap(),
        Kernels::best(),
        Serial,
    )
    .unwrap();
    let recorder = || -> conductor_runtime::exec::Probe {
        let sink = Arc::clone(&inputs);
        Box::new(move |name: &str, rows: &[f32], _| {
            if let Some(l) = name.strip_prefix("ffn_norm-") {
                sink.lock().unwrap()[l.parse::<usize>().unwrap()].extend_from_slice(rows);
            }
        })
    };
    let mut session = Session::new(model, len).unwrap();
    let vocab = u64::from(model.config().n_vocab);
    for c in 0..chunks {
        let tokens: Vec<u32> = (0..len)
            .map(|i| (mix((c * len + i) as u64) % vocab) as u32)
            .collect();
        session.clear();
        let last = tokens.len() - 1;
        driver
            .eval_probed(&mut session, &tokens, last, &mut |_, _| {}, recorder())
            .unwrap();
    }
    drop(driver);
    let out = std::mem::take(&mut *inputs.lock().unwrap());
    out
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Per layer and neuron, the share of tokens (in which its expert was chosen) it fires in.
fn measured_frequencies(spec: &SyntheticSpec) -> Vec<Vec<f32>> {
    let bytes = synthetic_model(spec).unwrap().to_bytes().unwrap();
    let model = Arc::new(Model::from_gguf(GgufFile::from_bytes(bytes).unwrap()).unwrap());
    let embd = spec.n_embd as usize;
    let inputs = ffn_inputs(&model, 4, 64);
    let moe = spec.n_expert > 0;
    (0..spec.n_layer as usize)
        .map(|l| {
            let name = |t: &str| format!("blk.{l}.{t}.weight");
            let gate = rows(
                &model,
                &name(if moe { "ffn_gate_exps" } else { "ffn_gate" }),
            );
            let router = moe.then(|| rows(&model, &name("ffn_gate_inp")));
            let per = spec.n_ff as usize;
            let mut fired = vec![0u32; gate.len()];
            let mut chosen = vec![0u32; gate.len() / per];
            for x in inputs[l].chunks_exact(embd) {
                let experts: Vec<usize> = match &router {
                    None => vec![0],
                    Some(r) => {
                        let logits: Vec<f32> = r.iter().map(|row| dot(row, x)).collect();
                        let mut order: Vec<usize> = (0..logits.len()).collect();
                        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
                        order.truncate(spec.n_expert_used as usize);
                        order
                    }
                };
                for e in experts {
                    chosen[e] += 1;
                    for i in e * per..(e + 1) * per {
                        fired[i] += u32::from(dot(&gate[i], x) > 0.0);
                    }
                }
            }
            fired
                .iter()
                .enumerate()
                .map(|(i, &f)| f as f32 / chosen[i / per].max(1) as f32)
                .collect()
        })
        .collect()
}

/// Checks a planted model's measured frequencies against its plan: each layer's mean within
/// 10% of the planted mean, hot neurons within 10% of theirs, cold ones within 25% (fewer
/// firings, so noisier over 256 tokens).
fn check_planted(spec: &SyntheticSpec, hot: f32, cold: f32) {
    let planned = spec.ffn_frequencies.as_ref().unwrap();
    let measured = measured_frequencies(spec);
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len().max(1) as f32;
    for (l, (want, got)) in planned.iter().zip(&measured).enumerate() {
        let (target, share) = (mean(want), mean(got));
        assert!(
            (share - target).abs() < 0.1 * target,
            "layer {l}: {share:.4} of neurons fire, planted {target:.4}"
        );
        let class = |f: f32| -> Vec<f32> {
            want.iter()
                .zip(got)
                .filter(|(w, _)| **w == f)
                .map(|(_, g)| *g)
                .collect()
        };
        let (h, c) = (mean(&class(hot)), mean(&class(cold)));
        eprintln!("layer {l}: {share:.4} fire (planted {target:.4}), hot {h:.3}, cold {c:.4}");
        assert!((h - hot).abs() < 0.1 * hot, "layer {l}: hot fire {h:.3}");
        assert!(
            (c - cold).abs() < 0.25 * cold,
            "layer {l}: cold fire {c:.4}"
        );
    }
}

#[test]
fn planted_frequencies_hold_through_the_layers() {
    // PowerInfer's split at 10% active: the hot fifth at 40%, the rest at 2.5%.
    check_planted(&planted(0, 0.4, 0.025), 0.4, 0.025);
}

#[test]
fn planted_frequencies_hold_within_the_chosen_experts() {
    check_planted(&planted(4, 0.6, 0.0375), 0.6, 0.0375);
}

#[test]
fn a_uniform_shift_plants_no_hot_set() {
    // The same measurement sees no hot set where none was planted: the old uniform shift,
    // at the planted model's mean.
    let spec = SyntheticSpec {
        ffn_frequencies: None,
        relu_active_share: Some(0.1),
        ..planted(0, 0.4, 0.025)
    };
    let measured = measured_frequencies(&spec);
    let hot = planted(0, 0.4, 0.025).ffn_frequencies.unwrap();
    for (l, (got, want)) in measured.iter().zip(&hot).enumerate() {
        let in_hot: Vec<f32> = got
            .iter()
            .zip(want)
            .filter(|(_, w)| **w > 0.1)
            .map(|(g, _)| *g)
            .collect();
        let hot_mean = in_hot.iter().sum::<f32>() / in_hot.len() as f32;
        let all = got.iter().sum::<f32>() / got.len() as f32;
        assert!(hot_mean < 2.0 * all, "layer {l}: {hot_mean} vs {all}");
    }
}

//! Batch invariance (issue 41): the logits of a position are the same bits however the tokens
//! before it were evaluated — one prefill, any split into chunks, token by token, reused from a
//! cached prefix, or batched with another sequence — on both drivers, 1 and 2 threads and every
//! kernel set of this CPU. Speculative decoding and the server's prefix reuse rely on it.

mod common;

use conductor::runtime::exec::{Driver, Session};
use conductor::runtime::gguf::GgufFile;
use conductor::runtime::model::{DecodeLayout, Model, WeightSource};
use conductor::runtime::plan::ExecutionPlan;
use conductor::runtime::quant::{GgmlType, Kernels, Layout};
use conductor::runtime::synthetic::{synthetic_model, SyntheticSpec, TypeMix};
use std::sync::Arc;

fn inline(model: &Arc<Model>, threads: usize, kernels: Kernels) -> Box<dyn Driver> {
    common::inline_driver(model, threads, &ExecutionPlan::default(), kernels)
}

fn actors(model: &Arc<Model>, threads: u32) -> Box<dyn Driver> {
    common::actor_driver(model, threads, &ExecutionPlan::default(), Kernels::best())
}

/// The model as the engine holds it in memory: decode's down projections re-laid per cluster,
/// Q4_K and Q6_K matrices interleaved (`Layout::X8`) where the kernels read them so.
fn as_the_engine_loads(model: Model) -> Arc<Model> {
    let layout = DecodeLayout {
        down_blocks: Some(ExecutionPlan::default().decode.ffn_neurons as usize),
        interleave: Kernels::best().has_interleaved_kernels(),
    };
    Arc::new(model.laid_out(layout).unwrap())
}

/// The logits of positions `from..` of `tokens` as raw bits, `[position][n_vocab]`.
type Bits = Vec<Vec<u32>>;

fn bits_of(rows: &[f32], n_vocab: usize) -> Bits {
    rows.chunks_exact(n_vocab)
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// `tokens` evaluated in steps of at most `chunk` tokens; the logits of positions `from..`.
fn chunked(driver: &mut dyn Driver, tokens: &[u32], chunk: usize, from: usize) -> Bits {
    let n_vocab = driver.model().config().n_vocab as usize;
    let mut session = Session::new(driver.model(), tokens.len() + 8).unwrap();
    let mut got = Vec::new();
    let mut start = 0;
    for part in tokens.chunks(chunk) {
        let local = from.saturating_sub(start);
        driver
            .eval(&mut session, part, local, &mut |_, rows| {
                got.extend(bits_of(rows, n_vocab))
            })
            .unwrap();
        start += part.len();
    }
    assert_eq!(session.n_past(), tokens.len());
    got
}

/// The server's prefix reuse: a session that evaluated `tokens[..keep]` and then other
/// tokens, cut back to `keep` (`conductor::reuse_prefix`), evaluates the rest in one step.
fn from_cached_prefix(driver: &mut dyn Driver, tokens: &[u32], keep: usize, from: usize) -> Bits {
    assert!(from >= keep);
    let n_vocab = driver.model().config().n_vocab as usize;
    let mut session = Session::new(driver.model(), tokens.len() + 8).unwrap();
    let mut earlier = tokens[..keep].to_vec();
    earlier.extend(tokens[..5].iter().rev());
    driver.eval_last(&mut session, &earlier).unwrap();
    session.truncate(keep);
    let mut got = Vec::new();
    driver
        .eval(
            &mut session,
            &tokens[keep..],
            from - keep,
            &mut |_, rows| got.extend(bits_of(rows, n_vocab)),
        )
        .unwrap();
    got
}

/// Continuous batching, as the server decodes: `tokens` prefilled up to a few positions before
/// `from`, then token by token in multi-sequence steps beside another sequence (prefilled with
/// another prompt). The batched steps begin before `from`, so the positions compared also read
/// keys and values that batched steps wrote.
fn batched(driver: &mut dyn Driver, tokens: &[u32], from: usize) -> Bits {
    assert!(from >= 1);
    let start = from.saturating_sub(4).max(1);
    let n_vocab = driver.model().config().n_vocab as usize;
    let model = Arc::clone(driver.model());
    let mut mine = Session::new(&model, tokens.len() + 8).unwrap();
    let mut other = Session::new(&model, tokens.len() + 8).unwrap();
    driver.eval_last(&mut mine, &tokens[..start]).unwrap();
    let other_prompt: Vec<u32> = tokens.iter().rev().take(9).copied().collect();
    driver.eval_last(&mut other, &other_prompt).unwrap();
    let mut got = Vec::new();
    for (i, &t) in tokens.iter().enumerate().skip(start) {
        let other_next = tokens[(i * 7) % tokens.len()];
        driver
            .step_sequences(&mut [&mut mine, &mut other], &[t, other_next])
            .unwrap();
        if i >= from {
            got.extend(bits_of(&driver.logits()[..n_vocab], n_vocab));
        }
    }
    got
}

/// Every way of evaluating `tokens` gives positions `from..` the bits of one prefill: steps of
/// each of `chunks`, a cached prefix, batched with another sequence. Returns those bits.
fn assert_invariant(
    name: &str,
    driver: &mut dyn Driver,
    tokens: &[u32],
    chunks: &[usize],
    from: usize,
) -> Bits {
    let want = chunked(driver, tokens, tokens.len(), from);
    assert_eq!(want.len(), tokens.len() - from, "{name}");
    for &chunk in chunks {
        let got = chunked(driver, tokens, chunk, from);
        assert!(got == want, "{name}: steps of {chunk} tokens");
    }
    let keep = from.min(tokens.len() / 2 + 3);
    let got = from_cached_prefix(driver, tokens, keep, from);
    assert!(got == want, "{name}: from a cached prefix of {keep} tokens");
    let got = batched(driver, tokens, from.max(1));
    assert!(
        got[..] == want[from.max(1) - from..],
        "{name}: batched with another sequence"
    );
    want
}

fn synthetic(spec: &SyntheticSpec) -> Arc<Model> {
    let bytes = synthetic_model(spec).unwrap().to_bytes().unwrap();
    as_the_engine_loads(Model::from_gguf(GgufFile::from_bytes(bytes).unwrap()).unwrap())
}

/// A prompt longer than a prefill step (512 tokens), so every split takes several steps:
/// 1, 7, 64 and 512 tokens, on the default model's Q4_1 and on a Q4_K_M mix whose Q4_K and
/// Q6_K matrices are interleaved, on both drivers, 1 and 2 threads and every kernel set.
#[test]
fn synthetic_prompts_give_the_same_bits_however_they_are_split() {
    let q4_1 = SyntheticSpec {
        n_layer: 2,
        n_embd: 128,
        n_ff: 384,
        n_head: 4,
        n_head_kv: 2,
        n_ctx: 1024,
        ..SyntheticSpec::default()
    };
    let q4km = SyntheticSpec {
        arch: "llama3",
        n_layer: 2,
        n_embd: 256,
        n_ff: 768,
        n_head: 4,
        n_head_kv: 2,
        n_ctx: 1024,
        mix: TypeMix::Q4KM,
        weight_type: GgmlType::Q4_K,
        embd_type: GgmlType::Q4_K,
        tied_output: false,
        ..SyntheticSpec::default()
    };
    for (label, spec) in [("Q4_1", q4_1), ("Q4_K_M", q4km)] {
        let model = synthetic(&spec);
        if label == "Q4_K_M" && Kernels::best().has_interleaved_kernels() {
            assert!(matches!(model.layers()[0].wq.layout, Layout::X8 { .. }));
        }
        let tokens: Vec<u32> = (0..530).map(|i| (i * 31 + 7) % spec.n_vocab).collect();
        let chunks = [512, 64, 7, 1];
        let mut reference = None;
        let mut runs: Vec<(String, Box<dyn Driver>)> = Kernels::available()
            .into_iter()
            .map(|k| {
                (
                    format!("inline, 1 thread, {}", k.isa()),
                    inline(&model, 1, k),
                )
            })
            .collect();
        runs.push((
            "inline, 2 threads".into(),
            inline(&model, 2, Kernels::best()),
        ));
        runs.push(("actors, 1 thread".into(), actors(&model, 1)));
        runs.push(("actors, 2 threads".into(), actors(&model, 2)));
        for (name, mut driver) in runs {
            let name = format!("{label}, {name}");
            let got = assert_invariant(&name, &mut *driver, &tokens, &chunks, 0);
            // And the same bits on every driver, thread count and kernel set.
            match &reference {
                None => reference = Some(got),
                Some(want) => assert!(&got == want, "{name} differs from the first run"),
            }
        }
    }
}

/// A real model: a reference prompt of more than 64 tokens, positions from the 60th on (both
/// sides of the 64-token step boundary), in steps of 7 and 64 tokens and token by token, from a
/// cached prefix and batched, on both drivers at 1 and 2 threads; every other kernel set on a
/// 12-token prompt (the scalar kernels are slow on a real model, Gemma's vocabulary large).
fn real_model_is_batch_invariant(model: Model, refs: &str) {
    let model = as_the_engine_loads(model);
    let r = std::fs::read_to_string(common::data(refs))
        .expect("reference file")
        .lines()
        .map(|l| serde_json::from_str::<common::Reference>(l).expect("reference line"))
        .find(|r| r.prompt_ids.len() > 64)
        .expect("a long reference prompt");
    let tokens = &r.prompt_ids[..r.prompt_ids.len().min(80)];
    let want = assert_invariant(
        "inline, 1 thread",
        &mut *inline(&model, 1, Kernels::best()),
        tokens,
        &[64, 7, 1],
        60,
    );
    let others: [(&str, Box<dyn Driver>); 3] = [
        ("inline, 2 threads", inline(&model, 2, Kernels::best())),
        ("actors, 1 thread", actors(&model, 1)),
        ("actors, 2 threads", actors(&model, 2)),
    ];
    for (name, mut driver) in others {
        let got = assert_invariant(name, &mut *driver, tokens, &[64, 7], 60);
        assert!(got == want, "{name} differs from inline on 1 thread");
    }
    let short = &tokens[..12];
    let best = chunked(&mut *inline(&model, 1, Kernels::best()), short, 12, 8);
    for kernels in Kernels::available() {
        let mut driver = inline(&model, 1, kernels);
        let name = format!("{} kernels", kernels.isa());
        let got = assert_invariant(&name, &mut *driver, short, &[7, 1], 8);
        assert!(got == best, "{name} differ from {}", Kernels::best().isa());
    }
}

#[test]
fn the_default_model_gives_the_same_bits_however_a_prompt_is_split() {
    let model = Model::open(&common::default_model(), WeightSource::Mapped).unwrap();
    real_model_is_batch_invariant(model, "greedy-public.jsonl");
}

/// Gemma-3-270M Q4_K_M: Q4_K and Q6_K matrices interleaved, Q5_0 and Q8_0 ones, sliding
/// window layers.
#[test]
fn a_q4_k_m_model_gives_the_same_bits_however_a_prompt_is_split() {
    let model = Model::open(&common::gemma3_model(), WeightSource::Mapped).unwrap();
    real_model_is_batch_invariant(model, "gemma3-greedy-public.jsonl");
}

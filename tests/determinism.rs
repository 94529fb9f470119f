//! Numerics are a function of model, input and plan — never of the number of threads.
//!
//! Clusters are fixed by the plan and reduced in cluster order, so the logits must be identical
//! bit for bit whether one thread computes everything or several threads share the clusters in
//! whatever order they happen to claim them.

mod common;

use conductor::actors::{PoolConfig, WorkerPool};
use conductor::runtime::exec::{InlineDriver, Session};
use conductor::runtime::gguf::GgufFile;
use conductor::runtime::model::Model;
use conductor::runtime::plan::ExecutionPlan;
use conductor::runtime::quant::Kernels;
use conductor::runtime::synthetic::{synthetic_model, SyntheticSpec};
use std::sync::Arc;

/// Logits of a prefill step and of every following decode step, as raw bits.
fn logit_bits(model: &Arc<Model>, threads: usize, tokens: &[u32], prompt_len: usize) -> Vec<u32> {
    let pool = WorkerPool::new(PoolConfig::new(threads)).unwrap();
    let mut driver = InlineDriver::new(
        Arc::clone(model),
        &ExecutionPlan::default(),
        Kernels::best(),
        pool,
    )
    .unwrap();
    let mut session = Session::new(model, tokens.len() + 1);
    let mut bits = Vec::new();
    let mut all = |_: usize, rows: &[f32]| bits.extend(rows.iter().map(|x| x.to_bits()));
    // Every prompt position's logits: exercises the output phase with many rows too.
    driver
        .eval(&mut session, &tokens[..prompt_len], 0, &mut all)
        .unwrap();
    for &t in &tokens[prompt_len..] {
        let logits = driver.eval_last(&mut session, &[t]).unwrap();
        bits.extend(logits.iter().map(|x| x.to_bits()));
    }
    bits
}

#[test]
fn synthetic_model_logits_are_bit_identical_on_1_2_and_3_threads() {
    let spec = SyntheticSpec {
        n_layer: 3,
        n_embd: 128,
        n_ff: 384,
        n_head: 8,
        n_head_kv: 2,
        ..SyntheticSpec::default()
    };
    let bytes = synthetic_model(&spec).unwrap().to_bytes().unwrap();
    let model = Arc::new(Model::from_gguf(GgufFile::from_bytes(bytes).unwrap()).unwrap());
    let tokens: Vec<u32> = (0..90).map(|i| (i * 31 + 7) % spec.n_vocab).collect();
    // 80 prompt tokens take the tiled attention path; then 10 decode steps.
    let one = logit_bits(&model, 1, &tokens, 80);
    assert_eq!(one, logit_bits(&model, 2, &tokens, 80));
    assert_eq!(one, logit_bits(&model, 3, &tokens, 80));
}

#[test]
fn default_model_logits_are_bit_identical_on_1_and_2_threads() {
    let model = Arc::new(Model::load(&common::default_model()).unwrap());
    let r = common::references()
        .into_iter()
        .find(|r| r.prompt_ids.len() > 64)
        .expect("a long reference prompt");
    let mut tokens = r.prompt_ids.clone();
    tokens.extend(&r.greedy_ids[..8]);
    let n = r.prompt_ids.len();
    assert_eq!(
        logit_bits(&model, 1, &tokens, n),
        logit_bits(&model, 2, &tokens, n)
    );
}

#[test]
fn cli_output_is_identical_on_1_and_2_threads() {
    let model = common::default_model();
    let run = |threads: &str| {
        let out = common::conductor()
            .args(["run", "-m"])
            .arg(&model)
            .args([
                "-p",
                "Once upon a time",
                "-n",
                "48",
                "--temp",
                "0.7",
                "--seed",
                "7",
            ])
            .args(["--ignore-eos", "-t", threads])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let one = run("1");
    assert!(one.len() > "Once upon a time".len() + 40);
    assert_eq!(one, run("2"));
}

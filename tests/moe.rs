//! Mixture-of-experts (Mixtral-style) models end to end, on a generated model of 2 layers, 4
//! experts of 64 neurons and top-2 routing: bit-identical logits across drivers, thread counts,
//! group splits and down-projection layouts; a neuron store under a memory budget computes the
//! in-memory bits while reading only the chosen experts' bundles; bad files and options give
//! clear errors. (The numerics against a plain reference: `runtime/tests/forward_reference.rs`.)

mod common;

use common::ScratchDir;
use conductor::actors::{ActorOptions, PoolConfig, WorkerPool};
use conductor::runtime::cache::{split_budget, MemoryBudget};
use conductor::runtime::convert::{convert, ConvertOptions};
use conductor::runtime::exec::{ffn_plan_of, Driver, InlineDriver, Serial, Session};
use conductor::runtime::gguf::{GgufFile, GgufWriter};
use conductor::runtime::model::{DecodeLayout, Model, WeightSource};
use conductor::runtime::plan::{CachePlan, CachePolicy};
use conductor::runtime::plan::{CoreSet, ExecutionPlan, GroupPlan, Share, Topology, XpuKind};
use conductor::runtime::quant::{GgmlType, Kernels};
use conductor::runtime::sparse::SparsityMode;
use conductor::runtime::synthetic::{synthetic_model, SyntheticSpec};
use conductor::{Engine, SparsitySettings};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const N_EXPERT: u32 = 4;
const PER_EXPERT: u32 = 64;
const N_LAYER: u32 = 2;

fn spec() -> SyntheticSpec {
    SyntheticSpec {
        n_layer: N_LAYER,
        n_embd: 64,
        n_ff: PER_EXPERT,
        n_expert: N_EXPERT,
        n_expert_used: 2,
        weight_type: GgmlType::Q8_0,
        seed: 11,
        ..SyntheticSpec::default()
    }
}

fn bytes() -> Vec<u8> {
    synthetic_model(&spec()).unwrap().to_bytes().unwrap()
}

/// The generated MoE model, written into `dir` the first time.
fn source_model(dir: &ScratchDir) -> PathBuf {
    dir.file("moe.gguf", bytes)
}

const PROMPT: [u32; 9] = [3, 17, 42, 5, 99, 120, 7, 250, 31];

/// Logits of every prompt position, then of 4 greedy decode steps, as bits.
fn run(driver: &mut dyn Driver) -> Vec<Vec<u32>> {
    let mut session = Session::new(driver.model(), 64).unwrap();
    let mut out = Vec::new();
    let mut rows = Vec::new();
    driver
        .eval(&mut session, &PROMPT, 0, &mut |_, r| {
            rows.extend(r.iter().map(|x| x.to_bits()))
        })
        .unwrap();
    let n_vocab = driver.model().config().n_vocab as usize;
    let mut logits = rows[rows.len() - n_vocab..]
        .iter()
        .map(|x| f32::from_bits(*x))
        .collect::<Vec<_>>();
    out.push(rows);
    for _ in 0..4 {
        let next = argmax(&logits);
        logits = driver.eval_last(&mut session, &[next]).unwrap().to_vec();
        out.push(logits.iter().map(|x| x.to_bits()).collect());
    }
    out
}

fn argmax(logits: &[f32]) -> u32 {
    logits
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i as u32)
}

fn inline(model: &Arc<Model>, threads: usize, plan: &ExecutionPlan) -> Box<dyn Driver> {
    let pool = WorkerPool::new(PoolConfig::new(threads)).unwrap();
    Box::new(
        InlineDriver::new(
            Arc::clone(model),
            plan,
            ffn_plan_of(model, plan).unwrap(),
            Kernels::best(),
            pool,
        )
        .unwrap(),
    )
}

fn actors(
    model: &Arc<Model>,
    threads: u32,
    plan: &ExecutionPlan,
    path: Option<&Path>,
) -> Box<dyn Driver> {
    let options = ActorOptions {
        threads: Some(threads),
        topology: Some(Topology::uniform(threads.max(2))),
        no_pinning: true,
        model_path: path.map(Path::to_path_buf),
    };
    Box::new(common::actors_with(model, plan, options))
}

/// Decode shared 2:1 between two CPU groups, prefill between the dense backend (launches of 4
/// tokens) and a CPU group; clusters smaller than an expert.
fn split_plan() -> ExecutionPlan {
    let group = |name: &str, kind, cores: Vec<u32>| GroupPlan {
        name: name.into(),
        kind,
        cores: CoreSet::Ids(cores),
        threads: 0,
    };
    let share = |group: &str, weight| Share {
        group: group.into(),
        weight,
    };
    let mut plan = ExecutionPlan {
        groups: vec![
            group("big", XpuKind::Cpu, vec![0]),
            group("little", XpuKind::Cpu, vec![1]),
            group("npu", XpuKind::Npu, vec![0, 1]),
        ],
        decode_on: vec![share("big", 2), share("little", 1)],
        prefill_on: vec![share("npu", 3), share("little", 1)],
        ..ExecutionPlan::default()
    };
    plan.dense.token_chunk = 4;
    plan.decode.ffn_neurons = 32;
    plan.prefill.ffn_rows = 32;
    plan
}

#[test]
fn moe_logits_are_bit_identical_across_drivers_threads_splits_and_layouts() {
    let model = Arc::new(Model::from_gguf(GgufFile::from_bytes(bytes()).unwrap()).unwrap());
    assert_eq!(
        (model.config().n_expert, model.config().n_ff),
        (N_EXPERT, N_EXPERT * PER_EXPERT)
    );
    let plan = ExecutionPlan::default();
    let reference = run(&mut *inline(&model, 1, &plan));
    assert_eq!(reference.len(), 5);
    assert_eq!(
        reference,
        run(&mut *inline(&model, 2, &plan)),
        "inline, 2 threads"
    );
    for threads in [1, 2] {
        assert_eq!(
            reference,
            run(&mut *actors(&model, threads, &plan, None)),
            "actors, {threads} threads"
        );
    }
    // Clusters of half an expert, split between groups: the same sums in the same order for
    // decode; prefill cuts its FFN rows differently but every row block is the same bits.
    let split = split_plan();
    let split_reference = run(&mut *inline(&model, 1, &split));
    assert_eq!(split_reference, run(&mut *actors(&model, 2, &split, None)));
    // The down projection re-laid per decode cluster (what the engine does in memory).
    let relaid = Model::from_gguf(GgufFile::from_bytes(bytes()).unwrap())
        .unwrap()
        .laid_out(DecodeLayout {
            down_blocks: Some(plan.decode.ffn_neurons as usize),
            interleave: false,
        })
        .unwrap();
    assert!(relaid.down_blocks().is_some());
    let relaid = Arc::new(relaid);
    assert_eq!(reference, run(&mut *inline(&relaid, 2, &plan)), "re-laid");
}

fn cache(slots: u32) -> CachePlan {
    CachePlan {
        slots,
        hot_slots: 0,
        policy: CachePolicy::Lru,
        max_loads: 2,
        stream_output: false,
        stream_attention: false,
        coalesce: 1,
        hot_units: Vec::new(),
        reads: conductor_runtime::plan::ReadPolicy::Bundles,
        gate_first_gap: 0,
    }
}

/// Relative max difference between two logit rows (as bits).
fn drift(a: &[u32], b: &[u32]) -> f32 {
    let f = |v: &[u32]| v.iter().map(|x| f32::from_bits(*x)).collect::<Vec<f32>>();
    let (a, b) = (f(a), f(b));
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale.max(1e-6)
}

#[test]
fn a_moe_store_under_a_budget_reads_only_the_chosen_experts() {
    let dir = ScratchDir::new("moe-store");
    let source = Arc::new(Model::open(&source_model(&dir), WeightSource::Mapped).unwrap());
    let plan = ExecutionPlan {
        prefill_max_tokens: 4,
        ..ExecutionPlan::default()
    };
    let from_source = run(&mut *inline(&source, 1, &plan));
    // Bundles of 32 neurons: 2 per expert, 8 per layer.
    for (options, tolerance) in [
        (ConvertOptions::block_columns(32), 1e-4),
        (ConvertOptions::neuron_columns(32), 2e-2),
    ] {
        let path = dir.store(&source_model(&dir), &options);
        let store = Arc::new(Model::open(&path, WeightSource::Mapped).unwrap());
        let layout = &store.store().unwrap().layout;
        assert_eq!(layout.n_bundles, 8);
        let reference = run(&mut *inline(&store, 1, &plan));
        for (step, (got, want)) in reference.iter().zip(&from_source).enumerate() {
            let d = drift(got, want);
            assert!(d <= tolerance, "{options:?}: step {step} drifts {d}");
        }

        // 3 slots for 16 units: every step streams; the bits stay the in-memory ones.
        let resident = Arc::new(
            Model::open(
                &path,
                WeightSource::Resident {
                    stream_output: false,
                    stream_attention: false,
                },
            )
            .unwrap(),
        );
        let budget = ExecutionPlan {
            cache: Some(cache(3)),
            ..plan.clone()
        };
        let mut d = common::serial_driver(&resident, &budget);
        let mut session = Session::new(&resident, 64).unwrap();
        let mut got = Vec::new();
        d.eval(&mut session, &PROMPT, 0, &mut |_, r| {
            got.extend(r.iter().map(|x| x.to_bits()))
        })
        .unwrap();
        assert_eq!(got, reference[0], "{options:?}: prompt under a budget");
        // Each decode token routes to 2 experts per layer: exactly their 2 × 2 bundles are
        // acquired (hit or read) in each layer, the other experts' never.
        let touched = |d: &InlineDriver<Serial>| -> Vec<u64> {
            d.cache_stats()
                .unwrap()
                .iter()
                .map(|l| l.hits + l.misses)
                .collect()
        };
        let n_vocab = resident.config().n_vocab as usize;
        let mut logits = d.logits()[d.logits().len() - n_vocab..].to_vec();
        for (step, want) in reference.iter().enumerate().skip(1) {
            let before = touched(&d);
            logits = d
                .eval_last(&mut session, &[argmax(&logits)])
                .unwrap()
                .to_vec();
            let bits: Vec<u32> = logits.iter().map(|x| x.to_bits()).collect();
            assert_eq!(&bits, want, "{options:?}: decode step {step}");
            let after = touched(&d);
            for l in 0..N_LAYER as usize {
                assert_eq!(
                    after[l] - before[l],
                    4,
                    "{options:?}: step {step}, layer {l}: bundles acquired"
                );
            }
        }

        // The actor driver under the same budget: the same bits.
        let got = run(&mut *actors(&resident, 2, &budget, Some(&path)));
        assert_eq!(got, reference, "{options:?}: actors under a budget");
    }
}

#[test]
fn the_engine_runs_a_moe_store_under_a_memory_budget_and_refuses_sparse_modes() {
    let dir = ScratchDir::new("moe-engine");
    let source = source_model(&dir);
    let store = dir.store(&source_model(&dir), &ConvertOptions::neuron_columns(32));
    let engine = |path: &Path, memory: Option<u64>, mode: Option<SparsityMode>| {
        let mut b = Engine::builder()
            .model(path)
            .threads(1)
            .context(64)
            .sparsity(SparsitySettings {
                mode,
                target: None,
                predictor_recall: None,
                profile: None,
                all_tokens: false,
                down_type: None,
                keep_down_layout: false,
            })
            .on_progress(|_| {});
        if let Some(bytes) = memory {
            b = b.memory(MemoryBudget::Bytes(bytes));
        }
        b.build()
    };
    let decode = |e: &mut Engine| -> Vec<u32> {
        let mut session = e.session(Some(64)).unwrap();
        let mut tokens = Vec::new();
        let mut logits = e.eval_last(&mut session, &PROMPT).unwrap().to_vec();
        for _ in 0..4 {
            let next = argmax(&logits);
            tokens.push(next);
            logits = e.eval_last(&mut session, &[next]).unwrap().to_vec();
        }
        tokens
    };
    let in_memory = decode(&mut engine(&store, None, None).unwrap());
    let resident = Model::open(&store, WeightSource::RESIDENT).unwrap();
    let split = split_budget(&resident, u64::MAX / 4, 64, 64, CachePolicy::Segmented).unwrap();
    let fixed = split.resident_weights + split.kv_cache + split.scratch + split.runtime_overhead;
    let slot = resident.store().unwrap().layout.stride + 4096;
    let mut budgeted = engine(&store, Some(fixed + 6 * slot), None).unwrap();
    assert_eq!(
        decode(&mut budgeted),
        in_memory,
        "greedy tokens under a budget"
    );
    let report = budgeted.cache_report().expect("a cache");
    assert!(report.misses() > 0, "{report:?}");

    for mode in [SparsityMode::Threshold, SparsityMode::Predictor] {
        let err = engine(&source, None, Some(mode)).err().expect("refused");
        assert!(
            err.to_string().contains("mixture-of-experts"),
            "{mode:?}: {err}"
        );
    }
}

/// A tensor's new dimensions from its name and dimensions (`None` drops it).
type TensorEdit<'a> = &'a dyn Fn(&str, Vec<u64>) -> Option<Vec<u64>>;

/// The generated model's GGUF keeping the metadata keys `meta` accepts, each tensor as
/// `tensor` says.
fn rewrite(meta: &dyn Fn(&str) -> bool, tensor: TensorEdit<'_>) -> Vec<u8> {
    let file = GgufFile::from_bytes(bytes()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        if meta(k) {
            w.add_metadata(k.clone(), v.clone()).unwrap();
        }
    }
    for t in file.tensors() {
        if let Some(dims) = tensor(&t.name, t.dims.clone()) {
            w.add_tensor(t.name.clone(), dims, t.ty, file.tensor_data(t).to_vec())
                .unwrap();
        }
    }
    w.to_bytes().unwrap()
}

fn load_error(bytes: Vec<u8>) -> String {
    match GgufFile::from_bytes(bytes).map(Model::from_gguf) {
        Ok(Ok(_)) => panic!("the model loaded"),
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_moe_files_and_layouts_give_clear_errors() {
    let with_key = |key: &'static str, value: u32| {
        let mut w = GgufWriter::new();
        let file = GgufFile::from_bytes(bytes()).unwrap();
        for (k, v) in file.metadata() {
            if k == key {
                w.add_metadata(k.clone(), conductor::runtime::gguf::Value::U32(value))
                    .unwrap();
            } else {
                w.add_metadata(k.clone(), v.clone()).unwrap();
            }
        }
        for t in file.tensors() {
            w.add_tensor(
                t.name.clone(),
                t.dims.clone(),
                t.ty,
                file.tensor_data(t).to_vec(),
            )
            .unwrap();
        }
        w.to_bytes().unwrap()
    };
    let e = load_error(with_key("llama.expert_used_count", 5));
    assert!(
        e.contains("llama.expert_used_count") && e.contains("only 4"),
        "{e}"
    );
    let e = load_error(with_key("llama.expert_used_count", 0));
    assert!(e.contains("llama.expert_used_count"), "{e}");
    let e = load_error(with_key("llama.expert_count", 1000));
    assert!(e.contains("llama.expert_count"), "{e}");

    let e = load_error(rewrite(&|_| true, &|name, dims| {
        (name != "blk.1.ffn_gate_inp.weight").then_some(dims)
    }));
    assert!(e.contains("blk.1.ffn_gate_inp.weight"), "{e}");
    let e = load_error(rewrite(&|k| k != "llama.expert_count", &|_, d| Some(d)));
    assert!(e.contains("llama.expert_used_count"), "{e}");
    let e = load_error(rewrite(
        &|k| k != "llama.expert_count" && k != "llama.expert_used_count",
        &|_, d| Some(d),
    ));
    assert!(
        e.contains("llama.expert_count") && e.contains("ffn_gate_exps"),
        "{e}"
    );
    // Expert and row dimensions swapped: same bytes, wrong shape.
    let e = load_error(rewrite(&|_| true, &|name, dims| {
        Some(if name == "blk.0.ffn_down_exps.weight" {
            vec![dims[0], dims[2], dims[1]]
        } else {
            dims
        })
    }));
    assert!(
        e.contains("blk.0.ffn_down_exps.weight") && e.contains("shape"),
        "{e}"
    );
    // A router of the wrong width.
    let e = load_error(rewrite(&|_| true, &|name, dims| {
        Some(if name == "blk.0.ffn_gate_inp.weight" {
            vec![dims[1], dims[0]]
        } else {
            dims
        })
    }));
    assert!(e.contains("blk.0.ffn_gate_inp.weight"), "{e}");

    // Bundles that would straddle experts are refused at conversion.
    let dir = ScratchDir::new("moe-bad");
    let err = convert(
        &source_model(&dir),
        &dir.join("store.gguf"),
        &ConvertOptions::neuron_columns(48),
        &mut |_, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("straddle experts of 64"), "{err}");
}

//! The neuron store and the neuron cache end to end, on a generated model: conversion, outputs
//! bit-identical for every cache size, policy and pipeline depth (inline and actors), and the
//! bad inputs (another version, corrupt bundles, a file truncated while running, overwriting).

mod common;

use common::ScratchDir;
use conductor::actors::{ActorDriver, ActorOptions};
use conductor::runtime::convert::{convert, ConvertError, ConvertOptions};
use conductor::runtime::exec::{
    ffn_plan_of, scheduler_for, Driver, InlineDriver, Serial, Session, StepError,
};
use conductor::runtime::model::{Model, WeightSource};
use conductor::runtime::neuron::Phase;
use conductor::runtime::plan::{CachePlan, CachePolicy};
use conductor::runtime::plan::{ExecutionPlan, IoEngine, Topology};
use conductor::runtime::quant::Kernels;
use conductor::runtime::schedule::{Command, StepShape};
use conductor::runtime::store::{DownLayout, StoreError};
use conductor::runtime::synthetic::{synthetic_model, Preset, SyntheticSpec, TypeMix};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A store with neuron columns (the default layout) of `neurons` per bundle.
fn store(dir: &ScratchDir, neurons: u32) -> PathBuf {
    dir.store(
        &dir.small_model(7),
        &ConvertOptions::neuron_columns(neurons),
    )
}

const PROMPT: [u32; 9] = [3, 17, 42, 5, 99, 120, 7, 250, 31];

/// Logits of a prompt step and four decode steps (greedy), as bits.
fn run(driver: &mut dyn Driver) -> Result<Vec<Vec<u32>>, StepError> {
    let model = Arc::clone(driver.model());
    let mut session = Session::new(&model, 64).unwrap();
    let mut out = Vec::new();
    let mut logits = driver.eval_last(&mut session, &PROMPT)?.to_vec();
    for _ in 0..4 {
        out.push(logits.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        let next = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i as u32)
            .unwrap();
        logits = driver.eval_last(&mut session, &[next])?.to_vec();
    }
    out.push(logits.iter().map(|x| x.to_bits()).collect());
    Ok(out)
}

fn plan_with(cache: Option<CachePlan>) -> ExecutionPlan {
    ExecutionPlan {
        cache,
        prefill_max_tokens: 4, // several prefill steps, each streaming the FFN
        ..ExecutionPlan::default()
    }
}

fn inline(path: &Path, cache: Option<CachePlan>) -> InlineDriver<Serial> {
    let stream = cache.as_ref().is_some_and(|c| c.stream_output);
    let attention = cache.as_ref().is_some_and(|c| c.stream_attention);
    let model = if cache.is_some() {
        Model::open(
            path,
            WeightSource::Resident {
                stream_output: stream,
                stream_attention: attention,
            },
        )
        .unwrap()
    } else {
        Model::open(path, WeightSource::Mapped).unwrap()
    };
    let mut plan = plan_with(cache);
    if stream {
        // 320 vocabulary rows of 136 bytes in clusters of 60: 6 clusters, the last short.
        plan.decode.output_rows = 60;
        plan.prefill.output_rows = 60;
    }
    {
        let ffn = ffn_plan_of(&model, &plan).unwrap();
        InlineDriver::new(Arc::new(model), &plan, ffn, Kernels::best(), Serial).unwrap()
    }
}

/// The actor driver on two threads (unpinned), reading `store`.
fn two_threads(store: &Path) -> ActorOptions {
    ActorOptions {
        threads: Some(2),
        topology: Some(Topology::uniform(2)),
        no_pinning: true,
        model_path: Some(store.to_path_buf()),
    }
}

fn streaming(slots: u32, hot: u32, policy: CachePolicy, max_loads: u32) -> Option<CachePlan> {
    cache(slots, hot, policy, max_loads).map(|c| CachePlan {
        stream_output: true,
        stream_attention: false,
        ..c
    })
}

fn cache(slots: u32, hot: u32, policy: CachePolicy, max_loads: u32) -> Option<CachePlan> {
    Some(CachePlan {
        slots,
        hot_slots: hot,
        policy,
        max_loads,
        stream_output: false,
        stream_attention: false,
        coalesce: max_loads.div_ceil(2),
        hot_units: Vec::new(),
        reads: conductor_runtime::plan::ReadPolicy::Bundles,
        gate_first_gap: 0,
    })
}

/// Largest difference between two logit vectors (as bits), relative to the larger logit.
fn drift(a: &[u32], b: &[u32]) -> f32 {
    let (a, b): (Vec<f32>, Vec<f32>) = (
        a.iter().map(|x| f32::from_bits(*x)).collect(),
        b.iter().map(|x| f32::from_bits(*x)).collect(),
    );
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale.max(1e-6)
}

#[test]
fn a_store_decodes_like_its_source_and_every_cache_gives_the_same_bits() {
    let dir = ScratchDir::new("store-bits");
    let source = Model::open(&dir.small_model(7), WeightSource::Mapped).unwrap();
    let plan = plan_with(None);
    let ffn = ffn_plan_of(&source, &plan).unwrap();
    let mut original =
        InlineDriver::new(Arc::new(source), &plan, ffn, Kernels::best(), Serial).unwrap();
    let from_source = run(&mut original).unwrap();
    // Block-columns move whole quant blocks: the same kernels on the same bits, except that a
    // prompt step batches the down projection. Neuron columns re-quantize the down projection
    // (to Q8_0): close to the source, not equal. 50 neurons: bundles need not be whole blocks.
    for (options, n_bundles, tolerance) in [
        (ConvertOptions::block_columns(64), 8, 1e-4),
        (ConvertOptions::neuron_columns(64), 8, 2e-2),
        (ConvertOptions::neuron_columns(50), 11, 2e-2),
    ] {
        let store_path = dir.store(&dir.small_model(7), &options);
        let store = Model::open(&store_path, WeightSource::Mapped).unwrap();
        let layout = &store.store().unwrap().layout;
        assert_eq!(
            (layout.n_bundles, Some(layout.down_layout)),
            (n_bundles, options.down_layout)
        );
        let reference = run(&mut inline(&store_path, None)).unwrap();
        for (step, (got, want)) in reference.iter().zip(&from_source).enumerate() {
            let d = drift(got, want);
            assert!(
                d <= tolerance,
                "{options:?}: step {step} drifts {d} from the source"
            );
        }
        if options.down_layout == Some(DownLayout::NeuronColumns) {
            assert_ne!(reference, from_source, "neuron columns are re-quantized");
        }

        let n_units = 3 * n_bundles;
        for (slots, hot, policy, loads) in [
            (1, 0, CachePolicy::Lru, 1),
            (2, 0, CachePolicy::Segmented, 1),
            (5, 3, CachePolicy::Segmented, 2),
            (9, 4, CachePolicy::Lru, 4),
            (12, 11, CachePolicy::Segmented, 3),
            (n_units, n_units, CachePolicy::Segmented, 8),
            (n_units + 5, 0, CachePolicy::Lru, 16),
        ] {
            let got = run(&mut inline(&store_path, cache(slots, hot, policy, loads))).unwrap();
            assert_eq!(
                got, reference,
                "{options:?}: slots {slots} hot {hot} {policy:?} loads {loads}"
            );
        }
        // The output projection and the embeddings stream too (FFN units + 6 output units).
        for (slots, hot, policy, loads) in [
            (1, 0, CachePolicy::Lru, 1),
            (4, 2, CachePolicy::Segmented, 2),
            (n_units + 6, n_units + 6, CachePolicy::Segmented, 4),
        ] {
            let got = run(&mut inline(
                &store_path,
                streaming(slots, hot, policy, loads),
            ))
            .unwrap();
            assert_eq!(
                got, reference,
                "{options:?} streaming: slots {slots} hot {hot} {policy:?}"
            );
        }
        // Attention streams as well, left out of memory: 4 matrices per layer (12 units).
        for (slots, hot, policy, loads) in [
            (1, 0, CachePolicy::Lru, 1),
            (5, 3, CachePolicy::Segmented, 2),
            (n_units + 18, n_units + 18, CachePolicy::Segmented, 4),
        ] {
            let plan = streaming(slots, hot, policy, loads).map(|c| CachePlan {
                stream_attention: true,
                ..c
            });
            let got = run(&mut inline(&store_path, plan)).unwrap();
            assert_eq!(
                got, reference,
                "{options:?} streaming attention: slots {slots} hot {hot} {policy:?}"
            );
        }
    }
}

#[test]
fn the_actor_driver_pipelines_loads_with_the_same_bits() {
    let dir = ScratchDir::new("store-actors");
    let store_path = store(&dir, 64);
    let reference = run(&mut inline(&store_path, None)).unwrap();
    for (slots, hot, loads, stream, attention) in [
        (2, 0, 1, false, false),
        (7, 4, 3, true, false),
        (30, 30, 4, true, false),
        (5, 2, 2, true, true),
    ] {
        let model = Arc::new(
            Model::open(
                &store_path,
                WeightSource::Resident {
                    stream_output: stream,
                    stream_attention: attention,
                },
            )
            .unwrap(),
        );
        let mut plan = plan_with(cache(slots, hot, CachePolicy::Segmented, loads));
        if stream {
            plan.cache.as_mut().unwrap().stream_output = true;
            plan.decode.output_rows = 60;
            plan.prefill.output_rows = 60;
        }
        plan.cache.as_mut().unwrap().stream_attention = attention;
        let mut d = common::actors_with(&model, &plan, two_threads(&store_path));
        assert_eq!(run(&mut d).unwrap(), reference, "slots {slots} hot {hot}");
        let report = d.cache_report().unwrap();
        assert!(report.loads > 0 && report.reads > 0 && report.reads <= report.loads);
        assert_eq!(report.layer_bytes.iter().sum::<u64>(), report.bytes_read);
    }
}

/// Every architecture's file converts and runs from its store as llama's does: Gemma 3 (post
/// norms, q/k norms, GELU-gated FFN, a sliding-window layer), Qwen 3 (q/k norms, a head size
/// apart from the width), Phi-3 (fused qkv and gate-up) and Qwen 2, in Q4_K_M type mixes.
/// Block columns (the source's quant blocks) give the source's logits to rounding; neuron
/// columns (down re-quantized, activations no longer rounded to 8 bits) stay close; and every
/// cache whose cold segment holds a cluster (two bundles here), streamed output and streamed
/// attention, inline and on actors, gives the bits of the store in memory.
#[test]
fn every_architecture_converts_and_decodes_under_every_cache_with_the_same_bits() {
    let worst = |a: &[Vec<u32>], b: &[Vec<u32>]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| drift(x, y))
            .fold(0f32, f32::max)
    };
    for arch in ["gemma3", "qwen3", "phi3", "qwen2"] {
        let dir = ScratchDir::new(&format!("store-{arch}"));
        let source = dir.file("source.gguf", || {
            let spec = SyntheticSpec::preset(arch, Preset::Tiny).unwrap();
            synthetic_model(&spec).unwrap().to_bytes().unwrap()
        });
        let from_source = run(&mut inline(&source, None)).unwrap();
        // Block columns need one down type across layers: the same model, every matrix Q4_K.
        let uniform_dir = ScratchDir::new(&format!("store-{arch}-uniform"));
        let uniform = uniform_dir.file("source.gguf", || {
            let spec = SyntheticSpec {
                mix: TypeMix::Uniform,
                ..SyntheticSpec::preset(arch, Preset::Tiny).unwrap()
            };
            synthetic_model(&spec).unwrap().to_bytes().unwrap()
        });
        let blocks = uniform_dir.store(&uniform, &ConvertOptions::block_columns(256));
        let from_blocks = run(&mut inline(&blocks, None)).unwrap();
        let d = worst(&from_blocks, &run(&mut inline(&uniform, None)).unwrap());
        assert!(d <= 1e-4, "{arch}: block columns drift {d} from the source");
        // Interleaved 8 rows by 8 (the default) or in the source's rows: the same bits, in
        // memory and through a cache.
        let info = |path: &Path| {
            Model::open(path, WeightSource::Mapped)
                .unwrap()
                .store()
                .unwrap()
                .layout
        };
        assert!(
            info(&blocks).interleaved,
            "{arch}: block columns are interleaved by default"
        );
        let rows_options = ConvertOptions::block_columns(256).rows_as_in_the_source();
        let rows = uniform_dir.store(&uniform, &rows_options);
        assert!(!info(&rows).interleaved, "{arch}");
        assert!(
            run(&mut inline(&rows, None)).unwrap() == from_blocks,
            "{arch}: interleaved bundles give other bits than rows"
        );
        let through_cache = cache(2, 1, CachePolicy::Segmented, 2);
        assert!(
            run(&mut inline(&blocks, through_cache.clone())).unwrap()
                == run(&mut inline(&rows, through_cache)).unwrap(),
            "{arch}: interleaved bundles give other bits than rows through a cache"
        );

        let store_path = dir.store(&source, &ConvertOptions::neuron_columns(64));
        let reference = run(&mut inline(&store_path, None)).unwrap();
        let d = worst(&reference, &from_source);
        assert!(
            d <= 4e-2,
            "{arch}: neuron columns drift {d} from the source"
        );
        for plan in [
            cache(2, 0, CachePolicy::Lru, 1),
            cache(5, 3, CachePolicy::Segmented, 2),
            streaming(4, 2, CachePolicy::Segmented, 2),
            streaming(3, 1, CachePolicy::Lru, 3).map(|c| CachePlan {
                stream_attention: true,
                ..c
            }),
        ] {
            let got = run(&mut inline(&store_path, plan.clone())).unwrap();
            let d = worst(&got, &reference);
            assert!(got == reference, "{arch}: {plan:?} drifts {d}");
        }
        let model = Arc::new(
            Model::open(
                &store_path,
                WeightSource::Resident {
                    stream_output: false,
                    stream_attention: true,
                },
            )
            .unwrap(),
        );
        let mut plan = plan_with(cache(4, 1, CachePolicy::Segmented, 2));
        plan.cache.as_mut().unwrap().stream_attention = true;
        let options = two_threads(&store_path);
        let mut actors = common::actors_with(&model, &plan, options);
        let got = run(&mut actors).unwrap();
        let d = worst(&got, &reference);
        assert!(got == reference, "{arch}: actors drift {d}");
    }
}

/// A store of 8-neuron bundles computed in clusters of 32 neurons (four bundles each, the
/// plan's `ffn_neurons`): far fewer clusters than bundles, one compute message per cluster
/// however its bundles land, every cache whose cold segment holds a cluster's bundles gives
/// the bits of the store in memory (inline and actors), and the sums grouped per cluster stay
/// close to one cluster per bundle.
#[test]
fn clusters_of_several_bundles_give_the_same_bits_under_every_cache() {
    let dir = ScratchDir::new("store-clusters");
    let store_path = store(&dir, 8);
    let with_clusters = |neurons: u32, cache: Option<CachePlan>| {
        let model = match &cache {
            Some(_) => Model::open(
                &store_path,
                WeightSource::Resident {
                    stream_output: false,
                    stream_attention: false,
                },
            )
            .unwrap(),
            None => Model::open(&store_path, WeightSource::Mapped).unwrap(),
        };
        let mut plan = plan_with(cache);
        plan.decode.ffn_neurons = neurons;
        plan.prefill.ffn_neurons = neurons;
        {
            let ffn = ffn_plan_of(&model, &plan).unwrap();
            InlineDriver::new(Arc::new(model), &plan, ffn, Kernels::best(), Serial).unwrap()
        }
    };
    let mut in_memory = with_clusters(32, None);
    let mut plan = plan_with(None);
    plan.decode.ffn_neurons = 32;
    let ffn = ffn_plan_of(in_memory.model(), &plan).unwrap();
    let scheduler = scheduler_for(in_memory.model(), &plan, ffn).unwrap();
    let program = scheduler.program(StepShape::Decode);
    // 512 neurons: 64 bundles, 16 clusters of 4.
    assert_eq!(program.ffn_units.len(), 64);
    assert_eq!(program.clusters(Phase::FfnNeurons).len(), 16);
    assert_eq!(program.units_of_cluster(Phase::FfnNeurons, 3), 12..16);
    let reference = run(&mut in_memory).unwrap();
    for (slots, hot, policy, loads) in [
        (4, 0, CachePolicy::Lru, 1),
        (7, 3, CachePolicy::Segmented, 2),
        (40, 20, CachePolicy::Segmented, 8),
        (200, 0, CachePolicy::Lru, 16),
    ] {
        let mut d = with_clusters(32, cache(slots, hot, policy, loads));
        d.start_trace();
        let got = run(&mut d).unwrap();
        assert_eq!(got, reference, "slots {slots} hot {hot} {policy:?}");
        // Bundles land one by one, yet each cluster goes out once, with its last bundle: one
        // message per cluster at most (runs of ready clusters share one), never one per bundle.
        let trace = d.take_trace();
        let commands = trace.records.iter().flat_map(|r| &r.commands);
        let (mut messages, mut clusters, mut loads_seen) = (0, 0, 0);
        for c in commands {
            match c {
                Command::Compute { work, .. } if work.phase == Phase::FfnNeurons => {
                    messages += 1;
                    clusters += work.clusters.len();
                }
                Command::Load { .. } => loads_seen += 1,
                _ => {}
            }
        }
        // 7 steps (the prompt in steps of 4, 4 and 1 tokens, then 4 decode) of 3 layers.
        assert_eq!(
            clusters,
            7 * 3 * 16,
            "slots {slots}: every cluster once a step"
        );
        assert!(messages <= clusters, "slots {slots}: {messages} messages");
        assert!(loads_seen > messages, "slots {slots}: {loads_seen} loads");
    }
    let model = Arc::new(
        Model::open(
            &store_path,
            WeightSource::Resident {
                stream_output: false,
                stream_attention: false,
            },
        )
        .unwrap(),
    );
    let mut plan = plan_with(cache(9, 2, CachePolicy::Segmented, 3));
    plan.decode.ffn_neurons = 32;
    plan.prefill.ffn_neurons = 32;
    let options = two_threads(&store_path);
    let mut actors = common::actors_with(&model, &plan, options);
    assert_eq!(run(&mut actors).unwrap(), reference, "actors");
    // One cluster per bundle sums the same products grouped otherwise: close.
    let per_bundle = run(&mut with_clusters(8, None)).unwrap();
    for (step, (a, b)) in per_bundle.iter().zip(&reference).enumerate() {
        let d = drift(a, b);
        assert!(d < 1e-4, "step {step}: clusters of bundles drift {d}");
    }
}

/// io_uring reads (`storage.engine = "uring"`), batched four at a time whether adjacent or
/// not: the same bits as positional reads, fewer requests than loads, the requests and
/// submissions the kernel saw counted, and a file truncated while running is the same clear
/// error.
#[test]
fn io_uring_reads_give_the_same_bits_and_the_same_errors() {
    let dir = ScratchDir::new("store-uring");
    let store_path = store(&dir, 64);
    let reference = run(&mut inline(&store_path, None)).unwrap();
    let model = Arc::new(Model::open(&store_path, WeightSource::RESIDENT).unwrap());
    let mut plan = plan_with(streaming(9, 3, CachePolicy::Segmented, 4));
    plan.cache.as_mut().unwrap().coalesce = 4;
    plan.decode.output_rows = 60;
    plan.prefill.output_rows = 60;
    plan.storage.engine = IoEngine::Uring;
    let options = || two_threads(&store_path);
    let mut d = match ActorDriver::new(
        Arc::clone(&model),
        &plan,
        ffn_plan_of(&model, &plan).unwrap(),
        Kernels::best(),
        options(),
    ) {
        Ok(d) => d,
        Err(e) => {
            // Kernels without io_uring, or containers whose seccomp filter forbids it: the
            // engine must say so (and point to the other engine), not fall over.
            let why = e.to_string();
            assert!(why.contains("io_uring") && why.contains("pread"), "{why}");
            common::environment_missing(&format!("io_uring unavailable here, refused with: {why}"));
            return;
        }
    };
    assert_eq!(run(&mut d).unwrap(), reference);
    let report = d.cache_report().unwrap();
    assert!(
        report.reads < report.loads,
        "batches of loads are one request each: {} reads for {} loads",
        report.reads,
        report.loads
    );
    // What the kernel was handed: every unit its own ring entry, each batch one submission.
    assert_eq!(
        (report.issued.requests, report.issued.submissions),
        (report.loads, report.reads),
        "io_uring: a request per unit, a submission per batch"
    );
    drop(d);
    // Positional reads of the same plan: one request (a pread, or a preadv of adjacent
    // units) per submission, never more requests than units.
    plan.storage.engine = IoEngine::Pread;
    let mut d = common::actors_with(&model, &plan, options());
    assert_eq!(run(&mut d).unwrap(), reference);
    let report = d.cache_report().unwrap();
    assert_eq!(report.issued.requests, report.issued.submissions);
    assert!(report.issued.requests > 0 && report.issued.requests <= report.loads);
    drop(d);
    // Inline driver, a file cut inside the last layer's bundles.
    let copy = dir.join("victim.gguf");
    std::fs::copy(&store_path, &copy).unwrap();
    let victim = Arc::new(
        Model::open(
            &copy,
            WeightSource::Resident {
                stream_output: false,
                stream_attention: false,
            },
        )
        .unwrap(),
    );
    let mut plan = plan_with(cache(3, 0, CachePolicy::Lru, 1));
    plan.storage.engine = IoEngine::Uring;
    let mut d = common::serial_driver(&victim, &plan);
    truncate_while_running(&mut d, &copy, &store_path);
}

/// Runs a prompt on `d` (reading `copy`, a copy of `store`), cuts `copy` inside the last
/// layer's bundles, checks that the next step fails naming the layer and the truncation, and
/// that after restoring the file the same driver serves the next step.
fn truncate_while_running(d: &mut InlineDriver<Serial>, copy: &Path, store: &Path) {
    let model = Arc::clone(d.model());
    let mut session = Session::new(&model, 64).unwrap();
    d.eval_last(&mut session, &PROMPT).unwrap();
    // Cut the file inside the last layer's bundles.
    let last = model.layers()[2].bundles.clone().unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(copy).unwrap();
    f.set_len(last.start as u64 + 1000).unwrap();
    let err = d.eval_last(&mut session, &[5]).unwrap_err();
    assert!(
        err.to_string().contains("layer 2") && err.to_string().contains("truncated"),
        "{err}"
    );
    assert_eq!(
        session.n_past(),
        PROMPT.len(),
        "the failed step left no token"
    );
    // Restore the file: the same driver serves the next request.
    std::fs::copy(store, copy).unwrap();
    d.eval_last(&mut session, &[5]).unwrap();
}

#[test]
fn hot_clusters_stay_and_cold_ones_stream() {
    let dir = ScratchDir::new("store-stats");
    let store_path = store(&dir, 64);
    // 3 layers x 8 clusters = 24 per step; the prompt runs as steps of 4, 4 and 1 tokens,
    // then 4 decode steps: 7 steps, each touching every cluster once, in order.
    let steps = 7;
    let total = |d: &InlineDriver<Serial>| {
        let s = d.cache_stats().unwrap();
        (
            s.iter().map(|l| l.hits).sum::<u64>(),
            s.iter().map(|l| l.misses).sum::<u64>(),
            s.iter().map(|l| l.evictions).sum::<u64>(),
        )
    };
    let mut segmented = inline(&store_path, cache(10, 6, CachePolicy::Segmented, 2));
    run(&mut segmented).unwrap();
    // 6 hot clusters hit on every step after the first; the 18 cold ones cycle through 4 slots
    // and never survive until their next use.
    let (hits, misses, evictions) = total(&segmented);
    assert_eq!(hits, 6 * (steps - 1));
    assert_eq!(hits + misses, 24 * steps);
    assert_eq!(
        evictions,
        misses - 6 - 4,
        "every miss but the hot ones' and the first 4 cold ones evicts"
    );
    // One LRU over the same 10 slots: a cyclic scan larger than the cache never hits.
    let mut lru = inline(&store_path, cache(10, 0, CachePolicy::Lru, 2));
    run(&mut lru).unwrap();
    assert_eq!(total(&lru).0, 0);
    // Everything fits: only the first step misses.
    let mut all = inline(&store_path, cache(24, 24, CachePolicy::Segmented, 2));
    run(&mut all).unwrap();
    assert_eq!(total(&all), (24 * (steps - 1), 24, 0));
}

#[test]
fn bad_stores_are_refused_with_a_reason() {
    let dir = ScratchDir::new("store-bad");
    let store_path = store(&dir, 64);

    // Converting a store again, or writing over an existing file, or over the source.
    let again = dir.join("again.gguf");
    let options = ConvertOptions::neuron_columns(64);
    let err = convert(&store_path, &again, &options, &mut |_, _| {}).unwrap_err();
    assert!(
        matches!(err, ConvertError::Store(StoreError::AlreadyStore { .. })),
        "{err}"
    );
    assert!(!again.exists());
    let err = convert(&dir.small_model(7), &store_path, &options, &mut |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("exists"), "{err}");
    let overwrite = options.clone().overwriting();
    let err = convert(
        &dir.small_model(7),
        &dir.small_model(7),
        &overwrite,
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("being converted"), "{err}");
    // Block-columns need whole blocks of the down type; no layout takes empty bundles.
    let x = dir.join("x.gguf");
    for options in [
        ConvertOptions::block_columns(48),
        ConvertOptions::neuron_columns(0),
    ] {
        let err = convert(&dir.small_model(7), &x, &options, &mut |_, _| {}).unwrap_err();
        assert!(
            matches!(err, ConvertError::Store(StoreError::BundleSize { .. })),
            "{err}"
        );
        assert!(!x.exists());
    }

    // A flipped byte inside a bundle: loading whole finds it; a cached run names the layer.
    let bytes = std::fs::read(&store_path).unwrap();
    let model = Model::open(&store_path, WeightSource::Mapped).unwrap();
    let range = model.layers()[1].bundles.clone().unwrap();
    let mut corrupt = bytes.clone();
    corrupt[range.start + 100] ^= 0x55;
    let corrupt_path = dir.join("corrupt.gguf");
    std::fs::write(&corrupt_path, &corrupt).unwrap();
    let err = Model::open(&corrupt_path, WeightSource::Mapped)
        .err()
        .expect("checksum failure");
    assert!(err.to_string().contains("layer 1"), "{err}");
    let mut d = inline(&corrupt_path, cache(2, 0, CachePolicy::Lru, 1));
    let err = run(&mut d).unwrap_err();
    assert!(err.to_string().contains("layer 1 neurons 0..64"), "{err}");

    // Another format version, a missing or unknown down layout: the same store with its
    // metadata edited (the writer keeps the store's 4096 alignment, carried by
    // `general.alignment`).
    let edited = |from: &Path, name: &str, version: u32, layout: Option<&str>| {
        use conductor::runtime::gguf::{GgufFile, GgufWriter, Value};
        let file = GgufFile::open(from).unwrap();
        let mut w = GgufWriter::new();
        for (k, v) in file.metadata() {
            let v = match k.as_str() {
                "conductor.store.version" => Value::U32(version),
                "conductor.store.down_layout" => match layout {
                    Some(l) => Value::String(l.into()),
                    None => continue,
                },
                _ => v.clone(),
            };
            w.add_metadata(k.clone(), v).unwrap();
        }
        for t in file.tensors() {
            let data = file.tensor_data(t).to_vec();
            w.add_tensor(t.name.clone(), t.dims.clone(), t.ty, data)
                .unwrap();
        }
        let path = dir.join(name);
        w.write_file_atomic(&path).unwrap();
        path
    };
    let refused = |path: &Path| {
        Model::open(path, WeightSource::Mapped)
            .err()
            .expect("refused")
            .to_string()
    };
    let err = refused(&edited(&store_path, "v99.gguf", 99, Some("neuron_columns")));
    assert!(err.contains("version 99"), "{err}");
    let err = refused(&edited(&store_path, "nolayout.gguf", 2, None));
    assert!(
        err.contains("down_layout") && err.contains("missing"),
        "{err}"
    );
    let err = refused(&edited(&store_path, "diag.gguf", 2, Some("diagonal")));
    assert!(err.contains("unknown layout `diagonal`"), "{err}");
    // A version-1 store (block-columns, no layout key) still reads, with the same bits.
    let blocks = dir.store(&dir.small_model(7), &ConvertOptions::block_columns(64));
    let v1 = edited(&blocks, "v1.gguf", 1, None);
    assert_eq!(
        run(&mut inline(&v1, None)).unwrap(),
        run(&mut inline(&blocks, None)).unwrap()
    );
}

/// A storage actor that panics while reading fails the step in flight (its loads will never
/// be answered) instead of hanging it; one killed is replaced; the next steps give the
/// reference bits.
#[test]
fn a_failing_storage_actor_fails_the_step_instead_of_hanging() {
    let dir = ScratchDir::new("store-storage-fault");
    let store_path = store(&dir, 64);
    let reference = run(&mut inline(&store_path, None)).unwrap();
    let model = Arc::new(Model::open(&store_path, WeightSource::RESIDENT).unwrap());
    let plan = plan_with(streaming(9, 3, CachePolicy::Segmented, 2));
    let options = two_threads(&store_path);
    let mut d = common::actors_with(&model, &plan, options);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        assert!(d.inject_storage_panic(0));
        let err = run(&mut d).unwrap_err();
        let after_panic = run(&mut d).unwrap();
        assert!(d.kill_storage(0));
        std::thread::sleep(std::time::Duration::from_millis(20));
        let after_kill = (run(&mut d), run(&mut d));
        let _ = tx.send((err, after_panic, after_kill));
    });
    let (err, after_panic, after_kill) = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("a failed storage actor hung the driver");
    assert!(
        matches!(&err, StepError::Actor { actor, why } if actor == "storage" && why.contains("injected fault")),
        "{err}"
    );
    assert_eq!(after_panic, reference);
    // The first request after the kill may fail (the actor is gone); the next is served.
    assert!(after_kill.0.as_ref().map_or(true, |r| *r == reference));
    assert_eq!(after_kill.1.unwrap(), reference);
}

#[test]
fn a_store_truncated_while_running_fails_the_request_and_the_engine_recovers() {
    let dir = ScratchDir::new("store-trunc");
    let store_path = store(&dir, 64);
    let copy = dir.join("victim.gguf");
    std::fs::copy(&store_path, &copy).unwrap();
    let mut d = inline(&copy, cache(3, 0, CachePolicy::Lru, 1));
    truncate_while_running(&mut d, &copy, &store_path);
}

/// A Q4_K_M store's layers with Q4_K down columns have bundles shorter than the stride its
/// Q6_K layers set. Under a budget that holds about half its bundles, each hot slot is as
/// long as its own unit's read, so the cache holds more units than slots of the stride
/// would, within the cache's bytes; decoding through it, inline and on actors, gives the bits
/// of the store in memory.
#[test]
fn a_mixed_store_under_a_budget_packs_its_hot_slots_and_keeps_the_bits() {
    use conductor::runtime::cache::{split_sizes, MemoryBudget, StoreSizes, SLOT_ALIGN};
    use conductor::{DriverKind, Engine};
    const CTX: usize = 32;
    let dir = ScratchDir::new("store-mixed-budget");
    let spec = SyntheticSpec {
        n_layer: 8,
        n_embd: 256,
        n_ff: 1024,
        n_head: 4,
        n_head_kv: 2,
        mix: TypeMix::Q4KM,
        seed: 11,
        ..SyntheticSpec::default()
    };
    let source = dir.file("source.gguf", || {
        synthetic_model(&spec).unwrap().to_bytes().unwrap()
    });
    let store = dir.store(&source, &ConvertOptions::block_columns(256));
    let resident = Model::open(&store, WeightSource::RESIDENT).unwrap();
    let sizes = StoreSizes::of_store(&resident).unwrap();
    let stride = sizes.bundle_stride;
    assert!(
        sizes.layer_bundle_bytes.contains(&stride)
            && sizes.layer_bundle_bytes.iter().any(|&b| b < stride),
        "a Q4_K_M mix has layers of both lengths: {:?} against {stride}",
        sizes.layer_bundle_bytes
    );
    let greedy = |engine: &mut Engine| {
        let mut s = engine.session(Some(CTX)).unwrap();
        let mut logits = engine.eval_last(&mut s, &[1, 5, 9, 2, 7]).unwrap().to_vec();
        let mut rows = Vec::new();
        for _ in 0..4 {
            rows.push(logits.iter().map(|x| x.to_bits()).collect::<Vec<u32>>());
            let next = logits
                .iter()
                .enumerate()
                .fold(
                    (0, f32::MIN),
                    |best, (i, &x)| if x > best.1 { (i, x) } else { best },
                )
                .0 as u32;
            logits = engine.eval_last(&mut s, &[next]).unwrap().to_vec();
        }
        rows
    };
    let builder = |driver, threads| {
        Engine::builder()
            .model(&store)
            .threads(threads)
            .driver(driver)
            .context(CTX)
            .on_progress(|_| {})
    };
    let reference = greedy(&mut builder(DriverKind::Inline, 1).build().unwrap());
    // The fixed segment, then room for about half the bundles.
    let whole = split_sizes(&sizes, u64::MAX / 4, CTX as u32, 64, &CachePlan::default()).unwrap();
    let fixed = whole.resident_weights + whole.kv_cache + whole.scratch + whole.runtime_overhead;
    let bundles = u64::from(sizes.n_layer * sizes.bundles_per_layer);
    let budget = fixed + bundles / 2 * stride;
    for (driver, threads) in [(DriverKind::Inline, 1), (DriverKind::Actors, 2)] {
        let mut engine = builder(driver, threads)
            .memory(MemoryBudget::Bytes(budget))
            .build()
            .unwrap();
        let split = engine.budget().expect("a budget").clone();
        let plan = &split.plan;
        let of_the_stride = (split.cache / (stride + SLOT_ALIGN as u64)) as u32;
        assert!(
            plan.slots > of_the_stride && plan.hot_slots < whole.plan.hot_slots,
            "{driver:?}: {} slots ({} hot) in {} bytes, {of_the_stride} of the stride",
            plan.slots,
            plan.hot_slots,
            split.cache
        );
        assert!(
            greedy(&mut engine) == reference,
            "{driver:?}: decoding under the budget changed the bits"
        );
    }
}

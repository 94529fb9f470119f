//! Sparse decode end to end on a generated model: profiling, thresholds that hit their target,
//! outputs that do not depend on threads or driver, 0% sparsity close to dense, predictors
//! that keep what the threshold keeps, and the bad inputs (another model's profile, no
//! profile, no predictors, calibration text too short).

mod common;

use common::{assert_success, ScratchDir};
use conductor::profile::{profile_model, ProfileOptions, ProfileRunError};
use conductor::runtime::cache::{split_budget, MemoryBudget};
use conductor::runtime::convert::{convert, ConvertOptions};
use conductor::runtime::model::{FfnActivation, Model, WeightSource};
use conductor::runtime::plan::CachePolicy;
use conductor::runtime::plan::{ExecutionPlan, IoEngine};
use conductor::runtime::sparse::profile::ModelProfile;
use conductor::runtime::sparse::SparsityMode;
use conductor::runtime::synthetic::{synthetic_model, SyntheticSpec};
use conductor::runtime::trace::{ActiveSet, Trace};
use conductor::{DriverKind, Engine, Error, SparsitySettings};
use conductor_planner::predictor::PredictorConfig;
use std::path::{Path, PathBuf};

fn spec(seed: u64, activation: FfnActivation) -> SyntheticSpec {
    SyntheticSpec {
        n_ctx: 512,
        activation,
        ..common::small_spec(seed)
    }
}

/// A generated model of `spec` written into `dir` as `name`.
fn write_model(dir: &ScratchDir, name: &str, spec: &SyntheticSpec) -> PathBuf {
    dir.file(name, || synthetic_model(spec).unwrap().to_bytes().unwrap())
}

/// Text of many different words, so every token position sees varied inputs.
fn text(words: usize) -> String {
    let mut x = 12345u64;
    let mut out = String::new();
    for _ in 0..words {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = 2 + (x % 6) as usize;
        for k in 0..len {
            out.push((b'a' + ((x >> (8 + 5 * k)) % 26) as u8) as char);
        }
        out.push(if x.is_multiple_of(11) { '.' } else { ' ' });
    }
    out
}

fn build(
    path: &Path,
    driver: DriverKind,
    threads: usize,
    sparsity: SparsitySettings,
) -> Result<Engine, Error> {
    Engine::builder()
        .model(path)
        .threads(threads)
        .driver(driver)
        .sparsity(sparsity)
        .on_progress(|_| {})
        .build()
}

fn settings(mode: SparsityMode, target: f32) -> SparsitySettings {
    SparsitySettings {
        mode: Some(mode),
        target: Some(target),
        predictor_recall: None,
        profile: None,
        all_tokens: false,
        down_type: None,
        keep_down_layout: false,
    }
}

fn quick_predictors() -> PredictorConfig {
    PredictorConfig {
        ranks: vec![32, 64],
        ..PredictorConfig::default()
    }
}

/// Profiles `model` (with predictors at 50%) and writes `MODEL.profile` beside it.
fn profile(model: &Path) -> ModelProfile {
    let mut engine = build(
        model,
        DriverKind::Inline,
        2,
        settings(SparsityMode::Dense, 0.0),
    )
    .unwrap();
    let options = ProfileOptions {
        ctx: 64,
        max_tokens: 3072,
        reference_sparsity: 0.5,
        predictors: Some((0.5, quick_predictors())),
        threads: 2,
    };
    let p = profile_model(&mut engine, &text(4000), "test", &options, &|_, _| {}).unwrap();
    p.save(&ModelProfile::default_path(model)).unwrap();
    p
}

/// Logits of every position of a greedy continuation: the prompt, then 12 decoded tokens.
const PROMPT: &str = "the quick brown fox jumps over";

fn decode_logits(engine: &mut Engine) -> Vec<Vec<f32>> {
    let prompt = engine.tokenize(PROMPT);
    let mut session = engine.session(Some(128)).unwrap();
    let mut all = Vec::new();
    let mut logits = engine.eval_last(&mut session, &prompt).unwrap().to_vec();
    for _ in 0..12 {
        let next = argmax(&logits);
        all.push(logits);
        logits = engine.eval_last(&mut session, &[next]).unwrap().to_vec();
    }
    all.push(logits);
    all
}

/// How an engine under a budget reads bundles: page by page (`--gate-first`, runs `gap` pages
/// apart read as one) or whole; runs of up to 16 reads in flight together through io_uring
/// (`batch`).
struct PageReads {
    pages: bool,
    gap: u32,
    batch: bool,
}

/// An engine over the store `store` under `budget` bytes, with one LRU over all slots (so
/// every way of reading keeps the same units cached) and 128 tokens of context.
fn budget_engine(
    store: &Path,
    driver: DriverKind,
    threads: usize,
    sparsity: SparsitySettings,
    budget: u64,
    reads: PageReads,
) -> Engine {
    let mut builder = Engine::builder();
    if reads.batch {
        builder = builder.io_engine(IoEngine::Uring).io_batch(16);
    }
    builder
        .model(store)
        .threads(threads)
        .driver(driver)
        .sparsity(sparsity)
        .memory(MemoryBudget::Bytes(budget))
        .cache_policy(CachePolicy::Lru)
        .gate_first(reads.pages)
        .gate_first_gap(reads.gap)
        .context(128)
        .on_progress(|_| {})
        .build()
        .unwrap()
}

/// The trace an engine recorded over [`decode_logits`] (which gave `got`) replays to the same
/// commands through the simulator's backend and through `inline`'s backend, which computes and
/// reads for real and derives the events finished phases owe from its own data: one dispatch
/// core, whichever backend carries the commands out.
fn check_backends_agree(trace: &Trace, inline: &mut Engine, got: &[Vec<f32>]) {
    let replayed = conductor_simulator::replay(trace).unwrap();
    assert_eq!(
        replayed.mismatched, 0,
        "simulator: {:?}",
        replayed.first_mismatch
    );
    let prompt = inline.tokenize(PROMPT);
    let decoded: Vec<[u32; 1]> = got[..got.len() - 1].iter().map(|l| [argmax(l)]).collect();
    let steps: Vec<&[u32]> = std::iter::once(&prompt[..])
        .chain(decoded.iter().map(|t| &t[..]))
        .collect();
    let records = inline.replay_trace(trace, &steps).unwrap();
    assert_eq!(records.len(), trace.records.len());
    for (i, (got, want)) in records.iter().zip(&trace.records).enumerate() {
        assert_eq!(
            (&got.event, &got.commands),
            (&want.event, &want.commands),
            "inline backend, record {i}"
        );
    }
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i as u32)
        .unwrap()
}

#[test]
fn sparse_decode_end_to_end() {
    let dir = ScratchDir::new("sparse-e2e");
    let model = write_model(&dir, "m.gguf", &spec(3, FfnActivation::Silu));
    let p = profile(&model);
    assert_eq!(p.layers.len(), 3);
    let set = p.predictors.as_ref().expect("predictors trained");
    for (l, &(recall, precision, predicted)) in set.held_out.iter().enumerate() {
        assert!(recall > 0.9, "layer {l}: held-out recall {recall}");
        assert!(
            precision > 0.5 && predicted < 0.95,
            "layer {l}: {precision} {predicted}"
        );
    }

    // Dense reference, then threshold decode at 0%: every neuron whose activation is not zero
    // is kept, so only the arithmetic of the down projection differs.
    let dense = decode_logits(
        &mut build(
            &model,
            DriverKind::Inline,
            1,
            settings(SparsityMode::Dense, 0.0),
        )
        .unwrap(),
    );
    let mut zero = build(
        &model,
        DriverKind::Inline,
        1,
        settings(SparsityMode::Threshold, 0.0),
    )
    .unwrap();
    let at_zero = decode_logits(&mut zero);
    let (_, active) = zero.take_sparsity_stats().expect("sparse decode ran");
    assert!(active > 0.999, "0% sparsity keeps every neuron: {active}");
    for (d, s) in dense.iter().zip(&at_zero) {
        let scale = d.iter().fold(0f32, |m, x| m.max(x.abs()));
        let diff = d.iter().zip(s).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            diff <= 0.02 * scale,
            "0% sparse vs dense: max diff {diff} (scale {scale})"
        );
    }

    // Threshold at 50%: about half the neurons active in decode, and outputs change.
    let mut half = build(
        &model,
        DriverKind::Inline,
        1,
        settings(SparsityMode::Threshold, 0.5),
    )
    .unwrap();
    let at_half = decode_logits(&mut half);
    let (gate, active) = half.take_sparsity_stats().unwrap();
    assert_eq!(gate, 1.0, "threshold mode computes every gate row");
    assert!(
        (0.35..0.65).contains(&active),
        "active share at 50%: {active}"
    );
    assert_ne!(at_half, at_zero);

    // Bit-identical whatever the threads and the driver, in every sparse mode.
    for mode in SparsityMode::ALL.into_iter().filter(|m| m.is_sparse()) {
        let reference =
            decode_logits(&mut build(&model, DriverKind::Inline, 1, settings(mode, 0.5)).unwrap());
        for (driver, threads) in [
            (DriverKind::Inline, 2),
            (DriverKind::Actors, 1),
            (DriverKind::Actors, 2),
        ] {
            let got =
                decode_logits(&mut build(&model, driver, threads, settings(mode, 0.5)).unwrap());
            assert!(
                got == reference,
                "{mode:?} on {driver:?} with {threads} threads differs"
            );
        }
    }

    // Predictor mode computes fewer gate rows and keeps nearly what the threshold keeps.
    let mut pred = build(
        &model,
        DriverKind::Inline,
        1,
        settings(SparsityMode::Predictor, 0.5),
    )
    .unwrap();
    let at_pred = decode_logits(&mut pred);
    let (gate, active_pred) = pred.take_sparsity_stats().unwrap();
    assert!(gate < 0.95, "the predictor skips gate rows: {gate}");
    assert!(
        active_pred <= active + 1e-9 && active_pred > 0.9 * active,
        "{active_pred} vs {active}"
    );
    let agree = at_pred
        .iter()
        .zip(&at_half)
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count();
    assert!(
        agree >= at_half.len() - 2,
        "predictor and threshold agree on {agree} of {}",
        at_half.len()
    );

    // Predictor-only: every neuron the predictors name passes (no threshold), so more are
    // active than the predictor mode keeps, and the outputs differ from it.
    let mut only = build(
        &model,
        DriverKind::Inline,
        1,
        settings(SparsityMode::PredictorOnly, 0.5),
    )
    .unwrap();
    let at_only = decode_logits(&mut only);
    let (gate_only, active_only) = only.take_sparsity_stats().unwrap();
    assert_eq!(active_only, gate_only, "every named neuron is computed");
    assert!(gate_only < 0.95, "the predictor skips neurons: {gate_only}");
    assert!(active_only > active_pred, "{active_only} vs {active_pred}");
    assert_ne!(at_only, at_pred);

    // SwiGLU models decode densely by default, profile or not: on this CPU the threshold path is
    // slower than dense (docs/benchmarks.md), so sparsity is asked for explicitly.
    let default = build(&model, DriverKind::Inline, 1, SparsitySettings::default()).unwrap();
    assert!(
        default.model().sparse().is_none(),
        "a SwiGLU model is dense by default"
    );
}

/// `keep_down_layout` (how `conductor profile` scores the operating points of a model whose
/// store holds block columns): at 50% sparsity in memory no transposed copy of the down
/// projections is made, and decode reads the active neurons' down columns from the model's
/// block columns instead, close to the transposed copy's answer (which re-quantizes them).
#[test]
fn sparse_decode_can_keep_the_down_projections_layout() {
    let dir = ScratchDir::new("sparse-keep-down");
    let model = write_model(&dir, "m.gguf", &spec(5, FfnActivation::Silu));
    profile(&model);
    let run = |keep_down_layout| {
        let sparsity = SparsitySettings {
            keep_down_layout,
            ..settings(SparsityMode::Threshold, 0.5)
        };
        let mut engine = build(&model, DriverKind::Inline, 1, sparsity).unwrap();
        let sparse = engine.model().sparse().expect("sparse decode");
        let copies = sparse.layers.iter().filter(|l| l.down_t.is_some()).count();
        let bytes = sparse.bytes();
        (copies, bytes, decode_logits(&mut engine))
    };
    let (copies, bytes, transposed) = run(false);
    let (kept_copies, kept_bytes, kept) = run(true);
    assert_eq!(
        copies, 3,
        "at 50% every layer's down projection is transposed"
    );
    assert_eq!(kept_copies, 0, "keep_down_layout transposes nothing");
    assert!(kept_bytes < bytes, "{kept_bytes} against {bytes}");
    // The prompt is prefilled densely, so the first decoded position sees the same inputs:
    // the two differ only in the down projection's arithmetic there.
    let (a, b) = (&transposed[1], &kept[1]);
    let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(diff <= 0.02 * scale, "max diff {diff} (scale {scale})");
}

#[test]
fn bad_profiles_and_texts_are_clear_errors() {
    let dir = ScratchDir::new("sparse-bad");
    let model = write_model(&dir, "a.gguf", &spec(5, FfnActivation::Silu));
    let other = write_model(&dir, "b.gguf", &spec(6, FfnActivation::Silu));

    // No profile: the explicit modes say where they looked; the default is dense.
    let e = build(
        &model,
        DriverKind::Inline,
        1,
        settings(SparsityMode::Threshold, 0.5),
    )
    .err()
    .expect("no profile");
    assert!(matches!(e, Error::NoProfile { .. }), "{e}");
    assert!(e.to_string().contains("a.gguf.profile"), "{e}");
    let dense = build(&model, DriverKind::Inline, 1, SparsitySettings::default()).unwrap();
    assert!(dense.model().sparse().is_none());

    // Empty text, text shorter than one context.
    let mut engine = build(
        &model,
        DriverKind::Inline,
        1,
        settings(SparsityMode::Dense, 0.0),
    )
    .unwrap();
    let options = ProfileOptions {
        ctx: 64,
        max_tokens: 256,
        reference_sparsity: 0.5,
        predictors: None,
        threads: 1,
    };
    let e = profile_model(&mut engine, "", "empty", &options, &|_, _| {}).unwrap_err();
    assert!(matches!(e, ProfileRunError::EmptyText), "{e}");
    let e = profile_model(&mut engine, "a few words", "short", &options, &|_, _| {}).unwrap_err();
    assert!(matches!(e, ProfileRunError::ShortText { .. }), "{e}");

    // A profile without predictors: threshold works, predictor mode says what is missing.
    let p = profile_model(&mut engine, &text(1500), "t", &options, &|_, _| {}).unwrap();
    p.save(&ModelProfile::default_path(&model)).unwrap();
    assert!(build(
        &model,
        DriverKind::Inline,
        1,
        settings(SparsityMode::Threshold, 0.3)
    )
    .is_ok());
    let e = build(
        &model,
        DriverKind::Inline,
        1,
        settings(SparsityMode::Predictor, 0.3),
    )
    .err()
    .expect("no predictors");
    assert!(e.to_string().contains("no predictors"), "{e}");

    // Another model's profile.
    let e = build(
        &other,
        DriverKind::Inline,
        1,
        SparsitySettings {
            profile: Some(ModelProfile::default_path(&model)),
            ..settings(SparsityMode::Threshold, 0.5)
        },
    )
    .err()
    .expect("another model's profile");
    assert!(e.to_string().contains("another model"), "{e}");

    // A sparsity outside the table.
    let e = build(
        &model,
        DriverKind::Inline,
        1,
        settings(SparsityMode::Threshold, 1.0),
    )
    .err()
    .expect("100% sparsity");
    assert!(e.to_string().contains("outside"), "{e}");
}

/// A SiLU model of `spec(seed)` written and profiled in `dir`, and its neuron store with
/// per-neuron down columns (bundles of 16): (model, store).
fn profiled_store(dir: &ScratchDir, seed: u64) -> (PathBuf, PathBuf) {
    let model = write_model(dir, "m.gguf", &spec(seed, FfnActivation::Silu));
    profile(&model);
    let store = dir.join("m.store.gguf");
    convert(
        &model,
        &store,
        &ConvertOptions::neuron_columns(16),
        &mut |_, _| {},
    )
    .unwrap();
    (model, store)
}

/// Sparse decode of a neuron store with per-neuron down columns: the source's profile serves
/// it, it decodes like the source's sparse decode (the down columns are re-quantized), and
/// under memory budgets, through the cache, inline or on actors, it gives the same bits as in
/// memory.
#[test]
fn sparse_decode_of_a_neuron_store_through_the_cache() {
    let dir = ScratchDir::new("sparse-store");
    let (model, store) = profiled_store(&dir, 5);
    let mut bytes_read = Vec::new();
    let mut threshold_reference = Vec::new();
    let (mut sparse_fixed, mut sparse_slot) = (0, 0);
    for mode in SparsityMode::ALL.into_iter().filter(|m| m.is_sparse()) {
        let mut in_memory = build(&store, DriverKind::Inline, 1, settings(mode, 0.5)).unwrap();
        let reference = decode_logits(&mut in_memory);
        let (_, active) = in_memory.take_sparsity_stats().expect("sparse decode ran");
        // Without a threshold every neuron the predictors name is active.
        let most = if mode.gate_threshold() { 0.65 } else { 0.95 };
        assert!((0.3..most).contains(&active), "{mode:?}: active {active}");
        if mode == SparsityMode::Threshold {
            threshold_reference = reference.clone();
        }
        let source =
            decode_logits(&mut build(&model, DriverKind::Inline, 1, settings(mode, 0.5)).unwrap());
        let agree = source
            .iter()
            .zip(&reference)
            .filter(|(a, b)| argmax(a) == argmax(b))
            .count();
        assert!(
            agree >= source.len() - 2,
            "{mode:?}: store and source agree on {agree} of {}",
            source.len()
        );

        // Budgets of a few slots and of most of the model, above the fixed segment.
        let resident = Model::open(&store, WeightSource::RESIDENT).unwrap();
        let split = split_budget(&resident, u64::MAX / 4, 128, 64, CachePolicy::Segmented).unwrap();
        let fixed = split.resident_weights
            + split.kv_cache
            + split.scratch
            + split.runtime_overhead
            + in_memory.model().sparse().unwrap().bytes() as u64;
        let slot = resident.store().unwrap().layout.stride + 4096;
        if mode == SparsityMode::Threshold {
            (sparse_fixed, sparse_slot) = (fixed, slot);
        }
        let mut read = 0;
        for (slots, driver, threads) in [
            (6, DriverKind::Inline, 1),
            (6, DriverKind::Actors, 2),
            (40, DriverKind::Actors, 1),
        ] {
            let mut engine = Engine::builder()
                .model(&store)
                .threads(threads)
                .driver(driver)
                .sparsity(settings(mode, 0.5))
                .memory(MemoryBudget::Bytes(fixed + slots * slot))
                .context(128)
                .on_progress(|_| {})
                .build()
                .unwrap();
            // The budget holds the sparse decode's tables beside the resident weights.
            assert_eq!(
                engine.budget().expect("a budget").resident_weights,
                split.resident_weights + engine.model().sparse().unwrap().bytes() as u64,
                "{mode:?}: the sparse decode's tables are not in the budget"
            );
            let got = decode_logits(&mut engine);
            assert!(
                got == reference,
                "{mode:?}, {slots} slots, {driver:?} x{threads}: not the in-memory bits"
            );
            let report = engine.cache_report().expect("a cache");
            assert!(report.loads > 0 && report.misses() > 0, "{report:?}");
            if slots == 6 && driver == DriverKind::Inline {
                read = report.bytes_read;
            }
        }
        bytes_read.push(read);
    }
    // `conductor plan --sparsity threshold` on the store: the plan carries the mode, the
    // target, the profile's thresholds per layer, a hot segment ranked by the profile, and its
    // budget; the engine then decodes sparsely under that budget with the in-memory bits.
    let plan_path = dir.join("sparse-plan.json");
    let budget = format!("{}KiB", (sparse_fixed + 10 * sparse_slot) / 1024);
    let out = common::conductor()
        .args(["plan", "-m", store.to_str().unwrap()])
        .args([
            "--profile",
            concat!(env!("CARGO_MANIFEST_DIR"), "/profiles/build-machine.toml"),
        ])
        .args(["--memory", &budget, "-c", "128", "-t", "1"])
        .args(["--sparsity", "threshold", "--target-sparsity", "50%"])
        .args(["-o", plan_path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_success(&out);
    let plan = ExecutionPlan::from_file(&plan_path).unwrap();
    let sparsity = plan
        .sparsity
        .clone()
        .expect("the plan carries its sparsity");
    assert_eq!(sparsity.mode, SparsityMode::Threshold);
    assert_eq!(sparsity.target, Some(0.5));
    let n_layer = Model::open(&store, WeightSource::Mapped)
        .unwrap()
        .config()
        .n_layer as usize;
    assert_eq!(sparsity.thresholds.len(), n_layer);
    assert!(!plan.cache.as_ref().unwrap().hot_units.is_empty());
    let mut planned = Engine::builder()
        .model(&store)
        .threads(1)
        .driver(DriverKind::Inline)
        .plan(plan)
        .context(128)
        .on_progress(|_| {})
        .build()
        .unwrap();
    assert!(planned.budget().is_some());
    assert!(
        decode_logits(&mut planned) == threshold_reference,
        "the planned sparse run differs from the in-memory threshold run"
    );

    // Predictor mode reads no more than threshold mode. (On this SwiGLU model every 16-neuron
    // bundle holds some predicted neuron, so both read the same; which bundles are skipped is
    // checked in the scheduler's tests.)
    assert!(
        bytes_read[1] <= bytes_read[0],
        "{bytes_read:?} bytes (threshold, predictor)"
    );
}

#[test]
fn relu_model_natural_sparsity_and_predictors() {
    let dir = ScratchDir::new("sparse-relu");
    let spec = SyntheticSpec {
        relu_active_share: Some(0.1),
        ..spec(9, FfnActivation::Relu)
    };
    let model = write_model(&dir, "relu.gguf", &spec);
    let p = profile(&model);
    for (l, layer) in p.layers.iter().enumerate() {
        assert!(
            (0.75..0.97).contains(&layer.zero_fraction),
            "layer {l}: natural sparsity {}",
            layer.zero_fraction
        );
    }
    // The default for a ReLU model with predictors: the predictors at the natural zeros.
    let mut engine = build(&model, DriverKind::Inline, 2, SparsitySettings::default()).unwrap();
    let sparse = engine.model().sparse().expect("sparse by default");
    assert_eq!(
        (sparse.mode, sparse.sparsity),
        (SparsityMode::Predictor, 0.0)
    );
    let predicted = decode_logits(&mut engine);
    let (gate, active) = engine.take_sparsity_stats().unwrap();
    assert!(gate < 0.5, "the predictors name few neurons: {gate}");
    assert!(active < 0.25 && active > 0.02, "active share {active}");
    // Natural zeros are lossless: the threshold at 0 matches dense up to the down arithmetic,
    // and the predictors keep the same greedy tokens.
    let dense = decode_logits(
        &mut build(
            &model,
            DriverKind::Inline,
            1,
            settings(SparsityMode::Dense, 0.0),
        )
        .unwrap(),
    );
    let zeros = decode_logits(
        &mut build(
            &model,
            DriverKind::Inline,
            1,
            settings(SparsityMode::Threshold, 0.0),
        )
        .unwrap(),
    );
    for (d, s) in dense.iter().zip(&zeros) {
        let scale = d.iter().fold(0f32, |m, x| m.max(x.abs()));
        let diff = d.iter().zip(s).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            diff <= 0.02 * scale,
            "natural zeros vs dense: {diff} (scale {scale})"
        );
    }
    let agree = predicted
        .iter()
        .zip(&zeros)
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count();
    assert!(
        agree >= zeros.len() - 1,
        "predictors agree on {agree} of {}",
        zeros.len()
    );
}

#[test]
fn powerinfer_files_run_with_their_own_predictors() {
    use conductor::runtime::sparse::powerinfer::{write_powerinfer_test_files, PowerInferTestSpec};
    let dir = ScratchDir::new("sparse-powerinfer");
    let spec = SyntheticSpec {
        relu_active_share: Some(0.1),
        ..spec(11, FfnActivation::Relu)
    };
    let model = dir.join("pi.gguf");
    let pred = dir.join("pi.predictor.gguf");
    write_powerinfer_test_files(&spec, &PowerInferTestSpec::default(), &model, &pred).unwrap();
    // No profile next to the file: the default still turns the file's predictors on.
    let mut engine = build(&model, DriverKind::Inline, 2, SparsitySettings::default()).unwrap();
    let sparse = engine
        .model()
        .sparse()
        .expect("a PowerInfer file is sparse by default");
    assert_eq!(sparse.mode, SparsityMode::Predictor);
    let first = decode_logits(&mut engine);
    let (gate, active) = engine.take_sparsity_stats().unwrap();
    assert!(gate < 1.0, "the predictors select a subset: {gate}");
    assert!(active <= gate, "active {active} within predicted {gate}");
    // Same numbers on another thread count and driver.
    let again = decode_logits(
        &mut build(&model, DriverKind::Actors, 1, SparsitySettings::default()).unwrap(),
    );
    assert_eq!(first, again);
    // Asked for dense, the same file runs densely.
    let dense = build(
        &model,
        DriverKind::Inline,
        1,
        settings(SparsityMode::Dense, 0.0),
    )
    .unwrap();
    assert!(dense.model().sparse().is_none());
}

#[test]
fn gate_first_loading_reads_fewer_bytes_with_the_same_bits() {
    // Rows wide enough that a page holds a handful of neurons' up rows or down columns, and
    // ~10% of neurons firing: many pages of a bundle hold no active neuron.
    let dir = ScratchDir::new("gate-first");
    let spec = SyntheticSpec {
        n_layer: 2,
        n_embd: 512,
        n_ff: 1024,
        relu_active_share: Some(0.1),
        ..spec(21, FfnActivation::Relu)
    };
    let model = write_model(&dir, "relu.gguf", &spec);
    let mut engine = build(
        &model,
        DriverKind::Inline,
        2,
        settings(SparsityMode::Dense, 0.0),
    )
    .unwrap();
    let options = ProfileOptions {
        ctx: 64,
        max_tokens: 1024,
        reference_sparsity: 0.0,
        predictors: Some((0.0, quick_predictors())),
        threads: 2,
    };
    let p = profile_model(&mut engine, &text(1600), "test", &options, &|_, _| {}).unwrap();
    p.save(&ModelProfile::default_path(&model)).unwrap();
    let store = dir.join("relu.store.gguf");
    convert(
        &model,
        &store,
        &ConvertOptions::neuron_columns(128),
        &mut |_, _| {},
    )
    .unwrap();
    // Threshold at the natural zeros: the reference is the store in memory.
    let threshold = || settings(SparsityMode::Threshold, 0.0);
    let reference = decode_logits(&mut build(&store, DriverKind::Inline, 1, threshold()).unwrap());
    let resident = Model::open(&store, WeightSource::RESIDENT).unwrap();
    let split = split_budget(&resident, u64::MAX / 4, 128, 64, CachePolicy::Segmented).unwrap();
    let layout = &resident.store().unwrap().layout;
    let slot = layout.stride + 4096;
    let fixed = split.resident_weights + split.kv_cache + split.scratch + split.runtime_overhead;
    // Room for a layer's bundles and two more (gate-first keeps a layer's bundles in slots):
    // bundles are evicted and read again every token. (A bundle's first read is whole, to
    // check its checksum.)
    let budget = fixed + (u64::from(layout.n_bundles) + 2) * slot;
    let mut read = Vec::new();
    // The last: runs of pages in flight together through io_uring where the kernel has it.
    #[cfg(feature = "io-uring")]
    let uring = match conductor::runtime::cache::Ring::new() {
        Ok(_) => true,
        Err(e) => {
            common::environment_missing(&format!(
                "io_uring unavailable here ({e}): the batched gate-first case"
            ));
            false
        }
    };
    #[cfg(not(feature = "io-uring"))]
    let uring = false;
    for (gate_first, gap, driver, threads, batch) in [
        (false, 0, DriverKind::Inline, 1, false),
        (true, 0, DriverKind::Inline, 1, false),
        (true, 0, DriverKind::Actors, 2, false),
        (true, 3, DriverKind::Actors, 1, false),
        (true, 0, DriverKind::Actors, 2, uring),
    ] {
        let make = |driver: DriverKind| {
            let reads = PageReads {
                pages: gate_first,
                gap,
                batch,
            };
            budget_engine(&store, driver, threads, threshold(), budget, reads)
        };
        let mut engine = make(driver);
        let recorded = driver == DriverKind::Actors;
        if recorded {
            engine.start_trace().unwrap();
        }
        let got = decode_logits(&mut engine);
        assert!(
            got == reference,
            "gate-first {gate_first} (gap {gap}), {driver:?} x{threads}: not the in-memory bits"
        );
        if recorded {
            // The trace keeps the neurons the gates let through, for the simulator, and
            // replays to the same commands through the simulator's backend and the inline
            // one.
            let trace = engine.take_trace().unwrap();
            check_backends_agree(&trace, &mut make(DriverKind::Inline), &got);
            let decode = trace.activity.last().expect("decode steps recorded");
            for set in &decode.layers {
                let ActiveSet::Neurons(v) = set else {
                    panic!("a gate-first step records its active neurons");
                };
                assert!(!v.is_empty() && v.len() < 1024 / 2, "{} active", v.len());
                assert!(v.windows(2).all(|w| w[0] < w[1]));
            }
        }
        let report = engine.cache_report().expect("a cache");
        assert!(report.misses() > 0, "{report:?}");
        if batch {
            assert!(report.reads < report.loads, "runs batched: {report:?}");
        }
        read.push(report.bytes_read);
    }
    // The same reads whichever driver or engine; fewer bytes than whole bundles (measured:
    // 13% fewer, about 14% of neurons firing); a gap reads more.
    assert_eq!(read[1], read[2], "{read:?}");
    assert_eq!(read[1], read[4], "{read:?}");
    assert!(read[1] * 100 < read[0] * 95, "gate-first read {read:?}");
    assert!(read[3] >= read[1], "{read:?}");

    // With predictors, the predicted neurons' pages (gate, up and down rows) are read in one
    // phase: the in-memory predictor bits, fewer bytes than the predicted bundles whole.
    let predictor = || settings(SparsityMode::Predictor, 0.0);
    let reference = decode_logits(&mut build(&store, DriverKind::Inline, 1, predictor()).unwrap());
    let mut read = Vec::new();
    for (pages, driver, threads, batch) in [
        (false, DriverKind::Inline, 1, false),
        (true, DriverKind::Inline, 1, false),
        (true, DriverKind::Actors, 2, uring),
    ] {
        let make = |driver: DriverKind| {
            let reads = PageReads {
                pages,
                gap: 0,
                batch,
            };
            budget_engine(
                &store,
                driver,
                threads,
                predictor(),
                budget + (1 << 20),
                reads,
            )
        };
        let mut engine = make(driver);
        let recorded = driver == DriverKind::Actors;
        if recorded {
            engine.start_trace().unwrap();
        }
        let got = decode_logits(&mut engine);
        assert!(
            got == reference,
            "predicted pages {pages}, {driver:?} x{threads}: not the in-memory bits"
        );
        if recorded {
            // The pages come as predictions (no gate phase), derived anew by either backend.
            let trace = engine.take_trace().unwrap();
            check_backends_agree(&trace, &mut make(DriverKind::Inline), &got);
        }
        let report = engine.cache_report().expect("a cache");
        read.push((report.bytes_read, report.loads));
    }
    // Page by page: more, smaller reads and never more bytes. (These predictors, trained on
    // random weights, name most neurons of every bundle: the bytes fall by under 1% here.)
    assert_eq!(read[1], read[2], "{read:?}");
    assert!(read[1].0 <= read[0].0 && read[1].1 > read[0].1, "{read:?}");

    // Gate-first needs the gate or the predictors to decide, and a budget.
    let err = Engine::builder()
        .model(&store)
        .sparsity(settings(SparsityMode::Dense, 0.0))
        .memory(MemoryBudget::Bytes(budget))
        .gate_first(true)
        .on_progress(|_| {})
        .build()
        .err()
        .expect("dense decode refuses gate-first loading");
    assert!(
        err.to_string()
            .contains("needs threshold sparsity (or predictor sparsity"),
        "{err}"
    );
    let err = Engine::builder()
        .model(&store)
        .sparsity(threshold())
        .gate_first(true)
        .on_progress(|_| {})
        .build()
        .err()
        .expect("no budget, no gate-first");
    assert!(err.to_string().contains("--memory"), "{err}");
}

/// Continuous batching under a memory budget and with sparse decode: a multi-sequence step of
/// three sequences, each at its own position with its own KV cache, sharing one neuron cache
/// of a few slots (so the sequences' bundles evict one another), gives every sequence the bits
/// of its own one-token decode step: dense, threshold and predictor sparsity, bundles or pages
/// read (`--gate-first`), inline and on actors, whatever order the sequences come in. Sparse
/// decode computes each sequence's own active neurons; the union of theirs decides only what
/// is read (a bundle or page one sequence needs serves every sequence that needs it, read
/// once), never what a sequence computes. The budget counts the three sessions' KV caches
/// ([`conductor::EngineBuilder::sequences`]).
#[test]
fn multi_sequence_steps_under_a_budget_give_each_sequence_its_solo_bits() {
    let dir = ScratchDir::new("sparse-batch");
    let (_, store) = profiled_store(&dir, 7);
    const N_SEQ: usize = 3;
    const CTX: usize = 64;
    let prompts = [
        "the quick brown fox jumps over",
        "a lazy dog sleeps",
        "once upon a time there was a small model that",
    ];
    let resident = Model::open(&store, WeightSource::RESIDENT).unwrap();
    let slot = resident.store().unwrap().layout.stride + 4096;
    for mode in [
        SparsityMode::Dense,
        SparsityMode::Threshold,
        SparsityMode::Predictor,
    ] {
        // The fixed segment of three sessions' KV caches (and the predictors), then a few
        // slots: a small cache the sequences contend for.
        let in_memory = build(&store, DriverKind::Inline, 1, settings(mode, 0.5)).unwrap();
        let predictors = in_memory.model().sparse().map_or(0, |s| s.bytes()) as u64;
        let sizes = conductor::runtime::cache::StoreSizes::of_store(&resident).unwrap();
        let split = conductor::runtime::cache::split_sizes_for(
            &sizes,
            u64::MAX / 4,
            CTX as u32,
            N_SEQ as u32,
            64,
            &conductor::runtime::plan::CachePlan::default(),
        )
        .unwrap();
        assert_eq!(split.sessions, N_SEQ as u32);
        let fixed = split.resident_weights
            + split.kv_cache
            + split.scratch
            + split.runtime_overhead
            + predictors;
        // The predictors and thresholds an engine under a budget holds differ from the ones in
        // memory (no transposed down projection): take the cache the first budget leaves, and
        // give back what is beyond 10 slots.
        let probe = |budget| {
            Engine::builder()
                .model(&store)
                .threads(1)
                .driver(DriverKind::Inline)
                .sparsity(settings(mode, 0.5))
                .memory(MemoryBudget::Bytes(budget))
                .context(CTX)
                .sequences(N_SEQ)
                .on_progress(|_| {})
                .build()
                .unwrap()
                .budget()
                .unwrap()
                .cache
        };
        let first = fixed + 10 * slot;
        let budget = first - probe(first).saturating_sub(10 * slot);
        let mut configs: Vec<(String, Engine)> = vec![(
            format!("{mode:?} in memory"),
            build(&store, DriverKind::Actors, 2, settings(mode, 0.5)).unwrap(),
        )];
        let page_modes: &[bool] = if mode == SparsityMode::Dense {
            &[false]
        } else {
            &[false, true]
        };
        for &pages in page_modes {
            for (driver, threads) in [(DriverKind::Inline, 1), (DriverKind::Actors, 2)] {
                let engine = Engine::builder()
                    .model(&store)
                    .threads(threads)
                    .driver(driver)
                    .sparsity(settings(mode, 0.5))
                    .memory(MemoryBudget::Bytes(budget))
                    .gate_first(pages)
                    .context(CTX)
                    .sequences(N_SEQ)
                    .on_progress(|_| {})
                    .build()
                    .unwrap();
                let b = engine.budget().expect("a budget");
                assert_eq!((b.sessions, b.n_ctx), (N_SEQ as u32, CTX as u32));
                // Fewer slots than the FFN's 96 bundles (gate-first loading needs a layer's 32
                // and more, and takes shorter prefill steps to have them; hot slots, as long
                // as their units without a slot's page of slack, fit a few more).
                let most = if pages { 90 } else { 12 };
                assert!(b.plan.slots <= most, "{mode:?}: {} slots", b.plan.slots);
                configs.push((
                    format!("{mode:?} under a budget, pages {pages}, {driver:?} x{threads}"),
                    engine,
                ));
            }
        }
        for (name, mut engine) in configs {
            check_batched_equals_solo(&mut engine, &name, &prompts, CTX);
        }
    }
}

/// On `engine`: each prompt alone and then 4 greedy one-token steps (the solo bits), then the
/// prompts in fresh sessions and the same tokens in multi-sequence steps over all of them,
/// the sequences in reverse order on every other step; each sequence's logits must be its
/// solo bits.
fn check_batched_equals_solo(engine: &mut Engine, name: &str, prompts: &[&str], ctx: usize) {
    const STEPS: usize = 4;
    let n_vocab = engine.model().config().n_vocab as usize;
    let mut solo: Vec<Vec<Vec<u32>>> = Vec::new();
    let mut chosen: Vec<Vec<u32>> = Vec::new();
    for prompt in prompts {
        let tokens = engine.tokenize(prompt);
        let mut s = engine.session(Some(ctx)).unwrap();
        let mut logits = engine.eval_last(&mut s, &tokens).unwrap().to_vec();
        let (mut rows, mut picks) = (Vec::new(), Vec::new());
        for _ in 0..STEPS {
            let next = argmax(&logits);
            picks.push(next);
            logits = engine.eval_last(&mut s, &[next]).unwrap().to_vec();
            rows.push(logits.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        }
        solo.push(rows);
        chosen.push(picks);
    }
    let mut sessions: Vec<_> = prompts
        .iter()
        .map(|p| {
            let tokens = engine.tokenize(p);
            let mut s = engine.session(Some(ctx)).unwrap();
            engine.eval_last(&mut s, &tokens).unwrap();
            s
        })
        .collect();
    for k in 0..STEPS {
        let mut order: Vec<usize> = (0..prompts.len()).collect();
        if k % 2 == 1 {
            order.reverse();
        }
        let tokens: Vec<u32> = order.iter().map(|&i| chosen[i][k]).collect();
        let mut refs: Vec<&mut _> = sessions.iter_mut().collect();
        let mut ordered: Vec<&mut _> = Vec::new();
        // `refs` in `order`, each session once.
        let mut taken: Vec<Option<&mut _>> = refs.drain(..).map(Some).collect();
        for &i in &order {
            ordered.push(taken[i].take().unwrap());
        }
        let logits = engine.step_sequences(&mut ordered, &tokens).unwrap();
        assert_eq!(logits.len(), prompts.len() * n_vocab, "{name}");
        for (row, &i) in logits.chunks_exact(n_vocab).zip(&order) {
            let bits: Vec<u32> = row.iter().map(|x| x.to_bits()).collect();
            assert!(
                bits == solo[i][k],
                "{name}: sequence {i} at step {k} differs from its solo decode"
            );
        }
    }
    if let Some(held) = engine.cache_report().map(|r| r.loads) {
        assert!(held > 0, "{name}: nothing read through the cache");
    }
}

/// A long prompt decoded sparsely in one step (`all_tokens`, as `conductor perplexity` runs
/// it: each cluster's gate, up and down products taken for every token at once) gives every
/// token the bits of its own one-token steps, at 30% in threshold and predictor mode, on one
/// thread or two.
#[test]
fn many_tokens_in_one_sparse_step_give_each_token_its_solo_bits() {
    let dir = ScratchDir::new("sparse-batched");
    let model = write_model(&dir, "m.gguf", &spec(9, FfnActivation::Silu));
    profile(&model);
    for mode in [SparsityMode::Threshold, SparsityMode::Predictor] {
        for threads in [1, 2] {
            let all = SparsitySettings {
                all_tokens: true,
                ..settings(mode, 0.3)
            };
            let mut batched = build(&model, DriverKind::Inline, threads, all).unwrap();
            let prompt = batched.tokenize(&text(60));
            assert!(prompt.len() >= 40, "{}", prompt.len());
            let prompt = &prompt[..40];
            let vocab = batched.model().config().n_vocab as usize;
            let mut session = batched.session(Some(64)).unwrap();
            let mut rows = Vec::new();
            batched
                .eval(&mut session, prompt, 0, &mut |_, r| {
                    rows.extend_from_slice(r)
                })
                .unwrap();
            assert_eq!(rows.len(), 40 * vocab);
            let mut solo = build(&model, DriverKind::Inline, 1, settings(mode, 0.3)).unwrap();
            let mut session = solo.session(Some(64)).unwrap();
            for (t, &token) in prompt.iter().enumerate() {
                let logits = solo.eval_last(&mut session, &[token]).unwrap();
                assert!(
                    logits == &rows[t * vocab..(t + 1) * vocab],
                    "{mode:?}, {threads} threads: token {t} differs"
                );
            }
        }
    }
}

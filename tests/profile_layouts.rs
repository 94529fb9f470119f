//! `conductor profile` sees the same activations whatever layout holds the weights: a Q4_K
//! model in its file's row layout, with its rows interleaved 8 by 8 at load (the default on
//! x86, where every threshold once came out 0), and as a neuron store in memory or on storage
//! under a memory budget.

mod common;

use common::ScratchDir;
use conductor::profile::{profile_model, ProfileOptions};
use conductor::runtime::cache::MemoryBudget;
use conductor::runtime::convert::{convert, ConvertOptions};
use conductor::runtime::quant::{GgmlType, Kernels, Layout};
use conductor::runtime::sparse::profile::{interpolate, ModelProfile};
use conductor::runtime::sparse::SparsityMode;
use conductor::runtime::synthetic::{synthetic_model, SyntheticSpec};
use conductor::{DriverKind, Engine, EngineBuilder, SparsitySettings};
use std::path::Path;

/// The profile of the model at `path` loaded by `configure`d builder, and the layout the
/// engine holds layer 0's gate in.
fn profile_of(
    path: &Path,
    configure: impl FnOnce(EngineBuilder) -> EngineBuilder,
) -> (ModelProfile, Option<Layout>) {
    let builder = Engine::builder()
        .model(path)
        .threads(2)
        .driver(DriverKind::Inline)
        .sparsity(SparsitySettings {
            mode: Some(SparsityMode::Dense),
            target: None,
            predictor_recall: None,
            profile: None,
            all_tokens: false,
            down_type: None,
            keep_down_layout: false,
        })
        .context(64)
        .on_progress(|_| {});
    let mut engine = configure(builder).build().unwrap();
    let layout = engine
        .model()
        .store()
        .is_none()
        .then(|| engine.model().layers()[0].gate.layout);
    let options = ProfileOptions {
        ctx: 64,
        max_tokens: 256,
        reference_sparsity: 0.5,
        predictors: None,
        threads: 2,
    };
    let p = profile_model(
        &mut engine,
        &common::random_words(99, 800),
        "test",
        &options,
        &|_, _| {},
    )
    .unwrap();
    (p, layout)
}

/// Panics naming the first layer and table where `got` differs from `want` by more than
/// `tolerance` (relative) in its first `exact_layers` layers bit for bit.
fn assert_close(
    got: &ModelProfile,
    want: &ModelProfile,
    exact_layers: usize,
    tolerance: f32,
    what: &str,
) {
    assert_eq!(got.layers.len(), want.layers.len(), "{what}");
    for (l, (g, w)) in got.layers.iter().zip(&want.layers).enumerate() {
        let tolerance = if l < exact_layers { 0.0 } else { tolerance };
        let tables: [(&str, &[f32], &[f32]); 5] = [
            ("importance", &g.importance, &w.importance),
            ("thresholds", &g.thresholds, &w.thresholds),
            ("kept_mass", &g.kept_mass, &w.kept_mass),
            ("frequency", &g.frequency, &w.frequency),
            ("mean_abs", &g.mean_abs, &w.mean_abs),
        ];
        for (name, a, b) in tables {
            // A frequency is a share of tokens: a token more or less moves it by 1/256.
            let slack = if name == "frequency" && tolerance > 0.0 {
                0.02
            } else {
                0.0
            };
            let far = |(x, y): (&f32, &f32)| {
                (x - y).abs() > (tolerance * x.abs().max(y.abs())).max(slack)
            };
            if let Some(i) = a.iter().zip(b).position(far) {
                panic!("{what}: layer {l} {name}[{i}]: {} vs {}", a[i], b[i]);
            }
        }
        if l < exact_layers {
            assert_eq!(g, w, "{what}: layer {l}");
        }
    }
}

/// Bit for bit.
fn assert_same(got: &ModelProfile, want: &ModelProfile, what: &str) {
    assert_close(got, want, usize::MAX, 0.0, what);
}

#[test]
fn interleaved_file_layout_and_stored_weights_profile_alike() {
    let dir = ScratchDir::new("profile-layouts");
    let spec = SyntheticSpec {
        n_layer: 2,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 2,
        n_ctx: 256,
        weight_type: GgmlType::Q4_K,
        seed: 17,
        ..SyntheticSpec::default()
    };
    let model = dir.file("q4k.gguf", || {
        synthetic_model(&spec).unwrap().to_bytes().unwrap()
    });
    let store = dir.join("q4k.store.gguf");
    // Block-column bundles hold the source's down blocks bit for bit, so even the down
    // projection's norms match.
    convert(
        &model,
        &store,
        &ConvertOptions::block_columns(256),
        &mut |_, _| {},
    )
    .unwrap();
    let budget = || MemoryBudget::Bytes(48 << 20);

    let (rows, rows_layout) = profile_of(&model, |b| b.interleave(false));
    assert_eq!(rows_layout, Some(Layout::Rows));
    if Kernels::best().has_interleaved_kernels() {
        let (x8, x8_layout) = profile_of(&model, |b| b.interleave(true));
        assert!(
            matches!(x8_layout, Some(Layout::X8 { .. })),
            "{x8_layout:?}"
        );
        assert_same(&x8, &rows, "interleaved vs file layout");
    } else {
        common::environment_missing("no interleaved K-quant kernels on this CPU (AVX2 or NEON)");
    }
    let (stored, _) = profile_of(&store, |b| b);
    // A store's FFN sums its bundles' partial outputs in bundle order, so from layer 1 on its
    // inputs differ in the last bits from the file's; layer 0 sees the very same activations.
    assert_close(&stored, &rows, 1, 1e-3, "a neuron store in memory");
    let (stored_budgeted, _) = profile_of(&store, |b| b.memory(budget()));
    assert_same(
        &stored_budgeted,
        &stored,
        "a neuron store on storage under a budget vs in memory",
    );

    // And the profile says something: real thresholds, less than all the mass kept.
    for (l, layer) in rows.layers.iter().enumerate() {
        let t = interpolate(&rows.grid, &layer.thresholds, 0.5);
        let kept = interpolate(&rows.grid, &layer.kept_mass, 0.5);
        assert!(t > 0.0, "layer {l}: threshold {t} at 50%");
        assert!(
            kept > 0.5 && kept < 1.0,
            "layer {l}: kept mass {kept} at 50%"
        );
        assert!(layer.importance.iter().all(|v| v.is_finite() && *v > 0.0));
    }
}

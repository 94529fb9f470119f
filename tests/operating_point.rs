//! The operating point of sparse decode, chosen by measurement: what `conductor profile`
//! records, what `--sparsity default` resolves to under a memory budget (and in memory), and
//! the bad inputs (no profile, a profile of another model or file).

mod common;

use common::{assert_success, ScratchDir};
use conductor::profile::{profile_model, ProfileOptions};
use conductor::runtime::cache::MemoryBudget;
use conductor::runtime::convert::{convert, ConvertOptions};
use conductor::runtime::model::FfnActivation;
use conductor::runtime::sparse::operating::{
    point_cost, ChosenPoint, OperatingPoint, PointSource, PROSPARSE_RECALL,
};
use conductor::runtime::sparse::profile::ModelProfile;
use conductor::runtime::sparse::SparsityMode;
use conductor::runtime::synthetic::{synthetic_model, SyntheticSpec, TypeMix};
use conductor::{DriverKind, Engine, Error, SparsitySettings};
use conductor_planner::predictor::PredictorConfig;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A small SwiGLU model in Q4_K_M (K-quant blocks of 256: n_embd 256).
fn q4km_spec(seed: u64) -> SyntheticSpec {
    SyntheticSpec {
        n_layer: 2,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 2,
        n_ctx: 256,
        mix: TypeMix::Q4KM,
        seed,
        ..SyntheticSpec::default()
    }
}

fn settings(mode: Option<SparsityMode>) -> SparsitySettings {
    SparsitySettings {
        mode,
        ..SparsitySettings::default()
    }
}

/// An engine over `path` (under `memory` bytes when given), and what it said while loading.
fn engine(
    path: &Path,
    memory: Option<u64>,
    sparsity: SparsitySettings,
) -> (Result<Engine, Error>, String) {
    let said = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&said);
    let mut builder = Engine::builder()
        .model(path)
        .threads(1)
        .driver(DriverKind::Inline)
        .context(64)
        .sparsity(sparsity)
        .on_progress(move |line| {
            let mut s = sink.lock().unwrap();
            s.push_str(line);
            s.push('\n');
        });
    if let Some(bytes) = memory {
        builder = builder.memory(MemoryBudget::Bytes(bytes));
    }
    let built = builder.build();
    let said = said.lock().unwrap().clone();
    (built, said)
}

/// Profiles `model` with predictors at 30% and records `point` as measured.
fn profile_with_point(model: &Path, point: Option<OperatingPoint>) -> ModelProfile {
    let (mut e, _) = engine(model, None, settings(Some(SparsityMode::Dense)));
    let e = e.as_mut().unwrap();
    let options = ProfileOptions {
        ctx: 64,
        max_tokens: 2048,
        reference_sparsity: 0.3,
        predictors: Some((
            0.3,
            PredictorConfig {
                ranks: vec![32],
                ..PredictorConfig::default()
            },
        )),
        threads: 2,
    };
    let mut p = profile_model(
        e,
        &common::random_words(4242, 3000),
        "test",
        &options,
        &|_, _| {},
    )
    .unwrap();
    p.operating_point = point.map(|point| ChosenPoint {
        point,
        cost: point_cost(&p, &point).unwrap(),
        source: PointSource::Measured {
            text: "test".into(),
            scored_tokens: 100,
            dense_perplexity: 10.0,
            tolerance: 0.03,
            points: Vec::new(),
        },
    });
    p
}

fn store_of(model: &Path, dir: &ScratchDir) -> PathBuf {
    let store = dir.join("m.store.gguf");
    convert(
        model,
        &store,
        &ConvertOptions::neuron_columns(16),
        &mut |_, _| {},
    )
    .unwrap();
    store
}

/// Generous: every bundle fits, beside the runtime's fixed share (the point is the sparsity
/// chosen, not the cache).
fn budget(store: &Path) -> u64 {
    std::fs::metadata(store).unwrap().len() * 2 + (32 << 20)
}

#[test]
fn under_a_budget_the_default_is_the_profiles_point_and_in_memory_dense() {
    let dir = ScratchDir::new("operating-point");
    let model = dir.file("m.gguf", || {
        synthetic_model(&q4km_spec(5)).unwrap().to_bytes().unwrap()
    });
    let point = OperatingPoint::predictor(0.3, Some(0.95));
    let profile = profile_with_point(&model, Some(point));
    profile.save(&ModelProfile::default_path(&model)).unwrap();
    let store = store_of(&model, &dir);

    // Under a budget: the recorded point, with each layer's predictor cut where the profile
    // calibrated recall 0.95 at 30%.
    let (e, said) = engine(&store, Some(budget(&store)), settings(None));
    let e = e.unwrap();
    let sparse = e.model().sparse().expect("sparse under --memory");
    assert_eq!(
        (sparse.mode, sparse.sparsity),
        (SparsityMode::Predictor, 0.3)
    );
    let set = profile.predictors.as_ref().unwrap();
    for (l, layer) in sparse.layers.iter().enumerate() {
        let want = set.point(l, 0.3, 0.95).unwrap().cut;
        assert_eq!(
            layer.predictor.as_ref().unwrap().threshold(),
            want,
            "layer {l}"
        );
        assert_eq!(layer.threshold, profile.threshold(l, 0.3).unwrap());
    }
    assert!(said.contains("operating point"), "{said}");
    // The command line still decides what it names: a target, dense.
    let (e, _) = engine(
        &store,
        Some(budget(&store)),
        SparsitySettings {
            target: Some(0.5),
            ..settings(None)
        },
    );
    assert_eq!(e.unwrap().model().sparse().unwrap().sparsity, 0.5);
    let (e, _) = engine(
        &store,
        Some(budget(&store)),
        settings(Some(SparsityMode::Dense)),
    );
    assert!(e.unwrap().model().sparse().is_none());
    // In memory the default stays dense for SwiGLU models (sparse decode is slower there).
    let (e, _) = engine(&model, None, settings(None));
    assert!(e.unwrap().model().sparse().is_none());

    // A threshold point.
    let profile = profile_with_point(&model, Some(OperatingPoint::threshold(0.2)));
    profile.save(&ModelProfile::default_path(&model)).unwrap();
    let (e, _) = engine(&store, Some(budget(&store)), settings(None));
    let e = e.unwrap();
    let sparse = e.model().sparse().unwrap();
    assert_eq!(
        (sparse.mode, sparse.sparsity),
        (SparsityMode::Threshold, 0.2)
    );

    // A profile that measured nothing within the tolerance, or chose nothing: dense, said.
    for (point, why) in [
        (Some(OperatingPoint::DENSE), "no sparse decode within"),
        (None, "records no operating point"),
    ] {
        let p = profile_with_point(&model, point);
        p.save(&ModelProfile::default_path(&model)).unwrap();
        let (e, said) = engine(&store, Some(budget(&store)), settings(None));
        assert!(e.unwrap().model().sparse().is_none());
        assert!(said.contains(why), "{said}");
    }

    // No profile: dense, and how to get one.
    std::fs::remove_file(ModelProfile::default_path(&model)).unwrap();
    let (e, said) = engine(&store, Some(budget(&store)), settings(None));
    assert!(e.unwrap().model().sparse().is_none());
    assert!(said.contains("conductor profile"), "{said}");
}

#[test]
fn a_profile_of_another_model_is_refused_naming_both() {
    let dir = ScratchDir::new("operating-point-other");
    let a = dir.file("a.gguf", || {
        synthetic_model(&q4km_spec(7)).unwrap().to_bytes().unwrap()
    });
    let b = dir.file("b.gguf", || {
        synthetic_model(&q4km_spec(8)).unwrap().to_bytes().unwrap()
    });
    let profile = profile_with_point(&a, Some(OperatingPoint::threshold(0.3)));
    let path = dir.join("a.profile");
    profile.save(&path).unwrap();
    let (e, _) = engine(
        &b,
        None,
        SparsitySettings {
            profile: Some(path.clone()),
            ..settings(Some(SparsityMode::Threshold))
        },
    );
    let e = e.err().expect("another model's profile").to_string();
    for name in ["a.profile", "a.gguf", "b.gguf"] {
        assert!(e.contains(name), "{name}: {e}");
    }
    assert!(e.contains("another model"), "{e}");
    // Under a budget the default reads the profile beside the store's source: refused the same.
    profile.save(&ModelProfile::default_path(&b)).unwrap();
    let store = {
        let s = dir.join("b.store.gguf");
        convert(&b, &s, &ConvertOptions::neuron_columns(16), &mut |_, _| {}).unwrap();
        s
    };
    let (e, _) = engine(&store, Some(budget(&store)), settings(None));
    let e = e.err().expect("another model's profile").to_string();
    assert!(e.contains("a.gguf") && e.contains("b.store.gguf"), "{e}");
}

/// `conductor profile` on a real model (SmolLM2, few tokens) measures held-out perplexity
/// and records the cheapest point within 3% of dense, which it names in its summary.
#[test]
fn conductor_profile_records_the_point_it_measured() {
    let dir = ScratchDir::new("operating-point-cli");
    let out = dir.join("smol.profile");
    let run = common::conductor()
        .args(["profile", "-t", "2", "--tokens", "512", "--no-predictors"])
        .args(["--held-out-ctx", "64", "--held-out-chunks", "2", "-o"])
        .arg(&out)
        .arg("-m")
        .arg(common::default_model())
        .output()
        .unwrap();
    assert_success(&run);
    let stdout = String::from_utf8_lossy(&run.stdout);
    let model = conductor::runtime::model::Model::open(
        &common::default_model(),
        conductor::runtime::model::WeightSource::Mapped,
    )
    .unwrap();
    let p = ModelProfile::load(&out, &conductor::runtime::plan::ModelIdentity::of(&model)).unwrap();
    let chosen = p.operating_point.as_ref().expect("a chosen point");
    let PointSource::Measured {
        dense_perplexity,
        points,
        tolerance,
        scored_tokens,
        ..
    } = &chosen.source
    else {
        panic!("measured, not published: {chosen:?}")
    };
    assert_eq!(*scored_tokens, 2 * 31);
    assert!(dense_perplexity.is_finite() && *dense_perplexity > 1.0);
    assert!(points.len() >= 2, "{points:?}");
    // The recorded choice is the cheapest measured point within the tolerance (dense if none).
    let limit = dense_perplexity * (1.0 + tolerance);
    let cheapest = points
        .iter()
        .filter(|m| m.perplexity <= limit)
        .min_by(|a, b| a.cost.total_cmp(&b.cost))
        .map_or(OperatingPoint::DENSE, |m| m.point);
    assert_eq!(chosen.point, cheapest);
    assert!(stdout.contains("operating point:"), "{stdout}");
    // Skew and reuse are in the profile and the summary.
    for layer in &p.layers {
        assert!(layer.mass_hot_share > 0.0 && layer.mass_hot_share < 0.8);
        assert_eq!(layer.levels.len(), 9);
        let l30 = &layer.levels[2];
        assert!((l30.active_share - 0.7).abs() < 0.1, "{l30:?}");
        assert!(
            l30.reuse.windows(2).all(|w| w[0] <= w[1]),
            "{:?}",
            l30.reuse
        );
    }
    assert!(stdout.contains("reuse of active neurons"), "{stdout}");
}

/// A ReLU model with random weights has no perplexity: its profile records ProSparse's
/// published predictor point, said to be published.
#[test]
fn random_relu_weights_get_the_published_point() {
    let dir = ScratchDir::new("operating-point-relu");
    let model = dir.file("relu.gguf", || {
        synthetic_model(&SyntheticSpec {
            activation: FfnActivation::Relu,
            relu_active_share: Some(0.15),
            n_ctx: 512,
            ..common::small_spec(11)
        })
        .unwrap()
        .to_bytes()
        .unwrap()
    });
    let out = dir.join("relu.profile");
    let text = dir.file("text.txt", || common::random_words(4242, 3000).into_bytes());
    let run = common::conductor()
        .args(["profile", "-t", "2", "--tokens", "1024", "-c", "128"])
        .args(["--predictor-ranks", "32", "-f"])
        .arg(&text)
        .arg("-o")
        .arg(&out)
        .arg("-m")
        .arg(&model)
        .output()
        .unwrap();
    assert_success(&run);
    let m = conductor::runtime::model::Model::open(
        &model,
        conductor::runtime::model::WeightSource::Mapped,
    )
    .unwrap();
    let p = ModelProfile::load(&out, &conductor::runtime::plan::ModelIdentity::of(&m)).unwrap();
    let chosen = p.operating_point.expect("the published point");
    assert_eq!(
        chosen.point,
        OperatingPoint::predictor(0.0, Some(PROSPARSE_RECALL))
    );
    let PointSource::Published { source } = &chosen.source else {
        panic!("published: {:?}", chosen.source)
    };
    assert!(source.contains("random weights") && source.contains("2402.13516"));
}

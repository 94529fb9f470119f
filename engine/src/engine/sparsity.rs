//! Which FFN neurons decode computes: the settings, the shipped defaults, and how they resolve
//! against a model's activation profile into the executor's [`SparseFfn`].

use super::Error;
use conductor_runtime::model::{FfnActivation, Model};
use conductor_runtime::plan::ModelIdentity;
use conductor_runtime::quant::GgmlType;
use conductor_runtime::sparse::operating::{OperatingPoint, DEFAULT_TOLERANCE};
use conductor_runtime::sparse::powerinfer::read_powerinfer;
use conductor_runtime::sparse::profile::ModelProfile;
use conductor_runtime::sparse::{SparseError, SparseFfn, SparsityMode};
use std::path::{Path, PathBuf};

/// Which FFN neurons decode computes ([`super::EngineBuilder::sparsity`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SparsitySettings {
    /// `None`: the shipped default. In memory: dense for SwiGLU models; for a ReLU model its
    /// natural zeros ([`SparsityMode::Predictor`] when its profile has predictors,
    /// [`DEFAULT_SPARSITY_MODE`] when not), or a PowerInfer file's own predictors. Under a
    /// memory budget: the operating point the model's activation profile records (the
    /// fastest within 3% perplexity of dense, measured by `conductor profile`), dense without
    /// one.
    pub mode: Option<SparsityMode>,
    /// Target share of FFN neurons skipped (default [`DEFAULT_SPARSITY`]).
    pub target: Option<f32>,
    /// Predictor mode: the recall the predictors' cut is calibrated for (one the profile
    /// tabulates); `None`: the cut set when they were trained.
    pub predictor_recall: Option<f32>,
    /// The activation profile (default: `MODEL.profile` beside the model file).
    pub profile: Option<PathBuf>,
    /// Sparse decode for prompt tokens too: every step runs in decode shape (how perplexity
    /// measures what sparse decode computes). Default: prompts are prefilled densely.
    pub all_tokens: bool,
    /// Format of the transposed down projection sparse decode reads (default
    /// [`DEFAULT_SPARSE_DOWN_TYPE`]).
    pub down_type: Option<GgmlType>,
    /// In memory, never transpose the down projections (by default they are, at 50%
    /// sparsity or more, for an axpy over the few active neurons' columns): sparse decode then
    /// reads the block columns a block-column neuron store reads under a budget, the same
    /// numerics. `conductor profile` scores its operating points so for such models.
    pub keep_down_layout: bool,
}

/// Format of the transposed down projection: re-quantized from the model's down projection
/// once at load (see docs/benchmarks.md for what each costs in perplexity).
pub const DEFAULT_SPARSE_DOWN_TYPE: GgmlType = GgmlType::Q8_0;

/// The sparsity mode `--sparsity default` picks for a ReLU model whose profile has no
/// predictors (with predictors it is [`SparsityMode::Predictor`]). SwiGLU models decode densely
/// by default in memory: at the sparsity their quality allows, sparse decode is slower than
/// dense on the machines measured (docs/benchmarks.md).
pub const DEFAULT_SPARSITY_MODE: SparsityMode = SparsityMode::Threshold;
/// The target sparsity of `--sparsity threshold|predictor` on SwiGLU models when none is given:
/// the most that stays within +3% perplexity on SmolLM2 (docs/benchmarks.md). ReLU models
/// default to their natural zeros (target 0: lossless).
pub const DEFAULT_SPARSITY: f32 = 0.3;

/// The activation profile `settings` name, or the one beside the model (for a neuron store
/// without its own: the one beside its source, which shares its identity).
fn profile_path(model: &Model, path: &Path, settings: &SparsitySettings) -> PathBuf {
    settings.profile.clone().unwrap_or_else(|| {
        let own = ModelProfile::default_path(path);
        match model.store() {
            Some(store) if !own.exists() => {
                let source = path.with_file_name(&store.source_name);
                Some(ModelProfile::default_path(&source))
                    .filter(|p| p.exists())
                    .unwrap_or(own)
            }
            _ => own,
        }
    })
}

/// Resolves `settings` for `model` (loaded from `path`; `budgeted` when it runs under a
/// memory budget): the sparse-decode data, or `None` for dense decode.
pub(super) fn resolve_sparsity(
    model: &Model,
    path: &Path,
    settings: &SparsitySettings,
    budgeted: bool,
    say: &mut dyn FnMut(&str),
) -> Result<Option<SparseFfn>, Error> {
    let profile_path = profile_path(model, path, settings);
    let relu = model.config().activation == FfnActivation::Relu;
    let mode = match settings.mode {
        Some(mode) if !mode.is_sparse() => return Ok(None),
        // The router is a mixture of experts' sparsity; neuron-level sparse decode is not
        // built for it.
        Some(_) if model.config().is_moe() => return Err(SparseError::MixtureOfExperts.into()),
        None if model.config().is_moe() => return Ok(None),
        Some(mode) => mode,
        // Under a budget, the profile's measured point (below); in memory, dense (quietly):
        // sparse decode is slower there at the sparsity quality allows.
        None if !relu && !budgeted => return Ok(None),
        None if !relu => return measured_default(model, path, &profile_path, settings, say),
        // ReLU models: their natural zeros, sparse.
        None => DEFAULT_SPARSITY_MODE,
    };
    // A PowerInfer file brings its own predictors and transposed down projection.
    if model.store().is_none() && (mode.predicts() || settings.mode.is_none()) {
        let c = model.config();
        let pi = read_powerinfer(
            model.file(),
            None,
            c.n_embd as usize,
            c.n_ff as usize,
            c.n_layer as usize,
        )
        .map_err(SparseError::from)?;
        if let Some(pi) = pi.filter(|p| p.has_predictors()) {
            let down_type = settings.down_type.unwrap_or(DEFAULT_SPARSE_DOWN_TYPE);
            // By default the file's predictors decide.
            let mode = if mode.predicts() {
                mode
            } else {
                SparsityMode::Predictor
            };
            let sparse = SparseFfn::from_powerinfer(model, pi, mode, down_type)?;
            say(&format!(
                "sparsity: {} (the PowerInfer file's own predictors), +{:.1} MiB",
                mode.name(),
                sparse.bytes() as f64 / (1 << 20) as f64
            ));
            return Ok(Some(sparse));
        }
    }
    if settings.mode.is_none() && !profile_path.exists() {
        return Ok(None);
    }
    if !profile_path.exists() {
        return Err(Error::NoProfile {
            mode: mode.name(),
            path: profile_path,
        });
    }
    let profile = ModelProfile::load_for(&profile_path, &ModelIdentity::of(model), Some(path))
        .map_err(SparseError::from)?;
    // A ReLU model's default: under a budget the profile's operating point where it has one,
    // else its natural zeros through the predictors (or the threshold without them).
    let chosen = profile.operating_point.as_ref().map(|c| c.point);
    let point = match (settings.mode, chosen) {
        (None, Some(p)) if budgeted && p.mode.is_sparse() => OperatingPoint {
            sparsity: settings.target.unwrap_or(p.sparsity),
            predictor_recall: settings.predictor_recall.or(p.predictor_recall),
            ..p
        },
        (None, _) => OperatingPoint {
            mode: if profile.predictors.is_some() {
                SparsityMode::Predictor
            } else {
                DEFAULT_SPARSITY_MODE
            },
            sparsity: settings.target.unwrap_or(0.0),
            predictor_recall: settings.predictor_recall,
        },
        (Some(mode), _) => OperatingPoint {
            mode,
            sparsity: settings
                .target
                .unwrap_or(if relu { 0.0 } else { DEFAULT_SPARSITY }),
            predictor_recall: settings.predictor_recall,
        },
    };
    build(model, &profile, &profile_path, &point, settings, say).map(Some)
}

/// The default of a SwiGLU model under a memory budget: the operating point its activation
/// profile records; dense, said, without a profile or a measured point.
fn measured_default(
    model: &Model,
    path: &Path,
    profile_path: &Path,
    settings: &SparsitySettings,
    say: &mut dyn FnMut(&str),
) -> Result<Option<SparseFfn>, Error> {
    if !profile_path.exists() {
        say(&format!(
            "sparsity: dense (no activation profile at {}; `conductor profile -m MODEL` measures the fastest sparse decode within {:.0}% perplexity of dense, which --memory then uses)",
            profile_path.display(),
            DEFAULT_TOLERANCE * 100.0
        ));
        return Ok(None);
    }
    let profile = ModelProfile::load_for(profile_path, &ModelIdentity::of(model), Some(path))
        .map_err(SparseError::from)?;
    let Some(chosen) = &profile.operating_point else {
        say(&format!(
            "sparsity: dense (the activation profile {} records no operating point: make it again with `conductor profile` without --no-choose)",
            profile_path.display()
        ));
        return Ok(None);
    };
    if !chosen.point.mode.is_sparse() {
        say(&format!(
            "sparsity: dense (the activation profile measured no sparse decode within {:.0}% perplexity of dense)",
            DEFAULT_TOLERANCE * 100.0
        ));
        return Ok(None);
    }
    say(&format!(
        "sparsity: the profile's operating point: {}",
        chosen.describe()
    ));
    let point = OperatingPoint {
        sparsity: settings.target.unwrap_or(chosen.point.sparsity),
        predictor_recall: settings.predictor_recall.or(chosen.point.predictor_recall),
        ..chosen.point
    };
    build(model, &profile, profile_path, &point, settings, say).map(Some)
}

/// The sparse decode of `model` at `point`, said.
fn build(
    model: &Model,
    profile: &ModelProfile,
    profile_path: &Path,
    point: &OperatingPoint,
    settings: &SparsitySettings,
    say: &mut dyn FnMut(&str),
) -> Result<SparseFfn, Error> {
    if let (true, Some(p), None) = (
        point.mode.predicts(),
        &profile.predictors,
        point.predictor_recall,
    ) {
        if point.sparsity + 1e-6 < p.sparsity {
            say(&format!(
                "sparsity: the predictors were trained for {:.0}% sparsity; at {:.0}% they miss more of the neurons the threshold keeps",
                p.sparsity * 100.0,
                point.sparsity * 100.0
            ));
        }
    }
    let down_type = settings.down_type.unwrap_or(DEFAULT_SPARSE_DOWN_TYPE);
    let sparse = SparseFfn::build_at(model, profile, point, down_type, !settings.keep_down_layout)?;
    say(&format!(
        "sparsity: {} ({}, +{:.1} MiB for transposed down projections and predictors)",
        point.describe(),
        profile_path.display(),
        sparse.bytes() as f64 / (1 << 20) as f64
    ));
    Ok(sparse)
}

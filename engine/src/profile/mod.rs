//! The model profiler behind `conductor profile`: runs a model over calibration text, folds
//! every layer's FFN activations into streaming statistics chunk by chunk, and turns them into
//! a [`ModelProfile`] (thresholds, neuron frequencies, predictors trained on the first tokens).

pub mod choose;
mod ffn;

pub use ffn::FfnWeights;

use crate::{Engine, Error};
use conductor_planner::predictor::{operating_points, train_layer, PredictorConfig, TrainingSet};
use conductor_runtime::model::ops::activate;
use conductor_runtime::model::Model;
use conductor_runtime::plan::ModelIdentity;
use conductor_runtime::quant::{Kernels, Layout};
use conductor_runtime::sparse::layer_stats::{LayerStats, LEVELS};
use conductor_runtime::sparse::profile::{
    interpolate, sparsity_grid, LayerProfile, ModelProfile, PredictorPoint, PredictorSet,
    PREDICTOR_RECALLS, PROFILE_VERSION,
};
use half::f16;
use std::sync::{Arc, Mutex};

/// What to profile and how.
#[derive(Clone, Debug)]
pub struct ProfileOptions {
    /// Tokens per evaluated chunk (each from an empty context, as `perplexity` does).
    pub ctx: usize,
    /// Profile at most this many tokens of the text.
    pub max_tokens: usize,
    /// The sparsity neuron frequencies are counted at.
    pub reference_sparsity: f32,
    /// Train predictors of the active sets at this sparsity (`None`: no predictors).
    pub predictors: Option<(f32, PredictorConfig)>,
    /// Threads for statistics and training (layers are independent).
    pub threads: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileRunError {
    #[error(transparent)]
    Engine(#[from] Error),
    #[error("the calibration text is empty")]
    EmptyText,
    #[error("the calibration text is {tokens} tokens, shorter than one context of {ctx}: give a longer text or a smaller -c")]
    ShortText { tokens: usize, ctx: usize },
    #[error("the predictor of layer {layer}: {why}")]
    Predictor { layer: usize, why: String },
    #[error("activation profiles of mixture-of-experts models are not supported yet (their sparsity is the router's choice of experts)")]
    MixtureOfExperts,
}

/// Stages reported to the progress callback, each with its share done (0..=1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Recording,
    Layers,
}

/// Bytes of FFN inputs kept (over all layers, as f16: the predictors quantize their input to
/// 8 bits anyway) as the predictors' training samples: the first tokens of the calibration
/// text, as many as fit (at least [`MIN_SAMPLES`]).
const SAMPLE_BYTES: usize = 64 << 20;
const MIN_SAMPLES: usize = 512;

/// Profiles `engine`'s model over `text` (described as `text_name` in the profile). The
/// engine must run the inline driver (it records through a probe).
///
/// Statistics stream: after each chunk of `ctx` tokens, every layer's gate and up projections
/// of that chunk are computed ([`FfnWeights`], the same in every layout) and folded into the
/// layer's [`LayerStats`]; nothing grows with the text but the predictors' samples, the first
/// tokens' FFN inputs up to [`SAMPLE_BYTES`].
pub fn profile_model(
    engine: &mut Engine,
    text: &str,
    text_name: &str,
    options: &ProfileOptions,
    progress: &(dyn Fn(Stage, f32) + Sync),
) -> Result<ModelProfile, ProfileRunError> {
    if engine.model().config().is_moe() {
        return Err(ProfileRunError::MixtureOfExperts);
    }
    let tokens = engine.tokenizer().encode(text, true, false);
    if tokens.is_empty() {
        return Err(ProfileRunError::EmptyText);
    }
    let ctx = options.ctx.max(2);
    if tokens.len() < ctx {
        return Err(ProfileRunError::ShortText {
            tokens: tokens.len(),
            ctx,
        });
    }
    let n_chunks = (tokens.len() / ctx)
        .min(options.max_tokens.div_ceil(ctx))
        .max(1);
    let n_layer = engine.model().config().n_layer as usize;
    let embd = engine.model().config().n_embd as usize;
    let n_tokens = n_chunks * ctx;
    let samples = if options.predictors.is_some() {
        (SAMPLE_BYTES / (2 * embd * n_layer).max(1))
            .max(MIN_SAMPLES)
            .min(n_tokens)
    } else {
        0
    };
    // Every layer's FFN input (after its norm) of the chunk being evaluated.
    let inputs: Arc<Mutex<Vec<Vec<f32>>>> = Arc::new(Mutex::new(vec![Vec::new(); n_layer]));
    let recorder = || -> conductor_runtime::exec::Probe {
        let sink = Arc::clone(&inputs);
        Box::new(move |name: &str, rows: &[f32], _width| {
            if let Some(l) = name.strip_prefix("ffn_norm-") {
                if let Ok(l) = l.parse::<usize>() {
                    let mut inputs = sink.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(v) = inputs.get_mut(l) {
                        v.extend_from_slice(rows);
                    }
                }
            }
        })
    };
    let add_bos = engine.tokenizer().add_bos();
    let bos = engine.tokenizer().bos();
    let grid = sparsity_grid();
    let kernels = Kernels::best();
    let mut session = engine.session(Some(ctx))?;
    let path = engine.model_path().to_path_buf();
    let mapped =
        FfnWeights::map_if_on_storage(engine.model(), &path).map_err(|source| Error::Load {
            path: path.clone(),
            source,
        })?;
    let mut stats: Vec<Mutex<Option<LayerStats>>> =
        (0..n_layer).map(|_| Mutex::default()).collect();
    let mut sampled: Vec<Vec<f16>> = vec![Vec::new(); n_layer];
    for i in 0..n_chunks {
        let mut chunk = tokens[i * ctx..(i + 1) * ctx].to_vec();
        if let (true, Some(b)) = (add_bos, bos) {
            chunk[0] = b;
        }
        session.clear();
        engine.eval_probed(&mut session, &chunk, ctx - 1, &mut |_, _| {}, recorder())?;
        let chunk_inputs = std::mem::replace(
            &mut *inputs.lock().unwrap_or_else(|e| e.into_inner()),
            vec![Vec::new(); n_layer],
        );
        debug_assert!(chunk_inputs.iter().all(|v| v.len() == ctx * embd));
        for (s, x) in sampled.iter_mut().zip(&chunk_inputs) {
            let room = (samples * embd).saturating_sub(s.len()).min(x.len());
            s.extend(x[..room].iter().map(|&v| f16::from_f32(v)));
        }
        let weights = FfnWeights::new(mapped.as_ref().unwrap_or(engine.model()));
        for_each_layer(options.threads, n_layer, |l| {
            let mut slot = stats[l].lock().unwrap_or_else(|e| e.into_inner());
            let layer = slot.get_or_insert_with(|| {
                LayerStats::new(weights.down_norms(l), options.reference_sparsity)
            });
            let (acts, ups) = gate_and_up(engine.model(), &weights, &kernels, l, &chunk_inputs[l]);
            layer.add(&acts, &ups);
        });
        progress(Stage::Recording, (i + 1) as f32 / n_chunks as f32);
    }
    let layers: Vec<LayerProfile> = stats
        .iter_mut()
        .map(|s| {
            s.get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .expect("every layer saw every chunk")
                .finish(&grid)
        })
        .collect();
    drop(stats);
    // The chunks' buffers are gone: give their pages back before training.
    crate::engine::release_freed_memory();
    let model = engine.model();
    let predictor_set = match &options.predictors {
        None => None,
        Some((sparsity, cfg)) => {
            let weights = FfnWeights::new(mapped.as_ref().unwrap_or(model));
            let done = Mutex::new(0usize);
            let trained: Vec<Mutex<Option<Result<Trained, String>>>> =
                (0..n_layer).map(|_| Mutex::default()).collect();
            let sampled: Vec<Mutex<Vec<f16>>> = sampled.into_iter().map(Mutex::new).collect();
            for_each_layer(options.threads, n_layer, |l| {
                let x: Vec<f32> =
                    std::mem::take(&mut *sampled[l].lock().unwrap_or_else(|e| e.into_inner()))
                        .into_iter()
                        .map(f16::to_f32)
                        .collect();
                let r = train_predictor(
                    model, &weights, &kernels, l, &x, &layers[l], &grid, *sparsity, cfg,
                );
                *trained[l].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                let mut done = done.lock().unwrap_or_else(|e| e.into_inner());
                *done += 1;
                progress(Stage::Layers, *done as f32 / n_layer as f32);
            });
            let mut predictors = Vec::with_capacity(n_layer);
            let mut held_out = Vec::with_capacity(n_layer);
            let mut points = Vec::with_capacity(n_layer);
            for (l, r) in trained.into_iter().enumerate() {
                let r = r
                    .into_inner()
                    .unwrap_or_else(|e| e.into_inner())
                    .expect("every layer trained");
                let t = r.map_err(|why| ProfileRunError::Predictor { layer: l, why })?;
                predictors.push(t.predictor);
                held_out.push(t.figures);
                points.push(t.points);
            }
            Some(PredictorSet {
                sparsity: *sparsity,
                layers: predictors,
                held_out,
                points,
            })
        }
    };
    if predictor_set.is_none() {
        progress(Stage::Layers, 1.0);
    }
    Ok(ModelProfile {
        version: PROFILE_VERSION,
        model: ModelIdentity::of(model),
        source: describe_source(model, &path),
        calibration: text_name.to_string(),
        tokens: n_tokens as u64,
        grid,
        reference_sparsity: options.reference_sparsity,
        layers,
        predictors: predictor_set,
        operating_point: None,
    })
}

/// The model's file name and the layout its FFN weights are in.
fn describe_source(model: &Model, path: &std::path::Path) -> String {
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let layout = match (&model.store(), model.resident_only()) {
        (Some(_), true) => "a neuron store on storage, under a memory budget",
        (Some(_), false) => "a neuron store in memory",
        (None, _)
            if model
                .layers()
                .first()
                .is_some_and(|l| matches!(l.gate.layout, Layout::X8 { .. })) =>
        {
            "rows interleaved 8 by 8"
        }
        (None, _) => "the file's rows",
    };
    format!("{name}, {layout}")
}

/// Runs `f(l)` for every layer `l` on up to `threads` threads (layers are independent).
fn for_each_layer(threads: usize, n_layer: usize, f: impl Fn(usize) + Sync) {
    let next = Mutex::new(0usize);
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, n_layer.max(1)) {
            scope.spawn(|| loop {
                let l = {
                    let mut next = next.lock().unwrap_or_else(|e| e.into_inner());
                    let l = *next;
                    *next += 1;
                    l
                };
                if l >= n_layer {
                    break;
                }
                f(l);
            });
        }
    });
}

/// Layer `l`'s act(gate) and up projections of the FFN inputs `x` (`[token][n_embd]`).
fn gate_and_up(
    model: &Model,
    weights: &FfnWeights<'_>,
    kernels: &Kernels,
    l: usize,
    x: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let mut acts = weights.project(kernels, l, false, x);
    let activation = model.config().activation;
    for g in acts.iter_mut() {
        *g = activate(activation, *g);
    }
    (acts, weights.project(kernels, l, true, x))
}

/// One layer's trained predictor and what the held-out samples say of it.
struct Trained {
    predictor: conductor_runtime::sparse::predictor::Predictor,
    /// At its trained cut: (recall, precision, predicted share).
    figures: (f32, f32, f32),
    /// At each sparsity of [`LEVELS`] and recall of [`PREDICTOR_RECALLS`].
    points: Vec<PredictorPoint>,
}

/// Layer `l`'s predictor of the neurons active at `sparsity`, trained on the sampled FFN
/// inputs `x` (their active sets from the gate and the layer's final thresholds), and its
/// operating points at the sparsities of [`LEVELS`].
#[allow(clippy::too_many_arguments)]
fn train_predictor(
    model: &Model,
    weights: &FfnWeights<'_>,
    kernels: &Kernels,
    l: usize,
    x: &[f32],
    stats: &LayerProfile,
    grid: &[f32],
    sparsity: f32,
    cfg: &PredictorConfig,
) -> Result<Trained, String> {
    let c = model.config();
    let (embd, ff) = (c.n_embd as usize, c.n_ff as usize);
    let n = x.len() / embd;
    let threshold = interpolate(grid, &stats.thresholds, sparsity);
    // The runtime's thresholds at the levels (on the grid), ascending.
    let level_thresholds: Vec<f32> = LEVELS
        .iter()
        .map(|&s| interpolate(grid, &stats.thresholds, s))
        .collect();
    let mut acts = weights.project(kernels, l, false, x);
    let words = ff.div_ceil(64);
    let mut active = vec![0u64; n * words];
    // Per (token, neuron): at how many levels it is active.
    let mut fired = vec![0u8; n * ff];
    for ((row, bits), lv) in acts
        .chunks_exact_mut(ff)
        .zip(active.chunks_exact_mut(words))
        .zip(fired.chunks_exact_mut(ff))
    {
        for (j, a) in row.iter().enumerate() {
            let score = activate(c.activation, *a).abs() * stats.importance[j];
            if score > threshold {
                bits[j / 64] |= 1 << (j % 64);
            }
            lv[j] = level_thresholds.iter().take_while(|&&t| score > t).count() as u8;
        }
    }
    drop(acts);
    let set = TrainingSet::new(x, &active, embd, ff).map_err(|e| e.to_string())?;
    let trained = train_layer(&set, cfg, &mut |_| {}).map_err(|e| e.to_string())?;
    drop(active);
    let figures = (
        trained.chosen.recall,
        trained.chosen.precision,
        trained.chosen.predicted_fraction,
    );
    let calibration_start = trained.train_tokens;
    let held_start = calibration_start + trained.calibration_tokens;
    let points = operating_points(
        &trained.predictor,
        x,
        calibration_start..held_start,
        held_start..held_start + trained.held_out_tokens,
        &LEVELS,
        &PREDICTOR_RECALLS,
        |t, j| usize::from(fired[t * ff + j]),
    );
    Ok(Trained {
        predictor: trained.predictor,
        figures,
        points,
    })
}

//! The model profiler behind `conductor profile`: runs a model over calibration text, records
//! every layer's FFN input, and turns it into a [`ModelProfile`] (thresholds, neuron
//! frequencies, predictors).

use crate::{Engine, Error};
use conductor_planner::predictor::{train_layer, PredictorConfig, TrainingSet};
use conductor_runtime::model::ops::activate;
use conductor_runtime::model::Model;
use conductor_runtime::plan::ModelIdentity;
use conductor_runtime::quant::{activation_type, dequantize_row, Kernels};
use conductor_runtime::sparse::profile::{
    importance, interpolate, layer_profile, sparsity_grid, LayerProfile, ModelProfile,
    PredictorSet, PROFILE_VERSION,
};
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

/// Profiles `engine`'s model over `text` (described as `text_name` in the profile). The
/// engine must run the inline driver (it records through a probe).
pub fn profile_model(
    engine: &mut Engine,
    text: &str,
    text_name: &str,
    options: &ProfileOptions,
    progress: &(dyn Fn(Stage, f32) + Sync),
) -> Result<ModelProfile, ProfileRunError> {
    if engine.model().config.is_moe() {
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
    let n_layer = engine.model().config.n_layer as usize;
    let embd = engine.model().config.n_embd as usize;
    // Every layer's FFN input (after its norm), token after token.
    let inputs: Arc<Mutex<Vec<Vec<f32>>>> = Arc::new(Mutex::new(vec![Vec::new(); n_layer]));
    let sink = Arc::clone(&inputs);
    engine.set_probe(Some(Box::new(move |name: &str, rows: &[f32], _width| {
        if let Some(l) = name.strip_prefix("ffn_norm-") {
            if let Ok(l) = l.parse::<usize>() {
                let mut inputs = sink.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(v) = inputs.get_mut(l) {
                    v.extend_from_slice(rows);
                }
            }
        }
    })))?;
    let add_bos = engine.tokenizer().add_bos();
    let bos = engine.tokenizer().bos();
    let mut session = engine.session(Some(ctx))?;
    for i in 0..n_chunks {
        let mut chunk = tokens[i * ctx..(i + 1) * ctx].to_vec();
        if let (true, Some(b)) = (add_bos, bos) {
            chunk[0] = b;
        }
        session.clear();
        engine.eval(&mut session, &chunk, ctx - 1, &mut |_, _| {})?;
        progress(Stage::Recording, (i + 1) as f32 / n_chunks as f32);
    }
    engine.set_probe(None)?;
    let inputs = std::mem::take(&mut *inputs.lock().unwrap_or_else(|e| e.into_inner()));
    let n_tokens = n_chunks * ctx;
    debug_assert!(inputs.iter().all(|v| v.len() == n_tokens * embd));

    let grid = sparsity_grid();
    let model = engine.model();
    let kernels = Kernels::best();
    let done = Mutex::new(0usize);
    let next = Mutex::new(0usize);
    let results: Vec<Mutex<Option<LayerResult>>> = (0..n_layer).map(|_| Mutex::default()).collect();
    std::thread::scope(|scope| {
        for _ in 0..options.threads.clamp(1, n_layer) {
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
                let r = profile_layer(model, &kernels, l, &inputs[l], &grid, options);
                *results[l].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                let mut done = done.lock().unwrap_or_else(|e| e.into_inner());
                *done += 1;
                progress(Stage::Layers, *done as f32 / n_layer as f32);
            });
        }
    });
    let mut layers = Vec::with_capacity(n_layer);
    let mut predictors = Vec::new();
    let mut held_out = Vec::new();
    for (l, r) in results.into_iter().enumerate() {
        let r = r
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .expect("every layer profiled");
        layers.push(r.stats);
        match r.predictor {
            Some(Ok((p, figures))) => {
                predictors.push(p);
                held_out.push(figures);
            }
            Some(Err(why)) => return Err(ProfileRunError::Predictor { layer: l, why }),
            None => {}
        }
    }
    Ok(ModelProfile {
        version: PROFILE_VERSION,
        model: ModelIdentity::of(model),
        calibration: text_name.to_string(),
        tokens: n_tokens as u64,
        grid,
        reference_sparsity: options.reference_sparsity,
        layers,
        predictors: options.predictors.as_ref().map(|(s, _)| PredictorSet {
            sparsity: *s,
            layers: predictors,
            held_out,
        }),
    })
}

type Figures = (f32, f32, f32);

struct LayerResult {
    stats: LayerProfile,
    predictor: Option<Result<(conductor_runtime::sparse::predictor::Predictor, Figures), String>>,
}

/// One layer: gate and up projections of the recorded inputs with decode's kernels, the
/// statistics, and the predictor.
fn profile_layer(
    model: &Model,
    kernels: &Kernels,
    l: usize,
    x: &[f32],
    grid: &[f32],
    options: &ProfileOptions,
) -> LayerResult {
    let c = &model.config;
    let (embd, ff) = (c.n_embd as usize, c.n_ff as usize);
    let n = x.len() / embd;
    let w = &model.layers[l];
    let project = |t: &conductor_runtime::model::TensorRef| {
        let at = activation_type(t.ty);
        let row = at.bytes_for(embd as u64).expect("whole blocks") as usize;
        let mut acts = vec![0u8; n * row];
        for (src, dst) in x.chunks_exact(embd).zip(acts.chunks_exact_mut(row)) {
            kernels.quantize_activations(t.ty, src, dst);
        }
        let mut out = vec![0f32; n * ff];
        kernels.matmul(model.mat(t), &acts, n, &mut out, ff);
        out
    };
    let mut acts = project(&w.gate);
    let ups = project(&w.up);
    for g in acts.iter_mut() {
        *g = activate(c.activation, *g);
    }
    let stats = layer_profile(
        &acts,
        &ups,
        importance(&ups, &column_norms(model, l)),
        grid,
        options.reference_sparsity,
    );
    drop(ups);
    let predictor = options.predictors.as_ref().map(|(sparsity, cfg)| {
        let threshold = interpolate(grid, &stats.thresholds, *sparsity);
        let words = ff.div_ceil(64);
        let mut active = vec![0u64; n * words];
        for (row, bits) in acts.chunks_exact(ff).zip(active.chunks_exact_mut(words)) {
            for (j, a) in row.iter().enumerate() {
                if a.abs() * stats.importance[j] > threshold {
                    bits[j / 64] |= 1 << (j % 64);
                }
            }
        }
        drop(acts);
        let set = TrainingSet::new(x, &active, embd, ff).map_err(|e| e.to_string())?;
        let trained = train_layer(&set, cfg, &mut |_| {}).map_err(|e| e.to_string())?;
        let figures = (
            trained.chosen.recall,
            trained.chosen.precision,
            trained.chosen.predicted_fraction,
        );
        Ok((trained.predictor, figures))
    });
    LayerResult { stats, predictor }
}

/// The Euclidean norm of every column of layer `l`'s down projection (one per neuron).
fn column_norms(model: &Model, l: usize) -> Vec<f32> {
    let down = &model.layers[l].down;
    let mat = model.mat(down);
    let mut sq = vec![0f64; down.cols];
    let mut row = vec![0f32; down.cols];
    let stride = down.row_bytes();
    for r in 0..down.rows {
        dequantize_row(down.ty, &mat.data[r * stride..(r + 1) * stride], &mut row)
            .expect("a model's down projection dequantizes");
        for (s, v) in sq.iter_mut().zip(&row) {
            *s += (*v as f64) * (*v as f64);
        }
    }
    sq.iter().map(|s| s.sqrt() as f32).collect()
}

//! Sparse FFN decode: which neurons a token needs, and the data that decides it.
//!
//! - [`profile`]: activation statistics of a model over calibration text (`conductor profile`):
//!   per-layer thresholds for target sparsities (CATS), neuron frequencies, hot ranking.
//! - [`predictor`]: per-layer low-rank predictors `fc2 · ReLU(fc1 · x)` of the active set.
//! - [`SparseFfn`]: what the executor holds to skip neurons in decode.

pub mod powerinfer;
pub mod predictor;
pub mod profile;

use crate::model::{FfnActivation, Model};
use crate::quant::{transpose_requantize, GgmlType, MatRef, QuantError};
use predictor::Predictor;
use profile::{ModelIdentity, ModelProfile, ProfileError};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

/// How decode chooses the FFN neurons it computes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SparsityMode {
    /// Every neuron (llama.cpp's arithmetic).
    #[default]
    Dense,
    /// Every gate row; up rows and down columns only where |act(gate)| passes the layer's
    /// threshold (CATS).
    Threshold,
    /// Gate rows only of the neurons the layer's predictor names, then the threshold.
    Predictor,
}

impl SparsityMode {
    pub fn name(self) -> &'static str {
        match self {
            SparsityMode::Dense => "dense",
            SparsityMode::Threshold => "threshold",
            SparsityMode::Predictor => "predictor",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SparseError {
    #[error(transparent)]
    Profile(#[from] ProfileError),
    #[error("the activation profile has no predictors (run `conductor profile` without --no-predictors)")]
    NoPredictors,
    #[error("a PowerInfer file's sparse decode needs the file itself, not a neuron store converted from it (use --sparsity threshold with an activation profile)")]
    Store,
    #[error(transparent)]
    PowerInfer(#[from] powerinfer::PowerInferError),
    #[error("cannot transpose the down projection of layer {layer}: {source}")]
    Transpose { layer: usize, source: QuantError },
    #[error("sparse decode (threshold, predictor) is not supported for mixture-of-experts models yet: the router already skips the experts it does not choose (use --sparsity dense)")]
    MixtureOfExperts,
}

/// One layer's sparse-decode data.
pub struct SparseLayer {
    /// Neuron `j` is active when |act(gate_j)| · `importance[j]` is above `threshold`.
    pub threshold: f32,
    pub importance: Vec<f32>,
    pub predictor: Option<Predictor>,
    /// The down projection transposed: row `j` is neuron `j`'s down column (`n_embd` values).
    /// Built only where few neurons fire per token (an axpy per active neuron is then cheaper
    /// than the dense down projection of the cluster).
    pub down_t: Option<Vec<u8>>,
}

/// Counters of sparse decode over (token, layer, neuron) triples: how many were considered,
/// how many gate rows were computed and how many neurons were active. Relaxed atomics:
/// statistics only.
#[derive(Default)]
pub struct SparseStats {
    pub neurons: AtomicU64,
    pub gate_rows: AtomicU64,
    pub active: AtomicU64,
}

impl SparseStats {
    /// (share of neurons whose gate was computed, share active) since the last call.
    pub fn take(&self) -> Option<(f64, f64)> {
        let total = self.neurons.swap(0, Ordering::Relaxed);
        let gate = self.gate_rows.swap(0, Ordering::Relaxed);
        let active = self.active.swap(0, Ordering::Relaxed);
        (total > 0).then(|| (gate as f64 / total as f64, active as f64 / total as f64))
    }
}

/// What the executor holds for sparse decode ([`Model::sparse`]).
pub struct SparseFfn {
    pub mode: SparsityMode,
    /// The target sparsity the thresholds were chosen for.
    pub sparsity: f32,
    pub layers: Vec<SparseLayer>,
    /// Format of `down_t` rows.
    pub down_type: GgmlType,
    pub activation: FfnActivation,
    /// Predictors see the FFN input before its RMS norm (PowerInfer's), not after (ours).
    pub predictor_sees_residual: bool,
    pub stats: SparseStats,
}

impl SparseFfn {
    /// Sparse decode of `model` in `mode` (not dense) at a target `sparsity`, from its
    /// `profile`. Transposes every layer's down projection once (`down_type` rows).
    pub fn build(
        model: &Model,
        profile: &ModelProfile,
        mode: SparsityMode,
        sparsity: f32,
        down_type: GgmlType,
    ) -> Result<SparseFfn, SparseError> {
        if model.config.is_moe() {
            return Err(SparseError::MixtureOfExperts);
        }
        profile.model.check(&ModelIdentity::of(model))?;
        let predictors = match mode {
            SparsityMode::Predictor => Some(
                profile
                    .predictors
                    .as_ref()
                    .ok_or(SparseError::NoPredictors)?,
            ),
            _ => None,
        };
        let mut layers = Vec::with_capacity(model.layers.len());
        for (l, w) in model.layers.iter().enumerate() {
            // The share of neurons expected to fire: below half, axpy over a transposed down
            // projection pays for its memory.
            // A store's bundles bring their own down columns (or block-columns).
            let zeros = profile.layers[l].zero_fraction;
            let down_t = if model.store.is_none() && sparsity.max(zeros) >= 0.5 {
                let down: MatRef<'_> = model.mat(&w.down);
                Some(
                    transpose_requantize(down, down_type)
                        .map_err(|source| SparseError::Transpose { layer: l, source })?,
                )
            } else {
                None
            };
            layers.push(SparseLayer {
                threshold: profile.threshold(l, sparsity)?,
                importance: profile.layers[l].importance.clone(),
                predictor: predictors.map(|p| p.layers[l].clone()),
                down_t,
            });
        }
        Ok(SparseFfn {
            mode,
            sparsity,
            layers,
            down_type,
            activation: model.config.activation,
            predictor_sees_residual: false,
            stats: SparseStats::default(),
        })
    }

    /// Sparse decode with a PowerInfer model's own predictors: a neuron runs when its
    /// predictor logit reaches the file's threshold, and then only its ReLU decides (activation
    /// threshold 0). The file's transposed down projection is used as stored when every layer
    /// has one of a type the kernels read; otherwise the model's is transposed into
    /// `fallback_down_type`.
    pub fn from_powerinfer(
        model: &Model,
        pi: powerinfer::PowerInferSparse,
        fallback_down_type: GgmlType,
    ) -> Result<SparseFfn, SparseError> {
        if model.config.is_moe() {
            return Err(SparseError::MixtureOfExperts);
        }
        if model.store.is_some() {
            return Err(SparseError::Store);
        }
        let n_ff = model.config.n_ff as usize;
        let stored = pi.down_type();
        let down_type = stored.unwrap_or(fallback_down_type);
        let mut layers = Vec::with_capacity(pi.layers.len());
        for (l, layer) in pi.layers.into_iter().enumerate() {
            let down_t = match (stored, layer.down_t) {
                (Some(_), Some((_, bytes))) => bytes,
                _ => transpose_requantize(model.mat(&model.layers[l].down), down_type)
                    .map_err(|source| SparseError::Transpose { layer: l, source })?,
            };
            layers.push(SparseLayer {
                threshold: 0.0,
                importance: vec![1.0; n_ff],
                predictor: layer.predictor,
                down_t: Some(down_t),
            });
        }
        Ok(SparseFfn {
            mode: SparsityMode::Predictor,
            sparsity: 0.0,
            layers,
            down_type,
            activation: model.config.activation,
            predictor_sees_residual: true,
            stats: SparseStats::default(),
        })
    }

    /// Bytes this adds to the model in memory (transposed down projections, predictors,
    /// per-neuron importances).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| {
                l.down_t.as_ref().map_or(0, Vec::len)
                    + l.predictor.as_ref().map_or(0, |p| p.bytes())
                    + l.importance.len() * 4
            })
            .sum()
    }

    /// `act(g)` as the dense path computes it (before the product with up).
    #[inline]
    pub fn activate(&self, g: f32) -> f32 {
        match self.activation {
            FfnActivation::Silu => g / (1.0 + (-g).exp()),
            FfnActivation::Relu => g.max(0.0),
        }
    }
}

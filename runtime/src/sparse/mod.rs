//! Sparse FFN decode: which neurons a token needs, and the data that decides it.
//!
//! - [`profile`]: activation statistics of a model over calibration text (`conductor profile`):
//!   per-layer thresholds for target sparsities (CATS), neuron frequencies, hot ranking.
//! - [`predictor`]: per-layer low-rank predictors `fc2 · ReLU(fc1 · x)` of the active set.
//! - [`operating`]: operating points (mode, sparsity, predictor recall), their cost, and the
//!   choice of the cheapest within a perplexity tolerance of dense.
//! - [`SparseFfn`]: what the executor holds to skip neurons in decode.

pub mod layer_stats;
pub mod operating;
pub mod powerinfer;
pub mod predictor;
pub mod profile;

use crate::plan::FfnActivation;
/// Defined in `plan` (a plan may set it); re-exported for the executor.
pub use crate::plan::SparsityMode;
use crate::quant::{GgmlType, QuantError};
use predictor::Predictor;
use profile::ProfileError;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// The threshold of a mode without one ([`crate::plan::SparsityMode::gate_threshold`]): every
/// neuron a step computes passes it.
pub const NO_THRESHOLD: f32 = f32::NEG_INFINITY;

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

/// What the executor holds for sparse decode (`Model::sparse`).
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
        self.activation.apply(g)
    }
}

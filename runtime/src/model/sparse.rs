//! Building a model's sparse decode ([`SparseFfn`]) from an activation profile or a
//! PowerInfer file: the constructors that need the weights (the down projections to
//! transpose). The data itself is defined in `crate::sparse`.

use super::Model;
use crate::plan::{ModelIdentity, SparsityMode};
use crate::quant::{transpose_requantize, GgmlType, MatRef};
use crate::sparse::operating::OperatingPoint;
use crate::sparse::powerinfer::PowerInferSparse;
use crate::sparse::profile::ModelProfile;
use crate::sparse::{SparseError, SparseFfn, SparseLayer, SparseStats, NO_THRESHOLD};

impl SparseFfn {
    /// Sparse decode of `model` at an operating `point` (not dense), from its `profile`. In
    /// memory at 50% sparsity or more, each layer's down projection is transposed once
    /// (`down_type` rows). With a predictor recall, each layer's predictor cuts its logits
    /// where the profile calibrated that recall at the sparsity nearest the point's.
    /// `transpose_down: false` keeps no transposed copy whatever the
    /// sparsity: the active neurons' down columns are then always read from the model's
    /// block columns, as on a block-column neuron store (the numerics `--memory` runs).
    pub fn build_at(
        model: &Model,
        profile: &ModelProfile,
        point: &OperatingPoint,
        down_type: GgmlType,
        transpose_down: bool,
    ) -> Result<SparseFfn, SparseError> {
        let (mode, sparsity) = (point.mode, point.sparsity);
        if model.config().is_moe() {
            return Err(SparseError::MixtureOfExperts);
        }
        profile.model.check(&ModelIdentity::of(model))?;
        let predictors = match mode.predicts() {
            true => Some(
                profile
                    .predictors
                    .as_ref()
                    .ok_or(SparseError::NoPredictors)?,
            ),
            false => None,
        };
        let mut layers = Vec::with_capacity(model.layers().len());
        for (l, w) in model.layers().iter().enumerate() {
            // The share of neurons expected to fire: below half, axpy over a transposed down
            // projection pays for its memory.
            // A store's bundles bring their own down columns (or block-columns).
            let zeros = profile.layers[l].zero_fraction;
            let down_t = if transpose_down && model.store().is_none() && sparsity.max(zeros) >= 0.5
            {
                let down: MatRef<'_> = model.mat(&w.down);
                Some(
                    transpose_requantize(down, down_type)
                        .map_err(|source| SparseError::Transpose { layer: l, source })?,
                )
            } else {
                None
            };
            let predictor = match (predictors, point.predictor_recall) {
                (None, _) => None,
                (Some(set), None) => Some(set.layers[l].clone()),
                (Some(set), Some(recall)) => {
                    let mut p = set.layers[l].clone();
                    p.set_threshold(set.point(l, sparsity, recall)?.cut);
                    Some(p)
                }
            };
            layers.push(SparseLayer {
                threshold: match mode.gate_threshold() {
                    true => profile.threshold(l, sparsity)?,
                    false => NO_THRESHOLD,
                },
                importance: profile.layers[l].importance.clone(),
                predictor,
                down_t,
            });
        }
        Ok(SparseFfn {
            mode,
            sparsity,
            layers,
            down_type,
            activation: model.config().activation,
            predictor_sees_residual: false,
            stats: SparseStats::default(),
        })
    }

    /// Sparse decode in `mode` with a PowerInfer model's own predictors: a neuron runs when
    /// its predictor logit reaches the file's threshold (where the mode predicts), and then
    /// only its ReLU decides (activation threshold 0, where the mode has one). The file's
    /// transposed down projection is used as stored when every layer has one of a type the
    /// kernels read; otherwise the model's is transposed into `fallback_down_type`.
    pub fn from_powerinfer(
        model: &Model,
        pi: PowerInferSparse,
        mode: SparsityMode,
        fallback_down_type: GgmlType,
    ) -> Result<SparseFfn, SparseError> {
        if model.config().is_moe() {
            return Err(SparseError::MixtureOfExperts);
        }
        if model.store().is_some() {
            return Err(SparseError::Store);
        }
        let n_ff = model.config().n_ff as usize;
        let stored = pi.down_type();
        let down_type = stored.unwrap_or(fallback_down_type);
        let mut layers = Vec::with_capacity(pi.layers.len());
        for (l, layer) in pi.layers.into_iter().enumerate() {
            let down_t = match (stored, layer.down_t) {
                (Some(_), Some((_, bytes))) => bytes,
                _ => transpose_requantize(model.mat(&model.layers()[l].down), down_type)
                    .map_err(|source| SparseError::Transpose { layer: l, source })?,
            };
            layers.push(SparseLayer {
                threshold: if mode.gate_threshold() {
                    0.0
                } else {
                    NO_THRESHOLD
                },
                importance: vec![1.0; n_ff],
                predictor: layer.predictor,
                down_t: Some(down_t),
            });
        }
        Ok(SparseFfn {
            mode,
            sparsity: 0.0,
            layers,
            down_type,
            activation: model.config().activation,
            predictor_sees_residual: true,
            stats: SparseStats::default(),
        })
    }
}

//! Operating points of sparse decode: which mode, at which threshold sparsity, with which
//! predictor recall; what each costs in FFN weights read; and the choice `conductor profile`
//! makes among points whose perplexity it measured: the cheapest within a tolerance of dense.

use super::profile::{ModelProfile, ProfileError};
use crate::plan::SparsityMode;
use serde::{Deserialize, Serialize};

/// The perplexity a chosen point may add to dense, relative (3%).
pub const DEFAULT_TOLERANCE: f64 = 0.03;

/// ProSparse's published predictor operating point (arXiv 2402.13516, Table 2: 91–93% recall
/// with 75–79% of neurons predicted inactive at 88–89% actual sparsity): the default of ReLU
/// models with random weights, which have no perplexity to measure one by.
pub const PROSPARSE_RECALL: f32 = 0.92;

/// One setting of sparse decode.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct OperatingPoint {
    pub mode: SparsityMode,
    /// The threshold's target share of FFN neurons skipped (0: keep every nonzero activation;
    /// a ReLU model's natural zeros).
    pub sparsity: f32,
    /// Predictor mode: the recall its cut is calibrated for at `sparsity` (one of the
    /// profile's [`super::profile::PREDICTOR_RECALLS`]); `None`: the cut set at training.
    pub predictor_recall: Option<f32>,
}

impl OperatingPoint {
    pub const DENSE: OperatingPoint = OperatingPoint {
        mode: SparsityMode::Dense,
        sparsity: 0.0,
        predictor_recall: None,
    };

    pub fn threshold(sparsity: f32) -> OperatingPoint {
        OperatingPoint {
            mode: SparsityMode::Threshold,
            sparsity,
            predictor_recall: None,
        }
    }

    pub fn predictor(sparsity: f32, recall: Option<f32>) -> OperatingPoint {
        OperatingPoint {
            mode: SparsityMode::Predictor,
            sparsity,
            predictor_recall: recall,
        }
    }

    /// "threshold 30%", "predictor 30% at recall 0.95", "dense".
    pub fn describe(&self) -> String {
        if !self.mode.is_sparse() {
            return self.mode.name().into();
        }
        let recall = self
            .predictor_recall
            .map(|r| format!(" at recall {r:.2}"))
            .unwrap_or_default();
        format!("{} {:.0}%{recall}", self.mode.name(), self.sparsity * 100.0)
    }
}

/// A point whose perplexity was measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MeasuredPoint {
    pub point: OperatingPoint,
    /// FFN weights a decode token reads, as a share of dense ([`point_cost`]).
    pub cost: f32,
    pub perplexity: f64,
}

/// Where a profile's operating point comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum PointSource {
    /// Perplexity measured on held-out text, at every point tried.
    Measured {
        /// The text (not the calibration text) and how many tokens were scored.
        text: String,
        scored_tokens: u64,
        dense_perplexity: f64,
        tolerance: f64,
        points: Vec<MeasuredPoint>,
    },
    /// A paper's figure (random weights have no perplexity).
    Published { source: String },
}

/// The operating point a profile records as its model's default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChosenPoint {
    pub point: OperatingPoint,
    pub cost: f32,
    pub source: PointSource,
}

impl ChosenPoint {
    /// One line: the point, its cost, and how it was chosen.
    pub fn describe(&self) -> String {
        let how = match &self.source {
            PointSource::Measured {
                dense_perplexity,
                tolerance,
                points,
                scored_tokens,
                ..
            } => {
                let ppl = points
                    .iter()
                    .find(|m| m.point == self.point)
                    .map_or(*dense_perplexity, |m| m.perplexity);
                format!(
                    "perplexity {ppl:.3} against dense {dense_perplexity:.3} ({:+.2}%, within {:.0}%) on {scored_tokens} held-out tokens",
                    (ppl / dense_perplexity - 1.0) * 100.0,
                    tolerance * 100.0
                )
            }
            PointSource::Published { source } => format!("published: {source}"),
        };
        format!(
            "{}, {:.0}% of dense FFN weights read; {how}",
            self.point.describe(),
            self.cost * 100.0
        )
    }
}

/// FFN weights a decode token reads at `point`, as a share of dense, averaged over layers
/// (weights counted, not bytes), from what its mode does: the gate rows computed (every one,
/// or the predicted ones, with the predictor's own two matrices), and the up rows and down
/// columns of the neurons that pass (with a threshold, those it keeps of them; without, every
/// one computed). Shares come from the profile: `1 − max(sparsity, natural zeros)` neurons
/// pass the threshold; a predictor names its held-out `predicted` share and keeps its
/// `recall` of those the threshold would.
pub fn point_cost(profile: &ModelProfile, point: &OperatingPoint) -> Result<f32, ProfileError> {
    let mode = point.mode;
    if !mode.is_sparse() {
        return Ok(1.0);
    }
    let m = &profile.model;
    let (embd, ff) = (m.n_embd as f64, m.n_ff as f64);
    let mut total = 0.0f64;
    for (l, layer) in profile.layers.iter().enumerate() {
        // The threshold keeps the target's share, or fewer where more are naturally zero.
        let active = 1.0 - f64::from(point.sparsity.max(layer.zero_fraction));
        // (share of gate rows computed, share of the threshold's neurons among them, the
        // predictor's weights as a share of the layer's)
        let (computed, recall, predictor) = match mode.predicts() {
            false => (1.0, 1.0, 0.0),
            true => {
                let set = profile
                    .predictors
                    .as_ref()
                    .ok_or(ProfileError::NoPredictors)?;
                let (predicted, recall) = match point.predictor_recall {
                    Some(r) => {
                        let p = set.point(l, point.sparsity, r)?;
                        (f64::from(p.predicted), f64::from(p.recall))
                    }
                    None => {
                        let (recall, _, predicted) = set.held_out[l];
                        (f64::from(predicted), f64::from(recall))
                    }
                };
                let rank = set.layers[l].rank() as f64;
                (predicted, recall, rank * (embd + ff) / (3.0 * embd * ff))
            }
        };
        let passed = match mode.gate_threshold() {
            true => active * recall,
            false => computed,
        };
        total += predictor + (computed + 2.0 * passed) / 3.0;
    }
    Ok((total / profile.layers.len().max(1) as f64) as f32)
}

/// The cheapest of the `measured` points whose perplexity is within `tolerance` (relative)
/// of `dense_perplexity`; dense when none is. Ties go to the earlier point.
pub fn choose(dense_perplexity: f64, measured: &[MeasuredPoint], tolerance: f64) -> OperatingPoint {
    let limit = dense_perplexity * (1.0 + tolerance);
    measured
        .iter()
        .filter(|m| m.perplexity.is_finite() && m.perplexity <= limit && m.cost < 1.0)
        .fold(None::<&MeasuredPoint>, |best, m| match best {
            Some(b) if b.cost <= m.cost => Some(b),
            _ => Some(m),
        })
        .map_or(OperatingPoint::DENSE, |m| m.point)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(point: OperatingPoint, cost: f32, perplexity: f64) -> MeasuredPoint {
        MeasuredPoint {
            point,
            cost,
            perplexity,
        }
    }

    #[test]
    fn the_cheapest_point_within_the_tolerance_wins() {
        let points = [
            measured(OperatingPoint::threshold(0.1), 0.93, 30.1),
            measured(OperatingPoint::threshold(0.2), 0.87, 30.5),
            measured(OperatingPoint::threshold(0.3), 0.80, 30.8),
            measured(OperatingPoint::threshold(0.4), 0.73, 31.2),
            measured(OperatingPoint::predictor(0.3, Some(0.95)), 0.70, 31.0),
        ];
        // Dense 30.0: 3% allows 30.9; the predictor point at 31.0 is cheaper but 3.3% worse.
        assert_eq!(choose(30.0, &points, 0.03), OperatingPoint::threshold(0.3));
        // At 5% the predictor point is the cheapest within.
        assert_eq!(
            choose(30.0, &points, 0.05),
            OperatingPoint::predictor(0.3, Some(0.95))
        );
        // Nothing within 0.1%: dense.
        assert_eq!(choose(30.0, &points, 0.001), OperatingPoint::DENSE);
        assert_eq!(choose(30.0, &[], 0.03), OperatingPoint::DENSE);
    }

    #[test]
    fn non_finite_and_costlier_than_dense_points_never_win() {
        let points = [
            measured(OperatingPoint::threshold(0.5), 0.6, f64::NAN),
            measured(OperatingPoint::predictor(0.1, None), 1.02, 30.0),
            measured(OperatingPoint::threshold(0.1), 0.93, 30.0),
        ];
        assert_eq!(choose(30.0, &points, 0.03), OperatingPoint::threshold(0.1));
        // Equal costs: the earlier point.
        let tie = [
            measured(OperatingPoint::threshold(0.2), 0.8, 30.0),
            measured(OperatingPoint::predictor(0.2, None), 0.8, 30.0),
        ];
        assert_eq!(choose(30.0, &tie, 0.03), OperatingPoint::threshold(0.2));
    }

    #[test]
    fn points_describe_themselves() {
        assert_eq!(OperatingPoint::DENSE.describe(), "dense");
        assert_eq!(OperatingPoint::threshold(0.3).describe(), "threshold 30%");
        assert_eq!(
            OperatingPoint::predictor(0.0, Some(0.92)).describe(),
            "predictor 0% at recall 0.92"
        );
    }
}

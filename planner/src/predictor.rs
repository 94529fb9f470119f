//! Training of the per-layer activation predictors (`conductor_runtime::sparse::predictor`):
//! profiling-time work, run by `conductor profile`. The runtime keeps the inference form
//! ([`Predictor`]: loading, validation, `predict`).
//!
//! # Training ([`train_layer`])
//! The tokens of a [`TrainingSet`] are split, in order, into a training part, a calibration
//! slice (the tail of the training part, not used for gradient steps) and a held-out part (the
//! last `held_out_fraction` of the tokens, contiguous, so held-out text is unseen). For each rank
//! candidate the f32 network is trained with Adam on recall-weighted BCE (positives weigh
//! `positive_weight`), then quantized to the inference form ([`Predictor`], Q8_0 weights), and
//! the threshold is chosen on the *quantized* calibration logits so that calibration recall is at
//! least `target_recall + recall_margin`. Recall, precision and the predicted fraction are then
//! measured on the held-out tokens with the same quantized path that decode runs, and the rank
//! with the lowest expected per-token cost among those meeting the target is kept. Candidates
//! are trained ascending; the search stops once a rank meets the target without costing less
//! than a smaller one that met it, since larger ranks then buy precision too slowly to pay for
//! their own work (on SmolLM2 this trains 2 of the 4 default ranks in 29 of 30 layers).
//!
//! Training is single-threaded and deterministic: the initialisation and shuffling come from a
//! seeded splitmix64, and every float sum is computed in a fixed order (the f32 products use the
//! crate's F32 dot kernels, which are bit-identical across ISAs), so the same set, config and
//! seed give a bit-identical predictor. Layers are independent; a driver may train several on
//! its own threads.

mod net;
mod points;
mod set;
#[cfg(test)]
mod tests;
mod threshold;
mod train;

use conductor_runtime::sparse::predictor::{Predictor, PredictorError, BLOCK};
pub use points::operating_points;
use serde::{Deserialize, Serialize};
pub use set::TrainingSet;
pub use train::train_layer;

/// How [`train_layer`] trains and chooses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PredictorConfig {
    /// Hidden sizes to try, each a positive multiple of 32 (tried ascending).
    pub ranks: Vec<usize>,
    /// Held-out recall a predictor must reach (share of truly active neuron-tokens predicted).
    pub target_recall: f32,
    /// The threshold is set for `target_recall + recall_margin` on the calibration slice, so
    /// that held-out recall lands at or above the target.
    pub recall_margin: f32,
    pub epochs: usize,
    /// Tokens per Adam step.
    pub batch: usize,
    /// Adam's initial step size (decays linearly to a tenth over the run).
    pub learning_rate: f32,
    /// Weight of an active neuron's BCE term (inactive ones weigh 1).
    pub positive_weight: f32,
    /// AdamW's decoupled weight decay of fc1/fc2 (per unit of learning rate).
    pub weight_decay: f32,
    /// Share of the tokens (the last ones, contiguous) held out for the reported figures.
    pub held_out_fraction: f32,
    /// Share of the remaining tokens (their tail) kept out of the gradient steps to calibrate
    /// the threshold.
    pub calibration_fraction: f32,
    pub seed: u64,
}

impl Default for PredictorConfig {
    fn default() -> Self {
        PredictorConfig {
            ranks: vec![32, 64, 128, 256],
            target_recall: 0.99,
            recall_margin: 0.003,
            epochs: 12,
            batch: 32,
            learning_rate: 1e-2,
            positive_weight: 2.0,
            weight_decay: 1.0,
            held_out_fraction: 0.2,
            calibration_fraction: 0.15,
            seed: 0x5eed_c0de,
        }
    }
}

impl PredictorConfig {
    fn check(&self) -> Result<(), PredictorError> {
        let bad = |m: String| Err(PredictorError::Config(m));
        if self.ranks.is_empty() {
            return bad("no rank candidate".into());
        }
        if let Some(r) = self
            .ranks
            .iter()
            .find(|&&r| r == 0 || !r.is_multiple_of(BLOCK))
        {
            return bad(format!("rank {r} is not a positive multiple of 32"));
        }
        if !(self.target_recall > 0.0 && self.target_recall <= 1.0) {
            return bad(format!(
                "target_recall {} outside (0, 1]",
                self.target_recall
            ));
        }
        if !(self.recall_margin >= 0.0 && self.recall_margin < 1.0) {
            return bad(format!(
                "recall_margin {} outside [0, 1)",
                self.recall_margin
            ));
        }
        if self.epochs == 0 || self.batch == 0 {
            return bad("epochs and batch must be positive".into());
        }
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0) {
            return bad(format!("learning_rate {}", self.learning_rate));
        }
        if !(self.positive_weight.is_finite() && self.positive_weight > 0.0) {
            return bad(format!("positive_weight {}", self.positive_weight));
        }
        if !(self.weight_decay >= 0.0 && self.learning_rate * self.weight_decay < 1.0) {
            return bad(format!("weight_decay {}", self.weight_decay));
        }
        for (name, f) in [
            ("held_out_fraction", self.held_out_fraction),
            ("calibration_fraction", self.calibration_fraction),
        ] {
            if !(f > 0.0 && f < 1.0) {
                return bad(format!("{name} {f} outside (0, 1)"));
            }
        }
        Ok(())
    }
}

/// The figures of one rank candidate, measured on the held-out tokens with the quantized
/// inference path.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankReport {
    pub rank: usize,
    /// Held-out recall: predicted-and-active / active.
    pub recall: f32,
    /// Held-out precision: predicted-and-active / predicted.
    pub precision: f32,
    /// Share of the held-out neuron-tokens predicted active.
    pub predicted_fraction: f32,
    /// Expected weights touched per token: `rank·(n_embd + n_ff) + predicted_fraction · n_ff ·
    /// 3 · n_embd` (the predictor, then gate/up/down of the predicted neurons).
    pub cost: f64,
    /// Recall on the calibration slice at the chosen threshold.
    pub calibration_recall: f32,
    pub threshold: f32,
}

/// The result of [`train_layer`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainedPredictor {
    /// The chosen predictor.
    pub predictor: Predictor,
    /// The chosen rank's figures (also in `tried`).
    pub chosen: RankReport,
    /// Whether the chosen predictor reaches `target_recall` on the held-out tokens; when no rank
    /// does, the one with the best held-out recall is chosen and this is false.
    pub meets_target: bool,
    /// Every rank trained, ascending.
    pub tried: Vec<RankReport>,
    /// Ranks not trained because even a perfect predictor of that rank would cost more than
    /// the best one already meeting the target.
    pub skipped: Vec<usize>,
    /// Ranks not trained because the rank before them met the target without costing less
    /// than the best smaller one: returns are taken as diminishing from there on (a larger
    /// rank buys a few points of precision for more predictor work per token).
    pub stopped: Vec<usize>,
    /// Share of held-out neuron-tokens truly active.
    pub base_rate: f32,
    /// Dense per-token cost (`n_ff · 3 · n_embd`), for comparison with `chosen.cost`.
    pub dense_cost: f64,
    pub train_tokens: usize,
    pub calibration_tokens: usize,
    pub held_out_tokens: usize,
}

//! Sparse decode as a plan sets it: how decode chooses the FFN neurons it computes.

use serde::{Deserialize, Serialize};

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

/// Sparse decode as a plan sets it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SparsityPlan {
    pub mode: SparsityMode,
    /// Target share of FFN neurons skipped (`None`: the model's default target).
    #[serde(default)]
    pub target: Option<f32>,
    /// Predictor mode: the recall its cut is calibrated for (one the activation profile
    /// tabulates); `None`: the cut set when the predictors were trained.
    #[serde(default)]
    pub predictor_recall: Option<f32>,
    /// The per-layer thresholds on |act(gate)| that target gives with the model's activation
    /// profile (for people reading the plan; the engine calibrates them again from the
    /// profile and the target, so both always agree with the profile in use).
    #[serde(default)]
    pub thresholds: Vec<f32>,
}

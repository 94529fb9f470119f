//! Sparse decode as a plan sets it: how decode chooses the FFN neurons it computes. Each mode
//! answers what it does ([`SparsityMode::predicts`], [`SparsityMode::gate_threshold`]); its
//! consumers ask those questions, never match on the variants, so a mode is added here (its
//! name, description and answers) and in its tests.

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
    /// Every neuron the layer's predictor names, whole: the predictor alone decides.
    #[serde(rename = "predictor-only")]
    PredictorOnly,
}

impl SparsityMode {
    /// Every mode, in the order settings list them.
    pub const ALL: [SparsityMode; 4] = [
        SparsityMode::Dense,
        SparsityMode::Threshold,
        SparsityMode::Predictor,
        SparsityMode::PredictorOnly,
    ];

    /// Whether decode skips FFN neurons at all (every mode but dense).
    pub fn is_sparse(self) -> bool {
        self.predicts() || self.gate_threshold()
    }

    /// Decode runs each layer's predictor after its attention and computes (and, under a
    /// cache, reads) only the neurons it names: the mode needs a profile with predictors (or
    /// a PowerInfer file's own).
    pub fn predicts(self) -> bool {
        matches!(self, SparsityMode::Predictor | SparsityMode::PredictorOnly)
    }

    /// Of the neurons a step computes, only those whose activated gate passes the layer's
    /// threshold get their up row and down column (the profile calibrates the thresholds for
    /// the target sparsity).
    pub fn gate_threshold(self) -> bool {
        matches!(self, SparsityMode::Threshold | SparsityMode::Predictor)
    }

    /// The setting `default`: no mode named, the shipped choice ([`SparsityMode::setting`]).
    pub const DEFAULT_SETTING: &'static str = "default";

    pub fn name(self) -> &'static str {
        match self {
            SparsityMode::Dense => "dense",
            SparsityMode::Threshold => "threshold",
            SparsityMode::Predictor => "predictor",
            SparsityMode::PredictorOnly => "predictor-only",
        }
    }

    /// One line on what the mode computes, for the settings' help.
    pub fn describe(self) -> &'static str {
        match self {
            SparsityMode::Dense => "every FFN neuron (llama.cpp's arithmetic)",
            SparsityMode::Threshold => {
                "every gate row; up rows and down columns where the gate passes the layer's threshold (CATS)"
            }
            SparsityMode::Predictor => {
                "gate rows only of the neurons the layer's predictor names, then the threshold"
            }
            SparsityMode::PredictorOnly => {
                "every neuron the layer's predictor names, whole (no threshold: the predictor alone decides)"
            }
        }
    }

    /// A sparsity setting as the command line, the Python package and the server take it:
    /// [`SparsityMode::DEFAULT_SETTING`] (`None`: the shipped choice: in memory dense for
    /// SwiGLU models, sparse for profiled ReLU models and PowerInfer files; under a budget
    /// the profile's measured operating point) or a mode's [`SparsityMode::name`], in any
    /// case. The settings' parsers all come here, so a new mode is named in this file only.
    pub fn setting(text: &str) -> Result<Option<SparsityMode>, String> {
        if text.eq_ignore_ascii_case(Self::DEFAULT_SETTING) {
            return Ok(None);
        }
        Self::ALL
            .into_iter()
            .find(|m| text.eq_ignore_ascii_case(m.name()))
            .map(Some)
            .ok_or_else(|| {
                let names: Vec<String> =
                    Self::setting_names().map(|n| format!("\"{n}\"")).collect();
                format!("sparsity {text:?}: one of {}", names.join(", "))
            })
    }

    /// The names [`SparsityMode::setting`] takes: `default`, then every mode's.
    pub fn setting_names() -> impl Iterator<Item = &'static str> {
        std::iter::once(Self::DEFAULT_SETTING).chain(Self::ALL.into_iter().map(Self::name))
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

#[cfg(test)]
mod tests {
    use super::SparsityMode;

    #[test]
    fn every_mode_is_a_setting_by_its_name_and_default_is_none() {
        for mode in SparsityMode::ALL {
            assert_eq!(SparsityMode::setting(mode.name()), Ok(Some(mode)));
            let upper = mode.name().to_ascii_uppercase();
            assert_eq!(SparsityMode::setting(&upper), Ok(Some(mode)));
            // The plan file's spelling (serde) is the setting's.
            let json = serde_json::to_string(&mode).unwrap();
            assert_eq!(json, format!("\"{}\"", mode.name()));
        }
        assert_eq!(SparsityMode::setting("Default"), Ok(None));
        let e = SparsityMode::setting("sparse").unwrap_err();
        for name in SparsityMode::setting_names() {
            assert!(e.contains(&format!("\"{name}\"")), "{e}");
        }
        assert_eq!(
            SparsityMode::setting_names().count(),
            SparsityMode::ALL.len() + 1
        );
    }
}

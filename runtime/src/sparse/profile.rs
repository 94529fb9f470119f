//! A model's activation profile: how its FFN neurons fire over calibration text.
//!
//! Sparsity here is CATS-style with a per-neuron weight: a neuron `j` is *active* for a token
//! when its *score* |act(gate_j · x)| · importance_j is above its layer's threshold, where
//! importance_j = mean |up_j · x| over the calibration tokens × ‖down column j‖₂ (what a unit
//! of activation is worth at the FFN's output). The gate decides alone, so decode computes the
//! gate row first and reads the up row and down column only of neurons that fire. A threshold
//! of 0 keeps every neuron whose activation is not exactly zero: dense for SwiGLU models, the
//! natural sparsity of ReLU models, and lossless for both.
//!
//! The profile tabulates each layer's threshold at a grid of target sparsities (the quantiles
//! of the scores over the calibration tokens, [`super::layer_stats`]), the share of the FFN output's mass the active
//! neurons carry at each, every neuron's activation frequency and mean magnitude at a reference
//! sparsity (the hot/cold ranking), and optionally the layers' trained predictors.

use super::operating::ChosenPoint;
use super::predictor::Predictor;
use crate::plan::ModelIdentity;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Format version of profile files; bumped on any change of [`ModelProfile`].
pub const PROFILE_VERSION: u32 = 3;
const MAGIC: &[u8; 8] = b"CNDPROF\0";

/// Target sparsities at which thresholds are tabulated: 0%, 5%, …, 95%, then 97.5% and 99%.
pub fn sparsity_grid() -> Vec<f32> {
    let mut grid: Vec<f32> = (0..20).map(|i| i as f32 * 0.05).collect();
    grid.extend([0.975, 0.99]);
    grid
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}: not an activation profile (made by `conductor profile`)")]
    NotAProfile(String),
    #[error("{path}: profile format version {found}; this build reads version {} (run `conductor profile` again)", PROFILE_VERSION)]
    Version { path: String, found: u32 },
    #[error("{path}: damaged profile: {why}")]
    Damaged { path: String, why: String },
    #[error(
        "the activation profile was made for another model ({profile}); this model is {model}"
    )]
    OtherModel { profile: String, model: String },
    #[error("sparsity {0} is outside 0..=0.99")]
    Sparsity(f32),
    #[error("the activation profile has no predictors (run `conductor profile` without --no-predictors)")]
    NoPredictors,
    #[error("predictor recall {0} is not one the profile calibrated (0.8, 0.85, 0.9, 0.92, 0.95, 0.98, 0.99)")]
    Recall(f32),
}

impl ModelIdentity {
    /// An error naming both models unless `model` is the one this identity describes.
    pub fn check(&self, model: &ModelIdentity) -> Result<(), ProfileError> {
        if self == model {
            Ok(())
        } else {
            Err(ProfileError::OtherModel {
                profile: self.describe(),
                model: model.describe(),
            })
        }
    }
}

/// One layer's statistics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerProfile {
    /// Per neuron: the weight of |act(gate)| in its score.
    pub importance: Vec<f32>,
    /// Threshold on the score at each sparsity of [`ModelProfile::grid`].
    pub thresholds: Vec<f32>,
    /// Share of the FFN output's mass (Σ |act(gate) · up| over neurons) that the active
    /// neurons carry at each sparsity of the grid: how much of the up and down work a
    /// gate-only decision keeps.
    pub kept_mass: Vec<f32>,
    /// Share of (token, neuron) activations that are exactly zero (ReLU's natural sparsity).
    pub zero_fraction: f32,
    /// Per neuron: share of tokens in which it is active at the reference sparsity.
    pub frequency: Vec<f32>,
    /// Per neuron: mean |act(gate)|.
    pub mean_abs: Vec<f32>,
    /// The fewest neurons that carry 80% of the FFN output's mass (Σ |act(gate) · up| over
    /// the calibration tokens), as a share of the layer's neurons: how skewed activation is,
    /// whatever the threshold.
    pub mass_hot_share: f32,
    /// Active sets followed token by token at each sparsity of
    /// [`super::layer_stats::LEVELS`].
    pub levels: Vec<LevelProfile>,
}

/// One layer's active sets at one sparsity, measured token by token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LevelProfile {
    /// The sparsity whose threshold (the first chunk's quantile) defines the active sets.
    pub target: f32,
    /// That threshold on the score.
    pub threshold: f32,
    /// Share of (token, neuron) pairs active over every calibration token.
    pub active_share: f32,
    /// The fewest neurons that take 80% of the activations (active pairs), as a share of
    /// the layer's neurons: 0.2 would be PowerInfer's "20% of neurons, 80% of activations";
    /// `1 − target` times 0.8 means no skew at all.
    pub hot_share: f32,
    /// `reuse[k − 1]`: the share of a token's active neurons that were active in at least one
    /// of the `k` tokens before it (LLM in a Flash's sliding window), k = 1..=5.
    pub reuse: Vec<f32>,
    /// Per neuron: share of tokens in which it is active.
    pub frequency: Vec<f32>,
}

/// Trained predictors of every layer, for one target sparsity.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PredictorSet {
    /// The sparsity whose active sets they were trained to predict.
    pub sparsity: f32,
    pub layers: Vec<Predictor>,
    /// Held-out figures per layer: (recall, precision, predicted fraction).
    pub held_out: Vec<(f32, f32, f32)>,
    /// Per layer: the predictor's operating points, each a sparsity of
    /// [`super::layer_stats::LEVELS`] and a recall of [`PREDICTOR_RECALLS`].
    pub points: Vec<Vec<PredictorPoint>>,
}

/// The recalls a predictor's operating points are calibrated for.
pub const PREDICTOR_RECALLS: [f32; 7] = [0.8, 0.85, 0.9, 0.92, 0.95, 0.98, 0.99];

/// A layer's predictor at one operating point: the logit cut that keeps `recall_target` of
/// the neurons active at `sparsity` on the calibration slice of the samples, and what that
/// cut gives on the held-out samples.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PredictorPoint {
    pub sparsity: f32,
    pub recall_target: f32,
    /// Neurons whose logit is at least this are predicted active.
    pub cut: f32,
    /// Held out: predicted-and-active / active.
    pub recall: f32,
    /// Held out: predicted-and-active / predicted.
    pub precision: f32,
    /// Held out: share of (token, neuron) pairs predicted active.
    pub predicted: f32,
}

impl PredictorSet {
    /// Layer `l`'s operating point nearest `sparsity` at recall `recall` (one of
    /// [`PREDICTOR_RECALLS`]).
    pub fn point(
        &self,
        l: usize,
        sparsity: f32,
        recall: f32,
    ) -> Result<PredictorPoint, ProfileError> {
        if !PREDICTOR_RECALLS.iter().any(|&r| (r - recall).abs() < 1e-4) {
            return Err(ProfileError::Recall(recall));
        }
        self.points
            .get(l)
            .into_iter()
            .flatten()
            .filter(|p| (p.recall_target - recall).abs() < 1e-4)
            .min_by(|a, b| {
                (a.sparsity - sparsity)
                    .abs()
                    .total_cmp(&(b.sparsity - sparsity).abs())
            })
            .copied()
            .ok_or(ProfileError::Recall(recall))
    }
}

/// A model's activation profile (`conductor profile`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModelProfile {
    pub version: u32,
    pub model: ModelIdentity,
    /// The file it was profiled on and the layout its weights had then ("m.gguf, rows
    /// interleaved 8 by 8"): named when the profile is refused for another model.
    pub source: String,
    /// Where the calibration text came from, and how many tokens were profiled.
    pub calibration: String,
    pub tokens: u64,
    pub grid: Vec<f32>,
    /// The sparsity `frequency` was counted at.
    pub reference_sparsity: f32,
    pub layers: Vec<LayerProfile>,
    pub predictors: Option<PredictorSet>,
    /// The default operating point of sparse decode (`--sparsity default` under `--memory`):
    /// measured on held-out text, or a published one for random weights. `None`: not chosen.
    pub operating_point: Option<ChosenPoint>,
}

impl ModelProfile {
    /// Layer `l`'s threshold for a target `sparsity`, interpolated linearly between grid points.
    pub fn threshold(&self, l: usize, sparsity: f32) -> Result<f32, ProfileError> {
        let last = *self.grid.last().unwrap_or(&0.0);
        if !(0.0..=last).contains(&sparsity) {
            return Err(ProfileError::Sparsity(sparsity));
        }
        Ok(interpolate(
            &self.grid,
            &self.layers[l].thresholds,
            sparsity,
        ))
    }

    /// Layer `l`'s neurons from most to least frequently active (ties: larger mean first).
    pub fn hot_order(&self, l: usize) -> Vec<u32> {
        let p = &self.layers[l];
        let mut order: Vec<u32> = (0..p.frequency.len() as u32).collect();
        order.sort_by(|&a, &b| {
            let (a, b) = (a as usize, b as usize);
            p.frequency[b]
                .total_cmp(&p.frequency[a])
                .then(p.mean_abs[b].total_cmp(&p.mean_abs[a]))
                .then(a.cmp(&b))
        });
        order
    }

    /// The profile file next to a model: `MODEL.gguf.profile`.
    pub fn default_path(model: &Path) -> std::path::PathBuf {
        let mut name = model.as_os_str().to_os_string();
        name.push(".profile");
        name.into()
    }

    pub fn save(&self, path: &Path) -> Result<(), ProfileError> {
        let io = |source| ProfileError::Io {
            path: path.display().to_string(),
            source,
        };
        let bytes = self
            .encode()
            .map_err(|e| io(std::io::Error::other(e.to_string())))?;
        // Written beside and renamed, so a failure never leaves half a profile.
        let tmp = path.with_extension("profile.tmp");
        std::fs::write(&tmp, &bytes).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// The file's bytes: magic, version, checksum of the body, body (what [`ModelProfile::decode`]
    /// reads).
    pub fn encode(&self) -> Result<Vec<u8>, bincode::error::EncodeError> {
        let body = bincode::serde::encode_to_vec(self, bincode::config::standard())?;
        let mut bytes = Vec::with_capacity(body.len() + 16);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&PROFILE_VERSION.to_le_bytes());
        bytes.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        bytes.extend_from_slice(&body);
        Ok(bytes)
    }

    /// Reads a profile and checks it belongs to `model`.
    pub fn load(path: &Path, model: &ModelIdentity) -> Result<ModelProfile, ProfileError> {
        ModelProfile::load_for(path, model, None)
    }

    /// [`ModelProfile::load`], naming the model's file (`model_file`) beside the profile's own
    /// when it is refused.
    pub fn load_for(
        path: &Path,
        model: &ModelIdentity,
        model_file: Option<&Path>,
    ) -> Result<ModelProfile, ProfileError> {
        let name = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| ProfileError::Io {
            path: name.clone(),
            source,
        })?;
        let profile = ModelProfile::decode(&bytes, &name)?;
        if profile.model != *model {
            return Err(ProfileError::OtherModel {
                profile: format!(
                    "{name}: {}, profiled on {}",
                    profile.model.describe(),
                    profile.source
                ),
                model: match model_file {
                    Some(file) => format!("{}: {}", file.display(), model.describe()),
                    None => model.describe(),
                },
            });
        }
        Ok(profile)
    }

    /// Parses a profile file's bytes (`name` for errors); checks its consistency.
    pub fn decode(bytes: &[u8], name: &str) -> Result<ModelProfile, ProfileError> {
        if bytes.len() < 16 || &bytes[..8] != MAGIC {
            return Err(ProfileError::NotAProfile(name.into()));
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != PROFILE_VERSION {
            return Err(ProfileError::Version {
                path: name.into(),
                found: version,
            });
        }
        let damaged = |why: String| ProfileError::Damaged {
            path: name.into(),
            why,
        };
        let crc = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"));
        let body = &bytes[16..];
        if crc32fast::hash(body) != crc {
            return Err(damaged("checksum mismatch".into()));
        }
        let limit = bincode::config::standard().with_limit::<{ 1 << 30 }>();
        let (profile, _): (ModelProfile, usize) =
            bincode::serde::decode_from_slice(body, limit).map_err(|e| damaged(e.to_string()))?;
        profile.validate().map_err(damaged)?;
        Ok(profile)
    }

    /// Every table has the sizes the model identity says.
    fn validate(&self) -> Result<(), String> {
        let m = &self.model;
        if self.layers.len() != m.n_layer as usize {
            return Err(format!(
                "{} layers for a {}-layer model",
                self.layers.len(),
                m.n_layer
            ));
        }
        if self.grid.is_empty() || self.grid.windows(2).any(|w| w[0] >= w[1]) {
            return Err("the sparsity grid is not increasing".into());
        }
        for (l, p) in self.layers.iter().enumerate() {
            if p.thresholds.len() != self.grid.len() || p.kept_mass.len() != self.grid.len() {
                return Err(format!("layer {l}: tables do not match the grid"));
            }
            if p.frequency.len() != m.n_ff as usize
                || p.mean_abs.len() != m.n_ff as usize
                || p.importance.len() != m.n_ff as usize
            {
                return Err(format!("layer {l}: per-neuron tables are not n_ff long"));
            }
            for level in &p.levels {
                if level.frequency.len() != m.n_ff as usize
                    || level.reuse.len() != super::layer_stats::REUSE_WINDOW
                {
                    return Err(format!(
                        "layer {l}: the tables of sparsity {} have the wrong size",
                        level.target
                    ));
                }
            }
        }
        if let Some(set) = &self.predictors {
            if set.layers.len() != m.n_layer as usize
                || set.held_out.len() != m.n_layer as usize
                || set.points.len() != m.n_layer as usize
            {
                return Err("predictors do not cover every layer".into());
            }
            for (l, p) in set.layers.iter().enumerate() {
                p.validate(m.n_embd as usize, m.n_ff as usize)
                    .map_err(|e| format!("predictor of layer {l}: {e}"))?;
            }
        }
        Ok(())
    }
}

/// The value of a table over `grid` at `sparsity`, linear between grid points and clamped to
/// the grid's ends.
pub fn interpolate(grid: &[f32], table: &[f32], sparsity: f32) -> f32 {
    let i = grid.partition_point(|&g| g <= sparsity).max(1) - 1;
    if i + 1 >= grid.len() {
        return table[i];
    }
    let (g0, g1) = (grid[i], grid[i + 1]);
    let w = ((sparsity - g0) / (g1 - g0)).clamp(0.0, 1.0);
    table[i] + w * (table[i + 1] - table[i])
}

#[cfg(test)]
mod tests {
    use super::super::layer_stats::layer_profile;
    use super::*;

    fn identity() -> ModelIdentity {
        ModelIdentity {
            arch: "llama".into(),
            n_layer: 2,
            n_embd: 4,
            n_ff: 8,
            relu: false,
            norms_crc32: 7,
        }
    }

    fn profile() -> ModelProfile {
        let grid = sparsity_grid();
        let acts: Vec<f32> = (0..8 * 100)
            .map(|i| ((i * 37) % 101) as f32 - 50.0)
            .collect();
        let ups = vec![1.0; acts.len()];
        let layer = layer_profile(&acts, &ups, vec![1.0; 8], &grid, 0.5);
        ModelProfile {
            version: PROFILE_VERSION,
            model: identity(),
            source: "test.gguf, file rows".into(),
            calibration: "test".into(),
            tokens: 100,
            grid,
            reference_sparsity: 0.5,
            layers: vec![layer.clone(), layer],
            predictors: None,
            operating_point: None,
        }
    }

    #[test]
    fn interpolation_and_bounds() {
        let p = profile();
        let t40 = p.threshold(0, 0.40).unwrap();
        let t45 = p.threshold(0, 0.45).unwrap();
        let t425 = p.threshold(0, 0.425).unwrap();
        assert!(t40 <= t425 && t425 <= t45);
        assert!(matches!(
            p.threshold(0, 1.5),
            Err(ProfileError::Sparsity(_))
        ));
        assert!(matches!(
            p.threshold(0, -0.1),
            Err(ProfileError::Sparsity(_))
        ));
        assert_eq!(
            p.threshold(1, 0.99).unwrap(),
            *p.layers[1].thresholds.last().unwrap()
        );
    }

    #[test]
    fn hot_order_ranks_by_frequency() {
        let mut p = profile();
        p.layers[0].frequency = vec![0.1, 0.9, 0.5, 0.5, 0.0, 0.2, 0.3, 0.4];
        p.layers[0].mean_abs = vec![0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0];
        assert_eq!(p.hot_order(0), vec![1, 3, 2, 7, 6, 5, 0, 4]);
    }

    #[test]
    fn files_round_trip_and_reject_damage() {
        let dir = std::env::temp_dir().join(format!("cnd-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.gguf.profile");
        let p = profile();
        p.save(&path).unwrap();
        let back = ModelProfile::load(&path, &identity()).unwrap();
        assert_eq!(back.layers, p.layers);
        // Another model.
        let mut other = identity();
        other.norms_crc32 = 8;
        let e = ModelProfile::load(&path, &other).unwrap_err();
        assert!(matches!(e, ProfileError::OtherModel { .. }), "{e}");
        // Both named: the profile's file and what it was made on, the model's file.
        let e = ModelProfile::load_for(&path, &other, Some(Path::new("other.gguf")))
            .unwrap_err()
            .to_string();
        for part in [
            "m.gguf.profile",
            "test.gguf, file rows",
            "other.gguf",
            "00000007",
            "00000008",
        ] {
            assert!(e.contains(part), "{part}: {e}");
        }
        // A flipped byte, a truncation, another version, not a profile at all.
        let bytes = std::fs::read(&path).unwrap();
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(matches!(
            ModelProfile::decode(&flipped, "x"),
            Err(ProfileError::Damaged { .. })
        ));
        assert!(ModelProfile::decode(&bytes[..bytes.len() / 2], "x").is_err());
        // The previous version (no token-by-token statistics, no operating point).
        let mut v2 = bytes.clone();
        v2[8] = 2;
        assert!(matches!(
            ModelProfile::decode(&v2, "x"),
            Err(ProfileError::Version { found: 2, .. })
        ));
        assert!(matches!(
            ModelProfile::decode(b"GGUF....0123456789", "x"),
            Err(ProfileError::NotAProfile(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A profile with predictors (n_embd 32, the smallest a predictor serves).
    fn profile_with_predictors() -> ModelProfile {
        let mut p = profile();
        p.model.n_embd = 32;
        let (e, f, r) = (32, 8, 32);
        let w = |n: usize| (0..n).map(|i| ((i * 7) % 13) as f32 / 13.0 - 0.5).collect();
        let fc1: Vec<f32> = w(r * e);
        let fc2: Vec<f32> = w(f * r);
        let pred =
            Predictor::from_weights(e, f, r, &fc1, vec![0.1; r], &fc2, vec![0.0; f], 0.0).unwrap();
        p.predictors = Some(PredictorSet {
            sparsity: 0.5,
            layers: vec![pred.clone(), pred],
            held_out: vec![(0.99, 0.5, 0.6); 2],
            points: vec![Vec::new(); 2],
        });
        p
    }

    proptest::proptest! {
        /// Hostile profile files: any bytes after a valid header and checksum (so the decoder
        /// itself sees them) give a profile that passes its checks or an error, never a panic;
        /// a profile that loads answers every lookup.
        #[test]
        fn hostile_profiles_never_panic(
            edits in proptest::collection::vec((0usize..1 << 16, proptest::prelude::any::<u8>()), 1..8),
            cut in 0usize..1 << 16,
        ) {
            let bytes = profile_with_predictors().encode().unwrap();
            let mut body = bytes[16..].to_vec();
            for (at, value) in edits {
                let n = body.len();
                body[at % n] = value;
            }
            body.truncate(body.len() - cut % (body.len() / 4 + 1));
            let mut file = bytes[..12].to_vec();
            file.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
            file.extend_from_slice(&body);
            if let Ok(p) = ModelProfile::decode(&file, "mutated") {
                for l in 0..p.layers.len() {
                    let _ = p.threshold(l, 0.5);
                    let _ = p.hot_order(l);
                }
            }
        }
    }

    #[test]
    fn tables_of_the_wrong_size_are_damage() {
        let mut p = profile();
        p.layers[1].frequency.pop();
        assert!(p.validate().is_err());
        let mut p = profile();
        p.layers.pop();
        assert!(p.validate().is_err());
    }
}

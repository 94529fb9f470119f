//! Planted ReLU sparsity: the shift in dimension 0 of the embeddings, the gate rows' weights on
//! it, and the low-rank structure of planted gate rows (see the module doc of `synthetic`).

use super::layout::norm_weights;
use super::model::Planned;
use super::noise::{mix, normal_quantile, Noise};
use super::{SyntheticModel, SyntheticSpec};
use crate::gguf::GgufError;

/// The value every token embedding holds in dimension 0 when ReLU sparsity is planted.
const SHIFT_DIM: f32 = 24.0;

/// Columns of a planted gate row that hold only the shift weight.
const SHIFT_BLOCK: usize = 32;

/// Planted gates: per layer this many shared random directions of the input space ...
pub const GATE_DIRECTIONS: usize = 32;
/// ... each gate row a random combination of this many of them ...
const DIRECTIONS_PER_ROW: usize = 4;
/// ... plus isotropic noise carrying this share of the row's variance (the default of
/// [`SyntheticSpec::gate_noise_share`]). Real ReLU models' activity is predictable from the
/// layer input by low-rank predictors (Deja Vu, arXiv 2310.17157; PowerInfer, arXiv
/// 2312.12456) but not perfectly; no paper gives a share to copy. Set so that `conductor
/// profile`'s predictors on the TurboSparse-Mistral-7B shape land near ProSparse's published
/// operating point (arXiv 2402.13516, Table 2: 91–93% recall with 75–79% of neurons predicted
/// inactive at 88–89% sparsity): random weights, measured in docs/benchmarks.md.
pub const GATE_NOISE_SHARE: f32 = 0.25;

/// What a matrix is to the residual stream, for the shift's rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// Token embeddings: dimension 0 carries the shift.
    Embedding,
    /// Layer `l`'s FFN gate: column 0 holds the shift's weight.
    Gate(u32),
    /// Reads the normed input (q, k, v, up, router, output).
    Reads,
    /// Writes the residual stream (attention output, down).
    Writes,
}

/// How ReLU sparsity is planted.
pub(super) enum Shift {
    None,
    /// [`SyntheticSpec::relu_active_share`]: this weight in every gate row's column 0.
    Uniform(f32),
    Planted(Box<Planted>),
}

pub(super) struct Planted {
    /// Per layer and neuron, the normal quantile Φ⁻¹(1 − p) its pre-activation must pass.
    z: Vec<Vec<f32>>,
    /// Per layer, [`GATE_DIRECTIONS`] directions of `n_embd` N(0, 1) values.
    directions: Vec<Vec<f32>>,
    /// Per layer, the FFN norm's weights.
    norms: Vec<Vec<f32>>,
    /// [`SyntheticSpec::gate_noise_share`].
    noise_share: f32,
    seed: u64,
}

impl Planted {
    /// Makes gate row `row` of layer `l` (holding N(0, std²) noise) low-rank plus noise, and
    /// sets its shift weight for its neuron's frequency.
    fn gate_row(&self, l: u32, row: u64, std: f32, values: &mut [f32]) {
        let cols = values.len();
        let dirs = &self.directions[l as usize];
        let mut pick = Noise(mix(self.seed ^ (u64::from(l) << 40) ^ row.rotate_left(17)));
        let mut chosen = [(0usize, 0f32); DIRECTIONS_PER_ROW];
        let mut sq = 0f32;
        for k in 0..DIRECTIONS_PER_ROW {
            let d = loop {
                pick.step();
                let d = (pick.0 % GATE_DIRECTIONS as u64) as usize;
                if chosen[..k].iter().all(|c| c.0 != d) {
                    break d;
                }
            };
            let c = pick.normal(1.0);
            sq += c * c;
            chosen[k] = (d, c);
        }
        // Unit-variance entries in the combination, so the row keeps deviation `std`.
        let low = (1.0 - self.noise_share).sqrt() * std / sq.max(1e-12).sqrt();
        let iso = self.noise_share.sqrt();
        for v in values.iter_mut() {
            *v *= iso;
        }
        for &(d, c) in &chosen {
            let dir = &dirs[d * cols..(d + 1) * cols];
            for (v, u) in values.iter_mut().zip(dir) {
                *v += low * c * u;
            }
        }
        // The neuron fires when Σ_{j≥1} g_j γ_j h_j > w γ_0 h_0 (the RMS norm's scale cancels):
        // with the residual's other dimensions of unit variance (the embeddings'; layers add
        // little, see `out_scale`), the left side is N(0, Σ (g_j γ_j)²) over tokens.
        // The rest of the first 32 columns is zero, so the shift weight is the largest value of
        // its quantization block and is stored exactly (Q4_0, Q4_1 and Q8_0 blocks are 32).
        values[1..cols.min(SHIFT_BLOCK)].fill(0.0);
        let gamma = &self.norms[l as usize];
        let rest: f32 = values[1..]
            .iter()
            .zip(&gamma[1..])
            .map(|(g, y)| (g * y) * (g * y))
            .sum();
        let z = self.z[l as usize][row as usize];
        values[0] = -z * rest.sqrt() / (gamma[0] * SHIFT_DIM);
    }
}

impl SyntheticModel {
    pub(super) fn shift(spec: &SyntheticSpec) -> Result<Shift, GgufError> {
        let Some(freq) = &spec.ffn_frequencies else {
            // One weight w0 for every gate row: dimension 0 of every embedding holds SHIFT_DIM
            // and the other dimensions ~N(0, 1); after the RMS norm x0 = SHIFT_DIM / rms and
            // the rest of gate · x is ~N(0, (n_embd − 1) / n_embd / rms²) (gate rows
            // ~N(0, 1 / n_embd)). A weight −w0 on dimension 0 with w0 · x0 = z · that deviation
            // leaves a share p above zero, z the normal quantile (from a logistic
            // approximation).
            return Ok(match spec.relu_active_share {
                Some(p) => {
                    let p = p.clamp(0.001, 0.999);
                    let z = ((1.0 - p) / p).ln() / 1.702;
                    let embd = spec.n_embd as f32;
                    Shift::Uniform(z * ((embd - 1.0) / embd).sqrt() / SHIFT_DIM)
                }
                None => Shift::None,
            });
        };
        let per_layer = spec.n_ff as usize * spec.n_expert.max(1) as usize;
        if freq.len() != spec.n_layer as usize || freq.iter().any(|l| l.len() != per_layer) {
            return Err(GgufError::InvalidMetadata {
                key: "ffn_frequencies".into(),
                reason: format!(
                    "need {} layers of {per_layer} neurons, got {} layers of {:?}",
                    spec.n_layer,
                    freq.len(),
                    freq.iter().map(Vec::len).max()
                ),
            });
        }
        let cols = spec.n_embd as usize;
        let directions = (0..spec.n_layer)
            .map(|l| {
                let mut noise = Noise(mix(spec.seed ^ 0x6469_7273 ^ u64::from(l) << 32));
                (0..GATE_DIRECTIONS * cols)
                    .map(|_| noise.normal(1.0))
                    .collect()
            })
            .collect();
        let z = freq
            .iter()
            .map(|layer| {
                layer
                    .iter()
                    .map(|&p| normal_quantile(1.0 - f64::from(p).clamp(1e-4, 1.0 - 1e-4)) as f32)
                    .collect()
            })
            .collect();
        let norms = (0..spec.n_layer)
            .map(|l| norm_weights(Some(l), spec.n_embd))
            .collect();
        if !(0.0..=1.0).contains(&spec.gate_noise_share) {
            return Err(GgufError::InvalidMetadata {
                key: "gate_noise_share".into(),
                reason: format!("{} is not a share within 0..=1", spec.gate_noise_share),
            });
        }
        Ok(Shift::Planted(Box::new(Planted {
            z,
            directions,
            norms,
            noise_share: spec.gate_noise_share,
            seed: spec.seed,
        })))
    }

    /// Applies the shift's rules to row `r` of a random tensor.
    pub(super) fn shape_row(&self, role: Role, r: u64, p: &Planned, std: f32, row: &mut [f32]) {
        match (&self.shift, role) {
            (Shift::None, _) => {}
            (_, Role::Embedding) => row[0] = SHIFT_DIM,
            (Shift::Uniform(w0), Role::Gate(_)) => row[0] = -w0,
            (Shift::Uniform(_), _) => {}
            (Shift::Planted(g), Role::Gate(l)) => g.gate_row(l, r, std, row),
            // Dimension 0 is the gates' alone: nothing else reads it, no layer writes it.
            (Shift::Planted(_), Role::Reads) => row[0] = 0.0,
            (Shift::Planted(_), Role::Writes) => {
                if r.is_multiple_of(p.per_matrix) {
                    row.fill(0.0);
                }
            }
        }
    }
}

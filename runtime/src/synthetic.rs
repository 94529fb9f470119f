//! Llama-family models with random weights, written as GGUF.
//!
//! For format, kernel, scheduling and speed tests on shapes and types the default model does
//! not have. Random weights say nothing about quality; never use them for quality claims.
//!
//! Small models are built in memory ([`synthetic_model`]). Models of any size stream to a file
//! in bounded memory through [`SyntheticModel`]: its header, then its tensors' data chunk by
//! chunk ([`SyntheticModel::chunks`], [`SyntheticModel::chunk_data`]). Every chunk is made from
//! the spec alone (the noise stream jumps to the chunk's first value), so chunks can be made in
//! any order or in parallel and the file is the same bytes either way, and the same as the
//! in-memory model's.
//!
//! ReLU sparsity is planted through a constant in dimension 0 of every token embedding: a gate
//! row's weight on it shifts that neuron's pre-activation below zero for all but a share of
//! tokens. Two ways:
//! - [`SyntheticSpec::relu_active_share`]: one weight for every neuron, so about that share
//!   of neurons fires, uniformly (no hot set).
//! - [`SyntheticSpec::ffn_frequencies`]: each neuron its own weight, set from its own gate
//!   row so that it fires in about its given share of tokens (a hot set, as real ReLU models
//!   have). Dimension 0 is then a private channel from the embeddings to the gates: every other
//!   matrix ignores it and no layer writes it, so it reaches every layer unchanged and the
//!   planted shares hold through depth. The gate rows are low-rank plus noise (see
//!   [`GATE_DIRECTIONS`]), so a low-rank predictor of the layer's input can predict activity,
//!   as it can in real ReLU models.

use std::ops::Range;

use crate::gguf::{Array, GgufError, GgufWriter, TensorDataWriter, Value};
use crate::plan::FfnActivation;
use crate::quant::{quantize_row, GgmlType};

/// What to generate.
#[derive(Clone, Debug)]
pub struct SyntheticSpec {
    /// `llama` or `qwen2` (q/k/v biases, NeoX RoPE).
    pub arch: &'static str,
    /// Written as `general.name` = `synthetic-NAME` (`None`: the architecture).
    pub name: Option<String>,
    pub n_layer: u32,
    pub n_embd: u32,
    /// FFN width (of each expert, in a mixture of experts).
    pub n_ff: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    /// At least 300 (byte tokens, special tokens and some merges).
    pub n_vocab: u32,
    pub n_ctx: u32,
    /// Type of the attention and FFN matrices.
    pub weight_type: GgmlType,
    /// Type of the token embeddings (and of the output when tied).
    pub embd_type: GgmlType,
    /// Type of the output projection when not tied (`None`: `embd_type`).
    pub output_type: Option<GgmlType>,
    /// Use the embeddings as the output projection.
    pub tied_output: bool,
    pub activation: FfnActivation,
    /// ReLU models: the share of FFN neurons that should fire per token (e.g. 0.1 for the
    /// ~90% natural sparsity of ReluLLaMA-like models), the same for every neuron. Every token
    /// embedding gets a large constant in dimension 0 and every gate row a negative weight
    /// there, which shifts gate · x below zero for all but about this share. `None`: unshifted
    /// (about half fire).
    pub relu_active_share: Option<f32>,
    /// ReLU models: per layer and neuron (in a mixture of experts expert after expert,
    /// `n_expert · n_ff` per layer), the share of tokens in which it fires (given, in a mixture
    /// of experts, that its expert was chosen). Planted per neuron (see the module doc);
    /// overrides `relu_active_share`.
    pub ffn_frequencies: Option<Vec<Vec<f32>>>,
    /// A Mixtral-style mixture of experts when above 0: `n_expert` experts of `n_ff` neurons
    /// each (`ffn_gate_inp`, `ffn_{gate,up,down}_exps`), `n_expert_used` chosen per token.
    pub n_expert: u32,
    pub n_expert_used: u32,
    pub seed: u64,
}

impl Default for SyntheticSpec {
    fn default() -> Self {
        SyntheticSpec {
            arch: "llama",
            name: None,
            n_layer: 2,
            n_embd: 64,
            n_ff: 128,
            n_head: 4,
            n_head_kv: 2,
            n_vocab: 320,
            n_ctx: 256,
            weight_type: GgmlType::Q4_1,
            embd_type: GgmlType::Q8_0,
            output_type: None,
            tied_output: true,
            activation: FfnActivation::Silu,
            relu_active_share: None,
            ffn_frequencies: None,
            n_expert: 0,
            n_expert_used: 0,
            seed: 1,
        }
    }
}

/// Deterministic normal-ish noise (sum of uniforms), independent of any crate's RNG versions.
struct Noise(u64);

impl Noise {
    /// xorshift64: linear over GF(2), so it can jump ahead ([`Jumps`]).
    fn step(&mut self) {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
    }

    fn uniform(&mut self) -> f32 {
        self.step();
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }

    /// Four steps of the stream.
    fn normal(&mut self, std: f32) -> f32 {
        (self.uniform() + self.uniform() + self.uniform() + self.uniform()) * std * 1.732
    }
}

/// Steps of the noise stream one normal value takes.
const STEPS_PER_NORMAL: u64 = 4;

/// A 64×64 matrix over GF(2): entry `i` is the image of bit `i`.
type Gf2 = [u64; 64];

fn gf2_apply(m: &Gf2, mut v: u64) -> u64 {
    let mut r = 0;
    while v != 0 {
        r ^= m[v.trailing_zeros() as usize];
        v &= v - 1;
    }
    r
}

/// The noise step raised to every power of two: jumping `n` steps costs one matrix-vector
/// product per set bit of `n`, however far.
struct Jumps(Vec<Gf2>);

impl Jumps {
    fn new() -> Self {
        let mut step = [0u64; 64];
        for (i, m) in step.iter_mut().enumerate() {
            let mut n = Noise(1 << i);
            n.step();
            *m = n.0;
        }
        let mut powers = vec![step];
        for k in 1..64 {
            let p = &powers[k - 1];
            let mut sq = [0u64; 64];
            for (s, &col) in sq.iter_mut().zip(p.iter()) {
                *s = gf2_apply(p, col);
            }
            powers.push(sq);
        }
        Jumps(powers)
    }

    fn jump(&self, mut state: u64, steps: u64) -> u64 {
        for (k, m) in self.0.iter().enumerate() {
            if steps >> k & 1 == 1 {
                state = gf2_apply(m, state);
            }
        }
        state
    }
}

/// splitmix64 of a key: seeds for the per-layer and per-row streams of planted gates.
fn mix(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

/// The standard normal quantile Φ⁻¹(p), 0 < p < 1 (Acklam's rational approximation, relative
/// error below 1.2e-9).
fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// GPT-2's byte ↔ printable-character map (bytes that are not printable ASCII/Latin-1 are
/// shifted past 255), so that every byte is a token.
pub fn byte_to_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        return b as char;
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).expect("valid char")
}

/// The value every token embedding holds in dimension 0 when ReLU sparsity is planted.
const SHIFT_DIM: f32 = 24.0;

/// Columns of a planted gate row that hold only the shift weight.
const SHIFT_BLOCK: usize = 32;

/// Planted gates: per layer this many shared random directions of the input space ...
pub const GATE_DIRECTIONS: usize = 32;
/// ... each gate row a random combination of this many of them ...
const DIRECTIONS_PER_ROW: usize = 4;
/// ... plus isotropic noise carrying this share of the row's variance. An assumption, not a
/// measured figure: real ReLU models' activity is predictable from the layer input by
/// low-rank predictors (Deja Vu, arXiv 2310.17157; PowerInfer, arXiv 2312.12456) but not
/// perfectly; no paper gives a share to copy, and it is not tuned to any predictor's score.
const GATE_NOISE_SHARE: f32 = 0.25;

/// What a matrix is to the residual stream, for the shift's rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Token embeddings: dimension 0 carries the shift.
    Embedding,
    /// Layer `l`'s FFN gate: column 0 holds the shift's weight.
    Gate(u32),
    /// Reads the normed input (q, k, v, up, router, output).
    Reads,
    /// Writes the residual stream (attention output, down).
    Writes,
}

/// How one tensor's values are made.
#[derive(Clone, Debug)]
enum Values {
    /// Given (norm weights, biases), written as F32.
    Given(Vec<f32>),
    /// Noise of deviation `std`, row after row from value `at` of the noise stream, then
    /// shaped by the shift's rules for `role`.
    Random { at: u64, std: f32, role: Role },
}

#[derive(Clone, Debug)]
struct Planned {
    /// Rows of all experts together; a vector is one row.
    rows: u64,
    cols: usize,
    /// Rows of one expert's matrix.
    per_matrix: u64,
    ty: GgmlType,
    values: Values,
}

/// How ReLU sparsity is planted.
enum Shift {
    None,
    /// [`SyntheticSpec::relu_active_share`]: this weight in every gate row's column 0.
    Uniform(f32),
    Planted(Box<Planted>),
}

struct Planted {
    /// Per layer and neuron, the normal quantile Φ⁻¹(1 − p) its pre-activation must pass.
    z: Vec<Vec<f32>>,
    /// Per layer, [`GATE_DIRECTIONS`] directions of `n_embd` N(0, 1) values.
    directions: Vec<Vec<f32>>,
    /// Per layer, the FFN norm's weights.
    norms: Vec<Vec<f32>>,
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
        let low = (1.0 - GATE_NOISE_SHARE).sqrt() * std / sq.max(1e-12).sqrt();
        let iso = GATE_NOISE_SHARE.sqrt();
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

/// A piece of one tensor's data: rows `rows` of tensor `tensor` (in file order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub tensor: usize,
    pub rows: Range<u64>,
}

/// A model ready to be written: its header and how to make each tensor's data.
pub struct SyntheticModel {
    header: GgufWriter,
    planned: Vec<Planned>,
    start: u64,
    jumps: Jumps,
    shift: Shift,
}

/// Weights of norm `layer` (`None`: the output norm's, all 1).
fn norm_weights(layer: Option<u32>, k: u32) -> Vec<f32> {
    match layer {
        Some(i) => (0..k)
            .map(|j| 1.0 + 0.1 * ((j * 7 + i) % 5) as f32 / 5.0)
            .collect(),
        None => vec![1.0; k as usize],
    }
}

/// Collects the header and the plan, tensor after tensor.
struct Builder {
    w: GgufWriter,
    planned: Vec<Planned>,
    /// Noise values used so far.
    at: u64,
}

impl Builder {
    /// `experts` matrices of `rows × cols` (one when 0), written 3-D for a mixture of experts.
    #[allow(clippy::too_many_arguments)]
    fn matrix(
        &mut self,
        name: &str,
        rows: u32,
        cols: u32,
        ty: GgmlType,
        std: f32,
        experts: u32,
        role: Role,
    ) -> Result<(), GgufError> {
        let dims = match experts {
            0 => vec![u64::from(cols), u64::from(rows)],
            e => vec![u64::from(cols), u64::from(rows), u64::from(e)],
        };
        self.w.add_tensor_info(name, dims, ty)?;
        let all = u64::from(rows) * u64::from(experts.max(1));
        self.planned.push(Planned {
            rows: all,
            cols: cols as usize,
            per_matrix: u64::from(rows),
            ty,
            values: Values::Random {
                at: self.at,
                std,
                role,
            },
        });
        self.at += all * u64::from(cols);
        Ok(())
    }

    fn vector(&mut self, name: &str, values: Vec<f32>) -> Result<(), GgufError> {
        self.w
            .add_tensor_info(name, vec![values.len() as u64], GgmlType::F32)?;
        self.planned.push(Planned {
            rows: 1,
            cols: values.len(),
            per_matrix: 1,
            ty: GgmlType::F32,
            values: Values::Given(values),
        });
        Ok(())
    }
}

impl SyntheticModel {
    /// Lays the model out: metadata, tensor descriptors, and how each tensor's data is made.
    pub fn new(spec: &SyntheticSpec) -> Result<Self, GgufError> {
        let mut w = GgufWriter::new();
        let arch = spec.arch;
        let u32v = |v: u32| Value::U32(v);
        let head_dim = spec.n_embd / spec.n_head;
        let name = spec.name.as_deref().unwrap_or(arch);
        w.add_metadata("general.architecture", Value::String(arch.into()))?;
        w.add_metadata("general.name", Value::String(format!("synthetic-{name}")))?;
        w.add_metadata(format!("{arch}.block_count"), u32v(spec.n_layer))?;
        w.add_metadata(format!("{arch}.context_length"), u32v(spec.n_ctx))?;
        w.add_metadata(format!("{arch}.embedding_length"), u32v(spec.n_embd))?;
        w.add_metadata(format!("{arch}.feed_forward_length"), u32v(spec.n_ff))?;
        w.add_metadata(format!("{arch}.attention.head_count"), u32v(spec.n_head))?;
        w.add_metadata(
            format!("{arch}.attention.head_count_kv"),
            u32v(spec.n_head_kv),
        )?;
        w.add_metadata(format!("{arch}.rope.freq_base"), Value::F32(10_000.0))?;
        w.add_metadata(
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-5),
        )?;
        w.add_metadata(format!("{arch}.vocab_size"), u32v(spec.n_vocab))?;
        if spec.activation == FfnActivation::Relu {
            w.add_metadata(
                format!("{arch}.activation_function"),
                Value::String("relu".into()),
            )?;
        }
        if spec.n_expert > 0 {
            w.add_metadata(format!("{arch}.expert_count"), u32v(spec.n_expert))?;
            w.add_metadata(
                format!("{arch}.expert_used_count"),
                u32v(spec.n_expert_used),
            )?;
        }
        add_vocab(&mut w, spec.n_vocab)?;

        let shift = Self::shift(spec)?;
        let mut b = Builder {
            w,
            planned: Vec::new(),
            at: 0,
        };
        let (embd, ff) = (spec.n_embd, spec.n_ff);
        let q = spec.n_head * head_dim;
        let kv = spec.n_head_kv * head_dim;
        let wt = spec.weight_type;
        // Scales keep activations O(1) through the layers (≈ 1/sqrt(fan-in)).
        let s_in = 1.0 / (embd as f32).sqrt();
        let s_ff = 1.0 / (ff as f32).sqrt();
        // With the ReLU shift, layers add less to the residual stream, so the shifted dimension
        // keeps its share of the norm (and the sparsity stays near its target) through depth.
        let out_scale = if matches!(shift, Shift::None) {
            1.0
        } else {
            0.2
        };
        let reads = Role::Reads;
        b.matrix(
            "token_embd.weight",
            spec.n_vocab,
            embd,
            spec.embd_type,
            1.0,
            0,
            Role::Embedding,
        )?;
        for i in 0..spec.n_layer {
            let n = |t: &str| format!("blk.{i}.{t}");
            b.vector(&n("attn_norm.weight"), norm_weights(Some(i), embd))?;
            b.matrix(&n("attn_q.weight"), q, embd, wt, s_in, 0, reads)?;
            b.matrix(&n("attn_k.weight"), kv, embd, wt, s_in, 0, reads)?;
            b.matrix(&n("attn_v.weight"), kv, embd, wt, s_in, 0, reads)?;
            let out = s_in * out_scale;
            b.matrix(&n("attn_output.weight"), embd, q, wt, out, 0, Role::Writes)?;
            if arch == "qwen2" {
                for (t, len) in [("attn_q.bias", q), ("attn_k.bias", kv), ("attn_v.bias", kv)] {
                    let bias = (0..len).map(|j| ((j % 7) as f32 - 3.0) * 0.05).collect();
                    b.vector(&n(t), bias)?;
                }
            }
            b.vector(&n("ffn_norm.weight"), norm_weights(Some(i), embd))?;
            let e = spec.n_expert;
            if e > 0 {
                // Router logits of spread ~2 make clear choices, yet every expert gets chosen.
                let name = n("ffn_gate_inp.weight");
                b.matrix(&name, e, embd, GgmlType::F32, 2.0 * s_in, 0, reads)?;
            }
            let names = match e {
                0 => ["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"],
                _ => [
                    "ffn_gate_exps.weight",
                    "ffn_up_exps.weight",
                    "ffn_down_exps.weight",
                ],
            };
            b.matrix(&n(names[0]), ff, embd, wt, s_in, e, Role::Gate(i))?;
            b.matrix(&n(names[1]), ff, embd, wt, s_in, e, reads)?;
            let down = s_ff * out_scale;
            b.matrix(&n(names[2]), embd, ff, wt, down, e, Role::Writes)?;
        }
        b.vector("output_norm.weight", norm_weights(None, embd))?;
        if !spec.tied_output {
            let ty = spec.output_type.unwrap_or(spec.embd_type);
            b.matrix("output.weight", spec.n_vocab, embd, ty, s_in, 0, reads)?;
        }
        Ok(SyntheticModel {
            header: b.w,
            planned: b.planned,
            start: spec.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            jumps: Jumps::new(),
            shift,
        })
    }

    fn shift(spec: &SyntheticSpec) -> Result<Shift, GgufError> {
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
        Ok(Shift::Planted(Box::new(Planted {
            z,
            directions,
            norms,
            seed: spec.seed,
        })))
    }

    /// The header: metadata and tensor descriptors, no data.
    pub fn header(&self) -> &GgufWriter {
        &self.header
    }

    /// Bytes of all tensor data (without alignment padding).
    pub fn data_bytes(&self) -> u64 {
        self.header.tensors().iter().map(|t| t.n_bytes).sum()
    }

    /// The data in file order, cut into chunks of whole rows of at most `max_bytes` each (a
    /// row larger than that is a chunk alone).
    pub fn chunks(&self, max_bytes: u64) -> Vec<Chunk> {
        let mut out = Vec::new();
        for (tensor, (p, t)) in self.planned.iter().zip(self.header.tensors()).enumerate() {
            let row_bytes = t.n_bytes / p.rows;
            let per = (max_bytes / row_bytes.max(1)).max(1);
            let mut r = 0;
            while r < p.rows {
                let end = (r + per).min(p.rows);
                out.push(Chunk {
                    tensor,
                    rows: r..end,
                });
                r = end;
            }
        }
        out
    }

    /// The bytes of `chunk`, as they are in the file.
    pub fn chunk_data(&self, chunk: &Chunk) -> Vec<u8> {
        let p = &self.planned[chunk.tensor];
        let row_bytes =
            p.ty.bytes_for(p.cols as u64)
                .expect("checked by the header") as usize;
        let n_rows = (chunk.rows.end - chunk.rows.start) as usize;
        let mut out = vec![0u8; n_rows * row_bytes];
        let (at, std, role) = match &p.values {
            Values::Given(v) => {
                for (d, s) in out.chunks_exact_mut(4).zip(v) {
                    d.copy_from_slice(&s.to_le_bytes());
                }
                return out;
            }
            Values::Random { at, std, role } => (*at, *std, *role),
        };
        let first = at + chunk.rows.start * p.cols as u64;
        let mut noise = Noise(self.jumps.jump(self.start, first * STEPS_PER_NORMAL));
        let mut row = vec![0f32; p.cols];
        for (r, dst) in chunk.rows.clone().zip(out.chunks_exact_mut(row_bytes)) {
            for v in row.iter_mut() {
                *v = noise.normal(std);
            }
            self.shape_row(role, r, p, std, &mut row);
            quantize_row(p.ty, &row, dst).expect("quantizable type");
        }
        out
    }

    /// Applies the shift's rules to row `r` of a random tensor.
    fn shape_row(&self, role: Role, r: u64, p: &Planned, std: f32, row: &mut [f32]) {
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

    /// Writes every tensor's data in order, `progress(done, total)` in bytes after each chunk.
    pub fn write_data<W: std::io::Write>(
        &self,
        stream: &mut TensorDataWriter<'_, W>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(), GgufError> {
        let total = self.data_bytes();
        let mut done = 0;
        for c in self.chunks(CHUNK_BYTES) {
            let data = self.chunk_data(&c);
            stream.write_chunk(&data)?;
            done += data.len() as u64;
            progress(done, total);
        }
        Ok(())
    }
}

/// Default chunk size: a few MiB of values in flight per chunk.
pub const CHUNK_BYTES: u64 = 2 << 20;

/// Builds the model in memory; write it with [`GgufWriter::write_file_atomic`] or `to_bytes`.
/// For large models use [`SyntheticModel`], which streams.
pub fn synthetic_model(spec: &SyntheticSpec) -> Result<GgufWriter, GgufError> {
    let model = SyntheticModel::new(spec)?;
    let header = model.header();
    let mut w = GgufWriter::new();
    for (k, v) in header.metadata() {
        w.add_metadata(k.clone(), v.clone())?;
    }
    let mut chunks = model.chunks(u64::MAX).into_iter();
    for t in header.tensors() {
        let c = chunks.next().expect("one chunk per tensor");
        w.add_tensor(t.name.clone(), t.dims.clone(), t.ty, model.chunk_data(&c))?;
    }
    Ok(w)
}

/// A byte-level BPE vocabulary: 256 byte tokens, two control tokens, then merged pairs of
/// lowercase letters (each with its merge rule) up to `n_vocab`.
fn add_vocab(w: &mut GgufWriter, n_vocab: u32) -> Result<(), GgufError> {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_to_char(b).to_string()).collect();
    let mut types = vec![1i32; 256];
    tokens.push("<|endoftext|>".into());
    tokens.push("<|im_end|>".into());
    types.extend([3, 3]);
    let mut merges = Vec::new();
    'outer: for a in b'a'..=b'z' {
        for b in b'a'..=b'z' {
            if tokens.len() >= n_vocab as usize {
                break 'outer;
            }
            tokens.push(format!("{}{}", a as char, b as char));
            types.push(1);
            merges.push(format!("{} {}", a as char, b as char));
        }
    }
    while tokens.len() < n_vocab as usize {
        tokens.push(format!("<|unused{}|>", tokens.len()));
        types.push(5);
    }
    w.add_metadata("tokenizer.ggml.model", Value::String("gpt2".into()))?;
    w.add_metadata("tokenizer.ggml.pre", Value::String("gpt-2".into()))?;
    w.add_metadata("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))?;
    w.add_metadata("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))?;
    w.add_metadata("tokenizer.ggml.merges", Value::Array(Array::String(merges)))?;
    w.add_metadata("tokenizer.ggml.eos_token_id", Value::U32(256))?;
    w.add_metadata("tokenizer.ggml.bos_token_id", Value::U32(256))?;
    w.add_metadata("tokenizer.ggml.add_bos_token", Value::Bool(false))?;
    w.add_metadata(
        "tokenizer.chat_template",
        Value::String(
            "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}\
             {% if add_generation_prompt %}assistant: {% endif %}"
                .into(),
        ),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests;

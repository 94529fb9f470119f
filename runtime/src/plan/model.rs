//! What the scheduler, the simulator and the planner know of a model: its dimensions and the
//! storage types of its matrices — never its weights.

use crate::quant::GgmlType;
use serde::{Deserialize, Serialize};

/// The dimensions of a model that the scheduler and the simulator need (no weights).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelShape {
    pub n_layer: u32,
    pub n_embd: u32,
    pub n_ff: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    pub n_vocab: u32,
    /// FFN neuron clusters must be a multiple of this many neurons: the block size of the down
    /// projection's quant type, whose columns a cluster owns.
    pub ffn_granule: u32,
    /// Neurons per bundle of a neuron store (FFN clusters are exactly its bundles); 0 for an
    /// ordinary model.
    #[serde(default)]
    pub ffn_bundle: u32,
    /// Bytes from one bundle to the next in a neuron store (one bundle read, padding
    /// included); 0 for an ordinary model.
    #[serde(default)]
    pub ffn_bundle_stride: u64,
    /// Bytes of a bundle's gate rows (they come first in it): what gate-first loading reads
    /// before the rest; 0 for an ordinary model.
    #[serde(default)]
    pub ffn_bundle_gate_bytes: u64,
    /// Experts of a mixture-of-experts FFN (0: a dense FFN). The layer's `n_ff` neurons are
    /// the experts' neurons side by side: expert `e` owns neurons
    /// `e * n_ff / n_expert .. (e + 1) * n_ff / n_expert`, so experts go through the same
    /// clusters, cache and pipeline as a dense FFN's neurons.
    #[serde(default)]
    pub n_expert: u32,
    /// Experts the router picks for each token (its top k); 0 for a dense FFN.
    #[serde(default)]
    pub n_expert_used: u32,
}

/// The largest width of a model (embedding, FFN, heads, head size, vocabulary, and the
/// products heads x head size): far above any real model, far below what would make
/// `rows * cols` overflow.
pub const MAX_DIM: u32 = 1 << 20;
/// The most layers a model may have.
pub const MAX_LAYERS: u32 = 4096;
/// The most experts a layer may have: above every released MoE model (DeepSeek-V3: 256).
pub const MAX_EXPERTS: u32 = 256;

impl ModelShape {
    /// Checks the upper bounds of a shape that came from outside (a trace, a description
    /// file): every width within [`MAX_DIM`], heads x head size too, layers and experts
    /// within theirs, so that the scheduler's and the simulator's arithmetic cannot overflow.
    /// The error names the field.
    pub fn check_limits(&self) -> Result<(), String> {
        let widths = [
            ("n_embd", u64::from(self.n_embd)),
            ("n_ff", u64::from(self.n_ff)),
            ("n_head", u64::from(self.n_head)),
            ("n_head_kv", u64::from(self.n_head_kv)),
            ("head_dim", u64::from(self.head_dim)),
            ("n_vocab", u64::from(self.n_vocab)),
            ("ffn_granule", u64::from(self.ffn_granule)),
            ("ffn_bundle", u64::from(self.ffn_bundle)),
            (
                "n_head x head_dim",
                u64::from(self.n_head) * u64::from(self.head_dim),
            ),
            (
                "n_head_kv x head_dim",
                u64::from(self.n_head_kv) * u64::from(self.head_dim),
            ),
        ];
        for (field, v) in widths {
            if v > u64::from(MAX_DIM) {
                return Err(format!("model shape `{field}` is {v}, above {MAX_DIM}"));
            }
        }
        if self.n_layer > MAX_LAYERS {
            return Err(format!(
                "model shape `n_layer` is {}, above {MAX_LAYERS}",
                self.n_layer
            ));
        }
        if self.n_expert > MAX_EXPERTS || self.n_expert_used > self.n_expert {
            return Err(format!(
                "model shape: {} experts ({} used) is outside 0..={MAX_EXPERTS}",
                self.n_expert, self.n_expert_used
            ));
        }
        Ok(())
    }

    /// Neurons of one expert (the whole FFN for a dense model).
    pub fn ffn_per_expert(&self) -> u32 {
        self.n_ff / self.n_expert.max(1)
    }

    /// Whether the FFN is a mixture of experts.
    pub fn is_moe(&self) -> bool {
        self.n_expert > 0
    }
}

/// Storage types of a layer's matrices and of the output projection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightTypes {
    pub attn_q: GgmlType,
    pub attn_k: GgmlType,
    pub attn_v: GgmlType,
    pub attn_out: GgmlType,
    pub ffn_gate: GgmlType,
    pub ffn_up: GgmlType,
    pub ffn_down: GgmlType,
    pub output: GgmlType,
}

/// A model as the simulator and the planner see it: a name, a shape and the weight types.
/// Built from a GGUF file (`Model::description`) or a named shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelDescription {
    pub name: String,
    pub shape: ModelShape,
    pub types: WeightTypes,
}

impl ModelDescription {
    /// Bytes of one row of `cols` elements stored as `ty` (0 if not whole blocks).
    pub fn row_bytes(ty: GgmlType, cols: u32) -> u64 {
        ty.bytes_for(u64::from(cols)).unwrap_or(0)
    }

    /// Bytes of one layer's attention matrices (q, k, v and the output projection).
    pub fn attention_bytes_per_layer(&self) -> u64 {
        self.attention_matrix_bytes().iter().sum()
    }

    /// Bytes of each of one layer's attention matrices: q, k, v, the output projection (the
    /// order of a streamed layer's attention units).
    pub fn attention_matrix_bytes(&self) -> [u64; 4] {
        let s = &self.shape;
        let t = &self.types;
        // In u64: a shape from a file is not yet checked here, and a u32 product could wrap.
        let q = u64::from(s.n_head) * u64::from(s.head_dim);
        let kv = u64::from(s.n_head_kv) * u64::from(s.head_dim);
        [
            q * Self::row_bytes(t.attn_q, s.n_embd),
            kv * Self::row_bytes(t.attn_k, s.n_embd),
            kv * Self::row_bytes(t.attn_v, s.n_embd),
            u64::from(s.n_embd) * Self::row_bytes(t.attn_out, s.n_head.saturating_mul(s.head_dim)),
        ]
    }

    /// Bytes of one layer's MoE router (`n_expert` rows of `n_embd` f32 values; 0 for a dense
    /// FFN).
    pub fn router_bytes_per_layer(&self) -> u64 {
        u64::from(self.shape.n_expert) * u64::from(self.shape.n_embd) * 4
    }

    /// Bytes of every weight a decode token reads when it is dense: all layers' matrices and the
    /// output projection.
    pub fn dense_weight_bytes(&self) -> u64 {
        let s = &self.shape;
        let t = &self.types;
        let per_layer = self.attention_bytes_per_layer()
            + u64::from(s.n_ff) * Self::row_bytes(t.ffn_gate, s.n_embd)
            + u64::from(s.n_ff) * Self::row_bytes(t.ffn_up, s.n_embd)
            + u64::from(s.n_embd) * Self::row_bytes(t.ffn_down, s.n_ff)
            + self.router_bytes_per_layer();
        per_layer * u64::from(s.n_layer)
            + u64::from(s.n_vocab) * Self::row_bytes(t.output, s.n_embd)
    }
}

/// The nonlinearity of the FFN's gate (`act(gate) * up`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnActivation {
    /// SwiGLU: most llama-family models.
    Silu,
    /// ReLU: ReluLLaMA, ProSparse, TurboSparse — naturally sparse.
    Relu,
    /// GeGLU with the tanh approximation of GELU: Gemma.
    GeluTanh,
}

impl FfnActivation {
    /// `act(g)`, as every path (dense, sparse, profiling) computes it.
    #[inline]
    pub fn apply(self, g: f32) -> f32 {
        match self {
            FfnActivation::Silu => g / (1.0 + (-g).exp()),
            FfnActivation::Relu => g.max(0.0),
            FfnActivation::GeluTanh => gelu_tanh(g),
        }
    }
}

/// GELU with the tanh approximation, as llama.cpp's CPU backend computes it for GeGLU: 0 from
/// -10 down, the identity from 10 up, and in between the input rounded to f16 and looked up in
/// a table of f16 results (`0.5x(1 + tanh(√(2/π)·x·(1 + 0.044715x²)))` in f32, rounded).
/// Matching the rounding keeps Gemma's logits close to llama.cpp's.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        let table = GELU_F16.get_or_init(gelu_f16_table);
        half::f16::from_bits(table[half::f16::from_f32(x).to_bits() as usize]).to_f32()
    }
}

static GELU_F16: std::sync::OnceLock<Box<[u16]>> = std::sync::OnceLock::new();

/// GELU of every f16 value, rounded to f16 (128 KiB, built on first use).
fn gelu_f16_table() -> Box<[u16]> {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    (0..=u16::MAX)
        .map(|bits| {
            let x = half::f16::from_bits(bits).to_f32();
            let y = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh());
            half::f16::from_f32(y).to_bits()
        })
        .collect()
}

/// What identifies the model a profile belongs to: its shape and a checksum of its norm
/// weights and of its first token embeddings (trained values every llama-family model can
/// give, store or not).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelIdentity {
    pub arch: String,
    pub n_layer: u32,
    pub n_embd: u32,
    pub n_ff: u32,
    pub relu: bool,
    /// CRC-32 of the norm weights and the first 16 token embeddings (as f32).
    pub norms_crc32: u32,
}

impl ModelIdentity {
    /// One line naming the model: architecture, shape and checksum.
    pub fn describe(&self) -> String {
        format!(
            "{} with {} layers, n_embd {}, n_ff {}, norms CRC32 {:08x}",
            self.arch, self.n_layer, self.n_embd, self.n_ff, self.norms_crc32
        )
    }
}

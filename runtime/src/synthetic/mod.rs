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

mod arch;
mod layout;
mod model;
mod noise;
mod sparsity;
mod types;
mod vocab;

pub use arch::{arch_info, ArchInfo, RopeFactors, SlidingWindowInfo, VocabInfo, ARCHS};
pub use model::{synthetic_model, Chunk, SyntheticModel, CHUNK_BYTES};
pub use sparsity::{GATE_DIRECTIONS, GATE_NOISE_SHARE};
pub use vocab::byte_to_char;

use crate::gguf::GgufError;
use crate::plan::FfnActivation;
use crate::quant::GgmlType;

/// What to generate.
#[derive(Clone, Debug)]
pub struct SyntheticSpec {
    /// An architecture of [`ARCHS`] (`llama`, `llama3`, `qwen2`, `qwen3`, `gemma3`, `phi3`).
    pub arch: &'static str,
    /// Written as `general.name` = `synthetic-NAME` (`None`: the architecture).
    pub name: Option<String>,
    pub n_layer: u32,
    pub n_embd: u32,
    /// FFN width (of each expert, in a mixture of experts).
    pub n_ff: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    /// Head size (`None`: `n_embd / n_head`). Written as `attention.key_length` and
    /// `value_length` where the architecture has them (qwen3, gemma3).
    pub head_dim: Option<u32>,
    /// At least 300 (byte tokens, special tokens and some merges).
    pub n_vocab: u32,
    pub n_ctx: u32,
    /// Type of the attention and FFN matrices ([`TypeMix::Uniform`]).
    pub weight_type: GgmlType,
    /// Type of the token embeddings (and of the output when tied).
    pub embd_type: GgmlType,
    /// Type of the output projection when not tied (`None`: `embd_type`; [`TypeMix::Uniform`]).
    pub output_type: Option<GgmlType>,
    /// How the matrices' types are chosen.
    pub mix: TypeMix,
    /// Use the embeddings as the output projection.
    pub tied_output: bool,
    /// An untied output projection's deviation is this over √n_embd: the logits' deviation.
    /// Random models' next-token distributions are flat; a larger spread gives their argmax a
    /// margin, as a trained model's confident predictions have.
    pub logit_scale: f32,
    pub activation: FfnActivation,
    /// Sliding-window layers' window (architectures with sliding windows; `None`: the
    /// architecture's default).
    pub sliding_window: Option<u32>,
    /// Written as `attention.sliding_window_pattern`: every this-many-th layer attends to the
    /// whole context (`None`: not written, llama.cpp's default for the architecture applies).
    pub swa_period: Option<u32>,
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
    /// With `ffn_frequencies`: the share of each gate row's variance that is isotropic noise
    /// (the rest lies in [`GATE_DIRECTIONS`] shared directions a low-rank predictor can learn).
    /// Default [`GATE_NOISE_SHARE`]: set so that predictors trained by `conductor profile`
    /// land near ProSparse's published operating point.
    pub gate_noise_share: f32,
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
            head_dim: None,
            n_vocab: 320,
            n_ctx: 256,
            weight_type: GgmlType::Q4_1,
            embd_type: GgmlType::Q8_0,
            output_type: None,
            mix: TypeMix::Uniform,
            tied_output: true,
            logit_scale: 1.0,
            activation: FfnActivation::Silu,
            sliding_window: None,
            swa_period: None,
            relu_active_share: None,
            ffn_frequencies: None,
            gate_noise_share: GATE_NOISE_SHARE,
            n_expert: 0,
            n_expert_used: 0,
            seed: 1,
        }
    }
}

/// How the matrices' types are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TypeMix {
    /// `weight_type` for every attention and FFN matrix, `output_type` for the output.
    Uniform,
    /// As llama.cpp's quantizer makes a Q4_K_M file: Q4_K matrices; Q6_K for `attn_v` and
    /// `ffn_down` on the layers llama.cpp gives more bits (the first and last eighth, and every
    /// third between) and for an untied output; Q5_K for a fused `attn_qkv`; `embd_type` for
    /// the embeddings.
    Q4KM,
}

/// Sizes of [`SyntheticSpec::preset`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// Two layers, a width of 256 or 320, a 320-token vocabulary: small enough to generate
    /// and run in a test (`runtime/tests/llama_cpp_logits.rs`).
    Tiny,
    /// Eight layers at a small real model's width (Qwen2-0.5B's 896, Gemma-3-270M's 640, ...)
    /// and a 32k vocabulary: `bench/logits-vs-llama-cpp`.
    Small,
}

impl SyntheticSpec {
    /// A model of architecture `arch` in the shape `preset`, its matrices typed as a Q4_K_M
    /// file's (Q8_0 embeddings). Some widths are not multiples of 256 (gemma3's 320 and 640,
    /// qwen2's 896), so those rows take llama.cpp's fallback types.
    pub fn preset(arch: &str, preset: Preset) -> Result<SyntheticSpec, GgufError> {
        let info = arch_info(arch)?;
        let tiny = preset == Preset::Tiny;
        // (layers, width, FFN, heads, kv heads, head size, tied output)
        let (n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, tied) = match (info.name, tiny) {
            ("llama", true) => (2, 256, 512, 4, 2, None, false),
            ("llama", false) => (8, 1024, 2816, 16, 4, None, false),
            ("llama3", true) => (2, 256, 512, 4, 1, None, false),
            ("llama3", false) => (8, 1024, 3584, 16, 4, None, false),
            ("qwen2", true) => (2, 256, 512, 4, 2, None, true),
            ("qwen2", false) => (8, 896, 4864, 14, 2, None, true),
            ("qwen3", true) => (2, 256, 768, 4, 2, Some(128), true),
            ("qwen3", false) => (8, 1024, 3072, 16, 8, Some(128), true),
            ("gemma3", true) => (2, 320, 512, 2, 1, Some(128), true),
            ("gemma3", false) => (8, 640, 2048, 4, 1, Some(256), true),
            ("phi3", true) => (2, 256, 512, 4, 4, None, false),
            (_, _) => (8, 1024, 2816, 16, 16, None, false),
        };
        let (window, period) = match (info.sliding_window, tiny) {
            // Windows shorter than the tests' 65 tokens, so that they matter; two tiny layers:
            // one windowed, one global.
            (Some(_), true) => (Some(16), Some(2)),
            (Some(_), false) => (Some(32), None),
            (None, _) => (None, None),
        };
        Ok(SyntheticSpec {
            arch: info.name,
            name: Some(format!(
                "{}-{}",
                info.name,
                if tiny { "tiny" } else { "small" }
            )),
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab: if tiny { 320 } else { 32_000 },
            n_ctx: match info.rope_factors {
                RopeFactors::LongRope { .. } => 131_072,
                _ => 4096,
            },
            weight_type: GgmlType::Q4_K,
            embd_type: GgmlType::Q8_0,
            output_type: Some(GgmlType::Q6_K),
            mix: TypeMix::Q4KM,
            tied_output: tied,
            logit_scale: 4.0,
            sliding_window: window,
            swa_period: period,
            seed: 5,
            ..SyntheticSpec::default()
        })
    }
}

#[cfg(test)]
mod tests;

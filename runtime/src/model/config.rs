//! Model hyper-parameters read from GGUF metadata.

use super::ModelError;
use crate::gguf::GgufFile;
use crate::plan::{FfnActivation, ModelShape};

/// The decoder-only transformer families Conductor runs. They share one forward pass and
/// differ in RoPE layout, biases, extra norms and defaults (each difference is a field of
/// [`ModelConfig`] or an optional tensor of [`super::LayerWeights`], set from this).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 1/2/3, Mistral, SmolLM, TinyLlama, ReluLLaMA … (`general.architecture = llama`).
    Llama,
    /// Qwen2: NeoX RoPE and biases on q, k, v.
    Qwen2,
    /// Qwen3: NeoX RoPE, RMSNorm of each q and k head before RoPE, head size set apart from
    /// the width.
    Qwen3,
    /// Phi-3: q, k and v in one fused matrix, gate and up in another, queries scaled before
    /// attention, LongRoPE factors (short and long).
    Phi3,
    /// Gemma 3: embeddings scaled by √n_embd, RMSNorm of q and k heads, norms after attention
    /// and after the FFN as well as before, a GELU-gated FFN, and sliding-window layers with
    /// their own RoPE base between global ones.
    Gemma3,
}

/// The architectures `general.architecture` may name, as error messages list them.
pub const SUPPORTED_ARCHITECTURES: &str = "llama, mistral, qwen2, qwen3, phi3, gemma3";

/// Sliding-window attention: layers that see only the last `window` positions, with their
/// own RoPE.
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    /// A query at position p attends to positions p - window + 1 ..= p.
    pub window: u32,
    /// Which layers use the window (the others attend to the whole context).
    pub layers: Vec<bool>,
    /// RoPE of the windowed layers.
    pub rope: RopeConfig,
}

/// How RoPE pairs up the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): the original llama layout.
    Normal,
    /// Pairs (i, i + n/2): GPT-NeoX layout.
    Neox,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    pub style: RopeStyle,
    /// Leading dimensions of each head that are rotated.
    pub n_dims: u32,
    pub freq_base: f32,
    /// 1 / linear scaling factor.
    pub freq_scale: f32,
    /// cos and sin are multiplied by this (`rope.scaling.attn_factor`: Phi-3's LongRoPE
    /// scale; 1 elsewhere).
    pub mscale: f32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Architecture,
    /// `general.architecture` as written in the file.
    pub arch_name: String,
    pub name: Option<String>,
    pub n_layer: u32,
    pub n_embd: u32,
    pub n_ff: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    pub n_vocab: u32,
    /// The context length the model was trained with.
    pub n_ctx_train: u32,
    pub rms_eps: f32,
    pub rope: RopeConfig,
    pub activation: FfnActivation,
    /// Experts of a mixture-of-experts FFN (`{arch}.expert_count`; 0: a dense FFN). `n_ff` is
    /// then the experts' neurons side by side: `n_expert × feed_forward_length`.
    pub n_expert: u32,
    /// Experts each token's router picks (`{arch}.expert_used_count`; 0 for a dense FFN).
    pub n_expert_used: u32,
    /// Token embeddings are multiplied by this (Gemma: √n_embd).
    pub embd_scale: Option<f32>,
    /// Queries are multiplied by this after RoPE (Gemma's attention scale; 1 elsewhere).
    pub q_scale: f32,
    /// Attention scores `q·k` are multiplied by this (1/√head_dim; 1 where `q_scale` scales).
    pub kq_scale: f32,
    /// Sliding-window layers, if the model has any.
    pub sliding_window: Option<SlidingWindow>,
    /// Logits become `cap · tanh(logit / cap)` (`{arch}.final_logit_softcapping`).
    pub final_logit_softcap: Option<f32>,
    /// The context RoPE was trained for before any extension
    /// (`rope.scaling.original_context_length`; `n_ctx_train` when absent): a longer session
    /// context uses the long-context RoPE factors.
    pub n_ctx_orig: u32,
}

pub use crate::plan::MAX_EXPERTS;
use crate::plan::{MAX_DIM, MAX_LAYERS};
/// The longest context a model may claim (`context_length`, `original_context_length`): 16M
/// tokens, 16x the longest released model's. It bounds products, not memory: what a session
/// may hold is decided by [`super::KvCache::new`] and the engine's default context.
pub const MAX_CONTEXT: u32 = 1 << 24;

impl ModelConfig {
    /// Reads the configuration of a llama-family model.
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelError> {
        let arch_name = file
            .get_str("general.architecture")?
            .ok_or(ModelError::MissingKey("general.architecture".into()))?
            .to_string();
        let arch = match arch_name.as_str() {
            "llama" | "mistral" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            "qwen3" => Architecture::Qwen3,
            "gemma3" => Architecture::Gemma3,
            "phi3" => Architecture::Phi3,
            other => return Err(ModelError::UnsupportedArchitecture(other.to_string())),
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let required = |k: &str| -> Result<u32, ModelError> {
            let name = key(k);
            file.get_u32(&name)?.ok_or(ModelError::MissingKey(name))
        };
        let n_layer = required("block_count")?;
        // Before anything is sized by it (the sliding-window pattern holds a flag a layer).
        check_layer_count(&arch_name, n_layer)?;
        let n_embd = required("embedding_length")?;
        let ff_per_expert = required("feed_forward_length")?;
        let (n_expert, n_expert_used) = experts(
            file.get_u32(&key("expert_count"))?,
            file.get_u32(&key("expert_used_count"))?,
            &key,
        )?;
        if ff_per_expert == 0 || ff_per_expert > MAX_DIM {
            return Err(ModelError::BadValue {
                key: key("feed_forward_length"),
                why: format!("{ff_per_expert} is outside 1..={MAX_DIM}"),
            });
        }
        // The experts' neurons form one FFN neuron space (ModelShape's convention).
        let n_ff = ff_per_expert
            .checked_mul(n_expert.max(1))
            .filter(|&n| n <= MAX_DIM)
            .ok_or_else(|| ModelError::BadValue {
                key: key("expert_count"),
                why: format!(
                    "{n_expert} experts of {ff_per_expert} neurons exceed {MAX_DIM} FFN neurons"
                ),
            })?;
        let n_head = required("attention.head_count")?;
        let n_head_kv = file
            .get_u32(&key("attention.head_count_kv"))?
            .unwrap_or(n_head);
        let n_ctx_train = file.get_u32(&key("context_length"))?.unwrap_or(4096);
        let head_dim = match file.get_u32(&key("attention.key_length"))? {
            Some(d) => d,
            // Without a head size the heads split the width, which they must then divide.
            None if n_head > 0 && n_embd.is_multiple_of(n_head) => n_embd / n_head,
            None if n_head > 0 => {
                return Err(ModelError::BadValue {
                    key: key("attention.head_count"),
                    why: format!(
                        "{n_head} heads do not divide the width {n_embd}, and no \
                         attention.key_length gives the head size"
                    ),
                })
            }
            None => 0,
        };
        if let Some(v) = file.get_u32(&key("attention.value_length"))? {
            if v != head_dim {
                return Err(ModelError::BadValue {
                    key: key("attention.value_length"),
                    why: format!(
                        "{v} differs from the key length {head_dim} (Conductor needs them equal)"
                    ),
                });
            }
        }
        let n_vocab = match file.get_u32(&key("vocab_size"))? {
            Some(v) => v,
            None => file
                .get_array("tokenizer.ggml.tokens")?
                .map(|a| a.len() as u32)
                .ok_or(ModelError::MissingKey(key("vocab_size")))?,
        };
        let rms_eps = file
            .get_f32(&key("attention.layer_norm_rms_epsilon"))?
            .unwrap_or(1e-5);
        let freq_base = file.get_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
        let n_rot = file
            .get_u32(&key("rope.dimension_count"))?
            .unwrap_or(head_dim);
        let freq_scale = match file.get_str(&key("rope.scaling.type"))? {
            None | Some("none") => 1.0,
            Some("linear") => {
                let factor = file.get_f32(&key("rope.scaling.factor"))?.unwrap_or(1.0);
                if !(factor.is_finite() && factor > 0.0) {
                    return Err(ModelError::BadValue {
                        key: key("rope.scaling.factor"),
                        why: format!("{factor} is not a positive scaling factor"),
                    });
                }
                1.0 / factor
            }
            Some(other) => {
                return Err(ModelError::BadValue {
                    key: key("rope.scaling.type"),
                    why: format!("RoPE scaling `{other}` is not supported (none, linear are)"),
                })
            }
        };
        let activation = match file.get_str(&key("activation_function"))? {
            // PowerInfer's files (`PWRI` magic) name no activation: its sparse models
            // (ReluLLaMA, ProSparse) are ReLU models, and its runtime computes them so.
            None if file.is_powerinfer() => FfnActivation::Relu,
            None if arch == Architecture::Gemma3 => FfnActivation::GeluTanh,
            None | Some("silu") | Some("swiglu") => FfnActivation::Silu,
            Some("relu") => FfnActivation::Relu,
            Some("gelu") | Some("geglu") => FfnActivation::GeluTanh,
            Some(other) => {
                return Err(ModelError::BadValue {
                    key: key("activation_function"),
                    why: format!(
                        "FFN activation `{other}` is not supported (silu, relu, gelu are)"
                    ),
                })
            }
        };
        let rope = RopeConfig {
            style: match arch {
                Architecture::Llama => RopeStyle::Normal,
                Architecture::Qwen2
                | Architecture::Qwen3
                | Architecture::Phi3
                | Architecture::Gemma3 => RopeStyle::Neox,
            },
            n_dims: n_rot,
            freq_base,
            freq_scale,
            mscale: file
                .get_f32(&key("rope.scaling.attn_factor"))?
                .unwrap_or(1.0),
        };
        let sliding_window = match arch {
            Architecture::Gemma3 => sliding_window(file, &key, n_layer, &rope)?,
            _ => None,
        };
        let default_kq_scale = 1.0 / (head_dim.max(1) as f32).sqrt();
        let (embd_scale, q_scale, kq_scale) = match arch {
            // Gemma 3 scales queries by its attention scale, which for the 27B model is
            // 1/√(n_embd / n_head) and 1/√head_dim for the others (llama.cpp keys it on the
            // 62 layers of the 27B).
            Architecture::Gemma3 => {
                let q_scale = if n_layer == 62 && n_head > 0 {
                    1.0 / ((n_embd / n_head) as f32).sqrt()
                } else {
                    default_kq_scale
                };
                (Some((n_embd as f32).sqrt()), q_scale, 1.0)
            }
            Architecture::Phi3 => (None, default_kq_scale, 1.0),
            _ => (None, 1.0, default_kq_scale),
        };
        let n_ctx_orig = file
            .get_u32(&key("rope.scaling.original_context_length"))?
            .unwrap_or(n_ctx_train);
        let final_logit_softcap = file
            .get_f32(&key("final_logit_softcapping"))?
            .filter(|&c| c != 0.0);
        let config = ModelConfig {
            arch,
            name: file.get_str("general.name")?.map(str::to_string),
            rope,
            arch_name,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab,
            n_ctx_train,
            rms_eps,
            activation,
            n_expert,
            n_expert_used,
            embd_scale,
            q_scale,
            kq_scale,
            sliding_window,
            final_logit_softcap,
            n_ctx_orig,
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ModelError> {
        let bad = |key: &str, why: String| {
            Err(ModelError::BadValue {
                key: format!("{}.{key}", self.arch_name),
                why,
            })
        };
        for (k, v) in [
            ("embedding_length", self.n_embd),
            ("feed_forward_length", self.n_ff),
            ("attention.head_count", self.n_head),
            ("attention.head_count_kv", self.n_head_kv),
            ("attention.key_length", self.head_dim),
            ("vocab_size", self.n_vocab),
        ] {
            if v == 0 || v > MAX_DIM {
                return bad(k, format!("{v} is outside 1..={MAX_DIM}"));
            }
        }
        check_layer_count(&self.arch_name, self.n_layer)?;
        // Widths that are products: each factor may be in range and their product not.
        for (k, heads, what) in [
            ("attention.head_count", self.n_head, "query"),
            ("attention.head_count_kv", self.n_head_kv, "key/value"),
        ] {
            let width = heads.checked_mul(self.head_dim).filter(|&w| w <= MAX_DIM);
            if width.is_none() {
                return bad(
                    k,
                    format!(
                        "{heads} {what} heads of {} dimensions exceed {MAX_DIM} dimensions",
                        self.head_dim
                    ),
                );
            }
        }
        for (k, v) in [
            ("context_length", self.n_ctx_train),
            ("rope.scaling.original_context_length", self.n_ctx_orig),
        ] {
            if v == 0 || v > MAX_CONTEXT {
                return bad(k, format!("{v} is outside 1..={MAX_CONTEXT} tokens"));
            }
        }
        if !self.n_head.is_multiple_of(self.n_head_kv) {
            return bad(
                "attention.head_count_kv",
                format!(
                    "{} does not divide the {} query heads",
                    self.n_head_kv, self.n_head
                ),
            );
        }
        if !self.head_dim.is_multiple_of(2)
            || self.rope.n_dims > self.head_dim
            || !self.rope.n_dims.is_multiple_of(2)
        {
            return bad(
                "rope.dimension_count",
                format!(
                    "{} rotated dimensions do not fit heads of {} dimensions",
                    self.rope.n_dims, self.head_dim
                ),
            );
        }
        if !(self.rms_eps.is_finite() && self.rms_eps > 0.0) {
            return bad(
                "attention.layer_norm_rms_epsilon",
                format!("{} is not a positive epsilon", self.rms_eps),
            );
        }
        if !(self.rope.freq_base.is_finite() && self.rope.freq_base > 0.0) {
            return bad(
                "rope.freq_base",
                format!("{} is not a positive base", self.rope.freq_base),
            );
        }
        if !(self.rope.mscale.is_finite() && self.rope.mscale > 0.0) {
            return bad(
                "rope.scaling.attn_factor",
                format!("{} is not a positive factor", self.rope.mscale),
            );
        }
        if let Some(swa) = &self.sliding_window {
            if swa.window > self.n_ctx_train {
                return bad(
                    "attention.sliding_window",
                    format!(
                        "a window of {} positions is larger than the {}-token context",
                        swa.window, self.n_ctx_train
                    ),
                );
            }
            if !(swa.rope.freq_base.is_finite() && swa.rope.freq_base > 0.0) {
                return bad(
                    "rope.freq_base_swa",
                    format!("{} is not a positive base", swa.rope.freq_base),
                );
            }
        }
        if let Some(cap) = self.final_logit_softcap {
            if !(cap.is_finite() && cap > 0.0) {
                return bad(
                    "final_logit_softcapping",
                    format!("{cap} is not a positive cap"),
                );
            }
        }
        Ok(())
    }

    /// The window and RoPE of layer `l`'s attention: `None` (the whole context) and the
    /// model's RoPE, except on sliding-window layers.
    pub fn layer_attention(&self, l: usize) -> (Option<u32>, &RopeConfig) {
        match &self.sliding_window {
            Some(swa) if swa.layers.get(l).copied().unwrap_or(false) => {
                (Some(swa.window), &swa.rope)
            }
            _ => (None, &self.rope),
        }
    }

    /// Neurons of one expert (the whole FFN for a dense model).
    pub fn ffn_per_expert(&self) -> u32 {
        self.n_ff / self.n_expert.max(1)
    }

    /// Whether the FFN is a mixture of experts.
    pub fn is_moe(&self) -> bool {
        self.n_expert > 0
    }

    /// Width of the query projection (all heads). A configuration from
    /// [`ModelConfig::from_gguf`] keeps it within `MAX_DIM`; one built by hand that overflows
    /// saturates (and then fails the tensor shape checks) rather than wrapping.
    pub fn q_dim(&self) -> u32 {
        self.n_head.saturating_mul(self.head_dim)
    }

    /// Width of the key and of the value projection (saturating, as [`ModelConfig::q_dim`]).
    pub fn kv_dim(&self) -> u32 {
        self.n_head_kv.saturating_mul(self.head_dim)
    }

    /// The shape the scheduler needs; `ffn_granule` comes from the down projection's type,
    /// `ffn_bundle` and `ffn_bundle_stride` from a neuron store's layout (0 otherwise).
    pub fn shape(&self, ffn_granule: u32, ffn_bundle: u32, ffn_bundle_stride: u64) -> ModelShape {
        ModelShape {
            n_layer: self.n_layer,
            n_embd: self.n_embd,
            n_ff: self.n_ff,
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim: self.head_dim,
            n_vocab: self.n_vocab,
            ffn_granule,
            ffn_bundle,
            ffn_bundle_stride,
            ffn_bundle_gate_bytes: 0,
            n_expert: self.n_expert,
            n_expert_used: self.n_expert_used,
        }
    }
}

/// `block_count` within 1..=[`MAX_LAYERS`].
fn check_layer_count(arch_name: &str, n_layer: u32) -> Result<(), ModelError> {
    if n_layer == 0 || n_layer > MAX_LAYERS {
        return Err(ModelError::BadValue {
            key: format!("{arch_name}.block_count"),
            why: format!("{n_layer} is outside 1..={MAX_LAYERS}"),
        });
    }
    Ok(())
}

/// Gemma 3's sliding-window layers: `attention.sliding_window` positions (none when absent or
/// 0), on the layers `attention.sliding_window_pattern` names — an array of one flag per
/// layer, or a period `n` where every `n`-th layer is global (default 6: five windowed
/// layers, then one global) — with RoPE base `rope.freq_base_swa` (default 10000) and no
/// scaling, as llama.cpp reads them.
fn sliding_window(
    file: &GgufFile,
    key: &dyn Fn(&str) -> String,
    n_layer: u32,
    global_rope: &RopeConfig,
) -> Result<Option<SlidingWindow>, ModelError> {
    let window = file.get_u32(&key("attention.sliding_window"))?.unwrap_or(0);
    if window == 0 {
        return Ok(None);
    }
    let pattern_key = key("attention.sliding_window_pattern");
    let layers = match file.get(&pattern_key) {
        Some(crate::gguf::Value::Array(crate::gguf::Array::Bool(flags))) => {
            if flags.len() != n_layer as usize {
                return Err(ModelError::BadValue {
                    key: pattern_key,
                    why: format!("{} flags for {n_layer} layers", flags.len()),
                });
            }
            flags.clone()
        }
        _ => {
            let period = file.get_u32(&pattern_key)?.unwrap_or(6);
            (0..n_layer)
                .map(|l| period == 0 || l % period < period - 1)
                .collect()
        }
    };
    let freq_base = file
        .get_f32(&key("rope.freq_base_swa"))?
        .unwrap_or(10_000.0);
    Ok(Some(SlidingWindow {
        window,
        layers,
        rope: RopeConfig {
            freq_base,
            freq_scale: 1.0,
            ..global_rope.clone()
        },
    }))
}

/// The MoE counts from `expert_count` and `expert_used_count` (`key` makes a metadata name):
/// both absent (or both 0) for a dense FFN; otherwise 1 ≤ used ≤ count ≤ [`MAX_EXPERTS`].
fn experts(
    count: Option<u32>,
    used: Option<u32>,
    key: &dyn Fn(&str) -> String,
) -> Result<(u32, u32), ModelError> {
    let bad = |k: &str, why: String| ModelError::BadValue { key: key(k), why };
    match (count.unwrap_or(0), used.unwrap_or(0)) {
        (0, 0) => Ok((0, 0)),
        (0, u) => Err(bad(
            "expert_used_count",
            format!("{u} experts used per token, but the model names no expert_count"),
        )),
        (c, _) if c > MAX_EXPERTS => Err(bad(
            "expert_count",
            format!("{c} experts is outside 1..={MAX_EXPERTS}"),
        )),
        (c, 0) => Err(bad(
            "expert_used_count",
            format!(
                "missing or 0, but the model has {c} experts (a router must pick at least one)"
            ),
        )),
        (c, u) if u > c => Err(bad(
            "expert_used_count",
            format!("{u} experts used per token, but the model has only {c}"),
        )),
        (c, u) => Ok((c, u)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(k: &str) -> String {
        format!("llama.{k}")
    }

    #[test]
    fn expert_counts_are_checked() {
        assert_eq!(experts(None, None, &key).unwrap(), (0, 0));
        assert_eq!(experts(Some(0), Some(0), &key).unwrap(), (0, 0));
        assert_eq!(experts(Some(8), Some(2), &key).unwrap(), (8, 2));
        let err = |c, u| experts(c, u, &key).unwrap_err().to_string();
        assert!(err(Some(4), Some(5)).contains("llama.expert_used_count"));
        assert!(err(Some(4), Some(5)).contains("only 4"));
        assert!(err(Some(4), None).contains("missing or 0"));
        assert!(err(None, Some(2)).contains("no expert_count"));
        assert!(err(Some(MAX_EXPERTS + 1), Some(2)).contains("llama.expert_count"));
    }

    proptest! {
        #[test]
        fn expert_counts_never_panic_and_accept_only_valid(
            c in proptest::option::of(0u32..600),
            u in proptest::option::of(0u32..600),
        ) {
            match experts(c, u, &key) {
                Ok((0, 0)) => prop_assert!(c.unwrap_or(0) == 0 && u.unwrap_or(0) == 0),
                Ok((n, k)) => prop_assert!(k >= 1 && k <= n && n <= MAX_EXPERTS),
                Err(e) => prop_assert!(e.to_string().contains("llama.expert")),
            }
        }
    }

    /// A header of `arch` with the given keys (names without the `ARCH.` prefix) on top of a
    /// valid small configuration (replacing its values).
    fn config_of(
        arch: &str,
        keys: &[(&str, crate::gguf::Value)],
    ) -> Result<ModelConfig, ModelError> {
        use crate::gguf::{GgufFile, GgufWriter, Value};
        let mut w = GgufWriter::new();
        w.add_metadata("general.architecture", Value::String(arch.into()))
            .unwrap();
        let base = [
            ("block_count", Value::U32(6)),
            ("embedding_length", Value::U32(640)),
            ("feed_forward_length", Value::U32(2048)),
            ("attention.head_count", Value::U32(4)),
            ("attention.head_count_kv", Value::U32(1)),
            ("attention.key_length", Value::U32(256)),
            ("context_length", Value::U32(1024)),
            ("vocab_size", Value::U32(320)),
        ];
        // `keys` replace the base values they name.
        let kept = base
            .iter()
            .filter(|(k, _)| keys.iter().all(|(o, _)| o != k));
        for (k, v) in kept.cloned().chain(keys.iter().cloned()) {
            w.add_metadata(format!("{arch}.{k}"), v).unwrap();
        }
        ModelConfig::from_gguf(&GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap())
    }

    #[test]
    fn a_huge_layer_count_is_refused_before_anything_is_sized_by_it() {
        // The fuzzer's find: gemma3's window pattern (a flag a layer) was built for 4 billion
        // layers before the count was checked, taking seconds and gigabytes.
        use crate::gguf::Value;
        let started = std::time::Instant::now();
        let e = config_of(
            "gemma3",
            &[
                ("attention.sliding_window", Value::U32(512)),
                ("block_count", Value::U32(u32::MAX)),
            ],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("gemma3.block_count"), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_millis(500));
    }

    #[test]
    fn gemma3_reads_its_window_pattern_scales_and_local_rope() {
        use crate::gguf::Value;
        let c = config_of("gemma3", &[("attention.sliding_window", Value::U32(512))]).unwrap();
        assert_eq!(c.arch, Architecture::Gemma3);
        assert_eq!(c.activation, FfnActivation::GeluTanh);
        assert_eq!(c.embd_scale, Some(640f32.sqrt()));
        assert_eq!((c.q_scale, c.kq_scale), (1.0 / 16.0, 1.0));
        let swa = c.sliding_window.as_ref().unwrap();
        // Every sixth layer is global: 5 windowed, then 1.
        assert_eq!(swa.layers, [true, true, true, true, true, false]);
        assert_eq!(c.layer_attention(0), (Some(512), &swa.rope));
        assert_eq!(c.layer_attention(5), (None, &c.rope));
        assert_eq!((swa.rope.freq_base, c.rope.freq_base), (10_000.0, 10_000.0));
        // A pattern given per layer, and a local base of its own.
        let flags = Value::Array(crate::gguf::Array::Bool(vec![
            true, false, true, false, true, false,
        ]));
        let c = config_of(
            "gemma3",
            &[
                ("attention.sliding_window", Value::U32(64)),
                ("attention.sliding_window_pattern", flags),
                ("rope.freq_base_swa", Value::F32(500.0)),
            ],
        )
        .unwrap();
        let swa = c.sliding_window.unwrap();
        assert_eq!(swa.layers, [true, false, true, false, true, false]);
        assert_eq!(swa.rope.freq_base, 500.0);
    }

    #[test]
    fn hyperparameters_that_do_not_fit_together_name_their_key() {
        use crate::gguf::Value;
        let err =
            |arch: &str, keys: &[(&str, Value)]| config_of(arch, keys).unwrap_err().to_string();
        let e = err("gemma3", &[("attention.sliding_window", Value::U32(4096))]);
        assert!(
            e.contains("gemma3.attention.sliding_window")
                && e.contains("larger than the 1024-token context"),
            "{e}"
        );
        let flags = Value::Array(crate::gguf::Array::Bool(vec![true; 4]));
        let e = err(
            "gemma3",
            &[
                ("attention.sliding_window", Value::U32(64)),
                ("attention.sliding_window_pattern", flags),
            ],
        );
        assert!(
            e.contains("sliding_window_pattern") && e.contains("4 flags for 6 layers"),
            "{e}"
        );
        let e = err("qwen3", &[("attention.value_length", Value::U32(128))]);
        assert!(e.contains("qwen3.attention.value_length"), "{e}");
        let e = err("phi3", &[("rope.scaling.attn_factor", Value::F32(-1.0))]);
        assert!(e.contains("phi3.rope.scaling.attn_factor"), "{e}");
        let e = err(
            "gemma3",
            &[("final_logit_softcapping", Value::F32(f32::NAN))],
        );
        assert!(e.contains("final_logit_softcapping"), "{e}");
        let e = err("falcon", &[]);
        assert!(
            e.contains("`falcon`") && e.contains(SUPPORTED_ARCHITECTURES),
            "{e}"
        );
    }

    /// Heads and head size each in range whose product wraps a u32 (65536 x 65536 = 2^32
    /// is 0 in release), and contexts no cache could hold, are refused naming the key.
    #[test]
    fn products_and_contexts_out_of_range_name_their_key() {
        use crate::gguf::Value;
        let err = |keys: &[(&str, Value)]| config_of("llama", keys).unwrap_err().to_string();
        let e = err(&[
            ("attention.head_count", Value::U32(1 << 16)),
            ("attention.head_count_kv", Value::U32(1 << 16)),
            ("attention.key_length", Value::U32(1 << 16)),
        ]);
        assert!(
            e.contains("llama.attention.head_count") && e.contains("query heads"),
            "{e}"
        );
        let e = err(&[
            ("attention.head_count", Value::U32(64)),
            ("attention.head_count_kv", Value::U32(64)),
            ("attention.key_length", Value::U32(1 << 15)),
        ]);
        assert!(e.contains("exceed 1048576 dimensions"), "{e}");
        for n in [0, MAX_CONTEXT + 1, u32::MAX] {
            let e = err(&[("context_length", Value::U32(n))]);
            assert!(e.contains("llama.context_length"), "{n}: {e}");
        }
        let e = err(&[("rope.scaling.original_context_length", Value::U32(u32::MAX))]);
        assert!(e.contains("original_context_length"), "{e}");
        // The largest values allowed still load.
        let c = config_of("llama", &[("context_length", Value::U32(MAX_CONTEXT))]).unwrap();
        assert_eq!(c.n_ctx_train, MAX_CONTEXT);
    }

    /// Without `attention.key_length` the heads split the width, which they must divide.
    #[test]
    fn heads_that_do_not_divide_the_width_need_a_head_size() {
        use crate::gguf::{GgufFile, GgufWriter, Value};
        let mut w = GgufWriter::new();
        w.add_metadata("general.architecture", Value::String("llama".into()))
            .unwrap();
        for (k, v) in [
            ("block_count", 2),
            ("embedding_length", 100),
            ("feed_forward_length", 64),
            ("attention.head_count", 3),
            ("vocab_size", 320),
        ] {
            w.add_metadata(format!("llama.{k}"), Value::U32(v)).unwrap();
        }
        let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        let e = ModelConfig::from_gguf(&file).unwrap_err().to_string();
        assert!(
            e.contains("llama.attention.head_count") && e.contains("do not divide the width 100"),
            "{e}"
        );
    }

    /// PowerInfer's files name no activation: they load as ReLU models (the predictor tensors
    /// are ignored), from bytes or from disk.
    #[test]
    fn powerinfer_files_load_as_relu_models() {
        use crate::gguf::GgufFile;
        use crate::model::Model;
        use crate::sparse::powerinfer::{
            powerinfer_test_files, write_powerinfer_test_files, PowerInferTestSpec, MAGIC,
        };
        use crate::synthetic::{synthetic_model, SyntheticSpec};
        let open = |bytes: &[u8]| GgufFile::from_bytes(bytes.to_vec()).unwrap();
        let relu = SyntheticSpec {
            n_layer: 3,
            n_embd: 64,
            n_ff: 160,
            activation: FfnActivation::Relu,
            relu_active_share: Some(0.2),
            ..SyntheticSpec::default()
        };
        // Our synthetic SiLU models write no activation key, like PowerInfer's converter.
        let spec = SyntheticSpec {
            activation: FfnActivation::Silu,
            ..relu.clone()
        };
        let mut bytes = synthetic_model(&spec).unwrap().to_bytes().unwrap();
        let plain = Model::from_gguf(open(&bytes)).unwrap();
        assert_eq!(plain.config().activation, FfnActivation::Silu);
        bytes[..4].copy_from_slice(&MAGIC);
        let pwri = Model::from_gguf(open(&bytes)).unwrap();
        assert_eq!(pwri.config().activation, FfnActivation::Relu);

        let files = powerinfer_test_files(&relu, &PowerInferTestSpec::default()).unwrap();
        let model = Model::from_gguf(open(&files.model)).unwrap();
        assert_eq!(model.layers().len(), 3);
        assert_eq!(model.config().activation, FfnActivation::Relu);

        let dir = std::env::temp_dir().join(format!("conductor-pwri-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (m, p) = (dir.join("model.powerinfer.gguf"), dir.join("pred.gguf"));
        write_powerinfer_test_files(&relu, &PowerInferTestSpec::default(), &m, &p).unwrap();
        let model = Model::open(&m, crate::model::WeightSource::Mapped).unwrap();
        assert_eq!(model.layers().len(), 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

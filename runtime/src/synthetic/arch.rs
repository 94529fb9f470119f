//! The architectures the generator writes: what each one's files hold beyond the llama layout
//! ([`ArchInfo`], [`ARCHS`]).

use crate::gguf::GgufError;

/// What an architecture's files hold beyond the llama layout. Every difference between the
/// architectures the generator writes is a field here, read by one code path.
#[derive(Clone, Copy, Debug)]
pub struct ArchInfo {
    /// What [`SyntheticSpec::arch`](super::SyntheticSpec::arch) names it by.
    pub name: &'static str,
    /// `general.architecture`, and the prefix of its metadata keys.
    pub gguf_arch: &'static str,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// Biases on q, k and v (Qwen2).
    pub qkv_bias: bool,
    /// RMS norms of each q and k head (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// Norms of the attention's and the FFN's outputs (`post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// q, k and v in one matrix (`attn_qkv`, rows q then k then v).
    pub fused_qkv: bool,
    /// Gate and up in one matrix (`ffn_up` of 2·n_ff rows, gate rows first) and no `ffn_gate`.
    pub fused_gate_up: bool,
    /// `attention.key_length` and `value_length` are written.
    pub head_dim_keys: bool,
    pub rope_factors: RopeFactors,
    pub sliding_window: Option<SlidingWindowInfo>,
    pub vocab: VocabInfo,
    /// Deviation of the token embeddings times √n_embd (`None`: 1, as the first synthetic
    /// models had). Gemma multiplies its embeddings by √n_embd, so its real ones are small.
    pub embd_std_sqrt: Option<f32>,
    /// The FFN's activation when the spec asks for SiLU (Gemma's is GELU, named by no key).
    pub gelu: bool,
}

/// RoPE frequency factors held in tensors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeFactors {
    None,
    /// Llama 3.1's `rope_freqs.weight` (`factor`, low and high frequency factors, original
    /// context), as convert_hf_to_gguf computes it.
    Llama3 {
        factor: f32,
        low_freq: f32,
        high_freq: f32,
        original_ctx: u32,
    },
    /// Phi-3's LongRoPE: `rope_factors_long.weight` and `rope_factors_short.weight`,
    /// `rope.scaling.original_context_length` and `rope.scaling.attn_factor`. llama.cpp uses the
    /// short factors while the context is at most the original one.
    LongRope {
        original_ctx: u32,
        attn_factor: f32,
    },
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlidingWindowInfo {
    pub default_window: u32,
    /// `rope.freq_base_swa`: the windowed layers' RoPE base.
    pub rope_base_swa: f32,
}

/// The tokenizer an architecture's files carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabInfo {
    /// Byte-level BPE (`gpt2`): 256 byte tokens, then `specials`, then merges of letter pairs.
    Bpe {
        pre: &'static str,
        specials: &'static [&'static str],
        /// Indexes into the whole vocabulary.
        bos: u32,
        eos: u32,
        add_bos: bool,
    },
    /// SentencePiece (`llama`): `specials` first, then the 256 byte tokens `<0xNN>`, then
    /// `▁`-words with descending scores.
    Spm {
        specials: &'static [&'static str],
        bos: u32,
        eos: u32,
        unk: u32,
        add_bos: bool,
        add_space_prefix: bool,
    },
}

const BPE_PLAIN: VocabInfo = VocabInfo::Bpe {
    pre: "gpt-2",
    specials: &["<|endoftext|>", "<|im_end|>"],
    bos: 256,
    eos: 256,
    add_bos: false,
};

const LLAMA: ArchInfo = ArchInfo {
    name: "llama",
    gguf_arch: "llama",
    rope_base: 10_000.0,
    rms_eps: 1e-5,
    qkv_bias: false,
    qk_norm: false,
    post_norms: false,
    fused_qkv: false,
    fused_gate_up: false,
    head_dim_keys: false,
    rope_factors: RopeFactors::None,
    sliding_window: None,
    vocab: BPE_PLAIN,
    embd_std_sqrt: None,
    gelu: false,
};

/// The architectures the generator writes.
pub const ARCHS: &[ArchInfo] = &[
    LLAMA,
    // Llama 3.1/3.2: RoPE frequency factors, base 500000, a BOS token added.
    ArchInfo {
        name: "llama3",
        rope_base: 500_000.0,
        rope_factors: RopeFactors::Llama3 {
            factor: 32.0,
            low_freq: 1.0,
            high_freq: 4.0,
            original_ctx: 8192,
        },
        vocab: VocabInfo::Bpe {
            pre: "llama-bpe",
            specials: &["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
            bos: 256,
            eos: 257,
            add_bos: true,
        },
        embd_std_sqrt: Some(1.0),
        ..LLAMA
    },
    // The RoPE base and epsilon are llama's, as the first synthetic qwen2 models had them.
    ArchInfo {
        name: "qwen2",
        gguf_arch: "qwen2",
        qkv_bias: true,
        ..LLAMA
    },
    ArchInfo {
        name: "qwen3",
        gguf_arch: "qwen3",
        rope_base: 1_000_000.0,
        rms_eps: 1e-6,
        qk_norm: true,
        head_dim_keys: true,
        vocab: VocabInfo::Bpe {
            pre: "qwen2",
            specials: &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            bos: 256,
            eos: 258,
            add_bos: false,
        },
        embd_std_sqrt: Some(4.0),
        ..LLAMA
    },
    ArchInfo {
        name: "gemma3",
        gguf_arch: "gemma3",
        rope_base: 1_000_000.0,
        rms_eps: 1e-6,
        qk_norm: true,
        post_norms: true,
        head_dim_keys: true,
        sliding_window: Some(SlidingWindowInfo {
            default_window: 512,
            rope_base_swa: 10_000.0,
        }),
        vocab: VocabInfo::Spm {
            specials: &["<pad>", "<eos>", "<bos>", "<unk>"],
            bos: 2,
            eos: 1,
            unk: 3,
            add_bos: true,
            add_space_prefix: false,
        },
        embd_std_sqrt: Some(4.0),
        gelu: true,
        ..LLAMA
    },
    ArchInfo {
        name: "phi3",
        gguf_arch: "phi3",
        fused_qkv: true,
        fused_gate_up: true,
        rope_factors: RopeFactors::LongRope {
            original_ctx: 4096,
            attn_factor: 1.190_238_4,
        },
        vocab: VocabInfo::Spm {
            // llama.cpp looks `<|endoftext|>` up in any model named phi3.
            specials: &["<unk>", "<s>", "</s>", "<|endoftext|>"],
            bos: 1,
            eos: 3,
            unk: 0,
            add_bos: false,
            add_space_prefix: true,
        },
        embd_std_sqrt: Some(1.0),
        ..LLAMA
    },
];

/// The architecture [`SyntheticSpec::arch`](super::SyntheticSpec::arch) names.
pub fn arch_info(name: &str) -> Result<&'static ArchInfo, GgufError> {
    ARCHS
        .iter()
        .find(|a| a.name == name)
        .ok_or_else(|| GgufError::InvalidMetadata {
            key: "arch".into(),
            reason: format!(
                "unknown synthetic architecture {name}; known: {}",
                ARCHS.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
            ),
        })
}

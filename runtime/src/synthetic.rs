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

/// What an architecture's files hold beyond the llama layout. Every difference between the
/// architectures the generator writes is a field here, read by one code path.
#[derive(Clone, Copy, Debug)]
pub struct ArchInfo {
    /// What [`SyntheticSpec::arch`] names it by.
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

/// The architecture [`SyntheticSpec::arch`] names.
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

/// What a matrix is to the type mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Embedding,
    Output,
    /// `attn_v` and `ffn_down`: more bits on some layers in a Q4_K_M file.
    MoreBits,
    /// A fused `attn_qkv`: Q5_K in a Q4_K_M file.
    Qkv,
    Other,
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers, and every third
/// layer between.
fn more_bits(layer: u32, n_layer: u32) -> bool {
    let (i, n) = (layer as i64, n_layer as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The type of a `cols`-wide matrix of kind `kind` on layer `layer`.
fn matrix_type(spec: &SyntheticSpec, kind: Kind, layer: u32, cols: u32) -> GgmlType {
    let ty = match (spec.mix, kind) {
        (_, Kind::Embedding) => spec.embd_type,
        (TypeMix::Uniform, Kind::Output) => spec.output_type.unwrap_or(spec.embd_type),
        (TypeMix::Uniform, _) => spec.weight_type,
        (TypeMix::Q4KM, Kind::Output) => GgmlType::Q6_K,
        (TypeMix::Q4KM, Kind::MoreBits) if more_bits(layer, spec.n_layer) => GgmlType::Q6_K,
        (TypeMix::Q4KM, Kind::Qkv) => GgmlType::Q5_K,
        (TypeMix::Q4KM, _) => GgmlType::Q4_K,
    };
    fallback_type(ty, cols)
}

/// A 256-block type on rows that are not a multiple of 256 falls back to a 32-block type, as
/// in llama.cpp's quantizer: Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0.
fn fallback_type(ty: GgmlType, cols: u32) -> GgmlType {
    if (cols as usize).is_multiple_of(ty.block_size()) {
        return ty;
    }
    match ty {
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        other => other,
    }
}

/// Llama 3.1's RoPE frequency factors for `n_rot` rotated dimensions (convert_hf_to_gguf's
/// formula): 1 for short wavelengths, `factor` for long ones, smoothly between.
fn llama3_rope_factors(
    base: f32,
    n_rot: u32,
    factor: f32,
    low_freq: f32,
    high_freq: f32,
    original_ctx: u32,
) -> Vec<f32> {
    let old = original_ctx as f64;
    let low_wavelen = old / f64::from(low_freq);
    let high_wavelen = old / f64::from(high_freq);
    (0..n_rot / 2)
        .map(|i| {
            let freq = 1.0 / f64::from(base).powf(f64::from(2 * i) / f64::from(n_rot));
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                f64::from(factor)
            } else {
                let smooth =
                    (old / wavelen - f64::from(low_freq)) / f64::from(high_freq - low_freq);
                1.0 / ((1.0 - smooth) / f64::from(factor) + smooth)
            };
            f as f32
        })
        .collect()
}

/// LongRoPE factors (short, long) for `n_rot` rotated dimensions, rising with the wavelength as
/// Phi-3's do (short from 1 to 2.5, long from 1 to 61).
fn longrope_factors(n_rot: u32) -> (Vec<f32>, Vec<f32>) {
    let m = (n_rot / 2).max(2);
    let t = |i: u32| i as f32 / (m - 1) as f32;
    (
        (0..n_rot / 2).map(|i| 1.0 + 1.5 * t(i).powi(3)).collect(),
        (0..n_rot / 2).map(|i| 1.0 + 60.0 * t(i).powi(2)).collect(),
    )
}

fn refuse(key: &str, reason: String) -> GgufError {
    GgufError::InvalidMetadata {
        key: key.into(),
        reason,
    }
}

impl SyntheticModel {
    /// Lays the model out: metadata, tensor descriptors, and how each tensor's data is made.
    pub fn new(spec: &SyntheticSpec) -> Result<Self, GgufError> {
        let info = arch_info(spec.arch)?;
        let mut w = GgufWriter::new();
        let arch = info.gguf_arch;
        let u32v = |v: u32| Value::U32(v);
        if spec.n_head == 0 || spec.n_head_kv == 0 || spec.n_embd == 0 {
            return Err(refuse("n_head", "heads and width must be above 0".into()));
        }
        let head_dim = spec.head_dim.unwrap_or(spec.n_embd / spec.n_head);
        let (embd, ff) = (spec.n_embd, spec.n_ff);
        let q = spec.n_head * head_dim;
        let kv = spec.n_head_kv * head_dim;
        let sparse = spec.relu_active_share.is_some() || spec.ffn_frequencies.is_some();
        if info.fused_gate_up && (sparse || spec.n_expert > 0) {
            return Err(refuse(
                "arch",
                format!(
                    "{}: no planted sparsity or experts with a fused gate",
                    info.name
                ),
            ));
        }
        if info.fused_qkv && q != embd {
            return Err(refuse(
                "head_dim",
                format!(
                    "{}: the heads must span the width ({q} != {embd})",
                    info.name
                ),
            ));
        }
        if info.gelu && spec.activation == FfnActivation::Relu {
            return Err(refuse("activation", format!("{} is GELU", info.name)));
        }
        let name = spec.name.as_deref().unwrap_or(info.name);
        w.add_metadata("general.architecture", Value::String(arch.into()))?;
        w.add_metadata("general.name", Value::String(format!("synthetic-{name}")))?;
        if spec.mix == TypeMix::Q4KM {
            // llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M.
            w.add_metadata("general.file_type", Value::U32(15))?;
        }
        w.add_metadata(format!("{arch}.block_count"), u32v(spec.n_layer))?;
        w.add_metadata(format!("{arch}.context_length"), u32v(spec.n_ctx))?;
        w.add_metadata(format!("{arch}.embedding_length"), u32v(spec.n_embd))?;
        w.add_metadata(format!("{arch}.feed_forward_length"), u32v(spec.n_ff))?;
        w.add_metadata(format!("{arch}.attention.head_count"), u32v(spec.n_head))?;
        w.add_metadata(
            format!("{arch}.attention.head_count_kv"),
            u32v(spec.n_head_kv),
        )?;
        w.add_metadata(format!("{arch}.rope.freq_base"), Value::F32(info.rope_base))?;
        w.add_metadata(
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            Value::F32(info.rms_eps),
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
        w.add_metadata(format!("{arch}.rope.dimension_count"), u32v(head_dim))?;
        if info.head_dim_keys {
            w.add_metadata(format!("{arch}.attention.key_length"), u32v(head_dim))?;
            w.add_metadata(format!("{arch}.attention.value_length"), u32v(head_dim))?;
        }
        if let Some(sw) = info.sliding_window {
            let window = spec.sliding_window.unwrap_or(sw.default_window);
            w.add_metadata(format!("{arch}.attention.sliding_window"), u32v(window))?;
            w.add_metadata(
                format!("{arch}.rope.freq_base_swa"),
                Value::F32(sw.rope_base_swa),
            )?;
            if let Some(p) = spec.swa_period {
                w.add_metadata(format!("{arch}.attention.sliding_window_pattern"), u32v(p))?;
            }
        }
        if let RopeFactors::LongRope {
            original_ctx,
            attn_factor,
        } = info.rope_factors
        {
            w.add_metadata(
                format!("{arch}.rope.scaling.original_context_length"),
                u32v(original_ctx),
            )?;
            w.add_metadata(
                format!("{arch}.rope.scaling.attn_factor"),
                Value::F32(attn_factor),
            )?;
        }
        add_vocab(&mut w, &info.vocab, spec.n_vocab)?;

        let shift = Self::shift(spec)?;
        let mut b = Builder {
            w,
            planned: Vec::new(),
            at: 0,
        };
        // Scales keep activations O(1) through the layers (≈ 1/sqrt(fan-in)).
        let fan_in = |cols: u32| 1.0 / (cols as f32).sqrt();
        let s_in = fan_in(embd);
        // With the ReLU shift, layers add less to the residual stream, so the shifted dimension
        // keeps its share of the norm (and the sparsity stays near its target) through depth.
        let out_scale = if matches!(shift, Shift::None) {
            1.0
        } else {
            0.2
        };
        let reads = Role::Reads;
        let ty = |kind, layer, cols| matrix_type(spec, kind, layer, cols);
        let embd_std = info.embd_std_sqrt.map_or(1.0, |k| k * s_in);
        let embd_ty = ty(Kind::Embedding, 0, embd);
        b.matrix(
            "token_embd.weight",
            spec.n_vocab,
            embd,
            embd_ty,
            embd_std,
            0,
            Role::Embedding,
        )?;
        match info.rope_factors {
            RopeFactors::None => {}
            RopeFactors::Llama3 {
                factor,
                low_freq,
                high_freq,
                original_ctx,
            } => {
                let f = llama3_rope_factors(
                    info.rope_base,
                    head_dim,
                    factor,
                    low_freq,
                    high_freq,
                    original_ctx,
                );
                b.vector("rope_freqs.weight", f)?;
            }
            RopeFactors::LongRope { .. } => {
                let (short, long) = longrope_factors(head_dim);
                b.vector("rope_factors_long.weight", long)?;
                b.vector("rope_factors_short.weight", short)?;
            }
        }
        for i in 0..spec.n_layer {
            let n = |t: &str| format!("blk.{i}.{t}");
            b.vector(&n("attn_norm.weight"), norm_weights(Some(i), embd))?;
            let other = ty(Kind::Other, i, embd);
            if info.fused_qkv {
                let qkv_ty = ty(Kind::Qkv, i, embd);
                let rows = q + 2 * kv;
                b.matrix(&n("attn_qkv.weight"), rows, embd, qkv_ty, s_in, 0, reads)?;
            } else {
                b.matrix(&n("attn_q.weight"), q, embd, other, s_in, 0, reads)?;
                b.matrix(&n("attn_k.weight"), kv, embd, other, s_in, 0, reads)?;
                let v_ty = ty(Kind::MoreBits, i, embd);
                b.matrix(&n("attn_v.weight"), kv, embd, v_ty, s_in, 0, reads)?;
            }
            let out = fan_in(q) * out_scale;
            let o_ty = ty(Kind::Other, i, q);
            b.matrix(
                &n("attn_output.weight"),
                embd,
                q,
                o_ty,
                out,
                0,
                Role::Writes,
            )?;
            if info.qkv_bias {
                for (t, len) in [("attn_q.bias", q), ("attn_k.bias", kv), ("attn_v.bias", kv)] {
                    let bias = (0..len).map(|j| ((j % 7) as f32 - 3.0) * 0.05).collect();
                    b.vector(&n(t), bias)?;
                }
            }
            if info.qk_norm {
                b.vector(
                    &n("attn_q_norm.weight"),
                    norm_weights(Some(i + 1), head_dim),
                )?;
                b.vector(
                    &n("attn_k_norm.weight"),
                    norm_weights(Some(i + 2), head_dim),
                )?;
            }
            if info.post_norms {
                let w = norm_weights(Some(i + 3), embd);
                b.vector(&n("post_attention_norm.weight"), w)?;
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
            if info.fused_gate_up {
                b.matrix(&n("ffn_up.weight"), 2 * ff, embd, other, s_in, 0, reads)?;
            } else {
                b.matrix(&n(names[0]), ff, embd, other, s_in, e, Role::Gate(i))?;
                b.matrix(&n(names[1]), ff, embd, other, s_in, e, reads)?;
            }
            let down = fan_in(ff) * out_scale;
            let d_ty = ty(Kind::MoreBits, i, ff);
            b.matrix(&n(names[2]), embd, ff, d_ty, down, e, Role::Writes)?;
            if info.post_norms {
                b.vector(&n("post_ffw_norm.weight"), norm_weights(Some(i + 4), embd))?;
            }
        }
        b.vector("output_norm.weight", norm_weights(None, embd))?;
        if !spec.tied_output {
            let ty = ty(Kind::Output, 0, embd);
            let std = spec.logit_scale * s_in;
            b.matrix("output.weight", spec.n_vocab, embd, ty, std, 0, reads)?;
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

/// The vocabulary `vocab` describes, `n_vocab` tokens, with its tokenizer's metadata.
fn add_vocab(w: &mut GgufWriter, vocab: &VocabInfo, n_vocab: u32) -> Result<(), GgufError> {
    match *vocab {
        VocabInfo::Bpe {
            pre,
            specials,
            bos,
            eos,
            add_bos,
        } => {
            add_bpe_vocab(w, n_vocab, pre, specials)?;
            w.add_metadata("tokenizer.ggml.eos_token_id", Value::U32(eos))?;
            w.add_metadata("tokenizer.ggml.bos_token_id", Value::U32(bos))?;
            w.add_metadata("tokenizer.ggml.add_bos_token", Value::Bool(add_bos))?;
        }
        VocabInfo::Spm {
            specials,
            bos,
            eos,
            unk,
            add_bos,
            add_space_prefix,
        } => {
            add_spm_vocab(w, n_vocab, specials, unk)?;
            w.add_metadata("tokenizer.ggml.bos_token_id", Value::U32(bos))?;
            w.add_metadata("tokenizer.ggml.eos_token_id", Value::U32(eos))?;
            w.add_metadata("tokenizer.ggml.unknown_token_id", Value::U32(unk))?;
            w.add_metadata("tokenizer.ggml.add_bos_token", Value::Bool(add_bos))?;
            w.add_metadata("tokenizer.ggml.add_eos_token", Value::Bool(false))?;
            w.add_metadata(
                "tokenizer.ggml.add_space_prefix",
                Value::Bool(add_space_prefix),
            )?;
        }
    }
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

/// A byte-level BPE vocabulary: 256 byte tokens, the control tokens `specials`, then merged
/// pairs of lowercase letters (each with its merge rule) up to `n_vocab`.
fn add_bpe_vocab(
    w: &mut GgufWriter,
    n_vocab: u32,
    pre: &str,
    specials: &[&str],
) -> Result<(), GgufError> {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_to_char(b).to_string()).collect();
    let mut types = vec![1i32; 256];
    tokens.extend(specials.iter().map(|s| s.to_string()));
    types.extend(specials.iter().map(|_| 3));
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
    w.add_metadata("tokenizer.ggml.pre", Value::String(pre.into()))?;
    w.add_metadata("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))?;
    w.add_metadata("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))?;
    w.add_metadata("tokenizer.ggml.merges", Value::Array(Array::String(merges)))?;
    Ok(())
}

/// A SentencePiece vocabulary: `specials` (control tokens, `unk` unknown), the 256 byte tokens
/// `<0xNN>`, `▁`, then `▁`-prefixed letters and letter pairs with descending scores, padded
/// with unused tokens up to `n_vocab`.
fn add_spm_vocab(
    w: &mut GgufWriter,
    n_vocab: u32,
    specials: &[&str],
    unk: u32,
) -> Result<(), GgufError> {
    let mut tokens: Vec<String> = specials.iter().map(|s| s.to_string()).collect();
    let mut types: Vec<i32> = (0..specials.len() as u32)
        .map(|i| if i == unk { 2 } else { 3 })
        .collect();
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    types.extend([6; 256]);
    let letters = (b'a'..=b'z').map(|a| (a as char).to_string());
    let pairs = (b'a'..=b'z')
        .flat_map(|a| (b'a'..=b'z').map(move |b| format!("{}{}", a as char, b as char)));
    let words = std::iter::once(String::new())
        .chain(letters.clone())
        .chain(pairs)
        .map(|w| format!("\u{2581}{w}"))
        .chain(letters);
    for word in words {
        if tokens.len() >= n_vocab as usize {
            break;
        }
        tokens.push(word);
        types.push(1);
    }
    while tokens.len() < n_vocab as usize {
        tokens.push(format!("<unused{}>", tokens.len()));
        types.push(5);
    }
    // Words score by rank (earlier is likelier); control and byte tokens 0.
    let first_word = specials.len() + 256;
    let scores = (0..tokens.len())
        .map(|i| {
            if i < first_word {
                0.0
            } else {
                -((i - first_word) as f32)
            }
        })
        .collect();
    w.add_metadata("tokenizer.ggml.model", Value::String("llama".into()))?;
    w.add_metadata("tokenizer.ggml.pre", Value::String("default".into()))?;
    w.add_metadata("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))?;
    w.add_metadata("tokenizer.ggml.scores", Value::Array(Array::F32(scores)))?;
    w.add_metadata("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))?;
    Ok(())
}

#[cfg(test)]
mod tests;

//! Small llama-family models with random weights, written as GGUF.
//!
//! For format, kernel, scheduling and speed tests on shapes and types the default model does
//! not have. Random weights say nothing about quality; never use them for quality claims.

use crate::gguf::{Array, GgufError, GgufWriter, Value};
use crate::plan::FfnActivation;
use crate::quant::{quantize_row, GgmlType};

/// What to generate.
#[derive(Clone, Debug)]
pub struct SyntheticSpec {
    /// `llama` or `qwen2` (q/k/v biases, NeoX RoPE).
    pub arch: &'static str,
    pub n_layer: u32,
    pub n_embd: u32,
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
    /// Use the embeddings as the output projection.
    pub tied_output: bool,
    pub activation: FfnActivation,
    /// ReLU models: the share of FFN neurons that should fire per token (e.g. 0.1 for the
    /// ~90% natural sparsity of ReluLLaMA-like models). Every token embedding gets a large
    /// constant in dimension 0 and every gate row a negative weight there, which shifts
    /// gate · x below zero for all but about this share. `None`: unshifted (about half fire).
    pub relu_active_share: Option<f32>,
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
            n_layer: 2,
            n_embd: 64,
            n_ff: 128,
            n_head: 4,
            n_head_kv: 2,
            n_vocab: 320,
            n_ctx: 256,
            weight_type: GgmlType::Q4_1,
            embd_type: GgmlType::Q8_0,
            tied_output: true,
            activation: FfnActivation::Silu,
            relu_active_share: None,
            n_expert: 0,
            n_expert_used: 0,
            seed: 1,
        }
    }
}

/// Deterministic normal-ish noise (sum of uniforms), independent of any crate's RNG versions.
struct Noise(u64);

impl Noise {
    fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }

    fn normal(&mut self, std: f32) -> f32 {
        (self.uniform() + self.uniform() + self.uniform() + self.uniform()) * std * 1.732
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

/// Builds the model; write it with [`GgufWriter::write_file_atomic`] or `to_bytes`.
pub fn synthetic_model(spec: &SyntheticSpec) -> Result<GgufWriter, GgufError> {
    let mut w = GgufWriter::new();
    let arch = spec.arch;
    let u32v = |v: u32| Value::U32(v);
    let head_dim = spec.n_embd / spec.n_head;
    w.add_metadata("general.architecture", Value::String(arch.into()))?;
    w.add_metadata("general.name", Value::String(format!("synthetic-{arch}")))?;
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

    let mut noise = Noise(spec.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    // The shift of `relu_active_share`: dimension 0 of every embedding holds SHIFT_DIM and the
    // other dimensions ~N(0, 1); after the RMS norm x0 = SHIFT_DIM / rms and the rest of
    // gate · x is ~N(0, (n_embd − 1) / n_embd / rms²) (gate rows ~N(0, 1 / n_embd)). A weight
    // −w0 on dimension 0 with w0 · x0 = z · that deviation leaves a share p above zero, z the
    // normal quantile (from a logistic approximation).
    const SHIFT_DIM: f32 = 24.0;
    let shift = spec.relu_active_share.map(|p| {
        let p = p.clamp(0.001, 0.999);
        let z = ((1.0 - p) / p).ln() / 1.702;
        let embd = spec.n_embd as f32;
        z * ((embd - 1.0) / embd).sqrt() / SHIFT_DIM
    });
    // `experts` matrices of `rows × cols` (one when 0), written 3-D for a mixture of experts.
    let mut matrices = |w: &mut GgufWriter,
                        name: &str,
                        rows: u32,
                        cols: u32,
                        ty: GgmlType,
                        std: f32,
                        experts: u32| {
        let dims = match experts {
            0 => vec![cols as u64, rows as u64],
            e => vec![cols as u64, rows as u64, e as u64],
        };
        let rows = rows * experts.max(1);
        let mut values: Vec<f32> = (0..rows as usize * cols as usize)
            .map(|_| noise.normal(std))
            .collect();
        if let Some(w0) = shift {
            let first_column = match name {
                "token_embd.weight" => Some(SHIFT_DIM),
                _ if name.ends_with("ffn_gate.weight")
                    || name.ends_with("ffn_gate_exps.weight") =>
                {
                    Some(-w0)
                }
                _ => None,
            };
            if let Some(v) = first_column {
                for row in values.chunks_exact_mut(cols as usize) {
                    row[0] = v;
                }
            }
        }
        let row_bytes = ty.bytes_for(cols as u64).expect("whole blocks") as usize;
        let mut data = vec![0u8; row_bytes * rows as usize];
        for (src, dst) in values
            .chunks_exact(cols as usize)
            .zip(data.chunks_exact_mut(row_bytes))
        {
            quantize_row(ty, src, dst).expect("quantizable type");
        }
        w.add_tensor(name, dims, ty, data)
    };
    let vector = |w: &mut GgufWriter, name: &str, values: Vec<f32>| {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.add_tensor(name, vec![values.len() as u64], GgmlType::F32, data)
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
    let out_scale = if shift.is_some() { 0.2 } else { 1.0 };
    matrices(
        &mut w,
        "token_embd.weight",
        spec.n_vocab,
        embd,
        spec.embd_type,
        1.0,
        0,
    )?;
    for i in 0..spec.n_layer {
        let n = |t: &str| format!("blk.{i}.{t}");
        let ones = |k: u32| {
            (0..k)
                .map(|j| 1.0 + 0.1 * ((j * 7 + i) % 5) as f32 / 5.0)
                .collect()
        };
        vector(&mut w, &n("attn_norm.weight"), ones(embd))?;
        matrices(&mut w, &n("attn_q.weight"), q, embd, wt, s_in, 0)?;
        matrices(&mut w, &n("attn_k.weight"), kv, embd, wt, s_in, 0)?;
        matrices(&mut w, &n("attn_v.weight"), kv, embd, wt, s_in, 0)?;
        matrices(
            &mut w,
            &n("attn_output.weight"),
            embd,
            q,
            wt,
            s_in * out_scale,
            0,
        )?;
        if arch == "qwen2" {
            for (t, len) in [("attn_q.bias", q), ("attn_k.bias", kv), ("attn_v.bias", kv)] {
                let b = (0..len).map(|j| ((j % 7) as f32 - 3.0) * 0.05).collect();
                vector(&mut w, &n(t), b)?;
            }
        }
        vector(&mut w, &n("ffn_norm.weight"), ones(embd))?;
        let e = spec.n_expert;
        if e > 0 {
            // Router logits of spread ~2 make clear choices, yet every expert gets chosen.
            matrices(
                &mut w,
                &n("ffn_gate_inp.weight"),
                e,
                embd,
                GgmlType::F32,
                2.0 * s_in,
                0,
            )?;
        }
        let names = match e {
            0 => ["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"],
            _ => [
                "ffn_gate_exps.weight",
                "ffn_up_exps.weight",
                "ffn_down_exps.weight",
            ],
        };
        matrices(&mut w, &n(names[0]), ff, embd, wt, s_in, e)?;
        matrices(&mut w, &n(names[1]), ff, embd, wt, s_in, e)?;
        matrices(&mut w, &n(names[2]), embd, ff, wt, s_ff * out_scale, e)?;
    }
    vector(&mut w, "output_norm.weight", vec![1.0; embd as usize])?;
    if !spec.tied_output {
        matrices(
            &mut w,
            "output.weight",
            spec.n_vocab,
            embd,
            spec.embd_type,
            s_in,
            0,
        )?;
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

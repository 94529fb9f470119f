//! The tensor layout of a synthetic model: its metadata and, per architecture, which tensors it
//! holds, their shapes, types and deviations ([`SyntheticModel::new`]).

use super::arch::{arch_info, RopeFactors};
use super::model::{Planned, Values};
use super::noise::Jumps;
use super::sparsity::{Role, Shift};
use super::types::{matrix_type, Kind};
use super::vocab::add_vocab;
use super::{SyntheticModel, SyntheticSpec, TypeMix};
use crate::gguf::{GgufError, GgufWriter, Value};
use crate::plan::FfnActivation;
use crate::quant::GgmlType;

/// Weights of norm `layer` (`None`: the output norm's, all 1).
pub(super) fn norm_weights(layer: Option<u32>, k: u32) -> Vec<f32> {
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

/// Llama 3.1's RoPE frequency factors for `n_rot` rotated dimensions (convert_hf_to_gguf's
/// formula): 1 for short wavelengths, `factor` for long ones, smoothly between.
pub(super) fn llama3_rope_factors(
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
}

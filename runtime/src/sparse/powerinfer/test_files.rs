//! PowerInfer-format model and predictor files written from a random-weight model
//! ([`synthetic_model`]), for tests and benchmarks: compiled in tests and with the runtime's
//! `synthetic` feature only.

use super::{
    down_t_name, fc1_name, fc2_name, tensor, PowerInferError, MAGIC, SPARSE_THRESHOLD_KEY,
};
use crate::gguf::{GgufError, GgufFile, GgufWriter, Value};
use crate::quant::{dequantize_row, quantize_row, transpose_requantize, GgmlType, MatRef};
use crate::synthetic::{synthetic_model, SyntheticSpec};
use std::path::Path;

/// What [`powerinfer_test_files`] adds to a synthetic model.
#[derive(Clone, Debug)]
pub struct PowerInferTestSpec {
    /// Predictor hidden size (any positive value the `fc_type` blocks divide).
    pub rank: usize,
    /// Type of `fc1`/`fc2` (PowerInfer's converter writes F16 by default, or F32).
    pub fc_type: GgmlType,
    /// `powerinfer.sparse_threshold`, written to both files when set.
    pub threshold: Option<f32>,
    /// Also write `fc1`/`fc2` into the model file (PowerInfer's own layout); they are always
    /// in the predictor file.
    pub predictors_in_model: bool,
    pub seed: u64,
}

impl Default for PowerInferTestSpec {
    fn default() -> Self {
        PowerInferTestSpec {
            rank: 48,
            fc_type: GgmlType::F16,
            threshold: Some(0.25),
            predictors_in_model: true,
            seed: 7,
        }
    }
}

/// A synthetic PowerInfer model and predictor file, and the values written.
#[derive(Clone, Debug)]
pub struct PowerInferTestFiles {
    /// The synthetic model (keeping its `ffn_down`, so our loader takes it) plus
    /// `ffn_down_t`, the threshold and, if asked, `fc1`/`fc2`; `PWRI` magic.
    pub model: Vec<u8>,
    /// `fc1`/`fc2` of every layer and the threshold; `PWRI` magic.
    pub predictor: Vec<u8>,
    /// Per layer, `fc1` (`rank × n_embd`) and `fc2` (`n_ff × rank`) as stored (after rounding
    /// to `fc_type`), row-major.
    pub fc1: Vec<Vec<f32>>,
    pub fc2: Vec<Vec<f32>>,
    /// Per layer, the bytes of `ffn_down_t` and their type.
    pub down_t: Vec<(GgmlType, Vec<u8>)>,
}

/// Deterministic noise: a sum of four uniforms, about normal.
pub(super) struct Noise(crate::sample::SplitMix64);

impl Noise {
    pub(super) fn new(seed: u64) -> Noise {
        Noise(crate::sample::SplitMix64::new(seed))
    }

    pub(super) fn normal(&mut self, std: f32) -> f32 {
        let s: f32 = (0..4).map(|_| 0.5 * self.0.signed_unit()).sum();
        s * std * 1.732
    }
}

/// `rows × cols` values quantized row-wise to `ty`, and the values as stored.
fn stored(
    name: &str,
    ty: GgmlType,
    values: &[f32],
    cols: usize,
) -> Result<(Vec<u8>, Vec<f32>), PowerInferError> {
    let quant = |source| PowerInferError::Quant {
        tensor: name.to_string(),
        source,
    };
    let rb = crate::quant::row_bytes(ty, cols).map_err(quant)?;
    let rows = values.len() / cols;
    let mut bytes = vec![0u8; rows * rb];
    let mut back = vec![0f32; values.len()];
    for ((src, dst), out) in values
        .chunks_exact(cols)
        .zip(bytes.chunks_exact_mut(rb))
        .zip(back.chunks_exact_mut(cols))
    {
        quantize_row(ty, src, dst).map_err(quant)?;
        dequantize_row(ty, dst, out).map_err(quant)?;
    }
    Ok((bytes, back))
}

/// `bytes` with the first four bytes replaced by [`MAGIC`], as PowerInfer's converter does.
fn with_magic(mut bytes: Vec<u8>) -> Vec<u8> {
    bytes[..4].copy_from_slice(&MAGIC);
    bytes
}

/// Builds a PowerInfer-style model from `model` (use `activation: FfnActivation::Relu`) and a
/// separate predictor file, laid out as PowerInfer lays them out: `fc1` ggml shape
/// `[n_embd, rank]`, `fc2` `[rank, n_ff]`, `ffn_down_t` `[n_embd, n_ff]` (the synthetic down
/// projection transposed, in the model's weight type when that can be written row-wise, F16
/// otherwise), `powerinfer.sparse_threshold` an f32, both files with the `PWRI` magic.
pub fn powerinfer_test_files(
    model: &SyntheticSpec,
    spec: &PowerInferTestSpec,
) -> Result<PowerInferTestFiles, PowerInferError> {
    let (n_embd, n_ff) = (model.n_embd as usize, model.n_ff as usize);
    let mut w = synthetic_model(model)?;
    let plain = GgufFile::from_bytes(w.to_bytes()?)?;
    let mut pred = GgufWriter::new();
    pred.add_metadata("general.architecture", Value::String(model.arch.into()))?;
    if let Some(t) = spec.threshold {
        w.add_metadata(SPARSE_THRESHOLD_KEY, Value::F32(t))?;
        pred.add_metadata(SPARSE_THRESHOLD_KEY, Value::F32(t))?;
    }
    let down_ty = match model.weight_type {
        t @ (GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::F16 | GgmlType::F32) => t,
        _ => GgmlType::F16,
    };
    let mut noise = Noise::new(spec.seed);
    let mut out = PowerInferTestFiles {
        model: Vec::new(),
        predictor: Vec::new(),
        fc1: Vec::new(),
        fc2: Vec::new(),
        down_t: Vec::new(),
    };
    let r = spec.rank;
    for l in 0..model.n_layer as usize {
        let down_name = format!("blk.{l}.ffn_down.weight");
        let t = tensor(&plain, &down_name, "the synthetic model has one per layer")?;
        let down = MatRef::new(t.ty, plain.tensor_data(t), n_embd, n_ff).map_err(|source| {
            PowerInferError::Quant {
                tensor: down_name.clone(),
                source,
            }
        })?;
        let down_t =
            transpose_requantize(down, down_ty).map_err(|source| PowerInferError::Quant {
                tensor: down_t_name(l),
                source,
            })?;
        w.add_tensor(
            down_t_name(l),
            vec![n_embd as u64, n_ff as u64],
            down_ty,
            down_t.clone(),
        )?;
        out.down_t.push((down_ty, down_t));

        let v1: Vec<f32> = (0..r * n_embd)
            .map(|_| noise.normal(1.0 / (n_embd as f32).sqrt()))
            .collect();
        let v2: Vec<f32> = (0..n_ff * r)
            .map(|_| noise.normal(1.0 / (r as f32).sqrt()))
            .collect();
        let (b1, s1) = stored(&fc1_name(l), spec.fc_type, &v1, n_embd)?;
        let (b2, s2) = stored(&fc2_name(l), spec.fc_type, &v2, r)?;
        let (d1, d2) = (vec![n_embd as u64, r as u64], vec![r as u64, n_ff as u64]);
        if spec.predictors_in_model {
            w.add_tensor(fc1_name(l), d1.clone(), spec.fc_type, b1.clone())?;
            w.add_tensor(fc2_name(l), d2.clone(), spec.fc_type, b2.clone())?;
        }
        pred.add_tensor(fc1_name(l), d1, spec.fc_type, b1)?;
        pred.add_tensor(fc2_name(l), d2, spec.fc_type, b2)?;
        out.fc1.push(s1);
        out.fc2.push(s2);
    }
    out.model = with_magic(w.to_bytes()?);
    out.predictor = with_magic(pred.to_bytes()?);
    Ok(out)
}

/// [`powerinfer_test_files`], written to `model_path` and `predictor_path`.
pub fn write_powerinfer_test_files(
    model: &SyntheticSpec,
    spec: &PowerInferTestSpec,
    model_path: &Path,
    predictor_path: &Path,
) -> Result<PowerInferTestFiles, PowerInferError> {
    let files = powerinfer_test_files(model, spec)?;
    for (path, bytes) in [
        (model_path, &files.model),
        (predictor_path, &files.predictor),
    ] {
        std::fs::write(path, bytes).map_err(|source| GgufError::Io {
            op: "write",
            path: path.display().to_string(),
            source,
        })?;
    }
    Ok(files)
}

//! PowerInfer's sparse-model files: per-layer predictors and transposed down projections.
//!
//! PowerInfer (SJTU-IPADS/PowerInfer) ships ReLU models (ReluLLaMA, ProSparse, Bamboo,
//! TurboSparse) as GGUF files with extra pieces, which this module reads:
//!
//! - the magic `PWRI` instead of `GGUF` (the rest of the file is plain GGUF; our reader accepts
//!   both, see [`GgufFile::is_powerinfer`]);
//! - `blk.N.fc1.weight`, ggml shape `[n_embd, rank]` (`rank` rows of `n_embd`), and
//!   `blk.N.fc2.weight`, ggml shape `[rank, n_ff]` (`n_ff` rows of `rank`): the predictor MLP
//!   `logits = fc2 · ReLU(fc1 · x)`, without biases, any rank;
//! - `blk.N.ffn_down_t.weight`, ggml shape `[n_embd, n_ff]`: the down projection transposed,
//!   one row of `n_embd` per neuron (PowerInfer's converter writes it *instead of*
//!   `ffn_down.weight`);
//! - `powerinfer.sparse_threshold` (f32): the predictor's decision threshold. A neuron is
//!   computed when its logit is `>=` the threshold (PowerInfer skips rows whose logit is below
//!   it); absent, PowerInfer uses 0. It is not an activation threshold: a computed neuron's
//!   activation is the plain ReLU.
//!
//! PowerInfer feeds the predictor of a llama-family layer the FFN *input before its RMS norm*
//! (the residual stream after attention), while the FFN itself gets the normed input.
//!
//! [`read_powerinfer`] turns these into [`PowerInferSparse`]: our Q8_0 [`Predictor`]s and the
//! `ffn_down_t` bytes as they are. [`powerinfer_test_files`] writes such files from a
//! [`synthetic_model`](crate::synthetic::synthetic_model), for tests.

use super::predictor::{Predictor, PredictorError};
use crate::gguf::{GgufError, GgufFile, GgufWriter, TensorInfo, Value};
use crate::quant::{
    dequantize_row, quantize_row, transpose_requantize, GgmlType, MatRef, QuantError,
};
use crate::synthetic::{synthetic_model, SyntheticSpec};
use std::path::Path;

/// PowerInfer's file magic (the first four bytes, in place of `GGUF`).
pub const MAGIC: [u8; 4] = *b"PWRI";
/// The metadata key of the predictors' decision threshold (f32).
pub const SPARSE_THRESHOLD_KEY: &str = "powerinfer.sparse_threshold";
/// Prefix of PowerInfer's metadata keys.
pub const KEY_PREFIX: &str = "powerinfer.";

/// Name of layer `l`'s first predictor matrix (`[n_embd, rank]`).
pub fn fc1_name(l: usize) -> String {
    format!("blk.{l}.fc1.weight")
}

/// Name of layer `l`'s second predictor matrix (`[rank, n_ff]`).
pub fn fc2_name(l: usize) -> String {
    format!("blk.{l}.fc2.weight")
}

/// Name of layer `l`'s transposed down projection (`[n_embd, n_ff]`).
pub fn down_t_name(l: usize) -> String {
    format!("blk.{l}.ffn_down_t.weight")
}

/// What a PowerInfer file holds, as [`read_powerinfer`] found it.
#[derive(Clone, Debug, PartialEq)]
pub struct PowerInferSparse {
    /// `powerinfer.sparse_threshold`, if a file has it (PowerInfer's default is 0). The
    /// predictors were built with this threshold, or 0 without it.
    pub threshold: Option<f32>,
    /// One per model layer.
    pub layers: Vec<PowerInferLayer>,
}

/// One layer's PowerInfer pieces. Each is present in every layer or in none.
#[derive(Clone, Debug, PartialEq)]
pub struct PowerInferLayer {
    /// `fc1`/`fc2` in our inference form (Q8_0, zero biases, rank padded to a multiple of 32).
    pub predictor: Option<Predictor>,
    /// `ffn_down_t` as stored: `n_ff` rows (one per neuron) of `n_embd` values of the type.
    pub down_t: Option<(GgmlType, Vec<u8>)>,
}

impl PowerInferSparse {
    /// Whether the layers have predictors.
    pub fn has_predictors(&self) -> bool {
        self.layers.iter().any(|l| l.predictor.is_some())
    }

    /// The type of every layer's `down_t`, if they all have one of the same type.
    pub fn down_type(&self) -> Option<GgmlType> {
        let first = self.layers.first()?.down_t.as_ref()?.0;
        self.layers
            .iter()
            .all(|l| l.down_t.as_ref().is_some_and(|d| d.0 == first))
            .then_some(first)
    }

    /// Bytes held (predictors and transposed down projections).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| {
                l.predictor.as_ref().map_or(0, Predictor::bytes)
                    + l.down_t.as_ref().map_or(0, |d| d.1.len())
            })
            .sum()
    }
}

/// Why PowerInfer pieces could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PowerInferError {
    #[error("tensor {tensor}: ggml shape {found:?}, expected {expected}")]
    Shape {
        tensor: String,
        expected: String,
        found: Vec<u64>,
    },
    #[error("tensor {tensor} is missing ({why})")]
    Missing { tensor: String, why: String },
    #[error("tensor {tensor}: layer {layer} is past the model's {n_layer} layers")]
    ExtraLayer {
        tensor: String,
        layer: usize,
        n_layer: usize,
    },
    #[error("tensor {tensor}: type {ty} is not supported here ({why})")]
    UnsupportedType {
        tensor: String,
        ty: GgmlType,
        why: &'static str,
    },
    #[error("tensor {tensor}: {why}")]
    Unexpected { tensor: String, why: String },
    #[error("metadata {key}: {why}")]
    Metadata { key: String, why: String },
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("tensor {tensor}: {source}")]
    Quant {
        tensor: String,
        #[source]
        source: QuantError,
    },
    #[error("predictor of layer {layer}: {source}")]
    Predictor {
        layer: usize,
        #[source]
        source: PredictorError,
    },
}

/// The PowerInfer tensors this module knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Piece {
    Fc1,
    Fc2,
    DownT,
}

/// `blk.N.<fc1|fc2|ffn_down_t>.<suffix>` → (N, piece, suffix).
fn parse_name(name: &str) -> Option<(usize, Piece, &str)> {
    let rest = name.strip_prefix("blk.")?;
    let (n, rest) = rest.split_once('.')?;
    let layer = n.parse().ok()?;
    let (what, suffix) = rest.split_once('.')?;
    let piece = match what {
        "fc1" => Piece::Fc1,
        "fc2" => Piece::Fc2,
        "ffn_down_t" => Piece::DownT,
        _ => return None,
    };
    Some((layer, piece, suffix))
}

fn has_piece(f: &GgufFile, want: &[Piece]) -> bool {
    f.tensors()
        .iter()
        .any(|t| parse_name(&t.name).is_some_and(|(_, p, _)| want.contains(&p)))
}

fn has_any(f: &GgufFile) -> bool {
    has_piece(f, &[Piece::Fc1, Piece::Fc2, Piece::DownT])
        || f.metadata().iter().any(|(k, _)| k.starts_with(KEY_PREFIX))
}

/// Every PowerInfer tensor of `f` must be a `.weight` of a layer below `n_layer`.
fn check_names(f: &GgufFile, n_layer: usize) -> Result<(), PowerInferError> {
    for t in f.tensors() {
        let Some((layer, _, suffix)) = parse_name(&t.name) else {
            continue;
        };
        if suffix != "weight" {
            return Err(PowerInferError::Unexpected {
                tensor: t.name.clone(),
                why: "PowerInfer's predictors and ffn_down_t have weights only (no biases)".into(),
            });
        }
        if layer >= n_layer {
            return Err(PowerInferError::ExtraLayer {
                tensor: t.name.clone(),
                layer,
                n_layer,
            });
        }
    }
    Ok(())
}

fn threshold_of(f: &GgufFile) -> Result<Option<f32>, PowerInferError> {
    let Some(t) = f.get_f32(SPARSE_THRESHOLD_KEY)? else {
        return Ok(None);
    };
    if !t.is_finite() {
        return Err(PowerInferError::Metadata {
            key: SPARSE_THRESHOLD_KEY.into(),
            why: format!("{t} is not a finite threshold"),
        });
    }
    Ok(Some(t))
}

/// A 2-D tensor as `rows × cols` f32 values (row-major), from any type `dequantize_row` reads.
fn dequantize_matrix(
    f: &GgufFile,
    t: &TensorInfo,
    rows: usize,
    cols: usize,
) -> Result<Vec<f32>, PowerInferError> {
    let quant = |source| PowerInferError::Quant {
        tensor: t.name.clone(),
        source,
    };
    let data = f.tensor_data(t);
    let rb =
        t.ty.bytes_for(cols as u64)
            .map(|b| b as usize)
            .ok_or_else(|| PowerInferError::Unexpected {
                tensor: t.name.clone(),
                why: format!("rows of {cols} are not whole {} blocks", t.ty),
            })?;
    let mut out = vec![0f32; rows * cols];
    for (src, dst) in data.chunks_exact(rb).zip(out.chunks_exact_mut(cols)) {
        dequantize_row(t.ty, src, dst).map_err(|e| match e {
            QuantError::Unsupported { .. } => PowerInferError::UnsupportedType {
                tensor: t.name.clone(),
                ty: t.ty,
                why: "predictor weights must be F32, F16 or a type the runtime dequantizes",
            },
            e => quant(e),
        })?;
    }
    Ok(out)
}

fn tensor<'f>(f: &'f GgufFile, name: &str, why: &str) -> Result<&'f TensorInfo, PowerInferError> {
    f.tensor(name).ok_or_else(|| PowerInferError::Missing {
        tensor: name.to_string(),
        why: why.to_string(),
    })
}

fn read_predictor(
    f: &GgufFile,
    l: usize,
    n_embd: usize,
    n_ff: usize,
    threshold: f32,
) -> Result<Predictor, PowerInferError> {
    let why = "the file has predictors for other layers; PowerInfer needs one per layer";
    let (n1, n2) = (fc1_name(l), fc2_name(l));
    let t1 = tensor(f, &n1, why)?;
    let t2 = tensor(f, &n2, why)?;
    let rank = match t1.dims[..] {
        [e, r] if e == n_embd as u64 && r > 0 => r as usize,
        _ => {
            return Err(PowerInferError::Shape {
                tensor: n1,
                expected: format!("[{n_embd}, rank] (n_embd, rank)"),
                found: t1.dims.clone(),
            })
        }
    };
    if t2.dims != [rank as u64, n_ff as u64] {
        return Err(PowerInferError::Shape {
            tensor: n2,
            expected: format!("[{rank}, {n_ff}] (rank of {n1}, n_ff)"),
            found: t2.dims.clone(),
        });
    }
    let fc1 = dequantize_matrix(f, t1, rank, n_embd)?;
    let fc2 = dequantize_matrix(f, t2, n_ff, rank)?;
    Predictor::from_weights(
        n_embd,
        n_ff,
        rank,
        &fc1,
        vec![0.0; rank],
        &fc2,
        vec![0.0; n_ff],
        threshold,
    )
    .map_err(|source| PowerInferError::Predictor { layer: l, source })
}

fn read_down_t(
    f: &GgufFile,
    l: usize,
    n_embd: usize,
    n_ff: usize,
) -> Result<(GgmlType, Vec<u8>), PowerInferError> {
    let name = down_t_name(l);
    let t = tensor(
        f,
        &name,
        "the file has ffn_down_t for other layers; PowerInfer needs one per layer",
    )?;
    if t.dims != [n_embd as u64, n_ff as u64] {
        return Err(PowerInferError::Shape {
            tensor: name,
            expected: format!("[{n_embd}, {n_ff}] (n_embd, n_ff)"),
            found: t.dims.clone(),
        });
    }
    if !t.ty.is_supported() {
        return Err(PowerInferError::UnsupportedType {
            tensor: name,
            ty: t.ty,
            why: "the runtime's kernels do not read it",
        });
    }
    Ok((t.ty, f.tensor_data(t).to_vec()))
}

/// Reads the PowerInfer pieces of a model of `n_layer` layers of `n_embd × n_ff`: predictors
/// from `predictor_file` when it has any `fc1`/`fc2` tensors, else from `model_file`; the
/// threshold from `predictor_file` when it has the key, else from `model_file`; `ffn_down_t`
/// from `model_file`, else from `predictor_file`. Either file may carry the `PWRI` or the
/// `GGUF` magic (PowerInfer itself reads the threshold only from `PWRI` files).
///
/// `Ok(None)` when neither file has a PowerInfer tensor or `powerinfer.*` key.
///
/// # Errors
/// A tensor of the wrong shape, one missing in some layer while present in another, one for
/// a layer past `n_layer`, a bias tensor, a type that cannot be read, a threshold that is not
/// a finite f32, or an `n_embd` the predictors cannot serve (not a multiple of 32).
pub fn read_powerinfer(
    model_file: &GgufFile,
    predictor_file: Option<&GgufFile>,
    n_embd: usize,
    n_ff: usize,
    n_layer: usize,
) -> Result<Option<PowerInferSparse>, PowerInferError> {
    if !has_any(model_file) && !predictor_file.is_some_and(has_any) {
        return Ok(None);
    }
    check_names(model_file, n_layer)?;
    if let Some(p) = predictor_file {
        check_names(p, n_layer)?;
    }
    let fc = [Piece::Fc1, Piece::Fc2];
    let pred_src = match predictor_file {
        Some(p) if has_piece(p, &fc) => Some(p),
        _ => has_piece(model_file, &fc).then_some(model_file),
    };
    let down_src = if has_piece(model_file, &[Piece::DownT]) {
        Some(model_file)
    } else {
        predictor_file.filter(|p| has_piece(p, &[Piece::DownT]))
    };
    let threshold = match predictor_file.map(threshold_of).transpose()?.flatten() {
        Some(t) => Some(t),
        None => threshold_of(model_file)?,
    };
    let mut layers = Vec::with_capacity(n_layer);
    for l in 0..n_layer {
        let predictor = pred_src
            .map(|f| read_predictor(f, l, n_embd, n_ff, threshold.unwrap_or(0.0)))
            .transpose()?;
        let down_t = down_src
            .map(|f| read_down_t(f, l, n_embd, n_ff))
            .transpose()?;
        layers.push(PowerInferLayer { predictor, down_t });
    }
    Ok(Some(PowerInferSparse { threshold, layers }))
}

// ------------------------------------------------------------------------------ test files

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

/// Deterministic noise (xorshift, sum of uniforms).
struct Noise(u64);

impl Noise {
    fn normal(&mut self, std: f32) -> f32 {
        let mut s = 0.0;
        for _ in 0..4 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            s += (self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        }
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
    let mut noise = Noise(spec.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{FfnActivation, Model};
    use crate::quant::Kernels;
    use crate::sparse::predictor::PredictorScratch;

    fn relu_spec() -> SyntheticSpec {
        SyntheticSpec {
            n_layer: 3,
            n_embd: 64,
            n_ff: 160,
            activation: FfnActivation::Relu,
            relu_active_share: Some(0.2),
            ..SyntheticSpec::default()
        }
    }

    #[test]
    fn powerinfer_files_without_an_activation_key_are_relu() {
        // Our synthetic SiLU models write no activation key, like PowerInfer's converter.
        let spec = SyntheticSpec {
            activation: FfnActivation::Silu,
            ..relu_spec()
        };
        let bytes = synthetic_model(&spec).unwrap().to_bytes().unwrap();
        let plain = Model::from_gguf(open(&bytes)).unwrap();
        assert_eq!(plain.config.activation, FfnActivation::Silu);
        let pwri = Model::from_gguf(open(&with_magic(bytes))).unwrap();
        assert_eq!(pwri.config.activation, FfnActivation::Relu);
    }

    fn open(bytes: &[u8]) -> GgufFile {
        GgufFile::from_bytes(bytes.to_vec()).unwrap()
    }

    fn read(
        model: &GgufFile,
        pred: Option<&GgufFile>,
    ) -> Result<Option<PowerInferSparse>, PowerInferError> {
        let s = relu_spec();
        read_powerinfer(
            model,
            pred,
            s.n_embd as usize,
            s.n_ff as usize,
            s.n_layer as usize,
        )
    }

    /// f32 `fc2 · ReLU(fc1 · x)`, and per logit `Σ_j |fc2_ij| · Σ_k |fc1_jk x_k|` (the scale
    /// Q8_0's relative errors apply to).
    fn reference(fc1: &[f32], fc2: &[f32], x: &[f32], rank: usize) -> (Vec<f32>, Vec<f32>) {
        let d = x.len();
        let h: Vec<f32> = (0..rank)
            .map(|j| {
                let row = &fc1[j * d..(j + 1) * d];
                row.iter().zip(x).map(|(w, x)| w * x).sum::<f32>().max(0.0)
            })
            .collect();
        let habs: Vec<f32> = (0..rank)
            .map(|j| {
                let row = &fc1[j * d..(j + 1) * d];
                row.iter().zip(x).map(|(w, x)| (w * x).abs()).sum::<f32>()
            })
            .collect();
        let n_ff = fc2.len() / rank;
        let logits = (0..n_ff)
            .map(|i| {
                let row = &fc2[i * rank..(i + 1) * rank];
                row.iter().zip(&h).map(|(w, h)| w * h).sum()
            })
            .collect();
        let scale = (0..n_ff)
            .map(|i| {
                let row = &fc2[i * rank..(i + 1) * rank];
                row.iter().zip(&habs).map(|(w, h)| w.abs() * h).sum()
            })
            .collect();
        (logits, scale)
    }

    fn inputs(n: usize, d: usize) -> Vec<Vec<f32>> {
        let mut noise = Noise(12345);
        (0..n)
            .map(|_| (0..d).map(|_| noise.normal(1.0)).collect())
            .collect()
    }

    /// The predictors' logits match an f32 evaluation of the stored weights within Q8_0 error.
    fn check_logits(sparse: &PowerInferSparse, files: &PowerInferTestFiles, rank: usize) {
        let kernels = Kernels::best();
        let n_embd = relu_spec().n_embd as usize;
        let (mut worst, mut worst_rms, mut sum, mut n) = (0f32, 0f32, 0f32, 0usize);
        for (l, layer) in sparse.layers.iter().enumerate() {
            let p = layer.predictor.as_ref().expect("predictor");
            assert_eq!(p.rank(), rank.div_ceil(32) * 32);
            let mut scratch = PredictorScratch::new(p);
            for x in inputs(8, n_embd) {
                let (want, scale) = reference(&files.fc1[l], &files.fc2[l], &x, rank);
                let got = p.logits(&kernels, &x, &mut scratch);
                let rms = (want.iter().map(|w| w * w).sum::<f32>() / want.len() as f32).sqrt();
                for ((g, w), s) in got.iter().zip(&want).zip(&scale) {
                    let rel = (g - w).abs() / s.max(1e-6);
                    worst = worst.max(rel);
                    worst_rms = worst_rms.max((g - w).abs() / rms);
                    sum += rel;
                    n += 1;
                }
            }
        }
        assert!(worst < 0.01, "worst error {worst} of the abs-sum scale");
        assert!(sum / (n as f32) < 0.002, "mean error {}", sum / n as f32);
        assert!(
            worst_rms < 0.1,
            "worst error {worst_rms} of the logits' rms"
        );
    }

    #[test]
    fn powerinfer_files_load_as_model_and_predictors() {
        let spec = PowerInferTestSpec::default();
        let files = powerinfer_test_files(&relu_spec(), &spec).unwrap();
        let model_file = open(&files.model);
        assert!(model_file.is_powerinfer());
        assert_eq!(&files.model[..4], b"PWRI");
        assert_eq!(&files.predictor[..4], b"PWRI");
        // ne order as PowerInfer writes it.
        assert_eq!(
            model_file.tensor("blk.0.fc1.weight").unwrap().dims,
            [64, 48]
        );
        assert_eq!(
            model_file.tensor("blk.0.fc2.weight").unwrap().dims,
            [48, 160]
        );
        assert_eq!(
            model_file.tensor("blk.2.ffn_down_t.weight").unwrap().dims,
            [64, 160]
        );

        let sparse = read(&model_file, None).unwrap().expect("pieces");
        assert_eq!(sparse.threshold, Some(0.25));
        assert_eq!(sparse.layers.len(), 3);
        assert!(sparse.has_predictors());
        for (l, layer) in sparse.layers.iter().enumerate() {
            assert_eq!(layer.predictor.as_ref().unwrap().threshold(), 0.25);
            assert_eq!(layer.down_t.as_ref(), Some(&files.down_t[l]));
            // Exactly the predictor `from_weights` makes of the stored values.
            let want = Predictor::from_weights(
                64,
                160,
                48,
                &files.fc1[l],
                vec![0.0; 48],
                &files.fc2[l],
                vec![0.0; 160],
                0.25,
            )
            .unwrap();
            assert_eq!(layer.predictor.as_ref(), Some(&want));
        }
        assert_eq!(sparse.down_type(), Some(GgmlType::Q4_1));
        check_logits(&sparse, &files, 48);

        // The same file loads as an ordinary model (the extra tensors are ignored).
        let model = Model::from_gguf(model_file).unwrap();
        assert_eq!(model.layers.len(), 3);
        assert_eq!(model.config.activation, FfnActivation::Relu);
    }

    #[test]
    fn powerinfer_predictor_file_supplies_predictors() {
        let spec = PowerInferTestSpec {
            rank: 64,
            fc_type: GgmlType::F32,
            threshold: None,
            predictors_in_model: false,
            seed: 3,
        };
        let files = powerinfer_test_files(&relu_spec(), &spec).unwrap();
        let (model_file, pred_file) = (open(&files.model), open(&files.predictor));
        assert!(pred_file.is_powerinfer());
        // The model file alone: down_t, no predictors.
        let alone = read(&model_file, None).unwrap().unwrap();
        assert!(!alone.has_predictors());
        assert!(alone.layers.iter().all(|l| l.down_t.is_some()));
        // With the predictor file.
        let sparse = read(&model_file, Some(&pred_file)).unwrap().unwrap();
        assert_eq!(sparse.threshold, None);
        assert_eq!(
            sparse.layers[0].predictor.as_ref().unwrap().threshold(),
            0.0
        );
        check_logits(&sparse, &files, 64);
        // The predictor file alone, next to a plain model: predictors, no down_t.
        let plain = open(&synthetic_model(&relu_spec()).unwrap().to_bytes().unwrap());
        let only = read(&plain, Some(&pred_file)).unwrap().unwrap();
        assert!(only.has_predictors());
        assert!(only.layers.iter().all(|l| l.down_t.is_none()));
        assert_eq!(only.down_type(), None);
    }

    #[test]
    fn powerinfer_absent_gives_none() {
        let plain = open(&synthetic_model(&relu_spec()).unwrap().to_bytes().unwrap());
        assert!(read(&plain, None).unwrap().is_none());
        let empty = open(&GgufWriter::new().to_bytes().unwrap());
        assert!(read(&plain, Some(&empty)).unwrap().is_none());
        // Unrelated `blk.N.*` tensors (PowerInfer's GPU index, say) are not pieces.
        let mut w = GgufWriter::new();
        w.add_tensor("blk.0.gpu_idx", vec![160], GgmlType::I32, vec![0; 640])
            .unwrap();
        assert!(read(&plain, Some(&open(&w.to_bytes().unwrap())))
            .unwrap()
            .is_none());
    }

    #[test]
    fn powerinfer_rank_padding_keeps_logits() {
        let (d, f, r) = (64, 96, 40);
        let mut noise = Noise(99);
        let fc1: Vec<f32> = (0..r * d).map(|_| noise.normal(0.2)).collect();
        let fc2: Vec<f32> = (0..f * r).map(|_| noise.normal(0.2)).collect();
        let b1: Vec<f32> = (0..r).map(|_| noise.normal(0.1)).collect();
        let b2: Vec<f32> = (0..f).map(|_| noise.normal(0.1)).collect();
        let p = Predictor::from_weights(d, f, r, &fc1, b1.clone(), &fc2, b2.clone(), 0.1).unwrap();
        assert_eq!(p.rank(), 64);
        // The same network padded by hand to rank 64.
        let mut fc1p = fc1.clone();
        fc1p.resize(64 * d, 0.0);
        let mut fc2p = vec![0f32; f * 64];
        for i in 0..f {
            fc2p[i * 64..i * 64 + r].copy_from_slice(&fc2[i * r..(i + 1) * r]);
        }
        let mut b1p = b1;
        b1p.resize(64, 0.0);
        let q = Predictor::from_weights(d, f, 64, &fc1p, b1p, &fc2p, b2, 0.1).unwrap();
        assert_eq!(p, q);
        let kernels = Kernels::best();
        let mut s = PredictorScratch::new(&p);
        for x in inputs(4, d) {
            let a = p.logits(&kernels, &x, &mut s).to_vec();
            let b = q.logits(&kernels, &x, &mut s).to_vec();
            assert_eq!(a, b);
            // And within Q8_0 error of the unpadded f32 network (biases zero here aside).
            assert!(a.iter().all(|v| v.is_finite()));
        }
        // Without biases, against the f32 reference of the unpadded weights.
        let p0 =
            Predictor::from_weights(d, f, r, &fc1, vec![0.0; r], &fc2, vec![0.0; f], 0.0).unwrap();
        let mut s0 = PredictorScratch::new(&p0);
        for x in inputs(4, d) {
            let (want, scale) = reference(&fc1, &fc2, &x, r);
            let got = p0.logits(&kernels, &x, &mut s0);
            for ((g, w), s) in got.iter().zip(&want).zip(&scale) {
                assert!((g - w).abs() <= 0.03 * s + 1e-6, "{g} vs {w} (scale {s})");
            }
        }
    }

    #[test]
    fn powerinfer_from_weights_rejects_bad_input() {
        let ok = |r: usize| (vec![0.5f32; r * 64], vec![0.5f32; 32 * r]);
        let (fc1, fc2) = ok(8);
        let e = Predictor::from_weights(48, 32, 8, &fc1, vec![0.0; 8], &fc2, vec![0.0; 32], 0.0);
        assert!(matches!(e, Err(PredictorError::EmbdNotBlockMultiple(48))));
        let e =
            Predictor::from_weights(64, 32, 8, &fc1[1..], vec![0.0; 8], &fc2, vec![0.0; 32], 0.0);
        assert!(matches!(e, Err(PredictorError::Length { .. })));
        let e = Predictor::from_weights(64, 32, 0, &[], vec![], &[], vec![0.0; 32], 0.0);
        assert!(matches!(e, Err(PredictorError::Config(_))));
        let mut bad = fc1.clone();
        bad[3] = f32::NAN;
        let e = Predictor::from_weights(64, 32, 8, &bad, vec![0.0; 8], &fc2, vec![0.0; 32], 0.0);
        assert!(matches!(e, Err(PredictorError::Malformed(_))));
        let e =
            Predictor::from_weights(64, 32, 8, &fc1, vec![0.0; 8], &fc2, vec![0.0; 32], f32::NAN);
        assert!(matches!(e, Err(PredictorError::Malformed(_))));
    }

    /// A file whose metadata `meta` writes, then the tensors `tensor(l, ..)` writes for each of
    /// `layers` layers.
    fn file_with(
        layers: usize,
        mut tensor: impl FnMut(usize, &mut GgufWriter),
        meta: impl FnOnce(&mut GgufWriter),
    ) -> GgufFile {
        let mut w = GgufWriter::new();
        meta(&mut w);
        for l in 0..layers {
            tensor(l, &mut w);
        }
        open(&w.to_bytes().unwrap())
    }

    fn f16_tensor(w: &mut GgufWriter, name: String, dims: [u64; 2]) {
        let n = (dims[0] * dims[1]) as usize;
        w.add_tensor(name, dims.to_vec(), GgmlType::F16, vec![0; 2 * n])
            .unwrap();
    }

    fn good_layer(l: usize, w: &mut GgufWriter) {
        f16_tensor(w, fc1_name(l), [64, 32]);
        f16_tensor(w, fc2_name(l), [32, 160]);
    }

    #[test]
    fn powerinfer_errors_name_the_tensor() {
        let plain = open(&GgufWriter::new().to_bytes().unwrap());
        let err = |f: &GgufFile| read(&plain, Some(f)).unwrap_err();
        let msg = |e: &PowerInferError| e.to_string();

        // A good file reads.
        let good = file_with(3, good_layer, |_| {});
        assert_eq!(read(&plain, Some(&good)).unwrap().unwrap().layers.len(), 3);

        // fc1 transposed (torch order instead of ggml order).
        let f = file_with(
            3,
            |l, w| {
                f16_tensor(w, fc1_name(l), [32, 64]);
                f16_tensor(w, fc2_name(l), [32, 160]);
            },
            |_| {},
        );
        let e = err(&f);
        assert!(
            matches!(&e, PowerInferError::Shape { tensor, .. } if tensor == "blk.0.fc1.weight"),
            "{e}"
        );
        assert!(msg(&e).contains("[64, rank]"), "{e}");

        // fc2 with another rank than fc1.
        let f = file_with(
            3,
            |l, w| {
                f16_tensor(w, fc1_name(l), [64, 32]);
                f16_tensor(w, fc2_name(l), [64, 160]);
            },
            |_| {},
        );
        let e = err(&f);
        assert!(
            matches!(&e, PowerInferError::Shape { tensor, .. } if tensor == "blk.0.fc2.weight"),
            "{e}"
        );
        assert!(msg(&e).contains("[32, 160]"), "{e}");

        // A layer without predictor.
        let f = file_with(
            3,
            |l, w| {
                if l != 1 {
                    good_layer(l, w)
                }
            },
            |_| {},
        );
        let e = err(&f);
        assert!(
            matches!(&e, PowerInferError::Missing { tensor, .. } if tensor == "blk.1.fc1.weight"),
            "{e}"
        );

        // A layer past the model's.
        let f = file_with(4, good_layer, |_| {});
        let e = err(&f);
        assert!(
            matches!(&e, PowerInferError::ExtraLayer { layer: 3, .. }),
            "{e}"
        );

        // A type the runtime cannot dequantize.
        let f = file_with(
            3,
            |l, w| {
                w.add_tensor(
                    fc1_name(l),
                    vec![64, 32],
                    GgmlType::Q5_0,
                    vec![0; 2 * 32 * 22],
                )
                .unwrap();
                f16_tensor(w, fc2_name(l), [32, 160]);
            },
            |_| {},
        );
        let e = err(&f);
        assert!(
            matches!(&e, PowerInferError::UnsupportedType { tensor, ty: GgmlType::Q5_0, .. }
                if tensor == "blk.0.fc1.weight"),
            "{e}"
        );

        // A bias (not part of the format).
        let f = file_with(
            3,
            |l, w| {
                good_layer(l, w);
                if l == 2 {
                    w.add_tensor("blk.2.fc1.bias", vec![32], GgmlType::F32, vec![0; 128])
                        .unwrap();
                }
            },
            |_| {},
        );
        assert!(matches!(err(&f), PowerInferError::Unexpected { .. }));

        // down_t of the wrong shape, and of a type the kernels do not read.
        let f = file_with(3, |l, w| f16_tensor(w, down_t_name(l), [160, 64]), |_| {});
        let e = err(&f);
        assert!(
            matches!(&e, PowerInferError::Shape { tensor, .. } if tensor == "blk.0.ffn_down_t.weight"),
            "{e}"
        );
        let f = file_with(
            3,
            |l, w| {
                w.add_tensor(
                    down_t_name(l),
                    vec![64, 160],
                    GgmlType::Q5_0,
                    vec![0; 160 * 2 * 22],
                )
                .unwrap();
            },
            |_| {},
        );
        assert!(matches!(err(&f), PowerInferError::UnsupportedType { .. }));

        // Bad thresholds.
        let f = file_with(3, good_layer, |w| {
            w.add_metadata(SPARSE_THRESHOLD_KEY, Value::String("0.5".into()))
                .unwrap();
        });
        assert!(matches!(err(&f), PowerInferError::Gguf(_)));
        let f = file_with(3, good_layer, |w| {
            w.add_metadata(SPARSE_THRESHOLD_KEY, Value::F32(f32::INFINITY))
                .unwrap();
        });
        assert!(matches!(err(&f), PowerInferError::Metadata { .. }));

        // n_embd the predictors cannot serve.
        let e = read_powerinfer(&plain, Some(&good), 48, 160, 3).unwrap_err();
        assert!(matches!(e, PowerInferError::Shape { .. }), "{e}");
        let f = file_with(
            3,
            |l, w| {
                f16_tensor(w, fc1_name(l), [48, 32]);
                f16_tensor(w, fc2_name(l), [32, 160]);
            },
            |_| {},
        );
        let e = read_powerinfer(&plain, Some(&f), 48, 160, 3).unwrap_err();
        assert!(
            matches!(
                e,
                PowerInferError::Predictor {
                    layer: 0,
                    source: PredictorError::EmbdNotBlockMultiple(48)
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn powerinfer_test_files_write_to_disk() {
        let dir = std::env::temp_dir().join(format!("conductor-pwri-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (m, p) = (dir.join("model.powerinfer.gguf"), dir.join("pred.gguf"));
        let files =
            write_powerinfer_test_files(&relu_spec(), &PowerInferTestSpec::default(), &m, &p)
                .unwrap();
        let model = GgufFile::open(&m).unwrap();
        let pred = GgufFile::open(&p).unwrap();
        assert!(model.is_powerinfer() && pred.is_powerinfer());
        let sparse = read(&model, Some(&pred)).unwrap().unwrap();
        check_logits(&sparse, &files, 48);
        let model = Model::load(&m).unwrap();
        assert_eq!(model.layers.len(), 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

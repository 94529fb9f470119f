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
//! `ffn_down_t` bytes as they are. With the `synthetic` feature (and in tests),
//! `powerinfer_test_files` writes such files from a random-weight model.

use super::predictor::{Predictor, PredictorError};
use crate::gguf::{GgufError, GgufFile, TensorInfo};
use crate::quant::{dequantize_row, GgmlType, QuantError};

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

// Test files: PowerInfer-format models and predictors written from random-weight models, for
// tests and benchmarks (the `synthetic` feature), not for the product.
#[cfg(any(test, feature = "synthetic"))]
mod test_files;
#[cfg(any(test, feature = "synthetic"))]
pub use test_files::{
    powerinfer_test_files, write_powerinfer_test_files, PowerInferTestFiles, PowerInferTestSpec,
};

#[cfg(test)]
mod tests;

//! The matrices' quantization types: uniform, or as llama.cpp's quantizer makes a Q4_K_M file,
//! with its fallbacks for rows off the 256 grid.

use super::{SyntheticSpec, TypeMix};
use crate::quant::GgmlType;

/// What a matrix is to the type mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
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
pub(super) fn more_bits(layer: u32, n_layer: u32) -> bool {
    let (i, n) = (layer as i64, n_layer as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The type of a `cols`-wide matrix of kind `kind` on layer `layer`.
pub(super) fn matrix_type(spec: &SyntheticSpec, kind: Kind, layer: u32, cols: u32) -> GgmlType {
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
pub(super) fn fallback_type(ty: GgmlType, cols: u32) -> GgmlType {
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

//! A decoder-only transformer (llama, qwen, gemma families): configuration from GGUF metadata, weights, and the forward-pass pieces.

pub mod attention;
mod config;
mod identity;
mod kv_cache;
pub mod moe;
pub mod ops;
mod sparse;
mod weights;

/// Defined in `plan` (part of what a model is); re-exported for the executor.
pub use crate::plan::FfnActivation;
pub use config::{
    Architecture, ModelConfig, RopeConfig, RopeStyle, SlidingWindow, MAX_EXPERTS,
    SUPPORTED_ARCHITECTURES,
};
pub use kv_cache::{context_that_fits, kv_bytes_per_position, KvCache, KvCacheError};
pub use weights::{
    DecodeLayout, DownBlocks, LayerWeights, LoadOptions, Model, TensorRef, WeightSource,
};

use crate::gguf::GgufError;
use crate::quant::{GgmlType, QuantError};

/// A model file Conductor cannot run, and why.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Quant(#[from] QuantError),
    #[error("unsupported architecture `{0}` (Conductor runs {SUPPORTED_ARCHITECTURES})")]
    UnsupportedArchitecture(String),
    #[error("the model has no metadata key `{0}`")]
    MissingKey(String),
    #[error("metadata `{key}`: {why}")]
    BadValue { key: String, why: String },
    #[error("the model has no tensor `{0}`")]
    MissingTensor(String),
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    #[error("tensor `{name}` has type {ty}, which Conductor cannot compute with (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS)")]
    UnsupportedType { name: String, ty: GgmlType },
    #[error(transparent)]
    Store(Box<crate::store::StoreError>),
    #[error("token id {token} is outside the vocabulary of {n_vocab} tokens")]
    TokenOutOfRange { token: u32, n_vocab: u32 },
    #[error(transparent)]
    KvCache(#[from] KvCacheError),
}

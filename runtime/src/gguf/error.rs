//! Everything that can be wrong with a GGUF file (or with what a caller asks the writer to
//! write). Each message names the place: a byte offset, a metadata key or a tensor name.

use crate::quant::GgmlType;

/// A GGUF read or write failure.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot {op} {path:?}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "bytes {start}..{end} of the file are not in memory (only the header and the resident tensors were read); read them from storage"
    )]
    NotInMemory { start: u64, end: u64 },

    #[error("{path} changed while memory-mapped ({why}): the engine stops using it; load it again (`--no-mmap` reads a model into memory, and a neuron store under --memory is read, not mapped: neither sees later changes)")]
    ChangedWhileMapped { path: String, why: String },

    #[error("write failed: {0}")]
    Write(#[source] std::io::Error),

    #[error(
        "file truncated: {what} at byte offset {offset} needs {needed} bytes, only {available} remain"
    )]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        available: u64,
    },

    #[error("not a GGUF file: magic at byte offset 0 is {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },

    #[error(
        "big-endian GGUF file (version field at byte offset 4 reads {raw_version:#010x}); only little-endian files are supported"
    )]
    BigEndian { raw_version: u32 },

    #[error("GGUF version {version} (byte offset 4) is not supported; only versions 2 and 3 are")]
    UnsupportedVersion { version: u32 },

    #[error(
        "{what} at byte offset {offset} is {count}, but each entry takes at least {min_bytes_each} bytes and only {available} remain"
    )]
    CountTooLarge {
        what: String,
        count: u64,
        offset: u64,
        min_bytes_each: u64,
        available: u64,
    },

    #[error("{what} at byte offset {offset} is not valid UTF-8")]
    InvalidUtf8 { what: String, offset: u64 },

    #[error("metadata key #{index} at byte offset {offset} is empty")]
    EmptyKey { index: u64, offset: u64 },

    #[error("duplicate metadata key {key:?} at byte offset {offset}")]
    DuplicateKey { key: String, offset: u64 },

    #[error("metadata key {key:?}: unknown value type id {type_id} at byte offset {offset}")]
    UnknownValueType {
        key: String,
        type_id: u32,
        offset: u64,
    },

    #[error(
        "metadata key {key:?}: arrays nested deeper than {max} levels at byte offset {offset}"
    )]
    NestingTooDeep {
        key: String,
        max: usize,
        offset: u64,
    },

    #[error("metadata key {key:?}: bool byte at offset {offset} is {byte}, expected 0 or 1")]
    InvalidBool { key: String, byte: u8, offset: u64 },

    #[error("metadata key {key:?} is {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },

    #[error("metadata key {key:?} holds {value}, which does not fit in {target}")]
    OutOfRange {
        key: String,
        value: String,
        target: &'static str,
    },

    #[error("general.alignment {alignment} is invalid: {reason}")]
    BadAlignment {
        alignment: u64,
        reason: &'static str,
    },

    #[error("invalid metadata key {key:?}: {reason}")]
    InvalidMetadata { key: String, reason: String },

    #[error("duplicate tensor name {name:?}")]
    DuplicateTensor { name: String },

    #[error("tensor {tensor:?} has {n_dims} dimensions; must be 1 to 4")]
    BadDimCount { tensor: String, n_dims: u32 },

    #[error("tensor {tensor:?} has size 0 in dimension {dim}")]
    ZeroDim { tensor: String, dim: usize },

    #[error(
        "tensor {tensor:?} with dims {dims:?}: element count overflows a signed 64-bit integer"
    )]
    ElementCountOverflow { tensor: String, dims: Vec<u64> },

    #[error("tensor {tensor:?} has unknown ggml type id {type_id}")]
    UnknownTensorType { tensor: String, type_id: u32 },

    #[error(
        "tensor {tensor:?} of type {ty}: row length {row} is not a multiple of the block size {block}"
    )]
    RowNotBlockMultiple {
        tensor: String,
        ty: GgmlType,
        row: u64,
        block: usize,
    },

    #[error(
        "tensor {tensor:?}: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    TensorMisaligned {
        tensor: String,
        offset: u64,
        alignment: u64,
    },

    #[error(
        "tensor {tensor:?}: {n_bytes} bytes at offset {offset} of the data section (which starts at byte {data_offset}) run past the end of the file ({file_len} bytes)"
    )]
    TensorOutOfBounds {
        tensor: String,
        offset: u64,
        n_bytes: u64,
        data_offset: u64,
        file_len: u64,
    },

    #[error(
        "tensor {tensor:?} (data offset {offset}) overlaps tensor {other:?}, which ends at {other_end}"
    )]
    TensorOverlap {
        tensor: String,
        offset: u64,
        other: String,
        other_end: u64,
    },

    #[error("tensor {tensor:?}: the data section would exceed 2^64 bytes")]
    DataSectionOverflow { tensor: String },

    #[error("tensor {tensor:?}: got {got} bytes of data, its type and shape need {expected}")]
    TensorDataSize {
        tensor: String,
        expected: u64,
        got: u64,
    },

    #[error("tensor {tensor:?} has no data attached (it was added with add_tensor_info)")]
    MissingTensorData { tensor: String },

    #[error("tensor data written out of order: {reason}")]
    TensorOrder { reason: String },
}

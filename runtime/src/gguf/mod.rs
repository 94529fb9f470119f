//! GGUF v2/v3 reader (memory-mapped) and writer.
//!
//! A GGUF file is a little-endian header (magic, version, counts), typed metadata entries, tensor
//! descriptors, then the tensor data section, each tensor aligned to `general.alignment`. The
//! reader validates all of it up front against the file's actual size, so hostile or damaged
//! files give a [`GgufError`] naming the offset, key or tensor at fault, and never a panic or an
//! out-of-bounds read later.

mod error;
mod parse;
mod reader;
mod tensor;
mod value;
mod writer;

pub use error::GgufError;
pub use reader::{GgufFile, MAGIC};
pub use tensor::{TensorInfo, DEFAULT_ALIGNMENT, MAX_ALIGNMENT, MAX_DIMS};
pub use value::{Array, Value, MAX_ARRAY_DEPTH};
pub use writer::{GgufWriter, StreamedFile, TensorDataWriter};

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

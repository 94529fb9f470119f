//! Block formats and the kernels that compute with them.

mod ggml_type;

pub use ggml_type::GgmlType;

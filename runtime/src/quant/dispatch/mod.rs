//! [`Kernels`]'s operations beyond the decode dot products (which stay in `quant/mod.rs`
//! with the dispatch macros): one file per kind of product.

mod axpy;
mod f16;
mod interleaved;
mod matmul;

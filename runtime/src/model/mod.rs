//! Llama-family model: configuration from GGUF metadata, weights, and the forward-pass pieces.

//! libFuzzer's bytes into [`conductor_fuzz::gguf_from_bytes`] (see `fuzz/src/lib.rs`).
//!
//! `scripts/fuzz gguf_from_bytes`, or `cargo +nightly fuzz run gguf_from_bytes` from the repository root.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    conductor_fuzz::gguf_from_bytes(data);
});

//! libFuzzer's bytes into [`conductor_fuzz::tokenizer_from_gguf`] (see `fuzz/src/lib.rs`).
//!
//! `scripts/fuzz tokenizer_from_gguf`, or `cargo +nightly fuzz run tokenizer_from_gguf` from the repository root.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    conductor_fuzz::tokenizer_from_gguf(data);
});

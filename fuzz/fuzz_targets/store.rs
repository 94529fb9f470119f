//! libFuzzer's bytes into [`conductor_fuzz::store`] (see `fuzz/src/lib.rs`).
//!
//! `scripts/fuzz store`, or `cargo +nightly fuzz run store` from the repository root.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    conductor_fuzz::store(data);
});

//! libFuzzer's bytes into [`conductor_fuzz::plan`] (see `fuzz/src/lib.rs`).
//!
//! `scripts/fuzz plan`, or `cargo +nightly fuzz run plan` from the repository root.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    conductor_fuzz::plan(data);
});

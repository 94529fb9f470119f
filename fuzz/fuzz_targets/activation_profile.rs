//! libFuzzer's bytes into [`conductor_fuzz::activation_profile`] (see `fuzz/src/lib.rs`).
//!
//! `scripts/fuzz activation_profile`, or `cargo +nightly fuzz run activation_profile` from the repository root.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    conductor_fuzz::activation_profile(data);
});

//! libFuzzer's bytes into [`conductor_fuzz::hardware_profile`] (see `fuzz/src/lib.rs`).
//!
//! `scripts/fuzz hardware_profile`, or `cargo +nightly fuzz run hardware_profile` from the repository root.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    conductor_fuzz::hardware_profile(data);
});

//! libFuzzer's bytes into [`conductor_fuzz::chat_template`] (see `fuzz/src/lib.rs`).
//!
//! `scripts/fuzz chat_template`, or `cargo +nightly fuzz run chat_template` from the repository root.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    conductor_fuzz::chat_template(data);
});

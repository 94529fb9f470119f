//! libFuzzer's bytes into [`conductor_fuzz::powerinfer`] (see `fuzz/src/lib.rs`).
//!
//! `scripts/fuzz powerinfer`, or `cargo +nightly fuzz run powerinfer` from the repository root.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    conductor_fuzz::powerinfer(data);
});

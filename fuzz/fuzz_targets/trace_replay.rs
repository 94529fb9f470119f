//! libFuzzer's bytes into [`conductor_fuzz::trace_replay`] (see `fuzz/src/lib.rs`).
//!
//! `scripts/fuzz trace_replay`, or `cargo +nightly fuzz run trace_replay` from the repository root.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    conductor_fuzz::trace_replay(data);
});

//! Arbitrary bytes into the GGUF reader: it must return Ok or Err without panicking, and an
//! accepted file must hand out in-bounds tensor data and write back out to an equivalent file.
//!
//! Run with `cargo +nightly fuzz run gguf_from_bytes` from the repository root.

#![no_main]

use conductor_runtime::gguf::{GgufFile, GgufWriter};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for t in f.tensors() {
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
    }
    let bytes = GgufWriter::from_file(&f)
        .and_then(|w| w.to_bytes())
        .expect("an accepted file re-serializes");
    let again = GgufFile::from_bytes(bytes).expect("a re-serialized file parses");
    assert_eq!(f.tensors().len(), again.tensors().len());
    assert_eq!(f.metadata().len(), again.metadata().len());
});

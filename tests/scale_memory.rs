//! Memory at scale, counted by a global allocator that tracks the bytes live and their peak:
//! loading a store holds its resident tensors and nothing the size of the file, and
//! `conductor convert` streams, its peak the same whatever the model's size.
//!
//! The tests of this file take turns (one lock), so that one's allocations never land in
//! another's count.

mod common;

use common::ScratchDir;
use conductor::runtime::convert::{convert, ConvertOptions};
use conductor::runtime::gguf::{GgufError, GgufFile};
use conductor::runtime::model::Model;
use conductor::runtime::store::stays_on_storage;
use conductor::runtime::synthetic::{SyntheticModel, SyntheticSpec};
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Tracks the bytes allocated and not yet freed (of every thread), and their peak.
struct Tracking;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(n: usize) {
    let now = LIVE.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

fn shrank(n: usize) {
    LIVE.fetch_sub(n, Ordering::Relaxed);
}

// SAFETY: every call goes unchanged to the system allocator, which upholds GlobalAlloc's
// contract; counting bytes is the only addition.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `layout` is passed on as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        shrank(layout.size());
        // SAFETY: `ptr` came from `System` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above; the caller's contract for `new_size` is passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Counted as both at once: a moving realloc holds both for a moment.
            grew(new_size);
            shrank(layout.size());
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

static TURN: Mutex<()> = Mutex::new(());

/// What `f` returns, and the most bytes it had allocated at once beyond what was live before.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed) - base)
}

/// Writes the model of `spec` to `path`, streaming (a chunk at a time).
fn write_model(path: &Path, spec: &SyntheticSpec) {
    let model = SyntheticModel::new(spec).unwrap();
    model
        .header()
        .write_file_atomic_with(path, |s| model.write_data(s, &mut |_, _| {}))
        .unwrap();
}

fn spec(n_layer: u32, n_ff: u32) -> SyntheticSpec {
    SyntheticSpec {
        n_layer,
        n_embd: 256,
        n_ff,
        n_head: 4,
        n_head_kv: 2,
        seed: 7,
        ..SyntheticSpec::default()
    }
}

#[test]
fn loading_a_store_holds_its_resident_tensors_only() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let dir = ScratchDir::new("scale-load");
    let source = dir.join("model.gguf");
    write_model(&source, &spec(4, 8192));
    let store = dir.join("store.gguf");
    convert(&source, &store, &ConvertOptions::default(), &mut |_, _| {}).unwrap();
    let file_len = std::fs::metadata(&store).unwrap().len() as usize;
    let (model, peak) = peak_during(|| Model::load_resident(&store, true).unwrap());
    let header = GgufFile::open(&store).unwrap();
    let resident: u64 = header
        .tensors()
        .iter()
        .filter(|t| !stays_on_storage(&t.name, true))
        .map(|t| t.n_bytes)
        .sum();
    let resident = resident as usize + header.data_offset() as usize;
    eprintln!("store of {file_len} bytes, {resident} resident: loading peaked at {peak} bytes");
    // The resident tensors, and the parsed header, tensor table and norms (a few KiB here).
    assert!(
        peak <= resident + (1 << 20),
        "loading allocated {peak} bytes at its peak, for {resident} resident"
    );
    assert!(
        peak * 8 < file_len,
        "loading allocated {peak} bytes for a file of {file_len}"
    );
    // What is not resident is not in memory, and asking for it says so.
    let bundles = model.layers[0].bundles.clone().unwrap();
    assert!(matches!(
        model.file().bytes(bundles),
        Err(GgufError::NotInMemory { .. })
    ));
    // The resident tensors are, byte for byte.
    let attn = header.tensor("blk.1.attn_q.weight").unwrap();
    assert_eq!(
        model.file().try_tensor_data(attn).unwrap(),
        header.tensor_data(attn)
    );
}

#[test]
fn convert_peaks_the_same_whatever_the_model_size() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let dir = ScratchDir::new("scale-convert");
    let mut peaks = Vec::new();
    for (name, s) in [("small", spec(2, 1024)), ("large", spec(6, 16384))] {
        let source = dir.join(&format!("{name}.gguf"));
        write_model(&source, &s);
        let store = dir.join(&format!("{name}.store.gguf"));
        let (summary, peak) = peak_during(|| {
            convert(&source, &store, &ConvertOptions::default(), &mut |_, _| {}).unwrap()
        });
        let len = std::fs::metadata(&store).unwrap().len();
        eprintln!(
            "{name}: a store of {len} bytes ({} of bundles), convert peaked at {peak} bytes",
            summary.bundle_bytes
        );
        peaks.push((peak, len));
    }
    let [(small, small_len), (large, large_len)] = peaks[..] else {
        unreachable!()
    };
    assert!(large_len > 10 * small_len, "the sizes must differ");
    // Same width, so the same bundle and write buffers; only the bundles' checksums (4 bytes
    // each) and the per-layer descriptions grow with the model.
    assert!(
        large <= small + (256 << 10),
        "convert peaked at {large} bytes for a {large_len}-byte store, {small} for {small_len}"
    );
    assert!(
        large * 8 < large_len as usize,
        "convert peaked at {large} bytes for a {large_len}-byte store"
    );
}

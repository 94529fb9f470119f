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
use conductor::runtime::model::{Model, WeightSource};
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
    let (model, peak) = peak_during(|| Model::open(&store, WeightSource::RESIDENT).unwrap());
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
    let bundles = model.layers()[0].bundles.clone().unwrap();
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

/// A cache of 50,000 slots over 500,000 units (a 47B-class store's bundles, and more): the
/// directory and the arena are built, filled, hit and evicted through in time and memory
/// linear in their sizes.
#[test]
fn a_cache_of_tens_of_thousands_of_slots() {
    use conductor::runtime::cache::{Acquired, CacheDirectory, Extent, SlotArena, UnitMap};
    use conductor::runtime::plan::{CachePlan, CachePolicy};
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let map = UnitMap {
        n_layer: 100,
        ffn_clusters: 5000,
        output_clusters: 0,
        attn_units: 0,
    };
    let (units, slots, hot) = (map.n_units(), 50_000u32, 40_000u32);
    assert_eq!(units, 500_000);
    let started = std::time::Instant::now();
    for policy in [CachePolicy::Segmented, CachePolicy::Lru] {
        let plan = CachePlan {
            slots,
            hot_slots: hot,
            policy,
            ..CachePlan::default()
        };
        let (mut d, bytes) = peak_during(|| CacheDirectory::new(&plan, &map));
        eprintln!("{policy:?}: a directory of {slots} slots over {units} units: {bytes} bytes");
        assert!(
            bytes < 64 * units as usize + 64 * slots as usize,
            "{bytes} bytes for {units} units and {slots} slots"
        );
        // A million acquisitions over every unit, in a scattered order: loads, hits and, once
        // the slots are full, evictions, each least recently used first.
        let (mut loads, mut hits, mut evictions) = (0u64, 0u64, 0u64);
        let mut rng = conductor::runtime::sample::SplitMix64::new(12345);
        for i in 0..1_000_000u64 {
            // Half the time a unit among the first 30,000 (the repeats hit), else any.
            let u = rng.below(if i % 2 == 0 { 30_000 } else { u64::from(units) }) as u32;
            let (l, c) = (u / map.ffn_clusters, u % map.ffn_clusters);
            match d.acquire(l, c) {
                Acquired::Load { evicted, .. } => {
                    loads += 1;
                    evictions += u64::from(evicted.is_some());
                    assert!(d.loaded(l, c));
                }
                Acquired::Hit => hits += 1,
                other => panic!("{other:?} with nothing pinned"),
            }
            d.release(l, c);
        }
        eprintln!("{policy:?}: {loads} loads, {hits} hits, {evictions} evictions");
        assert!(hits > 100_000 && evictions > 100_000 && loads <= 1_000_000 - hits);
    }
    // The arena: 50,000 slots of 4 KiB (the slots' memory, with no slack: the budget counts
    // slots at their size), the unit table linear in the units.
    let extents: Vec<Extent> = (0..units)
        .map(|u| Extent {
            offset: u64::from(u) * 4096,
            len: 4096,
            data: 0..4000,
            what: String::new(),
            bundle: None,
        })
        .collect();
    // Half of them hot (each its own unit's length), half cold.
    let hot: Vec<u32> = (0..slots / 2).collect();
    let (arena, bytes) = peak_during(|| SlotArena::new(slots, &hot, &map, &extents).unwrap());
    let per_slot = 4096 + 128;
    eprintln!("an arena of {slots} slots: {bytes} bytes");
    assert!(
        bytes < slots as usize * per_slot + 32 * units as usize,
        "{bytes} bytes for {slots} slots over {units} units"
    );
    for u in 0..units {
        let (l, c) = (u / map.ffn_clusters, u % map.ffn_clusters);
        let slot = u % slots;
        let evicted = (u >= slots).then(|| {
            let e = u - slots;
            (e / map.ffn_clusters, e % map.ffn_clusters)
        });
        arena.assign(l, c, slot, evicted);
        assert_eq!(arena.slot_of(l, c), Some(slot));
    }
    assert_eq!(arena.slot_of(0, 0), None, "evicted long ago");
    let took = started.elapsed();
    eprintln!("all of it in {took:?}");
    // Linear work is well under a second or two; anything quadratic in the slots would take
    // minutes.
    assert!(took.as_secs() < 60, "{took:?}");
}

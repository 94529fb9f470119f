//! Decode under a memory budget allocates no memory per neuron cluster it loads: slots are
//! allocated once, a load reads into one, eviction only drops it. Counted with a global
//! allocator that counts, over decode steps that load hundreds of clusters.
//!
//! The inline driver allocates nothing at all per step. The actor driver sends kameo messages,
//! and kameo boxes each message and its handler's future: a few allocations per message
//! (a load, its `ClusterLoaded`, the cluster's `Compute`) are the price of the actors, bounded
//! here so that none creeps in per neuron.

mod common;

use common::ScratchDir;
use conductor::actors::{ActorDriver, ActorOptions};
use conductor::runtime::convert::ConvertOptions;
use conductor::runtime::exec::{Driver, InlineDriver, Serial, Session};
use conductor::runtime::model::Model;
use conductor::runtime::plan::{CachePlan, CachePolicy};
use conductor::runtime::plan::{ExecutionPlan, Topology};
use conductor::runtime::quant::Kernels;
use conductor::runtime::synthetic::synthetic_model;
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counts allocations (of every thread) on top of the system allocator.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call goes unchanged to the system allocator, which upholds GlobalAlloc's
// contract; counting is the only addition.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `layout` is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc`/`realloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above; the caller's contract for `new_size` is passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The count is of the whole process: the tests of this file take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Decode steps measured, after a prompt and warm-up steps.
const STEPS: u32 = 8;

/// A small store (3 layers, 8 bundles each) in a temporary directory.
/// A generated model converted into a store of 64-neuron bundles, in `dir`.
fn store(dir: &ScratchDir) -> PathBuf {
    let source = dir.file("model.gguf", || {
        synthetic_model(&common::small_spec(3))
            .unwrap()
            .to_bytes()
            .unwrap()
    });
    dir.store(&source, &ConvertOptions::neuron_columns(64))
}

/// Too few slots to keep the model: every step loads most clusters again.
fn plan(slots: u32, hot: u32) -> ExecutionPlan {
    let mut plan = ExecutionPlan {
        cache: Some(CachePlan {
            slots,
            hot_slots: hot,
            policy: CachePolicy::Segmented,
            max_loads: 2,
            stream_output: true,
            stream_attention: false,
            coalesce: 1,
            hot_units: Vec::new(),
            reads: conductor_runtime::plan::ReadPolicy::Bundles,
            gate_first_gap: 0,
        }),
        ..ExecutionPlan::default()
    };
    plan.decode.output_rows = 60;
    plan.prefill.output_rows = 60;
    plan
}

/// (allocations, loads) over [`STEPS`] decode steps, after a prompt and three warm-up steps.
fn count<D: Driver>(d: &mut D, loads: impl Fn(&D) -> u64) -> (u64, u64) {
    let model = Arc::clone(d.model());
    let mut session = Session::new(&model, 64).unwrap();
    d.eval_last(&mut session, &[1, 2, 3, 4]).unwrap();
    for t in 0..3 {
        d.eval_last(&mut session, &[t]).unwrap();
    }
    let loads_before = loads(d); // (the report allocates: read it outside the count)
    let allocs_before = ALLOCATIONS.load(Ordering::Relaxed);
    for t in 0..STEPS {
        d.eval_last(&mut session, &[t]).unwrap();
    }
    let allocs = ALLOCATIONS.load(Ordering::Relaxed) - allocs_before;
    (allocs, loads(d) - loads_before)
}

#[test]
fn decode_steps_allocate_nothing_per_load() {
    let _turn = one_at_a_time();
    let dir = ScratchDir::new("alloc");
    let store = store(&dir);
    for (slots, hot) in [(3, 0), (12, 6)] {
        let model = Arc::new(Model::load_resident(&store, true).unwrap());
        let mut inline = InlineDriver::new(
            Arc::clone(&model),
            &plan(slots, hot),
            Kernels::best(),
            Serial,
        )
        .unwrap();
        let (allocs, loads) = count(&mut inline, |d| d.cache_report().unwrap().loads);
        eprintln!("inline, {slots} slots: {allocs} allocations in {STEPS} steps, {loads} loads");
        assert!(
            loads >= u64::from(STEPS) * 10,
            "the steps must load: {loads}"
        );
        // None per step or per load. (The count is of the whole process: the test harness's
        // own thread may allocate once meanwhile.)
        assert!(
            allocs < u64::from(STEPS),
            "{allocs} allocations in {STEPS} steps of {loads} loads"
        );
    }
    // The actor driver after every inline count: its threads (which may still be winding
    // down after a drop) never run beside an inline measurement.
    for (slots, hot) in [(3, 0), (12, 6)] {
        let model = Arc::new(Model::load_resident(&store, true).unwrap());
        let mut actors = ActorDriver::new(
            Arc::clone(&model),
            &plan(slots, hot),
            Kernels::best(),
            ActorOptions {
                threads: Some(2),
                topology: Some(Topology::uniform(2)),
                no_pinning: true,
                model_path: Some(store.clone()),
                read_faults: None,
            },
        )
        .unwrap();
        let (allocs, loads) = count(&mut actors, |d| d.cache_report().unwrap().loads);
        let per_load = allocs as f64 / loads as f64;
        eprintln!(
            "actors, {slots} slots: {allocs} allocations, {loads} loads: {per_load:.1} per load"
        );
        assert!(
            loads >= u64::from(STEPS) * 10,
            "the steps must load: {loads}"
        );
        // Measured: about 10 per load (kameo's boxes for three messages, the load's item list).
        assert!(per_load < 16.0, "{per_load:.1} allocations per load");
    }
}

/// In memory, with the plan the engine picks for a real file: a decode step allocates nothing.
/// The output projection is sent as many clusters in one message (24 on SmolLM2, more on
/// Gemma's 262k vocabulary), which once spilled `Blocks` to the heap every step.
#[test]
fn default_in_memory_decode_allocates_nothing() {
    use conductor::{DriverKind, Engine};
    let _turn = one_at_a_time();
    for (name, path) in [
        ("SmolLM2 (Q4_1)", common::default_model()),
        ("Gemma-3-270M (Q4_K_M)", common::gemma3_model()),
    ] {
        for threads in [1, 2] {
            let mut engine = Engine::builder()
                .model(&path)
                .driver(DriverKind::Inline)
                .threads(threads)
                .pin_threads(false)
                .build()
                .unwrap();
            let mut session = engine.session(Some(64)).unwrap();
            engine.eval_last(&mut session, &[1, 2, 3, 4]).unwrap();
            for t in 0..3 {
                engine.eval_last(&mut session, &[10 + t]).unwrap();
            }
            let before = ALLOCATIONS.load(Ordering::Relaxed);
            for t in 0..STEPS {
                engine.eval_last(&mut session, &[20 + t]).unwrap();
            }
            let allocs = ALLOCATIONS.load(Ordering::Relaxed) - before;
            eprintln!("{name}, {threads} threads: {allocs} allocations in {STEPS} steps");
            // (The count is of the whole process: the harness's thread may allocate once.)
            assert!(
                allocs < u64::from(STEPS),
                "{name}, {threads} threads: {allocs} allocations in {STEPS} decode steps"
            );
        }
    }
}

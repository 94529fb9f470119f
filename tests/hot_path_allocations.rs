//! Decode under a memory budget allocates no memory per neuron cluster it loads: slots are
//! allocated once, a load reads into one, eviction only drops it. Counted with a global
//! allocator that counts, over decode steps that load hundreds of clusters.
//!
//! The inline driver allocates nothing at all per step, under a budget or in memory, at real
//! models' and at a 7B model's cluster counts. The actor driver sends kameo messages,
//! and kameo boxes each message and its handler's future: a few allocations per message
//! (a load, its `ClusterLoaded`, the cluster's `Compute`) are the price of the actors, bounded
//! here so that none creeps in per neuron.

mod common;

use common::ScratchDir;
use conductor::actors::{ActorDriver, ActorOptions};
use conductor::runtime::convert::ConvertOptions;
use conductor::runtime::exec::{ffn_plan_of, Driver, Session};
use conductor::runtime::model::{Model, WeightSource};
use conductor::runtime::plan::{CachePlan, CachePolicy};
use conductor::runtime::plan::{ExecutionPlan, Topology};
use conductor::runtime::quant::Kernels;
use conductor::runtime::synthetic::synthetic_model;
use conductor::{DriverKind, Engine};
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
        let model = Arc::new(Model::open(&store, WeightSource::RESIDENT).unwrap());
        let mut inline = common::serial_driver(&model, &plan(slots, hot));
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
        let model = Arc::new(Model::open(&store, WeightSource::RESIDENT).unwrap());
        let mut actors = ActorDriver::new(
            Arc::clone(&model),
            &plan(slots, hot),
            ffn_plan_of(&model, &plan(slots, hot)).unwrap(),
            Kernels::best(),
            ActorOptions {
                threads: Some(2),
                topology: Some(Topology::uniform(2)),
                no_pinning: true,
                model_path: Some(store.clone()),
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

/// Allocations in [`STEPS`] in-memory decode steps of `path` with the plan the engine picks,
/// after a prompt and warm-up steps.
fn in_memory_decode_allocations(path: &std::path::Path, driver: DriverKind, threads: usize) -> u64 {
    let mut engine = Engine::builder()
        .model(path)
        .driver(driver)
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
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

/// What a decode step of the actor driver may allocate: kameo boxes each message and its
/// handler's future, a few allocations a message, and a step sends a group a few messages a
/// layer (one per phase), however many clusters each carries. Measured (2026-12-06): 7.8-7.9 a
/// layer and group on SmolLM2 and Gemma-3, 6.9 at the 7B cluster counts; the bound, 12, is below
/// what one allocation per cluster would add at the 7B counts (86 FFN clusters a layer).
fn actor_step_allocation_bound(n_layer: u64, groups: u64) -> u64 {
    const PER_LAYER_AND_GROUP: u64 = 12;
    PER_LAYER_AND_GROUP * (n_layer + 1) * groups
}

/// In memory, with the plan the engine picks for a real file: a decode step of the inline
/// driver allocates nothing, and one of the actor driver a bounded number a message, never
/// one per cluster. The output projection is sent as many clusters in one message (24 on
/// SmolLM2, more on Gemma's 262k vocabulary), which once spilled `Blocks` to the heap every
/// step.
#[test]
fn default_in_memory_decode_allocates_nothing() {
    let _turn = one_at_a_time();
    for (name, path, n_layer) in [
        ("SmolLM2 (Q4_1)", common::default_model(), 30),
        ("Gemma-3-270M (Q4_K_M)", common::gemma3_model(), 18),
    ] {
        for threads in [1, 2] {
            let allocs = in_memory_decode_allocations(&path, DriverKind::Inline, threads);
            eprintln!("{name}, inline, {threads} threads: {allocs} allocations in {STEPS} steps");
            // (The count is of the whole process: the harness's thread may allocate once.)
            assert!(
                allocs < u64::from(STEPS),
                "{name}, {threads} threads: {allocs} allocations in {STEPS} decode steps"
            );
        }
        let threads = 2;
        let allocs = in_memory_decode_allocations(&path, DriverKind::Actors, threads);
        let bound = u64::from(STEPS) * actor_step_allocation_bound(n_layer, threads as u64);
        eprintln!("{name}, actors, {threads} threads: {allocs} allocations in {STEPS} steps (bound {bound})");
        assert!(
            allocs <= bound,
            "{name}, actors: {allocs} allocations in {STEPS} decode steps, above {bound}"
        );
    }
}

/// The cluster counts of a 7B model's decode step (Llama-2-7B's FFN width: 86 clusters of 128
/// neurons in one message a layer; a 32k vocabulary: 16 output clusters), in memory, random
/// weights: the inline driver allocates nothing per step, the actor driver no more than the
/// messages' bound, however many clusters a message carries.
#[test]
fn decode_at_seven_billion_cluster_counts_allocates_nothing_per_cluster() {
    let _turn = one_at_a_time();
    let dir = ScratchDir::new("alloc-7b-clusters");
    let n_layer = 2;
    let path = dir.file("wide.gguf", || {
        let spec = conductor::runtime::synthetic::SyntheticSpec {
            n_layer,
            n_embd: 256,
            n_ff: 11008,
            n_head: 4,
            n_head_kv: 2,
            n_vocab: 32000,
            seed: 7,
            ..conductor::runtime::synthetic::SyntheticSpec::default()
        };
        synthetic_model(&spec).unwrap().to_bytes().unwrap()
    });
    for threads in [1, 2] {
        let allocs = in_memory_decode_allocations(&path, DriverKind::Inline, threads);
        eprintln!("7B clusters, inline, {threads} threads: {allocs} allocations in {STEPS} steps");
        assert!(
            allocs < u64::from(STEPS),
            "inline, {threads} threads: {allocs} allocations in {STEPS} decode steps"
        );
    }
    let threads = 2;
    let allocs = in_memory_decode_allocations(&path, DriverKind::Actors, threads);
    let bound = u64::from(STEPS) * actor_step_allocation_bound(u64::from(n_layer), threads as u64);
    eprintln!("7B clusters, actors: {allocs} allocations in {STEPS} steps (bound {bound})");
    assert!(
        allocs <= bound,
        "actors: {allocs} allocations in {STEPS} decode steps, above {bound}"
    );
}

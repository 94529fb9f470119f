//! What the actors of one engine share while a step runs.
//!
//! Data never travels in messages: the scheduler tells a group *which* clusters to compute, and
//! the group reads the step's inputs here and writes its output blocks here. The locks are never
//! contended in a correct run — the scheduler sends a phase's computes only after the previous
//! phase finished, and finishes a phase only after every compute of it reported done — they
//! make that protocol safe instead of trusted. Poisoned locks (a panicking actor) are taken
//! over: the step fails anyway, and the next step rewrites everything it reads.

use conductor_runtime::cache::{BundleFile, SlotArena};
use conductor_runtime::exec::{GroupOutput, StepState};
use conductor_runtime::model::{KvCache, Model};
use conductor_runtime::schedule::{Program, StepShape};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

pub(crate) struct StepShared {
    pub model: Arc<Model>,
    pub decode: Arc<Program>,
    pub prefill: Arc<Program>,
    pub state: RwLock<StepState>,
    /// The session's KV cache, lent by the driver for the duration of a step (a
    /// multi-sequence step: one per sequence, in token order).
    pub kv: RwLock<Vec<KvCache>>,
    /// One per processor group, indexed by `XpuId`.
    pub outputs: Vec<Mutex<GroupOutput>>,
    /// Time zero of traces.
    pub epoch: Instant,
    /// Whether actors time their work for a trace.
    pub recording: AtomicBool,
    /// A store's cache slots and bundle file, when the plan has a cache.
    pub cache: Option<(Arc<SlotArena>, Arc<BundleFile>)>,
    /// Time and bytes, always counted (a few atomic adds per message).
    pub counters: Counters,
}

/// Where the time of steps went, summed since the driver started.
pub struct Counters {
    /// Nanoseconds groups spent computing decode clusters.
    pub decode_compute_ns: AtomicU64,
    /// Nanoseconds the storage actor spent reading bundles.
    pub io_ns: AtomicU64,
    /// Bytes read into cache slots.
    pub io_bytes: AtomicU64,
    /// Units read.
    pub loads: AtomicU64,
    /// Read requests (adjacent units merged into one read count once).
    pub reads: AtomicU64,
    /// Bytes read per layer (the output projection last).
    pub layer_bytes: Vec<AtomicU64>,
}

impl Counters {
    /// Zeroed counters for a model of `n_layer` layers.
    pub fn new(n_layer: u32) -> Counters {
        Counters {
            decode_compute_ns: AtomicU64::new(0),
            io_ns: AtomicU64::new(0),
            io_bytes: AtomicU64::new(0),
            loads: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            layer_bytes: (0..=n_layer).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl StepShared {
    pub fn program(&self, shape: StepShape) -> &Program {
        match shape {
            StepShape::Decode => &self.decode,
            StepShape::Prefill => &self.prefill,
        }
    }

    /// Nanoseconds since the trace epoch.
    pub fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

pub(crate) fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

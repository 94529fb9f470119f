//! The worker pool's handoff, model-checked with loom: `src/pool.rs` itself, compiled here
//! against loom's atomics, mutex, condition variable, threads and cell (this file's
//! `pool_sync`) instead of std's, run under every interleaving loom explores.
//!
//! What it holds: `WorkerPool::run` hands a job whose lifetimes it erased (a `transmute` to
//! `'static`) to helper threads through a shared cell. That is sound only if no helper reads
//! the cell while the next job is written into it, and no helper calls a job's closure or
//! touches its outputs after `run` returned. Loom reports the first as a race on the cell; the
//! closure below counts its calls and the test checks the count both when `run` returns and
//! after the pool has joined its helpers, which a late call would change.

#[allow(dead_code)]
#[path = "../src/pool.rs"]
mod pool;

/// Loom's twins of the names `src/pool_sync.rs` gives the pool.
mod pool_sync {
    pub(crate) use loom::hint::spin_loop;
    pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
    pub(crate) use loom::sync::{Arc, Condvar, Mutex};
    pub(crate) use loom::thread;

    /// A cell whose every access loom tracks: a write overlapping another access fails the
    /// model.
    pub(crate) struct SharedCell<T>(loom::cell::UnsafeCell<T>);

    impl<T: Copy> SharedCell<T> {
        pub(crate) fn new(value: T) -> SharedCell<T> {
            SharedCell(loom::cell::UnsafeCell::new(value))
        }

        /// # Safety
        /// As `src/pool_sync.rs`'s: no write at the same time.
        pub(crate) unsafe fn read(&self) -> T {
            // SAFETY: the caller's promise; loom checks it.
            self.0.with(|p| unsafe { *p })
        }

        /// # Safety
        /// As `src/pool_sync.rs`'s: no other access at the same time.
        pub(crate) unsafe fn write(&self, value: T) {
            // SAFETY: the caller's promise; loom checks it.
            self.0.with_mut(|p| unsafe { *p = value })
        }
    }
}

/// The pool pins nothing here (no cores are given); this stands in for the crate's module.
mod affinity {
    pub(crate) fn pin_current_thread_to(_core: usize) -> bool {
        true
    }
}

use conductor_runtime::exec::ClusterRunner;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use pool::{PoolConfig, WorkerPool};

/// Runs `jobs` jobs of `items` items each on a pool of `threads` workers whose helpers spin
/// `spin` times before parking, checking after each `run` and after the pool is dropped that
/// every item ran exactly once and no call came late. With `rendezvous`, each item waits until
/// every item of its job has started, so a job finishes only if a helper takes part in it.
fn check(threads: usize, jobs: usize, items: usize, spin: u32, rendezvous: bool) {
    let mut model = loom::model::Builder::new();
    // Every interleaving with up to two preemptions: the handoff's races need one or two.
    model.preemption_bound = Some(2);
    // Spinning threads (the caller waiting for items, a rendezvous) branch at every yield.
    model.max_branches = 100_000;
    model.check(move || {
        let pool = WorkerPool::new(PoolConfig {
            spin_iterations: spin,
            ..PoolConfig::new(threads)
        })
        .expect("helpers start");
        let mut counters = Vec::new();
        for job in 0..jobs {
            let calls = Arc::new(AtomicUsize::new(0));
            let mut buf = vec![0.0f32; items];
            {
                let mut outs: Vec<&mut [f32]> = buf.chunks_mut(1).collect();
                let seen = Arc::clone(&calls);
                pool.run(&mut outs, &move |_, i, out| {
                    seen.fetch_add(1, Ordering::SeqCst);
                    while rendezvous && seen.load(Ordering::SeqCst) < items {
                        loom::thread::yield_now();
                    }
                    out[0] = (job * items + i) as f32 + 1.0;
                });
            }
            let expected: Vec<f32> = (0..items).map(|i| (job * items + i) as f32 + 1.0).collect();
            assert_eq!(buf, expected, "job {job}: an item missing or run twice");
            assert_eq!(
                calls.load(Ordering::SeqCst),
                items,
                "job {job}: calls when run returned"
            );
            counters.push(calls);
        }
        // Joins the helpers: a call of an old job still in flight would land before this.
        drop(pool);
        for (job, calls) in counters.iter().enumerate() {
            assert_eq!(
                calls.load(Ordering::SeqCst),
                items,
                "job {job}: a call after run returned"
            );
        }
    });
}

/// Two jobs back to back on one helper that spins: the second job's write of the cell
/// against the first job's late readers.
#[test]
fn jobs_back_to_back_with_a_spinning_helper() {
    check(2, 2, 2, 3, false);
}

/// Helpers that park at once, in jobs that need both threads (each item waits for the
/// other): a lost wake-up (sleepers, lock, condition variable) would leave `run` waiting
/// forever, which fails the model.
#[test]
fn jobs_that_need_a_parked_helper() {
    check(2, 2, 2, 0, true);
}

/// Three items, so that both threads take part in a job and one takes two.
#[test]
fn a_job_shared_by_both_threads() {
    check(2, 1, 3, 1, false);
}

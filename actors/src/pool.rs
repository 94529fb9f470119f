//! A pool of worker threads that split a phase's clusters among themselves.
//!
//! The calling thread is worker 0 and works too; `threads - 1` helpers wait for jobs. Decode
//! issues a job every few tens of microseconds, and a cross-thread wake-up through the kernel
//! costs 7–20 µs here, so helpers spin for a while before parking.
//!
//! Clusters are claimed from a shared counter, so who computes which cluster varies from run to
//! run — and does not matter: each cluster writes only its own output block (see
//! `conductor_runtime::exec`), so results are bit-identical for any number of threads.

use conductor_runtime::exec::ClusterRunner;
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

type JobFn = dyn Fn(usize, usize, &mut [f32]) + Sync;

/// A job with its lifetimes erased. Valid from the moment the caller opens it until the caller
/// has closed it and seen the participant count drop to zero (see `WorkerPool::run`).
#[derive(Clone, Copy)]
struct Job {
    f: *const JobFn,
    outs: *mut &'static mut [f32],
    n: usize,
}

/// `state` packs the job epoch (high 32 bits), an "open" bit and the number of helpers inside
/// the current job. Joining is a compare-and-swap on the whole word, so a helper can never join
/// a job that the caller has already closed.
const OPEN: u64 = 1 << 31;
const PARTICIPANTS: u64 = OPEN - 1;

/// Spin iterations (a few microseconds) before a waiting helper starts yielding its core.
const PURE_SPIN: u32 = 2_000;

fn epoch(state: u64) -> u64 {
    state >> 32
}

struct Shared {
    state: AtomicU64,
    job: UnsafeCell<Job>,
    next: AtomicUsize,
    done: AtomicUsize,
    panicked: AtomicBool,
    /// Held by the one caller inside `run`; a second concurrent caller would overwrite `job`.
    busy: AtomicBool,
    shutdown: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    spin_iterations: u32,
}

// SAFETY: `job` is written only by the caller while no helper participates (the job is closed
// and the participant count is zero) and read by helpers only while they participate; the
// atomics order those accesses (Release on open / Acquire on join). The raw pointers inside
// point to data that outlives every participation (see `WorkerPool::run`).
unsafe impl Sync for Shared {}
// SAFETY: as above; nothing in `Shared` is tied to a thread.
unsafe impl Send for Shared {}

/// Worker threads for one processor group.
pub struct WorkerPool {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
    threads: usize,
}

/// How a pool places its threads.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    pub threads: usize,
    /// Cores to pin worker `i` to (`cores[i % len]`); empty: no pinning. Worker 0 is the calling
    /// thread and is pinned by the pool when it is created.
    pub cores: Vec<usize>,
    /// How long helpers spin before parking, in `spin_loop` iterations.
    pub spin_iterations: u32,
}

impl PoolConfig {
    pub fn new(threads: usize) -> PoolConfig {
        PoolConfig {
            threads: threads.max(1),
            cores: Vec::new(),
            spin_iterations: 200_000,
        }
    }
}

/// The most threads a pool starts: far above any machine's cores, far below what would
/// exhaust the process's threads (a plan or `-t` asking for millions is refused).
pub const MAX_POOL_THREADS: usize = 1024;

/// Starts one helper thread: its name and body.
type Spawn<'a> =
    dyn FnMut(String, Box<dyn FnOnce() + Send>) -> std::io::Result<JoinHandle<()>> + 'a;

impl WorkerPool {
    pub fn new(config: PoolConfig) -> std::io::Result<WorkerPool> {
        WorkerPool::start(config, &mut |name, body| {
            std::thread::Builder::new().name(name).spawn(body)
        })
    }

    /// [`WorkerPool::new`] with the helpers started by `spawn`. If one fails, those already
    /// started are stopped and joined before the error returns: none is left parked forever.
    fn start(config: PoolConfig, spawn: &mut Spawn) -> std::io::Result<WorkerPool> {
        if config.threads > MAX_POOL_THREADS {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{} worker threads asked for; at most {MAX_POOL_THREADS}",
                    config.threads
                ),
            ));
        }
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            job: UnsafeCell::new(Job {
                f: std::ptr::null::<fn(usize, usize, &mut [f32])>() as *const JobFn,
                outs: std::ptr::null_mut(),
                n: 0,
            }),
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            spin_iterations: config.spin_iterations,
        });
        pin_worker(&config.cores, 0);
        // The pool exists before its helpers: on a failed spawn, its drop shuts down and joins
        // the helpers already running.
        let mut pool = WorkerPool {
            shared,
            helpers: Vec::new(),
            threads: config.threads,
        };
        for worker in 1..config.threads {
            let shared = Arc::clone(&pool.shared);
            let cores = config.cores.clone();
            let body = Box::new(move || {
                pin_worker(&cores, worker);
                helper_loop(&shared, worker);
            });
            pool.helpers
                .push(spawn(format!("conductor-worker-{worker}"), body)?);
        }
        Ok(pool)
    }

    pub fn threads(&self) -> usize {
        self.threads
    }
}

/// Pins the current thread (worker `worker`) to its core from `cores`, if any are given.
///
/// The core is set directly, not looked up among `core_affinity::get_core_ids()`: that lists
/// the cores the *calling* thread may use, and a thread started by an already pinned thread
/// inherits its one-core mask (a helper would then stay on worker 0's core).
fn pin_worker(cores: &[usize], worker: usize) {
    if cores.is_empty() {
        return;
    }
    // A refused pin (a cpuset without that core, an Android app process) leaves the worker
    // unpinned: slower perhaps, the same results.
    crate::affinity::pin_current_thread_to(cores[worker % cores.len()]);
}

/// Claims and runs items of the current job until none are left.
///
/// SAFETY: the caller must participate in the job (be the pool's caller inside `run`, or a
/// helper counted in `state`), so that `job` and what it points to are valid.
unsafe fn work_on(shared: &Shared, job: Job, worker: usize) {
    loop {
        let i = shared.next.fetch_add(1, Ordering::Relaxed);
        if i >= job.n {
            return;
        }
        // SAFETY: `i < n` was claimed by exactly this thread (fetch_add hands out each index
        // once), so this is the only reference to `outs[i]`; `f` and `outs` are valid while we
        // participate.
        let (f, out) = unsafe { (&*job.f, &mut **job.outs.add(i)) };
        if catch_unwind(AssertUnwindSafe(|| f(worker, i, out))).is_err() {
            shared.panicked.store(true, Ordering::Relaxed);
        }
        shared.done.fetch_add(1, Ordering::Release);
    }
}

fn helper_loop(shared: &Shared, worker: usize) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        let state = loop {
            if shared.shutdown.load(Ordering::Acquire) {
                return;
            }
            let s = shared.state.load(Ordering::Acquire);
            if epoch(s) != seen {
                break s;
            }
            if spins < shared.spin_iterations {
                spins += 1;
                // Phases follow each other within microseconds: spin. Past that, yield while
                // spinning, so a thread that is not ours (the application's, sampling the next
                // token) gets the core at once instead of after a scheduler tick.
                if spins < PURE_SPIN {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
                continue;
            }
            // Park. The SeqCst pair (sleepers here, state in `run`) and the re-check under the
            // lock make a lost wake-up impossible.
            shared.sleepers.fetch_add(1, Ordering::SeqCst);
            let guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            if epoch(shared.state.load(Ordering::SeqCst)) == seen
                && !shared.shutdown.load(Ordering::SeqCst)
            {
                drop(shared.wake.wait(guard));
            }
            shared.sleepers.fetch_sub(1, Ordering::SeqCst);
            spins = 0;
        };
        seen = epoch(state);
        if state & OPEN == 0 {
            continue;
        }
        // Join only if the job is still open and still this epoch.
        if shared
            .state
            .compare_exchange(state, state + 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            // Either closed meanwhile or another helper joined first: re-read and retry once.
            let s = shared.state.load(Ordering::Acquire);
            if epoch(s) != seen
                || s & OPEN == 0
                || shared
                    .state
                    .compare_exchange(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
        }
        // SAFETY: we are counted as a participant of an open job; `run` does not return (and
        // does not rewrite `job`) until the count is back to zero.
        unsafe {
            let job = *shared.job.get();
            work_on(shared, job, worker);
        }
        shared.state.fetch_sub(1, Ordering::Release);
    }
}

impl ClusterRunner for WorkerPool {
    fn workers(&self) -> usize {
        self.threads
    }

    fn run(&self, outs: &mut [&mut [f32]], f: &(dyn Fn(usize, usize, &mut [f32]) + Sync)) {
        let n = outs.len();
        if self.threads == 1 || n <= 1 {
            for (i, out) in outs.iter_mut().enumerate() {
                f(0, i, out);
            }
            return;
        }
        let shared = &*self.shared;
        // One caller at a time: groups that share a pool live on one host thread, so this
        // never fires in the engine; it turns a misuse into a panic instead of a data race.
        assert!(
            !shared.busy.swap(true, Ordering::Acquire),
            "WorkerPool::run called from two threads at once"
        );
        struct Release<'a>(&'a AtomicBool);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _release = Release(&shared.busy);
        let state = shared.state.load(Ordering::Acquire);
        debug_assert_eq!(
            state & (OPEN | PARTICIPANTS),
            0,
            "previous job fully closed"
        );
        // SAFETY: no helper participates (the previous job was closed and drained), so nobody
        // reads `job` while we write it. The erased lifetimes are sound because this function
        // does not return before every participant has left (below).
        unsafe {
            *shared.job.get() = Job {
                f: std::mem::transmute::<
                    &(dyn Fn(usize, usize, &mut [f32]) + Sync + '_),
                    &'static JobFn,
                >(f) as *const JobFn,
                outs: outs.as_mut_ptr().cast(),
                n,
            };
        }
        shared.next.store(0, Ordering::Relaxed);
        shared.done.store(0, Ordering::Relaxed);
        shared.panicked.store(false, Ordering::Relaxed);
        let next_epoch = (epoch(state) + 1) & 0xFFFF_FFFF;
        shared
            .state
            .store((next_epoch << 32) | OPEN, Ordering::SeqCst);
        if shared.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            shared.wake.notify_all();
        }
        // SAFETY: the caller participates for the whole job by construction.
        unsafe {
            work_on(shared, *shared.job.get(), 0);
        }
        while shared.done.load(Ordering::Acquire) < n {
            std::hint::spin_loop();
        }
        // Close the job, then wait for helpers that joined to leave it.
        shared.state.fetch_and(!OPEN, Ordering::AcqRel);
        while shared.state.load(Ordering::Acquire) & PARTICIPANTS != 0 {
            std::hint::spin_loop();
        }
        if shared.panicked.load(Ordering::Relaxed) {
            panic!("a cluster panicked on a worker thread");
        }
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _guard = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.helpers.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(pool: &WorkerPool, n: usize) -> Vec<f32> {
        let mut buf = vec![0.0f32; n * 4];
        let mut outs: Vec<&mut [f32]> = buf.chunks_mut(4).collect();
        pool.run(&mut outs, &|_, i, out| {
            for (k, o) in out.iter_mut().enumerate() {
                *o += (i * 4 + k) as f32;
            }
        });
        buf
    }

    #[test]
    fn every_item_runs_exactly_once_for_many_jobs() {
        for threads in [1, 2, 3] {
            let pool = WorkerPool::new(PoolConfig {
                spin_iterations: 50,
                ..PoolConfig::new(threads)
            })
            .unwrap();
            for n in [0, 1, 2, 5, 64] {
                for _ in 0..200 {
                    let buf = fill(&pool, n);
                    let expected: Vec<f32> = (0..n * 4).map(|v| v as f32).collect();
                    assert_eq!(buf, expected);
                }
            }
        }
    }

    /// A helper that cannot be started fails the pool, and the helpers started before it
    /// have returned by then: none is left parked forever.
    #[test]
    fn a_failed_spawn_joins_the_helpers_already_started() {
        let running = Arc::new(AtomicUsize::new(0));
        let mut spawned = 0;
        let err = WorkerPool::start(PoolConfig::new(4), &mut |name, body| {
            spawned += 1;
            if spawned == 3 {
                return Err(std::io::Error::other("no more threads"));
            }
            let running = Arc::clone(&running);
            running.fetch_add(1, Ordering::SeqCst);
            std::thread::Builder::new().name(name).spawn(move || {
                body();
                running.fetch_sub(1, Ordering::SeqCst);
            })
        })
        .err()
        .unwrap();
        assert_eq!(err.to_string(), "no more threads");
        assert_eq!(spawned, 3);
        assert_eq!(running.load(Ordering::SeqCst), 0, "helpers left running");
        let e = WorkerPool::new(PoolConfig::new(MAX_POOL_THREADS + 1))
            .err()
            .unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    }

    #[test]
    fn helpers_wake_up_after_parking() {
        let pool = WorkerPool::new(PoolConfig {
            spin_iterations: 1,
            ..PoolConfig::new(2)
        })
        .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let used = std::sync::Mutex::new(std::collections::BTreeSet::new());
        for _ in 0..50 {
            let mut buf = vec![0.0f32; 64];
            let mut outs: Vec<&mut [f32]> = buf.chunks_mut(1).collect();
            pool.run(&mut outs, &|w, _, out| {
                used.lock().unwrap().insert(w);
                std::thread::sleep(std::time::Duration::from_micros(50));
                out[0] = 1.0;
            });
            assert!(buf.iter().all(|&v| v == 1.0));
        }
        assert!(
            used.lock().unwrap().contains(&1),
            "the parked helper took part"
        );
    }

    /// Workers pinned to cores the process may not use (as an Android app may be refused
    /// them) run unpinned: every item still runs exactly once, and the refusals are counted.
    #[test]
    fn workers_whose_pinning_is_refused_run_unpinned() {
        let before = crate::affinity::refusals();
        let forbidden = crate::affinity::forbidden_core();
        // On a thread of its own: worker 0 is the calling thread.
        std::thread::spawn(move || {
            let pool = WorkerPool::new(PoolConfig {
                cores: vec![forbidden, crate::affinity::MAX_CORE_ID + 1],
                spin_iterations: 50,
                ..PoolConfig::new(3)
            })
            .unwrap();
            for n in [1, 7, 64] {
                let expected: Vec<f32> = (0..n * 4).map(|v| v as f32).collect();
                assert_eq!(fill(&pool, n), expected);
            }
        })
        .join()
        .unwrap();
        assert!(
            crate::affinity::refusals() >= before + 3,
            "the three workers' refused pins were not counted"
        );
    }

    #[test]
    fn a_panicking_cluster_panics_the_caller_instead_of_hanging() {
        let pool = WorkerPool::new(PoolConfig::new(2)).unwrap();
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let mut buf = [0.0f32; 8];
            let mut outs: Vec<&mut [f32]> = buf.chunks_mut(1).collect();
            pool.run(&mut outs, &|_, i, _| assert!(i != 3, "boom"));
        }));
        assert!(result.is_err());
        // The pool stays usable.
        assert_eq!(
            fill(&pool, 3),
            (0..12).map(|v| v as f32).collect::<Vec<_>>()
        );
    }
}

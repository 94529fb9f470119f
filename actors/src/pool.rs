//! A pool of worker threads that split a phase's clusters among themselves.
//!
//! The calling thread is worker 0 and works too; `threads - 1` helpers wait for jobs. Decode
//! issues a job every few tens of microseconds, and a cross-thread wake-up through the kernel
//! costs 7–20 µs here, so helpers spin for a while before parking.
//!
//! Clusters are claimed from a shared counter, so who computes which cluster varies from run to
//! run — and does not matter: each cluster writes only its own output block (see
//! `conductor_runtime::exec`), so results are bit-identical for any number of threads.

use crate::pool_sync::thread::{self, JoinHandle};
use crate::pool_sync::{
    fence, spin_loop, Arc, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, Ordering, SharedCell,
};
use conductor_runtime::exec::ClusterRunner;
use std::panic::{catch_unwind, AssertUnwindSafe};

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
    job: SharedCell<Job>,
    next: AtomicUsize,
    done: AtomicUsize,
    panicked: AtomicBool,
    /// Held by the one caller inside `run`; a second concurrent caller would overwrite `job`.
    busy: AtomicBool,
    shutdown: AtomicBool,
    sleepers: AtomicUsize,
    /// Set by `rest` ([`ClusterRunner::rest`]), cleared by the next job: waiting helpers park at once.
    resting: AtomicBool,
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
            thread::Builder::new().name(name).spawn(body)
        })
    }

    /// [`WorkerPool::new`] with the helpers started by `spawn`. If one fails, those already
    /// started are stopped and joined before the error returns: none is left parked forever.
    pub(crate) fn start(config: PoolConfig, spawn: &mut Spawn) -> std::io::Result<WorkerPool> {
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
            job: SharedCell::new(Job {
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
            resting: AtomicBool::new(false),
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
            // Parking early is always safe: the wake-up protocol below does not depend on it.
            if spins < shared.spin_iterations && !shared.resting.load(Ordering::Relaxed) {
                spins += 1;
                // Phases follow each other within microseconds: spin. Past that, yield while
                // spinning, so a thread that is not ours (the application's, sampling the next
                // token) gets the core at once instead of after a scheduler tick.
                if spins < PURE_SPIN {
                    spin_loop();
                } else {
                    thread::yield_now();
                }
                continue;
            }
            // Park. The pair of a write, a SeqCst fence and a read (sleepers then state here,
            // state then sleepers in `run`) means at least one side sees the other's write, and
            // the re-check under the lock makes a lost wake-up impossible. The fences, not
            // SeqCst accesses alone, are what the loom model (tests/pool_model.rs) can check.
            shared.sleepers.fetch_add(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
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
            let job = shared.job.read();
            work_on(shared, job, worker);
        }
        shared.state.fetch_sub(1, Ordering::Release);
    }
}

impl WorkerPool {
    /// Helpers parked now.
    #[cfg(test)]
    pub(crate) fn parked(&self) -> usize {
        self.shared.sleepers.load(Ordering::SeqCst)
    }
}

impl ClusterRunner for WorkerPool {
    fn workers(&self) -> usize {
        self.threads
    }

    fn rest(&self) {
        self.shared.resting.store(true, Ordering::Relaxed);
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
        shared.resting.store(false, Ordering::Relaxed);
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
            shared.job.write(Job {
                f: std::mem::transmute::<
                    &(dyn Fn(usize, usize, &mut [f32]) + Sync + '_),
                    &'static JobFn,
                >(f) as *const JobFn,
                outs: outs.as_mut_ptr().cast(),
                n,
            });
        }
        shared.next.store(0, Ordering::Relaxed);
        shared.done.store(0, Ordering::Relaxed);
        shared.panicked.store(false, Ordering::Relaxed);
        let next_epoch = (epoch(state) + 1) & 0xFFFF_FFFF;
        shared
            .state
            .store((next_epoch << 32) | OPEN, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if shared.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            shared.wake.notify_all();
        }
        // SAFETY: the caller participates for the whole job by construction.
        unsafe {
            work_on(shared, shared.job.read(), 0);
        }
        while shared.done.load(Ordering::Acquire) < n {
            spin_loop();
        }
        // Close the job, then wait for helpers that joined to leave it.
        shared.state.fetch_and(!OPEN, Ordering::AcqRel);
        while shared.state.load(Ordering::Acquire) & PARTICIPANTS != 0 {
            spin_loop();
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

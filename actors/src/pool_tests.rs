//! The worker pool's tests on real threads (`tests/pool_model.rs` model-checks its handoff).

use crate::pool::{PoolConfig, WorkerPool, MAX_POOL_THREADS};
use conductor_runtime::exec::ClusterRunner;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

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

/// Helpers that would spin for ever between jobs park once the pool rests (the cores go to
/// another engine), and the next job wakes them.
#[test]
fn helpers_park_when_the_pool_rests_and_wake_for_the_next_job() {
    let pool = WorkerPool::new(PoolConfig {
        spin_iterations: u32::MAX,
        ..PoolConfig::new(3)
    })
    .unwrap();
    let expected: Vec<f32> = (0..64 * 4).map(|v| v as f32).collect();
    let wait_for = |parked: usize, what: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while pool.parked() != parked {
            assert!(std::time::Instant::now() < deadline, "{what}");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    };
    for _ in 0..3 {
        assert_eq!(fill(&pool, 64), expected);
        wait_for(0, "the job did not wake the helpers");
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(pool.parked(), 0, "spinning helpers parked without a rest");
        pool.rest();
        wait_for(2, "helpers still spinning after the rest");
    }
    assert_eq!(fill(&pool, 64), expected);
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

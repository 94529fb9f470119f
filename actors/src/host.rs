//! Hosts: the OS threads actors run on.
//!
//! A kameo actor is a future. Run on tokio, a message to an actor on another thread costs
//! 25–30 µs here even when the receiving runtime spins before parking (measured: two
//! current-thread runtimes ping-ponging kameo messages; the remote wake goes through tokio's
//! inject queue and driver unpark). Decode sends two messages per phase, ~240 per token, so
//! that would cost most of a token. A [`Host`] instead polls its actors' futures itself: a woken
//! actor sets a flag the host thread is spinning on, so a message costs ~0.5 µs across threads
//! and ~0.3 µs between actors on the same host. After a spin window without work the host
//! parks, so an idle engine costs no CPU.
//!
//! kameo needs a tokio context for a few internal tasks (link notifications); every host
//! enters the handle of one small background runtime, which runs those and nothing else.
//!
//! A host is pinned to its first core when given cores: the compute group that lives on it
//! uses it as worker 0, so the calling thread of a phase is the host thread itself.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// How long an idle host spins before parking. Decode phases arrive every few tens of
/// microseconds and the gap between tokens is of the same order, so a busy engine never parks.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(200);

struct HostShared {
    /// Futures handed to the host and not yet adopted by its thread.
    incoming: Mutex<Vec<Task>>,
    /// Bumped by every wake-up and every new task; the host spins on it.
    notify: AtomicU64,
    /// Set while the host thread is parked (or about to park).
    sleeping: AtomicBool,
    shutdown: AtomicBool,
    thread: Thread,
}

impl HostShared {
    fn ring(&self) {
        self.notify.fetch_add(1, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            self.thread.unpark();
        }
    }
}

/// Wakes one task of a host.
struct TaskWaker {
    host: Arc<HostShared>,
    woken: AtomicBool,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.woken.swap(true, Ordering::AcqRel) {
            self.host.ring();
        }
    }
}

/// A thread that runs actors (and any other futures handed to it).
pub struct Host {
    name: String,
    shared: Arc<HostShared>,
    thread: Option<JoinHandle<()>>,
}

/// What a host is told when it starts.
#[derive(Clone, Debug)]
pub struct HostConfig {
    pub name: String,
    /// Pin the host thread to the first of these cores (none: leave it to the OS).
    pub cores: Vec<u32>,
    pub spin: Duration,
}

impl Host {
    /// Starts a host thread; `init` runs on it first (to build what must live on that thread,
    /// such as a worker pool whose worker 0 is the host), and its result is returned.
    pub fn start<T: Send + 'static>(
        config: HostConfig,
        tokio: tokio::runtime::Handle,
        init: impl FnOnce() -> T + Send + 'static,
    ) -> std::io::Result<(Host, T)> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let spin = config.spin;
        let cores = config.cores.clone();
        let thread = std::thread::Builder::new()
            .name(format!("conductor-{}", config.name))
            .spawn(move || {
                pin_current_thread(&cores);
                let shared = Arc::new(HostShared {
                    incoming: Mutex::new(Vec::new()),
                    notify: AtomicU64::new(0),
                    sleeping: AtomicBool::new(false),
                    shutdown: AtomicBool::new(false),
                    thread: std::thread::current(),
                });
                let value = init();
                if tx.send((Arc::clone(&shared), value)).is_err() {
                    return;
                }
                let _tokio = tokio.enter();
                run_loop(&shared, spin);
            })?;
        let (shared, value) = rx
            .recv()
            .map_err(|_| std::io::Error::other("host thread failed to start"))?;
        Ok((
            Host {
                name: config.name,
                shared,
                thread: Some(thread),
            },
            value,
        ))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `future` on this host.
    pub fn spawn(&self, future: impl Future<Output = ()> + Send + 'static) {
        self.shared
            .incoming
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Box::pin(future));
        self.shared.ring();
    }

    /// Whether the host thread is still running.
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Whether the host runs a new future within `wait`: false when its thread died, or is
    /// stuck in a future that does not return (a read that never completes). New actors
    /// must not be put on such a host.
    pub fn responds_within(&self, wait: Duration) -> bool {
        if !self.is_running() {
            return false;
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.spawn(async move {
            let _ = tx.send(());
        });
        rx.recv_timeout(wait).is_ok()
    }

    /// Lets the thread go without joining it (a stuck thread would block the join forever):
    /// it stops on its own once its futures return.
    pub fn abandon(mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.ring();
        drop(self.thread.take());
    }
}

impl Drop for Host {
    /// Stops the thread once its futures have finished (actors stop when told to or when every
    /// reference to them is gone); a future that never finishes is dropped unpolled.
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.ring();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn pin_current_thread(cores: &[u32]) {
    if let Some(&first) = cores.first() {
        // Refused: the host runs unpinned (see `affinity`).
        crate::affinity::pin_current_thread_to(first as usize);
    }
}

/// How long a host keeps polling its remaining futures after shutdown was asked, so that
/// actors told to stop can finish their shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Spin iterations before the idle host starts yielding.
const PURE_SPIN: u32 = 1_000;

fn run_loop(shared: &Arc<HostShared>, spin: Duration) {
    let mut tasks: Vec<(Task, Arc<TaskWaker>)> = Vec::new();
    let mut shutdown_since: Option<Instant> = None;
    loop {
        let seen = shared.notify.load(Ordering::SeqCst);
        for task in shared
            .incoming
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let waker = Arc::new(TaskWaker {
                host: Arc::clone(shared),
                woken: AtomicBool::new(true),
            });
            tasks.push((task, waker));
        }
        let mut progressed = false;
        tasks.retain_mut(|(task, waker)| {
            if !waker.woken.swap(false, Ordering::AcqRel) {
                return true;
            }
            progressed = true;
            let w = Waker::from(Arc::clone(waker));
            let mut cx = Context::from_waker(&w);
            task.as_mut().poll(&mut cx).is_pending()
        });
        if shared.shutdown.load(Ordering::SeqCst) {
            let since = *shutdown_since.get_or_insert_with(Instant::now);
            if tasks.is_empty() || since.elapsed() > SHUTDOWN_GRACE {
                return;
            }
        }
        if progressed {
            continue;
        }
        idle(shared, seen, spin);
    }
}

/// Waits for the next wake-up: spins for `spin`, then parks. Past the first microseconds the
/// spin yields the core at each turn: the thread that will send the next message (the
/// application's, sampling a token) may need this very core.
fn idle(shared: &HostShared, seen: u64, spin: Duration) {
    let start = Instant::now();
    let mut i = 0u32;
    while shared.notify.load(Ordering::Acquire) == seen {
        i = i.wrapping_add(1);
        if i > PURE_SPIN {
            std::thread::yield_now();
        }
        if i.is_multiple_of(64) && start.elapsed() > spin {
            // The SeqCst store/load pairs with `ring` (bump, then read `sleeping`): either the
            // ringer sees us sleeping and unparks, or we see its bump and do not park.
            shared.sleeping.store(true, Ordering::SeqCst);
            if shared.notify.load(Ordering::SeqCst) == seen
                && !shared.shutdown.load(Ordering::SeqCst)
            {
                std::thread::park_timeout(Duration::from_millis(100));
            }
            shared.sleeping.store(false, Ordering::SeqCst);
            return;
        }
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap()
    }

    fn config(name: &str) -> HostConfig {
        HostConfig {
            name: name.into(),
            cores: Vec::new(),
            spin: Duration::from_micros(20),
        }
    }

    #[test]
    fn futures_run_to_completion_and_wake_across_hosts() {
        let rt = runtime();
        let (a, init) = Host::start(config("a"), rt.handle().clone(), || 7).unwrap();
        assert_eq!(init, 7);
        let (b, ()) = Host::start(config("b"), rt.handle().clone(), || ()).unwrap();
        // Ping-pong through tokio channels: each side waits on the other (parked or spinning).
        let (to_b, mut b_rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
        let (to_a, mut a_rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        b.spawn(async move {
            while let Some(v) = b_rx.recv().await {
                if to_a.send(v + 1).is_err() {
                    break;
                }
            }
        });
        a.spawn(async move {
            let mut v = 0;
            for _ in 0..1000 {
                to_b.send(v).unwrap();
                v = a_rx.recv().await.unwrap();
                // Now and then let both sides park.
                if v % 250 == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            done_tx.send(v).unwrap();
        });
        assert_eq!(done_rx.recv_timeout(Duration::from_secs(20)).unwrap(), 1000);
        drop(a);
        drop(b);
    }

    /// A host whose thread died, or is stuck in a future, does not respond; an abandoned
    /// stuck host does not block the caller.
    #[test]
    fn dead_and_stuck_hosts_do_not_respond() {
        let rt = runtime();
        let (host, ()) = Host::start(config("d"), rt.handle().clone(), || ()).unwrap();
        assert!(host.responds_within(Duration::from_secs(5)));
        host.spawn(async { panic!("a future that kills its host") });
        let started = Instant::now();
        while host.is_running() && started.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!host.responds_within(Duration::from_secs(1)));
        drop(host);
        // Stuck until released: `abandon` returning while it is still held did not wait.
        let (stuck, ()) = Host::start(config("e"), rt.handle().clone(), || ()).unwrap();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (freed_tx, freed) = std::sync::mpsc::channel();
        stuck.spawn(async move {
            let _ = held.recv();
            let _ = freed_tx.send(());
        });
        assert!(!stuck.responds_within(Duration::from_millis(200)));
        stuck.abandon();
        assert!(
            freed.try_recv().is_err(),
            "abandon waited for the stuck future"
        );
        release.send(()).unwrap();
        freed.recv_timeout(Duration::from_secs(20)).unwrap();
    }

    #[test]
    fn a_dropped_host_stops_its_thread() {
        let rt = runtime();
        let (host, ()) = Host::start(config("c"), rt.handle().clone(), || ()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        host.spawn(async move {
            tx.send(()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(host.is_running());
        drop(host); // joins; a hang here fails the test run
    }
}

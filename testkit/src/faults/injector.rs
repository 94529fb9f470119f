//! The fault-injecting reader set on a store's reads: it counts an attempt's reads and strikes
//! the ones the schedule names.

use super::{FaultKind, KindCounts};
use conductor::runtime::cache::{ReadFault, ReadFaults};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The fault-injecting reader: set on a store's reads (`InlineDriver::set_read_faults`,
/// `ActorOptions::read_faults`), it counts the reads of the current attempt and strikes the
/// ones the schedule names. A latency spike sleeps; a stuck read waits until [`Injector::cancel`]
/// or the step deadline (plus a margin) and then fails.
#[derive(Debug)]
pub struct Injector {
    state: Mutex<Armed>,
    cancelled: Condvar,
    deadline: Duration,
    /// Faults that struck, by kind.
    fired: [AtomicU64; 9],
}

#[derive(Debug, Default)]
struct Armed {
    /// Reads of the store since [`Injector::arm`].
    reads: u32,
    faults: Vec<(u32, FaultKind)>,
    /// Stuck reads end at once from now on (until the next arm).
    cancelled: bool,
}

impl Injector {
    pub fn new(deadline: Duration) -> Injector {
        Injector {
            state: Mutex::new(Armed::default()),
            cancelled: Condvar::new(),
            deadline,
            fired: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Armed> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new attempt starts: reads count from 0 and `faults` (read index, kind) are armed.
    pub fn arm(&self, faults: impl IntoIterator<Item = (u32, FaultKind)>) {
        let mut s = self.lock();
        s.reads = 0;
        s.faults = faults.into_iter().collect();
        s.cancelled = false;
    }

    /// Reads counted since the last [`Injector::arm`].
    pub fn reads(&self) -> u32 {
        self.lock().reads
    }

    /// Ends every stuck read now (they fail), and disarms what is left.
    pub fn cancel(&self) {
        let mut s = self.lock();
        s.cancelled = true;
        s.faults.clear();
        self.cancelled.notify_all();
    }

    /// Counts an actor fault fired by the harness.
    pub fn count(&self, kind: FaultKind) {
        self.fired[kind.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Faults that struck so far, by kind.
    pub fn fired(&self) -> KindCounts {
        std::array::from_fn(|i| self.fired[i].load(Ordering::Relaxed))
    }
}

impl ReadFaults for Injector {
    fn before_read(&self, _offset: u64, len: usize) -> ReadFault {
        let kind = {
            let mut s = self.lock();
            let k = s.reads;
            s.reads += 1;
            s.faults
                .iter()
                .find(|(r, _)| *r == k)
                .map(|&(_, kind)| kind)
        };
        let Some(kind) = kind else {
            return ReadFault::None;
        };
        self.count(kind);
        match kind {
            FaultKind::ReadError => ReadFault::Fail(std::io::ErrorKind::Other),
            FaultKind::ShortRead(per_mille) => {
                ReadFault::Short(len * usize::from(per_mille) / 1000)
            }
            FaultKind::BitFlip(bit) => ReadFault::Flip(bit),
            FaultKind::LatencySpike(us) => {
                std::thread::sleep(Duration::from_micros(u64::from(us)));
                ReadFault::None
            }
            FaultKind::StuckRead(past) => {
                // Past the step deadline (so that the driver's deadline is what the step
                // meets first), or until cancelled.
                let until = Instant::now() + self.deadline + Duration::from_millis(past.into());
                let mut s = self.lock();
                while !s.cancelled {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    s = self
                        .cancelled
                        .wait_timeout(s, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                ReadFault::Fail(std::io::ErrorKind::TimedOut)
            }
            _ => ReadFault::None,
        }
    }
}

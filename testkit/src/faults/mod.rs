//! A seeded fault-injection harness, after TigerBeetle's VOPR: one `u64` seed drives a
//! deterministic fault schedule (read errors, short reads, bit flips, latency spikes, stuck
//! reads; actor panics and deaths), injected into the real inline and actor drivers (through a
//! fault-injecting reader, [`Injector`], set on the store's [`BundleFile`] at construction, and
//! the actor driver's fault hooks) and into the simulator (on virtual time,
//! [`Fixture::simulate`]), with invariants checked beside every step:
//!
//! - every step gives exactly the fault-free bits (its logits) or fails with an error;
//! - the step after a failure, retried as the API does it (the same token again, or the
//!   prompt from its first token the session does not hold; the actor driver replaces its
//!   actors first), gives the fault-free bits once no fault is scheduled on it;
//! - every step returns within its bound (the plan's step deadline, plus the actors' restart);
//! - no cache slot is held between steps, and no thread outlives a seed's driver;
//! - a seed's schedule is a function of the seed alone (printed with any failure), and on the
//!   inline driver so is everything the run does.
//!
//! `cargo run --release --example fault_injection -- --seeds 1000` runs the figure of
//! `docs/reliability.md`; `tests/fault_injection.rs` runs a few seeds and the regressions.
//!
//! [`BundleFile`]: conductor::runtime::cache::BundleFile

mod fixture;
mod injector;
mod report;
mod run;
mod schedule;
mod simulate;
mod watchdog;

pub use fixture::{default_spec, Fixture};
pub use injector::Injector;
pub use report::{SeedReport, Totals};
pub use run::Which;
pub use schedule::{Fault, FaultKind, KindCounts, Schedule, KIND_NAMES};
pub use simulate::sim_profile;
pub use watchdog::Watchdog;

use std::time::Duration;

/// Decode steps per seed.
pub const DECODE_STEPS: u32 = 64;
/// Attempts of one step that may carry faults; the next attempt is always clean.
pub const FAULTY_ATTEMPTS: u32 = 3;

/// The step deadline the harness runs under (the plan's `step_deadline_ms`).
pub const DEADLINE: Duration = Duration::from_millis(500);
/// How long past the deadline a stuck read may stay stuck at most.
pub const STUCK_MAX: Duration = Duration::from_millis(3000);

/// Threads of this process now (`/proc/self/task`; 0 where there is none).
pub fn count_threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

fn bits(logits: &[f32]) -> Vec<u32> {
    logits.iter().map(|x| x.to_bits()).collect()
}

/// Keeps the panics the harness injects (their message says "injected fault") off stderr;
/// every other panic is reported as before.
pub fn quiet_injected_panics() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if !message.contains("injected fault") {
            previous(info);
        }
    }));
}

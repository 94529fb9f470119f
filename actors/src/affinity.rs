//! Pinning threads to cores, and going on unpinned where the system refuses.
//!
//! A plan names the cores each group runs on, but the process may not be allowed them: a
//! cpuset or container that excludes them, or an Android app process, whose cpuset the system
//! manages (it may shrink it when the app goes to the background). `sched_setaffinity` then
//! fails. That costs speed, not correctness (results do not depend on which core computes what),
//! so a refused pin is reported once and the thread runs wherever the scheduler puts it.
//! The call is the same on glibc and bionic (`core_affinity` issues `sched_setaffinity` on both).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Core ids a CPU mask can name (`CPU_SETSIZE`, 1024 on glibc and on 64-bit bionic). Larger
/// ids are refused here without a system call: the mask cannot hold them (`CPU_SET` would index
/// past its end).
pub(crate) const MAX_CORE_ID: usize = 1023;

static REFUSED_NOTED: AtomicBool = AtomicBool::new(false);
static REFUSALS: AtomicUsize = AtomicUsize::new(0);

/// Pins the calling thread to `core`. Returns false, and the thread stays where it was, when
/// the system refuses; the first refusal in the process prints a note.
pub(crate) fn pin_current_thread_to(core: usize) -> bool {
    let refused = if core > MAX_CORE_ID {
        format!("core id {core} is above {MAX_CORE_ID}, the largest a CPU mask holds")
    } else if core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        return true;
    } else {
        // `sched_setaffinity` set errno on this thread; nothing ran in between.
        std::io::Error::last_os_error().to_string()
    };
    REFUSALS.fetch_add(1, Ordering::Relaxed);
    if !REFUSED_NOTED.swap(true, Ordering::Relaxed) {
        eprintln!(
            "note: a thread could not be pinned to core {core} ({refused}); threads whose pinning \
             is refused run unpinned"
        );
    }
    false
}

/// Refused pins in this process so far.
#[cfg(test)]
pub(crate) fn refusals() -> usize {
    REFUSALS.load(Ordering::Relaxed)
}

#[cfg(test)]
pub(crate) use tests::forbidden_core;

#[cfg(test)]
mod tests {
    use super::*;

    /// A core id the process may not use (it cannot run on every one of 1024 cores).
    pub(crate) fn forbidden_core() -> usize {
        let allowed: Vec<usize> = core_affinity::get_core_ids()
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.id)
            .collect();
        (0..=MAX_CORE_ID)
            .rev()
            .find(|c| !allowed.contains(c))
            .expect("some core id is not allowed")
    }

    #[test]
    fn a_refused_pin_returns_false_and_is_counted_and_an_id_past_the_mask_does_not_panic() {
        let before = refusals();
        let thread = std::thread::spawn(|| {
            (
                pin_current_thread_to(forbidden_core()),
                pin_current_thread_to(MAX_CORE_ID + 1),
                pin_current_thread_to(usize::MAX),
            )
        });
        assert_eq!(thread.join().unwrap(), (false, false, false));
        assert!(refusals() >= before + 3, "refusals not counted");
        assert!(REFUSED_NOTED.load(Ordering::Relaxed), "no note printed");
    }
}

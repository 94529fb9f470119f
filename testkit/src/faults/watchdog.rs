//! The watchdog that ends the process when a step does not return, printing the seed, its
//! schedule and the step.

use super::{Schedule, Which};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Fails a run that does not return: a step still running after [`Watchdog::LIMIT`] prints
/// the seed, its schedule and the step, and ends the process (a hung thread cannot be
/// joined, and a hang must not hang CI).
pub struct Watchdog {
    current: Arc<Mutex<Option<(Instant, String)>>>,
}

impl Watchdog {
    pub const LIMIT: Duration = Duration::from_secs(60);

    pub fn new() -> Watchdog {
        let current: Arc<Mutex<Option<(Instant, String)>>> = Arc::default();
        let watched = Arc::clone(&current);
        std::thread::Builder::new()
            .name("fault-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(250));
                let now = watched.lock().unwrap_or_else(|e| e.into_inner()).clone();
                if let Some((since, what)) = now {
                    if since.elapsed() > Watchdog::LIMIT {
                        eprintln!("HANG: {what} did not return within {:?}", Watchdog::LIMIT);
                        std::process::exit(3);
                    }
                }
            })
            .expect("the watchdog thread starts");
        Watchdog { current }
    }

    pub(super) fn start(&self, schedule: &Schedule, which: Which, step: u32, attempt: u32) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some((
            Instant::now(),
            format!(
                "{} driver, step {step} attempt {attempt}, {schedule}",
                which.name()
            ),
        ));
    }

    pub(super) fn stop(&self) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl Default for Watchdog {
    fn default() -> Self {
        Watchdog::new()
    }
}

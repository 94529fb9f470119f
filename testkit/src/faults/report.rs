//! What the seeds did: one seed's report on one driver, and the totals over many seeds.

use super::{KindCounts, Which, KIND_NAMES};

/// What one seed on one driver did.
#[derive(Clone, Debug, Default)]
pub struct SeedReport {
    pub seed: u64,
    pub which: Which,
    /// Step attempts run, and those that failed with an error.
    pub steps: u64,
    pub failed: u64,
    /// Of those, attempts of the prompt.
    pub failed_prompt: u64,
    /// Violations of the invariants.
    pub wrong: u64,
    pub hangs: u64,
    pub leaked_slots: u64,
    pub leaked_threads: u64,
    /// Clean attempts (after a failure) that failed.
    pub unrecovered: u64,
    pub fired: KindCounts,
    pub violations: Vec<String>,
}

impl SeedReport {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// What the run did, for comparing two runs of a seed: attempts, failures, faults struck.
    pub fn outcome(&self) -> (u64, u64, KindCounts) {
        (self.steps, self.failed, self.fired)
    }
}

/// Totals over many seeds.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    pub seeds: u64,
    pub steps: u64,
    pub failed: u64,
    /// Of those, attempts of the prompt.
    pub failed_prompt: u64,
    pub wrong: u64,
    pub hangs: u64,
    pub leaked_slots: u64,
    pub leaked_threads: u64,
    pub unrecovered: u64,
    pub fired: KindCounts,
    /// Seeds with a violation, with what it was.
    pub failing: Vec<(u64, String)>,
}

impl Totals {
    pub fn add(&mut self, r: &SeedReport) {
        self.seeds += 1;
        self.steps += r.steps;
        self.failed += r.failed;
        self.failed_prompt += r.failed_prompt;
        self.wrong += r.wrong;
        self.hangs += r.hangs;
        self.leaked_slots += r.leaked_slots;
        self.leaked_threads += r.leaked_threads;
        self.unrecovered += r.unrecovered;
        for (t, f) in self.fired.iter_mut().zip(r.fired) {
            *t += f;
        }
        if !r.ok() {
            self.failing.push((r.seed, r.violations.join("; ")));
        }
    }

    /// One line per count.
    pub fn summary(&self) -> String {
        let fired: Vec<String> = KIND_NAMES
            .iter()
            .zip(self.fired)
            .map(|(n, c)| format!("{n} {c}"))
            .collect();
        format!(
            "{} seeds, {} step attempts ({} failed with an error, {} of them the prompt's); faults injected: {}; wrong outputs {}, hangs {}, leaked slots {}, leaked threads {}, unrecovered {}",
            self.seeds,
            self.steps,
            self.failed,
            self.failed_prompt,
            fired.join(", "),
            self.wrong,
            self.hangs,
            self.leaked_slots,
            self.leaked_threads,
            self.unrecovered,
        )
    }
}

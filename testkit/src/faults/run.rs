//! Running a seed's schedule on a real driver (inline or actors): each step under its faults,
//! failed attempts retried, and every invariant checked beside it.

use super::{
    bits, count_threads, Fault, FaultKind, Fixture, Injector, Schedule, SeedReport, Watchdog,
    DECODE_STEPS, FAULTY_ATTEMPTS, STUCK_MAX,
};
use conductor::runtime::exec::{Driver, InlineDriver, Serial, Session};
use conductor_actors::ActorDriver;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which driver a run uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Which {
    #[default]
    Inline,
    Actors,
    /// The simulator, on virtual time ([`Fixture::simulate`]).
    Simulator,
}

impl Which {
    pub fn name(self) -> &'static str {
        match self {
            Which::Inline => "inline",
            Which::Actors => "actors",
            Which::Simulator => "simulator",
        }
    }
}

impl Fixture {
    /// Runs `schedule` on driver `which`: the prompt, then every decode step, each under its
    /// faults, failed attempts retried, each checked.
    pub fn run(&self, which: Which, schedule: &Schedule, watchdog: &Watchdog) -> SeedReport {
        let mut report = SeedReport {
            seed: schedule.seed,
            which,
            ..SeedReport::default()
        };
        let threads_before = count_threads();
        let injector = Arc::new(Injector::new(self.deadline()));
        let run = self.run_steps(which, schedule, watchdog, &injector, &mut report);
        if let Err(why) = run {
            report.violations.push(why);
        }
        injector.cancel();
        report.fired = injector.fired();
        // Every thread the driver started ends with it (a stuck read's thread once its read
        // returns: within the deadline).
        let grace = Instant::now() + self.deadline() + STUCK_MAX + Duration::from_secs(2);
        let mut threads = count_threads();
        while threads > threads_before && Instant::now() < grace {
            std::thread::sleep(Duration::from_millis(5));
            threads = count_threads();
        }
        if threads > threads_before {
            report.leaked_threads = (threads - threads_before) as u64;
            report.violations.push(format!(
                "{} threads outlived the driver",
                threads - threads_before
            ));
        }
        report
    }

    fn run_steps(
        &self,
        which: Which,
        schedule: &Schedule,
        watchdog: &Watchdog,
        injector: &Arc<Injector>,
        report: &mut SeedReport,
    ) -> Result<(), String> {
        let mut driver: Box<dyn Checked> = match which {
            Which::Inline => Box::new(self.inline(injector).map_err(|e| e.to_string())?),
            Which::Actors => Box::new(self.actors(injector)?),
            Which::Simulator => return Err("the simulator runs through Fixture::simulate".into()),
        };
        let mut session = Session::new(&self.model, self.n_ctx).map_err(|e| e.to_string())?;
        // The bound of a step: the deadline, the actors' restart (up to a second per host
        // that does not answer) or on the inline driver, which has no deadline of its own, the
        // longest stuck read; and slack for a loaded machine. The prompt is several steps.
        let bound = self.deadline() + STUCK_MAX + Duration::from_secs(2);
        let prompt_steps = self
            .prompt
            .len()
            .div_ceil(self.plan.prefill_max_tokens.max(1) as usize);
        // Step 0 is the prompt, then the decode steps.
        for step in 0..=DECODE_STEPS {
            let mut attempt = 0;
            loop {
                // A failed prompt is taken up again from the first token the session does not
                // hold: its steps that completed stay (`Driver::eval`).
                let tokens = match step {
                    0 => &self.prompt[session.n_past()..],
                    _ => std::slice::from_ref(&self.tokens[step as usize - 1]),
                };
                let bound = match step {
                    0 => bound * prompt_steps as u32,
                    _ => bound,
                };
                let faults: Vec<&Fault> = schedule.at(step, attempt).collect();
                injector.arm(
                    faults
                        .iter()
                        .filter(|f| f.kind.is_read())
                        .map(|f| (f.read, f.kind)),
                );
                for f in faults.iter().filter(|f| !f.kind.is_read()) {
                    if let Some(actors) = driver.as_actor() {
                        if self.fire_actor_fault(actors, f.kind) {
                            injector.count(f.kind);
                        }
                    }
                }
                watchdog.start(schedule, which, step, attempt);
                let started = Instant::now();
                let result = driver.eval_last(&mut session, tokens).map(bits);
                let took = started.elapsed();
                watchdog.stop();
                // What is left of this attempt's faults does not carry over.
                injector.arm([]);
                report.steps += 1;
                if took > bound {
                    report.hangs += 1;
                    report.violations.push(format!(
                        "step {step} attempt {attempt} took {took:?} (bound {bound:?})"
                    ));
                }
                let held = driver.held_slots();
                if held > 0 {
                    report.leaked_slots += u64::from(held);
                    report.violations.push(format!(
                        "step {step} attempt {attempt}: {held} cache slots held after the step"
                    ));
                }
                match result {
                    Ok(got) if got == self.logits[step as usize] => break,
                    Ok(_) => {
                        report.wrong += 1;
                        report.violations.push(format!(
                            "step {step} attempt {attempt}: logits differ from the fault-free run"
                        ));
                        break;
                    }
                    Err(e) => {
                        report.failed += 1;
                        if step == 0 {
                            report.failed_prompt += 1;
                        }
                        if attempt >= FAULTY_ATTEMPTS {
                            report.unrecovered += 1;
                            return Err(format!(
                                "step {step}: attempt {attempt} had no fault and failed: {e}"
                            ));
                        }
                        attempt += 1;
                    }
                }
            }
        }
        Ok(())
    }

    /// Fires an actor fault on the actor driver; whether it struck.
    fn fire_actor_fault(&self, d: &ActorDriver, kind: FaultKind) -> bool {
        match kind {
            FaultKind::GroupPanic => d.inject_panic(&self.group()),
            FaultKind::StoragePanic => d.inject_storage_panic(0),
            FaultKind::GroupDeath => d.kill_group(&self.group()),
            FaultKind::StorageDeath => d.kill_storage(0),
            _ => false,
        }
    }
}

/// What the harness needs of a driver besides [`Driver`].
trait Checked: Driver {
    fn held_slots(&self) -> u32;
    fn as_actor(&self) -> Option<&ActorDriver>;
}

impl Checked for InlineDriver<Serial> {
    fn held_slots(&self) -> u32 {
        self.held_cache_slots().unwrap_or(0)
    }

    fn as_actor(&self) -> Option<&ActorDriver> {
        None
    }
}

impl Checked for ActorDriver {
    /// The scheduler that will serve the next step: after a failed step the driver replaces
    /// its actors (and the scheduler with its cache directory), so only a healthy one counts.
    fn held_slots(&self) -> u32 {
        if self.needs_restart() {
            return 0;
        }
        self.held_cache_slots().unwrap_or(0)
    }

    fn as_actor(&self) -> Option<&ActorDriver> {
        Some(self)
    }
}

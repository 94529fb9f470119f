//! The seeds on the simulator: the schedule's faults on virtual time, each seed simulated twice
//! (the second run must be the same), and the hardware profile it runs on.

use super::{
    FaultKind, Fixture, KindCounts, Schedule, SeedReport, Which, DECODE_STEPS, FAULTY_ATTEMPTS,
};

/// The seed's schedule on the simulator: read faults on the reads the simulator issues (a
/// run read as one counts once), actor faults on the next compute or read.
struct SimInjector<'s> {
    schedule: &'s Schedule,
    faults: Vec<(u32, FaultKind)>,
    fired: KindCounts,
}

impl conductor_simulator::SimFaults for SimInjector<'_> {
    fn before_step(
        &mut self,
        index: usize,
        decode: Option<u32>,
        attempt: u32,
    ) -> conductor_simulator::SimActorFaults {
        let mut actors = conductor_simulator::SimActorFaults::default();
        self.faults.clear();
        // Decode steps are numbered from 1 here, as in the real drivers' schedule; the
        // prompt's faults (step 0) strike its first prefill step.
        let step = match decode {
            Some(i) => i + 1,
            None if index == 0 => 0,
            None => return actors,
        };
        for f in self.schedule.at(step, attempt) {
            match f.kind {
                FaultKind::GroupPanic | FaultKind::GroupDeath => actors.group = true,
                FaultKind::StoragePanic | FaultKind::StorageDeath => actors.storage = true,
                kind => {
                    self.faults.push((f.read, kind));
                    continue;
                }
            }
            self.fired[f.kind.index()] += 1;
        }
        actors
    }

    fn read(&mut self, read: u32) -> conductor_simulator::SimReadFault {
        use conductor_simulator::SimReadFault;
        let Some(&(_, kind)) = self.faults.iter().find(|(r, _)| *r == read) else {
            return SimReadFault::None;
        };
        self.fired[kind.index()] += 1;
        match kind {
            FaultKind::ReadError | FaultKind::ShortRead(_) | FaultKind::BitFlip(_) => {
                SimReadFault::Bad
            }
            FaultKind::LatencySpike(us) => SimReadFault::Delay(u64::from(us) * 1000),
            FaultKind::StuckRead(_) => SimReadFault::Stuck,
            _ => SimReadFault::None,
        }
    }
}

/// The hardware profile the simulator runs the seeds on (this repository's build machine).
pub fn sim_profile() -> conductor::runtime::plan::HardwareProfile {
    conductor::runtime::plan::HardwareProfile::from_toml(include_str!(
        "../../../profiles/build-machine.toml"
    ))
    .expect("the repository's build-machine profile parses")
}

impl Fixture {
    /// Runs `schedule` on the simulator (virtual time, the plan's deadline in virtual
    /// nanoseconds), twice: the invariants are checked on the first run, and the second must
    /// be the same run.
    pub fn simulate(
        &self,
        profile: &conductor::runtime::plan::HardwareProfile,
        schedule: &Schedule,
    ) -> SeedReport {
        let mut report = SeedReport {
            seed: schedule.seed,
            which: Which::Simulator,
            ..SeedReport::default()
        };
        let workload = conductor_simulator::Workload::new(
            self.model.description(),
            self.prompt.len() as u32,
            DECODE_STEPS,
        );
        let deadline_ns = self.deadline().as_nanos() as u64;
        let run = |fired: &mut KindCounts| {
            let mut injector = SimInjector {
                schedule,
                faults: Vec::new(),
                fired: KindCounts::default(),
            };
            let run = conductor_simulator::simulate_with_faults(
                profile,
                &self.plan,
                &workload,
                &mut injector,
                deadline_ns,
            );
            *fired = injector.fired;
            run
        };
        let first = run(&mut report.fired);
        let mut again_fired = KindCounts::default();
        let again = run(&mut again_fired);
        let run = match first {
            Ok(run) => run,
            Err(e) => {
                report.unrecovered += 1;
                report
                    .violations
                    .push(format!("the simulation failed: {e}"));
                return report;
            }
        };
        if again.as_ref().ok() != Some(&run) || again_fired != report.fired {
            report
                .violations
                .push("a second simulation of the seed differs from the first".into());
        }
        for a in &run.attempts {
            report.steps += 1;
            if a.end_ns - a.start_ns > deadline_ns {
                report.hangs += 1;
                report.violations.push(format!(
                    "step {} attempt {} took {} ns of virtual time",
                    a.index,
                    a.attempt,
                    a.end_ns - a.start_ns
                ));
            }
            if let Some(why) = &a.failed {
                report.failed += 1;
                if a.decode.is_none() {
                    report.failed_prompt += 1;
                }
                if a.attempt >= FAULTY_ATTEMPTS {
                    report.unrecovered += 1;
                    report.violations.push(format!(
                        "step {} attempt {} had no fault and failed: {why}",
                        a.index, a.attempt
                    ));
                }
            }
        }
        if run.held_slots > 0 {
            report.leaked_slots += u64::from(run.held_slots);
            report
                .violations
                .push(format!("{} cache slots held after the run", run.held_slots));
        }
        report
    }
}

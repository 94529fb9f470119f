//! Faults on virtual time: [`simulate_with_faults`] runs a workload as [`crate::simulate`]
//! does, asking a [`SimFaults`] about every read and every step attempt, and carries a failed
//! step as the real drivers do: the step in flight is abandoned (the scheduler forgets it and
//! what it had pending) and requested again at once; what the failed attempt left in flight
//! is ignored when it arrives.
//!
//! A read's fault: a latency spike adds to its time; a bad read (an error, a short read, a
//! checksum that fails) is read again once, as `BundleFile` does, and a second bad read fails
//! the step when it ends; a stuck read never completes, and the step fails at its deadline.
//! A failing group fails the step when its next compute ends; failing storage fails it when
//! its next read is issued. Nothing here has a clock: the same faults give the same run, bit for bit.

use crate::SimError;

/// What a fault does to one read (one device read: a unit, or a run read as one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimReadFault {
    None,
    /// The read takes this many nanoseconds longer.
    Delay(u64),
    /// The read fails, comes back short or fails its checksum: it is read again once.
    Bad,
    /// The read never completes.
    Stuck,
}

/// What fails before a step attempt starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimActorFaults {
    /// The group computing decode fails in its next compute (a panic, or an actor gone).
    pub group: bool,
    /// Storage fails its next read.
    pub storage: bool,
}

/// The source of faults: asked at each step attempt and each read, in order.
pub trait SimFaults {
    /// Attempt `attempt` (0: the first) of the workload's step `index` starts; `decode` is
    /// its decode index (`None` for a prefill step).
    fn before_step(&mut self, index: usize, decode: Option<u32>, attempt: u32) -> SimActorFaults;
    /// The `read`-th read of the current attempt (a retry is a read of its own).
    fn read(&mut self, read: u32) -> SimReadFault;
}

/// One attempt of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// The workload's step, and which attempt of it.
    pub index: usize,
    pub decode: Option<u32>,
    pub attempt: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Why it failed (`None`: it finished).
    pub failed: Option<String>,
}

/// What a run with faults did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultRun {
    pub attempts: Vec<Attempt>,
    /// Cache slots the scheduler held once the run ended (0 unless a slot leaked).
    pub held_slots: u32,
    pub end_ns: u64,
}

/// Attempts of one step at most before the run gives up ([`SimError::Stalled`]).
pub const MAX_ATTEMPTS: u32 = 16;

/// [`crate::simulate`] with `faults`, each step attempt failing after `deadline_ns` of
/// virtual time at most. Timings only (no spans, no records).
pub fn simulate_with_faults(
    profile: &conductor_runtime::plan::HardwareProfile,
    plan: &conductor_runtime::plan::ExecutionPlan,
    workload: &crate::Workload,
    faults: &mut dyn SimFaults,
    deadline_ns: u64,
) -> Result<FaultRun, SimError> {
    let (scheduler, machine) = crate::build(profile, plan, workload)?;
    let state = FaultState {
        hook: faults,
        deadline_ns,
        attempt: 0,
        serial: 0,
        reads: 0,
        actors: SimActorFaults::default(),
        started_ns: 0,
        attempts: Vec::new(),
    };
    crate::engine::Engine::new(scheduler, machine, workload, &crate::SimOptions::lean())
        .with_faults(state)
        .run_with_faults()
}

/// The engine's state of a run with faults.
pub(crate) struct FaultState<'f> {
    pub hook: &'f mut dyn SimFaults,
    pub deadline_ns: u64,
    /// Attempt of the current step.
    pub attempt: u32,
    /// Attempts started so far (a deadline names the attempt it belongs to).
    pub serial: u64,
    /// Reads of the current attempt so far.
    pub reads: u32,
    pub actors: SimActorFaults,
    pub started_ns: u64,
    pub attempts: Vec<Attempt>,
}

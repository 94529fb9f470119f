//! Fault schedules: the kinds of fault, and the deterministic schedule one seed draws
//! (`SplitMix64` on the seed alone) for the prompt and the decode steps.

use super::{FAULTY_ATTEMPTS, STUCK_MAX};
use std::fmt;

/// The schedule depends on the seed only.
type SplitMix = conductor_runtime::sample::SplitMix64;

/// True with probability `per_mille` in 1/1000ths.
fn chance(rng: &mut SplitMix, per_mille: u64) -> bool {
    rng.below(1000) < per_mille
}

/// What a fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// The read fails (EIO).
    ReadError,
    /// The read returns this share (in 1/1000ths) of its bytes.
    ShortRead(u16),
    /// One bit of what the read returned is flipped (this bit, modulo the bits read).
    BitFlip(u64),
    /// The read takes this many microseconds longer.
    LatencySpike(u32),
    /// The read does not return until cancelled or this many milliseconds past the step
    /// deadline, then fails.
    StuckRead(u32),
    /// The processor group panics in its next compute (actor driver, simulator).
    GroupPanic,
    /// The storage actor panics in its next read (actor driver, simulator).
    StoragePanic,
    /// The processor group's actor is stopped before the step (actor driver, simulator).
    GroupDeath,
    /// The storage actor is stopped before the step (actor driver, simulator).
    StorageDeath,
}

/// Kinds as counted in reports, in this order.
pub const KIND_NAMES: [&str; 9] = [
    "read error",
    "short read",
    "bit flip",
    "latency spike",
    "stuck read",
    "group panic",
    "storage panic",
    "group death",
    "storage death",
];

impl FaultKind {
    /// Index into [`KIND_NAMES`].
    pub fn index(self) -> usize {
        match self {
            FaultKind::ReadError => 0,
            FaultKind::ShortRead(_) => 1,
            FaultKind::BitFlip(_) => 2,
            FaultKind::LatencySpike(_) => 3,
            FaultKind::StuckRead(_) => 4,
            FaultKind::GroupPanic => 5,
            FaultKind::StoragePanic => 6,
            FaultKind::GroupDeath => 7,
            FaultKind::StorageDeath => 8,
        }
    }

    /// Whether it strikes a read (else an actor, before the step).
    pub fn is_read(self) -> bool {
        self.index() <= 4
    }
}

/// One fault of a schedule: at decode step `step` (1-based), attempt `attempt` (0: the
/// first), on the `read`-th read of the store that attempt makes (read faults), or before the
/// attempt starts (actor faults, `read` 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Fault {
    pub step: u32,
    pub attempt: u32,
    pub read: u32,
    pub kind: FaultKind,
}

/// A seed's faults, sorted by (step, attempt, read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub seed: u64,
    pub faults: Vec<Fault>,
}

impl Schedule {
    /// The schedule of `seed` for a run whose prompt makes `reads[0]` reads of the store and
    /// whose decode step `i` (1-based) makes `reads[i]`, when nothing fails (read faults aim
    /// within them).
    ///
    /// Per seed: 0 to 7 fault events on random decode steps; a read event strikes one read
    /// or, one time in three, two reads in a row (a read and its retry: the step then fails);
    /// one event in four repeats on the next attempt. One seed in four also has one or two
    /// events on the prompt (step 0), drawn from a stream of their own, so that the decode
    /// steps' faults are those the seed had before prompts took faults.
    pub fn from_seed(seed: u64, reads: &[u32]) -> Schedule {
        let decode = reads.get(1..).unwrap_or_default();
        let mut rng = SplitMix::new(seed);
        let mut faults = Vec::new();
        for _ in 0..rng.below(8) {
            let step = 1 + rng.below(decode.len().max(1) as u64) as u32;
            let n_reads = decode.get(step as usize - 1).copied().unwrap_or(0);
            push_event(&mut rng, step, n_reads, &mut faults);
        }
        let mut prompt = SplitMix::new(seed ^ PROMPT_STREAM);
        if chance(&mut prompt, 250) {
            for _ in 0..1 + prompt.below(2) {
                let n_reads = reads.first().copied().unwrap_or(0);
                push_event(&mut prompt, 0, n_reads, &mut faults);
            }
        }
        faults.sort();
        faults.dedup_by(|a, b| (a.step, a.attempt, a.read) == (b.step, b.attempt, b.read));
        Schedule { seed, faults }
    }

    /// The faults of attempt `attempt` of step `step` (0: the prompt; then the decode steps).
    pub fn at(&self, step: u32, attempt: u32) -> impl Iterator<Item = &Fault> {
        self.faults
            .iter()
            .filter(move |f| f.step == step && f.attempt == attempt)
    }
}

/// The stream the prompt's faults are drawn from: the seed xor this.
const PROMPT_STREAM: u64 = 0x7072_6f6d_7074_0001;

/// One fault event on `step` (which makes `n_reads` reads when nothing fails): its faults on
/// the first attempt and, one time in four each, on the next ones.
fn push_event(rng: &mut SplitMix, step: u32, n_reads: u32, faults: &mut Vec<Fault>) {
    let n_reads = n_reads.max(1);
    let mut attempt = 0;
    loop {
        let read = rng.below(u64::from(n_reads)) as u32;
        let kind = match rng.below(100) {
            0..=19 => FaultKind::ReadError,
            20..=34 => FaultKind::ShortRead(rng.below(1000) as u16),
            35..=54 => FaultKind::BitFlip(rng.next_u64()),
            55..=74 => FaultKind::LatencySpike(100 + rng.below(20_000) as u32),
            75..=79 => {
                FaultKind::StuckRead(100 + rng.below(STUCK_MAX.as_millis() as u64 - 100) as u32)
            }
            80..=84 => FaultKind::GroupPanic,
            85..=89 => FaultKind::StoragePanic,
            90..=94 => FaultKind::GroupDeath,
            _ => FaultKind::StorageDeath,
        };
        let read = if kind.is_read() { read } else { 0 };
        faults.push(Fault {
            step,
            attempt,
            read,
            kind,
        });
        let double = matches!(
            kind,
            FaultKind::ReadError | FaultKind::ShortRead(_) | FaultKind::BitFlip(_)
        ) && chance(rng, 333);
        if double {
            let kind = match rng.below(3) {
                0 => FaultKind::ReadError,
                1 => FaultKind::ShortRead(rng.below(1000) as u16),
                _ => FaultKind::BitFlip(rng.next_u64()),
            };
            faults.push(Fault {
                step,
                attempt,
                read: read + 1,
                kind,
            });
        }
        attempt += 1;
        if attempt >= FAULTY_ATTEMPTS || !chance(rng, 250) {
            break;
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seed {}: {} faults", self.seed, self.faults.len())?;
        for x in &self.faults {
            write!(
                f,
                "\n  step {} attempt {} read {}: {:?}",
                x.step, x.attempt, x.read, x.kind
            )?;
        }
        Ok(())
    }
}

/// Faults injected, by kind ([`KIND_NAMES`]).
pub type KindCounts = [u64; 9];

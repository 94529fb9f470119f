//! The cache part of an execution plan ([`CachePlan`]): how many slots the neuron cache has,
//! how they are shared, and how its units are read. The cache itself (the `cache` module) carries
//! the plan out.

use super::ReadPolicy;
use serde::{Deserialize, Serialize};

/// Loads the scheduler keeps in flight by default: enough to keep one issuer busy.
pub const DEFAULT_MAX_LOADS: u32 = 4;

/// Gate-first loading's default [`CachePlan::gate_first_gap`]: runs of wanted pages up
/// to this many pages apart are read as one.
pub const DEFAULT_GATE_FIRST_GAP: u32 = 0;

/// Adjacent bundles merged into one read by default: none. Merging (a vectored read into
/// several slots, `CachePlan::coalesce`) measured no faster on the build machine's disk than
/// one read per bundle (SmolLM2 at 50%: 1.7 bundles per read, 103 against 102 ms of I/O per
/// token), while one bigger bundle per read is (`--bundle-neurons 512`): see
/// docs/benchmarks.md.
pub const DEFAULT_COALESCE: u32 = 1;

/// How slots are shared between clusters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CachePolicy {
    /// Hot clusters keep reserved slots; the others share the rest by LRU.
    #[default]
    Segmented,
    /// One LRU over all slots.
    Lru,
}

/// The cache part of an execution plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "CachePlanFile")]
pub struct CachePlan {
    /// Slots in all (each holds one FFN cluster's bundle).
    pub slots: u32,
    /// Slots of the hot segment (ignored by [`CachePolicy::Lru`]).
    pub hot_slots: u32,
    pub policy: CachePolicy,
    /// Loads the scheduler keeps in flight ahead of compute (the pipeline's depth).
    pub max_loads: u32,
    /// The output projection streams through the cache too (its clusters are then sized to a
    /// slot); otherwise it stays resident.
    pub stream_output: bool,
    /// Each layer's attention matrices stream through the cache too (one unit per matrix),
    /// for budgets too small to keep them resident; otherwise they stay resident.
    pub stream_attention: bool,
    /// Units one read carries at most: the scheduler joins a load to the one before it
    /// (adjacent bundles, or any loads with io_uring) in runs of this many. 1: every unit its
    /// own read.
    pub coalesce: u32,
    /// Units the hot segment holds first, hottest first (a planner's ranking from an
    /// activation profile, numbered as `cache::UnitMap::from_plain` reads them); the segment's
    /// remaining slots follow `cache::UnitMap::hot_order`.
    /// Empty: the hot order alone (every cluster equally hot, as in dense decode).
    pub hot_units: Vec<u32>,
    /// How decode steps read bundles. Slots may hold a bundle in part under the page
    /// policies; a later step reads only the pages it lacks.
    pub reads: ReadPolicy,
    /// Page reads: runs of wanted pages this many pages apart or closer are read as one (the
    /// pages between come along): fewer, larger reads where a read's own cost outweighs the
    /// bytes between (storage's latency against its bandwidth).
    pub gate_first_gap: u32,
}

/// [`CachePlan`] as files hold it: plans of format 3 said `gate_first: true` for what is now
/// `reads: "gate-first"`.
#[derive(Deserialize)]
struct CachePlanFile {
    slots: u32,
    hot_slots: u32,
    #[serde(default)]
    policy: CachePolicy,
    max_loads: u32,
    #[serde(default)]
    stream_output: bool,
    #[serde(default)]
    stream_attention: bool,
    #[serde(default = "one")]
    coalesce: u32,
    #[serde(default)]
    hot_units: Vec<u32>,
    #[serde(default)]
    reads: Option<ReadPolicy>,
    #[serde(default)]
    gate_first: bool,
    #[serde(default = "default_gap")]
    gate_first_gap: u32,
}

impl From<CachePlanFile> for CachePlan {
    fn from(f: CachePlanFile) -> CachePlan {
        let legacy = if f.gate_first {
            ReadPolicy::GateFirst
        } else {
            ReadPolicy::Bundles
        };
        CachePlan {
            slots: f.slots,
            hot_slots: f.hot_slots,
            policy: f.policy,
            max_loads: f.max_loads,
            stream_output: f.stream_output,
            stream_attention: f.stream_attention,
            coalesce: f.coalesce,
            hot_units: f.hot_units,
            reads: f.reads.unwrap_or(legacy),
            gate_first_gap: f.gate_first_gap,
        }
    }
}

fn default_gap() -> u32 {
    DEFAULT_GATE_FIRST_GAP
}

fn one() -> u32 {
    1
}

impl Default for CachePlan {
    /// No slots yet (a budget split decides them: `split_sizes`); segmented, the default
    /// pipeline depth and read grouping, the output projection streaming.
    fn default() -> CachePlan {
        CachePlan {
            slots: 0,
            hot_slots: 0,
            policy: CachePolicy::Segmented,
            max_loads: DEFAULT_MAX_LOADS,
            stream_output: true,
            stream_attention: false,
            coalesce: DEFAULT_COALESCE,
            hot_units: Vec::new(),
            reads: ReadPolicy::Bundles,
            gate_first_gap: DEFAULT_GATE_FIRST_GAP,
        }
    }
}

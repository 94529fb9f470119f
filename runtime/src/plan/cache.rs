//! The cache part of an execution plan ([`CachePlan`]): how many slots the neuron cache has,
//! how they are shared, and how its units are read. The cache itself (the `cache` module) carries
//! the plan out.

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
pub struct CachePlan {
    /// Slots in all (each holds one FFN cluster's bundle).
    pub slots: u32,
    /// Slots of the hot segment (ignored by [`CachePolicy::Lru`]).
    pub hot_slots: u32,
    #[serde(default)]
    pub policy: CachePolicy,
    /// Loads the scheduler keeps in flight ahead of compute (the pipeline's depth).
    pub max_loads: u32,
    /// The output projection streams through the cache too (its clusters are then sized to a
    /// slot); otherwise it stays resident.
    #[serde(default)]
    pub stream_output: bool,
    /// Each layer's attention matrices stream through the cache too (one unit per matrix),
    /// for budgets too small to keep them resident; otherwise they stay resident.
    #[serde(default)]
    pub stream_attention: bool,
    /// Adjacent FFN bundles read in one request, at most (the scheduler issues loads in groups
    /// of this many when it can; drivers merge adjacent ones). 1: every bundle its own read.
    #[serde(default = "one")]
    pub coalesce: u32,
    /// Units the hot segment holds first, hottest first (a planner's ranking from an
    /// activation profile, numbered as `cache::UnitMap::from_plain` reads them); the segment's
    /// remaining slots follow `cache::UnitMap::hot_order`.
    /// Empty: the hot order alone (every cluster equally hot, as in dense decode).
    #[serde(default)]
    pub hot_units: Vec<u32>,
    /// Gate-first loading (PowerInfer-2's two-phase load) in decode steps: each FFN bundle's
    /// gate rows are read and computed first, then only the pages holding the up rows and down
    /// columns of neurons the gate let through (threshold sparsity). Slots may then hold a
    /// bundle in part; a later step reads only the pages it lacks.
    #[serde(default)]
    pub gate_first: bool,
    /// Gate-first loading: runs of wanted pages this many pages apart or closer are read as
    /// one (the pages between come along): fewer, larger reads where a read's own cost
    /// outweighs the bytes between (storage's latency against its bandwidth).
    #[serde(default = "default_gap")]
    pub gate_first_gap: u32,
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
            gate_first: false,
            gate_first_gap: DEFAULT_GATE_FIRST_GAP,
        }
    }
}

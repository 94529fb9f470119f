//! The segmented neuron cache: FFN clusters of a neuron store held in a fixed number of slots
//! under the memory budget, read from storage on a miss.
//!
//! - [`CacheDirectory`]: which cluster is in which slot, hot and cold segments, eviction, and
//!   counters; pure state inside the scheduler, so simulations replay it.
//! - [`SlotArena`]: the slots' memory, allocated once; the driver mirrors the directory's
//!   decisions into it.
//! - [`BundleFile`]: reads a cluster's bundle into a slot.
//! - [`split_budget`] / [`split_sizes`]: a memory budget split into the fixed segment and the
//!   cache's slots; [`fit_plan_to_budget`] applies it to a plan.

mod arena;
mod budget;
mod directory;
mod reader;
#[cfg(feature = "io-uring")]
mod uring;

pub use arena::{SlotArena, SlotBuf, SLOT_ALIGN};
pub use budget::{
    fit_plan_to_budget, split_budget, split_sizes, BudgetError, BudgetSplit, MemoryBudget,
    StoreSizes, DEFAULT_COALESCE, DEFAULT_MAX_LOADS, RUNTIME_OVERHEAD,
};
pub use directory::{Acquired, CacheDirectory, CachePlan, CachePolicy, LayerCacheStats};
pub use reader::{
    open_for_reads, read_full, unit_extents, BundleFile, Extent, LoadError, OpenError,
};
#[cfg(feature = "io-uring")]
pub use uring::{Ring, RING_ENTRIES};

#[cfg(test)]
mod tests;

use crate::neuron::Phase;

/// Numbers the units the cache holds: every layer's FFN clusters (layer-major), then the output
/// projection's clusters when it streams. Units are numbered in the order a step needs them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UnitMap {
    pub n_layer: u32,
    /// FFN clusters (bundles) per layer.
    pub ffn_clusters: u32,
    /// Clusters of the output projection's rows; 0 when it stays resident.
    pub output_clusters: u32,
}

impl UnitMap {
    pub fn n_units(&self) -> u32 {
        self.n_layer * self.ffn_clusters + self.output_clusters
    }

    /// Units every step needs (the FFN of every layer).
    pub fn n_ffn_units(&self) -> u32 {
        self.n_layer * self.ffn_clusters
    }

    /// Whether clusters of `phase` come through the cache.
    pub fn streams(&self, phase: Phase) -> bool {
        match phase {
            Phase::FfnNeurons => true,
            Phase::OutputRows => self.output_clusters > 0,
            _ => false,
        }
    }

    /// The unit of cluster `cluster` of `layer` (`n_layer`: the output projection).
    pub fn unit(&self, layer: u32, cluster: u32) -> u32 {
        if layer >= self.n_layer {
            self.n_ffn_units() + cluster
        } else {
            layer * self.ffn_clusters + cluster
        }
    }

    /// Whether unit `b` is the FFN bundle right after unit `a` in the store (bundles of all
    /// layers lie back to back, layer after layer): one read can fetch both.
    pub fn adjacent(&self, a: u32, b: u32) -> bool {
        b == a + 1 && b < self.n_ffn_units()
    }

    /// The (layer, cluster) of a unit (`n_layer` for the output projection).
    pub fn layer_cluster(&self, unit: u32) -> (u32, u32) {
        if unit >= self.n_ffn_units() {
            (self.n_layer, unit - self.n_ffn_units())
        } else {
            (unit / self.ffn_clusters, unit % self.ffn_clusters)
        }
    }

    /// Units in the order hot slots go to them: cluster by cluster, round-robin over the
    /// layers (the output projection counting as one more layer).
    pub fn hot_order(&self) -> Vec<u32> {
        let mut order = Vec::with_capacity(self.n_units() as usize);
        for c in 0..self.ffn_clusters.max(self.output_clusters) {
            for l in 0..=self.n_layer {
                let n = if l == self.n_layer {
                    self.output_clusters
                } else {
                    self.ffn_clusters
                };
                if c < n {
                    order.push(self.unit(l, c));
                }
            }
        }
        order
    }
}

/// What the cache did since the engine started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheReport {
    pub layers: Vec<LayerCacheStats>,
    /// Bytes read per layer (the last entry: the output projection).
    pub layer_bytes: Vec<u64>,
    /// Units read, the read requests that fetched them (adjacent units merge), and their bytes.
    pub loads: u64,
    pub reads: u64,
    pub bytes_read: u64,
    /// Time the storage issuer spent reading (0 where the driver does not time it).
    pub io_ns: u64,
    /// Time groups spent computing decode clusters (0 where the driver does not time it).
    pub decode_compute_ns: u64,
}

impl CacheReport {
    pub fn hits(&self) -> u64 {
        self.layers.iter().map(|l| l.hits).sum()
    }

    pub fn misses(&self) -> u64 {
        self.layers.iter().map(|l| l.misses).sum()
    }

    pub fn evictions(&self) -> u64 {
        self.layers.iter().map(|l| l.evictions).sum()
    }

    /// Hits over hits and misses (0 when nothing was looked up).
    pub fn hit_rate(&self) -> f64 {
        let all = self.hits() + self.misses();
        if all == 0 {
            0.0
        } else {
            self.hits() as f64 / all as f64
        }
    }
}

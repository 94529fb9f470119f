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
mod slot_reads;
mod stable_buf;
#[cfg(feature = "io-uring")]
mod uring;

pub use crate::read_faults::{ReadFault, ReadFaults};
pub use arena::{SlotArena, SlotBuf, SlotWrite, SLOT_ALIGN};
pub use budget::{
    fit_plan_to_budget, fit_plan_to_budget_for, runtime_overhead, split_budget, split_sizes,
    split_sizes_for, BudgetError, BudgetSplit, MemoryBudget, StoreSizes, RUNTIME_BASE,
    RUNTIME_PER_TOKEN, RUNTIME_PER_UNIT,
};
pub use directory::{
    hot_segment, resident_step_units, Acquired, CacheDirectory, LayerCacheStats, PagesAcquired,
    Want,
};
pub use reader::{
    direct_io_refused, open_for_reads, open_for_reads_with, read_full, unit_extents, BundleFile,
    Extent, IssuedCounts, LoadError, OpenError,
};
pub use slot_reads::{read_slots, SlotRead};
pub use stable_buf::StableBuf;
#[cfg(feature = "io-uring")]
pub use uring::{Ring, RING_ENTRIES};

#[cfg(test)]
mod tests;

/// How long an idle thread waits for work before parking under a plan with a cache (decode
/// then waits on storage most of the time): the actor driver's hosts spin this long, its pool
/// helpers a few hundred iterations (about a microsecond). On a virtual machine a spinning vCPU
/// holds time the host's disk emulation needs. The simulator charges a wake-up to a message
/// that finds its host idle longer than this, and to every phase shared by several workers.
pub const IO_BOUND_SPIN_NS: u64 = 5_000;

use crate::neuron::Phase;

/// Numbers the units the cache holds, in the order a step needs them: layer by layer, each
/// layer's streamed attention matrices (when attention streams) then its FFN clusters; then the
/// output projection's clusters when it streams.
///
/// Units are named by `(layer, cluster)`: FFN bundles by their cluster index `0..ffn_clusters`,
/// a layer's attention matrices by `ffn_clusters + i` ([`ATTN_Q`] … [`ATTN_OUT`]: one unit per
/// matrix), the output projection's clusters by layer `n_layer`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UnitMap {
    pub n_layer: u32,
    /// FFN clusters (bundles) per layer.
    pub ffn_clusters: u32,
    /// Clusters of the output projection's rows; 0 when it stays resident.
    pub output_clusters: u32,
    /// Attention units per layer: [`ATTN_UNITS`] when attention streams, else 0.
    #[serde(default)]
    pub attn_units: u32,
}

/// A layer's streamed attention matrices, in the order its phases need them (offsets from
/// `ffn_clusters` in a unit's cluster index): the three of `QkvHeads`, then `AttnOutRows`'s.
pub const ATTN_Q: u32 = 0;
pub const ATTN_K: u32 = 1;
pub const ATTN_V: u32 = 2;
pub const ATTN_OUT: u32 = 3;
pub const ATTN_UNITS: u32 = 4;

impl UnitMap {
    pub fn n_units(&self) -> u32 {
        self.n_layer * self.layer_units() + self.output_clusters
    }

    /// Units of one layer: its attention matrices (if they stream) and FFN clusters.
    pub fn layer_units(&self) -> u32 {
        self.attn_units + self.ffn_clusters
    }

    /// Units every step needs (every layer's, the output projection's excepted).
    pub fn n_layer_units(&self) -> u32 {
        self.n_layer * self.layer_units()
    }

    /// Whether clusters of `phase` come through the cache.
    pub fn streams(&self, phase: Phase) -> bool {
        match phase {
            Phase::FfnNeurons | Phase::FfnGateRows => true,
            Phase::OutputRows => self.output_clusters > 0,
            Phase::QkvHeads | Phase::AttnOutRows => self.attn_units > 0,
            _ => false,
        }
    }

    /// The cluster index naming the unit that cluster `cluster` of a streamed `phase` reads:
    /// the cluster itself for FFN and output clusters, the matrix's unit for attention (whose
    /// streamed phases have one cluster per matrix).
    pub fn unit_cluster(&self, phase: Phase, cluster: u32) -> u32 {
        match phase {
            Phase::QkvHeads => self.ffn_clusters + cluster,
            Phase::AttnOutRows => self.ffn_clusters + ATTN_OUT,
            _ => cluster,
        }
    }

    /// The phase whose cluster reads unit `(layer, cluster)`, and that cluster's index (an FFN
    /// bundle is named by `FfnNeurons`; under gate-first loading `FfnGateRows` reads it first).
    pub fn phase_cluster(&self, layer: u32, cluster: u32) -> (Phase, u32) {
        if layer >= self.n_layer {
            (Phase::OutputRows, cluster)
        } else if cluster < self.ffn_clusters {
            (Phase::FfnNeurons, cluster)
        } else if cluster - self.ffn_clusters == ATTN_OUT {
            (Phase::AttnOutRows, 0)
        } else {
            (Phase::QkvHeads, cluster - self.ffn_clusters)
        }
    }

    /// The unit of cluster `cluster` of `layer` (`n_layer`: the output projection).
    pub fn unit(&self, layer: u32, cluster: u32) -> u32 {
        if layer >= self.n_layer {
            self.n_layer_units() + cluster
        } else if cluster >= self.ffn_clusters {
            layer * self.layer_units() + (cluster - self.ffn_clusters)
        } else {
            layer * self.layer_units() + self.attn_units + cluster
        }
    }

    /// The unit a plan's hot ranking names `plain`: rankings number FFN clusters layer-major
    /// and the output projection's after them, as a map without streamed attention does, so
    /// that they stay valid whether attention streams or not.
    pub fn from_plain(&self, plain: u32) -> Option<u32> {
        let ffn = self.n_layer * self.ffn_clusters;
        if plain < ffn {
            Some(self.unit(plain / self.ffn_clusters, plain % self.ffn_clusters))
        } else {
            let c = plain - ffn;
            (c < self.output_clusters).then(|| self.unit(self.n_layer, c))
        }
    }

    /// Whether unit `b` is the FFN bundle right after unit `a` in the store (bundles of all
    /// layers lie back to back, layer after layer): one read can fetch both.
    pub fn adjacent(&self, a: u32, b: u32) -> bool {
        let is_bundle =
            |u: u32| u < self.n_layer_units() && u % self.layer_units() >= self.attn_units;
        b == a + 1 && is_bundle(a) && is_bundle(b)
    }

    /// The (layer, cluster) of a unit (`n_layer` for the output projection).
    pub fn layer_cluster(&self, unit: u32) -> (u32, u32) {
        if unit >= self.n_layer_units() {
            return (self.n_layer, unit - self.n_layer_units());
        }
        let (layer, local) = (unit / self.layer_units(), unit % self.layer_units());
        if local < self.attn_units {
            (layer, self.ffn_clusters + local)
        } else {
            (layer, local - self.attn_units)
        }
    }

    /// Units every token reads whatever its predictions: streamed attention, then the
    /// streamed output projection.
    pub fn every_token_units(&self) -> impl Iterator<Item = u32> + '_ {
        let attention = (0..self.attn_units)
            .flat_map(move |i| (0..self.n_layer).map(move |l| self.unit(l, self.ffn_clusters + i)));
        let output = (0..self.output_clusters).map(|c| self.unit(self.n_layer, c));
        attention.chain(output)
    }

    /// Units in the order hot slots go to them: streamed attention first (every token reads
    /// all of it), matrix by matrix over the layers; then cluster by cluster, round-robin over
    /// the layers (the output projection counting as one more layer).
    pub fn hot_order(&self) -> Vec<u32> {
        let mut order = Vec::with_capacity(self.n_units() as usize);
        for i in 0..self.attn_units {
            for l in 0..self.n_layer {
                order.push(self.unit(l, self.ffn_clusters + i));
            }
        }
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
    /// The read requests the kernel was handed for them, and the submissions that carried
    /// those (requests per submission: the queue depth offered to the device).
    pub issued: IssuedCounts,
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

//! The segmented neuron cache: FFN clusters of a neuron store held in a fixed number of slots
//! under the memory budget, read from storage on a miss.
//!
//! - [`CacheDirectory`]: which cluster is in which slot, hot and cold segments, eviction, and
//!   counters; pure state inside the scheduler, so simulations replay it.
//! - [`SlotArena`]: the slots' memory, allocated once; the driver mirrors the directory's
//!   decisions into it.
//! - [`BundleFile`]: reads a cluster's bundle into a slot.

mod arena;
mod directory;
mod reader;

pub use arena::{SlotArena, SlotBuf, SLOT_ALIGN};
pub use directory::{Acquired, CacheDirectory, CachePlan, CachePolicy, LayerCacheStats};
pub use reader::{BundleFile, LoadError};

#[cfg(test)]
mod tests;

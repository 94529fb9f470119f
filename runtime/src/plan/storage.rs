//! How the storage actor reads: issuers, queue depth, the I/O engine, and when reads of a
//! neuron store are checked against their checksums.

use serde::{Deserialize, Serialize};

/// How the storage actor reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoragePlan {
    /// Threads issuing reads (1: one issuer, as on a phone's single UFS command queue).
    pub io_threads: u32,
    /// Reads in flight per issuer.
    pub queue_depth: u32,
    /// Bypass the page cache (`O_DIRECT`) where the file system allows it.
    pub direct_io: bool,
    /// How reads reach the kernel.
    #[serde(default)]
    pub engine: IoEngine,
    /// When what is read from a neuron store is checked against its checksums.
    #[serde(default)]
    pub verify: Verify,
}

/// When reads of a neuron store are checked against its checksums (`conductor.bundle_crc`
/// and `conductor.page_crc`, see [`crate::store`]). A read that fails its check is read again
/// once, then fails the step (an error naming the unit, never wrong output).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verify {
    /// Every read: whole bundles against their CRC, parts of bundles, attention matrices,
    /// output and embedding rows page by page. Costs a CRC-32 of every byte read
    /// (docs/reliability.md has the figures).
    #[default]
    Always,
    /// A unit's first whole read only (what earlier versions did for bundles): later reads of
    /// the same unit, and reads of parts of it, are trusted. A disk that changes bytes
    /// after that first read goes unseen.
    First,
}

impl Verify {
    pub fn name(self) -> &'static str {
        match self {
            Verify::Always => "always",
            Verify::First => "first",
        }
    }
}

/// How the storage actor's reads reach the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoEngine {
    /// Positional reads (`pread`/`preadv`), one at a time per issuer: what an Android app
    /// can use.
    #[default]
    Pread,
    /// io_uring (cargo feature `io-uring`): the reads the scheduler groups (up to
    /// `cache.coalesce` of them, adjacent or not) are in flight together.
    Uring,
}

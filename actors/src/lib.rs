//! The parts of Conductor that run on real threads: the kameo actors of the spine.
//!
//! - [`ActorDriver`] — the engine as message flow: a [`SchedulerActor`] following the plan
//!   sends neuron-cluster [`Compute`] messages to processor-group actors ([`CpuGroup`] per core
//!   class, [`Npu`] for the dense backend), which answer with `ClusterDone`; a [`Storage`]
//!   actor owns the model file's reads.
//! - [`Host`] — the pinned threads actors run on (a spin-then-park executor: messages cost
//!   ~0.5 µs instead of tokio's ~25 µs cross-thread wake here).
//! - [`WorkerPool`] — the worker threads of one processor group, which split a phase's
//!   clusters among themselves without messages.
//! - [`detect_topology`] — this machine's cores and core classes.

mod affinity;
mod backend;
mod dense;
mod driver;
mod group;
mod host;
mod messaging;
mod pool;
mod pool_sync;
#[cfg(test)]
mod pool_tests;
pub mod protocol;
mod scaling;
mod scheduler;
mod step;
mod storage;
mod topology;

pub use dense::ChunkedGemm;
pub use driver::{ActorDriver, ActorOptions, SetupError};
pub use group::{Compute, CpuGroup, Npu};
pub use host::{Host, HostConfig};
pub use messaging::measure_messaging;
pub use pool::{PoolConfig, WorkerPool};
pub use scaling::measure_decode_scaling;
pub use scheduler::SchedulerActor;
pub use storage::{Storage, StorageError, StorageFile};
pub use topology::{detect_topology, topology_from_sysfs};

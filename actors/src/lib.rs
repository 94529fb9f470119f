//! The parts of Conductor that run on real threads.
//!
//! Today: [`WorkerPool`], the pinned worker threads of one processor group, which split a
//! phase's clusters among themselves. The kameo actors (scheduler, CPU groups, NPU, storage)
//! that the actor-runtime issue adds are built around it.

mod pool;

pub use pool::{PoolConfig, WorkerPool};

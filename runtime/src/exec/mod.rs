//! Carrying out the scheduler's commands on real data.
//!
//! - [`Executor`] computes one [`crate::schedule::Command`] at a time: the clusters of a phase
//!   (through a [`ClusterRunner`], which may spread them over threads) or a phase's finish.
//! - [`InlineDriver`] runs the scheduler and the executor on the calling thread: the reference
//!   path for numerics, and the baseline the actor driver is measured against.
//! - [`Session`] is one conversation's state: its KV cache and position.

mod executor;
mod inline;
mod session;

pub use executor::{Executor, Probe};
pub use inline::InlineDriver;
pub use session::{Session, StepError};

/// Runs the clusters of one phase, possibly on several threads.
///
/// Each cluster writes only its own output block, handed to it as `&mut`, so clusters can run
/// in any order on any thread without changing a single bit of the result.
pub trait ClusterRunner: Sync {
    /// How many workers may call `f` at once; `f` receives a worker index below this.
    fn workers(&self) -> usize;

    /// Calls `f(worker, i, outs[i])` exactly once for every `i`, and returns when all are done.
    fn run(&self, outs: &mut [&mut [f32]], f: &(dyn Fn(usize, usize, &mut [f32]) + Sync));
}

/// Runs every cluster on the calling thread, in order.
pub struct Serial;

impl ClusterRunner for Serial {
    fn workers(&self) -> usize {
        1
    }

    fn run(&self, outs: &mut [&mut [f32]], f: &(dyn Fn(usize, usize, &mut [f32]) + Sync)) {
        for (i, out) in outs.iter_mut().enumerate() {
            f(0, i, out);
        }
    }
}

//! Conductor's numeric core and pure logic.
//!
//! Nothing in this crate spawns threads, awaits, or reads a clock: the drivers (inline, actors,
//! simulator) own those. See `docs/architecture.md` for the map.

pub mod cache;
pub mod calendar;
pub mod convert;
pub mod dispatch;
pub mod exec;
pub mod gguf;
pub mod model;
pub mod neuron;
pub mod plan;
pub mod quant;
pub mod read_faults;
pub mod resolve;
pub mod sample;
pub mod schedule;
pub mod sparse;
pub mod store;
/// Random-weight models, for tests and benchmarks (the `synthetic` feature).
#[cfg(any(test, feature = "synthetic"))]
pub mod synthetic;
pub mod tokenizer;
pub mod trace;

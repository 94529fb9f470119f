//! Conductor's offline planner: hardware profiler, and a search over execution plans scored
//! by the simulator.
//!
//! - [`hardware`]: the measuring engine behind `conductor profile-hw`.
//! - [`search`]: candidate plans for a model on a hardware profile under the user's limits
//!   (memory, minimum speed), each scored by `conductor-simulator`; what `conductor plan`
//!   runs. Without a plan the engine uses `ExecutionPlan::for_topology`, whose cluster sizes
//!   were chosen by measurement on SmolLM2-135M (see `docs/benchmarks.md`).
//! - [`predictor`]: training of the activation predictors that sparse decode runs (the
//!   profiling half of `conductor profile`; inference stays in the runtime).
//! - [`explore`]: sweeps over budgets, models, profiles and plan features, each point
//!   simulated; what `conductor explore` runs.

pub mod explore;
pub mod hardware;
pub mod predictor;
pub mod search;

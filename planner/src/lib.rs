//! Conductor's offline planner: hardware and model profilers, a cost model, and a search over
//! execution plans scored by the simulator.
//!
//! Built so far: [`hardware`], the measuring engine behind `conductor profile-hw`. The cost
//! model and the plan search are their own issue; until then the runtime uses
//! `ExecutionPlan::default()`, whose cluster sizes were chosen by measurement on SmolLM2-135M
//! (see `docs/benchmarks.md`).

pub mod hardware;

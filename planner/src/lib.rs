//! Conductor's offline planner: hardware and model profilers, a cost model, and a search over
//! execution plans scored by the simulator.
//!
//! Not built yet (its own issue). Today the runtime uses `ExecutionPlan::default()`, whose
//! cluster sizes were chosen by measurement on SmolLM2-135M (see `docs/benchmarks.md`).

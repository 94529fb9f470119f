//! Conductor's discrete-event simulator: the same `Scheduler` driven on virtual nanoseconds,
//! with device models from a hardware profile, for deterministic tests and plan exploration.
//!
//! Not built yet (the actor-runtime issue). The scheduler it will drive is already pure
//! (`conductor_runtime::schedule`): no clocks, no threads, no hash-map order.

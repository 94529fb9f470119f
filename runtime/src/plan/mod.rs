//! The execution plan: the contract between the planner, the scheduler and the drivers.

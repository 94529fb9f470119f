//! What a run's settings (the command line's `--io-threads`, `--gate-first`, …, or an
//! embedding application's builder calls) change in a plan's storage and cache sections: one
//! pure function, used by the engine and by `conductor simulate`, so that a setting means the
//! same thing to both and is tested without files.

use super::{CachePlan, CachePolicy, ExecutionPlan, IoEngine, ReadPolicy, Verify};

/// Settings over a plan: each `Some` replaces what the plan says; `None` keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanOverrides {
    /// Threads issuing reads (`storage.io_threads`).
    pub io_threads: Option<u32>,
    /// How reads reach the kernel (`storage.engine`).
    pub io_engine: Option<IoEngine>,
    /// When reads are checked against the store's checksums (`storage.verify`).
    pub verify: Option<Verify>,
    /// How the neuron cache shares its slots (`cache.policy`; under a budget only).
    pub cache_policy: Option<CachePolicy>,
    /// Loads in flight ahead of compute (`cache.max_loads`; under a budget only).
    pub max_loads: Option<u32>,
    /// Gate-first page reads on or off (`cache.reads`; under a budget only).
    pub gate_first: Option<bool>,
    /// Runs of wanted pages up to this many apart read as one (`cache.gate_first_gap`).
    pub gate_first_gap: Option<u32>,
    /// Loads issued together (`cache.coalesce`, and io_uring's queue depth), applied once the
    /// budget has sized the cache ([`PlanOverrides::apply_io_batch`]).
    pub io_batch: Option<u32>,
}

/// Settings a plan cannot take.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OverrideError {
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    #[error(
        "gate-first loading needs --memory: it reads bundles of a neuron store into the cache"
    )]
    GateFirstWithoutBudget,
}

impl PlanOverrides {
    /// Applies the storage and cache settings to `plan`, which runs under a memory budget when
    /// `budgeted` (only then has it a neuron cache to shape); `predicts`: decode's neurons are
    /// predicted, so gate-first reads are the predicted neurons' pages. On error `plan` is as
    /// it was.
    pub fn apply(
        &self,
        plan: &mut ExecutionPlan,
        budgeted: bool,
        predicts: bool,
    ) -> Result<(), OverrideError> {
        self.check(budgeted)?;
        if let Some(n) = self.io_threads {
            plan.storage.io_threads = n;
        }
        if let Some(engine) = self.io_engine {
            plan.storage.engine = engine;
        }
        if let Some(verify) = self.verify {
            plan.storage.verify = verify;
        }
        if !budgeted {
            return Ok(());
        }
        if let Some(policy) = self.cache_policy {
            cache(plan).policy = policy;
        }
        if let Some(n) = self.max_loads {
            cache(plan).max_loads = n;
        }
        if let Some(on) = self.gate_first {
            cache(plan).reads = if on {
                ReadPolicy::pages_for(predicts)
            } else {
                ReadPolicy::Bundles
            };
        }
        if let Some(gap) = self.gate_first_gap {
            cache(plan).gate_first_gap = gap;
        }
        Ok(())
    }

    /// Loads issued together, once the budget has given `plan` its cache: each read group
    /// carries up to `io_batch` units, and with io_uring as many reads are in flight. Nothing
    /// without a cache.
    pub fn apply_io_batch(&self, plan: &mut ExecutionPlan) {
        if let (Some(n), Some(cache)) = (self.io_batch, plan.cache.as_mut()) {
            cache.coalesce = n;
            if plan.storage.engine == IoEngine::Uring {
                plan.storage.queue_depth = n;
            }
        }
    }

    fn check(&self, budgeted: bool) -> Result<(), OverrideError> {
        for (value, name) in [
            (self.io_threads, "io threads"),
            (self.max_loads, "max loads"),
            (self.io_batch, "io batch"),
        ] {
            if value == Some(0) {
                return Err(OverrideError::Zero(name));
            }
        }
        if budgeted {
            return Ok(());
        }
        if self.gate_first == Some(true) {
            return Err(OverrideError::GateFirstWithoutBudget);
        }
        Ok(())
    }
}

/// The plan's cache section, a default one if it has none yet (the budget sizes it).
fn cache(plan: &mut ExecutionPlan) -> &mut CachePlan {
    plan.cache.get_or_insert_with(CachePlan::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(
        overrides: PlanOverrides,
        budgeted: bool,
        predicts: bool,
    ) -> Result<ExecutionPlan, OverrideError> {
        let mut plan = ExecutionPlan::default();
        overrides.apply(&mut plan, budgeted, predicts)?;
        Ok(plan)
    }

    #[test]
    fn nothing_set_changes_nothing() {
        for budgeted in [false, true] {
            assert_eq!(
                applied(PlanOverrides::default(), budgeted, false).unwrap(),
                ExecutionPlan::default()
            );
        }
    }

    #[test]
    fn storage_settings_apply_with_or_without_a_budget() {
        let overrides = PlanOverrides {
            io_threads: Some(3),
            io_engine: Some(IoEngine::Uring),
            verify: Some(Verify::First),
            ..PlanOverrides::default()
        };
        for budgeted in [false, true] {
            let plan = applied(overrides.clone(), budgeted, false).unwrap();
            assert_eq!(plan.storage.io_threads, 3);
            assert_eq!(plan.storage.engine, IoEngine::Uring);
            assert_eq!(plan.storage.verify, Verify::First);
            assert_eq!(plan.cache, None, "storage settings make no cache section");
        }
    }

    #[test]
    fn cache_settings_shape_the_cache_under_a_budget_only() {
        let overrides = PlanOverrides {
            cache_policy: Some(CachePolicy::Lru),
            max_loads: Some(7),
            gate_first_gap: Some(2),
            ..PlanOverrides::default()
        };
        let cache = applied(overrides.clone(), true, false)
            .unwrap()
            .cache
            .expect("a cache section");
        assert_eq!(cache.policy, CachePolicy::Lru);
        assert_eq!(cache.max_loads, 7);
        assert_eq!(cache.gate_first_gap, 2);
        assert_eq!(cache.reads, CachePlan::default().reads);
        assert_eq!(applied(overrides, false, false).unwrap().cache, None);
    }

    #[test]
    fn gate_first_reads_the_pages_the_selection_decides() {
        let reads = |on, predicts| {
            let overrides = PlanOverrides {
                gate_first: Some(on),
                ..PlanOverrides::default()
            };
            applied(overrides, true, predicts)
                .unwrap()
                .cache
                .unwrap()
                .reads
        };
        assert_eq!(reads(true, false), ReadPolicy::GateFirst);
        assert_eq!(reads(true, true), ReadPolicy::PredictedPages);
        assert_eq!(reads(false, true), ReadPolicy::Bundles);
        // Off without a budget is what a run without one does anyway; on is refused.
        let off = PlanOverrides {
            gate_first: Some(false),
            ..PlanOverrides::default()
        };
        assert!(applied(off, false, false).is_ok());
        let on = PlanOverrides {
            gate_first: Some(true),
            ..PlanOverrides::default()
        };
        assert_eq!(
            applied(on, false, false),
            Err(OverrideError::GateFirstWithoutBudget)
        );
    }

    #[test]
    fn zero_counts_are_refused_and_leave_the_plan_as_it_was() {
        for (overrides, name) in [
            (
                PlanOverrides {
                    io_threads: Some(0),
                    ..PlanOverrides::default()
                },
                "io threads",
            ),
            (
                PlanOverrides {
                    max_loads: Some(0),
                    io_engine: Some(IoEngine::Uring),
                    ..PlanOverrides::default()
                },
                "max loads",
            ),
            (
                PlanOverrides {
                    io_batch: Some(0),
                    ..PlanOverrides::default()
                },
                "io batch",
            ),
        ] {
            let mut plan = ExecutionPlan::default();
            assert_eq!(
                overrides.apply(&mut plan, true, false),
                Err(OverrideError::Zero(name))
            );
            assert_eq!(plan, ExecutionPlan::default());
        }
    }

    #[test]
    fn an_io_batch_groups_reads_once_there_is_a_cache() {
        let overrides = PlanOverrides {
            io_batch: Some(8),
            ..PlanOverrides::default()
        };
        let mut plan = ExecutionPlan::default();
        overrides.apply_io_batch(&mut plan);
        assert_eq!(plan, ExecutionPlan::default(), "no cache, nothing to group");
        plan.cache = Some(CachePlan::default());
        overrides.apply_io_batch(&mut plan);
        assert_eq!(plan.cache.as_ref().unwrap().coalesce, 8);
        assert_eq!(plan.storage.queue_depth, 1, "pread: one read at a time");
        plan.storage.engine = IoEngine::Uring;
        overrides.apply_io_batch(&mut plan);
        assert_eq!(plan.storage.queue_depth, 8, "io_uring: 8 reads in flight");
    }
}

//! The FFN plan: how decode chooses and reads FFN neurons, resolved once into an [`FfnPlan`]
//! — which neurons a step computes ([`FfnSelect`], from the sparsity mode) and how a store's
//! bundles are read for them ([`ReadPolicy`]). The scheduler (what it awaits and loads), the
//! cache's flow and budget, the executor (what a cluster computes) and the simulator (what it
//! charges) ask this module their questions (`gate_first`, `predicted_pages`,
//! `selects_clusters`, `predicts`, `thresholds`, `predicted_rows_only`) instead of comparing
//! variants. A sparsity mode likewise says what it does (`SparsityMode::predicts`,
//! `gate_threshold`), and the selection, the sparse decode's build, its cost and the engine's
//! defaults derive from those answers: a mode that combines them anew is added in
//! `plan/sparsity.rs` and its tests alone. Which neurons pass is computed in
//! `exec/selection.rs` and `exec/sparse_ffn.rs`.

use super::{ExecutionPlan, ModelShape, SparsityMode};
use serde::{Deserialize, Serialize};

/// Which FFN neurons a decode step computes. Prefill is always dense.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FfnSelect {
    /// Every neuron of every cluster.
    #[default]
    Dense,
    /// Every cluster; inside it only the neurons whose gate passes the layer's threshold.
    Threshold,
    /// Only the clusters holding a neuron the layer's predictor names (after its attention).
    Predicted,
    /// Only the clusters of the experts the router chose (a mixture of experts).
    Experts,
}

impl FfnSelect {
    /// The selection of a model of `shape` decoding with `sparsity`, from what the mode says
    /// it does ([`SparsityMode::predicts`], [`SparsityMode::gate_threshold`]): a mixture's
    /// router is its sparsity, so it takes no other.
    pub fn of(shape: &ModelShape, sparsity: SparsityMode) -> Result<FfnSelect, FfnPlanError> {
        if shape.is_moe() {
            return match sparsity.is_sparse() {
                false => Ok(FfnSelect::Experts),
                true => Err(FfnPlanError::SparseExperts(sparsity.name())),
            };
        }
        Ok(if sparsity.predicts() {
            FfnSelect::Predicted
        } else if sparsity.gate_threshold() {
            FfnSelect::Threshold
        } else {
            FfnSelect::Dense
        })
    }

    /// Whether decode steps compute only some clusters, chosen after each layer's attention
    /// (the scheduler awaits the choice; the others are neither read nor summed).
    pub fn selects_clusters(self) -> bool {
        matches!(self, FfnSelect::Predicted | FfnSelect::Experts)
    }

    /// Decode runs each layer's predictor after its attention and computes (and, under a
    /// cache, reads) only the neurons it names.
    pub fn predicts(self) -> bool {
        self == FfnSelect::Predicted
    }

    /// Decode computes, inside each cluster, only the neurons whose gate passes the layer's
    /// threshold.
    pub fn thresholds(self) -> bool {
        self == FfnSelect::Threshold
    }

    pub fn name(self) -> &'static str {
        match self {
            FfnSelect::Dense => "dense",
            FfnSelect::Threshold => "threshold",
            FfnSelect::Predicted => "predicted",
            FfnSelect::Experts => "experts",
        }
    }
}

/// How decode steps read a store's FFN bundles: fixed by the plan, for the whole run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReadPolicy {
    /// Every needed bundle whole, in one read (runs of adjacent bundles merged up to
    /// `coalesce`).
    #[default]
    Bundles,
    /// PowerInfer-2's two-phase load (threshold sparsity): each bundle's gate rows first, then
    /// only the pages holding the up rows and down columns of neurons the gate let through.
    /// A layer's bundles stay pinned from its gate phase to its neurons.
    GateFirst,
    /// With predictors: only the pages holding the predicted neurons' gate rows, up rows and
    /// down columns, read in one phase after the layer's attention (nothing stays pinned).
    PredictedPages,
}

impl ReadPolicy {
    /// Whether slots may hold a bundle in part (page-granular reads).
    pub fn reads_pages(self) -> bool {
        self != ReadPolicy::Bundles
    }

    /// PowerInfer-2's two-phase load: decode reads each layer's gate rows first, then the
    /// pages of the neurons whose gate fires; the layer's bundles stay in their slots from the
    /// gate phase to the neurons (so the cold segment holds a whole layer's).
    pub fn gate_first(self) -> bool {
        self == ReadPolicy::GateFirst
    }

    /// A selected decode step's choice arrives as the pages to read (the predicted neurons'),
    /// not as clusters: a cluster's slot then holds only those pages.
    pub fn predicted_pages(self) -> bool {
        self == ReadPolicy::PredictedPages
    }

    /// The page-granular policy of a run: the predicted neurons' pages with predictors
    /// (`predicts`), gate-first loading otherwise (threshold sparsity).
    pub fn pages_for(predicts: bool) -> ReadPolicy {
        if predicts {
            ReadPolicy::PredictedPages
        } else {
            ReadPolicy::GateFirst
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ReadPolicy::Bundles => "bundles",
            ReadPolicy::GateFirst => "gate-first",
            ReadPolicy::PredictedPages => "predicted-pages",
        }
    }
}

/// How decode computes and reads the FFN, fixed for a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FfnPlan {
    pub select: FfnSelect,
    /// How a store's bundles are read through the neuron cache ([`ReadPolicy::Bundles`]
    /// without one).
    pub reads: ReadPolicy,
}

/// A plan's reads that its FFN selection cannot serve.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FfnPlanError {
    #[error("the plan reads {} pages, which needs {need}", .reads.name())]
    ReadsNeed {
        reads: ReadPolicy,
        need: &'static str,
    },
    #[error("{0} sparsity on a mixture of experts: its router is its sparsity (use dense)")]
    SparseExperts(&'static str),
    #[error("a {select} FFN selection on a model {}", if *.moe { "that is a mixture of experts (it selects its experts)" } else { "without experts" })]
    SelectsOtherShape { select: &'static str, moe: bool },
}

impl FfnPlan {
    /// The FFN plan of a model of `shape` decoding with `sparsity` under `plan` (its cache's
    /// read policy). Refused where the reads need a selection the sparsity does not give
    /// ([`FfnPlan::with_select`]).
    pub fn resolve(
        plan: &ExecutionPlan,
        shape: &ModelShape,
        sparsity: SparsityMode,
    ) -> Result<FfnPlan, FfnPlanError> {
        FfnPlan::with_select(plan, shape, FfnSelect::of(shape, sparsity)?)
    }

    /// The FFN plan that selects with `select` under `plan`'s reads, for a model of `shape`.
    /// Refused where the two disagree: gate-first pages need the gate's threshold, predicted
    /// pages a selection of clusters; a mixture selects its experts and nothing else does.
    pub fn with_select(
        plan: &ExecutionPlan,
        shape: &ModelShape,
        select: FfnSelect,
    ) -> Result<FfnPlan, FfnPlanError> {
        if shape.is_moe() != (select == FfnSelect::Experts) {
            return Err(FfnPlanError::SelectsOtherShape {
                select: select.name(),
                moe: shape.is_moe(),
            });
        }
        let reads = plan.cache.as_ref().map_or(ReadPolicy::Bundles, |c| c.reads);
        let need = match (reads, select) {
            (ReadPolicy::GateFirst, FfnSelect::Predicted) => {
                Some("threshold sparsity (with predictors, read the predicted pages)")
            }
            (ReadPolicy::GateFirst, FfnSelect::Dense | FfnSelect::Experts) => {
                Some("threshold sparsity (or predictor sparsity, which reads the predicted pages): the gate decides which neurons' pages are read")
            }
            (ReadPolicy::PredictedPages, FfnSelect::Dense | FfnSelect::Threshold) => {
                Some("predictor sparsity: the predictions decide which neurons' pages are read")
            }
            _ => None,
        };
        match need {
            Some(need) => Err(FfnPlanError::ReadsNeed { reads, need }),
            None => Ok(FfnPlan { select, reads }),
        }
    }

    /// The FFN plan `plan`'s own reads imply for a model of `shape`: the least selection they
    /// work with (the gate's threshold for gate-first pages, predictions for predicted pages,
    /// a mixture's router), dense otherwise. For running a plan without a model's sparse
    /// decode: a simulation without predictions, a hardware profile's timing runs, tests.
    pub fn implied(plan: &ExecutionPlan, shape: &ModelShape) -> FfnPlan {
        let reads = plan.cache.as_ref().map_or(ReadPolicy::Bundles, |c| c.reads);
        let select = match reads {
            _ if shape.is_moe() => FfnSelect::Experts,
            ReadPolicy::Bundles => FfnSelect::Dense,
            ReadPolicy::GateFirst => FfnSelect::Threshold,
            ReadPolicy::PredictedPages => FfnSelect::Predicted,
        };
        FfnPlan { select, reads }
    }

    /// Decode reads each layer's gate rows first ([`ReadPolicy::gate_first`]).
    pub fn gate_first(self) -> bool {
        self.reads.gate_first()
    }

    /// A selected decode step's choice arrives as pages ([`ReadPolicy::predicted_pages`]).
    pub fn predicted_pages(self) -> bool {
        self.reads.predicted_pages()
    }

    /// Decode steps compute only the clusters chosen after each layer's attention
    /// ([`FfnSelect::selects_clusters`]).
    pub fn selects_clusters(self) -> bool {
        self.select.selects_clusters()
    }

    /// Decode runs the layers' predictors ([`FfnSelect::predicts`]).
    pub fn predicts(self) -> bool {
        self.select.predicts()
    }

    /// Decode gates neurons by the layers' thresholds ([`FfnSelect::thresholds`]).
    pub fn thresholds(self) -> bool {
        self.select.thresholds()
    }

    /// A cluster's slot holds only its predicted neurons' pages, so a decode step with
    /// predictions computes those neurons' up rows one by one.
    pub fn predicted_rows_only(self) -> bool {
        self.predicted_pages() && self.predicts()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::CachePlan;

    fn reading(reads: Option<ReadPolicy>) -> ExecutionPlan {
        ExecutionPlan {
            cache: reads.map(|reads| CachePlan {
                reads,
                ..CachePlan::default()
            }),
            ..ExecutionPlan::default()
        }
    }

    fn shape(n_expert: u32) -> ModelShape {
        ModelShape {
            n_layer: 2,
            n_embd: 64,
            n_ff: 256,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 16,
            n_vocab: 100,
            ffn_granule: 32,
            ffn_bundle: 32,
            ffn_bundle_stride: 8 * 4096,
            ffn_bundle_gate_bytes: 4096,
            n_expert,
            n_expert_used: n_expert.min(2),
        }
    }

    #[test]
    fn every_sparsity_and_read_policy_resolves_or_is_refused_by_name() {
        use FfnSelect::*;
        use ReadPolicy::*;
        use SparsityMode as S;
        let dense = shape(0);
        // (reads, sparsity) → the selection, or None where refused.
        let table = [
            (None, S::Dense, Some(Dense)),
            (None, S::Threshold, Some(Threshold)),
            (None, S::Predictor, Some(Predicted)),
            (Some(Bundles), S::Dense, Some(Dense)),
            (Some(Bundles), S::Threshold, Some(Threshold)),
            (Some(Bundles), S::Predictor, Some(Predicted)),
            (Some(GateFirst), S::Dense, None),
            (Some(GateFirst), S::Threshold, Some(Threshold)),
            (Some(GateFirst), S::Predictor, None),
            (Some(PredictedPages), S::Dense, None),
            (Some(PredictedPages), S::Threshold, None),
            (Some(PredictedPages), S::Predictor, Some(Predicted)),
            (None, S::PredictorOnly, Some(Predicted)),
            (Some(Bundles), S::PredictorOnly, Some(Predicted)),
            (Some(GateFirst), S::PredictorOnly, None),
            (Some(PredictedPages), S::PredictorOnly, Some(Predicted)),
        ];
        // Every mode under every read: a new mode adds its rows.
        for mode in SparsityMode::ALL {
            let rows = table.iter().filter(|(_, m, _)| *m == mode).count();
            assert_eq!(rows, 4, "{mode:?}");
        }
        for (reads, sparsity, want) in table {
            let got = FfnPlan::resolve(&reading(reads), &dense, sparsity);
            let expected_reads = reads.unwrap_or(Bundles);
            match want {
                Some(select) => assert_eq!(
                    got,
                    Ok(FfnPlan {
                        select,
                        reads: expected_reads
                    }),
                    "{reads:?} {sparsity:?}"
                ),
                None => {
                    let err = got.expect_err("refused").to_string();
                    assert!(err.contains(expected_reads.name()), "{err}");
                    assert!(err.contains("sparsity"), "{err}");
                }
            }
        }
    }

    #[test]
    fn a_mixture_selects_its_experts_and_takes_no_other_sparsity() {
        let moe = shape(4);
        for reads in [
            None,
            Some(ReadPolicy::Bundles),
            Some(ReadPolicy::PredictedPages),
        ] {
            let plan = FfnPlan::resolve(&reading(reads), &moe, SparsityMode::Dense).unwrap();
            assert_eq!(plan.select, FfnSelect::Experts);
            assert!(plan.select.selects_clusters());
            assert!(!plan.predicted_rows_only(), "experts read whole rows");
        }
        assert!(FfnPlan::resolve(
            &reading(Some(ReadPolicy::GateFirst)),
            &moe,
            SparsityMode::Dense
        )
        .is_err());
        let err = FfnPlan::resolve(&reading(None), &moe, SparsityMode::Threshold).unwrap_err();
        assert_eq!(err, FfnPlanError::SparseExperts("threshold"));
    }

    #[test]
    fn the_implied_plan_is_the_least_selection_its_reads_resolve_with() {
        for moe in [0, 4] {
            for reads in [
                None,
                Some(ReadPolicy::Bundles),
                Some(ReadPolicy::GateFirst),
                Some(ReadPolicy::PredictedPages),
            ] {
                let plan = reading(reads);
                let implied = FfnPlan::implied(&plan, &shape(moe));
                let again = FfnPlan::with_select(&plan, &shape(moe), implied.select);
                // A mixture cannot read gate-first pages at all; every other implied plan is
                // one `with_select` gives, and one some sparsity mode resolves to.
                if moe > 0 && reads == Some(ReadPolicy::GateFirst) {
                    assert!(again.is_err());
                } else {
                    assert_eq!(again, Ok(implied), "{moe} {reads:?}");
                    assert!(
                        SparsityMode::ALL
                            .iter()
                            .any(|&m| FfnPlan::resolve(&plan, &shape(moe), m) == Ok(implied)),
                        "{moe} {reads:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_selection_for_the_other_kind_of_model_is_refused() {
        let plan = reading(None);
        for select in [FfnSelect::Dense, FfnSelect::Threshold, FfnSelect::Predicted] {
            let e = FfnPlan::with_select(&plan, &shape(4), select).unwrap_err();
            assert!(e.to_string().contains("mixture of experts"), "{e}");
        }
        let e = FfnPlan::with_select(&plan, &shape(0), FfnSelect::Experts).unwrap_err();
        assert!(e.to_string().contains("without experts"), "{e}");
    }

    /// The answers every question of the module gives, for every plan `resolve` accepts: what
    /// the scheduler, the cache, the executor and the simulator act on. A new mode adds its
    /// rows here.
    #[test]
    fn every_resolved_plan_answers_the_questions_its_consumers_ask() {
        use FfnSelect::*;
        use ReadPolicy::*;
        // (select, reads) → (gate_first, predicted_pages, selects_clusters, predicts,
        // thresholds, predicted_rows_only)
        #[rustfmt::skip]
        let table = [
            ((Dense, Bundles), [false, false, false, false, false, false]),
            ((Threshold, Bundles), [false, false, false, false, true, false]),
            ((Threshold, GateFirst), [true, false, false, false, true, false]),
            ((Predicted, Bundles), [false, false, true, true, false, false]),
            ((Predicted, PredictedPages), [false, true, true, true, false, true]),
            ((Experts, Bundles), [false, false, true, false, false, false]),
            ((Experts, PredictedPages), [false, true, true, false, false, false]),
        ];
        let mut seen = std::collections::HashSet::new();
        for moe in [0, 4] {
            for reads in [Bundles, GateFirst, PredictedPages] {
                for sparsity in SparsityMode::ALL {
                    let Ok(plan) = FfnPlan::resolve(&reading(Some(reads)), &shape(moe), sparsity)
                    else {
                        continue;
                    };
                    let (_, want) = table
                        .iter()
                        .find(|(key, _)| *key == (plan.select, plan.reads))
                        .unwrap_or_else(|| panic!("{plan:?} has no row"));
                    let got = [
                        plan.gate_first(),
                        plan.predicted_pages(),
                        plan.selects_clusters(),
                        plan.predicts(),
                        plan.thresholds(),
                        plan.predicted_rows_only(),
                    ];
                    assert_eq!(&got, want, "{plan:?}");
                    seen.insert((plan.select, plan.reads));
                }
            }
        }
        assert_eq!(seen.len(), table.len(), "a row no resolved plan reaches");
    }
}

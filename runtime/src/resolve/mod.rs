//! Settings, model facts and topology in, one [`ResolvedPlan`] out: the execution plan with the
//! command line's overrides, the FFN plan, the memory budget's split, the kernels and how the
//! model is loaded. A pure function ([`resolve`]), tested without files; the engine does the
//! I/O around it (reading the header and the activation profile, then loading the model once,
//! as the plan says).

mod budget;
#[cfg(test)]
mod tests;

pub use budget::{BudgetAsk, FittedBudget, BUDGET_CONTEXT, MIN_SHARED_CONTEXT};

use crate::cache::{BudgetError, StoreSizes};
use crate::model::{DecodeLayout, LoadOptions, Model, WeightSource};
use crate::plan::{
    ExecutionPlan, FfnPlan, FfnPlanError, ModelIdentity, ModelShape, OverrideError, PlanError,
    PlanOverrides, SparsityMode, Topology,
};
use crate::quant::Kernels;
use crate::sparse::SparseFfn;

/// What the user asked for (command line, builder calls, a plan file) and what the sparse decode
/// resolved to.
#[derive(Clone, Debug)]
pub struct RunSettings {
    /// A plan the user gave: checked against the model; `None`: the topology's default.
    pub plan: Option<ExecutionPlan>,
    /// What the command line changes in the plan's storage and cache sections.
    pub overrides: PlanOverrides,
    /// The sparse decode's mode ([`SparsityMode::Dense`] without one).
    pub sparsity: SparsityMode,
    /// Sparse decode for every token of a step, prefill's included: decode steps as long as
    /// prefill's.
    pub all_tokens: bool,
    /// A memory budget and what it must hold; `None`: the model is held in memory.
    pub memory: Option<BudgetAsk>,
    /// The file mapped (else read into memory) when it is held in memory.
    pub mmap: bool,
    /// In memory, each layer's down projection copied as block-columns of decode's clusters.
    pub down_blocks: bool,
    /// In memory, the Q4_K and Q6_K matrices interleaved where `kernels` have an interleaved
    /// kernel.
    pub interleave: bool,
    pub kernels: Kernels,
    /// The output projection over tokens `0..n` only (a draft model's head; in memory),
    /// over the plan's [`ExecutionPlan::output_vocab`].
    pub output_vocab: Option<u32>,
}

/// What the plan needs to know of the model, read from its header.
#[derive(Clone, Debug)]
pub struct ModelFacts {
    pub shape: ModelShape,
    pub identity: ModelIdentity,
    /// A neuron store's sizes; `None` for an ordinary model.
    pub store: Option<StoreSizes>,
}

impl ModelFacts {
    /// The facts of `model` (its header is enough) decoding with `sparse`: a store's resident
    /// weights count the sparse decode's tables (thresholds, predictors), which a budget holds
    /// beside them.
    pub fn of(model: &Model, sparse: Option<&SparseFfn>) -> Result<ModelFacts, BudgetError> {
        let mut store = model
            .store()
            .is_some()
            .then(|| StoreSizes::of_store(model))
            .transpose()?;
        if let (Some(sizes), None) = (store.as_mut(), model.sparse()) {
            // `of_store` counts the model's own sparse decode; a header holds none.
            sizes.resident_weights += sparse.map_or(0, |s| s.bytes() as u64);
        }
        Ok(ModelFacts {
            shape: model.shape(),
            identity: ModelIdentity::of(model),
            store,
        })
    }
}

/// Everything a run's execution follows, decided once.
#[derive(Clone, Debug)]
pub struct ResolvedPlan {
    pub plan: ExecutionPlan,
    /// Which FFN neurons decode computes and how their bundles are read.
    pub ffn: FfnPlan,
    /// The memory budget's split and each session's context, under a budget.
    pub budget: Option<FittedBudget>,
    pub kernels: Kernels,
    /// Where the weights are held and how they are laid out.
    pub source: WeightSource,
    pub layout: DecodeLayout,
    /// What the user should be told of the choices (held shares of the budget, shortened
    /// contexts), one line each.
    pub notes: Vec<String>,
}

impl ResolvedPlan {
    /// How to load the model this plan runs, with its sparse decode (the tokenizer's metadata
    /// is dropped: it was read from the header before).
    pub fn load_options(&self, sparse: Option<SparseFfn>) -> LoadOptions {
        LoadOptions {
            source: self.source,
            sparse,
            layout: self.layout,
            drop_tokenizer_metadata: true,
            read_faults: None,
        }
    }
}

/// Why settings cannot run on a model.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The given plan was made for another model.
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Settings(#[from] OverrideError),
    /// The plan's reads and the sparse decode disagree.
    #[error(transparent)]
    Ffn(#[from] FfnPlanError),
    #[error(transparent)]
    Budget(#[from] BudgetError),
    #[error("the memory budget holds {what} ({held} MiB) besides the model, which then lacks room: give at least {need} MiB for both")]
    BudgetWithReserved { what: String, held: u64, need: u64 },
    #[error("an output vocabulary of {asked} tokens: the model has {n_vocab}, and the head needs at least 1")]
    OutputVocab { asked: u32, n_vocab: u32 },
    #[error("a head over part of the vocabulary is for a draft model held in memory, not under a memory budget")]
    OutputVocabWithBudget,
}

/// The plan `settings` ask for on a model of `facts` over `topology`.
pub fn resolve(
    settings: RunSettings,
    facts: &ModelFacts,
    topology: &Topology,
) -> Result<ResolvedPlan, ResolveError> {
    let mut plan = match settings.plan {
        Some(plan) => {
            // A plan made for another model would mis-size or mis-place everything.
            plan.check_model(&facts.identity)?;
            plan
        }
        None => ExecutionPlan::for_topology(topology),
    };
    let budgeted = settings.memory.is_some();
    let predicts = settings.sparsity.predicts();
    settings.overrides.apply(&mut plan, budgeted, predicts)?;
    plan.output_vocab = settings.output_vocab.or(plan.output_vocab);
    if let Some(asked) = plan.output_vocab {
        let n_vocab = facts.shape.n_vocab;
        if asked == 0 || asked > n_vocab {
            return Err(ResolveError::OutputVocab { asked, n_vocab });
        }
        if budgeted {
            return Err(ResolveError::OutputVocabWithBudget);
        }
    }
    if settings.sparsity.is_sparse() && settings.all_tokens {
        plan.decode_max_tokens = plan.decode_max_tokens.max(plan.prefill_max_tokens);
    }
    // The plan's reads and the sparse decode must agree (the gate decides gate-first pages, the
    // predictions predicted pages): refused before anything is loaded. The drivers resolve the
    // same FFN plan from the same model and plan.
    let ffn = FfnPlan::resolve(&plan, &facts.shape, settings.sparsity)?;
    let mut notes = Vec::new();
    let (budget, source, layout) = match &settings.memory {
        // In memory, decode streams each FFN cluster's down projection as one contiguous
        // block-column, and its Q4_K and Q6_K matvecs read 8 interleaved rows at a time where
        // the kernels have an interleaved kernel (same bits, faster).
        None => {
            let source = match settings.mmap {
                true => WeightSource::Mapped,
                false => WeightSource::Read,
            };
            let layout = DecodeLayout {
                down_blocks: settings
                    .down_blocks
                    .then_some(plan.decode.ffn_neurons as usize),
                interleave: settings.interleave && settings.kernels.has_interleaved_kernels(),
            };
            (None, source, layout)
        }
        Some(ask) => {
            let sizes = facts.store.as_ref().ok_or(BudgetError::NotAStore)?;
            let fitted = budget::fit_sessions(sizes, &mut plan, ask, &mut notes)?;
            settings.overrides.apply_io_batch(&mut plan);
            // Attention is loaded only where the budget keeps it resident.
            let source = WeightSource::Resident {
                stream_output: true,
                stream_attention: fitted.split.plan.stream_attention,
            };
            (Some(fitted), source, DecodeLayout::default())
        }
    };
    Ok(ResolvedPlan {
        plan,
        ffn,
        budget,
        kernels: settings.kernels,
        source,
        layout,
        notes,
    })
}

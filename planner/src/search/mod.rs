//! The plan search: candidate execution plans for a model on a hardware profile under the
//! user's limits, each scored by the simulator, the fastest kept.
//!
//! - [`candidates`]: which plans are tried (processor groups, decode cluster sizes, and under
//!   a memory budget the cache policy, the pipeline's depth, read grouping and I/O threads).
//! - [`search`]: scores them, picks the fastest decode, explains what limited it.
//! - [`activity_from_profile`], [`hot_units_from_profile`]: an activation profile's neuron
//!   frequencies as simulated decode steps and as the hot segment's ranking.
//! - [`smallest_memory`]: for a minimum decode speed, the smallest budget some plan reaches
//!   it with (PowerInfer-2's planner question), by bisection over budgets.
//!
//! Scores are decode tokens per second in steady state: the simulated run generates
//! `warm + measured` tokens and only the last `measured` count, as `conductor bench` warms up
//! before it measures (the hot segment is full by then).

mod activity;
mod candidates;
mod sizes;

pub use activity::{activity_from_profile, hot_units_from_frequencies, hot_units_from_profile};
pub use candidates::{candidates, shares_by_speed, Candidate, Features, ReadPolicy};
pub use sizes::{planned_store_sizes, planned_store_sizes_with, DEFAULT_HEADER_BYTES};

use conductor_runtime::cache::{fit_plan_to_budget, BudgetError, BudgetSplit, StoreSizes};
use conductor_runtime::plan::ModelIdentity;
use conductor_runtime::plan::{
    ExecutionPlan, FfnSelect, HardwareProfile, ModelDescription, PlanPrediction, SparsityPlan,
};
use conductor_runtime::trace::StepActivity;
use conductor_simulator::{simulate, SimError, SimOptions, SimReport, Workload};

/// Predicted speeds closer than this share are treated as equal: the simulator's own
/// resolution (its predictions of this machine move by more than this between profiles, and
/// its model leaves out effects of a few percent; docs/simulator.md).
pub const RESOLUTION: f64 = 0.03;

/// What to plan for.
#[derive(Clone, Debug)]
pub struct PlanRequest {
    pub model: ModelDescription,
    /// The store's sizes, for plans under a memory budget (`None`: the model runs in memory
    /// only; a budget is then an error).
    pub store: Option<StoreSizes>,
    pub profile: HardwareProfile,
    pub limits: Limits,
    /// Context the budget reserves KV cache for.
    pub n_ctx: u32,
    /// Threads of each group (the command line's `-t`); `None`: one per core.
    pub threads: Option<u32>,
    /// Active neurons of decode steps (from an activation profile); `None`: dense.
    pub activity: Option<Vec<StepActivity>>,
    /// Units of the cache ranked hottest first (from an activation profile), written into the
    /// plan's hot segment.
    pub hot_units: Vec<u32>,
    /// Sparse decode the plan carries.
    pub sparsity: Option<SparsityPlan>,
    /// The model the plan is for (written into the plan, checked when it is loaded).
    pub identity: Option<ModelIdentity>,
    /// Generated tokens simulated before and while measuring.
    pub warm_tokens: u32,
    pub measured_tokens: u32,
}

/// The user's limits.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Limits {
    /// Bytes the process may hold; `None`: the whole model in memory.
    pub memory: Option<u64>,
    /// Decode tokens per second the plan must reach.
    pub min_speed: Option<f64>,
}

impl PlanRequest {
    /// A request with the default simulated lengths (8 warm-up tokens, 16 measured).
    pub fn new(model: ModelDescription, profile: HardwareProfile) -> PlanRequest {
        PlanRequest {
            model,
            store: None,
            profile,
            limits: Limits::default(),
            n_ctx: 1024,
            threads: None,
            activity: None,
            hot_units: Vec::new(),
            sparsity: None,
            identity: None,
            warm_tokens: 8,
            measured_tokens: 16,
        }
    }
}

/// One candidate with its predicted figures.
#[derive(Clone, Debug)]
pub struct Scored {
    pub features: Features,
    pub plan: ExecutionPlan,
    /// Steady-state decode tokens per second.
    pub decode_tok_s: f64,
    /// Bytes read from storage per decode token, averaged over the whole simulated run
    /// (warm-up included: the simulator does not count bytes per step).
    pub bytes_per_token: f64,
    /// Share of the run the busiest compute group and the storage device were busy.
    pub compute_busy: f64,
    pub storage_busy: f64,
    /// How the budget was spent for this candidate (its cold segment follows its pipeline
    /// depth); `None` in memory.
    pub split: Option<BudgetSplit>,
}

impl Scored {
    /// `io` when the storage device was busier than any compute group, else `compute`.
    pub fn limited_by(&self) -> &'static str {
        if self.storage_busy > self.compute_busy {
            "io"
        } else {
            "compute"
        }
    }
}

/// The search's answer.
#[derive(Clone, Debug)]
pub struct PlanOutcome {
    /// The chosen plan, with its prediction and explanation filled in.
    pub plan: ExecutionPlan,
    /// The chosen candidate: the earliest within [`RESOLUTION`] of the fastest.
    pub chosen: Scored,
    /// Every candidate scored, fastest first.
    pub scored: Vec<Scored>,
}

/// Why no plan was written.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error("the memory limit cannot be met: {0}")]
    Memory(BudgetError),
    #[error(
        "a memory budget needs a neuron store: give -m STORE.gguf (`conductor convert`) or a model shape"
    )]
    NotAStore,
    #[error("no plan reaches {wanted:.2} tokens/s: the fastest predicted is {best:.2} tokens/s ({limited_by}-limited{at}), {short:.0}% short")]
    TooSlow {
        wanted: f64,
        best: f64,
        limited_by: &'static str,
        at: String,
        short: f64,
    },
    #[error("a limit is not valid: {0}")]
    Limit(String),
    #[error("simulating a candidate: {0}")]
    Sim(#[from] SimError),
}

/// Scores every candidate for `request` at the memory limit it names and returns the
/// earliest candidate within [`RESOLUTION`] of the fastest (so the engine's default wins
/// unless something is clearly faster). `progress` is told
/// `(done, total)` after each candidate.
pub fn search(
    request: &PlanRequest,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<PlanOutcome, SearchError> {
    if let Some(s) = request.limits.min_speed {
        if !(s > 0.0 && s.is_finite()) {
            return Err(SearchError::Limit(format!(
                "a minimum speed must be above 0 tokens/s, not {s}"
            )));
        }
    }
    let budget = request.limits.memory;
    if budget.is_some() && request.store.is_none() {
        return Err(SearchError::NotAStore);
    }
    let threshold = request.sparsity.as_ref().is_some_and(|s| {
        // Gate-first reads serve a selection by the gate's threshold.
        FfnSelect::of(&request.model.shape, s.mode) == Ok(FfnSelect::Threshold)
    });
    let list = candidates(
        &request.model,
        &request.profile,
        budget.is_some(),
        threshold,
    );
    let total = list.len();
    let mut scored = Vec::with_capacity(total);
    for (i, c) in list.into_iter().enumerate() {
        let gate_first = c.features.read != ReadPolicy::Whole;
        match score(request, c, budget) {
            Ok(s) => scored.push(s),
            // Gate-first reads need a layer's bundles in the cold segment at once: a budget
            // too small for that rules out only those candidates.
            Err(SearchError::Memory(_)) if gate_first => {}
            Err(e) => return Err(e),
        }
        progress(i + 1, total);
    }
    // The earliest candidate (the engine's default first, simpler before more elaborate)
    // within the simulator's resolution of the fastest: a predicted gain smaller than that
    // is not worth a departure from the default.
    let fastest = scored.iter().map(|s| s.decode_tok_s).fold(0.0, f64::max);
    // A speed the user asks for is a floor the choice must clear too.
    let wanted = request.limits.min_speed.unwrap_or(0.0);
    let good_enough =
        |s: &Scored| s.decode_tok_s * (1.0 + RESOLUTION) >= fastest && s.decode_tok_s >= wanted;
    let chosen = scored.iter().find(|s| good_enough(s)).cloned();
    // Stable sort: among equal speeds the earlier candidate stays first.
    scored.sort_by(|a, b| b.decode_tok_s.total_cmp(&a.decode_tok_s));
    let Some(chosen) = chosen else {
        return Err(too_slow(wanted, &scored[0], budget));
    };
    let mut plan = chosen.plan.clone();
    plan.predicted = Some(PlanPrediction {
        decode_tok_s: chosen.decode_tok_s,
        prefill_tok_s: None,
        limited_by: chosen.limited_by().into(),
        profile: request.profile.name.clone(),
        reason: explain(&chosen, &scored),
        bytes_per_token: Some(chosen.bytes_per_token),
        compute_busy: Some(chosen.compute_busy),
        storage_busy: Some(chosen.storage_busy),
    });
    Ok(PlanOutcome {
        plan,
        chosen,
        scored,
    })
}

fn too_slow(wanted: f64, best: &Scored, budget: Option<u64>) -> SearchError {
    SearchError::TooSlow {
        wanted,
        best: best.decode_tok_s,
        limited_by: best.limited_by(),
        at: budget.map_or_else(
            || ", the whole model in memory".into(),
            |b| format!(", at {:.1} MiB", mib(b)),
        ),
        short: 100.0 * (1.0 - best.decode_tok_s / wanted),
    }
}

/// For `request.limits.min_speed`, the smallest memory budget (within 1% or 64 KiB) at which
/// some plan reaches it, searched between what the fixed segment needs and what holds the
/// whole FFN; `progress` is told each budget tried. The answer is that budget's search.
pub fn smallest_memory(
    request: &PlanRequest,
    progress: &mut dyn FnMut(u64, Option<f64>),
) -> Result<PlanOutcome, SearchError> {
    if request.limits.min_speed.is_none() {
        return Err(SearchError::Limit("no minimum speed given".into()));
    }
    let sizes = request.store.as_ref().ok_or(SearchError::NotAStore)?;
    let at = |budget: u64| {
        let mut r = request.clone();
        r.limits.memory = Some(budget);
        r
    };
    // The bounds: the least a split accepts, and the budget at which every unit (FFN
    // bundles and the output projection's clusters) has a slot of its own.
    let plan = ExecutionPlan::default();
    let low = match fit_plan_to_budget(sizes, &mut plan.clone(), 0, request.n_ctx) {
        Err(BudgetError::TooSmall { fixed, slots, .. }) => fixed + slots,
        Err(e) => return Err(SearchError::Memory(e)),
        Ok(_) => 0,
    };
    let all = fit_plan_to_budget(sizes, &mut plan.clone(), u64::MAX / 4, request.n_ctx)
        .map_err(SearchError::Memory)?;
    let slot = sizes.bundle_stride + conductor_runtime::cache::SLOT_ALIGN as u64;
    let high = (all.budget - all.cache) + u64::from(all.plan.slots) * slot;
    let mut quiet = |_: usize, _: usize| {};
    let best_at_high = search(&at(high), &mut quiet);
    progress(
        high,
        best_at_high.as_ref().ok().map(|o| o.chosen.decode_tok_s),
    );
    let mut best = best_at_high?;
    let (mut lo, mut hi) = (low, high);
    while hi - lo > (hi / 100).max(64 << 10) {
        let mid = lo + (hi - lo) / 2;
        match search(&at(mid), &mut quiet) {
            Ok(outcome) => {
                progress(mid, Some(outcome.chosen.decode_tok_s));
                best = outcome;
                hi = mid;
            }
            Err(SearchError::TooSlow { best, .. }) => {
                progress(mid, Some(best));
                lo = mid;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(best)
}

/// Simulates one candidate (under `budget`, when given) and scores it.
fn score(
    request: &PlanRequest,
    candidate: Candidate,
    budget: Option<u64>,
) -> Result<Scored, SearchError> {
    let mut plan = candidate.plan;
    plan.model = request.identity.clone();
    plan.sparsity = request.sparsity.clone();
    let split = match (budget, &request.store) {
        (Some(b), Some(sizes)) => {
            if !request.hot_units.is_empty() {
                if let Some(cache) = plan.cache.as_mut() {
                    cache.hot_units = request.hot_units.clone();
                }
            }
            let split = fit_plan_to_budget(sizes, &mut plan, b, request.n_ctx)
                .map_err(SearchError::Memory)?;
            plan.memory = Some(b);
            Some(split)
        }
        _ => None,
    };
    let n_gen = request.warm_tokens + request.measured_tokens.max(1);
    let workload = Workload {
        threads: request.threads,
        activity: request.activity.clone(),
        layer_bundle_bytes: request
            .store
            .as_ref()
            .map_or_else(Vec::new, |s| s.layer_bundle_bytes.clone()),
        ..Workload::new(request.model.clone(), 0, n_gen)
    };
    let report = simulate(&request.profile, &plan, &workload, &SimOptions::lean())?;
    Ok(Scored {
        features: candidate.features,
        decode_tok_s: steady_tok_s(&report, request.measured_tokens.max(1)),
        bytes_per_token: report.bytes_read as f64 / f64::from(n_gen),
        compute_busy: busiest_group(&report, &plan),
        // The storage track sums every issuer's busy time: per issuer, as a share.
        storage_busy: (track_busy(&report, "storage") / f64::from(plan.storage.io_threads.max(1)))
            .min(1.0),
        plan,
        split,
    })
}

/// Tokens per second over the last `measured` decode steps.
fn steady_tok_s(report: &SimReport, measured: u32) -> f64 {
    let steps = &report.steps;
    let tail = &steps[steps.len().saturating_sub(measured as usize)..];
    let ns: u64 = tail.iter().map(|s| s.end_ns - s.start_ns).sum();
    if ns == 0 {
        0.0
    } else {
        tail.len() as f64 * 1e9 / ns as f64
    }
}

fn track_busy(report: &SimReport, track: &str) -> f64 {
    report
        .utilisation
        .iter()
        .find(|u| u.track == track)
        .map_or(0.0, |u| u.fraction())
}

fn busiest_group(report: &SimReport, plan: &ExecutionPlan) -> f64 {
    plan.groups
        .iter()
        .map(|g| track_busy(report, &g.name))
        .fold(0.0, f64::max)
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

/// Why the chosen plan: what limited it, how its budget was spent, the fastest prediction when
/// it was not chosen, and the slowest candidate.
fn explain(chosen: &Scored, scored: &[Scored]) -> String {
    let mut why = format!(
        "{} at {:.2} tokens/s, {}-limited (compute busy {:.0}%, storage busy {:.0}%)",
        chosen.features.describe(),
        chosen.decode_tok_s,
        chosen.limited_by(),
        100.0 * chosen.compute_busy,
        100.0 * chosen.storage_busy
    );
    if let Some(s) = &chosen.split {
        why.push_str(&format!(
            "; the budget of {:.1} MiB leaves {:.1} MiB for the neuron cache ({} slots) after {:.1} MiB fixed, against {:.1} MiB of FFN bundles",
            mib(s.budget),
            mib(s.cache),
            s.plan.slots,
            mib(s.budget - s.cache),
            mib(s.ffn_bytes)
        ));
        if chosen.limited_by() == "io" {
            why.push_str(&format!(
                ", so {:.1} MiB per token are read: memory limits it",
                mib(chosen.bytes_per_token as u64)
            ));
        }
    }
    if let Some(best) = scored
        .first()
        .filter(|b| b.decode_tok_s > chosen.decode_tok_s)
    {
        why.push_str(&format!(
            "; chosen over the fastest prediction, {} at {:.2} tokens/s, which is within the simulator's {:.0}% resolution",
            best.features.describe(),
            best.decode_tok_s,
            100.0 * RESOLUTION
        ));
    }
    if let Some(worst) = scored.last() {
        why.push_str(&format!(
            "; {} candidates scored, the slowest {} at {:.2} tokens/s",
            scored.len(),
            worst.features.describe(),
            worst.decode_tok_s
        ));
    }
    why
}

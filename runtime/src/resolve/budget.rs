//! Fitting a plan to a memory budget for the sessions an engine serves, after what the budget
//! holds for other things: a pure function of a neuron store's sizes and what is asked.

use super::ResolveError;
use crate::cache::{fit_plan_to_budget_for, BudgetError, BudgetSplit, StoreSizes};
use crate::plan::ExecutionPlan;

/// The context a session gets under a memory budget when none is asked for.
pub const BUDGET_CONTEXT: usize = 1024;

/// The shortest context a session is cut to when several share a budget that does not hold
/// them all at the default context.
pub const MIN_SHARED_CONTEXT: usize = 128;

/// What a budget must hold, for how many sessions, and what is taken out of it first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BudgetAsk {
    /// The whole budget, in bytes.
    pub bytes: u64,
    /// Each session's context when asked for: kept, or refused if it does not fit. `None`:
    /// [`BUDGET_CONTEXT`], halved while several sessions do not fit (down to
    /// [`MIN_SHARED_CONTEXT`]).
    pub context: Option<usize>,
    pub sessions: usize,
    /// Held out of the budget for steps returning more than one row of logits: the rows beyond
    /// one, and their bytes.
    pub step_logits: (usize, u64),
    /// Bytes an application reserved out of the budget, and what for.
    pub reserved: Option<(u64, String)>,
}

/// A plan's budget: its split, and the context each session holds.
#[derive(Clone, Debug, PartialEq)]
pub struct FittedBudget {
    pub split: BudgetSplit,
    pub n_ctx: usize,
}

/// `plan` fitted to the budget `ask` describes for a store of `sizes`, with each session's
/// context; what it holds for logits and reservations, and contexts it shortened, are said in
/// `notes`. A budget too small beside a reservation says how much both need. On error `plan`
/// is as it was.
pub(super) fn fit_sessions(
    sizes: &StoreSizes,
    plan: &mut ExecutionPlan,
    ask: &BudgetAsk,
    notes: &mut Vec<String>,
) -> Result<FittedBudget, ResolveError> {
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    let (rows, logit_bytes) = ask.step_logits;
    let mut bytes = ask.bytes;
    if rows > 0 {
        notes.push(format!(
            "memory: {:.1} MiB of the budget held for the logits of {rows} more tokens a step",
            mib(logit_bytes)
        ));
        bytes = bytes.saturating_sub(logit_bytes);
    }
    if let Some((held, what)) = &ask.reserved {
        notes.push(format!(
            "memory: {:.1} MiB of the budget held for {what}",
            mib(*held)
        ));
        bytes = bytes.saturating_sub(*held);
    }
    let sessions = ask.sessions.max(1);
    let fit = |plan: &mut ExecutionPlan, n_ctx: usize| {
        let n_ctx = u32::try_from(n_ctx).unwrap_or(u32::MAX);
        let sessions = u32::try_from(sessions).unwrap_or(u32::MAX);
        fit_plan_to_budget_for(sizes, plan, bytes, n_ctx, sessions)
    };
    let default = ask.context.unwrap_or(BUDGET_CONTEXT);
    let mut n_ctx = default;
    let mut split = fit(plan, n_ctx);
    if ask.context.is_none() && sessions > 1 {
        // N sessions of the default context may not fit: shorter sessions before a refusal.
        while matches!(split, Err(BudgetError::TooSmall { .. })) && n_ctx / 2 >= MIN_SHARED_CONTEXT
        {
            n_ctx /= 2;
            split = fit(plan, n_ctx);
        }
        if n_ctx != default && split.is_ok() {
            notes.push(format!(
                "memory: {sessions} sessions of {default} tokens do not fit the budget beside \
                 the weights; each session gets {n_ctx} tokens of context (-c asks for more, \
                 refused if it does not fit)"
            ));
        }
    }
    match (split, &ask.reserved) {
        (Err(BudgetError::TooSmall { fixed, slots, .. }), Some((held, what))) => {
            let need = logit_bytes + held + fixed + slots;
            Err(ResolveError::BudgetWithReserved {
                what: what.clone(),
                held: held.div_ceil(1 << 20),
                need: need.div_ceil(1 << 20),
            })
        }
        (split, _) => Ok(FittedBudget {
            split: split?,
            n_ctx,
        }),
    }
}

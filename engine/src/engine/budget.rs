//! Fitting a plan to a memory budget for the sessions an engine serves: a pure function of a
//! neuron store's sizes and what the builder asks, tested without files.

use super::{Error, BUDGET_CONTEXT};
use conductor_runtime::cache::{fit_plan_to_budget_for, BudgetError, BudgetSplit, StoreSizes};
use conductor_runtime::plan::ExecutionPlan;

/// The shortest context a session is cut to when several share a budget that does not hold
/// them all at the default context.
pub(super) const MIN_SHARED_CONTEXT: usize = 128;

/// What a budget must hold, for how many sessions, and what was taken out of it before.
pub(super) struct BudgetAsk<'a> {
    /// Bytes for the weights, the sessions' KV caches and the neuron cache: the budget less
    /// what `step_logits` and `reserved` hold.
    pub bytes: u64,
    /// Each session's context when asked for: kept, or refused if it does not fit. `None`:
    /// [`BUDGET_CONTEXT`], halved while several sessions do not fit (down to
    /// [`MIN_SHARED_CONTEXT`]).
    pub context: Option<usize>,
    pub sessions: usize,
    /// Bytes held out of the budget for steps returning more than one row of logits.
    pub step_logits: u64,
    /// Bytes an application reserved out of the budget, and what for.
    pub reserved: Option<(u64, &'a str)>,
}

/// `plan` fitted to the budget `ask` describes for a store of `sizes`, with each session's
/// context. A budget too small beside a reservation says how much both need. On error `plan`
/// is as it was.
pub(super) fn fit_sessions(
    sizes: &StoreSizes,
    plan: &mut ExecutionPlan,
    ask: &BudgetAsk<'_>,
    say: &mut dyn FnMut(&str),
) -> Result<(BudgetSplit, usize), Error> {
    let sessions = ask.sessions.max(1);
    let fit = |plan: &mut ExecutionPlan, n_ctx: usize| {
        let n_ctx = u32::try_from(n_ctx).unwrap_or(u32::MAX);
        let sessions = u32::try_from(sessions).unwrap_or(u32::MAX);
        fit_plan_to_budget_for(sizes, plan, ask.bytes, n_ctx, sessions)
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
            say(&format!(
                "memory: {sessions} sessions of {default} tokens do not fit the budget beside \
                 the weights; each session gets {n_ctx} tokens of context (-c asks for more, \
                 refused if it does not fit)"
            ));
        }
    }
    match (split, ask.reserved) {
        (Err(BudgetError::TooSmall { fixed, slots, .. }), Some((held, what))) => {
            let need = ask.step_logits + held + fixed + slots;
            Err(Error::BudgetWithReserved {
                what: what.to_string(),
                held: held.div_ceil(1 << 20),
                need: need.div_ceil(1 << 20),
            })
        }
        (split, _) => Ok((split?, n_ctx)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A store the size of SmolLM2's (30 layers, 6 bundles of 336 KiB a layer).
    fn sizes() -> StoreSizes {
        StoreSizes {
            resident_weights: 18 * MIB,
            n_layer: 30,
            n_embd: 576,
            n_ff: 1536,
            q_dim: 576,
            kv_dim: 192,
            n_vocab: 49152,
            bundles_per_layer: 6,
            bundle_stride: 336 * 1024,
            output_row_bytes: 360,
            attention_bytes: 12 * MIB,
            attention_unit_bytes: 256 * 1024,
        }
    }

    fn ask(bytes: u64, context: Option<usize>, sessions: usize) -> BudgetAsk<'static> {
        BudgetAsk {
            bytes,
            context,
            sessions,
            step_logits: 0,
            reserved: None,
        }
    }

    /// The smallest budget (to a MiB) that holds `sessions` sessions of `n_ctx` tokens.
    fn least_budget(n_ctx: u32, sessions: u32) -> u64 {
        (1..1024)
            .map(|m| m * MIB)
            .find(|&b| {
                fit_plan_to_budget_for(&sizes(), &mut ExecutionPlan::default(), b, n_ctx, sessions)
                    .is_ok()
            })
            .expect("some budget fits")
    }

    #[test]
    fn one_session_gets_the_default_context_or_the_one_asked_for() {
        let mut said = Vec::new();
        let mut plan = ExecutionPlan::default();
        let budget = least_budget(BUDGET_CONTEXT as u32, 1);
        let (split, n_ctx) = fit_sessions(&sizes(), &mut plan, &ask(budget, None, 1), &mut |s| {
            said.push(s.to_string())
        })
        .unwrap();
        assert_eq!(n_ctx, BUDGET_CONTEXT);
        assert_eq!(plan.cache.as_ref().map(|c| c.slots), Some(split.plan.slots));
        assert!(said.is_empty(), "{said:?}");
        let (_, n_ctx) =
            fit_sessions(&sizes(), &mut plan, &ask(budget, Some(256), 1), &mut |_| {}).unwrap();
        assert_eq!(n_ctx, 256);
    }

    #[test]
    fn several_sessions_get_shorter_contexts_unless_one_was_asked_for() {
        // Four sessions of 256 tokens fit; four of 1024 do not.
        let budget = least_budget(256, 4);
        assert!(budget < least_budget(BUDGET_CONTEXT as u32, 4));
        let mut said = Vec::new();
        let mut plan = ExecutionPlan::default();
        let (_, n_ctx) = fit_sessions(&sizes(), &mut plan, &ask(budget, None, 4), &mut |s| {
            said.push(s.to_string())
        })
        .unwrap();
        assert_eq!(n_ctx, 256);
        assert_eq!(said.len(), 1);
        assert!(said[0].contains("4 sessions of 1024 tokens"), "{said:?}");
        // An explicit context is kept, and refused where it does not fit.
        let mut plan = ExecutionPlan::default();
        let refused = fit_sessions(
            &sizes(),
            &mut plan,
            &ask(budget, Some(1024), 4),
            &mut |_| {},
        );
        assert!(
            matches!(refused, Err(Error::Budget(BudgetError::TooSmall { .. }))),
            "{refused:?}"
        );
        assert_eq!(
            plan,
            ExecutionPlan::default(),
            "a refusal leaves the plan as it was"
        );
        // Never below the shortest shared context.
        let tiny = least_budget(MIN_SHARED_CONTEXT as u32, 4) - MIB;
        let refused = fit_sessions(&sizes(), &mut plan, &ask(tiny, None, 4), &mut |_| {});
        assert!(matches!(refused, Err(Error::Budget(_))), "{refused:?}");
    }

    #[test]
    fn a_budget_too_small_beside_a_reservation_says_what_both_need() {
        let budget = least_budget(BUDGET_CONTEXT as u32, 1);
        let held = 64 * MIB;
        let request = BudgetAsk {
            reserved: Some((held, "the draft model")),
            step_logits: 3 * MIB,
            ..ask(budget - 2 * MIB, None, 1)
        };
        let mut plan = ExecutionPlan::default();
        match fit_sessions(&sizes(), &mut plan, &request, &mut |_| {}) {
            Err(Error::BudgetWithReserved { what, held, need }) => {
                assert_eq!(what, "the draft model");
                assert_eq!(held, 64);
                // What the weights and cache need, the reservation and the held logits.
                assert!(need > 64 + 3 && need <= 64 + 3 + budget / MIB, "{need}");
            }
            other => panic!("{other:?}"),
        }
    }
}

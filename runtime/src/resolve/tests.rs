use super::budget::fit_sessions;
use super::*;
use crate::cache::fit_plan_to_budget_for;
use crate::plan::{FfnSelect, ReadPolicy};

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
        layer_bundle_bytes: Vec::new(),
    }
}

/// SmolLM2's shape, as a store of 6 bundles a layer or as an ordinary model.
fn shape(store: bool) -> ModelShape {
    ModelShape {
        n_layer: 30,
        n_embd: 576,
        n_ff: 1536,
        n_head: 9,
        n_head_kv: 3,
        head_dim: 64,
        n_vocab: 49152,
        ffn_granule: 32,
        ffn_bundle: if store { 256 } else { 0 },
        ffn_bundle_stride: if store { 336 * 1024 } else { 0 },
        ffn_bundle_gate_bytes: if store { 112 * 1024 } else { 0 },
        n_expert: 0,
        n_expert_used: 0,
    }
}

fn identity(n_layer: u32) -> ModelIdentity {
    ModelIdentity {
        arch: "llama".into(),
        n_layer,
        n_embd: 576,
        n_ff: 1536,
        relu: false,
        norms_crc32: 7,
    }
}

fn facts(store: bool) -> ModelFacts {
    ModelFacts {
        shape: shape(store),
        identity: identity(30),
        store: store.then(sizes),
    }
}

fn settings(memory: Option<BudgetAsk>) -> RunSettings {
    RunSettings {
        plan: None,
        overrides: PlanOverrides::default(),
        sparsity: SparsityMode::Dense,
        all_tokens: false,
        memory,
        mmap: true,
        down_blocks: true,
        interleave: true,
        kernels: Kernels::scalar(),
        output_vocab: None,
    }
}

fn ask(bytes: u64, context: Option<usize>, sessions: usize) -> BudgetAsk {
    BudgetAsk {
        bytes,
        context,
        sessions,
        ..BudgetAsk::default()
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
fn in_memory_the_plan_is_the_topologys_with_the_layout_the_kernels_read() {
    let topology = Topology::uniform(2);
    let r = resolve(settings(None), &facts(false), &topology).unwrap();
    assert_eq!(r.plan, ExecutionPlan::for_topology(&topology));
    assert_eq!(r.ffn.select, FfnSelect::Dense);
    assert!(r.budget.is_none() && r.notes.is_empty());
    assert_eq!(r.source, WeightSource::Mapped);
    assert_eq!(
        r.layout,
        DecodeLayout {
            down_blocks: Some(r.plan.decode.ffn_neurons as usize),
            // The scalar kernels have no interleaved kernel: nothing is interleaved.
            interleave: false,
        }
    );
    let read = RunSettings {
        mmap: false,
        down_blocks: false,
        ..settings(None)
    };
    let r = resolve(read, &facts(false), &topology).unwrap();
    assert_eq!(r.source, WeightSource::Read);
    assert_eq!(r.layout, DecodeLayout::default());
}

#[test]
fn a_budget_fits_the_plan_and_streams_what_it_does_not_hold() {
    let budget = least_budget(BUDGET_CONTEXT as u32, 1);
    let r = resolve(
        settings(Some(ask(budget, None, 1))),
        &facts(true),
        &Topology::uniform(2),
    )
    .unwrap();
    let fitted = r.budget.as_ref().expect("a budget");
    assert_eq!(fitted.n_ctx, BUDGET_CONTEXT);
    assert_eq!(
        r.plan.cache.as_ref().map(|c| c.slots),
        Some(fitted.split.plan.slots)
    );
    assert_eq!(
        r.source,
        WeightSource::Resident {
            stream_output: true,
            stream_attention: fitted.split.plan.stream_attention,
        }
    );
    assert_eq!(
        r.layout,
        DecodeLayout::default(),
        "a store is never re-laid"
    );
    // An ordinary model has no store to stream from.
    let refused = resolve(
        settings(Some(ask(budget, None, 1))),
        &facts(false),
        &Topology::uniform(2),
    );
    assert!(
        matches!(refused, Err(ResolveError::Budget(BudgetError::NotAStore))),
        "{refused:?}"
    );
}

#[test]
fn the_ffn_plan_follows_the_sparsity_and_the_overrides() {
    let budget = least_budget(BUDGET_CONTEXT as u32, 1);
    let predicted = RunSettings {
        sparsity: SparsityMode::Predictor,
        all_tokens: true,
        ..settings(Some(ask(budget, None, 1)))
    };
    let topology = Topology::uniform(2);
    let r = resolve(predicted, &facts(true), &topology).unwrap();
    assert_eq!(r.ffn.select, FfnSelect::Predicted);
    // Sparse decode on every token: decode steps as long as the plan's prefill steps (before
    // the budget shortened those).
    let default = ExecutionPlan::for_topology(&topology);
    assert!(default.decode_max_tokens < default.prefill_max_tokens);
    assert_eq!(r.plan.decode_max_tokens, default.prefill_max_tokens);
    // Gate-first pages under threshold sparsity: the gate decides them (a layer's bundles
    // stay pinned from its gate phase on: more slots than the least budget has).
    let gate_first = RunSettings {
        sparsity: SparsityMode::Threshold,
        overrides: PlanOverrides {
            gate_first: Some(true),
            ..PlanOverrides::default()
        },
        ..settings(Some(ask(2 * budget, None, 1)))
    };
    let r = resolve(gate_first, &facts(true), &Topology::uniform(2)).unwrap();
    assert_eq!(r.ffn.reads, ReadPolicy::GateFirst);
    // ... and refused in memory, where nothing is read.
    let in_memory = RunSettings {
        overrides: PlanOverrides {
            gate_first: Some(true),
            ..PlanOverrides::default()
        },
        ..settings(None)
    };
    let refused = resolve(in_memory, &facts(false), &Topology::uniform(2));
    assert!(
        matches!(refused, Err(ResolveError::Settings(_))),
        "{refused:?}"
    );
}

#[test]
fn a_plan_for_another_model_is_refused() {
    let other = ExecutionPlan {
        model: Some(identity(7)),
        ..ExecutionPlan::default()
    };
    let given = RunSettings {
        plan: Some(other),
        ..settings(None)
    };
    let refused = resolve(given, &facts(false), &Topology::uniform(2));
    assert!(matches!(refused, Err(ResolveError::Plan(_))), "{refused:?}");
}

#[test]
fn a_head_over_part_of_the_vocabulary_is_checked_against_the_model() {
    let topology = Topology::uniform(2);
    let n_vocab = shape(false).n_vocab;
    let head = |asked, memory| RunSettings {
        output_vocab: Some(asked),
        ..settings(memory)
    };
    let r = resolve(head(n_vocab / 2, None), &facts(false), &topology).unwrap();
    assert_eq!(r.plan.output_vocab, Some(n_vocab / 2));
    // The command line's over the plan's.
    let planned = RunSettings {
        plan: Some(ExecutionPlan {
            output_vocab: Some(7),
            ..ExecutionPlan::default()
        }),
        ..head(9, None)
    };
    assert_eq!(
        resolve(planned, &facts(false), &topology)
            .unwrap()
            .plan
            .output_vocab,
        Some(9)
    );
    for asked in [0, n_vocab + 1] {
        let refused = resolve(head(asked, None), &facts(false), &topology);
        assert!(
            matches!(refused, Err(ResolveError::OutputVocab { asked: a, n_vocab: v }) if a == asked && v == n_vocab),
            "{refused:?}"
        );
    }
    let budgeted = head(n_vocab / 2, Some(ask(least_budget(256, 1), Some(256), 1)));
    let refused = resolve(budgeted, &facts(true), &topology);
    assert!(
        matches!(refused, Err(ResolveError::OutputVocabWithBudget)),
        "{refused:?}"
    );
}

#[test]
fn one_session_gets_the_default_context_or_the_one_asked_for() {
    let mut notes = Vec::new();
    let mut plan = ExecutionPlan::default();
    let budget = least_budget(BUDGET_CONTEXT as u32, 1);
    let fitted = fit_sessions(&sizes(), &mut plan, &ask(budget, None, 1), &mut notes).unwrap();
    assert_eq!(fitted.n_ctx, BUDGET_CONTEXT);
    assert_eq!(
        plan.cache.as_ref().map(|c| c.slots),
        Some(fitted.split.plan.slots)
    );
    assert!(notes.is_empty(), "{notes:?}");
    let fitted = fit_sessions(&sizes(), &mut plan, &ask(budget, Some(256), 1), &mut notes).unwrap();
    assert_eq!(fitted.n_ctx, 256);
}

#[test]
fn several_sessions_get_shorter_contexts_unless_one_was_asked_for() {
    // Four sessions of 256 tokens fit; four of 1024 do not.
    let budget = least_budget(256, 4);
    assert!(budget < least_budget(BUDGET_CONTEXT as u32, 4));
    let mut notes = Vec::new();
    let mut plan = ExecutionPlan::default();
    let fitted = fit_sessions(&sizes(), &mut plan, &ask(budget, None, 4), &mut notes).unwrap();
    assert_eq!(fitted.n_ctx, 256);
    assert_eq!(notes.len(), 1);
    assert!(notes[0].contains("4 sessions of 1024 tokens"), "{notes:?}");
    // An explicit context is kept, and refused where it does not fit.
    let mut plan = ExecutionPlan::default();
    let refused = fit_sessions(&sizes(), &mut plan, &ask(budget, Some(1024), 4), &mut notes);
    assert!(
        matches!(
            refused,
            Err(ResolveError::Budget(BudgetError::TooSmall { .. }))
        ),
        "{refused:?}"
    );
    assert_eq!(
        plan,
        ExecutionPlan::default(),
        "a refusal leaves the plan as it was"
    );
    // Never below the shortest shared context.
    let tiny = least_budget(MIN_SHARED_CONTEXT as u32, 4) - MIB;
    let refused = fit_sessions(&sizes(), &mut plan, &ask(tiny, None, 4), &mut notes);
    assert!(
        matches!(refused, Err(ResolveError::Budget(_))),
        "{refused:?}"
    );
}

#[test]
fn what_the_budget_holds_first_is_said_and_taken_out() {
    let budget = least_budget(BUDGET_CONTEXT as u32, 1);
    // Held logits the budget still holds beside the rest: said, and fitted.
    let spare = least_budget(BUDGET_CONTEXT as u32, 1) + 4 * MIB;
    let mut notes = Vec::new();
    let holds = BudgetAsk {
        step_logits: (3, 3 * MIB),
        ..ask(spare, None, 1)
    };
    fit_sessions(&sizes(), &mut ExecutionPlan::default(), &holds, &mut notes).unwrap();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("3.0 MiB") && notes[0].contains("3 more tokens"));
    // A reservation the budget cannot hold beside the model says what both need.
    let request = BudgetAsk {
        reserved: Some((64 * MIB, "the draft model".into())),
        step_logits: (3, 3 * MIB),
        ..ask(budget - 2 * MIB, None, 1)
    };
    let mut notes = Vec::new();
    match fit_sessions(
        &sizes(),
        &mut ExecutionPlan::default(),
        &request,
        &mut notes,
    ) {
        Err(ResolveError::BudgetWithReserved { what, held, need }) => {
            assert_eq!(what, "the draft model");
            assert_eq!(held, 64);
            // What the weights and cache need, the reservation and the held logits.
            assert!(need > 64 + 3 && need <= 64 + 3 + budget / MIB, "{need}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes[1].contains("for the draft model"), "{notes:?}");
}

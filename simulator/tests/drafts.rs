//! Speculative decoding in the simulator (`Workload::draft`): the acceptance rate goes in, the
//! tokens a second come out. Under a neuron cache a verifying step reads what a one-token step
//! reads, so kept drafts divide the reads a token costs; in memory a step of several tokens
//! computes more, so drafts that are never kept cannot gain.

mod common;

use common::{cache_plan, pc, run, store_workload, workload};
use conductor_runtime::plan::ExecutionPlan;
use conductor_simulator::{simulate, DraftWorkload, SimOptions, Workload};

fn drafted(w: &Workload, tokens: u32, acceptance: f64) -> Workload {
    Workload {
        draft: Some(DraftWorkload {
            tokens,
            acceptance,
            resident: false,
        }),
        ..w.clone()
    }
}

#[test]
fn kept_drafts_divide_the_reads_a_token_costs_under_a_cache() {
    let w = store_workload("smollm2-135m", 8, 24);
    // 82 of 180 units hot: the other 98 stream on every step.
    let plan = cache_plan(90, 82);
    let plain = run(&pc(), &plan, &w);
    assert_eq!(plain.decode_steps, 24);
    // Every drafted token kept: 4 tokens a step, 6 steps.
    let all_kept = run(&pc(), &plan, &drafted(&w, 3, 1.0));
    assert_eq!(all_kept.decode_steps, 6);
    assert_eq!(all_kept.cache_misses, 82 + 98 * (1 + 6));
    assert_eq!(plain.cache_misses, 82 + 98 * (1 + 24));
    let (a, b) = (plain.gen_tok_s().unwrap(), all_kept.gen_tok_s().unwrap());
    assert!(b > 2.5 * a, "{b} against {a} tok/s");
    // The report's figures are per token: 24 tokens in 6 steps.
    let decode_ns: u64 = all_kept.steps[1..]
        .iter()
        .map(|s| s.end_ns - s.start_ns)
        .sum();
    assert!((all_kept.decode_ns_per_token - decode_ns as f64 / 24.0).abs() < 1e-6);
    // Acceptance 0.5 of 3: 1.875 tokens a step; faster than none, slower than all kept.
    let half = run(&pc(), &plan, &drafted(&w, 3, 0.5));
    assert_eq!(half.decode_steps, 13);
    let c = half.gen_tok_s().unwrap();
    assert!(a < c && c < b, "{a} < {c} < {b}");
}

/// A target drafting for itself (`--draft self`): its drafting steps compute what the cache
/// keeps and read nothing, so the reads are the verifying steps' alone, and their compute
/// costs time: the prediction lies between plain decoding and drafts that cost nothing.
#[test]
fn drafting_from_what_is_resident_reads_nothing_and_costs_its_compute() {
    let w = store_workload("smollm2-135m", 8, 24);
    let plan = cache_plan(90, 82);
    let plain = run(&pc(), &plan, &w);
    let free = run(&pc(), &plan, &drafted(&w, 3, 1.0));
    let mut own = drafted(&w, 3, 1.0);
    own.draft.as_mut().unwrap().resident = true;
    let own = run(&pc(), &plan, &own);
    assert_eq!((own.decode_steps, own.drafting_steps), (6, 18));
    assert_eq!(own.steps.len(), 1 + 6 + 18);
    assert_eq!(own.cache_misses, free.cache_misses);
    assert!(
        own.cache_hits > free.cache_hits,
        "{} {}",
        own.cache_hits,
        free.cache_hits
    );
    let (a, b, c) = (
        plain.gen_tok_s().unwrap(),
        own.gen_tok_s().unwrap(),
        free.gen_tok_s().unwrap(),
    );
    assert!(a < b && b < c, "{a} < {b} < {c} tok/s");
    // The prompt is the prompt's step alone.
    assert_eq!(own.prefill_ns, plain.prefill_ns);
}

#[test]
fn drafts_never_kept_do_not_gain_in_memory() {
    let w = workload("smollm2-135m", 0, 16);
    let plain = run(&pc(), &ExecutionPlan::default(), &w);
    let none_kept = run(&pc(), &ExecutionPlan::default(), &drafted(&w, 4, 0.0));
    assert_eq!(none_kept.decode_steps, 16);
    let (a, b) = (plain.gen_tok_s().unwrap(), none_kept.gen_tok_s().unwrap());
    // A step of five tokens costs at least the one token's: its matrices are priced at the
    // prefill rate, floored at one token's matvec (which reads every weight once).
    assert!(
        b <= a * 1.0001,
        "five tokens a step for one cannot be faster: {b} against {a} tok/s"
    );
}

#[test]
fn a_draft_workload_is_checked() {
    let w = workload("smollm2-135m", 0, 4);
    for (tokens, acceptance, says) in [
        (0, 0.5, "0 tokens"),
        (2, 1.5, "not a probability"),
        (2, f64::NAN, "not a probability"),
    ] {
        let e = simulate(
            &pc(),
            &ExecutionPlan::default(),
            &drafted(&w, tokens, acceptance),
            &SimOptions::lean(),
        )
        .unwrap_err();
        assert!(e.to_string().contains(says), "{e}");
    }
}

#[test]
fn a_verifying_step_is_priced_at_the_profiles_few_token_rate() {
    let w = drafted(&workload("smollm2-135m", 0, 16), 8, 0.5);
    let prefill_rate = run(&pc(), &ExecutionPlan::default(), &w);
    // The profile's rate for a step of 9 tokens: a tenth of prefill's.
    let mut slow = pc();
    for class in &mut slow.core_classes {
        for k in &mut class.kernels {
            k.matmul_few_gmacs = Some(k.matmul_gmacs / 10.0);
        }
    }
    let few_rate = run(&slow, &ExecutionPlan::default(), &w);
    assert_eq!(few_rate.decode_steps, prefill_rate.decode_steps);
    let (a, b) = (
        prefill_rate.gen_tok_s().unwrap(),
        few_rate.gen_tok_s().unwrap(),
    );
    assert!(b < 0.5 * a, "{b} against {a} tok/s");
    // Prefill (more than 9 tokens a step) keeps the prefill rate.
    let pp = workload("smollm2-135m", 64, 0);
    assert_eq!(
        run(&pc(), &ExecutionPlan::default(), &pp).prefill_ns,
        run(&slow, &ExecutionPlan::default(), &pp).prefill_ns
    );
}

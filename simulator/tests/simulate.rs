//! Simulations: determinism, the shape of the trace, and how predictions move with the machine.

mod common;

use common::{cache_plan, pc, phone, phone_plan, run, store_workload, workload};
use conductor_runtime::plan::ExecutionPlan;
use conductor_runtime::schedule::{Command, Event, StepShape};
use conductor_runtime::trace::{write_chrome_trace, ActiveSet, StepActivity, Trace};
use conductor_simulator::{simulate, DecodeStart, SimOptions, Workload};

#[test]
fn the_same_simulation_gives_the_same_trace() {
    for (profile, plan) in [(pc(), ExecutionPlan::default()), (phone(), phone_plan())] {
        let w = workload("smollm2-135m", 100, 8);
        let a = run(&profile, &plan, &w);
        let b = run(&profile, &plan, &w);
        assert_eq!(a.trace.hash(), b.trace.hash());
        assert_eq!(a.trace, b.trace);
        assert_eq!(a.steps, b.steps);
        assert!(!a.trace.records.is_empty() && !a.trace.spans.is_empty());
    }
}

#[test]
fn a_different_machine_gives_a_different_trace() {
    let w = workload("smollm2-135m", 64, 4);
    let plan = ExecutionPlan::default();
    let a = run(&pc(), &plan, &w);
    let mut slower = pc();
    slower.core_classes[0].kernels[1].matvec_stream_gmacs /= 2.0; // Q4_1
    let b = run(&slower, &plan, &w);
    assert_ne!(a.trace.hash(), b.trace.hash());
    assert!(b.decode_ns_per_token > a.decode_ns_per_token);
    assert_eq!(a.prefill_ns, b.prefill_ns, "prefill uses matmul rates only");
}

#[test]
fn the_trace_holds_every_event_and_its_commands() {
    let w = workload("smollm2-135m", 20, 3);
    let r = run(&pc(), &ExecutionPlan::default(), &w);
    let t = &r.trace;
    assert_eq!(t.header.driver, "simulator");
    assert_eq!(t.header.threads, 8);
    assert_eq!(r.events, t.records.len() as u64);
    assert!(t.records.windows(2).all(|w| w[0].t_ns <= w[1].t_ns));
    let requests = t
        .records
        .iter()
        .filter(|r| matches!(r.event, Event::StepRequested(_)))
        .count();
    assert_eq!(requests, 4);
    let commands = t.records.iter().flat_map(|r| &r.commands);
    let (mut computes, mut finishes, mut done) = (0, 0, 0);
    for c in commands {
        match c {
            Command::Compute { .. } => computes += 1,
            Command::FinishPhase { .. } => finishes += 1,
            Command::StepDone { .. } => done += 1,
            Command::Load { .. } => panic!("a plan without a cache loads nothing"),
        }
    }
    assert_eq!(done, 4);
    // One group computes every phase: one Compute, one ClusterDone, one FinishPhase each.
    assert_eq!(computes, finishes);
    assert_eq!(r.events as usize, computes + requests);
    // Spans: every Compute, every FinishPhase, and the start of every step.
    assert_eq!(t.spans.len(), computes + finishes + requests);
    assert!(t
        .spans
        .iter()
        .any(|s| s.track == "cpu" && s.name == "L3 ffn"));
    assert!(t
        .spans
        .iter()
        .any(|s| s.track == "npu" && s.name == "L29 ffn_down"));
    assert!(t
        .spans
        .iter()
        .any(|s| s.track == "cpu" && s.name == "output"));
    assert!(t
        .spans
        .iter()
        .any(|s| s.track == "scheduler" && s.name == "finish L0 qkv"));
    // Spans on one host never overlap (the cpu and npu groups share the host).
    let mut host: Vec<_> = t.spans.iter().collect();
    host.sort_by_key(|s| s.start_ns);
    for w in host.windows(2) {
        assert!(w[0].start_ns + w[0].dur_ns <= w[1].start_ns, "{w:?}");
    }
    // Steps: one prefill, then decode from an empty context, back to back.
    assert_eq!(r.steps.len(), 4);
    assert_eq!(r.steps[0].shape, StepShape::Prefill);
    assert_eq!(r.steps[1].n_past, 0);
    assert_eq!(r.steps[3].n_past, 2);
    for w in r.steps.windows(2) {
        assert_eq!(w[0].end_ns, w[1].start_ns);
    }
    assert_eq!(r.ttft_ns, r.prefill_ns);
    assert_eq!(r.prefill_ns, r.steps[0].end_ns - r.steps[0].start_ns);
    assert_eq!(r.time_between_tokens.count, 3);
    assert!(r.decode_ns_per_token > 0.0);
    assert_eq!((r.bytes_read, r.cache_hits, r.cache_misses), (0, 0, 0));
    // One host does everything (cpu: decode, npu: prefill, the scheduler between phases): it
    // is busy but for the local messages.
    let busy = |track: &str| r.utilisation.iter().find(|u| u.track == track).unwrap();
    let host = busy("cpu").fraction() + busy("npu").fraction() + busy("scheduler").fraction();
    assert!(host > 0.95 && host <= 1.0, "{:?}", r.utilisation);
    assert!(busy("scheduler").fraction() > 0.0);
    assert_eq!(r.end_ns, r.steps[3].end_ns);

    let mut json = Vec::new();
    write_chrome_trace(&t.spans, "simulator", &mut json).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert!(v["traceEvents"].as_array().unwrap().len() > t.spans.len());
}

#[test]
fn lean_runs_record_nothing_but_time_the_same() {
    let w = workload("smollm2-135m", 30, 5);
    let full = run(&pc(), &ExecutionPlan::default(), &w);
    let lean = simulate(&pc(), &ExecutionPlan::default(), &w, &SimOptions::lean()).unwrap();
    assert!(lean.trace.records.is_empty() && lean.trace.spans.is_empty());
    assert_eq!(lean.steps, full.steps);
    assert_eq!(lean.events, full.events);
    let spans_only = SimOptions {
        record_spans: true,
        record_records: false,
    };
    let s = simulate(&pc(), &ExecutionPlan::default(), &w, &spans_only).unwrap();
    assert_eq!(s.trace.spans, full.trace.spans);
    assert!(s.trace.records.is_empty());
}

#[test]
fn long_prompts_are_split_like_the_real_drivers() {
    let w = workload("smollm2-135m", 1100, 0);
    let r = run(&pc(), &ExecutionPlan::default(), &w);
    let tokens: Vec<(u32, u32)> = r.steps.iter().map(|s| (s.n_tokens, s.n_past)).collect();
    assert_eq!(tokens, vec![(512, 0), (512, 512), (76, 1024)]);
    // Only the last step computes logits.
    let outputs = r.trace.spans.iter().filter(|s| s.name == "output").count();
    assert_eq!(outputs, 1);
    assert_eq!(r.ttft_ns, r.end_ns);
    assert_eq!(r.time_between_tokens.count, 0);
    assert_eq!(r.decode_ns_per_token, 0.0);
}

#[test]
fn more_threads_are_not_slower_for_decode() {
    for shape in ["llama-2-7b", "smollm2-135m"] {
        let mut last = f64::INFINITY;
        for t in 1..=8 {
            let mut w = workload(shape, 0, 4);
            w.threads = Some(t);
            let r = run(&pc(), &ExecutionPlan::default(), &w);
            assert_eq!(r.threads, t);
            assert!(
                r.decode_ns_per_token <= last,
                "{shape}: {t} threads {} ns/token, fewer threads {last}",
                r.decode_ns_per_token
            );
            last = r.decode_ns_per_token;
        }
    }
}

#[test]
fn more_threads_make_decode_faster_until_memory_binds() {
    let time = |t| {
        let mut w = workload("llama-2-7b", 0, 2);
        w.threads = Some(t);
        run(&pc(), &ExecutionPlan::default(), &w).decode_ns_per_token
    };
    let (one, two, eight) = (time(1), time(2), time(8));
    assert!(two < 0.7 * one, "1 thread {one}, 2 threads {two}");
    // 3.6 GB per token at 60 GB/s: never better than 60 ms.
    assert!(eight >= 3.6e9 / 60.0 * 0.95, "{eight}");
}

#[test]
fn faster_memory_is_not_slower() {
    let w = workload("llama-2-7b", 64, 4);
    let mut last_decode = f64::INFINITY;
    let mut last_prefill = u64::MAX;
    for scale in [0.25, 0.5, 1.0, 2.0, 4.0] {
        let mut p = pc();
        p.memory.bandwidth_gbs *= scale;
        p.memory.per_core_gbs *= scale;
        let r = run(&p, &ExecutionPlan::default(), &w);
        assert!(r.decode_ns_per_token <= last_decode, "x{scale}");
        assert!(r.prefill_ns <= last_prefill, "x{scale}");
        last_decode = r.decode_ns_per_token;
        last_prefill = r.prefill_ns;
    }
    // A cache large enough to hold the model switches to cached matvec rates.
    let mut p = pc();
    p.memory.llc_bytes = 1 << 40;
    assert!(run(&p, &ExecutionPlan::default(), &w).decode_ns_per_token < last_decode);
}

#[test]
fn sparse_activity_makes_decode_cheaper() {
    let mut w = workload("smollm2-135m", 0, 6);
    let dense = run(&pc(), &ExecutionPlan::default(), &w);
    let sparse_layer = ActiveSet::Neurons((0..1536).step_by(10).collect());
    w.activity = Some(vec![
        StepActivity {
            step: 0,
            layers: vec![sparse_layer; 30],
        },
        StepActivity {
            step: 1,
            layers: vec![ActiveSet::All; 30],
        },
    ]);
    let sparse = run(&pc(), &ExecutionPlan::default(), &w);
    // Decode steps alternate sparse, dense: even steps are faster than dense decode.
    for (s, d) in sparse.steps.iter().zip(&dense.steps) {
        if s.step % 2 == 0 {
            assert!(s.end_ns - s.start_ns < d.end_ns - d.start_ns);
        } else {
            assert_eq!(s.end_ns - s.start_ns, d.end_ns - d.start_ns);
        }
    }
    assert_eq!(sparse.trace.activity.len(), 2);
    // Activity is data-dependent input, not a change of scheduling: same commands.
    let cmds = |r: &conductor_simulator::SimReport| {
        r.trace
            .records
            .iter()
            .map(|x| x.commands.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(cmds(&sparse), cmds(&dense));
}

#[test]
fn decode_after_the_prompt_attends_to_more_positions() {
    let fresh = workload("llama-2-7b", 512, 4);
    let after = Workload {
        decode_start: DecodeStart::AfterPrompt,
        ..fresh.clone()
    };
    let a = run(&pc(), &ExecutionPlan::default(), &fresh);
    let b = run(&pc(), &ExecutionPlan::default(), &after);
    assert_eq!(a.prefill_ns, b.prefill_ns);
    assert!(b.decode_ns_per_token > a.decode_ns_per_token);
    assert_eq!(b.steps[1].n_past, 512);
}

#[test]
fn the_phone_plan_uses_every_group_and_pays_for_remote_messages() {
    let w = workload("llama-2-7b", 256, 4);
    let r = run(&phone(), &phone_plan(), &w);
    for track in ["big", "mid", "npu", "scheduler"] {
        let u = r.utilisation.iter().find(|u| u.track == track).unwrap();
        assert!(u.busy_ns > 0, "{track} idle");
    }
    // 256 tokens = two NPU launches per phase (chunks of 128).
    assert_eq!(r.steps[0].shape, StepShape::Prefill);
    let mut slow = phone();
    slow.messaging.remote_message_ns *= 10.0;
    slow.messaging.wakeup_ns *= 10.0;
    let s = run(&slow, &phone_plan(), &w);
    assert!(s.decode_ns_per_token > r.decode_ns_per_token);
    assert!(s.prefill_ns > r.prefill_ns);
    // Without an NPU in the profile the dense backend runs on the group's (little) cores.
    let mut no_npu = phone();
    no_npu.npu = None;
    let c = run(&no_npu, &phone_plan(), &w);
    assert!(
        c.prefill_ns > 3 * r.prefill_ns,
        "{} vs {}",
        c.prefill_ns,
        r.prefill_ns
    );
    assert_eq!(c.decode_ns_per_token, r.decode_ns_per_token);
}

#[test]
fn bench_lines_match_conductor_bench() {
    let w = workload("smollm2-135m", 512, 128);
    let r = simulate(&pc(), &ExecutionPlan::default(), &w, &SimOptions::lean()).unwrap();
    let lines = r.bench_json_lines();
    assert_eq!(lines.len(), 2);
    let pp: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    let tg: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
    assert_eq!(pp["test"], "pp512");
    assert_eq!(tg["test"], "tg128");
    assert_eq!(
        (pp["n_prompt"].as_u64(), pp["n_gen"].as_u64()),
        (Some(512), Some(0))
    );
    assert_eq!(
        (tg["n_prompt"].as_u64(), tg["n_gen"].as_u64()),
        (Some(0), Some(128))
    );
    for v in [&pp, &tg] {
        assert_eq!(v["threads"], 8);
        assert_eq!(v["simulated"], true);
        assert_eq!(v["profile"], "test-pc");
        assert_eq!(v["model"], "smollm2-135m");
        assert!(v["peak_rss_bytes"].is_null());
        let t = &v["tok_s"];
        assert_eq!(t["median"], t["min"]);
        assert_eq!(t["median"], t["max"]);
        assert_eq!(t["samples"].as_array().unwrap().len(), 1);
        // The keys conductor bench prints, and ours.
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        for k in [
            "test",
            "threads",
            "n_prompt",
            "n_gen",
            "tok_s",
            "peak_rss_bytes",
            "model",
            "model_path",
            "model_bytes",
            "params",
            "isa",
        ] {
            assert!(keys.contains(&k), "{k}");
        }
    }
    let pp_tok_s = pp["tok_s"]["median"].as_f64().unwrap();
    assert!((pp_tok_s - 512.0 * 1e9 / r.prefill_ns as f64).abs() < 1e-6);
    let tg_tok_s = tg["tok_s"]["median"].as_f64().unwrap();
    assert!((tg_tok_s - 1e9 / r.decode_ns_per_token).abs() / tg_tok_s < 1e-9);
    let only_gen = simulate(
        &pc(),
        &ExecutionPlan::default(),
        &workload("smollm2-135m", 0, 16),
        &SimOptions::lean(),
    )
    .unwrap();
    assert_eq!(only_gen.bench_json_lines().len(), 1);
    assert_eq!(only_gen.ttft_ns, only_gen.steps[0].end_ns);
}

#[test]
fn traces_survive_a_round_trip_through_a_file() {
    let r = run(&phone(), &phone_plan(), &workload("smollm2-135m", 40, 3));
    let mut bytes = Vec::new();
    r.trace.write_to(&mut bytes).unwrap();
    let back = Trace::from_bytes(&bytes, "mem").unwrap();
    assert_eq!(back.hash(), r.trace.hash());
    assert!(conductor_simulator::replay(&back).unwrap().is_identical());
}

#[test]
fn a_group_listed_twice_is_refused_naming_the_field() {
    let mut plan = ExecutionPlan::default();
    plan.decode_on.push(plan.decode_on[0].clone());
    let w = workload("llama-2-7b", 0, 2);
    let err = conductor_simulator::simulate(&pc(), &plan, &w, &SimOptions::lean()).unwrap_err();
    assert!(err.to_string().contains("decode_on[1].group"), "{err}");
}

/// A store whose layers' bundles differ in length (a Q4_K_M mix) reads each bundle's own
/// length: with every unit read once (the cache holds them all), the bytes are the layers'
/// lengths summed, not the stride times the units.
#[test]
fn bundles_shorter_than_the_stride_read_their_own_length() {
    let w = store_workload("smollm2-135m", 8, 6);
    let all = cache_plan(180, 180);
    let stride = w.model.shape.ffn_bundle_stride;
    let n_layer = w.model.shape.n_layer as usize;
    let uniform = run(&pc(), &all, &w);
    assert_eq!(uniform.bytes_read, 180 * stride);
    // Odd layers' bundles a quarter shorter (whole pages); 6 bundles a layer.
    let short = (stride * 3 / 4).div_ceil(4096) * 4096;
    let mixed_w = Workload {
        layer_bundle_bytes: (0..n_layer)
            .map(|l| if l % 2 == 1 { short } else { stride })
            .collect(),
        ..w.clone()
    };
    let mixed = run(&pc(), &all, &mixed_w);
    let odd = n_layer as u64 / 2;
    assert_eq!(
        mixed.bytes_read,
        6 * (odd * short + (n_layer as u64 - odd) * stride)
    );
    assert_eq!(mixed.cache_misses, uniform.cache_misses);
}

#[test]
fn a_neuron_store_under_a_cache_reads_what_it_misses_and_waits_for_it() {
    let w = store_workload("smollm2-135m", 8, 6);
    let in_memory = run(&pc(), &ExecutionPlan::default(), &w);
    assert_eq!(in_memory.bytes_read, 0);
    let all = run(&pc(), &cache_plan(180, 180), &w);
    let half = run(&pc(), &cache_plan(90, 82), &w);
    // Everything fits: each unit is read once (the first step), then hits.
    assert_eq!(all.cache_misses, 180);
    assert_eq!(all.cache_hits, 180 * 6);
    // Half: 82 hot units hit after the first step, the other 98 stream on every step.
    assert_eq!(half.cache_hits, 82 * 6);
    assert_eq!(half.cache_misses, 82 + 98 * 7);
    assert!(half.bytes_read > all.bytes_read);
    assert!(half.decode_ns_per_token > all.decode_ns_per_token);
    assert!(half.decode_ns_per_token > in_memory.decode_ns_per_token);
    // Every load is a Loaded event back: the trace replays the cache too.
    let loads = half
        .trace
        .records
        .iter()
        .flat_map(|r| &r.commands)
        .filter(|c| matches!(c, Command::Load { .. }))
        .count() as u64;
    assert_eq!(loads, half.cache_misses);
}

#[test]
fn gate_first_loading_reads_only_the_pages_the_activity_needs() {
    use conductor_runtime::plan::{CachePlan, CachePolicy};
    use conductor_runtime::store::{BundleLayout, DownLayout};
    let mut w = workload("llama-2-7b", 0, 4);
    let s = w.model.shape.clone();
    let t = &w.model.types;
    let layout = BundleLayout::new(
        s.n_embd,
        s.n_ff,
        [
            t.ffn_gate,
            t.ffn_up,
            conductor_runtime::quant::GgmlType::Q8_0,
        ],
        DownLayout::NeuronColumns,
        256,
    )
    .unwrap();
    w.model.shape.ffn_bundle = 256;
    w.model.shape.ffn_bundle_stride = layout.stride;
    w.model.shape.ffn_bundle_gate_bytes = layout.gate_bytes(256) as u64;
    // Every 16th neuron fires: each bundle has active neurons, most pages of it none.
    let active: Vec<u32> = (0..s.n_ff).step_by(16).collect();
    w.activity = Some(vec![StepActivity {
        step: 0,
        layers: vec![ActiveSet::Neurons(active); s.n_layer as usize],
    }]);
    let bundles = s.n_ff.div_ceil(256);
    let report = |gate_first: bool| {
        let cache = Some(CachePlan {
            slots: bundles + 8,
            hot_slots: 0,
            policy: CachePolicy::Lru,
            max_loads: 4,
            stream_output: false,
            stream_attention: false,
            coalesce: 1,
            hot_units: Vec::new(),
            reads: if gate_first {
                conductor_runtime::plan::ReadPolicy::GateFirst
            } else {
                conductor_runtime::plan::ReadPolicy::Bundles
            },
            gate_first_gap: 0,
        });
        let plan = ExecutionPlan {
            cache,
            ..ExecutionPlan::default()
        };
        run(&pc(), &plan, &w)
    };
    let whole = report(false);
    let gated = report(true);
    // Gate rows are about a quarter of a bundle; the active sixteenth's up rows and down
    // columns take a page or two each of the rest.
    assert!(
        gated.bytes_read * 2 < whole.bytes_read,
        "{} vs {}",
        gated.bytes_read,
        whole.bytes_read
    );
    assert!(gated.bytes_read * 4 > whole.bytes_read);
    assert_eq!(gated.cache_misses, whole.cache_misses);
    // The gate phase is in the trace; the trace replays.
    let gate_phases = gated
        .trace
        .records
        .iter()
        .flat_map(|r| &r.commands)
        .filter(|c| matches!(c, Command::Compute { work, .. } if work.phase == conductor_runtime::neuron::Phase::FfnGateRows))
        .count();
    assert!(gate_phases > 0);
}

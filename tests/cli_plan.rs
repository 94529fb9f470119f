//! `conductor plan` from the command line: a plan for a neuron store under a budget, which the
//! engine then runs under (its budget and cache shape, the in-memory tokens); limits no plan
//! meets are one-line errors and write nothing.

mod common;

use common::ScratchDir;

use conductor::runtime::cache::MemoryBudget;
use conductor::runtime::convert::ConvertOptions;
use conductor::runtime::plan::ExecutionPlan;
use conductor::runtime::plan::{CachePlan, CachePolicy};
use conductor::runtime::synthetic::{synthetic_model, Preset, SyntheticSpec};
use conductor::{DriverKind, Engine, GenerateOptions};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

/// A generated model converted into a store of 64-neuron bundles, in `dir`.
fn store(dir: &ScratchDir) -> PathBuf {
    let source = dir.file("model.gguf", || {
        synthetic_model(&common::small_spec(11))
            .unwrap()
            .to_bytes()
            .unwrap()
    });
    dir.store(&source, &ConvertOptions::neuron_columns(64))
}

fn profile() -> String {
    format!("{}/profiles/build-machine.toml", env!("CARGO_MANIFEST_DIR"))
}

fn plan_cmd(args: &[&str]) -> std::process::Output {
    common::conductor()
        .arg("plan")
        .args(["--profile", &profile()])
        .args(args)
        .output()
        .unwrap()
}

/// The one line of a failed command's standard error.
fn error_line(out: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "succeeded:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(lines.len(), 1, "one error line expected:\n{stderr}");
    lines[0].to_string()
}

/// The budget (MiB) that a plan refused for too small a budget says it needs at least.
fn least_budget_mib(out: &std::process::Output) -> f64 {
    let line = error_line(out);
    assert!(line.contains("give at least"), "{line}");
    line.rsplit("give at least ")
        .next()
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no size in {line}"))
}

fn greedy(engine: &mut Engine) -> Vec<u32> {
    let prompt = engine.tokenize("ab cd ef");
    let mut session = engine.session(Some(64)).unwrap();
    let options = GenerateOptions {
        max_tokens: 6,
        sampling: conductor::runtime::sample::SamplingParams::greedy(),
        ignore_eos: true,
    };
    engine
        .generate(&mut session, &prompt, &options, &mut |_| {
            ControlFlow::Continue(())
        })
        .unwrap()
        .generated
}

fn engine(store: &Path, plan: Option<ExecutionPlan>, memory: Option<MemoryBudget>) -> Engine {
    let mut b = Engine::builder()
        .model(store)
        .threads(1)
        .driver(DriverKind::Inline)
        .context(64)
        .on_progress(|_| {});
    if let Some(p) = plan {
        b = b.plan(p);
    }
    if let Some(m) = memory {
        b = b.memory(m);
    }
    b.build().unwrap()
}

#[test]
fn a_plan_under_a_budget_runs_under_that_budget_with_the_in_memory_tokens() {
    let dir = ScratchDir::new("cli-plan-run");
    let store = store(&dir);
    let out_path = dir.join("plan.json");
    let store_arg = store.to_str().unwrap();
    let out_arg = out_path.to_str().unwrap();

    // Too small a budget: how much is needed, and no plan written.
    let out = plan_cmd(&[
        "-m", store_arg, "--memory", "1MiB", "-c", "64", "-o", out_arg,
    ]);
    let need = least_budget_mib(&out);
    assert!(!out_path.exists());

    // Just above it: a plan that holds part of the FFN.
    let budget = format!("{}KiB", (need * 1024.0) as u64 + 256);
    let out = plan_cmd(&[
        "-m", store_arg, "--memory", &budget, "-c", "64", "-t", "1", "-o", out_arg,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    common::assert_success(&out);
    assert!(
        stdout.contains("predicted:") && stdout.contains("why:"),
        "{stdout}"
    );
    let plan = ExecutionPlan::from_file(&out_path).unwrap();
    let memory = plan.memory.expect("the plan carries its budget");
    let cache = plan.cache.clone().expect("and a cache");
    assert!(plan.model.is_some() && plan.predicted.is_some());

    // The engine runs under the plan's budget, with the plan's cache shape.
    let mut planned = engine(&store, Some(plan.clone()), None);
    let split = planned.budget().expect("a budget from the plan").clone();
    assert_eq!(split.budget, memory);
    assert_eq!(split.plan.policy, cache.policy);
    assert_eq!(split.plan.max_loads, cache.max_loads);
    let mut in_memory = engine(&store, None, None);
    assert!(in_memory.budget().is_none());
    assert_eq!(greedy(&mut planned), greedy(&mut in_memory));
    assert!(planned.cache_report().unwrap().misses() > 0);

    // The command line's budget wins over the plan's; a plan's cache policy shapes the cache.
    let lru = ExecutionPlan {
        cache: Some(CachePlan {
            policy: CachePolicy::Lru,
            ..cache
        }),
        ..plan
    };
    let b = engine(
        &store,
        Some(lru),
        Some(MemoryBudget::Bytes(memory + (1 << 20))),
    );
    assert_eq!(b.budget().unwrap().budget, memory + (1 << 20));
    assert_eq!(b.budget().unwrap().plan.policy, CachePolicy::Lru);
}

#[test]
fn limits_no_plan_meets_and_bad_arguments_write_nothing() {
    let dir = ScratchDir::new("cli-plan-errors");
    let out_path = dir.join("plan.json");
    let out_arg = out_path.to_str().unwrap();
    for (args, expect) in [
        (vec!["--shape", "gpt-5"], "unknown model shape `gpt-5`"),
        (
            vec!["--shape", "smollm2-135m", "--min-speed", "1000000"],
            "no plan reaches 1000000.00 tokens/s",
        ),
        (
            vec!["--shape", "smollm2-135m", "--memory", "20MiB"],
            "the memory limit cannot be met",
        ),
        (
            vec!["--shape", "smollm2-135m", "--cores", "gpu"],
            "no core class `gpu`",
        ),
        (vec!["--shape", "smollm2-135m", "--cores", "77"], "core 77"),
        (
            vec!["--shape", "smollm2-135m", "--sparsity", "threshold"],
            "--sparsity needs a model file",
        ),
    ] {
        let mut all = args.clone();
        all.extend(["-o", out_arg]);
        let line = error_line(&plan_cmd(&all));
        assert!(line.contains(expect), "{args:?}: {line}");
        assert!(!out_path.exists(), "{args:?} wrote a plan");
    }
    // A shape with a speed it can reach: the smallest memory, written.
    let out = plan_cmd(&["--shape", "smollm2-135m", "--min-speed", "5", "-o", out_arg]);
    common::assert_success(&out);
    let plan = ExecutionPlan::from_file(&out_path).unwrap();
    assert!(plan.predicted.unwrap().decode_tok_s >= 5.0);
    assert!(plan.memory.is_some());
}

/// Gemma 3 (threshold on |GELU(gate)|) and Qwen 3 go the whole way from a file to a budgeted
/// sparse run: profile, convert, plan under a budget with threshold sparsity, run that plan;
/// the run writes what the same sparsity writes with the store in memory.
#[test]
fn gemma3_and_qwen3_profile_plan_and_run_sparse_under_a_budget() {
    for arch in ["gemma3", "qwen3"] {
        let dir = ScratchDir::new(&format!("cli-plan-{arch}"));
        let source = dir.file("model.gguf", || {
            let spec = SyntheticSpec::preset(arch, Preset::Tiny).unwrap();
            synthetic_model(&spec).unwrap().to_bytes().unwrap()
        });
        let store = dir.store(&source, &ConvertOptions::neuron_columns(64));
        let (source_arg, store_arg) = (source.to_str().unwrap(), store.to_str().unwrap());
        let out = common::conductor()
            .args([
                "profile",
                "-m",
                source_arg,
                "--no-predictors",
                "--tokens",
                "256",
            ])
            .args(["-c", "64", "-t", "1"])
            .output()
            .unwrap();
        common::assert_success(&out);

        let plan_path = dir.join("plan.json");
        let plan_arg = plan_path.to_str().unwrap();
        let sparse = ["--sparsity", "threshold", "--target-sparsity", "30%"];
        let need = least_budget_mib(&plan_cmd(&[
            "-m", store_arg, "--memory", "1MiB", "-c", "64", "-o", plan_arg,
        ]));
        let budget = format!("{}KiB", (need * 1024.0) as u64 + 256);
        let out = plan_cmd(
            &[
                &["-m", store_arg, "--memory", &budget, "-c", "64", "-t", "1"][..],
                &sparse,
                &["-o", plan_arg],
            ]
            .concat(),
        );
        common::assert_success(&out);
        let plan = ExecutionPlan::from_file(&plan_path).unwrap();
        assert!(
            plan.memory.is_some() && plan.cache.is_some(),
            "{arch}: {plan:?}"
        );

        let run = |extra: &[&str]| {
            let out = common::conductor()
                .args([
                    "run", "-m", store_arg, "-p", "ab cd", "-n", "8", "--temp", "0",
                ])
                .args(["--ignore-eos", "-c", "64", "-t", "1", "--driver", "inline"])
                .args(extra)
                .output()
                .unwrap();
            common::assert_success(&out);
            let stderr = String::from_utf8_lossy(&out.stderr).to_string();
            assert!(stderr.contains("sparsity: threshold"), "{arch}: {stderr}");
            String::from_utf8_lossy(&out.stdout).to_string()
        };
        let planned = run(&["--plan", plan_arg]);
        let in_memory = run(&sparse);
        assert_eq!(planned, in_memory, "{arch}");
    }
}

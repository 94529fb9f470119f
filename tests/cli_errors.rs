//! Bad input gets a one-line error and a non-zero exit, never a panic or a hang.

mod common;

use conductor::runtime::gguf::{GgufFile, GgufWriter, Value};
use conductor::runtime::quant::GgmlType;
use conductor::runtime::synthetic::{synthetic_model, SyntheticSpec};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A file path in a fresh temporary directory, removed with it when dropped.
struct TempPath(PathBuf);

impl TempPath {
    fn new(name: &str) -> TempPath {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "conductor-cli-errors-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempPath(dir.join(name))
    }
}

impl std::ops::Deref for TempPath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempPath {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TempPath {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn temp_path(name: &str) -> TempPath {
    TempPath::new(name)
}

fn small_model() -> TempPath {
    let path = temp_path("small.gguf");
    synthetic_model(&SyntheticSpec::default())
        .unwrap()
        .write_file_atomic(&path)
        .unwrap();
    path
}

/// Runs `conductor args…`; asserts it fails with exactly one `error:` line that contains every
/// one of `expected` (case-insensitive), and no panic.
fn fails_with(args: &[&str], expected: &[&str]) {
    let out = common::conductor().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "conductor {args:?} succeeded:\n{stderr}"
    );
    assert!(
        !stderr.contains("panicked"),
        "conductor {args:?} panicked:\n{stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "conductor {args:?}: one line expected:\n{stderr}"
    );
    assert!(lines[0].starts_with("error: "), "{stderr}");
    for e in expected {
        assert!(
            lines[0].to_lowercase().contains(&e.to_lowercase()),
            "conductor {args:?}: `{e}` not in {:?}",
            lines[0]
        );
    }
}

fn run_args<'a>(model: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["run", "-m", model.to_str().unwrap()];
    v.extend_from_slice(extra);
    v
}

#[test]
fn missing_model_file() {
    fails_with(
        &["run", "-m", "/nonexistent/model.gguf", "-p", "hi"],
        &["/nonexistent/model.gguf", "cannot read"],
    );
}

#[test]
fn a_file_that_is_not_gguf() {
    let path = temp_path("notes.gguf");
    std::fs::write(&path, "these are not the weights you are looking for").unwrap();
    fails_with(&run_args(&path, &["-p", "hi"]), &["notes.gguf", "magic"]);
}

#[test]
fn a_truncated_model_file() {
    let bytes = synthetic_model(&SyntheticSpec::default())
        .unwrap()
        .to_bytes()
        .unwrap();
    let path = temp_path("truncated.gguf");
    std::fs::write(&path, &bytes[..bytes.len() * 2 / 3]).unwrap();
    fails_with(&run_args(&path, &["-p", "hi"]), &["truncated.gguf"]);
}

#[test]
fn an_unsupported_architecture_is_named() {
    let small = GgufFile::open(&small_model()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in small.metadata() {
        let v = if k == "general.architecture" {
            Value::String("mamba".into())
        } else {
            v.clone()
        };
        w.add_metadata(k.clone(), v).unwrap();
    }
    let path = temp_path("mamba.gguf");
    w.write_file_atomic(&path).unwrap();
    fails_with(&run_args(&path, &["-p", "hi"]), &["architecture", "mamba"]);
}

#[test]
fn an_unsupported_quant_type_is_named() {
    // The same model with one matrix stored as IQ2_XS, which the kernels do not handle.
    let spec = SyntheticSpec {
        n_embd: 256,
        n_ff: 512,
        weight_type: GgmlType::Q4_K,
        embd_type: GgmlType::Q6_K,
        ..SyntheticSpec::default()
    };
    let src = GgufFile::from_bytes(synthetic_model(&spec).unwrap().to_bytes().unwrap()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        w.add_metadata(k.clone(), v.clone()).unwrap();
    }
    for t in src.tensors() {
        if t.name == "blk.1.ffn_up.weight" {
            let n = GgmlType::IQ2_XS.bytes_for(t.n_elements).unwrap() as usize;
            w.add_tensor(t.name.clone(), t.dims.clone(), GgmlType::IQ2_XS, vec![0; n])
                .unwrap();
        } else {
            w.add_tensor(
                t.name.clone(),
                t.dims.clone(),
                t.ty,
                src.tensor_data(t).to_vec(),
            )
            .unwrap();
        }
    }
    let path = temp_path("iq2xs.gguf");
    w.write_file_atomic(&path).unwrap();
    fails_with(
        &run_args(&path, &["-p", "hi"]),
        &["blk.1.ffn_up.weight", "IQ2_XS"],
    );
}

#[test]
fn a_prompt_longer_than_the_context() {
    let model = small_model();
    let long = "abc def ".repeat(40);
    fails_with(
        &run_args(&model, &["-p", &long, "-c", "16"]),
        &["context holds 16"],
    );
}

#[test]
fn an_empty_prompt() {
    let model = small_model();
    fails_with(&run_args(&model, &["-p", ""]), &["prompt is empty"]);
}

#[test]
fn nothing_to_generate() {
    let model = small_model();
    fails_with(&run_args(&model, &["-p", "hi", "-n", "0"]), &["-n"]);
}

#[test]
fn nonsense_sampling_values() {
    let model = small_model();
    for (flag, value, name) in [
        ("--temp", "-1", "temperature"),
        ("--temp", "NaN", "temperature"),
        ("--top-p", "1.5", "top-p"),
        ("--top-p", "0", "top-p"),
        ("--min-p", "-0.2", "min-p"),
        ("--repeat-penalty", "0", "repeat-penalty"),
    ] {
        let flag_value = format!("{flag}={value}");
        fails_with(&run_args(&model, &["-p", "hi", &flag_value]), &[name]);
    }
}

#[test]
fn zero_threads() {
    let model = small_model();
    fails_with(&run_args(&model, &["-p", "hi", "-t", "0"]), &["-t"]);
}

#[test]
fn check_refs_with_a_missing_or_broken_reference_file() {
    let model = small_model();
    let m = model.to_str().unwrap();
    fails_with(
        &["check-refs", "-m", m, "--refs", "/nonexistent/refs.jsonl"],
        &["/nonexistent/refs.jsonl"],
    );
    let broken = temp_path("refs.jsonl");
    std::fs::write(&broken, "{\"id\": \"x\", \"prompt_ids\": [1, 2]}\n").unwrap();
    fails_with(
        &["check-refs", "-m", m, "--refs", broken.to_str().unwrap()],
        &["refs.jsonl line 1"],
    );
}

#[test]
fn perplexity_on_a_text_too_short_for_the_context() {
    let model = small_model();
    let text = temp_path("short.txt");
    std::fs::write(&text, "a few words").unwrap();
    fails_with(
        &[
            "perplexity",
            "-m",
            model.to_str().unwrap(),
            "-f",
            text.to_str().unwrap(),
        ],
        &["needs at least 1024"],
    );
}

#[test]
fn fetch_without_python_says_what_to_do() {
    let home = temp_path("home");
    let out = common::conductor()
        .arg("fetch")
        .env("CONDUCTOR_HOME", &home)
        .env("CONDUCTOR_PYTHON", "/nonexistent/python3")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let last = stderr.lines().last().unwrap();
    assert!(
        last.starts_with("error: ") && last.contains("/nonexistent/python3"),
        "{stderr}"
    );
    assert!(last.contains("-m"), "suggests passing a model: {stderr}");
}

#[test]
fn plans_that_do_not_parse_or_do_not_fit_the_machine_name_the_field() {
    let model = small_model();
    let plan = temp_path("plan.json");
    std::fs::write(&plan, "{ not json").unwrap();
    let plan_arg = plan.to_str().unwrap();
    fails_with(
        &run_args(&model, &["-p", "hi", "--plan", plan_arg]),
        &["plan", "plan.json"],
    );

    let mut good = conductor::runtime::plan::ExecutionPlan::default();
    good.groups[0].cores = conductor::runtime::plan::CoreSet::Ids(vec![0, 4096]);
    std::fs::write(&plan, serde_json::to_string(&good).unwrap()).unwrap();
    fails_with(
        &run_args(&model, &["-p", "hi", "--plan", plan_arg]),
        &["groups[0].cores", "core 4096 does not exist"],
    );

    let mut good = conductor::runtime::plan::ExecutionPlan::default();
    good.decode_on[0].group = "gpu".into();
    std::fs::write(&plan, serde_json::to_string(&good).unwrap()).unwrap();
    fails_with(
        &run_args(&model, &["-p", "hi", "--plan", plan_arg]),
        &["decode_on[0].group", "gpu"],
    );

    let mut good = conductor::runtime::plan::ExecutionPlan::default();
    good.groups[1].cores = conductor::runtime::plan::CoreSet::Class("little".into());
    std::fs::write(&plan, serde_json::to_string(&good).unwrap()).unwrap();
    // This machine's cores are all of one class; a plan written for a phone's little cores
    // does not fit (unless the machine has them).
    let topology = conductor::actors::detect_topology();
    if !topology.classes().contains(&"little") {
        fails_with(
            &run_args(&model, &["-p", "hi", "--plan", plan_arg]),
            &["groups[1].cores", "core class `little`"],
        );
    }

    // A plan made for another model (here: one with another seed, so other norm weights),
    // in bincode: refused, naming both models. The same plan made for this model runs.
    let other = temp_path("other.gguf");
    synthetic_model(&SyntheticSpec {
        seed: 99,
        ..SyntheticSpec::default()
    })
    .unwrap()
    .write_file_atomic(&other)
    .unwrap();
    let bin = temp_path("plan.bin");
    let bin_arg = bin.to_str().unwrap();
    let for_model = |path: &Path| conductor::runtime::plan::ExecutionPlan {
        model: Some(conductor::runtime::plan::ModelIdentity::of(
            &conductor::runtime::model::Model::open(
                path,
                conductor::runtime::model::WeightSource::Mapped,
            )
            .unwrap(),
        )),
        ..conductor::runtime::plan::ExecutionPlan::default()
    };
    for_model(&other).to_file(&bin).unwrap();
    fails_with(
        &run_args(&model, &["-p", "hi", "-n", "1", "--plan", bin_arg]),
        &["plan was made for another model", "norms CRC32"],
    );
    for_model(&model).to_file(&bin).unwrap();
    let out = common::conductor()
        .args(run_args(
            &model,
            &["-p", "hi", "-n", "1", "--plan", bin_arg],
        ))
        .output()
        .unwrap();
    common::assert_success(&out);
}

#[test]
fn nonsense_draft_settings() {
    let model = small_model();
    let run = |extra: &[&str], expected: &[&str]| {
        let mut args = vec!["-p", "hello", "-n", "4", "--draft"];
        args.extend_from_slice(extra);
        fails_with(&run_args(&model, &args), expected);
    };
    run(
        &["ngram", "--draft-max", "0"],
        &["--draft-max", "at least 1"],
    );
    run(&["ngram", "--draft-max", "-2"], &["--draft-max", "-2"]);
    run(&["ngram", "--draft-min", "-1"], &["--draft-min", "-1"]);
    run(
        &["ngram", "--draft-max", "2", "--draft-min", "3"],
        &["--draft-min 3", "--draft-max 2"],
    );
    // Drafting from what a budget keeps resident needs a budget.
    run(&["self"], &["--draft self", "without --memory"]);
    run(&["/nonexistent/draft.gguf"], &["/nonexistent/draft.gguf"]);
    // A draft model with another vocabulary: both sizes named.
    let other = temp_path("other-vocab.gguf");
    let spec = SyntheticSpec {
        n_vocab: SyntheticSpec::default().n_vocab + 8,
        ..SyntheticSpec::default()
    };
    synthetic_model(&spec)
        .unwrap()
        .write_file_atomic(&other)
        .unwrap();
    let n = SyntheticSpec::default().n_vocab;
    run(
        &[other.to_str().unwrap()],
        &["vocabulary", &n.to_string(), &(n + 8).to_string()],
    );
    // Drafts guess from text: a benchmark of random tokens has none.
    fails_with(
        &[
            "bench",
            "-m",
            model.to_str().unwrap(),
            "-p",
            "0",
            "-n",
            "4",
            "--draft",
            "ngram",
        ],
        &["--prompt-file"],
    );
    // The server checks the same flags before it listens, and a draft model with another
    // vocabulary the same way.
    let serve = |extra: &[&str], expected: &[&str]| {
        let mut args = vec![
            "serve",
            "--port",
            "0",
            "-m",
            model.to_str().unwrap(),
            "--draft",
        ];
        args.extend_from_slice(extra);
        fails_with(&args, expected);
    };
    serve(
        &["ngram", "--draft-max", "0"],
        &["--draft-max", "at least 1"],
    );
    serve(
        &[other.to_str().unwrap()],
        &["vocabulary", &n.to_string(), &(n + 8).to_string()],
    );
}

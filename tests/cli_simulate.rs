//! `conductor simulate`, `profile-hw` and `--trace-out` from the command line: a real run's
//! trace replays, predictions come out in `conductor bench`'s JSON lines, bad profiles and
//! traces are one-line errors naming what is wrong.

mod common;

fn profiles(name: &str) -> String {
    format!("{}/profiles/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn ok(args: &[&str]) -> (String, String) {
    let out = common::conductor().args(args).output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "conductor {args:?} failed:\n{stderr}");
    (stdout, stderr)
}

fn error(args: &[&str]) -> String {
    let out = common::conductor().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "conductor {args:?} succeeded");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected:\n{stderr}");
    lines[0].to_string()
}

#[test]
fn a_real_runs_trace_replays_and_its_timeline_is_written() {
    let dir = common::ScratchDir::new("cli-sim-replay");
    let model = common::default_model();
    let trace = dir.join("run.trace");
    let (_, stderr) = ok(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "The capital of France is",
        "-n",
        "6",
        "--temp",
        "0",
        "-t",
        "2",
        "--trace-out",
        trace.to_str().unwrap(),
    ]);
    assert!(stderr.contains("trace:"), "{stderr}");
    let timeline: serde_json::Value =
        serde_json::from_slice(&std::fs::read(trace.with_extension("json")).unwrap()).unwrap();
    assert!(timeline["traceEvents"].as_array().unwrap().len() > 100);

    let (stdout, _) = ok(&[
        "simulate",
        "--replay",
        trace.to_str().unwrap(),
        "-m",
        model.to_str().unwrap(),
    ]);
    assert!(stdout.contains("identical command stream"), "{stdout}");

    // The same trace checked against another model's shape: refused, naming both.
    let other = dir.join("other.gguf");
    conductor::runtime::synthetic::synthetic_model(&Default::default())
        .unwrap()
        .write_file_atomic(&other)
        .unwrap();
    let line = error(&[
        "simulate",
        "--replay",
        trace.to_str().unwrap(),
        "-m",
        other.to_str().unwrap(),
    ]);
    assert!(line.contains("synthetic"), "{line}");

    // A damaged trace is an error, not a panic.
    let mut bytes = std::fs::read(&trace).unwrap();
    let keep = bytes.len() / 2;
    bytes.truncate(keep);
    let broken = dir.join("broken.trace");
    std::fs::write(&broken, bytes).unwrap();
    let line = error(&["simulate", "--replay", broken.to_str().unwrap()]);
    assert!(line.contains("corrupt"), "{line}");
}

#[test]
fn predictions_come_out_as_bench_json_lines() {
    let (stdout, _) = ok(&[
        "simulate",
        "--profile",
        &profiles("oneplus-12.toml"),
        "--shape",
        "llama-2-7b",
        "-p",
        "64",
        "-n",
        "4",
        "--json",
    ]);
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let tests: Vec<&str> = lines.iter().map(|l| l["test"].as_str().unwrap()).collect();
    assert_eq!(tests, vec!["pp64", "tg4"]);
    for l in &lines {
        let t = &l["tok_s"];
        assert!(t["median"].as_f64().unwrap() > 0.0);
        assert_eq!(t["median"], t["min"]);
        assert_eq!(l["simulated"], true);
    }
}

#[test]
fn bad_profiles_and_shapes_are_named() {
    let dir = common::ScratchDir::new("cli-sim-bad");
    let line = error(&[
        "simulate",
        "--profile",
        "/nonexistent/profile.toml",
        "--shape",
        "llama-2-7b",
    ]);
    assert!(line.contains("/nonexistent/profile.toml"), "{line}");

    let text = std::fs::read_to_string(profiles("oneplus-12.toml")).unwrap();
    let broken = dir.join("broken.toml");
    std::fs::write(
        &broken,
        text.replacen("bandwidth_gbs = 43.9", "bandwidth_gbs = -1.0", 1),
    )
    .unwrap();
    let line = error(&[
        "simulate",
        "--profile",
        broken.to_str().unwrap(),
        "--shape",
        "llama-2-7b",
    ]);
    assert!(line.contains("memory.bandwidth_gbs"), "{line}");

    let line = error(&[
        "simulate",
        "--profile",
        &profiles("oneplus-12.toml"),
        "--shape",
        "gpt-5",
    ]);
    assert!(line.contains("unknown model shape `gpt-5`"), "{line}");
}

#[test]
fn profile_hw_writes_a_profile_the_simulator_takes() {
    let dir = common::ScratchDir::new("cli-sim-profile-hw");
    let out = dir.join("quick.toml");
    ok(&[
        "profile-hw",
        "--quick",
        "--no-storage",
        "-o",
        out.to_str().unwrap(),
    ]);
    let profile =
        conductor::runtime::plan::HardwareProfile::from_file(&out).expect("a valid profile");
    assert!(!profile.core_classes.is_empty());
    let (stdout, _) = ok(&[
        "simulate",
        "--profile",
        out.to_str().unwrap(),
        "--shape",
        "smollm2-135m",
        "-p",
        "32",
        "-n",
        "4",
    ]);
    assert!(stdout.contains("decode"), "{stdout}");
}

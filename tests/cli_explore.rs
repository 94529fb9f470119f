//! `conductor explore` from the command line: a sweep writes a CSV row per point and the charts;
//! more memory never reads more per token; bad sweeps are one-line errors.

mod common;

use common::ScratchDir;

fn profile() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/profiles/oneplus-12.toml").to_string()
}

#[test]
fn a_sweep_writes_a_row_per_point_and_the_charts() {
    let scratch = ScratchDir::new("cli-explore-sweep");
    let dir = scratch.join("out");
    let out = common::conductor()
        .args([
            "explore",
            "--sweep",
            "model=smollm2-135m",
            "--sweep",
            &format!("profile={}", profile()),
            "--sweep",
            "memory=30%,60%,100%",
            "--sweep",
            "cache=static,lru",
            "--sweep",
            "bundle-neurons=64",
            "-o",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    common::assert_success(&out);
    let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].starts_with("model,profile,memory,budget_bytes"));
    assert_eq!(lines.len(), 1 + 3 * 2, "{csv}");
    let header: Vec<&str> = lines[0].split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let rows: Vec<Vec<&str>> = lines[1..].iter().map(|l| l.split(',').collect()).collect();
    // Points in sweep order: memory varies slower than cache.
    assert_eq!(rows[0][col("cache")], "static");
    assert_eq!(rows[1][col("cache")], "lru");
    assert_eq!(rows[2][col("memory")], "60% FFN");
    for pair in [(0, 2), (2, 4), (1, 3), (3, 5)] {
        let bytes = |r: usize| rows[r][col("bytes_per_token")].parse::<f64>().unwrap();
        let budget = |r: usize| rows[r][col("budget_bytes")].parse::<u64>().unwrap();
        assert!(budget(pair.1) > budget(pair.0));
        assert!(
            bytes(pair.1) <= bytes(pair.0),
            "more memory read more: {csv}"
        );
    }
    for r in &rows {
        assert!(r[col("decode_tok_s")].parse::<f64>().unwrap() > 0.0);
    }
    for chart in ["decode.svg", "decode.png", "io.svg", "io.png"] {
        let bytes = std::fs::read(dir.join(chart)).unwrap();
        assert!(bytes.len() > 100, "{chart}");
    }
    assert!(std::fs::read(dir.join("decode.png"))
        .unwrap()
        .starts_with(b"\x89PNG"));
    assert!(std::fs::read_to_string(dir.join("decode.svg"))
        .unwrap()
        .contains("<svg"));
}

#[test]
fn bad_sweeps_are_one_line_errors_and_write_nothing() {
    for (args, expected) in [
        (
            vec!["--sweep", "model=gpt-5"],
            "unknown model shape `gpt-5`",
        ),
        (vec!["--sweep", "model=smollm2-135m"], "profile"),
        (vec!["--sweep", "colour=red"], "unknown axis `colour`"),
        (
            vec![
                "--sweep",
                "model=smollm2-135m",
                "--sweep",
                "profile=/nonexistent.toml",
            ],
            "/nonexistent.toml",
        ),
        (
            vec![
                "--sweep",
                "model=smollm2-135m",
                "--sweep",
                "profile=PROFILE",
                "--sweep",
                "memory=1MB",
            ],
            "is below what this model needs",
        ),
    ] {
        let scratch = ScratchDir::new("cli-explore-bad");
        let dir = scratch.join("out");
        let args: Vec<String> = args
            .iter()
            .map(|a| a.replace("PROFILE", &profile()))
            .collect();
        let out = common::conductor()
            .arg("explore")
            .args(&args)
            .arg("-o")
            .arg(&dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(expected), "{args:?}: {err}");
        assert!(!dir.join("results.csv").exists(), "{args:?}");
    }
}

//! The benchmark scripts' own unit tests (Python, standard library), so that the one test
//! command covers them too.

#[test]
fn bench_script_unit_tests_pass() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "bench/tests"])
        .current_dir(root)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "bench/tests failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

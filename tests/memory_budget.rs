//! `--memory` on the default model: a run inside a Linux memory cgroup set to the budget plus
//! a small margin completes at half and at a quarter of the store (attention streamed), its
//! peak RSS stays under the budget, and a budget below the fixed segment is refused with how
//! much is needed; a server batching four clients under `--memory 50%` holds its budget in a
//! cgroup too.

mod common;

use common::ScratchDir;
use conductor::runtime::convert::ConvertOptions;
use std::path::{Path, PathBuf};
use std::process::Command;

const MARGIN: u64 = 4 << 20;

fn conductor() -> Command {
    Command::new(env!("CARGO_BIN_EXE_conductor"))
}

/// The default model converted into a neuron store, in `dir`.
fn store(dir: &ScratchDir) -> PathBuf {
    dir.store(&common::default_model(), &ConvertOptions::default())
}

/// A fresh memory cgroup limited to `limit` bytes: (directory, file to write a pid into,
/// file holding the peak usage). `None` where this machine gives us none, said through
/// `common::environment_missing` (a failure under `CI=true`).
fn memory_cgroup(limit: u64) -> Option<(PathBuf, PathBuf, PathBuf)> {
    let cgroup = try_memory_cgroup(limit);
    if cgroup.is_none() {
        common::environment_missing(
            "no writable memory cgroup on this machine (needs root and cgroup v1 or v2 with the memory controller)",
        );
    }
    cgroup
}

/// [`memory_cgroup`], `None` where this machine gives us none (not root, no memory
/// controller).
fn try_memory_cgroup(limit: u64) -> Option<(PathBuf, PathBuf, PathBuf)> {
    // One name per cgroup: the tests of this file run at once in one process.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("conductor-test-{}-{n}", std::process::id());
    let v1 = Path::new("/sys/fs/cgroup/memory");
    if v1.join("memory.limit_in_bytes").exists() {
        let dir = v1.join(&name);
        std::fs::create_dir(&dir).ok()?;
        std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string()).ok()?;
        let _ = std::fs::write(dir.join("memory.memsw.limit_in_bytes"), limit.to_string());
        return Some((
            dir.clone(),
            dir.join("cgroup.procs"),
            dir.join("memory.max_usage_in_bytes"),
        ));
    }
    let v2 = Path::new("/sys/fs/cgroup");
    let controllers = std::fs::read_to_string(v2.join("cgroup.controllers")).ok()?;
    if !controllers.split_whitespace().any(|c| c == "memory") {
        return None;
    }
    let _ = std::fs::write(v2.join("cgroup.subtree_control"), "+memory");
    let dir = v2.join(&name);
    std::fs::create_dir(&dir).ok()?;
    std::fs::write(dir.join("memory.max"), limit.to_string()).ok()?;
    let _ = std::fs::write(dir.join("memory.swap.max"), "0");
    Some((
        dir.clone(),
        dir.join("cgroup.procs"),
        dir.join("memory.peak"),
    ))
}

#[test]
fn a_budgeted_run_completes_inside_a_cgroup_of_that_size() {
    let dir = ScratchDir::new("budget-cgroup");
    let store = store(&dir);
    // Half the store keeps attention resident; a quarter streams it too.
    for percent in [50, 25] {
        run_in_cgroup(&store, percent);
    }
}

/// `conductor bench` of `store` with `--memory {percent}%` inside a memory cgroup of that
/// budget plus [`MARGIN`]: it completes, and its peak RSS stays within the budget.
fn run_in_cgroup(store: &Path, percent: u64) {
    let store_bytes = std::fs::metadata(store).unwrap().len();
    let budget = store_bytes * percent / 100;
    let limit = budget + MARGIN;
    let Some((cgroup, procs, peak_file)) = memory_cgroup(limit) else {
        return;
    };
    let shell = format!(
        "echo $$ > {} && exec {} bench -m {} --memory {percent}% -t 2 -p 16 -n 16 -r 1 --json",
        procs.display(),
        env!("CARGO_BIN_EXE_conductor"),
        store.display()
    );
    let out = Command::new("sh").arg("-c").arg(&shell).output().unwrap();
    let peak: Option<u64> = std::fs::read_to_string(&peak_file)
        .ok()
        .and_then(|s| s.trim().parse().ok());
    let _ = std::fs::remove_dir(&cgroup);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{percent}%: killed or failed under {limit} bytes: {stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = 0;
    for line in stdout.lines().filter(|l| l.starts_with('{')) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let rss = v["peak_rss_bytes"].as_u64().unwrap();
        assert_eq!(v["memory_budget_bytes"].as_u64(), Some(budget));
        assert!(
            rss <= budget,
            "{percent}%: peak RSS {rss} over the budget {budget}"
        );
        let cache = &v["cache"];
        assert!(cache["bytes_read_per_token"].as_f64().unwrap() > 0.0);
        // How the reads met the device: aligned reads of at least a page, timed, one request
        // a submission (positional reads, the default).
        assert!(
            cache["mean_read_bytes"].as_f64().unwrap() >= 4096.0,
            "{line}"
        );
        assert!(cache["read_mb_s"].as_f64().unwrap() > 0.0, "{line}");
        assert_eq!(
            cache["read_requests_per_submission"].as_f64(),
            Some(1.0),
            "{line}"
        );
        lines += 1;
    }
    assert_eq!(lines, 2, "{stdout}");
    match peak {
        Some(peak) => assert!(
            peak <= limit,
            "{percent}%: cgroup peak {peak} over its limit {limit}"
        ),
        None => common::environment_missing(&format!(
            "the cgroup's peak usage ({}) could not be read (cgroup v2 has it from Linux 5.19)",
            peak_file.display()
        )),
    }
}

#[test]
fn a_budget_below_the_fixed_segment_says_how_much_is_needed() {
    let dir = ScratchDir::new("budget-small");
    let store = store(&dir);
    let out = conductor()
        .args(["run", "-m"])
        .arg(&store)
        .args(["--memory", "16MiB", "-p", "hello", "-n", "4"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("memory budget of 16 MiB") && stderr.contains("give at least"),
        "{stderr}"
    );
    // An ordinary model cannot run under a budget: the error names the way out.
    let out = conductor()
        .args(["run", "-m"])
        .arg(common::default_model())
        .args(["--memory", "50%", "-p", "hello", "-n", "4"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("conductor convert"), "{stderr}");
}

/// `conductor serve --memory 50% --parallel 4` inside a memory cgroup of the budget plus
/// [`MARGIN`], four clients at once (continuous batching, the four slots' KV caches and the one
/// neuron cache in the budget): every request completes, the server is not killed, and the
/// cgroup's peak stays within its limit.
#[test]
fn a_server_batching_four_clients_holds_its_budget_inside_a_cgroup() {
    use std::io::{BufRead, BufReader, Read, Write};
    let dir = ScratchDir::new("budget-serve-cgroup");
    let store = store(&dir);
    let budget = std::fs::metadata(&store).unwrap().len() / 2;
    let limit = budget + MARGIN;
    let Some((cgroup, procs, peak_file)) = memory_cgroup(limit) else {
        return;
    };
    let shell = format!(
        "echo $$ > {} && exec {} serve -m {} --memory 50% --parallel 4 -t 2 --host 127.0.0.1 --port 0",
        procs.display(),
        env!("CARGO_BIN_EXE_conductor"),
        store.display()
    );
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(&shell)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    let Some(addr) = first
        .strip_prefix("listening on http://")
        .map(str::to_string)
    else {
        let _ = child.kill();
        let mut err = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut err);
        let _ = child.wait();
        let _ = std::fs::remove_dir(&cgroup);
        panic!("the server did not start under {limit} bytes: {first}\n{err}");
    };
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let body = format!(
                    r#"{{"messages":[{{"role":"user","content":"Write a story about topic {i}."}}],"max_tokens":48,"temperature":0,"ignore_eos":true}}"#
                );
                let mut conn = std::net::TcpStream::connect(&addr).ok()?;
                write!(
                    conn,
                    "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .ok()?;
                let mut answer = String::new();
                conn.read_to_string(&mut answer).ok()?;
                Some(answer)
            })
        })
        .collect();
    let answers: Vec<Option<String>> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let alive = matches!(child.try_wait(), Ok(None));
    let _ = child.kill();
    let _ = child.wait();
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    let peak: Option<u64> = std::fs::read_to_string(&peak_file)
        .ok()
        .and_then(|s| s.trim().parse().ok());
    let _ = std::fs::remove_dir(&cgroup);
    assert!(alive, "the server died under {limit} bytes:\n{err}");
    assert!(err.contains("(4 sessions × "), "{err}");
    for answer in &answers {
        let answer = answer.as_deref().unwrap_or("(no answer)");
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.contains(r#""completion_tokens":48"#),
            "{answer}\nserver log:\n{err}"
        );
    }
    match peak {
        Some(peak) => assert!(peak <= limit, "cgroup peak {peak} over its limit {limit}"),
        None => common::environment_missing(&format!(
            "the cgroup's peak usage ({}) could not be read (cgroup v2 has it from Linux 5.19)",
            peak_file.display()
        )),
    }
}

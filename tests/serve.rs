//! `conductor serve` end to end, on loopback: the official `openai` Python client (from PyPI,
//! in a venv made and cached under the Conductor home) against a server on the default model.
//! The checks themselves are in `tests/serve/openai_checks.py`, one scenario a test.

mod common;

use common::server::{chat, exchange, get, header, metric, run_greedy, Server};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The client's versions, pinned so a new release cannot change what the tests mean.
const PACKAGES: &[&str] = &["openai==3.57.0", "jsonschema==4.26.0"];

fn run_logged(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// Makes a venv at `dir` with the client installed, or says why not.
fn make_venv(dir: &Path) -> Result<(), String> {
    let venv = || run_logged(Command::new("python3").args(["-m", "venv"]).arg(dir));
    if let Err(first) = venv() {
        // Debian and Ubuntu ship `venv` apart (python3-venv); as root, install it the way the
        // bench scripts install what they need.
        let root = std::env::var("USER").as_deref() == Ok("root")
            || Command::new("id")
                .arg("-u")
                .output()
                .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
        if !root || Command::new("apt-get").arg("--version").output().is_err() {
            return Err(format!(
                "{first}\n(install python3-venv, e.g. `apt-get install -y python3-venv`)"
            ));
        }
        let _ = std::fs::remove_dir_all(dir);
        run_logged(Command::new("apt-get").args(["update", "-qq"]))?;
        run_logged(
            Command::new("apt-get")
                .args([
                    "install",
                    "-y",
                    "-qq",
                    "--no-install-recommends",
                    "python3-venv",
                ])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
        venv()?;
    }
    run_logged(
        Command::new(dir.join("bin/python"))
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            .args(PACKAGES),
    )
}

/// The venv's python with `openai` importable: made once, then cached under the Conductor
/// home (`venv-openai`). `None` (a skip, or a failure under CI=true) when it cannot be made.
fn openai_python() -> Option<PathBuf> {
    static PYTHON: OnceLock<Option<PathBuf>> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let dir = conductor::fetch::conductor_home().join("venv-openai");
            let python = dir.join("bin/python");
            let ready = |python: &Path| {
                Command::new(python)
                    .args(["-c", "import openai, jsonschema"])
                    .output()
                    .is_ok_and(|o| o.status.success())
            };
            if ready(&python) {
                return Some(python);
            }
            // Made beside its place and renamed into it, so a half-made venv is never used.
            let tmp = dir.with_extension(format!("tmp-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&tmp);
            if let Some(parent) = dir.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            match make_venv(&tmp) {
                Ok(()) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    if std::fs::rename(&tmp, &dir).is_err() || !ready(&python) {
                        // A venv's scripts name its path: one that cannot move is used where
                        // it was made.
                        let _ = std::fs::remove_dir_all(&dir);
                        return ready(&tmp.join("bin/python")).then(|| tmp.join("bin/python"));
                    }
                    Some(python)
                }
                Err(why) => {
                    let _ = std::fs::remove_dir_all(&tmp);
                    common::environment_missing(&format!(
                        "the openai client cannot be installed into a venv: {why}"
                    ));
                    None
                }
            }
        })
        .clone()
}

/// Runs a scenario of `openai_checks.py` against `server`; its stdout.
fn check(server: &Server, scenario: &str, args: &[&str]) -> Option<String> {
    let python = openai_python()?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/serve/openai_checks.py");
    let out = Command::new(python)
        .arg(script)
        .arg(&server.url)
        .arg(scenario)
        .args(args)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "scenario {scenario} failed:\n{}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Starts a server with `flags` and runs `name` of `openai_checks.py` against it.
fn scenario(flags: &[&str], name: &str, args: &[&str]) {
    let server = Server::start(flags);
    check(&server, name, args);
}

#[test]
fn openai_client_chats_plainly_and_streamed_and_completes_text() {
    scenario(&["-c", "1024"], "plain_and_streamed", &[]);
}

/// Asks `server` (serving `model` with `flags`) for `prompt` greedily over the openai client
/// and checks the answer is what `conductor run --chat --temp 0` prints with the same model
/// and flags. False when the client cannot run here (not under CI).
fn greedy_matches_run(
    server: &Server,
    model: &Path,
    flags: &[&str],
    prompt: &str,
    n: &str,
) -> bool {
    let Some(out) = check(server, "greedy", &[prompt, n]) else {
        return false;
    };
    let served: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON line");
    let served = served["content"].as_str().expect("content");
    assert!(!served.is_empty());
    assert_eq!(served, run_greedy(model, flags, prompt, n));
    true
}

/// Greedy output over the server is what `conductor run --chat --temp 0` prints.
#[test]
fn greedy_chat_over_the_server_matches_conductor_run() {
    let model = common::default_model();
    let flags = ["-c", "1024"];
    let server = Server::start_with(&model, &flags);
    let prompt = "What is the capital of France? Answer in one sentence.";
    greedy_matches_run(&server, &model, &flags, prompt, "24");
}

/// Under a memory budget (a neuron store, `--memory 50%`) the server answers as `conductor run`
/// does under the same budget, and /metrics counts the neuron cache's hits and misses.
#[test]
fn serving_under_a_memory_budget_matches_conductor_run_and_counts_the_cache() {
    let dir = common::ScratchDir::new("serve-budget");
    let store = dir.store(
        &common::default_model(),
        &conductor::runtime::convert::ConvertOptions::default(),
    );
    let flags = ["--memory", "50%", "-c", "1024"];
    let server = Server::start_with(&store, &flags);
    if !greedy_matches_run(&server, &store, &flags, "Name three colors.", "16") {
        return;
    }
    let cache = metric(&server, "conductor_neuron_cache_hits_total")
        + metric(&server, "conductor_neuron_cache_misses_total");
    assert!(cache > 0.0, "no neuron-cache traffic counted");
    assert!(metric(&server, "conductor_neuron_cache_read_bytes_total") > 0.0);
    // A streamed answer's figures (what the chat page shows) hold the cache's share of it.
    let timings = streamed_timings(&server, None, 8);
    let cache = &timings["neuron_cache"];
    let (hits, misses) = (cache["hits"].as_f64(), cache["misses"].as_f64());
    let (hits, misses) = (hits.expect("hits"), misses.expect("misses"));
    assert!(hits + misses > 0.0, "{timings}");
    let rate = cache["hit_rate"].as_f64().expect("hit_rate");
    assert!((rate - hits / (hits + misses)).abs() < 1e-9, "{timings}");
    let bytes = cache["bytes_read"].as_f64().expect("bytes_read");
    assert_eq!(
        cache["bytes_read_per_token"].as_f64(),
        Some(bytes / 8.0),
        "{timings}"
    );
    let (_, _, props) = exchange(&server, "GET", "/props", None, "");
    let props: serde_json::Value = serde_json::from_str(&props).expect("JSON");
    assert!(
        props["memory"]["budget"].as_u64().is_some_and(|b| b > 0),
        "{props}"
    );
    assert!(
        props["memory"]["neuron_cache"]
            .as_u64()
            .is_some_and(|b| b > 0),
        "{props}"
    );
}

/// Continuous batching under a memory budget (a neuron store, `--memory 50% --parallel 4`):
/// the four slots' KV caches come out of the budget (the log says how it was split), four
/// greedy requests at once share decode steps and the one neuron cache, and each answer is
/// what `conductor run --chat --temp 0` prints for its prompt alone under the same budget.
#[test]
fn batched_requests_under_a_memory_budget_each_match_conductor_run() {
    let dir = common::ScratchDir::new("serve-budget-batch");
    let store = dir.store(
        &common::default_model(),
        &conductor::runtime::convert::ConvertOptions::default(),
    );
    let server = Server::start_with(&store, &["--memory", "50%", "--parallel", "4"]);
    let log = server.log_once_it_has(&[
        "(4 sessions × ",
        "structured output is unavailable: off under --memory",
    ]);
    assert!(
        log.contains("(4 sessions × ") && !log.contains("one at a time"),
        "the budget does not hold four sessions:\n{log}"
    );
    // llguidance's tables are not in the budget's split: structured output is off, and said.
    assert!(
        log.contains("structured output is unavailable: off under --memory"),
        "{log}"
    );
    let prompts = [
        "Name three colors.",
        "What is the capital of France? Answer in one sentence.",
        "List three fruits.",
        "Say hello.",
    ];
    if !each_batched_answer_is_conductor_runs(
        &server,
        &store,
        &["--memory", "50%", "-c", "256"],
        "16",
        &prompts,
        "batched under --memory 50%",
    ) {
        return;
    }
    assert!(metric(&server, "conductor_neuron_cache_misses_total") > 0.0);
}

/// A context given with `-c` that the budget cannot hold for every slot is refused at start,
/// naming the sessions and what would fit.
#[test]
fn a_budget_too_small_for_every_slot_is_refused_at_start() {
    let dir = common::ScratchDir::new("serve-budget-refused");
    let store = dir.store(
        &common::default_model(),
        &conductor::runtime::convert::ConvertOptions::default(),
    );
    let out = common::conductor()
        .args(["serve", "--port", "0", "-t", "1", "-m"])
        .arg(&store)
        .args(["--memory", "50%", "--parallel", "8", "-c", "2048"])
        .output()
        .expect("conductor serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("8 sessions of 2048 tokens") && stderr.contains("give at least"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Continuous batching: four greedy requests at once share decode steps (the metrics count
/// steps of several sequences), and each answer is what `conductor run --chat --temp 0`
/// prints for its prompt alone.
#[test]
fn concurrent_greedy_requests_are_batched_and_each_matches_conductor_run() {
    let model = common::default_model();
    let flags = ["-c", "1024"];
    let server = Server::start_with(&model, &["-c", "1024", "--parallel", "4"]);
    let prompts = [
        "Write a short poem about the sea.",
        "What is the capital of France? Answer in one sentence.",
        "List three fruits.",
        "Explain what a computer is to a child.",
    ];
    each_batched_answer_is_conductor_runs(&server, &model, &flags, "20", &prompts, "batched");
}

/// Issue 41: the same greedy request three times, then streamed, gives one answer, the one
/// `conductor run` prints. The repeats are served from a slot's cached prompt (prefix reuse
/// evaluates only its last token, alone), so this holds only if a position's logits do not
/// depend on how the tokens before it were evaluated.
#[test]
fn a_repeated_greedy_request_gives_one_answer_streamed_or_not() {
    let model = common::default_model();
    let server = Server::start_with(&model, &["-c", "1024", "--parallel", "4"]);
    let prompt = "Name three primary colors.";
    let want = run_greedy(&model, &["-c", "1024"], prompt, "24");
    assert!(!want.is_empty());
    for i in 0..3 {
        assert_eq!(chat(&server, prompt, 24, false), want, "request {i}");
    }
    assert_eq!(chat(&server, prompt, 24, true), want, "streamed");
    assert!(metric(&server, "conductor_prompt_tokens_cached_total") > 0.0);
}

/// Sends `prompts` to `server` at once (greedy, `n` tokens each) and holds each answer to what
/// `conductor run` with `run_flags` prints for its prompt alone. False where the Python client
/// is missing outside CI (`check`).
fn each_batched_answer_is_conductor_runs(
    server: &Server,
    model: &Path,
    run_flags: &[&str],
    n: &str,
    prompts: &[&str],
    label: &str,
) -> bool {
    let mut args = vec![n];
    args.extend(prompts);
    let Some(out) = check(server, "batched_greedy", &args) else {
        return false;
    };
    let served: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON line");
    eprintln!(
        "{label}: {} sequences in {} decode steps",
        served["sequences"], served["steps"]
    );
    for (i, prompt) in prompts.iter().enumerate() {
        let content = served["contents"][i].as_str().expect("content");
        assert!(!content.is_empty(), "{prompt}");
        assert_eq!(content, run_greedy(model, run_flags, prompt, n), "{prompt}");
    }
    true
}

/// With `--parallel 2 --queue 1`: two streams generate together while a third request waits;
/// the first stream's client leaving frees its slot for the third, and the second goes on.
#[test]
fn a_disconnect_frees_its_slot_while_the_batch_goes_on() {
    scenario(
        &["-c", "4096", "--parallel", "2", "--queue", "1"],
        "slots_and_disconnect",
        &["4000"],
    );
}

#[test]
fn concurrent_requests_all_complete_with_their_own_answers() {
    scenario(
        &["-c", "1024", "--parallel", "2", "--queue", "8"],
        "concurrent",
        &["6"],
    );
}

/// A bounded load: 8 clients, each sending its requests in turn. It stops by itself; every
/// request succeeds (none refused: the queue holds every client); the log gets throughput and
/// TTFT p50/p99 (informational: this is a functional test on a shared machine).
#[test]
fn a_bounded_load_of_eight_clients_has_no_errors() {
    let server = Server::start(&["-c", "1024", "--queue", "8"]);
    if let Some(out) = check(&server, "load", &["8", "3"]) {
        eprintln!("load: {}", out.trim());
    }
}

/// Flags that cannot work are refused before anything is served.
#[test]
fn serve_refuses_flags_that_cannot_work() {
    for (args, said) in [
        (&["--queue", "0"][..], "--queue must be at least 1"),
        (&["--parallel", "0"][..], "--parallel must be at least 1"),
        (&["-c", "1"][..], "-c must be at least 2"),
        (&["--api-key", ""][..], "--api-key is empty"),
        (
            &["--chat-template-file", "/nonexistent/template.jinja"][..],
            "reading the chat template /nonexistent/template.jinja",
        ),
    ] {
        let out = common::conductor()
            .arg("serve")
            .args(args)
            .output()
            .expect("conductor serve");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(said),
            "{args:?}: {stderr}"
        );
    }
    // A port in use is named.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = taken.local_addr().expect("its address").port().to_string();
    let out = common::conductor()
        .args(["serve", "-t", "1", "-c", "256", "--port", &port, "-m"])
        .arg(common::default_model())
        .output()
        .expect("conductor serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "{stderr}"
    );
}

#[test]
fn json_schema_output_parses_and_validates_and_a_bad_schema_is_a_400() {
    scenario(&["-c", "1024"], "schema", &[]);
}

/// Tool calls over the openai client, with Qwen 2.5's template (Hermes `<tool_call>` syntax)
/// in place of the default model's (which has no tools): `tool_choice` required, named and
/// streamed give calls whose arguments validate against the function's schema; a call and
/// its result go back to the model; bad tool requests are 400s and the server goes on.
#[test]
fn tool_calls_parse_and_validate_plainly_and_streamed_and_bad_tools_are_400s() {
    let template = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("runtime/tests/data/chat-templates/qwen2.5.jinja");
    let template = template.to_str().expect("a UTF-8 path");
    scenario(
        &["-c", "1024", "--chat-template-file", template],
        "tools",
        &[],
    );
}

/// The default model's own template does not render tools: a request offering some is a 400
/// (`tools_unsupported`); with `tool_choice: "none"` it is served.
#[test]
fn tools_on_a_template_without_them_are_refused() {
    scenario(&["-c", "512"], "tools_unsupported", &[]);
}

/// With `--queue 1`: one request generating, one waiting, the next refused with 429 and
/// `Retry-After`; the generating client leaving cancels its sequence and the waiting one runs.
#[test]
fn a_full_queue_answers_429_and_a_disconnect_frees_the_engine() {
    scenario(
        &["-c", "4096", "--queue", "1"],
        "queue_and_disconnect",
        &["4000"],
    );
}

#[test]
fn bad_input_gets_openai_errors_and_the_server_keeps_serving() {
    scenario(
        &[
            "-c",
            "512",
            "--max-body",
            "65536",
            "--api-key",
            "sk-test-key",
        ],
        "bad_input",
        &["512"],
    );
}

/// SIGTERM while a stream is running: the stream ends with an error event and the server
/// exits promptly and cleanly.
#[test]
fn sigterm_cancels_a_running_stream_and_exits_promptly() {
    let mut server = Server::start(&["-c", "4096", "--shutdown-grace", "3"]);
    let mut conn = long_story(&server, true);
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("a read timeout");
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while seen.windows(8).filter(|w| w == b"content\"").count() < 3 {
        let n = conn.read(&mut buf).expect("the stream flows");
        assert!(
            n > 0,
            "the stream ended early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    common::signal(&server.child, rustix::process::Signal::TERM);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = server.child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the server is still running 20 s after SIGTERM; log:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}; log:\n{}", server.log());
    // The stream ended: to EOF, with the error event saying why.
    let _ = conn.read_to_end(&mut seen);
    let text = String::from_utf8_lossy(&seen);
    assert!(text.contains("shutting down"), "{text}");
}

/// Sends a request for a 4000-token story over a raw connection (to hang up on, or to read as
/// it streams) and returns the connection.
fn long_story(server: &Server, stream: bool) -> std::net::TcpStream {
    let mut conn =
        std::net::TcpStream::connect(("127.0.0.1", server.port())).expect("connect to the server");
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":"Tell a long story."}}],"max_tokens":4000,"ignore_eos":true,"stream":{stream}}}"#
    );
    write!(
        conn,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send the request");
    conn
}

/// A client of a non-streamed request that hangs up: its generation stops (counted as
/// cancelled, far short of max_tokens) and the engine is free again.
#[test]
fn a_non_streamed_request_whose_client_hangs_up_is_cancelled() {
    let server = Server::start(&["-c", "4096"]);
    let conn = long_story(&server, false);
    let started = Instant::now();
    while metric(&server, "conductor_requests_running") < 1.0 {
        assert!(started.elapsed() < Duration::from_secs(60), "it never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(conn);
    while metric(&server, "conductor_requests_cancelled_total") < 1.0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the generation went on after its client left; log:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(metric(&server, "conductor_requests_running"), 0.0);
    assert!(metric(&server, "conductor_completion_tokens_total") < 4000.0);
    assert!(get(&server, "/health").contains("ok"));
}

/// The chat page: `/` is HTML with a Content-Security-Policy allowing only its own files; its
/// files have their types; an unknown one is a 404. With `--api-key` the page is public, but
/// `/props` (what it shows) is keyed like the API.
#[test]
fn the_chat_page_is_served_with_its_policy_and_its_calls_are_keyed() {
    let server = Server::start(&["-c", "512", "--api-key", "sk-page"]);
    let (status, headers, html) = exchange(&server, "GET", "/", None, "");
    assert_eq!(status, 200, "{html}");
    assert_eq!(header(&headers, "content-type"), "text/html; charset=utf-8");
    let csp = header(&headers, "content-security-policy");
    assert!(
        csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(header(&headers, "x-content-type-options"), "nosniff");
    assert!(
        html.contains("<script type=\"module\" src=\"/page/app.js\">"),
        "{html}"
    );
    for (file, kind, holds) in [
        ("app.js", "text/javascript; charset=utf-8", "import"),
        ("chat.js", "text/javascript; charset=utf-8", "export"),
        (
            "style.css",
            "text/css; charset=utf-8",
            "prefers-color-scheme",
        ),
    ] {
        let (status, headers, body) = exchange(&server, "GET", &format!("/page/{file}"), None, "");
        assert_eq!(status, 200, "{file}");
        assert_eq!(header(&headers, "content-type"), kind, "{file}");
        assert!(body.contains(holds), "{file}");
    }
    for missing in ["/page/nope.js", "/page/../Cargo.toml", "/page/"] {
        let (status, _, body) = exchange(&server, "GET", missing, None, "");
        assert_eq!(status, 404, "{missing}: {body}");
    }
    let (status, _, _) = exchange(&server, "GET", "/props", None, "");
    assert_eq!(status, 401);
    let (status, _, _) = exchange(&server, "GET", "/props", Some("sk-wrong"), "");
    assert_eq!(status, 401);
    let (status, _, props) = exchange(&server, "GET", "/props", Some("sk-page"), "");
    assert_eq!(status, 200, "{props}");
    let props: serde_json::Value = serde_json::from_str(&props).expect("JSON");
    assert_eq!(props["n_ctx"], 512);
    assert_eq!(props["slots"], 1);
    assert!(props["memory"].is_null(), "{props}");
    assert!(props["model"]
        .as_str()
        .is_some_and(|m| m.contains("SmolLM2")));
    // A streamed answer ends with the server's own figures for it.
    let timings = streamed_timings(&server, Some("sk-page"), 6);
    assert_eq!(timings["generated_tokens"], 6, "{timings}");
    assert!(timings["time_to_first_token_ms"]
        .as_f64()
        .is_some_and(|t| t > 0.0));
    assert!(timings["tokens_per_second"]
        .as_f64()
        .is_some_and(|t| t > 0.0));
    assert!(timings.get("neuron_cache").is_none(), "{timings}");
}

/// Streams a greedy answer of `n` tokens (`ignore_eos`) and returns the `timings` of its chunk
/// with the finish reason.
fn streamed_timings(server: &Server, key: Option<&str>, n: usize) -> serde_json::Value {
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":"Name three colors."}}],"max_tokens":{n},"ignore_eos":true,"temperature":0,"stream":true}}"#
    );
    let (status, _, events) = exchange(server, "POST", "/v1/chat/completions", key, &body);
    assert_eq!(status, 200, "{events}");
    events
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .find(|c| !c["choices"][0]["finish_reason"].is_null())
        .map(|c| c["timings"].clone())
        .unwrap_or_else(|| panic!("no finishing chunk in\n{events}"))
}

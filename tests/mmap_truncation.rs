//! Item 7 of issue 28: a model file truncated under a running engine. The engine runs in a
//! child process (this test binary, run again in the child role), so that a `SIGBUS` would
//! kill the child and show as its exit status instead of taking the test harness down.
//!
//! - mapped (the default without a budget): the truncation happens between two steps; the
//!   next step fails with an error naming the file and the truncation, and the process lives.
//! - read into memory (`--no-mmap`): the next step gives the same bits as on an untouched file.
//! - mapped, generating through a token stream whose reader pauses (longer than
//!   `MODEL_FILE_CHECK_PAUSE`) while the file is cut: the stream's next token is that error.
//!
//! A file cut while a step reads the map still faults (`SIGBUS`); docs/reliability.md says so.

mod common;

use common::ScratchDir;
use conductor::runtime::sample::SamplingParams;
use conductor::{DriverKind, Engine, GenerateOptions, MODEL_FILE_CHECK_PAUSE};
use std::io::{BufRead, Write};
use std::path::Path;
use std::process::{Command, Stdio};

const ROLE: &str = "CONDUCTOR_TRUNCATION_CHILD";
const PROMPT: [u32; 5] = [3, 17, 42, 5, 99];

fn engine(path: &Path, mmap: bool) -> Engine {
    Engine::builder()
        .model(path)
        .mmap(mmap)
        .driver(DriverKind::Inline)
        .threads(1)
        .on_progress(|_| {})
        .build()
        .unwrap()
}

fn crc(logits: &[f32]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    logits
        .iter()
        .for_each(|x| h.update(&x.to_bits().to_le_bytes()));
    h.finalize()
}

/// The child: loads the model, runs the prompt, says `ready`, waits for a line on stdin (the
/// parent truncates the file meanwhile), runs one more step and prints how it went.
fn child(path: &Path, mode: &str) {
    if mode == "stream" {
        return stream_child(path);
    }
    let mut e = engine(path, mode == "mmap");
    let mut session = e.session(Some(32)).unwrap();
    e.eval_last(&mut session, &PROMPT).unwrap();
    // libtest prints `test NAME ... ` first, without a newline: the markers are looked for
    // inside lines.
    println!("child-ready");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    match e.eval_last(&mut session, &[7]) {
        Ok(logits) => println!("step ok {:08x}", crc(logits)),
        Err(err) => println!("step err {}", chain(&err)),
    }
    std::io::stdout().flush().unwrap();
}

/// An error and its sources, one line.
fn chain(err: &dyn std::error::Error) -> String {
    let mut why = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        why.push_str(&format!(": {s}"));
        source = s.source();
    }
    why
}

/// The child of the stream mode: a mapped model generating through a token stream, two
/// tokens (one step) taken before `ready`, the next one after the pause.
fn stream_child(path: &Path) {
    let mut e = engine(path, true);
    let mut session = e.session(Some(32)).unwrap();
    let options = GenerateOptions {
        max_tokens: 8,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
    };
    let mut stream = e.stream(&mut session, &PROMPT, &options).unwrap();
    for _ in 0..2 {
        stream.next().unwrap().unwrap();
    }
    println!("child-ready");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    match stream.next() {
        Some(Ok(piece)) => println!("step ok {:?}", piece.token),
        Some(Err(err)) => println!("step err {}", chain(&err)),
        None => println!("step ended"),
    }
    std::io::stdout().flush().unwrap();
}

#[test]
fn a_model_file_truncated_under_a_running_engine_fails_the_next_step_or_is_not_seen() {
    if let Ok(role) = std::env::var(ROLE) {
        let (mode, path) = role.split_once(':').unwrap();
        child(Path::new(path), mode);
        return;
    }
    let dir = ScratchDir::new("mmap-truncation");
    let source = dir.small_model(7);
    let reference = {
        let mut e = engine(&source, false);
        let mut session = e.session(Some(32)).unwrap();
        e.eval_last(&mut session, &PROMPT).unwrap();
        format!("{:08x}", crc(e.eval_last(&mut session, &[7]).unwrap()))
    };
    for mode in ["mmap", "read", "stream"] {
        let victim = dir.join(&format!("victim-{mode}.gguf"));
        std::fs::copy(&source, &victim).unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_model_file_truncated_under_a_running_engine_fails_the_next_step_or_is_not_seen",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE, format!("{mode}:{}", victim.display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while !line.contains("child-ready") {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "{mode}: child ended before ready"
            );
        }
        // Cut the file to its first tenth: the tensors' pages are gone.
        let len = std::fs::metadata(&victim).unwrap().len();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&victim)
            .unwrap();
        f.set_len(len / 10).unwrap();
        drop(f);
        // A reader's pause: longer than a stream lets go unchecked.
        std::thread::sleep(MODEL_FILE_CHECK_PAUSE * 20);
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "go").unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
        let status = child.wait().unwrap();
        assert!(
            status.success(),
            "{mode}: the child died ({status}; a SIGBUS is signal 7): {rest}"
        );
        let step = rest
            .lines()
            .find_map(|l| l.find("step ").map(|at| &l[at..]))
            .unwrap_or_else(|| panic!("{mode}: no step line in {rest}"));
        if mode != "read" {
            assert!(
                step.starts_with("step err")
                    && step.contains("truncated")
                    && step.contains(&victim.display().to_string()),
                "{step}"
            );
        } else {
            assert_eq!(step, format!("step ok {reference}"));
        }
    }
}

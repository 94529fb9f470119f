//! Speculative decoding (issue 43): drafted tokens verified in one step give exactly the tokens
//! of plain decoding, greedy and sampled, on both drivers, on the default model (Q4_1) and a
//! Q4_K_M file, in memory and under a budget; and the drafts really are used (each test checks
//! that tokens were drafted and kept, so a drafter that silently never drafts fails it).

mod common;

use common::ScratchDir;
use conductor::profile::{profile_model, ProfileOptions};
use conductor::runtime::cache::MemoryBudget;
use conductor::runtime::convert::ConvertOptions;
use conductor::runtime::sample::SamplingParams;
use conductor::runtime::sparse::profile::ModelProfile;
use conductor::runtime::sparse::SparsityMode;
use conductor::{
    DraftLimits, Drafter, DriverKind, Engine, Error, GenerateOptions, GenerationStats,
    ModelDrafter, NgramDrafter, SparsitySettings, Speculation,
};
use std::ops::ControlFlow;
use std::path::Path;

/// A chat request the model answers by copying: drafts find their continuations in it.
const COPY_PROMPT: &str = "Copy this Python function exactly:\ndef add_numbers(first, second):\n    total = first + second\n    return total";

/// Code that repeats itself, as code does: prompt lookup finds continuations in it.
const PROMPT: &str = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a * b\n\ndef div(a, b):\n";

fn engine(path: &Path, driver: DriverKind, memory: Option<MemoryBudget>) -> Engine {
    let mut builder = Engine::builder()
        .model(path)
        .threads(2)
        .driver(driver)
        // A step verifies up to 8 drafted tokens (under a budget their logits are held out).
        .step_logits(9)
        .on_progress(|_| {});
    if let Some(memory) = memory {
        builder = builder.memory(memory);
    }
    builder.build().unwrap()
}

/// Sampling at llama.cpp's defaults, with a repetition penalty or without (which discourages
/// the repeats prompt lookup finds).
fn sampled(repeat_penalty: f32) -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        repeat_penalty,
        seed: 7,
        ..SamplingParams::default()
    }
}

/// The tokens `engine` generates for `PROMPT`, with `draft` if any.
fn generate(
    engine: &mut Engine,
    sampling: &SamplingParams,
    n: usize,
    draft: Option<&mut Speculation>,
) -> (Vec<u32>, GenerationStats) {
    let prompt = engine.tokenize(PROMPT);
    let mut session = engine.session(Some(512)).unwrap();
    let options = GenerateOptions {
        max_tokens: n,
        sampling: sampling.clone(),
        ignore_eos: true,
    };
    let stats = engine
        .generate_with_draft(&mut session, &prompt, &options, draft, &mut |_| {
            ControlFlow::Continue(())
        })
        .unwrap();
    (stats.generated.clone(), stats)
}

/// Prompt lookup, unpaced: which steps draft does not depend on timing, so the counts of
/// drafts below are the same on any machine.
fn ngram(max: usize) -> Speculation {
    Speculation::new(
        Box::new(NgramDrafter::default()),
        DraftLimits::new(max, 1).unwrap(),
    )
    .unpaced()
}

/// Plain decoding and decoding with prompt-lookup drafts of `path` give the same tokens.
fn ngram_keeps_the_tokens(
    path: &Path,
    driver: DriverKind,
    memory: Option<MemoryBudget>,
    draft_maxes: &[usize],
) {
    let mut engine = engine(path, driver, memory);
    for sampling in [SamplingParams::greedy(), sampled(1.0)] {
        let (plain, plain_stats) = generate(&mut engine, &sampling, 48, None);
        assert_eq!(plain_stats.draft_steps, 0);
        let mut verified = 0;
        for &max in draft_maxes {
            let mut draft = ngram(max);
            let (drafted, stats) = generate(&mut engine, &sampling, 48, Some(&mut draft));
            let what = format!("{} {driver:?} draft-max {max} {sampling:?}", path.display());
            assert_eq!(drafted, plain, "{what}");
            verified += stats.drafted;
            assert_eq!(
                stats.decoded_tokens(),
                drafted.len() - 1,
                "{what}: {stats:?}"
            );
            if sampling.temperature == 0.0 {
                // Greedy on repeating code: some drafts must be right.
                assert!(stats.draft_accepted > 0, "{what}: {stats:?}");
                assert!(
                    stats.decode_evals < plain_stats.decode_evals,
                    "{what}: {stats:?}"
                );
            }
        }
        // Paced by the clock (the CLI's drafts): other steps may draft, the same tokens.
        let mut paced = Speculation::new(Box::new(NgramDrafter::default()), DraftLimits::default());
        let (drafted, _) = generate(&mut engine, &sampling, 48, Some(&mut paced));
        assert_eq!(drafted, plain, "{} {driver:?} paced", path.display());
        // Sampled text repeats less, but some drafts must have been verified.
        assert!(verified > 0, "{} {driver:?} {sampling:?}", path.display());
    }
}

#[test]
fn ngram_drafts_keep_the_default_models_tokens_on_both_drivers() {
    for driver in [DriverKind::Actors, DriverKind::Inline] {
        ngram_keeps_the_tokens(&common::default_model(), driver, None, &[1, 3, 8]);
    }
}

#[test]
fn ngram_drafts_keep_a_q4_k_m_models_tokens() {
    ngram_keeps_the_tokens(&common::gemma3_model(), DriverKind::Actors, None, &[1, 8]);
}

#[test]
fn ngram_drafts_keep_the_tokens_under_a_memory_budget() {
    let dir = ScratchDir::new("speculative-budget");
    let store = dir.store(&common::default_model(), &ConvertOptions::default());
    let budget = Some(MemoryBudget::PercentOfModel(50.0));
    ngram_keeps_the_tokens(&store, DriverKind::Actors, budget, &[8]);
    // Under a budget the drafted tokens' logits need room held in it: an engine built
    // without any refuses a draft rather than go over its budget.
    let mut engine = Engine::builder()
        .model(&store)
        .threads(1)
        .memory(MemoryBudget::PercentOfModel(50.0))
        .on_progress(|_| {})
        .build()
        .unwrap();
    let err = draft_refused(&mut engine, &mut ngram(4));
    assert!(matches!(err, Error::DraftNoRoom), "{err}");
}

/// `--draft self`: under a budget the target drafts for itself from what the budget keeps
/// resident (its cache's hot segment, reading nothing). The tokens are those of plain
/// decoding, greedy and sampled, on both drivers and on a Q4_K_M store; drafts are made, and
/// kept on greedy code. The budgets keep some units and stream the others (these small
/// models' fixed parts take most of a half-size budget, whose drafts would rarely be kept).
/// In memory, where everything is resident, it is refused.
#[test]
fn resident_drafts_keep_the_tokens_under_a_memory_budget() {
    let dir = ScratchDir::new("speculative-resident");
    let resident = || Speculation::resident(DraftLimits::new(8, 1).unwrap()).unpaced();
    let cases = [
        (common::default_model(), DriverKind::Actors, 115.0),
        (common::default_model(), DriverKind::Inline, 115.0),
        (common::gemma3_model(), DriverKind::Actors, 80.0),
    ];
    for (model, driver, percent) in cases {
        let store = dir.store(&model, &ConvertOptions::default());
        let budget = Some(MemoryBudget::PercentOfModel(percent));
        let mut engine = engine(&store, driver, budget);
        for sampling in [SamplingParams::greedy(), sampled(1.0)] {
            let what = format!("{} {driver:?} {sampling:?}", model.display());
            let (plain, _) = generate(&mut engine, &sampling, 32, None);
            let before = engine.cache_report().unwrap().loads;
            let (drafted, stats) = generate(&mut engine, &sampling, 32, Some(&mut resident()));
            assert_eq!(drafted, plain, "{what}");
            assert!(stats.drafted > 0, "{what}: {stats:?}");
            if sampling.temperature == 0.0 {
                assert!(stats.draft_accepted > 0, "{what}: {stats:?}");
            }
            // Drafting read nothing: the loads are the verifying steps' alone, fewer than
            // one-token steps would read (each reads every unit the budget does not keep).
            let loads = engine.cache_report().unwrap().loads - before;
            let (_, again) = generate(&mut engine, &sampling, 32, None);
            let plain_loads = engine.cache_report().unwrap().loads - before - loads;
            assert!(
                0 < loads && loads < plain_loads,
                "{what}: {loads} against {plain_loads}, {again:?}"
            );
        }
    }
    let mut in_memory = engine(&common::default_model(), DriverKind::Inline, None);
    let err = draft_refused(&mut in_memory, &mut resident());
    assert!(matches!(err, Error::DraftSelfInMemory), "{err}");
}

/// Why `engine` refuses `draft`'s drafts for a stream.
fn draft_refused(engine: &mut Engine, draft: &mut Speculation) -> Error {
    let prompt = engine.tokenize(PROMPT);
    let mut session = engine.session(Some(128)).unwrap();
    let options = GenerateOptions {
        max_tokens: 4,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
    };
    let stream = engine.stream(&mut session, &prompt, &options).unwrap();
    stream.with_draft(draft).err().unwrap()
}

/// A draft model decoding greedily: the default model drafting for itself agrees with itself
/// on every greedy token, so nearly every draft is kept, and the tokens are the target's. With
/// a head over the first quarter of the vocabulary (`--draft-vocab`) too: the tokens it leaves
/// out are never drafted, the output is the same.
#[test]
fn a_draft_model_keeps_the_targets_tokens() {
    let path = common::default_model();
    let mut target = engine(&path, DriverKind::Actors, None);
    let quarter = target.tokenizer().n_vocab() as u32 / 4;
    for head in [None, Some(quarter)] {
        for sampling in [SamplingParams::greedy(), sampled(1.1)] {
            let (plain, _) = generate(&mut target, &sampling, 40, None);
            let mut builder = Engine::builder()
                .model(&path)
                .threads(2)
                .driver(DriverKind::Inline)
                .on_progress(|_| {});
            if let Some(n) = head {
                builder = builder.output_vocab(n);
            }
            let drafter = ModelDrafter::new(&target, builder.build().unwrap(), 512).unwrap();
            let limits = DraftLimits::default();
            let mut speculation = Speculation::new(Box::new(drafter), limits).unpaced();
            let (drafted, stats) = generate(&mut target, &sampling, 40, Some(&mut speculation));
            assert_eq!(drafted, plain, "{head:?} {sampling:?}");
            assert!(stats.draft_accepted > 0, "{head:?} {stats:?}");
            if sampling.temperature == 0.0 && head.is_none() {
                // The draft is the target: every drafted token it was confident of is right.
                assert_eq!(stats.draft_accepted, stats.drafted, "{stats:?}");
            }
        }
    }
}

/// What a drafter was asked: `prime` or `draft`, and the tokens it was handed.
type Calls = std::sync::Arc<std::sync::Mutex<Vec<(&'static str, Vec<u32>)>>>;

/// Records what the engine hands a drafter, and drafts what prompt lookup would.
struct Recording {
    calls: Calls,
}

impl Drafter for Recording {
    fn prime(&mut self, history: &[u32]) -> Result<(), Error> {
        self.calls.lock().unwrap().push(("prime", history.to_vec()));
        Ok(())
    }

    fn draft(&mut self, context: &[u32], max: usize, out: &mut Vec<u32>) -> Result<(), Error> {
        self.calls.lock().unwrap().push(("draft", context.to_vec()));
        NgramDrafter::default().draft(context, max, out)
    }
}

/// A drafter reads each generation's prompt once, before its first draft (a draft model's
/// prefill, charged to the prompt), and each draft then sees that prompt and what followed.
#[test]
fn a_drafter_reads_each_prompt_before_its_first_draft() {
    let mut target = engine(&common::default_model(), DriverKind::Inline, None);
    let prompt = target.tokenize(PROMPT);
    let calls = Calls::default();
    let drafter = Recording {
        calls: std::sync::Arc::clone(&calls),
    };
    let mut speculation = Speculation::new(Box::new(drafter), DraftLimits::default()).unpaced();
    for _ in 0..2 {
        let (tokens, _) = generate(
            &mut target,
            &SamplingParams::greedy(),
            12,
            Some(&mut speculation),
        );
        let calls = std::mem::take(&mut *calls.lock().unwrap());
        assert_eq!(calls[0], ("prime", prompt.clone()), "{calls:?}");
        assert!(calls.len() > 1 && calls[1..].iter().all(|(what, _)| *what == "draft"));
        for (_, context) in &calls[1..] {
            assert!(context.starts_with(&prompt) && context.len() > prompt.len());
            let made = &context[prompt.len()..];
            assert!(
                tokens.starts_with(made),
                "{made:?} is not a start of {tokens:?}"
            );
        }
    }
}

#[test]
fn a_draft_with_another_vocabulary_is_refused_naming_both_sizes() {
    let target = engine(&common::default_model(), DriverKind::Inline, None);
    let draft = engine(&common::gemma3_model(), DriverKind::Inline, None);
    let err = ModelDrafter::new(&target, draft, 512).err().unwrap();
    let text = err.to_string();
    assert!(matches!(err, Error::DraftVocabulary { .. }), "{text}");
    assert!(text.contains("49152") && text.contains("262144"), "{text}");
}

/// A step of several tokens computes every FFN neuron; sparse decode would not keep its bits,
/// so a sparse engine refuses a draft rather than change its output.
#[test]
fn sparse_decode_refuses_a_draft() {
    let dir = ScratchDir::new("speculative-sparse");
    let model = dir.small_model(3);
    let mut dense = engine(&model, DriverKind::Inline, None);
    let options = ProfileOptions {
        ctx: 64,
        max_tokens: 512,
        reference_sparsity: 0.3,
        predictors: None,
        threads: 1,
    };
    let text = common::random_words(5, 600);
    let profile = profile_model(&mut dense, &text, "test", &options, &|_, _| {}).unwrap();
    profile.save(&ModelProfile::default_path(&model)).unwrap();
    let mut engine = Engine::builder()
        .model(&model)
        .threads(1)
        .sparsity(SparsitySettings {
            mode: Some(SparsityMode::Threshold),
            target: Some(0.3),
            ..SparsitySettings::default()
        })
        .on_progress(|_| {})
        .build()
        .unwrap();
    assert!(engine.model().sparse().is_some());
    let err = draft_refused(&mut engine, &mut ngram(4));
    assert!(matches!(err, Error::DraftNeedsDense), "{err}");
}

/// `serve --draft ngram`: a request running alone verifies drafts; answers are what
/// `conductor run` prints without a draft, plainly, streamed, and with a second request
/// running beside it (whose steps are shared, undrafted); `/metrics` and the answer's
/// `timings` count the drafted and kept tokens.
#[test]
fn a_server_with_ngram_drafts_answers_as_run_without_and_counts_them() {
    use common::server::{chat, exchange, metric, run_greedy, Server};
    let model = common::default_model();
    let server = Server::start_with(
        &model,
        &["-c", "1024", "--parallel", "2", "--draft", "ngram"],
    );
    let copy = COPY_PROMPT;
    let other = "List three fruits.";
    let want = run_greedy(&model, &["-c", "1024"], copy, "48");
    assert!(!want.is_empty());
    assert_eq!(chat(&server, copy, 48, false), want, "not streamed");
    assert_eq!(chat(&server, copy, 48, true), want, "streamed");
    let (steps, drafted, kept) = (
        metric(&server, "conductor_draft_steps_total"),
        metric(&server, "conductor_draft_tokens_total"),
        metric(&server, "conductor_draft_accepted_tokens_total"),
    );
    assert!(
        steps > 0.0 && kept > 0.0 && kept <= drafted,
        "{steps} {drafted} {kept}"
    );

    // Beside another request: the steps they share decode one token each.
    let want_other = run_greedy(&model, &["-c", "1024"], other, "24");
    let answers = std::thread::scope(|s| {
        let a = s.spawn(|| chat(&server, copy, 48, false));
        let b = s.spawn(|| chat(&server, other, 24, true));
        (a.join().expect("a"), b.join().expect("b"))
    });
    assert_eq!(answers, (want.clone(), want_other));

    // A non-streamed answer carries its figures too.
    let body = serde_json::json!({
        "messages": [{"role": "user", "content": copy}],
        "temperature": 0,
        "max_tokens": 48,
    })
    .to_string();
    let (status, _, reply) = exchange(&server, "POST", "/v1/chat/completions", None, &body);
    assert_eq!(status, 200, "{reply}");
    let reply: serde_json::Value = serde_json::from_str(&reply).expect("JSON");
    assert_eq!(reply["choices"][0]["message"]["content"], want.as_str());
    let draft = &reply["timings"]["draft"];
    let (drafted, kept) = (draft["drafted"].as_f64(), draft["accepted"].as_f64());
    let (drafted, kept) = (drafted.expect("drafted"), kept.expect("accepted"));
    assert!(kept <= drafted, "{draft}");
    let rate = draft["acceptance_rate"].as_f64().expect("acceptance_rate");
    assert!(
        (rate - if drafted > 0.0 { kept / drafted } else { 0.0 }).abs() < 1e-9,
        "{draft}"
    );
    let steps = draft["steps"].as_f64().expect("steps");
    let per_step = draft["mean_accepted_per_step"]
        .as_f64()
        .expect("mean_accepted_per_step");
    assert!(
        (per_step - if steps > 0.0 { kept / steps } else { 0.0 }).abs() < 1e-9,
        "{draft}"
    );
}

/// `--draft MODEL` under `--memory`: the draft model is held in memory beside the target, out
/// of the budget. A budget too small for both says how much both need, to the MiB: with that
/// much the run goes, and prints what the target prints alone under the same budget.
#[test]
fn a_draft_model_under_a_budget_takes_its_share_and_a_short_budget_says_how_much() {
    let dir = ScratchDir::new("spec-draft-budget");
    let source = common::default_model();
    let store = dir.store(&source, &ConvertOptions::default());
    let run = |memory: &str, draft: bool| {
        let mut cmd = common::conductor();
        cmd.args([
            "run", "--chat", "--temp", "0", "-t", "2", "-n", "24", "-c", "256",
        ])
        .args(["--memory", memory, "-p", COPY_PROMPT, "-m"])
        .arg(&store);
        if draft {
            cmd.arg("--draft").arg(&source);
        }
        let out = cmd.output().expect("conductor run");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!stderr.contains("panicked"), "{stderr}");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr,
        )
    };
    let (ok, _, stderr) = run("50%", true);
    assert!(!ok, "{stderr}");
    let need: u64 = stderr
        .split("give at least ")
        .nth(1)
        .and_then(|rest| rest.split(" MiB").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no amount in: {stderr}"));
    assert!(stderr.contains("the draft model"), "{stderr}");
    let short = format!("{}MiB", need - 1);
    let (ok, _, stderr) = run(&short, true);
    assert!(!ok, "{short}: {stderr}");
    let enough = format!("{need}MiB");
    let (ok, drafted, stderr) = run(&enough, true);
    assert!(ok, "{enough}: {stderr}");
    assert!(stderr.contains("held for the draft model"), "{stderr}");
    assert!(stderr.contains("draft = "), "no drafted steps: {stderr}");
    let (ok, alone, stderr) = run(&enough, false);
    assert!(ok, "{stderr}");
    assert_eq!(drafted, alone);
}

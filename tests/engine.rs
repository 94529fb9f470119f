//! The embedding API: streaming, cancellation, limits, sessions.

use conductor::runtime::sample::SamplingParams;
use conductor::runtime::synthetic::{synthetic_model, SyntheticSpec};
use conductor::{DriverKind, Engine, GenerateOptions, StopReason};
use std::ops::ControlFlow;

fn engine() -> (Engine, std::path::PathBuf) {
    engine_with(DriverKind::Actors, "a")
}

fn engine_with(driver: DriverKind, tag: &str) -> (Engine, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!(
        "conductor-engine-test-{}-{tag}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("small.gguf");
    synthetic_model(&SyntheticSpec::default())
        .unwrap()
        .write_file_atomic(&path)
        .unwrap();
    let engine = Engine::builder()
        .model(&path)
        .threads(2)
        .driver(driver)
        .build()
        .unwrap();
    assert_eq!(engine.driver_kind(), driver);
    (engine, dir)
}

#[test]
fn token_streams_match_callbacks_and_drivers_and_cancel_when_dropped() {
    let (mut actors, dir_a) = engine_with(DriverKind::Actors, "s1");
    let (mut inline, dir_b) = engine_with(DriverKind::Inline, "s2");
    let prompt = actors.tokenize("gh ij");

    let mut session = actors.session(Some(64)).unwrap();
    let pieces: Vec<_> = actors
        .stream(&mut session, &prompt, &options(6))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(pieces.len(), 6);
    let tokens: Vec<u32> = pieces.iter().filter_map(|p| p.token).collect();
    let text: String = pieces.iter().map(|p| p.text.as_str()).collect();
    assert_eq!(text, actors.tokenizer().decode(&tokens));

    // The inline driver generates the same tokens.
    let mut other = inline.session(Some(64)).unwrap();
    let stats = inline
        .generate(&mut other, &prompt, &options(6), &mut |_| {
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(stats.generated, tokens);

    // Taking two tokens and dropping the stream evaluates one: the session holds the prompt
    // and the one token evaluated after it.
    let mut short = actors.session(Some(64)).unwrap();
    let mut stream = actors.stream(&mut short, &prompt, &options(50)).unwrap();
    let first: Vec<u32> = stream
        .by_ref()
        .take(2)
        .map(|p| p.unwrap().token.unwrap())
        .collect();
    assert_eq!(stream.stats().generated, first);
    drop(stream);
    assert_eq!(first, tokens[..2]);
    assert_eq!(short.n_past(), prompt.len() + 1);

    drop(actors); // stops the actors and joins their threads
    drop(inline);
    std::fs::remove_dir_all(dir_a).unwrap();
    std::fs::remove_dir_all(dir_b).unwrap();
}

fn options(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
    }
}

#[test]
fn generation_streams_stops_and_continues_a_session() {
    let (mut engine, dir) = engine();
    let prompt = engine.tokenize("ab cd ef");
    assert!(!prompt.is_empty());

    // Length limit.
    let mut session = engine.session(Some(64)).unwrap();
    let mut text = String::new();
    let stats = engine
        .generate(&mut session, &prompt, &options(5), &mut |t| {
            text.push_str(t);
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(stats.stop, StopReason::Length);
    assert_eq!(stats.generated.len(), 5);
    assert_eq!(stats.decode_evals, 4, "the last token needs no evaluation");
    assert_eq!(text, engine.tokenizer().decode(&stats.generated));
    // The session now holds the prompt and the evaluated tokens; it continues from there.
    assert_eq!(session.n_past(), prompt.len() + 4);

    // Cancellation from the callback.
    let mut fresh = engine.session(Some(64)).unwrap();
    let mut pieces = 0;
    let stats = engine
        .generate(&mut fresh, &prompt, &options(50), &mut |_| {
            pieces += 1;
            if pieces == 3 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!(stats.stop, StopReason::Cancelled);
    assert!(stats.generated.len() <= 50 && pieces == 3);

    // Same prompt, same settings, fresh session: same tokens (greedy is deterministic).
    let mut again = engine.session(Some(64)).unwrap();
    let first5 = engine
        .generate(&mut again, &prompt, &options(5), &mut |_| {
            ControlFlow::Continue(())
        })
        .unwrap()
        .generated;
    let mut check = engine.session(Some(64)).unwrap();
    let replay = engine
        .generate(&mut check, &prompt, &options(5), &mut |_| {
            ControlFlow::Continue(())
        })
        .unwrap()
        .generated;
    assert_eq!(first5, replay);

    // A full context is an error, and the session stays usable.
    let mut tiny = engine.session(Some(prompt.len())).unwrap();
    assert!(engine
        .generate(&mut tiny, &prompt, &options(10), &mut |_| {
            ControlFlow::Continue(())
        })
        .is_err());
    tiny.clear();
    assert!(engine.eval_last(&mut tiny, &prompt[..1]).is_ok());
    std::fs::remove_dir_all(dir).unwrap();
}

/// A session larger than any machine holds is an error from `session`, not an abort; the
/// default session of a model claiming 16M tokens of context is one the machine can reserve.
#[test]
fn contexts_no_machine_holds_are_errors_and_the_default_fits() {
    let dir = std::env::temp_dir().join(format!("conductor-engine-ctx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("long.gguf");
    let spec = SyntheticSpec {
        n_ctx: 1 << 24,
        ..SyntheticSpec::default()
    };
    synthetic_model(&spec)
        .unwrap()
        .write_file_atomic(&path)
        .unwrap();
    let engine = Engine::builder()
        .model(&path)
        .threads(1)
        .driver(DriverKind::Inline)
        .on_progress(|_| {})
        .build()
        .unwrap();
    assert!((1..=1 << 24).contains(&engine.default_context()));
    let session = engine.session(None).unwrap();
    assert_eq!(session.n_ctx(), engine.default_context());
    let e = engine.session(Some(1 << 60)).err().unwrap().to_string();
    assert!(e.contains("KV cache"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// `perplexity` scores a chunk's second half a few positions a step (so a large vocabulary's
/// logits are never held for the whole half): its figure is the one computed from a single
/// step over each chunk.
#[test]
fn perplexity_in_pieces_is_the_perplexity_of_one_step_per_chunk() {
    let (mut engine, dir) = engine_with(DriverKind::Inline, "ppl");
    let text = "ab cd ef gh ij kl mn op qr st uv wx yz ".repeat(40);
    let tokens = engine.tokenize(&text);
    // Chunks whose scored half (150 positions) takes several steps of logits.
    let n_ctx = 300;
    assert!(tokens.len() >= 2 * n_ctx, "{}", tokens.len());
    let got =
        conductor::perplexity::perplexity(&mut engine, &tokens, n_ctx, Some(2), &mut |_, _| {})
            .unwrap();
    let n_vocab = engine.model().config().n_vocab as usize;
    let (mut nll, mut scored) = (0f64, 0usize);
    for chunk in tokens.chunks_exact(n_ctx).take(2) {
        let mut c = chunk.to_vec();
        if let (true, Some(b)) = (engine.tokenizer().add_bos(), engine.tokenizer().bos()) {
            c[0] = b;
        }
        let mut session = engine.session(Some(n_ctx)).unwrap();
        let mut rows = Vec::new();
        engine
            .eval(&mut session, &c, n_ctx / 2, &mut |_, r| {
                rows.extend_from_slice(r)
            })
            .unwrap();
        // Summed per chunk, then over chunks, as `perplexity` sums.
        let mut chunk_nll = 0f64;
        for (i, logits) in rows.chunks_exact(n_vocab).enumerate() {
            let pos = n_ctx / 2 + i;
            if pos + 1 < n_ctx {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
                chunk_nll -= (logits[c[pos + 1] as usize] - max) as f64 - sum.ln();
                scored += 1;
            }
        }
        nll += chunk_nll;
    }
    assert_eq!(got.scored_tokens, scored);
    assert_eq!(got.perplexity, (nll / scored as f64).exp());
    std::fs::remove_dir_all(dir).ok();
}

//! The default model against llama.cpp's recorded outputs (`tests/data`, copied from the shared
//! references): greedy agreement, first-token logits and perplexity, through the CLI exactly as
//! a user runs them.

mod common;

/// Runs `conductor` with `args`; returns stdout, failing the test on a non-zero exit.
fn conductor(args: &[&str]) -> String {
    let out = common::conductor().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "conductor {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `a/b` → (a, b).
fn ratio(s: &str) -> (f64, f64) {
    let (a, b) = s.split_once('/').unwrap();
    (a.parse().unwrap(), b.parse().unwrap())
}

#[test]
fn check_refs_agrees_on_confident_positions_and_first_token_logits() {
    let model = common::default_model();
    let refs = common::data("greedy-public.jsonl");
    let out = conductor(&[
        "check-refs",
        "-m",
        model.to_str().unwrap(),
        "--refs",
        refs.to_str().unwrap(),
    ]);
    // refs: confident A/B, all C/D, free-running identical I/N, first-token top-5 max |dlogit| E
    let summary = out.lines().find(|l| l.starts_with("refs: ")).expect(&out);
    let words: Vec<&str> = summary.split_whitespace().collect();
    let (agree, confident) = ratio(words[2].trim_end_matches(','));
    let (_, positions) = ratio(words[4].trim_end_matches(','));
    let dlogit: f64 = words.last().unwrap().parse().unwrap();
    assert_eq!(positions, 8.0 * 64.0, "{summary}");
    assert!(confident > 400.0, "{summary}");
    assert!(agree / confident >= 0.99, "{summary}");
    assert!(dlogit <= 0.5, "{summary}");
}

#[test]
fn perplexity_on_persuasion_is_within_one_percent_of_llama_cpp() {
    // llama-perplexity -c 512 on this text: 29.8344 ± 0.5424 (shared refs README).
    const LLAMA_CPP_PPL: f64 = 29.8344;
    let model = common::default_model();
    let text = common::data("ppl.txt");
    let out = conductor(&[
        "perplexity",
        "-m",
        model.to_str().unwrap(),
        "-f",
        text.to_str().unwrap(),
        "-c",
        "512",
    ]);
    let line = out
        .lines()
        .find(|l| l.starts_with("Final estimate: PPL = "))
        .expect(&out);
    let ppl: f64 = line.split_whitespace().nth(4).unwrap().parse().unwrap();
    let off = (ppl - LLAMA_CPP_PPL).abs() / LLAMA_CPP_PPL;
    assert!(
        off < 0.01,
        "PPL {ppl} is {:.2}% from llama.cpp's",
        off * 100.0
    );
}

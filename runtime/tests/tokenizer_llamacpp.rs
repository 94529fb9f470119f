//! The tokenizer against llama.cpp on small synthetic vocabularies.
//!
//! `data/tokenizer/{bpe,spm}_synthetic.json` hold made-up vocabularies and, for several
//! configurations of each (pre-tokenizer, add_bos, ...), what llama.cpp produced for a list of
//! texts: token ids for every (add_special, parse_special), detokenizations, every token's piece
//! and the end-of-generation tokens. `data/tokenizer/gen/make_fixtures.py` regenerates them.

use conductor_runtime::tokenizer::{Tokenizer, TokenizerSpec};
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/data/tokenizer/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .expect("list")
        .iter()
        .map(|x| x.as_str().expect("string").to_string())
        .collect()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Bytes of a detokenization: text, or `{"hex": ..}` where it is not UTF-8.
fn detok_bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::String(s) => s.as_bytes().to_vec(),
        other => hex(other["hex"].as_str().expect("hex detokenization")),
    }
}

fn spec(vocab: &Value, config: &Value) -> TokenizerSpec {
    let id = |k: &str| vocab.get(k).and_then(Value::as_u64).map(|x| x as u32);
    let flag = |k: &str| config.get(k).and_then(Value::as_bool);
    TokenizerSpec {
        model: vocab["model"].as_str().unwrap().to_string(),
        pre: config.get("pre").and_then(Value::as_str).map(String::from),
        tokens: strings(&vocab["tokens"]),
        token_types: Some(
            vocab["token_types"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_i64().unwrap() as i32)
                .collect(),
        ),
        scores: vocab.get("scores").map(|s| {
            s.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        }),
        merges: vocab.get("merges").map(strings),
        bos: id("bos"),
        eos: id("eos"),
        unk: id("unk"),
        add_bos: flag("add_bos"),
        add_eos: flag("add_eos"),
        add_space_prefix: flag("add_space_prefix"),
        ..Default::default()
    }
}

/// Checks every record of a fixture file; returns how many comparisons were made.
fn check_fixture(name: &str) -> usize {
    let fx = fixture(name);
    let texts = strings(&fx["texts"]);
    let mut failures = Vec::new();
    let mut checked = 0;
    for variant in fx["variants"].as_array().unwrap() {
        let config = &variant["config"];
        let tok = Tokenizer::new(spec(&fx["vocab"], config)).expect("tokenizer");
        assert_eq!(
            tok.bos(),
            variant["bos"].as_u64().map(|x| x as u32),
            "{config}"
        );
        assert_eq!(
            tok.eos(),
            variant["eos"].as_u64().map(|x| x as u32),
            "{config}"
        );
        assert_eq!(
            tok.add_bos(),
            variant["add_bos"].as_bool().unwrap(),
            "{config}"
        );
        assert_eq!(
            tok.add_eos(),
            variant["add_eos"].as_bool().unwrap(),
            "{config}"
        );
        assert_eq!(tok.eog_tokens(), ids(&fx["eog"]), "{config}");
        for (id, pair) in fx["pieces"].as_array().unwrap().iter().enumerate() {
            for (special, expected) in [(false, &pair[0]), (true, &pair[1])] {
                let got = tok.token_to_piece(id as u32, special);
                if got != hex(expected.as_str().unwrap()) {
                    failures.push(format!("{config} piece {id} special={special}: {got:?}"));
                }
                checked += 1;
            }
        }
        for (text, case) in texts.iter().zip(variant["cases"].as_array().unwrap()) {
            for (add, parse) in [(false, false), (false, true), (true, false), (true, true)] {
                let key = format!("ids_{}{}", add as u8, parse as u8);
                let expected = ids(&case[&key]);
                let got = tok.encode(text, add, parse);
                if got != expected {
                    failures.push(format!(
                        "{config} {text:?} {key}: got {got:?}, llama.cpp {expected:?}"
                    ));
                }
                checked += 1;
            }
            // Detokenize llama.cpp's (add_special, parse_special) ids.
            let toks = ids(&case["ids_11"]);
            for (i, expected) in case["detok"].as_array().unwrap().iter().enumerate() {
                let (remove_special, unparse_special) = (i & 2 != 0, i & 1 != 0);
                let got = tok
                    .detokenize(&toks, remove_special, unparse_special)
                    .unwrap();
                if got != detok_bytes(expected) {
                    failures.push(format!(
                        "{config} {text:?} detokenize({remove_special}, {unparse_special}): {:?}",
                        String::from_utf8_lossy(&got)
                    ));
                }
                checked += 1;
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches, first:\n{}",
        failures.len(),
        failures[..failures.len().min(10)].join("\n")
    );
    checked
}

#[test]
fn tokenizer_byte_level_bpe_matches_llama_cpp() {
    // 11 configurations (pre-tokenizers smollm, gpt-2, llama-bpe, qwen2, qwen35, default,
    // starcoder, deepseek-llm, deepseek-coder, falcon, gpt-4o) of a 632-token vocabulary.
    let n = check_fixture("bpe_synthetic.json");
    assert!(n > 10_000, "{n}");
}

#[test]
fn tokenizer_sentencepiece_matches_llama_cpp() {
    // With and without add_space_prefix, BOS and EOS; byte fallback, score ties.
    let n = check_fixture("spm_synthetic.json");
    assert!(n > 1_000, "{n}");
}

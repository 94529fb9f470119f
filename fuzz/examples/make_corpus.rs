//! Writes the seed corpus of every fuzz target into `fuzz/corpus/TARGET/`: `cargo run --release
//! --manifest-path fuzz/Cargo.toml --no-default-features --example make_corpus [-- --models]`.
//! The seeds that are not GGUF files are committed (run it again when a format changes); the
//! GGUF ones (`conductor_fuzz::seeds`) are ignored by git, and `--models` writes only them,
//! which `scripts/fuzz` does before libFuzzer runs.

use conductor_fuzz::seeds::{model_seeds, CHATML, LLAMA};
use conductor_runtime::plan::ExecutionPlan;
use std::path::{Path, PathBuf};

const LOOPS: &str = "{% set ns = namespace(n=0) %}{% for i in range(3) %}{% for j in range(i) %}{% set ns.n = ns.n + j %}{{ messages[0].content | tojson(indent=2) }}{% endfor %}{% endfor %}{{ ns.n }}{{ 'ab' * 3 }}{% macro f(x) %}{{ x | upper }}{% endmacro %}{{ f('x') }}{{ strftime_now('%Y') if strftime_now is defined }}";

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let put = |target: &str, name: &str, bytes: &[u8]| {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    };
    for (target, name, bytes) in model_seeds() {
        put(target, name, &bytes);
    }
    if std::env::args().any(|a| a == "--models") {
        return;
    }
    put("chat_template", "chatml.jinja", CHATML.as_bytes());
    put("chat_template", "llama.jinja", LLAMA.as_bytes());
    put("chat_template", "loops.jinja", LOOPS.as_bytes());

    let dir = std::env::temp_dir().join(format!("conductor-corpus-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let at = |name: &str| -> PathBuf { dir.join(name) };
    let read = |p: &Path| std::fs::read(p).unwrap();
    let plan = ExecutionPlan::default();
    for ext in ["json", "toml", "bin"] {
        plan.to_file(&at(&format!("plan.{ext}"))).unwrap();
        put(
            "plan",
            &format!("default.{ext}"),
            &read(&at(&format!("plan.{ext}"))),
        );
    }
    let profiles = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../profiles");
    for name in ["build-machine.toml", "oneplus-12.toml"] {
        let text = std::fs::read_to_string(profiles.join(name)).unwrap();
        put("hardware_profile", name, text.as_bytes());
        let p = conductor_runtime::plan::HardwareProfile::from_toml(&text).unwrap();
        let json = serde_json::to_string(&p).unwrap();
        put(
            "hardware_profile",
            &name.replace(".toml", ".json"),
            json.as_bytes(),
        );
    }
    put(
        "activation_profile",
        "small.body",
        &activation_profile_body(),
    );
    put("trace_replay", "small.trace", &small_trace());

    std::fs::remove_dir_all(&dir).unwrap();
}

/// A two-layer profile of a 4-neuron model, as the body `activation_profile` wraps.
fn activation_profile_body() -> Vec<u8> {
    let layer = serde_json::json!({
        "importance": [1.0, 0.5, 0.25, 0.0],
        "thresholds": [0.0, 0.5],
        "kept_mass": [1.0, 0.75],
        "zero_fraction": 0.5,
        "frequency": [0.9, 0.5, 0.1, 0.0],
        "mean_abs": [1.0, 0.5, 0.2, 0.0],
        "mass_hot_share": 0.5,
        "levels": [{
            "target": 0.5,
            "threshold": 0.5,
            "active_share": 0.5,
            "hot_share": 0.25,
            "reuse": [0.6, 0.7, 0.8, 0.85, 0.9],
            "frequency": [0.9, 0.5, 0.1, 0.0],
        }],
    });
    let profile = serde_json::json!({
        "version": conductor_runtime::sparse::profile::PROFILE_VERSION,
        "model": {"arch": "llama", "n_layer": 2, "n_embd": 32, "n_ff": 4, "relu": true, "norms_crc32": 7},
        "source": "seed.gguf",
        "calibration": "seed",
        "tokens": 16,
        "grid": [0.0, 0.5],
        "reference_sparsity": 0.5,
        "layers": [layer.clone(), layer],
        "predictors": null,
        "operating_point": null,
    });
    let p: conductor_runtime::sparse::profile::ModelProfile =
        serde_json::from_value(profile).unwrap();
    p.encode().unwrap()[16..].to_vec()
}

/// A trace of one decode step's first phase on a one-layer model.
fn small_trace() -> Vec<u8> {
    let header = serde_json::json!({
        "version": conductor_runtime::trace::TRACE_FORMAT_VERSION,
        "model": {
            "name": "tiny",
            "shape": {"n_layer": 1, "n_embd": 64, "n_ff": 128, "n_head": 2, "n_head_kv": 1,
                "head_dim": 32, "n_vocab": 10, "ffn_granule": 32, "ffn_bundle": 0,
                "ffn_bundle_stride": 0, "ffn_bundle_gate_bytes": 0, "n_expert": 0,
                "n_expert_used": 0},
            "types": {"attn_q": "Q4_1", "attn_k": "Q4_1", "attn_v": "Q4_1", "attn_out": "Q4_1",
                "ffn_gate": "Q4_1", "ffn_up": "Q4_1", "ffn_down": "Q4_1", "output": "Q8_0"},
        },
        "plan": ExecutionPlan::default(),
        "ffn": conductor_runtime::plan::FfnPlan::default(),
        "driver": "actors",
        "threads": 2,
        "writer": "corpus",
    });
    let header: conductor_runtime::trace::TraceHeader = serde_json::from_value(header).unwrap();
    let trace = conductor_runtime::trace::Trace {
        header,
        records: vec![],
        activity: vec![],
        spans: vec![],
    };
    let mut bytes = Vec::new();
    trace.write_to(&mut bytes).unwrap();
    bytes
}

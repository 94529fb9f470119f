//! The seeds that are GGUF files (tiny synthetic models with random weights, their metadata,
//! a PowerInfer pair, a neuron store): generated here on every run rather than committed, as
//! every model in this repository is. The other seeds are committed under `fuzz/corpus/`.

use conductor_runtime::convert::{convert, ConvertOptions};
use conductor_runtime::gguf::{GgufFile, GgufWriter, Value};
use conductor_runtime::quant::GgmlType;
use conductor_runtime::sparse::powerinfer::{powerinfer_test_files, PowerInferTestSpec};
use conductor_runtime::synthetic::{synthetic_model, Preset, SyntheticSpec, TypeMix};

/// A seed: its target, its file name, its bytes.
pub type Seed = (&'static str, &'static str, Vec<u8>);

/// A ChatML template, a seed of `chat_template` and inside one tokenizer seed.
pub const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
/// A Llama-2-style template, likewise.
pub const LLAMA: &str = "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content | trim }} [/INST]{% elif m.role == 'system' %}<<SYS>>{{ m.content }}<</SYS>>{% else %}{{ m.content ~ eos_token }}{% endif %}{% endfor %}";

fn small(arch: &str) -> SyntheticSpec {
    let mut s = SyntheticSpec::preset(arch, Preset::Tiny).expect("known architecture");
    s.n_embd = 32;
    s.n_ff = 64;
    s.n_head = 2;
    s.n_head_kv = 1;
    s.head_dim = Some(16);
    s.n_vocab = 300;
    s.n_ctx = 64;
    s.weight_type = GgmlType::Q8_0;
    s.embd_type = GgmlType::Q8_0;
    s.output_type = None;
    s.mix = TypeMix::Uniform;
    s
}

fn model_bytes(spec: &SyntheticSpec) -> Vec<u8> {
    synthetic_model(spec).unwrap().to_bytes().unwrap()
}

/// The metadata of `bytes` (a GGUF file) without its tensors.
fn metadata_only(bytes: &[u8], chat_template: Option<&str>) -> Vec<u8> {
    let f = GgufFile::from_bytes(bytes.to_vec()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        if k != "general.alignment" && !(chat_template.is_some() && k == "tokenizer.chat_template")
        {
            w.add_metadata(k.clone(), v.clone()).unwrap();
        }
    }
    if let Some(t) = chat_template {
        w.add_metadata("tokenizer.chat_template", Value::String(t.into()))
            .unwrap();
    }
    w.to_bytes().unwrap()
}

/// Every GGUF seed (deterministic: the synthetic models are seeded).
pub fn model_seeds() -> Vec<Seed> {
    let llama = model_bytes(&small("llama"));
    let qwen3 = model_bytes(&small("qwen3"));
    let gemma3 = model_bytes(&small("gemma3"));
    let pi = powerinfer_test_files(&small("llama"), &PowerInferTestSpec::default()).unwrap();
    let store = store_of(&llama, ConvertOptions::neuron_columns(32));
    // Format 5: block columns of Q4_K interleaved 8 rows by 8.
    let interleaved = store_of(
        &model_bytes(&small_q4_k()),
        ConvertOptions::block_columns(256),
    );
    vec![
        ("gguf_from_bytes", "llama.gguf", llama.clone()),
        (
            "gguf_from_bytes",
            "metadata.gguf",
            metadata_only(&llama, None),
        ),
        ("model_from_gguf", "llama.gguf", llama.clone()),
        ("model_from_gguf", "qwen3.gguf", qwen3.clone()),
        ("model_from_gguf", "gemma3.gguf", gemma3.clone()),
        ("model_from_gguf", "llama.store.gguf", store.clone()),
        (
            "model_from_gguf",
            "llama-q4k.store.gguf",
            interleaved.clone(),
        ),
        (
            "tokenizer_from_gguf",
            "llama.gguf",
            metadata_only(&llama, Some(CHATML)),
        ),
        (
            "tokenizer_from_gguf",
            "qwen3.gguf",
            metadata_only(&qwen3, None),
        ),
        (
            "tokenizer_from_gguf",
            "gemma3.gguf",
            metadata_only(&gemma3, Some(LLAMA)),
        ),
        ("powerinfer", "model.gguf", pi.model),
        ("powerinfer", "predictor.gguf", pi.predictor),
        ("store", "llama.store.gguf", store),
        ("store", "llama-q4k.store.gguf", interleaved),
    ]
}

/// [`small`] llama with Q4_K weights: the least width of whole 256-value blocks.
fn small_q4_k() -> SyntheticSpec {
    let mut s = small("llama");
    s.n_embd = 256;
    s.n_ff = 256;
    s.head_dim = Some(128);
    s.weight_type = GgmlType::Q4_K;
    s
}

/// `conductor convert` of `model` with `options`, through a scratch directory.
fn store_of(model: &[u8], options: ConvertOptions) -> Vec<u8> {
    let dir = std::env::temp_dir().join(format!(
        "conductor-fuzz-seeds-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, dst) = (dir.join("model.gguf"), dir.join("store.gguf"));
    std::fs::write(&src, model).unwrap();
    convert(&src, &dst, &options, &mut |_, _| {}).unwrap();
    let bytes = std::fs::read(&dst).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    bytes
}

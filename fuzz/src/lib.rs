//! What each fuzz target does with its input, as plain functions: `fuzz_targets/*.rs` hand
//! them libFuzzer's bytes (`cargo +nightly fuzz run NAME`), and `tests/corpus.rs` runs them on
//! stable over the seeds (committed, and `seeds`: the generated GGUF ones) and seeded mutations of them (`scripts/fuzz --smoke`).
//!
//! Every function must return for any input, saying whether the input got past the parser (the
//! seeds must: a seed the parser refuses seeds nothing); a panic (an overflow included: this crate's
//! profiles keep overflow checks on) is a bug. Where a parser accepts its input, the function
//! also checks what the accepted value promises (in-bounds data, a round trip).

pub mod seeds;

use conductor_runtime::gguf::{GgufFile, GgufWriter};
use conductor_runtime::model::{Model, ModelConfig};
use conductor_runtime::plan::{ExecutionPlan, HardwareProfile, ModelIdentity};
use conductor_runtime::sparse::powerinfer::read_powerinfer;
use conductor_runtime::sparse::profile::ModelProfile;
use conductor_runtime::store::StoreInfo;
use conductor_runtime::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use conductor_runtime::trace::Trace;

/// A target: the input's bytes in, whether they got past the parser out.
pub type Target = fn(&[u8]) -> bool;

/// Every target, by name: what `scripts/fuzz` runs and `tests/corpus.rs` smokes.
pub const TARGETS: &[(&str, Target)] = &[
    ("gguf_from_bytes", gguf_from_bytes),
    ("model_from_gguf", model_from_gguf),
    ("tokenizer_from_gguf", tokenizer_from_gguf),
    ("chat_template", chat_template),
    ("plan", plan),
    ("hardware_profile", hardware_profile),
    ("activation_profile", activation_profile),
    ("trace_replay", trace_replay),
    ("powerinfer", powerinfer),
    ("store", store),
];

/// The GGUF reader: an accepted file hands out in-bounds tensor data and writes back out to an
/// equivalent file.
pub fn gguf_from_bytes(data: &[u8]) -> bool {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return false;
    };
    for t in f.tensors() {
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
    }
    let bytes = GgufWriter::from_file(&f)
        .and_then(|w| w.to_bytes())
        .expect("an accepted file re-serializes");
    let again = GgufFile::from_bytes(bytes).expect("a re-serialized file parses");
    assert_eq!(f.tensors().len(), again.tensors().len());
    assert_eq!(f.metadata().len(), again.metadata().len());
    true
}

/// A model from a GGUF file: hyperparameters, tensors (shapes, types, PowerInfer and store
/// metadata, all of which `Model::from_gguf` reads) and the first embeddings (dequantizing
/// whatever bytes the tensors hold).
pub fn model_from_gguf(data: &[u8]) -> bool {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return false;
    };
    let config = ModelConfig::from_gguf(&f);
    let Ok(model) = Model::from_gguf(f) else {
        return false;
    };
    assert!(config.is_ok(), "a model loaded whose config did not");
    let mut row = vec![0f32; model.config().n_embd as usize];
    for token in 0..model.config().n_vocab.min(4) {
        let _ = model.embed(token, &mut row);
    }
    assert!(model.embed(model.config().n_vocab, &mut row).is_err());
    let _ = ModelIdentity::of(&model);
    true
}

/// The tokenizer a GGUF file's metadata describes: built, then used both ways, and its chat
/// template (if any) compiled and rendered.
pub fn tokenizer_from_gguf(data: &[u8]) -> bool {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return false;
    };
    let Ok(tok) = Tokenizer::from_gguf(&f) else {
        return false;
    };
    for text in ["Hello, world!", " ünïcödé 123 <s>\n\t", ""] {
        let ids = tok.encode(text, true, true);
        assert!(ids.iter().all(|&id| (id as usize) < tok.n_vocab()));
        let _ = tok.decode(&ids);
    }
    let _ = tok.decode(&[0, 1, u32::MAX]);
    if let Ok(t) = tok.chat_template() {
        let _ = t.apply(&messages(), true);
    }
    true
}

fn messages() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi {{ there }} {% raw %}"),
        ChatMessage::new("assistant", "Hello."),
        ChatMessage::new("user", "Again?"),
    ]
}

/// A chat template (UTF-8 source) compiled and rendered with the project's limits (fuel,
/// output and indent caps): an error or text, never a panic.
pub fn chat_template(data: &[u8]) -> bool {
    let Ok(source) = std::str::from_utf8(data) else {
        return false;
    };
    let Ok(t) = ChatTemplate::new(source) else {
        return false;
    };
    let t = t.with_special_tokens("<s>", "</s>").with_time(0);
    let rendered = t.apply(&messages(), true).is_ok();
    let _ = t.apply(&messages()[1..2], false);
    rendered
}

/// A plan as JSON, TOML and bincode: a parsed plan validates or is refused, and a valid one
/// round-trips through each format.
pub fn plan(data: &[u8]) -> bool {
    let mut parsed = Vec::new();
    if let Ok(text) = std::str::from_utf8(data) {
        parsed.extend(serde_json::from_str::<ExecutionPlan>(text).ok());
        parsed.extend(toml::from_str::<ExecutionPlan>(text).ok());
    }
    parsed.extend(ExecutionPlan::from_bincode(data).ok());
    let mut valid = false;
    for p in parsed {
        if p.validate().is_err() {
            continue;
        }
        valid = true;
        // Compared as text: a valid plan must not hold a NaN, but text says so either way.
        let json = serde_json::to_string(&p).expect("a plan is plain data");
        let back: ExecutionPlan = serde_json::from_str(&json).expect("JSON round trip");
        assert_eq!(serde_json::to_string(&back).expect("again"), json);
        if let Ok(text) = toml::to_string(&p) {
            let back: ExecutionPlan = toml::from_str(&text).expect("TOML round trip");
            assert_eq!(toml::to_string(&back).expect("again"), text);
        }
    }
    valid
}

/// A hardware profile as TOML and JSON: parsed and validated, or refused.
pub fn hardware_profile(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else {
        return false;
    };
    let mut valid = false;
    if let Ok(p) = HardwareProfile::from_toml(text) {
        let text = p.to_toml();
        let back = HardwareProfile::from_toml(&text).expect("TOML round trip");
        assert_eq!(back.to_toml(), text);
        valid = true;
    }
    if let Ok(p) = serde_json::from_str::<HardwareProfile>(text) {
        valid |= p.validate().is_ok();
    }
    valid
}

/// An activation profile: the file as given, and (so that the fuzzer gets past the checksum)
/// the input as the body of a file with a correct header.
pub fn activation_profile(data: &[u8]) -> bool {
    let _ = ModelProfile::decode(data, "fuzz");
    let mut file = Vec::with_capacity(data.len() + 16);
    file.extend_from_slice(b"CNDPROF\0");
    file.extend_from_slice(&conductor_runtime::sparse::profile::PROFILE_VERSION.to_le_bytes());
    file.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    file.extend_from_slice(data);
    let Ok(p) = ModelProfile::decode(&file, "fuzz") else {
        return false;
    };
    // Compared as bytes: a profile may hold NaNs, which are not equal to themselves.
    let encoded = p.encode().expect("a decoded profile encodes");
    let again = ModelProfile::decode(&encoded, "again").expect("an encoded profile decodes");
    assert_eq!(again.encode().expect("encodes"), encoded);
    for l in 0..p.layers.len() {
        let _ = p.threshold(l, 0.5);
        let _ = p.hot_order(l);
    }
    true
}

/// A trace, then its replay through the dispatch core: an error or a report, never a panic.
pub fn trace_replay(data: &[u8]) -> bool {
    let Ok(trace) = Trace::from_bytes(data, "fuzz") else {
        return false;
    };
    let mut bytes = Vec::new();
    trace.write_to(&mut bytes).expect("into memory");
    let again = Trace::from_bytes(&bytes, "again").expect("a written trace reads back");
    let mut twice = Vec::new();
    again.write_to(&mut twice).expect("into memory");
    assert_eq!(twice, bytes);
    let _ = conductor_simulator::replay(&trace);
    true
}

/// PowerInfer files (`PWRI` or `GGUF` magic): the predictors and transposed down matrices read
/// for the shape the file's own config gives, or a small default.
pub fn powerinfer(data: &[u8]) -> bool {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return false;
    };
    let (n_embd, n_ff, n_layer) = match ModelConfig::from_gguf(&f) {
        Ok(c) => (c.n_embd as usize, c.n_ff as usize, c.n_layer as usize),
        Err(_) => (32, 64, 2),
    };
    let alone = read_powerinfer(&f, None, n_embd, n_ff, n_layer);
    let _ = read_powerinfer(&f, Some(&f), n_embd, n_ff, n_layer);
    matches!(alone, Ok(Some(_)))
}

/// A neuron store's metadata, then every bundle checked and split as the reader does.
pub fn store(data: &[u8]) -> bool {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return false;
    };
    let (n_embd, n_ff, n_layer) = match ModelConfig::from_gguf(&f) {
        Ok(c) => (c.n_embd, c.n_ff, c.n_layer),
        Err(_) => (32, 64, 2),
    };
    let Ok(Some(info)) = StoreInfo::from_gguf(&f, n_embd, n_ff, n_layer) else {
        return false;
    };
    let layout = &info.layout;
    for l in 0..n_layer {
        let Some(t) = f.tensor(&conductor_runtime::store::bundle_tensor_name(l)) else {
            continue;
        };
        let bytes = f.tensor_data(t);
        for b in 0..layout.n_bundles {
            let at = b as usize * layout.stride as usize;
            let len = layout.payload_bytes(layout.neurons_of(b).len() as u32);
            let Some(bundle) = bytes.get(at..at + len) else {
                continue;
            };
            if info.check_bundle(l, b, bundle).is_ok() {
                let parts = layout.split(b, bundle);
                assert_eq!(parts.gate.rows, layout.neurons_of(b).len());
            }
        }
    }
    let _ = Model::from_gguf(f);
    true
}

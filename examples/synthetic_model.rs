//! Writes a llama-family GGUF with random weights of a chosen shape: for speed and memory tests
//! of shapes the default model does not have (say so wherever its numbers are shown: random
//! weights say nothing about quality).
//!
//! ```sh
//! cargo run --release --example synthetic_model -- -o wide.gguf --layers 16 --embd 1024 --ff 8192
//! # A ReLU model where about 10% of FFN neurons fire per token (~90% natural sparsity), the
//! # same share for every neuron:
//! cargo run --release --example synthetic_model -- -o relu.gguf --relu-active 0.1
//! # A named shape of the simulator (`conductor_simulator::NAMED_SHAPES`), full size:
//! cargo run --release --example synthetic_model -- --shape turbosparse-mistral-7b -o ts7b.gguf
//! # ... cut to one layer (any of --layers, --embd, --ff, --heads, --kv-heads, --vocab):
//! cargo run --release --example synthetic_model -- --shape turbosparse-mixtral-47b --layers 1 -o m1.gguf
//! # Another architecture (llama, llama3, qwen2, qwen3, gemma3, phi3) in its preset shape, typed
//! # as a Q4_K_M file (`--preset tiny`: the tests' 2-layer shape; small: 8 layers, the default):
//! cargo run --release --example synthetic_model -- --arch gemma3 -o gemma3.gguf
//! cargo run --release --example synthetic_model -- --arch qwen3 --preset tiny --types q4_0 -o q3.gguf
//! ```
//!
//! With `--arch`, the architecture's tensors and metadata are written as llama.cpp reads them
//! (qwen3's q/k head norms and head size; gemma3's four norms a layer, sliding windows and
//! SentencePiece vocabulary; phi3's fused q/k/v and gate/up matrices and LongRoPE factors;
//! llama3's RoPE frequency factors) in the preset's shape (`SyntheticSpec::preset`); the
//! dimension flags override it. `--types q4_k_m` (the presets' default) types the matrices as
//! llama.cpp's Q4_K_M quantizer does; a type name (q4_0, q4_1, q8_0, q4_k, q6_k) gives every
//! matrix that type.
//!
//! With `--shape`, dimensions and types are the named shape's: the same type for token
//! embeddings, attention and FFN matrices (Q4_0 for the 7B-class and Mixtral shapes, as
//! llama.cpp's Q4_0 files have them), an untied output projection of the shape's output type
//! (Q6_K there), a 4096-token context and the byte-level test vocabulary padded to the shape's
//! size. The sparse shapes (`bamboo-7b`, `turbosparse-mistral-7b`, `turbosparse-mixtral-47b`)
//! are ReLU models with their published activation statistics planted in the weights: each
//! neuron fires with the probability `conductor_simulator::neuron_frequencies` gives it (the
//! layer's active share, a hot fifth of the neurons taking 80% of the activations; within the
//! chosen experts for the mixture of experts, whose router is random F32), and the gate rows
//! are low-rank plus noise so that activity is predictable from the layer's input
//! (`conductor_runtime::synthetic`). `--relu-active` replaces a sparse shape's active share;
//! on a dense shape it gives the uniform shift. Dense shapes are SiLU.
//!
//! The file streams to disk in bounded memory (chunks of whole rows, made on `--threads`
//! threads, written in order): a model larger than RAM can be written. It is written to a
//! temporary file and renamed into place, so a failed write (a full disk) leaves no file that
//! looks complete. The same arguments give the same bytes, whatever the thread count.

use anyhow::{anyhow, bail, Result};
use clap::Parser;
use conductor::runtime::model::FfnActivation;
use conductor::runtime::quant::GgmlType;
use conductor::runtime::synthetic::{Preset, SyntheticModel, SyntheticSpec, TypeMix, CHUNK_BYTES};
use conductor_simulator::{activation_stats, named_shape, neuron_frequencies, NAMED_SHAPES};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
struct Args {
    #[arg(short = 'o', long)]
    output: PathBuf,
    /// A named shape of the simulator (e.g. turbosparse-mistral-7b); the flags below override
    /// its dimensions.
    #[arg(long)]
    shape: Option<String>,
    /// An architecture (llama, llama3, qwen2, qwen3, gemma3, phi3) in its preset shape; the
    /// flags below override its dimensions.
    #[arg(long, conflicts_with = "shape")]
    arch: Option<String>,
    /// The preset shape with --arch: tiny or small.
    #[arg(long, default_value = "small", requires = "arch")]
    preset: String,
    /// Matrix types with --arch: q4_k_m, or one type for every matrix (q4_0, q4_1, q8_0, q4_k,
    /// q6_k).
    #[arg(long, requires = "arch")]
    types: Option<String>,
    /// Head size with --arch (qwen3 and gemma3 write it apart from the width).
    #[arg(long, requires = "arch")]
    head_dim: Option<u32>,
    /// Layers (default 16 without --shape).
    #[arg(long)]
    layers: Option<u32>,
    /// Width (default 1024).
    #[arg(long)]
    embd: Option<u32>,
    /// FFN width, of each expert in a mixture of experts (default 8192).
    #[arg(long)]
    ff: Option<u32>,
    /// Query heads (default 16).
    #[arg(long)]
    heads: Option<u32>,
    /// Key/value heads (default 4).
    #[arg(long)]
    kv_heads: Option<u32>,
    /// Vocabulary (default 32000).
    #[arg(long)]
    vocab: Option<u32>,
    /// Seed of the weights (default 7; with --arch, the preset's).
    #[arg(long)]
    seed: Option<u64>,
    /// A ReLU model in which about this share of FFN neurons fires per token (e.g. 0.1).
    #[arg(long)]
    relu_active: Option<f32>,
    /// A sparse shape: the share of each gate row's variance that is noise a low-rank
    /// predictor cannot learn (default: the one set for ProSparse's operating point).
    #[arg(long)]
    gate_noise: Option<f32>,
    /// Threads making chunks (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

/// The spec of the explicit flags alone (what this example wrote before named shapes).
fn flag_spec(a: &Args) -> SyntheticSpec {
    SyntheticSpec {
        n_layer: a.layers.unwrap_or(16),
        n_embd: a.embd.unwrap_or(1024),
        n_ff: a.ff.unwrap_or(8192),
        n_head: a.heads.unwrap_or(16),
        n_head_kv: a.kv_heads.unwrap_or(4),
        n_vocab: a.vocab.unwrap_or(32000),
        n_ctx: 4096,
        weight_type: GgmlType::Q4_1,
        embd_type: GgmlType::Q8_0,
        tied_output: true,
        seed: a.seed.unwrap_or(7),
        activation: if a.relu_active.is_some() {
            FfnActivation::Relu
        } else {
            FfnActivation::Silu
        },
        relu_active_share: a.relu_active,
        ..SyntheticSpec::default()
    }
}

/// The spec of named shape `name`, with the flags' overrides.
fn shape_spec(name: &str, a: &Args) -> Result<SyntheticSpec> {
    let mut d = named_shape(name)
        .ok_or_else(|| anyhow!("unknown shape {name}; known: {}", NAMED_SHAPES.join(", ")))?;
    let s = &mut d.shape;
    let per_expert = a.ff.unwrap_or(s.ffn_per_expert());
    s.n_layer = a.layers.unwrap_or(s.n_layer);
    s.n_embd = a.embd.unwrap_or(s.n_embd);
    s.n_head = a.heads.unwrap_or(s.n_head);
    s.n_head_kv = a.kv_heads.unwrap_or(s.n_head_kv);
    s.n_vocab = a.vocab.unwrap_or(s.n_vocab);
    s.n_ff = per_expert * s.n_expert.max(1);
    s.head_dim = s.n_embd / s.n_head;
    let t = &d.types;
    let ty = t.ffn_gate;
    if [
        t.attn_q, t.attn_k, t.attn_v, t.attn_out, t.ffn_up, t.ffn_down,
    ]
    .iter()
    .any(|&x| x != ty)
    {
        bail!("shape {name} mixes matrix types; synthetic models use one");
    }
    let stats = activation_stats(name).map(|mut st| {
        if let Some(p) = a.relu_active {
            st.active_share = f64::from(p);
        }
        st
    });
    if let Some(st) = &stats {
        eprintln!(
            "{name}: ReLU, {:.0}% of neurons active per token ({}), the hot {:.0}% taking {:.0}% \
             (sources: {})",
            st.active_share * 100.0,
            if d.shape.is_moe() {
                "of a chosen expert's"
            } else {
                "of a layer's"
            },
            st.hot_share * 100.0,
            st.hot_mass * 100.0,
            st.sources
        );
    }
    let relu = stats.is_some() || a.relu_active.is_some();
    Ok(SyntheticSpec {
        name: Some(name.to_string()),
        n_layer: d.shape.n_layer,
        n_embd: d.shape.n_embd,
        n_ff: per_expert,
        n_head: d.shape.n_head,
        n_head_kv: d.shape.n_head_kv,
        n_vocab: d.shape.n_vocab,
        n_ctx: 4096,
        weight_type: ty,
        embd_type: ty,
        output_type: Some(t.output),
        tied_output: false,
        activation: if relu {
            FfnActivation::Relu
        } else {
            FfnActivation::Silu
        },
        relu_active_share: if stats.is_none() { a.relu_active } else { None },
        ffn_frequencies: stats.map(|st| neuron_frequencies(&d, &st)),
        gate_noise_share: a
            .gate_noise
            .unwrap_or(SyntheticSpec::default().gate_noise_share),
        n_expert: d.shape.n_expert,
        n_expert_used: d.shape.n_expert_used,
        seed: a.seed.unwrap_or(7),
        ..SyntheticSpec::default()
    })
}

/// The spec of architecture `arch` in its preset shape, with the flags' overrides.
fn arch_spec(arch: &str, a: &Args) -> Result<SyntheticSpec> {
    let preset = match a.preset.as_str() {
        "tiny" => Preset::Tiny,
        "small" => Preset::Small,
        other => bail!("unknown preset {other}; known: tiny, small"),
    };
    let mut s = SyntheticSpec::preset(arch, preset)?;
    s.n_layer = a.layers.unwrap_or(s.n_layer);
    s.n_embd = a.embd.unwrap_or(s.n_embd);
    s.n_ff = a.ff.unwrap_or(s.n_ff);
    s.n_head = a.heads.unwrap_or(s.n_head);
    s.n_head_kv = a.kv_heads.unwrap_or(s.n_head_kv);
    s.n_vocab = a.vocab.unwrap_or(s.n_vocab);
    s.head_dim = a.head_dim.or(s.head_dim);
    s.seed = a.seed.unwrap_or(s.seed);
    if a.embd.is_some() || a.heads.is_some() {
        // The preset's head size belongs to its width and heads.
        s.head_dim = a.head_dim;
    }
    match a.types.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("q4_k_m") => {}
        Some(name) => {
            let ty = GgmlType::from_name(name)
                .ok_or_else(|| anyhow!("unknown type {name}; q4_k_m or a ggml type name"))?;
            s.mix = TypeMix::Uniform;
            s.weight_type = ty;
            s.output_type = Some(ty);
        }
    }
    if a.relu_active.is_some() {
        s.activation = FfnActivation::Relu;
        s.relu_active_share = a.relu_active;
    }
    Ok(s)
}

/// A bar redrawn in place on a terminal, a line per quarter in a log.
fn progress_bar(started: Instant) -> impl FnMut(u64, u64) {
    let terminal = std::io::stderr().is_terminal();
    let step = if terminal { 1 } else { 25 };
    let mut last = u64::MAX;
    move |done, total| {
        let pct = done * 100 / total.max(1) / step * step;
        if pct == last {
            return;
        }
        last = pct;
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let rate = done as f64 / (1 << 20) as f64 / started.elapsed().as_secs_f64().max(1e-3);
        let (start, end) = if terminal { ("\r", "") } else { ("", "\n") };
        let filled = (pct / 4) as usize;
        eprint!(
            "{start}synthetic_model: [{}{}] {pct:3}% {:.2}/{:.2} GiB {rate:.0} MiB/s{end}",
            "#".repeat(filled),
            " ".repeat(25 - filled),
            gib(done),
            gib(total),
        );
        let _ = std::io::stderr().flush();
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    let spec = match (&a.shape, &a.arch) {
        (Some(name), _) => shape_spec(name, &a)?,
        (None, Some(arch)) => arch_spec(arch, &a)?,
        (None, None) => flag_spec(&a),
    };
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let started = Instant::now();
    let model = SyntheticModel::new(&spec)?;
    let chunks = model.chunks(CHUNK_BYTES);
    let total = model.data_bytes();
    let mut progress = progress_bar(started);
    model
        .header()
        .write_file_atomic_with(&a.output, |stream| -> Result<()> {
            let mut done = 0;
            // `threads` chunks at a time, made in parallel, written in order: at most that
            // many chunks are in memory.
            for batch in chunks.chunks(threads) {
                let made: Vec<Vec<u8>> = std::thread::scope(|s| {
                    let handles: Vec<_> = batch
                        .iter()
                        .map(|c| s.spawn(|| model.chunk_data(c)))
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("chunk thread"))
                        .collect()
                });
                for data in made {
                    stream.write_chunk(&data)?;
                    done += data.len() as u64;
                }
                progress(done, total);
            }
            Ok(())
        })?;
    if std::io::stderr().is_terminal() {
        eprintln!();
    }
    eprintln!(
        "wrote {} ({:.1} MiB, random weights) in {:.1} s",
        a.output.display(),
        std::fs::metadata(&a.output)?.len() as f64 / (1 << 20) as f64,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

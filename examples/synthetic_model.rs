//! Writes a llama-family GGUF with random weights of a chosen shape: for speed and memory tests
//! of shapes the default model does not have (say so wherever its numbers are shown: random
//! weights say nothing about quality).
//!
//! ```sh
//! cargo run --release --example synthetic_model -- -o wide.gguf --layers 16 --embd 1024 --ff 8192
//! # A ReLU model where about 10% of FFN neurons fire per token (~90% natural sparsity):
//! cargo run --release --example synthetic_model -- -o relu.gguf --relu-active 0.1
//! ```

use clap::Parser;
use conductor::runtime::model::FfnActivation;
use conductor::runtime::quant::GgmlType;
use conductor::runtime::synthetic::{synthetic_model, SyntheticSpec};
use std::path::PathBuf;

#[derive(Parser)]
struct Args {
    #[arg(short = 'o', long)]
    output: PathBuf,
    #[arg(long, default_value_t = 16)]
    layers: u32,
    #[arg(long, default_value_t = 1024)]
    embd: u32,
    #[arg(long, default_value_t = 8192)]
    ff: u32,
    #[arg(long, default_value_t = 16)]
    heads: u32,
    #[arg(long, default_value_t = 4)]
    kv_heads: u32,
    #[arg(long, default_value_t = 32000)]
    vocab: u32,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// A ReLU model in which about this share of FFN neurons fires per token (e.g. 0.1).
    #[arg(long)]
    relu_active: Option<f32>,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let spec = SyntheticSpec {
        n_layer: a.layers,
        n_embd: a.embd,
        n_ff: a.ff,
        n_head: a.heads,
        n_head_kv: a.kv_heads,
        n_vocab: a.vocab,
        n_ctx: 4096,
        weight_type: GgmlType::Q4_1,
        embd_type: GgmlType::Q8_0,
        tied_output: true,
        seed: a.seed,
        activation: if a.relu_active.is_some() {
            FfnActivation::Relu
        } else {
            FfnActivation::Silu
        },
        relu_active_share: a.relu_active,
        ..SyntheticSpec::default()
    };
    synthetic_model(&spec)?.write_file_atomic(&a.output)?;
    eprintln!(
        "wrote {} ({:.1} MiB, random weights)",
        a.output.display(),
        std::fs::metadata(&a.output)?.len() as f64 / (1 << 20) as f64
    );
    Ok(())
}

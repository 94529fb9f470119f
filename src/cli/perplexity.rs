//! `conductor perplexity`: the llama-perplexity method ([`conductor::perplexity`]).

use super::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use conductor::perplexity::perplexity;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Text file to score.
    #[arg(short = 'f', long = "file")]
    file: PathBuf,
    /// Tokens per chunk.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    ctx_size: usize,
    /// Score only the first N chunks (default: all).
    #[arg(long = "chunks")]
    chunks: Option<usize>,
}

pub fn run(args: PerplexityArgs) -> Result<()> {
    let n_ctx = args.ctx_size;
    if n_ctx < 4 {
        bail!("-c must be at least 4 tokens");
    }
    if args.chunks == Some(0) {
        bail!("--chunks must be at least 1");
    }
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let mut model_args = args.model.clone();
    if model_args.engine.context.is_none() {
        model_args.engine.context = Some(args.ctx_size);
    }
    // Sparse decode is measured on every token, not only on those a prompt would leave to it.
    model_args.engine.sparse_all_tokens = true;
    let mut engine = model_args.load(model_args.threads())?;
    let tokens = engine.tokenizer().encode(&text, true, false);
    if tokens.len() < 2 * n_ctx {
        bail!(
            "{} has {} tokens; perplexity with -c {n_ctx} needs at least {}",
            args.file.display(),
            tokens.len(),
            2 * n_ctx
        );
    }
    let n_chunk = (tokens.len() / n_ctx).min(args.chunks.unwrap_or(usize::MAX));
    eprintln!(
        "perplexity: {} tokens, {n_chunk} chunks of {n_ctx}, scoring the last {} positions of each",
        tokens.len(),
        n_ctx - n_ctx / 2 - 1
    );
    let started = Instant::now();
    let mut out = std::io::stdout().lock();
    let mut failed = None;
    let result = perplexity(
        &mut engine,
        &tokens,
        n_ctx,
        Some(n_chunk),
        &mut |i, running| {
            if let Err(e) = write!(out, "[{}]{running:.4},", i + 1).and_then(|_| out.flush()) {
                failed.get_or_insert(e);
            }
        },
    )?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    writeln!(out)?;
    writeln!(
        out,
        "Final estimate: PPL = {:.4} +/- {:.5}",
        result.perplexity, result.error
    )?;
    eprintln!(
        "perplexity: {} tokens scored in {:.1} s ({:.1} tokens/s evaluated)",
        result.scored_tokens,
        started.elapsed().as_secs_f64(),
        (n_chunk * n_ctx) as f64 / started.elapsed().as_secs_f64()
    );
    if let Some((gate, active)) = engine.take_sparsity_stats() {
        eprintln!(
            "perplexity: sparse FFN: gate rows computed {:.1}%, neurons active {:.1}%",
            gate * 100.0,
            active * 100.0
        );
    }
    Ok(())
}

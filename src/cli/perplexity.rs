//! `conductor perplexity`: the llama-perplexity method.
//!
//! The text is tokenized once and cut into non-overlapping chunks of `c` tokens. Each chunk is
//! evaluated from an empty context; the second half of each chunk is scored (every position
//! there has at least `c/2` tokens of context): perplexity = exp(mean negative log-likelihood).

use super::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
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

/// log p(token) under softmax(logits), as llama-perplexity computes it.
fn log_prob(logits: &[f32], token: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    (logits[token] - max) as f64 - sum.ln()
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
    let tokenizer = engine.tokenizer();
    let add_bos = tokenizer.add_bos();
    let bos = tokenizer.bos();
    let tokens = tokenizer.encode(&text, true, false);
    if tokens.len() < 2 * n_ctx {
        bail!(
            "{} has {} tokens; perplexity with -c {n_ctx} needs at least {}",
            args.file.display(),
            tokens.len(),
            2 * n_ctx
        );
    }
    let n_chunk = (tokens.len() / n_ctx).min(args.chunks.unwrap_or(usize::MAX));
    let first = n_ctx / 2;
    let n_vocab = engine.model().config.n_vocab as usize;
    eprintln!(
        "perplexity: {} tokens, {n_chunk} chunks of {n_ctx}, scoring the last {} positions of each",
        tokens.len(),
        n_ctx - first - 1
    );
    let started = Instant::now();
    let (mut nll, mut nll2, mut count) = (0.0f64, 0.0f64, 0usize);
    let mut session = engine.session(Some(n_ctx))?;
    let mut out = std::io::stdout().lock();
    for i in 0..n_chunk {
        let mut chunk = tokens[i * n_ctx..(i + 1) * n_ctx].to_vec();
        if let (true, Some(b)) = (add_bos, bos) {
            chunk[0] = b;
        }
        session.clear();
        let mut sum = (0.0f64, 0.0f64, 0usize);
        engine.eval(&mut session, &chunk, first, &mut |start, rows| {
            for (r, logits) in rows.chunks_exact(n_vocab).enumerate() {
                let pos = start + r;
                if pos + 1 < n_ctx {
                    let lp = log_prob(logits, chunk[pos + 1] as usize);
                    sum.0 -= lp;
                    sum.1 += lp * lp;
                    sum.2 += 1;
                }
            }
        })?;
        nll += sum.0;
        nll2 += sum.1;
        count += sum.2;
        write!(out, "[{}]{:.4},", i + 1, (nll / count as f64).exp())?;
        out.flush()?;
    }
    writeln!(out)?;
    let mean = nll / count as f64;
    let ppl = mean.exp();
    let var = nll2 / count as f64 - mean * mean;
    let err = if var > 0.0 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    writeln!(out, "Final estimate: PPL = {ppl:.4} +/- {err:.5}")?;
    eprintln!(
        "perplexity: {} tokens scored in {:.1} s ({:.1} tokens/s evaluated)",
        count,
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

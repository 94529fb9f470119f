//! Perplexity, the llama-perplexity method: the tokens are cut into non-overlapping chunks of
//! `n_ctx`, each evaluated from an empty context; the second half of each chunk is scored
//! (every position there has at least `n_ctx / 2` tokens of context): perplexity =
//! exp(mean negative log-likelihood).
//!
//! The scored half is evaluated `LOGIT_ROWS` positions a step, so the logits held at once
//! stay small; the bits are those of one step over the chunk. With sparse decode for every
//! token (`SparsitySettings::all_tokens`), the steps are decode-shape: each token gets the bits
//! its own one-token step would.

use crate::{Engine, Error};

/// A perplexity and what it was measured on.
#[derive(Clone, Debug, PartialEq)]
pub struct Perplexity {
    pub perplexity: f64,
    /// Its standard error, as llama-perplexity reports it.
    pub error: f64,
    pub scored_tokens: usize,
    pub chunks: usize,
}

/// log p(token) under softmax(logits), as llama-perplexity computes it.
fn log_prob(logits: &[f32], token: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    (logits[token] - max) as f64 - sum.ln()
}

/// Per chunk: Σ −log p, Σ (log p)², positions scored.
#[derive(Clone, Copy, Default)]
struct Sums(f64, f64, usize);

impl Sums {
    fn add(&mut self, logits: &[f32], token: u32) {
        let lp = log_prob(logits, token as usize);
        self.0 -= lp;
        self.1 += lp * lp;
        self.2 += 1;
    }
}

/// Positions scored a step: 37 MiB of logits for a 151,936-token vocabulary (Qwen2.5), each
/// copied a few times along the dispatch, where a chunk of 512 would score 256 at once.
const LOGIT_ROWS: usize = 64;

/// The perplexity of `engine` over the first `chunks` chunks of `n_ctx` tokens of `tokens`
/// (`None`: every whole chunk). `on_chunk(i, running)` hears the running perplexity after
/// chunk `i` (0-based).
pub fn perplexity(
    engine: &mut Engine,
    tokens: &[u32],
    n_ctx: usize,
    chunks: Option<usize>,
    on_chunk: &mut dyn FnMut(usize, f64),
) -> Result<Perplexity, Error> {
    let n_chunk = (tokens.len() / n_ctx.max(1)).min(chunks.unwrap_or(usize::MAX));
    let first = n_ctx / 2;
    let n_vocab = engine.model().config().n_vocab as usize;
    let add_bos = engine.tokenizer().add_bos();
    let bos = engine.tokenizer().bos();
    let chunk = |i: usize| {
        let mut c = tokens[i * n_ctx..(i + 1) * n_ctx].to_vec();
        if let (true, Some(b)) = (add_bos, bos) {
            c[0] = b;
        }
        c
    };
    let mut totals = Sums::default();
    let mut session = engine.session(Some(n_ctx))?;
    for i in 0..n_chunk {
        let c = chunk(i);
        let mut sums = Sums::default();
        session.clear();
        // The scored half LOGIT_ROWS positions at a time: a step holds (and copies along the
        // dispatch) the logits of every position it scores. The bits do not change: a
        // position's logits are the same however the tokens before it are split into steps.
        let mut start = 0;
        while start < n_ctx {
            let end = (start.max(first) + LOGIT_ROWS).min(n_ctx);
            let from = first.saturating_sub(start);
            engine.eval(&mut session, &c[start..end], from, &mut |at, rows| {
                for (r, logits) in rows.chunks_exact(n_vocab).enumerate() {
                    let pos = start + at + r;
                    if pos + 1 < n_ctx {
                        sums.add(logits, c[pos + 1]);
                    }
                }
            })?;
            start = end;
        }
        totals.0 += sums.0;
        totals.1 += sums.1;
        totals.2 += sums.2;
        on_chunk(i, (totals.0 / totals.2.max(1) as f64).exp());
    }
    let count = totals.2.max(1) as f64;
    let mean = totals.0 / count;
    let ppl = mean.exp();
    let var = totals.1 / count - mean * mean;
    let error = if var > 0.0 && totals.2 > 1 {
        (var / (count - 1.0)).sqrt() * ppl
    } else {
        0.0
    };
    Ok(Perplexity {
        perplexity: ppl,
        error,
        scored_tokens: totals.2,
        chunks: n_chunk,
    })
}

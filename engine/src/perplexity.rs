//! Perplexity, the llama-perplexity method: the tokens are cut into non-overlapping chunks of
//! `n_ctx`, each evaluated from an empty context; the second half of each chunk is scored
//! (every position there has at least `n_ctx / 2` tokens of context): perplexity =
//! exp(mean negative log-likelihood).
//!
//! With sparse decode for every token (`SparsitySettings::all_tokens`), a chunk is one
//! decode-shape step: each token gets the bits its own one-token step would.

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
        engine.eval(&mut session, &c, first, &mut |start, rows| {
            for (r, logits) in rows.chunks_exact(n_vocab).enumerate() {
                let pos = start + r;
                if pos + 1 < n_ctx {
                    sums.add(logits, c[pos + 1]);
                }
            }
        })?;
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

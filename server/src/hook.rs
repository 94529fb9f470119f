//! What a request adds to the engine's draw ([`SampleHook`]): the constraint's mask, and the
//! log-probabilities of each token drawn.

use super::api::{TokenLogprob, TopLogprob};
use super::constrain;
use conductor::SampleHook;
use conductor_runtime::tokenizer::Tokenizer;
use llguidance::Matcher;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;

/// OpenAI writes the log-probability of an impossible token as this, not -inf (JSON has none).
const FLOOR: f32 = -9999.0;

pub struct RequestHook {
    pub matcher: Option<Matcher>,
    pub tokenizer: Arc<Tokenizer>,
    /// `Some(n)`: record each drawn token's log-probability and its `n` likeliest rivals.
    pub logprobs: Option<usize>,
    /// Recorded log-probabilities, one per drawn token, taken by the worker as pieces come.
    pub drawn: Rc<RefCell<VecDeque<TokenLogprob>>>,
}

impl SampleHook for RequestHook {
    fn adjust(&mut self, logits: &mut [f32]) -> Result<(), String> {
        match &mut self.matcher {
            Some(m) => constrain::mask(m, &self.tokenizer, logits),
            None => Ok(()),
        }
    }

    fn drawn(&mut self, token: u32, logits: &[f32]) -> Result<(), String> {
        if let Some(top) = self.logprobs {
            let entry = logprob_entry(&self.tokenizer, token, logits, top);
            self.drawn.borrow_mut().push_back(entry);
        }
        match &mut self.matcher {
            Some(m) => constrain::advance(m, &self.tokenizer, token),
            None => Ok(()),
        }
    }
}

fn token_text(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tokenizer.token_to_piece(id, true);
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// `token`'s log-probability under `logits` (log-softmax) and the `top` likeliest tokens with
/// theirs, likeliest first (ties by id). Masked tokens (-inf) are at [`FLOOR`] and never listed.
pub fn log_probs(logits: &[f32], token: u32, top: usize) -> (f32, Vec<(u32, f32)>) {
    let max = logits
        .iter()
        .copied()
        .filter(|l| l.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    let log_sum = logits
        .iter()
        .filter(|l| l.is_finite())
        .map(|&l| ((l - max) as f64).exp())
        .sum::<f64>()
        .ln() as f32;
    let logprob = |l: f32| {
        let v = l - max - log_sum;
        if v.is_finite() {
            v.max(FLOOR)
        } else {
            FLOOR
        }
    };
    let mut ranked: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, &l)| (i as u32, l))
        .collect();
    let top = top.min(ranked.len());
    let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if top > 0 {
        ranked.select_nth_unstable_by(top - 1, by_logit);
    }
    ranked.truncate(top);
    ranked.sort_by(by_logit);
    let own = logits.get(token as usize).map_or(FLOOR, |&l| logprob(l));
    (
        own,
        ranked.into_iter().map(|(id, l)| (id, logprob(l))).collect(),
    )
}

/// [`log_probs`] with the tokens' texts, as the API writes them.
pub fn logprob_entry(
    tokenizer: &Tokenizer,
    token: u32,
    logits: &[f32],
    top: usize,
) -> TokenLogprob {
    let (logprob, rivals) = log_probs(logits, token, top);
    let (text, bytes) = token_text(tokenizer, token);
    TokenLogprob {
        token: text,
        logprob,
        bytes,
        top_logprobs: Some(
            rivals
                .into_iter()
                .map(|(id, logprob)| {
                    let (token, bytes) = token_text(tokenizer, id);
                    TopLogprob {
                        token,
                        logprob,
                        bytes,
                    }
                })
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_probabilities_are_a_log_softmax_with_masked_tokens_at_the_floor() {
        // Probabilities 1/4, 1/2, 0 (masked), 1/4.
        let logits = [0.0f32, 2.0f32.ln(), f32::NEG_INFINITY, 0.0];
        let (own, top) = log_probs(&logits, 1, 3);
        assert!((own - 0.5f32.ln()).abs() < 1e-6, "{own}");
        let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 0, 3]);
        assert!((top[1].1 - 0.25f32.ln()).abs() < 1e-6);
        assert_eq!(log_probs(&logits, 2, 0), (FLOOR, vec![]));
        assert_eq!(log_probs(&logits, 99, 10).1.len(), 3);
    }
}

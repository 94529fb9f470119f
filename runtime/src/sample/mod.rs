//! Sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, seeded.
//!
//! The chain follows llama.cpp's default order (penalties → top-k → top-p → min-p → temperature
//! → draw), so the same settings mean the same thing to someone coming from `llama-cli`.
//! Filters see untempered probabilities; temperature only shapes the final draw.

mod rng;

pub use rng::SplitMix64;
use std::collections::VecDeque;

/// Sampling settings. The defaults are llama.cpp's.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (always the most likely token).
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 keeps all.
    pub top_k: u32,
    /// Keep the most likely tokens whose probabilities add up to at least p; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 keeps all.
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of recently seen tokens by this; 1 is off.
    pub repeat_penalty: f32,
    /// How many recent tokens the repetition penalty looks at.
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0x5EED,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        }
    }

    /// Rejects values that have no meaning (negative temperature, p outside [0, 1], …).
    pub fn validate(&self) -> Result<(), SamplingError> {
        let bad = |name: &'static str, value: f32, expected: &'static str| {
            Err(SamplingError {
                name,
                value,
                expected,
            })
        };
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad("temperature", self.temperature, "a finite number ≥ 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top-p", self.top_p, "a number in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min-p", self.min_p, "a number in [0, 1]");
        }
        if !self.repeat_penalty.is_finite() || self.repeat_penalty <= 0.0 {
            return bad("repeat-penalty", self.repeat_penalty, "a finite number > 0");
        }
        Ok(())
    }
}

/// A sampling setting outside its meaningful range.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("invalid {name} {value}: expected {expected}")]
pub struct SamplingError {
    pub name: &'static str,
    pub value: f32,
    pub expected: &'static str,
}

/// Draws tokens from logits; remembers recent tokens for the repetition penalty.
pub struct Sampler {
    params: SamplingParams,
    rng: SplitMix64,
    recent: VecDeque<u32>,
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Sampler, SamplingError> {
        params.validate()?;
        Ok(Sampler {
            rng: SplitMix64::new(params.seed),
            recent: VecDeque::with_capacity(params.repeat_last_n),
            candidates: Vec::new(),
            params,
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Records a token of the context (prompt or generated) for the repetition penalty.
    pub fn accept(&mut self, token: u32) {
        if self.params.repeat_last_n == 0 {
            return;
        }
        if self.recent.len() == self.params.repeat_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    /// Picks the next token. `logits` must not be empty.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let penalize = self.params.repeat_penalty != 1.0 && !self.recent.is_empty();
        if self.params.temperature == 0.0 && !penalize {
            return argmax(logits);
        }
        self.candidates.clear();
        self.candidates
            .extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        if penalize {
            self.apply_repeat_penalty();
        }
        if self.params.temperature == 0.0 {
            return self.best_candidate();
        }
        self.keep_top_k();
        self.keep_top_p();
        self.keep_min_p();
        self.draw()
    }

    fn apply_repeat_penalty(&mut self) {
        let p = self.params.repeat_penalty;
        // Each distinct recent token is penalised once, as llama.cpp does.
        let mut seen: Vec<u32> = self.recent.iter().copied().collect();
        seen.sort_unstable();
        seen.dedup();
        for t in seen {
            if let Some(c) = self.candidates.get_mut(t as usize) {
                c.1 = if c.1 > 0.0 { c.1 / p } else { c.1 * p };
            }
        }
    }

    fn best_candidate(&self) -> u32 {
        let mut best = self.candidates[0];
        for &c in &self.candidates[1..] {
            if c.1 > best.1 {
                best = c;
            }
        }
        best.0
    }

    /// Keeps the k best candidates, sorted by decreasing logit (ties: lower id first).
    fn keep_top_k(&mut self) {
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let k = self.params.top_k as usize;
        if k > 0 && k < self.candidates.len() {
            self.candidates.select_nth_unstable_by(k - 1, by_logit);
            self.candidates.truncate(k);
        }
        self.candidates.sort_unstable_by(by_logit);
    }

    /// Softmax of the (sorted) candidates' logits, as probabilities in place of the logits.
    fn probabilities(&self) -> Vec<f32> {
        let max = self.candidates[0].1;
        let mut p: Vec<f32> = self.candidates.iter().map(|c| (c.1 - max).exp()).collect();
        let sum: f32 = p.iter().sum();
        p.iter_mut().for_each(|x| *x /= sum);
        p
    }

    fn keep_top_p(&mut self) {
        if self.params.top_p >= 1.0 {
            return;
        }
        let p = self.probabilities();
        let mut cumulative = 0.0;
        let mut keep = p.len();
        for (i, &pi) in p.iter().enumerate() {
            cumulative += pi;
            if cumulative >= self.params.top_p {
                keep = i + 1;
                break;
            }
        }
        self.candidates.truncate(keep.max(1));
    }

    fn keep_min_p(&mut self) {
        if self.params.min_p <= 0.0 {
            return;
        }
        // p_i ≥ min_p · p_max  ⇔  logit_i ≥ logit_max + ln(min_p)
        let threshold = self.candidates[0].1 + self.params.min_p.ln();
        let keep = self
            .candidates
            .iter()
            .take_while(|c| c.1 >= threshold)
            .count();
        self.candidates.truncate(keep.max(1));
    }

    fn draw(&mut self) -> u32 {
        let t = self.params.temperature;
        let max = self.candidates[0].1;
        let weights: Vec<f64> = self
            .candidates
            .iter()
            .map(|c| (((c.1 - max) / t) as f64).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut r = self.rng.next_f64() * total;
        for (c, w) in self.candidates.iter().zip(&weights) {
            if r < *w {
                return c.0;
            }
            r -= w;
        }
        self.candidates[self.candidates.len() - 1].0
    }
}

/// The index of the largest logit (the first one on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(params: SamplingParams) -> Sampler {
        Sampler::new(params).unwrap()
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = sampler(SamplingParams::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0]), 1);
    }

    #[test]
    fn repetition_penalty_changes_the_greedy_choice() {
        let mut s = sampler(SamplingParams {
            repeat_penalty: 2.0,
            ..SamplingParams::greedy()
        });
        s.accept(1);
        // 3.0 / 2 = 1.5 < 2.0
        assert_eq!(s.sample(&[0.0, 3.0, 2.0]), 2);
        // negative logits are multiplied, so a penalised token gets less likely, not more
        let mut s = sampler(SamplingParams {
            repeat_penalty: 2.0,
            ..SamplingParams::greedy()
        });
        s.accept(0);
        assert_eq!(s.sample(&[-1.0, -1.5, -3.0]), 1);
    }

    #[test]
    fn top_k_1_is_greedy_whatever_the_temperature() {
        let mut s = sampler(SamplingParams {
            temperature: 5.0,
            top_k: 1,
            ..SamplingParams::default()
        });
        for _ in 0..50 {
            assert_eq!(s.sample(&[0.0, 0.5, 0.4, 0.1]), 1);
        }
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        // probabilities ≈ 0.64, 0.24, 0.09, 0.03
        let logits = [2.0, 1.0, 0.0, -1.0];
        let mut s = sampler(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.7,
            min_p: 0.0,
            ..SamplingParams::default()
        });
        let mut seen = [0; 4];
        for _ in 0..2000 {
            seen[s.sample(&logits) as usize] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0);
        assert_eq!(
            seen[2] + seen[3],
            0,
            "top-p 0.7 keeps only two tokens: {seen:?}"
        );

        let mut s = sampler(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.3,
            ..SamplingParams::default()
        });
        let mut seen = [0; 4];
        for _ in 0..2000 {
            seen[s.sample(&logits) as usize] += 1;
        }
        // p1/p0 = e^-1 ≈ 0.37 ≥ 0.3 is kept; p2/p0 = e^-2 ≈ 0.14 is not
        assert!(seen[1] > 0);
        assert_eq!(seen[2] + seen[3], 0, "{seen:?}");
    }

    #[test]
    fn temperature_draws_follow_the_softmax_and_the_seed() {
        let logits = [0.0, (3.0f32).ln()]; // probabilities 1/4, 3/4
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 42,
            ..SamplingParams::default()
        };
        let mut s = sampler(params.clone());
        let draws: Vec<u32> = (0..4000).map(|_| s.sample(&logits)).collect();
        let ones = draws.iter().filter(|&&t| t == 1).count() as f64 / 4000.0;
        assert!((ones - 0.75).abs() < 0.03, "share of token 1: {ones}");
        let mut again = sampler(params);
        let replay: Vec<u32> = (0..4000).map(|_| again.sample(&logits)).collect();
        assert_eq!(draws, replay, "same seed, same tokens");
    }

    #[test]
    fn nonsense_settings_are_rejected() {
        for params in [
            SamplingParams {
                temperature: -1.0,
                ..SamplingParams::default()
            },
            SamplingParams {
                temperature: f32::NAN,
                ..SamplingParams::default()
            },
            SamplingParams {
                top_p: 0.0,
                ..SamplingParams::default()
            },
            SamplingParams {
                top_p: 1.5,
                ..SamplingParams::default()
            },
            SamplingParams {
                min_p: -0.1,
                ..SamplingParams::default()
            },
            SamplingParams {
                repeat_penalty: 0.0,
                ..SamplingParams::default()
            },
        ] {
            assert!(Sampler::new(params).is_err());
        }
    }
}

//! What a simulation predicts: step times, the llama.cpp-style summary numbers, utilisation,
//! and the trace.

use conductor_runtime::schedule::{StepId, StepShape};
use conductor_runtime::trace::Trace;
use serde::Serialize;
use serde_json::json;

/// When one step ran, virtual nanoseconds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StepTiming {
    pub step: StepId,
    pub n_tokens: u32,
    pub n_past: u32,
    pub shape: StepShape,
    /// The scheduler's host handled the step request.
    pub start_ns: u64,
    /// The scheduler emitted `StepDone`.
    pub end_ns: u64,
}

impl StepTiming {
    pub fn duration_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }
}

/// A distribution of token times (nanoseconds).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TokenTimes {
    pub count: usize,
    pub mean_ns: f64,
    pub median_ns: u64,
    pub p90_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
}

impl TokenTimes {
    pub fn of(samples: &[u64]) -> TokenTimes {
        if samples.is_empty() {
            return TokenTimes::default();
        }
        let mut s = samples.to_vec();
        s.sort_unstable();
        // Nearest-rank percentiles.
        let rank = |p: f64| s[((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1];
        TokenTimes {
            count: s.len(),
            mean_ns: s.iter().map(|&x| x as f64).sum::<f64>() / s.len() as f64,
            median_ns: rank(0.5),
            p90_ns: rank(0.9),
            min_ns: s[0],
            max_ns: s[s.len() - 1],
        }
    }
}

/// How busy one track was.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TrackUse {
    /// A plan group's name, `scheduler` (its host's work between phases) or `storage`.
    pub track: String,
    pub busy_ns: u64,
    /// Length of the whole simulated run.
    pub total_ns: u64,
}

impl TrackUse {
    /// busy / total (0 for an empty run).
    pub fn fraction(&self) -> f64 {
        if self.total_ns == 0 {
            0.0
        } else {
            self.busy_ns as f64 / self.total_ns as f64
        }
    }
}

/// The prediction for one workload on one machine and plan.
#[derive(Clone, Debug, Serialize)]
pub struct SimReport {
    /// The hardware profile's name.
    pub profile: String,
    pub model: String,
    pub n_prompt: u32,
    pub n_gen: u32,
    /// Decode steps that made the `n_gen` tokens (`n_gen` without a draft).
    pub decode_steps: u32,
    /// Resident-only steps that drafted tokens for the decode steps to verify (a target
    /// drafting for itself, [`crate::DraftWorkload::resident`]; 0 otherwise).
    pub drafting_steps: u32,
    /// Threads of the scheduler's group (what `conductor bench` reports as threads).
    pub threads: u32,
    /// Every step in order: prefill steps, then decode steps.
    pub steps: Vec<StepTiming>,
    /// Until the first token's logits: the prompt's steps (or, without a prompt, the first
    /// decode step).
    pub ttft_ns: u64,
    /// From the first prefill step's start to the last one's end (0 without a prompt).
    pub prefill_ns: u64,
    /// Decode time over the tokens it made (0 without generation): the mean step time, but with
    /// a draft, whose steps make several tokens each.
    pub decode_ns_per_token: f64,
    /// Decode step times: steps run back to back, so these are the times between tokens (with
    /// a draft, between verifying steps).
    pub time_between_tokens: TokenTimes,
    pub utilisation: Vec<TrackUse>,
    /// Time at least one storage read was in flight (the `storage` track's busy time counts
    /// overlapping reads each, so with a queue it can exceed the run).
    pub storage_active_ns: u64,
    /// Bytes read from storage and neuron-cache hits and misses (0 until the scheduler loads
    /// weights from storage).
    pub bytes_read: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Events fed to the scheduler.
    pub events: u64,
    /// End of the run, virtual nanoseconds.
    pub end_ns: u64,
    /// Records and spans as asked for in `SimOptions`; the header always.
    #[serde(skip)]
    pub trace: Trace,
}

impl SimReport {
    pub(crate) fn summarise(&mut self) {
        let (prompt, gen) = self.steps.split_at(self.steps_in_prompt() as usize);
        let decode: Vec<u64> = gen.iter().map(StepTiming::duration_ns).collect();
        self.prefill_ns = match (prompt.first(), prompt.last()) {
            (Some(a), Some(b)) => b.end_ns - a.start_ns,
            _ => 0,
        };
        self.ttft_ns = if prompt.is_empty() {
            decode.first().copied().unwrap_or(0)
        } else {
            self.prefill_ns
        };
        self.time_between_tokens = TokenTimes::of(&decode);
        self.decode_ns_per_token = if self.decode_steps == self.n_gen && self.drafting_steps == 0 {
            self.time_between_tokens.mean_ns
        } else {
            decode.iter().map(|&x| x as f64).sum::<f64>() / f64::from(self.n_gen.max(1))
        };
    }

    /// Steps the prompt took (every step before the first decode or drafting step).
    fn steps_in_prompt(&self) -> u32 {
        (self.steps.len() as u32).saturating_sub(self.decode_steps + self.drafting_steps)
    }

    /// Predicted prompt-processing speed, tokens per second (`None` without a prompt).
    pub fn prompt_tok_s(&self) -> Option<f64> {
        (self.n_prompt > 0 && self.prefill_ns > 0)
            .then(|| f64::from(self.n_prompt) * 1e9 / self.prefill_ns as f64)
    }

    /// Predicted generation speed, tokens per second (`None` without generation).
    pub fn gen_tok_s(&self) -> Option<f64> {
        let total: u64 = self.steps[self.steps_in_prompt() as usize..]
            .iter()
            .map(StepTiming::duration_ns)
            .sum();
        (self.n_gen > 0 && total > 0).then(|| f64::from(self.n_gen) * 1e9 / total as f64)
    }

    /// The lines `conductor bench --json` prints for `-p n_prompt -n n_gen`: `ppN` (prefill of
    /// N tokens from an empty context) and `tgN` (N single-token steps), with the same keys.
    /// A prediction has one sample, so median = min = max; what a simulation cannot know
    /// (peak RSS, the file, the ISA) is null; `"simulated": true` and the profile are added.
    pub fn bench_json_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let tests = [
            (
                self.prompt_tok_s(),
                format!("pp{}", self.n_prompt),
                self.n_prompt,
                0,
            ),
            (self.gen_tok_s(), format!("tg{}", self.n_gen), 0, self.n_gen),
        ];
        for (tok_s, test, n_prompt, n_gen) in tests {
            let Some(tok_s) = tok_s else { continue };
            let line = json!({
                "test": test,
                "threads": self.threads,
                "n_prompt": n_prompt,
                "n_gen": n_gen,
                "tok_s": { "median": tok_s, "min": tok_s, "max": tok_s, "samples": [tok_s] },
                "peak_rss_bytes": null,
                "model": self.model,
                "model_path": null,
                "model_bytes": null,
                "params": null,
                "isa": null,
                "driver": "simulator",
                "simulated": true,
                "profile": self.profile,
            });
            lines.push(line.to_string());
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_times_use_nearest_rank() {
        let t = TokenTimes::of(&[5, 1, 4, 2, 3, 6, 7, 8, 9, 10]);
        assert_eq!((t.count, t.min_ns, t.max_ns), (10, 1, 10));
        assert_eq!((t.median_ns, t.p90_ns), (5, 9));
        assert_eq!(t.mean_ns, 5.5);
        assert_eq!(TokenTimes::of(&[]), TokenTimes::default());
        assert_eq!(TokenTimes::of(&[7]).p90_ns, 7);
    }

    #[test]
    fn track_use_fraction() {
        let u = TrackUse {
            track: "cpu".into(),
            busy_ns: 25,
            total_ns: 100,
        };
        assert_eq!(u.fraction(), 0.25);
        assert_eq!(TrackUse { total_ns: 0, ..u }.fraction(), 0.0);
    }
}

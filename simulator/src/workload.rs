//! What to simulate: a model, a prompt length, a generation length, threads and (optionally)
//! which FFN neurons each decode step activates; and the steps that makes, split exactly as
//! the real drivers split them.

use crate::SimError;
use conductor_runtime::model::{Model, WeightSource};
use conductor_runtime::plan::{FfnSelect, ModelDescription};
use conductor_runtime::schedule::StepRequest;
use conductor_runtime::trace::{ActiveSet, StepActivity};
use std::path::Path;

/// Where decode steps start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodeStart {
    /// From an empty context (`n_past` = 0, 1, 2 …), as `conductor bench`'s tgN test and
    /// llama-bench do: the numbers compare with `conductor bench`.
    #[default]
    Fresh,
    /// After the prompt (`n_past` = p, p + 1 …), as a chat turn does.
    AfterPrompt,
}

/// A run to simulate.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub model: ModelDescription,
    /// Prompt tokens, evaluated in prefill steps of at most the plan's `prefill_max_tokens`
    /// (0: no prompt test).
    pub n_prompt: u32,
    /// Single-token decode steps (0: no generation test).
    pub n_gen: u32,
    /// Threads of groups whose plan leaves them at 0 (the command line's `-t`); `None`: one per
    /// core of the group.
    pub threads: Option<u32>,
    /// Active FFN neurons per decode step. Decode step `i` (counting from 0 among decode steps)
    /// uses `activity[i % len]`, so a short sample can drive a long generation. `None` or an
    /// empty list: dense decode (every neuron active).
    pub activity: Option<Vec<StepActivity>>,
    pub decode_start: DecodeStart,
    /// How a store holds a neuron's gate row, up row and down column: together in one bundle
    /// (`true`, the only layout the runtime has; one read per bundle) or apart in three
    /// matrices, as an ordinary GGUF does (`false`: a what-if for exploration; each bundle
    /// costs three reads of a third of its bytes, as the PowerInfer-2 ablation's baseline).
    pub bundled: bool,
    /// The read of one bundle of each layer (whole pages) where a store's layers differ (a
    /// Q4_K_M store's Q4_K down columns beside its Q6_K ones: `StoreSizes::layer_bundle_bytes`);
    /// empty: every bundle reads the shape's stride.
    pub layer_bundle_bytes: Vec<u64>,
    /// Start with the neuron cache as a long run leaves it (hot segment full, cold slots
    /// holding the next-hottest units) instead of empty: steady-state decode without
    /// simulating the hundreds of tokens a large cache takes to fill.
    pub warm_cache: bool,
    /// Which FFN neurons decode steps compute. [`FfnSelect::Predicted`] (PowerInfer-2's
    /// decode): each decode layer's clusters without an active neuron are skipped, neither
    /// read nor summed (the scheduler awaits the predictions the activity gives, as the
    /// drivers feed them; the predictor's own compute is not modelled). `None`: what the
    /// plan's reads imply ([`conductor_runtime::plan::FfnPlan::implied`]: every cluster read and computed, each gate
    /// deciding under gate-first reads).
    pub ffn: Option<FfnSelect>,
    /// Speculative decoding: each decode step verifies drafted tokens (`None`: one token a
    /// step).
    pub draft: Option<DraftWorkload>,
}

/// Speculative decoding in a simulated run (`conductor simulate --draft-tokens K
/// --draft-acceptance A`). Each decode step evaluates the pending token and `tokens` drafted
/// ones in one step, with logits for every one (what `Engine::step_generation` runs), and
/// yields the expected number of tokens: the drafted tokens are kept, in order, each with
/// probability `acceptance` while the ones before it were. The drafter's own cost is
/// modelled when the target drafts for itself (`resident`, `--draft self`), not otherwise
/// (prompt lookup costs next to nothing; a draft model does not).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftWorkload {
    /// Drafted tokens a step verifies (≥ 1).
    pub tokens: u32,
    /// The chance a drafted token is kept, given the ones before it were (0..=1).
    pub acceptance: f64,
    /// The target drafts for itself (`--draft self`): each verifying step follows `tokens`
    /// resident-only one-token steps (what the budget keeps computed, nothing read).
    pub resident: bool,
}

impl DraftWorkload {
    /// Tokens a verifying step yields on average: its own and the kept prefix of the drafts,
    /// 1 + a + a² + … + a^k = (1 − a^(k+1)) / (1 − a).
    pub fn tokens_per_step(&self) -> f64 {
        (0..=self.tokens)
            .map(|i| self.acceptance.powi(i as i32))
            .sum()
    }
}

impl Workload {
    /// `n_prompt` prompt tokens and `n_gen` generated ones, `conductor bench` style: dense,
    /// one thread per core, decode from an empty context.
    pub fn new(model: ModelDescription, n_prompt: u32, n_gen: u32) -> Workload {
        Workload {
            model,
            n_prompt,
            n_gen,
            threads: None,
            activity: None,
            decode_start: DecodeStart::Fresh,
            bundled: true,
            layer_bundle_bytes: Vec::new(),
            warm_cache: false,
            ffn: None,
            draft: None,
        }
    }

    /// Checks the fields the simulation relies on; the activity must match the model.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.n_prompt == 0 && self.n_gen == 0 {
            return Err(SimError::Workload {
                field: "n_prompt".into(),
                why: "nothing to simulate: give prompt tokens or generated tokens above 0".into(),
            });
        }
        let (n_layer, n_ff) = (self.model.shape.n_layer, self.model.shape.n_ff);
        let no_activity = self.activity.as_ref().is_none_or(|a| a.is_empty());
        if let Some(d) = &self.draft {
            let why = if d.tokens == 0 {
                Some("a draft of 0 tokens verifies nothing: give 1 or more".to_string())
            } else if !(0.0..=1.0).contains(&d.acceptance) {
                Some(format!(
                    "the acceptance {} is not a probability (0 to 1)",
                    d.acceptance
                ))
            } else if !no_activity || self.ffn.is_some_and(FfnSelect::predicts) {
                Some(
                    "drafts are verified by dense steps (every neuron): drop the sparse activity"
                        .into(),
                )
            } else {
                None
            };
            if let Some(why) = why {
                return Err(SimError::Workload {
                    field: "draft".into(),
                    why,
                });
            }
        }
        if self.model.shape.is_moe() && self.n_gen > 0 && no_activity {
            return Err(SimError::Workload {
                field: "activity".into(),
                why: format!(
                    "`{}` is a mixture of experts: its decode steps need the router's choices \
                     (activity; synthesize_activity makes them from published statistics)",
                    self.model.name
                ),
            });
        }
        for (i, step) in self.activity.iter().flatten().enumerate() {
            if step.layers.len() != n_layer as usize {
                return Err(SimError::Activity {
                    field: format!("activity[{i}].layers"),
                    why: format!(
                        "lists {} layers; the model `{}` has {n_layer}",
                        step.layers.len(),
                        self.model.name
                    ),
                });
            }
            for (l, set) in step.layers.iter().enumerate() {
                let ActiveSet::Neurons(neurons) = set else {
                    continue;
                };
                let field = || format!("activity[{i}].layers[{l}]");
                if !neurons.is_sorted_by(|a, b| a < b) {
                    return Err(SimError::Activity {
                        field: field(),
                        why: "neuron indices must be strictly ascending".into(),
                    });
                }
                if let Some(&last) = neurons.last().filter(|&&n| n >= n_ff) {
                    return Err(SimError::Activity {
                        field: field(),
                        why: format!("neuron {last} is out of range (the model has {n_ff})"),
                    });
                }
            }
        }
        Ok(())
    }

    /// The steps of the run, in order: prefill steps split exactly as `InlineDriver::eval`
    /// splits a prompt (chunks of `max_step_tokens`, logits for the last token only), then the
    /// decode steps (one token each, with logits; with a draft, the pending token and the
    /// drafted ones, with logits for each, until `n_gen` tokens are made: verifying step `i`
    /// makes the tokens that take the running expectation `(i + 1) · tokens_per_step` past a
    /// whole number; a target drafting for itself drafts them first, one resident-only step
    /// each).
    pub fn steps(&self, max_step_tokens: u32) -> Vec<PlannedStep> {
        let mut out = Vec::new();
        let max = max_step_tokens.max(1);
        let p = self.n_prompt;
        let logits_from = p.saturating_sub(1);
        let mut start = 0;
        while start < p {
            let len = max.min(p - start);
            out.push(PlannedStep {
                request: StepRequest {
                    step: out.len() as u64,
                    n_tokens: len,
                    n_past: start,
                    logits_from: logits_from.saturating_sub(start).min(len),
                    sequences: 1,
                    resident_only: false,
                },
                decode_index: None,
            });
            start += len;
        }
        let first_pos = match self.decode_start {
            DecodeStart::Fresh => 0,
            DecodeStart::AfterPrompt => p,
        };
        let (n_tokens, per_step) = match self.draft {
            Some(d) => ((d.tokens + 1).min(max), d.tokens_per_step()),
            None => (1, 1.0),
        };
        let drafting = self
            .draft
            .filter(|d| d.resident)
            .map_or(0, |_| n_tokens - 1);
        let expected = |i: u32| (f64::from(i) * per_step).floor() as u32;
        let (mut made, mut verified, mut i) = (0, 0, 0);
        while made < self.n_gen {
            for k in 0..drafting {
                out.push(PlannedStep {
                    request: StepRequest {
                        step: out.len() as u64,
                        n_tokens: 1,
                        n_past: first_pos + made + k,
                        logits_from: 0,
                        sequences: 1,
                        resident_only: true,
                    },
                    decode_index: Some(i),
                });
                i += 1;
            }
            out.push(PlannedStep {
                request: StepRequest {
                    step: out.len() as u64,
                    n_tokens,
                    n_past: first_pos + made,
                    logits_from: 0,
                    sequences: 1,
                    resident_only: false,
                },
                decode_index: Some(i),
            });
            made += (expected(verified + 1) - expected(verified)).clamp(1, self.n_gen - made);
            verified += 1;
            i += 1;
        }
        out
    }

    /// The activity of decode step `index`, if the workload has any.
    pub(crate) fn activity_of(&self, index: u32) -> Option<&StepActivity> {
        let a = self.activity.as_deref().filter(|a| !a.is_empty())?;
        Some(&a[index as usize % a.len()])
    }
}

/// One step of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedStep {
    pub request: StepRequest,
    /// `Some(i)` for the `i`-th decode step; `None` for a prefill step.
    pub decode_index: Option<u32>,
}

/// The description of a GGUF model file (its shape and weight types; the weights stay
/// mapped only while this runs).
pub fn describe_model_file(path: &Path) -> Result<ModelDescription, SimError> {
    Model::open(path, WeightSource::Mapped)
        .map(|m| m.description())
        .map_err(|source| SimError::Model {
            path: path.display().to_string(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::named_shape;

    #[test]
    fn drafted_decode_steps_make_the_expected_tokens() {
        let mut w = Workload::new(named_shape("smollm2-135m").unwrap(), 0, 10);
        w.draft = Some(DraftWorkload {
            tokens: 3,
            acceptance: 0.5,
            resident: false,
        });
        // 1 + 0.5 + 0.25 + 0.125 = 1.875 tokens a step: the running expectation passes
        // 1, 3, 5, 7, 9 and 10 (cut to n_gen) after steps 1..=6.
        let steps = w.steps(512);
        let got: Vec<_> = steps
            .iter()
            .map(|s| (s.request.n_tokens, s.request.n_past, s.decode_index))
            .collect();
        let want: Vec<_> = [0, 1, 3, 5, 7, 9]
            .iter()
            .enumerate()
            .map(|(i, &past)| (4, past, Some(i as u32)))
            .collect();
        assert_eq!(got, want);
        // Never kept: one token a step; always kept: four.
        w.draft = Some(DraftWorkload {
            tokens: 3,
            acceptance: 0.0,
            resident: false,
        });
        assert_eq!(w.steps(512).len(), 10);
        w.draft = Some(DraftWorkload {
            tokens: 3,
            acceptance: 1.0,
            resident: false,
        });
        assert_eq!(w.steps(512).len(), 3);
        // Drafting for itself: three resident-only steps before each verifying step, at the
        // positions the drafted tokens take.
        w.draft = Some(DraftWorkload {
            tokens: 3,
            acceptance: 1.0,
            resident: true,
        });
        let got: Vec<_> = w
            .steps(512)
            .iter()
            .map(|s| {
                (
                    s.request.n_tokens,
                    s.request.n_past,
                    s.request.resident_only,
                )
            })
            .collect();
        let round = |at: u32| {
            [
                (1, at, true),
                (1, at + 1, true),
                (1, at + 2, true),
                (4, at, false),
            ]
        };
        let want: Vec<_> = [0, 4, 8].into_iter().flat_map(round).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn prompts_split_like_the_inline_driver() {
        let w = Workload::new(named_shape("smollm2-135m").unwrap(), 1100, 2);
        let steps = w.steps(512);
        let reqs: Vec<_> = steps
            .iter()
            .map(|s| {
                (
                    s.request.n_tokens,
                    s.request.n_past,
                    s.request.logits_from,
                    s.decode_index,
                )
            })
            .collect();
        assert_eq!(
            reqs,
            vec![
                (512, 0, 512, None),
                (512, 512, 512, None),
                (76, 1024, 75, None),
                (1, 0, 0, Some(0)),
                (1, 1, 0, Some(1)),
            ]
        );
        assert!(steps
            .iter()
            .enumerate()
            .all(|(i, s)| s.request.step == i as u64));
        let w = Workload {
            decode_start: DecodeStart::AfterPrompt,
            ..w
        };
        assert_eq!(w.steps(512)[3].request.n_past, 1100);
    }

    #[test]
    fn activity_is_checked_against_the_model() {
        let model = named_shape("smollm2-135m").unwrap();
        let mut w = Workload::new(model, 0, 4);
        w.activity = Some(vec![StepActivity {
            step: 0,
            layers: vec![ActiveSet::All; 29],
        }]);
        let e = w.validate().unwrap_err().to_string();
        assert_eq!(
            e,
            "activity field `activity[0].layers`: lists 29 layers; the model `smollm2-135m` has 30"
        );
        let mut layers = vec![ActiveSet::All; 30];
        layers[3] = ActiveSet::Neurons(vec![1, 5, 5]);
        w.activity = Some(vec![StepActivity { step: 0, layers }]);
        assert!(w
            .validate()
            .unwrap_err()
            .to_string()
            .contains("`activity[0].layers[3]`: neuron indices must be strictly ascending"));
        let mut layers = vec![ActiveSet::All; 30];
        layers[0] = ActiveSet::Neurons(vec![1, 1536]);
        w.activity = Some(vec![StepActivity { step: 0, layers }]);
        assert!(w
            .validate()
            .unwrap_err()
            .to_string()
            .contains("out of range"));
        w.activity = None;
        w.n_gen = 0;
        assert!(matches!(w.validate(), Err(SimError::Workload { .. })));
    }
}

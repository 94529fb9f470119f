//! Models known by name, so plans can be simulated without their files, and for the sparse
//! ones the published activation statistics their decode steps are synthesized from.
//!
//! Every dimension comes from the model's released `config.json` (named beside it); every
//! statistic from the paper that measured it (named in [`ActivationStats::sources`]).
//! Synthesized steps follow those statistics and nothing else: they say how much a token
//! touches and how concentrated it is, never what a real model would compute.

use conductor_runtime::plan::{ModelDescription, ModelShape, WeightTypes};
use conductor_runtime::quant::GgmlType;
use conductor_runtime::sparse::profile::{LevelProfile, ModelProfile};
use conductor_runtime::trace::{ActiveSet, StepActivity};

/// Names [`named_shape`] knows.
pub const NAMED_SHAPES: &[&str] = &[
    "smollm2-135m",
    "llama-2-7b",
    "llama-2-13b",
    "mistral-7b",
    "bamboo-7b",
    "turbosparse-mistral-7b",
    "turbosparse-mixtral-47b",
];

/// A llama-family shape: layers, width, FFN width, query and key/value heads (head size
/// `n_embd / n_head`), vocabulary; FFN clusters in whole 32-value blocks, no store, dense FFN.
fn llama_shape(
    n_layer: u32,
    n_embd: u32,
    n_ff: u32,
    n_head: u32,
    n_head_kv: u32,
    n_vocab: u32,
) -> ModelShape {
    ModelShape {
        n_layer,
        n_embd,
        n_ff,
        n_head,
        n_head_kv,
        head_dim: n_embd / n_head,
        n_vocab,
        ffn_granule: 32,
        ffn_bundle: 0,
        ffn_bundle_stride: 0,
        ffn_bundle_gate_bytes: 0,
        n_expert: 0,
        n_expert_used: 0,
    }
}

/// Every matrix in `matrices`, the output projection in `output`.
fn uniform(matrices: GgmlType, output: GgmlType) -> WeightTypes {
    WeightTypes {
        attn_q: matrices,
        attn_k: matrices,
        attn_v: matrices,
        attn_out: matrices,
        ffn_gate: matrices,
        ffn_up: matrices,
        ffn_down: matrices,
        output,
    }
}

/// A model known by name.
pub fn named_shape(name: &str) -> Option<ModelDescription> {
    // Mistral-7B's dimensions (mistralai/Mistral-7B-v0.1 config.json): hidden 4096,
    // intermediate 14336, 32 layers, 32 query heads over 8 key/value heads, vocabulary 32000.
    // Bamboo-7B (PowerInfer/Bamboo-base-v0_1) and TurboSparse-Mistral-7B
    // (PowerInfer/TurboSparse-Mistral-Instruct) keep them and change only the activation.
    let mistral = || llama_shape(32, 4096, 14336, 32, 8, 32000);
    // The phone models run in INT4 as the paper runs them: Q4_0 matrices, Q6_K output (as
    // llama.cpp's Q4_0 files keep it).
    let int4 = || uniform(GgmlType::Q4_0, GgmlType::Q6_K);
    let (shape, types) = match name {
        "smollm2-135m" => (
            llama_shape(30, 576, 1536, 9, 3, 49152),
            uniform(GgmlType::Q4_1, GgmlType::Q8_0),
        ),
        "llama-2-7b" => (llama_shape(32, 4096, 11008, 32, 32, 32000), int4()),
        // meta-llama/Llama-2-13b-hf config.json: hidden 5120, intermediate 13824, 40 layers,
        // 40 heads (no grouped-query attention), vocabulary 32000.
        "llama-2-13b" => (llama_shape(40, 5120, 13824, 40, 40, 32000), int4()),
        "mistral-7b" | "bamboo-7b" | "turbosparse-mistral-7b" => (mistral(), int4()),
        // mistralai/Mixtral-8x7B-v0.1 config.json (TurboSparse-Mixtral keeps it): Mistral-7B's
        // attention, 8 experts of 14336 neurons per layer, 2 used per token
        // (num_local_experts 8, num_experts_per_tok 2). The layer's neuron space holds the 8
        // experts side by side.
        "turbosparse-mixtral-47b" => (
            ModelShape {
                n_ff: 8 * 14336,
                n_expert: 8,
                n_expert_used: 2,
                ..mistral()
            },
            int4(),
        ),
        _ => return None,
    };
    Some(ModelDescription {
        name: name.to_string(),
        shape,
        types,
    })
}

/// How a sparse model's FFN neurons fire in decode, as published.
#[derive(Clone, Debug, PartialEq)]
pub struct ActivationStats {
    /// Share of an FFN's neurons (of a chosen expert's, in a mixture of experts) active in a
    /// decode token, averaged over layers.
    pub active_share: f64,
    /// Share of the neurons that are hot ...
    pub hot_share: f64,
    /// ... and the share of all activations they take (the rest spread over the cold ones).
    pub hot_mass: f64,
    /// Mixture of experts: how often a token's first-choice expert in a layer is the previous
    /// token's (uniform routing would give 1 / n_expert).
    pub first_expert_repeat: f64,
    /// The share of a token's active neurons that were active in the token before (LLM in a
    /// Flash's window of 1); `None`: tokens drawn independently (no paper gives the figure
    /// for these models).
    pub reuse: Option<f64>,
    /// Where each figure comes from.
    pub sources: String,
}

/// A model's activation statistics as its activation profile measured them (`conductor
/// profile`) at the level nearest `sparsity`: means over layers of the active share, the
/// share of neurons taking 80% of the activations and the next-token reuse. What the
/// published figures above say for the sparse shapes, measured for a real model.
pub fn measured_stats(profile: &ModelProfile, sparsity: f32) -> Option<ActivationStats> {
    let levels: Vec<&LevelProfile> = profile
        .layers
        .iter()
        .map(|l| {
            l.levels.iter().min_by(|a, b| {
                (a.target - sparsity)
                    .abs()
                    .total_cmp(&(b.target - sparsity).abs())
            })
        })
        .collect::<Option<_>>()?;
    let n = levels.len() as f64;
    let mean =
        |f: &dyn Fn(&LevelProfile) -> f32| levels.iter().map(|l| f64::from(f(l))).sum::<f64>() / n;
    Some(ActivationStats {
        active_share: mean(&|l| l.active_share),
        hot_share: mean(&|l| l.hot_share),
        hot_mass: HOT_MASS,
        first_expert_repeat: 0.0,
        reuse: Some(mean(&|l| l.reuse.first().copied().unwrap_or(0.0))),
        sources: format!(
            "measured: `conductor profile` of {} over {} tokens of {}, at {:.0}% sparsity",
            profile.source,
            profile.tokens,
            profile.calibration,
            levels[0].target * 100.0
        ),
    })
}

/// PowerInfer (arXiv 2312.12456, §3 and its authors' announcement): activations follow a power
/// law, about 20% of the neurons take about 80% of them.
const HOT_SHARE: f64 = 0.2;
const HOT_MASS: f64 = 0.8;

/// The published activation statistics of a named sparse model; `None` for dense ones.
pub fn activation_stats(name: &str) -> Option<ActivationStats> {
    match name {
        "bamboo-7b" => Some(ActivationStats {
            active_share: 0.15,
            hot_share: HOT_SHARE,
            hot_mass: HOT_MASS,
            first_expert_repeat: 0.0,
            reuse: None,
            sources: "sparsity: Bamboo-base-v0_1 model card (\"nearly 85% sparsity\"); \
                      hot 20% of neurons take 80% of activations: PowerInfer (arXiv 2312.12456)"
                .into(),
        }),
        "turbosparse-mistral-7b" => Some(ActivationStats {
            active_share: 0.10,
            hot_share: HOT_SHARE,
            hot_mass: HOT_MASS,
            first_expert_repeat: 0.0,
            reuse: None,
            sources: "sparsity: TurboSparse (arXiv 2406.05955) §6.2, 90% of neurons inactive \
                      per layer on average; hot 20% of neurons take 80% of activations: \
                      PowerInfer (arXiv 2312.12456)"
                .into(),
        }),
        "turbosparse-mixtral-47b" => Some(ActivationStats {
            active_share: 0.15,
            hot_share: HOT_SHARE,
            hot_mass: HOT_MASS,
            first_expert_repeat: 0.25,
            reuse: None,
            sources: "sparsity: TurboSparse (arXiv 2406.05955) §6.2, 85% of an expert's \
                      neurons inactive, 2 of 8 experts (3% of a layer's FFN per token); \
                      hot 20% / 80%: PowerInfer (arXiv 2312.12456), assumed to hold within an \
                      expert (no per-expert figure is published); first-choice expert repeated \
                      by consecutive tokens ~25% vs 12.5% uniform: Mixtral of Experts (arXiv \
                      2401.04088) §5, middle and late layers"
                .into(),
        }),
        _ => None,
    }
}

/// A uniform number in [0, 1) from four keys: splitmix64 over their mix. The same keys always
/// give the same number, on every machine.
fn draw(seed: u64, step: u32, layer: u32, index: u32) -> f64 {
    let mut z = seed
        ^ (u64::from(step).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        ^ (u64::from(layer) << 40)
        ^ u64::from(index);
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// Seed of the hot/cold assignment (fixed: a model's hot neurons do not change between runs).
const HOT_SEED: u64 = 0x6e65_7572_6f6e;

/// Per layer and neuron, how often the neuron fires in a decode token, given its expert was
/// chosen (for a dense FFN, unconditionally): hot neurons (a `hot_share` of them, scattered
/// by a fixed hash as they are in a real model) at `hot_mass · active / hot_share`, the others
/// at `(1 − hot_mass) · active / (1 − hot_share)`; the mean is `active_share`.
pub fn neuron_frequencies(model: &ModelDescription, stats: &ActivationStats) -> Vec<Vec<f32>> {
    let s = &model.shape;
    let hot = (stats.hot_mass * stats.active_share / stats.hot_share).min(1.0) as f32;
    let cold =
        ((1.0 - stats.hot_mass) * stats.active_share / (1.0 - stats.hot_share)).min(1.0) as f32;
    (0..s.n_layer)
        .map(|l| {
            (0..s.n_ff)
                .map(|i| {
                    if draw(HOT_SEED, 0, l, i) < stats.hot_share {
                        hot
                    } else {
                        cold
                    }
                })
                .collect()
        })
        .collect()
}

/// The probability a neuron of frequency `f` fires given whether it fired in the token before
/// (`was`), in a two-state chain that keeps an active neuron active with probability `reuse`
/// (more for a neuron too frequent for that, so that `f` stays its frequency).
pub fn chained(f: f64, reuse: f64, was: bool) -> f64 {
    let keep = reuse.max((2.0 * f - 1.0) / f.max(1e-12));
    if was {
        keep
    } else if f < 1.0 {
        f * (1.0 - keep) / (1.0 - f)
    } else {
        1.0
    }
}

/// `steps` decode steps of `model` following `stats`, the same for the same `seed`.
///
/// A dense FFN: neuron `i` fires with its [`neuron_frequencies`] probability, independently
/// per step. A mixture of experts: each layer's router picks `n_expert_used` distinct experts;
/// each slot keeps the previous token's expert with the probability that makes the first
/// choice repeat `first_expert_repeat` of the time, else draws uniformly; then the chosen
/// experts' neurons fire as a dense FFN's do. With a measured `reuse`, each neuron's draws
/// form a chain ([`chained`]) that keeps that share of a token's active neurons active in the
/// next. Returns an empty list for `steps == 0`.
pub fn synthesize_activity(
    model: &ModelDescription,
    stats: &ActivationStats,
    steps: u32,
    seed: u64,
) -> Vec<StepActivity> {
    let s = &model.shape;
    let freq = neuron_frequencies(model, stats);
    let n_expert = s.n_expert.max(1);
    let used = if s.n_expert == 0 {
        1
    } else {
        s.n_expert_used.clamp(1, n_expert)
    };
    let per_expert = s.ffn_per_expert();
    // P(first choice repeats) = keep + (1 − keep) / E  ⇒  keep = (r − 1/E) / (1 − 1/E).
    let uniform = 1.0 / f64::from(n_expert);
    let keep = if n_expert > 1 {
        ((stats.first_expert_repeat - uniform) / (1.0 - uniform)).clamp(0.0, 1.0)
    } else {
        1.0
    };
    let mut previous: Vec<Vec<u32>> = vec![Vec::new(); s.n_layer as usize];
    // Per layer, the neurons active in the step before (for `reuse`).
    let mut was_active: Vec<Vec<bool>> = match stats.reuse {
        Some(_) => vec![vec![false; s.n_ff as usize]; s.n_layer as usize],
        None => Vec::new(),
    };
    let mut out = Vec::with_capacity(steps as usize);
    for step in 0..steps {
        let mut layers = Vec::with_capacity(s.n_layer as usize);
        for l in 0..s.n_layer {
            let prev = &previous[l as usize];
            let mut chosen: Vec<u32> = Vec::with_capacity(used as usize);
            for slot in 0..used {
                let kept = prev
                    .get(slot as usize)
                    .filter(|e| !chosen.contains(e))
                    .filter(|_| draw(seed, step, l, u32::MAX - 2 * slot) < keep);
                let expert = match kept {
                    Some(&e) => e,
                    None => {
                        let free: Vec<u32> =
                            (0..n_expert).filter(|e| !chosen.contains(e)).collect();
                        let r = draw(seed, step, l, u32::MAX - 2 * slot - 1);
                        free[((r * free.len() as f64) as usize).min(free.len() - 1)]
                    }
                };
                chosen.push(expert);
            }
            previous[l as usize] = chosen.clone();
            chosen.sort_unstable();
            let layer_freq = &freq[l as usize];
            let mut active = Vec::new();
            for &e in &chosen {
                for i in e * per_expert..(e + 1) * per_expert {
                    let f = f64::from(layer_freq[i as usize]);
                    let p = match stats.reuse {
                        Some(a) if step > 0 => chained(f, a, was_active[l as usize][i as usize]),
                        _ => f,
                    };
                    if draw(seed, step + 1, l, i) < p {
                        active.push(i);
                    }
                }
            }
            if let Some(was) = was_active.get_mut(l as usize) {
                was.fill(false);
                for &i in &active {
                    was[i as usize] = true;
                }
            }
            layers.push(ActiveSet::Neurons(active));
        }
        out.push(StepActivity {
            step: u64::from(step),
            layers,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_shapes_are_complete() {
        for name in NAMED_SHAPES {
            let d = named_shape(name).unwrap();
            assert_eq!(d.name, *name);
            assert!(d.dense_weight_bytes() > 0);
        }
        assert!(named_shape("gpt-5").is_none());
        let gb = |n: &str| named_shape(n).unwrap().dense_weight_bytes() as f64 / 1e9;
        // 7B parameters at 4.5 bits, plus the Q6_K output: about 3.6 GB.
        assert!(
            (3.4..3.9).contains(&gb("llama-2-7b")),
            "{}",
            gb("llama-2-7b")
        );
        // 13B at 4.5 bits: about 7 GB; Mistral-7B (7.2B): about 3.9 GB.
        assert!((6.8..7.6).contains(&gb("llama-2-13b")));
        assert!((3.7..4.2).contains(&gb("mistral-7b")));
        // Mixtral-8x7B: 46.7B parameters at 4.5 bits, about 26 GB.
        let mixtral = gb("turbosparse-mixtral-47b");
        assert!((25.0..27.5).contains(&mixtral), "{mixtral}");
        let m = named_shape("turbosparse-mixtral-47b").unwrap().shape;
        assert_eq!(
            (m.n_expert, m.n_expert_used, m.ffn_per_expert()),
            (8, 2, 14336)
        );
        // The sparse models have statistics with sources; the dense ones none.
        for name in [
            "bamboo-7b",
            "turbosparse-mistral-7b",
            "turbosparse-mixtral-47b",
        ] {
            let s = activation_stats(name).unwrap();
            assert!(s.sources.contains("arXiv"), "{name}");
        }
        assert!(activation_stats("llama-2-7b").is_none());
    }

    #[test]
    fn frequencies_average_to_the_published_sparsity() {
        let model = named_shape("turbosparse-mistral-7b").unwrap();
        let stats = activation_stats("turbosparse-mistral-7b").unwrap();
        let freq = neuron_frequencies(&model, &stats);
        assert_eq!(freq.len(), 32);
        for layer in &freq {
            let mean = layer.iter().map(|&f| f64::from(f)).sum::<f64>() / layer.len() as f64;
            assert!((mean - 0.10).abs() < 0.005, "{mean}");
            // The hot fifth takes about 80% of the activations.
            let hot: f64 = layer
                .iter()
                .filter(|&&f| f > 0.1)
                .map(|&f| f64::from(f))
                .sum();
            let share = hot / (mean * layer.len() as f64);
            assert!((share - 0.8).abs() < 0.02, "{share}");
        }
        // Hot neurons are scattered, and the same in every call.
        assert_ne!(freq[0], freq[1]);
        assert_eq!(neuron_frequencies(&model, &stats), freq);
    }

    #[test]
    fn moe_steps_use_the_routers_experts_and_repeat_as_published() {
        let model = named_shape("turbosparse-mixtral-47b").unwrap();
        let stats = activation_stats("turbosparse-mixtral-47b").unwrap();
        let steps = synthesize_activity(&model, &stats, 40, 7);
        assert_eq!(steps.len(), 40);
        let per = 14336;
        let mut repeats = 0;
        let mut pairs = 0;
        let mut prev_experts: Vec<Vec<u32>> = vec![Vec::new(); 32];
        let mut active = 0usize;
        for step in &steps {
            assert_eq!(step.layers.len(), 32);
            for (l, set) in step.layers.iter().enumerate() {
                let ActiveSet::Neurons(n) = set else {
                    panic!("neurons")
                };
                assert!(n.is_sorted_by(|a, b| a < b));
                let mut experts: Vec<u32> = n.iter().map(|&i| i / per).collect();
                experts.dedup();
                // Exactly the two chosen experts fire (each has ~2150 active neurons).
                assert_eq!(experts.len(), 2, "{experts:?}");
                if !prev_experts[l].is_empty() {
                    pairs += 1;
                    repeats += experts
                        .iter()
                        .filter(|e| prev_experts[l].contains(e))
                        .count();
                }
                prev_experts[l] = experts;
                active += n.len();
            }
        }
        // 15% of two experts' neurons: 3% of the layer.
        let share = active as f64 / (40.0 * 32.0 * 8.0 * per as f64);
        assert!((share - 0.0375).abs() < 0.003, "{share}");
        // Experts repeat more often than uniform routing's 2 × 2/8 = 0.5 per token pair.
        let per_pair = repeats as f64 / pairs as f64;
        assert!(per_pair > 0.55 && per_pair < 1.2, "{per_pair}");
        // Deterministic, and the seed matters.
        assert_eq!(
            synthesize_activity(&model, &stats, 3, 7),
            steps[..3].to_vec()
        );
        assert_ne!(
            synthesize_activity(&model, &stats, 3, 8),
            steps[..3].to_vec()
        );
    }

    #[test]
    fn measured_reuse_carries_into_the_steps() {
        let model = named_shape("bamboo-7b").unwrap();
        let stats = ActivationStats {
            reuse: Some(0.7),
            ..activation_stats("bamboo-7b").unwrap()
        };
        let steps = synthesize_activity(&model, &stats, 6, 3);
        let (mut kept, mut total, mut active) = (0usize, 0usize, 0usize);
        for w in steps.windows(2) {
            for (a, b) in w[0].layers.iter().zip(&w[1].layers) {
                let (ActiveSet::Neurons(a), ActiveSet::Neurons(b)) = (a, b) else {
                    panic!("neurons")
                };
                kept += b.iter().filter(|n| a.binary_search(n).is_ok()).count();
                total += b.len();
                active += b.len();
            }
        }
        let reuse = kept as f64 / total as f64;
        assert!((reuse - 0.7).abs() < 0.02, "{reuse}");
        // The frequencies hold: still 15% active.
        let share = active as f64 / (5.0 * 32.0 * 14336.0);
        assert!((share - 0.15).abs() < 0.01, "{share}");
        // Without reuse, tokens are independent: about the frequency-weighted share.
        let steps = synthesize_activity(&model, &activation_stats("bamboo-7b").unwrap(), 3, 3);
        let ActiveSet::Neurons(a) = &steps[1].layers[0] else {
            panic!()
        };
        let ActiveSet::Neurons(b) = &steps[2].layers[0] else {
            panic!()
        };
        let independent =
            b.iter().filter(|n| a.binary_search(n).is_ok()).count() as f64 / b.len() as f64;
        assert!(independent < 0.5, "{independent}");
    }

    #[test]
    fn dense_ffn_steps_follow_the_frequencies() {
        let model = named_shape("bamboo-7b").unwrap();
        let stats = activation_stats("bamboo-7b").unwrap();
        let steps = synthesize_activity(&model, &stats, 4, 1);
        let mut total = 0;
        for step in &steps {
            for set in &step.layers {
                let ActiveSet::Neurons(n) = set else {
                    panic!("neurons")
                };
                total += n.len();
            }
        }
        let share = total as f64 / (4.0 * 32.0 * 14336.0);
        assert!((share - 0.15).abs() < 0.01, "{share}");
        assert!(synthesize_activity(&model, &stats, 0, 1).is_empty());
    }
}

//! What an activation profile tells the planner: which neurons decode steps activate (to score
//! sparse plans with the simulator: measured frequencies at the plan's sparsity, and measured
//! reuse between consecutive tokens) and which cache units are hottest (the plan's hot set).

use conductor_runtime::sparse::profile::{LayerProfile, ModelProfile};
use conductor_runtime::trace::{ActiveSet, StepActivity};

/// The profile's per-neuron frequencies and next-token reuse of `layer` at `sparsity`: those
/// of the level ([`LevelProfile`]) nearest it, or, for a profile without levels, the
/// frequencies counted at its reference sparsity and no reuse (independent tokens).
fn layer_shape(layer: &LayerProfile, sparsity: f32) -> (&[f32], Option<f32>) {
    layer
        .levels
        .iter()
        .min_by(|a, b| {
            (a.target - sparsity)
                .abs()
                .total_cmp(&(b.target - sparsity).abs())
        })
        .map_or((&layer.frequency[..], None), |lv| {
            (&lv.frequency[..], lv.reuse.first().copied())
        })
}

/// `steps` decode steps whose active neurons follow the profile at `sparsity`: neuron `i` of
/// layer `l` is active in a step with the probability the profile measured for it at the level
/// nearest `sparsity` (its `frequency`), and, where the profile measured how often a token's
/// active neurons were active in the token before (`reuse`, k = 1), as a two-state chain that
/// keeps an active neuron active with that probability (a neuron too frequent for it keeps
/// more, so its frequency holds); draws come from a fixed seed, so the same profile always
/// gives the same steps.
pub fn activity_from_profile(
    profile: &ModelProfile,
    sparsity: f32,
    steps: u32,
) -> Vec<StepActivity> {
    let shapes: Vec<(&[f32], Option<f32>)> = profile
        .layers
        .iter()
        .map(|l| layer_shape(l, sparsity))
        .collect();
    let mut previous: Vec<Vec<bool>> = shapes.iter().map(|(f, _)| vec![false; f.len()]).collect();
    (0..steps)
        .map(|step| StepActivity {
            step: u64::from(step),
            layers: shapes
                .iter()
                .zip(previous.iter_mut())
                .enumerate()
                .map(|(l, ((frequency, reuse), was))| {
                    let mut active = Vec::new();
                    for (i, (&f, was)) in frequency.iter().zip(was.iter_mut()).enumerate() {
                        let f = f64::from(f);
                        let p = match reuse {
                            Some(a) if step > 0 => {
                                let keep = f64::from(*a).max((2.0 * f - 1.0) / f.max(1e-12));
                                if *was {
                                    keep
                                } else if f < 1.0 {
                                    f * (1.0 - keep) / (1.0 - f)
                                } else {
                                    1.0
                                }
                            }
                            _ => f,
                        };
                        *was = unit_draw(step, l as u32, i as u32) < p;
                        if *was {
                            active.push(i as u32);
                        }
                    }
                    ActiveSet::Neurons(active)
                })
                .collect(),
        })
        .collect()
}

/// A uniform number in [0, 1) for (step, layer, neuron): splitmix64 of the three.
fn unit_draw(step: u32, layer: u32, neuron: u32) -> f64 {
    let mut z = (u64::from(step) << 40) ^ (u64::from(layer) << 20) ^ u64::from(neuron);
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The store's FFN cache units (bundles of `bundle` neurons, layer-major) ranked hottest
/// first: by the expected number of active neurons a bundle holds at `sparsity` (the sum of
/// its neurons' frequencies at the nearest level); ties keep unit order.
pub fn hot_units_from_profile(profile: &ModelProfile, sparsity: f32, bundle: u32) -> Vec<u32> {
    hot_units_from_frequencies(
        profile.layers.iter().map(|l| layer_shape(l, sparsity).0),
        bundle,
    )
}

/// [`hot_units_from_profile`] from per-layer neuron frequencies (a profile's, or synthesized
/// from published statistics).
pub fn hot_units_from_frequencies<'a>(
    layers: impl IntoIterator<Item = &'a [f32]>,
    bundle: u32,
) -> Vec<u32> {
    let bundle = bundle.max(1) as usize;
    let mut units: Vec<(u32, f64)> = Vec::new();
    let mut per_layer = None;
    for (l, frequency) in layers.into_iter().enumerate() {
        let per_layer = *per_layer.get_or_insert(frequency.len().div_ceil(bundle));
        for (b, chunk) in frequency.chunks(bundle).enumerate() {
            let mass: f64 = chunk.iter().map(|&f| f64::from(f)).sum();
            units.push(((l * per_layer + b) as u32, mass));
        }
    }
    units.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    units.into_iter().map(|(u, _)| u).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use conductor_runtime::plan::ModelIdentity;
    use conductor_runtime::sparse::profile::LayerProfile;

    fn profile(layers: Vec<Vec<f32>>) -> ModelProfile {
        let n_ff = layers[0].len();
        ModelProfile {
            version: 1,
            model: ModelIdentity {
                arch: "llama".into(),
                n_layer: layers.len() as u32,
                n_embd: 64,
                n_ff: n_ff as u32,
                relu: false,
                norms_crc32: 0,
            },
            source: "test.gguf".into(),
            calibration: "test".into(),
            tokens: 1000,
            grid: vec![0.0, 0.5],
            reference_sparsity: 0.5,
            layers: layers
                .into_iter()
                .map(|frequency| LayerProfile {
                    importance: vec![1.0; n_ff],
                    thresholds: vec![0.0, 0.1],
                    kept_mass: vec![1.0, 0.9],
                    zero_fraction: 0.0,
                    mean_abs: vec![0.1; n_ff],
                    frequency,
                    mass_hot_share: 0.2,
                    levels: Vec::new(),
                })
                .collect(),
            predictors: None,
            operating_point: None,
        }
    }

    #[test]
    fn steps_follow_the_profiles_frequencies_and_repeat_exactly() {
        // Neuron 0 always fires, neuron 1 never, the other 2000 half the time.
        let mut freq = vec![1.0, 0.0];
        freq.extend(std::iter::repeat_n(0.5, 2000));
        let p = profile(vec![freq.clone(), freq]);
        let steps = activity_from_profile(&p, 0.5, 8);
        assert_eq!(steps.len(), 8);
        let mut counts = Vec::new();
        for (i, s) in steps.iter().enumerate() {
            assert_eq!(s.step, i as u64);
            assert_eq!(s.layers.len(), 2);
            for set in &s.layers {
                let ActiveSet::Neurons(n) = set else {
                    panic!("a set of neurons")
                };
                assert!(n.is_sorted_by(|a, b| a < b));
                assert_eq!(n.first(), Some(&0));
                assert!(n.get(1) != Some(&1));
                counts.push(n.len());
            }
        }
        // About half of 2000 plus neuron 0, and the layers and steps differ.
        assert!(
            counts.iter().all(|&c| (900..1100).contains(&c)),
            "{counts:?}"
        );
        assert!(steps[0].layers[0] != steps[0].layers[1]);
        assert!(steps[0].layers[0] != steps[1].layers[0]);
        assert_eq!(activity_from_profile(&p, 0.5, 8), steps);
    }

    /// The share of step t's active neurons of layer 0 that were active in step t − 1.
    fn measured_reuse(steps: &[StepActivity]) -> f64 {
        let (mut kept, mut total) = (0usize, 0usize);
        for w in steps.windows(2) {
            let (ActiveSet::Neurons(a), ActiveSet::Neurons(b)) = (&w[0].layers[0], &w[1].layers[0])
            else {
                panic!("sets of neurons")
            };
            kept += b.iter().filter(|n| a.binary_search(n).is_ok()).count();
            total += b.len();
        }
        kept as f64 / total as f64
    }

    #[test]
    fn measured_levels_give_their_frequencies_and_reuse() {
        use conductor_runtime::sparse::profile::LevelProfile;
        // 4000 neurons at 25% (and a few always on): with reuse 0.6 measured at 70% sparsity
        // the steps keep 60% of a token's neurons from the one before, and still fire 25% of
        // the time; at 30% (levels nearest: 30%) they follow that level's frequencies.
        let mut freq = vec![0.25f32; 4000];
        freq[..10].fill(1.0);
        let mut p = profile(vec![vec![0.5; 4000]]);
        let level = |target: f32, frequency: Vec<f32>, reuse: f32| LevelProfile {
            target,
            threshold: 0.1,
            active_share: 0.3,
            hot_share: 0.2,
            reuse: vec![reuse; 5],
            frequency,
        };
        p.layers[0].levels = vec![level(0.3, vec![0.7; 4000], 0.9), level(0.7, freq, 0.6)];
        let steps = activity_from_profile(&p, 0.75, 60);
        let share = steps
            .iter()
            .map(|s| match &s.layers[0] {
                ActiveSet::Neurons(n) => n.len(),
                ActiveSet::All => 4000,
            })
            .sum::<usize>() as f64
            / (60.0 * 4000.0);
        assert!((share - 0.2515).abs() < 0.01, "{share}");
        let reuse = measured_reuse(&steps);
        assert!((reuse - 0.6).abs() < 0.02, "{reuse}");
        // Without reuse figures (a profile without levels) tokens are independent: reuse is
        // the frequency.
        p.layers[0].levels.clear();
        p.layers[0].frequency = vec![0.25; 4000];
        let reuse = measured_reuse(&activity_from_profile(&p, 0.7, 60));
        assert!((reuse - 0.25).abs() < 0.02, "{reuse}");
        // Hot units follow the level too.
        p.layers[0].levels = vec![level(0.3, (0..4000).map(|i| (i % 2) as f32).collect(), 0.5)];
        let hot = hot_units_from_profile(&p, 0.3, 1);
        assert_eq!(hot[0], 1);
    }

    #[test]
    fn hot_units_rank_bundles_by_their_expected_active_neurons() {
        // Two layers of 8 neurons in bundles of 4: layer 1's second bundle is hottest, then
        // layer 0's first; the two cold ones tie and keep unit order.
        let p = profile(vec![
            vec![0.9, 0.9, 0.9, 0.9, 0.1, 0.1, 0.1, 0.1],
            vec![0.1, 0.1, 0.1, 0.1, 1.0, 1.0, 1.0, 1.0],
        ]);
        assert_eq!(hot_units_from_profile(&p, 0.5, 4), vec![3, 0, 1, 2]);
        // A bundle size that does not divide the layer: the short last bundle counts too.
        assert_eq!(hot_units_from_profile(&p, 0.5, 3).len(), 6);
    }
}

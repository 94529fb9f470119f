//! What an activation profile tells the planner: which neurons decode steps activate (to score
//! sparse plans with the simulator) and which cache units are hottest (the plan's hot set).

use conductor_runtime::sparse::profile::ModelProfile;
use conductor_runtime::trace::{ActiveSet, StepActivity};

/// `steps` decode steps whose active neurons follow the profile: neuron `i` of layer `l` is
/// active in a step with the probability the profile measured for it (its `frequency`, counted
/// at the profile's reference sparsity), drawn independently per step from a fixed seed, so
/// the same profile always gives the same steps.
pub fn activity_from_profile(profile: &ModelProfile, steps: u32) -> Vec<StepActivity> {
    (0..steps)
        .map(|step| StepActivity {
            step: u64::from(step),
            layers: profile
                .layers
                .iter()
                .enumerate()
                .map(|(l, layer)| {
                    let active = layer
                        .frequency
                        .iter()
                        .enumerate()
                        .filter(|&(i, &f)| unit_draw(step, l as u32, i as u32) < f64::from(f))
                        .map(|(i, _)| i as u32)
                        .collect();
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
/// first: by the expected number of active neurons a bundle holds (the sum of its neurons'
/// frequencies); ties keep unit order.
pub fn hot_units_from_profile(profile: &ModelProfile, bundle: u32) -> Vec<u32> {
    hot_units_from_frequencies(
        profile.layers.iter().map(|l| l.frequency.as_slice()),
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
                })
                .collect(),
            predictors: None,
        }
    }

    #[test]
    fn steps_follow_the_profiles_frequencies_and_repeat_exactly() {
        // Neuron 0 always fires, neuron 1 never, the other 2000 half the time.
        let mut freq = vec![1.0, 0.0];
        freq.extend(std::iter::repeat_n(0.5, 2000));
        let p = profile(vec![freq.clone(), freq]);
        let steps = activity_from_profile(&p, 8);
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
        assert_eq!(activity_from_profile(&p, 8), steps);
    }

    #[test]
    fn hot_units_rank_bundles_by_their_expected_active_neurons() {
        // Two layers of 8 neurons in bundles of 4: layer 1's second bundle is hottest, then
        // layer 0's first; the two cold ones tie and keep unit order.
        let p = profile(vec![
            vec![0.9, 0.9, 0.9, 0.9, 0.1, 0.1, 0.1, 0.1],
            vec![0.1, 0.1, 0.1, 0.1, 1.0, 1.0, 1.0, 1.0],
        ]);
        assert_eq!(hot_units_from_profile(&p, 4), vec![3, 0, 1, 2]);
        // A bundle size that does not divide the layer: the short last bundle counts too.
        assert_eq!(hot_units_from_profile(&p, 3).len(), 6);
    }
}

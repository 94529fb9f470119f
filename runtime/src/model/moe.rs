//! Mixture-of-experts routing, as llama.cpp routes Mixtral-style `llama` models
//! (`build_moe_ffn` with softmax gating and normalised weights): logits = W_router · x over
//! every expert, probabilities = their softmax, the `k` most probable experts are chosen (ties:
//! the lower expert index first), and their weights are their probabilities divided by the sum
//! of the chosen ones. The FFN output is then Σ_k w_k · down_k(act(gate_k · x) ⊙ up_k · x).

/// llama.cpp clamps the sum of the chosen probabilities to the smallest normal f16 before
/// dividing by it, so a degenerate router never divides by zero.
const MIN_WEIGHT_SUM: f32 = 1.0 / 16384.0; // 2^-14 = 6.103515625e-5

/// Routes one token: `router` holds `n_expert` rows of `x.len()` values. Writes each expert's
/// weight into `weights` (`n_expert` values, 0 for experts not chosen), the chosen experts in
/// choice order into `chosen` (`k` values) and uses `probs` as scratch. Plain f32 arithmetic in
/// a fixed order (sums of exponentials and of weights in f64, as ggml sums), so the result
/// never depends on threads or instruction sets.
pub fn route(
    router: &[f32],
    x: &[f32],
    k: usize,
    probs: &mut Vec<f32>,
    chosen: &mut Vec<u32>,
    weights: &mut [f32],
) {
    let n_expert = weights.len();
    let n = x.len();
    probs.clear();
    probs.extend(
        router
            .chunks_exact(n.max(1))
            .take(n_expert)
            .map(|row| row.iter().zip(x).map(|(w, v)| w * v).sum::<f32>()),
    );
    probs.resize(n_expert, 0.0);
    softmax(probs);
    // Top k by repeated selection (k and n_expert are small): allocation-free, and the scan in
    // index order with a strict comparison keeps the lower index on ties.
    let k = k.min(n_expert);
    chosen.clear();
    weights.fill(0.0);
    for _ in 0..k {
        let mut best: Option<usize> = None;
        for e in 0..n_expert {
            if chosen.contains(&(e as u32)) {
                continue;
            }
            if best.is_none_or(|b| probs[e].total_cmp(&probs[b]).is_gt()) {
                best = Some(e);
            }
        }
        if let Some(b) = best {
            chosen.push(b as u32);
        }
    }
    let sum = chosen
        .iter()
        .map(|&e| f64::from(probs[e as usize]))
        .sum::<f64>() as f32;
    let sum = sum.max(MIN_WEIGHT_SUM);
    for &e in chosen.iter() {
        weights[e as usize] = probs[e as usize] / sum;
    }
}

/// In-place softmax: exponentials of the differences to the maximum, summed in f64, then
/// scaled by the reciprocal of the sum (ggml's `soft_max`).
fn softmax(v: &mut [f32]) {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for x in v.iter_mut() {
        *x = (*x - max).exp();
        sum += f64::from(*x);
    }
    let scale = (1.0 / sum) as f32;
    v.iter_mut().for_each(|x| *x *= scale);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Routes a token whose logits are `logits` (an identity router over `n_expert` inputs).
    fn route_logits(logits: &[f32], k: usize) -> (Vec<u32>, Vec<f32>) {
        let n = logits.len();
        let mut router = vec![0.0; n * n];
        for e in 0..n {
            router[e * n + e] = 1.0;
        }
        let (mut probs, mut chosen, mut weights) = (Vec::new(), Vec::new(), vec![0.0; n]);
        route(&router, logits, k, &mut probs, &mut chosen, &mut weights);
        (chosen, weights)
    }

    #[test]
    fn picks_the_most_probable_and_renormalises() {
        let (chosen, w) = route_logits(&[0.0, 2.0, -1.0, 1.0], 2);
        assert_eq!(chosen, vec![1, 3]);
        // softmax restricted to the chosen two: e^2 / (e^2 + e^1).
        let w1 = 1.0 / (1.0 + (-1.0f32).exp());
        assert!((w[1] - w1).abs() < 1e-6, "{w:?}");
        assert!((w[3] - (1.0 - w1)).abs() < 1e-6, "{w:?}");
        assert_eq!((w[0], w[2]), (0.0, 0.0));
    }

    #[test]
    fn ties_go_to_the_lower_expert_index() {
        let (chosen, w) = route_logits(&[1.0, 3.0, 3.0, 3.0], 2);
        assert_eq!(chosen, vec![1, 2]);
        assert_eq!(w, vec![0.0, 0.5, 0.5, 0.0]);
        let (chosen, _) = route_logits(&[0.5; 5], 3);
        assert_eq!(chosen, vec![0, 1, 2]);
    }

    #[test]
    fn one_expert_of_one_gets_weight_one() {
        let (chosen, w) = route_logits(&[-7.5], 1);
        assert_eq!((chosen, w), (vec![0], vec![1.0]));
    }

    #[test]
    fn nan_logits_do_not_panic() {
        let (chosen, _) = route_logits(&[f32::NAN, 1.0, 0.0], 2);
        assert_eq!(chosen.len(), 2);
    }

    proptest! {
        #[test]
        fn chosen_are_the_top_k_and_weights_sum_to_one(
            logits in proptest::collection::vec(-20.0f32..20.0, 1..40),
            k in 1usize..8,
        ) {
            let k = k.min(logits.len());
            let (chosen, w) = route_logits(&logits, k);
            prop_assert_eq!(chosen.len(), k);
            let mut sorted = chosen.clone();
            sorted.sort_unstable();
            sorted.dedup();
            prop_assert_eq!(sorted.len(), k);
            // Every chosen expert's logit is at least every other one's.
            let min_chosen = chosen.iter().map(|&e| logits[e as usize]).fold(f32::MAX, f32::min);
            for (e, &l) in logits.iter().enumerate() {
                if !chosen.contains(&(e as u32)) {
                    // (exp may round two close logits to one probability; then the lower
                    // index wins, which may be the smaller logit.)
                    prop_assert!(l <= min_chosen + 1e-5 * (1.0 + l.abs()));
                    prop_assert_eq!(w[e], 0.0);
                }
            }
            let total: f32 = w.iter().sum();
            prop_assert!((total - 1.0).abs() < 1e-5, "weights sum to {}", total);
        }
    }
}

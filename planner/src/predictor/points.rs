//! A trained predictor's operating points: its logit cut for each (sparsity, recall) pair, set
//! on the calibration tokens, and what each cut gives on the held-out tokens. The predictor is
//! trained for one sparsity; its logits still rank neurons at the others, so one network
//! serves every point, and the cut is the setting (`--predictor-recall`).

use super::threshold::recall_threshold;
use conductor_runtime::quant::Kernels;
use conductor_runtime::sparse::predictor::Predictor;
use conductor_runtime::sparse::profile::PredictorPoint;
use std::ops::Range;

/// The points of `p` over the FFN inputs `x` (`[token][n_embd]`): for every sparsity of
/// `sparsities` (ascending) and recall of `recalls`, the cut that keeps that recall of the
/// calibration tokens' active neurons, and the held-out recall, precision and predicted share
/// at that cut. `fired(t, n)` says at how many of the sparsities neuron `n` of token `t` is
/// active (they are nested: active at the first `fired` of them).
pub fn operating_points(
    p: &Predictor,
    x: &[f32],
    calibration: Range<usize>,
    held_out: Range<usize>,
    sparsities: &[f32],
    recalls: &[f32],
    fired: impl Fn(usize, usize) -> usize,
) -> Vec<PredictorPoint> {
    let kernels = Kernels::best();
    let f = p.n_ff();
    let levels = sparsities.len();
    let mut positives: Vec<Vec<f32>> = vec![Vec::new(); levels];
    p.logits_rows(&kernels, x, calibration, |t0, logits| {
        for (i, row) in logits.chunks_exact(f).enumerate() {
            for (n, &z) in row.iter().enumerate() {
                for level in positives.iter_mut().take(fired(t0 + i, n)) {
                    level.push(z);
                }
            }
        }
    });
    let cuts: Vec<Vec<f32>> = positives
        .iter_mut()
        .map(|pos| recalls.iter().map(|&r| recall_threshold(pos, r)).collect())
        .collect();
    drop(positives);
    let mut active = vec![0u64; levels];
    let mut predicted = vec![vec![0u64; recalls.len()]; levels];
    let mut hits = vec![vec![0u64; recalls.len()]; levels];
    let mut pairs = 0u64;
    p.logits_rows(&kernels, x, held_out, |t0, logits| {
        for (i, row) in logits.chunks_exact(f).enumerate() {
            pairs += f as u64;
            for (n, &z) in row.iter().enumerate() {
                let lv = fired(t0 + i, n);
                for level in 0..levels {
                    let is_active = level < lv;
                    active[level] += u64::from(is_active);
                    for (r, &cut) in cuts[level].iter().enumerate() {
                        if z >= cut {
                            predicted[level][r] += 1;
                            hits[level][r] += u64::from(is_active);
                        }
                    }
                }
            }
        }
    });
    let share = |a: u64, b: u64| {
        if b == 0 {
            1.0
        } else {
            (a as f64 / b as f64) as f32
        }
    };
    let mut out = Vec::with_capacity(levels * recalls.len());
    for (level, &sparsity) in sparsities.iter().enumerate() {
        for (r, &recall_target) in recalls.iter().enumerate() {
            out.push(PredictorPoint {
                sparsity,
                recall_target,
                cut: cuts[level][r],
                recall: share(hits[level][r], active[level]),
                precision: share(hits[level][r], predicted[level][r]),
                predicted: share(predicted[level][r], pairs),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_keep_the_recall_they_were_set_for() {
        // A predictor whose logit for neuron n is x[n] (fc2 = identity over rank = n_ff = 32,
        // fc1 = identity, biases 0): activity is "x above a level's cut", so the cut keeping
        // recall r of the active neurons lies among the active logits.
        let d = 32;
        let eye: Vec<f32> = (0..d * d)
            .map(|i| if i / d == i % d { 1.0 } else { 0.0 })
            .collect();
        let p =
            Predictor::from_weights(d, d, d, &eye, vec![0.0; d], &eye, vec![0.0; d], 0.0).unwrap();
        let tokens = 400;
        let x: Vec<f32> = (0..tokens * d)
            .map(|i| ((i * 7919) % 997) as f32 / 997.0)
            .collect();
        // Active at the first level when x > 0.5, at the second when x > 0.8.
        let fired = |t: usize, n: usize| {
            let v = x[t * d + n];
            usize::from(v > 0.5) + usize::from(v > 0.8)
        };
        let points = operating_points(&p, &x, 0..200, 200..400, &[0.5, 0.8], &[0.9, 0.99], fired);
        assert_eq!(points.len(), 4);
        for pt in &points {
            // The ideal predictor of a monotone truth: recall near the target, and the cut
            // below the level's own line, so precision is high.
            assert!(pt.recall >= pt.recall_target - 0.03, "{pt:?}");
            assert!(pt.precision > 0.9, "{pt:?}");
        }
        let (lo, hi) = (points[0], points[2]);
        assert_eq!((lo.sparsity, hi.sparsity), (0.5, 0.8));
        assert!(lo.predicted > hi.predicted, "{lo:?} {hi:?}");
        // A higher recall costs a lower cut.
        assert!(points[1].cut <= points[0].cut);
    }
}

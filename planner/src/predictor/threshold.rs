//! The choice of a logit cut for a wanted recall: the decision threshold set on the
//! calibration tokens during training, and the quantile that the operating points reuse.

/// The decision threshold for calibration logits `logits` (`tokens × n_ff`, truth `is_pos`):
/// the largest `τ` at which the share of positive logits `>= τ` is at least `want`, then lowered
/// to the smallest positive logit above every negative logit under it (recall for free: no
/// calibration negative is added). `+∞` when there is no positive (nothing needs predicting).
/// Returns the threshold and the calibration recall at it.
pub(super) fn calibrate(logits: &[f32], is_pos: impl Fn(usize) -> bool, want: f32) -> (f32, f32) {
    let mut pos: Vec<f32> = Vec::new();
    for (i, &z) in logits.iter().enumerate() {
        if is_pos(i) {
            pos.push(z);
        }
    }
    if pos.is_empty() {
        return (f32::INFINITY, 1.0);
    }
    let tq = recall_threshold(&mut pos, want);
    let neg_below = logits
        .iter()
        .enumerate()
        .filter(|&(i, &z)| z < tq && !is_pos(i))
        .map(|(_, &z)| z)
        .fold(f32::NEG_INFINITY, f32::max);
    // `pos` is sorted: the first positive above `neg_below` (at most `tq`).
    let first = pos.partition_point(|&z| z <= neg_below);
    let t = pos[first.min(pos.len() - 1)].min(tq);
    let kept = pos.len() - pos.partition_point(|&z| z < t);
    (t, kept as f32 / pos.len() as f32)
}

/// The largest threshold `τ` such that the share of `pos` logits `>= τ` is at least `want`
/// (`+∞` when `pos` is empty). Sorts `pos`.
pub(super) fn recall_threshold(pos: &mut [f32], want: f32) -> f32 {
    if pos.is_empty() {
        return f32::INFINITY;
    }
    pos.sort_unstable_by(f32::total_cmp);
    let n = pos.len() as f64;
    // The fewest kept positives with kept / n >= want (the tolerance absorbs want's f32
    // rounding, e.g. 0.99f32 = 0.99000001).
    let keep = ((f64::from(want) * n * (1.0 - 1e-7)).ceil() as usize).clamp(1, pos.len());
    pos[pos.len() - keep]
}

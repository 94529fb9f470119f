//! One layer's activation statistics, kept as the calibration tokens stream past a chunk at a
//! time, in memory that does not grow with the number of tokens (what `conductor profile` turns
//! into a [`LayerProfile`]).
//!
//! - *Importance* (the per-neuron weight of a score, [`importance`]) comes from the first chunk
//!   added: scores need it before they can be counted, and a mean |up| over one chunk of
//!   calibration tokens is already close to the mean over all of them.
//! - *Thresholds* are quantiles of the scores over every token, read off a histogram whose bins
//!   are the top 16 bits of a positive `f32` (exponent and 7 mantissa bits: 128 bins per
//!   octave). A threshold is the largest value of the bin holding the exact quantile, so it is
//!   at most 2⁻⁷ (0.8%) above the exact quantile, never below it; the kept mass at a threshold is
//!   exact (every score above it lies in a higher bin). Deterministic: integer counts and sums
//!   in token order.
//! - *Frequencies* count, per neuron, the tokens whose score is above the reference sparsity's
//!   threshold within the first chunk (the exact quantile of its scores).
//! - *Levels*: at each sparsity of [`LEVELS`] (its threshold the exact quantile of the first
//!   chunk's scores), token by token: how often each neuron fires, how skewed firing is (the
//!   fewest neurons that take 80% of the activations) and how much consecutive tokens reuse
//!   active neurons (the share of a token's active neurons that fired in the last k tokens,
//!   k = 1..[`REUSE_WINDOW`], LLM in a Flash's sliding window). Chunks are separate sequences:
//!   the window never reaches into the previous chunk, and a chunk's first [`REUSE_WINDOW`]
//!   tokens, whose window is short, are not counted.

use super::profile::{LayerProfile, LevelProfile};

/// Bits of an `f32` below a histogram bin.
const BIN_SHIFT: u32 = 16;
/// Histogram bins over the positive `f32`s (and infinity; NaN falls in the last).
const BINS: usize = (0x7f80_0000u32 >> BIN_SHIFT) as usize + 1;

/// The sparsities at which active sets are followed token by token ([`LevelProfile`]): the
/// operating points `conductor profile` chooses among.
pub const LEVELS: [f32; 9] = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9];

/// Reuse is measured over windows of 1 to this many previous tokens.
pub const REUSE_WINDOW: usize = 5;

/// The number of levels.
const L: usize = LEVELS.len();

/// The share of activations whose fewest carrying neurons measure skew (PowerInfer's "hot"
/// neurons take about 80% of activations).
pub const HOT_MASS: f64 = 0.8;

/// What the first chunk fixes for the rest.
#[derive(Clone, Debug)]
struct First {
    importance: Vec<f32>,
    /// Threshold of the reference sparsity.
    reference: f32,
    /// Thresholds of [`LEVELS`], ascending.
    levels: Vec<f32>,
}

impl First {
    /// From the first chunk's `acts` (`[token][n_ff]`) scored with `importance`: the exact
    /// quantiles of its scores at the reference sparsity and at [`LEVELS`].
    fn of(importance: Vec<f32>, acts: &[f32], reference_sparsity: f32) -> First {
        let n_ff = importance.len().max(1);
        let scores: Vec<f32> = acts
            .iter()
            .enumerate()
            .map(|(i, a)| a.abs() * importance[i % n_ff])
            .collect();
        let mut at = LEVELS.to_vec();
        at.push(reference_sparsity);
        let mut order: Vec<usize> = (0..at.len()).collect();
        order.sort_by(|&a, &b| at[a].total_cmp(&at[b]));
        let sorted: Vec<f32> = order.iter().map(|&i| at[i]).collect();
        let mut quantiles = vec![0.0; at.len()];
        for (&i, v) in order.iter().zip(exact_quantiles(scores, &sorted)) {
            quantiles[i] = v;
        }
        let reference = quantiles.pop().expect("the reference sparsity");
        First {
            importance,
            reference,
            levels: quantiles,
        }
    }
}

/// The streaming statistics of one layer.
#[derive(Clone, Debug)]
pub struct LayerStats {
    down_norms: Vec<f32>,
    reference_sparsity: f32,
    first: Option<First>,
    /// Scores that are exactly zero, and their mass (zero too unless up is infinite).
    zeros: u64,
    counts: Vec<u64>,
    mass: Vec<f64>,
    total_mass: f64,
    zero_acts: u64,
    active: Vec<u64>,
    sum_abs: Vec<f64>,
    /// Per neuron: Σ |act(gate) · up|.
    neuron_mass: Vec<f64>,
    /// Per neuron, then f = 0..=L: tokens in which it fired at exactly the first f levels (the
    /// levels ascend, so the levels a neuron fires at are always the first few).
    fired_counts: Vec<u32>,
    /// Per neuron: how many levels it fired at in each of the last [`REUSE_WINDOW`] tokens of
    /// this chunk, a byte each, the latest lowest (0 before the chunk's first token).
    recent: Vec<u64>,
    /// Past a chunk's first [`REUSE_WINDOW`] tokens, (token, neuron) pairs by f, the levels
    /// fired at.
    counted_fired: [u64; L + 1],
    /// The same pairs, for k = 1..=REUSE_WINDOW, by min(f, the most levels the neuron fired at
    /// in the k tokens before): at levels below that value it fired within k tokens before.
    within: [[u64; L + 1]; REUSE_WINDOW],
    tokens: u64,
}

/// Per neuron: mean |up| over the tokens of `ups` (`[token][n_ff]`) × the norm of its down
/// column (`down_norms`).
pub fn importance(ups: &[f32], down_norms: &[f32]) -> Vec<f32> {
    let n_ff = down_norms.len();
    let mut sum = vec![0f64; n_ff];
    let mut tokens = 0usize;
    for row in ups.chunks_exact(n_ff.max(1)) {
        tokens += 1;
        for (s, u) in sum.iter_mut().zip(row) {
            *s += u.abs() as f64;
        }
    }
    sum.iter()
        .zip(down_norms)
        .map(|(s, d)| (s / tokens.max(1) as f64) as f32 * d)
        .collect()
}

fn bin(score: f32) -> usize {
    ((score.to_bits() >> BIN_SHIFT) as usize).min(BINS - 1)
}

/// The largest `f32` of bin `b`.
fn bin_top(b: usize) -> f32 {
    f32::from_bits((((b as u32) + 1) << BIN_SHIFT) - 1)
}

/// The `k`-th smallest of `values` (1-based; 0 gives 0) for `k = ⌊s · n⌋` at each `s` of
/// `sparsities` (ascending), exactly.
fn exact_quantiles(mut values: Vec<f32>, sparsities: &[f32]) -> Vec<f32> {
    let n = values.len();
    // Each selection leaves everything above its rank after it: the next one selects there.
    let mut from = 0;
    sparsities
        .iter()
        .map(|&s| {
            let k = ((s as f64) * n as f64).floor() as usize;
            if k == 0 || n == 0 {
                return 0.0;
            }
            let at = k.min(n) - 1;
            let lo = from.min(at);
            let (_, kth, _) = values[lo..].select_nth_unstable_by(at - lo, f32::total_cmp);
            let kth = *kth;
            from = at;
            kth.max(0.0)
        })
        .collect()
}

/// The fewest neurons whose `counts` (any per-neuron measure of activity) add up to
/// [`HOT_MASS`] of the total, as a share of the neurons (0 when nothing is active).
pub fn hot_share(counts: &[f64]) -> f32 {
    let total: f64 = counts.iter().sum();
    if total <= 0.0 || counts.is_empty() {
        return 0.0;
    }
    let mut sorted = counts.to_vec();
    sorted.sort_unstable_by(|a, b| b.total_cmp(a));
    let mut sum = 0.0;
    let mut n = 0;
    for c in sorted {
        if sum >= HOT_MASS * total {
            break;
        }
        sum += c;
        n += 1;
    }
    n as f32 / counts.len() as f32
}

impl LayerStats {
    /// Statistics of a layer whose down projection's columns have these norms, with neuron
    /// frequencies counted at `reference_sparsity`.
    pub fn new(down_norms: Vec<f32>, reference_sparsity: f32) -> LayerStats {
        let n_ff = down_norms.len();
        LayerStats {
            down_norms,
            reference_sparsity,
            first: None,
            zeros: 0,
            counts: vec![0; BINS],
            mass: vec![0.0; BINS],
            total_mass: 0.0,
            zero_acts: 0,
            active: vec![0; n_ff],
            sum_abs: vec![0.0; n_ff],
            neuron_mass: vec![0.0; n_ff],
            fired_counts: vec![0; n_ff * (L + 1)],
            recent: vec![0; n_ff],
            counted_fired: [0; L + 1],
            within: [[0; L + 1]; REUSE_WINDOW],
            tokens: 0,
        }
    }

    /// Per neuron: the weight of |act(gate)| in its score (once a chunk was added).
    pub fn importance(&self) -> Option<&[f32]> {
        self.first.as_ref().map(|f| &f.importance[..])
    }

    /// Adds a chunk of tokens: `acts` (`[token][n_ff]`, act(gate)) and the matching up
    /// projections `ups`.
    pub fn add(&mut self, acts: &[f32], ups: &[f32]) {
        let n_ff = self.down_norms.len();
        assert_eq!(acts.len(), ups.len(), "acts and ups of the same tokens");
        if n_ff == 0 || acts.is_empty() {
            return;
        }
        let reference_sparsity = self.reference_sparsity;
        let first = self.first.get_or_insert_with(|| {
            First::of(importance(ups, &self.down_norms), acts, reference_sparsity)
        });
        let (importance, reference, levels) = (&first.importance, first.reference, &first.levels);
        // A new sequence: nothing fired before its first token.
        self.recent.fill(0);
        const WINDOW_BYTES: u64 = (1 << (8 * REUSE_WINDOW)) - 1;
        for (pos, (row, up)) in acts
            .chunks_exact(n_ff)
            .zip(ups.chunks_exact(n_ff))
            .enumerate()
        {
            self.tokens += 1;
            let counted = pos >= REUSE_WINDOW;
            for j in 0..n_ff {
                let (a, u) = (row[j], up[j]);
                let score = a.abs() * importance[j];
                let mass = (a * u).abs() as f64;
                self.total_mass += mass;
                self.neuron_mass[j] += mass;
                if score == 0.0 {
                    self.zeros += 1;
                } else {
                    let b = bin(score);
                    self.counts[b] += 1;
                    self.mass[b] += mass;
                }
                self.zero_acts += u64::from(a == 0.0);
                self.active[j] += u64::from(score > reference);
                self.sum_abs[j] += a.abs() as f64;
                // Levels ascend: the neuron is active at the first `fired` of them (counted
                // without branches: which levels a score passes is data, and unpredictable).
                let fired = levels
                    .iter()
                    .map(|&t| usize::from(score > t))
                    .sum::<usize>();
                self.fired_counts[j * (L + 1) + fired] += 1;
                let recent = self.recent[j];
                if counted {
                    self.counted_fired[fired] += 1;
                    let mut most = 0;
                    for (k, by_value) in self.within.iter_mut().enumerate() {
                        most = most.max((recent >> (8 * k)) as u8 as usize);
                        by_value[fired.min(most)] += 1;
                    }
                }
                self.recent[j] = (recent << 8 | fired as u64) & WINDOW_BYTES;
            }
        }
    }

    /// Tokens added so far.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// The threshold at `sparsity`: the top of the histogram bin holding the exact quantile
    /// (0 while the zeros alone reach it).
    fn threshold(&self, sparsity: f32) -> (f32, usize) {
        let n = self.zeros + self.counts.iter().sum::<u64>();
        let k = ((sparsity as f64) * n as f64).floor() as u64;
        if k <= self.zeros {
            return (0.0, 0);
        }
        let mut seen = self.zeros;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= k {
                return (bin_top(b), b + 1);
            }
        }
        (f32::INFINITY, BINS)
    }

    /// At level `i`, the counted active (token, neuron) pairs by how many tokens back the
    /// neuron last fired at that level: 1..=REUSE_WINDOW, and last, longer ago or never.
    fn reuse_ages(&self, i: usize) -> [u64; REUSE_WINDOW + 1] {
        let above = |by_value: &[u64; L + 1]| by_value[i + 1..].iter().sum::<u64>();
        let mut ages = [0; REUSE_WINDOW + 1];
        // Fired at level i within the last k tokens, cumulative in k.
        let mut before = 0;
        for (age, by_value) in ages.iter_mut().zip(&self.within) {
            let within = above(by_value);
            *age = within - before;
            before = within;
        }
        ages[REUSE_WINDOW] = above(&self.counted_fired) - before;
        ages
    }

    /// The layer's profile over the sparsities of `grid`.
    pub fn finish(self, grid: &[f32]) -> LayerProfile {
        let n_ff = self.down_norms.len();
        let values = self.tokens * n_ff as u64;
        let (thresholds, kept_mass) = grid
            .iter()
            .map(|&s| {
                let (t, above) = self.threshold(s);
                // Every score in a bin above the threshold's (at 0: every nonzero one).
                let kept: f64 = self.mass[above.min(BINS)..].iter().sum();
                let share = if self.total_mass > 0.0 {
                    (kept / self.total_mass) as f32
                } else {
                    1.0
                };
                (t, share)
            })
            .unzip();
        let per = self.tokens.max(1) as f64;
        let level_thresholds = self
            .first
            .as_ref()
            .map_or_else(|| vec![0.0; LEVELS.len()], |f| f.levels.clone());
        let levels = LEVELS
            .iter()
            .enumerate()
            .map(|(i, &target)| {
                // Tokens in which each neuron fired at level i: at more than i levels.
                let counts: Vec<u32> = self
                    .fired_counts
                    .chunks_exact(L + 1)
                    .map(|by_fired| by_fired[i + 1..].iter().sum())
                    .collect();
                let active: u64 = counts.iter().map(|&c| u64::from(c)).sum();
                let ages = self.reuse_ages(i);
                let seen: u64 = ages.iter().sum();
                let mut within = 0u64;
                let reuse = ages[..REUSE_WINDOW]
                    .iter()
                    .map(|&a| {
                        within += a;
                        if seen == 0 {
                            0.0
                        } else {
                            (within as f64 / seen as f64) as f32
                        }
                    })
                    .collect();
                let as_f64: Vec<f64> = counts.iter().map(|&c| f64::from(c)).collect();
                LevelProfile {
                    target,
                    threshold: level_thresholds[i],
                    active_share: (active as f64 / values.max(1) as f64) as f32,
                    hot_share: hot_share(&as_f64),
                    reuse,
                    frequency: counts
                        .iter()
                        .map(|&c| (f64::from(c) / per) as f32)
                        .collect(),
                }
            })
            .collect();
        LayerProfile {
            mass_hot_share: hot_share(&self.neuron_mass),
            levels,
            importance: self
                .first
                .map(|f| f.importance)
                .unwrap_or_else(|| vec![0.0; n_ff]),
            thresholds,
            kept_mass,
            zero_fraction: (self.zero_acts as f64 / values.max(1) as f64) as f32,
            frequency: self
                .active
                .iter()
                .map(|&c| (c as f64 / per) as f32)
                .collect(),
            mean_abs: self.sum_abs.iter().map(|&s| (s / per) as f32).collect(),
        }
    }
}

/// One layer's profile from a single chunk of activations `acts` (`[token][n_ff]`, act(gate))
/// and the matching up projections `ups`, with the given `importance` (in place of the one a
/// first chunk gives) and neuron frequencies counted at `reference_sparsity`.
pub fn layer_profile(
    acts: &[f32],
    ups: &[f32],
    importance: Vec<f32>,
    grid: &[f32],
    reference_sparsity: f32,
) -> LayerProfile {
    let n_ff = importance.len();
    let mut stats = LayerStats::new(vec![1.0; n_ff], reference_sparsity);
    stats.first = Some(First::of(importance, acts, reference_sparsity));
    stats.add(acts, ups);
    stats.finish(grid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sparse::profile::sparsity_grid;

    #[test]
    fn thresholds_are_quantiles_of_the_magnitudes_within_a_bin() {
        // 1000 magnitudes 0.001 .. 1.0: the threshold at s is at or above the exact quantile
        // and within 2^-7 of it.
        let acts: Vec<f32> = (1..=1000).map(|i| i as f32 / 1000.0).collect();
        let ups = vec![1.0; 1000];
        let grid = sparsity_grid();
        let p = layer_profile(&acts, &ups, vec![1.0; 10], &grid, 0.3);
        for (&s, &t) in grid.iter().zip(&p.thresholds).skip(1) {
            let exact = ((s as f64 * 1000.0).floor() / 1000.0) as f32;
            assert!(
                t >= exact && t <= exact * (1.0 + 1.0 / 128.0),
                "s {s}: {t} vs exact {exact}"
            );
            // The kept mass is exactly the mass above the threshold.
            let above: f32 = acts.iter().filter(|&&a| a > t).sum();
            let total: f32 = acts.iter().sum();
            assert!(
                (p.kept_mass[grid.iter().position(|&g| g == s).unwrap()] - above / total).abs()
                    < 1e-5
            );
        }
        assert_eq!(p.thresholds[0], 0.0, "0% sparsity keeps everything");
        // Frequencies at 30%: every neuron's values are spread evenly, ~70% active each.
        for f in &p.frequency {
            assert!((f - 0.7).abs() < 0.11, "{f}");
        }
        assert_eq!(p.kept_mass[0], 1.0);
        assert!(p.kept_mass.windows(2).all(|w| w[1] <= w[0]));
    }

    #[test]
    fn importance_weights_the_score() {
        // Two neurons with the same activations; the second matters 10x more at the output,
        // so at 50% sparsity it is the one kept.
        let acts: Vec<f32> = (0..200).map(|i| 1.0 + (i / 2) as f32 * 0.01).collect();
        let ups: Vec<f32> = (0..200)
            .map(|i| if i % 2 == 0 { 1.0 } else { -2.0 })
            .collect();
        let imp = importance(&ups, &[3.0, 5.0]);
        assert_eq!(imp, vec![3.0, 10.0]);
        let p = layer_profile(&acts, &ups, imp, &sparsity_grid(), 0.5);
        assert_eq!(p.frequency, vec![0.0, 1.0]);
        // Streaming the same tokens in chunks takes its importance from the first chunk.
        let mut s = LayerStats::new(vec![3.0, 5.0], 0.5);
        s.add(&acts[..100], &ups[..100]);
        s.add(&acts[100..], &ups[100..]);
        assert_eq!(s.importance().unwrap(), &[3.0, 10.0]);
        assert_eq!(s.tokens(), 100);
    }

    #[test]
    fn levels_measure_frequency_skew_and_reuse() {
        // 10 neurons over two chunks of 40 tokens: neuron j fires (1 + j/100) on the tokens of
        // its parity, 0 otherwise; neuron 0's up is 100, the rest 1. Half of all values are
        // zero, so the levels up to 50% keep exactly the firing ones.
        let n_ff = 10;
        let chunk = |_: usize| -> (Vec<f32>, Vec<f32>) {
            let acts = (0..40 * n_ff)
                .map(|i| {
                    let (t, j) = (i / n_ff, i % n_ff);
                    if (t + j) % 2 == 0 {
                        1.0 + j as f32 / 100.0
                    } else {
                        0.0
                    }
                })
                .collect();
            let ups = (0..40 * n_ff)
                .map(|i| if i % n_ff == 0 { 100.0 } else { 1.0 })
                .collect();
            (acts, ups)
        };
        let mut stats = LayerStats::new(vec![1.0; n_ff], 0.5);
        for c in 0..2 {
            let (a, u) = chunk(c);
            stats.add(&a, &u);
        }
        let p = stats.finish(&sparsity_grid());
        assert_eq!(p.levels.len(), LEVELS.len());
        for level in &p.levels[..5] {
            assert_eq!(level.threshold, 0.0);
            assert_eq!(level.active_share, 0.5);
            assert!(level.frequency.iter().all(|&f| f == 0.5));
            // Equal counts: 8 of the 10 neurons carry 80% of the activations.
            assert!((level.hot_share - 0.8).abs() < 1e-6, "{}", level.hot_share);
            // Never active in the token before, always two tokens before.
            assert_eq!(level.reuse, vec![0.0, 1.0, 1.0, 1.0, 1.0]);
        }
        // Above 50% the threshold rises past some of the firing neurons' scores.
        assert!(p.levels[8].threshold > 0.0);
        assert!(p.levels[8].active_share < 0.15);
        // Neuron 0's up makes it carry most of the mass: 1 of 10 neurons.
        assert!(
            (p.mass_hot_share - 0.1).abs() < 1e-6,
            "{}",
            p.mass_hot_share
        );
        assert_eq!(hot_share(&[]), 0.0);
        assert_eq!(hot_share(&[0.0, 0.0]), 0.0);
        assert_eq!(hot_share(&[7.0, 1.0, 1.0, 1.0]), 0.5);
    }

    #[test]
    fn levels_match_a_direct_count_over_random_chunks() {
        // Random activations over three chunks of uneven length (one shorter than the reuse
        // window): every level's frequencies and reuse shares are those of counting, for each
        // active (token, neuron), how many tokens back in its chunk it last fired.
        let n_ff = 37;
        let mut rng = crate::sample::SplitMix64::new(11);
        let chunks: Vec<(Vec<f32>, Vec<f32>)> = [50, 3, 29]
            .iter()
            .map(|&t| {
                // Sticky neurons: each token keeps most of the previous one's activations.
                let mut acts = vec![0f32; t * n_ff];
                for i in 0..acts.len() {
                    let fresh = rng.signed_unit() * (1.0 + (i % n_ff) as f32 / 10.0);
                    acts[i] = if i >= n_ff && rng.signed_unit() < 0.2 {
                        acts[i - n_ff]
                    } else {
                        fresh
                    };
                }
                let ups = (0..t * n_ff).map(|_| rng.signed_unit()).collect();
                (acts, ups)
            })
            .collect();
        let norms: Vec<f32> = (0..n_ff).map(|j| 0.5 + j as f32 / 40.0).collect();
        let mut stats = LayerStats::new(norms, 0.5);
        for (a, u) in &chunks {
            stats.add(a, u);
        }
        let p = stats.finish(&sparsity_grid());
        let tokens: usize = chunks.iter().map(|(a, _)| a.len() / n_ff).sum();
        for (i, level) in p.levels.iter().enumerate() {
            let fires = |a: f32, j: usize| a.abs() * p.importance[j] > level.threshold;
            let mut count = vec![0u64; n_ff];
            let mut ages = [0u64; REUSE_WINDOW + 1];
            for (acts, _) in &chunks {
                let rows: Vec<&[f32]> = acts.chunks_exact(n_ff).collect();
                for (pos, row) in rows.iter().enumerate() {
                    for j in (0..n_ff).filter(|&j| fires(row[j], j)) {
                        count[j] += 1;
                        if pos >= REUSE_WINDOW {
                            let back = (1..=REUSE_WINDOW)
                                .find(|&k| fires(rows[pos - k][j], j))
                                .unwrap_or(REUSE_WINDOW + 1);
                            ages[back - 1] += 1;
                        }
                    }
                }
            }
            let want_frequency: Vec<f32> = count
                .iter()
                .map(|&c| (c as f64 / tokens as f64) as f32)
                .collect();
            assert_eq!(level.frequency, want_frequency, "level {i}");
            let seen: u64 = ages.iter().sum();
            assert!(seen > 0, "level {i}");
            let want_reuse: Vec<f32> = (1..=REUSE_WINDOW)
                .map(|k| (ages[..k].iter().sum::<u64>() as f64 / seen as f64) as f32)
                .collect();
            assert_eq!(level.reuse, want_reuse, "level {i}");
        }
        // The levels differ, and reuse grows with the window.
        assert!(p.levels[0].active_share > p.levels[8].active_share);
        assert!(p.levels[4].reuse[0] < p.levels[4].reuse[4]);
    }

    #[test]
    fn relu_zeros_are_natural_sparsity() {
        let acts: Vec<f32> = (0..1000)
            .map(|i| if i % 10 == 0 { 1.0 + i as f32 } else { 0.0 })
            .collect();
        let ups = vec![1.0; 1000];
        let p = layer_profile(&acts, &ups, vec![1.0; 10], &sparsity_grid(), 0.5);
        assert!((p.zero_fraction - 0.9).abs() < 1e-6);
        // Up to 90% the threshold stays at the natural zero; kept mass stays whole there.
        assert_eq!(p.thresholds[18], 0.0);
        assert_eq!(p.kept_mass[18], 1.0);
        assert!(p.thresholds[19] > 0.0);
    }

    #[test]
    fn chunks_stream_to_the_profile_of_the_whole() {
        // A layer's tokens in one chunk or in four give the same thresholds and masses (the
        // first chunk's importance is the same here: every chunk has the same |up|).
        let n_ff = 16;
        let acts: Vec<f32> = (0..n_ff * 400)
            .map(|i| (((i * 7919) % 1009) as f32 - 500.0) / 97.0)
            .collect();
        let ups: Vec<f32> = (0..acts.len()).map(|i| 1.0 + (i % n_ff) as f32).collect();
        let norms: Vec<f32> = (0..n_ff).map(|j| 0.5 + j as f32 * 0.1).collect();
        let grid = sparsity_grid();
        let mut whole = LayerStats::new(norms.clone(), 0.5);
        whole.add(&acts, &ups);
        let mut parts = LayerStats::new(norms, 0.5);
        for (a, u) in acts.chunks(n_ff * 100).zip(ups.chunks(n_ff * 100)) {
            parts.add(a, u);
        }
        let (w, p) = (whole.finish(&grid), parts.finish(&grid));
        assert_eq!(w.thresholds, p.thresholds);
        assert_eq!(w.importance, p.importance);
        for (a, b) in w.kept_mass.iter().zip(&p.kept_mass) {
            assert!((a - b).abs() < 1e-6);
        }
        assert!(w.thresholds[10] > 0.0);
    }
}

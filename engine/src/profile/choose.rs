//! The operating point `conductor profile` records: the candidates it measures on held-out
//! text, in the order that needs the fewest measurements, and the choice among them
//! ([`choose`]: the cheapest within the tolerance of dense).
//!
//! Perplexity grows with the threshold's sparsity, and at a fixed sparsity it falls as the
//! predictor's recall rises; both searches are bisections on that order:
//! 1. dense;
//! 2. threshold sparsity: the levels of the profile ([`LEVELS`], and a ReLU model's natural
//!    zeros first), bisected for the sparsest within the tolerance;
//! 3. predictor recall at that sparsity, among the recalls whose cost is below the
//!    threshold's, bisected for the lowest within the tolerance.
//!
//! At most 1 + 4 + 3 measurements.

use conductor_runtime::sparse::layer_stats::LEVELS;
use conductor_runtime::sparse::operating::{
    choose, point_cost, ChosenPoint, MeasuredPoint, OperatingPoint, PointSource,
};
use conductor_runtime::sparse::profile::{ModelProfile, PREDICTOR_RECALLS};

/// Measured perplexities: the search's input and its record.
pub struct Search {
    pub dense: f64,
    pub points: Vec<MeasuredPoint>,
}

/// The candidates' sparsities for the threshold: the levels above the layers' natural zeros
/// (for a ReLU model, the natural zeros themselves first: threshold 0).
fn threshold_sparsities(profile: &ModelProfile) -> Vec<f32> {
    let zeros = profile
        .layers
        .iter()
        .map(|l| l.zero_fraction)
        .fold(0.0f32, f32::max);
    let mut out = Vec::new();
    if profile.model.relu {
        out.push(0.0);
    }
    out.extend(LEVELS.iter().copied().filter(|&s| s > zeros));
    out
}

/// The lowest index in `0..n` where `pass` holds, given that it holds from some index on (`n`
/// when it never does), asking `pass` as few times as bisection needs.
fn first_passing<E>(n: usize, mut pass: impl FnMut(usize) -> Result<bool, E>) -> Result<usize, E> {
    let (mut lo, mut hi) = (0usize, n);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if pass(mid)? {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Ok(hi)
}

/// Measures the candidates of `profile` through `measure` (a point's perplexity on held-out
/// text) and returns every measurement, dense first. `tolerance`: the relative perplexity a
/// point may add to dense.
pub fn search<E>(
    profile: &ModelProfile,
    tolerance: f64,
    mut measure: impl FnMut(&OperatingPoint) -> Result<f64, E>,
) -> Result<Search, E>
where
    E: From<conductor_runtime::sparse::profile::ProfileError>,
{
    let dense = measure(&OperatingPoint::DENSE)?;
    let limit = dense * (1.0 + tolerance);
    let mut points: Vec<MeasuredPoint> = Vec::new();
    let mut record =
        |point: OperatingPoint, measure: &mut dyn FnMut(&OperatingPoint) -> Result<f64, E>| {
            measure_point(profile, &mut points, limit, point, measure)
        };
    // Sparsest threshold within the tolerance: passing is monotone downwards in sparsity, so
    // bisect on the sparsities from the top.
    let sparsities = threshold_sparsities(profile);
    let n = sparsities.len();
    let from_top = first_passing(n, |i| {
        record(
            OperatingPoint::threshold(sparsities[n - 1 - i]),
            &mut measure,
        )
    })?;
    let best = (from_top < n).then(|| sparsities[n - 1 - from_top]);
    if let (Some(s), Some(_)) = (best, &profile.predictors) {
        let threshold_cost = point_cost(profile, &OperatingPoint::threshold(s))?;
        let recalls: Vec<f32> = PREDICTOR_RECALLS
            .iter()
            .copied()
            .filter(|&r| {
                point_cost(profile, &OperatingPoint::predictor(s, Some(r)))
                    .is_ok_and(|c| c < threshold_cost)
            })
            .collect();
        first_passing(recalls.len(), |i| {
            record(OperatingPoint::predictor(s, Some(recalls[i])), &mut measure)
        })?;
    }
    Ok(Search { dense, points })
}

/// Measures `point`, records it in `points`, and says whether it is within `limit`.
fn measure_point<E>(
    profile: &ModelProfile,
    points: &mut Vec<MeasuredPoint>,
    limit: f64,
    point: OperatingPoint,
    measure: &mut dyn FnMut(&OperatingPoint) -> Result<f64, E>,
) -> Result<bool, E>
where
    E: From<conductor_runtime::sparse::profile::ProfileError>,
{
    let cost = point_cost(profile, &point)?;
    let perplexity = measure(&point)?;
    points.push(MeasuredPoint {
        point,
        cost,
        perplexity,
    });
    Ok(perplexity.is_finite() && perplexity <= limit)
}

/// The profile's operating point from a [`Search`] over `scored_tokens` tokens of `text`.
pub fn chosen(
    profile: &ModelProfile,
    search: Search,
    tolerance: f64,
    text: &str,
    scored_tokens: u64,
) -> ChosenPoint {
    let point = choose(search.dense, &search.points, tolerance);
    let cost = point_cost(profile, &point).unwrap_or(1.0);
    ChosenPoint {
        point,
        cost,
        source: PointSource::Measured {
            text: text.to_string(),
            scored_tokens,
            dense_perplexity: search.dense,
            tolerance,
            points: search.points,
        },
    }
}

/// The default of a ReLU model with random weights, which has no perplexity to measure:
/// ProSparse's published predictor point at its natural zeros.
pub fn published_relu_point(profile: &ModelProfile) -> Option<ChosenPoint> {
    use conductor_runtime::sparse::operating::PROSPARSE_RECALL;
    profile.predictors.as_ref()?;
    let point = OperatingPoint::predictor(0.0, Some(PROSPARSE_RECALL));
    let cost = point_cost(profile, &point).ok()?;
    Some(ChosenPoint {
        point,
        cost,
        source: PointSource::Published {
            source: "ProSparse (arXiv 2402.13516, Table 2): 91-93% recall with 75-79% of neurons predicted inactive at 88-89% sparsity; random weights, no perplexity measured".into(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use conductor_runtime::plan::ModelIdentity;
    use conductor_runtime::sparse::layer_stats::layer_profile;
    use conductor_runtime::sparse::predictor::Predictor;
    use conductor_runtime::sparse::profile::{
        sparsity_grid, PredictorPoint, PredictorSet, ProfileError, PROFILE_VERSION,
    };

    /// A two-layer profile of 1024 neurons (n_embd 256), with predictors of rank 32 whose
    /// points predict `recall` × (1 − sparsity) / 0.9 of the neurons (precision 0.9).
    fn profile(predictors: bool) -> ModelProfile {
        let (embd, ff) = (256, 1024);
        let grid = sparsity_grid();
        let acts: Vec<f32> = (0..ff * 200)
            .map(|i| ((i * 37) % 101) as f32 - 50.0)
            .collect();
        let ups = vec![1.0; acts.len()];
        let layer = layer_profile(&acts, &ups, vec![1.0; ff], &grid, 0.3);
        let w = |n: usize| -> Vec<f32> { (0..n).map(|i| ((i * 7) % 13) as f32 / 13.0).collect() };
        let pred = Predictor::from_weights(
            embd,
            ff,
            32,
            &w(32 * embd),
            vec![0.0; 32],
            &w(ff * 32),
            vec![0.0; ff],
            0.0,
        )
        .unwrap();
        let points: Vec<PredictorPoint> = LEVELS
            .iter()
            .flat_map(|&s| {
                PREDICTOR_RECALLS.iter().map(move |&r| PredictorPoint {
                    sparsity: s,
                    recall_target: r,
                    cut: r,
                    recall: r,
                    precision: 0.9,
                    predicted: (r * (1.0 - s) / 0.9).min(1.0),
                })
            })
            .collect();
        ModelProfile {
            version: PROFILE_VERSION,
            model: ModelIdentity {
                arch: "llama".into(),
                n_layer: 2,
                n_embd: embd as u32,
                n_ff: ff as u32,
                relu: false,
                norms_crc32: 1,
            },
            source: "test".into(),
            calibration: "test".into(),
            tokens: 200,
            grid,
            reference_sparsity: 0.3,
            layers: vec![layer.clone(), layer],
            predictors: predictors.then(|| PredictorSet {
                sparsity: 0.3,
                layers: vec![pred.clone(), pred],
                held_out: vec![(0.99, 0.5, 0.9); 2],
                points: vec![points.clone(), points],
            }),
            operating_point: None,
        }
    }

    /// Perplexity 10 dense, growing with the square of the threshold's sparsity, and with the
    /// predictor's misses.
    fn perplexity(p: &OperatingPoint) -> Result<f64, ProfileError> {
        let base = 10.0 * (1.0 + f64::from(p.sparsity).powi(2) / 2.0);
        Ok(match p.predictor_recall {
            Some(r) => base * (1.0 + (1.0 - f64::from(r)) * 0.2),
            None => base,
        })
    }

    #[test]
    fn the_search_measures_few_points_and_the_choice_is_the_cheapest_within() {
        // Threshold only: 20% is the sparsest within 3% (10.2 ≤ 10.3 < 10.45 at 30%).
        let p = profile(false);
        let mut asked = Vec::new();
        let s = search(&p, 0.03, |pt| {
            asked.push(*pt);
            perplexity(pt)
        })
        .unwrap();
        assert_eq!(asked[0], OperatingPoint::DENSE);
        assert!(asked.len() <= 5, "{asked:?}");
        let c = chosen(&p, s, 0.03, "held out", 100);
        assert_eq!(c.point, OperatingPoint::threshold(0.2));
        assert!(c.cost < 1.0);
        let PointSource::Measured {
            points,
            dense_perplexity,
            ..
        } = &c.source
        else {
            panic!("measured")
        };
        assert_eq!(*dense_perplexity, 10.0);
        assert!(points
            .iter()
            .any(|m| m.point == OperatingPoint::threshold(0.3)));

        // With predictors at 20%: recalls cheaper than the threshold there are tried, and
        // the lowest within 3% wins (10.2 · (1 + 0.2 · (1 − r)) ≤ 10.3 needs r ≥ 0.951).
        let p = profile(true);
        let mut asked = 0;
        let s = search(&p, 0.03, |pt| {
            asked += 1;
            perplexity(pt)
        })
        .unwrap();
        assert!(asked <= 1 + 4 + 3, "{asked}");
        let c = chosen(&p, s, 0.03, "held out", 100);
        assert_eq!(c.point, OperatingPoint::predictor(0.2, Some(0.98)));
    }

    #[test]
    fn nothing_within_the_tolerance_chooses_dense() {
        let p = profile(true);
        let s = search(&p, 0.001, perplexity).unwrap();
        assert_eq!(chosen(&p, s, 0.001, "t", 1).point, OperatingPoint::DENSE);
        // A measurement that fails stops the search with its error.
        let e = search(&profile(false), 0.03, |pt| {
            if pt.sparsity > 0.4 {
                Err(ProfileError::Sparsity(pt.sparsity))
            } else {
                perplexity(pt)
            }
        });
        assert!(e.is_err());
    }

    #[test]
    fn bisection_finds_the_first_passing_index_with_few_questions() {
        for n in 0..12 {
            for first in 0..=n {
                let mut asked = 0;
                let got = first_passing(n, |i| {
                    asked += 1;
                    Ok::<bool, ()>(i >= first)
                })
                .unwrap();
                assert_eq!(got, first, "n {n}");
                assert!(
                    asked <= (n as f64 + 1.0).log2().ceil() as usize,
                    "n {n}: {asked}"
                );
            }
        }
    }
}

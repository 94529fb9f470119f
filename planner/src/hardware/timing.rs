//! Timing: medians over repetitions of batches sized to a target duration.

use conductor_runtime::sample::SplitMix64;
use std::time::{Duration, Instant};

/// How long and how often to measure: a full run or `--quick`.
#[derive(Clone, Copy, Debug)]
pub struct Effort {
    /// Repetitions per figure; the median is kept (the machine may be shared).
    pub reps: usize,
    /// Duration of one repetition of a compute kernel.
    pub target: Duration,
    /// Duration of one repetition of a storage read pattern.
    pub storage_target: Duration,
    pub storage_reps: usize,
    /// Rows of the norm + quantize + add measurement.
    pub finish_rows: usize,
    /// Size of the memory bandwidth buffer, as a multiple of the LLC and at least `mem_min`.
    pub mem_llc_multiple: u64,
    pub mem_min: u64,
}

impl Effort {
    pub fn new(quick: bool) -> Effort {
        if quick {
            Effort {
                reps: 3,
                target: Duration::from_millis(4),
                storage_target: Duration::from_millis(8),
                storage_reps: 1,
                finish_rows: 16,
                mem_llc_multiple: 4,
                mem_min: 64 << 20,
            }
        } else {
            Effort {
                reps: 7,
                target: Duration::from_millis(40),
                // Many short samples, not a few long ones: they are spread over the whole
                // storage measurement (see `storage::measure_reads`).
                storage_target: Duration::from_millis(40),
                storage_reps: 7,
                finish_rows: 64,
                mem_llc_multiple: 8,
                mem_min: 256 << 20,
            }
        }
    }
}

pub fn median(v: &mut [f64]) -> f64 {
    assert!(!v.is_empty(), "median of nothing");
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Seconds per call of `f`: one call to warm up, one to size the batches, then the median over
/// `effort.reps` batches of about `effort.target` each. Never zero.
pub fn secs_per_call(effort: &Effort, mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    f();
    let one = t.elapsed().as_secs_f64().max(1e-9);
    let iters = ((effort.target.as_secs_f64() / one).ceil() as usize).clamp(1, 10_000_000);
    let mut per_call: Vec<f64> = (0..effort.reps.max(1))
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_secs_f64() / iters as f64
        })
        .collect();
    median(&mut per_call).max(1e-12)
}

/// Test data: `n` values uniform in [-1, 1).
pub fn signed_units(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.signed_unit()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 3.0);
    }

    #[test]
    fn calls_are_timed_positive() {
        let mut n = 0u64;
        let s = secs_per_call(&Effort::new(true), || n += 1);
        assert!(s > 0.0 && n >= 3);
    }

    #[test]
    fn test_data_stays_in_range() {
        let data = signed_units(&mut SplitMix64::new(7), 1000);
        assert!(data.iter().all(|x| (-1.0..1.0).contains(x)));
        assert!(data.iter().any(|&x| x < -0.5) && data.iter().any(|&x| x > 0.5));
    }
}

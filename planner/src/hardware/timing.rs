//! Timing: medians over repetitions of batches sized to a target duration.

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

/// Deterministic pseudo-random numbers (xorshift64), for test data and read offsets.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `0..n` (n > 0; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in [-1, 1).
    pub fn signed_unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.signed_unit()).collect()
    }
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
    fn random_numbers_stay_in_range() {
        let mut r = Rng::new(7);
        for _ in 0..1000 {
            assert!(r.below(10) < 10);
            let x = r.signed_unit();
            assert!((-1.0..1.0).contains(&x));
        }
    }
}

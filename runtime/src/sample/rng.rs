//! The project's one seeded generator, SplitMix64: the sampler's draws, fault schedules,
//! tool-call ids, the predictors' initialisation and shuffles, and the hardware profiler's test
//! data and read offsets. (Random-weight models use a generator that can jump ahead,
//! `synthetic/noise.rs`.) The same seed gives the same numbers on every platform and build.

/// SplitMix64 (Steele, Lea and Flood): small, fast, and statistically good enough for sampling
/// and test schedules. Not for secrets.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [-1, 1), from the top 24 bits (every value an f32 holds exactly).
    pub fn signed_unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    /// Uniform in `0..n` (`n > 0`), by multiplying rather than by a biased modulo.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::SplitMix64;

    #[test]
    fn the_sequence_is_splitmix64s() {
        // The reference outputs of SplitMix64 seeded with 0 (as in its published test vectors).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        let mut r = SplitMix64::new(7);
        for _ in 0..1000 {
            assert!(r.below(10) < 10);
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
        }
    }
}

//! Streaming read bandwidth of DRAM: one pinned core, then every core at once.

use super::system::pin_to;
use super::timing::{median, secs_per_call, Effort};
use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

/// A buffer of `bytes` (rounded down to 64-byte lines) holding non-zero data: pages that were
/// never written map the shared zero page, and reading them would measure a cache.
pub fn buffer(bytes: u64) -> Vec<u64> {
    let n = (bytes as usize / 64).max(1) * 8;
    (0..n as u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        .collect()
}

/// Reads every word of `words` once. Eight independent sums so the loop is bound by loads, not
/// by one addition chain (the compiler vectorizes it).
pub fn read_all(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    for chunk in words.chunks_exact(8) {
        for (a, w) in acc.iter_mut().zip(chunk) {
            *a = a.wrapping_add(*w);
        }
    }
    acc.iter().fold(0, |x, y| x ^ y)
}

/// GB/s of one thread reading `words` over and over (the caller pins it).
pub fn one_core_gbs(words: &[u64], effort: &Effort) -> f64 {
    let secs = secs_per_call(effort, || {
        black_box(read_all(black_box(words)));
    });
    (words.len() * 8) as f64 / secs / 1e9
}

/// GB/s of one pinned thread per core, each reading its own slice of `words` `passes` times,
/// started together; per repetition, all bytes over the time from the first start to the last
/// finish. Also returns the cores that could not be pinned.
pub fn all_cores_gbs(words: &[u64], cores: &[u32], passes: usize, reps: usize) -> (f64, Vec<u32>) {
    let n = cores.len().max(1);
    let per = words.len() / n / 8 * 8;
    let barrier = Barrier::new(n);
    // Per thread: (start, end) of each repetition, and its core if pinning failed.
    type Spans = (Vec<(Instant, Instant)>, Option<u32>);
    let results: Vec<Spans> = std::thread::scope(|s| {
        let handles: Vec<_> = cores
            .iter()
            .enumerate()
            .map(|(i, &core)| {
                let slice = &words[i * per..(i + 1) * per];
                let barrier = &barrier;
                s.spawn(move || {
                    let unpinned = (!pin_to(core)).then_some(core);
                    black_box(read_all(slice)); // warm the TLB, fault nothing later
                    let spans = (0..reps)
                        .map(|_| {
                            barrier.wait();
                            let t0 = Instant::now();
                            for _ in 0..passes {
                                black_box(read_all(black_box(slice)));
                            }
                            (t0, Instant::now())
                        })
                        .collect();
                    (spans, unpinned)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a bandwidth thread panicked"))
            .collect()
    });
    let bytes = (per * 8 * n * passes) as f64;
    let mut gbs: Vec<f64> = (0..reps)
        .map(|r| {
            let start = results.iter().map(|(s, _)| s[r].0).min().expect("cores");
            let end = results.iter().map(|(s, _)| s[r].1).max().expect("cores");
            bytes / (end - start).as_secs_f64().max(1e-9) / 1e9
        })
        .collect();
    let unpinned = results.iter().filter_map(|(_, u)| *u).collect();
    (median(&mut gbs), unpinned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_nonzero_lines() {
        let b = buffer(1000);
        assert_eq!(b.len(), 15 * 8);
        assert!(b.iter().all(|&w| w != 0));
        // Words 1..=8 land in one lane each (the ninth is not a whole line): 1^2^…^8 = 8.
        assert_eq!(read_all(&[1, 2, 3, 4, 5, 6, 7, 8, 9]), 8);
        assert_eq!(read_all(&[5; 16]), 0, "eight equal lanes cancel");
    }

    #[test]
    fn all_cores_reads_every_slice() {
        let words = buffer(1 << 20);
        let (gbs, _) = all_cores_gbs(&words, &[0, 0], 1, 2);
        assert!(gbs > 0.0);
    }
}

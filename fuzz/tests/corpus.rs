//! The fuzz targets on stable: every committed seed (`fuzz/corpus/TARGET/`), every crash
//! found and fixed (`fuzz/regressions/TARGET/`), and seeded mutations of the seeds (bit flips,
//! byte overwrites with boundary values, truncations, splices), each through its target. A
//! panic here is a crash libFuzzer would report; the failing target, file and mutation seed
//! are printed first, so the input can be rebuilt.
//!
//! `CONDUCTOR_FUZZ_SMOKE_MUTATIONS` sets the mutations per seed (default 300).

use std::path::{Path, PathBuf};

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    out.retain(|p| p.is_file());
    out.sort();
    out
}

/// xorshift64*: the mutations are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One to four edits of `seed`, `other` a second seed to splice from.
fn mutate(seed: &[u8], other: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        if b.is_empty() {
            b.push(rng.next() as u8);
            continue;
        }
        let at = rng.below(b.len());
        match rng.below(6) {
            0 => b[at] ^= 1 << rng.below(8),
            1 => b[at] = [0, 1, 0x7f, 0x80, 0xff][rng.below(5)],
            2 => {
                // A little-endian length or count field set to a boundary value.
                let v: u64 = [0, 1, u32::MAX as u64, u64::MAX, 1 << 31, 1 << 40][rng.below(6)];
                let n = (b.len() - at).min(8);
                b[at..at + n].copy_from_slice(&v.to_le_bytes()[..n]);
            }
            3 => b.truncate(at),
            4 if !other.is_empty() => {
                let from = rng.below(other.len());
                let len = rng.below(64).min(other.len() - from);
                b.splice(at..at, other[from..from + len].iter().copied());
            }
            _ => {
                let len = rng.below(16).min(b.len() - at);
                let chunk = b[at..at + len].to_vec();
                b.splice(at..at, chunk);
            }
        }
    }
    b
}

#[test]
fn every_target_survives_its_corpus_its_regressions_and_mutations_of_them() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let per_seed: usize = std::env::var("CONDUCTOR_FUZZ_SMOKE_MUTATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    for &(name, target) in conductor_fuzz::TARGETS {
        let seeds = files(&root.join("corpus").join(name));
        // A missing corpus would make this test pass without running anything.
        assert!(
            !seeds.is_empty(),
            "fuzz/corpus/{name} is empty: run the make_corpus example"
        );
        let regressions = files(&root.join("regressions").join(name));
        let started = std::time::Instant::now();
        let mut runs = 0;
        for path in &seeds {
            assert!(
                target(&std::fs::read(path).unwrap()),
                "{name}: the seed {} does not get past the parser, so it seeds nothing",
                path.display()
            );
            runs += 1;
        }
        for path in &regressions {
            eprintln!("{name}: {}", path.display());
            target(&std::fs::read(path).unwrap());
            runs += 1;
        }
        let bytes: Vec<Vec<u8>> = seeds.iter().map(|p| std::fs::read(p).unwrap()).collect();
        for (i, seed) in bytes.iter().enumerate() {
            let other = &bytes[(i + 1) % bytes.len()];
            for m in 0..per_seed {
                let s = (i as u64) << 32 | m as u64;
                let mut rng = Rng(s.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
                let input = mutate(seed, other, &mut rng);
                let result = std::panic::catch_unwind(|| target(&input));
                if result.is_err() {
                    let out = std::env::temp_dir().join(format!("crash-{name}-{s}"));
                    std::fs::write(&out, &input).unwrap();
                    panic!(
                        "{name} panicked on mutation {m} of {} (seed {s}); input written to {}",
                        seeds[i].display(),
                        out.display()
                    );
                }
                runs += 1;
            }
        }
        eprintln!(
            "{name}: {runs} inputs in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
}

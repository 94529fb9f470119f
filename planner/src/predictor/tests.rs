//! Tests of predictor training: synthetic layers with a known low-rank rule, checked for what
//! `train_layer` reports, its determinism, its errors and the threshold choice.

use super::net::uniform;
use super::threshold::{calibrate, recall_threshold};
use super::*;
use conductor_runtime::quant::Kernels;
use conductor_runtime::sample::SplitMix64;
use conductor_runtime::sparse::predictor::{bitset_words, PredictorScratch};

/// Synthetic layer: x Gaussian-ish with `n_embd` dims, active_j = (A·x)_j > c_j for a random
/// rank-`k` A (`n_ff × n_embd`), c_j set for an active share around `share`.
fn synthetic(
    tokens: usize,
    n_embd: usize,
    n_ff: usize,
    k: usize,
    share: f32,
    seed: u64,
) -> (Vec<f32>, Vec<u64>) {
    let mut rng = SplitMix64::new(seed);
    let gauss = |rng: &mut SplitMix64| {
        (0..4).map(|_| uniform(rng, 1.0)).sum::<f32>() * (3.0f32 / 4.0).sqrt()
    };
    let u: Vec<f32> = (0..n_ff * k).map(|_| gauss(&mut rng)).collect();
    let v: Vec<f32> = (0..k * n_embd).map(|_| gauss(&mut rng)).collect();
    let x: Vec<f32> = (0..tokens * n_embd).map(|_| gauss(&mut rng)).collect();
    // Gaussian z ~ N(0, σ²): threshold at the quantile for `share` (probit approximation).
    let q = {
        // Inverse normal CDF at 1 - share (Acklam-lite: good enough for a share).
        let p = 1.0 - share as f64;
        let t = (-2.0 * (p.min(1.0 - p)).ln()).sqrt();
        let z = t
            - (2.515517 + 0.802853 * t + 0.010328 * t * t)
                / (1.0 + 1.432788 * t + 0.189269 * t * t + 0.001308 * t * t * t);
        if p >= 0.5 {
            z
        } else {
            -z
        }
    } as f32;
    let words = bitset_words(n_ff);
    let mut active = vec![0u64; tokens * words];
    let mut vx = vec![0f32; k];
    for t in 0..tokens {
        let xr = &x[t * n_embd..(t + 1) * n_embd];
        for (j, o) in vx.iter_mut().enumerate() {
            *o = v[j * n_embd..(j + 1) * n_embd]
                .iter()
                .zip(xr)
                .map(|(a, b)| a * b)
                .sum();
        }
        let sd = ((k * n_embd) as f32).sqrt();
        for n in 0..n_ff {
            let z: f32 = u[n * k..(n + 1) * k]
                .iter()
                .zip(&vx)
                .map(|(a, b)| a * b)
                .sum::<f32>()
                / sd;
            if z > q {
                active[t * words + n / 64] |= 1 << (n % 64);
            }
        }
    }
    (x, active)
}

fn small_cfg() -> PredictorConfig {
    PredictorConfig {
        ranks: vec![32, 64],
        epochs: 8,
        ..PredictorConfig::default()
    }
}

#[test]
fn learns_a_low_rank_rule() {
    let (d, f) = (128, 320);
    let (x, active) = synthetic(3000, d, f, 8, 0.3, 7);
    let set = TrainingSet::new(&x, &active, d, f).unwrap();
    let mut calls = 0;
    let mut last = 0.0;
    let tp = train_layer(&set, &small_cfg(), &mut |p| {
        assert!(p >= last && p <= 1.0);
        last = p;
        calls += 1;
    })
    .unwrap();
    eprintln!("{tp:#?}");
    assert!(calls > 1 && last == 1.0);
    assert!(tp.meets_target, "{:?}", tp.tried);
    assert!(tp.chosen.recall >= 0.99);
    assert!(
        tp.chosen.precision > 0.7 && tp.chosen.precision > 2.0 * tp.base_rate,
        "precision {} vs base rate {}",
        tp.chosen.precision,
        tp.base_rate
    );
    assert!(tp.chosen.predicted_fraction < 0.4);
    assert_eq!(
        tp.train_tokens + tp.calibration_tokens + tp.held_out_tokens,
        3000
    );
    tp.predictor.validate(d, f).unwrap();
}

#[test]
fn stops_once_a_larger_rank_does_not_pay() {
    // A rank-4 rule blurred by random extra actives, which no rank can predict: a recall
    // of 0.99 needs nearly every neuron predicted at any rank, so the cost bound does not
    // skip 64, and rank 64 meets the target for more predictor work per token; 96 and 128
    // are not trained.
    let (d, f) = (128, 256);
    let (x, mut active) = synthetic(1500, d, f, 4, 0.3, 11);
    let mut rng = SplitMix64::new(5);
    for w in active.iter_mut() {
        for _ in 0..6 {
            *w |= 1 << (rng.next_u64() % 64);
        }
    }
    let set = TrainingSet::new(&x, &active, d, f).unwrap();
    let cfg = PredictorConfig {
        ranks: vec![128, 32, 96, 64],
        epochs: 6,
        ..PredictorConfig::default()
    };
    let tp = train_layer(&set, &cfg, &mut |_| {}).unwrap();
    let tried: Vec<usize> = tp.tried.iter().map(|r| r.rank).collect();
    assert_eq!(tried, [32, 64], "{tp:#?}");
    assert!(tp.tried.iter().all(|r| r.recall >= 0.99), "{:?}", tp.tried);
    assert!(tp.tried[1].cost >= tp.tried[0].cost);
    assert_eq!(tp.stopped, [96, 128]);
    assert!(tp.skipped.is_empty());
    assert_eq!(tp.chosen.rank, 32);
}

#[test]
fn predict_matches_the_reported_figures() {
    // `predict` (matvec per token) reproduces the batched evaluation bit for bit, so the
    // held-out figures are those of the inference path.
    let (d, f) = (64, 100);
    let (x, active) = synthetic(600, d, f, 4, 0.4, 3);
    let set = TrainingSet::new(&x, &active, d, f).unwrap();
    let cfg = PredictorConfig {
        ranks: vec![32],
        epochs: 3,
        ..PredictorConfig::default()
    };
    let tp = train_layer(&set, &cfg, &mut |_| {}).unwrap();
    let p = &tp.predictor;
    let held = 600 - tp.held_out_tokens..600;
    let words = bitset_words(f);
    for kernels in Kernels::available() {
        let mut scratch = PredictorScratch::new(p);
        let mut bits = vec![0u64; words];
        let (mut tp_n, mut pos, mut predicted) = (0u64, 0u64, 0u64);
        let mut batched = Vec::new();
        p.logits_rows(&kernels, set.x, held.clone(), |_, l| {
            batched.extend_from_slice(l)
        });
        for (i, t) in held.clone().enumerate() {
            let l = p.logits(&kernels, set.row(t), &mut scratch).to_vec();
            let want: Vec<u32> = batched[i * f..(i + 1) * f]
                .iter()
                .map(|v| v.to_bits())
                .collect();
            let got: Vec<u32> = l.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{}", kernels.isa());
            p.predict(&kernels, set.row(t), &mut scratch, &mut bits);
            assert_eq!(bits[words - 1] >> (f % 64), 0, "bits past n_ff");
            for n in 0..f {
                let a = set.is_active(t, n);
                let b = (bits[n / 64] >> (n % 64)) & 1 == 1;
                tp_n += u64::from(a && b);
                pos += u64::from(a);
                predicted += u64::from(b);
            }
        }
        let recall = tp_n as f32 / pos as f32;
        let frac = predicted as f32 / (tp.held_out_tokens * f) as f32;
        assert_eq!(recall, tp.chosen.recall);
        assert_eq!(frac, tp.chosen.predicted_fraction);
    }
}

#[test]
fn training_is_deterministic() {
    let (d, f) = (64, 96);
    let (x, active) = synthetic(500, d, f, 4, 0.5, 11);
    let set = TrainingSet::new(&x, &active, d, f).unwrap();
    let cfg = PredictorConfig {
        ranks: vec![32, 64],
        epochs: 3,
        ..PredictorConfig::default()
    };
    let enc = |p: &TrainedPredictor| {
        bincode::serde::encode_to_vec(p, bincode::config::standard()).unwrap()
    };
    let a = train_layer(&set, &cfg, &mut |_| {}).unwrap();
    let b = train_layer(&set, &cfg, &mut |_| {}).unwrap();
    assert_eq!(enc(&a), enc(&b));
    // Concurrent trainings (as a driver training layers on threads) give the same bits.
    let c = std::thread::scope(|s| {
        let h: Vec<_> = (0..2)
            .map(|_| s.spawn(|| train_layer(&set, &cfg, &mut |_| {}).unwrap()))
            .collect();
        h.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    });
    for c in &c {
        assert_eq!(enc(c), enc(&a));
    }
    // Another seed gives another predictor.
    let other = PredictorConfig { seed: 1, ..cfg };
    let d2 = train_layer(&set, &other, &mut |_| {}).unwrap();
    assert_ne!(enc(&d2), enc(&a));
}

#[test]
fn bad_input_is_an_error() {
    let (d, f) = (64, 70);
    let words = bitset_words(f);
    let x = vec![0.5f32; 200 * d];
    let active = vec![1u64; 200 * words];
    assert!(matches!(
        TrainingSet::new(&x[..d * 10 + 3], &active[..10 * words], d, f),
        Err(PredictorError::Length { .. })
    ));
    assert!(matches!(
        TrainingSet::new(&x[..d * 10], &active[..10 * words - 1], d, f),
        Err(PredictorError::Length { .. })
    ));
    assert!(matches!(
        TrainingSet::new(&x[..0], &active[..0], d, f),
        Err(PredictorError::Empty)
    ));
    assert!(matches!(
        TrainingSet::new(&x[..48 * 10], &active[..10 * words], 48, f),
        Err(PredictorError::EmbdNotBlockMultiple(48))
    ));
    assert!(matches!(
        TrainingSet::new(&x[..d], &[], d, 0),
        Err(PredictorError::NoNeurons)
    ));
    // Too few tokens for the split.
    let set = TrainingSet::new(&x[..60 * d], &active[..60 * words], d, f).unwrap();
    let e = train_layer(&set, &small_cfg(), &mut |_| {}).unwrap_err();
    assert!(
        matches!(e, PredictorError::TooFewTokens { tokens: 60, .. }),
        "{e}"
    );
    // A hand-made set bypassing the constructor is checked again.
    let raw = TrainingSet {
        x: &x[..d * 150],
        active: &active[..149 * words],
        n_embd: d,
        n_ff: f,
    };
    assert!(train_layer(&raw, &small_cfg(), &mut |_| {}).is_err());
    // Non-finite inputs and bad configs.
    let mut xn = x.clone();
    xn[d * 7 + 1] = f32::NAN;
    let set = TrainingSet::new(&xn, &active, d, f).unwrap();
    assert_eq!(
        train_layer(&set, &small_cfg(), &mut |_| {}).unwrap_err(),
        PredictorError::NonFinite { token: 7 }
    );
    let set = TrainingSet::new(&x, &active, d, f).unwrap();
    for cfg in [
        PredictorConfig {
            ranks: vec![],
            ..small_cfg()
        },
        PredictorConfig {
            ranks: vec![48],
            ..small_cfg()
        },
        PredictorConfig {
            target_recall: 1.5,
            ..small_cfg()
        },
        PredictorConfig {
            held_out_fraction: 0.0,
            ..small_cfg()
        },
        PredictorConfig {
            epochs: 0,
            ..small_cfg()
        },
        PredictorConfig {
            learning_rate: f32::NAN,
            ..small_cfg()
        },
    ] {
        assert!(matches!(
            train_layer(&set, &cfg, &mut |_| {}),
            Err(PredictorError::Config(_))
        ));
    }
}

#[test]
fn all_active_or_none_active_do_not_break() {
    let (d, f) = (32, 64);
    let words = bitset_words(f);
    let (x, _) = synthetic(300, d, f, 2, 0.5, 5);
    let cfg = PredictorConfig {
        ranks: vec![32],
        epochs: 2,
        ..PredictorConfig::default()
    };
    for fill in [0u64, u64::MAX] {
        let active = vec![fill; 300 * words];
        let set = TrainingSet::new(&x, &active, d, f).unwrap();
        let tp = train_layer(&set, &cfg, &mut |_| {}).unwrap();
        assert!(tp.meets_target, "{tp:?}");
        if fill == u64::MAX {
            assert!(tp.chosen.recall >= 0.99);
            assert_eq!(tp.chosen.precision, 1.0);
        } else {
            assert_eq!(tp.chosen.recall, 1.0);
            assert_eq!(tp.chosen.predicted_fraction, 0.0);
        }
    }
}

#[test]
fn validate_rejects_other_shapes_and_serde_round_trips() {
    let (d, f) = (64, 80);
    let (x, active) = synthetic(400, d, f, 4, 0.4, 9);
    let set = TrainingSet::new(&x, &active, d, f).unwrap();
    let cfg = PredictorConfig {
        ranks: vec![32],
        epochs: 1,
        ..PredictorConfig::default()
    };
    let p = train_layer(&set, &cfg, &mut |_| {}).unwrap().predictor;
    p.validate(d, f).unwrap();
    let e = p.validate(576, 1536).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("n_embd 64 x n_ff 80") && msg.contains("n_embd 576 x n_ff 1536"));
    assert!(p.validate(d, f + 1).is_err());
    assert_eq!(p.bytes(), 32 * 2 * 34 + 80 * 34 + 4 * (32 + 80));

    let bytes = bincode::serde::encode_to_vec(&p, bincode::config::standard()).unwrap();
    let (q, used): (Predictor, usize) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
    assert_eq!(used, bytes.len());
    assert_eq!(q, p);
    q.validate(d, f).unwrap();
    let kernels = Kernels::best();
    let (mut s1, mut s2) = (PredictorScratch::default(), PredictorScratch::new(&q));
    let (mut a1, mut a2) = (vec![0u64; 2], vec![0u64; 2]);
    p.predict(&kernels, &x[..d], &mut s1, &mut a1);
    q.predict(&kernels, &x[..d], &mut s2, &mut a2);
    assert_eq!(a1, a2);

    // A corrupted predictor: `validate`'s own test, in the runtime.
}

#[test]
fn threshold_meets_the_wanted_recall() {
    let mut v: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    let t = recall_threshold(&mut v, 0.99);
    assert_eq!(t, 10.0);
    assert_eq!(v.iter().filter(|&&z| z >= t).count(), 990);
    let mut v = vec![1.0f32; 5];
    assert_eq!(recall_threshold(&mut v, 1.0), 1.0);
    assert_eq!(recall_threshold(&mut [], 0.99), f32::INFINITY);
    // Lowered to just above the highest negative under the quantile threshold.
    let logits = [5.0, -1.0, 0.5, 1.0, 2.0, 3.0, 0.7];
    let pos = [true, false, true, true, true, true, false];
    let (t, r) = calibrate(&logits, |i| pos[i], 0.8);
    assert_eq!((t, r), (1.0, 0.8));
    let pos = [true, false, true, true, true, true, true];
    let (t, r) = calibrate(&logits, |i| pos[i], 0.8);
    assert_eq!((t, r), (0.5, 1.0));
    assert_eq!(calibrate(&logits, |_| false, 0.99), (f32::INFINITY, 1.0));
}

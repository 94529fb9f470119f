//! [`train_layer`]: the search over rank candidates. It splits the tokens, trains each rank
//! (`net.rs`), quantizes and calibrates it (`threshold.rs`), measures it on the held-out tokens
//! and keeps the cheapest predictor meeting the target.

use super::net::Trainer;
use super::threshold::calibrate;
use super::{PredictorConfig, RankReport, TrainedPredictor, TrainingSet};
use conductor_runtime::quant::Kernels;
use conductor_runtime::sample::SplitMix64;
use conductor_runtime::sparse::predictor::{
    bitset_words, set_bits, Predictor, PredictorError, MIN_CALIB_TOKENS, MIN_HELD_OUT_TOKENS,
    MIN_TRAIN_TOKENS,
};

/// Token ranges of the split: training, calibration, held-out.
fn split(
    tokens: usize,
    cfg: &PredictorConfig,
) -> Result<[std::ops::Range<usize>; 3], PredictorError> {
    let held = ((tokens as f64) * f64::from(cfg.held_out_fraction)).ceil() as usize;
    let held = held.min(tokens);
    let rest = tokens - held;
    let calib = (((rest as f64) * f64::from(cfg.calibration_fraction)).ceil() as usize).min(rest);
    let train = rest - calib;
    if train < MIN_TRAIN_TOKENS || calib < MIN_CALIB_TOKENS || held < MIN_HELD_OUT_TOKENS {
        return Err(PredictorError::TooFewTokens {
            tokens,
            train,
            calib,
            held_out: held,
        });
    }
    Ok([0..train, train..rest, rest..tokens])
}

/// Trains one layer's predictor: the rank candidates ascending, skipping those that cannot beat
/// the best so far and stopping once a rank that meets the target costs no less than a smaller
/// one that met it (see [`TrainedPredictor::stopped`]), each quantized and calibrated, and
/// keeps the cheapest one whose held-out recall meets the target (see the module docs). `progress` gets the share of the work done,
/// in `[0, 1]`, after every epoch.
pub fn train_layer(
    set: &TrainingSet,
    cfg: &PredictorConfig,
    progress: &mut dyn FnMut(f32),
) -> Result<TrainedPredictor, PredictorError> {
    let tokens = set.check()?;
    cfg.check()?;
    if let Some(t) = set
        .x
        .chunks_exact(set.n_embd)
        .position(|row| row.iter().any(|v| !v.is_finite()))
    {
        return Err(PredictorError::NonFinite { token: t });
    }
    let [train, calib, held] = split(tokens, cfg)?;
    let (d, f) = (set.n_embd, set.n_ff);
    let kernels = Kernels::best();

    let mut ranks = cfg.ranks.clone();
    ranks.sort_unstable();
    ranks.dedup();

    // Per-neuron base rates on the training tokens (initial b2) and the held-out base rate.
    let mut counts = vec![0u32; f];
    for t in train.clone() {
        for (n, c) in counts.iter_mut().enumerate() {
            *c += u32::from(set.is_active(t, n));
        }
    }
    let prior: Vec<f32> = counts
        .iter()
        .map(|&c| c as f32 / train.len() as f32)
        .collect();
    let held_active: u64 = held.clone().map(|t| active_count(set, t)).sum::<u64>();
    let base_rate = held_active as f32 / (held.len() * f) as f32;
    let neuron_cost = (f * 3 * d) as f64;
    let cost_of = |r: usize, frac: f32| (r * (d + f)) as f64 + f64::from(frac) * neuron_cost;

    let batch = cfg.batch.min(train.len());
    let steps_per_epoch = train.len().div_ceil(batch);
    let total_work: f64 = ranks.iter().map(|&r| (r * cfg.epochs) as f64).sum();
    let mut done_work = 0f64;

    let mut tried: Vec<RankReport> = Vec::new();
    let mut skipped = Vec::new();
    let mut best: Option<(RankReport, Predictor)> = None;
    let mut stopped = Vec::new();
    let mut best_meeting_cost = f64::INFINITY;
    let mut diminishing = false;
    for &r in &ranks {
        if diminishing {
            stopped.push(r);
            done_work += (r * cfg.epochs) as f64;
            progress((done_work / total_work) as f32);
            continue;
        }
        // A predictor meeting the target predicts at least target · base_rate of the neurons.
        if cost_of(r, cfg.target_recall * base_rate) > best_meeting_cost {
            skipped.push(r);
            done_work += (r * cfg.epochs) as f64;
            progress((done_work / total_work) as f32);
            continue;
        }
        let mut tr = Trainer::new(set, r, batch, &prior, cfg.seed);
        let mut rng = SplitMix64::new(cfg.seed.wrapping_add(0x0bad_5eed));
        let mut order: Vec<usize> = train.clone().collect();
        let total_steps = (cfg.epochs * steps_per_epoch) as f32;
        for _ in 0..cfg.epochs {
            for i in (1..order.len()).rev() {
                // (A modulo, as the shuffles were first drawn: the trained predictors keep their bits.)
                order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
            }
            for idx in order.chunks(batch) {
                let lr = cfg.learning_rate * (1.0 - 0.9 * tr.step as f32 / total_steps);
                tr.step(idx, lr, cfg.positive_weight, cfg.weight_decay);
            }
            done_work += r as f64;
            progress((done_work / total_work) as f32);
        }
        let net = &tr.net;
        let mut p = Predictor::quantized(
            net.d,
            net.f,
            net.r,
            net.w1(&tr.params),
            net.b1(&tr.params),
            net.w2(&tr.params),
            net.b2(&tr.params),
        );
        drop(tr);

        // Threshold: the calibration recall target on the quantized logits.
        let mut cal_logits = Vec::with_capacity(calib.len() * f);
        p.logits_rows(&kernels, set.x, calib.clone(), |_, l| {
            cal_logits.extend_from_slice(l)
        });
        let want = (cfg.target_recall + cfg.recall_margin).min(1.0);
        let (threshold, calibration_recall) = calibrate(
            &cal_logits,
            |i| set.is_active(calib.start + i / f, i % f),
            want,
        );
        p.set_threshold(threshold);
        drop(cal_logits);

        // Held-out figures with the same path.
        let (mut tp, mut fp, mut fneg) = (0u64, 0u64, 0u64);
        let words = bitset_words(f);
        let mut pred = vec![0u64; words];
        p.logits_rows(&kernels, set.x, held.clone(), |t0, logits| {
            for (i, row) in logits.chunks_exact(f).enumerate() {
                set_bits(row, p.threshold(), &mut pred);
                let truth = &set.active[(t0 + i) * words..(t0 + i + 1) * words];
                for (wi, (&pw, &tw)) in pred.iter().zip(truth).enumerate() {
                    let tw = tw & word_mask(f, wi);
                    tp += u64::from((pw & tw).count_ones());
                    fp += u64::from((pw & !tw).count_ones());
                    fneg += u64::from((!pw & tw).count_ones());
                }
            }
        });
        let recall = if tp + fneg == 0 {
            1.0
        } else {
            tp as f32 / (tp + fneg) as f32
        };
        let precision = if tp + fp == 0 {
            1.0
        } else {
            tp as f32 / (tp + fp) as f32
        };
        let predicted_fraction = (tp + fp) as f32 / (held.len() * f) as f32;
        let report = RankReport {
            rank: r,
            recall,
            precision,
            predicted_fraction,
            cost: cost_of(r, predicted_fraction),
            calibration_recall,
            threshold: p.threshold(),
        };
        tried.push(report.clone());
        let meets = recall >= cfg.target_recall;
        if meets {
            // Doubling the rank did not pay for itself: stop searching upwards.
            diminishing = report.cost >= best_meeting_cost;
            best_meeting_cost = best_meeting_cost.min(report.cost);
        }
        let better = match &best {
            None => true,
            Some((b, _)) => {
                let b_meets = b.recall >= cfg.target_recall;
                match (meets, b_meets) {
                    (true, false) => true,
                    (false, true) => false,
                    (true, true) => report.cost < b.cost,
                    (false, false) => report.recall > b.recall,
                }
            }
        };
        if better {
            best = Some((report, p));
        }
    }
    progress(1.0);
    let (chosen, predictor) = best.expect("at least one rank is trained");
    Ok(TrainedPredictor {
        predictor,
        meets_target: chosen.recall >= cfg.target_recall,
        chosen,
        tried,
        skipped,
        stopped,
        base_rate,
        dense_cost: neuron_cost,
        train_tokens: train.len(),
        calibration_tokens: calib.len(),
        held_out_tokens: held.len(),
    })
}

/// Mask of the neurons `< n_ff` in bitset word `wi`.
fn word_mask(n_ff: usize, wi: usize) -> u64 {
    let valid = n_ff.saturating_sub(wi * 64).min(64);
    if valid == 64 {
        u64::MAX
    } else {
        (1u64 << valid) - 1
    }
}

fn active_count(set: &TrainingSet, t: usize) -> u64 {
    let words = bitset_words(set.n_ff);
    set.active[t * words..(t + 1) * words]
        .iter()
        .enumerate()
        .map(|(wi, &w)| u64::from((w & word_mask(set.n_ff, wi)).count_ones()))
        .sum()
}

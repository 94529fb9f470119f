//! `conductor profile`: a model's FFN activations over calibration text, into an activation
//! profile (thresholds per target sparsity, hot neurons, skew and reuse, predictors and their
//! operating points) beside the model; then the default operating point of sparse decode,
//! chosen by perplexity measured on held-out text (the cheapest within 3% of dense).

use super::{parse_share, ModelArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use conductor::perplexity::perplexity;
use conductor::profile::{choose, profile_model, ProfileOptions, Stage};
use conductor::runtime::convert::chosen_down_layout;
use conductor::runtime::model::FfnActivation;
use conductor::runtime::sparse::operating::{ChosenPoint, OperatingPoint, PointSource};
use conductor::runtime::sparse::profile::{interpolate, ModelProfile, PredictorPoint};
use conductor::runtime::store::{DownLayout, DEFAULT_BUNDLE_NEURONS};
use conductor::DEFAULT_SPARSITY;
use conductor_planner::predictor::PredictorConfig;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The default calibration text: the last fifth of `tests/data/ppl.txt` (Jane Austen,
/// *Persuasion*, vol. I, public domain), which the perplexity figures in docs/benchmarks.md
/// leave out (they score the first 80 chunks).
const CALIBRATION: &str = include_str!("data/calibration.txt");

/// The default held-out text the operating point is chosen on: the first 17 KB of
/// `tests/data/ppl.txt` (the start of *Persuasion*), far from the calibration text's last
/// fifth. The perplexity figures of docs/benchmarks.md score these chunks too.
const HELD_OUT: &str = include_str!("data/heldout.txt");

#[derive(Args)]
pub struct ProfileArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Calibration text (default: built in, English prose not used by the perplexity figures).
    #[arg(short = 'f', long = "file")]
    file: Option<PathBuf>,
    /// Tokens per evaluated chunk.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    ctx_size: usize,
    /// Profile at most this many tokens of the text (the predictors train on the first of
    /// them: as many as 128 MiB of FFN inputs hold, at least 512).
    #[arg(long = "tokens", default_value_t = 4096)]
    tokens: usize,
    /// The sparsity the predictors learn to predict (0.3 or 30%; default: the shipped
    /// default, 30%, for SwiGLU models, the natural zeros (0%) for ReLU models).
    #[arg(long = "predictor-sparsity", value_parser = parse_share)]
    predictor_sparsity: Option<f32>,
    /// Thresholds and frequencies only (no predictors; --sparsity predictor needs them).
    #[arg(long = "no-predictors")]
    no_predictors: bool,
    /// Predictor hidden sizes to try, ascending multiples of 32 (default 32,64,128,256): fewer
    /// and smaller train a 7B-wide model's predictors in minutes rather than an hour.
    #[arg(long = "predictor-ranks", value_delimiter = ',')]
    predictor_ranks: Vec<usize>,
    /// Where to write the profile (default: MODEL.profile beside the model).
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
    /// Held-out text the operating point is chosen on (default: built in, the start of the
    /// text the calibration passage ends; never the calibration text itself).
    #[arg(long = "held-out")]
    held_out: Option<PathBuf>,
    /// Tokens per held-out perplexity chunk.
    #[arg(long = "held-out-ctx", default_value_t = 256)]
    held_out_ctx: usize,
    /// Held-out chunks each operating point is scored on.
    #[arg(long = "held-out-chunks", default_value_t = 4)]
    held_out_chunks: usize,
    /// Perplexity a chosen operating point may add to dense, relative (3% or 0.03).
    #[arg(long = "tolerance", value_parser = parse_share, default_value = "0.03")]
    tolerance: f32,
    /// Statistics and predictors only: choose no operating point (`--sparsity default`
    /// under --memory then stays dense).
    #[arg(long = "no-choose")]
    no_choose: bool,
}

/// A progress bar redrawn in place on a terminal, a line per quarter in a log.
fn progress_bar(label: &'static str) -> impl Fn(Stage, f32) + Sync {
    let last = std::sync::Mutex::new((None::<Stage>, u32::MAX));
    let terminal = std::io::stderr().is_terminal();
    move |stage, done| {
        let step = if terminal { 1 } else { 25 };
        let pct = ((done * 100.0) as u32) / step * step;
        let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
        if last.0 == Some(stage) && last.1 == pct {
            return;
        }
        let name = match stage {
            Stage::Recording => "recording activations",
            Stage::Layers => "thresholds and predictors",
        };
        if terminal && last.0.is_some_and(|s| s != stage) {
            eprintln!();
        }
        *last = (Some(stage), pct);
        let filled = (pct / 4) as usize;
        let (start, end) = if terminal { ("\r", "") } else { ("", "\n") };
        eprint!(
            "{start}{label}: [{}{}] {pct:3}% {name}{end}",
            "#".repeat(filled),
            " ".repeat(25 - filled)
        );
        let _ = std::io::stderr().flush();
    }
}

pub fn run(args: ProfileArgs) -> Result<()> {
    let (text, text_name) = match &args.file {
        Some(path) => (
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?,
            path.display().to_string(),
        ),
        None => (
            CALIBRATION.to_string(),
            "built-in: Persuasion vol. I, last fifth".to_string(),
        ),
    };
    if args.tokens == 0 {
        bail!("--tokens must be at least 1");
    }
    let mut model_args = args.model.clone();
    // Activations are recorded through the inline driver's probe, densely.
    model_args.engine.driver = super::DriverArg::Inline;
    model_args.engine.sparsity = super::SparsityArg::DENSE;
    model_args.engine.context = Some(args.ctx_size);
    model_args.engine.prompts_only = true;
    let threads = model_args.threads();
    let mut engine = model_args.load(threads)?;
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| ModelProfile::default_path(engine.model_path()));
    if output == engine.model_path() {
        bail!(
            "the profile would overwrite the model file {}",
            output.display()
        );
    }
    if let Some(r) = args
        .predictor_ranks
        .iter()
        .find(|&&r| r == 0 || r % 32 != 0)
    {
        bail!("--predictor-ranks: {r} is not a positive multiple of 32");
    }
    let relu = engine.model().config().activation == FfnActivation::Relu;
    let sparsity = args
        .predictor_sparsity
        .unwrap_or(if relu { 0.0 } else { DEFAULT_SPARSITY });
    let options = ProfileOptions {
        ctx: args.ctx_size,
        max_tokens: args.tokens,
        reference_sparsity: sparsity,
        predictors: (!args.no_predictors).then(|| {
            let mut config = PredictorConfig::default();
            if !args.predictor_ranks.is_empty() {
                config.ranks = args.predictor_ranks.clone();
            }
            (sparsity, config)
        }),
        threads,
    };
    if args.held_out_ctx < 4 || args.held_out_chunks == 0 {
        bail!("--held-out-ctx must be at least 4 and --held-out-chunks at least 1");
    }
    let held_out = match &args.held_out {
        Some(path) => (
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?,
            path.display().to_string(),
        ),
        None => (
            HELD_OUT.to_string(),
            "built-in: Persuasion, the first 17 KB".to_string(),
        ),
    };
    let random_weights = engine
        .model()
        .config()
        .name
        .as_deref()
        .is_some_and(|n| n.starts_with("synthetic"));
    let started = Instant::now();
    let bar = progress_bar("profile");
    let mut profile = profile_model(&mut engine, &text, &text_name, &options, &bar)
        .context("profiling the model")?;
    if std::io::stderr().is_terminal() {
        eprintln!();
    }
    profile
        .save(&output)
        .with_context(|| format!("cannot write {}", output.display()))?;
    let profiled = started.elapsed();
    let held_out_tokens = engine.tokenizer().encode(&held_out.0, true, false);
    // Under --memory, `--sparsity default` runs the chosen point on the store `convert`
    // writes; where that store holds block columns, its points are scored with their numerics
    // (and without the transposed copy of the down projections, which the store never has).
    let block_columns = engine.model().store().is_none()
        && chosen_down_layout(engine.model(), DEFAULT_BUNDLE_NEURONS) == DownLayout::BlockColumns;
    // The evaluating engines load the model again: this one goes first.
    drop(engine);
    conductor::release_freed_memory();
    if random_weights {
        // No perplexity to choose by: ReLU models get ProSparse's published predictor point.
        profile.operating_point = if relu {
            choose::published_relu_point(&profile)
        } else {
            None
        };
        eprintln!(
            "profile: random weights (a synthetic model): no perplexity to choose an operating point by{}",
            if profile.operating_point.is_some() {
                "; recording ProSparse's published predictor point"
            } else {
                ""
            }
        );
    } else if !args.no_choose {
        let need = args.held_out_ctx * args.held_out_chunks;
        if held_out_tokens.len() < need {
            bail!(
                "the held-out text {} has {} tokens; {} chunks of {} need {need} (give a longer --held-out or fewer --held-out-chunks)",
                held_out.1,
                held_out_tokens.len(),
                args.held_out_chunks,
                args.held_out_ctx
            );
        }
        let chosen = choose_point(
            &args,
            &output,
            &profile,
            &held_out_tokens,
            &held_out.1,
            block_columns,
        )?;
        profile.operating_point = Some(chosen);
    }
    if profile.operating_point.is_some() {
        profile
            .save(&output)
            .with_context(|| format!("cannot write {}", output.display()))?;
    }
    print_summary(&profile);
    eprintln!(
        "profile: {} tokens in {:.1} s, operating point in {:.1} s -> {}",
        profile.tokens,
        profiled.as_secs_f64(),
        (started.elapsed() - profiled).as_secs_f64(),
        output.display()
    );
    Ok(())
}

/// Measures the candidates' perplexity on `tokens` of held-out text (an engine per point,
/// sparse decode on every token, as `conductor perplexity` measures it) and chooses.
/// `block_columns`: sparse decode reads the down projections' block columns, as the model's
/// block-column store does under a budget.
fn choose_point(
    args: &ProfileArgs,
    profile_path: &Path,
    profile: &ModelProfile,
    tokens: &[u32],
    text: &str,
    block_columns: bool,
) -> Result<ChosenPoint> {
    let tolerance = f64::from(args.tolerance);
    let mut scored = 0u64;
    let search = choose::search(
        profile,
        tolerance,
        |point: &OperatingPoint| -> Result<f64> {
            let mut model_args = args.model.clone();
            model_args.engine.driver = super::DriverArg::Inline;
            model_args.engine.context = Some(args.held_out_ctx);
            model_args.engine.sparse_all_tokens = true;
            // Perplexity evaluates prompts: no copy of the down projections for decode.
            model_args.engine.prompts_only = true;
            model_args.engine.sparse_keep_down_layout = block_columns;
            model_args.engine.sparse_profile = Some(profile_path.to_path_buf());
            model_args.engine.sparsity = super::SparsityArg(Some(point.mode));
            model_args.engine.target_sparsity = Some(point.sparsity);
            model_args.engine.predictor_recall = point.predictor_recall;
            let at = Instant::now();
            let mut engine = model_args.load(model_args.threads())?;
            let result = perplexity(
                &mut engine,
                tokens,
                args.held_out_ctx,
                Some(args.held_out_chunks),
                &mut |_, _| {},
            )?;
            scored = result.scored_tokens as u64;
            eprintln!(
                "profile: held-out perplexity {:.4} at {} ({:.1} s)",
                result.perplexity,
                point.describe(),
                at.elapsed().as_secs_f64()
            );
            Ok(result.perplexity)
        },
    )?;
    Ok(choose::chosen(profile, search, tolerance, text, scored))
}

/// Per layer: thresholds and kept output mass at 30/50/70%, natural zeros, skew, the
/// predictor's held-out figures; then active sets token by token and the predictors' points
/// (means over layers), and the operating point.
fn print_summary(p: &ModelProfile) {
    let at = |table: &[f32], s: f32| interpolate(&p.grid, table, s);
    println!(
        "layer | threshold 30% 50% 70% | kept mass 30% 50% 70% | zeros | 80% of mass | predictor recall precision predicted"
    );
    for (l, layer) in p.layers.iter().enumerate() {
        let pred = p.predictors.as_ref().map_or(String::from("-"), |set| {
            let (r, pr, f) = set.held_out[l];
            format!(
                "{r:.4} {pr:.3} {:.1}% (rank {})",
                f * 100.0,
                set.layers[l].rank()
            )
        });
        println!(
            "{l:5} | {:.4} {:.4} {:.4} | {:.3} {:.3} {:.3} | {:.1}% | {:.1}% of neurons | {pred}",
            at(&layer.thresholds, 0.3),
            at(&layer.thresholds, 0.5),
            at(&layer.thresholds, 0.7),
            at(&layer.kept_mass, 0.3),
            at(&layer.kept_mass, 0.5),
            at(&layer.kept_mass, 0.7),
            layer.zero_fraction * 100.0,
            layer.mass_hot_share * 100.0
        );
    }
    if let Some(set) = &p.predictors {
        let n = set.held_out.len().max(1) as f32;
        let recall = set
            .held_out
            .iter()
            .map(|f| f.0)
            .fold(f32::INFINITY, f32::min);
        let mean_pred = set.held_out.iter().map(|f| f.2).sum::<f32>() / n;
        println!(
            "predictors at {:.0}% sparsity: lowest held-out recall {recall:.4}, mean share of neurons predicted {:.1}%",
            set.sparsity * 100.0,
            mean_pred * 100.0
        );
    }
    print_levels(p);
    if let Some(chosen) = &p.operating_point {
        print_operating_point(chosen);
    }
}

/// Mean over layers of `f(layer)`.
fn mean_over_layers(p: &ModelProfile, f: impl Fn(usize) -> Option<f32>) -> Option<f32> {
    let values: Vec<f32> = (0..p.layers.len()).filter_map(f).collect();
    (!values.is_empty()).then(|| values.iter().sum::<f32>() / values.len() as f32)
}

/// Active sets token by token at each level, and the predictors' points at a few recalls.
fn print_levels(p: &ModelProfile) {
    let Some(first) = p.layers.first() else {
        return;
    };
    println!(
        "sparsity | active | 80% of activations in | reuse of active neurons within k = 1 2 3 4 5 tokens (means over layers)"
    );
    for (i, level) in first.levels.iter().enumerate() {
        let mean = |f: &dyn Fn(&conductor::runtime::sparse::profile::LevelProfile) -> f32| {
            mean_over_layers(p, |l| p.layers[l].levels.get(i).map(f)).unwrap_or(0.0)
        };
        let reuse: Vec<String> = (0..level.reuse.len())
            .map(|k| format!("{:.3}", mean(&|lv| lv.reuse[k])))
            .collect();
        println!(
            "{:7.0}% | {:5.1}% | {:5.1}% of neurons | {}",
            level.target * 100.0,
            mean(&|lv| lv.active_share) * 100.0,
            mean(&|lv| lv.hot_share) * 100.0,
            reuse.join(" ")
        );
    }
    let Some(set) = &p.predictors else {
        return;
    };
    println!("predictor points (held out, means over layers): sparsity recall-target | recall precision predicted");
    for point in set.points.first().into_iter().flatten() {
        if ![0.9, 0.92, 0.95, 0.99]
            .iter()
            .any(|r| (r - point.recall_target).abs() < 1e-4)
        {
            continue;
        }
        let mean = |f: &dyn Fn(&PredictorPoint) -> f32| {
            mean_over_layers(p, |l| {
                set.points[l]
                    .iter()
                    .find(|q| {
                        q.sparsity == point.sparsity && q.recall_target == point.recall_target
                    })
                    .map(f)
            })
            .unwrap_or(0.0)
        };
        println!(
            "{:7.0}% {:.2} | {:.3} {:.3} {:5.1}%",
            point.sparsity * 100.0,
            point.recall_target,
            mean(&|q| q.recall),
            mean(&|q| q.precision),
            mean(&|q| q.predicted) * 100.0
        );
    }
}

fn print_operating_point(chosen: &ChosenPoint) {
    if let PointSource::Measured {
        dense_perplexity,
        points,
        text,
        ..
    } = &chosen.source
    {
        println!("held-out perplexity ({text}): dense {dense_perplexity:.4}");
        for m in points {
            println!(
                "  {:32} {:.4} ({:+.2}%), {:.0}% of dense FFN weights",
                m.point.describe(),
                m.perplexity,
                (m.perplexity / dense_perplexity - 1.0) * 100.0,
                m.cost * 100.0
            );
        }
    }
    println!("operating point: {}", chosen.describe());
}

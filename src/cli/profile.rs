//! `conductor profile`: a model's FFN activations over calibration text, into an activation
//! profile (thresholds per target sparsity, hot neurons, predictors) beside the model.

use super::{parse_share, ModelArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use conductor::profile::{profile_model, ProfileOptions, Stage};
use conductor::runtime::model::FfnActivation;
use conductor::runtime::sparse::profile::{interpolate, ModelProfile};
use conductor::DEFAULT_SPARSITY;
use conductor_planner::predictor::PredictorConfig;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

/// The default calibration text: the last fifth of `tests/data/ppl.txt` (Jane Austen,
/// *Persuasion*, vol. I, public domain), which the perplexity figures in docs/benchmarks.md
/// leave out (they score the first 80 chunks).
const CALIBRATION: &str = include_str!("data/calibration.txt");

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
    model_args.engine.sparsity = super::SparsityArg::Dense;
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
    let relu = engine.model().config.activation == FfnActivation::Relu;
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
    let started = Instant::now();
    let bar = progress_bar("profile");
    let profile = profile_model(&mut engine, &text, &text_name, &options, &bar)
        .context("profiling the model")?;
    if std::io::stderr().is_terminal() {
        eprintln!();
    }
    profile
        .save(&output)
        .with_context(|| format!("cannot write {}", output.display()))?;
    print_summary(&profile);
    eprintln!(
        "profile: {} tokens in {:.1} s -> {}",
        profile.tokens,
        started.elapsed().as_secs_f64(),
        output.display()
    );
    Ok(())
}

/// Per layer: thresholds and kept output mass at 30/50/70%, natural zeros, the predictor's
/// held-out figures.
fn print_summary(p: &ModelProfile) {
    let at = |table: &[f32], s: f32| interpolate(&p.grid, table, s);
    println!(
        "layer | threshold 30% 50% 70% | kept mass 30% 50% 70% | zeros | predictor recall precision predicted"
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
            "{l:5} | {:.4} {:.4} {:.4} | {:.3} {:.3} {:.3} | {:.1}% | {pred}",
            at(&layer.thresholds, 0.3),
            at(&layer.thresholds, 0.5),
            at(&layer.thresholds, 0.7),
            at(&layer.kept_mass, 0.3),
            at(&layer.kept_mass, 0.5),
            at(&layer.kept_mass, 0.7),
            layer.zero_fraction * 100.0
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
}

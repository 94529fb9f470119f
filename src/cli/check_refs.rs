//! `conductor check-refs`: agreement with llama.cpp's greedy reference outputs.
//!
//! For each reference prompt: feed `prompt_ids` exactly, then teacher-force llama.cpp's greedy
//! continuation and compare argmaxes position by position. Positions where llama.cpp's own top-1
//! margin is below 0.5 are reported separately: greedy text is fragile there, even between
//! llama.cpp configurations. Free decoding (greedy, through end-of-generation tokens) gives the same
//! tokens up to the first miss, so the first miss is where it diverges: continuations identical
//! to llama.cpp's are counted from that. And the first position's top-5 logits are compared.

use super::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use conductor::runtime::sample::argmax;
use serde::Deserialize;
use std::path::PathBuf;

/// Positions where llama.cpp's top-1 logit leads by at least this much count as confident.
const CONFIDENT_MARGIN: f32 = 0.5;

#[derive(Args)]
pub struct CheckRefsArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// JSON-lines reference file (`prompt_ids`, `greedy_ids`, `greedy_top1_margin`, `top5_first`).
    #[arg(long = "refs")]
    refs: PathBuf,
}

#[derive(Deserialize)]
struct Reference {
    id: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    greedy_top1_margin: Vec<f32>,
    top5_first: Vec<(u32, f32)>,
}

#[derive(Default)]
struct Tally {
    confident_agree: usize,
    confident: usize,
    agree: usize,
    positions: usize,
    identical: usize,
    prompts: usize,
    max_dlogit: f32,
}

pub fn run(args: CheckRefsArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.refs)
        .with_context(|| format!("cannot read {}", args.refs.display()))?;
    let mut refs = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let r: Reference = serde_json::from_str(line)
            .with_context(|| format!("{} line {}", args.refs.display(), i + 1))?;
        if r.prompt_ids.is_empty()
            || r.greedy_ids.is_empty()
            || r.greedy_ids.len() != r.greedy_top1_margin.len()
        {
            bail!(
                "{} line {}: needs prompt ids, greedy ids and one margin per greedy token",
                args.refs.display(),
                i + 1
            );
        }
        refs.push(r);
    }
    if refs.is_empty() {
        bail!("{} holds no references", args.refs.display());
    }
    let mut engine = args.model.load(args.model.threads())?;
    let n_vocab = engine.model().config().n_vocab;
    println!(
        "{:<14} {:>6} {:>11} {:>9} {:>11} {:>14}",
        "id", "prompt", "confident", "all", "free-run", "top5 |dlogit|"
    );
    let mut tally = Tally::default();
    for r in &refs {
        if let Some(bad) = r
            .prompt_ids
            .iter()
            .chain(&r.greedy_ids)
            .chain(r.top5_first.iter().map(|(id, _)| id))
            .find(|&&t| t >= n_vocab)
        {
            bail!(
                "{}: token id {bad} is outside the model's vocabulary ({n_vocab})",
                r.id
            );
        }
        // Teacher forcing: position k predicts greedy_ids[k] after seeing greedy_ids[..k]. One
        // evaluation of the prompt and the continuation gives every position's logits, the
        // bits of decoding them one by one (batch-invariant numerics, tests/batch_invariance.rs).
        let n = r.greedy_ids.len();
        let p = r.prompt_ids.len();
        let mut tokens = r.prompt_ids.clone();
        tokens.extend(&r.greedy_ids[..n.saturating_sub(1)]);
        let mut session = engine.session(Some(tokens.len() + 1))?;
        let mut first = Vec::new();
        let mut predicted = Vec::with_capacity(n);
        engine.eval(&mut session, &tokens, p - 1, &mut |at, rows| {
            for (i, row) in rows.chunks_exact(n_vocab as usize).enumerate() {
                if at + i == p - 1 {
                    first = row.to_vec();
                }
                predicted.push(argmax(row));
            }
        })?;
        let dlogit = r
            .top5_first
            .iter()
            .map(|&(id, l)| (first[id as usize] - l).abs())
            .fold(0.0f32, f32::max);
        let (mut confident_agree, mut confident, mut agree) = (0, 0, 0);
        for (k, &token) in predicted.iter().enumerate() {
            let hit = token == r.greedy_ids[k];
            agree += hit as usize;
            if r.greedy_top1_margin[k] >= CONFIDENT_MARGIN {
                confident += 1;
                confident_agree += hit as usize;
            }
        }
        // Free running from the same prompt follows the reference up to its first miss, with
        // the same tokens and so the same logits as above: it diverges there.
        let diverged_at = predicted
            .iter()
            .zip(&r.greedy_ids)
            .position(|(got, want)| got != want);
        let free = match diverged_at {
            None => "identical".to_string(),
            Some(k) => format!("differs@{k}"),
        };
        println!(
            "{:<14} {:>6} {:>11} {:>9} {:>11} {:>14.4}",
            r.id,
            r.prompt_ids.len(),
            format!("{confident_agree}/{confident}"),
            format!("{agree}/{n}"),
            free,
            dlogit
        );
        tally.confident_agree += confident_agree;
        tally.confident += confident;
        tally.agree += agree;
        tally.positions += n;
        tally.identical += diverged_at.is_none() as usize;
        tally.prompts += 1;
        tally.max_dlogit = tally.max_dlogit.max(dlogit);
    }
    println!(
        "refs: confident {}/{}, all {}/{}, free-running identical {}/{}, first-token top-5 max |dlogit| {:.4}",
        tally.confident_agree,
        tally.confident,
        tally.agree,
        tally.positions,
        tally.identical,
        tally.prompts,
        tally.max_dlogit
    );
    Ok(())
}

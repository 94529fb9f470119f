//! `conductor check-refs`: agreement with llama.cpp's greedy reference outputs.
//!
//! For each reference prompt: feed `prompt_ids` exactly, then teacher-force llama.cpp's greedy
//! continuation and compare argmaxes position by position. Positions where llama.cpp's own top-1
//! margin is below 0.5 are reported separately: greedy text is fragile there, even between
//! llama.cpp configurations. Then decode freely (greedy, through end-of-generation tokens) and
//! count identical continuations; and compare the first position's top-5 logits.

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
        if r.prompt_ids.is_empty() || r.greedy_ids.len() != r.greedy_top1_margin.len() {
            bail!(
                "{} line {}: needs prompt ids and one margin per greedy token",
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
    let n_vocab = engine.model().config.n_vocab;
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
            .find(|&&t| t >= n_vocab)
        {
            bail!(
                "{}: token id {bad} is outside the model's vocabulary ({n_vocab})",
                r.id
            );
        }
        let n = r.greedy_ids.len();
        let mut session = engine.session(Some(r.prompt_ids.len() + n + 1))?;
        let first = engine.eval_last(&mut session, &r.prompt_ids)?.to_vec();
        let dlogit = r
            .top5_first
            .iter()
            .map(|&(id, l)| (first[id as usize] - l).abs())
            .fold(0.0f32, f32::max);

        // Teacher forcing: position k predicts greedy_ids[k] after seeing greedy_ids[..k].
        let (mut confident_agree, mut confident, mut agree) = (0, 0, 0);
        let mut logits = first.clone();
        for k in 0..n {
            let hit = argmax(&logits) == r.greedy_ids[k];
            agree += hit as usize;
            if r.greedy_top1_margin[k] >= CONFIDENT_MARGIN {
                confident += 1;
                confident_agree += hit as usize;
            }
            if k + 1 < n {
                logits = engine.eval_last(&mut session, &[r.greedy_ids[k]])?.to_vec();
            }
        }

        // Free running from the same prompt.
        session.truncate(r.prompt_ids.len());
        let mut logits = first;
        let mut diverged_at = None;
        for k in 0..n {
            let token = argmax(&logits);
            if token != r.greedy_ids[k] && diverged_at.is_none() {
                diverged_at = Some(k);
            }
            if k + 1 < n {
                logits = engine.eval_last(&mut session, &[token])?.to_vec();
            }
        }
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

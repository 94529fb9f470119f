//! `--draft`, `--draft-max`, `--draft-min`: speculative decoding's flags, as in llama.cpp
//! (`run`, `bench`, `serve`).

use super::{ModelArgs, SparsityArg};
use anyhow::{bail, Result};
use clap::Args;
use conductor::{DraftLimits, Engine, ModelDrafter, NgramDrafter, Speculation};
use std::path::PathBuf;

#[derive(Args, Clone, Debug, Default)]
pub struct DraftArgs {
    /// Speculative decoding: `ngram` (continuations looked up in the prompt and the text so
    /// far: no weights read, no memory taken) or a draft model with the target's vocabulary (a
    /// file or a known name, e.g. qwen2.5-coder-0.5b for qwen2.5-coder-1.5b). The target
    /// verifies the drafted tokens in one step; the output is the target's own. Needs dense
    /// decode (the default unless --sparsity says otherwise).
    #[arg(long = "draft", value_name = "ngram|MODEL")]
    pub draft: Option<String>,
    /// The most tokens drafted for one step.
    #[arg(long = "draft-max", default_value_t = DraftLimits::default().max as i64, allow_negative_numbers = true)]
    pub draft_max: i64,
    /// Drafts shorter than this are not verified.
    #[arg(long = "draft-min", default_value_t = DraftLimits::default().min as i64, allow_negative_numbers = true)]
    pub draft_min: i64,
}

impl DraftArgs {
    /// Checks the flags before anything loads; dense decode unless `--sparsity` was given.
    pub fn prepare(&self, model: &mut ModelArgs) -> Result<Option<DraftLimits>> {
        if self.draft.is_none() {
            return Ok(None);
        }
        let (max, min) = (self.draft_max, self.draft_min);
        if max < 1 {
            bail!("--draft-max must be at least 1 (the most tokens drafted a step), not {max}");
        }
        if min < 0 {
            bail!("--draft-min must be 0 or more, not {min}");
        }
        if self.draft.as_deref() == Some("self") {
            bail!("--draft self is not built yet: use --draft ngram, or a draft model");
        }
        if model.engine.sparsity == SparsityArg::Default {
            model.engine.sparsity = SparsityArg::Dense;
        }
        model.engine.step_logits = max as usize + 1;
        Ok(Some(DraftLimits::new(max as usize, min as usize)?))
    }

    /// The drafter for `target` (loaded from `model`), or `None` without `--draft`.
    pub fn speculation(
        &self,
        model: &ModelArgs,
        target: &Engine,
        n_ctx: usize,
    ) -> Result<Option<Speculation>> {
        let mut model = model.clone();
        let Some(limits) = self.prepare(&mut model)? else {
            return Ok(None);
        };
        let drafter: Box<dyn conductor::Drafter> = match self.draft.as_deref() {
            Some("ngram") => Box::new(NgramDrafter::default()),
            Some(path) => {
                if model.engine.memory.is_some() {
                    bail!(
                        "a draft model under --memory is not supported yet (it would take the \
                         budget's memory): use --draft ngram"
                    );
                }
                let mut draft = model.clone();
                draft.model = Some(PathBuf::from(path));
                // The target's plan names the target; the draft's steps are one token.
                draft.engine.plan = None;
                draft.engine.step_logits = 1;
                let engine = draft.load(model.threads())?;
                Box::new(ModelDrafter::new(target, engine, n_ctx)?)
            }
            None => return Ok(None),
        };
        Ok(Some(Speculation::new(drafter, limits)))
    }
}

//! `--draft`, `--draft-max`, `--draft-min`: speculative decoding's flags, as in llama.cpp
//! (`run`, `bench`, `serve`).

use super::{ModelArgs, SparsityArg};
use anyhow::{bail, Context, Result};
use clap::Args;
use conductor::runtime::cache::RUNTIME_BASE;
use conductor::runtime::gguf::GgufFile;
use conductor::runtime::model::{kv_bytes_per_position, ModelConfig};
use conductor::{fetch, DraftLimits, Engine, ModelDrafter, NgramDrafter, Speculation};
use std::path::{Path, PathBuf};

#[derive(Args, Clone, Debug, Default)]
pub struct DraftArgs {
    /// Speculative decoding: `ngram` (continuations looked up in the prompt and the text so
    /// far: no weights read, no memory taken), `self` (under --memory: the target computed
    /// from what the budget keeps resident, attention, the cache's hot segment and the
    /// resident part of the head, reading nothing from storage), or a draft model with the
    /// target's vocabulary (a file or a known name, e.g. qwen2.5-coder-0.5b for
    /// qwen2.5-coder-1.5b). The target verifies the drafted tokens in one step; the output is
    /// the target's own. Needs dense decode (the default unless --sparsity says otherwise).
    #[arg(long = "draft", value_name = "ngram|self|MODEL")]
    pub draft: Option<String>,
    /// The most tokens drafted for one step.
    #[arg(long = "draft-max", default_value_t = DraftLimits::default().max as i64, allow_negative_numbers = true)]
    pub draft_max: i64,
    /// Drafts shorter than this are not verified.
    #[arg(long = "draft-min", default_value_t = DraftLimits::default().min as i64, allow_negative_numbers = true)]
    pub draft_min: i64,
    /// A draft model's head computes the logits of the first N tokens only (a byte-pair
    /// vocabulary numbers its most frequent tokens first), a large share of a small model's
    /// bytes saved on every drafted token; what it leaves out is never drafted, the output is
    /// the target's all the same. 0: the whole vocabulary.
    #[arg(long = "draft-vocab", value_name = "N", default_value_t = DEFAULT_DRAFT_VOCAB)]
    pub draft_vocab: u32,
}

/// `--draft-vocab`'s default: measured on Qwen2.5-Coder-0.5B drafting for the 1.5B
/// (`docs/benchmarks.md`).
pub const DEFAULT_DRAFT_VOCAB: u32 = 32768;

/// What [`DraftArgs::prepare`] resolved, for [`Draft::speculation`]: the limits and the
/// drafter.
#[derive(Clone, Debug)]
pub struct Draft {
    limits: DraftLimits,
    source: DraftSource,
    /// `--draft-vocab` (0: the whole vocabulary).
    vocab: u32,
}

/// Who drafts.
#[derive(Clone, Debug)]
enum DraftSource {
    Ngram,
    /// The target, from what its budget keeps resident.
    Resident,
    Model(PathBuf),
}

impl DraftArgs {
    /// Checks the flags and finds the draft model (fetching a known name) before anything
    /// loads; sets the target's engine up for drafts (dense decode unless `--sparsity` was
    /// given, logits for a whole draft, the draft model's memory out of a budget).
    pub fn prepare(&self, model: &mut ModelArgs) -> Result<Option<Draft>> {
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
        let source = self.source()?;
        if matches!(source, DraftSource::Resident) && model.engine.memory.is_none() {
            bail!(conductor::Error::DraftSelfInMemory);
        }
        if model.engine.sparsity == SparsityArg::DEFAULT {
            model.engine.sparsity = SparsityArg::DENSE;
        }
        model.engine.step_logits = max as usize + 1;
        let limits = DraftLimits::new(max as usize, min as usize)?;
        if let (DraftSource::Model(path), Some(_)) = (&source, model.engine.memory) {
            // The draft model is held in memory beside the target: out of the budget.
            let n_ctx = model.engine.context.unwrap_or(conductor::BUDGET_CONTEXT);
            let bytes = draft_footprint(path, n_ctx)?;
            model.engine.reserve = Some((bytes, format!("the draft model {}", path.display())));
        }
        Ok(Some(Draft {
            limits,
            source,
            vocab: self.draft_vocab,
        }))
    }

    /// Who drafts: a draft model's file is fetched if it is a known name.
    fn source(&self) -> Result<DraftSource> {
        match self.draft.as_deref() {
            None | Some("ngram") => Ok(DraftSource::Ngram),
            Some("self") => Ok(DraftSource::Resident),
            Some(name) => {
                let path =
                    fetch::resolve_model(Some(Path::new(name)), &mut |line| eprintln!("{line}"))
                        .with_context(|| format!("the draft model {name}"))?;
                Ok(DraftSource::Model(path))
            }
        }
    }
}

impl Draft {
    /// The drafter and its limits for `target`, whose engine was loaded from `model` (the
    /// arguments [`DraftArgs::prepare`] set up): a draft model loads here, in memory, with the
    /// target's threads, for sessions of `n_ctx` tokens.
    pub fn speculation(
        &self,
        model: &ModelArgs,
        target: &Engine,
        n_ctx: usize,
    ) -> Result<Speculation> {
        let drafter: Box<dyn conductor::Drafter> = match &self.source {
            DraftSource::Ngram => Box::new(NgramDrafter::default()),
            DraftSource::Resident => return Ok(Speculation::resident(self.limits)),
            DraftSource::Model(path) => {
                let mut draft = model.clone();
                draft.model = Some(path.clone());
                // The target's plan names the target; the draft's steps are one token, in
                // memory (under --memory the target's budget held the draft's share).
                draft.engine.plan = None;
                draft.engine.step_logits = 1;
                draft.engine.memory = None;
                draft.engine.reserve = None;
                draft.engine.sequences = None;
                draft.engine.output_vocab = draft_vocab(path, self.vocab)?;
                let engine = draft.load(model.threads())?;
                Box::new(ModelDrafter::new(target, engine, n_ctx)?)
            }
        };
        Ok(Speculation::new(drafter, self.limits))
    }
}

/// The draft model's head: the first `asked` tokens, `None` for the whole vocabulary (0, or
/// at least as many as it has).
fn draft_vocab(path: &Path, asked: u32) -> Result<Option<u32>> {
    if asked == 0 {
        return Ok(None);
    }
    let n_vocab = draft_config(path)?.n_vocab;
    Ok((asked < n_vocab).then_some(asked))
}

/// The draft model's header.
fn draft_config(path: &Path) -> Result<ModelConfig> {
    let read = || format!("reading the draft model {}", path.display());
    let file = GgufFile::open(path).with_context(read)?;
    ModelConfig::from_gguf(&file).with_context(read)
}

/// What a draft model takes in memory beside the target: its weights (read whole), the KV
/// cache of a session of `n_ctx` tokens, and the runtime's base.
fn draft_footprint(path: &Path, n_ctx: usize) -> Result<u64> {
    let c = draft_config(path)?;
    let kv = kv_bytes_per_position(
        c.n_layer as usize,
        c.n_head_kv as usize,
        c.head_dim as usize,
    )
    .and_then(|p| p.checked_mul(n_ctx as u64))
    .context("the draft model's KV cache size overflows")?;
    let weights = std::fs::metadata(path)
        .with_context(|| format!("reading the draft model {}", path.display()))?
        .len();
    Ok(weights + kv + RUNTIME_BASE)
}

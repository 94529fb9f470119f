//! The embedding API: load a model once, then evaluate and generate in sessions.

use crate::fetch;
use conductor_actors::{PoolConfig, WorkerPool};
use conductor_runtime::exec::{InlineDriver, Session, StepError};
use conductor_runtime::model::{Model, ModelError};
use conductor_runtime::plan::ExecutionPlan;
use conductor_runtime::quant::Kernels;
use conductor_runtime::sample::{Sampler, SamplingError, SamplingParams};
use conductor_runtime::schedule::ScheduleError;
use conductor_runtime::tokenizer::{StreamDecoder, Tokenizer, TokenizerError};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Anything that can go wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Fetch(#[from] fetch::FetchError),
    /// The source error follows in the chain (`{:#}` prints "path: why").
    #[error("{}", path.display())]
    Load { path: PathBuf, source: ModelError },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Step(#[from] StepError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error("cannot start worker threads: {0}")]
    Threads(std::io::Error),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("nothing to generate: the number of tokens to predict must be at least 1")]
    NothingToGenerate,
}

/// Builds an [`Engine`].
pub struct EngineBuilder {
    model: Option<PathBuf>,
    threads: usize,
    plan: ExecutionPlan,
    kernels: Kernels,
    say: Box<dyn FnMut(&str)>,
}

impl EngineBuilder {
    /// The GGUF file to load; without it, the default model (fetched on first use).
    pub fn model(mut self, path: impl Into<PathBuf>) -> Self {
        self.model = Some(path.into());
        self
    }

    /// Compute threads (the calling thread counts as one).
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    pub fn plan(mut self, plan: ExecutionPlan) -> Self {
        self.plan = plan;
        self
    }

    /// Kernels to use (default: the best this CPU supports).
    pub fn kernels(mut self, kernels: Kernels) -> Self {
        self.kernels = kernels;
        self
    }

    /// Where progress lines go (default: standard error).
    pub fn on_progress(mut self, say: impl FnMut(&str) + 'static) -> Self {
        self.say = Box::new(say);
        self
    }

    pub fn build(mut self) -> Result<Engine, Error> {
        let started = Instant::now();
        let path = match self.model.take() {
            Some(p) => p,
            None => fetch::ensure_default_model(&mut *self.say)?,
        };
        let load = |source| Error::Load {
            path: path.clone(),
            source,
        };
        let model = Arc::new(Model::load(&path).map_err(load)?);
        let tokenizer = Tokenizer::from_gguf(model.file())?;
        let pool = WorkerPool::new(PoolConfig::new(self.threads)).map_err(Error::Threads)?;
        let driver = InlineDriver::new(Arc::clone(&model), &self.plan, self.kernels, pool)?;
        Ok(Engine {
            model,
            tokenizer,
            driver,
            path,
            load_time: started.elapsed(),
        })
    }
}

/// Generation settings.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Tokens to generate at most (≥ 1).
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    EndOfGeneration,
    /// `max_tokens` were generated.
    Length,
    /// The callback asked to stop.
    Cancelled,
}

/// What a generation cost, in the terms llama.cpp reports.
#[derive(Clone, Debug)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub prompt_time: Duration,
    /// Single-token evaluations after the prompt.
    pub decode_evals: usize,
    pub decode_time: Duration,
    pub generated: Vec<u32>,
    /// From the call to the first generated token.
    pub time_to_first_token: Duration,
    pub stop: StopReason,
}

/// A loaded model, its tokenizer and the driver that runs it.
pub struct Engine {
    model: Arc<Model>,
    tokenizer: Tokenizer,
    driver: InlineDriver<WorkerPool>,
    path: PathBuf,
    load_time: Duration,
}

impl Engine {
    pub fn builder() -> EngineBuilder {
        EngineBuilder {
            model: None,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            plan: ExecutionPlan::default(),
            kernels: Kernels::best(),
            say: Box::new(|line| eprintln!("{line}")),
        }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn model_path(&self) -> &std::path::Path {
        &self.path
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn threads(&self) -> usize {
        self.driver.runner().threads()
    }

    /// Time `build` took (fetch excluded only when the model was already cached).
    pub fn load_time(&self) -> Duration {
        self.load_time
    }

    /// A new session with room for `n_ctx` tokens (default: the model's training context).
    pub fn session(&self, n_ctx: Option<usize>) -> Session {
        let n_ctx = n_ctx.unwrap_or(self.model.config.n_ctx_train as usize);
        Session::new(&self.model, n_ctx.max(1))
    }

    /// Evaluates `tokens`; see [`InlineDriver::eval`].
    pub fn eval(
        &mut self,
        session: &mut Session,
        tokens: &[u32],
        logits_from: usize,
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), Error> {
        Ok(self.driver.eval(session, tokens, logits_from, on_logits)?)
    }

    /// Evaluates `tokens` and returns the logits of the last one.
    pub fn eval_last(&mut self, session: &mut Session, tokens: &[u32]) -> Result<&[f32], Error> {
        Ok(self.driver.eval_last(session, tokens)?)
    }

    /// Tokenizes a prompt the way llama.cpp does for plain text: BOS if the model wants it,
    /// special tokens written in the text (`<|im_start|>`) parsed as such.
    pub fn tokenize(&self, text: &str) -> Vec<u32> {
        self.tokenizer.encode(text, true, true)
    }

    /// Generates from `prompt` after what `session` holds, calling `on_text` with each piece
    /// of text as soon as it is complete UTF-8. Return `ControlFlow::Break` to stop.
    pub fn generate(
        &mut self,
        session: &mut Session,
        prompt: &[u32],
        options: &GenerateOptions,
        on_text: &mut dyn FnMut(&str) -> ControlFlow<()>,
    ) -> Result<GenerationStats, Error> {
        if prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        if options.max_tokens == 0 {
            return Err(Error::NothingToGenerate);
        }
        let mut sampler = Sampler::new(options.sampling.clone())?;
        let started = Instant::now();
        let logits = self.driver.eval_last(session, prompt)?;
        let prompt_time = started.elapsed();
        for &t in session.tokens() {
            sampler.accept(t);
        }
        let mut token = sampler.sample(logits);
        let time_to_first_token = started.elapsed();
        let mut decoder = StreamDecoder::new(false);
        let mut stats = GenerationStats {
            prompt_tokens: prompt.len(),
            prompt_time,
            decode_evals: 0,
            decode_time: Duration::ZERO,
            generated: Vec::new(),
            time_to_first_token,
            stop: StopReason::Length,
        };
        loop {
            if !options.ignore_eos && self.tokenizer.is_eog(token) {
                stats.stop = StopReason::EndOfGeneration;
                break;
            }
            stats.generated.push(token);
            sampler.accept(token);
            let text = decoder.push(&self.tokenizer, token);
            if !text.is_empty() && on_text(&text).is_break() {
                stats.stop = StopReason::Cancelled;
                break;
            }
            if stats.generated.len() == options.max_tokens {
                break;
            }
            let t0 = Instant::now();
            let logits = self.driver.eval_last(session, &[token])?;
            stats.decode_time += t0.elapsed();
            stats.decode_evals += 1;
            token = sampler.sample(logits);
        }
        let rest = decoder.finish();
        if !rest.is_empty() {
            let _ = on_text(&rest);
        }
        Ok(stats)
    }
}

//! Conductor: LLM inference for devices whose memory is smaller than the model, after the
//! PowerInfer-2 paper.
//!
//! Embedding it takes a few lines:
//! ```no_run
//! use conductor::{Engine, GenerateOptions};
//! use conductor::runtime::sample::SamplingParams;
//!
//! let mut engine = Engine::builder().threads(2).build()?; // default model, fetched once
//! let mut session = engine.session(None)?;
//! let prompt = engine.tokenize("The capital of France is");
//! let options = GenerateOptions { max_tokens: 16, sampling: SamplingParams::greedy(), ignore_eos: false };
//! engine.generate(&mut session, &prompt, &options, &mut |text| {
//!     print!("{text}");
//!     std::ops::ControlFlow::Continue(())
//! })?;
//! # Ok::<(), conductor::Error>(())
//! ```
//!
//! The numeric core, the scheduler and the file formats live in [`runtime`]; the worker threads
//! in [`actors`]. The OpenAI server is the `conductor-server` crate and the command line
//! `conductor-cli`, both on top of this one; the fault harness is `conductor-testkit`.

mod engine;
pub mod fetch;
pub mod perplexity;
pub mod profile;

pub use conductor_actors as actors;
pub use conductor_runtime as runtime;
pub use engine::{
    apply_budget, apply_budget_for, release_freed_memory, reuse_prefix, step_logits_bytes,
    BadDraftLimits, DraftLimits, Drafter, DriverKind, Engine, EngineBuilder, Error,
    GenerateOptions, Generation, GenerationStats, ModelDrafter, NgramDrafter, Piece, SampleHook,
    SparsitySettings, Speculation, StopReason, TokenStream, BUDGET_CONTEXT, DEFAULT_DRAFT_P_MIN,
    DEFAULT_SPARSE_DOWN_TYPE, DEFAULT_SPARSITY, DEFAULT_SPARSITY_MODE, MODEL_FILE_CHECK_PAUSE,
};

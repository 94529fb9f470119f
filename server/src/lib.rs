//! `conductor serve`: an OpenAI-compatible HTTP server (axum on tokio) over one [`Engine`].
//!
//! One idea a file: the wire types (`api`), errors in OpenAI's shape (`error`), the routes
//! (`routes`), from a request to a job (`request`), the engine's thread and queue (`worker`),
//! what a request adds to each draw (`hook`: log-probabilities, and the structured-output mask
//! from `constrain`), stop sequences (`stop`), the API key and size caps (`limits`) and
//! Prometheus metrics (`metrics`), tool calls (`tools`), the chat page at `/` (`page`). See
//! docs/serve.md.

mod api;
mod constrain;
mod error;
mod hook;
mod limits;
pub mod local;
mod metrics;
mod page;
mod request;
mod routes;
mod stop;
mod tools;
mod worker;

pub use limits::DEFAULT_MAX_BODY;

use conductor::{Engine, Speculation};
use conductor_runtime::tokenizer::{ChatTemplate, Tokenizer};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How the server listens and what it allows.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Address to bind (default loopback: nothing outside this machine reaches it).
    pub host: String,
    /// Port (0: any free one; the address is printed).
    pub port: u16,
    /// Requests generated at once (continuous batching: each decode step computes every
    /// running request's next token in one multi-sequence step; see docs/serve.md).
    pub parallel: usize,
    /// Requests that may wait for the engine; past this, 429 with `Retry-After`.
    pub queue: usize,
    /// `Authorization: Bearer KEY` required on `/v1/*` and `/metrics`.
    pub api_key: Option<String>,
    /// Largest request body in bytes.
    pub max_body: usize,
    /// Context of the server's session (default: the engine's).
    pub context: Option<usize>,
    /// After SIGTERM / Ctrl-C, how long open connections may take to close.
    pub shutdown_grace: Duration,
    /// A Jinja chat template (its source) instead of the model's own.
    pub chat_template: Option<String>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            host: "127.0.0.1".into(),
            port: 8080,
            parallel: 1,
            queue: 8,
            api_key: None,
            max_body: DEFAULT_MAX_BODY,
            context: None,
            shutdown_grace: Duration::from_secs(5),
            chat_template: None,
        }
    }
}

/// What every handler sees.
pub struct AppState {
    queue: std::sync::mpsc::SyncSender<worker::Job>,
    queue_size: usize,
    template: ChatTemplate,
    tokenizer: Arc<Tokenizer>,
    /// Structured output, or why it is unavailable (this model, or a memory budget): made
    /// at the start by `serve`, on first use by an embedder ([`local::Local`]), whose load
    /// time it would otherwise add to (a third of a second for SmolLM2's vocabulary).
    constraints: std::sync::OnceLock<Result<constrain::Constraints, String>>,
    /// Under a memory budget: no structured output.
    budgeted: bool,
    /// How the template's model writes tool calls, or why it takes no tools.
    tool_syntax: Result<tools::Syntax, String>,
    n_ctx: usize,
    model: String,
    /// What `/props` answers.
    props: api::Props,
    created: u64,
    api_key: Option<String>,
    shared: Arc<worker::Shared>,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How many sequences the server generates at once for `--parallel` `asked`: that many, up to
/// the most one step holds ([`Engine::max_step_tokens`]). Under a memory budget the engine was
/// built for them ([`conductor::EngineBuilder::sequences`]: their KV caches come out of the budget,
/// and their multi-sequence steps share the one neuron cache); with sparse decode each
/// sequence computes its own active neurons and the step reads their union (docs/serve.md,
/// "Limits of batching").
pub fn slots_for(engine: &Engine, asked: usize) -> usize {
    let asked = asked.max(1);
    let most = engine.max_step_tokens().max(1);
    if asked > most {
        eprintln!(
            "serve: --parallel {asked}: one decode step holds at most {most} sequences under this plan; serving {most} at once"
        );
        return most;
    }
    if let Some(b) = engine.budget().filter(|b| (b.sessions as usize) < asked) {
        // An engine built for fewer sessions than asked (an embedder's): its budget holds
        // only theirs.
        let held = (b.sessions as usize).max(1);
        eprintln!(
            "serve: --parallel {asked}: the memory budget holds the KV caches of {held} sessions; serving {held} at once"
        );
        return held;
    }
    asked
}

/// The template's tool-call syntax, or why requests with `tools` are refused.
fn tool_syntax(template: &ChatTemplate) -> Result<tools::Syntax, String> {
    if !template.supports_tools() {
        return Err("the model's chat template does not support tools (it does not render the `tools` it is given); serve it with --chat-template-file FILE, a template that does".into());
    }
    tools::Syntax::detect(template.source()).ok_or_else(|| {
        "the model's chat template renders tools, but in a tool-call syntax this server does not parse (it knows Hermes <tool_call>, Llama 3 JSON and Mistral [TOOL_CALLS])".to_string()
    })
}

/// What the server runs on: the handlers' state, what they share with the engine's thread,
/// and that thread (serving `engine` in its slots until [`worker::Shared::shutdown`] is set
/// or every sender is gone). [`serve`] puts a listener in front of it; [`local::Local`]
/// calls the handlers in-process. `lazy_constraints`: structured output is made on first
/// use rather than now. `say` receives the lines worth telling the user. With `speculation`
/// a request running alone decodes with its drafts.
fn start(
    engine: Engine,
    speculation: Option<Speculation>,
    options: &ServeOptions,
    lazy_constraints: bool,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<(
    Arc<AppState>,
    Arc<worker::Shared>,
    std::thread::JoinHandle<()>,
)> {
    use anyhow::Context;
    let tokenizer = engine.shared_tokenizer();
    let template = match &options.chat_template {
        Some(source) => {
            let now = unix_now() as i64;
            tokenizer.chat_template_from(source)?.with_time(now)
        }
        None => {
            let (template, fallback) = engine.chat_template()?;
            if let Some(name) = fallback {
                say(&format!(
                    "serve: the model file has no chat template; using the {name} format"
                ));
            }
            template
        }
    };
    if let Some(speculation) = &speculation {
        engine.check_can_draft(speculation)?;
    }
    let tool_syntax = tool_syntax(&template);
    if let Ok(syntax) = &tool_syntax {
        say(&format!(
            "serve: tool calls in the {} syntax",
            syntax.name()
        ));
    }
    let n_ctx = options
        .context
        .unwrap_or_else(|| engine.default_context())
        .max(2);
    let slots = slots_for(&engine, options.parallel);
    // Made here, so that a context the machine cannot hold fails the start, not each request.
    let sessions = (0..slots)
        .map(|_| engine.session(Some(n_ctx)))
        .collect::<Result<Vec<_>, _>>()?;
    let model = engine
        .model_path()
        .file_stem()
        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    let engine_budgeted = engine.budget().is_some();
    let props = api::Props {
        model: model.clone(),
        n_ctx,
        slots,
        queue: options.queue.max(1),
        memory: engine.budget().map(|b| api::MemoryProps {
            budget: b.budget,
            resident_weights: b.resident_weights,
            kv_cache: b.kv_cache,
            neuron_cache: b.cache,
        }),
    };
    let shared = Arc::new(worker::Shared {
        metrics: metrics::Metrics::new()?,
        shutdown: Default::default(),
        tokenizer: tokenizer.clone(),
        forget: Default::default(),
    });
    let queue_size = options.queue.max(1);
    let (queue, jobs) = std::sync::mpsc::sync_channel(queue_size);
    let worker = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("serve-engine".into())
            .spawn(move || worker::run(engine, sessions, jobs, &shared, speculation))
            .context("starting the engine thread")?
    };
    let state = Arc::new(AppState {
        queue,
        queue_size,
        template,
        tokenizer,
        constraints: std::sync::OnceLock::new(),
        budgeted: engine_budgeted,
        tool_syntax,
        n_ctx,
        model,
        props,
        created: unix_now(),
        api_key: options.api_key.clone(),
        shared: shared.clone(),
    });
    if !lazy_constraints {
        if let Err(e) = state.constraints() {
            say(&format!("serve: structured output is unavailable: {e}"));
        }
    }
    Ok((state, shared, worker))
}

impl AppState {
    /// Structured output, or why it is unavailable.
    fn constraints(&self) -> &Result<constrain::Constraints, String> {
        self.constraints.get_or_init(|| {
            // llguidance's tables for a vocabulary are large (21 MiB for SmolLM2's 49k
            // tokens) and not in a memory budget's split: under --memory the server does
            // without them.
            if self.budgeted {
                Err("off under --memory (llguidance's tables for the vocabulary would not fit in the budget's split)".to_string())
            } else {
                constrain::Constraints::new(self.tokenizer.clone())
            }
        })
    }
}

/// Runs the server on `engine` until SIGTERM or Ctrl-C; with `speculation`, a request running
/// alone decodes with its drafts. `on_listening` is called with the bound address once
/// requests are accepted.
pub fn serve(
    engine: Engine,
    speculation: Option<Speculation>,
    options: ServeOptions,
    on_listening: impl FnOnce(SocketAddr),
) -> anyhow::Result<()> {
    use anyhow::Context;
    let (state, shared, worker) = start(engine, speculation, &options, false, &mut |line| {
        eprintln!("{line}")
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let served = runtime.block_on(routes::listen(state, &options, on_listening));
    // Whatever the server's end, stop the engine: the flag ends the running job and the
    // worker's loop.
    shared.shutdown.store(true, Ordering::Relaxed);
    runtime.shutdown_timeout(Duration::from_secs(1));
    if worker.join().is_err() {
        eprintln!("serve: the engine thread panicked");
    }
    served
}

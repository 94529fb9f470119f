//! `conductor serve`: the OpenAI-compatible server (server/src/, docs/serve.md).

use super::draft::DraftArgs;
use super::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use conductor_server::{ServeOptions, DEFAULT_MAX_BODY};
use std::io::Write;
use std::time::Duration;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Speculative decoding (a request running alone verifies drafted tokens in one step).
    #[command(flatten)]
    draft: DraftArgs,
    /// Address to listen on. The default, loopback, keeps the server to this machine.
    #[arg(long = "host", default_value = "127.0.0.1")]
    host: String,
    /// Port (0: a free one, printed on start).
    #[arg(long = "port", default_value_t = 8080)]
    port: u16,
    /// Requests generated at once: each decode step computes the next token of every running
    /// request in one multi-sequence step (continuous batching), each with its own KV cache.
    /// Under --memory every slot's KV cache comes out of the budget and the slots share the
    /// neuron cache.
    #[arg(long = "parallel", default_value_t = 1)]
    parallel: usize,
    /// Requests that may wait for the engine; more are answered 429 with Retry-After.
    #[arg(long = "queue", default_value_t = 8)]
    queue: usize,
    /// Require `Authorization: Bearer KEY` on /v1/* and /metrics.
    #[arg(long = "api-key")]
    api_key: Option<String>,
    /// Context size in tokens of the server's session (default: the model's training context,
    /// cut to what the machine holds).
    #[arg(short = 'c', long = "ctx-size")]
    ctx_size: Option<usize>,
    /// Largest request body in bytes.
    #[arg(long = "max-body", default_value_t = DEFAULT_MAX_BODY)]
    max_body: usize,
    /// Seconds open connections get to finish after SIGTERM / Ctrl-C.
    #[arg(long = "shutdown-grace", default_value_t = 5.0)]
    shutdown_grace: f64,
    /// Jinja chat template instead of the model's own (as llama-server's
    /// --chat-template-file), e.g. one that supports tool calls.
    #[arg(long = "chat-template-file", value_name = "FILE")]
    chat_template_file: Option<std::path::PathBuf>,
}

pub fn run(args: ServeArgs) -> Result<()> {
    if args.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    if args.queue == 0 {
        bail!("--queue must be at least 1");
    }
    if args.ctx_size.is_some_and(|c| c < 2) {
        bail!("-c must be at least 2");
    }
    if !(args.shutdown_grace.is_finite() && args.shutdown_grace >= 0.0) {
        bail!("--shutdown-grace must be a number of seconds ≥ 0");
    }
    if args.api_key.as_deref() == Some("") {
        bail!("--api-key is empty");
    }
    let chat_template = match &args.chat_template_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the chat template {}", path.display()))?,
        ),
        None => None,
    };
    let mut model_args = args.model.clone();
    if model_args.engine.context.is_none() {
        model_args.engine.context = args.ctx_size;
    }
    // Under --memory the budget holds every slot's KV cache.
    model_args.engine.sequences = Some(args.parallel);
    let draft = args.draft.prepare(&mut model_args)?;
    let engine = model_args.load(model_args.threads())?;
    let n_ctx = args.ctx_size.unwrap_or_else(|| engine.default_context());
    let speculation = match &draft {
        Some(draft) => Some(draft.speculation(&model_args, &engine, n_ctx)?),
        None => None,
    };
    if let Some(draft) = speculation.as_ref().and(args.draft.draft.as_deref()) {
        eprintln!(
            "serve: drafting with {draft} (up to {} tokens a step) while a request runs alone",
            args.draft.draft_max
        );
    }
    let options = ServeOptions {
        host: args.host,
        port: args.port,
        parallel: args.parallel,
        // Requests being generated count against the line too: `parallel` of them may be
        // taken in beyond the queue.
        queue: args.queue + args.parallel - 1,
        api_key: args.api_key,
        max_body: args.max_body,
        context: args.ctx_size,
        shutdown_grace: Duration::from_secs_f64(args.shutdown_grace),
        chat_template,
    };
    conductor_server::serve(engine, speculation, options, |addr| {
        // Scripts and tests read this line for the port.
        println!("listening on http://{addr}");
        let _ = std::io::stdout().flush();
    })
}

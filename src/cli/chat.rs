//! `conductor chat`: an interactive chat in the terminal. The conversation is rendered with the
//! model's chat template each turn; the session keeps what earlier turns computed
//! ([`conductor::reuse_prefix`]), so a turn evaluates only its new tokens. Ctrl-C stops the
//! answer being written, not the program.

use super::run::SamplingArgs;
use super::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use conductor::runtime::tokenizer::ChatMessage;
use conductor::GenerateOptions;
use serde::Serialize;
use std::io::{BufRead, Write};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// System message the conversation starts with (`/system TEXT` changes it).
    #[arg(long = "system")]
    system: Option<String>,
    /// Tokens an answer may take at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    n_predict: usize,
    /// Context size in tokens: the whole conversation must fit (default 4096).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    ctx_size: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Keep generating past end-of-generation tokens (for tests of Ctrl-C).
    #[arg(long = "ignore-eos", hide = true)]
    ignore_eos: bool,
}

const HELP: &str = "commands: /reset (forget the conversation), /system TEXT (set the system message and reset), /save FILE (the conversation as JSON), /quit; Ctrl-C stops an answer, Ctrl-D or /quit leaves";

#[derive(Serialize)]
struct Saved<'a> {
    messages: &'a [ChatMessage],
}

/// Ctrl-C sets this instead of ending the program (tokio's handler on its own thread).
fn interrupt_flag() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    let set = flag.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .context("starting the Ctrl-C handler")?;
    // Registered before the thread starts, so no Ctrl-C is missed between here and the loop.
    let mut signals = runtime.block_on(async { interrupt_stream() })?;
    std::thread::Builder::new()
        .name("ctrl-c".into())
        .spawn(move || {
            runtime.block_on(async move {
                while signals.recv().await.is_some() {
                    set.store(true, Ordering::Relaxed);
                }
            })
        })
        .context("starting the Ctrl-C handler")?;
    Ok(flag)
}

#[cfg(unix)]
fn interrupt_stream() -> Result<tokio::signal::unix::Signal> {
    Ok(tokio::signal::unix::signal(
        tokio::signal::unix::SignalKind::interrupt(),
    )?)
}

#[cfg(not(unix))]
fn interrupt_stream() -> Result<tokio::signal::windows::CtrlC> {
    Ok(tokio::signal::windows::ctrl_c()?)
}

pub fn run(args: ChatArgs) -> Result<()> {
    if args.n_predict == 0 {
        bail!("-n must be at least 1");
    }
    if args.ctx_size < 2 {
        bail!("-c must be at least 2");
    }
    let sampling = args.sampling.params()?;
    let mut model_args = args.model.clone();
    model_args.engine.context = Some(args.ctx_size);
    let mut engine = model_args.load(model_args.threads())?;
    let (template, fallback) = engine.chat_template()?;
    if let Some(name) = fallback {
        eprintln!("the model file has no chat template; using the {name} format");
    }
    let mut session = engine.session(Some(args.ctx_size))?;
    let interrupted = interrupt_flag()?;
    let mut system = args.system.clone();
    let mut history: Vec<ChatMessage> = Vec::new();
    let start = |system: &Option<String>| -> Vec<ChatMessage> {
        system
            .iter()
            .map(|s| ChatMessage::new("system", s.as_str()))
            .collect()
    };
    history.extend(start(&system));
    eprintln!("{HELP}");
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    let mut line = String::new();
    loop {
        write!(stdout, "> ")?;
        stdout.flush()?;
        line.clear();
        if stdin.lock().read_line(&mut line)? == 0 {
            writeln!(stdout)?;
            return Ok(());
        }
        let input = line.trim_end_matches(['\n', '\r']);
        let (command, rest) = input.split_once(' ').unwrap_or((input, ""));
        match command {
            "" => continue,
            "/quit" | "/exit" => return Ok(()),
            "/help" => {
                eprintln!("{HELP}");
                continue;
            }
            "/reset" => {
                history = start(&system);
                eprintln!("(the conversation is forgotten)");
                continue;
            }
            "/system" => {
                system = Some(rest.trim().to_string()).filter(|s| !s.is_empty());
                history = start(&system);
                eprintln!("(system message set; the conversation starts anew)");
                continue;
            }
            "/save" => {
                let path = PathBuf::from(rest.trim());
                if rest.trim().is_empty() {
                    eprintln!("/save needs a file name");
                    continue;
                }
                let json = serde_json::to_string_pretty(&Saved { messages: &history })?;
                match std::fs::write(&path, json + "\n") {
                    Ok(()) => eprintln!("(saved {} messages to {})", history.len(), path.display()),
                    Err(e) => eprintln!("cannot write {}: {e}", path.display()),
                }
                continue;
            }
            c if c.starts_with('/') => {
                eprintln!("unknown command {c}; {HELP}");
                continue;
            }
            _ => {}
        }
        history.push(ChatMessage::new("user", input));
        let text = match template.apply(&history, true) {
            Ok(t) => t,
            Err(e) => {
                history.pop();
                eprintln!("the chat template cannot render this conversation: {e}");
                continue;
            }
        };
        let prompt = engine.tokenize(&text);
        if prompt.len() >= session.n_ctx() {
            history.pop();
            eprintln!(
                "the conversation is {} tokens long and the context holds {}: /reset, or start with a larger -c",
                prompt.len(),
                session.n_ctx()
            );
            continue;
        }
        let kept = conductor::reuse_prefix(&mut session, &prompt);
        let options = GenerateOptions {
            max_tokens: args.n_predict.min(session.n_ctx() - prompt.len()),
            sampling: sampling.clone(),
            ignore_eos: args.ignore_eos,
        };
        interrupted.store(false, Ordering::Relaxed);
        let mut answer = String::new();
        let result = engine.generate(&mut session, &prompt[kept..], &options, &mut |piece| {
            answer.push_str(piece);
            let _ = write!(stdout, "{piece}").and_then(|_| stdout.flush());
            if interrupted.load(Ordering::Relaxed) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        writeln!(stdout)?;
        if interrupted.swap(false, Ordering::Relaxed) {
            eprintln!("(stopped)");
        }
        match result {
            // What was said stays in the conversation, stopped or not.
            Ok(_) => history.push(ChatMessage::new("assistant", answer)),
            Err(e) => {
                history.pop();
                session.clear();
                eprintln!("error: {e:#}");
            }
        }
    }
}

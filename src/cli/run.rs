//! `conductor run`: generate from a prompt, streamed, with llama.cpp-style timings at the end.

use super::draft::DraftArgs;
use super::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use conductor::runtime::sample::SamplingParams;
use conductor::runtime::tokenizer::ChatMessage;
use conductor::{GenerateOptions, GenerationStats};
use std::io::Write;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

/// Sampling settings, llama.cpp's flags and defaults (`run`, `chat`).
#[derive(Args, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    temp: f32,
    /// Keep only the k most likely tokens (0 = all).
    #[arg(long = "top-k", default_value_t = 40)]
    top_k: u32,
    /// Keep the most likely tokens up to this cumulative probability (1 = all).
    #[arg(long = "top-p", default_value_t = 0.95)]
    top_p: f32,
    /// Drop tokens less likely than this fraction of the most likely one (0 = off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    min_p: f32,
    /// Penalise recently seen tokens (1 = off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    repeat_penalty: f32,
    /// How many recent tokens the repetition penalty considers.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    repeat_last_n: usize,
    /// Random seed for sampling.
    #[arg(short = 's', long = "seed", default_value_t = 0x5EED)]
    seed: u64,
}

impl SamplingArgs {
    /// The settings, checked.
    pub fn params(&self) -> Result<SamplingParams> {
        let sampling = SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed: self.seed,
        };
        sampling.validate()?;
        Ok(sampling)
    }
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt.
    #[arg(short = 'p', long = "prompt")]
    prompt: String,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n_predict: usize,
    /// Context size in tokens (default: the model's training context).
    #[arg(short = 'c', long = "ctx-size")]
    ctx_size: Option<usize>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    draft: DraftArgs,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long = "chat")]
    chat: bool,
    /// System message for --chat.
    #[arg(long = "system", requires = "chat")]
    system: Option<String>,
    /// Jinja chat template for --chat instead of the model's own.
    #[arg(long = "chat-template-file", requires = "chat", value_name = "FILE")]
    chat_template_file: Option<std::path::PathBuf>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long = "ignore-eos")]
    ignore_eos: bool,
    /// Do not echo the prompt before the generated text.
    #[arg(long = "no-display-prompt")]
    no_display_prompt: bool,
    /// Record a trace of the run (actor driver): every scheduler event and command, for
    /// `conductor simulate --replay`, plus a Chrome-trace timeline beside it (.json).
    #[arg(long = "trace-out")]
    trace_out: Option<std::path::PathBuf>,
}

pub fn run(args: RunArgs) -> Result<()> {
    if args.prompt.is_empty() {
        bail!("the prompt is empty: give some text with -p");
    }
    if args.n_predict == 0 {
        bail!("-n must be at least 1: there is nothing to generate");
    }
    if args.ctx_size == Some(0) {
        bail!("-c must be at least 1");
    }
    let sampling = args.sampling.params()?;

    let started = Instant::now();
    let mut model_args = args.model.clone();
    if model_args.engine.context.is_none() {
        model_args.engine.context = args.ctx_size;
    }
    let draft = args.draft.prepare(&mut model_args)?;
    let mut engine = model_args.load(model_args.threads())?;
    let load_time = started.elapsed();
    let text = if args.chat {
        let template = match &args.chat_template_file {
            Some(path) => {
                let source = std::fs::read_to_string(path)
                    .with_context(|| format!("reading the chat template {}", path.display()))?;
                engine.tokenizer().chat_template_from(&source)?
            }
            None => {
                let (template, fallback) = engine.chat_template()?;
                if let Some(name) = fallback {
                    eprintln!("the model file has no chat template; using the {name} format");
                }
                template
            }
        };
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::new("system", system.as_str()));
        }
        messages.push(ChatMessage::new("user", args.prompt.as_str()));
        template.apply(&messages, true)?
    } else {
        args.prompt.clone()
    };
    let prompt = engine.tokenize(&text);
    let mut session = engine.session(args.ctx_size)?;
    if prompt.len() >= session.n_ctx() {
        bail!(
            "the prompt is {} tokens long but the context holds {} (raise -c)",
            prompt.len(),
            session.n_ctx()
        );
    }
    let options = GenerateOptions {
        max_tokens: args.n_predict.min(session.n_ctx() - prompt.len()),
        sampling,
        ignore_eos: args.ignore_eos,
    };

    if args.trace_out.is_some() {
        engine.start_trace()?;
    }
    // Before the prompt is printed: a draft model that cannot load says so first.
    let mut speculation = match &draft {
        Some(draft) => Some(draft.speculation(&model_args, &engine, session.n_ctx())?),
        None => None,
    };
    let mut out = std::io::stdout().lock();
    if !args.no_display_prompt && !args.chat {
        write!(out, "{text}")?;
        out.flush()?;
    }
    let mut write_error = None;
    let stats = engine.generate_with_draft(
        &mut session,
        &prompt,
        &options,
        speculation.as_mut(),
        &mut |piece| {
            match write!(out, "{piece}").and_then(|_| out.flush()) {
                Ok(()) => ControlFlow::Continue(()),
                Err(e) => {
                    // Closed pipe (`| head`): stop generating, report nothing more.
                    write_error = Some(e);
                    ControlFlow::Break(())
                }
            }
        },
    )?;
    if write_error.is_none() {
        writeln!(out)?;
    }
    drop(out);
    print_timings(load_time, &stats, started.elapsed());
    if let Some(path) = &args.trace_out {
        super::save_trace(&engine.take_trace()?, path)?;
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn rate(d: Duration, n: usize) -> (f64, f64) {
    if n == 0 {
        return (0.0, 0.0);
    }
    let per = ms(d) / n as f64;
    (per, if per > 0.0 { 1e3 / per } else { 0.0 })
}

fn print_timings(load: Duration, s: &GenerationStats, total: Duration) {
    let (pp_per, pp_rate) = rate(s.prompt_time, s.prompt_tokens);
    let (tg_per, tg_rate) = rate(s.decode_time, s.decoded_tokens());
    eprintln!();
    eprintln!("conductor:          load time = {:10.2} ms", ms(load));
    eprintln!(
        "conductor:   prompt eval time = {:10.2} ms / {:5} tokens ({:8.2} ms per token, {:8.2} tokens per second)",
        ms(s.prompt_time),
        s.prompt_tokens,
        pp_per,
        pp_rate
    );
    eprintln!(
        "conductor:          eval time = {:10.2} ms / {:5} runs   ({:8.2} ms per token, {:8.2} tokens per second)",
        ms(s.decode_time),
        s.decode_evals,
        tg_per,
        tg_rate
    );
    if s.draft_steps > 0 {
        eprintln!(
            "conductor:              draft = {:5} steps verified {:5} drafted tokens, kept {:5} ({:.1}% accepted, {:.2} tokens an evaluation)",
            s.draft_steps,
            s.drafted,
            s.draft_accepted,
            100.0 * s.draft_acceptance(),
            s.decoded_tokens() as f64 / s.decode_evals.max(1) as f64,
        );
    }
    eprintln!(
        "conductor: time to first token = {:9.2} ms",
        ms(s.time_to_first_token)
    );
    eprintln!(
        "conductor:         total time = {:10.2} ms / {:5} tokens",
        ms(total),
        s.prompt_tokens + s.generated.len()
    );
}

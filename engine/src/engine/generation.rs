//! The generation loop: drawing tokens from logits, one at a time or several per step
//! (speculative decoding), with the text each completes.

use super::speculative::Speculation;
use super::{Engine, Error};
use conductor_runtime::exec::Session;
use conductor_runtime::sample::{Sampler, SamplingParams};
use conductor_runtime::tokenizer::{StreamDecoder, Tokenizer};
use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

/// Sees each step's logits before a token is drawn from them, and the token drawn from them:
/// where constrained decoding masks tokens out and where a server reads log-probabilities
/// ([`Engine::stream_with`]). The generation loop stays [`TokenStream`]'s.
pub trait SampleHook {
    /// Changes `logits` before the draw (a token set to `f32::NEG_INFINITY` is never drawn).
    fn adjust(&mut self, logits: &mut [f32]) -> Result<(), String>;
    /// `token` was drawn from `logits` (as [`SampleHook::adjust`] left them).
    fn drawn(&mut self, token: u32, logits: &[f32]) -> Result<(), String>;
}

impl<T: SampleHook + ?Sized> SampleHook for &mut T {
    fn adjust(&mut self, logits: &mut [f32]) -> Result<(), String> {
        (**self).adjust(logits)
    }

    fn drawn(&mut self, token: u32, logits: &[f32]) -> Result<(), String> {
        (**self).drawn(token, logits)
    }
}

/// Draws the next token from `logits`, through `hook` when there is one (which then works on
/// a copy in `scratch`: the driver's logits are read-only), and records it in the sampler's
/// window.
fn draw(
    sampler: &mut Sampler,
    hook: &mut Option<Box<dyn SampleHook + '_>>,
    scratch: &mut Vec<f32>,
    logits: &[f32],
) -> Result<u32, Error> {
    let token = match hook {
        None => sampler.sample(logits),
        Some(hook) => {
            scratch.clear();
            scratch.extend_from_slice(logits);
            hook.adjust(scratch).map_err(Error::Hook)?;
            let token = sampler.sample(scratch);
            hook.drawn(token, scratch).map_err(Error::Hook)?;
            token
        }
    };
    // Into the repetition penalty's window before the next draw, which with speculative
    // decoding comes before this token is handed out.
    sampler.accept(token);
    Ok(token)
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
    /// Evaluations after the prompt (one-token steps, or one pending token and its drafted
    /// successors).
    pub decode_evals: usize,
    pub decode_time: Duration,
    pub generated: Vec<u32>,
    /// From the call to the first generated token.
    pub time_to_first_token: Duration,
    pub stop: StopReason,
    /// Speculative decoding: decode evaluations that verified drafted tokens, the tokens
    /// drafted for them, and how many of those the target's own draws kept.
    pub draft_steps: usize,
    pub drafted: usize,
    pub draft_accepted: usize,
}

impl GenerationStats {
    /// Tokens drawn from decode evaluations: one each, plus the drafted tokens they kept.
    pub fn decoded_tokens(&self) -> usize {
        self.decode_evals + self.draft_accepted
    }

    /// The share of drafted tokens kept (0 when nothing was drafted).
    pub fn draft_acceptance(&self) -> f64 {
        if self.drafted == 0 {
            return 0.0;
        }
        self.draft_accepted as f64 / self.drafted as f64
    }

    /// Drafted tokens kept per verifying step (0 when no step verified a draft).
    pub fn draft_accepted_per_step(&self) -> f64 {
        if self.draft_steps == 0 {
            return 0.0;
        }
        self.draft_accepted as f64 / self.draft_steps as f64
    }
}

impl Engine {
    /// Evaluates `prompt` after what `session` holds and returns an iterator over the
    /// generated tokens, each with the text it completes. Evaluation is lazy: each `next`
    /// computes one token, so dropping the iterator cancels generation.
    pub fn stream<'a>(
        &'a mut self,
        session: &'a mut Session,
        prompt: &[u32],
        options: &GenerateOptions,
    ) -> Result<TokenStream<'a>, Error> {
        self.stream_with(session, prompt, options, None)
    }

    /// [`Engine::stream`], with `hook` seeing every draw: it may mask logits (constrained
    /// decoding) and read the distribution each token came from (log-probabilities).
    pub fn stream_with<'a>(
        &'a mut self,
        session: &'a mut Session,
        prompt: &[u32],
        options: &GenerateOptions,
        hook: Option<&'a mut dyn SampleHook>,
    ) -> Result<TokenStream<'a>, Error> {
        let hook = hook.map(|h| Box::new(h) as Box<dyn SampleHook + 'a>);
        let generation = self.start_generation(session, prompt, options, hook)?;
        Ok(TokenStream {
            engine: self,
            session,
            generation,
            speculation: None,
            last_step: Instant::now(),
        })
    }

    /// Evaluates `prompt` after what `session` holds and draws the first token: a
    /// [`Generation`] that continues apart from the engine, so that a server can step many at
    /// once ([`Engine::step_sequences`]). [`Engine::stream_with`] is this and one-token steps.
    pub fn start_generation<'h>(
        &mut self,
        session: &mut Session,
        prompt: &[u32],
        options: &GenerateOptions,
        mut hook: Option<Box<dyn SampleHook + 'h>>,
    ) -> Result<Generation<'h>, Error> {
        if prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        if options.max_tokens == 0 {
            return Err(Error::NothingToGenerate);
        }
        let mut sampler = Sampler::new(options.sampling.clone())?;
        let started = Instant::now();
        self.check_model_file()?;
        let logits = self.driver.get().eval_last(session, prompt)?;
        let prompt_time = started.elapsed();
        for &t in session.tokens() {
            sampler.accept(t);
        }
        let mut scratch = Vec::new();
        let first = draw(&mut sampler, &mut hook, &mut scratch, logits)?;
        let time_to_first_token = started.elapsed();
        Ok(Generation {
            sampler,
            hook,
            scratch,
            decoder: StreamDecoder::new(false),
            options: options.clone(),
            next: Some(first),
            to_eval: None,
            ahead: VecDeque::new(),
            stats: GenerationStats {
                prompt_tokens: prompt.len(),
                prompt_time,
                decode_evals: 0,
                decode_time: Duration::ZERO,
                generated: Vec::new(),
                time_to_first_token,
                stop: StopReason::Length,
                draft_steps: 0,
                drafted: 0,
                draft_accepted: 0,
            },
        })
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
        self.generate_with_draft(session, prompt, options, None, on_text)
    }

    /// [`Engine::generate`], decoding with `speculation`'s drafts when there is one: the same
    /// text, in fewer steps where the drafts are right ([`TokenStream::with_draft`]).
    pub fn generate_with_draft(
        &mut self,
        session: &mut Session,
        prompt: &[u32],
        options: &GenerateOptions,
        speculation: Option<&mut Speculation>,
        on_text: &mut dyn FnMut(&str) -> ControlFlow<()>,
    ) -> Result<GenerationStats, Error> {
        let mut stream = self.stream(session, prompt, options)?;
        if let Some(speculation) = speculation {
            stream = stream.with_draft(speculation)?;
        }
        while let Some(piece) = stream.next() {
            let piece = piece?;
            if !piece.text.is_empty() && on_text(&piece.text).is_break() {
                stream.generation.stats.stop = StopReason::Cancelled;
                break;
            }
        }
        Ok(stream.into_stats())
    }
}

/// One generated token and the text it completes (empty while a UTF-8 character is still
/// incomplete). The last piece of a stream may carry no token: the flush of bytes that never
/// completed a character.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    pub token: Option<u32>,
    pub text: String,
}

/// Generated tokens, one per `next`; see [`Engine::stream`].
pub struct TokenStream<'a> {
    engine: &'a mut Engine,
    session: &'a mut Session,
    generation: Generation<'a>,
    /// Speculative decoding's drafter.
    speculation: Option<&'a mut Speculation>,
    /// When the stream's last step (or its prompt) ended: the model file is checked again
    /// only after a pause ([`MODEL_FILE_CHECK_PAUSE`]).
    last_step: Instant,
}

/// A token stream checks its model file before a step only when at least this long has passed
/// since its last step ended. The check (`Engine::check_model_file`, an `fstat`) turns a mapped
/// file truncated while the engine waited into an error instead of `SIGBUS`: a request starts
/// with it, a server's batch step makes it once for all its sequences, and a stream whose
/// reader paused makes it. Steps that follow each other at once skip it: a truncation then
/// lands in a running step, which no check between steps can catch.
pub const MODEL_FILE_CHECK_PAUSE: Duration = Duration::from_millis(1);

/// One generation's state (sampler, hook, text decoder, counts) apart from the engine and the
/// session: [`TokenStream`] steps one with one-token steps; a server steps many in one
/// multi-sequence step ([`Engine::step_sequences`]). Either way the same code samples, stops
/// and decodes text.
pub struct Generation<'h> {
    sampler: Sampler,
    hook: Option<Box<dyn SampleHook + 'h>>,
    /// The logits a hook works on.
    scratch: Vec<f32>,
    decoder: StreamDecoder,
    options: GenerateOptions,
    /// The sampled token to hand out next.
    next: Option<u32>,
    /// The token handed out last, evaluated at the next call (so its text comes out first).
    to_eval: Option<u32>,
    /// Tokens drawn after `next` in one speculative step, in order: every one but the last is
    /// already in the session.
    ahead: VecDeque<u32>,
    stats: GenerationStats,
}

impl<'a> TokenStream<'a> {
    /// What the generation cost so far.
    pub fn stats(&self) -> &GenerationStats {
        &self.generation.stats
    }

    pub fn into_stats(self) -> GenerationStats {
        self.generation.stats
    }

    /// Decodes with `speculation`'s drafts from the next step on (see [`Speculation`]): the
    /// same tokens, in fewer steps where the drafts are right. Needs dense decode; under a
    /// memory budget, drafts are as long as [`super::EngineBuilder::step_logits`] held room
    /// for (build the engine with the drafts' length and one: without, a draft is refused).
    pub fn with_draft(mut self, speculation: &'a mut Speculation) -> Result<Self, Error> {
        self.engine.check_can_draft(speculation)?;
        self.speculation = Some(speculation);
        Ok(self)
    }

    fn advance(&mut self) -> Result<Option<Piece>, Error> {
        if self.generation.pending().is_some() {
            if self.last_step.elapsed() >= MODEL_FILE_CHECK_PAUSE {
                self.engine.check_model_file()?;
            }
            let stepped = self.engine.step_generation(
                self.session,
                &mut self.generation,
                self.speculation.as_deref_mut(),
            );
            self.last_step = Instant::now();
            stepped?;
        }
        Ok(self.generation.piece(&self.engine.tokenizer))
    }
}

impl Generation<'_> {
    /// What the generation cost so far.
    pub fn stats(&self) -> &GenerationStats {
        &self.stats
    }

    pub fn into_stats(self) -> GenerationStats {
        self.stats
    }

    /// The token handed out last, which must be evaluated (its logits given to
    /// [`Generation::evaluated`]) before the next [`Generation::piece`]; `None` once the
    /// generation has ended.
    pub fn pending(&self) -> Option<u32> {
        self.to_eval
    }

    /// Tokens this generation may still hand out.
    pub(super) fn room(&self) -> usize {
        self.options.max_tokens - self.stats.generated.len()
    }

    /// Whether no decode step has run yet (the prompt alone is evaluated).
    pub(super) fn is_first_step(&self) -> bool {
        self.stats.decode_evals == 0
    }

    /// Work on the prompt done after it was evaluated (a draft model reading it) took `took`.
    pub(super) fn charge_prompt(&mut self, took: Duration) {
        self.stats.prompt_time += took;
    }

    /// The pending token's logits (computed in `took`): draws the next token.
    pub fn evaluated(&mut self, logits: &[f32], took: Duration) -> Result<(), Error> {
        self.to_eval = None;
        self.stats.decode_time += took;
        self.stats.decode_evals += 1;
        self.next = Some(draw(
            &mut self.sampler,
            &mut self.hook,
            &mut self.scratch,
            logits,
        )?);
        Ok(())
    }

    /// The next generated token and its text; `None` at the end. After a token,
    /// [`Generation::pending`] names it until its logits are in.
    pub fn piece(&mut self, tokenizer: &Tokenizer) -> Option<Piece> {
        if self.to_eval.is_some() {
            return None;
        }
        let token = self.next.take()?;
        if !self.options.ignore_eos && tokenizer.is_eog(token) {
            self.stats.stop = StopReason::EndOfGeneration;
            let rest = self.decoder.finish();
            return (!rest.is_empty()).then_some(Piece {
                token: None,
                text: rest,
            });
        }
        self.stats.generated.push(token);
        let mut text = self.decoder.push(tokenizer, token);
        if self.stats.generated.len() == self.options.max_tokens {
            self.stats.stop = StopReason::Length;
            text.push_str(&self.decoder.finish());
        } else if let Some(drawn) = self.ahead.pop_front() {
            // Drawn in the same speculative step: `token` is already in the session.
            self.next = Some(drawn);
        } else {
            self.to_eval = Some(token);
        }
        Some(Piece {
            token: Some(token),
            text,
        })
    }

    /// The logits of a speculative step (computed in `took`): `rows` holds `[token][n_vocab]`
    /// for the pending token and then each of `drafted`. Draws from each row in turn, exactly
    /// as one-token steps would, and goes on to the next row only while the token drawn is the
    /// drafted one there. Returns how many drafted tokens were kept: the session must keep the
    /// pending token and that many drafted ones, and forget the rest.
    pub fn verified(
        &mut self,
        rows: &[f32],
        drafted: &[u32],
        took: Duration,
        tokenizer: &Tokenizer,
    ) -> Result<usize, Error> {
        let n_vocab = rows.len() / (drafted.len() + 1);
        self.to_eval = None;
        self.stats.decode_time += took;
        self.stats.decode_evals += 1;
        self.stats.draft_steps += 1;
        self.stats.drafted += drafted.len();
        // Tokens this generation may still hand out, `next` included.
        let room = self.room();
        for (i, row) in rows.chunks_exact(n_vocab).enumerate() {
            let token = draw(&mut self.sampler, &mut self.hook, &mut self.scratch, row)?;
            if i == 0 {
                self.next = Some(token);
            } else {
                self.ahead.push_back(token);
            }
            let kept_on = drafted.get(i) == Some(&token)
                && i + 1 < room
                && (self.options.ignore_eos || !tokenizer.is_eog(token));
            if !kept_on {
                break;
            }
        }
        let kept = self.ahead.len();
        self.stats.draft_accepted += kept;
        Ok(kept)
    }

    /// Ends the generation (after an error): no more pieces.
    pub fn end(&mut self) {
        self.next = None;
        self.to_eval = None;
        self.ahead.clear();
    }
}

impl Iterator for TokenStream<'_> {
    type Item = Result<Piece, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.advance() {
            Ok(piece) => piece.map(Ok),
            Err(e) => {
                // The stream ends with its error.
                self.generation.end();
                Some(Err(e))
            }
        }
    }
}

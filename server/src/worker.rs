//! The engine's thread and its queue: continuous batching. Requests wait in a bounded queue;
//! the worker keeps `--parallel` slots, each a session (its own KV cache) and at most one
//! running request. Between decode steps it takes requests into free slots (each prompt is
//! evaluated alone, then its first token drawn); then one multi-sequence step
//! ([`Engine::step_sequences`]) computes the next token of every running request at once,
//! sharing each weight read. A request that ends (its end, `max_tokens`, a stop sequence, its
//! client gone) leaves its slot at once. Generation itself — sampling, the hook, text — is
//! [`conductor::Generation`], the state `conductor run`'s stream steps too.
//!
//! With `--draft` ([`conductor::Speculation`]), a request that runs alone decodes with drafts: the
//! drafted tokens are verified in one step of its own ([`Engine::step_generation`]). While
//! several run, their one-token multi-sequence steps already share each weight read, and no
//! request drafts.
//!
//! A slot keeps its session after a request: a request whose prompt begins with tokens a free
//! slot holds (a conversation's next turn) goes to that slot and evaluates only the rest.

use super::api::{CacheTimings, DraftTimings, Timings, TokenLogprob, Usage};
use super::error::ApiError;
use super::hook::RequestHook;
use super::metrics::Metrics;
use super::stop::StopMatcher;
use conductor::{Engine, GenerateOptions, Generation, GenerationStats, Speculation, StopReason};
use conductor_runtime::exec::Session;
use conductor_runtime::tokenizer::Tokenizer;
use llguidance::Matcher;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// One request for the engine.
pub struct Job {
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    pub stops: Vec<String>,
    /// `Some(n)`: log-probabilities with `n` alternatives per token.
    pub logprobs: Option<usize>,
    pub matcher: Option<Matcher>,
    /// When the request arrived (queue time and time to first token count from here).
    pub received: Instant,
    pub events: UnboundedSender<Event>,
}

/// What the worker sends back for a job, in order: text, then `Done` or `Failed`.
#[derive(Debug)]
pub enum Event {
    Text {
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    Done {
        finish_reason: &'static str,
        usage: Usage,
        timings: Timings,
    },
    Failed(ApiError),
}

/// Everything the worker shares with the HTTP side.
pub struct Shared {
    pub metrics: Metrics,
    /// Set on SIGTERM / Ctrl-C: the running job is cancelled, queued ones are refused.
    pub shutdown: AtomicBool,
    pub tokenizer: Arc<Tokenizer>,
    /// Set by an embedder's `reset` ([`super::local::Local::forget`]): the free slots forget
    /// what their sessions hold before the next request is taken in, which then evaluates its
    /// whole prompt.
    pub forget: AtomicBool,
}

/// How often an idle worker looks at the shutdown flag.
const IDLE_POLL: Duration = Duration::from_millis(100);

/// A session and the request it is generating, if any.
struct Slot {
    session: Session,
    running: Option<Running>,
}

/// A request being generated in a slot.
struct Running {
    generation: Generation<'static>,
    /// Log-probabilities the hook recorded, one per drawn token.
    drawn: Rc<RefCell<VecDeque<TokenLogprob>>>,
    stops: StopMatcher,
    events: UnboundedSender<Event>,
    received: Instant,
    prompt_len: usize,
    /// When its first token was handed out (`None` until then).
    first_at: Option<Instant>,
    /// The neuron cache's counters when it was admitted, under `--memory`.
    cache_at_start: Option<CacheCounters>,
    /// Whether the server drafts (`--draft`): its figures then say how drafting went.
    drafting: bool,
}

/// The neuron cache's counters (the engine's, from its start).
#[derive(Clone, Copy)]
struct CacheCounters {
    hits: u64,
    misses: u64,
    bytes_read: u64,
}

/// The neuron cache's counters now, under `--memory`.
fn cache_counters(engine: &Engine) -> Option<CacheCounters> {
    engine.cache_report().map(|r| CacheCounters {
        hits: r.hits(),
        misses: r.misses(),
        bytes_read: r.bytes_read,
    })
}

/// Why a request left its slot.
#[derive(Clone, Copy)]
enum End {
    /// The generation ended: end of generation or `max_tokens`.
    Finished,
    /// A stop sequence appeared.
    StopText,
    ClientLeft,
}

/// Serves jobs from `queue` in `sessions.len()` slots until shutdown, or until every sender is
/// gone and nothing runs; a request running alone drafts with `speculation` when there is one
/// (the engine checked with [`Engine::check_can_draft`]).
pub fn run(
    mut engine: Engine,
    sessions: Vec<Session>,
    queue: Receiver<Job>,
    shared: &Shared,
    mut speculation: Option<Speculation>,
) {
    let mut slots: Vec<Slot> = sessions
        .into_iter()
        .map(|session| Slot {
            session,
            running: None,
        })
        .collect();
    let mut order = Vec::with_capacity(slots.len());
    let mut tokens = Vec::with_capacity(slots.len());
    loop {
        if shared.shutdown.load(Ordering::Relaxed) {
            shut_down(&mut slots, &queue, shared);
            return;
        }
        // Take requests into free slots: wait for one only when nothing runs.
        let mut gone = false;
        while slots.iter().any(|s| s.running.is_none()) {
            let idle = slots.iter().all(|s| s.running.is_none());
            let job = if idle {
                match queue.recv_timeout(IDLE_POLL) {
                    Ok(job) => job,
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => {
                        gone = true;
                        break;
                    }
                }
            } else {
                match queue.try_recv() {
                    Ok(job) => job,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        gone = true;
                        break;
                    }
                }
            };
            admit(&mut engine, &mut slots, job, shared, speculation.is_some());
        }
        if slots.iter().all(|s| s.running.is_none()) {
            if gone {
                return;
            }
            continue;
        }
        match speculation.as_mut() {
            Some(speculation) if running(&slots).count() == 1 => {
                step_alone(&mut engine, &mut slots, speculation, shared)
            }
            _ => step(&mut engine, &mut slots, &mut order, &mut tokens, shared),
        }
    }
}

/// On SIGTERM / Ctrl-C: running generations end with a 503 error, queued requests get one.
fn shut_down(slots: &mut [Slot], queue: &Receiver<Job>, shared: &Shared) {
    for slot in slots {
        if let Some(r) = slot.running.take() {
            shared.metrics.cancelled.inc();
            shared.metrics.running.dec();
            let _ = r.events.send(Event::Failed(ApiError::unavailable(
                "the server is shutting down: this generation was cut short",
            )));
        }
    }
    while let Ok(job) = queue.try_recv() {
        shared.metrics.queued.dec();
        let _ = job.events.send(Event::Failed(ApiError::unavailable(
            "the server is shutting down",
        )));
    }
}

/// Tokens at the start of `prompt` that `session` holds.
fn common_prefix(session: &Session, prompt: &[u32]) -> usize {
    session
        .tokens()
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count()
}

/// Takes `job` into a free slot (the one holding most of its prompt), evaluates its prompt
/// and hands out its first token. `drafting`: the server drafts (`--draft`).
fn admit(engine: &mut Engine, slots: &mut [Slot], job: Job, shared: &Shared, drafting: bool) {
    shared.metrics.queued.dec();
    if job.events.is_closed() {
        // Its client left while it waited.
        shared.metrics.cancelled.inc();
        return;
    }
    shared
        .metrics
        .queue_time
        .observe(job.received.elapsed().as_secs_f64());
    if shared.forget.swap(false, Ordering::SeqCst) {
        for s in slots.iter_mut().filter(|s| s.running.is_none()) {
            s.session.clear();
        }
    }
    let Some(slot) = slots
        .iter_mut()
        .filter(|s| s.running.is_none())
        .max_by_key(|s| common_prefix(&s.session, &job.prompt))
    else {
        unreachable!("a job is taken only into a free slot");
    };
    shared.metrics.running.inc();
    let cache_at_start = cache_counters(engine);
    let reuse = conductor::reuse_prefix(&mut slot.session, &job.prompt);
    shared.metrics.prompt_tokens_cached.inc_by(reuse as u64);
    shared.metrics.prompt_tokens.inc_by(job.prompt.len() as u64);
    let drawn = Rc::new(RefCell::new(VecDeque::new()));
    let hook = RequestHook {
        matcher: job.matcher,
        tokenizer: shared.tokenizer.clone(),
        logprobs: job.logprobs,
        drawn: drawn.clone(),
    };
    let started = engine.start_generation(
        &mut slot.session,
        &job.prompt[reuse..],
        &job.options,
        Some(Box::new(hook)),
    );
    let generation = match started {
        Ok(g) => g,
        Err(e) => {
            // The session may hold half a step: the next request starts afresh.
            slot.session.clear();
            shared.metrics.running.dec();
            let _ = job
                .events
                .send(Event::Failed(ApiError::internal(format!("{e:#}"))));
            return;
        }
    };
    slot.running = Some(Running {
        generation,
        drawn,
        stops: StopMatcher::new(job.stops),
        events: job.events,
        received: job.received,
        prompt_len: job.prompt.len(),
        first_at: None,
        cache_at_start,
        drafting,
    });
    hand_out(engine, slot, shared);
}

/// The slots whose request waits for a step.
fn running(slots: &[Slot]) -> impl Iterator<Item = usize> + '_ {
    slots.iter().enumerate().filter_map(|(i, s)| {
        s.running
            .as_ref()
            .and_then(|r| r.generation.pending())
            .map(|_| i)
    })
}

/// The one running request's next step, with drafted tokens when the drafter has some; then
/// its text handed out.
fn step_alone(
    engine: &mut Engine,
    slots: &mut [Slot],
    speculation: &mut Speculation,
    shared: &Shared,
) {
    let Some(i) = running(slots).next() else {
        return;
    };
    let slot = &mut slots[i];
    let r = slot.running.as_mut().expect("a running slot");
    let result = engine.step_generation(&mut slot.session, &mut r.generation, Some(speculation));
    shared.metrics.decode_steps.inc();
    shared.metrics.decode_sequences.inc();
    match result {
        Ok(()) => hand_out(engine, slot, shared),
        Err(e) => fail(slot, ApiError::internal(format!("{e:#}")), shared),
    }
}

/// One decode step over every running request: each one's next token in one multi-sequence
/// step, then its text handed out.
fn step(
    engine: &mut Engine,
    slots: &mut [Slot],
    order: &mut Vec<usize>,
    tokens: &mut Vec<u32>,
    shared: &Shared,
) {
    order.clear();
    tokens.clear();
    for i in running(slots) {
        order.push(i);
        tokens.extend(
            slots[i]
                .running
                .as_ref()
                .and_then(|r| r.generation.pending()),
        );
    }
    if order.is_empty() {
        return;
    }
    let t0 = Instant::now();
    let mut sessions: Vec<&mut Session> = slots
        .iter_mut()
        .filter(|s| {
            s.running
                .as_ref()
                .is_some_and(|r| r.generation.pending().is_some())
        })
        .map(|s| &mut s.session)
        .collect();
    let result = engine.step_sequences(&mut sessions, tokens);
    drop(sessions);
    shared.metrics.decode_steps.inc();
    shared.metrics.decode_sequences.inc_by(order.len() as u64);
    let logits = match result {
        Ok(logits) => logits,
        Err(e) => {
            // The step failed for every sequence in it: each request fails and its slot
            // starts afresh.
            let why = format!("{e:#}");
            for &i in order.iter() {
                fail(&mut slots[i], ApiError::internal(why.clone()), shared);
            }
            return;
        }
    };
    let took = t0.elapsed() / order.len() as u32;
    let n_vocab = logits.len() / order.len();
    let mut failed = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        let r = slots[i].running.as_mut().expect("a running slot");
        let row = &logits[k * n_vocab..(k + 1) * n_vocab];
        if let Err(e) = r.generation.evaluated(row, took) {
            failed.push((i, format!("{e:#}")));
        }
    }
    for (i, why) in failed {
        fail(&mut slots[i], ApiError::internal(why), shared);
    }
    for &i in order.iter() {
        if slots[i].running.is_some() {
            hand_out(engine, &mut slots[i], shared);
        }
    }
}

/// Ends the slot's request with `error`; the slot starts afresh.
fn fail(slot: &mut Slot, error: ApiError, shared: &Shared) {
    slot.session.clear();
    if let Some(r) = slot.running.take() {
        shared.metrics.running.dec();
        let _ = r.events.send(Event::Failed(error));
    }
}

/// Sends the slot's pieces of text until its generation waits for a step, or ends it.
fn hand_out(engine: &Engine, slot: &mut Slot, shared: &Shared) {
    let r = slot.running.as_mut().expect("a running slot");
    let end = loop {
        if r.generation.pending().is_some() {
            return;
        }
        let Some(piece) = r.generation.piece(&shared.tokenizer) else {
            break End::Finished;
        };
        if r.first_at.is_none() {
            r.first_at = Some(Instant::now());
            shared
                .metrics
                .time_to_first_token
                .observe(r.received.elapsed().as_secs_f64());
        }
        let logprobs = match piece.token {
            Some(_) => r.drawn.borrow_mut().pop_front().into_iter().collect(),
            None => Vec::new(),
        };
        let released = r.stops.push(&piece.text);
        let sent = (released.text.is_empty() && logprobs.is_empty())
            || r.events
                .send(Event::Text {
                    text: released.text,
                    logprobs,
                })
                .is_ok();
        if released.stopped {
            break End::StopText;
        }
        if !sent || r.events.is_closed() {
            break End::ClientLeft;
        }
    };
    let r = slot.running.take().expect("a running slot");
    finish(engine, r, end, shared);
}

/// A request leaves its slot: its last text and `Done` (or nothing, its client gone).
fn finish(engine: &Engine, mut r: Running, end: End, shared: &Shared) {
    shared.metrics.running.dec();
    let stats = r.generation.into_stats();
    shared
        .metrics
        .completion_tokens
        .inc_by(stats.generated.len() as u64);
    shared.metrics.draft_steps.inc_by(stats.draft_steps as u64);
    shared.metrics.drafted_tokens.inc_by(stats.drafted as u64);
    shared
        .metrics
        .draft_accepted_tokens
        .inc_by(stats.draft_accepted as u64);
    if let Some(report) = engine.cache_report() {
        shared.metrics.record_cache(&report);
    }
    let finish_reason = match end {
        End::ClientLeft => {
            shared.metrics.cancelled.inc();
            return;
        }
        End::StopText => "stop",
        End::Finished => {
            let rest = r.stops.finish();
            if !rest.is_empty() {
                let _ = r.events.send(Event::Text {
                    text: rest,
                    logprobs: Vec::new(),
                });
            }
            match stats.stop {
                StopReason::Length => "length",
                _ => "stop",
            }
        }
    };
    let generated = stats.generated.len();
    let mut timings = timings(
        r.received,
        r.first_at,
        r.cache_at_start.zip(cache_counters(engine)),
        generated,
    );
    if r.drafting {
        timings.draft = Some(draft_timings(&stats));
    }
    let _ = r.events.send(Event::Done {
        finish_reason,
        usage: Usage::new(r.prompt_len, generated),
        timings,
    });
}

/// The figures of an answer of `generated` tokens ending now: it arrived at `received`, its
/// first token went out at `first_at`, and `cache` holds the neuron cache's counters at its
/// admission and now.
fn timings(
    received: Instant,
    first_at: Option<Instant>,
    cache: Option<(CacheCounters, CacheCounters)>,
    generated: usize,
) -> Timings {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let first_at = first_at.unwrap_or_else(Instant::now);
    let generation_ms = ms(first_at.elapsed());
    let tokens_per_second = if generated > 1 && generation_ms > 0.0 {
        (generated - 1) as f64 * 1000.0 / generation_ms
    } else {
        0.0
    };
    let neuron_cache = cache.map(|(start, now)| {
        let hits = now.hits.saturating_sub(start.hits);
        let misses = now.misses.saturating_sub(start.misses);
        let bytes_read = now.bytes_read.saturating_sub(start.bytes_read);
        let looked_up = hits + misses;
        CacheTimings {
            hits,
            misses,
            hit_rate: if looked_up == 0 {
                0.0
            } else {
                hits as f64 / looked_up as f64
            },
            bytes_read,
            bytes_read_per_token: bytes_read as f64 / generated.max(1) as f64,
        }
    });
    Timings {
        time_to_first_token_ms: ms(first_at.duration_since(received)),
        generation_ms,
        generated_tokens: generated,
        tokens_per_second,
        neuron_cache,
        draft: None,
    }
}

/// Speculative decoding's figures for an answer.
fn draft_timings(stats: &GenerationStats) -> DraftTimings {
    DraftTimings {
        steps: stats.draft_steps,
        drafted: stats.drafted,
        accepted: stats.draft_accepted,
        acceptance_rate: stats.draft_acceptance(),
        mean_accepted_per_step: stats.draft_accepted_per_step(),
    }
}

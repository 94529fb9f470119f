//! The engine's thread and its queue. Requests wait in a bounded queue; the worker takes them
//! one at a time and runs each through [`Engine::stream_with`] (the loop `conductor run` uses),
//! sending text back as it comes. One engine computes one sequence at a time: this is not
//! continuous batching (docs/serve.md).
//!
//! The worker keeps one session: a request whose prompt begins with tokens the session already
//! holds (a conversation's next turn) evaluates only the rest.

use super::api::{TokenLogprob, Usage};
use super::error::ApiError;
use super::hook::RequestHook;
use super::metrics::Metrics;
use super::stop::StopMatcher;
use crate::{Engine, GenerateOptions, StopReason};
use conductor_runtime::exec::Session;
use conductor_runtime::tokenizer::Tokenizer;
use llguidance::Matcher;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
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
    },
    Failed(ApiError),
}

/// Everything the worker shares with the HTTP side.
pub struct Shared {
    pub metrics: Metrics,
    /// Set on SIGTERM / Ctrl-C: the running job is cancelled, queued ones are refused.
    pub shutdown: AtomicBool,
    pub tokenizer: Arc<Tokenizer>,
}

/// How often an idle worker looks at the shutdown flag.
const IDLE_POLL: Duration = Duration::from_millis(100);

/// Serves jobs from `queue` until shutdown, or until every sender is gone.
pub fn run(mut engine: Engine, mut session: Session, queue: Receiver<Job>, shared: &Shared) {
    loop {
        if shared.shutdown.load(Ordering::Relaxed) {
            // Refuse what is still queued.
            while let Ok(job) = queue.try_recv() {
                shared.metrics.queued.dec();
                let _ = job.events.send(Event::Failed(ApiError::unavailable(
                    "the server is shutting down",
                )));
            }
            return;
        }
        let job = match queue.recv_timeout(IDLE_POLL) {
            Ok(job) => job,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        shared.metrics.queued.dec();
        if job.events.is_closed() {
            // Its client left while it waited.
            shared.metrics.cancelled.inc();
            continue;
        }
        shared
            .metrics
            .queue_time
            .observe(job.received.elapsed().as_secs_f64());
        shared.metrics.running.inc();
        let events = job.events.clone();
        match serve_one(&mut engine, &mut session, job, shared) {
            Ok(Some(done)) => {
                let _ = events.send(done);
            }
            Ok(None) => shared.metrics.cancelled.inc(),
            Err(e) => {
                // The session may hold half a step: start the next request afresh.
                session.clear();
                let _ = events.send(Event::Failed(e));
            }
        }
        shared.metrics.running.dec();
        if let Some(report) = engine.cache_report() {
            shared.metrics.record_cache(&report);
        }
    }
}

/// Why a generation loop ended.
#[derive(Clone, Copy)]
enum End {
    /// The engine stopped: end of generation or `max_tokens`.
    Finished,
    /// A stop sequence appeared.
    StopText,
    ClientLeft,
    ShuttingDown,
}

/// Generates for `job`; `None` when its client left.
fn serve_one(
    engine: &mut Engine,
    session: &mut Session,
    job: Job,
    shared: &Shared,
) -> Result<Option<Event>, ApiError> {
    let reuse = crate::reuse_prefix(session, &job.prompt);
    shared.metrics.prompt_tokens_cached.inc_by(reuse as u64);
    shared.metrics.prompt_tokens.inc_by(job.prompt.len() as u64);
    let drawn = Rc::new(RefCell::new(VecDeque::new()));
    let mut hook = RequestHook {
        matcher: job.matcher,
        tokenizer: shared.tokenizer.clone(),
        logprobs: job.logprobs,
        drawn: drawn.clone(),
    };
    let mut stops = StopMatcher::new(job.stops);
    let mut first = true;
    let mut end = End::Finished;
    let mut stream = engine
        .stream_with(session, &job.prompt[reuse..], &job.options, Some(&mut hook))
        .map_err(|e| ApiError::internal(format!("{e:#}")))?;
    for piece in stream.by_ref() {
        let piece = piece.map_err(|e| ApiError::internal(format!("{e:#}")))?;
        if first {
            first = false;
            shared
                .metrics
                .time_to_first_token
                .observe(job.received.elapsed().as_secs_f64());
        }
        let logprobs = match piece.token {
            Some(_) => drawn.borrow_mut().pop_front().into_iter().collect(),
            None => Vec::new(),
        };
        let released = stops.push(&piece.text);
        let sent = (released.text.is_empty() && logprobs.is_empty())
            || job
                .events
                .send(Event::Text {
                    text: released.text,
                    logprobs,
                })
                .is_ok();
        if released.stopped {
            end = End::StopText;
            break;
        }
        if !sent || job.events.is_closed() {
            end = End::ClientLeft;
            break;
        }
        if shared.shutdown.load(Ordering::Relaxed) {
            end = End::ShuttingDown;
            break;
        }
    }
    let stats = stream.into_stats();
    shared
        .metrics
        .completion_tokens
        .inc_by(stats.generated.len() as u64);
    let finish_reason = match (end, stats.stop) {
        (End::ClientLeft, _) | (_, StopReason::Cancelled) => return Ok(None),
        (End::ShuttingDown, _) => {
            shared.metrics.cancelled.inc();
            return Err(ApiError::unavailable(
                "the server is shutting down: this generation was cut short",
            ));
        }
        (End::StopText, _) => "stop",
        (End::Finished, stop) => {
            let rest = stops.finish();
            if !rest.is_empty() {
                let _ = job.events.send(Event::Text {
                    text: rest,
                    logprobs: Vec::new(),
                });
            }
            match stop {
                StopReason::Length => "length",
                _ => "stop",
            }
        }
    };
    Ok(Some(Event::Done {
        finish_reason,
        usage: Usage::new(job.prompt.len(), stats.generated.len()),
    }))
}

//! The endpoints, the router around them and the listener with its graceful shutdown.

use super::api::{
    ChatChoice, ChatChunk, ChatLogprobs, ChatRequest, ChunkChoice, CompletionChoice,
    CompletionLogprobs, CompletionRequest, CompletionResponse, Delta, DeltaFunctionCall,
    DeltaToolCall, ModelEntry, ModelList, PromptInput, ResponseFormat, ResponseFunctionCall,
    ResponseMessage, ResponseToolCall, SamplingFields, Timings, TokenLogprob, Usage,
};
use super::error::ApiError;
use super::request::{self, MAX_TOP_LOGPROBS};
use super::worker::{Event, Job};
use super::{limits, page, tools, AppState, ServeOptions};
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::sse::{self, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::TrySendError;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::UnboundedReceiverStream;

type Shared = State<Arc<AppState>>;

/// The legacy completions API lists at most this many alternatives per token.
const MAX_LEGACY_LOGPROBS: u32 = 5;

pub fn router(state: Arc<AppState>, max_body: usize) -> Router {
    let keyed = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/props", get(props))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            limits::require_key,
        ));
    Router::new()
        .merge(keyed)
        .route("/health", get(health))
        // The page's files are public; the calls it makes are keyed (page/mod.rs).
        .route("/", get(page::index))
        .route("/page/{name}", get(page::asset))
        .fallback(|| async { ApiError::not_found("this endpoint") })
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .with_state(state)
}

/// Binds, serves until a signal, then gives open connections `shutdown_grace` to finish.
pub async fn listen(
    state: Arc<AppState>,
    options: &ServeOptions,
    on_listening: impl FnOnce(SocketAddr),
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind((options.host.as_str(), options.port))
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}:{}: {e}", options.host, options.port))?;
    on_listening(listener.local_addr()?);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let shared = state.shared.clone();
    tokio::spawn(async move {
        signal().await;
        eprintln!("serve: shutting down: running requests are cancelled, queued ones refused");
        shared.shutdown.store(true, Ordering::Relaxed);
        let _ = stop_tx.send(true);
    });
    let mut graceful = stop_rx.clone();
    let server =
        axum::serve(listener, router(state, options.max_body)).with_graceful_shutdown(async move {
            let _ = graceful.wait_for(|stop| *stop).await;
        });
    let mut deadline = stop_rx;
    let grace = options.shutdown_grace;
    tokio::select! {
        served = std::future::IntoFuture::into_future(server) => served?,
        _ = async move {
            let _ = deadline.wait_for(|stop| *stop).await;
            tokio::time::sleep(grace).await;
        } => eprintln!("serve: connections still open after {grace:?}; closing them"),
    }
    Ok(())
}

/// SIGTERM or Ctrl-C.
async fn signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Counts every answer by endpoint and status.
async fn count(State(state): Shared, request: Request, next: Next) -> Response {
    let endpoint = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "other".to_string(), |p| p.as_str().to_string());
    let response = next.run(request).await;
    state
        .shared
        .metrics
        .requests
        .with_label_values(&[endpoint.as_str(), response.status().as_str()])
        .inc();
    response
}

async fn health(State(state): Shared) -> Response {
    if state.shared.shutdown.load(Ordering::Relaxed) {
        return ApiError::unavailable("the server is shutting down").into_response();
    }
    Json(serde_json::json!({"status": "ok"})).into_response()
}

pub(super) async fn metrics(State(state): Shared) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.shared.metrics.render(),
    )
        .into_response()
}

pub(super) async fn props(State(state): Shared) -> Json<super::api::Props> {
    Json(state.props.clone())
}

async fn models(State(state): Shared) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![ModelEntry {
            id: state.model.clone(),
            object: "model",
            created: state.created,
            owned_by: "conductor",
        }],
    })
}

fn next_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn unix_now() -> u64 {
    super::unix_now()
}

/// Puts `job` in line for the engine: 429 when the line is full, 503 while shutting down.
fn submit(state: &AppState, job: Job) -> Result<(), ApiError> {
    if state.shared.shutdown.load(Ordering::Relaxed) {
        return Err(ApiError::unavailable("the server is shutting down"));
    }
    let metrics = &state.shared.metrics;
    metrics.queued.inc();
    match state.queue.try_send(job) {
        Ok(()) => Ok(()),
        Err(TrySendError::Full(_)) => {
            metrics.queued.dec();
            metrics.rejected.inc();
            Err(ApiError::busy(state.queue_size))
        }
        Err(TrySendError::Disconnected(_)) => {
            metrics.queued.dec();
            Err(ApiError::unavailable("the engine has stopped"))
        }
    }
}

/// Runs `work` (template rendering, tokenizing, compiling a schema: CPU work that grows with
/// the request) on tokio's blocking threads, so that a large request does not stall the
/// threads every connection shares.
async fn blocking<T: Send + 'static>(
    state: &Arc<AppState>,
    work: impl FnOnce(&AppState) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let state = state.clone();
    tokio::task::spawn_blocking(move || work(&state))
        .await
        .map_err(|e| ApiError::internal(format!("preparing the request failed: {e}")))?
}

/// A queued job's events, and how its client wants them.
struct Queued {
    events: UnboundedReceiver<Event>,
    stream: bool,
    include_usage: bool,
}

/// Makes the job for `prompt` and puts it in line.
fn enqueue(
    state: &AppState,
    prompt: Vec<u32>,
    sampling: SamplingFields,
    logprobs: Option<usize>,
    matcher: Option<llguidance::Matcher>,
    received: Instant,
) -> Result<Queued, ApiError> {
    let stream = sampling.stream.unwrap_or(false);
    let include_usage = sampling
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    let (job, events) = request::job(state, prompt, sampling, logprobs, matcher, received)?;
    submit(state, job)?;
    Ok(Queued {
        events,
        stream,
        include_usage,
    })
}

/// What a finished non-streamed request produced.
struct Collected {
    text: String,
    logprobs: Vec<TokenLogprob>,
    finish_reason: &'static str,
    usage: Usage,
    timings: Timings,
}

async fn collect(mut events: UnboundedReceiver<Event>) -> Result<Collected, ApiError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    while let Some(event) = events.recv().await {
        match event {
            Event::Text {
                text: t,
                logprobs: l,
            } => {
                text.push_str(&t);
                logprobs.extend(l);
            }
            Event::Done {
                finish_reason,
                usage,
                timings,
            } => {
                return Ok(Collected {
                    text,
                    logprobs,
                    finish_reason,
                    usage,
                    timings,
                })
            }
            Event::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::unavailable(
        "the engine stopped before finishing this request",
    ))
}

fn data(value: &impl serde::Serialize) -> sse::Event {
    sse::Event::default().data(serde_json::to_string(value).unwrap_or_default())
}

/// An SSE response: `head` first, then each worker event through `to_events`, ending with
/// `data: [DONE]` (or an error object) as OpenAI's streams do.
fn event_stream(
    head: Option<sse::Event>,
    events: UnboundedReceiver<Event>,
    mut to_events: impl FnMut(Event) -> Vec<sse::Event> + Send + 'static,
) -> Response {
    let body = futures_util::stream::iter(head)
        .chain(
            UnboundedReceiverStream::new(events)
                .flat_map(move |event| futures_util::stream::iter(to_events(event))),
        )
        .map(Ok::<_, Infallible>);
    Sse::new(body)
        .keep_alive(sse::KeepAlive::default())
        .into_response()
}

pub(super) async fn chat(
    State(state): Shared,
    body: Result<Json<ChatRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let received = Instant::now();
    let Json(req) = body?;
    let logprobs = request::logprobs_wanted(
        req.logprobs.unwrap_or(false),
        req.top_logprobs,
        "top_logprobs",
        MAX_TOP_LOGPROBS,
    )?;
    let (req, prompt, matcher, offer) = blocking(&state, move |state| {
        let messages = request::chat_messages(&req)?;
        let offer = tools::offer(
            req.tools.as_deref(),
            req.tool_choice.as_ref(),
            req.parallel_tool_calls,
            &state.tool_syntax,
        )?;
        let format = req
            .response_format
            .as_ref()
            .filter(|f| !matches!(f, ResponseFormat::Text));
        if offer.is_some() && format.is_some() {
            return Err(ApiError::invalid_param(
                "response_format",
                "response_format cannot be combined with tools (give tool_choice: \"none\" to answer in JSON)",
            ));
        }
        let text = request::render(
            &state.template,
            &messages,
            offer.as_ref().map(|o| o.rendered.as_slice()),
        )?;
        let prompt = state.tokenizer.encode(&text, true, true);
        let grammar = offer.as_ref().and_then(|o| o.grammar(&state.tokenizer));
        let matcher = match (grammar, format) {
            (None, None) => None,
            (grammar, format) => match state.constraints() {
                Ok(c) => match grammar {
                    Some(grammar) => Some(c.compile_lark(grammar)?),
                    None => format.map(|f| c.compile(f)).transpose()?.flatten(),
                },
                Err(why) => {
                    let param = if format.is_some() { "response_format" } else { "tool_choice" };
                    return Err(ApiError::invalid_param(
                        param,
                        format!("constrained output is unavailable: {why}"),
                    ));
                }
            },
        };
        Ok((req, prompt, matcher, offer))
    })
    .await?;
    let Queued {
        events,
        stream,
        include_usage,
    } = enqueue(&state, prompt, req.sampling, logprobs, matcher, received)?;
    let id = next_id("chatcmpl");
    let created = unix_now();
    let model = state.model.clone();
    if !stream {
        let done = collect(events).await?;
        let parsed = offer
            .as_ref()
            .and_then(|o| Some((o.syntax, o.parse(&done.text)?)));
        let (message, finish_reason) = match parsed {
            Some((syntax, parsed)) => (
                ResponseMessage {
                    role: "assistant",
                    content: parsed.content,
                    tool_calls: Some(
                        parsed
                            .calls
                            .into_iter()
                            .map(|c| ResponseToolCall {
                                id: tools::call_id(syntax),
                                kind: "function",
                                function: ResponseFunctionCall {
                                    name: c.name,
                                    arguments: c.arguments,
                                },
                            })
                            .collect(),
                    ),
                },
                tool_calls_finish(done.finish_reason),
            ),
            None => (
                ResponseMessage {
                    role: "assistant",
                    content: Some(done.text),
                    tool_calls: None,
                },
                done.finish_reason,
            ),
        };
        return Ok(Json(super::api::ChatResponse {
            id,
            object: "chat.completion",
            created,
            model,
            choices: vec![ChatChoice {
                index: 0,
                message,
                logprobs: logprobs.map(|_| ChatLogprobs {
                    content: done.logprobs,
                }),
                finish_reason,
            }],
            usage: done.usage,
            timings: done.timings,
        })
        .into_response());
    }
    let chunk = move |delta: Delta,
                      logprobs: Option<ChatLogprobs>,
                      finish_reason: Option<&'static str>,
                      usage: Option<Usage>,
                      timings: Option<Timings>| ChatChunk {
        id: id.clone(),
        object: "chat.completion.chunk",
        created,
        model: model.clone(),
        choices: if usage.is_some() {
            Vec::new()
        } else {
            vec![ChunkChoice {
                index: 0,
                delta,
                logprobs,
                finish_reason,
            }]
        },
        usage,
        timings,
    };
    let head = data(&chunk(
        Delta {
            role: Some("assistant"),
            content: Some(String::new()),
            tool_calls: None,
        },
        None,
        None,
        None,
        None,
    ));
    let content = |text: String| Delta {
        content: Some(text),
        ..Delta::default()
    };
    // With tools offered, content goes out as it comes and what may be a call is held until
    // the end (with its log-probabilities), then sent as `tool_calls` deltas.
    let mut split = offer.as_ref().map(|o| tools::StreamSplit::new(o.syntax));
    let mut held: Vec<TokenLogprob> = Vec::new();
    Ok(event_stream(Some(head), events, move |event| match event {
        Event::Text { text, logprobs: l } => match &mut split {
            None => vec![data(&chunk(
                content(text),
                logprobs.map(|_| ChatLogprobs { content: l }),
                None,
                None,
                None,
            ))],
            Some(split) => {
                held.extend(l);
                let text = split.push(&text);
                if text.is_empty() {
                    return Vec::new();
                }
                let l = std::mem::take(&mut held);
                vec![data(&chunk(
                    content(text),
                    logprobs.map(|_| ChatLogprobs { content: l }),
                    None,
                    None,
                    None,
                ))]
            }
        },
        Event::Done {
            mut finish_reason,
            usage,
            timings,
        } => {
            let mut out = Vec::new();
            if let (Some(split), Some(offer)) = (split.take(), &offer) {
                let (rest, calls) = split.finish(offer);
                let mut deltas: Vec<Delta> = rest.map(content).into_iter().collect();
                for (index, call) in calls.into_iter().enumerate() {
                    finish_reason = tool_calls_finish(finish_reason);
                    let index = index as u32;
                    deltas.push(Delta {
                        tool_calls: Some(vec![DeltaToolCall {
                            index,
                            id: Some(tools::call_id(offer.syntax)),
                            kind: Some("function"),
                            function: DeltaFunctionCall {
                                name: Some(call.name),
                                arguments: String::new(),
                            },
                        }]),
                        ..Delta::default()
                    });
                    deltas.push(Delta {
                        tool_calls: Some(vec![DeltaToolCall {
                            index,
                            id: None,
                            kind: None,
                            function: DeltaFunctionCall {
                                name: None,
                                arguments: call.arguments,
                            },
                        }]),
                        ..Delta::default()
                    });
                }
                for delta in deltas {
                    let l = std::mem::take(&mut held);
                    let lp = logprobs
                        .filter(|_| !l.is_empty())
                        .map(|_| ChatLogprobs { content: l });
                    out.push(data(&chunk(delta, lp, None, None, None)));
                }
            }
            out.push(data(&chunk(
                Delta::default(),
                None,
                Some(finish_reason),
                None,
                Some(timings),
            )));
            if include_usage {
                out.push(data(&chunk(
                    Delta::default(),
                    None,
                    None,
                    Some(usage),
                    None,
                )));
            }
            out.push(sse::Event::default().data("[DONE]"));
            out
        }
        Event::Failed(e) => vec![data(&e.body())],
    }))
}

/// The finish reason of an answer with tool calls: `tool_calls`, unless `max_tokens` cut it
/// (`length`: its last call may be lost).
fn tool_calls_finish(generated: &'static str) -> &'static str {
    match generated {
        "length" => "length",
        _ => "tool_calls",
    }
}

/// The legacy API's log-probabilities of `entries`, whose texts start at `offset`.
fn legacy_logprobs(entries: Vec<TokenLogprob>, mut offset: usize) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for e in entries {
        out.text_offset.push(offset);
        offset += e.token.len();
        out.token_logprobs.push(e.logprob);
        out.top_logprobs.push(
            e.top_logprobs
                .unwrap_or_default()
                .into_iter()
                .map(|t| (t.token, serde_json::Value::from(t.logprob)))
                .collect(),
        );
        out.tokens.push(e.token);
    }
    out
}

pub(super) async fn completions(
    State(state): Shared,
    body: Result<Json<CompletionRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let received = Instant::now();
    let Json(req) = body?;
    let text = match req.prompt {
        PromptInput::Text(t) => t,
        PromptInput::Texts(mut v) if v.len() == 1 => v.remove(0),
        PromptInput::Texts(_) => {
            return Err(ApiError::invalid_param(
                "prompt",
                "give one prompt: this server completes one per request",
            ))
        }
    };
    if req.echo == Some(true) {
        return Err(ApiError::invalid_param("echo", "echo is not supported"));
    }
    let prompt = blocking(&state, move |state| {
        Ok(state.tokenizer.encode(&text, true, true))
    })
    .await?;
    let logprobs = request::logprobs_wanted(
        req.logprobs.is_some(),
        req.logprobs,
        "logprobs",
        MAX_LEGACY_LOGPROBS,
    )?;
    let Queued {
        events,
        stream,
        include_usage,
    } = enqueue(&state, prompt, req.sampling, logprobs, None, received)?;
    let id = next_id("cmpl");
    let created = unix_now();
    let model = state.model.clone();
    let response =
        move |choice: Option<CompletionChoice>, usage: Option<Usage>| CompletionResponse {
            id: id.clone(),
            object: "text_completion",
            created,
            model: model.clone(),
            choices: choice.into_iter().collect(),
            usage,
            timings: None,
        };
    if !stream {
        let done = collect(events).await?;
        let mut answer = response(
            Some(CompletionChoice {
                index: 0,
                text: done.text,
                logprobs: logprobs.map(|_| legacy_logprobs(done.logprobs, 0)),
                finish_reason: Some(done.finish_reason),
            }),
            Some(done.usage),
        );
        answer.timings = Some(done.timings);
        return Ok(Json(answer).into_response());
    }
    let mut offset = 0;
    Ok(event_stream(None, events, move |event| match event {
        Event::Text { text, logprobs: l } => {
            let lp = logprobs.map(|_| legacy_logprobs(l, offset));
            offset += text.len();
            vec![data(&response(
                Some(CompletionChoice {
                    index: 0,
                    text,
                    logprobs: lp,
                    finish_reason: None,
                }),
                None,
            ))]
        }
        Event::Done {
            finish_reason,
            usage,
            ..
        } => {
            let mut out = vec![data(&response(
                Some(CompletionChoice {
                    index: 0,
                    text: String::new(),
                    logprobs: None,
                    finish_reason: Some(finish_reason),
                }),
                None,
            ))];
            if include_usage {
                out.push(data(&response(None, Some(usage))));
            }
            out.push(sse::Event::default().data("[DONE]"));
            out
        }
        Event::Failed(e) => vec![data(&e.body())],
    }))
}

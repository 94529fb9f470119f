//! The server without a socket, for embedders in other languages (the Python package in
//! `python/`): a request in the OpenAI API's JSON goes through the router, the request
//! checks, the chat template, the constrained decoding, the tool-call parsing and the engine's
//! thread that `conductor serve` runs, in this process. Its answer comes back as the server
//! writes it (one JSON body, or the payloads of its event stream one by one), so an embedder
//! gets the server's behaviour without a second implementation of it.

use super::{routes, worker, AppState, ServeOptions};
use axum::body::BodyDataStream;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use conductor::Engine;
use conductor_runtime::tokenizer::Tokenizer;
use futures_util::StreamExt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// An engine served in-process: one slot, requests taken in order.
pub struct Local {
    /// The handlers' state; `None` once closed (its engine's queue with it).
    state: Option<Arc<AppState>>,
    tokenizer: Arc<Tokenizer>,
    n_ctx: usize,
    shared: Arc<worker::Shared>,
    worker: Option<JoinHandle<()>>,
    /// Runs the handlers: each call is driven by the thread that asks for its next piece.
    runtime: Arc<tokio::runtime::Runtime>,
}

impl Local {
    /// Starts the engine's thread. `options.context`, `options.queue` and
    /// `options.chat_template` apply; the rest (address, key, slots) is a listener's.
    pub fn new(
        engine: Engine,
        options: &ServeOptions,
        say: &mut dyn FnMut(&str),
    ) -> anyhow::Result<Local> {
        let options = ServeOptions {
            parallel: 1,
            api_key: None,
            ..options.clone()
        };
        // One worker thread for the timers; the caller's thread polls its own call.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("conductor-local")
            .enable_time()
            .build()?;
        let (state, shared, worker) = super::start(engine, None, &options, true, say)?;
        Ok(Local {
            tokenizer: state.tokenizer.clone(),
            n_ctx: state.n_ctx,
            state: Some(state),
            shared,
            worker: Some(worker),
            runtime: Arc::new(runtime),
        })
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// Tokens a request's prompt and answer may hold together.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// The next request evaluates its whole prompt: the sessions forget what they hold
    /// (llama-cpp-python's `reset`). Answers do not depend on it (docs/serve.md, "Prefix
    /// reuse per slot").
    pub fn forget(&self) {
        self.shared.forget.store(true, Ordering::SeqCst);
    }

    /// Sends `body` (JSON) to the server's handler for `path`: `/v1/chat/completions`,
    /// `/v1/completions`, or `/metrics` and `/props` (no body). Nothing runs until [`Call::next`] is
    /// called; dropping the call cancels its generation at the next token.
    pub fn call(&self, path: &str, body: &[u8]) -> Result<Call, String> {
        let state = self
            .state
            .clone()
            .ok_or("the engine is closed: make a new one")?;
        let future: ResponseFuture = match path {
            "/v1/chat/completions" => {
                let request = Json::from_bytes(body);
                Box::pin(async move { routes::chat(State(state), request).await.into_response() })
            }
            "/v1/completions" => {
                let request = Json::from_bytes(body);
                Box::pin(async move {
                    routes::completions(State(state), request)
                        .await
                        .into_response()
                })
            }
            "/metrics" => Box::pin(async move { routes::metrics(State(state)).await }),
            "/props" => Box::pin(async move { routes::props(State(state)).await.into_response() }),
            _ => return Err(format!("no handler for {path}")),
        };
        Ok(Call {
            runtime: self.runtime.clone(),
            state: CallState::Waiting(future),
            status: None,
            stream: false,
            buffer: Vec::new(),
        })
    }

    /// Stops the engine: a running generation ends with an error, and the engine's thread
    /// (and with it the model) is gone when this returns. Calls made afterwards fail.
    pub fn close(&mut self) {
        self.state = None;
        self.shared.shutdown.store(true, Ordering::SeqCst);
        if let Some(worker) = self.worker.take() {
            // A panic on the engine's thread has been printed already; the engine is gone
            // either way.
            let _ = worker.join();
        }
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        self.close();
    }
}

type ResponseFuture = Pin<Box<dyn Future<Output = Response> + Send>>;

enum CallState {
    /// The handler has not answered yet (a non-streamed answer comes when it is complete).
    Waiting(ResponseFuture),
    Body(BodyDataStream),
    Done,
}

/// One request in flight; see [`Local::call`].
pub struct Call {
    runtime: Arc<tokio::runtime::Runtime>,
    state: CallState,
    status: Option<u16>,
    /// The answer is an event stream (`text/event-stream`), handed out payload by payload.
    stream: bool,
    /// Body bytes not handed out yet.
    buffer: Vec<u8>,
}

/// What [`Call::next`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    /// Nothing yet within the wait: ask again (after checking for an interrupt).
    Waiting,
    /// A whole JSON body, or one event's payload of a stream (without `data: `; `[DONE]`
    /// is not handed out).
    Data(String),
    /// The answer is complete.
    End,
}

impl Call {
    /// The answer's HTTP status, once [`Call::next`] has returned something other than
    /// [`Piece::Waiting`].
    pub fn status(&self) -> Option<u16> {
        self.status
    }

    /// Whether the answer is an event stream.
    pub fn is_stream(&self) -> bool {
        self.stream
    }

    /// Waits at most `wait` for the next piece of the answer. (The timer is made inside the
    /// runtime, which it needs.)
    pub fn next(&mut self, wait: Duration) -> Result<Piece, String> {
        loop {
            if let Some(piece) = self.take_event() {
                return Ok(piece);
            }
            let runtime = self.runtime.clone();
            match &mut self.state {
                CallState::Done => {
                    return Ok(if self.buffer.is_empty() || self.stream {
                        Piece::End
                    } else {
                        let body = std::mem::take(&mut self.buffer);
                        Piece::Data(String::from_utf8_lossy(&body).into_owned())
                    })
                }
                CallState::Waiting(future) => {
                    let Ok(response) =
                        runtime.block_on(async { tokio::time::timeout(wait, future).await })
                    else {
                        return Ok(Piece::Waiting);
                    };
                    self.status = Some(response.status().as_u16());
                    self.stream = response
                        .headers()
                        .get(header::CONTENT_TYPE)
                        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
                    self.state = CallState::Body(response.into_body().into_data_stream());
                }
                CallState::Body(body) => {
                    let Ok(frame) =
                        runtime.block_on(async { tokio::time::timeout(wait, body.next()).await })
                    else {
                        return Ok(Piece::Waiting);
                    };
                    match frame {
                        Some(Ok(bytes)) => self.buffer.extend_from_slice(&bytes),
                        Some(Err(e)) => {
                            self.state = CallState::Done;
                            return Err(format!("reading the answer: {e}"));
                        }
                        None => self.state = CallState::Done,
                    }
                }
            }
        }
    }

    /// The next complete event of a stream in the buffer, if there is one.
    fn take_event(&mut self) -> Option<Piece> {
        if !self.stream {
            return None;
        }
        loop {
            let end = self.buffer.windows(2).position(|w| w == b"\n\n")?;
            let event: Vec<u8> = self.buffer.drain(..end + 2).collect();
            let event = String::from_utf8_lossy(&event);
            // `data:` lines make the payload; comments (`:`, keep-alives) and other fields
            // are not for the caller.
            let data: Vec<&str> = event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if data.is_empty() {
                continue;
            }
            let data = data.join("\n");
            if data == "[DONE]" {
                continue;
            }
            return Some(Piece::Data(data));
        }
    }
}

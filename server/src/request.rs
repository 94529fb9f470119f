//! From an OpenAI request to a [`Job`]: the prompt's tokens, sampling settings, limits checked
//! against the context.

use super::api::{ChatRequest, MessageContent, RequestMessage, SamplingFields};
use super::error::ApiError;
use super::worker::Job;
use super::AppState;
use conductor::GenerateOptions;
use conductor_runtime::sample::SamplingParams;
use conductor_runtime::tokenizer::{ChatMessage, ChatTemplate, FunctionCall, ToolCall};
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The most alternatives a token's log-probabilities list (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// The calls of an assistant message as the template takes them: each call's `arguments` (a
/// JSON text) parsed, as llama.cpp gives them to templates; text that is not JSON stays a
/// string.
fn tool_calls(i: usize, m: &RequestMessage) -> Result<Option<Vec<ToolCall>>, ApiError> {
    let Some(calls) = &m.tool_calls else {
        return Ok(None);
    };
    if m.role != "assistant" {
        return Err(ApiError::invalid_param(
            "messages",
            format!(
                "messages[{i}] has tool_calls but its role is `{}`: only assistant messages make calls",
                m.role
            ),
        ));
    }
    calls
        .iter()
        .enumerate()
        .map(|(j, call)| {
            if let Some(kind) = call.kind.as_deref().filter(|k| *k != "function") {
                return Err(ApiError::invalid_param(
                    "messages",
                    format!("messages[{i}].tool_calls[{j}].type is `{kind}`: only `function` calls are supported"),
                ));
            }
            if call.function.name.is_empty() {
                return Err(ApiError::invalid_param(
                    "messages",
                    format!("messages[{i}].tool_calls[{j}].function.name is empty"),
                ));
            }
            let arguments = match &call.function.arguments {
                None => Value::Object(Default::default()),
                Some(Value::String(text)) => {
                    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.clone()))
                }
                Some(v @ Value::Object(_)) => v.clone(),
                Some(other) => {
                    return Err(ApiError::invalid_param(
                        "messages",
                        format!("messages[{i}].tool_calls[{j}].function.arguments must be a JSON string, not {other}"),
                    ))
                }
            };
            Ok(ToolCall {
                id: call.id.clone(),
                kind: "function".into(),
                function: FunctionCall {
                    name: call.function.name.clone(),
                    arguments,
                },
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The chat's messages as the template takes them; only text content is understood.
pub fn chat_messages(request: &ChatRequest) -> Result<Vec<ChatMessage>, ApiError> {
    if request.messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages is empty: give at least one message",
        ));
    }
    request
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let content = match &m.content {
                None => String::new(),
                Some(MessageContent::Text(t)) => t.clone(),
                Some(MessageContent::Parts(parts)) => {
                    let mut text = String::new();
                    for part in parts {
                        match (part.kind.as_str(), &part.text) {
                            ("text", Some(t)) => text.push_str(t),
                            (kind, _) => {
                                return Err(ApiError::invalid_param(
                                    "messages",
                                    format!("content parts of type `{kind}` are not supported: this server reads text"),
                                ))
                            }
                        }
                    }
                    text
                }
            };
            if m.role == "tool" && m.tool_call_id.is_none() {
                return Err(ApiError::invalid_param(
                    "messages",
                    format!("messages[{i}] (role `tool`) has no tool_call_id: name the call it answers"),
                ));
            }
            Ok(ChatMessage {
                tool_calls: tool_calls(i, m)?,
                tool_call_id: m.tool_call_id.clone(),
                name: m.name.clone(),
                ..ChatMessage::new(m.role.as_str(), content)
            })
        })
        .collect()
}

/// The prompt text of a chat: the template's rendering, opening the assistant's turn, with
/// `tools` when the model is offered some. A template that refuses the messages
/// (`raise_exception`, fuel or output exhausted) is a 400.
pub fn render(
    template: &ChatTemplate,
    messages: &[ChatMessage],
    tools: Option<&[Value]>,
) -> Result<String, ApiError> {
    template
        .apply_with_tools(messages, tools, true)
        .map_err(|e| {
            ApiError::invalid_param(
                "messages",
                format!("the chat template cannot render these messages: {e}"),
            )
            .with_code("template_error")
        })
}

/// A seed for requests that give none: different for every request.
fn fresh_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Sampling settings: llama.cpp's defaults (those of `conductor run`) where the request is
/// silent.
fn sampling(fields: &SamplingFields) -> Result<SamplingParams, ApiError> {
    let d = SamplingParams::default();
    let params = SamplingParams {
        temperature: fields.temperature.unwrap_or(d.temperature),
        top_k: fields.top_k.unwrap_or(d.top_k),
        top_p: fields.top_p.unwrap_or(d.top_p),
        min_p: fields.min_p.unwrap_or(d.min_p),
        repeat_penalty: fields.repeat_penalty.unwrap_or(d.repeat_penalty),
        repeat_last_n: d.repeat_last_n,
        seed: fields.seed.unwrap_or_else(fresh_seed),
    };
    params.validate().map_err(|e| {
        let param = match e.name {
            "temperature" => "temperature",
            "top-p" => "top_p",
            "min-p" => "min_p",
            _ => "repeat_penalty",
        };
        ApiError::invalid_param(param, e.to_string())
    })?;
    Ok(params)
}

/// Checks the fields both endpoints share and makes the job for `prompt` (tokens). The
/// receiver gets the job's events.
pub fn job(
    state: &AppState,
    prompt: Vec<u32>,
    fields: SamplingFields,
    logprobs: Option<usize>,
    matcher: Option<llguidance::Matcher>,
    received: Instant,
) -> Result<
    (
        Job,
        tokio::sync::mpsc::UnboundedReceiver<super::worker::Event>,
    ),
    ApiError,
> {
    if let Some(n) = fields.n {
        if n != 1 {
            return Err(ApiError::invalid_param(
                "n",
                format!("n = {n}: this server generates one choice per request (n = 1)"),
            ));
        }
    }
    let n_ctx = state.n_ctx;
    if prompt.is_empty() {
        return Err(ApiError::invalid_param("prompt", "the prompt is empty"));
    }
    if prompt.len() >= n_ctx {
        return Err(ApiError::invalid(format!(
            "This model's maximum context length is {n_ctx} tokens. However, your prompt is {} tokens long, leaving no room to generate.",
            prompt.len()
        ))
        .with_code("context_length_exceeded"));
    }
    let room = n_ctx - prompt.len();
    let max_tokens = match fields.max_tokens {
        Some(0) => {
            return Err(ApiError::invalid_param(
                "max_tokens",
                "max_tokens must be at least 1",
            ))
        }
        Some(m) if m > room as u64 => {
            return Err(ApiError::invalid_param(
                "max_tokens",
                format!(
                    "This model's maximum context length is {n_ctx} tokens. However, you requested {} tokens ({} in the prompt, {m} for the completion).",
                    prompt.len() as u64 + m,
                    prompt.len()
                ),
            )
            .with_code("context_length_exceeded"))
        }
        Some(m) => m as usize,
        None => room,
    };
    let sampling = sampling(&fields)?;
    let stops = fields.stop.map(|s| s.into_vec()).unwrap_or_default();
    if stops.len() > 4 {
        return Err(ApiError::invalid_param(
            "stop",
            "at most 4 stop sequences are allowed",
        ));
    }
    let (events, receiver) = tokio::sync::mpsc::unbounded_channel();
    Ok((
        Job {
            prompt,
            options: GenerateOptions {
                max_tokens,
                sampling,
                ignore_eos: fields.ignore_eos.unwrap_or(false),
            },
            stops,
            logprobs,
            matcher,
            received,
            events,
        },
        receiver,
    ))
}

/// `top_logprobs` / `logprobs` checked: how many alternatives to list, if log-probabilities
/// are wanted at all.
pub fn logprobs_wanted(
    wanted: bool,
    top: Option<u32>,
    param: &'static str,
    max: u32,
) -> Result<Option<usize>, ApiError> {
    match top {
        Some(n) if n > max => Err(ApiError::invalid_param(
            param,
            format!("{param} = {n}: at most {max}"),
        )),
        Some(_) if !wanted => Err(ApiError::invalid_param(
            param,
            "top_logprobs needs logprobs = true",
        )),
        _ if !wanted => Ok(None),
        top => Ok(Some(top.unwrap_or(0) as usize)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn a_template_that_refuses_the_messages_is_a_400() {
        let template = ChatTemplate::new(
            "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}{{ m.content }}{% endfor %}",
        )
        .unwrap();
        let ok = [ChatMessage::new("user", "hi")];
        assert_eq!(render(&template, &ok, None).unwrap(), "hi");
        let e = render(&template, &[ChatMessage::new("tool", "x")], None).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            (e.param, e.code),
            (Some("messages"), Some("template_error"))
        );
        assert!(e.message.contains("no tools here"), "{}", e.message);
    }

    #[test]
    fn top_logprobs_needs_logprobs_and_a_bound() {
        assert_eq!(logprobs_wanted(false, None, "top_logprobs", 20), Ok(None));
        assert_eq!(logprobs_wanted(true, None, "top_logprobs", 20), Ok(Some(0)));
        assert_eq!(
            logprobs_wanted(true, Some(3), "top_logprobs", 20),
            Ok(Some(3))
        );
        assert!(logprobs_wanted(false, Some(3), "top_logprobs", 20).is_err());
        assert!(logprobs_wanted(true, Some(21), "top_logprobs", 20).is_err());
    }
}

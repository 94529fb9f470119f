//! The OpenAI wire types this server reads and writes (the subset it implements).
//!
//! Requests ignore fields they do not know (clients send many), but a known field of the
//! wrong type is a 400. Responses are built from these structs only, so every endpoint writes
//! the same shapes.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One message of a chat request. `content` may be a string or a list of text parts (or
/// null, in an assistant message that made tool calls).
#[derive(Deserialize, Debug)]
pub struct RequestMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// An assistant message's calls.
    #[serde(default)]
    pub tool_calls: Option<Vec<RequestToolCall>>,
    /// A `tool` message: the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

/// A call in an assistant message: `{"id", "type": "function", "function": {"name",
/// "arguments"}}`, `arguments` a JSON text (an object is taken too).
#[derive(Deserialize, Debug)]
pub struct RequestToolCall {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub function: RequestFunctionCall,
}

#[derive(Deserialize, Debug)]
pub struct RequestFunctionCall {
    pub name: String,
    #[serde(default)]
    pub arguments: Option<Value>,
}

/// One of `tools`: `{"type": "function", "function": {"name", "description", "parameters"}}`.
#[derive(Deserialize, Debug)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDefinition,
}

#[derive(Deserialize, Debug)]
pub struct FunctionDefinition {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<Value>,
}

/// `tool_choice`: `"none"`, `"auto"`, `"required"` or `{"type": "function", "function":
/// {"name"}}`.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(String),
    Named(NamedToolChoice),
}

#[derive(Deserialize, Debug)]
pub struct NamedToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionName,
}

#[derive(Deserialize, Debug)]
pub struct FunctionName {
    pub name: String,
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize, Debug)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// `stop`: one string or a list of them.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// `response_format`.
#[derive(Deserialize, Debug)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

#[derive(Deserialize, Debug)]
pub struct JsonSchemaFormat {
    #[serde(default)]
    pub schema: Option<Value>,
}

/// The sampling fields both completion endpoints share.
#[derive(Deserialize, Debug, Default)]
pub struct SamplingFields {
    #[serde(default, alias = "max_completion_tokens")]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    /// llama.cpp's extensions, for clients that know them.
    #[serde(default)]
    pub top_k: Option<u32>,
    #[serde(default)]
    pub min_p: Option<f32>,
    #[serde(default)]
    pub repeat_penalty: Option<f32>,
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub stop: Option<Stop>,
    #[serde(default)]
    pub n: Option<u32>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
}

#[derive(Deserialize, Debug, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// `POST /v1/chat/completions`.
#[derive(Deserialize, Debug)]
pub struct ChatRequest {
    pub messages: Vec<RequestMessage>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    #[serde(default)]
    pub logprobs: Option<bool>,
    #[serde(default)]
    pub top_logprobs: Option<u32>,
    #[serde(default)]
    pub response_format: Option<ResponseFormat>,
    #[serde(default)]
    pub tools: Option<Vec<Tool>>,
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
}

/// `POST /v1/completions`: one prompt (a string, or a list holding one string).
#[derive(Deserialize, Debug)]
pub struct CompletionRequest {
    pub prompt: PromptInput,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    /// The legacy API's number of top log-probabilities per token.
    #[serde(default)]
    pub logprobs: Option<u32>,
    #[serde(default)]
    pub echo: Option<bool>,
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
}

#[derive(Serialize, Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// A token's log-probability, and (when asked for) the most likely alternatives.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<Vec<TopLogprob>>,
}

#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Serialize, Debug)]
pub struct ChatLogprobs {
    pub content: Vec<TokenLogprob>,
}

#[derive(Serialize, Debug)]
pub struct ResponseMessage {
    pub role: &'static str,
    /// Null when the answer is tool calls only.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ResponseToolCall>>,
}

/// A call the model made: `{"id", "type": "function", "function": {"name", "arguments"}}`.
#[derive(Serialize, Debug)]
pub struct ResponseToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: ResponseFunctionCall,
}

#[derive(Serialize, Debug)]
pub struct ResponseFunctionCall {
    pub name: String,
    /// A JSON text.
    pub arguments: String,
}

/// A streamed call: the first chunk of a call has its `id`, `type` and name, later ones
/// pieces of its arguments.
#[derive(Serialize, Debug)]
pub struct DeltaToolCall {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: DeltaFunctionCall,
}

#[derive(Serialize, Debug)]
pub struct DeltaFunctionCall {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

#[derive(Serialize, Debug)]
pub struct ChatChoice {
    pub index: u32,
    pub message: ResponseMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: &'static str,
}

#[derive(Serialize, Debug)]
pub struct ChatResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    /// The server's own figures for the answer (as on a stream's last chunk).
    pub timings: Timings,
}

#[derive(Serialize, Debug, Default)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<DeltaToolCall>>,
}

#[derive(Serialize, Debug)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Serialize, Debug)]
pub struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// On the chunk with the finish reason: the server's own figures for the answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

/// How one answer went, as the server measured it (llama-server sends a `timings` object on
/// its last chunk too; these names are ours).
#[derive(Serialize, Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// From the request's arrival to its first generated token (queue and prompt included).
    pub time_to_first_token_ms: f64,
    /// From the first generated token to the last.
    pub generation_ms: f64,
    pub generated_tokens: usize,
    /// Tokens after the first over `generation_ms` (0 with fewer than two tokens).
    pub tokens_per_second: f64,
    /// Under `--memory`: the neuron cache while this answer ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neuron_cache: Option<CacheTimings>,
    /// With `--draft`: speculative decoding in this answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft: Option<DraftTimings>,
}

/// Speculative decoding over one answer (`serve --draft`). Drafts are verified while a request
/// runs alone; steps shared with other requests decode one token each.
#[derive(Serialize, Debug, Clone, Copy, Default, PartialEq)]
pub struct DraftTimings {
    /// Decode steps that verified drafted tokens.
    pub steps: usize,
    pub drafted: usize,
    /// Drafted tokens the target's own draws kept.
    pub accepted: usize,
    /// accepted / drafted (0 when nothing was drafted).
    pub acceptance_rate: f64,
    /// accepted / steps: tokens each verifying step added beyond its one.
    pub mean_accepted_per_step: f64,
}

/// The neuron cache's counters over one answer's life. They are the engine's: under
/// `--parallel`, requests that ran at the same time share them.
#[derive(Serialize, Debug, Clone, Copy, Default, PartialEq)]
pub struct CacheTimings {
    pub hits: u64,
    pub misses: u64,
    /// hits / (hits + misses), 0 when nothing was looked up.
    pub hit_rate: f64,
    pub bytes_read: u64,
    /// bytes_read / generated_tokens.
    pub bytes_read_per_token: f64,
}

/// The legacy completions API's log-probabilities.
#[derive(Serialize, Debug, Default)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<serde_json::Map<String, Value>>,
    pub text_offset: Vec<usize>,
}

#[derive(Serialize, Debug)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Serialize, Debug)]
pub struct CompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Not streamed: the server's own figures for the answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

#[derive(Serialize, Debug)]
pub struct ModelEntry {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}

#[derive(Serialize, Debug)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelEntry>,
}

/// `GET /props`: what the chat page shows about the server (llama-server has an endpoint of
/// this name too; these fields are ours).
#[derive(Serialize, Debug, Clone)]
pub struct Props {
    pub model: String,
    /// Tokens of context each slot holds.
    pub n_ctx: usize,
    /// Requests generated at once.
    pub slots: usize,
    /// Requests that may wait.
    pub queue: usize,
    /// Under `--memory`: how the budget is split, in bytes.
    pub memory: Option<MemoryProps>,
}

#[derive(Serialize, Debug, Clone)]
pub struct MemoryProps {
    pub budget: u64,
    pub resident_weights: u64,
    pub kv_cache: u64,
    pub neuron_cache: u64,
}

//! Tool calls: OpenAI's `tools` / `tool_choice` checked and given to the chat template, the
//! grammar that makes `tool_choice: "required"` (or a named function) produce a well-formed
//! call, and the parser that finds calls in what the model wrote.
//!
//! The syntax of a call is the model family's, chosen from the chat template's source
//! ([`Syntax::detect`]): Hermes / Qwen (`<tool_call>{"name", "arguments"}</tool_call>`, one or
//! several), Llama 3.x (`{"name", "parameters"}`, after an optional `<|python_tag|>`) and
//! Mistral (`[TOOL_CALLS][{"name", "arguments"}, …]`). A template that does not render the
//! `tools` it is given, or whose syntax is none of these, cannot take tools (a 400).

use super::api::{NamedToolChoice, Tool, ToolChoice};
use super::error::ApiError;
use conductor_runtime::sample::SplitMix64;
use conductor_runtime::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};

/// How a model family writes a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    /// `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`, possibly several (Qwen 2.5,
    /// Qwen 3, Hermes 2/3).
    Hermes,
    /// `{"name": …, "parameters": {…}}`, the whole answer, after an optional `<|python_tag|>`
    /// (Llama 3.1, 3.2, 3.3). One call per answer, as the templates allow.
    Llama3,
    /// `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]` (Mistral Nemo and its kin).
    Mistral,
}

impl Syntax {
    /// The syntax the template teaches, from its source: where it writes an assistant's
    /// `tool_calls`.
    pub fn detect(source: &str) -> Option<Syntax> {
        if source.contains("<tool_call>") {
            Some(Syntax::Hermes)
        } else if source.contains("[TOOL_CALLS]") {
            Some(Syntax::Mistral)
        } else if source.contains("<|start_header_id|>") && source.contains("\"parameters\"") {
            Some(Syntax::Llama3)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Syntax::Hermes => "Hermes (<tool_call>)",
            Syntax::Llama3 => "Llama 3 JSON",
            Syntax::Mistral => "Mistral ([TOOL_CALLS])",
        }
    }

    /// The key a call's arguments go under.
    fn arguments_key(self) -> &'static str {
        match self {
            Syntax::Llama3 => "parameters",
            Syntax::Hermes | Syntax::Mistral => "arguments",
        }
    }
}

/// A function the request offers.
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    pub name: String,
    /// Its `parameters` JSON schema (an object schema without properties when none is given).
    pub parameters: Value,
}

/// What the model must or may do with the tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// It may call them or answer in text: unconstrained, parsed afterwards.
    Auto,
    /// It must call one of them (constrained).
    Required,
    /// It must call this one (an index into [`Offer::functions`]; constrained).
    Named(usize),
}

/// The tools of a request that offers them to the model.
#[derive(Debug, Clone)]
pub struct Offer {
    pub syntax: Syntax,
    pub functions: Vec<Function>,
    pub mode: Mode,
    /// Whether several calls may come in one answer (`parallel_tool_calls`, default true).
    pub parallel: bool,
    /// `tools` as the template gets them.
    pub rendered: Vec<Value>,
}

/// A function name as OpenAI allows it: 1-64 of `a-z A-Z 0-9 _ -`.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Checks `tools`, `tool_choice` and `parallel_tool_calls`. `None`: nothing is offered to the
/// model (no tools, or `tool_choice: "none"`). `syntax` is the template's tool-call syntax, or
/// why it has none.
pub fn offer(
    tools: Option<&[Tool]>,
    choice: Option<&ToolChoice>,
    parallel: Option<bool>,
    syntax: &Result<Syntax, String>,
) -> Result<Option<Offer>, ApiError> {
    let tools = tools.unwrap_or_default();
    let mut functions: Vec<Function> = Vec::with_capacity(tools.len());
    let mut rendered = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        if tool.kind != "function" {
            return Err(ApiError::invalid_param(
                "tools",
                format!(
                    "tools[{i}].type is `{}`: only `function` tools are supported",
                    tool.kind
                ),
            ));
        }
        let f = &tool.function;
        if !valid_name(&f.name) {
            return Err(ApiError::invalid_param(
                "tools",
                format!(
                    "tools[{i}].function.name `{}` is not a valid function name (1 to 64 letters, digits, `_` or `-`)",
                    f.name
                ),
            ));
        }
        if functions.iter().any(|g| g.name == f.name) {
            return Err(ApiError::invalid_param(
                "tools",
                format!("tools[{i}]: the function `{}` is given twice", f.name),
            ));
        }
        let parameters = match &f.parameters {
            None => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(other) => {
                return Err(ApiError::invalid_param(
                    "tools",
                    format!(
                        "tools[{i}].function.parameters must be a JSON Schema object, not {other}"
                    ),
                )
                .with_code("invalid_schema"))
            }
        };
        let mut function = serde_json::Map::new();
        function.insert("name".into(), Value::from(f.name.as_str()));
        if let Some(d) = &f.description {
            function.insert("description".into(), Value::from(d.as_str()));
        }
        function.insert("parameters".into(), parameters.clone());
        rendered.push(json!({"type": "function", "function": function}));
        functions.push(Function {
            name: f.name.clone(),
            parameters,
        });
    }
    let mode = match choice {
        None => Mode::Auto,
        Some(ToolChoice::Mode(m)) => match m.as_str() {
            "none" => return Ok(None),
            "auto" => Mode::Auto,
            "required" => Mode::Required,
            other => {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    format!(
                        "tool_choice `{other}` is not one of `none`, `auto`, `required` or {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"
                    ),
                ))
            }
        },
        Some(ToolChoice::Named(NamedToolChoice { kind, function })) => {
            if kind != "function" {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    format!("tool_choice.type is `{kind}`: only `function` is supported"),
                ));
            }
            match functions.iter().position(|f| f.name == function.name) {
                Some(i) => Mode::Named(i),
                None => {
                    return Err(ApiError::invalid_param(
                        "tool_choice",
                        format!(
                            "tool_choice names the function `{}`, which is not in tools",
                            function.name
                        ),
                    ))
                }
            }
        }
    };
    if functions.is_empty() {
        return match mode {
            Mode::Auto => Ok(None),
            _ => Err(ApiError::invalid_param(
                "tool_choice",
                "tool_choice requires a function, but tools is empty",
            )),
        };
    }
    let syntax = match syntax {
        Ok(s) => *s,
        Err(why) => {
            return Err(ApiError::invalid_param("tools", why.clone()).with_code("tools_unsupported"))
        }
    };
    Ok(Some(Offer {
        syntax,
        functions,
        mode,
        parallel: parallel.unwrap_or(true) && syntax != Syntax::Llama3,
        rendered,
    }))
}

/// A Lark string literal (JSON string syntax, which llguidance's Lark reads).
fn lit(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// The grammar element for `text`, a special token of the model (`[TOOL_CALLS]`) when it is
/// one, else the text itself.
fn marker(tokenizer: &Tokenizer, text: &str) -> String {
    match tokenizer.token_id(text) {
        Some(id) if tokenizer.is_control(id) => format!("<[{id}]>"),
        _ => lit(text),
    }
}

impl Offer {
    /// The functions the answer may call.
    fn callable(&self) -> Vec<&Function> {
        match self.mode {
            Mode::Named(i) => vec![&self.functions[i]],
            Mode::Auto | Mode::Required => self.functions.iter().collect(),
        }
    }

    /// `Some(grammar)`: the Lark grammar (llguidance) an answer must follow, for `required` and
    /// a named function. Its arguments follow the function's `parameters` schema (`%json`),
    /// written compactly with Python's separators, as the templates show calls.
    pub fn grammar(&self, tokenizer: &Tokenizer) -> Option<String> {
        self.grammar_with(|text| marker(tokenizer, text))
    }

    /// [`Offer::grammar`], with `marker` writing the grammar element of a marker text.
    fn grammar_with(&self, marker: impl Fn(&str) -> String) -> Option<String> {
        if self.mode == Mode::Auto {
            return None;
        }
        let key = self.syntax.arguments_key();
        let mut rules = String::new();
        let mut alternatives = Vec::new();
        for (i, f) in self.callable().into_iter().enumerate() {
            let mut schema = f.parameters.clone();
            if let Value::Object(map) = &mut schema {
                map.insert(
                    "x-guidance".into(),
                    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
                );
            }
            let head = format!("{{\"name\": {}, \"{key}\": ", lit(&f.name));
            rules.push_str(&format!(
                "fn_{i}: {} args_{i} \"}}\"\nargs_{i}: %json {schema}\n",
                lit(&head)
            ));
            alternatives.push(format!("fn_{i}"));
        }
        rules.push_str(&format!("call: {}\n", alternatives.join(" | ")));
        let start = match (self.syntax, self.parallel) {
            (Syntax::Hermes, parallel) => {
                rules.push_str("tagged: \"<tool_call>\\n\" call \"\\n</tool_call>\"\n");
                if parallel {
                    "start: tagged (\"\\n\" tagged)*\n".to_string()
                } else {
                    "start: tagged\n".to_string()
                }
            }
            (Syntax::Llama3, _) => "start: call\n".to_string(),
            (Syntax::Mistral, parallel) => {
                let more = if parallel { " (\", \" call)*" } else { "" };
                format!("start: {} \"[\" call{more} \"]\"\n", marker("[TOOL_CALLS]"))
            }
        };
        Some(start + &rules)
    }

    /// Finds the calls in `text`, the whole answer. `None` when it holds no well-formed call
    /// of an offered function (then it is all content). With `parallel_tool_calls: false` only
    /// the first call is kept. A Hermes answer cut short (`max_tokens`) in a call keeps its
    /// whole calls; the cut one is content.
    pub fn parse(&self, text: &str) -> Option<Parsed> {
        let mut parsed = parse(self.syntax, text)?;
        if parsed
            .calls
            .iter()
            .any(|c| !self.functions.iter().any(|f| f.name == c.name))
        {
            return None;
        }
        if !self.parallel {
            parsed.calls.truncate(1);
        }
        Some(parsed)
    }
}

/// A call found in the model's text.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    /// The arguments as a JSON text (an object), as OpenAI sends them.
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// The text outside the calls, trimmed; `None` when there is none.
    pub content: Option<String>,
    pub calls: Vec<ParsedCall>,
}

/// `{"name": string, KEY: object}` (the arguments may also be a string holding a JSON object,
/// as some models write them).
fn call_from(value: Value, keys: &[&str]) -> Option<ParsedCall> {
    let Value::Object(mut map) = value else {
        return None;
    };
    let name = match map.remove("name")? {
        Value::String(s) => s,
        _ => return None,
    };
    let arguments = keys.iter().find_map(|k| map.remove(*k))?;
    let arguments = match arguments {
        Value::Object(_) => arguments,
        Value::String(s) => match serde_json::from_str::<Value>(&s) {
            Ok(v @ Value::Object(_)) => v,
            _ => return None,
        },
        _ => return None,
    };
    Some(ParsedCall {
        name,
        arguments: arguments.to_string(),
    })
}

/// One JSON value at the start of `text` (after whitespace) and the text after it.
fn json_prefix(text: &str) -> Option<(Value, &str)> {
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let value = values.next()?.ok()?;
    Some((value, &text[values.byte_offset()..]))
}

fn nonempty(text: &str) -> Option<String> {
    let t = text.trim();
    (!t.is_empty()).then(|| t.to_string())
}

/// The calls written in `syntax` in `text`; `None` when there is none or one is malformed
/// (except a Hermes call the text ends in before its closing tag, which is content when it is
/// not whole).
pub fn parse(syntax: Syntax, text: &str) -> Option<Parsed> {
    match syntax {
        Syntax::Hermes => {
            const OPEN: &str = "<tool_call>";
            const CLOSE: &str = "</tool_call>";
            let mut content = String::new();
            let mut calls = Vec::new();
            let mut rest = text;
            while let Some(at) = rest.find(OPEN) {
                content.push_str(&rest[..at]);
                let body = &rest[at + OPEN.len()..];
                let Some(end) = body.find(CLOSE) else {
                    // The answer ended in this call, without its closing tag: it counts if
                    // it is whole, else (cut short) it is content.
                    let whole = json_prefix(body)
                        .filter(|(_, trailing)| trailing.trim().is_empty())
                        .and_then(|(value, _)| call_from(value, &["arguments", "parameters"]));
                    match whole {
                        Some(call) => calls.push(call),
                        None => content.push_str(&rest[at..]),
                    }
                    rest = "";
                    break;
                };
                let (value, trailing) = json_prefix(&body[..end])?;
                if !trailing.trim().is_empty() {
                    return None;
                }
                calls.push(call_from(value, &["arguments", "parameters"])?);
                rest = &body[end + CLOSE.len()..];
            }
            content.push_str(rest);
            (!calls.is_empty()).then(|| Parsed {
                content: nonempty(&content),
                calls,
            })
        }
        Syntax::Llama3 => {
            let body = text.trim_start();
            let body = body.strip_prefix("<|python_tag|>").unwrap_or(body);
            let (value, trailing) = json_prefix(body)?;
            if !trailing.trim().is_empty() {
                return None;
            }
            let call = call_from(value, &["parameters", "arguments"])?;
            Some(Parsed {
                content: None,
                calls: vec![call],
            })
        }
        Syntax::Mistral => {
            let (content, body) = match text.find("[TOOL_CALLS]") {
                Some(at) => (&text[..at], &text[at + "[TOOL_CALLS]".len()..]),
                None => ("", text),
            };
            let (value, trailing) = json_prefix(body.trim_start())?;
            if !trailing.trim().is_empty() {
                return None;
            }
            let Value::Array(items) = value else {
                return None;
            };
            let calls = items
                .into_iter()
                .map(|v| call_from(v, &["arguments", "parameters"]))
                .collect::<Option<Vec<_>>>()?;
            (!calls.is_empty()).then(|| Parsed {
                content: nonempty(content),
                calls,
            })
        }
    }
}

/// A fresh call id: `call_` and 24 letters and digits, or, for Mistral (whose templates
/// accept only these), 9 letters and digits.
pub fn call_id(syntax: Syntax) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // Ids need to differ, not to be secret.
    let mut rng = SplitMix64::new(
        nanos
            ^ NEXT
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    let (prefix, n) = match syntax {
        Syntax::Mistral => ("", 9),
        Syntax::Hermes | Syntax::Llama3 => ("call_", 24),
    };
    let mut id = String::from(prefix);
    for _ in 0..n {
        id.push(ALPHABET[rng.below(ALPHABET.len() as u64) as usize] as char);
    }
    id
}

/// A streamed answer split as it comes into content, sent at once, and what may be a call,
/// held back until the answer ends and parsed then.
pub struct StreamSplit {
    syntax: Syntax,
    text: String,
    /// Bytes of `text` sent as content.
    sent: usize,
    /// A call may have begun at `sent`: everything from there is held.
    holding: bool,
    /// For the syntaxes whose call is the whole answer: the answer began as text.
    plain: bool,
}

/// The longest suffix of `text` that is a proper prefix of `marker`.
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && text.ends_with(&marker[..n]))
        .unwrap_or(0)
}

impl StreamSplit {
    pub fn new(syntax: Syntax) -> StreamSplit {
        StreamSplit {
            syntax,
            text: String::new(),
            sent: 0,
            holding: false,
            plain: false,
        }
    }

    /// Takes the next piece of the answer; returns the content that can be sent now.
    pub fn push(&mut self, piece: &str) -> String {
        self.text.push_str(piece);
        if self.holding {
            return String::new();
        }
        let start = self.sent;
        let rest = &self.text[start..];
        match self.syntax {
            Syntax::Hermes => {
                const OPEN: &str = "<tool_call>";
                let safe = match rest.find(OPEN) {
                    Some(at) => {
                        self.holding = true;
                        at
                    }
                    None => rest.len() - partial_suffix(rest, OPEN),
                };
                self.sent += safe;
                self.text[start..start + safe].to_string()
            }
            Syntax::Llama3 | Syntax::Mistral => {
                if self.plain {
                    self.sent = self.text.len();
                    return self.text[start..].to_string();
                }
                let head = self.text.trim_start();
                if head.is_empty() {
                    return String::new();
                }
                let markers: &[&str] = match self.syntax {
                    Syntax::Llama3 => &["{", "<|python_tag|>"],
                    _ => &["[", "[TOOL_CALLS]"],
                };
                let may_call = markers
                    .iter()
                    .any(|m| head.starts_with(m) || m.starts_with(head));
                if may_call {
                    self.holding = true;
                    String::new()
                } else {
                    self.plain = true;
                    self.sent = self.text.len();
                    self.text.clone()
                }
            }
        }
    }

    /// The answer ended: the content not sent yet and the calls, parsed from what was held
    /// (all content when it holds no well-formed call of an offered function).
    pub fn finish(self, offer: &Offer) -> (Option<String>, Vec<ParsedCall>) {
        let held = &self.text[self.sent..];
        match offer.parse(held) {
            Some(parsed) => (parsed.content, parsed.calls),
            None => ((!held.is_empty()).then(|| held.to_string()), Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer_of(syntax: Syntax, names: &[&str], parallel: bool) -> Offer {
        Offer {
            syntax,
            functions: names
                .iter()
                .map(|n| Function {
                    name: n.to_string(),
                    parameters: json!({"type": "object"}),
                })
                .collect(),
            mode: Mode::Auto,
            parallel,
            rendered: Vec::new(),
        }
    }

    fn call(name: &str, arguments: &str) -> ParsedCall {
        ParsedCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn the_syntax_comes_from_the_template() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../runtime/tests/data/chat-templates/"
        );
        let read = |n: &str| std::fs::read_to_string(format!("{dir}{n}.jinja")).unwrap();
        for (name, want) in [
            ("qwen2.5", Some(Syntax::Hermes)),
            ("qwen3", Some(Syntax::Hermes)),
            ("llama3.1", Some(Syntax::Llama3)),
            ("llama3.2", Some(Syntax::Llama3)),
            ("mistral-nemo", Some(Syntax::Mistral)),
            ("smollm2-135m", None),
            ("smollm3", None),
            ("gemma2", None),
        ] {
            assert_eq!(Syntax::detect(&read(name)), want, "{name}");
        }
    }

    #[test]
    fn hermes_calls_are_parsed_with_the_text_around_them() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}\n</tool_call>";
        let p = parse(Syntax::Hermes, text).unwrap();
        assert_eq!(p.content.as_deref(), Some("Let me look."));
        assert_eq!(
            p.calls,
            [
                call("get_weather", r#"{"city":"Paris"}"#),
                call("get_time", r#"{"tz":"CET"}"#)
            ]
        );
        // The closing tag may be missing at the end.
        let p = parse(
            Syntax::Hermes,
            "<tool_call>{\"name\": \"f\", \"arguments\": {}}",
        )
        .unwrap();
        assert_eq!((p.content, p.calls), (None, vec![call("f", "{}")]));
        // An answer cut short in its last call: the whole calls, and the rest as content.
        let p = parse(
            Syntax::Hermes,
            "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"g\", \"argu",
        )
        .unwrap();
        assert_eq!(p.calls, [call("f", "{}")]);
        assert_eq!(
            p.content.as_deref(),
            Some("<tool_call>{\"name\": \"g\", \"argu")
        );
    }

    #[test]
    fn llama3_and_mistral_calls_are_parsed() {
        for text in [
            r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#,
            r#"  <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}} "#,
        ] {
            let p = parse(Syntax::Llama3, text).unwrap();
            assert_eq!(
                p.calls,
                [call("get_weather", r#"{"city":"Paris"}"#)],
                "{text}"
            );
        }
        for text in [
            r#"[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}, "id": "abcdefghi"}]"#,
            r#"[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]"#,
        ] {
            let p = parse(Syntax::Mistral, text).unwrap();
            assert_eq!(
                p.calls,
                [call("a", r#"{"x":1}"#), call("b", "{}")],
                "{text}"
            );
        }
        let p = parse(
            Syntax::Mistral,
            "Sure. [TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}]",
        )
        .unwrap();
        assert_eq!(p.content.as_deref(), Some("Sure."));
    }

    /// Malformed calls never panic: the answer stays content.
    #[test]
    fn malformed_calls_are_content() {
        let hermes = [
            "plain text",
            "<tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": {",
            "<tool_call>{\"name\": \"f\"}</tool_call>",
            "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": \"not json\"}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": {}} junk</tool_call>",
            "<tool_call>oops</tool_call><tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
            "<tool_call>\u{1F389}\u{0}</tool_call>",
        ];
        for text in hermes {
            assert_eq!(parse(Syntax::Hermes, text), None, "{text}");
        }
        for text in [
            "",
            "Paris is sunny.",
            "{\"name\": \"f\"}",
            "{\"name\": \"f\", \"parameters\": {}} and more",
            "{\"name\": \"f\", \"parameters\": {",
            "[1, 2]",
        ] {
            assert_eq!(parse(Syntax::Llama3, text), None, "{text}");
        }
        for text in [
            "[TOOL_CALLS]",
            "[TOOL_CALLS][]",
            "[TOOL_CALLS]{\"name\": \"a\", \"arguments\": {}}",
            "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}",
            "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, 7]",
        ] {
            assert_eq!(parse(Syntax::Mistral, text), None, "{text}");
        }
        // A call of a function that was not offered is content too.
        let offer = offer_of(Syntax::Hermes, &["g"], true);
        assert_eq!(
            offer.parse("<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"),
            None
        );
    }

    #[test]
    fn parallel_false_keeps_the_first_call() {
        let text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>";
        assert_eq!(
            offer_of(Syntax::Hermes, &["f", "g"], true)
                .parse(text)
                .unwrap()
                .calls
                .len(),
            2
        );
        assert_eq!(
            offer_of(Syntax::Hermes, &["f", "g"], false)
                .parse(text)
                .unwrap()
                .calls,
            [call("f", "{}")]
        );
    }

    /// Streamed: content goes out as it comes, a call is held until the end; split anywhere,
    /// the pieces give what the whole text gives.
    #[test]
    fn a_streamed_answer_sends_content_and_holds_calls() {
        let offer = offer_of(Syntax::Hermes, &["f"], true);
        let text = "Checking <tool_ca. <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"é\"}}\n</tool_call>";
        for step in 1..8 {
            let mut split = StreamSplit::new(Syntax::Hermes);
            let mut sent = String::new();
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(step) {
                sent.push_str(&split.push(&piece.iter().collect::<String>()));
            }
            assert_eq!(sent, "Checking <tool_ca. ", "step {step}");
            let (rest, calls) = split.finish(&offer);
            assert_eq!(rest, None);
            assert_eq!(calls, [call("f", r#"{"a":"é"}"#)]);
        }
        // Text that is no call goes out whole.
        let mut split = StreamSplit::new(Syntax::Llama3);
        let offer = offer_of(Syntax::Llama3, &["f"], false);
        assert_eq!(split.push("  "), "");
        assert_eq!(split.push("Hi {"), "  Hi {");
        assert_eq!(split.push("x"), "x");
        assert_eq!(split.finish(&offer), (None, vec![]));
        // A held start that turns out malformed comes out as content at the end.
        let mut split = StreamSplit::new(Syntax::Llama3);
        assert_eq!(split.push("{\"name\": "), "");
        assert_eq!(
            split.finish(&offer),
            (Some("{\"name\": ".to_string()), vec![])
        );
    }

    /// The grammar of `required` (and of a named function) takes the family's call with
    /// arguments that follow the schema, several when parallel, and nothing else; what it
    /// takes parses back into the call.
    #[test]
    fn required_grammars_take_valid_calls_only() {
        use llguidance::api::TopLevelGrammar;
        use llguidance::toktrie::ApproximateTokEnv;
        use llguidance::{Matcher, ParserFactory};
        let env = ApproximateTokEnv::single_byte_env();
        let mut factory = ParserFactory::new_simple(&env).unwrap();
        factory.quiet();
        let schema = json!({"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"], "additionalProperties": false});
        let offer = |syntax, mode, parallel| Offer {
            syntax,
            functions: ["w", "v"]
                .iter()
                .map(|n| Function {
                    name: n.to_string(),
                    parameters: schema.clone(),
                })
                .collect(),
            mode,
            parallel,
            rendered: Vec::new(),
        };
        let takes = |offer: &Offer, text: &str| {
            let grammar = offer.grammar_with(lit).unwrap();
            let mut m = Matcher::new(factory.create_parser(TopLevelGrammar::from_lark(grammar)));
            assert_eq!(m.get_error(), None);
            let tokens: Vec<u32> = text.bytes().map(u32::from).collect();
            m.validate_tokens(&tokens).unwrap() == tokens.len()
                && m.consume_tokens(&tokens).is_ok()
                && m.is_accepting().unwrap()
        };
        let hermes = |name: &str, city: &str| {
            format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {{\"city\": \"{city}\"}}}}\n</tool_call>")
        };
        let cases = [
            (Syntax::Hermes, hermes("w", "Paris"), hermes("w", "Oslo")),
            (
                Syntax::Llama3,
                r#"{"name": "v", "parameters": {"city": "Rome"}}"#.to_string(),
                r#"{"name": "v", "arguments": {"city": "Rome"}}"#.to_string(),
            ),
            (
                Syntax::Mistral,
                r#"[TOOL_CALLS][{"name": "w", "arguments": {"city": "Rome"}}]"#.to_string(),
                r#"[TOOL_CALLS][{"name": "x", "arguments": {"city": "Rome"}}]"#.to_string(),
            ),
        ];
        for (syntax, good, bad) in cases {
            let o = offer(syntax, Mode::Required, false);
            assert!(takes(&o, &good), "{syntax:?}: {good}");
            assert!(!takes(&o, &bad), "{syntax:?}: {bad}");
            assert!(!takes(&o, &format!("Sure. {good}")), "{syntax:?}");
            assert!(!takes(&o, &format!("{good} ")), "{syntax:?}");
            assert_eq!(o.parse(&good).unwrap().calls.len(), 1, "{syntax:?}");
        }
        // Parallel: several calls; a named function: that one only.
        let two = format!("{}\n{}", hermes("w", "Paris"), hermes("v", "Rome"));
        assert!(takes(&offer(Syntax::Hermes, Mode::Required, true), &two));
        assert!(!takes(&offer(Syntax::Hermes, Mode::Required, false), &two));
        let mistral_two = r#"[TOOL_CALLS][{"name": "w", "arguments": {"city": "Rome"}}, {"name": "v", "arguments": {"city": "Paris"}}]"#;
        assert!(takes(
            &offer(Syntax::Mistral, Mode::Required, true),
            mistral_two
        ));
        let named = offer(Syntax::Hermes, Mode::Named(1), true);
        assert!(takes(&named, &hermes("v", "Rome")));
        assert!(!takes(&named, &hermes("w", "Rome")));
        assert_eq!(
            offer(Syntax::Hermes, Mode::Auto, true).grammar_with(lit),
            None
        );
    }

    #[test]
    fn call_ids_differ_and_fit_the_syntax() {
        let a = call_id(Syntax::Hermes);
        let b = call_id(Syntax::Hermes);
        assert!(a.starts_with("call_") && a.len() == 29 && a != b, "{a} {b}");
        let m = call_id(Syntax::Mistral);
        assert!(
            m.len() == 9 && m.bytes().all(|c| c.is_ascii_alphanumeric()),
            "{m}"
        );
    }
}

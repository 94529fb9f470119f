//! Chat templates (`tokenizer.chat_template`): Jinja run the way Hugging Face runs them.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State, Value};
use serde::Serialize;

use super::TokenizerError;

/// One chat turn. Besides `role` and `content`, an assistant turn may carry the tool calls
/// it made and a `tool` turn the id of the call it answers (and the function's name): templates
/// read them as OpenAI's API writes them, except that a call's `arguments` is what the client
/// sent parsed as JSON (an object), as llama.cpp gives it to templates. Fields left `None` are
/// undefined in the template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A call an assistant turn made: `{"id", "type": "function", "function": {"name",
/// "arguments"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolCall {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FunctionCall {
    pub name: String,
    /// Usually an object; a string where the client's text was not JSON.
    pub arguments: serde_json::Value,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..ChatMessage::default()
        }
    }
}

/// A compiled chat template.
///
/// The environment follows `transformers`' `apply_chat_template`: blocks trimmed
/// (`trim_blocks`, `lstrip_blocks`), `loop` controls, `raise_exception(msg)`, a `tojson` that
/// writes like Python's `json.dumps(ensure_ascii=False)`, common Python string and dict methods
/// (`strip`, `startswith`, `split`, `items`, `get`, ...), and `bos_token`/`eos_token`.
/// `strftime_now(fmt)` formats the time given with [`ChatTemplate::with_time`] (this crate reads
/// no clock); without one it is an error.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// Tokenizing the prompt adds BOS (EOS): the template's own leading BOS (trailing EOS) text
    /// is dropped, as llama.cpp drops it, so the model does not see it twice.
    strip_bos: bool,
    strip_eos: bool,
    /// Seconds since the Unix epoch (UTC) that dates are rendered for, when given.
    now: Option<i64>,
    source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

const NAME: &str = "chat_template";

/// Templates come with model files, so a hostile one must not hang or exhaust the process.
/// Instructions a render may run: real templates take a few hundred per message, so this is
/// thousands of messages' worth, and about a second at most.
const FUEL: u64 = 50_000_000;
/// The most a render may write: far more than any context holds.
const MAX_OUTPUT: usize = 8 << 20;
/// The largest `tojson(indent=…)`.
const MAX_INDENT: usize = 64;
/// How deep a value written out (`{{ … }}`, `tojson`, `string`) may nest, and how many of its
/// parts may be visited: a namespace set into itself (`{% set ns.n = ns %}`) is a cycle, which
/// minijinja would write out by recursing until the stack overflows.
const MAX_NESTING: usize = 128;
const MAX_PARTS: usize = 1 << 20;

fn template_error(e: Error) -> TokenizerError {
    // The display of a minijinja error carries its kind, detail and line.
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    TokenizerError::Template(msg)
}

impl ChatTemplate {
    /// Compiles `source`; a syntax error is a [`TokenizerError::Template`].
    pub fn new(source: &str) -> Result<Self, TokenizerError> {
        let mut env = Environment::new();
        env.set_fuel(Some(FUEL));
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("raise_exception: {msg}"),
            ))
        });
        env.add_function("strftime_now", |_fmt: String| -> Result<Value, Error> {
            Err(Error::new(
                ErrorKind::InvalidOperation,
                "strftime_now: no time given (ChatTemplate::with_time)",
            ))
        });
        env.add_filter("tojson", tojson);
        env.set_formatter(|out, state, value| {
            check_nesting(value)?;
            minijinja::escape_formatter(out, state, value)
        });
        env.add_filter("string", |v: Value| -> Result<Value, Error> {
            if v.kind() == ValueKind::String {
                return Ok(v);
            }
            check_nesting(&v)?;
            Ok(Value::from(v.to_string()))
        });
        // Jinja2's undefined has length 0 (`tools|length` where no tools are given).
        env.add_filter("length", |v: Value| -> Result<Value, Error> {
            if v.is_undefined() {
                return Ok(Value::from(0));
            }
            v.len().map(Value::from).ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    format!("cannot take the length of {}", v.kind()),
                )
            })
        });
        env.set_unknown_method_callback(python_method);
        env.add_template_owned(NAME, source.to_string())
            .map_err(template_error)?;
        Ok(ChatTemplate {
            env,
            bos_token: String::new(),
            eos_token: String::new(),
            strip_bos: false,
            strip_eos: false,
            now: None,
            source: source.to_string(),
        })
    }

    /// Sets the texts of `bos_token` and `eos_token`.
    pub fn with_special_tokens(mut self, bos: &str, eos: &str) -> Self {
        self.bos_token = bos.to_string();
        self.eos_token = eos.to_string();
        self
    }

    /// Whether tokenizing the rendered prompt adds BOS and EOS (the vocabulary's `add_bos`,
    /// `add_eos`): if so, a BOS text the template writes first, and an EOS text it writes last,
    /// are dropped from the prompt.
    pub fn with_added_specials(mut self, add_bos: bool, add_eos: bool) -> Self {
        self.strip_bos = add_bos;
        self.strip_eos = add_eos;
        self
    }

    /// The time that `strftime_now` formats, as seconds since the Unix epoch (UTC). It also
    /// sets `date_string` ("26 Jul 2024") and `datetime` ("Jul 26 2024"), which llama.cpp gives
    /// every template (Llama 3.1's writes the first as today's date).
    pub fn with_time(mut self, unix_seconds: i64) -> Self {
        self.now = Some(unix_seconds);
        self.env
            .add_function("strftime_now", move |fmt: String| -> Result<Value, Error> {
                Ok(Value::from(strftime(&fmt, unix_seconds)))
            });
        self
    }

    /// Renders the conversation; `add_generation_prompt` opens the assistant's turn.
    ///
    /// As llama.cpp's chat layer does: a leading system message is merged into the first user
    /// turn (`system + "\n" + user`) when the template has no place for it, `enable_thinking`
    /// is true, and BOS/EOS texts that tokenizing adds anyway are dropped
    /// ([`ChatTemplate::with_added_specials`]).
    pub fn apply(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.apply_with_tools(messages, None, add_generation_prompt)
    }

    /// [`ChatTemplate::apply`] with `tools` (OpenAI's `tools` list, `[{"type": "function",
    /// "function": {"name", "description", "parameters"}}]`) given to the template as `tools`;
    /// `None` leaves `tools` undefined.
    pub fn apply_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let merged;
        let messages = match messages {
            [system, user, rest @ ..]
                if system.role == "system" && !self.supports_system_role() =>
            {
                merged = std::iter::once(ChatMessage {
                    content: format!("{}\n{}", system.content, user.content),
                    ..user.clone()
                })
                .chain(rest.iter().cloned())
                .collect::<Vec<_>>();
                &merged[..]
            }
            [system] if system.role == "system" && !self.supports_system_role() => &[],
            _ => messages,
        };
        let mut text = self.render(messages, tools, add_generation_prompt)?;
        if self.strip_bos && !self.bos_token.is_empty() && text.starts_with(&self.bos_token) {
            text.drain(..self.bos_token.len());
        }
        if self.strip_eos && !self.eos_token.is_empty() && text.ends_with(&self.eos_token) {
            text.truncate(text.len() - self.eos_token.len());
        }
        Ok(text)
    }

    fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let tmpl = self.env.get_template(NAME).map_err(template_error)?;
        // Without a time the dates stay undefined: templates then write their own default.
        let dates = match self.now {
            Some(t) => minijinja::context! {
                date_string => strftime("%d %b %Y", t),
                datetime => strftime("%b %d %Y", t),
            },
            None => minijinja::context! {},
        };
        let tools = match tools {
            Some(tools) => minijinja::context! { tools => Value::from_serialize(tools) },
            None => minijinja::context! {},
        };
        let mut out = CappedWriter(Vec::new());
        tmpl.render_captured_to(
            minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
                enable_thinking => true,
                ..minijinja::value::merge_maps([dates, tools])
            },
            &mut out,
        )
        .map_err(|e| match e.kind() {
            ErrorKind::WriteFailure => TokenizerError::Template(format!(
                "the chat template wrote more than {} MiB",
                MAX_OUTPUT >> 20
            )),
            _ => template_error(e),
        })?;
        // Everything written came from Rust strings, so it is UTF-8.
        String::from_utf8(out.0).map_err(|e| TokenizerError::Template(e.to_string()))
    }

    /// Whether the template writes a system message's text (some, like Gemma 2's, refuse the
    /// role; others drop it): probed by rendering one, as llama.cpp probes its capabilities.
    fn supports_system_role(&self) -> bool {
        const PROBE: &str = "System message probe";
        let probe = [
            ChatMessage::new("system", PROBE),
            ChatMessage::new("user", "User message"),
        ];
        self.render(&probe, None, false)
            .is_ok_and(|text| text.contains(PROBE))
    }

    /// Whether the template offers tools to the model: a tool given in `tools` appears in what
    /// it renders (probed as llama.cpp probes its capabilities).
    pub fn supports_tools(&self) -> bool {
        const PROBE: &str = "tool_support_probe_fn";
        let tools = [serde_json::json!({
            "type": "function",
            "function": {
                "name": PROBE,
                "description": "",
                "parameters": {"type": "object", "properties": {}},
            },
        })];
        let probe = [ChatMessage::new("user", "User message")];
        self.render(&probe, Some(&tools), true)
            .is_ok_and(|text| text.contains(PROBE))
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }
}

/// A render's output, refused past [`MAX_OUTPUT`] bytes.
struct CappedWriter(Vec<u8>);

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_OUTPUT {
            return Err(std::io::Error::other("chat template output too large"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Refuses a value nested deeper than [`MAX_NESTING`] or made of more than [`MAX_PARTS`] parts
/// (a cycle is both), before anything recurses through it to write it out.
fn check_nesting(value: &Value) -> Result<(), Error> {
    let mut parts = 0usize;
    let mut stack = vec![(value.clone(), 0usize)];
    while let Some((v, depth)) = stack.pop() {
        parts += 1;
        if depth > MAX_NESTING || parts > MAX_PARTS {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "a value nested deeper than {MAX_NESTING} levels or of more than {MAX_PARTS} parts (a namespace set into itself?) is not written out"
                ),
            ));
        }
        match v.kind() {
            ValueKind::Seq | ValueKind::Iterable => {
                if let Ok(items) = v.try_iter() {
                    stack.extend(items.map(|item| (item, depth + 1)));
                }
            }
            ValueKind::Map | ValueKind::Plain => {
                if let Ok(keys) = v.try_iter() {
                    for key in keys {
                        if let Ok(item) = v.get_item(&key) {
                            stack.push((item, depth + 1));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`.
fn tojson(value: Value, args: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = args.get("indent")?;
    if indent.is_some_and(|n| n > MAX_INDENT) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: an indent above {MAX_INDENT} is refused"),
        ));
    }
    let sort_keys: Option<bool> = args.get("sort_keys")?;
    args.assert_all_used()?;
    check_nesting(&value)?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    write_json(&json, indent, sort_keys.unwrap_or(false), 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write_json(
    v: &serde_json::Value,
    indent: Option<usize>,
    sort: bool,
    depth: usize,
    out: &mut String,
) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    // Python's separators: ", " inline, "," before a newline.
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json(item, indent, sort, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            let mut entries: Vec<_> = map.iter().collect();
            if sort {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json_string(k, out);
                out.push_str(": ");
                write_json(item, indent, sort, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        J::Array(_) => out.push_str("[]"),
        J::Object(_) => out.push_str("{}"),
        J::String(s) => write_json_string(s, out),
        other => out.push_str(&other.to_string()),
    }
}

fn write_json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python methods that templates call on strings and dicts.
fn python_method(
    _state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    let unknown = || Err(Error::from(ErrorKind::UnknownMethod));
    let arg_str = |i: usize| args.get(i).and_then(|a| a.as_str().map(str::to_string));
    match value.kind() {
        ValueKind::String => {
            let s = value.as_str().unwrap_or_default();
            let chars = arg_str(0);
            let strip_set = |c: char| match &chars {
                Some(set) => set.contains(c),
                None => c.is_whitespace(),
            };
            Ok(match method {
                "strip" => Value::from(s.trim_matches(strip_set)),
                "lstrip" => Value::from(s.trim_start_matches(strip_set)),
                "rstrip" => Value::from(s.trim_end_matches(strip_set)),
                "upper" => Value::from(s.to_uppercase()),
                "lower" => Value::from(s.to_lowercase()),
                "title" => Value::from(title_case(s)),
                "capitalize" => {
                    let mut it = s.chars();
                    Value::from(match it.next() {
                        Some(f) => f
                            .to_uppercase()
                            .chain(it.flat_map(char::to_lowercase))
                            .collect(),
                        None => String::new(),
                    })
                }
                "startswith" | "endswith" => {
                    let test = |p: &str| {
                        if method == "startswith" {
                            s.starts_with(p)
                        } else {
                            s.ends_with(p)
                        }
                    };
                    let arg = args.first().cloned().unwrap_or_default();
                    let hit = if let Some(p) = arg.as_str() {
                        test(p)
                    } else {
                        // A tuple of prefixes.
                        arg.try_iter()?.any(|p| p.as_str().is_some_and(test))
                    };
                    Value::from(hit)
                }
                "split" => {
                    let max = args
                        .get(1)
                        .and_then(|a| i64::try_from(a.clone()).ok())
                        .filter(|&m| m >= 0);
                    let parts: Vec<String> = match arg_str(0) {
                        Some(sep) if sep.is_empty() => {
                            return Err(Error::new(
                                ErrorKind::InvalidOperation,
                                "split: empty separator",
                            ))
                        }
                        Some(sep) => match max {
                            Some(m) => s
                                .splitn(m as usize + 1, sep.as_str())
                                .map(String::from)
                                .collect(),
                            None => s.split(sep.as_str()).map(String::from).collect(),
                        },
                        None => s.split_whitespace().map(String::from).collect(),
                    };
                    Value::from(parts)
                }
                "replace" => {
                    let (Some(from), Some(to)) = (arg_str(0), arg_str(1)) else {
                        return Err(Error::new(ErrorKind::MissingArgument, "replace(old, new)"));
                    };
                    Value::from(s.replace(&from, &to))
                }
                "find" => Value::from(
                    arg_str(0)
                        .and_then(|p| s.find(&p))
                        .map_or(-1, |b| s[..b].chars().count() as i64),
                ),
                "count" => Value::from(arg_str(0).map_or(0, |p| {
                    if p.is_empty() {
                        0
                    } else {
                        s.matches(&p).count()
                    }
                })),
                "format" => Value::from(py_format(s, args)?),
                "join" => {
                    let items = args.first().cloned().unwrap_or_default();
                    let parts: Vec<String> = items.try_iter()?.map(|v| v.to_string()).collect();
                    Value::from(parts.join(s))
                }
                _ => return unknown(),
            })
        }
        ValueKind::Map => match method {
            "items" => {
                let mut pairs = Vec::new();
                for k in value.try_iter()? {
                    let v = value.get_item(&k)?;
                    pairs.push(Value::from(vec![k, v]));
                }
                Ok(Value::from(pairs))
            }
            "keys" => Ok(Value::from(value.try_iter()?.collect::<Vec<_>>())),
            "values" => {
                let keys: Vec<Value> = value.try_iter()?.collect();
                keys.iter()
                    .map(|k| value.get_item(k))
                    .collect::<Result<Vec<_>, _>>()
                    .map(Value::from)
            }
            "get" => {
                let key = args.first().cloned().unwrap_or_default();
                let found = value.get_item(&key)?;
                Ok(if found.is_undefined() {
                    args.get(1).cloned().unwrap_or(Value::from(()))
                } else {
                    found
                })
            }
            _ => unknown(),
        },
        _ => unknown(),
    }
}

/// Python's `str.format` with `{}`, `{0}` and `{name}` fields (no format specs).
fn py_format(fmt: &str, args: &[Value]) -> Result<String, Error> {
    let (positional, kwargs) = match args.last() {
        Some(last) if last.is_kwargs() => (&args[..args.len() - 1], Some(last)),
        _ => (args, None),
    };
    let bad = |msg: String| Error::new(ErrorKind::InvalidOperation, format!("format: {msg}"));
    let mut out = String::new();
    let mut next = 0;
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                let field: String = chars.by_ref().take_while(|&c| c != '}').collect();
                let value = if field.is_empty() {
                    next += 1;
                    positional.get(next - 1).cloned()
                } else if let Ok(i) = field.parse::<usize>() {
                    positional.get(i).cloned()
                } else {
                    kwargs
                        .and_then(|k| k.get_attr(&field).ok())
                        .filter(|v| !v.is_undefined())
                };
                out.push_str(
                    &value
                        .ok_or_else(|| bad(format!("no value for {{{field}}}")))?
                        .to_string(),
                );
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

fn title_case(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut prev_letter = false;
    for c in s.chars() {
        if prev_letter {
            out.extend(c.to_lowercase());
        } else {
            out.extend(c.to_uppercase());
        }
        prev_letter = c.is_alphabetic();
    }
    out
}

/// The `strftime` fields that templates use, for a UTC time.
fn strftime(fmt: &str, unix_seconds: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix_seconds.div_euclid(86_400);
    let secs = unix_seconds.rem_euclid(86_400);
    let (y, m, d) = crate::calendar::civil_from_days(days);
    // 1970-01-01 was a Thursday.
    let weekday = (days + 3).rem_euclid(7) as usize;
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('-') if it.clone().next() == Some('d') => {
                it.next();
                out.push_str(&d.to_string());
            }
            Some('B') => out.push_str(MONTHS[m as usize - 1]),
            Some('b') => out.push_str(&MONTHS[m as usize - 1][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hostile templates end in an error from a limit, never hang or exhaust memory.
    #[test]
    fn runaway_templates_are_stopped() {
        let user = [ChatMessage::new("user", "hi")];
        for (source, says) in [
            (
                "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                "fuel",
            ),
            (
                "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}",
                "MiB",
            ),
            ("{{ messages | tojson(indent=1000000000) }}", "indent"),
            // A namespace set into itself is a cycle: written out, it would recurse until the
            // stack overflowed (the fuzz smoke found it aborting the process).
            (
                "{% set ns = namespace(n=0) %}{% set ns.n = ns %}{{ ns.n }}",
                "nested deeper",
            ),
            (
                "{% set ns = namespace(n=0) %}{% set ns.n = [1, ns] %}{{ ns | tojson }}",
                "nested deeper",
            ),
            (
                "{% set ns = namespace(n=0) %}{% set ns.n = ns %}{{ ns | string }}",
                "nested deeper",
            ),
            // A value that only doubles each level is no cycle, but written out it would be
            // 2^60 parts.
            (
                "{% set ns = namespace(v=1) %}{% for i in range(60) %}{% set ns.v = [ns.v, ns.v] %}{% endfor %}{{ ns.v }}",
                "parts",
            ),
        ] {
            // What stops each one is a count (fuel, output size, depth, parts), never a clock:
            // a CPU-time bound here failed on a slower CI machine while the limits held.
            let err = ChatTemplate::new(source)
                .unwrap()
                .apply(&user, true)
                .unwrap_err()
                .to_string();
            assert!(err.contains(says), "{source}: {err}");
        }
    }

    /// A conversation with tools, a call and its result renders as Hugging Face's
    /// `apply_chat_template` renders it (`tool-renderings.json`, made with Jinja2 by
    /// `tool_renderings.py`): tools in the family's place, the call's arguments (an object)
    /// written as JSON, the result where the template puts it.
    #[test]
    fn tool_calls_and_results_render_as_jinja2_renders_them() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/chat-templates/");
        let cases: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(format!("{dir}tool-renderings.json")).unwrap(),
        )
        .unwrap();
        let text = |v: &serde_json::Value| v.as_str().map(str::to_string);
        let messages: Vec<ChatMessage> = cases["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| ChatMessage {
                tool_calls: m["tool_calls"].as_array().map(|calls| {
                    calls
                        .iter()
                        .map(|c| ToolCall {
                            id: text(&c["id"]),
                            kind: "function".into(),
                            function: FunctionCall {
                                name: text(&c["function"]["name"]).unwrap(),
                                arguments: c["function"]["arguments"].clone(),
                            },
                        })
                        .collect()
                }),
                tool_call_id: text(&m["tool_call_id"]),
                name: text(&m["name"]),
                ..ChatMessage::new(
                    text(&m["role"]).unwrap(),
                    text(&m["content"]).unwrap_or_default(),
                )
            })
            .collect();
        let tools = cases["tools"].as_array().unwrap();
        let rendered = cases["rendered"].as_object().unwrap();
        assert!(rendered.len() >= 4);
        for (name, want) in rendered {
            let source = std::fs::read_to_string(format!("{dir}{name}.jinja")).unwrap();
            let template = ChatTemplate::new(&source)
                .unwrap()
                .with_special_tokens("", "</s>");
            assert!(template.supports_tools(), "{name}");
            let got = template
                .apply_with_tools(&messages, Some(tools), true)
                .unwrap();
            assert_eq!(got, want.as_str().unwrap(), "{name}");
        }
        // Templates that do not render tools say so.
        for name in ["smollm2-135m", "gemma2", "smollm3"] {
            let source = std::fs::read_to_string(format!("{dir}{name}.jinja")).unwrap();
            assert!(
                !ChatTemplate::new(&source).unwrap().supports_tools(),
                "{name}"
            );
        }
    }

    #[test]
    fn dates() {
        assert_eq!(strftime("%d %b %Y", 0), "01 Jan 1970");
        // 2024-02-29 12:34:56 UTC, a Thursday.
        assert_eq!(
            strftime("%A %-d %B %y %H:%M:%S", 1_709_210_096),
            "Thursday 29 February 24 12:34:56"
        );
    }

    #[test]
    fn json_like_python() {
        let t = ChatTemplate::new(
            r#"{{ {"a": [1, "é\n"], "b": {}} | tojson }}|{{ [1,2] | tojson(indent=2) }}"#,
        )
        .unwrap();
        let out = t.apply(&[], false).unwrap();
        assert_eq!(out, "{\"a\": [1, \"é\\n\"], \"b\": {}}|[\n  1,\n  2\n]");
    }

    #[test]
    fn python_methods() {
        let t = ChatTemplate::new(
            "{{ '  x y '.strip() }}|{{ 'a,b'.split(',') | join('+') }}|{{ 'abc'.startswith('ab') }}|{% for k, v in {'k': 1}.items() %}{{ k }}={{ v }}{% endfor %}",
        )
        .unwrap();
        assert_eq!(t.apply(&[], false).unwrap(), "x y|a+b|True|k=1");
    }

    #[test]
    fn jinja2_compat() {
        // Undefined has length 0; str.format fills positional and named fields.
        let t = ChatTemplate::new(
            "{% if tools is not none and tools|length > 0 %}tools{% endif %}{{ messages|length }}|{{ '<{}:{0}:{x}>{{}}'.format('a', x='b') }}",
        )
        .unwrap();
        assert_eq!(
            t.apply(&[ChatMessage::new("user", "q")], false).unwrap(),
            "1|<a:a:b>{}"
        );
    }

    #[test]
    fn loop_controls_and_time() {
        let t = ChatTemplate::new("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %} {{ strftime_now('%Y') }}")
            .unwrap()
            .with_time(1_709_210_096);
        let msgs = [ChatMessage::new("user", "a"), ChatMessage::new("user", "b")];
        assert_eq!(t.apply(&msgs, false).unwrap(), "a 2024");
    }
}

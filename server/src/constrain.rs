//! Structured output: `response_format` (and the grammar of a required tool call) compiled
//! by llguidance (as llama.cpp and mistral.rs do) into a matcher that names, before each
//! draw, the tokens that keep the output valid.

use super::api::ResponseFormat;
use super::error::ApiError;
use conductor_runtime::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;

/// The model's vocabulary as llguidance sees it: every token's bytes (special tokens behind
/// llguidance's marker byte) and a way to tokenize text.
struct Vocabulary {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.tokenizer
            .encode(&String::from_utf8_lossy(s), false, false)
    }
}

/// Compiles `response_format`s for one model.
pub struct Constraints {
    factory: ParserFactory,
}

impl Constraints {
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<Constraints, String> {
        let n_vocab = tokenizer.n_vocab();
        let eos = tokenizer
            .eot()
            .or(tokenizer.eos())
            .ok_or("the model has no end-of-text token")?;
        let words: Vec<Vec<u8>> = (0..n_vocab as u32)
            .map(|id| {
                if tokenizer.is_control(id) {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend(tokenizer.token_to_piece(id, true));
                    w
                } else {
                    tokenizer.token_to_piece(id, false)
                }
            })
            .collect();
        let info = TokRxInfo {
            tok_bos: tokenizer.bos(),
            tok_pad: tokenizer.pad(),
            tok_unk: tokenizer.unk(),
            tok_end_of_turn: tokenizer.eot(),
            ..TokRxInfo::new(n_vocab as u32, eos)
        };
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Vocabulary { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Constraints { factory })
    }

    /// The matcher for `format`, or `None` for plain text. A schema llguidance cannot compile
    /// is a 400 naming `response_format`.
    pub fn compile(&self, format: &ResponseFormat) -> Result<Option<Matcher>, ApiError> {
        let schema = match format {
            ResponseFormat::Text => return Ok(None),
            ResponseFormat::JsonObject => serde_json::json!({"type": "object"}),
            ResponseFormat::JsonSchema { json_schema } => match &json_schema.schema {
                Some(schema) => schema.clone(),
                None => {
                    return Err(ApiError::invalid_param(
                        "response_format",
                        "response_format.json_schema.schema is missing",
                    ))
                }
            },
        };
        self.matcher(TopLevelGrammar::from_json_schema(schema), "response_format")
            .map(Some)
    }

    /// The matcher for a tool call's Lark grammar (`tools::Offer::grammar`). A `parameters`
    /// schema llguidance cannot compile is a 400 naming `tools`.
    pub fn compile_lark(&self, grammar: String) -> Result<Matcher, ApiError> {
        self.matcher(TopLevelGrammar::from_lark(grammar), "tools")
    }

    fn matcher(&self, grammar: TopLevelGrammar, param: &'static str) -> Result<Matcher, ApiError> {
        let what = match param {
            "tools" => "a function's parameters schema",
            _ => "the JSON schema",
        };
        let invalid = |e: &dyn std::fmt::Display| {
            ApiError::invalid_param(
                param,
                format!("{what} cannot be used for constrained output: {e}"),
            )
            .with_code("invalid_schema")
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| invalid(&e))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(invalid(&e));
        }
        Ok(matcher)
    }
}

/// Masks `logits` to what `matcher` allows next. End-of-generation tokens stand or fall
/// together with the matcher's end-of-text token.
pub fn mask(
    matcher: &mut Matcher,
    tokenizer: &Tokenizer,
    logits: &mut [f32],
) -> Result<(), String> {
    let allowed = matcher
        .compute_mask_or_eos()
        .map_err(|e| format!("constrained output: {e}"))?;
    let eos_ok = tokenizer
        .eot()
        .or(tokenizer.eos())
        .is_some_and(|eos| allowed.is_allowed(eos));
    let mut any = false;
    for (id, logit) in logits.iter_mut().enumerate() {
        let id = id as u32;
        let ok = if tokenizer.is_eog(id) {
            eos_ok
        } else {
            (id as usize) < allowed.len() && allowed.is_allowed(id)
        };
        if ok {
            any |= logit.is_finite() || *logit == f32::INFINITY;
        } else {
            *logit = f32::NEG_INFINITY;
        }
    }
    if !any {
        return Err("constrained output: no token can continue the output".into());
    }
    Ok(())
}

/// Tells `matcher` the token drawn (end-of-generation tokens end it instead).
pub fn advance(matcher: &mut Matcher, tokenizer: &Tokenizer, token: u32) -> Result<(), String> {
    if tokenizer.is_eog(token) {
        return Ok(());
    }
    matcher
        .consume_token(token)
        .map_err(|e| format!("constrained output: {e}"))
}

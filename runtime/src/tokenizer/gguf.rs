//! Building a tokenizer from a GGUF file's `tokenizer.*` metadata.

use super::{Tokenizer, TokenizerError, TokenizerSpec};
use crate::gguf::{Array, GgufError, GgufFile};

fn bad(key: &str, e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::BadMetadata {
        key: key.to_string(),
        message: e.to_string(),
    }
}

impl TokenizerSpec {
    /// Reads the tokenizer metadata of a GGUF file (typed arrays are copied once, not
    /// converted element by element).
    pub fn from_gguf(file: &GgufFile) -> Result<TokenizerSpec, TokenizerError> {
        let string = |key: &str| -> Result<Option<String>, TokenizerError> {
            Ok(file
                .get_str(key)
                .map_err(|e| bad(key, e))?
                .map(str::to_string))
        };
        let id = |key: &str| file.get_u32(key).map_err(|e| bad(key, e));
        let flag = |key: &str| file.get_bool(key).map_err(|e| bad(key, e));
        let array = |key: &str| -> Result<Option<&Array>, TokenizerError> {
            file.get_array(key).map_err(|e: GgufError| bad(key, e))
        };
        let strings = |key: &str| -> Result<Option<Vec<String>>, TokenizerError> {
            match array(key)? {
                None => Ok(None),
                Some(a) => a
                    .as_strings()
                    .map(|s| Some(s.to_vec()))
                    .ok_or_else(|| bad(key, format!("expected strings, found {}", a.type_name()))),
            }
        };
        let model = string("tokenizer.ggml.model")?
            .ok_or_else(|| bad("tokenizer.ggml.model", "missing"))?;
        let tokens = strings("tokenizer.ggml.tokens")?
            .ok_or_else(|| bad("tokenizer.ggml.tokens", "missing"))?;
        let token_types = match array("tokenizer.ggml.token_type")? {
            None => None,
            Some(a) => Some(match a {
                Array::I32(v) => v.clone(),
                Array::U32(v) => v.iter().map(|&x| x as i32).collect(),
                other => {
                    return Err(bad(
                        "tokenizer.ggml.token_type",
                        format!("expected integers, found {}", other.type_name()),
                    ))
                }
            }),
        };
        let scores = match array("tokenizer.ggml.scores")? {
            None => None,
            Some(Array::F32(v)) => Some(v.clone()),
            Some(other) => {
                return Err(bad(
                    "tokenizer.ggml.scores",
                    format!("expected f32 values, found {}", other.type_name()),
                ))
            }
        };
        Ok(TokenizerSpec {
            model,
            pre: string("tokenizer.ggml.pre")?,
            tokens,
            token_types,
            scores,
            merges: strings("tokenizer.ggml.merges")?,
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            eot: id("tokenizer.ggml.eot_token_id")?,
            eom: id("tokenizer.ggml.eom_token_id")?,
            unk: id("tokenizer.ggml.unknown_token_id")?,
            pad: id("tokenizer.ggml.padding_token_id")?,
            // The GGUF key is spelled this way.
            sep: id("tokenizer.ggml.seperator_token_id")?,
            add_bos: flag("tokenizer.ggml.add_bos_token")?,
            add_eos: flag("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix")?,
            chat_template: string("tokenizer.chat_template")?,
            model_name: string("general.name")?,
        })
    }
}

impl Tokenizer {
    /// The tokenizer a GGUF model file describes.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::new(TokenizerSpec::from_gguf(file)?)
    }
}

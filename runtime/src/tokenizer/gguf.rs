//! Building a tokenizer from a GGUF file's `tokenizer.*` metadata.

use super::{Tokenizer, TokenizerError, TokenizerSpec};
use crate::gguf::{Array, GgufError, GgufFile};

fn bad(key: &str, e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::BadMetadata {
        key: key.to_string(),
        message: e.to_string(),
    }
}

/// The vocabulary and merges of a GGUF file, borrowed from its parsed metadata.
struct BigArrays<'f> {
    tokens: &'f [String],
    merges: Option<&'f [String]>,
}

impl TokenizerSpec {
    /// Reads the tokenizer metadata of a GGUF file (typed arrays are copied once, not
    /// converted element by element).
    pub fn from_gguf(file: &GgufFile) -> Result<TokenizerSpec, TokenizerError> {
        let (mut spec, arrays) = TokenizerSpec::from_gguf_borrowing(file)?;
        spec.tokens = arrays.tokens.to_vec();
        spec.merges = arrays.merges.map(<[String]>::to_vec);
        Ok(spec)
    }

    /// Everything but the vocabulary and merges, which are borrowed.
    fn from_gguf_borrowing(
        file: &GgufFile,
    ) -> Result<(TokenizerSpec, BigArrays<'_>), TokenizerError> {
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
        let strings = |key: &str| -> Result<Option<&[String]>, TokenizerError> {
            match array(key)? {
                None => Ok(None),
                Some(a) => a
                    .as_strings()
                    .map(Some)
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
        let arrays = BigArrays {
            tokens,
            merges: strings("tokenizer.ggml.merges")?,
        };
        let spec = TokenizerSpec {
            model,
            pre: string("tokenizer.ggml.pre")?,
            tokens: Vec::new(),
            token_types,
            scores,
            merges: None,
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
        };
        Ok((spec, arrays))
    }
}

impl Tokenizer {
    /// The tokenizer a GGUF model file describes.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let (spec, arrays) = TokenizerSpec::from_gguf_borrowing(file)?;
        Tokenizer::build(spec, arrays.tokens, arrays.merges)
    }
}

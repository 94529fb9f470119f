//! Incremental detokenization for printing tokens as they are generated.

use super::Tokenizer;

/// Turns a stream of token ids into text, holding back the bytes of an incomplete UTF-8
/// sequence until the token that completes it arrives (a token may carry part of a character).
///
/// Pieces are rendered as llama.cpp prints generated tokens: [`Tokenizer::token_to_piece`], with
/// no space cleanup. Invalid byte sequences come out as U+FFFD.
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    special: bool,
}

impl StreamDecoder {
    /// `special`: render control tokens (`<|im_end|>`, ...) as their text instead of nothing.
    pub fn new(special: bool) -> Self {
        StreamDecoder {
            pending: Vec::new(),
            special,
        }
    }

    /// Adds one token; returns the text that is complete now (possibly empty). Ids outside the
    /// vocabulary render as nothing.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        self.pending
            .extend_from_slice(tokenizer.piece(id, self.special));
        self.take_complete()
    }

    /// Returns what is held back (an unfinished sequence, as U+FFFD) and resets the decoder.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }

    /// Bytes held back, waiting for the rest of a character.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    // The prefix was just validated, so this cannot fail.
                    out.push_str(std::str::from_utf8(&self.pending[start..valid]).unwrap_or(""));
                    match e.error_len() {
                        // Invalid bytes: replace them and go on.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start = valid + n;
                        }
                        // An incomplete sequence at the end: keep it for the next token.
                        None => {
                            start = valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }
}

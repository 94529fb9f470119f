//! Tokens back into text: `llama_token_to_piece` and `llama_detokenize` (pieces, byte tokens,
//! the first piece's space, llama.cpp's cleanup of spaces before punctuation).

use super::*;

impl Tokenizer {
    /// The bytes of one token, as `llama_token_to_piece` (no space stripping): control and
    /// unknown tokens render only with `special`. Ids outside the vocabulary render as nothing;
    /// see [`Tokenizer::try_token_to_piece`] to catch them.
    pub fn token_to_piece(&self, id: u32, special: bool) -> Vec<u8> {
        self.piece(id, special).to_vec()
    }

    /// [`Tokenizer::token_to_piece`] that rejects ids outside the vocabulary.
    pub fn try_token_to_piece(&self, id: u32, special: bool) -> Result<Vec<u8>, TokenizerError> {
        self.check(id)?;
        Ok(self.token_to_piece(id, special))
    }

    fn check(&self, id: u32) -> Result<(), TokenizerError> {
        if (id as usize) < self.vocab.len() {
            Ok(())
        } else {
            Err(TokenizerError::TokenOutOfRange {
                id,
                n_vocab: self.vocab.len(),
            })
        }
    }

    pub(crate) fn piece(&self, id: u32, special: bool) -> &[u8] {
        match self.attrs.get(id as usize) {
            Some(a) if special || a & (ATTR_CONTROL | ATTR_UNKNOWN) == 0 => {
                self.pieces.get(id as usize).unwrap_or_default()
            }
            _ => &[],
        }
    }

    pub(super) fn render_piece(&self, id: u32) -> Vec<u8> {
        let text = self.vocab.text(id).unwrap_or_default();
        let attr = self.attrs[id as usize];
        if attr & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_USER_DEFINED) != 0 {
            return text.as_bytes().to_vec();
        }
        if attr & ATTR_NORMAL != 0 {
            return match self.model {
                Model::Spm { .. } => text.replace('▁', " ").into_bytes(),
                Model::Bpe(_) => {
                    let mut out = Vec::with_capacity(text.len());
                    for c in text.chars() {
                        match unicode::char_to_byte(c) {
                            Some(b) => out.push(b),
                            None => {
                                // As llama.cpp: a char outside the byte map is shown, not lost.
                                out.extend_from_slice(b"[UNK_BYTE_0x");
                                let mut buf = [0u8; 4];
                                for b in c.encode_utf8(&mut buf).bytes() {
                                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                                }
                                out.extend_from_slice(text.as_bytes());
                                out.push(b']');
                            }
                        }
                    }
                    out
                }
            };
        }
        if attr & ATTR_BYTE != 0 {
            // "<0xXX>": the hex digits at 3..5, read like strtol (stops at the first non-digit).
            let digits = text.get(3..).unwrap_or("").bytes().take(2);
            let mut v = 0u8;
            for d in digits {
                match (d as char).to_digit(16) {
                    Some(x) => v = v.wrapping_mul(16).wrapping_add(x as u8),
                    None => break,
                }
            }
            return vec![v];
        }
        Vec::new()
    }

    /// `llama_detokenize`: the pieces of `ids` joined, with the first piece's leading space
    /// dropped where the vocabulary adds one (`add_space_prefix`), BOS/EOS dropped with
    /// `remove_special`, control tokens rendered with `unparse_special`, and for vocabularies
    /// that ask for it spaces before punctuation and contractions cleaned up.
    pub fn detokenize(
        &self,
        ids: &[u32],
        remove_special: bool,
        unparse_special: bool,
    ) -> Result<Vec<u8>, TokenizerError> {
        for &id in ids {
            self.check(id)?;
        }
        let mut ids = ids;
        let mut remove_space = self.add_space_prefix;
        if remove_special && self.add_bos && ids.first().is_some_and(|&t| Some(t) == self.bos) {
            remove_space = false;
            ids = &ids[1..];
        }
        if remove_special && self.add_eos && ids.last().is_some_and(|&t| Some(t) == self.eos) {
            ids = &ids[..ids.len() - 1];
        }
        let mut text = Vec::new();
        for &id in ids {
            let mut piece = self.piece(id, unparse_special);
            if remove_space {
                piece = piece.strip_prefix(b" ").unwrap_or(piece);
            }
            remove_space = false;
            text.extend_from_slice(piece);
        }
        if self.clean_spaces {
            clean_up_spaces(&mut text);
        }
        Ok(text)
    }

    /// The text of `ids` (no special-token texts; invalid UTF-8 as U+FFFD; ids outside the
    /// vocabulary skipped). Same as `detokenize(ids, false, false)` otherwise.
    pub fn decode(&self, ids: &[u32]) -> String {
        let valid: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&i| (i as usize) < self.vocab.len())
            .collect();
        let bytes = self.detokenize(&valid, false, false).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// `clean_up_tokenization_spaces` as llama.cpp does it, in three passes over the bytes.
pub(super) fn clean_up_spaces(text: &mut Vec<u8>) {
    // " ?", " !", " .", " ,": drop the space.
    let mut out: Vec<u8> = Vec::with_capacity(text.len());
    for (i, &c) in text.iter().enumerate() {
        if i > 0 && text[i - 1] == b' ' && matches!(c, b'?' | b'!' | b'.' | b',') {
            out.pop();
        }
        out.push(c);
    }
    // " ' ": a lone apostrophe between spaces loses both spaces. The dropped space after it is
    // overwritten with NUL there, which the next comparison then sees: kept that way.
    let mut src = std::mem::take(&mut out);
    let mut i = 0;
    while i < src.len() {
        let c = src[i];
        if i > 0 && c == b'\'' && i + 1 < src.len() && src[i - 1] == b' ' && src[i + 1] == b' ' {
            out.pop();
            src[i + 1] = 0;
            out.push(c);
            i += 2;
            continue;
        }
        out.push(c);
        i += 1;
    }
    // " 's", " 'm", " 're", " 've": the contraction joins the word before.
    let src = std::mem::take(&mut out);
    for (i, &c) in src.iter().enumerate() {
        if i > 0 && src[i - 1] == b' ' && c == b'\'' && i + 1 < src.len() {
            let c1 = src[i + 1];
            let c2 = src.get(i + 2).copied();
            let joins = matches!(c1, b's' | b'm')
                || (i + 2 < src.len()
                    && matches!((c1, c2), (b'r', Some(b'e')) | (b'v', Some(b'e'))));
            if joins {
                out.pop();
            }
        }
        out.push(c);
    }
    *text = out;
}

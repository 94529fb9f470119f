//! The tokenizer a synthetic model carries: byte-level BPE or SentencePiece vocabularies and
//! their metadata.

use super::arch::VocabInfo;
use crate::gguf::{Array, GgufError, GgufWriter, Value};

/// GPT-2's byte ↔ printable-character map (bytes that are not printable ASCII/Latin-1 are
/// shifted past 255), so that every byte is a token.
pub fn byte_to_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        return b as char;
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).expect("valid char")
}

/// The vocabulary `vocab` describes, `n_vocab` tokens, with its tokenizer's metadata.
pub(super) fn add_vocab(
    w: &mut GgufWriter,
    vocab: &VocabInfo,
    n_vocab: u32,
) -> Result<(), GgufError> {
    match *vocab {
        VocabInfo::Bpe {
            pre,
            specials,
            bos,
            eos,
            add_bos,
        } => {
            add_bpe_vocab(w, n_vocab, pre, specials)?;
            w.add_metadata("tokenizer.ggml.eos_token_id", Value::U32(eos))?;
            w.add_metadata("tokenizer.ggml.bos_token_id", Value::U32(bos))?;
            w.add_metadata("tokenizer.ggml.add_bos_token", Value::Bool(add_bos))?;
        }
        VocabInfo::Spm {
            specials,
            bos,
            eos,
            unk,
            add_bos,
            add_space_prefix,
        } => {
            add_spm_vocab(w, n_vocab, specials, unk)?;
            w.add_metadata("tokenizer.ggml.bos_token_id", Value::U32(bos))?;
            w.add_metadata("tokenizer.ggml.eos_token_id", Value::U32(eos))?;
            w.add_metadata("tokenizer.ggml.unknown_token_id", Value::U32(unk))?;
            w.add_metadata("tokenizer.ggml.add_bos_token", Value::Bool(add_bos))?;
            w.add_metadata("tokenizer.ggml.add_eos_token", Value::Bool(false))?;
            w.add_metadata(
                "tokenizer.ggml.add_space_prefix",
                Value::Bool(add_space_prefix),
            )?;
        }
    }
    w.add_metadata(
        "tokenizer.chat_template",
        Value::String(
            "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}\
             {% if add_generation_prompt %}assistant: {% endif %}"
                .into(),
        ),
    )?;
    Ok(())
}

/// A byte-level BPE vocabulary: 256 byte tokens, the control tokens `specials`, then merged
/// pairs of lowercase letters (each with its merge rule) up to `n_vocab`.
fn add_bpe_vocab(
    w: &mut GgufWriter,
    n_vocab: u32,
    pre: &str,
    specials: &[&str],
) -> Result<(), GgufError> {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_to_char(b).to_string()).collect();
    let mut types = vec![1i32; 256];
    tokens.extend(specials.iter().map(|s| s.to_string()));
    types.extend(specials.iter().map(|_| 3));
    let mut merges = Vec::new();
    'outer: for a in b'a'..=b'z' {
        for b in b'a'..=b'z' {
            if tokens.len() >= n_vocab as usize {
                break 'outer;
            }
            tokens.push(format!("{}{}", a as char, b as char));
            types.push(1);
            merges.push(format!("{} {}", a as char, b as char));
        }
    }
    while tokens.len() < n_vocab as usize {
        tokens.push(format!("<|unused{}|>", tokens.len()));
        types.push(5);
    }
    w.add_metadata("tokenizer.ggml.model", Value::String("gpt2".into()))?;
    w.add_metadata("tokenizer.ggml.pre", Value::String(pre.into()))?;
    w.add_metadata("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))?;
    w.add_metadata("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))?;
    w.add_metadata("tokenizer.ggml.merges", Value::Array(Array::String(merges)))?;
    Ok(())
}

/// A SentencePiece vocabulary: `specials` (control tokens, `unk` unknown), the 256 byte tokens
/// `<0xNN>`, `▁`, then `▁`-prefixed letters and letter pairs with descending scores, padded
/// with unused tokens up to `n_vocab`.
fn add_spm_vocab(
    w: &mut GgufWriter,
    n_vocab: u32,
    specials: &[&str],
    unk: u32,
) -> Result<(), GgufError> {
    let mut tokens: Vec<String> = specials.iter().map(|s| s.to_string()).collect();
    let mut types: Vec<i32> = (0..specials.len() as u32)
        .map(|i| if i == unk { 2 } else { 3 })
        .collect();
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    types.extend([6; 256]);
    let letters = (b'a'..=b'z').map(|a| (a as char).to_string());
    let pairs = (b'a'..=b'z')
        .flat_map(|a| (b'a'..=b'z').map(move |b| format!("{}{}", a as char, b as char)));
    let words = std::iter::once(String::new())
        .chain(letters.clone())
        .chain(pairs)
        .map(|w| format!("\u{2581}{w}"))
        .chain(letters);
    for word in words {
        if tokens.len() >= n_vocab as usize {
            break;
        }
        tokens.push(word);
        types.push(1);
    }
    while tokens.len() < n_vocab as usize {
        tokens.push(format!("<unused{}>", tokens.len()));
        types.push(5);
    }
    // Words score by rank (earlier is likelier); control and byte tokens 0.
    let first_word = specials.len() + 256;
    let scores = (0..tokens.len())
        .map(|i| {
            if i < first_word {
                0.0
            } else {
                -((i - first_word) as f32)
            }
        })
        .collect();
    w.add_metadata("tokenizer.ggml.model", Value::String("llama".into()))?;
    w.add_metadata("tokenizer.ggml.pre", Value::String("default".into()))?;
    w.add_metadata("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))?;
    w.add_metadata("tokenizer.ggml.scores", Value::Array(Array::F32(scores)))?;
    w.add_metadata("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))?;
    Ok(())
}

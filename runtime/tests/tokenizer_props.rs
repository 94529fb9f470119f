//! Properties: encoding is lossless (SentencePiece up to `▁`), nothing panics on any input.

use std::sync::LazyLock;

use conductor_runtime::tokenizer::{StreamDecoder, Tokenizer, TokenizerSpec};
use proptest::prelude::*;

fn byte_char(b: u8) -> char {
    let printable = |x: u32| matches!(x, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b as u32) {
        return b as char;
    }
    let n = (0..b as u32).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap()
}

/// Byte-level BPE: two special tokens, the 256 bytes, a few merges.
fn bpe(pre: &str) -> Tokenizer {
    let mut tokens = vec!["<|im_start|>".to_string(), "<tool>".to_string()];
    let mut types = vec![3, 4];
    for b in 0..=255u8 {
        tokens.push(byte_char(b).to_string());
        types.push(1);
    }
    let merges = [
        "Ġ t", "t h", "Ġt h", "h e", "Ġth e", "e r", "Ġ Ġ", "Ċ Ċ", "Ã ©", "1 2", "Ġ a", "a n",
        "an d",
    ];
    for m in merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    Tokenizer::new(TokenizerSpec {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types: Some(types),
        merges: Some(merges.iter().map(|m| m.to_string()).collect()),
        bos: Some(0),
        eos: Some(0),
        add_bos: Some(true),
        add_eos: Some(true),
        ..Default::default()
    })
    .unwrap()
}

/// SentencePiece with byte fallback (no user-defined tokens: those get a space prefixed after
/// them, which a round trip cannot undo).
fn spm() -> Tokenizer {
    let mut tokens = vec![
        "<unk>".to_string(),
        "<s>".into(),
        "</s>".into(),
        "<|im_start|>".into(),
    ];
    let mut types = vec![2, 3, 3, 3];
    let mut scores = vec![0.0; 4];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (i, p) in [
        "▁", "▁t", "h", "e", "▁the", "a", "n", "d", "▁and", "é", "中", "中文",
    ]
    .iter()
    .enumerate()
    {
        tokens.push(p.to_string());
        types.push(1);
        scores.push(-(i as f32));
    }
    Tokenizer::new(TokenizerSpec {
        model: "llama".into(),
        tokens,
        token_types: Some(types),
        scores: Some(scores),
        ..Default::default()
    })
    .unwrap()
}

static SMOLLM: LazyLock<Tokenizer> = LazyLock::new(|| bpe("smollm"));
static LLAMA3: LazyLock<Tokenizer> = LazyLock::new(|| bpe("llama-bpe"));
static QWEN2: LazyLock<Tokenizer> = LazyLock::new(|| bpe("qwen2"));
static GPT2: LazyLock<Tokenizer> = LazyLock::new(|| bpe("gpt-2"));
static DEFAULT: LazyLock<Tokenizer> = LazyLock::new(|| bpe("default"));
static SPM: LazyLock<Tokenizer> = LazyLock::new(spm);

/// Arbitrary Unicode mixed with the pieces the rules care about.
fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        any::<String>(),
        "[ a-z\n\t0-9'.,!?-]{0,12}",
        Just("<|im_start|>".to_string()),
        Just("<|im_sta".to_string()),
        Just("<tool>".to_string()),
        Just("   ".to_string()),
        Just("1234567".to_string()),
        Just("the and é 中文 🦙".to_string()),
        Just("\u{2581}".to_string()),
    ];
    proptest::collection::vec(piece, 0..6).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn tokenizer_bpe_is_lossless(s in text()) {
        // (Llama 3 and GPT-2 vocabularies clean up spaces before punctuation when decoding.)
        for tok in [&*SMOLLM, &*QWEN2] {
            for parse_special in [false, true] {
                let ids = tok.encode(&s, false, parse_special);
                prop_assert!(ids.iter().all(|&i| (i as usize) < tok.n_vocab()));
                // Control tokens come back with unparse_special.
                let back = tok.detokenize(&ids, false, true).unwrap();
                prop_assert_eq!(String::from_utf8(back).unwrap(), s.clone());
            }
            // Without special tokens parsed, decode alone gives the text back.
            prop_assert_eq!(tok.decode(&tok.encode(&s, false, false)), s.clone());
        }
    }

    #[test]
    fn tokenizer_sentencepiece_is_lossless_up_to_the_space_marker(s in text()) {
        let ids = SPM.encode(&s, false, false);
        prop_assert!(ids.iter().all(|&i| (i as usize) < SPM.n_vocab()));
        // The prefixed space is dropped again; a literal "▁" reads as a space.
        prop_assert_eq!(SPM.decode(&ids), s.replace('\u{2581}', " "));
    }

    #[test]
    fn tokenizer_encoding_never_panics(s in text(), add in any::<bool>(), parse in any::<bool>()) {
        for tok in [&*SMOLLM, &*LLAMA3, &*QWEN2, &*GPT2, &*DEFAULT, &*SPM] {
            let ids = tok.encode(&s, add, parse);
            prop_assert!(ids.iter().all(|&i| (i as usize) < tok.n_vocab()));
            // add_special brackets the text with BOS and EOS in these vocabularies.
            if add && !std::ptr::eq(tok, &*SPM) {
                prop_assert_eq!(ids.first(), Some(&0));
                prop_assert_eq!(ids.last(), Some(&0));
            }
        }
    }

    #[test]
    fn tokenizer_any_ids_decode_without_panicking(ids in proptest::collection::vec(any::<u32>(), 0..16),
                                        small in proptest::collection::vec(0u32..300, 0..16)) {
        for tok in [&*SMOLLM, &*GPT2, &*SPM] {
            for seq in [&ids, &small] {
                let all_valid = seq.iter().all(|&i| (i as usize) < tok.n_vocab());
                prop_assert_eq!(tok.detokenize(seq, true, true).is_ok(), all_valid);
                let text = tok.decode(seq);
                let mut stream = StreamDecoder::new(false);
                let mut streamed: String = seq.iter().map(|&i| stream.push(tok, i)).collect();
                streamed.push_str(&stream.finish());
                for &i in seq.iter() {
                    prop_assert_eq!(tok.try_token_to_piece(i, true).is_ok(), (i as usize) < tok.n_vocab());
                }
                // Without space cleanup or a space prefix, streaming equals decoding.
                if std::ptr::eq(tok, &*SMOLLM) {
                    prop_assert_eq!(streamed, text);
                }
            }
        }
    }
}

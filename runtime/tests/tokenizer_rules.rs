//! The tokenizer rules one at a time, on tiny vocabularies built here.

use conductor_runtime::tokenizer::{
    ChatTemplate, StreamDecoder, Tokenizer, TokenizerError, TokenizerSpec,
};

/// GPT-2's byte → char map (printable Latin-1 as is, other bytes from U+0100 on).
fn byte_char(b: u8) -> char {
    let printable = |x: u32| matches!(x, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b as u32) {
        return b as char;
    }
    let n = (0..b as u32).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap()
}

fn encoded(s: &str) -> String {
    s.bytes().map(byte_char).collect()
}

/// A byte-level BPE vocabulary: `specials` (text, type) first, then the 256 bytes, then the
/// result of each merge (merges written with plain text, e.g. " h" is "Ġh"), then `extra`.
fn bpe(pre: &str, merges: &[(&str, &str)], extra: &[&str], specials: &[(&str, i32)]) -> Tokenizer {
    let mut tokens: Vec<String> = specials.iter().map(|s| s.0.to_string()).collect();
    let mut types: Vec<i32> = specials.iter().map(|s| s.1).collect();
    for b in 0..=255u8 {
        tokens.push(byte_char(b).to_string());
        types.push(1);
    }
    let mut lines = Vec::new();
    for (a, b) in merges {
        let (a, b) = (encoded(a), encoded(b));
        lines.push(format!("{a} {b}"));
        let merged = format!("{a}{b}");
        if !tokens.contains(&merged) {
            tokens.push(merged);
            types.push(1);
        }
    }
    for e in extra {
        tokens.push(encoded(e));
        types.push(1);
    }
    Tokenizer::new(TokenizerSpec {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types: Some(types),
        merges: Some(lines),
        ..Default::default()
    })
    .unwrap()
}

/// The pieces of `text` as plain strings (lossy), for readable expectations.
fn pieces(tok: &Tokenizer, text: &str, parse_special: bool) -> Vec<String> {
    tok.encode(text, false, parse_special)
        .into_iter()
        .map(|id| String::from_utf8_lossy(&tok.token_to_piece(id, true)).into_owned())
        .collect()
}

#[test]
fn tokenizer_lowest_rank_merges_first() {
    let bc_first = bpe("gpt-2", &[("b", "c"), ("a", "b")], &[], &[]);
    assert_eq!(pieces(&bc_first, "abc", false), ["a", "bc"]);
    let ab_first = bpe("gpt-2", &[("a", "b"), ("b", "c"), ("ab", "c")], &[], &[]);
    assert_eq!(pieces(&ab_first, "abc", false), ["abc"]);
    assert_eq!(pieces(&ab_first, "abcbc", false), ["abc", "bc"]);
}

#[test]
fn tokenizer_equal_pairs_merge_leftmost_first() {
    let tok = bpe("gpt-2", &[("a", "a")], &[], &[]);
    assert_eq!(pieces(&tok, "aaa", false), ["aa", "a"]);
    assert_eq!(pieces(&tok, "aaaa", false), ["aa", "aa"]);
}

#[test]
fn tokenizer_a_merge_through_a_string_that_is_no_token() {
    // "qz" is not a token, but it is a step to "qza"; alone it falls back to its bytes.
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    tokens.push("qza".into());
    let tok = Tokenizer::new(TokenizerSpec {
        model: "gpt2".into(),
        pre: Some("gpt-2".into()),
        tokens,
        merges: Some(vec!["q z".into(), "qz a".into()]),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(pieces(&tok, "qza", false), ["qza"]);
    assert_eq!(pieces(&tok, "qz", false), ["q", "z"]);
}

#[test]
fn tokenizer_words_do_not_merge_across_pre_tokenizer_boundaries() {
    let merges = [
        (" ", " "),
        (" ", "b"),
        ("\n", "\n"),
        ("1", "2"),
        ("12", "3"),
    ];
    let gpt2 = bpe("gpt-2", &merges, &[], &[]);
    // Two spaces before a word: one stays alone, the other leads the word.
    assert_eq!(pieces(&gpt2, "a   b", false), ["a", "  ", " b"]);
    assert_eq!(pieces(&gpt2, "a\n\n", false), ["a", "\n\n"]);
    assert_eq!(pieces(&gpt2, "1234", false), ["123", "4"]);
    // SmolLM2 (and StarCoder) split every digit.
    let smollm = bpe("smollm", &merges, &[], &[]);
    assert_eq!(pieces(&smollm, "1234", false), ["1", "2", "3", "4"]);
    // Llama 3: groups of up to three digits.
    let llama3 = bpe("llama-bpe", &merges, &[], &[]);
    assert_eq!(pieces(&llama3, "123123", false), ["123", "123"]);
    // Qwen 2: single digits; a space before a letter joins it, before a digit it does not.
    let qwen2 = bpe("qwen2", &merges, &[], &[]);
    assert_eq!(pieces(&qwen2, "12 b 1", false), ["1", "2", " b", " ", "1"]);
}

#[test]
fn tokenizer_contractions_split_by_pre_tokenizer() {
    let merges = [("'", "s"), ("'", "S")];
    // GPT-2: lowercase contractions only.
    let gpt2 = bpe("gpt-2", &merges, &[], &[]);
    assert_eq!(
        pieces(&gpt2, "it's IT'S", false),
        ["i", "t", "'s", " ", "I", "T", "'", "S"]
    );
    // Llama 3: case-insensitive.
    let llama3 = bpe("llama-bpe", &merges, &[], &[]);
    assert_eq!(
        pieces(&llama3, "it's IT'S", false),
        ["i", "t", "'s", " ", "I", "T", "'S"]
    );
}

#[test]
fn tokenizer_utf8_is_merged_from_bytes() {
    // "é" is C3 A9, two byte symbols ("Ã", "©" byte-encoded); one merge makes it a token.
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    tokens.push("Ã©".into());
    let tok = Tokenizer::new(TokenizerSpec {
        model: "gpt2".into(),
        pre: Some("smollm".into()),
        tokens,
        merges: Some(vec!["Ã ©".into()]),
        ..Default::default()
    })
    .unwrap();
    let ids = tok.encode("é🦙", false, false);
    assert_eq!(ids.len(), 1 + 4, "{ids:?}");
    assert_eq!(tok.token_to_piece(ids[0], false), "é".as_bytes());
    // A token may hold part of a character: pieces are bytes.
    assert_eq!(tok.token_to_piece(ids[1], false), [0xF0]);
    assert_eq!(tok.decode(&ids), "é🦙");
}

#[test]
fn tokenizer_whole_word_tokens_skip_merges_where_the_pre_tokenizer_says_so() {
    // " zebra" is a token no merge reaches: Llama 3 takes it whole, GPT-2 cannot.
    let llama3 = bpe("llama-bpe", &[], &[" zebra"], &[]);
    assert_eq!(pieces(&llama3, "a zebra", false), ["a", " zebra"]);
    let gpt2 = bpe("gpt-2", &[], &[" zebra"], &[]);
    assert_eq!(pieces(&gpt2, "a zebra", false).len(), 7);
}

#[test]
fn tokenizer_special_tokens_are_cut_out_longest_first() {
    let specials = [
        ("<|im_start|>", 3),
        ("<|im", 3),
        ("<tool>", 4),
        ("<|endoftext|>", 3),
    ];
    let tok = bpe("smollm", &[], &[], &specials);
    assert_eq!(
        tok.encode("<|im_start|>hi<|im", false, true),
        [0, 'h' as u32 + 4, 'i' as u32 + 4, 1]
    );
    // Control tokens need parse_special; user-defined ones never do.
    let plain = tok.encode("<|im_start|>", false, false);
    assert_eq!(plain.len(), "<|im_start|>".len());
    assert_eq!(
        tok.encode("a<tool>b", false, false),
        ['a' as u32 + 4, 2, 'b' as u32 + 4]
    );
    // A partial marker is text.
    assert_eq!(
        pieces(&tok, "<|endof", true),
        ["<", "|", "e", "n", "d", "o", "f"]
    );
    assert!(tok.is_eog(3) && !tok.is_eog(0));
    // Control tokens render only with `special`; user-defined ones always.
    assert_eq!(tok.decode(&[0, 2, 3]), "<tool>");
    assert_eq!(
        tok.detokenize(&[0, 2, 3], false, true).unwrap(),
        b"<|im_start|><tool><|endoftext|>"
    );
}

#[test]
fn tokenizer_bytes_without_a_token_are_dropped() {
    // As llama.cpp: a symbol that is no token falls back to one-byte tokens where they exist.
    let mut tokens: Vec<String> = (0..=255u8)
        .filter(|&b| b != 0x1F)
        .map(|b| byte_char(b).to_string())
        .collect();
    tokens.push("<|endoftext|>".into());
    let tok = Tokenizer::new(TokenizerSpec {
        model: "gpt2".into(),
        pre: Some("gpt-2".into()),
        tokens,
        merges: Some(vec![]),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(tok.decode(&tok.encode("a\u{1f}b", false, false)), "ab");
}

#[test]
fn tokenizer_bos_and_eos_follow_the_vocabulary() {
    let mut spec = TokenizerSpec {
        model: "gpt2".into(),
        pre: Some("qwen2".into()),
        tokens: (0..=255u8).map(|b| byte_char(b).to_string()).collect(),
        merges: Some(vec![]),
        bos: Some(1),
        eos: Some(2),
        add_bos: Some(true),
        add_eos: Some(true),
        ..Default::default()
    };
    let tok = Tokenizer::new(spec.clone()).unwrap();
    // Token ids are the byte values here.
    assert_eq!(tok.encode("a", true, false), [1, 97, 2]);
    assert_eq!(tok.encode("a", false, false), [97]);
    // No add_* flags: gpt2 vocabularies add nothing by default, Llama 3 ones a BOS.
    spec.add_bos = None;
    spec.add_eos = None;
    assert_eq!(
        Tokenizer::new(spec.clone())
            .unwrap()
            .encode("", true, false),
        Vec::<u32>::new()
    );
    spec.pre = Some("llama-bpe".into());
    assert_eq!(Tokenizer::new(spec).unwrap().encode("", true, false), [1]);
}

/// A SentencePiece vocabulary: <unk>, <s>, </s>, optionally the 256 byte tokens, then pieces.
fn spm(pieces: &[(&str, f32)], byte_tokens: bool, add_space_prefix: Option<bool>) -> Tokenizer {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0, 0.0, 0.0];
    if byte_tokens {
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
            scores.push(0.0);
        }
    }
    tokens.push("<|im_start|>".into());
    types.push(3);
    scores.push(0.0);
    for (p, s) in pieces {
        tokens.push(p.to_string());
        types.push(1);
        scores.push(*s);
    }
    Tokenizer::new(TokenizerSpec {
        model: "llama".into(),
        tokens,
        token_types: Some(types),
        scores: Some(scores),
        add_space_prefix,
        ..Default::default()
    })
    .unwrap()
}

fn spm_pieces(tok: &Tokenizer, text: &str) -> Vec<String> {
    tok.encode(text, false, true)
        .into_iter()
        .map(|id| tok.token_text(id).unwrap().to_string())
        .collect()
}

#[test]
fn tokenizer_sentencepiece_merges_by_score_with_space_prefix() {
    let vocab = [
        ("▁", -1.0),
        ("a", -2.0),
        ("b", -2.0),
        ("c", -2.0),
        ("▁a", -1.5),
        ("ab", -3.0),
        ("bc", -0.5),
    ];
    let tok = spm(&vocab, true, None);
    // The best-scoring pair first: "bc" before "▁a"; "ab" never gets a chance.
    assert_eq!(spm_pieces(&tok, "abc"), ["▁a", "bc"]);
    // Defaults: BOS added, a space prefixed to the text and after special tokens.
    assert_eq!(
        tok.encode("a", true, true),
        [1, tok.token_id("▁a").unwrap()]
    );
    assert_eq!(spm_pieces(&tok, "<|im_start|>a"), ["<|im_start|>", "▁a"]);
    // Detokenizing drops the prefixed space again, but (as in llama.cpp) not after a BOS.
    assert_eq!(tok.decode(&tok.encode("a bc", false, false)), "a bc");
    assert_eq!(tok.decode(&tok.encode("a bc", true, false)), " a bc");
    let no_prefix = spm(&vocab, true, Some(false));
    assert_eq!(spm_pieces(&no_prefix, "abc"), ["a", "bc"]);
}

#[test]
fn tokenizer_sentencepiece_equal_scores_merge_leftmost() {
    let tok = spm(
        &[
            ("a", -2.0),
            ("b", -2.0),
            ("c", -2.0),
            ("ab", -1.0),
            ("bc", -1.0),
        ],
        true,
        Some(false),
    );
    assert_eq!(spm_pieces(&tok, "abc"), ["ab", "c"]);
}

#[test]
fn tokenizer_sentencepiece_byte_fallback_and_unknown() {
    let tok = spm(&[("▁", -1.0), ("a", -1.0)], true, None);
    // "é" is not a piece: its UTF-8 bytes.
    assert_eq!(spm_pieces(&tok, "aé"), ["▁", "a", "<0xC3>", "<0xA9>"]);
    assert_eq!(tok.decode(&tok.encode("aé", false, false)), "aé");
    // Without byte tokens the unknown token stands in for each byte.
    let no_bytes = spm(&[("▁", -1.0), ("a", -1.0)], false, None);
    assert_eq!(spm_pieces(&no_bytes, "aé"), ["▁", "a", "<unk>", "<unk>"]);
}

#[test]
fn tokenizer_streaming_waits_for_complete_characters() {
    let tok = bpe("smollm", &[], &[], &[]);
    let ids = tok.encode("a🦙b", false, false);
    assert_eq!(ids.len(), 6);
    let mut dec = StreamDecoder::new(false);
    let out: Vec<String> = ids.iter().map(|&id| dec.push(&tok, id)).collect();
    assert_eq!(out, ["a", "", "", "", "🦙", "b"]);
    assert_eq!(dec.finish(), "");
    // An unfinished character at the end comes out as U+FFFD; invalid bytes too.
    let mut dec = StreamDecoder::new(false);
    assert_eq!(dec.push(&tok, ids[1]), "");
    assert_eq!(dec.pending_len(), 1);
    assert_eq!(dec.finish(), "\u{FFFD}");
    let cont = tok.encode("\u{80}", false, false)[1]; // a lone continuation byte
    assert_eq!(dec.push(&tok, cont), "\u{FFFD}");
    // Ids outside the vocabulary render as nothing.
    assert_eq!(dec.push(&tok, u32::MAX), "");
}

#[test]
fn tokenizer_bad_metadata_is_an_error() {
    let base = TokenizerSpec {
        model: "gpt2".into(),
        pre: Some("gpt-2".into()),
        tokens: vec!["a".into(), "b".into()],
        merges: Some(vec!["a b".into()]),
        ..Default::default()
    };
    let err = |spec: TokenizerSpec| Tokenizer::new(spec).unwrap_err();
    let e = err(TokenizerSpec {
        model: "bert".into(),
        ..base.clone()
    });
    assert!(
        matches!(&e, TokenizerError::UnsupportedModel(m) if m == "bert"),
        "{e}"
    );
    assert!(e.to_string().contains("'bert'"));
    let e = err(TokenizerSpec {
        pre: Some("mystery".into()),
        ..base.clone()
    });
    assert!(e.to_string().contains("'mystery'"), "{e}");
    assert!(matches!(
        err(TokenizerSpec {
            merges: None,
            ..base.clone()
        }),
        TokenizerError::MissingMerges
    ));
    assert!(matches!(
        err(TokenizerSpec {
            tokens: vec![],
            ..base.clone()
        }),
        TokenizerError::EmptyVocab
    ));
    let e = err(TokenizerSpec {
        scores: Some(vec![0.0]),
        ..base.clone()
    });
    assert!(matches!(
        e,
        TokenizerError::LengthMismatch {
            what: "tokenizer.ggml.scores",
            got: 1,
            n_tokens: 2
        }
    ));
    let e = err(TokenizerSpec {
        token_types: Some(vec![1]),
        ..base.clone()
    });
    assert!(matches!(e, TokenizerError::LengthMismatch { got: 1, .. }));
    // Special ids outside the vocabulary are ignored, as llama.cpp does.
    let tok = Tokenizer::new(TokenizerSpec {
        bos: Some(99),
        eos: Some(1),
        ..base
    })
    .unwrap();
    assert_eq!((tok.bos(), tok.eos()), (None, Some(1)));
    assert!(matches!(
        tok.try_token_to_piece(2, false),
        Err(TokenizerError::TokenOutOfRange { id: 2, n_vocab: 2 })
    ));
    assert!(tok.detokenize(&[0, 7], false, false).is_err());
    assert_eq!(tok.decode(&[0, 7, 1]), "ab");
}

#[test]
fn tokenizer_from_gguf_metadata() {
    use conductor_runtime::gguf::{Array, GgufFile, GgufWriter, Value};
    let strings =
        |v: &[&str]| Value::Array(Array::String(v.iter().map(|s| s.to_string()).collect()));
    let mut w = GgufWriter::new();
    w.add_metadata("tokenizer.ggml.model", "gpt2").unwrap();
    w.add_metadata("tokenizer.ggml.pre", "smollm").unwrap();
    w.add_metadata(
        "tokenizer.ggml.tokens",
        strings(&["a", "b", "ab", "<|im_end|>"]),
    )
    .unwrap();
    w.add_metadata(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(vec![1, 1, 1, 3])),
    )
    .unwrap();
    w.add_metadata("tokenizer.ggml.merges", strings(&["a b"]))
        .unwrap();
    w.add_metadata("tokenizer.ggml.eos_token_id", Value::U32(3))
        .unwrap();
    w.add_metadata("tokenizer.ggml.add_bos_token", false)
        .unwrap();
    w.add_metadata("tokenizer.chat_template", "{{ messages[0].content }}")
        .unwrap();
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let spec = TokenizerSpec::from_gguf(&file).unwrap();
    assert_eq!(spec.tokens.len(), 4);
    assert_eq!(
        (spec.eos, spec.add_bos, spec.bos),
        (Some(3), Some(false), None)
    );
    let tok = Tokenizer::from_gguf(&file).unwrap();
    assert_eq!(tok.encode("ab<|im_end|>", false, true), [2, 3]);
    assert!(tok.is_eog(3));
    assert_eq!(
        tok.chat_template_source(),
        Some("{{ messages[0].content }}")
    );

    let mut wrong = GgufWriter::new();
    wrong
        .add_metadata("tokenizer.ggml.model", Value::U32(1))
        .unwrap();
    let file = GgufFile::from_bytes(wrong.to_bytes().unwrap()).unwrap();
    let e = TokenizerSpec::from_gguf(&file).unwrap_err();
    assert!(e.to_string().contains("tokenizer.ggml.model"), "{e}");
    let empty = GgufFile::from_bytes(GgufWriter::new().to_bytes().unwrap()).unwrap();
    let e = TokenizerSpec::from_gguf(&empty).unwrap_err();
    assert!(e.to_string().contains("missing"), "{e}");
}

#[test]
fn tokenizer_chat_template_errors_are_reported() {
    let e = ChatTemplate::new("{% for m in messages %}{{ m.content }").unwrap_err();
    assert!(matches!(e, TokenizerError::Template(_)), "{e}");
    let raising = ChatTemplate::new(
        "{% if messages[0].role != 'system' %}{{ raise_exception('first message must be system') }}{% endif %}",
    )
    .unwrap();
    let e = raising
        .apply(
            &[conductor_runtime::tokenizer::ChatMessage::new("user", "hi")],
            false,
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("first message must be system"),
        "{e}"
    );
    // strftime_now needs a time from the caller (the runtime reads no clock).
    let dated = ChatTemplate::new("{{ strftime_now('%d %b %Y') }}").unwrap();
    assert!(dated.apply(&[], false).is_err());
    assert_eq!(dated.with_time(0).apply(&[], false).unwrap(), "01 Jan 1970");
}

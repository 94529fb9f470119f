//! Unit tests of the tokenizer's own parts (sharing, empty and repeated vocabulary texts,
//! llama.cpp's space cleanup).

use super::detok::clean_up_spaces;
use super::*;

#[test]
fn tokenizer_is_shareable() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Tokenizer>();
}

#[test]
fn empty_and_repeated_texts_follow_llama_cpp() {
    // SentencePiece vocabulary: an empty text becomes `[EMPTY_<id>]`, a repeated text
    // is found at its last id, and every id keeps its own text.
    let tok = Tokenizer::new(TokenizerSpec {
        model: "llama".into(),
        tokens: ["<unk>", "<s>", "</s>", "", "▁a", "▁a", "b"]
            .map(String::from)
            .to_vec(),
        ..TokenizerSpec::default()
    })
    .unwrap();
    assert_eq!(tok.n_vocab(), 7);
    assert_eq!(tok.token_text(3), Some("[EMPTY_3]"));
    assert_eq!(tok.token_id("[EMPTY_3]"), Some(3));
    assert_eq!(tok.token_id(""), None);
    assert_eq!(tok.token_id("▁a"), Some(5));
    assert_eq!(tok.token_text(4), Some("▁a"));
    assert_eq!(tok.token_text(7), None);
    assert_eq!(tok.token_to_piece(6, false), b"b");
    assert_eq!(tok.token_to_piece(4, false), b" a");
}

#[test]
fn space_cleanup_matches_llama_cpp() {
    // Outputs of llama_detokenize on a GPT-2 vocabulary.
    for (raw, clean) in [
        ("x ' ' y", "x'' y"),
        ("we 're here , ok .", "we're here, ok."),
        ("don 't", "don 't"),
        ("I 'll go ?", "I 'll go?"),
        ("x 's 'm 've 'd", "x's'm've 'd"),
        (" ' ", "'"),
    ] {
        let mut text = raw.as_bytes().to_vec();
        clean_up_spaces(&mut text);
        assert_eq!(String::from_utf8(text).unwrap(), clean, "{raw:?}");
    }
}

//! The default model's tokenizer, read from its GGUF file, reproduces llama.cpp's token ids for
//! every reference prompt, and its chat template renders the reference chat prompts exactly.

mod common;

use conductor::runtime::gguf::GgufFile;
use conductor::runtime::tokenizer::{ChatMessage, Tokenizer};

fn tokenizer() -> Tokenizer {
    let file = GgufFile::open(&common::default_model()).unwrap();
    Tokenizer::from_gguf(&file).unwrap()
}

#[test]
fn reference_prompts_tokenize_like_llama_cpp() {
    let tok = tokenizer();
    assert!(!tok.add_bos(), "SmolLM2 adds no BOS");
    let refs = common::references();
    assert_eq!(refs.len(), 8);
    for r in &refs {
        // llama.cpp made prompt_ids with special tokens parsed and no BOS.
        assert_eq!(tok.encode(&r.prompt, true, true), r.prompt_ids, "{}", r.id);
        // Byte-level BPE is lossless: the ids give the prompt back.
        let back = tok.detokenize(&r.prompt_ids, false, true).unwrap();
        assert_eq!(String::from_utf8(back).unwrap(), r.prompt, "{}", r.id);
    }
}

#[test]
fn special_tokens_and_end_of_generation() {
    let tok = tokenizer();
    // <|endoftext|> 0, <|im_end|> 2 (also EOS), and <reponame> 4, a FIM repo marker.
    assert_eq!(tok.eog_tokens(), vec![0, 2, 4]);
    assert!(tok.is_eog(2) && !tok.is_eog(1) && !tok.is_eog(u32::MAX));
    assert_eq!((tok.bos(), tok.eos()), (Some(1), Some(2)));
    assert_eq!(tok.token_to_piece(2, true), b"<|im_end|>");
    assert!(tok.token_to_piece(2, false).is_empty());
    // Without parse_special the marker is plain text.
    let plain = tok.encode("<|im_end|>", false, false);
    assert!(plain.len() > 1 && !plain.contains(&2), "{plain:?}");
    assert_eq!(tok.decode(&plain), "<|im_end|>");
}

#[test]
fn chat_template_renders_the_reference_chat_prompts() {
    let tmpl = tokenizer().chat_template().unwrap();
    let chats: Vec<String> = common::references()
        .into_iter()
        .filter(|r| r.chat_template)
        .map(|r| r.prompt)
        .collect();
    assert_eq!(chats.len(), 2);
    // Without a system message the template supplies SmolLM's default one.
    let japan = tmpl
        .apply(
            &[ChatMessage::new("user", "What is the capital of Japan?")],
            true,
        )
        .unwrap();
    assert_eq!(japan, chats[0]);
    let math = tmpl
        .apply(
            &[
                ChatMessage::new("system", "You are a concise math tutor."),
                ChatMessage::new("user", "What is 15 multiplied by 12?"),
            ],
            true,
        )
        .unwrap();
    assert_eq!(math, chats[1]);
}

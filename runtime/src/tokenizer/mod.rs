//! Tokenizers built from GGUF metadata (gpt2-style BPE, SentencePiece) and chat templates.
//!
//! The behaviour is llama.cpp's (`llama_tokenize`, `llama_token_to_piece`, `llama_detokenize`),
//! including its quirks, so that prompts turn into exactly the ids llama.cpp feeds its models:
//!
//! * special-token texts (`<|im_start|>`, ...) are cut out of the text first, longest first,
//!   when `parse_special` is set (user-defined tokens always);
//! * BPE (`tokenizer.ggml.model = "gpt2"`): each fragment is split into words by the regex set of
//!   `tokenizer.ggml.pre` (`pretok.rs`), byte-encoded and merged by rank (`bpe.rs`);
//! * SentencePiece (`"llama"`): spaces become `▁`, a space is prepended to each fragment that
//!   starts the text or follows a special token (`add_space_prefix`), pairs are merged by score
//!   and leftovers fall back to `<0xXX>` byte tokens (`spm.rs`).
//!
//! Build one from a model file with [`Tokenizer::from_gguf`], or from a [`TokenizerSpec`] (the
//! `tokenizer.*` metadata as plain data) with [`Tokenizer::new`].

mod bpe;
mod chat;
mod chat_fallback;
mod detok;
mod gguf;
mod pretok;
mod spm;
mod stream;
mod unicode;
mod unicode_data;
mod vocab;

pub use chat::{ChatMessage, ChatTemplate, FunctionCall, ToolCall};
pub use chat_fallback::fallback_chat_template;
pub use stream::StreamDecoder;

use bpe::Bpe;
use pretok::PreConfig;
use vocab::{ByteTable, Vocab};

/// Errors from building a tokenizer, looking up tokens and rendering chat templates.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(
        "unsupported tokenizer model '{0}' (tokenizer.ggml.model): supported are \"gpt2\" (BPE) \
         and \"llama\" (SentencePiece)"
    )]
    UnsupportedModel(String),
    #[error("unsupported pre-tokenizer '{0}' (tokenizer.ggml.pre)")]
    UnsupportedPreTokenizer(String),
    #[error("pre-tokenizer '{pre}': bad split expression: {message}")]
    BadRegex { pre: String, message: String },
    #[error("BPE tokenizer without merges (tokenizer.ggml.merges is missing)")]
    MissingMerges,
    #[error("the vocabulary is empty (tokenizer.ggml.tokens)")]
    EmptyVocab,
    #[error("{what} has {got} entries for {n_tokens} tokens")]
    LengthMismatch {
        what: &'static str,
        got: usize,
        n_tokens: usize,
    },
    #[error("token id {id} out of range (vocabulary of {n_vocab})")]
    TokenOutOfRange { id: u32, n_vocab: usize },
    #[error("metadata {key}: {message}")]
    BadMetadata { key: String, message: String },
    #[error("the model has no chat template (tokenizer.chat_template)")]
    NoChatTemplate,
    #[error("chat template: {0}")]
    Template(String),
}

/// The `tokenizer.*` metadata of a GGUF file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model`: `"gpt2"` or `"llama"`.
    pub model: String,
    /// `tokenizer.ggml.pre` (`"smollm"`, `"llama-bpe"`, `"qwen2"`, `"gpt-2"`, `"default"`, ...).
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    /// 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    pub token_types: Option<Vec<i32>>,
    pub scores: Option<Vec<f32>>,
    pub merges: Option<Vec<String>>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub sep: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    pub chat_template: Option<String>,
    /// `general.name`: llama.cpp adjusts token attributes for some models by name (Phi-3's
    /// special tokens swallow the whitespace after them).
    pub model_name: Option<String>,
}

// Token attributes (llama.cpp's `llama_token_attr` bits that matter here).
const ATTR_UNKNOWN: u8 = 1 << 0;
const ATTR_UNUSED: u8 = 1 << 1;
const ATTR_NORMAL: u8 = 1 << 2;
const ATTR_CONTROL: u8 = 1 << 3;
const ATTR_USER_DEFINED: u8 = 1 << 4;
const ATTR_BYTE: u8 = 1 << 5;
/// Whitespace before the token's text goes with it (when special tokens are cut out).
const ATTR_LSTRIP: u8 = 1 << 6;
/// Whitespace after the token's text goes with it.
const ATTR_RSTRIP: u8 = 1 << 7;

fn attr_of_type(t: i32) -> u8 {
    match t {
        1 => ATTR_NORMAL,
        2 => ATTR_UNKNOWN,
        3 => ATTR_CONTROL,
        4 => ATTR_USER_DEFINED,
        5 => ATTR_UNUSED,
        6 => ATTR_BYTE,
        _ => 0,
    }
}

/// Texts that mark an end-of-turn token when the metadata names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
/// Texts of tokens that end generation (llama.cpp decides by text as GGUF has no such list).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
/// Fill-in-the-middle markers: control tokens, and the last three end generation.
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

#[derive(Debug)]
enum Model {
    Bpe(Box<Bpe>),
    Spm {
        /// Token of each byte (`<0xXX>`, else the one-byte string), `u32::MAX` if none.
        byte_token: Box<[u32; 256]>,
    },
}

/// A text fragment after cutting out special tokens.
enum Fragment {
    Text(usize, usize),
    Token(u32),
}

/// A tokenizer built from GGUF metadata. Immutable and `Sync`: share it freely.
pub struct Tokenizer {
    model: Model,
    /// Token texts, and ids by text.
    vocab: Vocab,
    attrs: Vec<u8>,
    scores: Vec<f32>,
    /// Tokens cut out of the text before tokenizing: longest text first.
    special_order: Vec<u32>,
    /// `token_to_piece(id, special = true)` of every token.
    pieces: ByteTable,
    eog: Vec<bool>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    sep: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The vocabulary itself is too long to print.
        f.debug_struct("Tokenizer")
            .field(
                "model",
                &match self.model {
                    Model::Bpe(_) => "gpt2 (BPE)",
                    Model::Spm { .. } => "llama (SentencePiece)",
                },
            )
            .field("n_vocab", &self.vocab.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eog", &self.eog_tokens())
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds a tokenizer; bad or unsupported metadata is an error, never a panic.
    ///
    /// As in llama.cpp: special-token ids outside the vocabulary are ignored (the family's
    /// default applies), `scores`/`token_types` may be longer than `tokens` but not shorter,
    /// and an empty token text becomes `[EMPTY_<id>]`.
    pub fn new(mut spec: TokenizerSpec) -> Result<Self, TokenizerError> {
        let tokens = std::mem::take(&mut spec.tokens);
        let merges = spec.merges.take();
        Tokenizer::build(spec, &tokens, merges.as_deref())
    }

    /// [`Tokenizer::new`] with the two big arrays borrowed (a GGUF file's parsed metadata, so
    /// loading never holds a second copy of them); `spec.tokens` and `spec.merges` are ignored.
    fn build(
        spec: TokenizerSpec,
        tokens: &[String],
        merges: Option<&[String]>,
    ) -> Result<Self, TokenizerError> {
        let TokenizerSpec {
            model,
            pre,
            tokens: _,
            token_types,
            scores,
            merges: _,
            bos: meta_bos,
            eos: meta_eos,
            eot: meta_eot,
            eom: meta_eom,
            unk: meta_unk,
            pad: meta_pad,
            sep: meta_sep,
            add_bos: meta_add_bos,
            add_eos: meta_add_eos,
            add_space_prefix: meta_add_space_prefix,
            chat_template,
            model_name,
        } = spec;
        let n = tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        if n > u32::MAX as usize / 2 {
            return Err(TokenizerError::LengthMismatch {
                what: "tokenizer.ggml.tokens",
                got: n,
                n_tokens: n,
            });
        }
        let is_spm = match model.as_str() {
            "llama" => true,
            "gpt2" => false,
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        if let Some(s) = &scores {
            if s.len() < n {
                return Err(TokenizerError::LengthMismatch {
                    what: "tokenizer.ggml.scores",
                    got: s.len(),
                    n_tokens: n,
                });
            }
        }
        if let Some(t) = &token_types {
            if t.len() < n {
                return Err(TokenizerError::LengthMismatch {
                    what: "tokenizer.ggml.token_type",
                    got: t.len(),
                    n_tokens: n,
                });
            }
        }
        // A repeated text maps to its last id.
        let vocab = Vocab::new(tokens.iter().enumerate().map(|(i, t)| {
            if t.is_empty() {
                std::borrow::Cow::Owned(format!("[EMPTY_{i}]"))
            } else {
                std::borrow::Cow::Borrowed(t.as_str())
            }
        }));
        let scores: Vec<f32> = match scores {
            // -0.0 and 0.0 must tie when scores are compared.
            Some(s) => s[..n]
                .iter()
                .map(|&x| if x == 0.0 { 0.0 } else { x })
                .collect(),
            None => vec![0.0; n],
        };
        let mut attrs: Vec<u8> = match &token_types {
            Some(t) => t[..n].iter().map(|&t| attr_of_type(t)).collect(),
            None => vec![ATTR_NORMAL; n],
        };

        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        // Defaults of the family, then the metadata where it names a valid token.
        let (
            mut bos,
            mut eos,
            mut unk,
            add_bos_default,
            add_space_default,
            clean_spaces,
            model_impl,
        );
        if is_spm {
            (bos, eos, unk) = (Some(1), Some(2), Some(0));
            add_bos_default = true;
            add_space_default = true;
            clean_spaces = false;
            let mut byte_token = Box::new([u32::MAX; 256]);
            for (b, slot) in byte_token.iter_mut().enumerate() {
                let hex = format!("<0x{b:02X}>");
                let raw = (b < 128).then(|| (b as u8 as char).to_string());
                if let Some(id) = vocab.id(&hex).or_else(|| raw.and_then(|r| vocab.id(&r))) {
                    *slot = id;
                }
            }
            model_impl = Model::Spm { byte_token };
        } else {
            let cfg = PreConfig::for_name(pre.as_deref())?;
            let merges = merges.ok_or(TokenizerError::MissingMerges)?;
            bos = if cfg.no_default_bos { None } else { Some(11) };
            eos = Some(11);
            unk = None;
            add_bos_default = cfg.add_bos_default;
            add_space_default = false;
            clean_spaces = cfg.clean_spaces;
            model_impl = Model::Bpe(Box::new(Bpe::new(cfg, n, &vocab, merges)));
        }
        bos = in_range(meta_bos).or(in_range(bos));
        eos = in_range(meta_eos).or(in_range(eos));
        unk = in_range(meta_unk).or(in_range(unk));
        let mut eot = in_range(meta_eot);
        let mut eom = in_range(meta_eom);
        let pad = in_range(meta_pad);
        let sep = in_range(meta_sep);

        // Tokens known by their text (GGUF has no attribute for these). llama.cpp takes the first
        // candidate in hash order; here the first of the list, so "<|eot_id|>" and "<|im_end|>"
        // win over "<|endoftext|>".
        let by_text = |texts: &[&str], attrs: &mut [u8]| -> Option<u32> {
            let id = texts.iter().find_map(|t| vocab.id(t))?;
            attrs[id as usize] |= ATTR_CONTROL;
            Some(id)
        };
        if eot.is_none() {
            eot = by_text(EOT_TEXTS, &mut attrs);
        }
        if eom.is_none() {
            eom = by_text(&["<|eom_id|>"], &mut attrs);
        }
        by_text(FIM_PRE_TEXTS, &mut attrs);
        by_text(FIM_SUF_TEXTS, &mut attrs);
        by_text(FIM_MID_TEXTS, &mut attrs);
        let fim_eog = [
            by_text(FIM_PAD_TEXTS, &mut attrs),
            by_text(FIM_REP_TEXTS, &mut attrs),
            by_text(FIM_SEP_TEXTS, &mut attrs),
        ];
        // (Like llama.cpp, these go by text: a repeated text counts at its last id only.)
        for (t, id) in vocab.entries() {
            let a = &mut attrs[id as usize];
            if *a & ATTR_CONTROL != 0 && t.contains("unused") {
                *a |= ATTR_UNUSED;
            }
        }
        let mut eog = vec![false; n];
        for id in fim_eog.into_iter().flatten() {
            eog[id as usize] = true;
        }
        for text in EOG_TEXTS {
            if let Some(id) = vocab.id(text) {
                eog[id as usize] = true;
                attrs[id as usize] |= ATTR_CONTROL;
            }
        }
        // gpt-oss: these structure tokens always render.
        for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = vocab.id(text) {
                attrs[id as usize] = ATTR_USER_DEFINED;
            }
        }
        for id in [eos, eot, eom].into_iter().flatten() {
            eog[id as usize] = true;
        }
        let eog_with =
            |eog: &[bool], text: &str| vocab.id(text).map(|id| id as usize).filter(|&id| eog[id]);
        let has = |eog: &[bool], text: &str| eog_with(eog, text).is_some();
        // Harmony-style vocabularies: "<|end|>" ends a message, not the generation.
        if let Some(end) = eog_with(&eog, "<|end|>") {
            if (has(&eog, "<|return|>") && has(&eog, "<|call|>"))
                || (has(&eog, "<|calls|>") && has(&eog, "<|flush|>"))
            {
                eog[end] = false;
                attrs[end] = ATTR_USER_DEFINED;
            }
        }
        // Where "<|tool_response>" or "<|plamo:eos|>" ends generation, "</s>" is plain text.
        if let Some(s) = eog_with(&eog, "</s>") {
            if has(&eog, "<|tool_response>") || has(&eog, "<|plamo:eos|>") {
                eog[s] = false;
                attrs[s] = ATTR_NORMAL;
            }
        }

        let mut special_order: Vec<u32> = (0..n as u32)
            .filter(|&i| attrs[i as usize] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) != 0)
            .collect();
        let text_len = |id: u32| vocab.text(id).map_or(0, str::len);
        special_order.sort_by_key(|&id| std::cmp::Reverse(text_len(id)));
        let name = model_name.as_deref().unwrap_or("").to_lowercase();
        if name.contains("phi-3") || name.contains("phi3") {
            for &id in &special_order {
                attrs[id as usize] |= ATTR_RSTRIP;
            }
            let mut set = |text: &str, on: bool| {
                if let Some(id) = vocab.id(text) {
                    let a = &mut attrs[id as usize];
                    *a = if on {
                        *a | ATTR_RSTRIP
                    } else {
                        *a & !ATTR_RSTRIP
                    };
                }
            };
            set("</s>", true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                set(t, false);
            }
        }

        let mut tok = Tokenizer {
            model: model_impl,
            vocab,
            attrs,
            scores,
            special_order,
            pieces: ByteTable::default(),
            eog,
            bos,
            eos,
            eot,
            eom,
            unk,
            pad,
            sep,
            add_bos: meta_add_bos.unwrap_or(add_bos_default),
            add_eos: meta_add_eos.unwrap_or(false),
            add_space_prefix: meta_add_space_prefix.unwrap_or(add_space_default),
            clean_spaces,
            chat_template,
        };
        let mut pieces = ByteTable::with_capacity(n, tok.vocab.text_bytes());
        for id in 0..n as u32 {
            pieces.push(&tok.render_piece(id));
        }
        tok.pieces = pieces;
        Ok(tok)
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-turn token (from the metadata, else found by text such as `<|im_end|>`).
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    pub fn eom(&self) -> Option<u32> {
        self.eom
    }

    pub fn unk(&self) -> Option<u32> {
        self.unk
    }

    pub fn pad(&self) -> Option<u32> {
        self.pad
    }

    pub fn sep(&self) -> Option<u32> {
        self.sep
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether generating `id` ends the generation: EOS, EOT, EOM, and the tokens llama.cpp
    /// recognises by text (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, FIM pad/repo/sep, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.get(id as usize).copied().unwrap_or(false)
    }

    /// All end-of-generation tokens, ascending.
    pub fn eog_tokens(&self) -> Vec<u32> {
        (0..self.eog.len() as u32)
            .filter(|&i| self.eog[i as usize])
            .collect()
    }

    /// Whether `id` is a control token (rendered only with `special`).
    pub fn is_control(&self, id: u32) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|a| a & ATTR_CONTROL != 0)
    }

    /// The vocabulary string of a token (byte-encoded for BPE, `▁` for spaces in SPM).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.text(id)
    }

    /// The id of a vocabulary string.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.id(text)
    }

    /// The model's chat template source (`tokenizer.chat_template`).
    pub fn chat_template_source(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The model's chat template, with `bos_token`/`eos_token` set from this vocabulary.
    pub fn chat_template(&self) -> Result<ChatTemplate, TokenizerError> {
        let source = self
            .chat_template
            .as_deref()
            .ok_or(TokenizerError::NoChatTemplate)?;
        self.chat_template_from(source)
    }

    /// A chat template compiled from `source`, with this vocabulary's special tokens (their
    /// texts, and whether tokenizing adds them).
    pub fn chat_template_from(&self, source: &str) -> Result<ChatTemplate, TokenizerError> {
        let text = |id: Option<u32>| id.and_then(|i| self.token_text(i)).unwrap_or("");
        Ok(ChatTemplate::new(source)?
            .with_special_tokens(text(self.bos), text(self.eos))
            .with_added_specials(self.add_bos, self.add_eos))
    }

    /// Tokenizes `text` like `llama_tokenize`: `add_special` adds BOS/EOS as the vocabulary
    /// asks (`add_bos`/`add_eos`), `parse_special` turns the texts of control tokens into those
    /// tokens (user-defined tokens always are).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let fragments = self.partition(text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        match &self.model {
            Model::Bpe(bpe) => {
                for f in fragments {
                    match f {
                        Fragment::Text(a, b) => bpe.tokenize(&text[a..b], &self.vocab, &mut out),
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
            Model::Spm { byte_token } => {
                let spm = spm::Spm {
                    vocab: &self.vocab,
                    scores: &self.scores,
                    byte_token,
                    unk: self.unk,
                };
                // The start of the text counts as "after a special token".
                let mut after_special = true;
                for f in fragments {
                    match f {
                        Fragment::Text(a, b) => {
                            let mut s = String::with_capacity(b - a + 4);
                            if self.add_space_prefix && after_special {
                                s.push(' ');
                            }
                            s.push_str(&text[a..b]);
                            spm.tokenize(&s.replace(' ', "▁"), &mut out);
                            after_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Cuts the texts of special tokens out of `text`, longest token first.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut frags = if text.is_empty() {
            vec![]
        } else {
            vec![Fragment::Text(0, text.len())]
        };
        for &id in &self.special_order {
            if !parse_special && self.attrs[id as usize] & (ATTR_CONTROL | ATTR_UNKNOWN) != 0 {
                continue;
            }
            let pat = self.vocab.text(id).unwrap_or_default();
            if !text.contains(pat) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(a, b) = f else {
                    next.push(f);
                    continue;
                };
                let attr = self.attrs[id as usize];
                let bytes = text.as_bytes();
                let mut cur = a;
                while let Some(p) = text[cur..b].find(pat) {
                    let mut left_end = cur + p;
                    if attr & ATTR_LSTRIP != 0 {
                        while left_end > cur && is_c_space(bytes[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > cur {
                        next.push(Fragment::Text(cur, left_end));
                    }
                    next.push(Fragment::Token(id));
                    cur += p + pat.len();
                    if attr & ATTR_RSTRIP != 0 {
                        while cur < b && is_c_space(bytes[cur]) {
                            cur += 1;
                        }
                    }
                }
                if cur < b {
                    next.push(Fragment::Text(cur, b));
                }
            }
            frags = next;
        }
        frags
    }
}

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

#[cfg(test)]
mod tests;

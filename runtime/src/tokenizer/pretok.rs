//! Pre-tokenization of gpt2-style BPE vocabularies: splitting text into words before merging.
//!
//! llama.cpp picks a list of split expressions from `tokenizer.ggml.pre` (the patterns come
//! from each model family's `tokenizer.json`) and applies them one after the other, each on the
//! pieces the previous one left: a match and the text between two matches both become pieces.
//! The four common expressions (GPT-2, Llama 3, Qwen 2, Qwen 3.5) run as hand-written scanners
//! there, and the rest through `std::regex` on a "collapsed" text where every non-ASCII
//! codepoint is replaced by one stand-in per Unicode class. Both are reproduced here, the
//! second on `fancy-regex`, so that rare characters split the same way.

use super::unicode::{flags, CAT_LETTER, CAT_MARK, CAT_NUMBER, CAT_PUNCT, CAT_SYMBOL, WHITESPACE};
use super::TokenizerError;

/// One split stage.
#[derive(Debug)]
enum Step {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    Gpt2,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    /// with D = `max_digits`; `marks` makes `\p{M}` count as a letter (Qwen 3.5).
    Llama3 { max_digits: usize, marks: bool },
    /// `\p{N}`: every number codepoint on its own.
    EachNumber,
    /// `[^\n]+|[\n]+`
    Newlines,
    /// Any other expression, as llama.cpp's `std::regex` fallback runs it.
    Regex {
        re: fancy_regex::Regex,
        collapsed: bool,
    },
}

/// How a `tokenizer.ggml.pre` value tokenizes and detokenizes.
#[derive(Debug)]
pub(crate) struct PreConfig {
    pub(crate) splitter: PreTokenizer,
    /// Detokenization removes spaces before punctuation and some contractions.
    pub(crate) clean_spaces: bool,
    /// A word that is already a token is not merged (Llama 3 style).
    pub(crate) ignore_merges: bool,
    /// Default of `add_bos` when the metadata does not say.
    pub(crate) add_bos_default: bool,
    /// The family has no BOS token unless the metadata names one.
    pub(crate) no_default_bos: bool,
}

#[derive(Debug)]
pub(crate) struct PreTokenizer {
    steps: Vec<Step>,
}

const LLAMA3: &str = "llama3";
const QWEN2: &str = "qwen2";
const QWEN35: &str = "qwen35";
const GPT2: &str = "gpt2";
const EACH_NUMBER: &str = r"\p{N}";
const NEWLINES: &str = "newlines";

const DEFAULT_PUNCT: &str = r"[\p{P}\$\+<=>\^~\|]+";
const FALCON_PUNCT: &str = r"[\p{P}\$\+<=>\^~\|`]+";
const DEEPSEEK_LLM_LETTERS: &str = r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+";
const DEEPSEEK_LLM_PUNCT: &str =
    r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+";
const CJK_HANGUL: &str = r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+";
const DEEPSEEK3_MAIN: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;
const BLOOM: &str = r" ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
const UFAKZEKA: &str =
    r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const BAILINGMOE: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
const MINICPM5: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

impl PreConfig {
    /// The configuration of a `tokenizer.ggml.pre` value; `None` (absent) is llama.cpp's
    /// `default`.
    pub(crate) fn for_name(pre: Option<&str>) -> Result<PreConfig, TokenizerError> {
        let name = pre.unwrap_or("default");
        // (expressions, clean_spaces, ignore_merges, add_bos default, no default BOS)
        let (exprs, clean, ignore, bos, no_bos): (&[&str], bool, bool, bool, bool) = match name {
            "default" => (
                &[DEFAULT_PUNCT, GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
                true,
                false,
                false,
                false,
            ),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" => (&[LLAMA3], true, true, true, false),
            "dbrx" | "smaug-bpe" => (&[LLAMA3], true, false, false, false),
            "chatglm-bpe" => (&[LLAMA3], true, false, false, true),
            "glm4" | "glm5" => (&[LLAMA3], true, true, false, true),
            "deepseek-llm" => (
                &[
                    "[\r\n]",
                    DEEPSEEK_LLM_LETTERS,
                    DEEPSEEK_LLM_PUNCT,
                    r"\s+$",
                    CJK_HANGUL,
                    r"\p{N}+",
                ],
                false,
                false,
                false,
                false,
            ),
            "deepseek-coder" => (
                &[
                    "[\r\n]",
                    r"\s?\p{L}+",
                    r"\s?\p{P}+",
                    CJK_HANGUL,
                    EACH_NUMBER,
                ],
                false,
                false,
                false,
                false,
            ),
            "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => (
                &[
                    r"\p{N}{1,3}",
                    r"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+",
                    DEEPSEEK3_MAIN,
                ],
                false,
                false,
                false,
                false,
            ),
            "falcon" => (
                &[FALCON_PUNCT, GPT2, "[0-9][0-9][0-9]"],
                true,
                false,
                false,
                false,
            ),
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
            | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "jina-v1-en"
            | "jina-v2-code" | "roberta-bpe" | "mpt" | "olmo" | "jais" | "exaone4" => {
                (&[GPT2], true, false, false, false)
            }
            "trillion" | "granite-docling" => (&[GPT2], false, false, false, false),
            "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
                (&[EACH_NUMBER, GPT2], true, false, false, false)
            }
            "smollm" | "command-r" => (&[EACH_NUMBER, GPT2], false, false, false, false),
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open"
            | "grok-2" => (&[QWEN2], false, false, false, false),
            "stablelm2" | "megrez" => (&[QWEN2], true, false, false, false),
            "qwen35" => (&[QWEN35], false, false, false, false),
            "laguna" => (&[NEWLINES, QWEN2], false, false, false, false),
            "poro-chat" => (&[BLOOM], false, false, false, false),
            "bloom" | "gpt3-finnish" => (&[BLOOM], true, false, false, false),
            "viking" => (&[BLOOM, EACH_NUMBER], false, false, false, false),
            "tekken" => (&[TEKKEN], false, true, true, false),
            "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => {
                (&[GPT4O], false, false, false, false)
            }
            "seed-coder" => (&[SEED_CODER], false, false, false, false),
            "ufakzeka" => (&[UFAKZEKA], false, false, false, false),
            "bailingmoe" | "bailingmoe2" | "llada-moe" => {
                (&[BAILINGMOE], false, false, false, false)
            }
            "minicpm5" => (&[r"\p{N}{1,3}", MINICPM5], true, true, false, false),
            other => return Err(TokenizerError::UnsupportedPreTokenizer(other.to_string())),
        };
        let steps = exprs
            .iter()
            .map(|e| Step::new(e))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|message| TokenizerError::BadRegex {
                pre: name.to_string(),
                message,
            })?;
        Ok(PreConfig {
            splitter: PreTokenizer { steps },
            clean_spaces: clean,
            ignore_merges: ignore,
            add_bos_default: bos,
            no_default_bos: no_bos,
        })
    }
}

/// The Unicode classes that llama.cpp's regex fallback can see, with their stand-in codepoints.
const COLLAPSED_CLASSES: [(&str, u16, char); 10] = [
    (r"\p{N}", CAT_NUMBER, '\u{E0D1}'),
    (r"\p{L}", CAT_LETTER, '\u{E0D2}'),
    (r"\p{P}", CAT_PUNCT, '\u{E0D3}'),
    (r"\p{M}", CAT_MARK, '\u{E0D4}'),
    (r"\p{S}", CAT_SYMBOL, '\u{E0D5}'),
    // llama.cpp has no finer letter classes: all of them mean "letter".
    (r"\p{Lu}", CAT_LETTER, '\u{E0D2}'),
    (r"\p{Ll}", CAT_LETTER, '\u{E0D2}'),
    (r"\p{Lt}", CAT_LETTER, '\u{E0D2}'),
    (r"\p{Lm}", CAT_LETTER, '\u{E0D2}'),
    (r"\p{Lo}", CAT_LETTER, '\u{E0D2}'),
];
/// Stand-in of a non-ASCII codepoint of no class above (and not whitespace).
const COLLAPSED_OTHER: char = '\u{E0D0}';

/// The collapsed form of one codepoint: ASCII as is, non-ASCII whitespace as a vertical tab
/// (so that ASCII `\s` sees it), anything else as its class's stand-in.
fn collapse(c: char) -> char {
    if c.is_ascii() {
        return c;
    }
    let f = flags(c);
    if f & WHITESPACE != 0 {
        return '\u{0B}';
    }
    let cat = f & 0xFF;
    COLLAPSED_CLASSES[..5]
        .iter()
        .find(|(_, bit, _)| *bit == cat)
        .map_or(COLLAPSED_OTHER, |&(_, _, stand_in)| stand_in)
}

/// Non-ASCII whitespace becomes a vertical tab for expressions without classes, as there.
fn ascii_whitespace(c: char) -> char {
    if !c.is_ascii() && flags(c) & WHITESPACE != 0 {
        '\u{0B}'
    } else {
        c
    }
}

/// Rewrites `\p{..}` classes of an expression for the collapsed text: the class becomes its
/// stand-in plus its ASCII members (inside a bracket expression, without new brackets).
fn rewrite_collapsed(expr: &str) -> String {
    let mut out = String::with_capacity(expr.len() * 2);
    let mut inside = false;
    let mut prev: Option<char> = None;
    let mut rest = expr;
    while let Some(c) = rest.chars().next() {
        if c == '[' && prev != Some('\\') {
            inside = true;
        } else if c == ']' && inside && prev != Some('\\') {
            inside = false;
        } else if c == '\\' {
            if let Some(&(pat, bit, stand_in)) = COLLAPSED_CLASSES
                .iter()
                .find(|(pat, _, _)| rest.starts_with(pat))
            {
                if !inside {
                    out.push('[');
                }
                out.push_str(&format!("\\x{{{:X}}}", stand_in as u32));
                for a in 0u8..128 {
                    if flags(a as char) & 0xFF == bit {
                        out.push_str(&format!("\\x{{{a:02X}}}"));
                    }
                }
                if !inside {
                    out.push(']');
                }
                rest = &rest[pat.len()..];
                prev = Some('}');
                continue;
            }
        }
        out.push(c);
        prev = Some(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

impl Step {
    fn new(expr: &str) -> Result<Step, String> {
        Ok(match expr {
            GPT2 => Step::Gpt2,
            LLAMA3 => Step::Llama3 {
                max_digits: 3,
                marks: false,
            },
            QWEN2 => Step::Llama3 {
                max_digits: 1,
                marks: false,
            },
            QWEN35 => Step::Llama3 {
                max_digits: 1,
                marks: true,
            },
            EACH_NUMBER => Step::EachNumber,
            NEWLINES => Step::Newlines,
            _ => {
                let collapsed = COLLAPSED_CLASSES
                    .iter()
                    .any(|(pat, _, _)| expr.contains(pat));
                let source = if collapsed {
                    rewrite_collapsed(expr)
                } else {
                    expr.to_string()
                };
                let re = fancy_regex::Regex::new(&source).map_err(|e| e.to_string())?;
                Step::Regex { re, collapsed }
            }
        })
    }

    /// Splits `seg` (one piece from the previous stage), appending piece lengths in codepoints.
    fn split(&self, seg: &[char], out: &mut Vec<usize>) {
        match self {
            Step::Gpt2 => split_gpt2(seg, out),
            Step::Llama3 { max_digits, marks } => split_llama3(seg, *max_digits, *marks, out),
            Step::EachNumber => {
                let mut start = 0;
                for (i, &c) in seg.iter().enumerate() {
                    if flags(c) & CAT_NUMBER != 0 {
                        if i > start {
                            out.push(i - start);
                        }
                        out.push(1);
                        start = i + 1;
                    }
                }
                if seg.len() > start {
                    out.push(seg.len() - start);
                }
            }
            Step::Newlines => {
                let mut start = 0;
                for i in 1..=seg.len() {
                    if i == seg.len() || (seg[i] == '\n') != (seg[start] == '\n') {
                        out.push(i - start);
                        start = i;
                    }
                }
            }
            Step::Regex { re, collapsed } => {
                let map = if *collapsed {
                    collapse
                } else {
                    ascii_whitespace
                };
                let hay: String = seg.iter().map(|&c| map(c)).collect();
                let mut last_byte = 0;
                let mut emitted = 0; // codepoints already pushed
                let count = |from: usize, to: usize| hay[from..to].chars().count();
                for m in re.find_iter(&hay) {
                    // A search that gives up (backtracking limit) leaves the rest as one piece.
                    let Ok(m) = m else { break };
                    if m.start() == m.end() {
                        continue;
                    }
                    if m.start() > last_byte {
                        let n = count(last_byte, m.start());
                        out.push(n);
                        emitted += n;
                    }
                    let n = count(m.start(), m.end());
                    out.push(n);
                    emitted += n;
                    last_byte = m.end();
                }
                if seg.len() > emitted {
                    out.push(seg.len() - emitted);
                }
            }
        }
    }
}

impl PreTokenizer {
    /// Splits `text` into words (non-empty, contiguous, covering the text).
    pub(crate) fn split<'a>(&self, text: &'a str) -> Vec<&'a str> {
        let chars: Vec<char> = text.chars().collect();
        let mut pieces = vec![chars.len()];
        let mut next = Vec::new();
        for step in &self.steps {
            next.clear();
            let mut start = 0;
            for &len in &pieces {
                step.split(&chars[start..start + len], &mut next);
                start += len;
            }
            std::mem::swap(&mut pieces, &mut next);
        }
        // Byte offset of every codepoint, and of the end.
        let offsets: Vec<usize> = text
            .char_indices()
            .map(|(i, _)| i)
            .chain(std::iter::once(text.len()))
            .collect();
        let mut words = Vec::with_capacity(pieces.len());
        let mut cp = 0;
        for len in pieces {
            words.push(&text[offsets[cp]..offsets[cp + len]]);
            cp += len;
        }
        words
    }
}

/// Class of the codepoint at `i` of the piece, 0 past its ends (the scanners' lookahead stops
/// at piece boundaries, as llama.cpp's does).
#[inline]
fn flag_at(seg: &[char], i: usize) -> u16 {
    seg.get(i).map_or(0, |&c| flags(c))
}

fn is_contraction_1(c: char) -> bool {
    matches!(c.to_ascii_lowercase(), 's' | 't' | 'm' | 'd')
}

fn is_contraction_2(a: char, b: char) -> bool {
    matches!(
        (a.to_ascii_lowercase(), b.to_ascii_lowercase()),
        ('r', 'e') | ('v', 'e') | ('l', 'l')
    )
}

/// Pushes the piece `[*prev, end)` if non-empty.
#[inline]
fn emit(out: &mut Vec<usize>, prev: &mut usize, end: usize) {
    if end > *prev {
        out.push(end - *prev);
    }
    *prev = end;
}

/// Length of the whitespace run at `pos`.
fn whitespace_run(seg: &[char], pos: usize) -> usize {
    seg[pos..]
        .iter()
        .take_while(|&&c| flags(c) & WHITESPACE != 0)
        .count()
}

fn split_gpt2(seg: &[char], out: &mut Vec<usize>) {
    let n = seg.len();
    let mut pos = 0;
    let mut prev = 0;
    while pos < n {
        let c = seg[pos];
        // 's|'t|'re|'ve|'m|'ll|'d (lowercase only)
        if c == '\'' && pos + 1 < n {
            let c1 = seg[pos + 1];
            if matches!(c1, 's' | 't' | 'm' | 'd') {
                pos += 2;
                emit(out, &mut prev, pos);
                continue;
            }
            if pos + 2 < n && matches!((c1, seg[pos + 2]), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                pos += 3;
                emit(out, &mut prev, pos);
                continue;
            }
        }
        // An optional leading space joins the run of the class that follows it.
        let lead = usize::from(c == ' ');
        let f = flag_at(seg, pos + lead);
        let run_class = if f & CAT_LETTER != 0 {
            Some(CAT_LETTER)
        } else if f & CAT_NUMBER != 0 {
            Some(CAT_NUMBER)
        } else {
            None
        };
        if let Some(class) = run_class {
            pos += lead;
            while flag_at(seg, pos) & class != 0 {
                pos += 1;
            }
            emit(out, &mut prev, pos);
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+`
        let other = |f: u16| f != 0 && f & (WHITESPACE | CAT_LETTER | CAT_NUMBER) == 0;
        if other(f) {
            pos += lead;
            while other(flag_at(seg, pos)) {
                pos += 1;
            }
            emit(out, &mut prev, pos);
            continue;
        }
        let ws = whitespace_run(seg, pos);
        if ws > 1 && pos + ws < n {
            // `\s+(?!\S)`: leave the last space to the word that follows.
            pos += ws - 1;
        } else if ws > 0 {
            pos += ws;
        } else {
            pos += 1;
        }
        emit(out, &mut prev, pos);
    }
}

fn split_llama3(seg: &[char], max_digits: usize, marks: bool, out: &mut Vec<usize>) {
    let n = seg.len();
    let letter_bits = if marks {
        CAT_LETTER | CAT_MARK
    } else {
        CAT_LETTER
    };
    let is_letter = |f: u16| f & letter_bits != 0;
    let mut pos = 0;
    let mut prev = 0;
    while pos < n {
        let c = seg[pos];
        let f = flags(c);
        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if c == '\'' && pos + 1 < n {
            if is_contraction_1(seg[pos + 1]) {
                pos += 2;
                emit(out, &mut prev, pos);
                continue;
            }
            if pos + 2 < n && is_contraction_2(seg[pos + 1], seg[pos + 2]) {
                pos += 3;
                emit(out, &mut prev, pos);
                continue;
            }
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(c == '\r' || c == '\n' || f & CAT_NUMBER != 0)
            && (is_letter(f) || is_letter(flag_at(seg, pos + 1)))
        {
            pos += 1;
            while is_letter(flag_at(seg, pos)) {
                pos += 1;
            }
            emit(out, &mut prev, pos);
            continue;
        }
        // \p{N}{1,max_digits}
        if f & CAT_NUMBER != 0 {
            let mut run = 0;
            while flag_at(seg, pos) & CAT_NUMBER != 0 {
                pos += 1;
                run += 1;
                if run == max_digits {
                    emit(out, &mut prev, pos);
                    run = 0;
                }
            }
            emit(out, &mut prev, pos);
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        let other = |f: u16| f != 0 && f & (WHITESPACE | letter_bits | CAT_NUMBER) == 0;
        let lead = usize::from(c == ' ');
        let f2 = flag_at(seg, pos + lead);
        if f2 & (WHITESPACE | letter_bits | CAT_NUMBER) == 0 {
            // A lone space at the end of the piece lands here too and is a piece by itself.
            pos += lead;
            while other(flag_at(seg, pos)) {
                pos += 1;
            }
            while pos < n && (seg[pos] == '\r' || seg[pos] == '\n') {
                pos += 1;
            }
            emit(out, &mut prev, pos);
            continue;
        }
        let ws = whitespace_run(seg, pos);
        // \s*[\r\n]+ : up to the last line break of the run.
        if let Some(last) = seg[pos..pos + ws]
            .iter()
            .rposition(|&c| c == '\r' || c == '\n')
        {
            pos += last + 1;
        } else if ws > 1 && pos + ws < n {
            pos += ws - 1;
        } else if ws > 0 {
            pos += ws;
        } else {
            pos += 1;
        }
        emit(out, &mut prev, pos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: &str, text: &str) -> Vec<String> {
        let cfg = PreConfig::for_name(Some(pre)).unwrap();
        cfg.splitter
            .split(text)
            .into_iter()
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn gpt2_words() {
        assert_eq!(
            words("gpt-2", "Hello world's  end 123!!\n\n x"),
            ["Hello", " world", "'s", " ", " end", " 123", "!!", "\n\n", " x"]
        );
    }

    #[test]
    fn smollm_isolates_digits() {
        assert_eq!(
            words("smollm", "in 2024,"),
            ["in", " ", "2", "0", "2", "4", ","]
        );
    }

    #[test]
    fn llama3_groups_digits_by_three() {
        assert_eq!(
            words("llama-bpe", "1234567 I'M"),
            ["123", "456", "7", " I", "'M"]
        );
        assert_eq!(words("llama-bpe", "a \n\n b"), ["a", " \n\n", " b"]);
    }

    #[test]
    fn qwen2_single_digits() {
        assert_eq!(words("qwen2", "x=12"), ["x", "=", "1", "2"]);
    }

    #[test]
    fn regex_fallback_sees_classes() {
        // `default`: punctuation runs are split before the GPT-2 expression runs.
        assert_eq!(
            words("default", "a,b 1234"),
            ["a", ",", "b", " ", "123", "4"]
        );
        assert_eq!(words("deepseek-coder", "é中文x"), ["é", "中文", "x"]);
    }

    #[test]
    fn unknown_pre_is_an_error() {
        let err = PreConfig::for_name(Some("no-such-pre")).unwrap_err();
        assert!(err.to_string().contains("no-such-pre"), "{err}");
    }

    #[test]
    fn every_supported_expression_compiles() {
        for pre in [
            "default",
            "llama-bpe",
            "deepseek-llm",
            "deepseek-coder",
            "deepseek-v3",
            "falcon",
            "gpt-2",
            "starcoder",
            "smollm",
            "qwen2",
            "qwen35",
            "laguna",
            "bloom",
            "viking",
            "tekken",
            "gpt-4o",
            "seed-coder",
            "ufakzeka",
            "bailingmoe",
            "minicpm5",
            "chatglm-bpe",
        ] {
            let cfg = PreConfig::for_name(Some(pre)).unwrap();
            let text = "Hello, wörld! 12345 \u{3000}中文 'll\r\n\n  x";
            let joined: String = cfg.splitter.split(text).concat();
            assert_eq!(joined, text, "{pre}");
        }
    }
}

#!/usr/bin/env python3
"""Regenerates the llama.cpp expectations of the synthetic vocabularies (../*.json).

The vocabularies are small and made up here (a byte-level BPE trained on CORPUS below, a
SentencePiece vocabulary with byte fallback). Each is written to a vocab-only GGUF with the `gguf`
package, once per configuration (pre-tokenizer, add_bos, ...), and `llama_ref` (llama_ref.cpp,
linked to llama.cpp) records what llama.cpp makes of every text in TEXTS. The Rust tests
(`runtime/tests/tokenizer_llamacpp.rs`) then check the tokenizer against those records, so the
expectations do not come from the implementation under test.

    pip install gguf
    g++ ... llama_ref.cpp -o llama_ref   (see the top of llama_ref.cpp)
    python3 make_fixtures.py ./llama_ref
"""

import json
import math
import os
import subprocess
import sys
import tempfile
from collections import Counter

import gguf
import regex

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.dirname(HERE)

CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog didn't care; it's been there before.
In 2024, the committee met 12 times and approved 1,234 proposals worth $5.6 million.
I'd say he'd go, you'd stay; I'd rather not. She said: "We'll see what they're doing tomorrow," and then she left the room.
Café owners in the old town serve naïve tourists crêpes, jalapeño soup and a résumé of history.
def tokenize(text):\n    return [t for t in text.split() if t]\n
Numbers like 3.14159, 42 and 1000000 appear in tables; dates like 1999-12-31 too.
Москва — столица России. 東京は日本の首都です。 中文文本也在这里。 한국어 문장도 있어요.
Emoji carry meaning too 🦙🦙 and 👍 and ❤️ in modern text!!! Really??? Yes...
the the the and and and of of to to in in is is that that for for it it with with as as
"""

TEXTS = [
    "",
    " ",
    "  ",
    "\n",
    "\n\n\n",
    "\t\tindented\n",
    "\r\n",
    "Hello world",
    " Hello world",
    "Hello  world   ",
    "the quick brown fox",
    "The dog didn't care; it's been there",
    "THEY'LL SAY IT'S OK, we'RE fine",
    "12345678 and 3.14159 and 1,234",
    "In 2024, the committee met 12 times.",
    "Café naïve résumé jalapeño crêpes",
    "e\u0301 a\u0308 combining marks",
    "Москва — столица России.",
    "東京は日本の首都です。中文文本",
    "한국어 문장",
    "🦙🦙 👍 ❤️ 👨\u200d👩\u200d👧",
    "tabs\tand\u00a0nbsp\u3000ideographic space\u2009thin",
    "x = a + b * (c - d) / e;",
    "def f(x):\n    return x**2\n",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_end|>",
    "<|im_start",
    "text<|endoftext|>more text",
    " <|im_end|> spaced ",
    "use <tool> here and<tool>there",
    "<|fim_pad|><|unused_0|>",
    "qza qz qzaq zebra Ġzebra",
    "unit\x1fseparator and \x01 control",
    "ab abc bc abcd",
    "QUIZ zigzag",
    "\u2581already escaped\u2581 marker",
    "a'b 'S 's 'll 'LL",
    "I'd you'D we've 'm 're'",
    "   leading spaces and trailing   ",
    "\u0378 unassigned \U0002EBF0 new letter \ue000 private",
    "...!!!???,,,;;;",
    "a\n\nb\n \nc \n d",
    "Ω K Å ﬁ ẞ",
    "1\u0661\u0662 \u00bd \u2163 \U0001d7d9",
]


def byte_encoder():
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    mapping, n = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + n)
            n += 1
    return mapping


def train_bpe(n_merges):
    enc = byte_encoder()
    split = regex.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s+")
    words = Counter("".join(enc[b] for b in w.encode()) for w in split.findall(CORPUS))
    seqs = {w: list(w) for w in words}
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for w, seq in seqs.items():
            for a, b in zip(seq, seq[1:]):
                pairs[(a, b)] += words[w]
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        merges.append((a, b))
        for w, seq in seqs.items():
            out, i = [], 0
            while i < len(seq):
                if i + 1 < len(seq) and seq[i] == a and seq[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            seqs[w] = out
    return merges


def bpe_vocab():
    enc = byte_encoder()
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool>", "<|fim_pad|>", "<|unused_0|>"]
    types = [3, 3, 3, 4, 3, 3]
    # No token for byte 0x1F: llama.cpp drops such bytes.
    for b in range(256):
        if b != 0x1F:
            tokens.append(enc[b])
            types.append(1)
    merges = train_bpe(400)
    for a, b in merges:
        if a + b not in tokens:
            tokens.append(a + b)
            types.append(1)
    # A word reachable only without merges (pre-tokenizers that ignore merges for whole-word
    # tokens), and a merge path through a string that is not a token ("qz").
    for t in ["Ġzebra", "qza"]:
        tokens.append(t)
        types.append(1)
    merge_lines = [f"{a} {b}" for a, b in merges] + ["q z", "qz a"]
    return {"model": "gpt2", "tokens": tokens, "token_types": types, "merges": merge_lines,
            "bos": 0, "eos": 2}


def spm_vocab():
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    for t, ty in [("<tool>", 4), ("<|im_start|>", 3), ("<|im_end|>", 3)]:
        tokens.append(t)
        types.append(ty)
        scores.append(0.0)
    text = "▁" + CORPUS.replace(" ", "▁").replace("\n", "▁")
    # Single characters (a few left out, for byte fallback), then frequent substrings.
    chars = sorted({c for c in text if c not in "Qz\n"})
    counts = Counter()
    for n in range(2, 7):
        for i in range(len(text) - n + 1):
            s = text[i:i + n]
            if "▁" not in s[1:]:
                counts[s] += 1
    pieces = [(c, -10.0) for c in chars]
    for s, k in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if k >= 3 and len(pieces) < 700:
            pieces.append((s, round(math.log(k) - 2.0 * len(s), 4)))
    # Two pieces with equal scores that compete for the same character: leftmost wins.
    pieces += [("ab", -5.0), ("bc", -5.0), ("cd", -4.0)]
    for s, sc in pieces:
        if s not in tokens:
            tokens.append(s)
            types.append(1)
            scores.append(sc)
    return {"model": "llama", "tokens": tokens, "token_types": types, "scores": scores,
            "bos": 1, "eos": 2, "unk": 0}


def write_gguf(path, vocab, variant):
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.add_tokenizer_model(vocab["model"])
    if variant.get("pre"):
        w.add_tokenizer_pre(variant["pre"])
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["token_types"])
    if "scores" in vocab:
        w.add_token_scores(vocab["scores"])
    if "merges" in vocab:
        w.add_token_merges(vocab["merges"])
    w.add_bos_token_id(vocab["bos"])
    w.add_eos_token_id(vocab["eos"])
    if "unk" in vocab:
        w.add_unk_token_id(vocab["unk"])
    if variant.get("add_bos") is not None:
        w.add_add_bos_token(variant["add_bos"])
    if variant.get("add_eos") is not None:
        w.add_add_eos_token(variant["add_eos"])
    if variant.get("add_space_prefix") is not None:
        w.add_add_space_prefix(variant["add_space_prefix"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def text_or_hex(h):
    """A detokenization as text, or as {"hex": ...} where it is not valid UTF-8."""
    try:
        return bytes.fromhex(h).decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": h}


def run(llama_ref, name, vocab, variants):
    out = {"vocab": vocab, "texts": TEXTS, "variants": []}
    with tempfile.TemporaryDirectory() as tmp:
        texts = os.path.join(tmp, "texts.txt")
        with open(texts, "w", encoding="utf-8", newline="") as f:
            f.write("\n__case__\n".join(TEXTS))
        for v in variants:
            path = os.path.join(tmp, "v.gguf")
            write_gguf(path, vocab, v)
            res = json.loads(subprocess.run([llama_ref, path, texts], check=True,
                                            capture_output=True).stdout)
            pieces, eog = res.pop("pieces"), res.pop("eog")
            for case in res["cases"]:
                case["detok"] = [text_or_hex(h) for h in case["detok"]]
            out.setdefault("pieces", pieces)
            out.setdefault("eog", eog)
            # Pieces and end-of-generation tokens do not depend on the configurations used.
            assert pieces == out["pieces"] and eog == out["eog"], v
            out["variants"].append({"config": v, **res})
    with open(os.path.join(OUT, f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


def main():
    llama_ref = sys.argv[1]
    bpe = [
        {"pre": "smollm", "add_bos": False},
        {"pre": "gpt-2"},
        {"pre": "llama-bpe"},
        {"pre": "qwen2", "add_bos": True, "add_eos": True},
        {"pre": "qwen35"},
        {"pre": "default"},
        {"pre": "starcoder"},
        {"pre": "deepseek-llm"},
        {"pre": "deepseek-coder"},
        {"pre": "falcon"},
        {"pre": "gpt-4o"},
    ]
    run(llama_ref, "bpe_synthetic", bpe_vocab(), bpe)
    spm = [
        {},
        {"add_space_prefix": False, "add_bos": False, "add_eos": True},
    ]
    run(llama_ref, "spm_synthetic", spm_vocab(), spm)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes ../smollm2_prompts.json: the part of SmolLM2-135M-Instruct's tokenizer that the
reference prompts can reach, with those prompts and llama.cpp's ids for them.

BPE only ever looks up merges and tokens whose text is a substring of the (byte-encoded) text
between special tokens, so keeping exactly those (merges in their original order, tokens at their
original ids) tokenizes the prompts as the full vocabulary does.

    python3 prune_smollm2.py MODEL.gguf shared/refs/greedy-public.jsonl
"""

import json
import os
import re
import sys

from gguf import GGUFReader, GGUFValueType


def field(r, key):
    f = r.fields[key]
    if f.types[0] == GGUFValueType.ARRAY:
        if f.types[-1] == GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if f.types[0] == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]].tolist()[0]


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


def main():
    r = GGUFReader(sys.argv[1])
    refs = [json.loads(line) for line in open(sys.argv[2], encoding="utf-8")]
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = field(r, "tokenizer.ggml.merges")
    assert field(r, "tokenizer.ggml.pre") == "smollm"
    specials = [t for t, ty in zip(tokens, types) if ty != 1]
    enc = byte_encoder()
    split = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))
    fragments = ["".join(enc[b] for b in frag.encode()) for ref in refs
                 for frag in split.split(ref["prompt"])]
    # The special tokens' texts too, for tokenizing them as plain text.
    fragments += ["".join(enc[b] for b in s.encode()) for s in specials]
    text = "\x00".join(fragments)  # NUL never occurs in a token: no match spans two fragments
    keep = {i: t for i, (t, ty) in enumerate(zip(tokens, types)) if ty != 1 or t in text}
    kept_merges = [m for m in merges if m.replace(" ", "", 1) in text]
    out = {
        "source": "SmolLM2-135M-Instruct tokenizer (tokenizer.ggml.*), pruned to the reference prompts",
        "pre": "smollm",
        "n_vocab": len(tokens),
        "tokens": [[i, t, types[i]] for i, t in sorted(keep.items())],
        "merges": kept_merges,
        "bos": field(r, "tokenizer.ggml.bos_token_id"),
        "eos": field(r, "tokenizer.ggml.eos_token_id"),
        "unk": field(r, "tokenizer.ggml.unknown_token_id"),
        "pad": field(r, "tokenizer.ggml.padding_token_id"),
        "add_bos": field(r, "tokenizer.ggml.add_bos_token"),
        "add_space_prefix": field(r, "tokenizer.ggml.add_space_prefix"),
        "chat_template": field(r, "tokenizer.chat_template"),
        "prompts": [{"id": ref["id"], "prompt": ref["prompt"], "chat_template": ref["chat_template"],
                     "prompt_ids": ref["prompt_ids"]} for ref in refs],
    }
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "smollm2_prompts.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{len(keep)} tokens, {len(kept_merges)} merges -> {path}")


if __name__ == "__main__":
    main()

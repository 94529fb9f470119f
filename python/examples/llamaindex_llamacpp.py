"""LlamaIndex's llama-cpp-python integration on Conductor, with only the import changed.

Needs `pip install llama-index-llms-llama-cpp` beside the conductor package. Runs LlamaIndex's
`LlamaCPP` (complete, stream_complete) on the default model, greedy, and checks its text
against `conductor.Llama`'s own. Exits non-zero on a difference.

    python python/examples/llamaindex_llamacpp.py [MODEL]
"""

import sys

import conductor

# LlamaIndex does `from llama_cpp import Llama` itself: let that find Conductor.
conductor.install_as_llama_cpp()

from llama_index.llms.llama_cpp import LlamaCPP  # noqa: E402

MODEL = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"
PROMPT = "The capital of France is"

# (A known model's name fetches it on first use.)
with conductor.Llama(MODEL, n_ctx=512, n_threads=2, verbose=False) as llm:
    want = llm(PROMPT, max_tokens=24, temperature=0)["choices"][0]["text"]
# LlamaCPP wants a file (it would download llama-cpp-python's default model otherwise).
MODEL = str(conductor.known_model_path(MODEL) or MODEL)

index_llm = LlamaCPP(
    model_path=MODEL,
    temperature=0,
    max_new_tokens=24,
    context_window=512,
    model_kwargs={"n_threads": 2},
    verbose=False,
)
got = index_llm.complete(PROMPT).text
got_stream = "".join(piece.delta for piece in index_llm.stream_complete(PROMPT))

failed = False
for what, text in [("LlamaCPP.complete", got), ("LlamaCPP.stream_complete", got_stream)]:
    same = text == want
    failed |= not same
    print(f"{what}: {'same as' if same else 'DIFFERS from'} conductor.Llama: {text!r}")
print(f"metadata: context window {index_llm.metadata.context_window}")
sys.exit(1 if failed else 0)

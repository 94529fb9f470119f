"""LangChain's llama-cpp-python integration on Conductor, with only the import changed.

Needs `pip install langchain-community` beside the conductor package. Runs LangChain's
`LlamaCpp` (completion, streamed too) and `ChatLlamaCpp` on the default model, greedy, and
checks their text against `conductor.Llama`'s own. Prints what it compared; exits non-zero on a
difference.

    python python/examples/langchain_llamacpp.py [MODEL]
"""

import sys

import conductor

# LangChain does `from llama_cpp import Llama, LlamaGrammar` itself: let that find Conductor.
conductor.install_as_llama_cpp()

from langchain_community.chat_models import ChatLlamaCpp  # noqa: E402
from langchain_community.llms import LlamaCpp  # noqa: E402

MODEL = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"
PROMPT = "The capital of France is"
QUESTION = "What is the capital of Japan?"
SETTINGS = dict(model_path=MODEL, n_ctx=512, n_threads=2, temperature=0, max_tokens=24, verbose=False)
# What LangChain sends besides (its defaults): the same here, so the texts can be compared.
SAMPLING = dict(max_tokens=24, temperature=0, top_p=0.95, top_k=40, repeat_penalty=1.1)

with conductor.Llama(MODEL, n_ctx=512, n_threads=2, verbose=False) as llm:
    want_text = llm(PROMPT, **SAMPLING)["choices"][0]["text"]
    want_chat = llm.create_chat_completion([{"role": "user", "content": QUESTION}], **SAMPLING)[
        "choices"
    ][0]["message"]["content"]

completion = LlamaCpp(**SETTINGS)
got_text = completion.invoke(PROMPT)
got_stream = "".join(completion.stream(PROMPT))
chat = ChatLlamaCpp(**SETTINGS)
got_chat = chat.invoke([("user", QUESTION)]).content

failed = False
for what, got, want in [
    ("LlamaCpp.invoke", got_text, want_text),
    ("LlamaCpp.stream", got_stream, want_text),
    ("ChatLlamaCpp.invoke", got_chat, want_chat),
]:
    same = got == want
    failed |= not same
    print(f"{what}: {'same as' if same else 'DIFFERS from'} conductor.Llama: {got!r}")
sys.exit(1 if failed else 0)

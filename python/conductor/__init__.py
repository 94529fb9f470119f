"""Conductor from Python, in llama-cpp-python's shape.

Conductor runs GGUF language models, including models larger than memory (a neuron store
under a memory budget), after the PowerInfer-2 paper. ``conductor.Llama`` takes the
arguments and returns the dicts of ``llama_cpp.Llama``, so code written for
llama-cpp-python changes one import::

    from conductor import Llama

    llm = Llama("smollm2-135m")  # a model Conductor knows, fetched on first use
    out = llm("The capital of France is", max_tokens=16, temperature=0)
    print(out["choices"][0]["text"])

Libraries that import ``llama_cpp`` themselves (LangChain, LlamaIndex) find this package
after ``conductor.install_as_llama_cpp()``. See docs/python.md in the repository.
"""

from ._native import known_model_path, known_models
from .compat import LlamaGrammar, install_as_llama_cpp
from .llama import Llama, convert

__all__ = [
    "Llama",
    "LlamaGrammar",
    "convert",
    "install_as_llama_cpp",
    "known_models",
    "known_model_path",
]
__version__ = "0.1.0"

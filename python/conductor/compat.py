"""Standing in for llama-cpp-python where a library imports it itself.

LangChain's ``LlamaCpp`` and ``ChatLlamaCpp`` and LlamaIndex's ``LlamaCPP`` do
``from llama_cpp import Llama`` inside their own code, so changing the caller's import is not
enough: :func:`install_as_llama_cpp` makes that import find this package.
"""

import sys
from typing import Any, NoReturn

_GRAMMAR_HINT = (
    "GBNF grammars are not supported by Conductor: constrain the output with a JSON schema "
    "instead (response_format={'type': 'json_object', 'schema': ...})"
)


class LlamaGrammar:
    """llama-cpp-python's GBNF grammar, which Conductor does not have: both constructors raise
    ValueError. (Libraries import the name whether or not they use a grammar.)"""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ValueError(_GRAMMAR_HINT)

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> NoReturn:
        raise ValueError(_GRAMMAR_HINT)

    @classmethod
    def from_file(cls, file: Any, verbose: bool = True) -> NoReturn:
        raise ValueError(_GRAMMAR_HINT)

    @classmethod
    def from_json_schema(cls, json_schema: str, verbose: bool = True) -> NoReturn:
        raise ValueError(_GRAMMAR_HINT)


def install_as_llama_cpp() -> None:
    """Makes ``import llama_cpp`` give the ``conductor`` package, for libraries that import
    llama-cpp-python themselves. Call it before they construct their model. If llama-cpp-python
    itself was imported already, RuntimeError: two engines under one name would be a trap."""
    import conductor

    present = sys.modules.get("llama_cpp")
    if present is conductor:
        return
    if present is not None:
        raise RuntimeError(
            "llama_cpp is imported already (llama-cpp-python): call "
            "conductor.install_as_llama_cpp() before anything imports it"
        )
    sys.modules["llama_cpp"] = conductor

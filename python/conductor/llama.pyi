"""Type stubs of conductor.llama: llama-cpp-python's Llama, with Conductor's settings."""

import os
import types
from typing import Any, Dict, Iterator, List, Literal, Optional, Sequence, Union, overload

LLAMA_DEFAULT_SEED: int

_Path = Union[str, "os.PathLike[str]"]
_Stop = Union[str, List[str], None]
Completion = Dict[str, Any]
CompletionChunk = Dict[str, Any]
ChatCompletion = Dict[str, Any]
ChatCompletionChunk = Dict[str, Any]

def convert(model: _Path, output: _Path, overwrite: bool = False) -> None: ...

class Llama:
    model_path: str
    verbose: bool
    chat_format: Optional[str]
    def __init__(
        self,
        model_path: Optional[_Path] = None,
        *,
        n_ctx: int = 512,
        n_threads: Optional[int] = None,
        seed: int = ...,
        verbose: bool = True,
        chat_format: Optional[str] = None,
        chat_template: Optional[str] = None,
        memory: Union[str, int, None] = None,
        sparsity: Optional[str] = None,
        target_sparsity: Optional[float] = None,
        sparse_profile: Optional[_Path] = None,
        plan: Optional[_Path] = None,
        **kwargs: Any,
    ) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Llama": ...
    def __exit__(self, *exc: Any) -> None: ...
    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> List[int]: ...
    def detokenize(
        self, tokens: Sequence[int], prev_tokens: Optional[Sequence[int]] = None, special: bool = False
    ) -> bytes: ...
    def n_ctx(self) -> int: ...
    @property
    def context_params(self) -> types.SimpleNamespace: ...
    def n_vocab(self) -> int: ...
    def token_bos(self) -> int: ...
    def token_eos(self) -> int: ...
    def reset(self) -> None: ...
    def set_seed(self, seed: int) -> None: ...
    def memory_budget(self) -> Optional[Dict[str, int]]: ...
    def metrics(self) -> str: ...
    @overload
    def create_completion(
        self, prompt: Union[str, bytes], suffix: Optional[str] = None, max_tokens: Optional[int] = 16,
        temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
        logprobs: Optional[int] = None, echo: bool = False, stop: _Stop = None,
        frequency_penalty: float = 0.0, presence_penalty: float = 0.0, repeat_penalty: float = 1.0,
        top_k: int = 40, stream: Literal[False] = False, seed: Optional[int] = None, **kwargs: Any,
    ) -> Completion: ...
    @overload
    def create_completion(
        self, prompt: Union[str, bytes], suffix: Optional[str] = None, max_tokens: Optional[int] = 16,
        temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
        logprobs: Optional[int] = None, echo: bool = False, stop: _Stop = None,
        frequency_penalty: float = 0.0, presence_penalty: float = 0.0, repeat_penalty: float = 1.0,
        top_k: int = 40, *, stream: Literal[True], seed: Optional[int] = None, **kwargs: Any,
    ) -> Iterator[CompletionChunk]: ...
    def __call__(
        self, prompt: Union[str, bytes], *args: Any, **kwargs: Any
    ) -> Union[Completion, Iterator[CompletionChunk]]: ...
    @overload
    def create_chat_completion(
        self, messages: List[Dict[str, Any]], functions: Optional[List[Dict[str, Any]]] = None,
        function_call: Union[str, Dict[str, Any], None] = None,
        tools: Optional[List[Dict[str, Any]]] = None,
        tool_choice: Union[str, Dict[str, Any], None] = None, temperature: float = 0.2,
        top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05, typical_p: float = 1.0,
        stream: Literal[False] = False, stop: _Stop = None, seed: Optional[int] = None,
        response_format: Optional[Dict[str, Any]] = None, max_tokens: Optional[int] = None,
        **kwargs: Any,
    ) -> ChatCompletion: ...
    @overload
    def create_chat_completion(
        self, messages: List[Dict[str, Any]], functions: Optional[List[Dict[str, Any]]] = None,
        function_call: Union[str, Dict[str, Any], None] = None,
        tools: Optional[List[Dict[str, Any]]] = None,
        tool_choice: Union[str, Dict[str, Any], None] = None, temperature: float = 0.2,
        top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05, typical_p: float = 1.0,
        *, stream: Literal[True], stop: _Stop = None, seed: Optional[int] = None,
        response_format: Optional[Dict[str, Any]] = None, max_tokens: Optional[int] = None,
        **kwargs: Any,
    ) -> Iterator[ChatCompletionChunk]: ...

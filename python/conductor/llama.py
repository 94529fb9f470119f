"""``Llama``: llama-cpp-python's class over Conductor's engine.

Requests go to the engine as the OpenAI API's JSON and are handled by the code of
``conductor serve`` (the chat template, constrained decoding for JSON schemas and tool calls,
stop sequences, log-probabilities), in this process: the answers are the server's, shaped as
llama-cpp-python shapes them.
"""

from __future__ import annotations

import json
import os
import types
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from . import _native

#: llama-cpp-python's "no seed given": each call draws from a fresh seed.
LLAMA_DEFAULT_SEED = 0xFFFFFFFF

# Constructor arguments of llama_cpp.Llama that have no meaning for Conductor (GPU layers,
# batch sizes, mlock, RoPE overrides...). They are accepted so that code written for
# llama-cpp-python (and LangChain's LlamaCpp, which passes several) runs unchanged; any other
# unknown argument is a TypeError.
_IGNORED_INIT_ARGS = frozenset(
    """n_gpu_layers split_mode main_gpu tensor_split rpc_servers vocab_only use_mmap use_mlock
    kv_overrides n_batch n_ubatch n_threads_batch rope_scaling_type pooling_type rope_freq_base
    rope_freq_scale yarn_ext_factor yarn_attn_factor yarn_beta_fast yarn_beta_slow
    yarn_orig_ctx logits_all embedding offload_kqv flash_attn op_offload swa_full no_perf
    last_n_tokens_size lora_base lora_scale lora_path numa chat_handler draft_model tokenizer
    type_k type_v spm_infill n_parts f16_kv""".split()
)

# ChatML, for chat_format="chatml" (the format of models trained on it, and llama.cpp's
# fallback for files without a template).
_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _error(status: Optional[int], text: Optional[str]) -> Exception:
    """The server's error answer as a Python exception: the request at fault (4xx) is a
    ValueError, the engine's failures (5xx, a full queue, a stream cut short) RuntimeError."""
    message = text or "no answer"
    try:
        message = json.loads(text)["error"]["message"]  # type: ignore[arg-type]
    except (TypeError, ValueError, KeyError):
        pass
    if status is not None and 400 <= status < 500 and status != 429:
        return ValueError(message)
    return RuntimeError(message)


def _error_code(text: Optional[str]) -> tuple:
    try:
        error = json.loads(text)["error"]  # type: ignore[arg-type]
        return error.get("code"), error.get("param")
    except (TypeError, ValueError, KeyError, AttributeError):
        return None, None


def _unsupported(name: str, value: Any, default: Any) -> None:
    if value != default:
        raise ValueError(
            f"{name}={value!r} is not supported by Conductor (leave it at {default!r}); "
            "see docs/python.md for what is"
        )


def _refuse_unsupported_sampling(typical_p: float, frequency_penalty: float,
                                 presence_penalty: float, tfs_z: float, mirostat_mode: int,
                                 logits_processor: Any, grammar: Any,
                                 logit_bias: Optional[Dict[int, float]]) -> None:
    """llama-cpp-python's sampling settings that Conductor does not have: ValueError unless
    each is at its default."""
    _unsupported("typical_p", typical_p, 1.0)
    _unsupported("frequency_penalty", frequency_penalty, 0.0)
    _unsupported("presence_penalty", presence_penalty, 0.0)
    _unsupported("tfs_z", tfs_z, 1.0)
    _unsupported("mirostat_mode", mirostat_mode, 0)
    _unsupported("logits_processor", logits_processor, None)
    _unsupported("grammar", grammar, None)
    _unsupported("logit_bias", logit_bias, None)


def _sampling_body(max_tokens: Optional[int], temperature: float, top_p: float, min_p: float,
                   top_k: int, repeat_penalty: float, stop: Union[str, List[str], None],
                   seed: int, ignore_eos: bool, stream: bool) -> Dict[str, Any]:
    """The request fields a completion and a chat share, as the server reads them."""
    return {
        "max_tokens": max_tokens if max_tokens is not None and max_tokens > 0 else None,
        "temperature": temperature,
        "top_p": top_p,
        "min_p": min_p,
        "top_k": top_k,
        "repeat_penalty": repeat_penalty,
        "stop": stop if stop else None,
        "seed": seed,
        "ignore_eos": ignore_eos or None,
        "stream": stream,
    }


def convert(model: Union[str, "os.PathLike[str]"], output: Union[str, "os.PathLike[str]"],
            overwrite: bool = False) -> None:
    """Converts a GGUF model (a file, or a known model's name) into a neuron store at
    ``output``, as ``conductor convert`` does. A store runs under a memory budget:
    ``Llama(output, memory="50%")``. An existing ``output`` is kept unless ``overwrite``."""
    _native.convert(os.fspath(model), os.fspath(output), overwrite)


class Llama:
    """A language model, loaded once, with llama-cpp-python's methods.

    ``model_path`` is a GGUF file, a neuron store (``conductor.convert``), or the name of a
    model Conductor knows (``conductor.known_models()``, e.g. ``"smollm2-135m"``), fetched
    into ``~/.cache/conductor`` on first use; ``None`` is the default model (SmolLM2-135M).

    llama-cpp-python's arguments: ``n_ctx`` (tokens a prompt and its answer hold together;
    0: Conductor's default), ``n_threads`` (default: every core), ``seed`` (the default seed of
    sampling calls; the default draws a fresh one each call), ``verbose`` (progress lines on
    stderr), ``chat_format`` (``None``: the model's own chat template; ``"chatml"``).
    Arguments of llama_cpp.Llama that mean nothing here (``n_gpu_layers``, ``n_batch``,
    ``use_mlock``...) are accepted and ignored.

    Conductor's own: ``memory`` (a budget for everything the process holds: bytes, ``"48MiB"``
    or ``"50%"`` of the model file; needs a neuron store), ``sparsity`` (``"default"``,
    ``"dense"``, ``"threshold"``, ``"predictor"``), ``target_sparsity`` (a share, 0.3),
    ``sparse_profile`` (an activation profile, default beside the model), ``plan`` (an
    execution plan file from ``conductor plan``), ``chat_template`` (a Jinja chat template's
    source instead of the model's).

    Bad input raises ValueError with Conductor's message (a missing or malformed file, an
    unknown model name, a budget too small); a failure of the engine raises RuntimeError.
    ``close()`` (or leaving a ``with`` block) stops the engine and frees the model.
    """

    def __init__(
        self,
        model_path: Union[str, "os.PathLike[str]", None] = None,
        *,
        n_ctx: int = 512,
        n_threads: Optional[int] = None,
        seed: int = LLAMA_DEFAULT_SEED,
        verbose: bool = True,
        chat_format: Optional[str] = None,
        chat_template: Optional[str] = None,
        memory: Union[str, int, None] = None,
        sparsity: Optional[str] = None,
        target_sparsity: Optional[float] = None,
        sparse_profile: Union[str, "os.PathLike[str]", None] = None,
        plan: Union[str, "os.PathLike[str]", None] = None,
        **kwargs: Any,
    ) -> None:
        unknown = sorted(set(kwargs) - _IGNORED_INIT_ARGS)
        if unknown:
            raise TypeError(f"Llama() got unexpected keyword arguments: {', '.join(unknown)}")
        if chat_format is not None:
            if chat_template is not None:
                raise ValueError("give chat_format or chat_template, not both")
            if chat_format.lower() != "chatml":
                raise ValueError(
                    f"chat_format={chat_format!r}: Conductor renders the model's own chat "
                    "template (chat_format=None), ChatML (\"chatml\"), or a Jinja template "
                    "given as chat_template=..."
                )
            chat_template = _CHATML
        self.verbose = verbose
        self._seed = seed
        self._native = _native.NativeEngine(
            None if model_path is None else os.fspath(model_path),
            n_ctx=n_ctx,
            n_threads=n_threads,
            memory=memory,
            sparsity=sparsity,
            target_sparsity=target_sparsity,
            sparse_profile=None if sparse_profile is None else os.fspath(sparse_profile),
            plan=None if plan is None else os.fspath(plan),
            chat_template=chat_template,
            verbose=verbose,
        )
        self.model_path = str(model_path) if model_path is not None else str(
            self._native.model_path
        )
        self.chat_format = chat_format

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Stops the engine and frees the model. The object cannot generate afterwards."""
        self._native.close()

    def __enter__(self) -> "Llama":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- tokens ---------------------------------------------------------------------------

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> List[int]:
        """Token ids of ``text`` (UTF-8 bytes). ``add_bos``: the model's beginning-of-sequence
        token first, if it has one; ``special``: special tokens written in the text
        (``<|im_start|>``) are read as such."""
        if isinstance(text, str):
            raise TypeError("tokenize takes bytes: encode the text first (text.encode())")
        return self._native.tokenize(bytes(text), add_bos, special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Optional[Sequence[int]] = None,
                   special: bool = False) -> bytes:
        """The bytes of ``tokens`` (``special``: special tokens' text too). ``prev_tokens`` is
        accepted for llama-cpp-python's signature and does not change the result."""
        return self._native.detokenize(list(tokens), special)

    def n_ctx(self) -> int:
        """Tokens a prompt and its answer may hold together."""
        return self._native.n_ctx()

    @property
    def context_params(self) -> types.SimpleNamespace:
        """llama-cpp-python's context parameters, as far as they mean something here:
        ``n_ctx`` (LlamaIndex reads it)."""
        return types.SimpleNamespace(n_ctx=self.n_ctx())

    def n_vocab(self) -> int:
        return self._native.n_vocab()

    def token_bos(self) -> int:
        bos = self._native.token_bos()
        return -1 if bos is None else bos

    def token_eos(self) -> int:
        eos = self._native.token_eos()
        return -1 if eos is None else eos

    def reset(self) -> None:
        """Forgets the evaluated tokens: the next call evaluates its whole prompt. (Without it
        a prompt that begins like the last one evaluates only what is new; the answer is the
        same either way.)"""
        self._native.reset()

    def set_seed(self, seed: int) -> None:
        """The seed of later calls that give none."""
        self._seed = seed

    # -- Conductor's extras ---------------------------------------------------------------

    def memory_budget(self) -> Optional[Dict[str, int]]:
        """Under a memory budget, its split in bytes (``budget``, ``resident_weights``,
        ``kv_cache``, ``neuron_cache``); ``None`` without one."""
        return json.loads(self._get("/props")).get("memory")

    def metrics(self) -> str:
        """The engine's Prometheus metrics, as ``conductor serve``'s ``/metrics`` writes them
        (tokens, cancelled requests, neuron cache hits...)."""
        return self._get("/metrics")

    def _get(self, path: str) -> str:
        call = self._native.request(path, "")
        text = call.next()
        if call.status != 200:
            raise _error(call.status, text)
        return text or ""

    # -- requests -------------------------------------------------------------------------

    def _seed_for(self, seed: Optional[int]) -> Optional[int]:
        if seed is None:
            seed = self._seed
        if seed is None or seed == LLAMA_DEFAULT_SEED or seed < 0:
            return None
        return seed

    def _start(self, path: str, body: Dict[str, Any]):
        """Sends a request; returns the open call and the answer's first piece."""
        body = {k: v for k, v in body.items() if v is not None}
        call = self._native.request(path, json.dumps(body))
        first = call.next()
        status = call.status
        if status == 400 and "max_tokens" in body:
            code, param = _error_code(first)
            if code == "context_length_exceeded" and param == "max_tokens":
                # llama-cpp-python stops at the end of the context rather than refusing a
                # max_tokens beyond it: ask again for whatever room the prompt leaves.
                del body["max_tokens"]
                return self._start(path, body)
        if status != 200:
            call.close()
            raise _error(status, first)
        return call, first

    def _pieces(self, call: Any, first: Optional[str]) -> Iterator[Dict[str, Any]]:
        """The events of a streamed answer; closing the iterator cancels the generation."""
        try:
            piece = first
            while piece is not None:
                event = json.loads(piece)
                if "error" in event:
                    raise _error(500, piece)
                yield event
                piece = call.next()
        finally:
            call.close()

    def __call__(self, prompt: str, *args: Any, **kwargs: Any):
        """``create_completion``."""
        return self.create_completion(prompt, *args, **kwargs)

    def create_completion(
        self,
        prompt: Union[str, bytes],
        suffix: Optional[str] = None,
        max_tokens: Optional[int] = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        logprobs: Optional[int] = None,
        echo: bool = False,
        stop: Union[str, List[str], None] = None,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        top_k: int = 40,
        stream: bool = False,
        seed: Optional[int] = None,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: Optional[str] = None,
        stopping_criteria: Any = None,
        logits_processor: Any = None,
        grammar: Any = None,
        logit_bias: Optional[Dict[int, float]] = None,
        *,
        ignore_eos: bool = False,
    ):
        """Completes ``prompt``: an OpenAI ``text_completion`` dict, or with ``stream=True`` an
        iterator of its chunks (closing the iterator early cancels the generation).

        ``max_tokens`` None or <= 0: up to the end of the context. ``temperature=0`` is greedy
        (the text ``conductor run --temp 0`` prints). ``logprobs=n`` lists each token's
        log-probability and its n likeliest rivals (n <= 5). ``stop``: up to 4 texts that end
        the answer (not included). ``ignore_eos`` (Conductor's): generate past the end of
        the text. Ctrl-C raises KeyboardInterrupt and cancels the generation."""
        if isinstance(prompt, bytes):
            prompt = prompt.decode("utf-8")
        if not isinstance(prompt, str):
            raise ValueError("prompt must be text (token ids are not supported as a prompt)")
        _unsupported("suffix", suffix, None)
        _unsupported("stopping_criteria", stopping_criteria, None)
        _refuse_unsupported_sampling(typical_p, frequency_penalty, presence_penalty, tfs_z,
                                     mirostat_mode, logits_processor, grammar, logit_bias)
        if echo and logprobs is not None:
            raise ValueError("echo with logprobs is not supported")
        body = {
            "prompt": prompt,
            "logprobs": logprobs,
            **_sampling_body(max_tokens, temperature, top_p, min_p, top_k, repeat_penalty, stop,
                             self._seed_for(seed), ignore_eos, stream),
        }
        call, first = self._start("/v1/completions", body)
        name = model or self.model_path
        if not stream:
            answer = _whole_answer(call, first, name)
            if echo:
                answer["choices"][0]["text"] = prompt + answer["choices"][0]["text"]
            return answer
        return self._completion_chunks(call, first, name, prompt if echo else None)

    def _completion_chunks(self, call, first, name, echo):
        for chunk in self._pieces(call, first):
            chunk["model"] = name
            if echo is not None and chunk.get("choices"):
                chunk["choices"][0]["text"] = echo + chunk["choices"][0]["text"]
                echo = None
            yield chunk

    def create_chat_completion(
        self,
        messages: List[Dict[str, Any]],
        functions: Optional[List[Dict[str, Any]]] = None,
        function_call: Union[str, Dict[str, Any], None] = None,
        tools: Optional[List[Dict[str, Any]]] = None,
        tool_choice: Union[str, Dict[str, Any], None] = None,
        temperature: float = 0.2,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        stream: bool = False,
        stop: Union[str, List[str], None] = None,
        seed: Optional[int] = None,
        response_format: Optional[Dict[str, Any]] = None,
        max_tokens: Optional[int] = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: Optional[str] = None,
        logits_processor: Any = None,
        grammar: Any = None,
        logit_bias: Optional[Dict[int, float]] = None,
        logprobs: Optional[bool] = None,
        top_logprobs: Optional[int] = None,
        *,
        ignore_eos: bool = False,
    ):
        """Answers a chat: an OpenAI ``chat.completion`` dict, or with ``stream=True`` an
        iterator of ``chat.completion.chunk`` dicts.

        The messages are rendered with the model's own chat template (or the one the
        constructor chose). ``response_format={"type": "json_object"}`` makes the answer a
        JSON object, and with ``"schema": {...}`` one that the JSON schema accepts
        (constrained decoding, as ``conductor serve`` does; OpenAI's
        ``{"type": "json_schema", "json_schema": {"schema": ...}}`` works too). ``tools`` and
        ``tool_choice`` (``"auto"``, ``"none"``, ``"required"`` or a named function) offer
        functions to the model; a forced call is constrained to the functions' parameter
        schemas, and calls come back as ``message["tool_calls"]``. A malformed schema raises
        ValueError."""
        _refuse_unsupported_sampling(typical_p, frequency_penalty, presence_penalty, tfs_z,
                                     mirostat_mode, logits_processor, grammar, logit_bias)
        if functions is not None:
            # The legacy `functions` / `function_call` pair, as tools.
            if tools is not None:
                raise ValueError("give tools or functions, not both")
            tools = [{"type": "function", "function": f} for f in functions]
            if isinstance(function_call, dict):
                tool_choice = {"type": "function", "function": {"name": function_call["name"]}}
            elif function_call is not None:
                tool_choice = function_call
        body = {
            "messages": messages,
            "response_format": _response_format(response_format),
            "tools": tools,
            "tool_choice": tool_choice,
            "logprobs": logprobs,
            "top_logprobs": top_logprobs,
            **_sampling_body(max_tokens, temperature, top_p, min_p, top_k, repeat_penalty, stop,
                             self._seed_for(seed), ignore_eos, stream),
        }
        call, first = self._start("/v1/chat/completions", body)
        name = model or self.model_path
        if not stream:
            return _whole_answer(call, first, name)
        return self._chat_chunks(call, first, name)

    def _chat_chunks(self, call, first, name):
        for chunk in self._pieces(call, first):
            if not chunk.get("choices"):
                continue  # the usage-only chunk, which llama-cpp-python does not send
            chunk["model"] = name
            chunk.pop("timings", None)
            yield chunk


def _whole_answer(call: Any, body: str, name: str) -> Dict[str, Any]:
    """A non-streamed answer: the server's JSON body, named after the model the caller gave."""
    call.close()
    answer = json.loads(body)
    answer["model"] = name
    return answer


def _response_format(fmt: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """llama-cpp-python's ``{"type": "json_object", "schema": S}`` as the server's
    ``json_schema`` format; other formats as given."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise ValueError("response_format must be a dict such as {\"type\": \"json_object\"}")
    if fmt.get("type") == "json_object" and fmt.get("schema") is not None:
        schema = fmt["schema"]
        if not isinstance(schema, dict):
            raise ValueError("response_format's schema must be a JSON schema (a dict)")
        return {"type": "json_schema", "json_schema": {"schema": schema}}
    return fmt


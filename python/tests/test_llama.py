"""The Python package on the default model (SmolLM2-135M-Instruct Q4_1, fetched on first use).

The greedy references come from the `conductor` binary: $CONDUCTOR_BIN, default
target/checked/conductor (what `cargo test --workspace --profile checked` builds).
"""

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

import conductor
from conductor import Llama

ROOT = Path(__file__).resolve().parents[2]
THREADS = 2
PROMPT = "The capital of France is"
CHAT = "What is the capital of Japan?"


def conductor_bin() -> str:
    path = Path(os.environ.get("CONDUCTOR_BIN", ROOT / "target" / "checked" / "conductor"))
    if not path.is_file():
        pytest.fail(
            f"no conductor binary at {path}: build it (cargo build --profile checked) "
            "or point CONDUCTOR_BIN at one"
        )
    return str(path)


def cli_greedy(*args: str) -> str:
    """What `conductor run --temp 0` prints as the answer (its stdout, less the newline it
    ends with)."""
    out = subprocess.run(
        [conductor_bin(), "run", "--temp", "0", "-t", str(THREADS), "--no-display-prompt", *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    assert out.endswith("\n"), repr(out)
    return out[:-1]


@pytest.fixture(scope="module")
def llm():
    with Llama(n_threads=THREADS, verbose=False) as model:
        yield model


def counter(llm: Llama, name: str) -> float:
    for line in llm.metrics().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


# -- answers --------------------------------------------------------------------------------


def test_greedy_completion_is_the_cli_text(llm):
    want = cli_greedy("-p", PROMPT, "-n", "24")
    got = llm(PROMPT, max_tokens=24, temperature=0)
    assert got["object"] == "text_completion"
    assert got["choices"][0]["text"] == want
    usage = got["usage"]
    assert usage["prompt_tokens"] == len(llm.tokenize(PROMPT.encode()))
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_greedy_chat_is_the_cli_chat_text(llm):
    want = cli_greedy("--chat", "-p", CHAT, "-n", "48")
    got = llm.create_chat_completion(
        [{"role": "user", "content": CHAT}], temperature=0, max_tokens=48
    )
    message = got["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert message["content"] == want
    assert got["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_stream_joined_is_the_answer(llm):
    whole = llm(PROMPT, max_tokens=32, temperature=0, ignore_eos=True)
    chunks = list(llm(PROMPT, max_tokens=32, temperature=0, ignore_eos=True, stream=True))
    assert len(chunks) > 2
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"

    messages = [{"role": "user", "content": CHAT}]
    whole = llm.create_chat_completion(messages, temperature=0, max_tokens=32)
    chunks = list(llm.create_chat_completion(messages, temperature=0, max_tokens=32, stream=True))
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    joined = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert joined == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]


def test_sampling_with_a_seed_repeats_and_seeds_differ(llm):
    a = llm(PROMPT, max_tokens=24, temperature=1.0, seed=7, ignore_eos=True)
    b = llm(PROMPT, max_tokens=24, temperature=1.0, seed=7, ignore_eos=True)
    c = llm(PROMPT, max_tokens=24, temperature=1.0, seed=8, ignore_eos=True)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert a["choices"][0]["text"] != c["choices"][0]["text"]


def test_a_stop_sequence_ends_the_text_before_it(llm):
    full = llm(PROMPT, max_tokens=24, temperature=0, ignore_eos=True)["choices"][0]["text"]
    # A word from the middle of the greedy answer.
    words = full.split()
    assert len(words) >= 4, full
    stop = words[2]
    got = llm(PROMPT, max_tokens=24, temperature=0, stop=[stop], ignore_eos=True)
    assert got["choices"][0]["text"] == full[: full.index(stop)]
    assert got["choices"][0]["finish_reason"] == "stop"


def test_logprobs_come_per_token(llm):
    got = llm(PROMPT, max_tokens=8, temperature=0, logprobs=3, ignore_eos=True)
    lp = got["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == got["usage"]["completion_tokens"] == 8
    assert "".join(lp["tokens"]) == got["choices"][0]["text"]
    for own, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
        assert len(top) == 3
        # Greedy: the drawn token is the likeliest.
        assert own == pytest.approx(max(top.values()))
        assert own <= 0


def test_echo_puts_the_prompt_first(llm):
    got = llm(PROMPT, max_tokens=4, temperature=0, echo=True)
    plain = llm(PROMPT, max_tokens=4, temperature=0)
    assert got["choices"][0]["text"] == PROMPT + plain["choices"][0]["text"]


def test_a_json_schema_is_honoured(llm):
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "population": {"type": "integer", "minimum": 0},
        },
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    got = llm.create_chat_completion(
        [{"role": "user", "content": "Name a big city and its population, as JSON."}],
        response_format={"type": "json_object", "schema": schema},
        temperature=0,
        max_tokens=80,
    )
    assert got["choices"][0]["finish_reason"] == "stop"
    answer = json.loads(got["choices"][0]["message"]["content"])
    assert set(answer) == {"city", "population"}
    assert isinstance(answer["city"], str) and len(answer["city"]) <= 24
    assert isinstance(answer["population"], int) and answer["population"] >= 0


def test_json_object_without_a_schema_is_an_object(llm):
    got = llm.create_chat_completion(
        [{"role": "user", "content": "Describe a cat as JSON."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=60,
        stream=True,
    )
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in got)
    assert text.lstrip().startswith("{")


def test_tokens_round_trip(llm):
    text = "Hello, world! <|im_start|>"
    ids = llm.tokenize(text.encode())
    assert llm.detokenize(ids).decode() == text
    assert llm.tokenize(text.encode(), add_bos=False) == ids[len(ids) - len(llm.tokenize(text.encode(), add_bos=False)):]
    special = llm.tokenize(text.encode(), add_bos=False, special=True)
    assert len(special) < len(llm.tokenize(text.encode(), add_bos=False))
    assert llm.n_ctx() == 512
    assert llm.n_vocab() > 1000
    assert 0 <= llm.token_eos() < llm.n_vocab()
    with pytest.raises(TypeError):
        llm.tokenize(text)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not in the vocabulary"):
        llm.detokenize([llm.n_vocab()])


def test_reset_makes_the_next_prompt_evaluate_whole(llm):
    llm(PROMPT, max_tokens=2, temperature=0)
    before = counter(llm, "conductor_prompt_tokens_cached_total")
    llm(PROMPT, max_tokens=2, temperature=0)
    reused = counter(llm, "conductor_prompt_tokens_cached_total") - before
    assert reused > 0
    llm.reset()
    before = counter(llm, "conductor_prompt_tokens_cached_total")
    llm(PROMPT, max_tokens=2, temperature=0)
    assert counter(llm, "conductor_prompt_tokens_cached_total") == before


# -- behaviour ------------------------------------------------------------------------------


def test_another_thread_runs_during_a_generation(llm):
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.001)

    t = threading.Thread(target=tick)
    t.start()
    try:
        time.sleep(0.05)
        start = time.monotonic()
        llm(PROMPT, max_tokens=64, temperature=0, ignore_eos=True)
        end = time.monotonic()
    finally:
        stop.set()
        t.join()
    during = [x for x in ticks if start <= x <= end]
    gaps = [b - a for a, b in zip([start] + during, during + [end])]
    assert end - start > 0.1, "the generation was too short to tell"
    # Holding the GIL through the call would leave one gap as long as the generation.
    assert max(gaps) < 0.1, max(gaps)
    assert len(during) > (end - start) * 100


def test_ctrl_c_interrupts_and_the_model_stays_usable(llm):
    want = llm(PROMPT, max_tokens=12, temperature=0)["choices"][0]["text"]
    cancelled = counter(llm, "conductor_requests_cancelled_total")
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    started = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        llm(PROMPT, max_tokens=500, temperature=0, ignore_eos=True)
    timer.join()
    assert time.monotonic() - started < 5
    assert llm(PROMPT, max_tokens=12, temperature=0)["choices"][0]["text"] == want
    assert counter(llm, "conductor_requests_cancelled_total") == cancelled + 1


def test_a_dropped_stream_cancels_its_generation(llm):
    cancelled = counter(llm, "conductor_requests_cancelled_total")
    generated = counter(llm, "conductor_completion_tokens_total")
    stream = llm(PROMPT, max_tokens=400, temperature=0, ignore_eos=True, stream=True)
    next(stream)
    next(stream)
    stream.close()
    deadline = time.monotonic() + 10
    while counter(llm, "conductor_requests_cancelled_total") == cancelled:
        assert time.monotonic() < deadline, "the dropped stream's generation went on"
        time.sleep(0.02)
    assert counter(llm, "conductor_completion_tokens_total") - generated < 400


def test_close_frees_the_engine():
    with Llama(n_threads=1, verbose=False) as model:
        assert model(PROMPT, max_tokens=2, temperature=0)["usage"]["completion_tokens"] >= 1
    with pytest.raises(RuntimeError, match="closed"):
        model(PROMPT, max_tokens=2)
    model.close()  # twice is fine


# -- errors ---------------------------------------------------------------------------------


def test_a_missing_file_is_a_value_error(tmp_path):
    missing = tmp_path / "nope" / "model.gguf"
    with pytest.raises(ValueError, match="model.gguf"):
        Llama(str(missing), verbose=False)


def test_a_hostile_file_is_a_value_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes([3, 0, 0, 0]) + b"\xff" * 64)
    with pytest.raises(ValueError, match="bad.gguf"):
        Llama(str(bad), verbose=False)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(ValueError):
        Llama(str(junk), verbose=False)


def test_an_unknown_model_name_is_a_value_error():
    with pytest.raises(ValueError, match="smollm2-135m"):
        Llama("no-such-model-7b", verbose=False)


def test_bad_settings_are_value_errors():
    with pytest.raises(ValueError, match="memory"):
        Llama(memory="lots", verbose=False)
    with pytest.raises(ValueError, match="sparsity"):
        Llama(sparsity="some", verbose=False)
    with pytest.raises(ValueError, match="n_threads"):
        Llama(n_threads=0, verbose=False)
    with pytest.raises(TypeError, match="n_gpu_layerz"):
        Llama(n_gpu_layerz=3, verbose=False)


def test_a_prompt_longer_than_the_context_is_a_value_error():
    with Llama(n_ctx=32, n_threads=THREADS, verbose=False) as small:
        with pytest.raises(ValueError, match="context"):
            small("word " * 100, max_tokens=4)
        # max_tokens past the context stops at its end, as llama-cpp-python does.
        got = small(PROMPT, max_tokens=1000, temperature=0, ignore_eos=True)
        assert got["usage"]["total_tokens"] == 32


def test_bad_request_values_are_value_errors(llm):
    with pytest.raises(ValueError, match="temperature"):
        llm(PROMPT, max_tokens=4, temperature=-1)
    with pytest.raises(ValueError, match="frequency_penalty"):
        llm(PROMPT, max_tokens=4, frequency_penalty=0.5)
    with pytest.raises(ValueError, match="messages"):
        llm.create_chat_completion([])


def test_a_malformed_schema_is_a_value_error(llm):
    with pytest.raises(ValueError, match="schema"):
        llm.create_chat_completion(
            [{"role": "user", "content": "hi"}],
            response_format={"type": "json_object", "schema": {"type": "no-such-type"}},
        )
    with pytest.raises(ValueError, match="schema"):
        llm.create_chat_completion(
            [{"role": "user", "content": "hi"}],
            response_format={"type": "json_object", "schema": "not a schema"},
        )


def test_tools_on_a_template_without_them_are_a_value_error(llm):
    tool = {
        "type": "function",
        "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}},
    }
    with pytest.raises(ValueError, match="tools"):
        llm.create_chat_completion(
            [{"role": "user", "content": "Weather in Paris?"}], tools=[tool], tool_choice="required"
        )


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def qwen_template_llm():
    """The default model with Qwen 2.5's chat template, which renders tools (Hermes
    `<tool_call>` syntax), as the server's tool-call test runs it."""
    template = ROOT / "runtime" / "tests" / "data" / "chat-templates" / "qwen2.5.jinja"
    with Llama(
        n_threads=THREADS, n_ctx=1024, chat_template=template.read_text(), verbose=False
    ) as model:
        yield model


def test_a_required_tool_call_comes_back_parsed(qwen_template_llm):
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    for stream in (False, True):
        got = qwen_template_llm.create_chat_completion(
            question, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=64,
            stream=stream,
        )
        if stream:
            calls = {}
            finish = None
            for chunk in got:
                choice = chunk["choices"][0]
                finish = choice["finish_reason"] or finish
                for call in choice["delta"].get("tool_calls") or []:
                    entry = calls.setdefault(call["index"], {"name": "", "arguments": ""})
                    function = call.get("function") or {}
                    entry["name"] += function.get("name") or ""
                    entry["arguments"] += function.get("arguments") or ""
            calls = [calls[i] for i in sorted(calls)]
        else:
            choice = got["choices"][0]
            finish = choice["finish_reason"]
            calls = [c["function"] for c in choice["message"]["tool_calls"]]
            assert all(c["type"] == "function" and c["id"] for c in choice["message"]["tool_calls"])
        assert finish == "tool_calls", (stream, finish)
        assert calls and all(c["name"] == "get_weather" for c in calls), calls
        for call in calls:
            arguments = json.loads(call["arguments"])
            assert isinstance(arguments.get("city"), str), arguments


def test_a_tool_result_goes_back_to_the_model(qwen_template_llm):
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": '{"sky": "sunny", "celsius": 21}'},
    ]
    got = qwen_template_llm.create_chat_completion(
        messages, tools=[WEATHER], temperature=0, max_tokens=32
    )
    message = got["choices"][0]["message"]
    assert got["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
    assert message["content"] or message.get("tool_calls")


# -- a Q4_K_M file ----------------------------------------------------------------------------


def test_gemma3_q4_k_m_greedy_is_the_cli_text():
    """Gemma-3-270M Q4_K_M (fetched on first use; the workspace tests fetch it too): Q4_K,
    Q5_0, Q6_K and Q8_0 weights through the package, completion and chat."""
    with Llama("gemma3-270m", n_threads=THREADS, verbose=False) as gemma:
        want = cli_greedy("-m", "gemma3-270m", "-p", PROMPT, "-n", "16")
        assert gemma(PROMPT, max_tokens=16, temperature=0)["choices"][0]["text"] == want
        want = cli_greedy("-m", "gemma3-270m", "--chat", "-p", CHAT, "-n", "24")
        got = gemma.create_chat_completion(
            [{"role": "user", "content": CHAT}], temperature=0, max_tokens=24
        )
        assert got["choices"][0]["message"]["content"] == want


# -- under a memory budget --------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "smollm2.store.gguf"
    conductor.convert("smollm2-135m", path)
    return path


def test_half_the_model_runs_on_a_neuron_store(store):
    with Llama(str(store), memory="50%", n_ctx=256, n_threads=THREADS, verbose=False) as half:
        budget = half.memory_budget()
        assert budget is not None
        size = store.stat().st_size
        assert budget["budget"] == pytest.approx(size / 2, rel=0.01)
        assert budget["neuron_cache"] > 0
        got = half(PROMPT, max_tokens=16, temperature=0, ignore_eos=True)
        assert got["usage"]["completion_tokens"] == 16
        assert got["choices"][0]["text"].strip()
        # Structured output needs llguidance's tables, which a budget does not hold.
        with pytest.raises(ValueError, match="unavailable"):
            half.create_chat_completion(
                [{"role": "user", "content": "hi"}], response_format={"type": "json_object"}
            )
    with pytest.raises(ValueError, match="convert|store|clear"):
        conductor.convert("smollm2-135m", store)  # exists: kept


def test_a_budget_too_small_is_a_value_error(store):
    with pytest.raises(ValueError, match="budget|MiB"):
        Llama(str(store), memory="1%", verbose=False)


def test_a_budget_needs_a_store():
    with pytest.raises(ValueError, match="store|convert"):
        Llama(memory="50%", verbose=False)


# -- standing in for llama_cpp ------------------------------------------------------------------


def test_install_as_llama_cpp_makes_the_import_find_conductor(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "llama_cpp", raising=False)
    conductor.install_as_llama_cpp()
    from llama_cpp import Llama as Imported, LlamaGrammar  # what LangChain imports

    assert Imported is Llama
    with pytest.raises(ValueError, match="JSON schema"):
        LlamaGrammar.from_string('root ::= "yes"')
    conductor.install_as_llama_cpp()  # a second call is harmless

    monkeypatch.setitem(sys.modules, "llama_cpp", object())  # llama-cpp-python itself
    with pytest.raises(RuntimeError, match="imported already"):
        conductor.install_as_llama_cpp()


def test_context_params_carry_n_ctx(llm):
    assert llm.context_params.n_ctx == llm.n_ctx()

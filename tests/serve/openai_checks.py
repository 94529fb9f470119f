"""Checks of `conductor serve` through the official `openai` client (tests/serve.rs runs them).

    python openai_checks.py BASE_URL SCENARIO [ARGS...]

Each scenario asserts what it checks and exits non-zero on the first failure; what the Rust
side compares (the greedy text) is printed as one JSON line.
"""

import json
import sys
import threading
import time
import urllib.error
import urllib.request

import jsonschema
import openai

BASE = sys.argv[1]
KEY = "sk-test-key"
MODEL = "default"


def client(**kw):
    # No retries: a 429 must reach the test, not be retried away.
    return openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120, **kw)


def raw(path, body=None, key=KEY, method=None):
    """(status, headers, parsed JSON or text) of a request sent as-is."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(BASE + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            status, headers, text = r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        status, headers, text = e.code, e.headers, e.read().decode()
    try:
        return status, headers, json.loads(text)
    except ValueError:
        return status, headers, text


def metric(name):
    _, _, text = raw("/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics:\n{text}")


def hello():
    return [{"role": "user", "content": "Say hello in one short sentence."}]


def assert_openai_error(status, body, want_status, what):
    assert status == want_status, f"{what}: status {status}, want {want_status}: {body}"
    assert isinstance(body, dict) and set(body) == {"error"}, f"{what}: {body}"
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, f"{what}: {err}"
    assert isinstance(err["message"], str) and err["message"], f"{what}: {err}"


def serving_still(what):
    r = client().chat.completions.create(model=MODEL, messages=hello(), max_tokens=4)
    assert r.choices[0].message.content is not None, f"after {what}: {r}"


def plain_and_streamed():
    c = client()
    models = c.models.list()
    assert len(models.data) == 1 and models.data[0].id, models
    r = c.chat.completions.create(
        model=MODEL, messages=hello(), max_tokens=12, temperature=0.7, seed=3,
        logprobs=True, top_logprobs=2,
    )
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content, r
    assert choice.finish_reason in ("stop", "length"), r
    assert r.usage.prompt_tokens > 5 and 1 <= r.usage.completion_tokens <= 12, r.usage
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    lp = choice.logprobs.content
    assert len(lp) == r.usage.completion_tokens, (len(lp), r)
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in lp), lp
    assert all(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob for t in lp), lp
    assert b"".join(bytes(t.bytes) for t in lp).decode() == choice.message.content, lp

    chunks = list(c.chat.completions.create(
        model=MODEL, messages=hello(), max_tokens=12, stream=True,
        stream_options={"include_usage": True},
    ))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert text and finish in (["stop"], ["length"]), chunks
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1, chunks[-1]

    # The same seed gives the same text; a stop sequence cuts the text before it.
    a = c.chat.completions.create(model=MODEL, messages=hello(), max_tokens=10, seed=7)
    b = c.chat.completions.create(model=MODEL, messages=hello(), max_tokens=10, seed=7)
    assert a.choices[0].message.content == b.choices[0].message.content, (a, b)
    full = c.chat.completions.create(model=MODEL, messages=hello(), max_tokens=10, temperature=0)
    text = full.choices[0].message.content
    cut = text[3:6]
    stopped = c.chat.completions.create(
        model=MODEL, messages=hello(), max_tokens=10, temperature=0, stop=[cut])
    assert stopped.choices[0].message.content == text[: text.index(cut)], (text, cut, stopped)
    assert stopped.choices[0].finish_reason == "stop"

    done = c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6,
                                temperature=0, logprobs=2)
    assert done.choices[0].text and done.usage.completion_tokens >= 1, done
    assert len(done.choices[0].logprobs.tokens) == len(done.choices[0].logprobs.top_logprobs)
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0,
        stream=True) if ch.choices)
    assert streamed == done.choices[0].text, (streamed, done)

    status, _, body = raw("/health", key=None, method="GET")
    assert status == 200 and body == {"status": "ok"}, body
    assert metric('conductor_requests_total{endpoint="/v1/chat/completions",status="200"}') >= 5
    assert metric("conductor_time_to_first_token_seconds_count") >= 5
    assert metric("conductor_queue_time_seconds_count") >= 5


def greedy(prompt, n):
    r = client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=int(n),
        temperature=0)
    print(json.dumps({"content": r.choices[0].message.content}))


def concurrent(n):
    n = int(n)
    results, errors = [None] * n, []

    def one(i):
        try:
            stream = i % 2 == 1
            r = client().chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"Count to {i + 3}."}],
                max_tokens=8, temperature=0, stream=stream)
            results[i] = ("".join(ch.choices[0].delta.content or "" for ch in r if ch.choices)
                          if stream else r.choices[0].message.content)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(r for r in results), results
    # Each answer is what the same request gets alone.
    for i in (0, 1):
        alone = client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Count to {i + 3}."}],
            max_tokens=8, temperature=0).choices[0].message.content
        assert alone == results[i], (i, alone, results[i])


def batched_greedy(n, *prompts):
    """Run with `--parallel N`: the prompts sent at once, greedily, half of them streamed.
    Prints their answers (the Rust side compares each with `conductor run --temp 0`) and checks
    that decode steps computed several sequences at once."""
    results, errors = [None] * len(prompts), []
    barrier = threading.Barrier(len(prompts))

    def one(i):
        try:
            stream = i % 2 == 1
            barrier.wait()
            r = client().chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": prompts[i]}],
                max_tokens=int(n), temperature=0, stream=stream)
            results[i] = ("".join(ch.choices[0].delta.content or "" for ch in r if ch.choices)
                          if stream else r.choices[0].message.content)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    steps = metric("conductor_decode_steps_total")
    sequences = metric("conductor_decode_sequences_total")
    assert sequences > steps, f"no step computed two sequences: {sequences} in {steps} steps"
    print(json.dumps({"contents": results, "steps": steps, "sequences": sequences}))


def long_stream(c, max_tokens):
    """A streamed request that runs until closed: the stream and its chunks, after the first."""
    stream = c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell a very long story."}],
        max_tokens=int(max_tokens), stream=True, extra_body={"ignore_eos": True})
    chunks = iter(stream)
    first = next(chunks)
    assert first.choices[0].delta.role == "assistant", first
    return stream, chunks


def slots_and_disconnect(max_tokens):
    """Run with `--parallel 2 --queue 1`: A and B generate together, C waits; closing A frees
    its slot for C while B goes on."""
    c = client()
    a, _ = long_stream(c, max_tokens)
    b, b_chunks = long_stream(c, max_tokens)
    deadline = time.time() + 60
    while metric("conductor_requests_running") < 2:
        assert time.time() < deadline, "A and B are not generating together"
        time.sleep(0.05)
    c_result = []
    waiter = threading.Thread(target=lambda: c_result.append(c.chat.completions.create(
        model=MODEL, messages=hello(), max_tokens=4, temperature=0)))
    waiter.start()
    while metric("conductor_requests_queued") < 1:
        assert time.time() < deadline, "C never reached the queue"
        time.sleep(0.05)
    for _ in range(3):
        next(b_chunks)  # both slots are busy: C waits while A and B flow
    assert waiter.is_alive(), "C ran while both slots were busy"
    a.close()  # A's client goes away: its slot must be freed for C
    waiter.join(timeout=120)
    assert not waiter.is_alive() and c_result, "C never ran after A's client left"
    assert c_result[0].choices[0].message.content, c_result
    for _ in range(3):
        chunk = next(b_chunks)  # B goes on after A left and C came and went
        assert chunk.choices, chunk
    b.close()
    deadline = time.time() + 10
    while metric("conductor_requests_cancelled_total") < 2:
        assert time.time() < deadline, "A's and B's cancellations are not counted"
        time.sleep(0.05)
    assert metric("conductor_requests_running") == 0
    assert metric("conductor_completion_tokens_total") < 2 * int(max_tokens)
    serving_still("two disconnects")


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


def schema():
    c = client()
    for temperature in (0, 1.0):
        r = c.chat.completions.create(
            model=MODEL, max_tokens=80, temperature=temperature, seed=11,
            messages=[{"role": "user", "content": "Describe a person who lives in a city."}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
        text = r.choices[0].message.content
        value = json.loads(text)
        jsonschema.validate(value, PERSON)
        assert r.choices[0].finish_reason == "stop", r
    r = c.chat.completions.create(
        model=MODEL, max_tokens=200, temperature=0,
        messages=[{"role": "user", "content": "Give me a JSON object about a cat, with its name and age."}],
        response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop", r
    assert isinstance(json.loads(r.choices[0].message.content), dict), r
    try:
        c.chat.completions.create(
            model=MODEL, max_tokens=8, messages=hello(),
            response_format={"type": "json_schema", "json_schema": {
                "name": "bad", "schema": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}})
        raise AssertionError("a schema that cannot compile was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "schema" in str(e), e
    serving_still("a bad schema")


WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["C", "F"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The time in a time zone", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}


def weather_question():
    return [{"role": "user", "content": "What is the weather in Paris?"}]


def assert_calls(calls, names=None):
    """Each call is well formed, names an offered function and its arguments validate."""
    assert calls, "no tool calls"
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_"), call
        assert call.function.name in SCHEMAS, call
        if names is not None:
            assert call.function.name in names, (call, names)
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    assert len({c.id for c in calls}) == len(calls), calls


def tools():
    """Run with --chat-template-file qwen2.5.jinja (Hermes <tool_call> syntax)."""
    c = client()
    # required: the answer is a call, whatever the model would have said.
    for temperature in (0, 1.0):
        r = c.chat.completions.create(
            model=MODEL, messages=weather_question(), tools=TOOLS, tool_choice="required",
            max_tokens=200, temperature=temperature, seed=5, parallel_tool_calls=False)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", r
        assert choice.message.content is None, r
        assert_calls(choice.message.tool_calls)
        assert len(choice.message.tool_calls) == 1, r
    # Parallel calls (the default): this small model goes on calling until max_tokens cuts
    # it; the whole calls are returned, each valid, with finish_reason "length".
    r = c.chat.completions.create(
        model=MODEL, messages=weather_question(), tools=TOOLS, tool_choice="required",
        max_tokens=60, temperature=0)
    choice = r.choices[0]
    assert_calls(choice.message.tool_calls)
    assert choice.finish_reason in ("tool_calls", "length"), r
    if choice.finish_reason == "tool_calls":
        assert choice.message.content is None, r
    # A named function is the one called.
    r = c.chat.completions.create(
        model=MODEL, messages=weather_question(), tools=TOOLS, max_tokens=200, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert r.choices[0].finish_reason == "tool_calls", r
    assert_calls(r.choices[0].message.tool_calls, names={"get_time"})
    # Streamed: tool_calls deltas (index, id, type, name, then arguments), then finish_reason.
    calls, finish, content = {}, [], ""
    for ch in c.chat.completions.create(
            model=MODEL, messages=weather_question(), tools=TOOLS, max_tokens=200,
            temperature=0, stream=True, parallel_tool_calls=False,
            tool_choice={"type": "function", "function": {"name": "get_weather"}}):
        if not ch.choices:
            continue
        delta = ch.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or []:
            entry = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            if d.id:
                assert entry["id"] is None, ch
                entry["id"] = d.id
                assert d.type == "function" and d.function.name, ch
                entry["name"] = d.function.name
            entry["arguments"] += d.function.arguments or ""
        if ch.choices[0].finish_reason:
            finish.append(ch.choices[0].finish_reason)
    assert finish == ["tool_calls"], (finish, calls)
    assert content == "", content
    assert list(calls) == [0] and calls[0]["name"] == "get_weather", calls
    assert calls[0]["id"].startswith("call_"), calls
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER)
    # The same stream unconstrained (auto): whatever the model says is well formed.
    r = c.chat.completions.create(
        model=MODEL, messages=weather_question(), tools=TOOLS, tool_choice="auto",
        max_tokens=40, temperature=0)
    m = r.choices[0].message
    if m.tool_calls:
        assert r.choices[0].finish_reason == "tool_calls", r
        assert_calls(m.tool_calls)
    else:
        assert m.content is not None and r.choices[0].finish_reason in ("stop", "length"), r
    # A second turn: the call and its result go back to the model.
    call = m.tool_calls[0] if m.tool_calls else None
    history = weather_question() + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"C\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
    ]
    r = c.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=16,
                                  temperature=0, tool_choice="none")
    assert r.choices[0].message.content is not None and not r.choices[0].message.tool_calls, r
    assert r.usage.prompt_tokens > 40, r.usage
    del call
    # Bad tool requests are OpenAI errors and the server goes on.
    bad = [
        ("tool_choice naming an unknown function",
         {"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ("tool_choice of an unknown mode", {"tool_choice": "always"}, "tool_choice"),
        ("a non-object parameters schema", {"tools": [{"type": "function", "function": {
            "name": "f", "parameters": [1, 2]}}]}, "tools"),
        ("a schema llguidance cannot compile", {"tool_choice": "required", "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}]}, "tools"),
        ("a tool that is no function", {"tools": [{"type": "retrieval", "function": {"name": "f"}}]},
         "tools"),
        ("a bad function name", {"tools": [{"type": "function", "function": {"name": "a b"}}]},
         "tools"),
        ("required without tools", {"tools": [], "tool_choice": "required"}, "tool_choice"),
        ("a tool message without tool_call_id", {"messages": weather_question() + [
            {"role": "tool", "content": "21"}]}, "messages"),
        ("tool_calls on a user message", {"messages": [
            {"role": "user", "content": "x", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
         "messages"),
        ("tools with a wrong shape", {"tools": "get_weather"}, None),
        ("tools and a JSON response_format", {"tool_choice": "required",
                                              "response_format": {"type": "json_object"}},
         "response_format"),
    ]
    for what, fields, param in bad:
        body = {"messages": weather_question(), "tools": TOOLS, "max_tokens": 8, **fields}
        status, _, reply = raw("/v1/chat/completions", body)
        assert_openai_error(status, reply, 400, what)
        if param is not None:
            assert reply["error"]["param"] == param, (what, reply)
        serving_still(what)


def tools_unsupported():
    """The default model's template does not render tools: offering some is a 400, but
    tool_choice "none" (nothing offered) is served."""
    status, _, reply = raw("/v1/chat/completions", {
        "messages": weather_question(), "tools": TOOLS, "max_tokens": 4})
    assert_openai_error(status, reply, 400, "tools on a template without them")
    assert reply["error"]["code"] == "tools_unsupported", reply
    assert "does not support tools" in reply["error"]["message"], reply
    r = client().chat.completions.create(
        model=MODEL, messages=weather_question(), tools=TOOLS, tool_choice="none", max_tokens=4)
    assert r.choices[0].message.content is not None and not r.choices[0].message.tool_calls, r


def queue_and_disconnect(max_tokens):
    """Run with `--queue 1`: A generates, B waits, C is refused; closing A lets B run."""
    c = client()
    a = c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell a very long story."}],
        max_tokens=int(max_tokens), stream=True, extra_body={"ignore_eos": True})
    first = next(iter(a))
    assert first.choices[0].delta.role == "assistant", first
    b_result = []
    b = threading.Thread(target=lambda: b_result.append(c.chat.completions.create(
        model=MODEL, messages=hello(), max_tokens=4, temperature=0)))
    b.start()
    deadline = time.time() + 60
    while metric("conductor_requests_queued") < 1:
        assert time.time() < deadline, "B never reached the queue"
        time.sleep(0.05)
    try:
        c.chat.completions.create(model=MODEL, messages=hello(), max_tokens=4)
        raise AssertionError("a request past a full queue was accepted")
    except openai.RateLimitError as e:
        assert e.status_code == 429, e
        assert e.response.headers.get("retry-after") == "1", e.response.headers
        assert e.body["code"] == "queue_full", e.body
    assert metric("conductor_requests_rejected_total") == 1
    assert b.is_alive(), "B finished while A held the engine"
    a.close()  # the client goes away: A's generation must stop and free the engine
    b.join(timeout=120)
    assert not b.is_alive() and b_result, "B never ran after A's client left"
    assert b_result[0].choices[0].message.content, b_result
    deadline = time.time() + 10
    while metric("conductor_requests_cancelled_total") < 1:
        assert time.time() < deadline, "A's cancellation is not counted"
        time.sleep(0.05)
    generated = metric("conductor_completion_tokens_total")
    assert generated < int(max_tokens), f"A ran to its end ({generated} tokens) instead of stopping"
    serving_still("a disconnect")


def bad_input(n_ctx):
    n_ctx = int(n_ctx)
    good = {"messages": hello(), "max_tokens": 4}
    cases = [
        ("malformed JSON", b'{"messages": [', 400),
        ("wrong-typed field", {"messages": hello(), "max_tokens": "four"}, 400),
        ("wrong-typed messages", {"messages": "hello"}, 400),
        ("max_tokens past the context", {"messages": hello(), "max_tokens": n_ctx + 1}, 400),
        ("max_tokens zero", {"messages": hello(), "max_tokens": 0}, 400),
        ("empty messages", {"messages": [], "max_tokens": 4}, 400),
        ("prompt longer than the context",
         {"messages": [{"role": "user", "content": "word " * (2 * n_ctx)}]}, 400),
        ("n > 1", {"messages": hello(), "n": 2}, 400),
        ("negative temperature", {"messages": hello(), "temperature": -1}, 400),
        ("image content", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, 400),
        ("unknown response_format", {"messages": hello(), "response_format": {"type": "xml"}}, 400),
        # The server runs with --max-body 65536.
        ("body too large", {"messages": [{"role": "user", "content": "x" * 200_000}]}, 413),
    ]
    for what, body, want in cases:
        status, _, reply = raw("/v1/chat/completions", body)
        assert_openai_error(status, reply, want, what)
        status, _, reply = raw("/v1/chat/completions", good)
        assert status == 200 and reply["choices"][0]["message"]["content"] is not None, (what, reply)
    status, _, reply = raw("/v1/completions", {"prompt": "word " * (2 * n_ctx)})
    assert_openai_error(status, reply, 400, "completion prompt longer than the context")
    assert reply["error"]["code"] == "context_length_exceeded", reply
    status, _, reply = raw("/v1/chat/completions", good, key="sk-wrong")
    assert_openai_error(status, reply, 401, "a wrong API key")
    status, _, reply = raw("/v1/models", key=None, method="GET")
    assert_openai_error(status, reply, 401, "no API key")
    status, _, reply = raw("/v1/nowhere", good)
    assert_openai_error(status, reply, 404, "an unknown endpoint")
    try:
        client().chat.completions.create(model=MODEL, messages=[], max_tokens=4)
        raise AssertionError("empty messages accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "messages", e.body
    serving_still("bad input")


def load(clients, per_client):
    """A bounded load: each client sends its requests one after another, streamed. Every one
    must succeed; throughput and TTFT are printed for the log, not judged (shared machines)."""
    clients, per_client = int(clients), int(per_client)
    ttfts, errors, tokens = [], [], [0]
    lock = threading.Lock()

    def one_client(i):
        c = client()
        for j in range(per_client):
            sent = time.perf_counter()
            try:
                first, n = None, 0
                for ch in c.chat.completions.create(
                        model=MODEL, max_tokens=6, temperature=0.5, seed=100 * i + j, stream=True,
                        stream_options={"include_usage": True},
                        messages=[{"role": "user", "content": f"Name a color ({i}.{j})."}]):
                    if first is None and ch.choices and ch.choices[0].delta.content:
                        first = time.perf_counter() - sent
                    if ch.usage:
                        n = ch.usage.completion_tokens
                assert n >= 1, "no usage chunk"
                with lock:
                    ttfts.append(first if first is not None else time.perf_counter() - sent)
                    tokens[0] += n
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(repr(e))

    started = time.perf_counter()
    threads = [threading.Thread(target=one_client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    assert not errors, errors
    assert len(ttfts) == clients * per_client, len(ttfts)
    ttfts.sort()
    print(json.dumps({
        "requests": len(ttfts), "errors": len(errors), "seconds": round(elapsed, 2),
        "tokens_per_second": round(tokens[0] / elapsed, 1),
        "ttft_p50_ms": round(1e3 * ttfts[len(ttfts) // 2], 1),
        "ttft_p99_ms": round(1e3 * ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))], 1),
    }))
    assert metric("conductor_requests_rejected_total") == 0


if __name__ == "__main__":
    globals()[sys.argv[2]](*sys.argv[3:])

"""Writes tool-renderings.json: a tool-calling conversation rendered by each template the way
Hugging Face's `apply_chat_template` renders it (Jinja2, trim_blocks, lstrip_blocks, loop
controls, Python's json.dumps as `tojson`), for runtime/src/tokenizer/chat.rs's tests.

    python3 tool_renderings.py   # needs jinja2
"""

import json
import os

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
}]

# As llama.cpp gives them to templates: a call's arguments parsed into an object, the null
# content of a message with calls as "" (Qwen 3's template cannot take null).
MESSAGES = [
    {"role": "system", "content": "You help with the weather."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call12345", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}},
    }]},
    {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temp\": 21}"},
]


def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def render(name):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    with open(os.path.join(HERE, name + ".jinja")) as f:
        template = env.from_string(f.read())
    return template.render(messages=MESSAGES, tools=TOOLS, add_generation_prompt=True,
                           bos_token="", eos_token="</s>")


out = {"tools": TOOLS, "messages": MESSAGES,
       "rendered": {name: render(name) for name in ["qwen2.5", "qwen3", "llama3.1", "mistral-nemo"]}}
with open(os.path.join(HERE, "tool-renderings.json"), "w") as f:
    json.dump(out, f, indent=1, ensure_ascii=False)
    f.write("\n")

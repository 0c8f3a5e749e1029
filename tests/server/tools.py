"""Tool calling end to end (tests/server/suite.py runs these) through the pinned openai
client: tools with every tool_choice ("none", "auto", "required", a named function),
parallel_tool_calls, streamed calls reassembled by the client, a multi-turn exchange with
the tool's result, and the 400s of malformed tools.

Two kinds of server use these:
  - the real model (SmolLM2, whose template renders no tools: celer describes them in a
    system message and holds the answer to the generic JSON shapes);
  - the tiny random LLaVA-NeXT of tests/server/fixtures/llava-chat with each family's chat
    template (--chat-template-file tests/templates/*.jinja): with "required" the grammar
    forces a call in that family's own format (Hermes <tool_call>, Llama 3 JSON, Mistral
    [TOOL_CALLS], Command R7B <|START_ACTION|>, Phi-4-mini functools), and the parser must
    read it back into tool_calls, streamed or not; the call then goes back through the
    template as the next turn's history.
"""
import json
import os

import jsonschema
import openai

from common import T, check, error_of, post_json, short

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "maxLength": 24},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}},
                   "required": ["zone"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


def client(srv, timeout=120):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=T(timeout), max_retries=0)


def check_calls(calls, what, names=None, n=None):
    check(calls, f"{what}: no tool_calls")
    if n is not None:
        check(len(calls) == n, f"{what}: {len(calls)} calls, want {n}")
    for c in calls:
        check(c.type == "function" and c.id and c.function.name in PARAMS, f"{what}: call {short(c)}")
        if names:
            check(c.function.name in names, f"{what}: called {c.function.name}, want one of {names}")
        args = json.loads(c.function.arguments)
        errors = list(jsonschema.Draft202012Validator(PARAMS[c.function.name]).iter_errors(args))
        check(not errors, f"{what}: arguments {c.function.arguments} invalid: {errors[0].message if errors else ''}")


def ask(srv, messages=ASK, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 160)
    return client(srv).chat.completions.create(model="x", messages=messages, tools=TOOLS, **kw)


def streamed(srv, messages=ASK, **kw):
    """A streamed answer reassembled as the client's users do: content and tool calls by index."""
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 160)
    stream = client(srv).chat.completions.create(model="x", messages=messages, tools=TOOLS, stream=True, **kw)
    content, calls, finish = "", {}, None
    for chunk in stream:
        for ch in chunk.choices:
            d = ch.delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    c["id"] = tc.id
                if tc.function and tc.function.name:
                    c["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    c["arguments"] += tc.function.arguments
            finish = ch.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def roundtrip(srv, call, what):
    """The call and the tool's result go back as history; the next answer comes (200)."""
    history = ASK + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "name": call.function.name,
         "content": json.dumps({"temperature": 21, "sky": "clear"})}]
    r = ask(srv, history, tool_choice="auto", max_tokens=24)
    ch = r.choices[0]
    check(ch.finish_reason in ("stop", "length", "tool_calls"), f"{what}: after the result: {ch.finish_reason}")
    return r


# ---------------------------------------------------------------------------------------
# the real model (generic format)

def test_required(srv):
    r = ask(srv, tool_choice="required", temperature=0.7, seed=3)
    ch = r.choices[0]
    check(ch.finish_reason == "tool_calls", f"required: finish {ch.finish_reason}: {short(ch.message)}")
    check_calls(ch.message.tool_calls, "required")
    check(ch.message.content is None, f"required: content {ch.message.content!r}")
    check(ch.message.tool_calls[0].id.startswith("call_"), f"id {ch.message.tool_calls[0].id}")


def test_named(srv):
    r = ask(srv, tool_choice={"type": "function", "function": {"name": "get_time"}})
    check_calls(r.choices[0].message.tool_calls, "named", names={"get_time"})
    check(r.choices[0].finish_reason == "tool_calls", f"named: finish {r.choices[0].finish_reason}")


def test_parallel(srv):
    for seed in range(3):
        r = ask(srv, tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=seed)
        check_calls(r.choices[0].message.tool_calls, f"parallel false seed {seed}", n=1)
    r = ask(srv, [{"role": "user", "content": "Weather in Paris and the time in Tokyo?"}], tool_choice="required",
            parallel_tool_calls=True, temperature=0.8, seed=5)
    check_calls(r.choices[0].message.tool_calls, "parallel true")


def test_auto(srv):
    kinds = set()
    for seed in range(6):
        r = ask(srv, tool_choice="auto", temperature=1.0, seed=seed)
        ch = r.choices[0]
        if ch.message.tool_calls:
            check(ch.finish_reason == "tool_calls", f"auto: finish {ch.finish_reason}")
            check_calls(ch.message.tool_calls, f"auto seed {seed}")
            kinds.add("call")
        else:
            check(isinstance(ch.message.content, str) and ch.finish_reason in ("stop", "length"),
                  f"auto seed {seed}: {short(ch.message)}")
            kinds.add("text")
    print(f"  auto: {sorted(kinds)}")


def test_none(srv):
    r = ask(srv, tool_choice="none", max_tokens=12)
    ch = r.choices[0]
    check(not ch.message.tool_calls and ch.finish_reason in ("stop", "length"), f"none: {short(ch.message)}")


def test_stream_equals_whole(srv):
    # one call: greedy, SmolLM2 would repeat parallel calls until the length limit
    whole = ask(srv, tool_choice="required", parallel_tool_calls=False)
    content, calls, finish = streamed(srv, tool_choice="required", parallel_tool_calls=False)
    w = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
    s = [(c["name"], c["arguments"]) for c in calls]
    check(finish == "tool_calls" and s == w and all(c["id"] for c in calls),
          f"streamed {s} ({finish}) vs whole {w}")


def test_multi_turn(srv):
    r = ask(srv, tool_choice="required", parallel_tool_calls=False)
    roundtrip(srv, r.choices[0].message.tool_calls[0], "multi-turn")


def test_bad_tools(srv):
    cases = [
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}}}}],
          "tool_choice": "required"}, "tools[0].function.parameters"),
        ({"functions": [{"name": "f"}]}, "functions"),
    ]
    for extra, param in cases:
        body = {"messages": ASK, "max_tokens": 4}
        body.update(extra)
        r = post_json(srv, "/v1/chat/completions", body)
        check(r.status_code == 400, f"{short(extra)}: status {r.status_code}")
        err = error_of(r.json())
        check(err["param"] == param, f"{short(extra)}: param {err['param']!r}, want {param!r}: {err['message']}")


def real_tests():
    return [
        ("tools_required", test_required),
        ("tools_named_function", test_named),
        ("tools_parallel", test_parallel),
        ("tools_auto", test_auto),
        ("tools_none", test_none),
        ("tools_stream_equals_whole", test_stream_equals_whole),
        ("tools_multi_turn_with_result", test_multi_turn),
        ("tools_bad_input_400", test_bad_tools),
    ]


# ---------------------------------------------------------------------------------------
# each family's template on the tiny random model

# (template file under tests/templates, the format it must be read as, whether the template
# renders a tool result after a call). Command R7B's "default" template raises on a "tool"
# message in transformers too (tests/templates/golden_cohere2.json, "tool call round trip"),
# so celer answers 400 there; its tool_use template is another file.
FAMILY_TEMPLATES = [
    ("qwen2_5", "hermes", True),
    ("qwen3_1_7b", "hermes", True),
    ("llama3_2", "llama3", True),
    ("mistral_v3", "mistral", True),
    ("cohere2", "command_r7b", False),
    ("phi4_mini", "phi4_mini", True),
    ("gemma3", "generic", True),
]


def family_test(fmt, renders_results):
    def t(srv):
        check(f"tool calls in the {fmt} format" in srv.log_tail(200), f"the server did not read the template as {fmt}")
        for seed in range(3):
            r = ask(srv, tool_choice="required", temperature=1.0, seed=seed, parallel_tool_calls=False)
            ch = r.choices[0]
            check(ch.finish_reason == "tool_calls", f"{fmt} seed {seed}: finish {ch.finish_reason}: {short(ch.message)}")
            check_calls(ch.message.tool_calls, f"{fmt} seed {seed}", n=1)
        r = ask(srv, tool_choice={"type": "function", "function": {"name": "get_time"}}, temperature=0.5, seed=9,
                parallel_tool_calls=False)
        check_calls(r.choices[0].message.tool_calls, f"{fmt} named", names={"get_time"}, n=1)
        content, calls, finish = streamed(srv, tool_choice="required", temperature=1.0, seed=1,
                                          parallel_tool_calls=False)
        whole = ask(srv, tool_choice="required", temperature=1.0, seed=1, parallel_tool_calls=False)
        w = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
        check(finish == "tool_calls" and [(c["name"], c["arguments"]) for c in calls] == w,
              f"{fmt}: streamed {calls} ({finish}) vs whole {w}")
        if renders_results:
            roundtrip(srv, whole.choices[0].message.tool_calls[0], f"{fmt} multi-turn")
            return
        try:
            roundtrip(srv, whole.choices[0].message.tool_calls[0], f"{fmt} multi-turn")
            raise AssertionError(f"{fmt}: a tool result was rendered by a template that refuses it")
        except openai.BadRequestError as e:
            check("roles must alternate" in error_of(e.response.json())["message"], f"{fmt}: {e}")
    return t


def family_servers(templates_dir):
    """(server name, extra args, tests) for each family's template."""
    out = []
    for name, fmt, renders_results in FAMILY_TEMPLATES:
        path = os.path.join(templates_dir, name + ".jinja")
        out.append((f"tools_{name}", ["--chat-template-file", path],
                    [(f"tools_family[{name}:{fmt}]", family_test(fmt, renders_results))]))
    return out

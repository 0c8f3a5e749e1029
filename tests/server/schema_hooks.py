"""Schemathesis hooks for tests/server/schema.sh (loaded through SCHEMATHESIS_HOOKS).

1. Short generations. The generated requests are arbitrary members of OpenAI's request
   schemas; on a CPU the generation they ask for must stay short for the run to end in a
   few minutes. In every body, a numeric `max_tokens` / `max_completion_tokens` above CAP
   (or none at all, or null) becomes CAP and a numeric `n` above N_CAP becomes N_CAP.
   Values of the wrong type or below the range are left alone, so negative cases stay
   negative.

2. Enough accepted requests. Most members of OpenAI's schemas carry something celer answers
   with 400 (functions, audio, non-text content parts, batch or null prompts, suffix,
   top_logprobs without logprobs, max_tokens 0, top_p 0, best_of 0) or that a generated
   value rarely gets right (tools whose names and schemas must be valid, JSON response
   formats with a schema the compiler enforces; tests/server/tools.py and structured.py
   drive those). Left alone, almost no request reaches a 200 and the response schema check
   has nothing to look at. So every other body is steered: those fields are dropped or
   narrowed to plain chat. The other half is sent as generated (apart from 1.), for the
   no-5xx check on everything.
"""
import itertools

import schemathesis

CAP = 4
N_CAP = 2
_counter = itertools.count()

UNSUPPORTED_CHAT = ("tools", "functions", "tool_choice", "function_call", "parallel_tool_calls", "audio",
                    "modalities", "prediction", "web_search_options")


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def cap(body):
    if not isinstance(body, dict):
        return body
    limits = [k for k in ("max_tokens", "max_completion_tokens") if body.get(k) is not None]
    if not limits:
        body["max_tokens"] = CAP  # absent or null: no limit but the context
    for k in limits:
        if _number(body[k]) and body[k] > CAP:
            body[k] = CAP
    if _number(body.get("n")) and body["n"] > N_CAP:
        body["n"] = N_CAP
    return body


def steer(path, body):
    if not isinstance(body, dict):
        return
    if path.endswith("/chat/completions"):
        for k in UNSUPPORTED_CHAT:
            body.pop(k, None)
        rf = body.get("response_format")
        if isinstance(rf, dict) and rf.get("type") != "text":
            body.pop("response_format")
        if "top_logprobs" in body and body.get("logprobs") is not True:
            body["logprobs"] = True
        msgs = body.get("messages")
        if isinstance(msgs, list):
            for m in msgs:
                if isinstance(m, dict) and isinstance(m.get("content"), list):
                    parts = [p for p in m["content"] if isinstance(p, dict) and p.get("type") == "text"]
                    m["content"] = parts or "Hello"
    elif path.endswith("/completions"):
        p = body.get("prompt")
        if p is None:
            body["prompt"] = "Hello"
        elif isinstance(p, list) and p and isinstance(p[0], (str, list)):
            body["prompt"] = p[0]
        body.pop("suffix", None)
    for k in ("max_tokens", "max_completion_tokens"):
        if _number(body.get(k)) and body[k] < 1:
            body[k] = CAP
    for k in ("top_p", "best_of"):  # celer wants top_p > 0 and best_of >= 1
        if _number(body.get(k)) and body[k] <= 0:
            body.pop(k)


@schemathesis.hook
def map_body(context, body):
    return cap(body)


@schemathesis.hook
def before_call(context, case, kwargs):
    if next(_counter) % 2 == 0:
        steer(case.path, case.body)
    cap(case.body)

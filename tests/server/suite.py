#!/usr/bin/env python3
"""End-to-end tests of `celer serve`: the official openai client and raw HTTP against real
servers started here on free ports. Usage: suite.py BUILD_DIR (CELER_BIN overrides the
binary). Prints one line per test and, last, `test_server: N passed, M failed[, K skipped]`.

Servers, one at a time:
  main      -np 4 --metrics --alias, CORS, --max-body-bytes, --max-queue 64: client API,
            bad input, metrics, prefix cache, 16 concurrent greedy requests
  structured  -np 8: response_format json_object / json_schema, llama-server's json_schema and
            grammar fields (tests/server/structured.py): every completion validated with the
            jsonschema package, refused keywords, 16 streams half constrained
  structured_tiny  the tiny random LLaVA-NeXT below: 2,400 schema completions at random
            temperatures, every one that stops valid
  tools     -np 4: tools with every tool_choice, parallel calls, streamed calls, a multi-turn
            exchange, malformed tools (tests/server/tools.py); tools_<family>: the tiny random
            LLaVA-NeXT with each family's chat template (--chat-template-file), calls forced in
            the family's format and read back
  noprefix  --no-prefix-cache --metrics: same greedy text as with the cache, dropped
            clients cancel their requests, SIGTERM during a stream
  auth      --api-key (two keys); authfile: --api-key-file
  queue     -np 1 --max-queue 1: 503 when full
  vlm       the tiny LLaVA-NeXT of tests/server/fixtures/llava-chat: image_url parts against
            the transformers goldens, streaming, the prefix cache keyed by the image, bad
            image inputs, a body of a few hundred KB under the default body limit
  gemma3    the tiny Gemma 3 of tests/fixtures/gemma3-vision-mlx-bf16 (pan and scan): image_url
            parts expanded as Gemma3Processor does and answered as transformers does, the
            prefix cache over image blocks, an image marker without its image
  fault     CELER_FAULT_STEP=1: the request whose step fails gets 500 and an OpenAI error
            object, /health stays 200, the next request is served, /metrics counts it
  faultsse  CELER_FAULT_STEP=2: a stream whose second step fails ends with an error event
            (no [DONE]), the next request is served
  lost      CELER_FAULT_STEP=1:sticky: every request gets 500 with the same message,
            /health says 503 "error", the server still answers and exits 0 on SIGTERM
"""
import base64
import concurrent.futures
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import zlib

import httpx
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import structured  # noqa: E402
import tools  # noqa: E402
from common import (ROOT, Failure, Results, Server, ServerError, T, celer_bin, check,  # noqa: E402
                    default_model, eq, error_of, get, metrics, parse_json_body, post_json, raw_request,
                    set_scale, short, timeout_scale, wait_until)

ALIAS = "celer-test-alias"
ORIGIN = "http://client.example.test"
MAX_BODY = 262144
TOTAL_CTX = 4096
METRIC_NAMES = [
    "celer_requests_running", "celer_requests_waiting", "celer_kv_cache_usage_ratio",
    "celer_prompt_tokens_total", "celer_generation_tokens_total", "celer_prefix_cache_queries_total",
    "celer_prefix_cache_hits_total",
]
HISTOGRAMS = ["celer_time_to_first_token_seconds", "celer_inter_token_latency_seconds",
              "celer_e2e_request_latency_seconds"]
# SmolLM2's <|endoftext|>, <|im_start|>, <|im_end|>: banned where a test needs a long generation.
NO_EOS = {"0": -100, "1": -100, "2": -100}

SYSTEM_PROMPT = (
    "You are a meticulous assistant for a small public library in a coastal town. The library "
    "opens at nine in the morning and closes at six in the evening on weekdays, and it closes "
    "at two in the afternoon on Saturdays. It is closed on Sundays and public holidays. Members "
    "may borrow up to eight books at a time for three weeks, renew them twice online, and "
    "reserve new releases at the front desk. The reading room on the second floor is quiet, "
    "the children's corner has story time every Wednesday, and the local history archive can "
    "be visited by appointment. Answer every question briefly, politely and accurately."
)


def oa(srv, api_key="none", timeout=60):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=api_key, timeout=T(timeout), max_retries=0)


def served_id(srv, headers=None):
    """The first model id GET /v1/models lists (what a client would send as `model`)."""
    r = get(srv, "/v1/models", headers=headers)
    check(r.status_code == 200, f"GET /v1/models status {r.status_code}")
    data = r.json().get("data") or [{}]
    return data[0].get("id") or "default"


def tokenize(srv, text, add_special):
    r = post_json(srv, "/tokenize", {"content": text, "add_special": add_special})
    check(r.status_code == 200, f"/tokenize status {r.status_code}: {short(r.text)}")
    toks = r.json().get("tokens")
    check(isinstance(toks, list) and all(isinstance(t, int) for t in toks), f"/tokenize tokens: {short(toks)}")
    return toks


class Ctx:
    """What the tests of one run share: the model id and results one server computes for
    a later server to compare against."""

    def __init__(self, binary, model):
        self.binary, self.model = binary, model
        self.model_id = ALIAS
        self.prefix_text = None  # greedy text of the second prefix-cache request (main server)


# =======================================================================================
# main server: the client API


def chat(c, content, model=ALIAS, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 12)
    msgs = content if isinstance(content, list) else [{"role": "user", "content": content}]
    return c.chat.completions.create(model=model, messages=msgs, **kw)


def test_health(srv):
    r = get(srv, "/health")
    eq(r.status_code, 200, "GET /health status")


def test_models_list(srv):
    models = oa(srv).models.list()
    ids = [m.id for m in models.data]
    check(ALIAS in ids, f"/v1/models ids {ids} lack the --alias {ALIAS!r}")
    r = get(srv, "/v1/models")
    eq(r.status_code, 200, "GET /v1/models status")
    body = r.json()
    eq(body.get("object"), "list", "/v1/models object")
    for m in body.get("data", []):
        eq(m.get("object"), "model", "/v1/models data[].object")
        check(isinstance(m.get("created"), int), f"model.created not an int: {short(m)}")
        check(isinstance(m.get("owned_by"), str), f"model.owned_by not a string: {short(m)}")


def test_path_aliases(srv):
    r = get(srv, "/models")
    eq(r.status_code, 200, "GET /models status")
    check(any(m.get("id") == ALIAS for m in r.json().get("data", [])), f"/models lacks {ALIAS}: {short(r.text)}")
    r = post_json(srv, "/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    eq(r.status_code, 200, "POST /chat/completions status")
    eq(r.json().get("object"), "chat.completion", "/chat/completions object")
    r = post_json(srv, "/completions", {"prompt": "Hi", "max_tokens": 2})
    eq(r.status_code, 200, "POST /completions status")
    eq(r.json().get("object"), "text_completion", "/completions object")


def test_chat_nonstream(srv):
    r = chat(oa(srv), "Name a fruit that is yellow.", max_tokens=10)
    check(isinstance(r.id, str) and r.id, f"id {r.id!r}")
    eq(r.object, "chat.completion", "object")
    check(isinstance(r.created, int) and r.created > 1_600_000_000, f"created {r.created!r}")
    eq(r.model, ALIAS, "model")
    eq(len(r.choices), 1, "number of choices")
    ch = r.choices[0]
    eq(ch.index, 0, "choices[0].index")
    eq(ch.message.role, "assistant", "message.role")
    check(isinstance(ch.message.content, str) and ch.message.content.strip(), f"content {ch.message.content!r}")
    check(ch.finish_reason in ("stop", "length"), f"finish_reason {ch.finish_reason!r}")
    u = r.usage
    check(u.prompt_tokens > len("Name a fruit that is yellow.".split()), f"prompt_tokens {u.prompt_tokens}")
    check(1 <= u.completion_tokens <= 10, f"completion_tokens {u.completion_tokens} outside 1..10")
    eq(u.total_tokens, u.prompt_tokens + u.completion_tokens, "total_tokens")
    if ch.finish_reason == "length":
        eq(u.completion_tokens, 10, "completion_tokens at finish_reason length")


def test_chat_stream(srv):
    c = oa(srv)
    ref = chat(c, "Tell me about the moon.", max_tokens=12)
    chunks = list(chat(c, "Tell me about the moon.", max_tokens=12, stream=True))
    check(len(chunks) >= 2, f"only {len(chunks)} chunks")
    ids = {ch.id for ch in chunks}
    eq(len(ids), 1, "distinct ids across chunks")
    for ch in chunks:
        eq(ch.object, "chat.completion.chunk", "chunk object")
    first = [ch for ch in chunks if ch.choices][0]
    eq(first.choices[0].delta.role, "assistant", "first delta role")
    finals = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    eq(len(finals), 1, "chunks with a finish_reason")
    check(finals[0] is [ch for ch in chunks if ch.choices][-1], "the finish_reason chunk is not the last one")
    eq(finals[0].choices[0].finish_reason, ref.choices[0].finish_reason, "stream finish_reason vs non-stream")
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    eq(text, ref.choices[0].message.content, "streamed text vs non-stream greedy text")
    check(all(ch.usage is None for ch in chunks), "usage chunk sent without stream_options.include_usage")


def test_chat_stream_raw_sse(srv):
    body = {"messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 6, "stream": True}
    with httpx.Client(base_url=srv.url, timeout=T(60)) as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            eq(r.status_code, 200, "status")
            ctype = r.headers.get("content-type", "")
            check(ctype.startswith("text/event-stream"), f"content-type {ctype!r}")
            lines = list(r.iter_lines())
    events = [ln[5:].strip() for ln in lines if ln.startswith("data:")]
    check(events, f"no data: events in {short(lines)}")
    eq(events[-1], "[DONE]", "last event")
    eq(events.count("[DONE]"), 1, "number of [DONE] events")
    objs = [json.loads(e) for e in events[:-1]]
    check(all("error" not in o for o in objs), f"error event: {short(objs)}")
    eq(len({o["id"] for o in objs}), 1, "distinct ids")
    eq(objs[0]["choices"][0]["delta"].get("role"), "assistant", "first delta role")
    check(objs[-1]["choices"][0].get("finish_reason") in ("stop", "length"),
          f"last chunk finish_reason {short(objs[-1])}")
    bad = [ln for ln in lines if ln.strip() and not ln.startswith("data:") and not ln.startswith(":")]
    check(not bad, f"lines that are not SSE fields: {short(bad)}")


def test_chat_content_parts(srv):
    c = oa(srv)
    plain = chat(c, "What color is the sky?", max_tokens=10)
    parts = c.chat.completions.create(
        model=ALIAS, temperature=0, max_tokens=10,
        messages=[{"role": "user", "content": [{"type": "text", "text": "What color "},
                                               {"type": "text", "text": "is the sky?"}]}])
    eq(parts.choices[0].message.content, plain.choices[0].message.content, "text parts vs string content")
    eq(parts.usage.prompt_tokens, plain.usage.prompt_tokens, "prompt_tokens of text parts vs string")


def test_chat_template_kwargs(srv):
    """chat_template_kwargs (vLLM's and llama-server's field) reaches the template: SmolLM2's
    ignores enable_thinking, so the prompt is the same; names the server sets are refused."""
    c = oa(srv)
    plain = chat(c, "What color is the sky?", max_tokens=4)
    kw = c.chat.completions.create(model=ALIAS, temperature=0, max_tokens=4,
                                   messages=[{"role": "user", "content": "What color is the sky?"}],
                                   extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    eq(kw.usage.prompt_tokens, plain.usage.prompt_tokens, "prompt_tokens with an unused kwarg")
    for kwargs, param in (({"tools": []}, "chat_template_kwargs.tools"), ("x", "chat_template_kwargs")):
        r = post_json(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                   "max_tokens": 1, "chat_template_kwargs": kwargs})
        eq(r.status_code, 400, f"status for chat_template_kwargs {kwargs!r}")
        eq(error_of(r.json())["param"], param, "error.param")
    server_still_serves(srv)


def test_image_part_text_only_model(srv):
    """A text-only model answers an image part with a 400 that names it text-only."""
    url = "data:image/png;base64," + base64.b64encode(vlm_image_bytes("a")).decode()
    try:
        oa(srv).chat.completions.create(model=ALIAS, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]}])
    except openai.BadRequestError as e:
        eq(e.status_code, 400, "status")
        err = error_of(e.response.json())
        eq(err["param"], "messages[0].content[1].type", "error.param")
        check("text-only" in err["message"] and ALIAS in err["message"],
              f"message does not name {ALIAS} as text-only: {err['message']!r}")
        server_still_serves(srv)
        return
    raise Failure("an image part to a text-only model did not raise openai.BadRequestError")


def test_completions_string(srv):
    prompt = "The capital of France is"
    r = oa(srv).completions.create(model=ALIAS, prompt=prompt, max_tokens=8, temperature=0)
    eq(r.object, "text_completion", "object")
    check(isinstance(r.id, str) and r.id, f"id {r.id!r}")
    eq(len(r.choices), 1, "number of choices")
    eq(r.choices[0].index, 0, "choices[0].index")
    check(isinstance(r.choices[0].text, str) and r.choices[0].text, f"text {r.choices[0].text!r}")
    check(r.choices[0].finish_reason in ("stop", "length"), f"finish_reason {r.choices[0].finish_reason!r}")
    n_tok = len(tokenize(srv, prompt, True))
    eq(r.usage.prompt_tokens, n_tok, "usage.prompt_tokens vs /tokenize (add_special) count")
    eq(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens, "total_tokens")
    check(1 <= r.usage.completion_tokens <= 8, f"completion_tokens {r.usage.completion_tokens}")


def test_completions_token_ids(srv):
    prompt = "The tallest mountain in the world is"
    c = oa(srv)
    ids = tokenize(srv, prompt, True)
    by_text = c.completions.create(model=ALIAS, prompt=prompt, max_tokens=8, temperature=0)
    by_ids = c.completions.create(model=ALIAS, prompt=ids, max_tokens=8, temperature=0)
    eq(by_ids.usage.prompt_tokens, len(ids), "prompt_tokens of a token-id prompt")
    eq(by_ids.choices[0].text, by_text.choices[0].text, "greedy text of token-id prompt vs string prompt")


def test_usage_counts_tokens(srv):
    """completion_tokens is the number of generated tokens: logprobs has one entry per token."""
    c = oa(srv)
    r = c.completions.create(model=ALIAS, prompt="Once upon a time", max_tokens=9, temperature=0, logprobs=1)
    eq(len(r.choices[0].logprobs.tokens), r.usage.completion_tokens, "logprobs tokens vs completion_tokens")
    r = chat(c, "Describe a forest.", max_tokens=9, logprobs=True)
    eq(len(r.choices[0].logprobs.content), r.usage.completion_tokens, "chat logprobs entries vs completion_tokens")
    eq(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens, "chat total_tokens")


def test_logprobs_chat(srv):
    r = chat(oa(srv), "Write a long poem about the sea.", max_tokens=6, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs
    check(lp is not None and lp.content is not None, "choices[0].logprobs.content missing")
    eq(len(lp.content), r.usage.completion_tokens, "logprobs.content length vs completion_tokens")
    for i, e in enumerate(lp.content):
        check(isinstance(e.token, str), f"content[{i}].token {e.token!r}")
        check(isinstance(e.logprob, float) and e.logprob <= 1e-6, f"content[{i}].logprob {e.logprob!r}")
        eq(len(e.top_logprobs), 3, f"content[{i}].top_logprobs length")
        tops = [t.logprob for t in e.top_logprobs]
        check(all(a >= b - 1e-6 for a, b in zip(tops, tops[1:])), f"content[{i}] top_logprobs not sorted: {tops}")
        eq(e.top_logprobs[0].token, e.token, f"content[{i}]: greedy token vs best top_logprob")
        check(abs(e.top_logprobs[0].logprob - e.logprob) < 1e-3,
              f"content[{i}]: logprob {e.logprob} vs top {e.top_logprobs[0].logprob}")
    if r.choices[0].finish_reason == "length":
        eq("".join(e.token for e in lp.content), r.choices[0].message.content, "joined tokens vs content")


def test_logprobs_completions(srv):
    r = oa(srv).completions.create(model=ALIAS, prompt="The weather today is", max_tokens=6, temperature=0,
                                   logprobs=2, logit_bias=NO_EOS)
    lp = r.choices[0].logprobs
    check(lp is not None, "choices[0].logprobs missing")
    n = r.usage.completion_tokens
    eq(len(lp.tokens), n, "logprobs.tokens length")
    eq(len(lp.token_logprobs), n, "logprobs.token_logprobs length")
    eq(len(lp.top_logprobs), n, "logprobs.top_logprobs length")
    eq(len(lp.text_offset), n, "logprobs.text_offset length")
    for i in range(n):
        check(lp.token_logprobs[i] <= 1e-6, f"token_logprobs[{i}] = {lp.token_logprobs[i]}")
        top = lp.top_logprobs[i]
        check(isinstance(top, dict) and len(top) == 2, f"top_logprobs[{i}] = {short(top)}")
        check(lp.tokens[i] in top, f"greedy token {lp.tokens[i]!r} not in top_logprobs[{i}] {short(top)}")
        check(abs(max(top.values()) - lp.token_logprobs[i]) < 1e-3, f"greedy token is not the top at {i}")
        if i:
            eq(lp.text_offset[i] - lp.text_offset[i - 1], len(lp.tokens[i - 1]), f"text_offset[{i}] step")
    eq("".join(lp.tokens), r.choices[0].text, "joined tokens vs text")


def pick_stop(text):
    """A substring from the middle of text whose first occurrence starts after position 0."""
    n = len(text)
    for start in list(range(n // 2, n - 3)) + list(range(n // 2 - 1, 0, -1)):
        cand = text[start:start + 4]
        if cand.strip() and len(cand) == 4 and text.find(cand) > 0:
            return cand
    raise Failure(f"greedy output too short to pick a stop string from: {text!r}")


def test_stop_completions(srv):
    c = oa(srv)
    prompt = "The history of the Roman Empire began"
    base = c.completions.create(model=ALIAS, prompt=prompt, max_tokens=24, temperature=0, logit_bias=NO_EOS)
    text = base.choices[0].text
    stop = pick_stop(text)
    want = text[:text.find(stop)]
    r = c.completions.create(model=ALIAS, prompt=prompt, max_tokens=24, temperature=0, logit_bias=NO_EOS,
                             stop=["@@never@@", stop])
    out = r.choices[0].text
    check(stop not in out, f"stop {stop!r} appears in {out!r}")
    eq(out, want, f"text with stop {stop!r} (greedy text {text!r})")
    eq(r.choices[0].finish_reason, "stop", "finish_reason")


def test_stop_chat(srv):
    c = oa(srv)
    q = "Explain how rain forms."
    text = chat(c, q, max_tokens=24, logit_bias=NO_EOS).choices[0].message.content
    stop = pick_stop(text)
    want = text[:text.find(stop)]
    r = chat(c, q, max_tokens=24, logit_bias=NO_EOS, stop=stop)
    out = r.choices[0].message.content or ""
    check(stop not in out, f"stop {stop!r} appears in {out!r}")
    eq(out, want, f"text with stop {stop!r} (greedy text {text!r})")
    eq(r.choices[0].finish_reason, "stop", "finish_reason")
    # The same in a stream: the stop text is never sent, not even in part across chunks.
    chunks = list(chat(c, q, max_tokens=24, logit_bias=NO_EOS, stop=stop, stream=True))
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    eq(streamed, want, f"streamed text with stop {stop!r}")
    reasons = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    eq(reasons, ["stop"], "streamed finish_reason")


def test_n_choices(srv):
    r = chat(oa(srv), "Suggest a name for a cat.", max_tokens=8, temperature=1.0, seed=11, n=3)
    eq(len(r.choices), 3, "number of choices")
    eq(sorted(ch.index for ch in r.choices), [0, 1, 2], "choice indices")
    for ch in r.choices:
        check(isinstance(ch.message.content, str), f"choice {ch.index} content {ch.message.content!r}")
        check(ch.finish_reason in ("stop", "length"), f"choice {ch.index} finish_reason {ch.finish_reason!r}")
    r = oa(srv).completions.create(model=ALIAS, prompt="My favourite animal is", max_tokens=6, temperature=1.0,
                                   seed=5, n=3)
    eq(sorted(ch.index for ch in r.choices), [0, 1, 2], "completions choice indices")


def test_seed_determinism(srv):
    c = oa(srv)

    def gen(seed):
        return c.completions.create(model=ALIAS, prompt="In a small village there lived", max_tokens=16,
                                    temperature=1.0, seed=seed).choices[0].text

    a, b = gen(1234), gen(1234)
    eq(b, a, "same seed, temperature 1: second text")
    others = [gen(s) for s in (1235, 1236, 1237)]
    check(any(o != a for o in others), f"seeds 1235..1237 all gave the text of seed 1234: {a!r}")


def test_max_tokens_length(srv):
    c = oa(srv)
    r = c.completions.create(model=ALIAS, prompt="1, 2, 3, 4, 5,", max_tokens=7, temperature=0, logit_bias=NO_EOS)
    eq(r.choices[0].finish_reason, "length", "completions finish_reason")
    eq(r.usage.completion_tokens, 7, "completions completion_tokens")
    r = c.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "Write a long story about a dragon."}],
                                  temperature=0, max_completion_tokens=6, logit_bias=NO_EOS)
    eq(r.choices[0].finish_reason, "length", "chat finish_reason (max_completion_tokens)")
    eq(r.usage.completion_tokens, 6, "chat completion_tokens (max_completion_tokens)")
    r = chat(c, "Write a long story about a dragon.", max_tokens=5, logit_bias=NO_EOS)
    eq(r.choices[0].finish_reason, "length", "chat finish_reason (max_tokens)")
    eq(r.usage.completion_tokens, 5, "chat completion_tokens (max_tokens)")


def test_stream_include_usage(srv):
    c = oa(srv)
    q = "Write a long story about a dragon."
    ref = chat(c, q, max_tokens=7, logit_bias=NO_EOS)
    chunks = list(chat(c, q, max_tokens=7, logit_bias=NO_EOS, stream=True,
                       stream_options={"include_usage": True}))
    last = chunks[-1]
    eq(last.choices, [], "choices of the usage chunk")
    check(last.usage is not None, "last chunk has no usage")
    eq(last.usage.completion_tokens, 7, "usage.completion_tokens")
    eq(last.usage.prompt_tokens, ref.usage.prompt_tokens, "usage.prompt_tokens vs non-stream")
    eq(last.usage.total_tokens, last.usage.prompt_tokens + 7, "usage.total_tokens")
    check(all(ch.usage is None for ch in chunks[:-1]), "usage on a chunk before the last")
    eq(len({ch.id for ch in chunks}), 1, "distinct ids")
    # completions too
    chunks = list(c.completions.create(model=ALIAS, prompt="1, 2, 3,", max_tokens=4, temperature=0, stream=True,
                                       logit_bias=NO_EOS, stream_options={"include_usage": True}))
    eq(chunks[-1].choices, [], "completions: choices of the usage chunk")
    check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4,
          f"completions usage chunk {short(chunks[-1])}")


def test_sampler_fields_accepted(srv):
    body = {"model": ALIAS, "messages": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": "Hello"}],
            "max_tokens": 4, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
            "repeat_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": 0.5, "seed": 3,
            "stop": ["\n\n"], "logit_bias": {"100": -1.5}, "response_format": {"type": "text"},
            "user": "tester", "some_unknown_field": {"nested": [1, 2]}, "stream": False}
    r = post_json(srv, "/v1/chat/completions", body)
    eq(r.status_code, 200, f"chat with every sampler field: {short(r.text)}")
    body = {"prompt": "Hello", "max_tokens": 4, "temperature": 0.5, "top_k": 10, "min_p": 0.1, "seed": 1,
            "repeat_penalty": 1.2, "stop": "\n", "echo_unknown": True}
    r = post_json(srv, "/v1/completions", body)
    eq(r.status_code, 200, f"completions with sampler fields: {short(r.text)}")


def test_logit_bias_effect(srv):
    forced = tokenize(srv, " zebra", False)[0]
    word = post_json(srv, "/detokenize", {"tokens": [forced]}).json()["content"]
    r = oa(srv).completions.create(model=ALIAS, prompt="The capital of France is", max_tokens=3, temperature=0,
                                   logit_bias={str(forced): 100})
    eq(r.choices[0].text, word * 3, f"text with logit_bias +100 on token {forced} ({word!r})")


def test_tokenize_roundtrip(srv):
    text = "Hello, world! Ünïcödé text, emoji 🙂 and\ttabs\nnew lines   spaces."
    toks = tokenize(srv, text, False)
    check(len(toks) > 5, f"few tokens: {toks}")
    r = post_json(srv, "/detokenize", {"tokens": toks})
    eq(r.status_code, 200, "/detokenize status")
    eq(r.json().get("content"), text, "detokenize(tokenize(text))")
    with_special = tokenize(srv, text, True)
    check(len(with_special) >= len(toks), f"add_special gave fewer tokens ({len(with_special)} < {len(toks)})")
    # Same ids as the command line.
    out = subprocess.run([CTX.binary, "tokenize", "-m", CTX.model, "--text", text, "--no-add-special", "--json"],
                         capture_output=True, text=True, timeout=T(60))
    if out.returncode == 0:
        eq(json.loads(out.stdout.strip().splitlines()[-1]), toks, "/tokenize vs celer tokenize --json")


# ---------------------------------------------------------------------------------------
# main server: bad input. Each case: method, path, body (bytes or object), expected status,
# words of which one must appear in error.param or error.message (None: any).

LONG_PROMPT = "hello " * (TOTAL_CTX + 500)

BAD_INPUTS = [
    ("malformed_json_chat", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"', 400, None),
    ("malformed_json_completions", "/v1/completions", b'{"prompt": "hi",, }', 400, None),
    ("empty_body", "/v1/chat/completions", b"", 400, None),
    ("body_not_object", "/v1/chat/completions", b"[1, 2, 3]", 400, None),
    ("messages_missing", "/v1/chat/completions", {"max_tokens": 2}, 400, ["messages"]),
    ("messages_not_array", "/v1/chat/completions", {"messages": "hi"}, 400, ["messages"]),
    ("messages_empty", "/v1/chat/completions", {"messages": []}, 400, ["messages"]),
    ("message_content_int", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400,
     ["content", "messages"]),
    ("message_role_int", "/v1/chat/completions", {"messages": [{"role": 7, "content": "hi"}]}, 400,
     ["role", "messages"]),
    ("max_tokens_string", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                   "max_tokens": "ten"}, 400, ["max_tokens"]),
    ("max_tokens_negative", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                     "max_tokens": -1}, 400, ["max_tokens"]),
    ("max_tokens_huge", "/v1/completions", {"prompt": "hi", "max_tokens": 10 ** 12}, 400, ["max_tokens"]),
    ("max_completion_tokens_negative", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -5}, 400, ["max_completion_tokens"]),
    ("temperature_string", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                    "temperature": "hot"}, 400, ["temperature"]),
    ("top_p_string", "/v1/completions", {"prompt": "hi", "top_p": "x"}, 400, ["top_p"]),
    ("top_k_string", "/v1/completions", {"prompt": "hi", "top_k": "x"}, 400, ["top_k"]),
    ("seed_string", "/v1/completions", {"prompt": "hi", "seed": "x"}, 400, ["seed"]),
    ("n_string", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": "x"}, 400, ["n"]),
    ("n_zero", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 0}, 400, ["n"]),
    ("stop_int", "/v1/completions", {"prompt": "hi", "stop": 5}, 400, ["stop"]),
    ("stop_list_of_ints", "/v1/completions", {"prompt": "hi", "stop": [1, 2]}, 400, ["stop"]),
    ("logit_bias_list", "/v1/completions", {"prompt": "hi", "logit_bias": [1]}, 400, ["logit_bias"]),
    ("logit_bias_bad_key", "/v1/completions", {"prompt": "hi", "logit_bias": {"abc": 1}}, 400, ["logit_bias"]),
    ("stream_string", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                               "stream": "yes"}, 400, ["stream"]),
    ("chat_logprobs_string", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                      "logprobs": "yes"}, 400, ["logprobs"]),
    ("top_logprobs_negative", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                       "logprobs": True, "top_logprobs": -1}, 400, ["top_logprobs"]),
    ("completions_logprobs_string", "/v1/completions", {"prompt": "hi", "logprobs": "x"}, 400, ["logprobs"]),
    ("prompt_missing", "/v1/completions", {"max_tokens": 2}, 400, ["prompt"]),
    ("prompt_object", "/v1/completions", {"prompt": {"a": 1}}, 400, ["prompt"]),
    ("prompt_token_out_of_range", "/v1/completions", {"prompt": [1, 99999999], "max_tokens": 2}, 400, ["prompt"]),
    ("response_format_type_xml", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "xml"}}, 400,
     ["response_format.type"]),
    ("response_format_json_schema_unsupported", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}],
      "response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": 1}}}}, 400,
     ["response_format.json_schema.schema", "minProperties"]),
    ("grammar_malformed", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "grammar": "root ::= ("}, 400, ["grammar", "line 1"]),
    ("tools_bad_name", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}],
      "tools": [{"type": "function", "function": {"name": "f(x)", "parameters": {"type": "object"}}}]}, 400,
     ["tools[0].function.name"]),
    ("invalid_utf8_chat", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "caf\xc3\x28 \xff\xfe"}], "max_tokens": 2}', 400,
     ["utf-8", "utf8", "content", "messages"]),
    ("invalid_utf8_completions", "/v1/completions", b'{"prompt": "ab\xed\xa0\x80cd", "max_tokens": 2}', 400,
     ["utf-8", "utf8", "prompt"]),
    ("deeply_nested_json", "/v1/chat/completions", b"[" * 100000 + b"]" * 100000, 400, None),
]

# Requests whose exact answer the spec leaves open, but that must never get a 5xx.
ODD_INPUTS = [
    ("temperature_negative", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "temperature": -1}),
    ("top_k_negative", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "top_k": -5}),
    ("top_p_above_one", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "top_p": 7}),
    ("max_tokens_zero", "/v1/completions", {"prompt": "hi", "max_tokens": 0}),
    ("max_tokens_float", "/v1/completions", {"prompt": "hi", "max_tokens": 2.5}),
    ("logit_bias_id_out_of_range", "/v1/completions", {"prompt": "hi", "max_tokens": 2,
                                                       "logit_bias": {"99999999": 5}}),
    ("unknown_role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}], "max_tokens": 2}),
    ("nul_in_content", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a\u0000b"}],
                                                "max_tokens": 2}),
    ("many_stop_strings", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "stop": ["s%d" % i for i in range(200)]}),
    ("empty_prompt", "/v1/completions", {"prompt": "", "max_tokens": 2}),
    ("empty_token_prompt", "/v1/completions", {"prompt": [], "max_tokens": 2}),
    ("content_null", "/v1/chat/completions", {"messages": [{"role": "user", "content": None}], "max_tokens": 2}),
    ("content_part_unknown_type", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "max_tokens": 2}),
    ("top_logprobs_huge", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                   "logprobs": True, "top_logprobs": 100000}),
    ("n_huge", "/v1/completions", {"prompt": "hi", "max_tokens": 1, "n": 100000}),
]


def server_still_serves(srv):
    r = get(srv, "/health", timeout=10)
    check(r.status_code == 200, f"server stopped serving: /health {r.status_code}")


def make_bad_input_test(path, body, status, fields):
    def t(srv):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        st, _, resp = raw_request(srv.port, "POST", path, data, {"Content-Type": "application/json"}, timeout=60)
        eq(st, status, f"status (body {short(resp[:300])})")
        err = error_of(parse_json_body(resp, "error"))
        if fields:
            where = ((err.get("param") or "") + " " + err["message"]).lower()
            check(any(f.lower() in where for f in fields),
                  f"error names none of {fields}: param={err.get('param')!r} message={err['message']!r}")
        server_still_serves(srv)
    return t


def make_odd_input_test(path, body):
    def t(srv):
        st, _, resp = raw_request(srv.port, "POST", path, json.dumps(body).encode(),
                                  {"Content-Type": "application/json"}, timeout=120)
        check(st < 500, f"status {st}: {short(resp[:300])}")
        if st >= 400:
            error_of(parse_json_body(resp, "error"))
        server_still_serves(srv)
    return t


def test_prompt_longer_than_context(srv):
    n_plain = len(tokenize(srv, LONG_PROMPT, False))
    n_special = len(tokenize(srv, LONG_PROMPT, True))
    r = post_json(srv, "/v1/completions", {"prompt": LONG_PROMPT, "max_tokens": 4})
    eq(r.status_code, 400, f"status ({short(r.text)})")
    err = error_of(r.json())
    nums = set(re.findall(r"\d+", err["message"]))
    check(str(n_plain) in nums or str(n_special) in nums,
          f"message does not give the prompt's {n_special} tokens: {err['message']!r}")
    check(len(nums) >= 2, f"message gives no context size: {err['message']!r}")
    # chat too
    r = post_json(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": LONG_PROMPT}],
                                                "max_tokens": 4})
    eq(r.status_code, 400, f"chat status ({short(r.text)})")
    error_of(r.json())
    server_still_serves(srv)


def test_body_too_large(srv):
    body = json.dumps({"prompt": "a " * (MAX_BODY // 2 + 1000), "max_tokens": 1}).encode()
    check(len(body) > MAX_BODY, "test body not over the limit")
    st, _, resp = raw_request(srv.port, "POST", "/v1/completions", body, {"Content-Type": "application/json"})
    eq(st, 413, f"status for a {len(body)}-byte body with --max-body-bytes {MAX_BODY} ({short(resp[:200])})")
    server_still_serves(srv)
    # Just under the limit is served.
    body = json.dumps({"prompt": "hi", "max_tokens": 1, "pad": "x" * (MAX_BODY - 200)}).encode()
    st, _, resp = raw_request(srv.port, "POST", "/v1/completions", body, {"Content-Type": "application/json"})
    eq(st, 200, f"status for a {len(body)}-byte body under the limit ({short(resp[:200])})")


def test_truncated_body(srv):
    """A client that promises more body than it sends, then hangs up."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=T(10))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 1000\r\n\r\n{\"prompt\": \"hi\"")
    time.sleep(0.2)
    s.close()
    server_still_serves(srv)
    r = post_json(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 1})
    eq(r.status_code, 200, "a request after a truncated one")


def test_unknown_path(srv):
    for method, path in (("GET", "/v1/nope"), ("POST", "/v1/nope"), ("GET", "/nope/deeper"),
                         ("POST", "/v1/chat/completions/extra")):
        st, _, resp = raw_request(srv.port, method, path, b"{}" if method == "POST" else b"",
                                  {"Content-Type": "application/json"})
        eq(st, 404, f"{method} {path} status")
        error_of(parse_json_body(resp, f"{method} {path}"))
    server_still_serves(srv)


def test_cors(srv):
    r = get(srv, "/v1/models", headers={"Origin": ORIGIN})
    eq(r.status_code, 200, "GET /v1/models with Origin")
    eq(r.headers.get("access-control-allow-origin"), ORIGIN, "Access-Control-Allow-Origin")
    with httpx.Client(base_url=srv.url, timeout=T(10)) as c:
        r = c.request("OPTIONS", "/v1/chat/completions",
                      headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                               "Access-Control-Request-Headers": "authorization, content-type"})
    check(r.status_code in (200, 204), f"preflight status {r.status_code}")
    eq(r.headers.get("access-control-allow-origin"), ORIGIN, "preflight Access-Control-Allow-Origin")
    check("POST" in r.headers.get("access-control-allow-methods", "").upper(),
          f"Access-Control-Allow-Methods {r.headers.get('access-control-allow-methods')!r}")
    allow_h = r.headers.get("access-control-allow-headers", "").lower()
    check(allow_h == "*" or ("authorization" in allow_h and "content-type" in allow_h),
          f"Access-Control-Allow-Headers {allow_h!r}")


def test_metrics_names(srv):
    r = get(srv, "/metrics")
    eq(r.status_code, 200, "GET /metrics status")
    check(r.headers.get("content-type", "").startswith("text/plain"), f"content-type {r.headers.get('content-type')!r}")
    m = metrics(srv)
    missing = [n for n in METRIC_NAMES if n not in m]
    for h in HISTOGRAMS:
        for suffix in ("_sum", "_count"):
            if h + suffix not in m:
                missing.append(h + suffix)
        if not any(k.startswith(h + "_bucket{") and 'le="+Inf"' in k for k in m):
            missing.append(h + '_bucket{le="+Inf"}')
        if m.get("#TYPE " + h) != "histogram":
            missing.append(f"# TYPE {h} histogram")
    for n in ("celer_prompt_tokens_total", "celer_generation_tokens_total"):
        # "# TYPE x_total counter" or, in OpenMetrics style, "# TYPE x counter".
        if m.get("#TYPE " + n) != "counter" and m.get("#TYPE " + n[:-len("_total")]) != "counter":
            missing.append(f"# TYPE {n} counter")
    for n in ("celer_requests_running", "celer_requests_waiting", "celer_kv_cache_usage_ratio"):
        if m.get("#TYPE " + n) != "gauge":
            missing.append(f"# TYPE {n} gauge")
    check(not missing, f"/metrics lacks {missing}")
    check(0.0 <= m["celer_kv_cache_usage_ratio"] <= 1.0, f"kv usage {m['celer_kv_cache_usage_ratio']}")


def test_metrics_counters(srv):
    before = metrics(srv)
    eq(before.get("celer_requests_running"), 0.0, "celer_requests_running when idle")
    eq(before.get("celer_requests_waiting"), 0.0, "celer_requests_waiting when idle")
    prompt = f"A unique prompt {time.time_ns()} for counting tokens:"
    r = oa(srv).completions.create(model=ALIAS, prompt=prompt, max_tokens=5, temperature=0, logit_bias=NO_EOS)
    after = metrics(srv)

    def d(name):
        return after.get(name, 0.0) - before.get(name, 0.0)

    eq(d("celer_prompt_tokens_total"), float(r.usage.prompt_tokens), "celer_prompt_tokens_total increase")
    eq(d("celer_generation_tokens_total"), float(r.usage.completion_tokens), "celer_generation_tokens_total increase")
    for h in HISTOGRAMS[::2]:  # TTFT and e2e: one observation per request
        eq(d(h + "_count"), 1.0, f"{h}_count increase")
        check(d(h + "_sum") > 0, f"{h}_sum did not grow")
    check(d("celer_inter_token_latency_seconds_count") >= r.usage.completion_tokens - 1,
          f"inter-token latency count grew by {d('celer_inter_token_latency_seconds_count')}")
    check(d("celer_prefix_cache_queries_total") >= 1, "celer_prefix_cache_queries_total did not grow")


def test_prefix_cache(srv):
    c = oa(srv)
    sysmsg = {"role": "system", "content": SYSTEM_PROMPT}
    n_sys = len(tokenize(srv, SYSTEM_PROMPT, False))
    check(n_sys > 64, f"system prompt has only {n_sys} tokens")
    hits0 = metrics(srv).get("celer_prefix_cache_hits_total", 0.0)
    a = c.chat.completions.create(model=ALIAS, temperature=0, max_tokens=12,
                                  messages=[sysmsg, {"role": "user", "content": "When does the library open on Saturday?"}])
    b = c.chat.completions.create(model=ALIAS, temperature=0, max_tokens=12,
                                  messages=[sysmsg, {"role": "user", "content": "How many books can I borrow?"}])
    details = b.usage.prompt_tokens_details
    cached = details.cached_tokens if details is not None else None
    check(cached is not None and cached > 0, f"second request: prompt_tokens_details.cached_tokens = {cached!r}")
    check(cached <= b.usage.prompt_tokens, f"cached_tokens {cached} > prompt_tokens {b.usage.prompt_tokens}")
    check(cached >= 48, f"cached_tokens {cached}: fewer than 3 blocks of a {n_sys}-token shared system prompt")
    check(metrics(srv).get("celer_prefix_cache_hits_total", 0.0) > hits0, "celer_prefix_cache_hits_total did not grow")
    CTX.prefix_text = (b.choices[0].message.content, a.choices[0].message.content)


def test_concurrent_greedy(srv):
    prompts = [f"Write one sentence about the number {i * 7 + 3}." for i in range(16)]

    def one(p):
        c = oa(srv, timeout=120)
        r = chat(c, p, max_tokens=12)
        return r.choices[0].message.content, r.choices[0].finish_reason

    alone = [one(p) for p in prompts]
    peak = {"running": 0}
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            try:
                peak["running"] = max(peak["running"], metrics(srv).get("celer_requests_running", 0))
            except Exception:
                pass
            time.sleep(0.05)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    barrier = threading.Barrier(16, timeout=T(30))

    def together(p):
        barrier.wait()
        return one(p)

    try:
        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            together_res = list(ex.map(together, prompts, timeout=T(240)))
    finally:
        stop.set()
        w.join(timeout=5)
    diffs = [(i, alone[i], together_res[i]) for i in range(16) if alone[i] != together_res[i]]
    check(not diffs, f"{len(diffs)} of 16 differ when concurrent, e.g. #{diffs[0][0]}: alone {diffs[0][1]!r} "
                     f"vs concurrent {diffs[0][2]!r}" if diffs else "")
    check(peak["running"] >= 2, f"celer_requests_running peaked at {peak['running']}: requests did not overlap")


# =======================================================================================
# noprefix server


def test_prefix_cache_off_same_text(srv):
    if CTX.prefix_text is None:
        raise Failure("no greedy text from the prefix-cache server to compare with (test_prefix_cache failed)")
    c = oa(srv)
    model = served_id(srv)
    sysmsg = {"role": "system", "content": SYSTEM_PROMPT}
    a = c.chat.completions.create(model=model, temperature=0, max_tokens=12,
                                  messages=[sysmsg, {"role": "user", "content": "When does the library open on Saturday?"}])
    b = c.chat.completions.create(model=model, temperature=0, max_tokens=12,
                                  messages=[sysmsg, {"role": "user", "content": "How many books can I borrow?"}])
    eq(b.choices[0].message.content, CTX.prefix_text[0], "greedy text with --no-prefix-cache vs with the cache")
    eq(a.choices[0].message.content, CTX.prefix_text[1], "first request's greedy text, --no-prefix-cache vs cache")
    details = b.usage.prompt_tokens_details
    cached = details.cached_tokens if details is not None else 0
    eq(cached or 0, 0, "cached_tokens with --no-prefix-cache")


def open_stream_socket(srv, body):
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=T(30))
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(data)}\r\n\r\n").encode() + data)
    return s


def read_events(s, n, timeout):
    """Reads from the socket until n `data:` events arrived; returns the bytes read."""
    buf = b""
    deadline = time.monotonic() + timeout
    while buf.count(b"data:") < n and time.monotonic() < deadline:
        s.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            chunk = s.recv(4096)
        except socket.timeout:
            break
        if not chunk:
            break
        buf += chunk
    return buf


LONG_GEN = {"prompt": "1, 2, 3, 4, 5, 6, 7,", "max_tokens": 1500, "temperature": 0, "logit_bias": NO_EOS}


def check_cancelled(srv, idle, gen_before, t_close, what):
    def settled():
        m = metrics(srv)
        ok = m.get("celer_requests_running") == 0 and m.get("celer_kv_cache_usage_ratio") <= idle + 1e-9
        return m if ok else None

    m = wait_until(settled, T(10), 0.05)
    if not m:
        last = metrics(srv)
        raise Failure(f"{what}: 10 s after closing, running={last.get('celer_requests_running')} "
                      f"kv={last.get('celer_kv_cache_usage_ratio')} (idle {idle})")
    generated = m.get("celer_generation_tokens_total", 0) - gen_before
    check(generated < 1000, f"{what}: {generated:.0f} tokens generated after the client left (not cancelled)")
    return time.monotonic() - t_close


def test_disconnect_stream(srv):
    m0 = metrics(srv)
    idle = m0["celer_kv_cache_usage_ratio"]
    eq(m0.get("celer_requests_running"), 0.0, "running before")
    s = open_stream_socket(srv, dict(LONG_GEN, stream=True))
    try:
        buf = read_events(s, 3, T(30))
        check(buf.count(b"data:") >= 3, f"stream gave {buf.count(b'data:')} events before timing out: {short(buf)}")
        m1 = metrics(srv)
        check(m1.get("celer_requests_running", 0) >= 1, f"running while streaming: {m1.get('celer_requests_running')}")
        check(m1.get("celer_kv_cache_usage_ratio", 0) > idle, "kv usage did not grow while streaming")
    finally:
        s.shutdown(socket.SHUT_RDWR)
        s.close()
    check_cancelled(srv, idle, m0.get("celer_generation_tokens_total", 0), time.monotonic(), "stream")
    server_still_serves(srv)


def test_disconnect_nonstream(srv):
    m0 = metrics(srv)
    idle = m0["celer_kv_cache_usage_ratio"]
    s = open_stream_socket(srv, LONG_GEN)
    try:
        started = wait_until(lambda: metrics(srv).get("celer_requests_running", 0) >= 1, T(10), 0.05)
        check(started, "the request never showed as running")
        time.sleep(0.3)
    finally:
        s.shutdown(socket.SHUT_RDWR)
        s.close()
    check_cancelled(srv, idle, m0.get("celer_generation_tokens_total", 0), time.monotonic(), "non-stream")
    server_still_serves(srv)


def test_sigterm_during_stream(srv):
    s = open_stream_socket(srv, dict(LONG_GEN, stream=True))
    try:
        buf = read_events(s, 2, T(30))
        check(buf.count(b"data:") >= 2, f"stream gave {buf.count(b'data:')} events")
        rc = srv.stop(timeout=20)
    finally:
        s.close()
    eq(rc, 0, f"exit status after SIGTERM during a stream (log: {srv.log_tail(3)})")


# =======================================================================================
# auth servers

KEYS = ("k-one-secret", "k-two-secret")


def test_auth(srv):
    def st(path, headers, method="GET", body=None):
        with httpx.Client(base_url=srv.url, timeout=T(60)) as c:
            r = c.request(method, path, headers=headers, json=body)
        return r

    for label, headers in (("no key", {}), ("wrong Bearer", {"Authorization": "Bearer nope"}),
                           ("wrong X-Api-Key", {"X-Api-Key": "nope"}),
                           ("key without Bearer", {"Authorization": KEYS[0]}),
                           ("prefix of a key", {"Authorization": "Bearer " + KEYS[0][:-1]})):
        r = st("/v1/models", headers)
        eq(r.status_code, 401, f"GET /v1/models with {label}")
        eq(error_of(r.json())["type"], "authentication_error", f"error.type with {label}")
    r = st("/v1/chat/completions", {}, "POST", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    eq(r.status_code, 401, "POST /v1/chat/completions without a key")
    r = st("/v1/completions", {"X-Api-Key": "nope"}, "POST", {"prompt": "hi", "max_tokens": 2})
    eq(r.status_code, 401, "POST /v1/completions with a wrong X-Api-Key")
    eq(st("/v1/models", {"Authorization": "Bearer " + KEYS[0]}).status_code, 200, "Bearer first key")
    eq(st("/v1/models", {"Authorization": "Bearer " + KEYS[1]}).status_code, 200, "Bearer second key")
    eq(st("/v1/models", {"X-Api-Key": KEYS[1]}).status_code, 200, "X-Api-Key second key")
    eq(st("/health", {}).status_code, 200, "/health without a key")
    r = st("/v1/completions", {"Authorization": "Bearer " + KEYS[0]}, "POST", {"prompt": "hi", "max_tokens": 2})
    eq(r.status_code, 200, "POST /v1/completions with a key")


def test_auth_openai_client(srv):
    model = served_id(srv, headers={"Authorization": "Bearer " + KEYS[0]})
    r = chat(oa(srv, api_key=KEYS[0]), "Hi", model=model, max_tokens=3)
    check(r.choices[0].message.content is not None, "no content")
    try:
        chat(oa(srv, api_key="wrong"), "Hi", model=model, max_tokens=3)
    except openai.AuthenticationError:
        return
    raise Failure("a wrong key did not raise openai.AuthenticationError")


def test_auth_key_file(srv):
    eq(get(srv, "/v1/models").status_code, 401, "no key")
    eq(get(srv, "/v1/models", headers={"Authorization": "Bearer file-key-1"}).status_code, 200, "Bearer file-key-1")
    eq(get(srv, "/v1/models", headers={"X-Api-Key": "file-key-2"}).status_code, 200, "X-Api-Key file-key-2")
    eq(get(srv, "/health").status_code, 200, "/health without a key")


# =======================================================================================
# queue server


def test_queue_full_503(srv):
    body = {"prompt": "Write a long story about a brave knight.", "max_tokens": 40, "temperature": 0,
            "logit_bias": NO_EOS}
    barrier = threading.Barrier(20, timeout=T(30))

    def one(_):
        barrier.wait()
        with httpx.Client(base_url=srv.url, timeout=T(120)) as c:
            r = c.post("/v1/completions", json=body)
        return r.status_code, r.text

    with concurrent.futures.ThreadPoolExecutor(20) as ex:
        res = list(ex.map(one, range(20), timeout=T(300)))
    codes = [c for c, _ in res]
    check(set(codes) <= {200, 503}, f"statuses other than 200/503: {sorted(codes)}")
    check(codes.count(503) >= 10, f"only {codes.count(503)} of 20 got 503 with -np 1 --max-queue 1: {sorted(codes)}")
    check(codes.count(200) >= 1, f"no request was served: {sorted(codes)}")
    for c, t in res:
        if c == 503:
            error_of(json.loads(t))
    r = post_json(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    eq(r.status_code, 200, "a request after the burst")


def test_metrics_off(srv):
    st = get(srv, "/metrics").status_code
    eq(st, 404, "GET /metrics without --metrics")


def test_models_default_id(srv):
    r = get(srv, "/v1/models")
    eq(r.status_code, 200, "status")
    ids = [m.get("id") for m in r.json().get("data", [])]
    stem = os.path.basename(CTX.model).rsplit(".gguf", 1)[0].lower()
    check(len(ids) >= 1 and any(stem.split(".")[0] in (i or "").lower() for i in ids),
          f"/v1/models without --alias lists {ids}, none names the model file {os.path.basename(CTX.model)}")



# =======================================================================================
# vlm server: image_url parts on the tiny LLaVA-NeXT of tests/server/fixtures/llava-chat,
# against the goldens tools/make_llava_chat_fixture.py computed with transformers.

VLM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "llava-chat")
VLM_GOLDEN = None  # golden.json, loaded by main()
BAD_PROMPT = "What is this?"


def vlm_image_bytes(name):
    with open(os.path.join(VLM_DIR, f"image_{name}.png"), "rb") as f:
        return f.read()


def data_url(data, media="image/png"):
    return f"data:{media};base64," + base64.b64encode(data).decode()


def vlm_messages(url, prompt=None):
    """The golden's one user message, [image, text], with the image at url."""
    text = prompt if prompt is not None else VLM_GOLDEN["prompt"]
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


def vlm_chat(srv, name, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", VLM_GOLDEN["max_new_tokens"])
    return oa(srv).chat.completions.create(model="llava-chat", messages=vlm_messages(data_url(vlm_image_bytes(name))),
                                           **kw)


def check_vlm_golden(r, name, what):
    """r (a non-streamed answer) is image `name`'s golden: text, every token's bytes, usage."""
    g = VLM_GOLDEN["cases"][name]
    ch = r.choices[0]
    eq(ch.message.content, g["completion_text"], f"{what}: text")
    eq(ch.finish_reason, "length", f"{what}: finish_reason")
    eq(r.usage.prompt_tokens, g["prompt_tokens"], f"{what}: usage.prompt_tokens (the image token expanded)")
    eq(r.usage.completion_tokens, len(g["completion_ids"]), f"{what}: usage.completion_tokens")
    if ch.logprobs is not None:
        eq([list(t.bytes) for t in ch.logprobs.content], g["completion_token_bytes"], f"{what}: bytes of each token")


def test_vlm_golden(srv):
    r = vlm_chat(srv, "a", logprobs=True)
    check(r.choices[0].logprobs is not None, "no logprobs")
    check_vlm_golden(r, "a", "image a")
    # the golden's ids, detokenized by the server, are the same text
    d = post_json(srv, "/detokenize", {"tokens": VLM_GOLDEN["cases"]["a"]["completion_ids"]})
    eq(d.json().get("content"), r.choices[0].message.content, "/detokenize of the golden ids vs the completion")
    # the same image as JPEG-labelled media type is refused by nothing: the decoder sniffs PNG
    r = oa(srv).chat.completions.create(model="llava-chat", temperature=0, max_tokens=VLM_GOLDEN["max_new_tokens"],
                                        messages=vlm_messages(data_url(vlm_image_bytes("a"), "image/jpeg")))
    check_vlm_golden(r, "a", "image a sent as image/jpeg")


def test_vlm_stream(srv):
    g = VLM_GOLDEN["cases"]["a"]
    chunks = list(vlm_chat(srv, "a", stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    eq(text, g["completion_text"], "streamed text")
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    eq(finals, ["length"], "finish reasons")
    last = chunks[-1]
    check(last.usage is not None, "no usage chunk")
    eq(last.usage.prompt_tokens, g["prompt_tokens"], "streamed usage.prompt_tokens")


def cached_of(r):
    d = r.usage.prompt_tokens_details
    check(d is not None and d.cached_tokens is not None, f"no prompt_tokens_details.cached_tokens: {short(r.usage)}")
    return d.cached_tokens


def test_vlm_prefix_cache_by_image(srv):
    """The same request again reuses its blocks; the same ids with another image reuse no
    block that holds image rows, and give that image's own golden."""
    ga, gb = VLM_GOLDEN["cases"]["a"], VLM_GOLDEN["cases"]["b"]
    eq(ga["prompt_ids"], gb["prompt_ids"], "the two cases' prompt ids (the test needs them equal)")
    first = vlm_chat(srv, "a")
    again = vlm_chat(srv, "a")
    check_vlm_golden(again, "a", "image a again")
    cached = cached_of(again)
    check(cached >= 48, f"image a again: cached_tokens {cached}, want the prompt's full blocks (>= 48 of "
                        f"{ga['prompt_tokens']})")
    check(cached < again.usage.prompt_tokens, f"cached_tokens {cached} not below prompt_tokens")
    eq(first.choices[0].message.content, again.choices[0].message.content, "image a: first vs again")
    other = vlm_chat(srv, "b")
    check_vlm_golden(other, "b", "image b after image a")
    cb = cached_of(other)
    check(cb <= gb["image_start"], f"image b: cached_tokens {cb} reach into the image rows (they start at "
                                   f"{gb['image_start']}): blocks of image a were reused")
    check(cached_of(vlm_chat(srv, "b")) >= 48, "image b again: its own blocks are not reused")


def tiny_png(w, h, seed):
    """An RGB PNG of pseudo-random pixels (incompressible), written with zlib alone."""
    import random
    rnd = random.Random(seed)
    raw = b"".join(b"\x00" + rnd.randbytes(w * 3) for _ in range(h))

    def chunk(kind, data):
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    ihdr = w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 1))
            + chunk(b"IEND", b""))


def test_vlm_large_body(srv):
    """A data URL of a few hundred KB fits the default --max-body-bytes (8 MiB)."""
    png = tiny_png(320, 300, 5)
    body = json.dumps({"messages": vlm_messages(data_url(png)), "max_tokens": 2, "temperature": 0}).encode()
    check(len(body) > 300_000, f"test body only {len(body)} bytes")
    st, _, resp = raw_request(srv.port, "POST", "/v1/chat/completions", body, {"Content-Type": "application/json"},
                              timeout=120)
    eq(st, 200, f"status for a {len(body)}-byte body ({short(resp[:300])})")
    u = parse_json_body(resp, "answer")["usage"]
    n_text = len(VLM_GOLDEN["cases"]["a"]["prompt_ids"]) - 1
    check(u["prompt_tokens"] > n_text + VLM_GOLDEN["cases"]["a"]["image_rows"],
          f"prompt_tokens {u['prompt_tokens']}: a 320x300 image takes more rows than an 80x48 one")


def test_vlm_two_images(srv):
    """Two image parts: two image tokens where the template put them, each expanded."""
    ua, ub = data_url(vlm_image_bytes("a")), data_url(vlm_image_bytes("b"))
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": ua, "detail": "high"}},
                                         {"type": "text", "text": "and"},
                                         {"type": "image_url", "image_url": {"url": ub}}]}]
    r = oa(srv).chat.completions.create(model="llava-chat", temperature=0, max_tokens=2, messages=msgs)
    # what the fixture's template renders for these parts
    ids = tokenize(srv, "<s>USER: <image>\nand<image>\n\nASSISTANT:", False)
    image_token = VLM_GOLDEN["image_token"]
    eq(ids.count(image_token), 2, "image tokens in the rendered prompt")
    rows = VLM_GOLDEN["cases"]["a"]["image_rows"]  # both images are 80x48
    eq(r.usage.prompt_tokens, len(ids) - 2 + 2 * rows, "usage.prompt_tokens of two images")


def vlm_bad(body_messages, param_suffix, words):
    """A test: the messages get a 400 OpenAI error naming param (suffix) with one of words."""
    def t(srv):
        body = json.dumps({"messages": body_messages() if callable(body_messages) else body_messages,
                           "max_tokens": 2}).encode()
        st, _, resp = raw_request(srv.port, "POST", "/v1/chat/completions", body,
                                  {"Content-Type": "application/json"}, timeout=60)
        eq(st, 400, f"status (body {short(resp[:300])})")
        err = error_of(parse_json_body(resp, "error"))
        check((err.get("param") or "").endswith(param_suffix),
              f"error.param {err.get('param')!r}, want one ending in {param_suffix!r}")
        check(any(w.lower() in err["message"].lower() for w in words),
              f"error.message names none of {words}: {err['message']!r}")
        eq(err["type"], "invalid_request_error", "error.type")
        server_still_serves(srv)
    return t


URL_PARAM = "messages[0].content[0].image_url.url"

VLM_BAD_INPUTS = [
    ("http_url", vlm_messages("http://example.com/cat.png", BAD_PROMPT), URL_PARAM, ["only base64 data: URLs"]),
    ("https_url", vlm_messages("https://example.com/cat.png", BAD_PROMPT), URL_PARAM, ["never fetches"]),
    ("file_url", vlm_messages("file:///etc/passwd", BAD_PROMPT), URL_PARAM, ["only base64 data: URLs"]),
    ("data_url_not_base64", vlm_messages("data:image/png,%89PNG%0D%0A", BAD_PROMPT), URL_PARAM, ["not base64"]),
    ("data_url_not_image", vlm_messages("data:text/plain;base64,aGVsbG8=", BAD_PROMPT), URL_PARAM, ["text/plain"]),
    ("bad_base64_character", vlm_messages("data:image/png;base64,iVBORw0K*goAAAAA", BAD_PROMPT), URL_PARAM,
     ["invalid base64"]),
    ("bad_base64_padding", vlm_messages("data:image/png;base64,iVBORw0KGgo=AAAA", BAD_PROMPT), URL_PARAM, ["padding"]),
    ("truncated_png", lambda: vlm_messages(data_url(vlm_image_bytes("a")[:300]), BAD_PROMPT), URL_PARAM, ["truncated"]),
    ("not_an_image", lambda: vlm_messages(data_url(b"GIF89a" + bytes(64)), BAD_PROMPT), URL_PARAM, ["png", "jpeg", "image"]),
    ("image_url_not_object", [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
     "messages[0].content[0].image_url", ["expected an object"]),
    ("image_in_assistant_message", lambda: [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
        {"type": "image_url", "image_url": {"url": data_url(vlm_image_bytes("a"))}}]}],
     "messages[1].content[0].type", ["user messages"]),
    ("input_audio_part", [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}],
     "messages[0].content[0].type", ["input_audio"]),
    ("image_token_in_text", [{"role": "user", "content": "What is <image> here?"}], "messages",
     ["did not place"]),
]


def vlm_tests():
    tests = [
        ("vlm_image_chat_matches_transformers", test_vlm_golden),
        ("vlm_image_chat_stream", test_vlm_stream),
        ("vlm_prefix_cache_keyed_by_image", test_vlm_prefix_cache_by_image),
        ("vlm_two_images", test_vlm_two_images),
        ("vlm_large_data_url_default_body_limit", test_vlm_large_body),
    ]
    tests += [(f"vlm_bad_input[{n}]", vlm_bad(m, p, w)) for n, m, p, w in VLM_BAD_INPUTS]
    return tests


# =======================================================================================
# gemma3 server: image_url parts on the tiny Gemma 3 of tests/fixtures/gemma3-vision-mlx-bf16
# (pan and scan on), against the goldens tools/make_gemma3_fixtures.py computed with
# transformers' Gemma3Processor and Gemma3ForConditionalGeneration.

G3_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "gemma3-vision-mlx-bf16")
G3_GOLDEN = None  # golden.json, loaded by main()
G3_EOS = 1


def g3_case(name):
    return next(c for c in G3_GOLDEN["cases"] if c["name"] == name)


def g3_messages(case):
    """The case's messages with each image part an image_url of its file."""
    files = iter(case["images"])
    content = []
    for part in case["messages"][0]["content"]:
        if part["type"] == "image":
            name = next(files)
            with open(os.path.join(G3_DIR, name), "rb") as f:
                media = "image/jpeg" if name.endswith(".jpg") else "image/png"
                content.append({"type": "image_url", "image_url": {"url": data_url(f.read(), media)}})
        else:
            content.append(part)
    return [{"role": "user", "content": content}]


def g3_expect(srv, case):
    """The golden greedy ids up to the model's end of sequence, and their text."""
    ids = case["greedy"]
    if G3_EOS in ids:
        ids = ids[:ids.index(G3_EOS)]
    text = post_json(srv, "/detokenize", {"tokens": ids}).json().get("content")
    return ids, text


def g3_chat(srv, case, **kw):
    return oa(srv).chat.completions.create(model="gemma3", messages=g3_messages(case), temperature=0,
                                           max_tokens=len(case["greedy"]), **kw)


def test_g3_golden(srv):
    """Each case (pan and scan of a wide and a tall image, a square one without crops):
    the prompt as Gemma3Processor expands it, the greedy text transformers generates."""
    for name in ("wide", "tall", "square"):
        c = g3_case(name)
        ids, text = g3_expect(srv, c)
        r = g3_chat(srv, c)
        eq(r.usage.prompt_tokens, len(c["input_ids"]), f"{name}: usage.prompt_tokens (Gemma3Processor's ids)")
        eq(r.choices[0].message.content, text, f"{name}: text")
        eq(r.usage.completion_tokens, min(len(ids) + 1, len(c["greedy"])), f"{name}: usage.completion_tokens")


def test_g3_prefix_cache(srv):
    """The same request again reuses the blocks of the image rows and gives the same text."""
    c = g3_case("wide")
    first = g3_chat(srv, c)
    again = g3_chat(srv, c)
    cached = cached_of(again)
    check(cached >= 48, f"wide again: cached_tokens {cached}, want the prompt's full blocks")
    eq(again.choices[0].message.content, first.choices[0].message.content, "wide: first vs again")


G3_BAD_INPUTS = [
    ("marker_without_image", [{"role": "user", "content": "What is <start_of_image> here?"}], "messages",
     ["markers"]),
]


def g3_tests():
    tests = [("gemma3_image_chat_matches_transformers", test_g3_golden),
             ("gemma3_prefix_cache_keyed_by_image", test_g3_prefix_cache)]
    tests += [(f"gemma3_bad_input[{n}]", vlm_bad(m, p, w)) for n, m, p, w in G3_BAD_INPUTS]
    return tests


# =======================================================================================
# fault servers: CELER_FAULT_STEP makes a model step fail (a real CUDA error on a GPU)


def failed_completion(srv, what):
    """POSTs a completion that must fail with 500; returns the error's message."""
    r = post_json(srv, "/v1/completions", {"prompt": "Name a color.", "max_tokens": 3, "temperature": 0})
    eq(r.status_code, 500, f"{what}: status (body {short(r.text)})")
    err = error_of(parse_json_body(r.content, what))
    eq(err["type"], "server_error", f"{what}: error.type")
    check("CELER_FAULT_STEP" in err["message"] or "cuda" in err["message"],
          f"{what}: the message does not name the failure: {err['message']!r}")
    return err["message"]


def served_completion(srv, what):
    r = post_json(srv, "/v1/completions", {"prompt": "Name a color.", "max_tokens": 3, "temperature": 0})
    eq(r.status_code, 200, f"{what}: status (body {short(r.text)})")
    check(r.json()["usage"]["completion_tokens"] >= 1, f"{what}: no tokens: {short(r.text)}")


def test_fault_500_then_served(srv):
    failed_completion(srv, "the request of the failing step")
    r = get(srv, "/health")
    eq((r.status_code, r.json().get("status")), (200, "ok"), "/health after a recoverable failure")
    served_completion(srv, "the request after it")
    m = metrics(srv)
    eq(m.get("celer_step_failures_total"), 1.0, "celer_step_failures_total")
    eq(m.get("celer_request_failures_total"), 1.0, "celer_request_failures_total")
    eq(m.get("celer_requests_running"), 0.0, "celer_requests_running after the failure")
    eq(m.get("celer_kv_cache_usage_ratio"), 0.0, "KV blocks held after the failure")


def test_fault_stream_error_event(srv):
    body = {"prompt": "Count to ten:", "max_tokens": 8, "temperature": 0, "stream": True, "logit_bias": NO_EOS}
    with httpx.Client(base_url=srv.url, timeout=T(60)) as c:
        with c.stream("POST", "/v1/completions", json=body) as r:
            eq(r.status_code, 200, "stream status (the failure comes after the headers)")
            lines = list(r.iter_lines())
    events = [ln[5:].strip() for ln in lines if ln.startswith("data:")]
    check("[DONE]" not in events, f"[DONE] after a failed step: {short(events)}")
    objs = [json.loads(e) for e in events]
    check(objs and "error" in objs[-1], f"the stream does not end with an error event: {short(objs)}")
    err = error_of(objs[-1])
    check("CELER_FAULT_STEP" in err["message"] or "cuda" in err["message"],
          f"the error event does not name the failure: {err['message']!r}")
    check(any(o.get("choices") and o["choices"][0].get("text") for o in objs[:-1]),
          f"no text before the failed second step: {short(objs)}")
    served_completion(srv, "the request after the failed stream")


def test_lost_device(srv):
    first = failed_completion(srv, "the request that lost the device")
    r = get(srv, "/health")
    eq(r.status_code, 503, f"/health after a lost device (body {short(r.text)})")
    eq(r.json().get("status"), "error", "/health status")
    check(r.json().get("error") in first, f"/health error {r.json().get('error')!r} is not the failure {first!r}")
    again = failed_completion(srv, "a request after the device was lost")
    eq(again, first, "the message of a later request")
    eq(get(srv, "/v1/models").status_code, 200, "GET /v1/models after a lost device")
    eq(metrics(srv).get("celer_step_failures_total"), 2.0, "celer_step_failures_total")


CTX = None


def with_server(res, ctx, name, args, tests, log_dir, stop_check=True, model=None, env=None, skip_why=None):
    only = os.environ.get("SERVER_TESTS_ONLY")  # "structured,vlm": run just these servers
    if only and name not in only.split(","):
        return
    if skip_why:
        for tname, _ in tests:
            res.skipped += 1
            print(f"SKIP {tname}: {skip_why}", flush=True)
        return
    srv = Server(ctx.binary, model or ctx.model, name, args, log_dir, env)
    print(f"--- server {name}: celer serve {' '.join(args)}", flush=True)
    try:
        srv.start()
    except ServerError as e:
        for tname, *_ in tests:
            res.record(tname, False, f"server did not start: {e}")
        return
    try:
        for tname, fn in tests:
            if not srv.alive():
                res.record(tname, False, f"server {name} died (exit {srv.proc.returncode}): {srv.log_tail()}")
                continue
            res.run(tname, fn, srv)
    finally:
        if srv.exit_code is None and stop_check:
            rc = srv.stop()
            res.record(f"sigterm_exit_0[{name}]", rc == 0, f"exit status {rc!r} after SIGTERM: {srv.log_tail(3)}")
        else:
            srv.stop()


def main():
    global CTX
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    binary = celer_bin(build)
    res = Results("test_server")
    if not os.path.isfile(binary):
        res.record("celer_binary", False, f"{binary} not found")
        print(res.summary())
        return 1
    set_scale(timeout_scale(binary))
    model = default_model()
    if model is None:
        if os.environ.get("CI"):
            res.record("default_model", False, "the default model is missing: CI must fetch it (tools/fetch_model.sh)")
        else:
            res.skipped += 1
            print("SKIP all: default model not found (run tools/fetch_model.sh with network access)")
        print(res.summary())
        return 1 if res.failed else 0
    log_dir = os.path.join(build, "server-tests")
    os.makedirs(log_dir, exist_ok=True)
    for f in os.listdir(log_dir):
        if f.endswith(".log") or f.endswith(".keys"):
            os.remove(os.path.join(log_dir, f))
    CTX = Ctx(binary, model)
    t0 = time.monotonic()

    main_tests = [
        ("health", test_health),
        ("models_list_alias", test_models_list),
        ("path_aliases", test_path_aliases),
        ("chat_nonstream", test_chat_nonstream),
        ("chat_stream", test_chat_stream),
        ("chat_stream_raw_sse", test_chat_stream_raw_sse),
        ("chat_content_parts", test_chat_content_parts),
        ("chat_template_kwargs", test_chat_template_kwargs),
        ("image_part_text_only_model_400", test_image_part_text_only_model),
        ("completions_string_prompt", test_completions_string),
        ("completions_token_id_prompt", test_completions_token_ids),
        ("usage_counts_tokens", test_usage_counts_tokens),
        ("logprobs_chat", test_logprobs_chat),
        ("logprobs_completions", test_logprobs_completions),
        ("stop_strings_completions", test_stop_completions),
        ("stop_string_chat", test_stop_chat),
        ("n_choices", test_n_choices),
        ("seed_determinism", test_seed_determinism),
        ("max_tokens_finish_length", test_max_tokens_length),
        ("stream_include_usage", test_stream_include_usage),
        ("sampler_fields_accepted", test_sampler_fields_accepted),
        ("logit_bias_effect", test_logit_bias_effect),
        ("tokenize_roundtrip", test_tokenize_roundtrip),
        ("metrics_names", test_metrics_names),
        ("metrics_counters", test_metrics_counters),
    ]
    main_tests += [(f"bad_input[{n}]", make_bad_input_test(p, b, s, f)) for n, p, b, s, f in BAD_INPUTS]
    main_tests += [(f"odd_input_no_5xx[{n}]", make_odd_input_test(p, b)) for n, p, b in ODD_INPUTS]
    main_tests += [
        ("prompt_longer_than_context", test_prompt_longer_than_context),
        ("body_over_max_body_bytes_413", test_body_too_large),
        ("truncated_body", test_truncated_body),
        ("unknown_path_404", test_unknown_path),
        ("cors_origin", test_cors),
        ("prefix_cache_hit", test_prefix_cache),
        ("concurrent_16_greedy_match_sequential", test_concurrent_greedy),
    ]
    with_server(res, CTX, "main", ["-np", "4", "-c", str(TOTAL_CTX), "--metrics", "--alias", ALIAS,
                                   "--cors-origin", ORIGIN, "--max-body-bytes", str(MAX_BODY),
                                   "--max-queue", "64"], main_tests, log_dir)

    # Hundreds of real-model completions of up to 160 tokens: under a sanitizer build (5x
    # timeouts) a token takes half a second, so there the tiny model's servers below cover
    # the same code (grammar, tool-call formats, streaming).
    real_structured = [("structured", ["-np", "8", "-c", "8192", "-t", "2"], structured.real_tests()),
                       ("tools", ["-np", "4", "-c", "8192", "-t", "2"], tools.real_tests())]
    for name, args, server_tests in real_structured:
        with_server(res, CTX, name, args, server_tests, log_dir,
                    skip_why="real-model generations are too slow in a sanitizer build" if T(1) > 1 else None)

    with_server(res, CTX, "noprefix", ["--no-prefix-cache", "--metrics", "-np", "2", "-c", str(TOTAL_CTX)], [
        ("prefix_cache_off_same_greedy_text", test_prefix_cache_off_same_text),
        ("disconnect_mid_stream_cancels", test_disconnect_stream),
        ("disconnect_nonstream_cancels", test_disconnect_nonstream),
        ("sigterm_during_stream_exit_0", test_sigterm_during_stream),
    ], log_dir, stop_check=False)

    with_server(res, CTX, "auth", ["--api-key", ",".join(KEYS), "-np", "1"], [
        ("auth_headers", test_auth),
        ("auth_openai_client", test_auth_openai_client),
    ], log_dir)

    keyfile = os.path.join(log_dir, "server.keys")
    with open(keyfile, "w") as f:
        f.write("file-key-1\nfile-key-2\n")
    with_server(res, CTX, "authfile", ["--api-key-file", keyfile, "-np", "1"], [
        ("auth_key_file", test_auth_key_file),
    ], log_dir)

    with_server(res, CTX, "queue", ["-np", "1", "--max-queue", "1"], [
        ("queue_full_503", test_queue_full_503),
        ("metrics_off_without_flag", test_metrics_off),
        ("models_default_id", test_models_default_id),
    ], log_dir)

    global VLM_GOLDEN
    with open(os.path.join(VLM_DIR, "golden.json")) as f:
        VLM_GOLDEN = json.load(f)
    with_server(res, CTX, "vlm", ["-np", "2", "-c", "2048", "-t", "2"], vlm_tests(), log_dir, model=VLM_DIR)
    with_server(res, CTX, "structured_tiny", ["-np", "8", "-c", "4096", "-t", "2"], structured.tiny_tests(), log_dir,
                model=VLM_DIR)
    for name, extra, family_tests in tools.family_servers(os.path.join(ROOT, "tests", "templates")):
        with_server(res, CTX, name, ["-np", "2", "-c", "4096", "-t", "2"] + extra, family_tests, log_dir,
                    model=VLM_DIR)

    global G3_GOLDEN
    with open(os.path.join(G3_DIR, "golden.json")) as f:
        G3_GOLDEN = json.load(f)
    with_server(res, CTX, "gemma3", ["-np", "2", "-c", "1024", "-t", "2", "--alias", "gemma3"], g3_tests(), log_dir,
                model=G3_DIR)

    with_server(res, CTX, "fault", ["-np", "2", "--metrics"], [
        ("fault_500_then_served", test_fault_500_then_served),
    ], log_dir, env={"CELER_FAULT_STEP": "1"})
    with_server(res, CTX, "faultsse", ["-np", "2"], [
        ("fault_stream_error_event", test_fault_stream_error_event),
    ], log_dir, env={"CELER_FAULT_STEP": "2"})
    with_server(res, CTX, "lost", ["-np", "2", "--metrics"], [
        ("lost_device_500_health_503", test_lost_device),
    ], log_dir, env={"CELER_FAULT_STEP": "1:sticky"})

    print(f"server logs in {log_dir}; {time.monotonic() - t0:.0f} s", flush=True)
    if res.failures:
        print("failed: " + " ".join(res.failures), flush=True)
    print(res.summary(), flush=True)
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())

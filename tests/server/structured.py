"""Structured outputs end to end (tests/server/suite.py runs these): response_format
json_object and json_schema, llama-server's json_schema and grammar fields, through the
pinned openai client and raw HTTP. Every completion that stops must parse and validate
against its schema with the `jsonschema` package (Draft 2020-12, formats checked); the
only other ending allowed is the length limit. Schemas the compiler does not enforce are
400s naming the keyword. Under concurrency, constrained and free requests share steps:
each constrained output is valid and each free greedy one equals the same request alone.

Two servers use these: the real model (SmolLM2, a few hundred sampled completions) and the
tiny random LLaVA-NeXT of tests/server/fixtures/llava-chat, whose byte-level vocabulary of
512 tokens and random weights wander through everything a schema allows: 2,400
completions at random temperatures.
"""
import concurrent.futures
import json
import random
import re

import jsonschema
import openai

from common import T, check, error_of, post_json, short

# Each supported kind of schema (docs/structured_outputs.md) at least once.
SCHEMAS = [
    ("object_required", {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 16},
                       "age": {"type": "integer", "minimum": 0, "maximum": 130},
                       "member": {"type": "boolean"}},
        "required": ["name", "age"], "additionalProperties": False}),
    ("enum_const_null", {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue", 7, None]},
                       "kind": {"const": "fruit"},
                       "note": {"type": ["string", "null"], "maxLength": 10}},
        "required": ["color", "kind", "note"], "additionalProperties": False}),
    ("any_of_one_of", {
        "type": "object",
        "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 10, "maximum": 99},
                                           {"type": "string", "minLength": 2, "maxLength": 4}]},
                       "shape": {"oneOf": [{"const": "circle"}, {"const": "square"}]}},
        "required": ["value", "shape"], "additionalProperties": False}),
    ("all_of_objects", {
        "allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                  {"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"]}]}),
    ("arrays", {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                                "minItems": 1, "maxItems": 3},
                       "point": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}],
                                 "items": False}},
        "required": ["tags", "point"], "additionalProperties": False}),
    ("string_formats", {
        "type": "object",
        "properties": {"day": {"type": "string", "format": "date"},
                       "at": {"type": "string", "format": "time"},
                       "when": {"type": "string", "format": "date-time"},
                       "id": {"type": "string", "format": "uuid"},
                       "mail": {"type": "string", "format": "email"}},
        "required": ["day", "at", "when", "id", "mail"], "additionalProperties": False}),
    ("pattern_lengths", {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
                       "word": {"type": "string", "minLength": 3, "maxLength": 5}},
        "required": ["code", "word"], "additionalProperties": False}),
    ("number_bounds", {
        "type": "object",
        "properties": {"n": {"type": "integer", "exclusiveMinimum": -5, "exclusiveMaximum": 1000},
                       "x": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["n", "x"], "additionalProperties": False}),
    ("ref_defs_recursive", {
        "$defs": {"node": {"type": "object",
                           "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                          "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                   "maxItems": 2}},
                           "required": ["v"], "additionalProperties": False}},
        "$ref": "#/$defs/node"}),
    ("additional_schema", {
        "type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
        "additionalProperties": {"type": "string", "maxLength": 5}}),
    ("top_level_array", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4}),
    ("empty_schema_any", {}),
]

# Keywords the compiler refuses (fail closed), each in a schema of its own.
REFUSED = [
    ("multipleOf", {"type": "integer", "multipleOf": 3}),
    ("patternProperties", {"type": "object", "patternProperties": {"^x": {"type": "string"}}}),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}),
    ("if", {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}),
    ("not", {"not": {"type": "string"}}),
    ("contains", {"type": "array", "contains": {"type": "integer"}}),
    ("minProperties", {"type": "object", "minProperties": 2}),
    ("propertyNames", {"type": "object", "propertyNames": {"maxLength": 3}}),
]

VALIDATORS = {}


def validator(schema_name, schema):
    if schema_name not in VALIDATORS:
        cls = jsonschema.Draft202012Validator
        cls.check_schema(schema)
        VALIDATORS[schema_name] = cls(schema, format_checker=cls.FORMAT_CHECKER)
    return VALIDATORS[schema_name]


def schema_format(name, schema):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def client(srv, timeout=120):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=T(timeout), max_retries=0)


def check_choice(name, schema, text, finish, what):
    """A choice under schema: valid when it stopped; otherwise only the length limit cut it."""
    check(finish in ("stop", "length"), f"{what}: finish_reason {finish!r}")
    if finish != "stop":
        return False
    try:
        value = json.loads(text)
    except ValueError as e:
        raise AssertionError(f"{what}: not JSON ({e}): {short(text)}")
    errors = sorted(validator(name, schema).iter_errors(value), key=str)
    check(not errors, f"{what}: invalid under schema {name}: {errors[0].message if errors else ''}: {short(text)}")
    return True


def run_schema_sweep(srv, per_schema, max_tokens, prompt, workers=8, seed=0):
    """per_schema choices of every schema at random temperatures (0 to 1.5), four a request,
    validated; returns (stopped, cut by length)."""
    rng = random.Random(seed)
    jobs = []
    for name, schema in SCHEMAS:
        for k in range(per_schema // 4):
            jobs.append((name, schema, round(rng.uniform(0, 1.5), 2), rng.randrange(1 << 30)))

    def one(job):
        name, schema, temp, s = job
        c = client(srv)
        r = c.chat.completions.create(
            model="x", messages=[{"role": "user", "content": prompt + json.dumps(schema)}],
            response_format=schema_format(name, schema), temperature=temp, seed=s, n=4,
            max_tokens=max_tokens)
        out = []
        for ch in r.choices:
            out.append(check_choice(name, schema, ch.message.content, ch.finish_reason,
                                    f"schema {name} temperature {temp} seed {s} choice {ch.index}"))
        return out

    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        results = [x for res in ex.map(one, jobs, timeout=T(900)) for x in res]
    return sum(results), len(results) - sum(results)


# ---------------------------------------------------------------------------------------
# real model

def test_schema_sweep_real(srv):
    stopped, cut = run_schema_sweep(srv, 12, 160, "Reply with JSON matching this schema: ", seed=1)
    total = stopped + cut
    print(f"  real model: {stopped} of {total} schema completions stopped and validated, {cut} cut by length")
    check(stopped >= total * 3 // 4, f"only {stopped} of {total} completions ended before the length limit")


def test_json_object(srv):
    c = client(srv)
    for temp in (0, 0.9):
        r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "Describe a cat as JSON."}],
                                      response_format={"type": "json_object"}, temperature=temp, seed=3,
                                      max_tokens=120)
        ch = r.choices[0]
        if ch.finish_reason == "stop":
            check(isinstance(json.loads(ch.message.content), dict), f"json_object: {short(ch.message.content)}")
        else:
            check(ch.finish_reason == "length", f"json_object finish {ch.finish_reason}")


def test_schema_streaming(srv):
    name, schema = SCHEMAS[0]
    c = client(srv)
    stream = c.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "A library member as JSON."}],
        response_format=schema_format(name, schema), temperature=0.7, seed=11, max_tokens=120, stream=True)
    text, finish = "", None
    for chunk in stream:
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    check(check_choice(name, schema, text, finish, "streamed"), f"streamed choice cut by length: {short(text)}")


def test_length_limit(srv):
    name, schema = SCHEMAS[0]
    r = client(srv).chat.completions.create(
        model="x", messages=[{"role": "user", "content": "A person as JSON."}],
        response_format=schema_format(name, schema), temperature=0, max_tokens=3)
    ch = r.choices[0]
    check(ch.finish_reason == "length", f"3 tokens of a schema: finish {ch.finish_reason!r}: {short(ch.message.content)}")


def test_llama_server_fields(srv):
    # json_schema as a request field, on chat and on completions
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 3,
              "maxItems": 3}
    r = client(srv).chat.completions.create(model="x", messages=[{"role": "user", "content": "Three digits."}],
                                            temperature=0.5, seed=5, max_tokens=40,
                                            extra_body={"json_schema": schema})
    check_choice("digits", schema, r.choices[0].message.content, r.choices[0].finish_reason, "json_schema field")
    r = client(srv).completions.create(model="x", prompt="Digits: ", temperature=0.5, seed=6, max_tokens=40,
                                       extra_body={"json_schema": schema})
    check_choice("digits", schema, r.choices[0].text, r.choices[0].finish_reason, "json_schema on completions")
    # GBNF grammar, which ends the choice as soon as nothing can extend it
    r = client(srv).chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Is the sky blue?"}], temperature=1.0, seed=7,
        max_tokens=20, extra_body={"grammar": 'root ::= ("yes" | "no") ", " [a-z]{3,6} "."'})
    ch = r.choices[0]
    check(ch.finish_reason == "stop" and re.fullmatch(r"(yes|no), [a-z]{3,6}\.", ch.message.content),
          f"grammar: {ch.finish_reason} {short(ch.message.content)}")


def test_refused_keywords(srv):
    c = client(srv)
    for kw, schema in REFUSED:
        try:
            c.chat.completions.create(model="x", messages=[{"role": "user", "content": "x"}],
                                      response_format=schema_format("s", schema), max_tokens=4)
            raise AssertionError(f"schema with {kw}: accepted")
        except openai.BadRequestError as e:
            err = error_of(e.response.json())
            check(kw in err["message"] and err["param"] == "response_format.json_schema.schema",
                  f"schema with {kw}: {short(err)}")


def test_bad_grammar(srv):
    r = post_json(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                               "grammar": "root ::= item\nitem ::= [a-"})
    check(r.status_code == 400, f"malformed GBNF: status {r.status_code}")
    err = error_of(r.json())
    check(err["param"] == "grammar" and "line 2" in err["message"], f"malformed GBNF: {short(err)}")
    r = post_json(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                               "grammar": "root ::= other"})
    check(r.status_code == 400 and "other" in error_of(r.json())["message"],
          f"undefined rule: {r.status_code} {short(r.text)}")


def test_concurrent_mixed(srv):
    """16 streams at once, half under a schema (sampled), half free and greedy: every
    constrained output is valid, every free one equals the same request alone."""
    name, schema = SCHEMAS[0]
    free_prompts = [f"Write one sentence about the number {i * 11 + 2}." for i in range(8)]

    def free(p):
        r = client(srv).chat.completions.create(model="x", messages=[{"role": "user", "content": p}],
                                                temperature=0, max_tokens=24)
        return r.choices[0].message.content, r.choices[0].finish_reason

    def constrained(i):
        r = client(srv).chat.completions.create(
            model="x", messages=[{"role": "user", "content": f"Person number {i} as JSON."}],
            response_format=schema_format(name, schema), temperature=0.8, seed=100 + i, max_tokens=120)
        ch = r.choices[0]
        return check_choice(name, schema, ch.message.content, ch.finish_reason, f"concurrent constrained #{i}")

    alone = [free(p) for p in free_prompts]
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        fut_free = [ex.submit(free, p) for p in free_prompts]
        fut_con = [ex.submit(constrained, i) for i in range(8)]
        together = [f.result(timeout=T(300)) for f in fut_free]
        [f.result(timeout=T(300)) for f in fut_con]
    diffs = [i for i in range(8) if alone[i] != together[i]]
    check(not diffs, f"{len(diffs)} free requests differ beside constrained ones, e.g. #{diffs[0]}: "
                     f"{short(alone[diffs[0]])} vs {short(together[diffs[0]])}" if diffs else "")


def real_tests():
    return [
        ("structured_schema_sweep_real", test_schema_sweep_real),
        ("structured_json_object", test_json_object),
        ("structured_schema_streaming", test_schema_streaming),
        ("structured_length_limit", test_length_limit),
        ("structured_llama_server_fields", test_llama_server_fields),
        ("structured_refused_keywords_400", test_refused_keywords),
        ("structured_bad_grammar_400", test_bad_grammar),
        ("structured_concurrent_16_half_constrained", test_concurrent_mixed),
    ]


# ---------------------------------------------------------------------------------------
# tiny random model

def test_schema_sweep_tiny(srv):
    stopped, cut = run_schema_sweep(srv, 200, 200, "", workers=8, seed=2)
    total = stopped + cut
    print(f"  tiny random model: {stopped} of {total} schema completions stopped and validated, {cut} cut by length")
    check(stopped >= total // 2, f"only {stopped} of {total} completions ended before the length limit")


def tiny_tests():
    return [("structured_schema_sweep_tiny_random", test_schema_sweep_tiny)]

"""make_schema_goldens.py - instances and their validity for tests/test_json_schema.c.

For every schema below it writes tests/grammar/schema_cases.json: the schema, hand-written
valid and invalid instances, random instances generated from the schema and random
mutations of them, and the verdict of the reference validator (jsonschema, pinned in
tools/requirements-schema.txt, Draft 2020-12 with format checking). Instances are written in
the compiled grammar's form: properties in schema order, compact or with one space or a
newline and indentation between tokens, non-ASCII characters raw.

"strict": false marks a mutated instance the reference accepts but that may lie outside the
grammar's documented subset (an integer written 1.0, -0, escapes); the C test then only
checks that the grammar does not accept what the reference rejects.

    build/schema-venv/bin/python tools/make_schema_goldens.py
"""
import json
import random
import sys

import jsonschema

V = jsonschema.Draft202012Validator

CASES = [
    ("string", {"type": "string"}, ["", "abc", "é\"\\\n\u0001/"], [1, None, ["a"]]),
    ("number", {"type": "number"}, [0, -1.5, 3.25e10, 12], ["1", None, True]),
    ("integer", {"type": "integer"}, [0, -7, 123456789], [1.5, "3", None]),
    ("boolean", {"type": "boolean"}, [True, False], [0, "true", None]),
    ("null", {"type": "null"}, [None], [0, False, ""]),
    ("type_list", {"type": ["string", "null"]}, ["x", None], [1, True, []]),
    ("empty_schema", {}, [1, "a", None, {"a": [1, {"b": None}]}, [], True], []),
    ("true_schema", True, [1, "x", {"k": [True]}], []),
    ("object_required", {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                         "required": ["name", "age"], "additionalProperties": False},
     [{"name": "a", "age": 3}], [{"name": "a"}, {"age": 3}, {"name": "a", "age": "3"}, {"name": "a", "age": 3, "x": 1}, {}]),
    ("object_optional", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                                                          "c": {"type": "boolean"}}, "additionalProperties": False},
     [{}, {"a": 1}, {"b": "x"}, {"c": True}, {"a": 1, "c": False}, {"a": 1, "b": "", "c": True}],
     [{"d": 1}, {"a": "1"}, {"c": None}, []]),
    ("object_mixed", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                                                       "c": {"type": "boolean"}}, "required": ["b"],
                      "additionalProperties": False},
     [{"b": "x"}, {"a": 1, "b": "x"}, {"b": "y", "c": True}, {"a": 0, "b": "", "c": False}],
     [{}, {"a": 1}, {"a": 1, "c": True}, {"b": 1}]),
    ("additional_true", {"type": "object", "properties": {"a": {"type": "integer"}}},
     [{}, {"a": 1}, {"a": 1, "zz": [1, "x"]}, {"b": None}, {"ab": 1}, {"": 2}], [{"a": "x"}, {"a": 1, "a2": 1, "q": {"r": 1}, "s": "t"} if False else {"a": None}]),
    ("additional_schema", {"type": "object", "properties": {"id": {"type": "integer"}},
                           "additionalProperties": {"type": "string"}},
     [{"id": 1}, {"id": 1, "x": "y"}, {"x": "y", "zz": "w"}, {"i": "s"}, {"idd": "s"}], [{"x": 1}, {"id": 1, "x": None}]),
    ("required_undeclared", {"type": "object", "required": ["k"], "additionalProperties": {"type": "integer"}},
     [{"k": 1}, {"k": 2, "j": 3}], [{}, {"k": "x"}, {"j": 1}]),
    ("no_type_properties", {"properties": {"a": {"type": "integer"}}, "additionalProperties": False},
     [{"a": 1}, {}, "str", 3, None, [1]], [{"a": "x"}, {"b": 1}]),
    ("enum", {"enum": ["red", "green", 3, None, [1, 2], {"k": "v"}]},
     ["red", "green", 3, None, [1, 2], {"k": "v"}], ["blue", 4, [1], {"k": "w"}, "Red"]),
    ("enum_typed", {"type": "string", "enum": ["a", "b", 1]}, ["a", "b"], [1, "c"]),
    ("const", {"const": "fixed"}, ["fixed"], ["fixe", "fixed ", None]),
    ("const_object", {"const": {"a": [True, None]}}, [{"a": [True, None]}], [{"a": [True]}, {}]),
    ("anyof", {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]}, [1, "ab", ""], ["abc", None, 1.5]),
    ("oneof", {"oneOf": [{"type": "boolean"}, {"type": "null"}]}, [True, None], [0, "x"]),
    ("allof_merge", {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                               {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
     [{"a": 1, "b": "x"}, {"a": 1, "b": "x", "c": None}], [{"a": 1}, {"b": "x"}, {"a": "1", "b": "x"}]),
    ("allof_single", {"allOf": [{"type": "integer", "minimum": 3}], "description": "d"}, [3, 10], [2, "x"]),
    ("array_items", {"type": "array", "items": {"type": "integer"}}, [[], [1], [1, 2, 3]], [[1, "a"], ["a"], {}, [None]]),
    ("array_bounds", {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 3},
     [["a", "b"], ["a", "b", "c"]], [[], ["a"], ["a", "b", "c", "d"], ["a", 1]]),
    ("array_any", {"type": "array"}, [[], [1, "a", None, [2], {"k": 1}]], [{}, "[]"]),
    ("prefix_items", {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
     [[], ["a"], ["a", 1]], [[1], ["a", "b"], ["a", 1, 2]]),
    ("prefix_items_rest", {"type": "array", "prefixItems": [{"type": "boolean"}], "items": {"type": "null"},
                           "minItems": 2, "maxItems": 4},
     [[True, None], [False, None, None, None]], [[True], [True, 1], [None, None], [True, None, None, None, None]]),
    ("string_length", {"type": "string", "minLength": 2, "maxLength": 4}, ["ab", "abcd", "éé", "\n\""],
     ["a", "abcde", ""]),
    ("string_min", {"type": "string", "minLength": 3}, ["abc", "abcdefgh"], ["ab", ""]),
    ("pattern_anchored", {"type": "string", "pattern": "^[a-z]{2,4}-\\d+$"}, ["ab-1", "abcd-123"],
     ["a-1", "ab-", "AB-1", "ab-1x", "xabcd-1"]),
    ("pattern_search", {"type": "string", "pattern": "fo+"}, ["foo", "xfoy", "fo"], ["f", "of", ""]),
    ("pattern_escape", {"type": "string", "pattern": "^a\"b\\\\c$"}, ["a\"b\\c"], ["ab\\c", "a\"bc"]),
    ("pattern_alt", {"type": "string", "pattern": "^(cat|dog)s?$|^bird$"}, ["cat", "dogs", "bird"],
     ["birds", "cow", "catdog"]),
    ("format_date", {"type": "string", "format": "date"}, ["2024-02-29", "1999-12-31", "2000-02-29", "0001-01-01"],
     ["2023-02-29", "1900-02-29", "2024-13-01", "2024-04-31", "24-01-01", "2024-1-01", "0000-01-01"]),
    ("format_time", {"type": "string", "format": "time"}, ["12:34:56Z", "23:59:59.123+05:30", "00:00:00-01:00"],
     ["24:00:00Z", "12:60:00Z", "12:34:56", "1:02:03Z"]),
    ("format_date_time", {"type": "string", "format": "date-time"}, ["2024-01-15T10:20:30Z", "2020-02-29T00:00:00.5+01:00"],
     ["2024-01-15 10:20:30Z", "2024-01-15T10:20:30", "2021-02-29T00:00:00Z"]),
    ("format_uuid", {"type": "string", "format": "uuid"}, ["123e4567-e89b-12d3-a456-426614174000", "00000000-0000-0000-0000-000000000000"],
     ["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400", "g23e4567-e89b-12d3-a456-426614174000"]),
    ("format_email", {"type": "string", "format": "email"}, ["a@b.co", "first.last+tag@mail.example.org"],
     ["plain", "", "a b"]),
    ("integer_range", {"type": "integer", "minimum": 18, "maximum": 130}, [18, 19, 99, 100, 129, 130],
     [17, 131, 0, -18, 1000, 9]),
    ("integer_negative", {"type": "integer", "minimum": -25, "maximum": -3}, [-25, -3, -10, -19], [-26, -2, 0, 3, -100]),
    ("integer_exclusive", {"type": "integer", "exclusiveMinimum": -1, "exclusiveMaximum": 1000}, [0, 1, 999, 500],
     [-1, 1000, -5, 10000]),
    ("integer_min_only", {"type": "integer", "minimum": 250}, [250, 251, 999, 1000, 123456], [249, 0, -250, 99]),
    ("integer_max_only", {"type": "integer", "maximum": -7}, [-7, -8, -70, -1000000], [-6, 0, 7, 70]),
    ("integer_fractional_bounds", {"type": "integer", "minimum": 1.5, "exclusiveMaximum": 4.5}, [2, 3, 4], [1, 5]),
    ("number_range", {"type": "number", "minimum": 0, "maximum": 10}, [0, 10, 5.5, 0.001, 9.999, 10.0],
     [-0.5, 10.5, 11, -1, 10.001]),
    ("number_exclusive", {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, [0.5, 0.001, 0.999],
     [0, 1, 1.5, -0.5, 0.0]),
    ("number_negative", {"type": "number", "minimum": -5, "exclusiveMaximum": -2}, [-5, -4.5, -2.001, -3],
     [-5.1, -2, -1, 0, 3]),
    ("ref_defs", {"$defs": {"pos": {"type": "integer", "minimum": 1}},
                  "type": "object", "properties": {"n": {"$ref": "#/$defs/pos"}}, "required": ["n"],
                  "additionalProperties": False}, [{"n": 1}, {"n": 42}], [{"n": 0}, {}, {"n": "1"}]),
    ("ref_definitions", {"definitions": {"s": {"type": "string"}}, "type": "array", "items": {"$ref": "#/definitions/s"}},
     [[], ["a", "b"]], [[1]]),
    ("ref_recursive", {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
     [{"v": 1}, {"v": 1, "kids": []}, {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}],
     [{"kids": []}, {"v": 1, "kids": [{}]}, {"v": 1, "kids": [{"v": "x"}]}]),
    ("nested", {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "name": {"type": "string"}, "emails": {"type": "array", "items": {"type": "string", "format": "email"}, "maxItems": 2}},
        "required": ["name"], "additionalProperties": False}}, "required": ["user"], "additionalProperties": False},
     [{"user": {"name": "x"}}, {"user": {"name": "x", "emails": ["a@b.cd"]}}],
     [{"user": {}}, {"user": {"name": "x", "emails": ["a@b.cd", "c@d.ef", "e@f.gh"]}}, {}]),
    ("annotations", {"title": "T", "description": "D", "examples": [1], "$comment": "c", "default": 1,
                     "$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "https://example.com/s",
                     "deprecated": False, "readOnly": False, "writeOnly": False, "type": "integer"}, [1, -2], ["1"]),
    ("false_property", {"type": "object", "properties": {"a": False, "b": {"type": "integer"}}},
     [{}, {"b": 1}, {"c": 1}], [{"a": 1}, {"b": 1, "a": 1}]),
    ("openai_strict", {"type": "object", "properties": {
        "location": {"type": "string", "description": "City"}, "unit": {"type": ["string", "null"], "enum": ["C", "F", None]}},
        "required": ["location", "unit"], "additionalProperties": False},
     [{"location": "Paris", "unit": "C"}, {"location": "", "unit": None}],
     [{"location": "Paris"}, {"location": "Paris", "unit": "K"}, {"unit": "C", "location": "Paris"} if False else {"location": 1, "unit": "C"}]),
]


def resolve(root, ref):
    node = root
    for tok in ref[2:].split("/") if ref != "#" else []:
        node = node[tok.replace("~1", "/").replace("~0", "~")]
    return node


def rand_string(rng, lo=0, hi=6):
    alphabet = "abcxyz XYZ019_-é\"\\\n/"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


def generate(rng, root, s, depth=0):
    """A random instance of s (None when s has nothing this generator can produce)."""
    if s is True or s == {}:
        return rng.choice([1, "v", None, True, [1], {"k": 2}])
    if s is False or depth > 6:
        raise ValueError
    if "$ref" in s:
        return generate(rng, root, resolve(root, s["$ref"]), depth + 1)
    if "const" in s:
        return s["const"]
    if "enum" in s:
        return rng.choice(s["enum"])
    for k in ("anyOf", "oneOf"):
        if k in s:
            return generate(rng, root, rng.choice(s[k]), depth + 1)
    if "allOf" in s:
        merged = {"type": "object", "properties": {}, "required": []}
        for m in s["allOf"]:
            if "properties" not in m and "required" not in m:
                return generate(rng, root, m, depth + 1)
            merged["properties"].update(m.get("properties", {}))
            merged["required"] += m.get("required", [])
        return generate(rng, root, merged, depth + 1)
    if "pattern" in s:
        raise ValueError
    types = s.get("type", ["null", "boolean", "object", "array", "string", "number"])
    t = rng.choice(types if isinstance(types, list) else [types])
    if t == "null":
        return None
    if t == "boolean":
        return rng.random() < 0.5
    if t == "integer" or t == "number":
        lo = s.get("minimum", s.get("exclusiveMinimum", -1000))
        hi = s.get("maximum", s.get("exclusiveMaximum", 1000))
        v = rng.randint(int(lo) - 1, int(hi) + 1)
        if t == "number" and rng.random() < 0.5:
            v = v + rng.choice([0.5, 0.25, 0.125])
        return v
    if t == "string":
        fmt = s.get("format")
        if fmt == "date":
            return "%04d-%02d-%02d" % (rng.randint(1, 2999), rng.randint(1, 12), rng.randint(1, 28))
        if fmt == "time":
            return "%02d:%02d:%02dZ" % (rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59))
        if fmt == "date-time":
            return "%04d-%02d-%02dT%02d:%02d:%02d+02:00" % (rng.randint(1, 2999), rng.randint(1, 12),
                                                            rng.randint(1, 28), rng.randint(0, 23),
                                                            rng.randint(0, 59), rng.randint(0, 59))
        if fmt == "uuid":
            return "%08x-%04x-%04x-%04x-%012x" % tuple(rng.getrandbits(b) for b in (32, 16, 16, 16, 48))
        if fmt == "email":
            return rand_string(rng, 1, 5).replace(" ", "").replace("\"", "") .replace("\\", "").replace("\n", "").replace("é", "e").replace("/", "a") + "x@ex.com"
        lo = s.get("minLength", 0)
        return rand_string(rng, lo, s.get("maxLength", lo + 6))
    if t == "array":
        pre = s.get("prefixItems", [])
        items = s.get("items", True)
        n = rng.randint(s.get("minItems", 0), s.get("maxItems", len(pre) + 3))
        if items is False:
            n = min(n, len(pre))
        return [generate(rng, root, pre[i] if i < len(pre) else items, depth + 1) for i in range(n)]
    if t == "object":
        out = {}
        req = s.get("required", [])
        for k, sub in s.get("properties", {}).items():
            if sub is not False and (k in req or rng.random() < 0.6):
                out[k] = generate(rng, root, sub, depth + 1)
        addl = s.get("additionalProperties", True)
        for k in req:
            if k not in out:
                out[k] = generate(rng, root, addl, depth + 1)
        if addl is not False and rng.random() < 0.3:
            out["extra_" + str(rng.randint(0, 9))] = generate(rng, root, addl, depth + 1)
        return out
    raise ValueError


def mutate(rng, v, depth=0):
    """A random change somewhere in v."""
    if isinstance(v, dict) and v and rng.random() < 0.7:
        k = rng.choice(list(v))
        w = dict(v)
        r = rng.random()
        if r < 0.3:
            del w[k]
        elif r < 0.5:
            w["zz"] = 1
        else:
            w[k] = mutate(rng, v[k], depth + 1)
        return w
    if isinstance(v, list) and v and rng.random() < 0.7:
        w = list(v)
        i = rng.randrange(len(w))
        r = rng.random()
        if r < 0.3:
            del w[i]
        elif r < 0.5:
            w.append(w[i])
        else:
            w[i] = mutate(rng, w[i], depth + 1)
        return w
    if isinstance(v, bool) or v is None:
        return rng.choice([0, "x", not v if isinstance(v, bool) else True])
    if isinstance(v, (int, float)):
        return rng.choice([v + 1, v - 1, -v, v * 10, v + 0.5, str(v), None])
    if isinstance(v, str):
        return rng.choice([v + "x", v[:-1], v.upper(), 1, "", v + v])
    return None


def dumps(v, style):
    if style == 0:
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    if style == 1:
        return json.dumps(v, ensure_ascii=False)
    return json.dumps(v, ensure_ascii=False, indent=2)


def main():
    rng = random.Random(1234)
    out = []
    for name, schema, valid, invalid in CASES:
        val = V(schema, format_checker=V.FORMAT_CHECKER)
        insts = []
        seen = set()

        def add(v, expect, strict, style):
            text = dumps(v, style)
            if text in seen:
                return
            seen.add(text)
            ok = val.is_valid(v)
            if expect is not None and ok != expect:
                sys.exit(f"{name}: {text} is {'valid' if ok else 'invalid'} by jsonschema, the case says otherwise")
            insts.append({"text": text, "valid": ok, "strict": strict})

        for i, v in enumerate(valid):
            add(v, True, True, i % 3)
        for i, v in enumerate(invalid):
            add(v, False, True, i % 3)
        generated = []
        for _ in range(40):
            try:
                v = generate(rng, schema, schema)
            except (ValueError, KeyError):
                break
            generated.append(v)
            add(v, None, True, rng.randrange(3))
        for v in (generated + valid) * 2:
            add(mutate(rng, v), None, False, rng.randrange(3))
        # a truncated document is never a value
        for v in valid[:3]:
            text = dumps(v, 0)
            if len(text) > 1 and text[-1] in "\"]}":
                insts.append({"text": text[:-1], "valid": False, "strict": True})
        out.append({"name": name, "schema": schema, "instances": insts})
    with open("tests/grammar/schema_cases.json", "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n = sum(len(c["instances"]) for c in out)
    print(f"{len(out)} schemas, {n} instances")


if __name__ == "__main__":
    main()

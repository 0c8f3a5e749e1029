/*
 * test_json_schema.c - JSON Schema -> GBNF (sampling/json_schema.h) against an independent
 * reference: for every schema of tests/grammar/schema_cases.json (written by
 * tools/make_schema_goldens.py with the pinned jsonschema validator) the compiled grammar
 * parses in the grammar engine and accepts the instances jsonschema calls valid and rejects
 * those it calls invalid. Random sentences drawn from each grammar must be JSON that the
 * grammar accepts again. Then refusals (every unsupported keyword named with its pointer),
 * malformed schemas, hostile schemas (bounded work, clear errors), prefixes, and the public
 * wrapper.
 */
#include "harness.h"

#include "grammar_walk.h"
#include "sampling/json_schema.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static grammar_vocab *vocab;

/* ==== Reference instances ==== */

static void check_case(const json_t *c, int *n_inst, int *n_walk) {
    const char *name = json_string_value(json_object_get(c, "name"));
    char *text = NULL;
    celer_error e;
    celer_status st = json_schema_to_gbnf(json_object_get(c, "schema"), "root", "", &text, &e);
    if (!CHECK(st == CELER_OK, "%s: compiles: %s", name, st == CELER_OK ? "" : e.msg)) return;
    grammar *g = NULL;
    st = grammar_parse(text, strlen(text), &g, &e);
    if (!CHECK(st == CELER_OK, "%s: the grammar parses: %s\n%s", name, st == CELER_OK ? "" : e.msg,
               text)) {
        free(text);
        return;
    }
    const json_t *insts = json_object_get(c, "instances");
    int bad = 0;
    for (size_t i = 0; i < json_array_size(insts); i++) {
        const json_t *x = json_array_get(insts, i);
        const char *s = json_string_value(json_object_get(x, "text"));
        bool valid = json_is_true(json_object_get(x, "valid"));
        bool strict = json_is_true(json_object_get(x, "strict"));
        bool acc = walk_accepts(g, vocab, s, strlen(s));
        bool ok = valid ? (acc || !strict) : !acc;
        if (!ok && bad++ < 3)
            CHECK(false, "%s: %s is %s by jsonschema, the grammar %s it", name, s,
                  valid ? "valid" : "invalid", acc ? "accepts" : "rejects");
        (*n_inst)++;
    }
    CHECK(bad == 0, "%s: %d of %zu instances disagree with jsonschema", name, bad,
          json_array_size(insts));
    /* The reverse direction: sentences of the grammar are JSON values. */
    uint64_t rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)strlen(name);
    char buf[600];
    int not_json = 0;
    for (int w = 0; w < 30; w++) {
        long n = walk_sentence(g, vocab, &rng, buf, sizeof buf);
        if (n < 0) continue;
        json_error_t je;
        json_t *v = json_loadb(buf, (size_t)n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!v && not_json++ < 2)
            CHECK(false, "%s: sentence %s is not JSON: %s", name, buf, je.text);
        json_decref(v);
        (*n_walk)++;
    }
    CHECK(not_json == 0, "%s: every sentence drawn from the grammar is JSON", name);
    grammar_free(g);
    free(text);
}

static void check_cases(void) {
    json_error_t je;
    json_t *cases = json_load_file("tests/grammar/schema_cases.json", 0, &je);
    if (!CHECK(cases != NULL, "tests/grammar/schema_cases.json: %s", je.text)) return;
    int n_inst = 0, n_walk = 0;
    for (size_t i = 0; i < json_array_size(cases); i++)
        check_case(json_array_get(cases, i), &n_inst, &n_walk);
    CHECK(json_array_size(cases) >= 40, "at least 40 schemas (%zu)", json_array_size(cases));
    printf("schema cases: %zu schemas, %d instances against jsonschema, %d sentences drawn\n",
           json_array_size(cases), n_inst, n_walk);
    json_decref(cases);
}

/* ==== Refusals and malformed schemas ==== */

static void expect_error(const char *schema_text, const char *want) {
    json_error_t je;
    json_t *s = json_loads(schema_text, JSON_DECODE_ANY, &je);
    if (!CHECK(s != NULL, "test schema parses: %s", schema_text)) return;
    char *text = NULL;
    celer_error e = {{0}};
    celer_status st = json_schema_to_gbnf(s, "root", "", &text, &e);
    CHECK(st != CELER_OK && text == NULL && strstr(e.msg, want),
          "%s: error containing '%s', got '%s'", schema_text, want,
          st == CELER_OK ? "(compiled)" : e.msg);
    free(text);
    json_decref(s);
}

static void check_refusals(void) {
    static const char *const kw[] = {"multipleOf",
                                     "patternProperties",
                                     "propertyNames",
                                     "dependentRequired",
                                     "dependentSchemas",
                                     "if",
                                     "then",
                                     "else",
                                     "not",
                                     "uniqueItems",
                                     "contains",
                                     "minContains",
                                     "maxContains",
                                     "minProperties",
                                     "maxProperties",
                                     "unevaluatedProperties",
                                     "unevaluatedItems",
                                     "additionalItems",
                                     "dependencies",
                                     "$anchor",
                                     "$dynamicRef",
                                     "contentEncoding",
                                     "x-custom"};
    for (size_t i = 0; i < sizeof kw / sizeof *kw; i++) {
        char schema[256], want[256];
        snprintf(schema, sizeof schema,
                 "{\"type\":\"object\",\"properties\":{\"age\":{\"type\":\"integer\",\"%s\":2}}}",
                 kw[i]);
        snprintf(want, sizeof want, "schema: \"/properties/age/%s\": keyword %s is not supported",
                 kw[i], kw[i]);
        expect_error(schema, want);
    }
    expect_error("{\"$ref\":\"https://example.com/s.json\"}",
                 "\"/$ref\": $ref to https://example.com/s.json is not supported");
    expect_error("{\"$ref\":\"#/$defs/missing\"}", "$ref target #/$defs/missing not found");
    expect_error("{\"type\":\"number\",\"minimum\":0.5}", "non-integral bound on type number");
    expect_error("{\"type\":\"string\",\"format\":\"hostname\"}",
                 "\"/format\": format hostname is not supported");
    expect_error("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}",
                 "\"/pattern\": regex at offset 3: backreference \\1");
    expect_error("{\"type\":\"string\",\"pattern\":\"a(?=b)\"}", "lookahead is not supported");
    expect_error("{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}",
                 "pattern together with minLength/maxLength");
    expect_error("{\"items\":[{\"type\":\"string\"}]}", "items as an array");
    expect_error("{\"allOf\":[{\"type\":\"string\"},{\"minLength\":2}]}",
                 "keyword type in allOf is not supported");
    expect_error("{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"string\"}}},{\"properties\":{"
                 "\"a\":{\"type\":\"integer\"}}}]}",
                 "define property a differently");
    expect_error("{\"anyOf\":[{\"type\":\"string\"}],\"minLength\":2}",
                 "keyword minLength beside anyOf is not supported");
    expect_error("{\"$ref\":\"#/$defs/a\",\"minimum\":1,\"$defs\":{\"a\":{}}}",
                 "keyword minimum beside $ref");
    expect_error("false", "schema accepts no value");
    expect_error("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "schema accepts no value");
    /* malformed */
    expect_error("{\"type\":3}", "\"/type\": type must be one of");
    expect_error("{\"type\":\"str\"}", "type must be one of");
    expect_error("{\"type\":\"object\",\"required\":\"a\"}",
                 "required must be an array of strings");
    expect_error("{\"type\":\"object\",\"required\":[1]}", "required must be an array of strings");
    expect_error("{\"type\":\"array\",\"minItems\":-1}",
                 "\"/minItems\": minItems must be a non-negative integer");
    expect_error("{\"type\":\"array\",\"maxItems\":1.5}",
                 "maxItems must be a non-negative integer");
    expect_error("{\"type\":\"object\",\"properties\":[]}", "properties must be an object");
    expect_error("{\"properties\":{\"a\":3}}",
                 "\"/properties/a\": a schema must be an object or a boolean");
    expect_error("{\"anyOf\":[]}", "anyOf must be a non-empty array");
    expect_error("{\"enum\":3}", "enum must be an array");
    expect_error("{\"type\":\"integer\",\"minimum\":\"3\"}", "minimum must be a number");
    expect_error("{\"type\":\"string\",\"pattern\":5}", "pattern must be a string");
    expect_error("\"string\"", "a schema must be an object or a boolean");
}

/* ==== Hostile schemas ==== */

static void check_hostile(void) {
    expect_error("{\"type\":\"array\",\"maxItems\":1000000000}",
                 "maxItems above 1000 is not supported");
    expect_error("{\"type\":\"string\",\"maxLength\":1001}",
                 "maxLength above 1000 is not supported");
    expect_error("{\"type\":\"integer\",\"maximum\":1e30}", "maximum of 1e18 or more");
    expect_error("{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/"
                 "a\"}},\"$ref\":\"#/$defs/a\"}",
                 "refers back to itself before any JSON token");
    expect_error("{\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/"
                 "a\"},{\"type\":\"null\"}]}},\"$ref\":\"#/$defs/a\"}",
                 "refers back to itself");
    /* deep nesting: 5000 levels of items */
    {
        size_t depth = 1000, cap = depth * 12 + 64;
        char *s = malloc(cap);
        size_t n = 0;
        for (size_t i = 0; i < depth; i++) n += (size_t)snprintf(s + n, cap - n, "{\"items\":");
        n += (size_t)snprintf(s + n, cap - n, "{}");
        for (size_t i = 0; i < depth; i++) s[n++] = '}';
        s[n] = 0;
        json_t *j = json_loads(s, 0, NULL);
        if (j) {
            char *text = NULL;
            celer_error e;
            celer_status st = json_schema_to_gbnf(j, "root", "", &text, &e);
            CHECK(st != CELER_OK && strstr(e.msg, "nested deeper than 64"),
                  "deep nesting refused: %s", st == CELER_OK ? "(compiled)" : e.msg);
            free(text);
            json_decref(j);
        } else {
            SKIP("jansson refuses %zu levels itself", depth);
        }
        free(s);
    }
    /* a huge enum: bounded text or a clear error */
    json_t *big = json_array();
    for (int i = 0; i < 100000; i++) json_array_append_new(big, json_integer(i));
    json_t *sch = json_pack("{s:o}", "enum", big);
    char *text = NULL;
    celer_error e;
    celer_status st = json_schema_to_gbnf(sch, "root", "", &text, &e);
    CHECK(st == CELER_OK ? strlen(text) < ((size_t)4 << 20) : strstr(e.msg, "larger than") != NULL,
          "100000-value enum: bounded grammar or a size error (%s)",
          st == CELER_OK ? "compiled" : e.msg);
    free(text);
    json_decref(sch);
    /* a recursive schema with no base case through a required property: bounded grammar */
    json_t *rec = json_loads(
        "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"n\":{\"$ref\":\"#/$defs/n\"}},"
        "\"required\":[\"n\"]}},\"$ref\":\"#/$defs/n\"}",
        0, NULL);
    st = json_schema_to_gbnf(rec, "root", "", &text, &e);
    CHECK(st == CELER_OK, "recursion through a required property compiles (bounded text)");
    free(text);
    json_decref(rec);
    /* exponential fan-out of $refs: each definition compiled once */
    json_t *defs = json_object();
    for (int i = 0; i < 20; i++) {
        char a[16], b[32];
        snprintf(a, sizeof a, "d%d", i);
        snprintf(b, sizeof b, "#/$defs/d%d", i + 1);
        json_object_set_new(defs, a,
                            i == 19 ? json_pack("{s:s}", "type", "integer")
                                    : json_pack("{s:s,s:[{s:s},{s:s}]}", "type", "array",
                                                "prefixItems", "$ref", b, "$ref", b));
    }
    json_t *fan = json_pack("{s:o,s:s}", "$defs", defs, "$ref", "#/$defs/d0");
    st = json_schema_to_gbnf(fan, "root", "", &text, &e);
    CHECK(st == CELER_OK && strlen(text) < 20000, "20 levels of doubling $refs: %s",
          st == CELER_OK ? "compiled" : e.msg);
    free(text);
    json_decref(fan);
}

/* ==== Prefixes, json_object, the public wrapper ==== */

static void check_prefix_and_wrappers(void) {
    json_t *s = json_loads(
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]}",
        0, NULL);
    char *t1 = NULL, *t2 = NULL;
    celer_error e;
    CHECK(json_schema_to_gbnf(s, "tool-a", "tool-a-", &t1, &e) == CELER_OK, "prefixed compile");
    json_t *s2 = json_loads("{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}", 0, NULL);
    CHECK(json_schema_to_gbnf(s2, "tool-b", "tool-b-", &t2, &e) == CELER_OK,
          "second prefixed compile");
    /* every rule of a prefixed grammar starts with its prefix (or is its root) */
    bool all = true;
    for (const char *l = t1; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l))
        all &= !strncmp(l, "tool-a-", 7) || !strncmp(l, "tool-a ::=", 10);
    CHECK(all, "every rule begins with the prefix:\n%s", t1);
    /* the two joined under one root parse and accept both */
    char *joined = malloc(strlen(t1) + strlen(t2) + 64);
    sprintf(joined, "root ::= tool-a | tool-b\n%s%s", t1, t2);
    grammar *g = NULL;
    CHECK(grammar_parse(joined, strlen(joined), &g, &e) == CELER_OK, "joined grammars parse");
    if (g) {
        CHECK(walk_accepts(g, vocab, "{\"a\":\"x\"}", 9) && walk_accepts(g, vocab, "[1, 2]", 6) &&
                  !walk_accepts(g, vocab, "{}", 2),
              "the joined grammar accepts either schema's values");
        grammar_free(g);
    }
    free(joined), free(t1), free(t2);
    json_decref(s), json_decref(s2);
    CHECK(json_schema_to_gbnf(s, "bad_name", "", &t1, &e) == CELER_STATUS_INVALID_ARGUMENT,
          "root name checked");

    char *obj = NULL;
    CHECK(json_object_gbnf("root", "", &obj, &e) == CELER_OK, "json_object grammar");
    if (obj && grammar_parse(obj, strlen(obj), &g, &e) == CELER_OK) {
        CHECK(walk_accepts(g, vocab, "{\"a\": [1, {\"b\": null}]}", 23),
              "json_object accepts an object");
        CHECK(!walk_accepts(g, vocab, "[1]", 3) && !walk_accepts(g, vocab, "\"s\"", 3),
              "json_object refuses non-objects");
        CHECK(!walk_accepts(g, vocab, "{\"a\":1}  ", 9), "no trailing whitespace");
        CHECK(!walk_accepts(g, vocab, "{  \"a\":1}", 9), "at most one space between tokens");
        CHECK(walk_accepts(g, vocab, "{\n                        \"a\":1}", 32),
              "a newline and 24 spaces");
        CHECK(!walk_accepts(g, vocab, "{\n                         \"a\":1}", 33), "not 25 spaces");
        grammar_free(g);
    }
    free(obj);

    char err[256], *out = NULL;
    CHECK(celer_json_schema_to_grammar("{\"type\":\"integer\",\"minimum\":0}", &out, err,
                                       sizeof err) == CELER_OK &&
              out && strstr(out, "root ::="),
          "public wrapper compiles");
    free(out);
    CHECK(celer_json_schema_to_grammar("{\"type\":", &out, err, sizeof err) ==
                  CELER_STATUS_INVALID_ARGUMENT &&
              !out && strstr(err, "line 1"),
          "public wrapper: malformed JSON names the place: %s", err);
    CHECK(celer_json_schema_to_grammar("{\"not\":{}}", &out, err, sizeof err) ==
                  CELER_STATUS_UNSUPPORTED &&
              strstr(err, "\"/not\": keyword not is not supported"),
          "public wrapper: refusal message: %s", err);
    CHECK(celer_regex_to_grammar("a+b", &out, err, sizeof err) == CELER_OK && out,
          "public regex wrapper");
    free(out);
    CHECK(celer_regex_to_grammar("(?<=a)b", &out, err, sizeof err) == CELER_STATUS_UNSUPPORTED &&
              strstr(err, "lookbehind"),
          "public regex wrapper refusal: %s", err);
}

int main(void) {
    vocab = walk_vocab();
    if (!CHECK(vocab != NULL, "byte vocabulary")) return harness_done("test_json_schema");
    check_cases();
    check_refusals();
    check_hostile();
    check_prefix_and_wrappers();
    grammar_vocab_free(vocab);
    return harness_done("test_json_schema");
}

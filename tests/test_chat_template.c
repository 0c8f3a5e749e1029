/*
 * test_chat_template.c - chat templates against transformers, and the Jinja subset's
 * semantics on their own.
 *
 * Every template of tests/templates (and the two of tests/tokenizers, named "shared:") is
 * rendered over every conversation of conversations.json, with and without
 * add_generation_prompt, and compared byte for byte with golden_<name>.json; a case
 * where the template called raise_exception expects the same message, and one where it failed
 * otherwise (a TypeError on content it does not handle) expects a refusal. Then small templates pin
 * whitespace control, loop variables, namespaces, slices, filters, tojson, and the
 * errors: unknown filter, unclosed block, bad syntax (with line and column), a
 * surfaced raise_exception, a bounded runaway loop.
 */
#define _DEFAULT_SOURCE
#include "harness.h"
#include "tokenizer/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void check_goldens(const char *name, json_t *convs) {
    char path[256];
    snprintf(path, sizeof path, "tests/templates/golden_%s.json", name);
    json_t *g = json_load_file(path, 0, NULL);
    if (!CHECK(g, "%s: cannot read %s", name, path)) return;
    char why[4096] = "";
    char *src = golden_template_source(json_string_value(json_object_get(g, "template")), why);
    if (!src && *why) {
        SKIP_REQUIRED("%s: %s", name, why);
        json_decref(g);
        return;
    }
    if (!CHECK(src, "%s: template %s not found", name, json_string_value(json_object_get(g, "template")))) {
        json_decref(g);
        return;
    }
    chat_template *t;
    celer_error e;
    celer_status st = chat_template_parse(src, strlen(src), &t, &e);
    if (!CHECK(st == CELER_OK, "%s: parse: %s", name, e.msg)) {
        free(src), json_decref(g);
        return;
    }
    json_t *cases = json_object_get(g, "cases");
    size_t n = json_array_size(cases), bad = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *c = json_array_get(cases, i);
        json_t *conv = json_array_get(convs, (size_t)json_integer_value(json_object_get(c, "conversation")));
        json_t *vars = json_deep_copy(json_object_get(conv, "vars"));
        if (!vars) vars = json_object();
        if (json_object_get(conv, "tools")) json_object_set(vars, "tools", json_object_get(conv, "tools"));
        chat_template_opts o = {
            .add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt")),
            .bos_token = json_string_value(json_object_get(g, "bos_token")),
            .eos_token = json_string_value(json_object_get(g, "eos_token")),
            .vars = vars,
        };
        char *out = NULL;
        size_t len = 0;
        st = chat_template_render(t, json_object_get(conv, "messages"), &o, &out, &len, &e);
        const char *want = json_string_value(json_object_get(c, "output"));
        const char *want_err = json_string_value(json_object_get(c, "error"));
        bool ok;
        if (want) {
            ok = st == CELER_OK && len == strlen(want) && !memcmp(out, want, len);
            CHECK(ok, "%s case %zu (%s, agp=%d): %s\n  got:  [%s]\n  want: [%s]", name, i,
                  json_string_value(json_object_get(conv, "name")), o.add_generation_prompt,
                  st == CELER_OK ? "mismatch" : e.msg, st == CELER_OK ? out : "", want);
        } else {
            /* raise_exception (TemplateError): the template's own message; any other exception is
             * Python's wording for input the template does not handle, where refusing is what counts */
            const char *type = json_string_value(json_object_get(c, "error_type"));
            bool own = !type || !strcmp(type, "TemplateError");
            ok = st != CELER_OK && (!own || strstr(e.msg, want_err)) && !strncmp(e.msg, "template line ", 14);
            CHECK(ok, "%s case %zu (%s): want error \"%s\", got %s", name, i,
                  json_string_value(json_object_get(conv, "name")), want_err, st == CELER_OK ? out : e.msg);
        }
        bad += !ok;
        free(out);
        json_decref(vars);
    }
    printf("%s: %zu conversations, %zu mismatches\n", name, n, bad);
    chat_template_free(t);
    free(src);
    json_decref(g);
}

/* Renders src over msgs (JSON text) with bos "<s>"; returns malloc'd output or NULL (e set). */
static char *render_ex(const char *src, const char *msgs, const char *vars, bool agp, celer_error *e) {
    chat_template *t;
    if (chat_template_parse(src, strlen(src), &t, e) != CELER_OK) return NULL;
    json_t *m = json_loads(msgs ? msgs : "[{\"role\": \"user\", \"content\": \"hi\"}]", 0, NULL);
    json_t *v = vars ? json_loads(vars, 0, NULL) : NULL;
    chat_template_opts o = {.add_generation_prompt = agp, .bos_token = "<s>", .eos_token = "</s>", .vars = v};
    char *out = NULL;
    celer_status st = chat_template_render(t, m, &o, &out, NULL, e);
    json_decref(m), json_decref(v);
    chat_template_free(t);
    return st == CELER_OK ? out : NULL;
}

static void expect(const char *src, const char *want) {
    celer_error e = {{0}};
    char *out = render_ex(src, NULL, NULL, false, &e);
    CHECK(out && !strcmp(out, want), "%s\n  got:  [%s]\n  want: [%s]", src, out ? out : e.msg, want);
    free(out);
}

static void expect_vars(const char *src, const char *vars, const char *want) {
    celer_error e = {{0}};
    char *out = render_ex(src, NULL, vars, false, &e);
    CHECK(out && !strcmp(out, want), "%s\n  got:  [%s]\n  want: [%s]", src, out ? out : e.msg, want);
    free(out);
}

static void expect_error(const char *src, const char *want) {
    celer_error e = {{0}};
    char *out = render_ex(src, NULL, NULL, false, &e);
    CHECK(!out && strstr(e.msg, want), "%s\n  got:  [%s]\n  want error containing: [%s]", src, out ? out : e.msg,
          want);
    free(out);
}

static void unit_tests(void) {
    /* whitespace control, trim_blocks, lstrip_blocks, trailing newline */
    expect("a  {{- 'b' -}}  c", "abc");
    expect("a\n  {%- if true %}b{% endif %}", "ab");
    expect("{% if true %}\nx\n{% endif %}\ny", "x\ny");
    expect("  {% if true %}x{% endif %}", "x");
    expect("q  {% if true %}x{% endif %}", "q  x");
    expect("  {{ 'v' }}\n", "  v");
    expect("{# note #}\nz", "z");
    expect("{%+ if true %}x{% endif %}", "x");
    expect("a\n    {% set x = 1 %}\nb", "a\nb");
    expect("line\r\nnext", "line\nnext");
    /* loop variables, else, filters on loops, break/continue, unpacking */
    expect("{% for x in [10, 20, 30] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
           "{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
           "103TrueFalse3;212FalseFalse3;321FalseTrue3;");
    expect("{% for x in [] %}a{% else %}empty{% endfor %}", "empty");
    expect("{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}", "2242");
    expect("{% for x in [1,2,3,4] %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}", "12");
    expect("{% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}", "13");
    expect("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }} {% endfor %}", "a=1 b=2 ");
    expect("{% for x in [1,2] %}{% set y = x %}{% endfor %}{{ y is defined }}", "False");
    expect("{% for c in 'héé' %}[{{ c }}]{% endfor %}", "[h][é][é]");
    /* namespace and set */
    expect("{% set ns = namespace(x=1, s='') %}{% for i in range(3) %}{% set ns.x = ns.x * 2 %}{% endfor %}{{ ns.x }}",
           "8");
    expect("{% set a, b = 1, 2 %}{{ a + b }}", "3");
    expect("{% set blk %}in {{ 'side' }}{% endset %}[{{ blk }}]", "[in side]");
    /* expressions */
    expect("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }}",
           "3 -4 1 2 3.5 1024 7");
    expect("{{ 'a' ~ 1 ~ none ~ true }} {{ 'x' * 3 }} {{ [1] + [2] }}", "a1NoneTrue xxx [1, 2]");
    expect("{{ 1 < 2 < 3 }} {{ 'b' > 'a' }} {{ 1 == 1.0 }} {{ 'a' in 'cat' }} {{ 3 not in [1, 2] }}",
           "True True True True True");
    expect("{{ 'yes' if 0 else 'no' }}|{{ 'x' if false }}|{{ none or 'd' }}|{{ 1 and 2 }}", "no||d|2");
    expect("{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.5e-7 }} {{ -0.5 }}", "1.0 0.30000000000000004 1e+20 1.5e-07 -0.5");
    expect("{{ {'k': [1, 'two', none, true]} }}", "{'k': [1, 'two', None, True]}");
    expect("{{ \"it's\" }} {{ [\"it's\", 'a\"b'] }}", "it's [\"it's\", 'a\"b']");
    /* slices and subscripts */
    expect("{{ [1,2,3,4][::-1] }} {{ [1,2,3,4][1:] }} {{ [1,2,3,4][:-1] }} {{ [1,2,3,4][::2] }} {{ [1,2,3][-1] }}",
           "[4, 3, 2, 1] [2, 3, 4] [1, 2, 3] [1, 3] 3");
    expect("{{ 'héllo'[1:3] }} {{ 'abc'[::-1] }} {{ 'abc'[5:] }}|{{ [1][3] is defined }}", "él cba |False");
    expect("{{ messages[0].role }} {{ messages[0]['content'] }} {{ messages[0].missing is defined }}",
           "user hi False");
    /* tests */
    expect("{{ none is none }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ 3 is odd }} "
           "{{ x is undefined }} {{ 1 is number }} {{ false is false }} {{ 6 is divisibleby(3) }}",
           "True True True True True True True True True");
    expect("{{ x is iterable }} {{ x is sequence }} {{ x is callable }} {{ x is mapping }} {{ 3 is iterable }}",
           "True True True False False");
    /* filters */
    expect("{{ '  a b \\n' | trim }}|{{ 'abc' | upper }}|{{ 'ABC' | lower }}|{{ 'hello world' | title }}|"
           "{{ 'hELLO' | capitalize }}",
           "a b|ABC|abc|Hello World|Hello");
    expect("{{ [1, 2, 3] | length }} {{ 'héllo' | length }} {{ {'a': 1} | length }} {{ [3, 4] | first }} "
           "{{ [3, 4] | last }} {{ ['a', 'b'] | join(', ') }} {{ 'abc' | list }}",
           "3 5 1 3 4 a, b ['a', 'b', 'c']");
    expect("{{ x | default('dflt') }} {{ '' | default('e', true) }} {{ 'aXbX' | replace('X', '-') }} "
           "{{ 42 | string }} {{ '17' | int + 1 }} {{ 3.9 | int }}",
           "dflt e a-b- 42 18 3");
    expect("{{ messages | selectattr('role', 'equalto', 'user') | list | length }} "
           "{{ messages | rejectattr('role', 'equalto', 'user') | list | length }} "
           "{{ messages | map(attribute='role') | join }}",
           "1 0 user");
    expect("{{ {'b': 1, 'a': [1, 2.5, 'x\"\\n'], 'c': {'d': none}} | tojson }}",
           "{\"b\": 1, \"a\": [1, 2.5, \"x\\\"\\n\"], \"c\": {\"d\": null}}");
    expect("{{ {'a': [1, {}], 'é': []} | tojson(indent=2) }}",
           "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"é\": []\n}");
    expect("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}", "{\"a\": 2, \"b\": 1}");
    expect("{{ 'é😀' | tojson(ensure_ascii=true) }} {{ 'é' | tojson }}", "\"\\u00e9\\ud83d\\ude00\" \"é\"");
    expect_error("{{ 'x' | tojson(separators=[',', ':']) }}", "filter 'tojson' has no supported argument 'separators'");
    expect("{{ none | trim }}|{{ 'a' in undefined_list }}|{{ 'x<y' | title }}", "None|False|X<Y");
    expect("{{ '' is upper }}{{ 'AB1' is upper }}{{ 'ab' is lower }}{{ '1' is lower }}{{ 3.0 is odd }}{{ [1] * 2 }}{{ true * 'ab' }}",
           "FalseTrueTrueFalseTrue[1, 1]ab");
    /* string and dict methods */
    expect("{{ '  x  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n\\nb'.lstrip('\\n') }}|{{ 'a  '.rstrip() }}|"
           "{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}",
           "x|a|b|a|TrueTrue");
    expect("{{ 'a,b,,c'.split(',') }} {{ '  a  b '.split() }} {{ 'a</think>b'.split('</think>')[-1] }} "
           "{{ 'Hi'.upper() }}{{ 'Hi'.lower() }} {{ 'a-b'.replace('-', '+') }} {{ '-'.join(['x', 'y']) }}",
           "['a', 'b', '', 'c'] ['a', 'b'] b HIhi a+b x-y");
    expect("{{ messages[0].get('role') }} {{ messages[0].get('nope', 'd') }} {{ messages[0].keys() | list }} "
           "{{ {'a': 1}.values() | list }}",
           "user d ['role', 'content'] [1]");
    /* macros, globals, extra vars, strftime_now */
    expect("{% macro greet(who, punct='!') %}hi {{ who }}{{ punct }}{% endmacro %}{{ greet('bob') }} "
           "{{ greet('amy', punct='?') }}",
           "hi bob! hi amy?");
    expect("{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}{{ tools is none }}", "<s></s>FalseTrue");
    expect_vars("{{ enable_thinking }} {{ custom.k }}", "{\"enable_thinking\": false, \"custom\": {\"k\": 3}}",
                "False 3");
    expect("{{ strftime_now('%d %b %Y') }}", "26 Jul 2024");
    /* reasoning under any of its names is aliased as transformers does, keys in its order */
    {
        celer_error e = {{0}};
        char *out = render_ex("{% for m in messages %}{{ m.keys() | list }}{{ m.thinking }}|{% endfor %}",
                              "[{\"role\": \"assistant\", \"content\": \"c\", \"reasoning\": \"r\"},"
                              " {\"role\": \"assistant\", \"thinking\": null, \"reasoning_content\": \"x\"},"
                              " {\"role\": \"user\", \"content\": \"u\", \"reasoning\": null}]",
                              NULL, false, &e);
        const char *want = "['thinking', 'role', 'content', 'reasoning', 'reasoning_content']r|"
                           "['thinking', 'role', 'reasoning_content']None|['role', 'content', 'reasoning']|";
        CHECK(out && !strcmp(out, want), "reasoning aliases\n  got:  [%s]\n  want: [%s]", out ? out : e.msg, want);
        free(out);
    }
    /* errors name the line and column */
    expect_error("line one\n{{ 'x' | wordcount }}", "template line 2 column 10: unknown filter 'wordcount'");
    expect_error("{% for m in messages %}\nno end", "template line 1 column 1: unclosed 'for' block");
    expect_error("{% if true %}x", "template line 1 column 1: unclosed 'if' block");
    expect_error("ok\n  {{ 1 + }}", "template line 2 column 10: expected an expression, found '}}'");
    expect_error("{% frobnicate %}", "template line 1 column 4: unknown tag 'frobnicate'");
    expect_error("{% endfor %}", "unexpected tag 'endfor'");
    expect_error("{{ 'unterminated }}", "template line 1 column 4: unterminated string literal");
    expect_error("{{ x is frob }}", "unknown test 'frob'");
    expect_error("{{ 'a'.frob() }}", "template line 1 column 8: unknown method 'frob' of string");
    expect_error("{{ nope(1) }}", "unknown function 'nope'");
    expect_error("{{ undefined_thing.attr }}", "undefined value has no attribute 'attr'");
    expect_error("{{ 1 + 'a' }}", "unsupported operand types for +");
    expect_error("{{ 1 // 0 }}", "division by zero");
    expect_error("x\n{{ raise_exception('Roles must alternate!') }}", "template line 2 column 4: Roles must alternate!");
    expect_error("{% set ns = 1 %}{% set ns.x = 2 %}", "only on a namespace");
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nested too deeply");
    expect_error("{% set r = range(5000) %}{% for a in r %}{% for b in r %}{% endfor %}{% endfor %}", "steps");
    expect_error("{% set s = 'x' * 1000000 %}{% for a in range(1000) %}{% set s = s + s %}{% endfor %}",
                 "out of memory");
    expect_error("{% for x in messages recursive %}{% endfor %}", "recursive loops are not supported");

    /* the model-directory loader: chat_template.jinja wins over tokenizer_config.json */
    char dir[] = "/tmp/celer-tmpl-XXXXXX";
    if (CHECK(mkdtemp(dir), "mkdtemp")) {
        char p[256];
        snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
        FILE *f = fopen(p, "w");
        fputs("{\"bos_token\": {\"content\": \"<B>\"}, \"eos_token\": \"<E>\", \"chat_template\": "
              "[{\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": \"default\", \"template\": \"D\"}]}",
              f);
        fclose(f);
        char *t, *bos, *eos;
        celer_error e;
        celer_status st = chat_template_from_dir(dir, &t, &bos, &eos, &e);
        CHECK(st == CELER_OK && !strcmp(t, "D") && !strcmp(bos, "<B>") && !strcmp(eos, "<E>"),
              "from_dir list: %s", st == CELER_OK ? t : e.msg);
        if (st == CELER_OK) free(t), free(bos), free(eos);
        char q[256];
        snprintf(q, sizeof q, "%s/chat_template.jinja", dir);
        f = fopen(q, "w");
        fputs("J", f);
        fclose(f);
        st = chat_template_from_dir(dir, &t, &bos, &eos, &e);
        CHECK(st == CELER_OK && !strcmp(t, "J"), "from_dir jinja: %s", st == CELER_OK ? t : e.msg);
        if (st == CELER_OK) free(t), free(bos), free(eos);
        unlink(q), unlink(p);
        st = chat_template_from_dir(dir, &t, &bos, &eos, &e);
        CHECK(st != CELER_OK && strstr(e.msg, dir) && strstr(e.msg, "no chat template"), "from_dir none: %s", e.msg);
        rmdir(dir);
    }
}

int main(void) {
    json_t *convs = json_load_file("tests/templates/conversations.json", 0, NULL);
    if (!CHECK(json_is_array(convs), "conversations.json")) return harness_done("test_chat_template");
    static const char *const names[] = {"llama3_1",   "qwen3",      "qwen3_1_7b", "smollm2", "llama3_2",
                                        "qwen2_5",    "mistral_v1", "mistral_v3", "cohere2", "gemma2",
                                        "gemma3",     "phi3",       "phi3_5",     "phi4_mini", "phi4"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) check_goldens(names[i], convs);
    json_decref(convs);
    unit_tests();
    return harness_done("test_chat_template");
}

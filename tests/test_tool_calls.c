/*
 * test_tool_calls.c - tool-call formats (src/server/tool_calls.h): detection on every
 * template of tests/templates and the real tokenizers; the parser against what each
 * family's template renders for an assistant turn with tool_calls (transformers' goldens;
 * Command R7B's through celer's renderer, whose output equals transformers' on the
 * goldens); hand-written cases per format (plain text, calls, escapes, malformed, unknown
 * tools, markers in prose); streamed == complete over every cut point of the small cases
 * and random cuts of the long ones; and the GBNF frames, translated to a PCRE2 regex here
 * (rules inlined) and matched against calls written by hand.
 */
#define _POSIX_C_SOURCE       200809L
#define PCRE2_CODE_UNIT_WIDTH 8
#include "harness.h"

#include "server/tool_calls.h"
#include "tokenizer/chat_template.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char tools_json[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
    "\"Weather\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"lookup\"}}]";
static json_t *tools;

/* ==== Stream == complete ==== */

/* Feeds text[len] cut at cuts[n_cuts] (ascending) and compares the result with the
 * complete parse r: content, reasoning, calls, deltas, flag. */
static bool stream_matches(tool_format f, const char *text, size_t len, const size_t *cuts,
                           int n_cuts, const tool_calls_result *r, const char *label) {
    tool_stream *s = tool_stream_create(f, tools, 42);
    char *content = calloc(1, len + 1), *reasoning = calloc(1, len + 1);
    size_t cl = 0, rl = 0, n_first = 0;
    char args[64][512] = {{0}};
    bool ok = s && content && reasoning, deltas_ok = true;
    for (int i = 0; ok && i <= n_cuts + 1; i++) {
        size_t a = i == 0 || i > n_cuts ? 0 : cuts[i - 1], b = i < n_cuts ? cuts[i] : len;
        const tool_stream_out *o =
            i <= n_cuts ? tool_stream_push(s, text + a, b - a) : tool_stream_finish(s);
        if (!(ok = o != NULL)) break;
        if (cl + o->content_len > len || rl + o->reasoning_len > len) {
            ok = false; /* released more than was pushed (generic responses excepted below) */
            break;
        }
        memcpy(content + cl, o->content, o->content_len), cl += o->content_len;
        memcpy(reasoning + rl, o->reasoning, o->reasoning_len), rl += o->reasoning_len;
        for (size_t d = 0; d < o->n_deltas; d++) {
            const tool_call_delta *x = &o->deltas[d];
            if (x->index < 0 || x->index >= 64)
                deltas_ok = false;
            else if (x->id) {
                deltas_ok &= x->index == (int)n_first++ && x->name && !strcmp(x->arguments, "");
            } else {
                deltas_ok &= strlen(args[x->index]) + strlen(x->arguments) < 512;
                if (deltas_ok) strcat(args[x->index], x->arguments);
            }
        }
    }
    size_t n = 0;
    const tool_call *c = s ? tool_stream_calls(s, &n) : NULL;
    ok = ok && deltas_ok && cl == r->content_len && !memcmp(content, r->content, cl) &&
         rl == r->reasoning_len && !memcmp(reasoning, r->reasoning, rl) && n == r->n_calls &&
         n_first == n && tool_stream_malformed(s) == r->malformed;
    for (size_t i = 0; ok && i < n; i++)
        ok = !strcmp(c[i].id, r->calls[i].id) && !strcmp(c[i].name, r->calls[i].name) &&
             !strcmp(c[i].arguments, r->calls[i].arguments) && i < 64 &&
             !strcmp(args[i], r->calls[i].arguments);
    CHECK(ok, "%s: stream (%d cuts, first %zu) != complete: content [%.*s] vs [%s]", label, n_cuts,
          n_cuts ? cuts[0] : 0, (int)cl, content ? content : "", r->content);
    free(content), free(reasoning);
    tool_stream_destroy(s);
    return ok;
}

/* Every single cut point, byte by byte, and random cuts. */
static void check_stream(tool_format f, const char *text, size_t len, const char *label) {
    tool_calls_result r;
    tool_error e;
    if (!CHECK(tool_calls_parse(f, text, len, tools, 42, &r, &e) == CELER_OK, "%s: %s", label,
               e.msg))
        return;
    size_t *cuts = malloc((len + 1) * sizeof *cuts);
    bool ok = true;
    for (size_t i = 0; ok && i <= len; i++) {
        cuts[0] = i;
        ok = stream_matches(f, text, len, cuts, 1, &r, label);
    }
    for (size_t i = 0; i < len; i++) cuts[i] = i + 1;
    if (ok && len) ok = stream_matches(f, text, len, cuts, (int)len - 1, &r, label);
    uint64_t x = 0x1234 + len;
    for (int round = 0; ok && round < 20 && len > 1; round++) {
        int k = 0;
        for (size_t i = 1; i < len; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            if ((x >> 33) % 5 == 0) cuts[k++] = i;
        }
        ok = stream_matches(f, text, len, cuts, k, &r, label);
    }
    free(cuts);
    tool_calls_result_free(&r);
}

/* ==== Detection ==== */

static const struct {
    const char *golden;
    tool_format want;
} detections[] = {
    {"cohere2", TOOL_FORMAT_COMMAND_R7B}, {"gemma2", TOOL_FORMAT_GENERIC},
    {"gemma3", TOOL_FORMAT_GENERIC},      {"llama3_1", TOOL_FORMAT_GENERIC},
    {"llama3_2", TOOL_FORMAT_LLAMA3},     {"mistral_v1", TOOL_FORMAT_GENERIC},
    {"mistral_v3", TOOL_FORMAT_MISTRAL},  {"phi3", TOOL_FORMAT_GENERIC},
    {"phi3_5", TOOL_FORMAT_GENERIC},      {"phi4", TOOL_FORMAT_GENERIC},
    {"phi4_mini", TOOL_FORMAT_PHI4_MINI}, {"qwen2_5", TOOL_FORMAT_HERMES},
    {"qwen3", TOOL_FORMAT_HERMES},        {"qwen3_1_7b", TOOL_FORMAT_HERMES},
    {"smollm2", TOOL_FORMAT_GENERIC},
};

/* ==== Golden round trips ==== */

/* Where an assistant turn begins and ends in each family's rendering. */
static const struct {
    tool_format f;
    const char *open[2], *close;
} turns[] = {
    {TOOL_FORMAT_HERMES, {"<|im_start|>assistant\n", NULL}, "<|im_end|>"},
    {TOOL_FORMAT_LLAMA3, {"<|start_header_id|>assistant<|end_header_id|>\n\n", NULL}, "<|eot_id|>"},
    {TOOL_FORMAT_MISTRAL, {"[/INST]", "[/TOOL_RESULTS]"}, "</s>"},
    {TOOL_FORMAT_COMMAND_R7B,
     {"<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", NULL},
     "<|END_OF_TURN_TOKEN|>"},
};

/* The next assistant turn in out at or after *at: [*b, *e), or false. A turn whose close
 * comes after the next opener is not an assistant turn (the generation prompt). */
static bool next_turn(int k, const char *out, size_t *at, size_t *b, size_t *e) {
    for (;;) {
        const char *best = NULL, *open = NULL;
        for (int i = 0; i < 2 && turns[k].open[i]; i++) {
            const char *p = strstr(out + *at, turns[k].open[i]);
            if (p && (!best || p < best)) best = p, open = turns[k].open[i];
        }
        if (!best) return false;
        const char *start = best + strlen(open), *close = strstr(start, turns[k].close),
                   *next = NULL;
        for (int i = 0; i < 2 && turns[k].open[i]; i++) {
            const char *p = strstr(start, turns[k].open[i]);
            if (p && (!next || p < next)) next = p;
        }
        *at = (size_t)(start - out);
        if (!close) return false;
        if (next && next < close) continue;
        *b = (size_t)(start - out), *e = (size_t)(close - out);
        *at = *e;
        return true;
    }
}

/* The parsed calls equal the message's tool_calls (names; arguments as JSON values). */
static bool calls_equal(const tool_calls_result *r, const json_t *want, const char *label) {
    if (!CHECK(r->n_calls == json_array_size(want) && !r->malformed, "%s: %zu calls (want %zu)%s%s",
               label, r->n_calls, json_array_size(want), r->malformed ? ", malformed: " : "",
               r->problem))
        return false;
    bool ok = true;
    for (size_t i = 0; i < r->n_calls; i++) {
        const json_t *fn = json_object_get(json_array_get(want, i), "function");
        const json_t *wa = json_object_get(fn, "arguments");
        json_t *wv = json_is_string(wa) ? json_loads(json_string_value(wa), 0, NULL)
                                        : json_incref((json_t *)wa);
        json_t *got = json_loads(r->calls[i].arguments, 0, NULL);
        ok &= CHECK(!strcmp(r->calls[i].name, json_string_value(json_object_get(fn, "name"))) &&
                        json_equal(got, wv) && !strchr(r->calls[i].arguments, '\n'),
                    "%s: call %zu is %s(%s)", label, i, r->calls[i].name, r->calls[i].arguments);
        json_decref(wv), json_decref(got);
    }
    return ok;
}

/* Every assistant turn of a golden rendering: the turns of messages with tool_calls parse to
 * those calls, the others to no call and no complaint. Returns how many calls were checked. */
static int check_rendering(tool_format f, const char *out, const json_t *messages,
                           const char *label, json_t *vtools) {
    int k = 0, checked = 0;
    while (k < (int)(sizeof turns / sizeof turns[0]) && turns[k].f != f) k++;
    if (k == (int)(sizeof turns / sizeof turns[0])) return 0;
    size_t at = 0, b, e, m = 0;
    while (next_turn(k, out, &at, &b, &e)) {
        const json_t *msg = NULL;
        while (m < json_array_size(messages)) {
            const json_t *x = json_array_get(messages, m++);
            if (!strcmp(json_string_value(json_object_get(x, "role")), "assistant")) {
                msg = x;
                break;
            }
        }
        if (!CHECK(msg, "%s: more assistant turns than assistant messages", label)) break;
        tool_calls_result r;
        tool_error err;
        if (!CHECK(tool_calls_parse(f, out + b, e - b, vtools, 1, &r, &err) == CELER_OK, "%s",
                   err.msg))
            break;
        const json_t *want = json_object_get(msg, "tool_calls");
        /* a template that drops tool_calls (Command R7B's without documents) renders a plain turn
         */
        const char *name0 = json_string_value(
            json_object_get(json_object_get(json_array_get(want, 0), "function"), "name"));
        if (name0) {
            char *turn = strndup(out + b, e - b);
            if (!strstr(turn, name0)) want = NULL;
            free(turn);
        }
        char l2[256];
        snprintf(l2, sizeof l2, "%s turn [%.40s...]", label, out + b);
        if (want)
            checked += calls_equal(&r, want, l2) ? (int)r.n_calls : 0;
        else
            CHECK(r.n_calls == 0 && !r.malformed, "%s: %zu calls in a plain turn", l2, r.n_calls);
        if (want && f == TOOL_FORMAT_COMMAND_R7B) {
            const char *plan = json_string_value(json_object_get(msg, "tool_plan"));
            CHECK(plan && !strcmp(r.reasoning, plan) && !r.content_len,
                  "%s: reasoning [%s] content [%s]", l2, r.reasoning, r.content);
        }
        check_stream(f, out + b, e - b, l2);
        tool_calls_result_free(&r);
    }
    return checked;
}

static void check_goldens(json_t *convs) {
    for (size_t d = 0; d < sizeof detections / sizeof detections[0]; d++) {
        char path[256];
        snprintf(path, sizeof path, "tests/templates/golden_%s.json", detections[d].golden);
        json_t *g = json_load_file(path, 0, NULL);
        if (!CHECK(g, "cannot read %s", path)) continue;
        const char *tsrc = json_string_value(json_object_get(g, "template"));
        char why[4096] = "";
        char *src = tsrc ? golden_template_source(tsrc, why) : NULL;
        if (!src) {
            SKIP_REQUIRED("%s: template %s unavailable %s", detections[d].golden, tsrc ? tsrc : "?",
                          why);
            json_decref(g);
            continue;
        }
        tool_format f = tool_format_detect(src);
        CHECK(f == detections[d].want, "%s: detected %s, want %s", detections[d].golden,
              tool_format_name(f), tool_format_name(detections[d].want));
        printf("%-11s -> %s\n", detections[d].golden, tool_format_name(f));
        int checked = 0;
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(g, "cases"), i, c) {
            const char *out = json_string_value(json_object_get(c, "output"));
            json_t *conv = json_array_get(
                convs, (size_t)json_integer_value(json_object_get(c, "conversation")));
            if (!out || json_is_true(json_object_get(c, "add_generation_prompt"))) continue;
            char label[128];
            snprintf(label, sizeof label, "%s \"%s\"", detections[d].golden,
                     json_string_value(json_object_get(conv, "name")));
            checked += check_rendering(f, out, json_object_get(conv, "messages"), label, NULL);
        }
        if (f != TOOL_FORMAT_GENERIC && f != TOOL_FORMAT_PHI4_MINI && f != TOOL_FORMAT_COMMAND_R7B)
            CHECK(checked > 0, "%s: no rendered tool call was checked", detections[d].golden);
        printf("%-11s    %d golden calls parsed back\n", "", checked);
        free(src);
        json_decref(g);
    }
}

/* Command R7B's template renders tool calls only with documents: no golden has one, so the
 * turn comes from celer's renderer. */
static void check_command_r7b_render(void) {
    char *src = read_text_file("tests/templates/cohere2.jinja");
    if (!CHECK(src, "cohere2.jinja")) return;
    json_t *msgs = json_loads(
        "[{\"role\": \"user\", \"content\": \"Weather and time in Oslo?\"},"
        " {\"role\": \"assistant\", \"tool_plan\": \"I will look both up.\", \"tool_calls\": ["
        "  {\"id\": \"a\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"arguments\": {\"city\": \"Oslo\", \"n\": [1, {\"x\": \"\\u00e9\\\"\"}]}}},"
        "  {\"id\": \"b\", \"type\": \"function\", \"function\": {\"name\": \"get_time\", "
        "\"arguments\": {}}}]},"
        " {\"role\": \"tool\", \"tool_call_id\": \"a\", \"content\": \"-3\"},"
        " {\"role\": \"tool\", \"tool_call_id\": \"b\", \"content\": \"14:05\"},"
        " {\"role\": \"assistant\", \"content\": \"Cold, 14:05.\"}]",
        0, NULL);
    json_t *vars = json_pack("{s:[{s:s}],s:O}", "documents", "text", "doc", "tools", tools);
    chat_template *t = NULL;
    celer_error e;
    char *out = NULL;
    chat_template_opts o = {
        .bos_token = "<BOS_TOKEN>", .eos_token = "<|END_OF_TURN_TOKEN|>", .vars = vars};
    if (CHECK(chat_template_parse(src, strlen(src), &t, &e) == CELER_OK &&
                  chat_template_render(t, msgs, &o, &out, NULL, &e) == CELER_OK,
              "cohere2 render: %s", e.msg)) {
        CHECK(tool_format_detect(src) == TOOL_FORMAT_COMMAND_R7B, "cohere2 detection");
        /* the document turn the template injects first is an assistant turn of its own */
        json_t *with_doc = json_deep_copy(msgs);
        json_array_insert_new(
            with_doc, 1,
            json_pack("{s:s,s:s,s:[{s:{s:s,s:{}}}]}", "role", "assistant", "tool_plan",
                      "I will look through the document to address the users needs.", "tool_calls",
                      "function", "name", "direct-injected-document", "arguments"));
        int n =
            check_rendering(TOOL_FORMAT_COMMAND_R7B, out, with_doc, "cohere2 (celer render)", NULL);
        CHECK(n == 3, "cohere2: %d calls checked, want 3", n);
        json_decref(with_doc);
    }
    free(out);
    chat_template_free(t);
    json_decref(vars), json_decref(msgs);
    free(src);
}

/* ==== Hand-written cases ==== */

typedef struct hcase {
    tool_format f;
    const char *text;
    const char *content; /* expected content */
    const char *calls;   /* "name args;name args" (args compact), "" for none */
    bool malformed;
    const char *reasoning; /* NULL: "" */
} hcase;

static const hcase cases[] = {
    /* hermes */
    {TOOL_FORMAT_HERMES, "Just text, no call.", "Just text, no call.", "", false, NULL},
    {TOOL_FORMAT_HERMES,
     "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
     "\"Paris\"}}\n</tool_call>",
     "Let me check.", "get_weather {\"city\":\"Paris\"}", false, NULL},
    {TOOL_FORMAT_HERMES,
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
     "\"Oslo\"}}\n</tool_call>\n<tool_call>\n"
     "{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>",
     "", "get_weather {\"city\":\"Oslo\"};get_time {\"tz\":\"CET\"}", false, NULL},
    {TOOL_FORMAT_HERMES,
     "<tool_call>{\"name\": \"lookup\", \"arguments\": {\"q\": \"a \\\"b\\\" \\\\ \\u00e9 日本 "
     "}]\", \"n\": {\"d\": [1, 2.50, -3e2, null, true]}}}</tool_call>",
     "",
     "lookup {\"q\":\"a \\\"b\\\" \\\\ \\u00e9 日本 }]\",\"n\":{\"d\":[1,2.50,-3e2,null,true]}}",
     false, NULL},
    {TOOL_FORMAT_HERMES,
     "x <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>",
     "x <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>", "",
     true, NULL},
    {TOOL_FORMAT_HERMES, "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>",
     "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>", "", true, NULL},
    {TOOL_FORMAT_HERMES, "Wrap calls in <tool_call> tags, like so.",
     "Wrap calls in <tool_call> tags, like so.", "", true, NULL},
    {TOOL_FORMAT_HERMES, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": [1]}\n</tool_call>",
     "<tool_call>\n{\"name\": \"get_time\", \"arguments\": [1]}\n</tool_call>", "", true, NULL},
    {TOOL_FORMAT_HERMES,
     "<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"a\\\": 1}\"}\n</tool_call>", "",
     "get_time {\"a\":1}", false, NULL},
    {TOOL_FORMAT_HERMES, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}", "",
     "get_time {}", false, NULL},
    {TOOL_FORMAT_HERMES,
     "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\nDone.", "Done.",
     "get_time {}", false, NULL},
    {TOOL_FORMAT_HERMES,
     "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{bad}",
     "<tool_call>\n{bad}", "get_time {}", true, NULL},
    {TOOL_FORMAT_HERMES, "text ends in <tool_c", "text ends in <tool_c", "", false, NULL},
    {TOOL_FORMAT_HERMES, "text then spaces   \n", "text then spaces   \n", "", false, NULL},
    /* llama3 */
    {TOOL_FORMAT_LLAMA3, "The capital is {Paris}.", "The capital is {Paris}.", "", false, NULL},
    {TOOL_FORMAT_LLAMA3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "",
     "get_weather {\"city\":\"Paris\"}", false, NULL},
    {TOOL_FORMAT_LLAMA3,
     "{\"type\": \"function\", \"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}", "",
     "get_time {\"tz\":\"UTC\"}", false, NULL},
    {TOOL_FORMAT_LLAMA3, "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}", "",
     "get_time {}", false, NULL},
    {TOOL_FORMAT_LLAMA3, "Sure.<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}", "Sure.",
     "get_time {}", false, NULL},
    {TOOL_FORMAT_LLAMA3,
     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; {\"name\": \"get_time\", "
     "\"parameters\": {}}\n"
     "{\"name\": \"lookup\", \"parameters\": {\"q\": \"\\n\"}}",
     "", "get_weather {\"city\":\"Oslo\"};get_time {};lookup {\"q\":\"\\n\"}", false, NULL},
    {TOOL_FORMAT_LLAMA3, "  {\"answer\": 42}", "  {\"answer\": 42}", "", true, NULL},
    {TOOL_FORMAT_LLAMA3, "{\"name\": \"get_time\", \"parameters\": {}}; and more", "; and more",
     "get_time {}", false, NULL},
    /* mistral */
    {TOOL_FORMAT_MISTRAL, "No tools needed.", "No tools needed.", "", false, NULL},
    {TOOL_FORMAT_MISTRAL,
     "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": "
     "\"abcDEF123\"}, "
     "{\"name\": \"get_time\", \"arguments\": {}}]",
     "", "get_weather {\"city\":\"Paris\"};get_time {}", false, NULL},
    {TOOL_FORMAT_MISTRAL, "Hmm.[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}}]", "Hmm.",
     "get_time {}", false, NULL},
    {TOOL_FORMAT_MISTRAL, "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {}]",
     "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {}]", "", true, NULL},
    {TOOL_FORMAT_MISTRAL, "The [TOOL_CALLS] token starts calls.",
     "The [TOOL_CALLS] token starts calls.", "", true, NULL},
    /* command_r7b */
    {TOOL_FORMAT_COMMAND_R7B, "<|START_RESPONSE|>Hello there.<|END_RESPONSE|>", "Hello there.", "",
     false, NULL},
    {TOOL_FORMAT_COMMAND_R7B,
     "<|START_THINKING|>Check the weather.<|END_THINKING|><|START_ACTION|>[\n    "
     "{\"tool_call_id\": \"0\", "
     "\"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}},\n    "
     "{\"tool_call_id\": \"1\", "
     "\"tool_name\": \"get_time\", \"parameters\": {}}\n]<|END_ACTION|>",
     "", "get_weather {\"city\":\"Oslo\"};get_time {}", false, "Check the weather."},
    {TOOL_FORMAT_COMMAND_R7B,
     "<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"nope\", \"parameters\": "
     "{}}]<|END_ACTION|>",
     "<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"nope\", \"parameters\": "
     "{}}]<|END_ACTION|>",
     "", true, NULL},
    {TOOL_FORMAT_COMMAND_R7B, "<|START_THINKING|>unfinished", "", "", false, "unfinished"},
    /* phi4_mini */
    {TOOL_FORMAT_PHI4_MINI, "plain answer", "plain answer", "", false, NULL},
    {TOOL_FORMAT_PHI4_MINI,
     "functools[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]", "",
     "get_weather {\"city\":\"Rome\"}", false, NULL},
    {TOOL_FORMAT_PHI4_MINI, "I'll use functools for this.", "I'll use functools for this.", "",
     true, NULL},
    /* generic */
    {TOOL_FORMAT_GENERIC, "{\"response\": \"Hi \\\"you\\\"\\n\"}", "Hi \"you\"\n", "", false, NULL},
    {TOOL_FORMAT_GENERIC,
     "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lima\"}}, "
     "{\"name\": \"get_time\", "
     "\"arguments\": {}}]}",
     "", "get_weather {\"city\":\"Lima\"};get_time {}", false, NULL},
    {TOOL_FORMAT_GENERIC, "I ignored the format.", "I ignored the format.", "", false, NULL},
    {TOOL_FORMAT_GENERIC, "{\"answer\": 1}", "{\"answer\": 1}", "", true, NULL},
    {TOOL_FORMAT_GENERIC, "{\"tool_calls\": []}", "{\"tool_calls\": []}", "", true, NULL},
};

static void check_cases(void) {
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const hcase *h = &cases[k];
        tool_calls_result r;
        tool_error e;
        char label[96];
        snprintf(label, sizeof label, "%s case %zu", tool_format_name(h->f), k);
        if (!CHECK(tool_calls_parse(h->f, h->text, strlen(h->text), tools, 7, &r, &e) == CELER_OK,
                   "%s", e.msg))
            continue;
        char got[1024] = "";
        for (size_t i = 0; i < r.n_calls; i++) {
            size_t l = strlen(got);
            snprintf(got + l, sizeof got - l, "%s%s %s", i ? ";" : "", r.calls[i].name,
                     r.calls[i].arguments);
        }
        CHECK(!strcmp(r.content, h->content) && !strcmp(got, h->calls) &&
                  r.malformed == h->malformed &&
                  !strcmp(r.reasoning, h->reasoning ? h->reasoning : ""),
              "%s: content [%s] calls [%s] malformed %d (%s) reasoning [%s]", label, r.content, got,
              r.malformed, r.problem, r.reasoning);
        for (size_t i = 0; i < r.n_calls; i++) {
            const char *id = r.calls[i].id;
            bool ok = h->f == TOOL_FORMAT_MISTRAL ? strlen(id) == 9
                                                  : strlen(id) == 29 && !strncmp(id, "call_", 5);
            for (size_t j = h->f == TOOL_FORMAT_MISTRAL ? 0 : 5; ok && id[j]; j++)
                ok = (id[j] >= '0' && id[j] <= '9') || (id[j] >= 'a' && id[j] <= 'z') ||
                     (id[j] >= 'A' && id[j] <= 'Z');
            CHECK(ok, "%s: id %s", label, id);
        }
        if (h->f == TOOL_FORMAT_MISTRAL && r.n_calls == 2)
            CHECK(!strcmp(r.calls[0].id, "abcDEF123") && strcmp(r.calls[1].id, "abcDEF123"),
                  "mistral ids %s %s", r.calls[0].id, r.calls[1].id);
        tool_calls_result_free(&r);
        check_stream(h->f, h->text, strlen(h->text), label);
    }
    /* ids follow the seed: the same seed, the same ids; another seed, others */
    const char *t = "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>";
    tool_calls_result a, b, c;
    tool_error e;
    tool_calls_parse(TOOL_FORMAT_HERMES, t, strlen(t), tools, 5, &a, &e);
    tool_calls_parse(TOOL_FORMAT_HERMES, t, strlen(t), tools, 5, &b, &e);
    tool_calls_parse(TOOL_FORMAT_HERMES, t, strlen(t), tools, 6, &c, &e);
    CHECK(a.n_calls == 1 && b.n_calls == 1 && c.n_calls == 1 &&
              !strcmp(a.calls[0].id, b.calls[0].id) && strcmp(a.calls[0].id, c.calls[0].id),
          "seeded ids");
    tool_calls_result_free(&a), tool_calls_result_free(&b), tool_calls_result_free(&c);
    /* without a tools list any name goes; an embedded NUL is kept as content */
    const char nul[] = "a\0b<tool_call>{\"name\": \"zzz\", \"arguments\": {}}</tool_call>";
    tool_calls_parse(TOOL_FORMAT_HERMES, nul, sizeof nul - 1, NULL, 5, &a, &e);
    CHECK(a.n_calls == 1 && a.content_len == 3 && !memcmp(a.content, "a\0b", 3),
          "NUL content, any name");
    tool_calls_result_free(&a);
}

/* ==== Grammar frames ==== */

/* GBNF (the subset the frames use) to a PCRE2 pattern with every rule inlined. */
static bool gbnf_to_regex(const char *g, const char *rule, char *out, size_t cap, int depth) {
    if (depth > 20) return false;
    char head[64];
    snprintf(head, sizeof head, "%s ::= ", rule);
    const char *p = NULL;
    for (const char *l = g; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, head, strlen(head))) p = l + strlen(head);
    if (!p) return false;
    size_t n = strlen(out);
#define PUT(...) (n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, __VA_ARGS__))
    while (*p && *p != '\n') {
        char c = *p;
        if (c == ' ')
            p++;
        else if (c == '"') {
            for (p++; *p && *p != '"'; p++) {
                int ch = (unsigned char)*p;
                if (ch == '\\') {
                    p++;
                    ch = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p == 'r' ? '\r' : (unsigned char)*p;
                    if (*p == 'x') ch = (int)strtol((char[]){p[1], p[2], 0}, NULL, 16), p += 2;
                }
                PUT("\\x{%02x}", ch);
            }
            p++;
        } else if (c == '[') {
            const char *s = p;
            for (p++; *p && *p != ']'; p++)
                if (*p == '\\') p++;
            PUT("%.*s", (int)(p - s + 1), s);
            p++;
        } else if (c == '(')
            PUT("(?:"), p++;
        else if (strchr(")|*+?", c))
            PUT("%c", c), p++;
        else if (c == '{') {
            const char *s = p;
            while (*p && *p != '}') p++;
            PUT("%.*s", (int)(p - s + 1), s);
            p++;
        } else {
            char name[64];
            int k = 0;
            while (k < 63 && (p[k] == '-' || p[k] == '_' || (p[k] >= 'a' && p[k] <= 'z') ||
                              (p[k] >= '0' && p[k] <= '9')))
                name[k] = p[k], k++;
            name[k] = 0;
            if (!k) return false;
            p += k;
            PUT("(?:");
            if (!gbnf_to_regex(g, name, out, cap, depth + 1)) return false;
            n = strlen(out);
            PUT(")");
        }
    }
#undef PUT
    return n < cap;
}

static bool regex_full_match(const char *re, const char *s) {
    int err;
    PCRE2_SIZE off;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, 0, &err, &off, NULL);
    if (!code) return false;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
    int rc = pcre2_match(code, (PCRE2_SPTR)s, strlen(s), 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED, md,
                         NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(code);
    return rc >= 0;
}

static void check_grammar_one(tool_format f, const char *forced, bool parallel, bool response,
                              const char *text, bool want) {
    char *g = NULL;
    tool_error e;
    if (!CHECK(tool_calls_grammar(f, tools, forced, parallel, response, &g, &e) == CELER_OK && g,
               "grammar %s: %s", tool_format_name(f), e.msg))
        return;
    /* stand-ins for the schema compiler's rules */
    size_t gl = strlen(g);
    char *full = malloc(gl + 256);
    snprintf(full, gl + 256,
             "%stool0-args ::= \"{\\\"city\\\": \\\"Paris\\\"}\"\ntool1-args ::= "
             "\"{}\"\ntool2-args ::= \"{}\"\n",
             g);
    static char re[1 << 16];
    re[0] = 0;
    bool ok = gbnf_to_regex(full, "root", re, sizeof re, 0);
    CHECK(ok, "%s: frame does not translate:\n%s", tool_format_name(f), g);
    bool m = ok && regex_full_match(re, text);
    CHECK(m == want, "%s forced=%s parallel=%d: [%s] %s\n%s", tool_format_name(f),
          forced ? forced : "-", parallel, text, want ? "does not match" : "matches", g);
    if (m && !strstr(text, "response")) { /* what the grammar lets through parses back as calls */
        tool_calls_result r;
        tool_calls_parse(f, text, strlen(text), tools, 1, &r, &e);
        CHECK(r.n_calls >= 1 && !r.malformed && r.content_len == 0,
              "%s: grammar output does not parse: %s", tool_format_name(f), r.problem);
        tool_calls_result_free(&r);
    }
    free(full);
    free(g);
}

static void check_grammars(void) {
    static const struct {
        tool_format f;
        const char *one, *two; /* get_weather(Paris); then get_time({}) after it */
    } ex[] = {
        {TOOL_FORMAT_HERMES,
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
         "\"Paris\"}}\n</tool_call>",
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
         "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": "
         "\"get_time\", \"arguments\": {}}\n</tool_call>"},
        {TOOL_FORMAT_LLAMA3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
         "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n{\"name\": "
         "\"get_time\", \"parameters\": {}}"},
        {TOOL_FORMAT_MISTRAL,
         "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": "
         "\"a1B2c3D4e\"}]",
         "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": "
         "\"a1B2c3D4e\"}, {\"name\": "
         "\"get_time\", \"arguments\": {}, \"id\": \"zzzzzzzzz\"}]"},
        {TOOL_FORMAT_COMMAND_R7B,
         "<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", "
         "\"parameters\": {\"city\": \"Paris\"}}]<|END_ACTION|>",
         "<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", "
         "\"parameters\": {\"city\": \"Paris\"}}, "
         "{\"tool_call_id\": \"1\", \"tool_name\": \"get_time\", \"parameters\": "
         "{}}]<|END_ACTION|>"},
        {TOOL_FORMAT_PHI4_MINI,
         "functools[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
         "functools[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": "
         "\"get_time\", \"arguments\": {}}]"},
        {TOOL_FORMAT_GENERIC,
         "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]}",
         "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
         "{\"name\": \"get_time\", "
         "\"arguments\": {}}]}"},
    };
    for (size_t i = 0; i < sizeof ex / sizeof ex[0]; i++) {
        tool_format f = ex[i].f;
        check_grammar_one(f, NULL, false, false, ex[i].one, true);
        check_grammar_one(f, NULL, false, false, ex[i].two, false);
        check_grammar_one(f, NULL, true, false, ex[i].one, true);
        check_grammar_one(f, NULL, true, false, ex[i].two, true);
        check_grammar_one(f, "get_weather", false, false, ex[i].one, true);
        check_grammar_one(f, "get_time", false, false, ex[i].one, false);
        check_grammar_one(f, "get_time", true, false, ex[i].two, false);
        /* a wrong name, arguments not from the tool's rule, text around the call */
        char bad[1024];
        snprintf(bad, sizeof bad, "%s", ex[i].one);
        char *w = strstr(bad, "get_weather");
        memcpy(w, "get_wether", 10), memmove(w + 10, w + 11, strlen(w + 11) + 1);
        check_grammar_one(f, NULL, true, false, bad, false);
        snprintf(bad, sizeof bad, "%s", ex[i].one);
        memcpy(strstr(bad, "Paris"), "Pariz", 5);
        check_grammar_one(f, NULL, true, false, bad, false);
        snprintf(bad, sizeof bad, "Sure! %s", ex[i].one);
        check_grammar_one(f, NULL, true, false, bad, false);
        char *g = NULL;
        tool_error e;
        CHECK(tool_calls_grammar(f, tools, NULL, false, true, &g, &e) == CELER_OK &&
                  (f == TOOL_FORMAT_GENERIC) == (g != NULL),
              "%s: auto grammar", tool_format_name(f));
        free(g);
        CHECK(tool_calls_grammar(f, tools, "missing", false, false, &g, &e) != CELER_OK && !g &&
                  strstr(e.msg, "missing"),
              "%s: unknown forced name: %s", tool_format_name(f), e.msg);
    }
    check_grammar_one(TOOL_FORMAT_GENERIC, NULL, false, true,
                      "{\"response\": \"Hi \\\"x\\\" \\u00e9\"}", true);
    check_grammar_one(TOOL_FORMAT_GENERIC, NULL, false, true, "{\"response\": \"a\nb\"}", false);
    check_grammar_one(TOOL_FORMAT_GENERIC, NULL, false, true, ex[5].one, true);
    check_grammar_one(TOOL_FORMAT_GENERIC, NULL, false, false, "{\"response\": \"Hi\"}", false);
    /* an awkward name is escaped, in the frame and in the regex */
    json_t *odd = json_loads(
        "[{\"type\": \"function\", \"function\": {\"name\": \"a\\\"b\\\\c\"}}]", 0, NULL);
    char *g = NULL;
    tool_error e;
    CHECK(tool_calls_grammar(TOOL_FORMAT_HERMES, odd, NULL, false, false, &g, &e) == CELER_OK &&
              strstr(g, "\"\\\"a\\\\\\\"b\\\\\\\\c\\\"\""),
          "escaped name: %s", g ? g : e.msg);
    free(g);
    json_decref(odd);
    json_t *none = json_array();
    CHECK(tool_calls_grammar(TOOL_FORMAT_HERMES, none, NULL, false, false, &g, &e) != CELER_OK,
          "empty tools refused");
    json_decref(none);
}

/* ==== Generic system prompt ==== */

static void check_generic_prompt(void) {
    tool_error e;
    char *s = tool_calls_generic_system(tools, true, &e);
    CHECK(s &&
              strstr(s, "{\"name\":\"get_weather\",\"description\":\"Weather\",\"parameters\":{") &&
              strstr(s, "{\"name\":\"lookup\"}\n") && strstr(s, "{\"tool_calls\": [") &&
              strstr(s, "{\"response\": "),
          "generic system text: %s", s ? s : e.msg);
    free(s);
    json_t *m1 = json_loads("[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": "
                            "\"user\", \"content\": \"hi\"}]",
                            0, NULL);
    json_t *m2 = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}]", 0, NULL);
    json_t *m3 = json_loads(
        "[{\"role\": \"system\", \"content\": [{\"type\": \"text\", \"text\": \"A\"}]}]", 0, NULL);
    json_t *o1 = tool_calls_generic_messages(m1, tools, false, &e),
           *o2 = tool_calls_generic_messages(m2, tools, false, &e),
           *o3 = tool_calls_generic_messages(m3, tools, false, &e);
    const char *c1 = json_string_value(json_object_get(json_array_get(o1, 0), "content"));
    CHECK(json_array_size(o1) == 2 && c1 && !strncmp(c1, "Be brief.\n\nYou can call", 23) &&
              json_array_size(m1) == 2 &&
              !strcmp(json_string_value(json_object_get(json_array_get(m1, 0), "content")),
                      "Be brief."),
          "merged into the system message");
    CHECK(json_array_size(o2) == 2 &&
              !strcmp(json_string_value(json_object_get(json_array_get(o2, 0), "role")), "system"),
          "new system message");
    CHECK(json_array_size(json_object_get(json_array_get(o3, 0), "content")) == 2, "system parts");
    json_t *nameless = json_loads("[{}]", 0, NULL);
    CHECK(!tool_calls_generic_messages(m2, nameless, false, &e) && strstr(e.msg, "tools[0]"),
          "nameless tool refused: %s", e.msg);
    json_decref(nameless);
    json_decref(m1), json_decref(m2), json_decref(m3), json_decref(o1), json_decref(o2),
        json_decref(o3);
}

int main(void) {
    tools = json_loads(tools_json, 0, NULL);
    json_t *convs = json_load_file("tests/templates/conversations.json", 0, NULL);
    if (CHECK(tools && json_is_array(convs), "tools / conversations.json")) {
        CHECK(tool_format_detect(NULL) == TOOL_FORMAT_GENERIC &&
                  !strcmp(tool_format_name(TOOL_FORMAT_COUNT), "?"),
              "NULL template");
        check_goldens(convs);
        check_command_r7b_render();
        check_cases();
        check_grammars();
        check_generic_prompt();
    }
    json_decref(convs);
    json_decref(tools);
    return harness_done("test_tool_calls");
}

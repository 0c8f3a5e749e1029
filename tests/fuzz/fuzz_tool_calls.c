/*
 * fuzz_tool_calls.c - libFuzzer target for the tool-call parsers (src/server/tool_calls.h).
 *
 * The first two bytes pick where the text is cut (a seed for the cut points), the rest is
 * a model's output. For every format the complete parse and the stream parse over those
 * cuts must agree on content, reasoning, calls (id, name, arguments), the streamed argument
 * pieces and the malformed flag, and each call's arguments must be a JSON object; any
 * disagreement traps. Never crash, leak, or run unbounded.
 */
#define _POSIX_C_SOURCE 200809L
#include "server/tool_calls.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static json_t *tools;

static void check(bool ok) {
    if (!ok) __builtin_trap();
}

static void one_format(tool_format f, const char *text, size_t len, uint32_t seed) {
    tool_calls_result r;
    tool_error e;
    if (tool_calls_parse(f, text, len, tools, 9, &r, &e) != CELER_OK) return;
    tool_stream *s = tool_stream_create(f, tools, 9);
    char *content = malloc(len + 1), *reasoning = malloc(len + 1);
    char **args = calloc(r.n_calls + 1, sizeof *args);
    size_t cl = 0, rl = 0, n_first = 0;
    size_t a = 0;
    for (bool done = false; s && content && reasoning && args && !done;) {
        size_t b = a;
        if (a < len) {
            seed = seed * 1103515245u + 12345u;
            b = a + 1 + (seed >> 16) % 7;
            if (b > len) b = len;
        }
        const tool_stream_out *o =
            a < len ? tool_stream_push(s, text + a, b - a) : tool_stream_finish(s);
        done = a == len;
        a = b;
        check(o != NULL);
        check(cl + o->content_len <= len && rl + o->reasoning_len <= len);
        memcpy(content + cl, o->content, o->content_len), cl += o->content_len;
        memcpy(reasoning + rl, o->reasoning, o->reasoning_len), rl += o->reasoning_len;
        for (size_t d = 0; d < o->n_deltas; d++) {
            const tool_call_delta *x = &o->deltas[d];
            check(x->index >= 0 && (size_t)x->index < r.n_calls);
            if (x->id) {
                check((size_t)x->index == n_first++ && !strcmp(x->arguments, ""));
                continue;
            }
            check(!args[x->index]);
            args[x->index] = strdup(x->arguments);
        }
    }
    check(cl == r.content_len && !memcmp(content, r.content, cl));
    check(rl == r.reasoning_len && !memcmp(reasoning, r.reasoning, rl));
    size_t n = 0;
    const tool_call *c = tool_stream_calls(s, &n);
    check(n == r.n_calls && n_first == n && tool_stream_malformed(s) == r.malformed);
    for (size_t i = 0; i < n; i++) {
        check(!strcmp(c[i].id, r.calls[i].id) && !strcmp(c[i].name, r.calls[i].name));
        check(!strcmp(c[i].arguments, r.calls[i].arguments) && args[i] &&
              !strcmp(args[i], c[i].arguments));
        json_t *v = json_loads(c[i].arguments, 0, NULL);
        check(json_is_object(v));
        json_decref(v);
    }
    for (size_t i = 0; args && i < r.n_calls; i++) free(args[i]);
    free(args);
    free(content), free(reasoning);
    tool_stream_destroy(s);
    tool_calls_result_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tools)
        tools = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\"}},"
                           " {\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}]",
                           0, NULL);
    if (size < 2) return 0;
    uint32_t seed = (uint32_t)data[0] << 8 | data[1];
    for (int f = 0; f < TOOL_FORMAT_COUNT; f++)
        one_format((tool_format)f, (const char *)data + 2, size - 2, seed);
    return 0;
}

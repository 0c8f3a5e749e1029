/*
 * chat_tools.c - tool calling on the chat route (chat_tools.h).
 *
 * Templates that render tools get them as transformers' apply_chat_template(tools=...)
 * passes them: the request's tools array under the variable "tools". A template that renders
 * none (the generic format) gets the tools described in a system message instead, and the
 * model answers with one JSON object, {"tool_calls": [...]} or {"response": "..."}, held to
 * that shape by a grammar. Its history is rewritten into turns such a template renders: an
 * assistant's calls become that JSON as its content, and the tool results after them one user
 * message {"tool_results": [{"tool_call_id", "name", "content"}]}, so user and assistant still
 * alternate. "required" and a named function force a call in the family's own
 * format; each tool's arguments follow its parameters schema (compiled as the rules
 * tool<i>-args beside the frame).
 */
#define _POSIX_C_SOURCE 200809L
#include "server/chat_tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool fail_oom(request_error *e) {
    return request_fail(e, 500, "server_error", NULL, NULL, "out of memory");
}

/* The grammar forcing a call (or, generic and "auto", either answer shape), or NULL. */
static bool tools_grammar(tool_format f, const server_request *r, const json_t *tools, char **out,
                          request_error *e) {
    *out = NULL;
    const bool any = r->tool_choice == REQUEST_TOOLS_AUTO;
    if (any && f != TOOL_FORMAT_GENERIC) return true; /* the parser takes what comes */
    char *frame = NULL;
    tool_error te = {{0}};
    if (tool_calls_grammar(f, tools, r->tool_choice == REQUEST_TOOLS_NAMED ? r->tool_name : NULL,
                           r->parallel_tool_calls, any, &frame, &te) != CELER_OK)
        return request_fail(e, 400, "invalid_request_error", NULL, "tools", "tools: %s", te.msg);
    size_t len = strlen(frame), cap = len + 1;
    char *g = frame;
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *fn = json_object_get(json_array_get(tools, i), "function"),
                     *params = json_object_get(fn, "parameters");
        json_t *none = params ? NULL
                              : json_pack("{s:s, s:{}, s:b}", "type", "object", "properties",
                                          "additionalProperties", 0);
        char *schema = json_dumps(params ? params : none, JSON_COMPACT), root[32], prefix[32],
             err[400], *rules = NULL;
        json_decref(none);
        if (!schema) {
            free(g);
            return fail_oom(e);
        }
        snprintf(root, sizeof root, "tool%zu-args", i);
        snprintf(prefix, sizeof prefix, "tool%zu-", i);
        const celer_status st =
            celer_json_schema_to_grammar_rules(schema, root, prefix, &rules, err, sizeof err);
        free(schema);
        if (st != CELER_OK) {
            free(g);
            char param[96];
            snprintf(param, sizeof param, "tools[%zu].function.parameters", i);
            return st == CELER_STATUS_OUT_OF_MEMORY
                       ? fail_oom(e)
                       : request_fail(e, 400, "invalid_request_error", NULL, param, "%s: %s", param,
                                      err);
        }
        const size_t n = strlen(rules);
        if (len + n + 2 > cap) {
            while (len + n + 2 > cap) cap *= 2;
            char *bigger = realloc(g, cap);
            if (!bigger) {
                free(g), free(rules);
                return fail_oom(e);
            }
            g = bigger;
        }
        g[len++] = '\n';
        memcpy(g + len, rules, n + 1);
        len += n;
        free(rules);
    }
    *out = g;
    return true;
}

/* The generic format's history (see the top of this file): a new array, or NULL when out of
 * memory. */
static json_t *generic_history(const json_t *msgs) {
    json_t *out = json_array(), *results = NULL;
    for (size_t i = 0; out && i <= json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        const bool tool = role && !strcmp(role, "tool");
        if (results && !tool) { /* the end of a run of tool results */
            char *text = json_dumps(results, JSON_COMPACT);
            json_t *u = text ? json_pack("{s:s, s:s}", "role", "user", "content", text) : NULL;
            free(text);
            json_decref(results);
            results = NULL;
            if (!u || json_array_append_new(out, u) != 0) goto oom;
        }
        if (!m) break;
        if (tool) {
            if (!results && !(results = json_pack("{s:[]}", "tool_results"))) goto oom;
            json_t *r = json_pack(
                "{s:O?, s:O?, s:O?}", "tool_call_id", json_object_get(m, "tool_call_id"), "name",
                json_object_get(m, "name"), "content", json_object_get(m, "content"));
            if (!r || json_array_append_new(json_object_get(results, "tool_results"), r) != 0)
                goto oom;
            continue;
        }
        const json_t *calls = json_object_get(m, "tool_calls");
        json_t *copy = json_deep_copy(m);
        if (!copy) goto oom;
        if (json_array_size(calls) > 0) { /* the answer the model gave, as it gave it */
            json_t *shape = json_pack("{s:[]}", "tool_calls");
            for (size_t k = 0; shape && k < json_array_size(calls); k++) {
                const json_t *f = json_object_get(json_array_get(calls, k), "function");
                json_array_append_new(json_object_get(shape, "tool_calls"),
                                      json_pack("{s:O?, s:O?}", "name", json_object_get(f, "name"),
                                                "arguments", json_object_get(f, "arguments")));
            }
            char *text = shape ? json_dumps(shape, JSON_COMPACT) : NULL;
            json_decref(shape);
            if (!text || json_object_set_new(copy, "content", json_string(text)) != 0) {
                free(text), json_decref(copy);
                goto oom;
            }
            free(text);
            json_object_del(copy, "tool_calls");
        }
        if (json_array_append_new(out, copy) != 0) goto oom;
    }
    return out;
oom:
    json_decref(results);
    json_decref(out);
    return NULL;
}

bool chat_tools_prepare(tool_format f, const char *defaults, const server_request *r,
                        char **messages_json, char **vars, char **grammar, request_error *e) {
    *messages_json = *vars = *grammar = NULL;
    json_t *tools = json_loads(r->tools_json, 0, NULL), *msgs = NULL, *v = NULL;
    char *base = NULL;
    bool ok = tools && request_template_vars(defaults, r, &base);
    if (!ok) goto oom;
    v = base ? json_loads(base, 0, NULL) : json_object();
    if (!v) goto oom;
    if (f == TOOL_FORMAT_GENERIC) { /* the template renders no tools: a system message does */
        json_t *m = json_loads(r->messages_json, 0, NULL), *h = m ? generic_history(m) : NULL;
        tool_error te = {{0}};
        msgs = h ? tool_calls_generic_messages(h, tools, r->parallel_tool_calls, &te) : NULL;
        json_decref(m), json_decref(h);
        if (!msgs) goto oom;
        *messages_json = json_dumps(msgs, JSON_COMPACT);
    } else {
        json_object_set(v, "tools", tools);
        *messages_json = strdup(r->messages_json);
    }
    *vars = json_dumps(v, JSON_COMPACT);
    if (!*messages_json || !*vars) goto oom;
    ok = tools_grammar(f, r, tools, grammar, e);
    goto done;
oom:
    ok = fail_oom(e);
done:
    if (!ok) {
        free(*messages_json), free(*vars);
        *messages_json = *vars = NULL;
    }
    free(base);
    json_decref(tools), json_decref(msgs), json_decref(v);
    return ok;
}

json_t *chat_tools_calls_json(const tool_call *calls, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", calls[i].id,
                                               "type", "function", "function", "name",
                                               calls[i].name, "arguments", calls[i].arguments)) !=
            0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

json_t *chat_tools_deltas_json(const tool_call_delta *d, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) {
        json_t *fn = json_pack("{s:s}", "arguments", d[i].arguments ? d[i].arguments : "");
        json_t *o = json_pack("{s:i}", "index", d[i].index);
        if (fn && d[i].name) json_object_set_new(fn, "name", json_string(d[i].name));
        if (o && d[i].id) {
            json_object_set_new(o, "id", json_string(d[i].id));
            json_object_set_new(o, "type", json_string("function"));
        }
        if (!fn || !o || json_object_set_new(o, "function", fn) != 0 ||
            json_array_append_new(a, o) != 0) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

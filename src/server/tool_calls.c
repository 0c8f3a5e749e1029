/*
 * tool_calls.c - tool-call formats: detection from a chat template, one incremental parser
 * that serves both the complete and the streamed parse, the GBNF call frame and the
 * generic format's system prompt (the contract is in tool_calls.h).
 *
 * The complete parse is the stream parse fed in one piece, so the two cannot disagree in
 * logic; what the stream must get right is waiting: it releases text only once no later
 * byte can change what that text is (a possible marker prefix and whitespace that may
 * precede a call are held, a call block is held until its JSON and end marker are whole).
 * It does not compile JSON schemas (the caller appends the `tool<i>-args` rules), does not
 * know about tokens, and does not parse reasoning other than Command R7B's thinking block.
 */
#include "server/tool_calls.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Fills e with the message; returns s. */
static celer_status tool_fail(tool_error *e, celer_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static celer_status tool_fail(tool_error *e, celer_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return s;
}

/* ==== Formats ==== */

typedef enum { MK_CALL, MK_THINK, MK_DROP } marker_kind;

typedef struct marker {
    const char *text;
    marker_kind kind;
} marker;

typedef struct format_spec {
    const char *name;
    marker markers[3]; /* searched for in content */
    int n_markers;
    char opener;          /* what the call JSON opens with: '{', '[', or 0 for either */
    const char *end;      /* the marker closing a call block, or NULL */
    bool json_at_start;   /* a '{' first in the output (after whitespace) opens a block */
    const char *name_key; /* keys of one call object */
    const char *args_key;
    const char *args_alt; /* also accepted, or NULL */
    bool own_id;          /* keep the model's "id" when it is 9 alphanumerics (mistral) */
} format_spec;

static const format_spec specs[TOOL_FORMAT_COUNT] = {
    [TOOL_FORMAT_GENERIC] =
        {"generic", {{0}}, 0, '{', NULL, true, "name", "arguments", NULL, false},
    [TOOL_FORMAT_HERMES] = {"hermes",
                            {{"<tool_call>", MK_CALL}},
                            1,
                            '{',
                            "</tool_call>",
                            false,
                            "name",
                            "arguments",
                            NULL,
                            false},
    [TOOL_FORMAT_LLAMA3] = {"llama3",
                            {{"<|python_tag|>", MK_CALL}},
                            1,
                            '{',
                            NULL,
                            true,
                            "name",
                            "parameters",
                            "arguments",
                            false},
    [TOOL_FORMAT_MISTRAL] = {"mistral",
                             {{"[TOOL_CALLS]", MK_CALL}},
                             1,
                             0,
                             NULL,
                             false,
                             "name",
                             "arguments",
                             NULL,
                             true},
    [TOOL_FORMAT_COMMAND_R7B] = {"command_r7b",
                                 {{"<|START_ACTION|>", MK_CALL},
                                  {"<|START_THINKING|>", MK_THINK},
                                  {"<|START_RESPONSE|>", MK_DROP}},
                                 3,
                                 '[',
                                 "<|END_ACTION|>",
                                 false,
                                 "tool_name",
                                 "parameters",
                                 NULL,
                                 false},
    [TOOL_FORMAT_PHI4_MINI] = {"phi4_mini",
                               {{"functools", MK_CALL}},
                               1,
                               '[',
                               NULL,
                               false,
                               "name",
                               "arguments",
                               NULL,
                               false},
};

/* Command R7B closes a response with this; dropped like its opener. */
static const char end_response[] = "<|END_RESPONSE|>";
static const char end_thinking[] = "<|END_THINKING|>";

tool_format tool_format_detect(const char *src) {
    if (!src) return TOOL_FORMAT_GENERIC;
    if (strstr(src, "<|START_ACTION|>")) return TOOL_FORMAT_COMMAND_R7B;
    if (strstr(src, "[TOOL_CALLS]")) return TOOL_FORMAT_MISTRAL;
    if (strstr(src, "<tool_call>")) return TOOL_FORMAT_HERMES;
    if ((strstr(src, "<|tool|>") && strstr(src, "<|/tool|>")) || strstr(src, "functools"))
        return TOOL_FORMAT_PHI4_MINI;
    if (strstr(src, "<|start_header_id|>") &&
        (strstr(src, "ipython") || strstr(src, "<|python_tag|>")))
        return TOOL_FORMAT_LLAMA3;
    return TOOL_FORMAT_GENERIC;
}

const char *tool_format_name(tool_format f) {
    return (unsigned)f < TOOL_FORMAT_COUNT ? specs[f].name : "?";
}

/* ==== Small helpers ==== */

typedef struct tbuf {
    char *p;
    size_t len, cap;
} tbuf;

static bool tb_put(tbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p, b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return true;
}

static bool tb_puts(tbuf *b, const char *s) {
    return tb_put(b, s, strlen(s));
}

static bool is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool is_alnum(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* First occurrence of needle in hay[n], or SIZE_MAX. */
static size_t find(const char *hay, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++)
        if (hay[i] == needle[0] && !memcmp(hay + i, needle, m)) return i;
    return SIZE_MAX;
}

/* Length of the longest suffix of s[n] that is a proper prefix of marker. */
static size_t prefix_held(const char *s, size_t n, const char *marker) {
    size_t m = strlen(marker);
    for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, marker, k)) return k;
    return 0;
}

static char *dup_n(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

static uint64_t rng_next(uint64_t *x) { /* splitmix64 */
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void rng_alnum(uint64_t *x, char *out, int n) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    for (int i = 0; i < n; i++) out[i] = abc[rng_next(x) % 62];
    out[n] = 0;
}

/* The function name of one OpenAI tools entry ({"type": "function", "function": {"name":
 * ...}}, or a bare {"name": ...}), or NULL. */
static const char *tool_name_of(const json_t *t) {
    const json_t *fn = json_object_get(t, "function");
    const json_t *name = json_object_get(fn ? fn : t, "name");
    return json_string_value(name);
}

static const json_t *tool_function_of(const json_t *t) {
    const json_t *fn = json_object_get(t, "function");
    return fn ? fn : t;
}

static bool tool_known(const json_t *tools, const char *name) {
    if (!tools) return true;
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const char *n = tool_name_of(t);
        if (n && !strcmp(n, name)) return true;
    }
    return false;
}

/* ==== Compact JSON ==== */

/* s[n] without whitespace outside strings. */
static char *json_minify(const char *s, size_t n, size_t *out_len) {
    char *m = malloc(n + 1);
    if (!m) return NULL;
    size_t k = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            m[k++] = c;
            if (c == '\\' && i + 1 < n)
                m[k++] = s[++i];
            else if (c == '"')
                in_str = false;
        } else if (!is_ws(c)) {
            m[k++] = c;
            if (c == '"') in_str = true;
        }
    }
    m[k] = 0;
    *out_len = k;
    return m;
}

/* The walker below reads minified text that jansson has already accepted, so it only
 * needs to find where values end; every index is still bounded by n. */
static size_t skip_value(const char *m, size_t i, size_t n) {
    if (i >= n) return n;
    if (m[i] == '"') {
        for (i++; i < n && m[i] != '"'; i++)
            if (m[i] == '\\') i++;
        return i + 1 < n ? i + 1 : n;
    }
    if (m[i] == '{' || m[i] == '[') {
        int depth = 0;
        bool in_str = false;
        for (; i < n; i++) {
            char c = m[i];
            if (in_str) {
                if (c == '\\')
                    i++;
                else if (c == '"')
                    in_str = false;
            } else if (c == '"')
                in_str = true;
            else if (c == '{' || c == '[')
                depth++;
            else if ((c == '}' || c == ']') && --depth == 0)
                return i + 1;
        }
        return n;
    }
    while (i < n && m[i] != ',' && m[i] != '}' && m[i] != ']') i++;
    return i;
}

/* The span [*vs, *ve) of member key of the object at m[at] (the last one, as jansson keeps);
 * false when the key is not there as written (escaped keys). */
static bool member_span(const char *m, size_t n, size_t at, const char *key, size_t *vs,
                        size_t *ve) {
    size_t kl = strlen(key), i = at + 1;
    bool found = false;
    while (i < n && m[i] == '"') {
        size_t ke = skip_value(m, i, n);
        bool match = ke - i == kl + 2 && !memcmp(m + i + 1, key, kl);
        size_t v0 = ke + 1, v1 = skip_value(m, v0, n);
        if (match) *vs = v0, *ve = v1, found = true;
        i = v1 < n && m[v1] == ',' ? v1 + 1 : n;
    }
    return found;
}

/* The start of element k of the array at m[at]. */
static size_t element_at(const char *m, size_t n, size_t at, size_t k) {
    size_t i = at + 1;
    for (size_t j = 0; j < k && i < n; j++) i = skip_value(m, i, n) + 1;
    return i;
}

/* ==== Stream parser ==== */

enum { M_TEXT, M_BLOCK, M_THINK, M_RAW };

struct tool_stream {
    tool_format f;
    const format_spec *sp;
    json_t *tools;
    uint64_t rng;
    tbuf text;  /* everything pushed */
    size_t pos; /* text[0, pos) is decided */
    int mode;
    bool json_here; /* a '{' here (after whitespace, and ';' for llama3) opens a block */
    bool skip_ws;   /* whitespace at pos follows a block: dropped */
    /* the open call block */
    size_t blk_start;  /* where it began, held whitespace included: content if it fails */
    size_t scan;       /* next byte to look at */
    size_t json_start; /* SIZE_MAX until seen */
    size_t json_end;   /* 0 until complete */
    int depth;
    bool in_str, esc;
    /* results */
    tool_call *calls;
    size_t n_calls, cap_calls;
    bool malformed;
    char problem[200];
    /* what the current push releases */
    tbuf content, reasoning;
    tool_call_delta *deltas;
    size_t n_deltas, cap_deltas;
    tool_stream_out out;
    bool oom;
};

tool_stream *tool_stream_create(tool_format f, const json_t *tools, uint64_t seed) {
    if ((unsigned)f >= TOOL_FORMAT_COUNT) f = TOOL_FORMAT_GENERIC;
    tool_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->f = f;
    s->sp = &specs[f];
    s->tools = json_is_array(tools) ? json_incref((json_t *)tools) : NULL;
    s->rng = seed;
    s->mode = M_TEXT;
    s->json_here = s->sp->json_at_start;
    if (!tb_put(&s->text, "", 0) || !tb_put(&s->content, "", 0) || !tb_put(&s->reasoning, "", 0)) {
        tool_stream_destroy(s);
        return NULL;
    }
    return s;
}

void tool_stream_destroy(tool_stream *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n_calls; i++) {
        free(s->calls[i].id);
        free(s->calls[i].name);
        free(s->calls[i].arguments);
    }
    free(s->calls);
    free(s->text.p);
    free(s->content.p);
    free(s->reasoning.p);
    free(s->deltas);
    json_decref(s->tools);
    free(s);
}

static void emit_content(tool_stream *s, size_t from, size_t to) {
    if (to > from && !tb_put(&s->content, s->text.p + from, to - from)) s->oom = true;
}

static void emit_reasoning(tool_stream *s, size_t from, size_t to) {
    if (to > from && !tb_put(&s->reasoning, s->text.p + from, to - from)) s->oom = true;
}

static bool add_delta(tool_stream *s, tool_call_delta d) {
    if (s->n_deltas == s->cap_deltas) {
        size_t cap = s->cap_deltas ? 2 * s->cap_deltas : 8;
        tool_call_delta *p = realloc(s->deltas, cap * sizeof *p);
        if (!p) return false;
        s->deltas = p, s->cap_deltas = cap;
    }
    s->deltas[s->n_deltas++] = d;
    return true;
}

/* The open block fails: it and everything after it is content from now on. */
static bool block_fail(tool_stream *s, const char *fmt, const char *arg) {
    if (!s->malformed) {
        s->malformed = true;
        snprintf(s->problem, sizeof s->problem, fmt, arg ? arg : "");
    }
    s->mode = M_RAW;
    s->pos = s->blk_start;
    return true;
}

/* One call object (v, at m[at] in the minified block m[n]) into *c; NULL or the problem. */
static const char *call_decode(tool_stream *s, const json_t *v, const char *m, size_t n, size_t at,
                               tool_call *c, const char **what) {
    const format_spec *sp = s->sp;
    if (!json_is_object(v)) return "a call is not a JSON object%s";
    const char *name = json_string_value(json_object_get(v, sp->name_key));
    if (!name) return "a call has no string \"name\"%s";
    *what = name;
    if (!tool_known(s->tools, name)) return "the call names \"%s\", which is not among the tools";
    const char *key = sp->args_key;
    const json_t *args = json_object_get(v, key);
    if (!args && sp->args_alt) args = json_object_get(v, key = sp->args_alt);
    size_t vs = 0, ve = 0;
    if (json_is_object(args) && member_span(m, n, at, key, &vs, &ve)) {
        c->arguments = dup_n(m + vs, ve - vs);
    } else if (json_is_object(args)) {
        c->arguments = json_dumps(args, JSON_COMPACT);
    } else if (json_is_string(args)) {
        const char *a = json_string_value(args);
        size_t al = json_string_length(args);
        json_t *inner = json_loadb(a, al, 0, NULL);
        bool ok = json_is_object(inner);
        json_decref(inner);
        if (!ok) return "the arguments of \"%s\" are a string that is not a JSON object";
        size_t ml;
        c->arguments = json_minify(a, al, &ml);
    } else {
        return "the arguments of \"%s\" are not a JSON object";
    }
    c->name = dup_n(name, strlen(name));
    const char *id = json_string_value(json_object_get(v, "id"));
    char gen[32];
    if (sp->own_id) {
        bool ok = id && strlen(id) == 9;
        for (int i = 0; ok && i < 9; i++) ok = is_alnum(id[i]);
        if (!ok) rng_alnum(&s->rng, gen, 9), id = gen;
    } else {
        memcpy(gen, "call_", 5);
        rng_alnum(&s->rng, gen + 5, 24);
        id = gen;
    }
    c->id = dup_n(id, strlen(id));
    if (!c->arguments || !c->name || !c->id) s->oom = true;
    return NULL;
}

static void calls_free(tool_call *c, size_t n) {
    for (size_t i = 0; i < n; i++) free(c[i].id), free(c[i].name), free(c[i].arguments);
    free(c);
}

/* The block's JSON is complete (and its end marker seen): decode it into calls, or into
 * the generic format's response, or fail the block. All or nothing. */
static bool block_accept(tool_stream *s, size_t after) {
    const char *j = s->text.p + s->json_start;
    size_t jl = s->json_end - s->json_start;
    json_error_t je;
    json_t *v = json_loadb(j, jl, 0, &je);
    if (!v) {
        char why[160];
        snprintf(why, sizeof why, "%.100s at line %d column %d", je.text, je.line, je.column);
        return block_fail(s, "the call JSON does not parse: %s", why);
    }
    size_t n = 0;
    char *m = json_minify(j, jl, &n);
    tool_call *got = NULL;
    size_t n_got = 0;
    const char *problem = NULL, *what = NULL;
    const json_t *list = v;
    size_t list_at = 0;
    if (!m) {
        s->oom = true;
        goto out;
    }
    if (s->f == TOOL_FORMAT_GENERIC) {
        const json_t *calls = json_object_get(v, "tool_calls");
        const json_t *resp = json_object_get(v, "response");
        size_t vs, ve;
        if (json_is_array(calls) && member_span(m, n, 0, "tool_calls", &vs, &ve)) {
            list = calls, list_at = vs;
        } else if (json_is_string(resp) && !calls) {
            if (!tb_put(&s->content, json_string_value(resp), json_string_length(resp)))
                s->oom = true;
            goto out;
        } else {
            problem = "the answer is neither {\"tool_calls\": [...]} nor {\"response\": \"...\"}%s";
            goto out;
        }
    }
    size_t count = json_is_array(list) ? json_array_size(list) : 1;
    if (count == 0) {
        problem = "the call list is empty%s";
        goto out;
    }
    if (s->n_calls + count > TOOL_CALLS_MAX_CALLS) {
        problem = "more than 128 calls in one output%s";
        goto out;
    }
    got = calloc(count, sizeof *got);
    if (!got) {
        s->oom = true;
        goto out;
    }
    uint64_t rng = s->rng; /* ids are drawn only for a block that stands */
    for (size_t i = 0; i < count && !problem; i++, n_got++) {
        const json_t *c = json_is_array(list) ? json_array_get(list, i) : list;
        size_t at = json_is_array(list) ? element_at(m, n, list_at, i) : list_at;
        what = NULL;
        problem = call_decode(s, c, m, n, at, &got[i], &what);
    }
    if (problem || s->oom) {
        s->rng = rng;
        goto out;
    }
    if (s->n_calls + count > s->cap_calls) {
        size_t cap = s->cap_calls ? s->cap_calls : 4;
        while (cap < s->n_calls + count) cap *= 2;
        tool_call *p = realloc(s->calls, cap * sizeof *p);
        if (!p) {
            s->oom = true;
            goto out;
        }
        s->calls = p, s->cap_calls = cap;
    }
    for (size_t i = 0; i < count; i++) {
        tool_call *c = &s->calls[s->n_calls];
        *c = got[i];
        int index = (int)s->n_calls++;
        if (!add_delta(s, (tool_call_delta){index, c->id, c->name, ""}) ||
            !add_delta(s, (tool_call_delta){index, NULL, NULL, c->arguments}))
            s->oom = true;
    }
    free(got);
    got = NULL, n_got = 0;
out:
    calls_free(got, n_got);
    free(m);
    if (problem) block_fail(s, problem, what); /* what lives in v */
    json_decref(v);
    if (problem) return true;
    s->pos = after;
    s->mode = M_TEXT;
    s->skip_ws = true;
    s->json_here = s->f == TOOL_FORMAT_LLAMA3;
    return true;
}

static void block_open(tool_stream *s, size_t blk_start, size_t scan) {
    s->mode = M_BLOCK;
    s->blk_start = blk_start;
    s->scan = scan;
    s->json_start = SIZE_MAX;
    s->json_end = 0;
    s->depth = 0;
    s->in_str = s->esc = false;
}

/* One step in block mode; false when it must wait for more text. */
static bool step_block(tool_stream *s, bool final) {
    const char *t = s->text.p;
    size_t len = s->text.len;
    if (s->json_start == SIZE_MAX) {
        while (s->scan < len && is_ws(t[s->scan])) s->scan++;
        if (s->scan == len)
            return final ? block_fail(s, "the output ends before a call%s", NULL) : false;
        char c = t[s->scan], want = s->sp->opener;
        if (want ? c != want : c != '{' && c != '[')
            return block_fail(s, "a call marker is not followed by JSON%s", NULL);
        s->json_start = s->scan;
    }
    if (!s->json_end) {
        for (; s->scan < len; s->scan++) {
            char c = t[s->scan];
            if (s->in_str) {
                if (s->esc)
                    s->esc = false;
                else if (c == '\\')
                    s->esc = true;
                else if (c == '"')
                    s->in_str = false;
            } else if (c == '"') {
                s->in_str = true;
            } else if (c == '{' || c == '[') {
                s->depth++;
            } else if ((c == '}' || c == ']') && --s->depth == 0) {
                s->json_end = ++s->scan;
                break;
            }
        }
        if (s->scan - s->json_start > TOOL_CALLS_MAX_BLOCK)
            return block_fail(s, "a call is longer than 1 MiB%s", NULL);
        if (!s->json_end)
            return final ? block_fail(s, "the output ends inside a call's JSON%s", NULL) : false;
    }
    size_t after = s->json_end;
    if (s->sp->end) {
        const char *em = s->sp->end;
        size_t ml = strlen(em), i = s->json_end;
        while (i < len && is_ws(t[i])) i++;
        size_t rest = len - i;
        if (rest >= ml) {
            if (memcmp(t + i, em, ml)) return block_fail(s, "a call does not end with %s", em);
            after = i + ml;
        } else {
            if (memcmp(t + i, em, rest)) return block_fail(s, "a call does not end with %s", em);
            if (!final) return false;
            after = len; /* the output stopped on (or just before) the end marker */
        }
    }
    return block_accept(s, after);
}

/* One step in text mode; false when it must wait for more text. */
static bool step_text(tool_stream *s, bool final) {
    const char *t = s->text.p;
    size_t len = s->text.len;
    const format_spec *sp = s->sp;
    if (s->json_here) {
        size_t w = s->pos;
        while (w < len && (is_ws(t[w]) || (s->f == TOOL_FORMAT_LLAMA3 && t[w] == ';'))) w++;
        if (w == len && !final) return false;
        s->json_here = false;
        if (w < len && t[w] == '{') {
            block_open(s, s->pos, w);
            return true;
        }
    }
    if (s->skip_ws) {
        while (s->pos < len && is_ws(t[s->pos])) s->pos++;
        if (s->pos == len && !final) return false;
        s->skip_ws = false;
    }
    size_t best = SIZE_MAX;
    const char *best_text = NULL;
    marker_kind kind = MK_DROP;
    for (int i = 0; i < sp->n_markers; i++) {
        size_t p = find(t + s->pos, len - s->pos, sp->markers[i].text);
        if (p < best) best = p, best_text = sp->markers[i].text, kind = sp->markers[i].kind;
    }
    if (s->f == TOOL_FORMAT_COMMAND_R7B) {
        size_t p = find(t + s->pos, len - s->pos, end_response);
        if (p < best) best = p, best_text = end_response, kind = MK_DROP;
    }
    if (best != SIZE_MAX) {
        size_t p = s->pos + best, q = p, ml = strlen(best_text);
        if (kind == MK_CALL) {
            while (q > s->pos && is_ws(t[q - 1])) q--;
            emit_content(s, s->pos, q);
            block_open(s, q, p + ml);
            return true;
        }
        emit_content(s, s->pos, p);
        s->pos = p + ml;
        if (kind == MK_THINK) s->mode = M_THINK;
        return true;
    }
    size_t e = len;
    if (!final && sp->n_markers) {
        size_t hold = 0;
        for (int i = 0; i < sp->n_markers; i++) {
            size_t h = prefix_held(t + s->pos, len - s->pos, sp->markers[i].text);
            if (h > hold) hold = h;
        }
        if (s->f == TOOL_FORMAT_COMMAND_R7B) {
            size_t h = prefix_held(t + s->pos, len - s->pos, end_response);
            if (h > hold) hold = h;
        }
        e -= hold;
        while (e > s->pos && is_ws(t[e - 1])) e--; /* may precede a call marker */
    }
    emit_content(s, s->pos, e);
    s->pos = e;
    return false;
}

static bool step_think(tool_stream *s, bool final) {
    const char *t = s->text.p;
    size_t len = s->text.len, p = find(t + s->pos, len - s->pos, end_thinking);
    if (p != SIZE_MAX) {
        emit_reasoning(s, s->pos, s->pos + p);
        s->pos += p + strlen(end_thinking);
        s->mode = M_TEXT;
        return true;
    }
    size_t e = final ? len : len - prefix_held(t + s->pos, len - s->pos, end_thinking);
    emit_reasoning(s, s->pos, e);
    s->pos = e;
    return false;
}

static const tool_stream_out *run(tool_stream *s, bool final) {
    s->content.len = s->reasoning.len = 0;
    s->content.p[0] = s->reasoning.p[0] = 0;
    s->n_deltas = 0;
    for (bool more = true; more && !s->oom;) {
        switch (s->mode) {
        case M_TEXT:
            more = step_text(s, final);
            break;
        case M_BLOCK:
            more = step_block(s, final);
            break;
        case M_THINK:
            more = step_think(s, final);
            break;
        default:
            emit_content(s, s->pos, s->text.len);
            s->pos = s->text.len;
            more = false;
        }
    }
    if (s->oom) return NULL;
    s->out = (tool_stream_out){s->content.p,     s->content.len, s->reasoning.p,
                               s->reasoning.len, s->deltas,      s->n_deltas};
    return &s->out;
}

const tool_stream_out *tool_stream_push(tool_stream *s, const char *piece, size_t len) {
    if (s->oom || !tb_put(&s->text, piece, len)) {
        s->oom = true;
        return NULL;
    }
    return run(s, false);
}

const tool_stream_out *tool_stream_finish(tool_stream *s) {
    return s->oom ? NULL : run(s, true);
}

const tool_call *tool_stream_calls(const tool_stream *s, size_t *n) {
    *n = s->n_calls;
    return s->calls;
}

bool tool_stream_malformed(const tool_stream *s) {
    return s->malformed;
}

const char *tool_stream_problem(const tool_stream *s) {
    return s->problem;
}

/* ==== Complete parse ==== */

celer_status tool_calls_parse(tool_format f, const char *text, size_t len, const json_t *tools,
                              uint64_t seed, tool_calls_result *out, tool_error *e) {
    memset(out, 0, sizeof *out);
    tool_stream *s = tool_stream_create(f, tools, seed);
    tbuf content = {0}, reasoning = {0};
    bool ok = s && tb_put(&content, "", 0) && tb_put(&reasoning, "", 0);
    for (int pass = 0; ok && pass < 2; pass++) {
        const tool_stream_out *o = pass ? tool_stream_finish(s) : tool_stream_push(s, text, len);
        ok = o && tb_put(&content, o->content, o->content_len) &&
             tb_put(&reasoning, o->reasoning, o->reasoning_len);
    }
    if (!ok) {
        free(content.p);
        free(reasoning.p);
        tool_stream_destroy(s);
        return tool_fail(e, CELER_STATUS_OUT_OF_MEMORY, "tool calls: out of memory");
    }
    out->content = content.p, out->content_len = content.len;
    out->reasoning = reasoning.p, out->reasoning_len = reasoning.len;
    out->calls = s->calls, out->n_calls = s->n_calls;
    out->malformed = s->malformed;
    memcpy(out->problem, s->problem, sizeof out->problem);
    s->calls = NULL, s->n_calls = 0;
    tool_stream_destroy(s);
    return CELER_OK;
}

void tool_calls_result_free(tool_calls_result *r) {
    if (!r) return;
    calls_free(r->calls, r->n_calls);
    free(r->content);
    free(r->reasoning);
    memset(r, 0, sizeof *r);
}

/* ==== Grammar frame ==== */

/* The pieces of one format's frame, as text the model writes (turned into GBNF literals):
 * root = open call (sep call)* close; a call = call_open NAME mid ARGS call_close, where
 * NAME is the JSON string of the name. call_id, when set, is a GBNF fragment spliced in
 * after call_open (command_r7b's counter). mistral adds ", \"id\": \"<9 alnum>\"". */
typedef struct frame {
    const char *open, *sep, *close, *call_open, *call_id, *mid, *call_close;
} frame;

static const frame frames[TOOL_FORMAT_COUNT] = {
    [TOOL_FORMAT_GENERIC] = {"{\"tool_calls\": [", ", ", "]}", "{\"name\": ", NULL,
                             ", \"arguments\": ", "}"},
    [TOOL_FORMAT_HERMES] = {"", "\n", "", "<tool_call>\n{\"name\": ", NULL,
                            ", \"arguments\": ", "}\n</tool_call>"},
    [TOOL_FORMAT_LLAMA3] = {"", "\n", "", "{\"name\": ", NULL, ", \"parameters\": ", "}"},
    [TOOL_FORMAT_MISTRAL] = {"[TOOL_CALLS][", ", ", "]", "{\"name\": ", NULL,
                             ", \"arguments\": ", NULL},
    [TOOL_FORMAT_COMMAND_R7B] = {"<|START_ACTION|>[", ", ", "]<|END_ACTION|>",
                                 "{\"tool_call_id\": \"", "[0-9]+ \"\\\", \\\"tool_name\\\": \"",
                                 ", \"parameters\": ", "}"},
    [TOOL_FORMAT_PHI4_MINI] = {"functools[", ", ", "]", "{\"name\": ", NULL,
                               ", \"arguments\": ", "}"},
};

/* s as a GBNF string literal. */
static bool gbnf_literal(tbuf *b, const char *s) {
    bool ok = tb_puts(b, "\"");
    for (; *s && ok; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\')
            snprintf(esc, sizeof esc, "\\%c", c);
        else if (c == '\n')
            snprintf(esc, sizeof esc, "\\n");
        else if (c == '\r')
            snprintf(esc, sizeof esc, "\\r");
        else if (c == '\t')
            snprintf(esc, sizeof esc, "\\t");
        else if (c < 0x20 || c == 0x7f)
            snprintf(esc, sizeof esc, "\\x%02X", c);
        else
            esc[0] = (char)c, esc[1] = 0;
        ok = tb_puts(b, esc);
    }
    return ok && tb_puts(b, "\"");
}

celer_status tool_calls_grammar(tool_format f, const json_t *tools, const char *forced_name,
                                bool parallel, bool allow_response, char **out, tool_error *e) {
    *out = NULL;
    if ((unsigned)f >= TOOL_FORMAT_COUNT)
        return tool_fail(e, CELER_STATUS_INVALID_ARGUMENT, "tool grammar: unknown format %d", f);
    if (!json_is_array(tools) || !json_array_size(tools))
        return tool_fail(e, CELER_STATUS_INVALID_ARGUMENT,
                         "tool grammar: tools is not a non-empty array");
    if (allow_response && f != TOOL_FORMAT_GENERIC) return CELER_OK;
    const frame *fr = &frames[f];
    tbuf b = {0};
    bool ok = tb_puts(&b, "root ::= ");
    if (allow_response) ok = ok && tb_puts(&b, "tc-calls | tc-response\ntc-calls ::= ");
    if (*fr->open) ok = ok && gbnf_literal(&b, fr->open) && tb_puts(&b, " ");
    ok = ok && tb_puts(&b, "tc-call");
    if (parallel)
        ok = ok && tb_puts(&b, " (") && gbnf_literal(&b, fr->sep) && tb_puts(&b, " tc-call)*");
    if (*fr->close) ok = ok && tb_puts(&b, " ") && gbnf_literal(&b, fr->close);
    ok = ok && tb_puts(&b, "\ntc-call ::=");
    size_t i, n_alt = 0;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const char *name = tool_name_of(t);
        if (!name) {
            free(b.p);
            return tool_fail(e, CELER_STATUS_INVALID_ARGUMENT,
                             "tool grammar: tools[%zu] has no function name", i);
        }
        if (forced_name && strcmp(name, forced_name)) continue;
        char ref[40];
        snprintf(ref, sizeof ref, " tc-call-%zu", i);
        ok = ok && tb_puts(&b, n_alt++ ? " |" : "") && tb_puts(&b, ref);
    }
    if (!n_alt) {
        free(b.p);
        return tool_fail(e, CELER_STATUS_INVALID_ARGUMENT,
                         "tool grammar: tool_choice names \"%s\", which is not among the tools",
                         forced_name ? forced_name : "");
    }
    ok = ok && tb_puts(&b, "\n");
    json_array_foreach(tools, i, t) {
        const char *name = tool_name_of(t);
        if (forced_name && strcmp(name, forced_name)) continue;
        json_t *js = json_string(name);
        char *quoted = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
        json_decref(js);
        char head[64];
        snprintf(head, sizeof head, "tc-call-%zu ::= ", i);
        ok = ok && quoted && tb_puts(&b, head) && gbnf_literal(&b, fr->call_open);
        if (fr->call_id) ok = ok && tb_puts(&b, " ") && tb_puts(&b, fr->call_id);
        ok = ok && tb_puts(&b, " ") && gbnf_literal(&b, quoted) && tb_puts(&b, " ") &&
             gbnf_literal(&b, fr->mid);
        snprintf(head, sizeof head, " tool%zu-args ", i);
        ok = ok && tb_puts(&b, head);
        if (fr->call_close)
            ok = ok && gbnf_literal(&b, fr->call_close);
        else
            ok = ok && tb_puts(&b, "\", \\\"id\\\": \\\"\" tc-id \"\\\"}\"");
        ok = ok && tb_puts(&b, "\n");
        free(quoted);
    }
    if (f == TOOL_FORMAT_MISTRAL) ok = ok && tb_puts(&b, "tc-id ::= [a-zA-Z0-9]{9}\n");
    if (allow_response)
        ok = ok &&
             tb_puts(&b,
                     "tc-response ::= \"{\\\"response\\\": \" tc-string \"}\"\n"
                     "tc-string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | "
                     "\"u\" [0-9a-fA-F]{4} ) )* \"\\\"\"\n");
    if (!ok) {
        free(b.p);
        return tool_fail(e, CELER_STATUS_OUT_OF_MEMORY, "tool grammar: out of memory");
    }
    *out = b.p;
    return CELER_OK;
}

/* ==== The generic format's prompt ==== */

char *tool_calls_generic_system(const json_t *tools, bool parallel, tool_error *e) {
    if (!json_is_array(tools) || !json_array_size(tools)) {
        tool_fail(e, CELER_STATUS_INVALID_ARGUMENT, "tools is not a non-empty array");
        return NULL;
    }
    tbuf b = {0};
    bool ok = tb_puts(&b, "You can call these tools (name, description and JSON Schema of the "
                          "arguments, one per line):\n");
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *fn = tool_function_of(t);
        const char *name = tool_name_of(t);
        if (!name) {
            free(b.p);
            tool_fail(e, CELER_STATUS_INVALID_ARGUMENT, "tools[%zu] has no function name", i);
            return NULL;
        }
        json_t *line = json_pack("{s:s}", "name", name);
        const json_t *d = json_object_get(fn, "description"),
                     *p = json_object_get(fn, "parameters");
        if (line && d) json_object_set(line, "description", (json_t *)d);
        if (line && p) json_object_set(line, "parameters", (json_t *)p);
        char *txt = line ? json_dumps(line, JSON_COMPACT) : NULL;
        ok = ok && txt && tb_puts(&b, txt) && tb_puts(&b, "\n");
        free(txt);
        json_decref(line);
    }
    ok = ok &&
         tb_puts(
             &b,
             "\nAnswer with one JSON object and nothing else. To call a tool, answer\n"
             "{\"tool_calls\": [{\"name\": \"<tool name>\", \"arguments\": {<arguments>}}]}\n") &&
         tb_puts(&b, parallel ? "listing one or more calls.\n"
                              : "with exactly one call in the list.\n") &&
         tb_puts(&b, "To answer the user directly, answer {\"response\": \"<your answer>\"}.");
    if (!ok) {
        free(b.p);
        tool_fail(e, CELER_STATUS_OUT_OF_MEMORY, "tool prompt: out of memory");
        return NULL;
    }
    return b.p;
}

json_t *tool_calls_generic_messages(const json_t *messages, const json_t *tools, bool parallel,
                                    tool_error *e) {
    if (!json_is_array(messages)) {
        tool_fail(e, CELER_STATUS_INVALID_ARGUMENT, "messages is not an array");
        return NULL;
    }
    char *sys = tool_calls_generic_system(tools, parallel, e);
    if (!sys) return NULL;
    json_t *out = json_deep_copy(messages);
    json_t *first = json_array_get(out, 0);
    const char *role = json_string_value(json_object_get(first, "role"));
    json_t *content = json_object_get(first, "content");
    bool ok = out != NULL;
    if (ok && role && !strcmp(role, "system") && json_is_string(content)) {
        tbuf b = {0};
        ok = tb_puts(&b, json_string_value(content)) && tb_puts(&b, "\n\n") && tb_puts(&b, sys) &&
             !json_object_set_new(first, "content", json_string(b.p));
        free(b.p);
    } else if (ok && role && !strcmp(role, "system") && json_is_array(content)) {
        tbuf b = {0};
        ok = tb_puts(&b, "\n\n") && tb_puts(&b, sys) &&
             !json_array_append_new(content, json_pack("{s:s,s:s}", "type", "text", "text", b.p));
        free(b.p);
    } else if (ok) {
        ok = !json_array_insert_new(out, 0,
                                    json_pack("{s:s,s:s}", "role", "system", "content", sys));
    }
    free(sys);
    if (!ok) {
        json_decref(out);
        tool_fail(e, CELER_STATUS_OUT_OF_MEMORY, "tool prompt: out of memory");
        return NULL;
    }
    return out;
}

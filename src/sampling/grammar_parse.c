/*
 * grammar_parse.c - GBNF text -> a compiled grammar: the rule tree (over code points) and
 * the byte-level automaton the matcher runs (grammar_impl.h).
 *
 * The syntax is llama.cpp's (grammars/README.md there): `name ::= alternatives`, `|`,
 * sequences, `( ... )`, "literals", [classes], [^negated], `.`, postfix `* + ? {m} {m,}
 * {m,n} {,n}`, `#` comments; a newline ends a rule except inside parentheses and right
 * after `|` or `::=`. Rule names take [a-zA-Z0-9_-]. As in llama.cpp a rule defined twice
 * keeps its last definition, and a repetition bound above GRAMMAR_MAX_REPEAT means "no
 * limit" while a lower bound above it is refused.
 *
 * Compilation turns every code-point class into UTF-8 byte-range sequences, so the
 * matcher never decodes UTF-8. `? * +` become loops inside the rule; `{m,n}` calls a
 * synthesized rule for the repeated item m..n times, so a bound costs one state, not a
 * copy of the item. Left recursion (a rule reaching itself before consuming a byte) is
 * refused here, which is what lets the matcher's closure terminate.
 *
 * Not here: token references (`<[id]>`, `<token>`, `!...`; refused with a message) and
 * anything about vocabularies.
 */
#include "sampling/gbnf_text.h"
#include "sampling/grammar_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== Growable arrays ==== */

static bool grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return true;
    int64_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return false;
    *p = q, *cap = c;
    return true;
}

/* ==== Parser ==== */

typedef struct parser {
    const char *s;
    size_t n, pos;
    grammar *g;
    celer_error *e;
    celer_status st; /* CELER_OK until the first error */
    int64_t cap_nodes, cap_kids, cap_pool, cap_rules;
    int depth;
} parser;

static void where(const char *s, size_t pos, int *line, int *col) {
    *line = 1, *col = 1;
    for (size_t i = 0; i < pos; i++) {
        if (s[i] == '\n')
            ++*line, *col = 1;
        else if (((unsigned char)s[i] & 0xC0) != 0x80)
            ++*col;
    }
}

static bool fail_at(parser *p, size_t pos, celer_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool fail_at(parser *p, size_t pos, celer_status st, const char *fmt, ...) {
    if (p->st != CELER_OK) return false;
    char msg[CELER_ERROR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    where(p->s, pos, &line, &col);
    p->st = error_set(p->e, st, "grammar line %d column %d: %s", line, col, msg);
    return false;
}
#define FAIL(p, pos, ...) fail_at((p), (pos), CELER_STATUS_INVALID_ARGUMENT, __VA_ARGS__)
#define OOM(p)            fail_at((p), (p)->pos, CELER_STATUS_OUT_OF_MEMORY, "out of memory")

/* A byte of the input as it may appear in a one-line message. */
static const char *show(int c, char *buf) {
    if (c > 0x20 && c < 0x7F)
        snprintf(buf, 8, "%c", c);
    else
        snprintf(buf, 8, "\\x%02X", (unsigned)c & 0xFF);
    return buf;
}

static int peek(const parser *p) {
    return p->pos < p->n ? (unsigned char)p->s[p->pos] : -1;
}
static int peek_at(const parser *p, size_t k) {
    return p->pos + k < p->n ? (unsigned char)p->s[p->pos + k] : -1;
}

static bool is_name_char(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static void skip_space(parser *p, bool newline_ok) {
    for (;;) {
        int c = peek(p);
        if (c == ' ' || c == '\t' || (newline_ok && (c == '\r' || c == '\n'))) {
            p->pos++;
        } else if (c == '#') {
            while (p->pos < p->n && p->s[p->pos] != '\r' && p->s[p->pos] != '\n') p->pos++;
        } else {
            return;
        }
    }
}

static int32_t node_add(parser *p, gnode nd) {
    grammar *g = p->g;
    if (!grow((void **)&g->nodes, &p->cap_nodes, g->n_nodes + 1, sizeof *g->nodes))
        return OOM(p), -1;
    g->nodes[g->n_nodes] = nd;
    return g->n_nodes++;
}

/* A node whose kids are list[n] (copied). */
static int32_t node_add_kids(parser *p, gnode_kind kind, const int32_t *list, int32_t n) {
    grammar *g = p->g;
    if (!grow((void **)&g->kids, &p->cap_kids, (int64_t)g->n_kids + n, sizeof *g->kids))
        return OOM(p), -1;
    if (n) memcpy(g->kids + g->n_kids, list, (size_t)n * sizeof *list);
    gnode nd = {.kind = kind, .kid = g->n_kids, .n_kid = n};
    g->n_kids += n;
    return node_add(p, nd);
}

static bool pool_add(parser *p, uint32_t v) {
    grammar *g = p->g;
    if (!grow((void **)&g->pool, &p->cap_pool, g->n_pool + 1, sizeof *g->pool)) return OOM(p);
    g->pool[g->n_pool++] = v;
    return true;
}

/* The index of rule name[len], added (undefined, located at pos) when new. */
static int32_t rule_find(parser *p, const char *name, size_t len, size_t pos) {
    grammar *g = p->g;
    for (int32_t i = 0; i < g->n_rules; i++)
        if (strlen(g->rules[i].name) == len && !memcmp(g->rules[i].name, name, len)) return i;
    if (!grow((void **)&g->rules, &p->cap_rules, g->n_rules + 1, sizeof *g->rules))
        return OOM(p), -1;
    char *copy = malloc(len + 1);
    if (!copy) return OOM(p), -1;
    memcpy(copy, name, len);
    copy[len] = 0;
    int line, col;
    where(p->s, pos, &line, &col);
    g->rules[g->n_rules] =
        (grule){.name = copy, .body = -1, .line = line, .col = col, .owner = g->n_rules};
    return g->n_rules++;
}

static bool parse_hex(parser *p, int digits, uint32_t *cp) {
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int c = peek(p);
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return FAIL(p, p->pos, "expecting %d hex digits after the escape", digits);
        v = v * 16 + (uint32_t)d;
        p->pos++;
    }
    if (v > 0x10FFFF) return FAIL(p, p->pos, "code point U+%X is beyond U+10FFFF", v);
    *cp = v;
    return true;
}

/* One character of a literal or class: an escape or one UTF-8 sequence. */
static bool parse_char(parser *p, uint32_t *cp) {
    size_t at = p->pos;
    int c = peek(p);
    if (c < 0) return FAIL(p, at, "unexpected end of input");
    if (c == '\\') {
        p->pos++;
        int x = peek(p);
        p->pos++;
        switch (x) {
        case 'x':
            return parse_hex(p, 2, cp);
        case 'u':
            return parse_hex(p, 4, cp);
        case 'U':
            return parse_hex(p, 8, cp);
        case 't':
            *cp = '\t';
            return true;
        case 'r':
            *cp = '\r';
            return true;
        case 'n':
            *cp = '\n';
            return true;
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
            *cp = (uint32_t)x;
            return true;
        case -1:
            return FAIL(p, at, "unexpected end of input after '\\'");
        default:
            return FAIL(p, at, "unknown escape '\\%s'", show(x, (char[8]){0}));
        }
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    int len = c < 0x80             ? 1
              : (c & 0xE0) == 0xC0 ? 2
              : (c & 0xF0) == 0xE0 ? 3
              : (c & 0xF8) == 0xF0 ? 4
                                   : 0;
    if (!len) return FAIL(p, at, "invalid UTF-8 byte 0x%02X", c);
    uint32_t v = len == 1 ? (uint32_t)c : (uint32_t)c & (0x7Fu >> len);
    for (int i = 1; i < len; i++) {
        int b = peek_at(p, (size_t)i);
        if (b < 0 || (b & 0xC0) != 0x80) return FAIL(p, at, "invalid UTF-8 sequence");
        v = v << 6 | ((uint32_t)b & 0x3F);
    }
    if (v < min_cp[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return FAIL(p, at, "invalid UTF-8 sequence");
    p->pos += (size_t)len;
    *cp = v;
    return true;
}

static int cmp_range(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

static int32_t parse_alternates(parser *p, int32_t rule, bool nested);

static int32_t parse_literal(parser *p) {
    size_t at = p->pos++;
    int32_t off = p->g->n_pool;
    while (peek(p) != '"') {
        if (peek(p) < 0) return FAIL(p, at, "unterminated string literal"), -1;
        uint32_t cp;
        if (!parse_char(p, &cp) || !pool_add(p, cp)) return -1;
    }
    p->pos++;
    return node_add(p, (gnode){.kind = GN_CHARS, .off = off, .n = p->g->n_pool - off});
}

static int32_t parse_class(parser *p) {
    size_t at = p->pos++;
    bool neg = false;
    if (peek(p) == '^') neg = true, p->pos++;
    int32_t off = p->g->n_pool;
    while (peek(p) != ']') {
        if (peek(p) < 0) return FAIL(p, at, "unterminated character class"), -1;
        size_t cat = p->pos;
        uint32_t lo, hi;
        if (!parse_char(p, &lo)) return -1;
        hi = lo;
        if (peek(p) == '-' && peek_at(p, 1) != ']') {
            p->pos++;
            if (peek(p) < 0) return FAIL(p, at, "unterminated character class"), -1;
            if (!parse_char(p, &hi)) return -1;
            if (hi < lo)
                return FAIL(p, cat, "character range U+%04X-U+%04X is reversed", lo, hi), -1;
        }
        if (!pool_add(p, lo) || !pool_add(p, hi)) return -1;
    }
    p->pos++;
    grammar *g = p->g;
    int32_t n = (g->n_pool - off) / 2, m = 0;
    uint32_t *r = g->pool + off;
    qsort(r, (size_t)n, 2 * sizeof *r, cmp_range);
    for (int32_t i = 0; i < n; i++) { /* merge overlapping and touching ranges */
        if (m && r[2 * i] <= r[2 * m - 1] + 1) {
            if (r[2 * i + 1] > r[2 * m - 1]) r[2 * m - 1] = r[2 * i + 1];
        } else {
            r[2 * m] = r[2 * i], r[2 * m + 1] = r[2 * i + 1], m++;
        }
    }
    g->n_pool = off + 2 * m;
    return node_add(p, (gnode){.kind = GN_CLASS, .negated = neg, .off = off, .n = m});
}

static bool parse_uint(parser *p, uint64_t *v) {
    if (peek(p) < '0' || peek(p) > '9') return FAIL(p, p->pos, "expecting an integer");
    uint64_t x = 0;
    while (peek(p) >= '0' && peek(p) <= '9') {
        if (x < UINT32_MAX) x = x * 10 + (uint64_t)(peek(p) - '0');
        p->pos++;
    }
    *v = x;
    return true;
}

/* The bounds after '{' at p->pos: {m} {m,} {m,n} {,n}. */
static bool parse_bounds(parser *p, bool nested, uint32_t *min, uint32_t *max) {
    size_t at = p->pos++;
    skip_space(p, nested);
    uint64_t lo = 0, hi = UINT64_MAX;
    bool have_lo = peek(p) != ',';
    if (have_lo) {
        if (!parse_uint(p, &lo)) return false;
        skip_space(p, nested);
    }
    if (peek(p) == '}') {
        hi = lo;
    } else if (peek(p) == ',') {
        p->pos++;
        skip_space(p, nested);
        if (peek(p) >= '0' && peek(p) <= '9') {
            if (!parse_uint(p, &hi)) return false;
            skip_space(p, nested);
        } else if (!have_lo) {
            return FAIL(p, at, "repetition bounds {,} name no bound");
        }
        if (peek(p) != '}') return FAIL(p, p->pos, "expecting '}' to close the repetition bounds");
    } else {
        return FAIL(p, p->pos, "expecting ',' or '}' in the repetition bounds");
    }
    p->pos++;
    if (lo > GRAMMAR_MAX_REPEAT)
        return FAIL(p, at, "repetition minimum %llu is above the limit of %d",
                    (unsigned long long)lo, GRAMMAR_MAX_REPEAT);
    if (hi != UINT64_MAX && hi < lo)
        return FAIL(p, at, "repetition bounds {%llu,%llu}: the maximum is below the minimum",
                    (unsigned long long)lo, (unsigned long long)hi);
    *min = (uint32_t)lo;
    *max = hi > GRAMMAR_MAX_REPEAT ? GRAMMAR_NO_MAX : (uint32_t)hi;
    return true;
}

/* Elements until something that cannot continue a sequence. */
static int32_t parse_sequence(parser *p, int32_t rule, bool nested) {
    int32_t *list = NULL;
    int64_t n = 0, cap = 0;
    int32_t result = -1;
    for (;;) {
        int c = peek(p);
        size_t at = p->pos;
        int32_t item = -2;
        uint32_t min = 0, max = 0;
        if (c == '"') {
            item = parse_literal(p);
        } else if (c == '[') {
            item = parse_class(p);
        } else if (c == '.') {
            p->pos++;
            item = node_add(p, (gnode){.kind = GN_ANY});
        } else if (is_name_char(c)) {
            size_t start = p->pos;
            while (is_name_char(peek(p))) p->pos++;
            int32_t r = rule_find(p, p->s + start, p->pos - start, start);
            item = r < 0 ? -1 : node_add(p, (gnode){.kind = GN_REF, .ref = r});
        } else if (c == '(') {
            if (++p->depth > GRAMMAR_MAX_NESTING) {
                FAIL(p, at, "parentheses nested deeper than %d", GRAMMAR_MAX_NESTING);
                goto out;
            }
            p->pos++;
            skip_space(p, true);
            item = parse_alternates(p, rule, true);
            p->depth--;
            if (item >= 0 && peek(p) != ')') {
                FAIL(p, p->pos, "expecting ')'");
                goto out;
            }
            p->pos++;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (!n) {
                FAIL(p, at, "'%c' has no preceding item to repeat", c);
                goto out;
            }
            if (c == '{') {
                if (!parse_bounds(p, nested, &min, &max)) goto out;
            } else {
                p->pos++;
                min = c == '+', max = c == '?' ? 1 : GRAMMAR_NO_MAX;
            }
            int32_t last = list[n - 1], height = 0;
            for (int32_t k = last; p->g->nodes[k].kind == GN_REPEAT;
                 k = p->g->kids[p->g->nodes[k].kid])
                height++;
            if (height >= 8) {
                FAIL(p, at, "more than 8 repetition operators on one item");
                goto out;
            }
            int32_t rep = node_add_kids(p, GN_REPEAT, &last, 1);
            if (rep < 0) goto out;
            p->g->nodes[rep].min = min, p->g->nodes[rep].max = max;
            list[n - 1] = rep;
            skip_space(p, nested);
            continue;
        } else if (c == '<' || c == '!') {
            FAIL(p, at, "token references ('%c') are not supported", c);
            goto out;
        } else {
            break;
        }
        if (item < 0) goto out;
        if (!grow((void **)&list, &cap, n + 1, sizeof *list)) {
            OOM(p);
            goto out;
        }
        list[n++] = item;
        skip_space(p, nested);
    }
    result = node_add_kids(p, GN_SEQ, list, (int32_t)n);
out:
    free(list);
    return p->st == CELER_OK ? result : -1;
}

static int32_t parse_alternates(parser *p, int32_t rule, bool nested) {
    int32_t *list = NULL;
    int64_t n = 0, cap = 0;
    int32_t result = -1;
    for (;;) {
        int32_t seq = parse_sequence(p, rule, nested);
        if (seq < 0) goto out;
        if (!grow((void **)&list, &cap, n + 1, sizeof *list)) {
            OOM(p);
            goto out;
        }
        list[n++] = seq;
        if (peek(p) != '|') break;
        p->pos++;
        skip_space(p, true);
    }
    result = node_add_kids(p, GN_ALT, list, (int32_t)n);
out:
    free(list);
    return result;
}

static bool parse_rule(parser *p) {
    size_t start = p->pos;
    if (!is_name_char(peek(p))) return FAIL(p, start, "expecting a rule name");
    while (is_name_char(peek(p))) p->pos++;
    int32_t r = rule_find(p, p->s + start, p->pos - start, start);
    if (r < 0) return false;
    skip_space(p, false);
    if (p->pos + 3 > p->n || memcmp(p->s + p->pos, "::=", 3))
        return FAIL(p, p->pos, "expecting '::=' after rule name '%s'", p->g->rules[r].name);
    p->pos += 3;
    skip_space(p, true);
    int32_t body = parse_alternates(p, r, false);
    if (body < 0) return false;
    grule *gr = &p->g->rules[r];
    gr->body = body;
    where(p->s, start, &gr->line, &gr->col);
    if (peek(p) == '\r') p->pos++;
    if (peek(p) == '\n')
        p->pos++;
    else if (peek(p) >= 0)
        return FAIL(p, p->pos, "unexpected '%s' in rule '%s'", show(peek(p), (char[8]){0}),
                    gr->name);
    skip_space(p, true);
    return true;
}

/* ==== Compiler ==== */

typedef struct edge_list {
    uint32_t *from;
    gedge *e;
    int64_t n, cap, cap_from;
} edge_list;

typedef struct compiler {
    parser *p;
    edge_list el;
    uint32_t n_states;
    int32_t rule; /* the rule being compiled, for messages */
} compiler;

static bool cfail(compiler *c, const char *what) {
    grule *r = &c->p->g->rules[c->p->g->rules[c->rule].owner];
    parser *p = c->p;
    if (p->st != CELER_OK) return false;
    p->st = error_set(p->e, CELER_STATUS_INVALID_ARGUMENT,
                      "grammar line %d column %d: rule '%s': %s", r->line, r->col, r->name, what);
    return false;
}

static bool state_new(compiler *c, uint32_t *s) {
    if (c->n_states >= GRAMMAR_MAX_STATES)
        return cfail(c, "the grammar is too large (more than 4194304 automaton states)");
    *s = c->n_states++;
    return true;
}

static bool edge_add(compiler *c, uint32_t from, gedge e) {
    edge_list *l = &c->el;
    if (l->n >= 4 * (int64_t)GRAMMAR_MAX_STATES)
        return cfail(c, "the grammar is too large (too many edges)");
    if (!grow((void **)&l->e, &l->cap, l->n + 1, sizeof *l->e) ||
        !grow((void **)&l->from, &l->cap_from, l->n + 1, sizeof *l->from))
        return cfail(c, "out of memory");
    l->from[l->n] = from, l->e[l->n++] = e;
    return true;
}

static bool eps(compiler *c, uint32_t a, uint32_t b) {
    return edge_add(c, a, (gedge){.kind = GE_EPS, .to = b});
}

/* A chain of byte ranges lo[i]..hi[i], i < n, from a to b. */
static bool byte_chain(compiler *c, uint32_t a, uint32_t b, const uint8_t *lo, const uint8_t *hi,
                       int n) {
    for (int i = 0; i < n; i++) {
        uint32_t to = b;
        if (i + 1 < n && !state_new(c, &to)) return false;
        if (!edge_add(c, a, (gedge){.kind = GE_BYTE, .lo = lo[i], .hi = hi[i], .to = to}))
            return false;
        a = to;
    }
    return true;
}

/* Code points lo..hi (one encoded length) as byte-range sequences: split until every
 * position's bytes form one range (the classic UTF-8 range splitting). */
static bool utf8_span(compiler *c, uint32_t a, uint32_t b, uint32_t lo, uint32_t hi) {
    uint8_t el[4], eh[4];
    int n = (int)gbnf_utf8_encode(lo, (char *)el);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m)
                return utf8_span(c, a, b, lo, lo | m) && utf8_span(c, a, b, (lo | m) + 1, hi);
            if ((hi & m) != m)
                return utf8_span(c, a, b, lo, (hi & ~m) - 1) && utf8_span(c, a, b, hi & ~m, hi);
        }
    }
    gbnf_utf8_encode(hi, (char *)eh);
    return byte_chain(c, a, b, el, eh, n);
}

static bool utf8_range(compiler *c, uint32_t a, uint32_t b, uint32_t lo, uint32_t hi) {
    static const uint32_t top[4] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    for (int k = 0; k < 4 && lo <= hi; k++) {
        if (lo > top[k]) continue;
        uint32_t h = hi < top[k] ? hi : top[k];
        if (!utf8_span(c, a, b, lo, h)) return false;
        lo = h + 1;
    }
    return true;
}

/* Code points in ranges r[n] (or outside them when negated; surrogates never match). */
static bool class_compile(compiler *c, uint32_t a, uint32_t b, const uint32_t *r, int32_t n,
                          bool neg) {
    if (!neg) {
        for (int32_t i = 0; i < n; i++)
            if (!utf8_range(c, a, b, r[2 * i], r[2 * i + 1])) return false;
        return true;
    }
    uint32_t next = 0; /* the first code point not yet covered */
    for (int32_t i = 0; i <= n; i++) {
        uint32_t lo = next, hi = i < n ? (r[2 * i] ? r[2 * i] - 1 : 0) : 0x10FFFF;
        bool empty = i < n && r[2 * i] == 0;
        if (i < n) next = r[2 * i + 1] + 1;
        if (empty || lo > hi) continue;
        /* leave out the surrogates */
        if (lo < 0xD800 && !utf8_range(c, a, b, lo, hi < 0xD7FF ? hi : 0xD7FF)) return false;
        if (hi > 0xDFFF && !utf8_range(c, a, b, lo > 0xE000 ? lo : 0xE000, hi)) return false;
        if (next > 0x10FFFF) break;
    }
    return true;
}

static bool node_compile(compiler *c, int32_t k, uint32_t a, uint32_t b);

/* A synthesized rule whose body is node k (the item of a counted repetition). */
static bool rule_synth(compiler *c, int32_t k, int32_t *out) {
    parser *p = c->p;
    grammar *g = p->g;
    if (!grow((void **)&g->rules, &p->cap_rules, g->n_rules + 1, sizeof *g->rules))
        return cfail(c, "out of memory");
    grule r = {.body = k, .owner = g->rules[c->rule].owner, .line = 0, .col = 0};
    if (!state_new(c, &r.start) || !state_new(c, &r.end)) return false;
    *out = g->n_rules;
    g->rules[g->n_rules++] = r;
    return node_compile(c, k, r.start, r.end);
}

static bool node_compile(compiler *c, int32_t k, uint32_t a, uint32_t b) {
    grammar *g = c->p->g;
    gnode nd = g->nodes[k];
    switch (nd.kind) {
    case GN_ALT:
        for (int32_t i = 0; i < nd.n_kid; i++)
            if (!node_compile(c, g->kids[nd.kid + i], a, b)) return false;
        return true;
    case GN_SEQ: {
        if (!nd.n_kid) return eps(c, a, b);
        for (int32_t i = 0; i < nd.n_kid; i++) {
            uint32_t to = b;
            if (i + 1 < nd.n_kid && !state_new(c, &to)) return false;
            if (!node_compile(c, g->kids[nd.kid + i], a, to)) return false;
            a = to;
        }
        return true;
    }
    case GN_CHARS: {
        if (!nd.n) return eps(c, a, b);
        for (int32_t i = 0; i < nd.n; i++) {
            uint8_t enc[4];
            int len = (int)gbnf_utf8_encode(g->pool[nd.off + i], (char *)enc);
            uint32_t to = b;
            if (i + 1 < nd.n && !state_new(c, &to)) return false;
            if (!byte_chain(c, a, to, enc, enc, len)) return false;
            a = to;
        }
        return true;
    }
    case GN_CLASS:
        return class_compile(c, a, b, g->pool + nd.off, nd.n, nd.negated);
    case GN_ANY:
        return class_compile(c, a, b, NULL, 0, true);
    case GN_REF:
        return edge_add(c, a, (gedge){.kind = GE_CALL, .to = b, .rule = nd.ref});
    case GN_REPEAT: {
        int32_t item = g->kids[nd.kid];
        if (nd.min == 1 && nd.max == 1) return node_compile(c, item, a, b);
        if (nd.min <= 1 && (nd.max == 1 || nd.max == GRAMMAR_NO_MAX)) {
            /* ? * + as a loop around one copy: a -> x -> y -> b, y -> x when unbounded */
            uint32_t x = 0, y = 0;
            if (!state_new(c, &x) || !state_new(c, &y)) return false;
            if (!eps(c, a, x) || !node_compile(c, item, x, y) || !eps(c, y, b)) return false;
            if (nd.max == GRAMMAR_NO_MAX && !eps(c, y, x)) return false;
            return nd.min == 1 || eps(c, a, b);
        }
        int32_t r = 0;
        if (g->nodes[item].kind == GN_REF)
            r = g->nodes[item].ref;
        else if (!rule_synth(c, item, &r))
            return false;
        for (uint32_t i = 0; i < nd.min; i++) { /* the required copies: one call each */
            uint32_t to = 0;
            if (!state_new(c, &to) ||
                !edge_add(c, a, (gedge){.kind = GE_CALL, .to = to, .rule = r}))
                return false;
            a = to;
        }
        if (nd.max == GRAMMAR_NO_MAX)
            return edge_add(c, a, (gedge){.kind = GE_CALL, .to = a, .rule = r}) && eps(c, a, b);
        for (uint32_t i = nd.min; i < nd.max; i++) { /* optional ones, nested: (x (x ...)?)? */
            uint32_t to = 0;
            if (!eps(c, a, b) || !state_new(c, &to) ||
                !edge_add(c, a, (gedge){.kind = GE_CALL, .to = to, .rule = r}))
                return false;
            a = to;
        }
        return eps(c, a, b);
    }
    }
    return true;
}

/* ==== Checks on the automaton ==== */

/* Walks rule r's states reachable without consuming a byte (epsilon moves, and calls of
 * nullable rules stepped over). Returns whether r's end is reached; each rule called on
 * the way goes to callees (if not NULL). */
static bool rule_walk(const grammar *g, int32_t r, uint32_t *mark, uint32_t stamp, uint32_t *work,
                      int32_t *callees, int32_t *n_callees) {
    int64_t top = 0;
    bool end = false;
    work[top++] = g->rules[r].start;
    mark[g->rules[r].start] = stamp;
    while (top) {
        uint32_t s = work[--top];
        if (s == g->rules[r].end) end = true;
        for (uint32_t i = g->edge_start[s]; i < g->edge_start[s + 1]; i++) {
            const gedge *ed = &g->edges[i];
            if (ed->kind == GE_BYTE) continue;
            if (ed->kind == GE_CALL) {
                if (callees) callees[(*n_callees)++] = ed->rule;
                if (!g->rules[ed->rule].nullable) continue;
            }
            if (mark[ed->to] != stamp) mark[ed->to] = stamp, work[top++] = ed->to;
        }
    }
    return end;
}

/* Nullable rules, then a cycle among "calls before consuming": left recursion. */
static bool check_left_recursion(parser *p) {
    grammar *g = p->g;
    int32_t R = g->n_rules;
    uint32_t *mark = calloc(g->n_states, sizeof *mark);
    uint32_t *work = malloc((size_t)g->n_states * sizeof *work);
    int32_t *cstart = malloc(((size_t)R + 1) * sizeof *cstart);
    int32_t *callees = malloc(((size_t)g->edge_start[g->n_states] + 1) * sizeof *callees);
    int32_t *color = calloc((size_t)R, sizeof *color),
            *stack = malloc((size_t)R * 2 * sizeof *stack);
    bool ok = false;
    if (!mark || !work || !cstart || !callees || !color || !stack) {
        OOM(p);
        goto out;
    }
    uint32_t stamp = 0;
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < R; r++)
            if (!g->rules[r].nullable && rule_walk(g, r, mark, ++stamp, work, NULL, NULL))
                g->rules[r].nullable = changed = true;
    }
    int32_t nc = 0;
    for (int32_t r = 0; r < R; r++) {
        cstart[r] = nc;
        rule_walk(g, r, mark, ++stamp, work, callees, &nc);
    }
    cstart[R] = nc;
    /* iterative depth-first search: color 1 = on the path, 2 = done */
    for (int32_t r0 = 0; r0 < R; r0++) {
        if (color[r0]) continue;
        int32_t top = 0;
        stack[top++] = r0, stack[top++] = cstart[r0];
        color[r0] = 1;
        while (top) {
            int32_t r = stack[top - 2], i = stack[top - 1];
            if (i == cstart[r + 1]) {
                color[r] = 2, top -= 2;
                continue;
            }
            stack[top - 1]++;
            int32_t q = callees[i];
            if (color[q] == 1) {
                grule *o = &g->rules[g->rules[q].owner];
                p->st = error_set(p->e, CELER_STATUS_INVALID_ARGUMENT,
                                  "grammar line %d column %d: left recursion: rule '%s' can reach "
                                  "itself without consuming input",
                                  o->line, o->col, o->name);
                goto out;
            }
            if (!color[q]) color[q] = 1, stack[top++] = q, stack[top++] = cstart[q];
        }
    }
    ok = true;
out:
    free(mark), free(work), free(cstart), free(callees), free(color), free(stack);
    return ok;
}

/* ==== Entry points ==== */

static bool compile_all(parser *p) {
    grammar *g = p->g;
    compiler c = {.p = p};
    for (int32_t r = 0; r < g->n_named; r++) {
        c.rule = r;
        if (!state_new(&c, &g->rules[r].start) || !state_new(&c, &g->rules[r].end)) goto fail;
    }
    for (int32_t r = 0; r < g->n_named; r++) {
        c.rule = r;
        if (!node_compile(&c, g->rules[r].body, g->rules[r].start, g->rules[r].end)) goto fail;
    }
    /* edges grouped by their state (counting sort keeps each state's edges in order) */
    g->n_states = c.n_states;
    g->edge_start = calloc((size_t)c.n_states + 1, sizeof *g->edge_start);
    g->edges = malloc(((size_t)c.el.n + 1) * sizeof *g->edges);
    g->flags = calloc((size_t)c.n_states, 1);
    if (!g->edge_start || !g->edges || !g->flags) {
        OOM(p);
        goto fail;
    }
    for (int64_t i = 0; i < c.el.n; i++) g->edge_start[c.el.from[i] + 1]++;
    for (uint32_t s = 0; s < c.n_states; s++) g->edge_start[s + 1] += g->edge_start[s];
    uint32_t *fill = malloc(((size_t)c.n_states + 1) * sizeof *fill);
    if (!fill) {
        OOM(p);
        goto fail;
    }
    memcpy(fill, g->edge_start, ((size_t)c.n_states + 1) * sizeof *fill);
    for (int64_t i = 0; i < c.el.n; i++) {
        g->edges[fill[c.el.from[i]]++] = c.el.e[i];
        if (c.el.e[i].kind == GE_BYTE) g->flags[c.el.from[i]] |= GSTATE_BYTES;
    }
    free(fill);
    for (int32_t r = 0; r < g->n_rules; r++) g->flags[g->rules[r].end] |= GSTATE_END;
    /* byte classes: a new class starts wherever some edge's range starts or ends */
    bool cut[257] = {0};
    for (int64_t i = 0; i < c.el.n; i++)
        if (c.el.e[i].kind == GE_BYTE) cut[c.el.e[i].lo] = cut[c.el.e[i].hi + 1] = true;
    int k = -1;
    for (int b = 0; b < 256; b++) {
        if (b == 0 || cut[b]) g->class_byte[++k] = (uint8_t)b;
        g->byte_class[b] = (uint8_t)k;
    }
    g->n_classes = k + 1;
    free(c.el.from), free(c.el.e);
    return check_left_recursion(p);
fail:
    free(c.el.from), free(c.el.e);
    return false;
}

void grammar_free(grammar *g) {
    if (!g) return;
    for (int32_t i = 0; i < g->n_rules; i++) free(g->rules[i].name);
    free(g->nodes), free(g->kids), free(g->pool), free(g->rules);
    free(g->edge_start), free(g->edges), free(g->flags);
    free(g);
}

celer_status grammar_parse(const char *src, size_t len, grammar **out, celer_error *e) {
    *out = NULL;
    grammar *g = calloc(1, sizeof *g);
    if (!g) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    parser p = {.s = src, .n = len, .g = g, .e = e};
    skip_space(&p, true);
    while (p.st == CELER_OK && peek(&p) >= 0) parse_rule(&p);
    for (int32_t r = 0; p.st == CELER_OK && r < g->n_rules; r++)
        if (g->rules[r].body < 0)
            p.st = error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                             "grammar line %d column %d: unknown rule '%s'", g->rules[r].line,
                             g->rules[r].col, g->rules[r].name);
    if (p.st == CELER_OK) {
        g->n_named = g->n_rules;
        g->root = -1;
        for (int32_t r = 0; r < g->n_rules; r++)
            if (!strcmp(g->rules[r].name, "root")) g->root = r;
        if (g->root < 0) {
            int line, col;
            where(src, len, &line, &col);
            p.st = error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                             "grammar line %d column %d: the grammar has no rule named 'root'",
                             line, col);
        }
    }
    if (p.st == CELER_OK) compile_all(&p);
    if (p.st != CELER_OK) {
        grammar_free(g);
        return p.st;
    }
    *out = g;
    return CELER_OK;
}

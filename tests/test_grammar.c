/*
 * test_grammar.c - the GBNF parser, the byte-level matcher and the token mask.
 *
 * The parser: every grammar of llama.cpp's grammars/ folder (tests/grammar/) parses, and
 * malformed grammars each fail with one line naming the line and column. The matcher is
 * checked against an independent reference written here: a memoized recursive-descent
 * recognizer over code points that reads the parsed rule tree (not the automaton) and
 * answers "complete sentence" and "prefix of a sentence". Strings come from random
 * derivations of each grammar, their prefixes, and random code-point mutations. The mask
 * is checked against the brute-force mask (each token tried on a clone) for a small
 * made-up vocabulary and for a real tokenizer's. A second, outside reference: llama.cpp's
 * own validator's verdicts on a few hundred strings (tests/grammar/golden_*.json, written by
 * tools/make_grammar_goldens.py). Also deep nesting and hostile grammars.
 */
#include "harness.h"

#include "sampling/grammar_impl.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static grammar *parse_str(const char *src) {
    grammar *g = NULL;
    celer_error e = {{0}};
    if (grammar_parse(src, strlen(src), &g, &e) != CELER_OK) {
        CHECK(false, "grammar should parse: %s\n%s", e.msg, src);
        return NULL;
    }
    return g;
}

static grammar *parse_file(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "tests/grammar/%s.gbnf", name);
    char *src = read_text_file(path);
    if (!src) {
        CHECK(false, "cannot read %s", path);
        return NULL;
    }
    const size_t n = strlen(src);
    grammar *g = NULL;
    celer_error e = {{0}};
    celer_status st = grammar_parse(src, n, &g, &e);
    CHECK(st == CELER_OK, "%s parses: %s", path, e.msg);
    free(src);
    return g;
}

/* ==== Random numbers ==== */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return n ? (uint32_t)(rng % n) : 0;
}

/* ==== Code points ==== */

static const uint32_t cp_pool[] = {
    'a',     'z',      'A',    '0',    '9',    '1',    ' ',    '\n',   '\t',   '"',
    '\\',    '{',      '}',    '[',    ']',    ',',    ':',    '-',    '+',    '.',
    'e',     'E',      '(',    ')',    '=',    '*',    '/',    '_',    '#',    'x',
    'u',     'n',      't',    'r',    'f',    'l',    's',    0x7F,   0x01,   0xE9,
    0xFC,    0x7FF,    0x800,  0x3042, 0x30A2, 0x4E00, 0x3001, 0x9FFF, 0xFFFF, 0x10000,
    0x1F600, 0x10FFFF, 0x2028, 0x85,   0xD7FF, 0xE000};
#define N_POOL (sizeof cp_pool / sizeof cp_pool[0])

static int enc(uint32_t cp, char *o) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | (cp >> 6 & 0x3F)),
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F)), o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static bool class_has(const grammar *g, const gnode *nd, uint32_t cp) {
    if (nd->kind == GN_ANY) return true;
    bool in = false;
    for (int32_t i = 0; i < nd->n; i++)
        if (cp >= g->pool[nd->off + 2 * i] && cp <= g->pool[nd->off + 2 * i + 1]) in = true;
    return in != nd->negated;
}

/* ==== Reference recognizer (over code points, on the rule tree) ==== */

typedef struct ref {
    const grammar *g;
    const uint32_t *cp;
    int n, W;
    uint64_t *memo; /* [rule][pos][W] */
    uint8_t *state; /* [rule][pos]: 0 unknown, 1 done */
    uint8_t *part;  /* [rule][pos] */
} ref;

static void set_or(uint64_t *a, const uint64_t *b, int W) {
    for (int i = 0; i < W; i++) a[i] |= b[i];
}

/* End positions of node k matched from pos into out[W] (or'ed); *partial when the input
 * ends inside a match that could go on. */
static void ref_match(ref *r, int32_t k, int pos, uint64_t *out, bool *partial) {
    const grammar *g = r->g;
    const gnode *nd = &g->nodes[k];
    int W = r->W;
    switch (nd->kind) {
    case GN_CHARS: {
        int i = 0;
        for (; i < nd->n; i++) {
            if (pos + i == r->n) {
                *partial = true;
                return;
            }
            if (r->cp[pos + i] != g->pool[nd->off + i]) return;
        }
        out[(pos + i) / 64] |= 1ull << ((pos + i) % 64);
        return;
    }
    case GN_CLASS:
    case GN_ANY:
        if (pos == r->n) {
            if (nd->kind == GN_ANY || nd->negated || nd->n) *partial = true;
            return;
        }
        if (class_has(g, nd, r->cp[pos])) out[(pos + 1) / 64] |= 1ull << ((pos + 1) % 64);
        return;
    case GN_REF: {
        size_t at = (size_t)nd->ref * (size_t)(r->n + 1) + (size_t)pos;
        if (!r->state[at]) {
            uint64_t *tmp = calloc((size_t)W, 8);
            bool p = false;
            ref_match(r, g->rules[nd->ref].body, pos, tmp, &p);
            memcpy(r->memo + at * (size_t)W, tmp, (size_t)W * 8);
            r->part[at] = p, r->state[at] = 1;
            free(tmp);
        }
        set_or(out, r->memo + at * (size_t)W, W);
        if (r->part[at]) *partial = true;
        return;
    }
    case GN_ALT:
        for (int32_t i = 0; i < nd->n_kid; i++)
            ref_match(r, g->kids[nd->kid + i], pos, out, partial);
        return;
    case GN_SEQ: {
        uint64_t *cur = calloc((size_t)W, 8), *next = calloc((size_t)W, 8);
        cur[pos / 64] |= 1ull << (pos % 64);
        for (int32_t i = 0; i < nd->n_kid; i++) {
            memset(next, 0, (size_t)W * 8);
            for (int p = pos; p <= r->n; p++)
                if (cur[p / 64] >> (p % 64) & 1)
                    ref_match(r, g->kids[nd->kid + i], p, next, partial);
            memcpy(cur, next, (size_t)W * 8);
        }
        set_or(out, cur, W);
        free(cur), free(next);
        return;
    }
    case GN_REPEAT: {
        uint64_t *cur = calloc((size_t)W, 8), *next = calloc((size_t)W, 8),
                 *all = calloc((size_t)W, 8);
        cur[pos / 64] |= 1ull << (pos % 64);
        if (nd->min == 0) set_or(out, cur, W);
        for (uint32_t k2 = 1; k2 <= nd->max; k2++) {
            memset(next, 0, (size_t)W * 8);
            for (int p = pos; p <= r->n; p++)
                if (cur[p / 64] >> (p % 64) & 1) ref_match(r, g->kids[nd->kid], p, next, partial);
            if (k2 >= nd->min) set_or(out, next, W);
            bool empty = true, grew = false;
            for (int i = 0; i < W; i++) {
                if (next[i]) empty = false;
                if (next[i] & ~all[i]) grew = true;
            }
            if (empty) break;
            if (nd->max == GRAMMAR_NO_MAX && k2 >= nd->min) {
                if (!grew) break;
                set_or(all, next, W);
                set_or(next, cur, W); /* monotone once past the minimum */
            }
            memcpy(cur, next, (size_t)W * 8);
        }
        free(cur), free(next), free(all);
        return;
    }
    }
}

/* Whether cp[n] is a complete sentence (*complete) and a prefix of one (returned). */
static bool ref_check(const grammar *g, const uint32_t *cp, int n, bool *complete) {
    ref r = {.g = g, .cp = cp, .n = n, .W = (n + 1 + 63) / 64};
    size_t cells = (size_t)g->n_rules * (size_t)(n + 1);
    r.memo = calloc(cells * (size_t)r.W, 8), r.state = calloc(cells, 1), r.part = calloc(cells, 1);
    uint64_t *out = calloc((size_t)r.W, 8);
    bool partial = false;
    ref_match(&r, g->rules[g->root].body, 0, out, &partial);
    *complete = out[n / 64] >> (n % 64) & 1;
    free(r.memo), free(r.state), free(r.part), free(out);
    return *complete || partial;
}

/* ==== Random derivations ==== */

static uint32_t *minlen; /* per rule; filled by minlen_fill */

static uint32_t node_minlen(const grammar *g, int32_t k) {
    const gnode *nd = &g->nodes[k];
    uint64_t m = 0;
    switch (nd->kind) {
    case GN_CHARS:
        return (uint32_t)nd->n;
    case GN_CLASS:
    case GN_ANY:
        return 1;
    case GN_REF:
        return minlen[nd->ref];
    case GN_ALT:
        m = UINT32_MAX;
        for (int32_t i = 0; i < nd->n_kid; i++) {
            uint32_t x = node_minlen(g, g->kids[nd->kid + i]);
            if (x < m) m = x;
        }
        return (uint32_t)m;
    case GN_SEQ:
        for (int32_t i = 0; i < nd->n_kid; i++) m += node_minlen(g, g->kids[nd->kid + i]);
        return m > UINT32_MAX / 2 ? UINT32_MAX / 2 : (uint32_t)m;
    case GN_REPEAT:
        m = (uint64_t)nd->min * node_minlen(g, g->kids[nd->kid]);
        return m > UINT32_MAX / 2 ? UINT32_MAX / 2 : (uint32_t)m;
    }
    return 0;
}

static void minlen_fill(const grammar *g) {
    free(minlen);
    minlen = malloc((size_t)g->n_rules * sizeof *minlen);
    for (int32_t i = 0; i < g->n_rules; i++) minlen[i] = UINT32_MAX / 2;
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t i = 0; i < g->n_rules; i++) {
            uint32_t x = node_minlen(g, g->rules[i].body);
            if (x < minlen[i]) minlen[i] = x, changed = true;
        }
    }
}

static uint32_t pick_cp(const grammar *g, const gnode *nd) {
    if (nd->kind == GN_CLASS && !nd->negated && nd->n) {
        int32_t i = (int32_t)rnd((uint32_t)nd->n);
        uint32_t lo = g->pool[nd->off + 2 * i], hi = g->pool[nd->off + 2 * i + 1];
        uint32_t c = rnd(3) == 0 ? lo : rnd(2) ? hi : lo + rnd(hi - lo + 1);
        return c >= 0xD800 && c <= 0xDFFF ? lo : c;
    }
    for (int t = 0; t < 200; t++) {
        uint32_t c = cp_pool[rnd(N_POOL)];
        if (class_has(g, nd, c)) return c;
    }
    return UINT32_MAX;
}

typedef struct cps {
    uint32_t *v;
    int n, cap;
} cps;

static void cps_add(cps *s, uint32_t c) {
    if (s->n == s->cap) s->cap = s->cap ? 2 * s->cap : 64, s->v = realloc(s->v, (size_t)s->cap * 4);
    s->v[s->n++] = c;
}

static bool derive(const grammar *g, int32_t k, int depth, cps *out) {
    const gnode *nd = &g->nodes[k];
    bool small = depth > 12 || out->n > 120;
    switch (nd->kind) {
    case GN_CHARS:
        for (int32_t i = 0; i < nd->n; i++) cps_add(out, g->pool[nd->off + i]);
        return true;
    case GN_CLASS:
    case GN_ANY: {
        uint32_t c = pick_cp(g, nd);
        if (c == UINT32_MAX) return false;
        cps_add(out, c);
        return true;
    }
    case GN_REF:
        return depth < 200 && derive(g, g->rules[nd->ref].body, depth + 1, out);
    case GN_ALT: {
        int32_t best = 0;
        if (small) {
            uint32_t bm = UINT32_MAX;
            for (int32_t i = 0; i < nd->n_kid; i++) {
                uint32_t x = node_minlen(g, g->kids[nd->kid + i]);
                if (x < bm) bm = x, best = i;
            }
        } else {
            best = (int32_t)rnd((uint32_t)nd->n_kid);
        }
        return derive(g, g->kids[nd->kid + best], depth + 1, out);
    }
    case GN_SEQ:
        for (int32_t i = 0; i < nd->n_kid; i++)
            if (!derive(g, g->kids[nd->kid + i], depth + 1, out)) return false;
        return true;
    case GN_REPEAT: {
        uint32_t extra = nd->max == GRAMMAR_NO_MAX ? 4 : nd->max - nd->min;
        uint32_t count = nd->min + (small ? 0 : rnd((extra < 4 ? extra : 4) + 1));
        for (uint32_t i = 0; i < count; i++)
            if (!derive(g, g->kids[nd->kid], depth + 1, out)) return false;
        return true;
    }
    }
    return true;
}

/* ==== Matcher against the reference ==== */

static const char *const tiny_tokens[] = {"{",     "}",
                                          "\"",    "\"a",
                                          "a",     "1",
                                          "12",    ", ",
                                          ":",     "[",
                                          "]",     "true",
                                          "null",  " ",
                                          "\n",    "\xC3\xA9",
                                          "\xC3",  "\xA9",
                                          "\"}",   "}]",
                                          "-",     "0.5e",
                                          "ab",    "\\n",
                                          "\\u00", "x",
                                          "=",     "(",
                                          ")",     "+",
                                          "- ",    "\xE3\x81",
                                          "\x82",  "\xE3\x81\x82",
                                          "1.",    "e+",
                                          "\t",    "\":",
                                          "{\"",   "\xF0\x9F\x98\x80",
                                          "/",     "*",
                                          "foo",   "xy",
                                          "ã"};
#define N_TINY (int)(sizeof tiny_tokens / sizeof tiny_tokens[0])

static void run_matcher(grammar_matcher *m, const uint32_t *cp, int n, bool *alive, bool *can_end) {
    char buf[8];
    *alive = true;
    for (int i = 0; i < n && *alive; i++)
        *alive = grammar_matcher_accept_bytes(m, buf, (size_t)enc(cp[i], buf));
    *can_end = *alive && grammar_matcher_can_end(m);
}

static int n_mismatch;

static void compare(const char *name, const grammar *g, const grammar_vocab *v, const uint32_t *cp,
                    int n, const char *what) {
    bool complete, prefix = ref_check(g, cp, n, &complete);
    grammar_matcher *m = grammar_matcher_create(g, v);
    bool alive, can_end;
    run_matcher(m, cp, n, &alive, &can_end);
    if ((alive != prefix || can_end != complete) && n_mismatch++ < 10) {
        char text[1024];
        int k = 0;
        for (int i = 0; i < n && k < 1000; i++) k += enc(cp[i], text + k);
        text[k] = 0;
        CHECK(false, "%s (%s): '%s': matcher prefix %d end %d, reference prefix %d end %d", name,
              what, text, alive, can_end, prefix, complete);
    }
    grammar_matcher_free(m);
}

static void mutate(cps *s) {
    int op = (int)rnd(3), at = (int)rnd((uint32_t)s->n + 1);
    if (op == 0 || !s->n) { /* insert */
        cps_add(s, 0);
        memmove(s->v + at + 1, s->v + at, (size_t)(s->n - 1 - at) * 4);
        s->v[at] = cp_pool[rnd(N_POOL)];
    } else {
        if (at == s->n) at--;
        if (op == 1)
            memmove(s->v + at, s->v + at + 1, (size_t)(s->n - at - 1) * 4), s->n--;
        else
            s->v[at] = cp_pool[rnd(N_POOL)];
    }
}

static void test_against_reference(const char *name, grammar *g, int n_strings) {
    if (!g) return;
    const char *toks[1] = {"a"};
    size_t lens[1] = {1};
    grammar_vocab *v;
    celer_error e;
    CHECK(grammar_vocab_create(toks, lens, 1, NULL, 0, &v, &e) == CELER_OK, "vocab");
    minlen_fill(g);
    n_mismatch = 0;
    int checked = 0, derived = 0;
    for (int k = 0; k < n_strings; k++) {
        cps s = {0};
        if (!derive(g, g->rules[g->root].body, 0, &s) || s.n > 400) {
            free(s.v);
            continue;
        }
        derived++;
        /* a derived string is a sentence: the matcher must accept it whole */
        grammar_matcher *m = grammar_matcher_create(g, v);
        bool alive, can_end;
        run_matcher(m, s.v, s.n, &alive, &can_end);
        if (!(alive && can_end) && n_mismatch++ < 10)
            CHECK(false, "%s: derived sentence %d refused", name, k);
        grammar_matcher_free(m);
        if (s.n <= 150) {
            compare(name, g, v, s.v, s.n, "sentence");
            for (int t = 0; t < 3; t++)
                compare(name, g, v, s.v, (int)rnd((uint32_t)s.n + 1), "prefix");
            for (int t = 0; t < 4; t++) {
                cps c = {0};
                for (int i = 0; i < s.n; i++) cps_add(&c, s.v[i]);
                for (int j = 0, nm = 1 + (int)rnd(3); j < nm; j++) mutate(&c);
                compare(name, g, v, c.v, c.n, "mutation");
                compare(name, g, v, c.v, (int)rnd((uint32_t)c.n + 1), "mutation prefix");
                free(c.v);
                checked += 2;
            }
            checked += 4;
        }
        free(s.v);
    }
    CHECK(n_mismatch == 0, "%s: %d of %d strings disagree with the reference", name, n_mismatch,
          checked);
    CHECK(derived >= n_strings / 2, "%s: only %d of %d derivations finished", name, derived,
          n_strings);
    printf("%s: %d derived sentences, %d strings compared with the reference\n", name, derived,
           checked);
    grammar_vocab_free(v);
}

/* ==== Mask against brute force ==== */

static uint32_t cache_limit; /* when set, matchers trim their caches past this many entries */

static int mask_check(const grammar_vocab *v, grammar_matcher *m, const char *const *bytes,
                      const size_t *len, int64_t n_vocab, const int32_t *eos, int n_eos) {
    int64_t W = (n_vocab + 31) / 32;
    uint32_t *mask = calloc((size_t)W, 4), *want = calloc((size_t)W, 4);
    bool ret = grammar_matcher_mask(m, mask);
    bool any = false;
    for (int64_t i = 0; i < n_vocab; i++) {
        bool ok = false;
        bool is_eos = false;
        for (int k = 0; k < n_eos; k++) is_eos |= eos[k] == i;
        if (is_eos)
            ok = grammar_matcher_can_end(m);
        else if (len[i]) {
            grammar_matcher *c = grammar_matcher_clone(m);
            ok = grammar_matcher_accept_bytes(c, bytes[i], len[i]);
            grammar_matcher_free(c);
        }
        if (ok) want[i / 32] |= 1u << (i % 32), any = true;
    }
    int bad = 0;
    for (int64_t i = 0; i < W; i++) bad += mask[i] != want[i];
    bad += ret != any;
    free(mask), free(want);
    return bad;
}

static void test_mask_sentences(const char *name, grammar *g, const char *const *bytes,
                                const size_t *len, int64_t n_vocab, const int32_t *eos, int n_eos,
                                int n_sent, int every) {
    if (!g) return;
    grammar_vocab *v;
    celer_error e;
    if (grammar_vocab_create(bytes, len, n_vocab, eos, n_eos, &v, &e) != CELER_OK) {
        CHECK(false, "vocab: %s", e.msg);
        return;
    }
    minlen_fill(g);
    int positions = 0, bad = 0;
    for (int k = 0; k < n_sent; k++) {
        cps s = {0};
        if (!derive(g, g->rules[g->root].body, 0, &s)) {
            free(s.v);
            continue;
        }
        char *text = malloc((size_t)s.n * 4 + 1);
        int tn = 0;
        for (int i = 0; i < s.n; i++) tn += enc(s.v[i], text + tn);
        grammar_matcher *m = grammar_matcher_create(g, v);
        if (cache_limit) grammar_matcher_limit_caches(m, cache_limit, cache_limit);
        for (int at = 0; at <= tn; at++) {
            if (at % every == 0 || at == tn)
                bad += mask_check(v, m, bytes, len, n_vocab, eos, n_eos) != 0, positions++;
            if (at < tn && !grammar_matcher_accept_bytes(m, text + at, 1)) {
                CHECK(false, "%s: derived sentence refused at byte %d", name, at);
                break;
            }
        }
        CHECK(grammar_matcher_can_end(m), "%s: sentence can end", name);
        if (n_eos) {
            CHECK(grammar_matcher_accept_token(m, eos[0]), "%s: eos accepted at the end", name);
            CHECK(!grammar_matcher_accept_bytes(m, "a", 1) && grammar_matcher_must_end(m),
                  "%s: nothing after eos", name);
        }
        grammar_matcher_free(m);
        free(text), free(s.v);
    }
    CHECK(bad == 0, "%s: %d of %d masks differ from brute force", name, bad, positions);
    printf("%s: %d masks equal to brute force over %lld tokens\n", name, positions - bad,
           (long long)n_vocab);
    grammar_vocab_free(v);
}

/* ==== Parser ==== */

static void test_parse_files(void) {
    static const char *names[] = {"arithmetic", "c",    "chess",    "english",
                                  "japanese",   "json", "json_arr", "list"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) grammar_free(parse_file(names[i]));
}

static void test_errors(void) {
    static const struct {
        const char *src, *want;
    } cases[] = {
        {"root ::= foo\n", "line 1 column 10: unknown rule 'foo'"},
        {"main ::= \"a\"\n", "no rule named 'root'"},
        {"", "no rule named 'root'"},
        {"root ::= \"abc\n", "line 1 column 10: unterminated string literal"},
        {"root ::= [a-z\n", "line 1 column 10: unterminated character class"},
        {"root ::= \"\\q\"\n", "line 1 column 11: unknown escape"},
        {"root ::= \"\\x4\"\n", "expecting 2 hex digits"},
        {"root ::= \"a\"{3,2}\n", "line 1 column 13: repetition bounds {3,2}"},
        {"root ::= \"a\"{5000}\n", "repetition minimum 5000"},
        {"root ::= \"a\"{,}\n", "name no bound"},
        {"root ::= \"a\"{x}\n", "expecting an integer"},
        {"root ::= * \"a\"\n", "line 1 column 10: '*' has no preceding item"},
        {"root ::= (\"a\" \"b\"\n", "expecting ')'"},
        {"root ::= a\na ::= a \"x\"\n", "line 2 column 1: left recursion: rule 'a'"},
        {"root ::= b \"x\"\nb ::= c? root\nc ::= \"y\"\n", "left recursion"},
        {"root ::= \"a\"\n  ::= \"b\"\n", "line 2 column 3: expecting a rule name"},
        {"root \"a\"\n", "line 1 column 6: expecting '::='"},
        {"root ::= [z-a]\n", "line 1 column 11: character range"},
        {"root ::= <[12]>\n", "token references"},
        {"root ::= \"a\" )\n", "line 1 column 14: unexpected ')'"},
        {"root ::= \"\xff\"\n", "invalid UTF-8"},
        {"root ::= \"\\U00110000\"\n", "beyond U+10FFFF"},
        {"root ::= \"a\"\n\nx ::= y\n", "line 3 column 7: unknown rule 'y'"},
        {"root ::= \"a\"*********\n", "more than 8 repetition operators"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        grammar *g = NULL;
        celer_error e = {{0}};
        celer_status st = grammar_parse(cases[i].src, strlen(cases[i].src), &g, &e);
        CHECK(st == CELER_STATUS_INVALID_ARGUMENT && !g, "case %zu is refused", i);
        CHECK(strstr(e.msg, cases[i].want) && !strncmp(e.msg, "grammar line ", 13) &&
                  !strchr(e.msg, '\n'),
              "case %zu: message '%s' wants '%s'", i, e.msg, cases[i].want);
        grammar_free(g);
    }
    /* deep parentheses: refused with a message, no deep C recursion */
    size_t n = 200000;
    char *deep = malloc(2 * n + 32);
    strcpy(deep, "root ::= ");
    size_t k = strlen(deep);
    for (size_t i = 0; i < n; i++) deep[k++] = '(';
    deep[k++] = '"', deep[k++] = 'a', deep[k++] = '"';
    for (size_t i = 0; i < n; i++) deep[k++] = ')';
    grammar *g = NULL;
    celer_error e = {{0}};
    CHECK(grammar_parse(deep, k, &g, &e) != CELER_OK && strstr(e.msg, "nested deeper"),
          "deep nesting: %s", e.msg);
    free(deep);
    /* a large bounded repetition: bounded states, parses, matches exactly */
    g = parse_str("root ::= [a-c]{2000} \"x\"{0,1999}\n");
    if (g) {
        const char *t[1] = {"a"};
        size_t l[1] = {1};
        grammar_vocab *v;
        grammar_vocab_create(t, l, 1, NULL, 0, &v, &e);
        grammar_matcher *m = grammar_matcher_create(g, v);
        char *s = malloc(4000);
        memset(s, 'b', 2000), memset(s + 2000, 'x', 1999);
        CHECK(!grammar_matcher_accept_bytes(m, s, 1999) || !grammar_matcher_can_end(m),
              "1999 are too few");
        CHECK(grammar_matcher_accept_bytes(m, s + 1999, 1) && grammar_matcher_can_end(m),
              "2000 suffice");
        CHECK(grammar_matcher_accept_bytes(m, s + 2000, 1999) && grammar_matcher_must_end(m),
              "then 1999 x");
        CHECK(!grammar_matcher_accept_bytes(m, "x", 1), "not 2000 x");
        free(s);
        grammar_matcher_free(m), grammar_vocab_free(v), grammar_free(g);
    }
}

/* ==== Deep nesting ==== */

static void test_deep_json(void) {
    grammar *g = parse_file("json");
    if (!g) return;
    const char *t[2] = {"[", "]"};
    size_t l[2] = {1, 1};
    int32_t eos = 1;
    grammar_vocab *v;
    celer_error e;
    grammar_vocab_create(t, l, 2, &eos, 0, &v, &e);
    grammar_matcher *m = grammar_matcher_create(g, v);
    int depth = 10000;
    bool ok = grammar_matcher_accept_bytes(m, "{\"a\":", 5);
    for (int i = 0; i < depth && ok; i++) ok = grammar_matcher_accept_bytes(m, "[", 1);
    uint32_t mask[1];
    CHECK(ok && grammar_matcher_mask(m, mask) && mask[0] == 3,
          "10000 deep: both brackets allowed (%x)", mask[0]);
    grammar_matcher *c = grammar_matcher_clone(m);
    for (int i = 0; i < depth && ok; i++) ok = grammar_matcher_accept_bytes(m, "]", 1);
    CHECK(ok && !grammar_matcher_can_end(m) && grammar_matcher_accept_bytes(m, "}", 1) &&
              grammar_matcher_can_end(m),
          "10000 deep JSON closes");
    CHECK(!grammar_matcher_accept_bytes(c, "]}", 2), "the clone is independent and still deep");
    grammar_matcher_free(c), grammar_matcher_free(m);
    grammar_vocab_free(v), grammar_free(g);
}

/* ==== llama.cpp's verdicts ==== */

static void test_goldens(void) {
    static const char *names[] = {"json", "arithmetic", "list", "chess", "japanese", "c"};
    const char *t[1] = {"a"};
    size_t l[1] = {1};
    grammar_vocab *v;
    celer_error e;
    grammar_vocab_create(t, l, 1, NULL, 0, &v, &e);
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        char path[256];
        snprintf(path, sizeof path, "tests/grammar/golden_%s.json", names[k]);
        json_error_t je;
        json_t *doc = json_load_file(path, 0, &je);
        if (!CHECK(doc != NULL, "%s: %s", path, je.text)) continue;
        grammar *g = parse_file(names[k]);
        json_t *recs = json_object_get(doc, "records");
        size_t n = json_array_size(recs), agree = 0, valid = 0;
        for (size_t i = 0; g && i < n; i++) {
            json_t *r = json_array_get(recs, i);
            const char *in = json_string_value(json_object_get(r, "input"));
            size_t in_n = json_string_length(json_object_get(r, "input"));
            bool want_valid = json_is_true(json_object_get(r, "valid"));
            bool want_prefix = json_is_true(json_object_get(r, "prefix"));
            grammar_matcher *m = grammar_matcher_create(g, v);
            bool alive = grammar_matcher_accept_bytes(m, in, in_n);
            bool end = alive && grammar_matcher_can_end(m);
            grammar_matcher_free(m);
            bool ok = alive == want_prefix && end == want_valid;
            agree += ok, valid += want_valid;
            CHECK(ok, "%s: '%s': celer prefix %d complete %d, llama.cpp prefix %d complete %d",
                  names[k], in, alive, end, want_prefix, want_valid);
        }
        CHECK(n >= 30 && valid > 0, "%s: %zu records, %zu valid", path, n, valid);
        printf("%s: %zu of %zu llama.cpp verdicts agree (%zu valid)\n", path, agree, n, valid);
        grammar_free(g);
        json_decref(doc);
    }
    grammar_vocab_free(v);
}

/* ==== Real vocabulary ==== */

static void real_vocab_masks(const char *tok_name, const char *grammar_name, const char *eos_text,
                             int n_sent, int every) {
    char dir[512];
    if (!tokenizer_dir(tok_name, dir, sizeof dir)) {
        SKIP_REQUIRED("%s tokenizer: %s", tok_name, dir);
        return;
    }
    tokenizer *t;
    celer_error e;
    if (tok_load(dir, &t, &e) != CELER_OK) {
        CHECK(false, "load %s: %s", dir, e.msg);
        return;
    }
    char **bytes;
    size_t *len;
    if (CHECK(tok_vocab_bytes(t, &bytes, &len, &e) == CELER_OK, "tok_vocab_bytes: %s", e.msg)) {
        int32_t eos = tok_token_to_id(t, eos_text, strlen(eos_text));
        CHECK(eos >= 0, "%s: eos token %s", tok_name, eos_text);
        grammar *g = parse_file(grammar_name);
        char name[64];
        snprintf(name, sizeof name, "%s/%s", grammar_name, tok_name);
        rng = 12345;
        test_mask_sentences(name, g, (const char *const *)bytes, len, tok_vocab_size(t), &eos, 1,
                            n_sent, every);
        grammar_free(g);
        tok_vocab_bytes_free(bytes, len);
    }
    tok_free(t);
}

/* ==== Threads ==== */

/* Matchers over one grammar and vocabulary on four threads at once: each thread's masks
 * along the same text equal those computed alone beforehand. */
typedef struct thread_job {
    const grammar *g;
    const grammar_vocab *v;
    const char *text;
    int n_text, n_words;
    const uint32_t *want;
    int bad;
} thread_job;

static void *thread_run(void *arg) {
    thread_job *j = arg;
    for (int round = 0; round < 20; round++) {
        grammar_matcher *m = grammar_matcher_create(j->g, j->v);
        uint32_t mask[8];
        for (int at = 0; at <= j->n_text; at++) {
            grammar_matcher_mask(m, mask);
            j->bad += memcmp(mask, j->want + (size_t)at * (size_t)j->n_words,
                             (size_t)j->n_words * 4) != 0;
            if (at < j->n_text) grammar_matcher_accept_bytes(m, j->text + at, 1);
        }
        grammar_matcher_free(m);
    }
    return NULL;
}

static void test_threads(const char *const *bytes, const size_t *len, int n_vocab) {
    grammar *g = parse_file("json");
    if (!g) return;
    grammar_vocab *v;
    celer_error e;
    int32_t eos = 0;
    grammar_vocab_create(bytes, len, n_vocab, &eos, 1, &v, &e);
    const char *text =
        "{\"k\u00e9y\": [1, -2.5e3, {\"s\": \"caf\xC3\xA9 \\\" \xE3\x81\x82\"}], \"t\": true}";
    int n_text = (int)strlen(text), n_words = (n_vocab + 31) / 32;
    uint32_t *want = calloc((size_t)(n_text + 1) * (size_t)n_words, 4);
    grammar_matcher *m = grammar_matcher_create(g, v);
    bool ok = true;
    for (int at = 0; at <= n_text && ok; at++) {
        grammar_matcher_mask(m, want + (size_t)at * (size_t)n_words);
        if (at < n_text) ok = grammar_matcher_accept_bytes(m, text + at, 1);
    }
    CHECK(ok && grammar_matcher_can_end(m), "threads: the text is a sentence");
    grammar_matcher_free(m);
    thread_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (thread_job){g, v, text, n_text, n_words, want, 0};
        pthread_create(&th[i], NULL, thread_run, &jobs[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL), bad += jobs[i].bad;
    CHECK(bad == 0, "threads: %d masks differ from the single-threaded ones", bad);
    free(want);
    grammar_vocab_free(v), grammar_free(g);
}

/* ==== Main ==== */

int main(void) {
    test_parse_files();
    test_errors();
    static const char *files[] = {"json", "arithmetic", "list",    "chess",
                                  "c",    "japanese",   "json_arr"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        grammar *g = parse_file(files[i]);
        test_against_reference(files[i], g, 150);
        grammar_free(g);
    }
    static const char *own[] = {
        "root ::= ([a-f0-9]{2,4} | [^a-z\\n]+ \"!\" | .{1,3} \"?\")* \"end\"\n",
        ("root ::= item (\",\" item){0,3}\nitem ::= \"x\" | \"[\" root? \"]\" | "
         "[\\u00e9-\\u3042]{1,2} | [^\\x00-\\u07ff]\n"),
        "root ::= ( | \"a\" | \"b\" root) (\"\\xe9\" | [\\U0001F600-\\U0001F64F])?\n",
        "root ::= a b c\na ::= \"p\"?\nb ::= (\"q\" | )*\nc ::= [^pq]{0,2} a\n",
        "root ::= (\"ab\" | \"a\" \"b\"? | [a-b]+)+ \".\"\n",
        "root ::= [\\u0080-\\u07ff\\u0800-\\uffff]+ [\\U00010000-\\U0010ffff]? | \"\"\n",
        "root ::= x{0,3} \"-\" x{2} x{1,}\nx ::= \"(\" root? \")\" | [0-9]\n",
    };
    for (size_t i = 0; i < sizeof own / sizeof *own; i++) {
        char name[32];
        snprintf(name, sizeof name, "own%zu", i);
        grammar *g = parse_str(own[i]);
        test_against_reference(name, g, 150);
        grammar_free(g);
    }
    /* the tiny vocabulary: id 0 is eos, id 1 a special token (no bytes) */
    {
        const char *bytes[N_TINY + 2];
        size_t len[N_TINY + 2];
        bytes[0] = bytes[1] = "", len[0] = len[1] = 0;
        for (int i = 0; i < N_TINY; i++)
            bytes[i + 2] = tiny_tokens[i], len[i + 2] = strlen(tiny_tokens[i]);
        int32_t eos = 0;
        static const char *mask_files[] = {"json", "arithmetic", "list", "japanese"};
        for (size_t i = 0; i < sizeof mask_files / sizeof *mask_files; i++) {
            grammar *g = parse_file(mask_files[i]);
            test_mask_sentences(mask_files[i], g, bytes, len, N_TINY + 2, &eos, 1, 20, 1);
            grammar_free(g);
        }
        for (size_t i = 0; i < sizeof own / sizeof *own; i++) {
            grammar *g = parse_str(own[i]);
            test_mask_sentences("own", g, bytes, len, N_TINY + 2, &eos, 1, 20, 1);
            grammar_free(g);
        }
        test_threads(bytes, len, N_TINY + 2);
        /* the same masks with caches trimmed nearly every call */
        cache_limit = 8;
        for (size_t i = 0; i < sizeof mask_files / sizeof *mask_files; i++) {
            grammar *g = parse_file(mask_files[i]);
            test_mask_sentences("trimmed caches", g, bytes, len, N_TINY + 2, &eos, 1, 10, 1);
            grammar_free(g);
        }
        cache_limit = 0;
        /* must_end: a finished fixed sentence */
        grammar *g = parse_str("root ::= \"ab\" (\"c\")?\n");
        grammar_vocab *v;
        celer_error e;
        grammar_vocab_create(bytes, len, N_TINY + 2, &eos, 1, &v, &e);
        grammar_matcher *m = grammar_matcher_create(g, v);
        CHECK(grammar_matcher_accept_bytes(m, "ab", 2) && grammar_matcher_can_end(m) &&
                  !grammar_matcher_must_end(m),
              "ab: may end, need not");
        CHECK(grammar_matcher_accept_bytes(m, "c", 1) && grammar_matcher_must_end(m),
              "abc: must end");
        uint32_t mask[2];
        CHECK(grammar_matcher_mask(m, mask) && mask[0] == 1 && mask[1] == 0,
              "abc: only eos (%x %x)", mask[0], mask[1]);
        CHECK(grammar_matcher_accept_token(m, 0) && !grammar_matcher_mask(m, mask),
              "after eos: nothing");
        grammar_matcher_free(m);
        grammar_vocab_free(v), grammar_free(g);
    }
    test_goldens();
    test_deep_json();
    real_vocab_masks("llama3_1", "json", "<|eot_id|>", 4, 5);
    real_vocab_masks("qwen3", "japanese", "<|im_end|>", 3, 4);
    free(minlen);
    return harness_done("test_grammar");
}

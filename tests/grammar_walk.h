/*
 * grammar_walk.h - helpers shared by the structured-output tests (test_json_schema.c,
 * test_regex_gbnf.c): whole-string acceptance by a compiled GBNF grammar, and random
 * sentences of a grammar drawn byte by byte from the matcher's mask over a vocabulary of
 * the 256 single bytes plus an end token. Header-only (static functions): the Makefile
 * links each test from one file.
 */
#ifndef CELER_TESTS_GRAMMAR_WALK_H
#define CELER_TESTS_GRAMMAR_WALK_H

#include "sampling/grammar.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* Whether g accepts exactly s[n]. */
static bool walk_accepts(const grammar *g, const grammar_vocab *v, const char *s, size_t n) {
    grammar_matcher *m = grammar_matcher_create(g, v);
    bool ok = m && grammar_matcher_accept_bytes(m, s, n) && grammar_matcher_can_end(m);
    grammar_matcher_free(m);
    return ok;
}

/* Token i < 256 is byte i; token 256 is the end. Free with grammar_vocab_free. */
static grammar_vocab *walk_vocab(void) {
    static char bytes[256];
    const char *t[257];
    size_t l[257];
    for (int i = 0; i < 256; i++) bytes[i] = (char)i, t[i] = &bytes[i], l[i] = 1;
    t[256] = "", l[256] = 0;
    int32_t eos = 256;
    grammar_vocab *v = NULL;
    celer_error e;
    if (grammar_vocab_create(t, l, 257, &eos, 1, &v, &e) != CELER_OK) return NULL;
    return v;
}

static uint64_t walk_rand(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

/* A random sentence of g into out[cap] (NUL-terminated): each step takes a random allowed
 * byte, or ends where the grammar may end (with probability 1/4, always when must_end). Its
 * length, or -1 when no end was reached within cap - 1 bytes. */
static long walk_sentence(const grammar *g, const grammar_vocab *v, uint64_t *rng, char *out,
                          size_t cap) {
    grammar_matcher *m = grammar_matcher_create(g, v);
    uint32_t allowed[(257 + 31) / 32];
    size_t n = 0;
    long result = -1;
    while (m && n + 1 < cap) {
        if (grammar_matcher_must_end(m) ||
            (grammar_matcher_can_end(m) && walk_rand(rng) % 4 == 0)) {
            result = (long)n;
            break;
        }
        if (!grammar_matcher_mask(m, allowed)) break;
        int ids[256], k = 0;
        for (int i = 0; i < 256; i++)
            if (allowed[i / 32] >> (i % 32) & 1) ids[k++] = i;
        if (!k) break;
        char b = (char)ids[walk_rand(rng) % (uint64_t)k];
        if (!grammar_matcher_accept_bytes(m, &b, 1)) break;
        out[n++] = b;
    }
    out[n] = 0;
    grammar_matcher_free(m);
    return result;
}

#endif

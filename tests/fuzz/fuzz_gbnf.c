/*
 * fuzz_gbnf.c - libFuzzer target for the GBNF parser and the grammar matcher.
 *
 * The input is a grammar. It must either fail to parse with a one-line message, or
 * compile; then a matcher over a tiny built-in vocabulary follows a few byte strings
 * chosen by the masks themselves (always the first allowed token, then the last), and
 * the mask must agree with trying each token on a clone. Never crash, leak, or run
 * unbounded.
 */
#include "sampling/grammar.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const tokens[] = {
    "",    "a", "b", "ab", "{",        "}",    "\"",   " ",
    "\n",  "0", "1", "-",  "\xC3\xA9", "\xC3", "\xA9", "\xE3\x81\x82",
    "x y", "[", "]", ",",  ":",        "\\",   "true", "\xF0\x9F\x98\x80"};
#define N_TOK (int)(sizeof tokens / sizeof tokens[0])

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static grammar_vocab *v;
    celer_error e;
    if (!v) {
        size_t len[N_TOK];
        for (int i = 0; i < N_TOK; i++) len[i] = strlen(tokens[i]);
        int32_t eos = 0;
        if (grammar_vocab_create(tokens, len, N_TOK, &eos, 1, &v, &e) != CELER_OK) abort();
    }
    grammar *g;
    if (grammar_parse((const char *)data, size, &g, &e) != CELER_OK) {
        if (memchr(e.msg, '\n', strlen(e.msg))) abort(); /* one line */
        return 0;
    }
    for (int pick_last = 0; pick_last < 2; pick_last++) {
        grammar_matcher *m = grammar_matcher_create(g, v);
        if (!m) break;
        for (int step = 0; step < 16; step++) {
            uint32_t mask[(N_TOK + 31) / 32];
            bool any = grammar_matcher_mask(m, mask);
            int chosen = -1;
            for (int i = 0; i < N_TOK; i++) {
                bool want = false;
                if (i == 0)
                    want = grammar_matcher_can_end(m);
                else {
                    grammar_matcher *c = grammar_matcher_clone(m);
                    if (!c) break;
                    want = grammar_matcher_accept_bytes(c, tokens[i], strlen(tokens[i]));
                    grammar_matcher_free(c);
                }
                bool got = mask[i / 32] >> (i % 32) & 1;
                if (got != want) abort(); /* the mask disagrees with brute force */
                if (got && i && (chosen < 0 || pick_last)) chosen = i;
            }
            if (!any || chosen < 0) break;
            if (!grammar_matcher_accept_token(m, chosen)) abort();
        }
        grammar_matcher_free(m);
    }
    grammar_free(g);
    return 0;
}

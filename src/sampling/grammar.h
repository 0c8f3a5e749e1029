/*
 * grammar.h - grammar-constrained decoding: GBNF grammars (llama.cpp's syntax), a matcher
 * that follows one output through a grammar byte by byte, and the mask of the tokens that
 * keep the output inside it.
 *
 * A grammar compiles to a byte-level pushdown automaton (grammar_parse.c); a matcher keeps
 * its position as an interned set of persistent stacks and caches its transitions, and the
 * mask walks the vocabulary's byte trie through that cache (grammar.c). This module sees
 * only byte strings: it knows nothing of tokenizers, logits or models.
 *
 *     grammar *g;  grammar_vocab *v;  celer_error e;
 *     grammar_parse(text, strlen(text), &g, &e);
 *     grammar_vocab_create(bytes, lens, n_vocab, &eos_id, 1, &v, &e);
 *     grammar_matcher *m = grammar_matcher_create(g, v);
 *     while (...) {
 *         grammar_matcher_mask(m, allowed);        // then mask the logits, sample id
 *         grammar_matcher_accept_token(m, id);
 *         if (grammar_matcher_must_end(m)) break;
 *     }
 *
 * Thread safety: a grammar and a vocabulary are immutable and may be shared by matchers
 * used from several threads at once; a matcher (and all it caches) belongs to one thread
 * at a time.
 */
#ifndef CELER_SAMPLING_GRAMMAR_H
#define CELER_SAMPLING_GRAMMAR_H

#include "base/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct grammar grammar;                 /* compiled; immutable */
typedef struct grammar_vocab grammar_vocab;     /* the vocabulary's byte strings (a trie) */
typedef struct grammar_matcher grammar_matcher; /* one output's position in a grammar */

/* Parses GBNF in llama.cpp's syntax; the start rule is "root". Errors are one line:
 * "grammar line L column C: ...". Free with grammar_free. */
celer_status grammar_parse(const char *src, size_t len, grammar **out, celer_error *e);
void grammar_free(grammar *g);

/* bytes[i][len[i]]: what token i appends to the output text. A token of length 0 (special
 * and control tokens) is never allowed by a mask. eos[n_eos]: the ids allowed exactly
 * where the grammar may end. Free with grammar_vocab_free. */
celer_status grammar_vocab_create(const char *const *bytes, const size_t *len, int64_t n_vocab,
                                  const int32_t *eos, int32_t n_eos, grammar_vocab **out,
                                  celer_error *e);
void grammar_vocab_free(grammar_vocab *v);
int64_t grammar_vocab_size(const grammar_vocab *v);

/* NULL when out of memory. The matcher refers to g and v; both must outlive it. */
grammar_matcher *grammar_matcher_create(const grammar *g, const grammar_vocab *v);
void grammar_matcher_free(grammar_matcher *m);
/* An independent copy at the same position (NULL when out of memory). */
grammar_matcher *grammar_matcher_clone(const grammar_matcher *m);

/* Advances over the bytes; false (and the matcher unchanged) when they leave the grammar. */
bool grammar_matcher_accept_bytes(grammar_matcher *m, const char *s, size_t n);
/* The same for a token's bytes; an eos id is accepted only where the grammar may end, and
 * ends the matcher (nothing is accepted after it). */
bool grammar_matcher_accept_token(grammar_matcher *m, int32_t id);
/* Whether the grammar may end here (the text so far is a complete sentence). */
bool grammar_matcher_can_end(const grammar_matcher *m);
/* Whether nothing but the end can follow (the sentence is complete and no byte extends
 * it): the caller stops generating. */
bool grammar_matcher_must_end(const grammar_matcher *m);
/* allowed[(n_vocab + 31) / 32]: bit (id % 32) of word id / 32 set for every token whose
 * bytes keep the text a prefix of some sentence (an eos id: where the grammar may end).
 * Never all zero for a matcher that has not ended, unless the vocabulary cannot continue
 * the sentence at all: then returns false (also for an ended matcher). */
bool grammar_matcher_mask(grammar_matcher *m, uint32_t *allowed);

#endif

/*
 * logits_proc.c - an output's logits processors and sampler (logits_proc.h).
 *
 * The penalties keep a count per vocabulary id and the list of ids counted, so applying
 * them costs the completion's distinct tokens, not the vocabulary. The grammar mask is a
 * bit per id (grammar_matcher_mask); the ending ids have no bytes, so the mask never sets
 * theirs, and they are let through here where the sentence may end.
 */
#include "sampling/logits_proc.h"

#include <math.h>
#include <stdlib.h>

struct logits_proc {
    logits_proc_params p;
    int64_t n_vocab;
    sampler *smp;
    int32_t *counts; /* [n_vocab] occurrences in the completion, or NULL without penalties */
    int32_t *uniq;   /* [max_tokens] the distinct ids counts has seen */
    int64_t n_uniq;
    grammar_matcher *gm; /* with a grammar */
    uint32_t *allowed;   /* [(n_vocab + 31) / 32] the mask */
    float *end_logit;    /* [n_end] the ending ids' logits while the mask runs */
    bool ended;          /* an ending id was accepted */
};

logits_proc *logits_proc_create(const logits_proc_params *p, int64_t n_vocab, int64_t max_tokens) {
    logits_proc *lp = calloc(1, sizeof *lp);
    if (!lp) return NULL;
    lp->p = *p;
    lp->n_vocab = n_vocab;
    lp->smp = sampler_create(&p->sampler, n_vocab);
    bool ok = lp->smp != NULL;
    if (ok && (p->presence_penalty != 0 || p->frequency_penalty != 0))
        ok = (lp->counts = calloc((size_t)n_vocab, sizeof *lp->counts)) &&
             (lp->uniq = malloc(sizeof *lp->uniq * (size_t)(max_tokens > 0 ? max_tokens : 1)));
    if (ok && p->grammar)
        ok = (lp->gm = grammar_matcher_create(p->grammar, p->vocab)) &&
             (lp->allowed = malloc(sizeof *lp->allowed * (size_t)((n_vocab + 31) / 32))) &&
             (lp->end_logit = malloc(sizeof *lp->end_logit * (size_t)(p->n_end + 1)));
    if (!ok) {
        logits_proc_destroy(lp);
        return NULL;
    }
    return lp;
}

void logits_proc_destroy(logits_proc *lp) {
    if (!lp) return;
    sampler_destroy(lp->smp);
    free(lp->counts);
    free(lp->uniq);
    grammar_matcher_free(lp->gm);
    free(lp->allowed);
    free(lp->end_logit);
    free(lp);
}

bool logits_proc_greedy(const logits_proc *lp) {
    return lp->p.sampler.temp <= 0.0f && lp->p.sampler.repeat_penalty == 1.0f &&
           lp->p.n_bias == 0 && !lp->counts && !lp->gm;
}

/* Sets every logit the grammar rules out to -inf; false when nothing is left. */
static bool apply_grammar(logits_proc *lp, float *l) {
    const bool end = grammar_matcher_can_end(lp->gm);
    for (int32_t i = 0; i < lp->p.n_end; i++) lp->end_logit[i] = l[lp->p.end_ids[i]];
    const bool any = grammar_matcher_mask(lp->gm, lp->allowed);
    if (!any)
        for (int64_t i = 0; i < lp->n_vocab; i++) l[i] = -INFINITY;
    for (int64_t w = 0; any && w < (lp->n_vocab + 31) / 32; w++) {
        const uint32_t bits = lp->allowed[w];
        if (bits == UINT32_MAX) continue;
        const int64_t last = w * 32 + 32 < lp->n_vocab ? 32 : lp->n_vocab - w * 32;
        for (int64_t b = 0; b < last; b++)
            if (!(bits >> b & 1)) l[w * 32 + b] = -INFINITY;
    }
    for (int32_t i = 0; i < lp->p.n_end; i++)
        l[lp->p.end_ids[i]] = end ? lp->end_logit[i] : -INFINITY;
    return any || (end && lp->p.n_end > 0);
}

int32_t logits_proc_sample(logits_proc *lp, float *l) {
    for (int32_t i = 0; i < lp->p.n_bias; i++) l[lp->p.bias_ids[i]] += lp->p.bias[i];
    for (int64_t i = 0; lp->counts && i < lp->n_uniq; i++) {
        const int32_t id = lp->uniq[i];
        l[id] -= lp->p.frequency_penalty * (float)lp->counts[id] + lp->p.presence_penalty;
    }
    if (lp->gm && !apply_grammar(lp, l)) return -1;
    return sampler_sample(lp->smp, l);
}

float logits_proc_adjustment(const logits_proc *lp, int32_t id) {
    float d = 0;
    for (int32_t i = 0; i < lp->p.n_bias; i++)
        if (lp->p.bias_ids[i] == id) d += lp->p.bias[i];
    if (lp->counts && lp->counts[id] > 0)
        d -= lp->p.frequency_penalty * (float)lp->counts[id] + lp->p.presence_penalty;
    return d;
}

void logits_proc_accept_prompt(logits_proc *lp, int32_t tok) {
    sampler_accept(lp->smp, tok);
}

void logits_proc_accept(logits_proc *lp, int32_t tok) {
    sampler_accept(lp->smp, tok);
    if (lp->counts && lp->counts[tok]++ == 0) lp->uniq[lp->n_uniq++] = tok;
    if (!lp->gm) return;
    for (int32_t i = 0; i < lp->p.n_end; i++) lp->ended |= lp->p.end_ids[i] == tok;
    if (!lp->ended) grammar_matcher_accept_token(lp->gm, tok);
}

bool logits_proc_done(const logits_proc *lp) {
    return lp->gm && (lp->ended || grammar_matcher_must_end(lp->gm));
}

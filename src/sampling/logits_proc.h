/*
 * logits_proc.h - what one output does to its row of logits before and after a token is
 * chosen: the processors, in a fixed order (logit bias, then OpenAI's presence and frequency
 * penalties over the completion so far, then the grammar mask), then the sampler
 * (sampling.h: repetition penalty, temperature, top-k, top-p, min-p, the draw), and the
 * bookkeeping of the chosen token.
 *
 * The engine owns one per choice and hands it its rows; nothing here knows of models,
 * sequences or text. Every buffer is sized at creation: applying and sampling allocate
 * nothing.
 */
#ifndef CELER_SAMPLING_LOGITS_PROC_H
#define CELER_SAMPLING_LOGITS_PROC_H

#include "sampling/grammar.h"
#include "sampling/sampling.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct logits_proc_params {
    const int32_t *bias_ids; /* [n_bias] added to their logits; borrowed, must outlive the proc */
    const float *bias;
    int32_t n_bias;
    float presence_penalty;  /* subtracted once from a token already generated */
    float frequency_penalty; /* subtracted per earlier occurrence in the completion */
    /* A grammar the completion must follow (NULL: none): only tokens that keep the text a
     * prefix of one of its sentences survive the mask, and the ending ids end_ids[n_end]
     * (EOS, stop ids; borrowed) only where a sentence may end. vocab: the tokens' bytes. */
    const grammar *grammar;
    const grammar_vocab *vocab;
    const int32_t *end_ids;
    int32_t n_end;
    sampler_params sampler;
} logits_proc_params;

typedef struct logits_proc logits_proc;

/* max_tokens: the most tokens the completion can hold (bounds the penalties' list). NULL
 * when out of memory. */
logits_proc *logits_proc_create(const logits_proc_params *p, int64_t n_vocab, int64_t max_tokens);
void logits_proc_destroy(logits_proc *lp);

/* Whether the next token is simply the argmax of the raw logits: greedy, and no processor
 * changes a logit (a caller may then ask a device for the argmax alone). */
bool logits_proc_greedy(const logits_proc *lp);

/* Runs the processors on l[n_vocab] in place, then the sampler; returns the token, or -1
 * when the grammar leaves no token at all (the vocabulary cannot go on with the sentence). */
int32_t logits_proc_sample(logits_proc *lp, float *l);

/* What the processors added to token id's logit (for the model's own log-probability). */
float logits_proc_adjustment(const logits_proc *lp, int32_t id);

/* Records a token of the prompt (the repetition penalty's history) or of the completion
 * (that history and the presence/frequency counts). */
void logits_proc_accept_prompt(logits_proc *lp, int32_t tok);
void logits_proc_accept(logits_proc *lp, int32_t tok);

/* Whether the grammar's sentence is complete and nothing can extend it, or an ending id was
 * accepted: the output is over. False without a grammar. */
bool logits_proc_done(const logits_proc *lp);

#endif

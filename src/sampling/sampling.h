/*
 * sampling.h - choosing the next token from float logits. Knows nothing of tensors or
 * models.
 *
 * The chain, in order: repetition penalty over the last repeat_last_n accepted tokens
 * (llama.cpp's rule: a positive logit is divided by the penalty, a negative one
 * multiplied), then temperature (0 = greedy: the argmax after the penalty), top-k,
 * top-p (the smallest set of most likely tokens whose probability reaches p), min-p
 * (drop tokens below min_p times the top probability), and a draw from what is left
 * with a seeded xoshiro256** generator, so a seed reproduces a run exactly.
 */
#ifndef CELER_SAMPLING_H
#define CELER_SAMPLING_H

#include <stdint.h>

/* The index of the largest logit; the lowest index among equal maxima (as argmax in
 * numpy and torch). NaN never wins. n >= 1. */
int32_t sampling_argmax(const float *logits, int64_t n);

typedef struct sampler_params {
    float temp;            /* 0 = greedy */
    int32_t top_k;         /* 0 = off */
    float top_p;           /* 1 = off */
    float min_p;           /* 0 = off */
    float repeat_penalty;  /* 1 = off */
    int32_t repeat_last_n; /* tokens of history the penalty looks at */
    uint64_t seed;
} sampler_params;

sampler_params sampler_default_params(void);

typedef struct sampler sampler;

/* All memory (candidates for n_vocab tokens, history) is allocated here, never while
 * sampling. NULL when out of memory. */
sampler *sampler_create(const sampler_params *p, int64_t n_vocab);
void sampler_destroy(sampler *s);
/* Forgets the history and reseeds. */
void sampler_reset(sampler *s);

/* Picks a token from logits[n_vocab] (read only) and does not record it. */
int32_t sampler_sample(sampler *s, const float *logits);
/* Records tok in the history the repetition penalty reads. */
void sampler_accept(sampler *s, int32_t tok);

/* The distribution the draw would use: writes up to n_vocab (id, probability) pairs in
 * descending probability and returns how many survive the filters. For tests. */
int64_t sampler_distribution(sampler *s, const float *logits, int32_t *ids, float *probs);

#endif

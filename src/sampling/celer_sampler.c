/*
 * celer_sampler.c - the public sampling API of celer.h over sampling.h.
 */
#include "celer.h"

#include "sampling/sampling.h"

/* A celer_sampler handle is the internal sampler itself; the public struct is never
 * defined. */

celer_sampler_params celer_sampler_default_params(void) {
    const sampler_params p = sampler_default_params();
    return (celer_sampler_params){p.temp, p.top_k, p.top_p, p.min_p, p.repeat_penalty, p.repeat_last_n, p.seed};
}

celer_sampler *celer_sampler_create(const celer_sampler_params *p, int64_t n_vocab) {
    const sampler_params sp = {p->temp, p->top_k, p->top_p, p->min_p, p->repeat_penalty, p->repeat_last_n, p->seed};
    return (celer_sampler *)sampler_create(&sp, n_vocab);
}

void celer_sampler_destroy(celer_sampler *s) { sampler_destroy((sampler *)s); }
int32_t celer_sampler_sample(celer_sampler *s, const float *logits) { return sampler_sample((sampler *)s, logits); }
void celer_sampler_accept(celer_sampler *s, int32_t token) { sampler_accept((sampler *)s, token); }

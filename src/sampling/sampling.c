/*
 * sampling.c - greedy selection.
 */
#include "sampling/sampling.h"

int32_t sampling_argmax(const float *logits, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (logits[i] > logits[best] || logits[best] != logits[best]) best = i;
    return (int32_t)best;
}

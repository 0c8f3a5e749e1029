/*
 * sampling.h - choosing tokens from float logits. Knows nothing of tensors or models.
 */
#ifndef CELER_SAMPLING_H
#define CELER_SAMPLING_H

#include <stdint.h>

/* The index of the largest logit; the lowest index among equal maxima (as argmax in
 * numpy and torch). NaN never wins. n >= 1. */
int32_t sampling_argmax(const float *logits, int64_t n);

#endif

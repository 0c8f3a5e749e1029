/*
 * check.h - what the CUDA test programs share: their one way to stop on a failed CUDA
 * call (file, line, the call and CUDA's reason, exit status 2), and the matview of an
 * affine matrix from its arrays.
 */
#ifndef CELER_TESTS_CUDA_CHECK_H
#define CELER_TESTS_CUDA_CHECK_H

#include "base/tensor.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                         \
        }                                                                                    \
    } while (0)

/* W[rows, cols] as MLX affine codes (uint32 words) with scales and biases of type st. */
static inline matview affine_view(const void *codes, const void *scales, const void *biases, int64_t rows,
                                  int64_t cols, int bits, int64_t group, dtype st) {
    matview w;
    memset(&w, 0, sizeof w);
    w.rows = rows;
    w.cols = cols;
    w.type = DTYPE_U32;
    w.data = codes;
    w.quant_bits = bits;
    w.group = group;
    w.scale_type = st;
    w.scales = scales;
    w.biases = biases;
    return w;
}

#endif

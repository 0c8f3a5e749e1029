/*
 * check.h - the CUDA test programs' one way to stop on a failed CUDA call: file, line,
 * the call and CUDA's reason, exit status 2.
 */
#ifndef CELER_TESTS_CUDA_CHECK_H
#define CELER_TESTS_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                         \
        }                                                                                    \
    } while (0)

#endif

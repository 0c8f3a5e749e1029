/*
 * host_ops.c - ops that only move data on host memory, shared by the CPU backends
 * (there is nothing for SIMD or a second implementation to gain).
 */
#include "backend/backend.h"

#include <string.h>

void backend_host_patches(backend *be, float *y, const float *x, int64_t n, int64_t s, int64_t p,
                          bool channels_last) {
    (void)be;
    const int64_t g = s / p, cols = 3 * p * p;
    for (int64_t t = 0; t < n; t++)
        for (int64_t py = 0; py < g; py++)
            for (int64_t px = 0; px < g; px++) {
                float *row = y + ((t * g + py) * g + px) * cols;
                for (int64_t c = 0; c < 3; c++)
                    for (int64_t ky = 0; ky < p; ky++) {
                        const float *src = x + ((t * 3 + c) * s + py * p + ky) * s + px * p;
                        if (!channels_last) {
                            memcpy(row + (c * p + ky) * p, src, sizeof(float) * (size_t)p);
                            continue;
                        }
                        for (int64_t kx = 0; kx < p; kx++) row[(ky * p + kx) * 3 + c] = src[kx];
                    }
            }
}

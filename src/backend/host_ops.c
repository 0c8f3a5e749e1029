/*
 * host_ops.c - memory and data-movement ops on host memory, shared by the CPU backends
 * (there is nothing for SIMD or a second implementation to gain).
 */
#include "backend/backend.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define HOST_ALIGN 64

/* calloc, so large buffers (KV pools) are zero pages until touched; aligned to 64 bytes
 * with the pointer to free just before the block. */
void *backend_host_alloc(backend *be, size_t bytes) {
    (void)be;
    if (bytes > SIZE_MAX - 2 * HOST_ALIGN) return NULL;
    unsigned char *raw = calloc(1, bytes + 2 * HOST_ALIGN);
    if (!raw) return NULL;
    unsigned char *p = (unsigned char *)(((uintptr_t)raw + sizeof(void *) + HOST_ALIGN - 1) &
                                         ~(uintptr_t)(HOST_ALIGN - 1));
    ((void **)p)[-1] = raw;
    return p;
}

void backend_host_release(backend *be, void *p) {
    (void)be;
    if (p) free(((void **)p)[-1]);
}

void backend_host_copy(backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (dst != src && bytes) memmove(dst, src, bytes);
}

void backend_host_copy_rows(backend *be, float *y, int64_t ldy, const float *x, int64_t ldx,
                            int64_t n, int64_t d) {
    (void)be;
    for (int64_t r = 0; r < n; r++) memmove(y + r * ldy, x + r * ldx, sizeof(float) * (size_t)d);
}

void backend_host_gather_rows(backend *be, float *y, const float *x, const int32_t *idx,
                              const float *fill, int64_t n, int64_t d) {
    (void)be;
    for (int64_t i = 0; i < n; i++) {
        const float *src = idx[i] >= 0 ? x + (int64_t)idx[i] * d : fill;
        CELER_ASSERT(src != NULL);
        memcpy(y + i * d, src, sizeof(float) * (size_t)d);
    }
}

void backend_host_patches(backend *be, float *y, const float *x, int64_t n, int64_t s, int64_t p,
                          bool channels_last, bool lead) {
    (void)be;
    const int64_t g = s / p, cols = 3 * p * p;
    for (int64_t t = 0; t < n; t++) {
        float *img = y + t * (g * g + lead) * cols;
        if (lead) memset(img, 0, sizeof(float) * (size_t)cols);
        img += lead * cols;
        for (int64_t py = 0; py < g; py++)
            for (int64_t px = 0; px < g; px++) {
                float *row = img + (py * g + px) * cols;
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
}

void backend_host_avg_pool(backend *be, float *y, const float *x, int64_t n, int64_t s, int64_t k,
                           int64_t d) {
    (void)be;
    const int64_t g = s / k;
    const float inv = (float)(k * k);
    for (int64_t t = 0; t < n; t++)
        for (int64_t oy = 0; oy < g; oy++)
            for (int64_t ox = 0; ox < g; ox++) {
                float *o = y + ((t * g + oy) * g + ox) * d;
                for (int64_t c = 0; c < d; c++) {
                    float sum = 0.0f;
                    for (int64_t ky = 0; ky < k; ky++)
                        for (int64_t kx = 0; kx < k; kx++)
                            sum += x[((t * s + oy * k + ky) * s + ox * k + kx) * d + c];
                    o[c] = sum / inv;
                }
            }
}

/*
 * matmul.c - reference matrix products on dense (F32/F16/BF16) and MLX affine-quantized
 * (4- and 8-bit, any group size) weights.
 *
 * Each output row is dequantized once into scratch, then dotted with every input row:
 * simple and exact, not fast (the fast kernels live in src/backend/cpu/).
 */
#include "kernels/ref/ref.h"

#include "base/error.h"
#include "base/half.h"

#include <string.h>

/* Weights sit in the mmap at whatever offset the file gives them (MLX does not align
 * its safetensors data), so every load goes through memcpy: no unaligned typed access. */
static float value_at(dtype t, const void *p, int64_t i) {
    const unsigned char *b = p;
    float f;
    uint16_t h;
    switch (t) {
    case DTYPE_F32: memcpy(&f, b + 4 * i, 4); return f;
    case DTYPE_F16: memcpy(&h, b + 2 * i, 2); return f16_to_f32(h);
    case DTYPE_BF16: memcpy(&h, b + 2 * i, 2); return bf16_to_f32(h);
    default: CELER_ASSERT(!"bad weight dtype"); return 0;
    }
}

static uint32_t word_at(const void *p, int64_t i) {
    uint32_t w;
    memcpy(&w, (const unsigned char *)p + 4 * i, 4);
    return w;
}

void ref_mat_row(float *out, const matview *w, int64_t r) {
    const int64_t cols = w->cols;
    if (w->quant_bits == 0) {
        for (int64_t c = 0; c < cols; c++) out[c] = value_at(w->type, w->data, r * cols + c);
        return;
    }
    const int bits = w->quant_bits;
    const uint32_t mask = (1u << bits) - 1u;
    const int per_word = 32 / bits;
    const int64_t words = cols / per_word, groups = cols / w->group;
    const int64_t row_word = r * words;
    for (int64_t g = 0; g < groups; g++) {
        const float s = value_at(w->scale_type, w->scales, r * groups + g);
        const float b = value_at(w->scale_type, w->biases, r * groups + g);
        for (int64_t c = g * w->group; c < (g + 1) * w->group; c++) {
            uint32_t q = (word_at(w->data, row_word + c / per_word) >> ((c % per_word) * bits)) & mask;
            out[c] = s * (float)q + b;
        }
    }
}

void ref_matmul(float *y, const matview *w, const float *x, int64_t n, int64_t r0, int64_t r1,
                float *wrow) {
    const int64_t rows = w->rows, cols = w->cols;
    for (int64_t r = r0; r < r1; r++) {
        ref_mat_row(wrow, w, r);
        for (int64_t t = 0; t < n; t++) {
            const float *xt = x + t * cols;
            float acc = 0.0f;
            for (int64_t c = 0; c < cols; c++) acc += wrow[c] * xt[c];
            y[t * rows + r] = acc;
        }
    }
}

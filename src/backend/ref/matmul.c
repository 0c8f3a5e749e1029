/*
 * matmul.c - reference matrix products on dense (F32/F16/BF16) and MLX affine-quantized
 * (4- and 8-bit, any group size) weights.
 *
 * Each output row is dequantized once into scratch, then dotted with every input row:
 * simple and exact, not fast (the fast kernels live in src/backend/cpu/).
 */
#include "backend/ref/ref.h"

/* The dequantizer is base/tensor.c's matview_row, shared with the embedding lookups. */
void ref_mat_row(float *out, const matview *w, int64_t r) { matview_row(out, w, r); }

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

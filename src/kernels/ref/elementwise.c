/*
 * elementwise.c - reference RMSNorm, RoPE, softmax and SiLU/SwiGLU.
 */
#include "kernels/ref/ref.h"

#include <math.h>

void ref_rmsnorm(float *y, const float *x, const float *w, int64_t d, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < d; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss / (float)d + eps);
    for (int64_t i = 0; i < d; i++) y[i] = w[i] * (x[i] * inv);
}

void ref_rope(float *x, int64_t h, int64_t hd, int64_t pos, const float *inv_freq, float mscale,
              bool traditional) {
    const int64_t half = hd / 2;
    for (int64_t i = 0; i < half; i++) {
        /* The angle is formed in fp32 as the reference implementations do. */
        const float ang = (float)pos * inv_freq[i];
        const float c = (float)cos((double)ang) * mscale, s = (float)sin((double)ang) * mscale;
        const int64_t a = traditional ? 2 * i : i, b = traditional ? 2 * i + 1 : i + half;
        for (int64_t k = 0; k < h; k++) {
            float *v = x + k * hd;
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x1 * c + x0 * s;
        }
    }
}

void ref_softmax(float *x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

float ref_silu(float x) { return x / (1.0f + expf(-x)); }

void ref_swiglu(float *y, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = ref_silu(gate[i]) * up[i];
}

/*
 * elementwise.c - reference RMSNorm, LayerNorm, RoPE, softmax, soft-capping, and the
 * activations (SiLU, the GELU family) alone or gating a second input.
 */
#include "backend/ref/ref.h"

#include <math.h>

void ref_rmsnorm(float *y, const float *x, const float *w, int64_t d, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < d; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss / (float)d + eps);
    for (int64_t i = 0; i < d; i++) y[i] = w[i] * (x[i] * inv);
}

void ref_layernorm(float *y, const float *x, const float *w, const float *b, int64_t d, float eps) {
    float sum = 0.0f;
    for (int64_t i = 0; i < d; i++) sum += x[i];
    const float mean = sum / (float)d;
    float ss = 0.0f;
    for (int64_t i = 0; i < d; i++) ss += (x[i] - mean) * (x[i] - mean);
    const float inv = 1.0f / sqrtf(ss / (float)d + eps);
    for (int64_t i = 0; i < d; i++) y[i] = (x[i] - mean) * inv * w[i] + (b ? b[i] : 0.0f);
}

void ref_rope(float *x, int64_t h, int64_t hd, int64_t pos, const rope_params *rp) {
    const int64_t half = rope_dims(rp, hd) / 2;
    for (int64_t i = 0; i < half; i++) {
        /* The angle is formed in fp32 as the reference implementations do. */
        const float ang = (float)pos * rp->inv_freq[i];
        const float c = (float)cos((double)ang) * rp->mscale, s = (float)sin((double)ang) * rp->mscale;
        const int64_t a = rp->traditional ? 2 * i : i, b = rp->traditional ? 2 * i + 1 : i + half;
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

float ref_act_one(float x, backend_act kind) {
    switch (kind) {
    case BACKEND_ACT_SILU:
        return ref_silu(x);
    case BACKEND_ACT_GELU_ERF:
        return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case BACKEND_ACT_GELU_TANH:
        return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case BACKEND_ACT_QUICK_GELU:
        return x / (1.0f + expf(-1.702f * x));
    }
    return x;
}

void ref_act(float *y, const float *x, int64_t n, backend_act kind) {
    for (int64_t i = 0; i < n; i++) y[i] = ref_act_one(x[i], kind);
}

void ref_glu(float *y, const float *gate, const float *up, int64_t n, backend_act act) {
    for (int64_t i = 0; i < n; i++) y[i] = ref_act_one(gate[i], act) * up[i];
}

/* tanh in double, rounded once: the reference's own rounding stays below fp32's. */
void ref_softcap(float *y, float cap, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = (float)((double)cap * tanh((double)y[i] / (double)cap));
}

/*
 * attention.c - reference attention of one query row: causal over a paged KV cache (or up to a
 * later limit: a Gemma 3 image block), with grouped-query heads, an optional sliding window
 * and optional soft-capping of the scores; or unmasked over plain K and V rows
 * (a vision encoder's segment). Materializes the score row (one float per key); the tiled
 * online-softmax kernels belong to the CPU backend.
 */
#include "backend/ref/ref.h"

#include "base/half.h"

/* Element i of the cache row at slot. */
static inline float kv_at(const void *pool, bool f16, int64_t i) {
    return f16 ? f16_to_f32(((const uint16_t *)pool)[i]) : ((const float *)pool)[i];
}

void ref_attention(float *out, const float *q, const kv_span *kv, int64_t pos, int64_t limit,
                   int64_t window, int64_t h, int64_t hk, int64_t hd, float scale, float softcap,
                   float *scores) {
    const int64_t lo = (window > 0 && pos - window + 1 > 0) ? pos - window + 1 : 0;
    const int64_t n = limit - lo + 1, group = h / hk, kvd = hk * hd;
    for (int64_t i = 0; i < h; i++) {
        const float *qi = q + i * hd;
        const int64_t off = (i / group) * hd;
        for (int64_t j = 0; j < n; j++) {
            const int64_t k = kv_span_slot(kv, lo + j) * kvd + off;
            float dot = 0.0f;
            for (int64_t c = 0; c < hd; c++) dot += qi[c] * kv_at(kv->k, kv->f16, k + c);
            scores[j] = dot * scale;
        }
        if (softcap > 0.0f) ref_softcap(scores, softcap, n);
        ref_softmax(scores, n);
        float *o = out + i * hd;
        for (int64_t c = 0; c < hd; c++) o[c] = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            const int64_t v = kv_span_slot(kv, lo + j) * kvd + off;
            for (int64_t c = 0; c < hd; c++) o[c] += scores[j] * kv_at(kv->v, kv->f16, v + c);
        }
    }
}

void ref_attention_full(float *out, const float *q, const float *k, const float *v, int64_t seg,
                        int64_t h, int64_t hk, int64_t hd, float scale, float *scores) {
    const int64_t group = h / hk, kvd = hk * hd;
    for (int64_t i = 0; i < h; i++) {
        const float *qi = q + i * hd;
        const int64_t off = (i / group) * hd;
        for (int64_t j = 0; j < seg; j++) {
            float dot = 0.0f;
            for (int64_t c = 0; c < hd; c++) dot += qi[c] * k[j * kvd + off + c];
            scores[j] = dot * scale;
        }
        ref_softmax(scores, seg);
        float *o = out + i * hd;
        for (int64_t c = 0; c < hd; c++) o[c] = 0.0f;
        for (int64_t j = 0; j < seg; j++)
            for (int64_t c = 0; c < hd; c++) o[c] += scores[j] * v[j * kvd + off + c];
    }
}

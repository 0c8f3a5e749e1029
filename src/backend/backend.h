/*
 * backend.h - the op interface model code is written against (DESIGN.md section 2).
 *
 * A backend runs each op over whole batches of rows on buffers it can address (host
 * memory for the CPU backends). Model files call only these ops, so one forward body
 * serves every backend. A backend never sees a model, a config or a tokenizer.
 *
 * attention reads the paged KV cache causally (text models); attention_full has no cache
 * and no mask (a vision encoder): its n rows form n / seg independent segments of seg
 * consecutive rows (n % seg == 0, one image tile each), and every row attends to every
 * row of its own segment. Query head i reads KV head i / (h / hk) in both.
 */
#ifndef CELER_BACKEND_H
#define CELER_BACKEND_H

#include "base/tensor.h"

#include <stdbool.h>
#include <stdint.h>

/* Rotary embedding parameters of one model, precomputed at load. */
typedef struct rope_params {
    const float *inv_freq; /* [hd / 2] */
    float mscale;          /* multiplies cos and sin (YaRN attention factor; else 1) */
    bool traditional;      /* rotate (2i, 2i+1) instead of (i, i + hd/2) */
} rope_params;

/* The rows of one attention call: row r sits at position pos[r] of the sequence whose
 * block table is blocks[r], and attends causally over that sequence's cache. */
typedef struct attn_rows {
    int64_t n;
    const int32_t *pos;           /* [n] */
    const int32_t *const *blocks; /* [n] */
    int64_t block_size;
    int64_t window; /* sliding window in positions; 0 = none */
    int64_t h, hk, hd;
    float scale;
} attn_rows;

/* Elementwise activations of the act op, each as Hugging Face names it. */
typedef enum backend_act {
    BACKEND_ACT_GELU_ERF,   /* "gelu": 0.5 x (1 + erf(x / sqrt 2)) */
    BACKEND_ACT_GELU_TANH,  /* "gelu_pytorch_tanh": 0.5 x (1 + tanh(0.79788 (x + 0.044715 x^3))) */
    BACKEND_ACT_QUICK_GELU, /* "quick_gelu" (CLIP): x sigmoid(1.702 x) */
} backend_act;

typedef struct backend backend;

typedef struct backend_ops {
    const char *name;
    void (*destroy)(backend *be);
    /* y[n, w.rows] = x[n, w.cols] @ W^T */
    void (*matmul)(backend *be, float *y, const matview *w, const float *x, int64_t n);
    /* y[n, w.cols] = rows ids[n] of W (an embedding table, dequantized) */
    void (*embed)(backend *be, float *y, const matview *w, const int32_t *ids, int64_t n);
    /* y[n, d] = rmsnorm(x[n, d]) * w[d] */
    void (*rmsnorm)(backend *be, float *y, const float *x, const float *w, int64_t n, int64_t d,
                    float eps);
    /* y[n, d] = (x[n, d] - mean) / sqrt(var + eps) * w[d] + b[d], per row; b may be NULL */
    void (*layernorm)(backend *be, float *y, const float *x, const float *w, const float *b,
                      int64_t n, int64_t d, float eps);
    /* x[n, h, hd] rotated in place, row r at position pos[r] */
    void (*rope)(backend *be, float *x, const int32_t *pos, int64_t n, int64_t h, int64_t hd,
                 const rope_params *rp);
    /* k, v [n, hk*hd] stored into the pools at slots slot[n], as fp16 or fp32 values
     * (backend_kv_bytes). How a cache block is laid out inside the pools is the backend's
     * own business: only its attention reads them. */
    void (*kv_store)(backend *be, void *kpool, void *vpool, const float *k, const float *v,
                     const int32_t *slot, int64_t n, int64_t kvd);
    /* out[n, h*hd] = attention of q[n, h*hd] over the pools */
    void (*attention)(backend *be, float *out, const float *q, const void *kpool,
                      const void *vpool, const attn_rows *rows);
    /* out[n, h*hd] = attention of q[n, h*hd] over k, v[n, hk*hd] within segments of seg rows */
    void (*attention_full)(backend *be, float *out, const float *q, const float *k, const float *v,
                           int64_t n, int64_t seg, int64_t h, int64_t hk, int64_t hd, float scale);
    /* y[m] = silu(gate[m]) * up[m] */
    void (*swiglu)(backend *be, float *y, const float *gate, const float *up, int64_t m);
    /* y[m] = act(x[m]) */
    void (*act)(backend *be, float *y, const float *x, int64_t m, backend_act kind);
    /* y[m] += x[m] */
    void (*add)(backend *be, float *y, const float *x, int64_t m);
    /* y[n, d] += bias[d] for every row */
    void (*add_bias)(backend *be, float *y, const float *bias, int64_t n, int64_t d);
    /* y[m] *= s */
    void (*scale)(backend *be, float *y, float s, int64_t m);
    /* y[n * (s/p)^2, 3 p p] = the p x p patches of images x[n, 3, s, s], row-major per
     * image, each flattened (channel, row, column), or (row, column, channel) when
     * channels_last: a convolution of stride p as one matrix product */
    void (*patches)(backend *be, float *y, const float *x, int64_t n, int64_t s, int64_t p,
                    bool channels_last);
} backend_ops;

struct backend {
    const backend_ops *ops;
    bool kv_f16; /* the KV pools hold fp16 values (else fp32); fixed at creation */
};

/* Bytes of one cached K or V value. */
static inline int64_t backend_kv_bytes(bool kv_f16) { return kv_f16 ? 2 : 4; }

/* y[m] += x[m], y[n, d] += bias[d] and y[m] *= s on host memory: plain loops that every CPU backend
 * uses as its add and add_bias ops (memory-bound; nothing to gain from more). */
static inline void backend_host_add(backend *be, float *y, const float *x, int64_t m) {
    (void)be;
    for (int64_t i = 0; i < m; i++) y[i] += x[i];
}

static inline void backend_host_add_bias(backend *be, float *y, const float *bias, int64_t n, int64_t d) {
    (void)be;
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < d; i++) y[t * d + i] += bias[i];
}

static inline void backend_host_scale(backend *be, float *y, float s, int64_t m) {
    (void)be;
    for (int64_t i = 0; i < m; i++) y[i] *= s;
}

/* The patches op on host memory (data movement only; both CPU backends use it). */
void backend_host_patches(backend *be, float *y, const float *x, int64_t n, int64_t s, int64_t p,
                          bool channels_last);

static inline void backend_destroy(backend *be) {
    if (be) be->ops->destroy(be);
}

#endif

/*
 * ref.h - scalar reference kernels: the correctness oracle, kept forever.
 *
 * Plain C, fp32 accumulation, no SIMD and no threads: every fast kernel is tested
 * against these. Each works on one row (or a range of output rows) so a caller can split
 * work across threads; none allocates.
 */
#ifndef CELER_KERNELS_REF_H
#define CELER_KERNELS_REF_H

#include "backend/backend.h"
#include "base/tensor.h"

#include <stdbool.h>
#include <stdint.h>

/* out[cols] = W[r, :] as floats (dense converted, affine dequantized). */
void ref_mat_row(float *out, const matview *w, int64_t r);

/* y[t, r] = x[t, :] @ W[r, :] for t < n and r0 <= r < r1; y is [n, w->rows], x is
 * [n, w->cols]. wrow is scratch of w->cols floats. */
void ref_matmul(float *y, const matview *w, const float *x, int64_t n, int64_t r0, int64_t r1,
                float *wrow);

/* y[d] = x[d] / sqrt(mean(x^2) + eps) * w[d] (y may alias x). */
void ref_rmsnorm(float *y, const float *x, const float *w, int64_t d, float eps);

/* y[d] = (x[d] - mean) / sqrt(var + eps) * w[d] + b[d] with the population variance, both
 * moments in fp32 over two passes (mean, then the mean of (x - mean)^2) as torch computes
 * an fp32 LayerNorm; b may be NULL (no bias); y may alias x. */
void ref_layernorm(float *y, const float *x, const float *w, const float *b, int64_t d, float eps);

/* In-place rotary embedding of x[h, hd] at position pos: of each head the first
 * r = rope_dims(rp, hd) values rotate, pair i < r/2 by pos * rp->inv_freq[i], cos and sin
 * scaled by rp->mscale; the rest pass through. traditional: pairs (2i, 2i+1); otherwise
 * (i, i + r/2) as Hugging Face's rotate_half on the rotated part. */
void ref_rope(float *x, int64_t h, int64_t hd, int64_t pos, const rope_params *rp);

/* In-place softmax of x[n]. */
void ref_softmax(float *x, int64_t n);

float ref_silu(float x);

/* y[n] = act(gate[n]) * up[n] (y may alias gate). */
void ref_glu(float *y, const float *gate, const float *up, int64_t n, backend_act act);

/* y[n] = cap * tanh(y[n] / cap). */
void ref_softcap(float *y, float cap, int64_t n);

/* y[n] = act(x[n]) by libm's erff, tanhf and expf in the formulas of backend_act (y may
 * alias x). */
float ref_act_one(float x, backend_act kind);
void ref_act(float *y, const float *x, int64_t n, backend_act kind);

/* out[h, hd] = attention of q[h, hd] at position pos over the keys of kv at positions
 * [max(0, pos - window + 1), limit] (window <= 0: all of [0, limit]; limit >= pos, pos for
 * causal attention). Query head i reads kv head i / (h / hk) (GQA). A score is scale * q . k,
 * then softcap * tanh(score / softcap) where softcap > 0. scores: scratch of limit + 1
 * floats. */
void ref_attention(float *out, const float *q, const kv_span *kv, int64_t pos, int64_t limit,
                   int64_t window, int64_t h, int64_t hk, int64_t hd, float scale, float softcap,
                   float *scores);

/* out[h, hd] = attention of q[h, hd] over every row of k, v[seg, hk*hd] (no mask). Query
 * head i reads kv head i / (h / hk). scores: scratch of seg floats. */
void ref_attention_full(float *out, const float *q, const float *k, const float *v, int64_t seg,
                        int64_t h, int64_t hk, int64_t hd, float scale, float *scores);

#endif

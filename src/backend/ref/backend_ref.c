/*
 * backend_ref.c - the backend ops over the scalar reference kernels.
 *
 * Rows are split across the pool: matmul by output rows in chunks from an atomic
 * counter, everything else by batch rows. Scratch (one dequantized weight row and one
 * score row per thread) is allocated once at creation, never in a forward. attention_full
 * takes the thread's whole scratch (max_cols + max_keys floats) as its score row, since a
 * vision segment (577 rows for a CLIP ViT-L/14-336 tile) can be longer than n_ctx.
 */
#include "backend/ref/backend_ref.h"

#include "base/threadpool.h"
#include "base/error.h"
#include "base/half.h"
#include "backend/ref/ref.h"

#include <stdlib.h>
#include <string.h>

typedef struct ref_backend {
    backend base;
    threadpool *pool;
    int64_t max_cols, max_keys;
    float *scratch; /* per thread: max_cols + max_keys floats */
    int n_threads;
    threadpool_counter counter;
} ref_backend;

static int64_t scratch_floats(const ref_backend *rb) {
    return rb->max_cols + rb->max_keys;
}

static float *thread_scratch(ref_backend *rb, int ith) {
    return rb->scratch + (size_t)ith * (size_t)scratch_floats(rb);
}

/* Static split of [0, n) for thread ith of nth. */
static void split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    *lo = n * ith / nth;
    *hi = n * (ith + 1) / nth;
}

/* ==== matmul and embedding ==== */

typedef struct matmul_job {
    ref_backend *rb;
    float *y;
    const matview *w;
    const float *x;
    const int32_t *ids;
    int64_t n;
    float scale; /* of embedded rows */
} matmul_job;

static void matmul_task(void *p, int ith, int nth) {
    (void)nth;
    matmul_job *j = p;
    float *wrow = thread_scratch(j->rb, ith);
    int64_t lo, hi;
    while (threadpool_chunk(&j->rb->counter, j->w->rows, 16, &lo, &hi))
        ref_matmul(j->y, j->w, j->x, j->n, lo, hi, wrow);
}

static void ref_op_matmul(backend *be, float *y, const matview *w, const float *x, int64_t n) {
    ref_backend *rb = (ref_backend *)be;
    CELER_ASSERT(w->cols <= rb->max_cols);
    matmul_job j = {rb, y, w, x, NULL, n, 1.0f};
    atomic_store(&rb->counter.next, 0);
    threadpool_run(rb->pool, matmul_task, &j);
}

static void embed_task(void *p, int ith, int nth) {
    matmul_job *j = p;
    int64_t lo, hi;
    split(j->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        if (j->ids[t] < 0) continue;
        float *y = j->y + t * j->w->cols;
        ref_mat_row(y, j->w, j->ids[t]);
        if (j->scale != 1.0f)
            for (int64_t c = 0; c < j->w->cols; c++) y[c] *= j->scale;
    }
}

static void ref_op_embed(backend *be, float *y, const matview *w, const int32_t *ids, int64_t n,
                         float scale) {
    ref_backend *rb = (ref_backend *)be;
    matmul_job j = {rb, y, w, NULL, ids, n, scale};
    threadpool_run(rb->pool, embed_task, &j);
}

/* ==== per-row ops ==== */

typedef struct row_job {
    ref_backend *rb;
    float *y;
    const float *x, *x2, *w, *b;
    const void *kpool, *vpool;
    const int32_t *idx;
    int64_t n, d, h, hd;
    float eps, cap;
    backend_act act;
    const rope_params *rp;
    const attn_rows *ar;
} row_job;

static void rmsnorm_task(void *p, int ith, int nth) {
    row_job *j = p;
    int64_t lo, hi;
    split(j->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++)
        ref_rmsnorm(j->y + t * j->d, j->x + t * j->d, j->w, j->d, j->eps);
}

static void ref_op_rmsnorm(backend *be, float *y, const float *x, const float *w, int64_t n,
                           int64_t d, float eps) {
    row_job j = {.rb = (ref_backend *)be, .y = y, .x = x, .w = w, .n = n, .d = d, .eps = eps};
    threadpool_run(j.rb->pool, rmsnorm_task, &j);
}

static void layernorm_task(void *p, int ith, int nth) {
    row_job *j = p;
    int64_t lo, hi;
    split(j->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++)
        ref_layernorm(j->y + t * j->d, j->x + t * j->d, j->w, j->b, j->d, j->eps);
}

static void ref_op_layernorm(backend *be, float *y, const float *x, const float *w, const float *b,
                             int64_t n, int64_t d, float eps) {
    row_job j = {
        .rb = (ref_backend *)be, .y = y, .x = x, .w = w, .b = b, .n = n, .d = d, .eps = eps};
    threadpool_run(j.rb->pool, layernorm_task, &j);
}

static void rope_task(void *p, int ith, int nth) {
    row_job *j = p;
    int64_t lo, hi;
    split(j->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++)
        ref_rope(j->y + t * j->h * j->hd, j->h, j->hd, j->idx[t], j->rp);
}

static void ref_op_rope(backend *be, float *x, const int32_t *pos, int64_t n, int64_t h, int64_t hd,
                        const rope_params *rp) {
    row_job j = {.rb = (ref_backend *)be, .y = x, .idx = pos, .n = n, .h = h, .hd = hd, .rp = rp};
    threadpool_run(j.rb->pool, rope_task, &j);
}

static void ref_op_kv_store(backend *be, void *kpool, void *vpool, const float *k, const float *v,
                            const int32_t *slot, int64_t n, int64_t kvd) {
    for (int64_t t = 0; t < n; t++) {
        const size_t at = (size_t)slot[t] * (size_t)kvd;
        if (be->kv_f16) {
            for (int64_t c = 0; c < kvd; c++) {
                ((uint16_t *)kpool)[at + (size_t)c] = f32_to_f16(k[t * kvd + c]);
                ((uint16_t *)vpool)[at + (size_t)c] = f32_to_f16(v[t * kvd + c]);
            }
        } else {
            memcpy((float *)kpool + at, k + t * kvd, sizeof(float) * (size_t)kvd);
            memcpy((float *)vpool + at, v + t * kvd, sizeof(float) * (size_t)kvd);
        }
    }
}

static void attention_task(void *p, int ith, int nth) {
    row_job *j = p;
    const attn_rows *ar = j->ar;
    float *scores = thread_scratch(j->rb, ith) + j->rb->max_cols;
    const int64_t qd = ar->h * ar->hd;
    int64_t lo, hi;
    split(ar->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        kv_span kv = {j->kpool, j->vpool, ar->tables + (int64_t)ar->seq[t] * ar->table_cols,
                      ar->block_size, j->rb->base.kv_f16};
        ref_attention(j->y + t * qd, j->x + t * qd, &kv, ar->pos[t], attn_rows_limit(ar, t),
                      ar->window, ar->h, ar->hk, ar->hd, ar->scale, ar->softcap, scores);
    }
}

static void ref_op_attention(backend *be, float *out, const float *q, const void *kpool,
                             const void *vpool, const attn_rows *rows) {
    ref_backend *rb = (ref_backend *)be;
    for (int64_t t = 0; t < rows->n; t++)
        CELER_ASSERT(rows->pos[t] <= attn_rows_limit(rows, t) &&
                     attn_rows_limit(rows, t) < rb->max_keys);
    row_job j = {.rb = rb, .y = out, .x = q, .kpool = kpool, .vpool = vpool, .ar = rows};
    threadpool_run(rb->pool, attention_task, &j);
}

typedef struct full_job {
    ref_backend *rb;
    float *out;
    const float *q, *k, *v;
    int64_t n, seg, h, hk, hd;
    float scale;
} full_job;

static void attention_full_task(void *p, int ith, int nth) {
    full_job *j = p;
    float *scores = thread_scratch(j->rb, ith);
    const int64_t qd = j->h * j->hd, kvd = j->hk * j->hd;
    int64_t lo, hi;
    split(j->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        const int64_t first = t / j->seg * j->seg; /* the first row of t's segment */
        ref_attention_full(j->out + t * qd, j->q + t * qd, j->k + first * kvd, j->v + first * kvd,
                           j->seg, j->h, j->hk, j->hd, j->scale, scores);
    }
}

static void ref_op_attention_full(backend *be, float *out, const float *q, const float *k,
                                  const float *v, int64_t n, int64_t seg, int64_t h, int64_t hk,
                                  int64_t hd, float scale) {
    ref_backend *rb = (ref_backend *)be;
    CELER_ASSERT(seg > 0 && n % seg == 0 && seg <= scratch_floats(rb));
    CELER_ASSERT(hk > 0 && h % hk == 0);
    full_job j = {rb, out, q, k, v, n, seg, h, hk, hd, scale};
    threadpool_run(rb->pool, attention_full_task, &j);
}

static void glu_task(void *p, int ith, int nth) {
    row_job *j = p;
    int64_t lo, hi;
    split(j->n, ith, nth, &lo, &hi);
    ref_glu(j->y + lo, j->x + lo, j->x2 + lo, hi - lo, j->act);
}

static void ref_op_glu(backend *be, float *y, const float *gate, const float *up, int64_t m,
                       backend_act act) {
    row_job j = {.rb = (ref_backend *)be, .y = y, .x = gate, .x2 = up, .n = m, .act = act};
    threadpool_run(j.rb->pool, glu_task, &j);
}

static void softcap_task(void *p, int ith, int nth) {
    row_job *j = p;
    int64_t lo, hi;
    split(j->n, ith, nth, &lo, &hi);
    ref_softcap(j->y + lo, j->cap, hi - lo);
}

static void ref_op_softcap(backend *be, float *y, float cap, int64_t m) {
    row_job j = {.rb = (ref_backend *)be, .y = y, .n = m, .cap = cap};
    threadpool_run(j.rb->pool, softcap_task, &j);
}

static void act_task(void *p, int ith, int nth) {
    row_job *j = p;
    int64_t lo, hi;
    split(j->n, ith, nth, &lo, &hi);
    ref_act(j->y + lo, j->x + lo, hi - lo, j->act);
}

static void ref_op_act(backend *be, float *y, const float *x, int64_t m, backend_act kind) {
    row_job j = {.rb = (ref_backend *)be, .y = y, .x = x, .n = m, .act = kind};
    threadpool_run(j.rb->pool, act_task, &j);
}

static void ref_destroy(backend *be) {
    ref_backend *rb = (ref_backend *)be;
    threadpool_destroy(rb->pool);
    free(rb->scratch);
    free(rb);
}

static int64_t ref_work_bytes(const backend *be) {
    const ref_backend *rb = (const ref_backend *)be;
    return (int64_t)sizeof(float) * rb->n_threads * scratch_floats(rb);
}

static const backend_ops ref_ops = {
    .name = "ref",
    .destroy = ref_destroy,
    BACKEND_HOST_MEMORY_OPS,
    .begin = backend_host_begin,
    .work_bytes = ref_work_bytes,
    .matmul = ref_op_matmul,
    .embed = ref_op_embed,
    .rmsnorm = ref_op_rmsnorm,
    .layernorm = ref_op_layernorm,
    .rope = ref_op_rope,
    .kv_store = ref_op_kv_store,
    .attention_softcap = true,
    .attention_limit = true,
    .attention = ref_op_attention,
    .attention_full = ref_op_attention_full,
    .glu = ref_op_glu,
    .act = ref_op_act,
    .softcap = ref_op_softcap,
    .add = backend_host_add,
    .add_bias = backend_host_add_bias,
    .scale = backend_host_scale,
    .patches = backend_host_patches,
    .avg_pool = backend_host_avg_pool,
};

backend *backend_ref_create(int n_threads, int64_t max_cols, int64_t max_keys, bool kv_f16) {
    ref_backend *rb = calloc(1, sizeof *rb);
    if (!rb) return NULL;
    rb->base.ops = &ref_ops;
    rb->base.kv_f16 = kv_f16;
    rb->base.host = true;
    rb->base.kernels = "ref";
    rb->base.in_place = true;
    rb->max_cols = max_cols;
    rb->max_keys = max_keys;
    rb->pool = threadpool_create(n_threads);
    rb->n_threads = n_threads < 1 ? 1 : n_threads;
    rb->scratch = calloc((size_t)rb->n_threads * (size_t)scratch_floats(rb), sizeof(float));
    if (!rb->pool || !rb->scratch) {
        ref_destroy(&rb->base);
        return NULL;
    }
    return &rb->base;
}

/*
 * backend_cpu.c - the fast CPU backend: threads, buffers and op orchestration over a
 * kernel table (kernels.h).
 *
 * Matrix products quantize the input rows once (int8 per block of 32, as a value row
 * and a residual row, pack.h), then threads take tiles of 16 output rows from an atomic
 * counter and run the table's product over every input row, so a weight tile is read
 * once per call while it sits in L1/L2. Attention is tiled: up to ATT_TILE consecutive
 * rows of one sequence and one KV head read each cache block once (keys stored
 * transposed per block), with an online softmax (no [n, n] score matrix). Full
 * (unmasked, uncached) attention is tiled the same way over plain K and V rows, a block
 * of 16 keys transposed into scratch at a time, so its scratch does not grow with the
 * segment. Work too small to wake the pool runs on the calling thread. Every buffer is
 * sized at creation; no op allocates.
 */
#include "backend/cpu/backend_cpu.h"

#include "backend/cpu/kernels.h"
#include "backend/cpu/pack.h"
#include "base/threadpool.h"
#include "base/error.h"
#include "base/half.h"
#include "backend/ref/backend_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ATT_TILE        16 /* query rows of one sequence sharing each K/V block read */
#define FULL_TILE       64 /* query vectors (rows x heads of one KV head) of one full-attention item */
#define CPU_ROPE_TABLES 4 /* RoPE tables kept at once */
/* Rows from which a 4-bit product takes the bf16 tiles where the kernels have them: below,
 * the tile dequantization costs more than the int8 product it replaces. */
#define BF16_MIN_ROWS 32

typedef struct cpu_backend {
    backend base;
    const cpu_kernels *k;
    threadpool *pool;
    int nth;
    backend_cpu_sizes sz;
    qrows xq;          /* quantized input rows of the current product */
    float *s16;        /* xq.s16's buffer: half-block sums, for weights in groups of 16 */
    brows xb;          /* or its bf16 parts, for the bf16 product (kernels with gemm_bf16) */
    void *bscratch;    /* per thread: BF16_SCRATCH bytes for the bf16 product */
    float *wrow;       /* per thread: one dequantized row (unpacked matrices) */
    float *att;        /* per thread: attention state for one tile */
    size_t att_floats; /* per thread */
    int act_pairs;     /* activations as int8 pairs (value + residual), see pack.h */
    int32_t *tile_row; /* [max_rows + 1] first row of each attention tile */
    /* cos and sin tables of the RoPE parameters a model passes (one per kind of layer,
     * or short and long factors), the least recently built replaced when more come */
    const rope_params *rope_of[CPU_ROPE_TABLES]; /* the parameters table i was built for */
    float *rope_cs[CPU_ROPE_TABLES];             /* [max_keys, hd/2, 2] cos and sin each */
    int64_t rope_used[CPU_ROPE_TABLES];          /* when table i was last asked for */
    int64_t rope_tick;
    int64_t work; /* bytes of the buffers above */
    threadpool_counter counter;
} cpu_backend;

/* Static split of [0, n) for thread ith of nth. */
static void split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    *lo = n * ith / nth;
    *hi = n * (ith + 1) / nth;
}

/* The packed layout of w in the backend's prepared set, or NULL. */
static const packed_mat *packed_of(const backend *be, const matview *w) {
    const cpu_weights *cw = (const cpu_weights *)be->weights;
    return cw && w->id > 0 && w->id <= cw->n ? cw->mats[w->id - 1] : NULL;
}

/* Runs fn on the pool, or on the calling thread alone when the work (in elements
 * touched) is too small to pay for waking the workers: decode steps are full of those. */
#define INLINE_WORK 8192
static void run(cpu_backend *cb, threadpool_fn fn, void *arg, int64_t work) {
    if (work < INLINE_WORK)
        fn(arg, 0, 1);
    else
        threadpool_run(cb->pool, fn, arg);
}

/* ==== matmul and embedding ==== */

typedef struct matmul_job {
    cpu_backend *cb;
    float *y;
    const matview *w;
    const packed_mat *pw; /* w's packed layout, or NULL */
    const float *x;
    const int32_t *ids;
    int64_t n;
    float scale; /* of embedded rows */
} matmul_job;

static void quantize_task(void *p, int ith, int nth) {
    matmul_job *j = p;
    const qrows *xq = &j->cb->xq;
    const int64_t cols = j->w->cols, nb = cols / QBLOCK;
    float *res = j->cb->wrow + (size_t)ith * (size_t)j->cb->sz.max_cols;
    int64_t lo, hi;
    split(j->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        const int64_t r = t << xq->pairs;
        int8_t *q = xq->q + r * cols;
        float *d = xq->d + r * nb, *s = xq->s + r * nb;
        const float *x = j->x + t * cols;
        j->cb->k->quantize_row(q, d, s, x, cols);
        if (xq->s16) { /* the halves' sums (the residual row's stay 0, as its s) */
            float *h = xq->s16 + r * (cols / 16);
            for (int64_t c = 0; c < cols / 16; c++) {
                float sum = 0.0f;
                for (int k = 0; k < 16; k++) sum += x[16 * c + k];
                h[c] = sum;
            }
            if (xq->pairs) memset(h + cols / 16, 0, sizeof(float) * (size_t)(cols / 16));
        }
        if (!xq->pairs) continue;
        /* the second row quantizes what the first left over; its sums stay 0 so the bias
         * term is counted once */
        for (int64_t c = 0; c < cols; c++) res[c] = x[c] - d[c / QBLOCK] * (float)q[c];
        j->cb->k->quantize_row(q + cols, d + nb, s + nb, res, cols);
        memset(s + nb, 0, sizeof(float) * (size_t)nb);
    }
}

static void gemm_q_task(void *p, int ith, int nth) {
    matmul_job *j = p;
    const packed_mat *w = j->pw;
    /* decode streams weights: larger chunks; prefill tiles are heavy: one at a time */
    const int64_t chunk = j->n >= 4 ? 1 : 4;
    int64_t lo, hi;
    (void)ith, (void)nth;
    while (threadpool_chunk(&j->cb->counter, w->tiles, chunk, &lo, &hi))
        j->cb->k->gemm_q(j->y, w->rows, w, lo, hi, &j->cb->xq);
}

static void split_task(void *p, int ith, int nth) {
    matmul_job *j = p;
    const brows *xb = &j->cb->xb;
    int64_t lo, hi;
    split(j->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++)
        j->cb->k->split_bf16(brows_row(xb, t), j->x + t * xb->cols, xb->cols);
}

static void gemm_bf16_task(void *p, int ith, int nth) {
    matmul_job *j = p;
    const packed_mat *w = j->pw;
    /* sets of up to BF16_TILES weight tiles, an even number, spread over the threads */
    int64_t chunk = (w->tiles / nth + 1) & ~(int64_t)1;
    chunk = chunk < 2 ? 2 : chunk > BF16_TILES ? BF16_TILES : chunk;
    void *scratch = (char *)j->cb->bscratch + (size_t)ith * BF16_SCRATCH;
    int64_t lo, hi;
    while (threadpool_chunk(&j->cb->counter, w->tiles, chunk, &lo, &hi))
        j->cb->k->gemm_bf16(j->y, w->rows, w, lo, hi, &j->cb->xb, scratch);
}

static void gemm_dense_task(void *p, int ith, int nth) {
    matmul_job *j = p;
    int64_t lo, hi;
    (void)nth;
    if (j->w->quant_bits == 0) {
        while (threadpool_chunk(&j->cb->counter, j->w->rows, 16, &lo, &hi))
            j->cb->k->gemm_dense(j->y, j->w->rows, j->w, lo, hi, j->x, j->n);
        return;
    }
    /* an affine matrix the packer refused: one dequantized row at a time */
    float *wrow = j->cb->wrow + (size_t)ith * (size_t)j->cb->sz.max_cols;
    const matview row = {.rows = 1, .cols = j->w->cols, .type = DTYPE_F32, .data = wrow};
    while (threadpool_chunk(&j->cb->counter, j->w->rows, 16, &lo, &hi))
        for (int64_t r = lo; r < hi; r++) {
            matview_row(wrow, j->w, r);
            j->cb->k->gemm_dense(j->y + r, j->w->rows, &row, 0, 1, j->x, j->n);
        }
}

static void cpu_matmul(backend *be, float *y, const matview *w, const float *x, int64_t n) {
    cpu_backend *cb = (cpu_backend *)be;
    CELER_ASSERT(n <= cb->sz.max_rows && w->cols <= cb->sz.max_cols);
    matmul_job j = {cb, y, w, packed_of(be, w), x, NULL, n, 1.0f};
    if (j.pw && cb->xb.t && j.pw->planes == 1 && n >= BF16_MIN_ROWS && w->rows % PACK_ROWS == 0) {
        const int64_t padded = (n + 15) / 16 * 16;
        cb->xb.n = n;
        cb->xb.cols = w->cols;
        if (padded > n) /* the last group's missing rows: zero, all blocks of both parts */
            for (int64_t b = 0; b < w->cols / QBLOCK; b++)
                for (int part = 0; part < 2; part++)
                    for (int64_t t = n; t < padded; t++)
                        memset(brows_row(&cb->xb, t) + b * BROWS_BLOCK + part * 16 * QBLOCK, 0,
                               sizeof(uint16_t) * QBLOCK);
        run(cb, split_task, &j, n * w->cols);
        atomic_store(&cb->counter.next, 0);
        threadpool_run(cb->pool, gemm_bf16_task, &j);
    } else if (j.pw) {
        cb->xq.pairs = cb->act_pairs;
        cb->xq.n = n << cb->xq.pairs;
        cb->xq.cols = w->cols;
        cb->xq.s16 = j.pw->group == 16 ? cb->s16 : NULL;
        run(cb, quantize_task, &j, n * w->cols);
        atomic_store(&cb->counter.next, 0);
        threadpool_run(cb->pool, gemm_q_task, &j);
    } else {
        atomic_store(&cb->counter.next, 0);
        threadpool_run(cb->pool, gemm_dense_task, &j);
    }
}

static void embed_task(void *p, int ith, int nth) {
    matmul_job *j = p;
    int64_t lo, hi;
    split(j->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        float *out = j->y + t * j->w->cols;
        if (j->ids[t] < 0) continue;
        if (j->pw)
            packed_row(out, j->pw, j->ids[t]);
        else
            matview_row(out, j->w, j->ids[t]);
        if (j->scale != 1.0f)
            for (int64_t c = 0; c < j->w->cols; c++) out[c] *= j->scale;
    }
}

static void cpu_embed(backend *be, float *y, const matview *w, const int32_t *ids, int64_t n,
                      float scale) {
    cpu_backend *cb = (cpu_backend *)be;
    matmul_job j = {cb, y, w, packed_of(be, w), NULL, ids, n, scale};
    run(cb, embed_task, &j, n * w->cols);
}

/* ==== per-row ops ==== */

typedef struct row_job {
    cpu_backend *cb;
    float *y;
    const float *x, *x2, *w, *b;
    const int32_t *pos;
    int64_t n, d, h, hd;
    float eps;
    backend_act act;
} row_job;

static void rmsnorm_task(void *p, int ith, int nth) {
    row_job *j = p;
    int64_t lo, hi;
    split(j->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        const float *x = j->x + t * j->d;
        float *y = j->y + t * j->d;
        float ss = 0.0f;
        for (int64_t i = 0; i < j->d; i++) ss += x[i] * x[i];
        const float inv = 1.0f / sqrtf(ss / (float)j->d + j->eps);
        for (int64_t i = 0; i < j->d; i++) y[i] = j->w[i] * (x[i] * inv);
    }
}

static void cpu_rmsnorm(backend *be, float *y, const float *x, const float *w, int64_t n, int64_t d,
                        float eps) {
    row_job j = {.cb = (cpu_backend *)be, .y = y, .x = x, .w = w, .n = n, .d = d, .eps = eps};
    run(j.cb, rmsnorm_task, &j, n * d);
}

static void layernorm_task(void *p, int ith, int nth) {
    row_job *j = p;
    int64_t lo, hi;
    split(j->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++)
        j->cb->k->layernorm(j->y + t * j->d, j->x + t * j->d, j->w, j->b, j->d, j->eps);
}

static void cpu_layernorm(backend *be, float *y, const float *x, const float *w, const float *b,
                          int64_t n, int64_t d, float eps) {
    row_job j = {
        .cb = (cpu_backend *)be, .y = y, .x = x, .w = w, .b = b, .n = n, .d = d, .eps = eps};
    run(j.cb, layernorm_task, &j, n * d);
}

/* The cos and sin of every (position, pair) for rp, formed exactly as the reference
 * forms them (fp32 angle, cos/sin in double): built once per parameters while no more
 * kinds are in use than the backend has tables (sz.rope_kinds, at most CPU_ROPE_TABLES);
 * past that the least recently used table is built again. */
static const float *rope_table(cpu_backend *cb, const rope_params *rp) {
    int t = 0;
    for (int i = 0; i < CPU_ROPE_TABLES && cb->rope_cs[i]; i++) {
        if (cb->rope_of[i] == rp) {
            cb->rope_used[i] = ++cb->rope_tick;
            return cb->rope_cs[i];
        }
        if (cb->rope_used[i] < cb->rope_used[t]) t = i;
    }
    const int64_t half = rope_dims(rp, cb->sz.hd) / 2;
    float *cs = cb->rope_cs[t];
    for (int64_t p = 0; p < cb->sz.max_keys; p++)
        for (int64_t i = 0; i < half; i++) {
            const float ang = (float)p * rp->inv_freq[i];
            cs[(p * half + i) * 2] = (float)cos((double)ang) * rp->mscale;
            cs[(p * half + i) * 2 + 1] = (float)sin((double)ang) * rp->mscale;
        }
    cb->rope_of[t] = rp;
    cb->rope_used[t] = ++cb->rope_tick;
    return cs;
}

typedef struct rope_job {
    const float *cs; /* rope_table's */
    float *x;
    const int32_t *pos;
    int64_t n, h, hd, dims;
    bool traditional;
} rope_job;

static void rope_task(void *p, int ith, int nth) {
    rope_job *j = p;
    const int64_t half = j->dims / 2;
    int64_t lo, hi;
    split(j->n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        const float *cs = j->cs + (int64_t)j->pos[t] * half * 2;
        for (int64_t k = 0; k < j->h; k++) {
            float *v = j->x + (t * j->h + k) * j->hd;
            for (int64_t i = 0; i < half; i++) {
                const int64_t a = j->traditional ? 2 * i : i,
                              b = j->traditional ? 2 * i + 1 : i + half;
                const float x0 = v[a], x1 = v[b], c = cs[2 * i], s = cs[2 * i + 1];
                v[a] = x0 * c - x1 * s;
                v[b] = x1 * c + x0 * s;
            }
        }
    }
}

static void cpu_rope(backend *be, float *x, const int32_t *pos, int64_t n, int64_t h, int64_t hd,
                     const rope_params *rp) {
    cpu_backend *cb = (cpu_backend *)be;
    CELER_ASSERT(hd == cb->sz.hd);
    for (int64_t t = 0; t < n; t++) CELER_ASSERT(pos[t] >= 0 && pos[t] < cb->sz.max_keys);
    rope_job j = {rope_table(cb, rp), x, pos, n, h, hd, rope_dims(rp, hd), rp->traditional};
    run(cb, rope_task, &j, n * h * hd);
}

/* The CPU layout of a cache block of ATT_BLOCK slots: K transposed, [kvd][ATT_BLOCK], so
 * one load gives one dimension of 16 keys; V as written, [ATT_BLOCK][kvd]. fp16 pools
 * hold the same layout in half the bytes. */
static void cpu_kv_store(backend *be, void *kpool, void *vpool, const float *k, const float *v,
                         const int32_t *slot, int64_t n, int64_t kvd) {
    for (int64_t t = 0; t < n; t++) {
        const int64_t kt = (int64_t)(slot[t] / ATT_BLOCK) * ATT_BLOCK * kvd + slot[t] % ATT_BLOCK;
        const int64_t vt = (int64_t)slot[t] * kvd;
        if (be->kv_f16) {
            for (int64_t c = 0; c < kvd; c++) {
                ((uint16_t *)kpool)[kt + c * ATT_BLOCK] = f32_to_f16(k[t * kvd + c]);
                ((uint16_t *)vpool)[vt + c] = f32_to_f16(v[t * kvd + c]);
            }
        } else {
            for (int64_t c = 0; c < kvd; c++) ((float *)kpool)[kt + c * ATT_BLOCK] = k[t * kvd + c];
            memcpy((float *)vpool + vt, v + t * kvd, sizeof(float) * (size_t)kvd);
        }
    }
}

/* ==== attention ==== */

typedef struct attn_job {
    cpu_backend *cb;
    float *out;
    const float *q;
    const void *kpool, *vpool;
    const attn_rows *ar;
    int64_t n_tiles;
} attn_job;

static int64_t row_lo(const attn_rows *ar, int64_t r) {
    const int64_t p = ar->pos[r];
    return ar->window > 0 && p - ar->window + 1 > 0 ? p - ar->window + 1 : 0;
}

/* Rows [r0, r1) of one sequence (consecutive positions), query heads of KV head g: for
 * each cache block, the scores of every row and head come from one kernel call while the
 * block sits in L1, the online-softmax update masks positions a row must not see, and
 * one more call adds the block's values to every row's output. */
static void attn_tile(attn_job *j, float *st, int64_t r0, int64_t r1, int64_t g) {
    const cpu_kernels *k = j->cb->k;
    const attn_rows *ar = j->ar;
    const int64_t hd = ar->hd, group = ar->h / ar->hk, kvd = ar->hk * ar->hd, bs = ATT_BLOCK;
    const int64_t nq = (r1 - r0) * group, stride = 2 * hd;
    /* per (row, head): scaled q [hd], then the output [hd]; then running max, sum and
     * the block's correction; then the block's scores; then (fp16 pools) the block's keys
     * and values in fp32 */
    float *mx = st + nq * stride, *sum = mx + nq, *corr = sum + nq, *scores = corr + nq;
    float *kbuf = scores + nq * bs, *vbuf = kbuf + hd * bs;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t i = 0; i < group; i++) {
            const int64_t qi = (r - r0) * group + i;
            const float *q = j->q + r * ar->h * hd + (g * group + i) * hd;
            for (int64_t c = 0; c < hd; c++) st[qi * stride + c] = q[c] * ar->scale;
            memset(st + qi * stride + hd, 0, sizeof(float) * (size_t)hd);
            mx[qi] = -INFINITY;
            sum[qi] = 0.0f;
        }
    const int32_t *blocks = ar->tables + (int64_t)ar->seq[r0] * ar->table_cols;
    const int64_t lo = row_lo(ar, r0), hi = attn_rows_limit(ar, r1 - 1);
    for (int64_t kb = lo / bs; kb <= hi / bs; kb++) {
        const int64_t base = kb * bs, last = base + bs - 1;
        /* positions (and limits) rise along the rows, so the rows that see this block are a
         * range */
        int64_t ra = r0, rb = r1;
        while (ra < rb && attn_rows_limit(ar, ra) < base) ra++;
        while (rb > ra && row_lo(ar, rb - 1) > last) rb--;
        if (ra == rb) continue;
        const int64_t koff = (int64_t)blocks[kb] * bs * kvd + g * hd * bs;
        const int64_t voff = (int64_t)blocks[kb] * bs * kvd + g * hd;
        const float *kt, *vp;
        int64_t ldv = kvd;
        if (j->cb->base.kv_f16) {
            /* This KV head's slice of the block, widened once for every row and head. */
            k->f16_to_f32(kbuf, (const uint16_t *)j->kpool + koff, hd * bs);
            for (int64_t c = 0; c < bs; c++)
                k->f16_to_f32(vbuf + c * hd, (const uint16_t *)j->vpool + voff + c * kvd, hd);
            kt = kbuf, vp = vbuf, ldv = hd;
        } else {
            kt = (const float *)j->kpool + koff, vp = (const float *)j->vpool + voff;
        }
        const int64_t q0 = (ra - r0) * group, nqb = (rb - ra) * group;
        k->attn_scores(scores, st + q0 * stride, stride, nqb, kt, hd);
        for (int64_t r = ra; r < rb; r++) {
            const int64_t a = row_lo(ar, r) - base,
                          b = attn_rows_limit(ar, r) - base; /* visible: [a, b] */
            for (int64_t i = 0; i < group; i++) {
                const int64_t qi = (r - r0) * group + i;
                float *sc = scores + (qi - q0) * bs;
                float m = mx[qi];
                const int64_t lo = a > 0 ? a : 0, hi = b < bs - 1 ? b : bs - 1;
                if (ar->softcap > 0.0f && hi >= lo) k->softcap(sc + lo, ar->softcap, hi - lo + 1);
                for (int64_t c = 0; c < bs; c++) {
                    if (c < a || c > b) {
                        sc[c] = -INFINITY;
                        continue;
                    }
                    m = sc[c] > m ? sc[c] : m;
                }
                corr[qi] = mx[qi] == -INFINITY ? 0.0f : expf(mx[qi] - m);
                sum[qi] = sum[qi] * corr[qi] + k->exp_sum(sc, bs, m);
                mx[qi] = m;
            }
        }
        k->attn_pv(st + q0 * stride + hd, stride, corr + q0, scores, nqb, vp, ldv, hd);
    }
    for (int64_t r = r0; r < r1; r++)
        for (int64_t i = 0; i < group; i++) {
            const int64_t qi = (r - r0) * group + i;
            const float inv = 1.0f / sum[qi];
            float *o = j->out + r * ar->h * hd + (g * group + i) * hd;
            for (int64_t c = 0; c < hd; c++) o[c] = st[qi * stride + hd + c] * inv;
        }
}

static void attention_task(void *p, int ith, int nth) {
    attn_job *j = p;
    const int64_t hk = j->ar->hk, items = j->n_tiles * hk;
    float *st = j->cb->att + (size_t)ith * j->cb->att_floats;
    int64_t lo, hi;
    (void)nth;
    /* the last tiles of a causal prefill are the longest: hand them out first */
    while (threadpool_chunk(&j->cb->counter, items, 1, &lo, &hi)) {
        const int64_t item = items - 1 - lo, tile = item / hk, g = item % hk;
        attn_tile(j, st, j->cb->tile_row[tile], j->cb->tile_row[tile + 1], g);
    }
}

static void cpu_attention(backend *be, float *out, const float *q, const void *kpool,
                          const void *vpool, const attn_rows *ar) {
    cpu_backend *cb = (cpu_backend *)be;
    CELER_ASSERT(ar->n <= cb->sz.max_rows && ar->hd == cb->sz.hd && ar->block_size == ATT_BLOCK);
    /* tiles: runs of consecutive positions of one sequence */
    int64_t nt = 0;
    for (int64_t r = 0; r < ar->n; r++) {
        CELER_ASSERT(ar->pos[r] <= attn_rows_limit(ar, r) &&
                     attn_rows_limit(ar, r) < cb->sz.max_keys);
        const bool cont = r > 0 && ar->seq[r] == ar->seq[r - 1] &&
                          ar->pos[r] == ar->pos[r - 1] + 1 && r - cb->tile_row[nt - 1] < ATT_TILE;
        if (!cont) cb->tile_row[nt++] = (int32_t)r;
    }
    cb->tile_row[nt] = (int32_t)ar->n;
    attn_job j = {cb, out, q, kpool, vpool, ar, nt};
    atomic_store(&cb->counter.next, 0);
    threadpool_run(cb->pool, attention_task, &j);
}

/* ==== full attention ==== */

typedef struct full_job {
    cpu_backend *cb;
    float *out;
    const float *q, *k, *v;
    int64_t seg, h, hk, hd;
    int64_t tiles; /* query tiles per (segment, KV head) */
    float scale;
    int64_t n_items; /* segments x KV heads x tiles */
} full_job;

/* Query vectors [v0, v1) of segment s that read KV head g, vector i being head
 * g * group + i % group of the segment's row i / group: every key block of the segment is
 * transposed once into scratch, scored against all of them in one kernel call, folded
 * into each one's online softmax, and its values (copied next to the keys: rows kvd
 * apart are often 4 KiB apart, and 16 of them would share one L1 set) added in one more
 * call. The last block may be partial: its missing keys and values are zeros and their
 * probabilities are set to 0, so no row past the segment is read. */
static void full_tile(full_job *j, float *st, int64_t s, int64_t g, int64_t v0, int64_t v1) {
    const cpu_kernels *k = j->cb->k;
    const int64_t hd = j->hd, group = j->h / j->hk, kvd = j->hk * hd, bs = ATT_BLOCK;
    const int64_t nq = v1 - v0, stride = 2 * hd, seg = j->seg;
    /* per query vector: scaled q [hd], then the output [hd]; then running max, sum and the
     * block's correction; then the block's scores; then one block of keys (transposed)
     * and of values */
    float *mx = st + nq * stride, *sum = mx + nq, *corr = sum + nq, *scores = corr + nq;
    float *kt = scores + nq * bs, *vbuf = kt + hd * bs;
    const float *ks = j->k + s * seg * kvd + g * hd, *vs = j->v + s * seg * kvd + g * hd;
    for (int64_t i = 0; i < nq; i++) {
        const int64_t r = s * seg + (v0 + i) / group, head = g * group + (v0 + i) % group;
        const float *q = j->q + r * j->h * hd + head * hd;
        for (int64_t c = 0; c < hd; c++) st[i * stride + c] = q[c] * j->scale;
        memset(st + i * stride + hd, 0, sizeof(float) * (size_t)hd);
        mx[i] = -INFINITY;
        sum[i] = 0.0f;
    }
    for (int64_t base = 0; base < seg; base += bs) {
        const int64_t nk = seg - base < bs ? seg - base : bs;
        for (int64_t jj = 0; jj < bs; jj++) {
            if (jj < nk) {
                const float *kr = ks + (base + jj) * kvd;
                for (int64_t c = 0; c < hd; c++) kt[c * bs + jj] = kr[c];
                memcpy(vbuf + jj * hd, vs + (base + jj) * kvd, sizeof(float) * (size_t)hd);
            } else {
                for (int64_t c = 0; c < hd; c++) kt[c * bs + jj] = 0.0f;
                memset(vbuf + jj * hd, 0, sizeof(float) * (size_t)hd);
            }
        }
        k->attn_scores(scores, st, stride, nq, kt, hd);
        for (int64_t i = 0; i < nq; i++) {
            float *sc = scores + i * bs, m = mx[i];
            for (int64_t c = 0; c < nk; c++) m = sc[c] > m ? sc[c] : m;
            corr[i] = mx[i] == -INFINITY ? 0.0f : expf(mx[i] - m);
            sum[i] = sum[i] * corr[i] + k->exp_sum(sc, nk, m);
            for (int64_t c = nk; c < bs; c++) sc[c] = 0.0f;
            mx[i] = m;
        }
        k->attn_pv(st + hd, stride, corr, scores, nq, vbuf, hd, hd);
    }
    for (int64_t i = 0; i < nq; i++) {
        const int64_t r = s * seg + (v0 + i) / group, head = g * group + (v0 + i) % group;
        const float inv = 1.0f / sum[i];
        float *o = j->out + r * j->h * hd + head * hd;
        for (int64_t c = 0; c < hd; c++) o[c] = st[i * stride + hd + c] * inv;
    }
}

static void attention_full_task(void *p, int ith, int nth) {
    full_job *j = p;
    const int64_t per_seg = j->hk * j->tiles, nv = j->seg * (j->h / j->hk);
    float *st = j->cb->att + (size_t)ith * j->cb->att_floats;
    int64_t lo, hi;
    (void)nth;
    while (threadpool_chunk(&j->cb->counter, j->n_items, 1, &lo, &hi)) {
        const int64_t s = lo / per_seg, g = lo % per_seg / j->tiles, tile = lo % j->tiles;
        const int64_t v0 = tile * FULL_TILE, v1 = v0 + FULL_TILE < nv ? v0 + FULL_TILE : nv;
        full_tile(j, st, s, g, v0, v1);
    }
}

static void cpu_attention_full(backend *be, float *out, const float *q, const float *k,
                               const float *v, int64_t n, int64_t seg, int64_t h, int64_t hk,
                               int64_t hd, float scale) {
    cpu_backend *cb = (cpu_backend *)be;
    CELER_ASSERT(seg > 0 && n % seg == 0 && hk > 0 && h % hk == 0);
    CELER_ASSERT(hd > 0 && hd % 2 == 0 && hd <= cb->sz.hd);
    const int64_t tiles = (seg * (h / hk) + FULL_TILE - 1) / FULL_TILE;
    full_job j = {cb, out, q, k, v, seg, h, hk, hd, tiles, scale, n / seg * hk * tiles};
    atomic_store(&cb->counter.next, 0);
    run(cb, attention_full_task, &j, n * seg * h * hd);
}

/* ==== elementwise ==== */

static void glu_task(void *p, int ith, int nth) {
    row_job *j = p;
    int64_t lo, hi;
    split(j->n / 8, ith, nth, &lo, &hi);
    lo *= 8;
    hi = ith == nth - 1 ? j->n : hi * 8;
    j->cb->k->glu(j->y + lo, j->x + lo, j->x2 + lo, hi - lo, j->act);
}

static void cpu_glu(backend *be, float *y, const float *gate, const float *up, int64_t m,
                    backend_act act) {
    row_job j = {.cb = (cpu_backend *)be, .y = y, .x = gate, .x2 = up, .n = m, .act = act};
    run(j.cb, glu_task, &j, m);
}

/* A logits row's soft-capping: one row a step at decode, on the calling thread. */
static void cpu_softcap(backend *be, float *y, float cap, int64_t m) {
    ((cpu_backend *)be)->k->softcap(y, cap, m);
}

static void act_task(void *p, int ith, int nth) {
    row_job *j = p;
    int64_t lo, hi;
    split(j->n / 8, ith, nth, &lo, &hi);
    lo *= 8;
    hi = ith == nth - 1 ? j->n : hi * 8;
    j->cb->k->act(j->y + lo, j->x + lo, hi - lo, j->act);
}

static void cpu_act(backend *be, float *y, const float *x, int64_t m, backend_act kind) {
    row_job j = {.cb = (cpu_backend *)be, .y = y, .x = x, .n = m, .act = kind};
    run(j.cb, act_task, &j, m);
}

static void cpu_destroy(backend *be) {
    cpu_backend *cb = (cpu_backend *)be;
    threadpool_destroy(cb->pool);
    free(cb->xq.q);
    free(cb->xq.d);
    free(cb->xq.s);
    free(cb->s16);
    free(cb->xb.t);
    free(cb->bscratch);
    free(cb->wrow);
    free(cb->att);
    free(cb->tile_row);
    for (int i = 0; i < CPU_ROPE_TABLES; i++) free(cb->rope_cs[i]);
    free(cb);
}

static int64_t cpu_work_bytes(const backend *be) {
    return ((const cpu_backend *)be)->work;
}

static const backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    BACKEND_HOST_MEMORY_OPS,
    .begin = backend_host_begin,
    .work_bytes = cpu_work_bytes,
    .matmul = cpu_matmul,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .layernorm = cpu_layernorm,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention_softcap = true,
    .attention_limit = true,
    .attention = cpu_attention,
    .attention_full = cpu_attention_full,
    .glu = cpu_glu,
    .softcap = cpu_softcap,
    .act = cpu_act,
    .add = backend_host_add,
    .add_bias = backend_host_add_bias,
    .scale = backend_host_scale,
    .patches = backend_host_patches,
    .avg_pool = backend_host_avg_pool,
};

backend *backend_cpu_create(cpu_isa isa, int n_threads, const backend_cpu_sizes *sz, bool kv_f16) {
    CELER_ASSERT(isa != CPU_ISA_REF && cpu_isa_supported(isa));
    cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return NULL;
    cb->base.ops = &cpu_ops;
    cb->base.kv_f16 = kv_f16;
    cb->base.host = true;
    cb->base.kernels = cpu_isa_name(isa);
    cb->k = cpu_kernels_for(isa);
    cb->sz = *sz;
    cb->nth = n_threads < 1 ? 1 : n_threads;
    cb->pool = threadpool_create(cb->nth);
    const size_t rows = (size_t)sz->max_rows, cols = (size_t)sz->max_cols;
    const size_t blocks = (cols + QBLOCK - 1) / QBLOCK;
    /* Single int8 rows lose too much on real models (SmolLM2: mean KL 0.019 from the
     * reference, top-1 93%; pairs: 3e-7 and 100%), so pairs are the default;
     * CELER_ACT=int8 keeps the single pass for speed comparisons. */
    const char *act = getenv("CELER_ACT");
    cb->act_pairs = !(act && !strcmp(act, "int8"));
    cb->xq.q = malloc(2 * rows * cols);
    cb->xq.d = malloc(sizeof(float) * 2 * rows * blocks);
    cb->xq.s = malloc(sizeof(float) * 2 * rows * blocks);
    cb->s16 = malloc(sizeof(float) * 2 * rows * (cols / 16 + 1));
    cb->wrow = malloc(sizeof(float) * cols * (size_t)cb->nth);
    const size_t brows_bytes =
        cb->k->gemm_bf16 ? 2 * sizeof(uint16_t) * ((rows + 15) / 16 * 16) * cols : 0;
    if (brows_bytes) {
        cb->xb.t = aligned_alloc(64, (brows_bytes + 63) / 64 * 64);
        cb->bscratch = aligned_alloc(64, BF16_SCRATCH * (size_t)cb->nth);
    }
    /* per thread: ATT_TILE rows x heads per KV head (at most max_cols / hd) query vectors,
     * outputs, three scalars and a block of scores each, then a block of keys and values;
     * full attention needs the same for FULL_TILE query vectors of any head dim up to hd */
    const int64_t per_q = 2 * sz->hd + 3 + ATT_BLOCK, kv_block = 2 * sz->hd * ATT_BLOCK;
    const int64_t causal = ATT_TILE * per_q * (sz->max_cols / sz->hd) + kv_block;
    const int64_t full = FULL_TILE * per_q + kv_block;
    cb->att_floats = (size_t)(causal > full ? causal : full);
    cb->att = malloc(sizeof(float) * cb->att_floats * (size_t)cb->nth);
    cb->tile_row = malloc(sizeof(int32_t) * (rows + 1));
    const int64_t tables = sz->rope_kinds < 1                 ? 1
                           : sz->rope_kinds > CPU_ROPE_TABLES ? CPU_ROPE_TABLES
                                                              : sz->rope_kinds;
    bool have_tables = true;
    for (int64_t i = 0; i < tables; i++) {
        cb->rope_cs[i] = malloc(sizeof(float) * (size_t)sz->max_keys * (size_t)sz->hd);
        have_tables = have_tables && cb->rope_cs[i];
    }
    if (!cb->pool || !cb->xq.q || !cb->xq.d || !cb->xq.s || !cb->s16 || !cb->wrow || !cb->att ||
        !cb->tile_row || !have_tables || (brows_bytes && (!cb->xb.t || !cb->bscratch))) {
        cpu_destroy(&cb->base);
        return NULL;
    }
    cb->work =
        (int64_t)(2 * rows * cols + sizeof(float) * 4 * rows * blocks +
                  sizeof(float) * 2 * rows * (cols / 16 + 1) +
                  sizeof(float) * cols * (size_t)cb->nth +
                  sizeof(float) * cb->att_floats * (size_t)cb->nth + sizeof(int32_t) * (rows + 1) +
                  sizeof(float) * (size_t)(tables * sz->max_keys * sz->hd) + brows_bytes +
                  (brows_bytes ? BF16_SCRATCH * (size_t)cb->nth : 0));
    return &cb->base;
}

/* ==== The cpu class ==== */

static int cpu_device_count(celer_error *e) {
    (void)e;
    return 1;
}

/* "AMD EPYC 9454 48-Core Processor, 2 cores (avx512)" from /proc/cpuinfo and cpuid. */
static void cpu_device_name(int device, char *out, size_t size) {
    (void)device;
    char line[512], model[256] = "x86-64";
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        const char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || !colon) continue;
        snprintf(model, sizeof model, "%s", colon + 2);
        model[strcspn(model, "\n")] = '\0';
        break;
    }
    if (f) fclose(f);
    snprintf(out, size, "%s, %d cores (%s)", model, cpu_physical_cores(),
             cpu_isa_name(cpu_isa_best()));
}

static bool reference_kernels(const backend_params *p) {
    return p->kernels && !strcmp(p->kernels, "ref");
}

static celer_status cpu_prepare(const weight_set *ws, const backend_params *p,
                                backend_weights **out, celer_error *e) {
    *out = NULL;
    if (reference_kernels(p)) return CELER_OK; /* the reference reads every matrix in place */
    cpu_weights *w;
    celer_status s = pack_weights(ws, &backend_cpu_class, p->n_threads, &w, e);
    if (s == CELER_OK) *out = &w->base;
    return s;
}

static void cpu_unprepare(backend_weights *w) {
    pack_weights_free((cpu_weights *)w);
}

static backend *cpu_class_create(const backend_params *p, const backend_weights *w,
                                 celer_error *e) {
    cpu_isa isa;
    const char *kernels = p->kernels && *p->kernels ? p->kernels : "auto";
    if (!cpu_isa_from_name(kernels, &isa)) {
        error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                  "kernels \"%s\": expected auto, ref, generic, avx2, avx512 or amx", kernels);
        return NULL;
    }
    if (!cpu_isa_supported(isa)) {
        error_set(e, CELER_STATUS_UNSUPPORTED, "kernels \"%s\": this CPU lacks the instructions",
                  kernels);
        return NULL;
    }
    backend *be;
    if (isa == CPU_ISA_REF) {
        be = backend_ref_create(p->n_threads, p->max_cols, p->max_keys, p->kv_f16);
    } else {
        const backend_cpu_sizes sz = {.max_rows = p->max_rows,
                                      .max_cols = p->max_cols,
                                      .max_keys = p->max_keys,
                                      .hd = p->hd,
                                      .rope_kinds = p->rope_kinds};
        be = backend_cpu_create(isa, p->n_threads, &sz, p->kv_f16);
    }
    if (!be) {
        error_set(e, CELER_STATUS_OUT_OF_MEMORY, "cpu backend: out of memory");
        return NULL;
    }
    be->weights = w;
    backend_fault_init(&be->fault);
    /* CELER_CPU_STAGED=1: callers treat the backend's memory as its own, moving inputs
     * up and rows down as for a GPU, so a machine without one tests that path too */
    const char *staged = getenv("CELER_CPU_STAGED");
    if (staged && !strcmp(staged, "1")) be->host = false;
    return be;
}

static bool cpu_kernels_supported(const char *name) {
    cpu_isa isa;
    return name && cpu_isa_from_name(name, &isa) && cpu_isa_supported(isa);
}

const backend_class backend_cpu_class = {
    .name = "cpu",
    .rows_per_step = 512,
    .device_count = cpu_device_count,
    .device_name = cpu_device_name,
    .prepare = cpu_prepare,
    .unprepare = cpu_unprepare,
    .create = cpu_class_create,
    .default_threads = cpu_physical_cores,
    .kernels_supported = cpu_kernels_supported,
};

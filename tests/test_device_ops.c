/*
 * test_device_ops.c - every op of the backend on the device under test
 * ($CELER_TEST_DEVICE: "cuda", "cuda:1"; make test-cuda sets it) against the reference
 * backend, on random inputs of awkward sizes, each max difference printed beside its
 * tolerance: products of dense (F32, F16, BF16) and 4/8-bit affine matrices (groups 32,
 * 64, 128; F16, BF16 and F32 scales; one with more rows than one dequantization slab),
 * embedding rows (negative ids leave their rows alone), RMSNorm, LayerNorm with and
 * without bias (out of place and in place), RoPE (half-split and traditional, mscale),
 * K/V stores read back by paged causal attention (two sequences with shuffled block
 * tables in one call: a prefill run and decode rows; GQA, windows 0 and 9, fp16 and fp32
 * pools, head dims 40 and 128), paged attention on every kernel the device picks (runs
 * of up to 300 rows, rows of several sequences mixed or at random positions, decode rows
 * with spans past 2048, windows, GQA ratios 1 to 8, head dims 40 to 256, blocks of 7 and
 * 16 positions, runs whose image blocks see past their positions (attn_rows.limit); also
 * against a double-precision oracle), full attention over segments,
 * gated activations (glu), the GELU family, soft-capping, a gated activation fused into a
 * product (glu_matmul; also bit for bit
 * against the device's own glu then matmul),
 * add, add_bias, scale, and the memory ops (strided row copies, gathers with fill rows,
 * image patches), average pooling, and the fused ops (add_rmsnorm; rope_store, its pools read back
 * by attention) against the reference's ops they stand for. Matrices and weight vectors reach the
 * device as a model's do: prepared by the device's class, vectors mirrored from an arena; every
 * input moves up with upload and every output comes down with download, and outputs start as NaN
 * (or a pattern where the op must leave some of them alone), so an element an op forgets is seen.
 * Negative cases (one weight code off by one quantum, a causal bound one key short, a window one
 * key wider, segments moved by a row, positions moved by one) show that the bounds see
 * such bugs.
 *
 * It does not test steps (begin/end, and what a backend records in them: test_parity
 * and test_contract run whole models on the device), speed, or the CPU kernels
 * (test_cpu_kernels). The bounds are those of a device computing in fp32: the cpu
 * class's int8 activations fall outside the product bounds. With no device named it
 * prints one SKIP line.
 *
 * Tolerances. Data movement (embedding of dense rows, add, add_bias, scale, copies,
 * gathers, patches) is exact. Products and norms: 1e-5 of the largest reference value
 * (fp32 sums in another order; a contracted multiply-add). Dequantized embedding rows
 * and RoPE: 1e-6 of the largest value (one multiply-add apart). Activations and SwiGLU:
 * 1e-5 of max(1, |y|) per element (device expf, erff, tanhf against libm). Products of
 * prefill rows (n >= 128): 1e-3 of the largest value (a device's fp16 fast path, DESIGN.md
 * numerics). Attention:
 * 2e-5 absolute on unit-scale values; with fp16 pools both backends read the same
 * rounded values, so the bound is that of fp32 pools. The kernel cases: 4e-6 of the
 * largest value against the reference backend and 2e-6 against the double oracle; with
 * FAST_ROWS rows or more (a device's fp16 fast path: one fp16 query and probabilities)
 * 1e-3 of the largest value against both.
 */
#include "harness.h"

#include "backend/backend.h"
#include "base/arena.h"
#include "base/half.h"
#include "backend/ref/backend_ref.h"
#include "sampling/sampling.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_THREADS 4
#define FAST_ROWS 128 /* steps of this many rows may take a device's fp16 fast paths */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static const backend_class *cls; /* the device under test */
static int dev_index;

static void fill_rand(float *v, int64_t n, float scale, float offset) {
    for (int64_t i = 0; i < n; i++) v[i] = rand_uniform(&rng) * scale + offset;
}

/* n random floats (malloc'd). */
static float *rand_vec(int64_t n, float scale) {
    float *v = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    CELER_ASSERT(v != NULL);
    fill_rand(v, n, scale, 0.0f);
    return v;
}

/* A random integer in [0, k). */
static int32_t rand_below(int32_t k) {
    const int32_t r = (int32_t)((rand_uniform(&rng) * 0.5f + 0.5f) * (float)k);
    return r < k ? r : k - 1;
}

static void report(const char *what, double diff, double tol) {
    printf("  %-72s max diff %.3g (tol %.3g)\n", what, diff, tol);
    CHECK(diff <= tol, "%s: max diff %g > %g", what, diff, tol);
}

/* A negative case: the device against a deliberately wrong reference must be over tol. */
static void report_wrong(const char *what, double diff, double tol) {
    printf("  %-72s max diff %.3g (must be > %.3g)\n", what, diff, tol);
    CHECK(diff > tol, "%s: max diff %g <= %g: the check above cannot fail", what, diff, tol);
}

/* max |a - b| / max(1, |b|) over n floats (NaN counts as infinite). */
static double max_rel_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - (double)b[i]) / fmax(1.0, fabs((double)b[i]));
        m = d != d ? INFINITY : fmax(m, d);
    }
    return m;
}

/* ==== The device under test ==== */

typedef struct device {
    backend *be;
    backend_weights *w;
} device;

static backend_params params(bool kv_f16, int64_t rows, int64_t cols, int64_t keys, int64_t hd) {
    return (backend_params){.device = dev_index,
                            .n_threads = N_THREADS,
                            .kv_f16 = kv_f16,
                            .max_rows = rows,
                            .max_cols = cols,
                            .max_keys = keys,
                            .hd = hd};
}

/* The device's backend running with its class's prepared copy of ws; false (a failed
 * check) when the class refuses. */
static bool device_open(device *d, const weight_set *ws, const backend_params *p) {
    celer_error e = {{0}};
    d->be = NULL, d->w = NULL;
    if (!CHECK(cls->prepare(ws, p, &d->w, &e) == CELER_OK, "%s: prepare: %s", cls->name, e.msg))
        return false;
    d->be = cls->create(p, d->w, &e);
    if (!CHECK(d->be != NULL, "%s: create: %s", cls->name, e.msg)) {
        if (d->w) cls->unprepare(d->w);
        return false;
    }
    return true;
}

static void device_close(device *d) {
    backend_destroy(d->be);
    if (d->w) cls->unprepare(d->w);
}

/* The device's backend for p (in d) and a reference backend of the same sizes (returned);
 * NULL, with a failed check and nothing left open, when the device's class refuses. */
static backend *open_pair(device *d, const weight_set *ws, const backend_params *p) {
    backend *ref = backend_ref_create(N_THREADS, p->max_cols, p->max_keys, p->kv_f16);
    CELER_ASSERT(ref != NULL);
    if (device_open(d, ws, p)) return ref;
    backend_destroy(ref);
    return NULL;
}

/* Backend memory holding bytes of src (zeroed when src is NULL); release with drop. */
static void *put(backend *be, const void *src, size_t bytes) {
    void *p = be->ops->alloc(be, bytes);
    CELER_ASSERT(p != NULL);
    if (src) be->ops->upload(be, p, src, bytes);
    return p;
}

/* Backend memory of n floats, each NaN: an output the op must write in full. */
static float *put_nan(backend *be, int64_t n) {
    float *h = malloc(sizeof(float) * (size_t)n);
    CELER_ASSERT(h != NULL);
    for (int64_t i = 0; i < n; i++) h[i] = NAN;
    float *p = put(be, h, sizeof(float) * (size_t)n);
    free(h);
    return p;
}

/* dst[bytes] = backend memory src, after the work queued before. */
static void get(backend *be, void *dst, const void *src, size_t bytes) {
    be->ops->download(be, dst, src, bytes);
}

static void drop(backend *be, void *p) {
    be->ops->release(be, p);
}

/* A weight vector of n random floats in arena a, which the device mirrors. */
static float *weight_vec(arena *a, int64_t n, float scale, float offset) {
    float *v = arena_alloc(a, sizeof(float) * (size_t)n);
    CELER_ASSERT(v != NULL);
    fill_rand(v, n, scale, offset);
    return v;
}

/* ==== Matrices ==== */

/* A random matrix and the memory it owns. */
typedef struct test_mat {
    matview w;
    void *data, *scales, *biases;
    char desc[64];
} test_mat;

static void store_scale(dtype st, void *p, int64_t i, float v) {
    if (st == DTYPE_F32)
        ((float *)p)[i] = v;
    else if (st == DTYPE_F16)
        ((uint16_t *)p)[i] = f32_to_f16(v);
    else
        ((uint16_t *)p)[i] = f32_to_bf16(v);
}

/* W[rows, cols] of dense type t, values in [-1, 1). */
static void mat_dense(test_mat *m, dtype t, int64_t rows, int64_t cols) {
    const int64_t k = rows * cols;
    memset(m, 0, sizeof *m);
    m->data = malloc(dtype_size(t) * (size_t)k);
    CELER_ASSERT(m->data != NULL);
    for (int64_t i = 0; i < k; i++) store_scale(t, m->data, i, rand_uniform(&rng));
    m->w = (matview){.rows = rows, .cols = cols, .type = t, .data = m->data};
    snprintf(m->desc, sizeof m->desc, "%s [%lld x %lld]", dtype_name(t), (long long)rows,
             (long long)cols);
}

/* An MLX affine matrix: uniform codes, scales of 0.01..0.03 and biases that centre the
 * weights near zero, in scale type st. */
static void mat_affine(test_mat *m, int bits, int64_t group, dtype st, int64_t rows, int64_t cols) {
    const int64_t per = 32 / bits, words = cols / per, groups = cols / group;
    CELER_ASSERT(cols % group == 0 && cols % per == 0);
    memset(m, 0, sizeof *m);
    uint32_t *codes = calloc((size_t)(rows * words), sizeof(uint32_t));
    m->scales = malloc(dtype_size(st) * (size_t)(rows * groups));
    m->biases = malloc(dtype_size(st) * (size_t)(rows * groups));
    CELER_ASSERT(codes && m->scales && m->biases);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            codes[r * words + c / per] |= (uint32_t)rand_below(1 << bits) << ((c % per) * bits);
    for (int64_t i = 0; i < rows * groups; i++) {
        const float s = 0.01f + 0.02f * fabsf(rand_uniform(&rng));
        store_scale(st, m->scales, i, s);
        store_scale(st, m->biases, i,
                    -s * (float)(1 << (bits - 1)) * (1.0f + 0.1f * rand_uniform(&rng)));
    }
    m->data = codes;
    m->w = (matview){.rows = rows,
                     .cols = cols,
                     .type = DTYPE_U32,
                     .data = codes,
                     .quant_bits = bits,
                     .group = group,
                     .scale_type = st,
                     .scales = m->scales,
                     .biases = m->biases};
    snprintf(m->desc, sizeof m->desc, "%d-bit g%lld %s [%lld x %lld]", bits, (long long)group,
             dtype_name(st), (long long)rows, (long long)cols);
}

static void mat_free(test_mat *m) {
    free(m->data), free(m->scales), free(m->biases);
}

/* The prepared set of mats[n]: ids 1..n in order. */
static weight_set mats_set(test_mat *mats, matview **list, int n, const arena *const *vectors,
                           int n_vectors) {
    for (int i = 0; i < n; i++) mats[i].w.id = i + 1, list[i] = &mats[i].w;
    return (weight_set){.mats = list, .n_mats = n, .vectors = vectors, .n_vectors = n_vectors};
}

/* ==== matmul ==== */

#define MAX_MATS    64
#define MM_MAX_N    37
#define MM_MAX_COLS 640
/* An LM head's worth of rows (many blocks of row tiles, the last one partial). */
#define HEAD_ROWS (2 * 16384 + 37)

/* One product of n random rows through w on both backends (x and dx: host and device
 * rows of at least n * w->cols; yr, yd: room for n * w->rows): the largest difference and
 * the largest reference value go into *diff and *mx. */
static void matmul_case(backend *be, backend *ref, const matview *w, int64_t n, float *x, float *dx,
                        float *yr, float *yd, double *diff, double *mx) {
    const int64_t m = n * w->rows;
    fill_rand(x, n * w->cols, 1.0f, 0.0f);
    be->ops->upload(be, dx, x, sizeof(float) * (size_t)(n * w->cols));
    float *dy = put_nan(be, m);
    be->ops->matmul(be, dy, w, dx, n);
    ref->ops->matmul(ref, yr, w, x, n);
    get(be, yd, dy, sizeof(float) * (size_t)m);
    drop(be, dy);
    *diff = fmax(*diff, max_abs_diff(yd, yr, m));
    *mx = fmax(*mx, max_abs(yr, m));
}

/* matmul_multi over k <= 3 matrices of one input, n random rows, each output against the
 * reference's own product; as matmul_case. */
static void multi_case(backend *be, backend *ref, const matview *const *mw, int k, int64_t n,
                       float *x, float *dx, float *yr, float *yd, double *diff, double *mx) {
    const int64_t cols = mw[0]->cols;
    fill_rand(x, n * cols, 1.0f, 0.0f);
    be->ops->upload(be, dx, x, sizeof(float) * (size_t)(n * cols));
    float *dys[3];
    for (int i = 0; i < k; i++) dys[i] = put_nan(be, n * mw[i]->rows);
    backend_matmul_multi(be, dys, mw, k, dx, n);
    for (int i = 0; i < k; i++) {
        const int64_t m = n * mw[i]->rows;
        ref->ops->matmul(ref, yr, mw[i], x, n);
        get(be, yd, dys[i], sizeof(float) * (size_t)m);
        drop(be, dys[i]);
        *diff = fmax(*diff, max_abs_diff(yd, yr, m));
        *mx = fmax(*mx, max_abs(yr, m));
    }
}

/* swiglu_matmul of n random gate and up rows through w (x, dx: room for 2 n w->cols):
 * against the reference's swiglu then product (into *diff, *mx), and bit for bit against
 * the device's own swiglu then matmul (the largest difference into *self). */
static void swiglu_case(backend *be, backend *ref, const matview *w, int64_t n, float *x, float *dx,
                        float *yr, float *yd, double *diff, double *mx, double *self,
                        backend_act act) {
    const int64_t m = n * w->rows, k = n * w->cols;
    fill_rand(x, 2 * k, 2.0f, 0.0f);
    float *dgate = dx, *dup = dx + k, *dy = put_nan(be, m);
    be->ops->upload(be, dx, x, sizeof(float) * (size_t)(2 * k));
    backend_glu_matmul(be, dy, w, dgate, dup, n, act);
    ref->ops->glu(ref, x, x, x + k, k, act);
    ref->ops->matmul(ref, yr, w, x, n);
    get(be, yd, dy, sizeof(float) * (size_t)m);
    *diff = fmax(*diff, max_abs_diff(yd, yr, m));
    *mx = fmax(*mx, max_abs(yr, m));
    fill_rand(x, 2 * k, 2.0f, 0.0f);
    be->ops->upload(be, dx, x, sizeof(float) * (size_t)(2 * k));
    backend_glu_matmul(be, dy, w, dgate, dup, n, act);
    get(be, yd, dy, sizeof(float) * (size_t)m);
    be->ops->upload(be, dx, x, sizeof(float) * (size_t)(2 * k));
    be->ops->glu(be, dgate, dgate, dup, k, act);
    be->ops->matmul(be, dy, w, dgate, n);
    get(be, yr, dy, sizeof(float) * (size_t)m);
    *self = fmax(*self, max_abs_diff(yd, yr, m));
    drop(be, dy);
}

/* swiglu_mlp of n random rows x through gate g, up u and down d (x: room for n (cols + 2
 * g->rows) floats; dx: n cols): against the reference's products and swiglu (into *diff,
 * *mx), and against the device's own matmul_multi then swiglu_matmul (into *self). */
static void mlp_case(backend *be, backend *ref, const matview *g, const matview *u,
                     const matview *d, int64_t n, float *x, float *dx, float *yr, float *yd,
                     double *diff, double *mx, double *self, backend_act act) {
    const int64_t f = g->rows, m = n * d->rows;
    float *gr = x + n * g->cols, *ur = gr + n * f;
    fill_rand(x, n * g->cols, 1.0f, 0.0f);
    be->ops->upload(be, dx, x, sizeof(float) * (size_t)(n * g->cols));
    float *dg = put_nan(be, n * f), *du = put_nan(be, n * f), *dy = put_nan(be, m);
    backend_glu_mlp(be, dy, g, u, d, dx, dg, du, n, act);
    get(be, yd, dy, sizeof(float) * (size_t)m);
    ref->ops->matmul(ref, gr, g, x, n);
    ref->ops->matmul(ref, ur, u, x, n);
    ref->ops->glu(ref, gr, gr, ur, n * f, act);
    ref->ops->matmul(ref, yr, d, gr, n);
    *diff = fmax(*diff, max_abs_diff(yd, yr, m));
    *mx = fmax(*mx, max_abs(yr, m));
    float *const ys[2] = {dg, du};
    const matview *const ws[2] = {g, u};
    backend_matmul_multi(be, ys, ws, 2, dx, n);
    backend_glu_matmul(be, dy, d, dg, du, n, act);
    get(be, yr, dy, sizeof(float) * (size_t)m);
    *self = fmax(*self, max_abs_diff(yd, yr, m));
    drop(be, dg), drop(be, du), drop(be, dy);
}

static void test_matmul(void) {
    static test_mat mats[MAX_MATS];
    matview *list[MAX_MATS];
    int nm = 0;
    const dtype dense[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    const int64_t dense_shape[3][2] = {{1, 77}, {33, 130}, {100, 320}};
    for (int t = 0; t < 3; t++)
        for (int s = 0; s < 3; s++)
            mat_dense(&mats[nm++], dense[t], dense_shape[s][0], dense_shape[s][1]);
    const int bits[] = {4, 8};
    const int64_t groups[] = {32, 64, 128}, rows[] = {1, 33, 100};
    const int64_t cols_small[] = {64, 192, 320}, cols_g128[] = {128, 384, 640};
    const dtype sts[] = {DTYPE_F16, DTYPE_BF16};
    int wrong = -1; /* the matrix of the negative case */
    for (int b = 0; b < 2; b++)
        for (int g = 0; g < 3; g++)
            for (int st = 0; st < 2; st++)
                for (int s = 0; s < 3; s++) {
                    const int64_t cols = groups[g] == 128 ? cols_g128[s] : cols_small[s];
                    if (bits[b] == 4 && groups[g] == 32 && st == 0 && s == 1) wrong = nm;
                    mat_affine(&mats[nm++], bits[b], groups[g], sts[st], rows[s], cols);
                }
    mat_affine(&mats[nm++], 4, 64, DTYPE_F32, 37, 192); /* F32 scales, not exact in f16 */
    /* sets of one input for matmul_multi (q, k, v-like rows), and one that cannot share a
     * launch (a dense matrix among them) */
    const int sets = nm;
    const int64_t set_rows[3] = {100, 33, 33};
    for (int i = 0; i < 3; i++) mat_affine(&mats[nm++], 4, 64, DTYPE_F16, set_rows[i], 192);
    for (int i = 0; i < 3; i++) mat_affine(&mats[nm++], 8, 32, DTYPE_BF16, set_rows[i], 192);
    mat_affine(&mats[nm++], 4, 64, DTYPE_F16, 33, 192);
    mat_dense(&mats[nm++], DTYPE_F16, 33, 192);
    const int head = nm;
    mat_affine(&mats[nm++], 4, 64, DTYPE_F16, HEAD_ROWS, 64);
    CELER_ASSERT(nm <= MAX_MATS);
    const weight_set ws = mats_set(mats, list, nm, NULL, 0);
    const backend_params p = params(false, MM_MAX_N, 4096, 16, 64);
    device d;
    backend *ref = backend_ref_create(N_THREADS, 4096, 16, false);
    CELER_ASSERT(ref != NULL);
    if (device_open(&d, &ws, &p)) {
        backend *be = d.be;
        float *x = malloc(sizeof(float) * MM_MAX_N * MM_MAX_COLS);
        float *yr = malloc(sizeof(float) * MM_MAX_N * HEAD_ROWS),
              *yd = malloc(sizeof(float) * MM_MAX_N * HEAD_ROWS);
        float *dx = put(be, NULL, sizeof(float) * MM_MAX_N * MM_MAX_COLS);
        const int64_t ns[] = {1, 3, 8, 37};
        float *x2 = malloc(sizeof(float) * 2 * MM_MAX_N * MM_MAX_COLS);
        float *dx2 = put(be, NULL, sizeof(float) * 2 * MM_MAX_N * MM_MAX_COLS);
        for (int i = 0; i < nm; i++) {
            const matview *w = &mats[i].w;
            double diff = 0, mx = 0;
            for (int k = 0; k < 4; k++) matmul_case(be, ref, w, ns[k], x, dx, yr, yd, &diff, &mx);
            char what[128];
            snprintf(what, sizeof what, "matmul %s%s n=1,3,8,37", mats[i].desc,
                     i == head ? " (a head)" : "");
            report(what, diff, 1e-5 * mx);
            /* an MLP's down projection: SwiGLU where the product reads x */
            /* and GeGLU (gelu tanh), which the fused decode staging leaves to the glu op */
            for (int a = 0; a < 2; a++) {
                const backend_act act = a ? BACKEND_ACT_GELU_TANH : BACKEND_ACT_SILU;
                double self = 0;
                diff = mx = 0;
                for (int k = 0; k < 4; k++)
                    swiglu_case(be, ref, w, ns[k], x2, dx2, yr, yd, &diff, &mx, &self, act);
                snprintf(what, sizeof what, "glu_matmul %s %s n=1,3,8,37", a ? "gelu tanh" : "silu",
                         mats[i].desc);
                report(what, diff, 1e-5 * mx);
                CHECK(self == 0, "glu_matmul %s: %g from the device's glu then matmul (must be 0)",
                      mats[i].desc, self);
            }
        }
        /* matmul_multi: each output against the reference's own product */
        const int set_first[3] = {sets, sets + 3, sets + 6}, set_k[3] = {3, 3, 2};
        const char *const set_names[3] = {"4-bit g64 F16, rows 100/33/33",
                                          "8-bit g32 BF16, rows 100/33/33",
                                          "4-bit g64 and dense F16 (one by one)"};
        for (int si = 0; si < 3; si++) {
            const int k = set_k[si];
            double diff = 0, mx = 0;
            const matview *mw[3];
            for (int i = 0; i < k; i++) mw[i] = &mats[set_first[si] + i].w;
            for (int ni = 0; ni < 4; ni++)
                multi_case(be, ref, mw, k, ns[ni], x, dx, yr, yd, &diff, &mx);
            char what[128];
            snprintf(what, sizeof what, "matmul_multi %s, n=1,3,8,37", set_names[si]);
            report(what, diff, 1e-5 * mx);
        }
        /* the reference with one code of the matrix one quantum off must be seen */
        const matview *w = &mats[wrong].w;
        const int64_t n = 8, words = w->cols / 8, m = n * w->rows, r = 17, c = 101;
        uint32_t *codes = malloc(sizeof(uint32_t) * (size_t)(w->rows * words));
        memcpy(codes, w->data, sizeof(uint32_t) * (size_t)(w->rows * words));
        uint32_t *word = &codes[r * words + c / 8];
        const unsigned shift = (unsigned)(c % 8) * 4;
        const uint32_t q = (*word >> shift) & 15u;
        *word = (*word & ~(15u << shift)) | ((q == 15u ? 14u : q + 1u) << shift);
        matview off = *w;
        off.data = codes;
        fill_rand(x, n * w->cols, 1.0f, 0.0f);
        x[3 * w->cols + c] = 1.0f; /* a row where that weight counts in full */
        be->ops->upload(be, dx, x, sizeof(float) * (size_t)(n * w->cols));
        float *dy = put_nan(be, m);
        be->ops->matmul(be, dy, w, dx, n);
        get(be, yd, dy, sizeof(float) * (size_t)m);
        ref->ops->matmul(ref, yr, w, x, n);
        const double tol = 1e-5 * max_abs(yr, m);
        ref->ops->matmul(ref, yr, &off, x, n);
        char what[128];
        snprintf(what, sizeof what, "  ... %s against one code one quantum off", mats[wrong].desc);
        report_wrong(what, max_abs_diff(yd, yr, m), tol);
        drop(be, dy);
        drop(be, dx);
        drop(be, dx2);
        free(codes), free(x), free(x2), free(yr), free(yd);
        device_close(&d);
    }
    backend_destroy(ref);
    for (int i = 0; i < nm; i++) mat_free(&mats[i]);
}

/* ==== embed ==== */

static void test_embed(void) {
    enum { N_TABLES = 6, VOCAB = 61, N = 37 };
    test_mat mats[N_TABLES];
    matview *list[N_TABLES];
    mat_dense(&mats[0], DTYPE_F32, VOCAB, 77);
    mat_dense(&mats[1], DTYPE_F16, VOCAB, 130);
    mat_dense(&mats[2], DTYPE_BF16, VOCAB, 96);
    mat_affine(&mats[3], 4, 32, DTYPE_F16, VOCAB, 96);
    mat_affine(&mats[4], 8, 64, DTYPE_BF16, VOCAB, 192);
    mat_affine(&mats[5], 4, 128, DTYPE_F32, VOCAB, 256);
    const weight_set ws = mats_set(mats, list, N_TABLES, NULL, 0);
    const backend_params p = params(false, N, 256, 16, 64);
    device d;
    backend *ref = backend_ref_create(N_THREADS, 256, 16, false);
    CELER_ASSERT(ref != NULL);
    int32_t ids[N];
    for (int t = 0; t < N; t++) ids[t] = rand_below(VOCAB);
    ids[0] = VOCAB - 1, ids[1] = 0, ids[4] = ids[19] = ids[N - 1] = -1;
    if (device_open(&d, &ws, &p)) {
        backend *be = d.be;
        int32_t *dids = put(be, ids, sizeof ids);
        float *yr = malloc(sizeof(float) * N * 256), *yd = malloc(sizeof(float) * N * 256);
        for (int i = 0; i < N_TABLES; i++) {
            const matview *w = &mats[i].w;
            const int64_t m = N * w->cols;
            for (int64_t j = 0; j < m; j++) yr[j] = 1000.0f + (float)j; /* what negative ids keep */
            float *dy = put(be, yr, sizeof(float) * (size_t)m);
            const float scale = i % 2 ? 8.0f : 1.0f; /* Gemma's sqrt(d) on every other table */
            be->ops->embed(be, dy, w, dids, N, scale);
            ref->ops->embed(ref, yr, w, ids, N, scale);
            get(be, yd, dy, sizeof(float) * (size_t)m);
            drop(be, dy);
            double mx = 0;
            bool kept = true;
            for (int t = 0; t < N; t++)
                for (int64_t c = 0; c < w->cols; c++) {
                    const int64_t j = t * w->cols + c;
                    if (ids[t] >= 0)
                        mx = fmax(mx, fabs(yr[j]));
                    else
                        kept = kept && yd[j] == 1000.0f + (float)j;
                }
            CHECK(kept, "embed %s: a row of a negative id was written", mats[i].desc);
            char what[128];
            snprintf(what, sizeof what, "embed %s x %g n=37, 3 ids negative", mats[i].desc,
                     (double)scale);
            report(what, max_abs_diff(yd, yr, m), w->quant_bits ? 1e-6 * mx : 0.0);
        }
        drop(be, dids);
        free(yr), free(yd);
        device_close(&d);
    }
    backend_destroy(ref);
    for (int i = 0; i < N_TABLES; i++) mat_free(&mats[i]);
}

/* ==== Norms, elementwise ops and data movement ==== */

#define VEC_N 37
#define ACT_M (37 * 1031)

typedef struct vectors {
    float *rms_w[2], *ln_w[2], *ln_b[2], *bias[2]; /* [d] for d = 77, 1028 */
    float *fill;                                   /* [130], gather_rows */
} vectors;

/* (rows of 37: at 1028 the CUDA device takes float4 loads) */
static const int64_t norm_d[2] = {77, 1028};

/* op of y[n, d] from x[n, d] on both backends, out of place and in place (y = x): the
 * max difference, and the largest reference value in *mx. kind: 0 rmsnorm, 1 layernorm,
 * 2 layernorm without bias. */
static double norm_diff(backend *be, backend *ref, const vectors *v, int di, int kind, double *mx) {
    const int64_t d = norm_d[di], m = VEC_N * d;
    float *x = rand_vec(m, 2.0f), *yr = malloc(sizeof(float) * (size_t)m),
          *yd = malloc(sizeof(float) * (size_t)m);
    for (int64_t i = 0; i < m; i++) x[i] += kind ? 3.0f : 0.25f; /* a mean far from zero */
    double diff = 0;
    *mx = 0;
    for (int inplace = 0; inplace < 2; inplace++) {
        float *dx = put(be, x, sizeof(float) * (size_t)m), *dy = inplace ? dx : put_nan(be, m);
        if (inplace) memcpy(yr, x, sizeof(float) * (size_t)m);
        const float *xr = inplace ? yr : x;
        if (kind == 0) {
            be->ops->rmsnorm(be, dy, dx, v->rms_w[di], VEC_N, d, 1e-6f);
            ref->ops->rmsnorm(ref, yr, xr, v->rms_w[di], VEC_N, d, 1e-6f);
        } else {
            const float *b = kind == 1 ? v->ln_b[di] : NULL;
            be->ops->layernorm(be, dy, dx, v->ln_w[di], b, VEC_N, d, 1e-5f);
            ref->ops->layernorm(ref, yr, xr, v->ln_w[di], b, VEC_N, d, 1e-5f);
        }
        get(be, yd, dy, sizeof(float) * (size_t)m);
        diff = fmax(diff, max_abs_diff(yd, yr, m));
        *mx = fmax(*mx, max_abs(yr, m));
        if (!inplace) drop(be, dy);
        drop(be, dx);
    }
    free(x), free(yr), free(yd);
    return diff;
}

static void test_norms(backend *be, backend *ref, const vectors *v) {
    const char *const names[3] = {"rmsnorm", "layernorm with bias", "layernorm without bias"};
    for (int kind = 0; kind < 3; kind++)
        for (int di = 0; di < 2; di++) {
            double mx;
            const double diff = norm_diff(be, ref, v, di, kind, &mx);
            char what[128];
            snprintf(what, sizeof what, "%s [37 x %lld], out of place and in place", names[kind],
                     (long long)norm_d[di]);
            report(what, diff, 1e-5 * mx);
        }
    for (int di = 0; di < 2; di++) { /* the fused add + rmsnorm against the reference's two ops */
        const int64_t d = norm_d[di], m = VEC_N * d;
        float *x = rand_vec(m, 2.0f), *r = rand_vec(m, 1.0f),
              *yr = malloc(sizeof(float) * (size_t)m);
        float *yd = malloc(sizeof(float) * (size_t)m), *xd = malloc(sizeof(float) * (size_t)m);
        float *dx = put(be, x, sizeof(float) * (size_t)m),
              *dr = put(be, r, sizeof(float) * (size_t)m);
        float *dy = put_nan(be, m);
        backend_add_rmsnorm(be, dy, dx, dr, v->rms_w[di], VEC_N, d, 1e-6f);
        backend_add_rmsnorm(ref, yr, x, r, v->rms_w[di], VEC_N, d, 1e-6f);
        get(be, yd, dy, sizeof(float) * (size_t)m);
        get(be, xd, dx, sizeof(float) * (size_t)m);
        char what[128];
        snprintf(what, sizeof what, "add_rmsnorm [37 x %lld]: the sum", (long long)d);
        report(what, max_abs_diff(xd, x, m), 0.0);
        snprintf(what, sizeof what, "add_rmsnorm [37 x %lld]: the norm", (long long)d);
        report(what, max_abs_diff(yd, yr, m), 1e-5 * max_abs(yr, m));
        drop(be, dx), drop(be, dr), drop(be, dy);
        free(x), free(r), free(yr), free(yd), free(xd);
    }
    for (int di = 0; di < 2; di++) {
        const int64_t d = norm_d[di], m = VEC_N * d;
        float *y = rand_vec(m, 1.0f), *yd = malloc(sizeof(float) * (size_t)m);
        float *dy = put(be, y, sizeof(float) * (size_t)m);
        be->ops->add_bias(be, dy, v->bias[di], VEC_N, d);
        ref->ops->add_bias(ref, y, v->bias[di], VEC_N, d);
        get(be, yd, dy, sizeof(float) * (size_t)m);
        char what[128];
        snprintf(what, sizeof what, "add_bias [37 x %lld]", (long long)d);
        report(what, max_abs_diff(yd, y, m), 0.0);
        drop(be, dy);
        free(y), free(yd);
    }
}

static void test_elementwise(backend *be, backend *ref) {
    const int64_t ms[2] = {13, ACT_M};
    float *x = malloc(sizeof(float) * ACT_M), *x2 = malloc(sizeof(float) * ACT_M);
    float *yr = malloc(sizeof(float) * ACT_M), *yd = malloc(sizeof(float) * ACT_M);
    char what[128];
    for (int mi = 0; mi < 2; mi++) {
        const int64_t m = ms[mi];
        const size_t bytes = sizeof(float) * (size_t)m;
        /* glu of each activation, out of place and in place (y = gate, as the MLP calls it) */
        float *dg = put_nan(be, m), *du = put_nan(be, m), *dy = put_nan(be, m);
        double diff;
        const backend_act glus[4] = {BACKEND_ACT_SILU, BACKEND_ACT_GELU_ERF, BACKEND_ACT_GELU_TANH,
                                     BACKEND_ACT_QUICK_GELU};
        const char *const glu_names[4] = {"silu", "gelu erf", "gelu tanh", "quick gelu"};
        for (int k = 0; k < 4; k++) {
            fill_rand(x, m, 10.0f, 0.0f);
            fill_rand(x2, m, 1.0f, 0.0f);
            be->ops->upload(be, dg, x, bytes);
            be->ops->upload(be, du, x2, bytes);
            be->ops->glu(be, dy, dg, du, m, glus[k]);
            ref->ops->glu(ref, yr, x, x2, m, glus[k]);
            get(be, yd, dy, bytes);
            diff = max_rel_diff(yd, yr, m);
            be->ops->glu(be, dg, dg, du, m, glus[k]);
            get(be, yd, dg, bytes);
            diff = fmax(diff, max_rel_diff(yd, yr, m));
            snprintf(what, sizeof what, "glu %s m=%lld, out of place and in place (relative)",
                     glu_names[k], (long long)m);
            report(what, diff, 1e-5);
        }
        /* soft-capping of logits-sized values */
        fill_rand(x, m, 80.0f, 0.0f);
        be->ops->upload(be, dy, x, bytes);
        be->ops->softcap(be, dy, 30.0f, m);
        memcpy(yr, x, bytes);
        ref->ops->softcap(ref, yr, 30.0f, m);
        get(be, yd, dy, bytes);
        snprintf(what, sizeof what, "softcap 30 m=%lld (relative)", (long long)m);
        report(what, max_rel_diff(yd, yr, m), 1e-5);
        /* the GELU family on [-8, 8) and a few far values, out of place and in place */
        const float far[12] = {-1e4f, -100.0f, -30.0f, -15.0f, -0.0f,  1e-30f,
                               15.0f, 30.0f,   100.0f, 1e4f,   -1e-7f, 0.5f};
        const backend_act kinds[3] = {BACKEND_ACT_GELU_ERF, BACKEND_ACT_GELU_TANH,
                                      BACKEND_ACT_QUICK_GELU};
        const char *const kind_names[3] = {"gelu erf", "gelu tanh", "quick gelu"};
        for (int k = 0; k < 3; k++) {
            fill_rand(x, m, 8.0f, 0.0f);
            for (int i = 0; i < 12 && i < m; i++) x[m - 1 - i] = far[i];
            be->ops->upload(be, dg, x, bytes);
            be->ops->act(be, dy, dg, m, kinds[k]);
            ref->ops->act(ref, yr, x, m, kinds[k]);
            get(be, yd, dy, bytes);
            diff = max_rel_diff(yd, yr, m);
            be->ops->act(be, dg, dg, m, kinds[k]);
            get(be, yd, dg, bytes);
            diff = fmax(diff, max_rel_diff(yd, yr, m));
            snprintf(what, sizeof what, "act %s m=%lld, out of place and in place (relative)",
                     kind_names[k], (long long)m);
            report(what, diff, 1e-5);
        }
        /* add and scale: exact */
        fill_rand(x, m, 1.0f, 0.0f);
        fill_rand(x2, m, 1.0f, 0.0f);
        be->ops->upload(be, dy, x, bytes);
        be->ops->upload(be, du, x2, bytes);
        be->ops->add(be, dy, du, m);
        ref->ops->add(ref, x, x2, m);
        get(be, yd, dy, bytes);
        snprintf(what, sizeof what, "add m=%lld", (long long)m);
        report(what, max_abs_diff(yd, x, m), 0.0);
        be->ops->scale(be, dy, -0.37f, m);
        ref->ops->scale(ref, x, -0.37f, m);
        get(be, yd, dy, bytes);
        snprintf(what, sizeof what, "scale m=%lld", (long long)m);
        report(what, max_abs_diff(yd, x, m), 0.0);
        drop(be, dg), drop(be, du), drop(be, dy);
    }
    free(x), free(x2), free(yr), free(yd);
}

static void test_movement(backend *be, backend *ref, const vectors *v) {
    char what[128];
    /* copy_rows: strided both sides, then contiguous; the gaps keep their pattern */
    const struct { int64_t n, d, ldy, ldx; } copies[2] = {{37, 77, 100, 1031}, {5, 130, 130, 130}};
    for (int c = 0; c < 2; c++) {
        const int64_t n = copies[c].n, d = copies[c].d, ldy = copies[c].ldy, ldx = copies[c].ldx;
        float *x = rand_vec(n * ldx, 1.0f), *y = malloc(sizeof(float) * (size_t)(n * ldy));
        float *yd = malloc(sizeof(float) * (size_t)(n * ldy));
        for (int64_t i = 0; i < n * ldy; i++) y[i] = -7.0f - (float)i;
        float *dx = put(be, x, sizeof(float) * (size_t)(n * ldx)),
              *dy = put(be, y, sizeof(float) * (size_t)(n * ldy));
        be->ops->copy_rows(be, dy, ldy, dx, ldx, n, d);
        ref->ops->copy_rows(ref, y, ldy, x, ldx, n, d);
        get(be, yd, dy, sizeof(float) * (size_t)(n * ldy));
        snprintf(what, sizeof what, "copy_rows [%lld x %lld], ldy %lld, ldx %lld", (long long)n,
                 (long long)d, (long long)ldy, (long long)ldx);
        report(what, max_abs_diff(yd, y, n * ldy), 0.0);
        drop(be, dx), drop(be, dy);
        free(x), free(y), free(yd);
    }
    /* gather_rows: repeats, the first and last rows, and -1 rows taking the fill vector */
    {
        const int64_t rows = 61, d = 130, n = 37;
        int32_t idx[37];
        for (int i = 0; i < n; i++) idx[i] = rand_below((int32_t)rows);
        idx[0] = (int32_t)rows - 1, idx[1] = 0, idx[2] = idx[3] = 5,
        idx[7] = idx[8] = idx[n - 1] = -1;
        float *x = rand_vec(rows * d, 1.0f), *y = malloc(sizeof(float) * (size_t)(n * d));
        float *yd = malloc(sizeof(float) * (size_t)(n * d));
        float *dx = put(be, x, sizeof(float) * (size_t)(rows * d)), *dy = put_nan(be, n * d);
        int32_t *didx = put(be, idx, sizeof idx);
        be->ops->gather_rows(be, dy, dx, didx, v->fill, n, d);
        ref->ops->gather_rows(ref, y, x, idx, v->fill, n, d);
        get(be, yd, dy, sizeof(float) * (size_t)(n * d));
        report("gather_rows [37 x 130] of 61 rows, 3 fill rows", max_abs_diff(yd, y, n * d), 0.0);
        drop(be, dx), drop(be, dy), drop(be, didx);
        free(x), free(y), free(yd);
    }
    /* patches: a size the patch does not divide (the rest cropped), a ViT-like one */
    const struct { int64_t n, s, p; } pc[3] = {{2, 30, 7}, {1, 28, 14}, {3, 16, 4}};
    for (int c = 0; c < 3; c++) {
        const int64_t n = pc[c].n, s = pc[c].s, p = pc[c].p, g = s / p, cols = 3 * p * p;
        float *x = rand_vec(n * 3 * s * s, 1.0f);
        float *dx = put(be, x, sizeof(float) * (size_t)(n * 3 * s * s));
        for (int cl = 0; cl < 2; cl++)
            for (int lead = 0; lead < 2; lead++) {
                const int64_t m = n * (g * g + lead) * cols;
                float *y = malloc(sizeof(float) * (size_t)m),
                      *yd = malloc(sizeof(float) * (size_t)m);
                float *dy = put_nan(be, m);
                be->ops->patches(be, dy, dx, n, s, p, cl, lead);
                ref->ops->patches(ref, y, x, n, s, p, cl, lead);
                get(be, yd, dy, sizeof(float) * (size_t)m);
                snprintf(what, sizeof what, "patches %lld x [3, %lld, %lld] p=%lld, %s, %s",
                         (long long)n, (long long)s, (long long)s, (long long)p,
                         cl ? "channels last" : "channels first",
                         lead ? "lead row" : "no lead row");
                report(what, max_abs_diff(yd, y, m), 0.0);
                drop(be, dy);
                free(y), free(yd);
            }
        drop(be, dx);
        free(x);
    }
    /* avg_pool: Gemma 3's projector (4 x 4 windows of a 16 x 16 grid), and odd sizes */
    const struct { int64_t n, s, k, d; } ac[3] = {{2, 16, 4, 37}, {1, 64, 4, 72}, {3, 6, 3, 5}};
    for (int c = 0; c < 3; c++) {
        const int64_t n = ac[c].n, s = ac[c].s, k = ac[c].k, d = ac[c].d,
                      m = n * (s / k) * (s / k) * d;
        float *x = rand_vec(n * s * s * d, 1.0f), *y = malloc(sizeof(float) * (size_t)m),
              *yd = malloc(sizeof(float) * (size_t)m);
        float *dx = put(be, x, sizeof(float) * (size_t)(n * s * s * d)), *dy = put_nan(be, m);
        be->ops->avg_pool(be, dy, dx, n, s, k, d);
        ref->ops->avg_pool(ref, y, x, n, s, k, d);
        get(be, yd, dy, sizeof(float) * (size_t)m);
        snprintf(what, sizeof what, "avg_pool %lld x [%lld, %lld, %lld] k=%lld", (long long)n,
                 (long long)s, (long long)s, (long long)d, (long long)k);
        report(what, max_abs_diff(yd, y, m), 1e-6);
        drop(be, dx), drop(be, dy);
        free(x), free(y), free(yd);
    }
}

/* argmax_rows (optional: a device backend's own) against sampling_argmax on the host:
 * rows of random values with the maximum anywhere (a vocabulary of 49,157, not a multiple
 * of the block), ties (the first wins), NaNs (never win), a row of -inf, a row of NaN. */
static void test_argmax(backend *be) {
    if (!be->ops->argmax_rows) return;
    const int64_t n = 9, v = 49157;
    float *x = rand_vec(n * v, 1.0f);
    x[0 * v + 0] = 5.0f;                                   /* at the first id */
    x[1 * v + v - 1] = 5.0f;                               /* at the last */
    x[2 * v + 1000] = x[2 * v + 40000] = 5.0f;             /* a tie: 1000 */
    for (int64_t i = 0; i < v; i += 3) x[3 * v + i] = NAN; /* NaNs around the maximum */
    x[3 * v + 7777] = 5.0f, x[3 * v + 7776] = NAN;
    for (int64_t i = 0; i < v; i++) x[4 * v + i] = -INFINITY; /* every value -inf: 0 */
    for (int64_t i = 0; i < v; i++) x[5 * v + i] = NAN;       /* every value NaN: v - 1 */
    x[6 * v + 0] = NAN;                                       /* NaN first, then values */
    int32_t want[9], got[9];
    for (int64_t r = 0; r < n; r++) want[r] = sampling_argmax(x + r * v, v);
    float *dx = put(be, x, sizeof(float) * (size_t)(n * v));
    int32_t *dids = put(be, got, sizeof got);
    be->ops->argmax_rows(be, dids, dx, n, v);
    get(be, got, dids, sizeof got);
    int wrong = 0;
    for (int64_t r = 0; r < n; r++) wrong += got[r] != want[r];
    CHECK(wrong == 0,
          "argmax_rows [9 x 49157] equals sampling_argmax (%d rows differ; row 2: %d, want %d)",
          wrong, got[2], want[2]);
    drop(be, dx), drop(be, dids);
    free(x);
}

static void test_vector_ops(void) {
    arena mem = {0};
    vectors v;
    for (int di = 0; di < 2; di++) {
        v.rms_w[di] = weight_vec(&mem, norm_d[di], 0.5f, 1.0f);
        v.ln_w[di] = weight_vec(&mem, norm_d[di], 0.5f, 1.0f);
        v.ln_b[di] = weight_vec(&mem, norm_d[di], 0.5f, 0.0f);
        v.bias[di] = weight_vec(&mem, norm_d[di], 1.0f, 0.0f);
    }
    v.fill = weight_vec(&mem, 130, 1.0f, 0.0f);
    const arena *const vl[1] = {&mem};
    const weight_set ws = {.vectors = vl, .n_vectors = 1};
    const backend_params p = params(false, 64, 1031, 16, 64);
    device d;
    backend *ref = backend_ref_create(N_THREADS, 1031, 16, false);
    CELER_ASSERT(ref != NULL);
    if (device_open(&d, &ws, &p)) {
        test_norms(d.be, ref, &v);
        test_elementwise(d.be, ref);
        test_movement(d.be, ref, &v);
        test_argmax(d.be);
        device_close(&d);
    }
    backend_destroy(ref);
    arena_free(&mem);
}

/* ==== RoPE ==== */

#define MAX_KEYS 80 /* positions of the rope and attention backends */

static void test_rope(int64_t hd) {
    const int64_t n = 37, half = hd / 2;
    arena mem = {0};
    float *inv[2] = {arena_alloc(&mem, sizeof(float) * (size_t)half),
                     arena_alloc(&mem, sizeof(float) * (size_t)half)};
    CELER_ASSERT(inv[0] && inv[1]);
    for (int64_t i = 0; i < half; i++) {
        inv[0][i] = powf(10000.0f, -(float)(2 * i) / (float)hd);
        inv[1][i] =
            powf(500000.0f, -(float)(2 * i) / (float)hd) * 0.25f; /* a scaled base, as YaRN makes */
    }
    /* distinct parameter sets, each in its own place, as models keep them */
    const rope_params rp[5] = {
        {.inv_freq = inv[0], .mscale = 1.1f, .traditional = false},
        {.inv_freq = inv[0], .mscale = 1.1f, .traditional = true},
        {.inv_freq = inv[1], .mscale = 1.0f, .traditional = false},
        {.inv_freq = inv[0], .dims = hd / 2, .mscale = 1.0f, .traditional = false},
        {.inv_freq = inv[1], .dims = hd - 8, .mscale = 1.2f, .traditional = true}};
    const char *const names[5] = {"half-split, mscale 1.1", "traditional, mscale 1.1",
                                  "half-split, other frequencies, mscale 1",
                                  "half-split, half the head rotated",
                                  "traditional, all but 8 rotated, mscale 1.2"};
    int32_t pos[37], pos1[37];
    for (int t = 0; t < n; t++) pos[t] = rand_below(MAX_KEYS);
    pos[0] = 0, pos[1] = MAX_KEYS - 1, pos[2] = 1;
    for (int t = 0; t < n; t++) pos1[t] = pos[t] + 1 < MAX_KEYS ? pos[t] + 1 : pos[t] - 1;
    const arena *const vl[1] = {&mem};
    const weight_set ws = {.vectors = vl, .n_vectors = 1};
    const backend_params p = params(false, n, 6 * hd, MAX_KEYS, hd);
    device d;
    backend *ref = backend_ref_create(N_THREADS, 6 * hd, MAX_KEYS, false);
    CELER_ASSERT(ref != NULL);
    if (device_open(&d, &ws, &p)) {
        backend *be = d.be;
        const int64_t m = n * 6 * hd;
        float *x = malloc(sizeof(float) * (size_t)m), *xr = malloc(sizeof(float) * (size_t)m);
        float *xd = malloc(sizeof(float) * (size_t)m);
        int32_t *dpos = put(be, pos, sizeof pos);
        float *dx = put(be, NULL, sizeof(float) * (size_t)m);
        for (int k = 0; k < 5; k++) {
            double diff = 0, mx = 0;
            for (int64_t h = 6; h >= 2; h -= 4) { /* a query's heads, then a key's */
                const int64_t mh = n * h * hd;
                fill_rand(x, mh, 1.0f, 0.0f);
                memcpy(xr, x, sizeof(float) * (size_t)mh);
                be->ops->upload(be, dx, x, sizeof(float) * (size_t)mh);
                be->ops->rope(be, dx, dpos, n, h, hd, &rp[k]);
                ref->ops->rope(ref, xr, pos, n, h, hd, &rp[k]);
                get(be, xd, dx, sizeof(float) * (size_t)mh);
                diff = fmax(diff, max_abs_diff(xd, xr, mh));
                mx = fmax(mx, max_abs(xr, mh));
                if (k == 0 && h == 6) { /* the reference one position off must be seen */
                    memcpy(xr, x, sizeof(float) * (size_t)mh);
                    ref->ops->rope(ref, xr, pos1, n, h, hd, &rp[k]);
                    char what[128];
                    snprintf(what, sizeof what, "  ... rope hd=%lld against positions moved by one",
                             (long long)hd);
                    report_wrong(what, max_abs_diff(xd, xr, mh), 1e-6 * max_abs(xr, mh));
                }
            }
            char what[128];
            snprintf(what, sizeof what, "rope hd=%lld %s, 6 and 2 heads, n=37", (long long)hd,
                     names[k]);
            report(what, diff, 1e-6 * mx);
        }
        drop(be, dpos), drop(be, dx);
        free(x), free(xr), free(xd);
        device_close(&d);
    }
    backend_destroy(ref);
    arena_free(&mem);
}

/* ==== kv_store and attention ==== */

/* Two sequences of MAX_KEYS positions in blocks of 16, their tables shuffled (and one
 * column more than they use); rows 0..29 a prefill run of sequence 0 ending at the last
 * position, rows 30..36 decode rows of sequence 1 at the first position, both sides of a
 * block boundary, and the last. Each backend fills its own pools with its own kv_store. */
static void test_attention(int64_t hd, bool kv_f16) {
    enum { H = 6, HK = 2, BS = 16, N_BLOCKS = 11, COLS = 6, N = 37, STORED = 2 * MAX_KEYS };
    const int64_t kvd = HK * hd, qd = H * hd;
    const int32_t tables[2 * COLS] = {3, 0, 7, 5, 9, 10, 1, 2, 4, 6, 8, 10};
    const int32_t decode[7] = {0, 8, 15, 16, 40, 63, MAX_KEYS - 1};
    const weight_set ws = {0};
    const backend_params p = params(kv_f16, 64, 1024, MAX_KEYS, hd);
    device d;
    backend *ref = open_pair(&d, &ws, &p);
    if (!ref) return;
    backend *be = d.be;
    float *k = rand_vec(STORED * kvd, 1.0f), *v = rand_vec(STORED * kvd, 1.0f);
    int32_t slot[STORED];
    for (int s = 0; s < 2; s++)
        for (int q = 0; q < MAX_KEYS; q++)
            slot[s * MAX_KEYS + q] = tables[s * COLS + q / BS] * BS + q % BS;
    const size_t pool = (size_t)(N_BLOCKS * BS * kvd * backend_kv_bytes(kv_f16));
    void *kp = calloc(1, pool), *vp = calloc(1, pool), *dkp = put(be, NULL, pool),
         *dvp = put(be, NULL, pool);
    float *dk = put(be, k, sizeof(float) * (size_t)(STORED * kvd)),
          *dv = put(be, v, sizeof(float) * (size_t)(STORED * kvd));
    int32_t *dslot = put(be, slot, sizeof slot);
    for (int64_t r0 = 0; r0 < STORED; r0 += N) { /* calls of up to N rows, across both sequences */
        const int64_t c = STORED - r0 < N ? STORED - r0 : N;
        be->ops->kv_store(be, dkp, dvp, dk + r0 * kvd, dv + r0 * kvd, dslot + r0, c, kvd);
        ref->ops->kv_store(ref, kp, vp, k + r0 * kvd, v + r0 * kvd, slot + r0, c, kvd);
    }
    int32_t pos[N], seq[N], short_pos[N];
    for (int r = 0; r < N; r++) {
        pos[r] = r < 30 ? MAX_KEYS - 30 + r : decode[r - 30];
        seq[r] = r < 30 ? 0 : 1;
        short_pos[r] = pos[r] > 0 ? pos[r] - 1 : 0;
    }
    float *q = rand_vec(N * qd, 2.0f), *out = malloc(sizeof(float) * N * qd),
          *outd = malloc(sizeof(float) * N * qd);
    float *dq = put(be, q, sizeof(float) * N * qd);
    int32_t *dpos = put(be, pos, sizeof pos), *dseq = put(be, seq, sizeof seq),
            *dtab = put(be, tables, sizeof tables);
    const int64_t windows[2] = {0, 9};
    for (int wi = 0; wi < 2; wi++) {
        const attn_rows rows = {.n = N,
                                .pos = pos,
                                .seq = seq,
                                .tables = tables,
                                .table_cols = COLS,
                                .block_size = BS,
                                .window = windows[wi],
                                .h = H,
                                .hk = HK,
                                .hd = hd,
                                .scale = 2.0f / sqrtf((float)hd)};
        attn_rows drows = rows;
        drows.pos = dpos, drows.seq = dseq, drows.tables = dtab;
        float *dout = put_nan(be, N * qd);
        be->ops->attention(be, dout, dq, dkp, dvp, &drows);
        ref->ops->attention(ref, out, q, kp, vp, &rows);
        get(be, outd, dout, sizeof(float) * N * qd);
        drop(be, dout);
        const double tol = 2e-5;
        char what[128];
        snprintf(what, sizeof what,
                 "attention hd=%lld GQA 6/2, 2 sequences paged, %s KV, window %lld", (long long)hd,
                 kv_f16 ? "fp16" : "fp32", (long long)windows[wi]);
        report(what, max_abs_diff(outd, out, N * qd), tol);
        /* the reference one key short (window 0) or one key wider (window 9) must be seen */
        attn_rows wrong = rows;
        if (windows[wi] == 0)
            wrong.pos = short_pos;
        else
            wrong.window = windows[wi] + 1;
        ref->ops->attention(ref, out, q, kp, vp, &wrong);
        snprintf(what, sizeof what, "  ... against the reference %s",
                 windows[wi] ? "with window 10" : "one key short");
        report_wrong(what, max_abs_diff(outd, out, N * qd), tol);
    }
    drop(be, dkp), drop(be, dvp), drop(be, dk), drop(be, dv), drop(be, dslot);
    drop(be, dq), drop(be, dpos), drop(be, dseq), drop(be, dtab);
    free(k), free(v), free(kp), free(vp), free(q), free(out), free(outd);
    device_close(&d);
    backend_destroy(ref);
}

/* ==== rope_store ==== */

/* The fused rope of q and k and store of k and v against the reference's three ops: one
 * prefill run of N rows (37, or 100: CUDA then forms an angle once for several heads) at
 * positions 3..N+2 in shuffled blocks of 16; q and k compared directly, the pools through
 * the reference's attention over them. A reference one position off must be seen. */
static void test_rope_store(int64_t hd, bool kv_f16, int N) {
    enum { H = 6, HK = 2, BS = 16, N_BLOCKS = 8, MAX_N = 100 };
    CELER_ASSERT(N <= MAX_N);
    const int64_t kvd = HK * hd, qd = H * hd, half = hd / 2;
    const int32_t table[N_BLOCKS] = {2, 0, 3, 1, 7, 5, 4, 6};
    arena mem = {0};
    float *inv = arena_alloc(&mem, sizeof(float) * (size_t)half);
    CELER_ASSERT(inv != NULL);
    for (int64_t i = 0; i < half; i++) inv[i] = powf(10000.0f, -(float)(2 * i) / (float)hd);
    const rope_params rp = {.inv_freq = inv, .mscale = 1.0f, .traditional = false};
    const arena *const vl[1] = {&mem};
    const weight_set ws = {.vectors = vl, .n_vectors = 1};
    const backend_params p = params(kv_f16, MAX_N, 1024, N_BLOCKS * BS, hd);
    device d;
    backend *ref = open_pair(&d, &ws, &p);
    if (!ref) {
        arena_free(&mem);
        return;
    }
    backend *be = d.be;
    int32_t pos[MAX_N], pos1[MAX_N], slot[MAX_N], seq[MAX_N];
    for (int r = 0; r < N; r++) {
        pos[r] = 3 + r, pos1[r] = 4 + r, seq[r] = 0;
        slot[r] = table[pos[r] / BS] * BS + pos[r] % BS;
    }
    float *q = rand_vec(N * qd, 1.0f), *k = rand_vec(N * kvd, 1.0f), *v = rand_vec(N * kvd, 1.0f);
    float *q1 = malloc(sizeof(float) * N * qd), *k1 = malloc(sizeof(float) * N * kvd);
    float *qd_ = malloc(sizeof(float) * N * qd), *kd = malloc(sizeof(float) * N * kvd);
    memcpy(q1, q, sizeof(float) * N * qd), memcpy(k1, k, sizeof(float) * N * kvd);
    const size_t pool = (size_t)(N_BLOCKS * BS * kvd * backend_kv_bytes(kv_f16));
    void *kp = calloc(1, pool), *vp = calloc(1, pool), *dkp = put(be, NULL, pool),
         *dvp = put(be, NULL, pool);
    float *dq = put(be, q, sizeof(float) * N * qd), *dk = put(be, k, sizeof(float) * N * kvd),
          *dv = put(be, v, sizeof(float) * N * kvd);
    int32_t *dpos = put(be, pos, sizeof(int32_t) * N), *dslot = put(be, slot, sizeof(int32_t) * N);
    backend_rope_store(be, dq, dk, dv, dkp, dvp, dpos, dslot, N, H, HK, hd, &rp);
    backend_rope_store(ref, q, k, v, kp, vp, pos, slot, N, H, HK, hd, &rp);
    get(be, qd_, dq, sizeof(float) * N * qd);
    get(be, kd, dk, sizeof(float) * N * kvd);
    char what[128];
    snprintf(what, sizeof what, "rope_store hd=%lld %s KV, n=%d: q", (long long)hd,
             kv_f16 ? "fp16" : "fp32", N);
    report(what, max_abs_diff(qd_, q, N * qd), 1e-6 * max_abs(q, N * qd));
    snprintf(what, sizeof what, "rope_store hd=%lld %s KV, n=%d: k", (long long)hd,
             kv_f16 ? "fp16" : "fp32", N);
    report(what, max_abs_diff(kd, k, N * kvd), 1e-6 * max_abs(k, N * kvd));
    /* the pools, through attention of the rotated q over them (each backend its own) */
    const attn_rows rows = {.n = N,
                            .pos = pos,
                            .seq = seq,
                            .tables = table,
                            .table_cols = N_BLOCKS,
                            .block_size = BS,
                            .window = 0,
                            .h = H,
                            .hk = HK,
                            .hd = hd,
                            .scale = 1.0f / sqrtf((float)hd)};
    attn_rows drows = rows;
    int32_t *dseq = put(be, seq, sizeof(int32_t) * N), *dtab = put(be, table, sizeof table);
    drows.pos = dpos, drows.seq = dseq, drows.tables = dtab;
    float *dout = put_nan(be, N * qd), *out = malloc(sizeof(float) * N * qd),
          *outd = malloc(sizeof(float) * N * qd);
    be->ops->attention(be, dout, dq, dkp, dvp, &drows);
    ref->ops->attention(ref, out, q, kp, vp, &rows);
    get(be, outd, dout, sizeof(float) * N * qd);
    snprintf(what, sizeof what, "rope_store hd=%lld %s KV, n=%d: attention over the stored pools",
             (long long)hd, kv_f16 ? "fp16" : "fp32", N);
    report(what, max_abs_diff(outd, out, N * qd), 2e-5);
    backend_rope_store(ref, q1, k1, v, kp, vp, pos1, slot, N, H, HK, hd, &rp);
    snprintf(what, sizeof what, "  ... q against the reference at positions moved by one");
    report_wrong(what, max_abs_diff(qd_, q1, N * qd), 1e-6 * max_abs(q1, N * qd));
    drop(be, dkp), drop(be, dvp), drop(be, dq), drop(be, dk), drop(be, dv), drop(be, dpos),
        drop(be, dslot);
    drop(be, dseq), drop(be, dtab), drop(be, dout);
    free(q), free(k), free(v), free(q1), free(k1), free(qd_), free(kd), free(kp), free(vp),
        free(out), free(outd);
    device_close(&d);
    backend_destroy(ref);
    arena_free(&mem);
}

/* ==== attention: tiles, decode splits and the general rows ==== */

/* How a case's rows are laid out over its sequences. */
typedef enum att_layout {
    ROWS_RUN,    /* one sequence, consecutive positions ending at its last */
    ROWS_MIXED,  /* a run of sequence 0 with decode rows of the others (and a few of sequence
                    0 at earlier positions) put in at random places */
    ROWS_RANDOM, /* every row a random sequence at a random position */
    ROWS_DECODE, /* row r: sequence r % n_seq at its last position */
} att_layout;

typedef struct att_case {
    const char *path; /* the kernel the case is meant for: tiles, split, decode, simple */
    int64_t n, h, hk, hd, bs, window;
    int n_seq;
    int32_t len[4]; /* positions stored of each sequence */
    att_layout layout;
    float qscale;
    bool f16;
    int64_t block; /* rows in image blocks (ROWS_RUN): every other run of this many rows sees
                      up to its last row (attn_rows.limit); 0 = causal rows */
} att_case;

/* limit[n] of case c's rows (ROWS_RUN with c->block): the rows of the odd runs of
 * c->block rows see up to the run's last position. */
static void att_limits(const att_case *c, const int32_t *pos, int32_t *limit) {
    for (int64_t r = 0; r < c->n; r++) {
        const int64_t run = r / c->block, last = (run + 1) * c->block - 1 < c->n - 1
                                                     ? (run + 1) * c->block - 1
                                                     : c->n - 1;
        limit[r] = run % 2 ? pos[last] : pos[r];
    }
}

/* The rows of case c: seq[n], pos[n]. */
static void att_rows(const att_case *c, int32_t *seq, int32_t *pos) {
    const int64_t n = c->n;
    switch (c->layout) {
    case ROWS_RUN:
        for (int64_t r = 0; r < n; r++) seq[r] = 0, pos[r] = c->len[0] - (int32_t)n + (int32_t)r;
        break;
    case ROWS_MIXED:
        for (int64_t r = 0; r < n; r++) seq[r] = 0, pos[r] = c->len[0] - (int32_t)n + (int32_t)r;
        for (int64_t k = 0; k < n / 6; k++) { /* the run moves up a row, another row goes in */
            const int64_t at = rand_below((int32_t)n);
            memmove(seq + at + 1, seq + at, sizeof(int32_t) * (size_t)(n - at - 1));
            memmove(pos + at + 1, pos + at, sizeof(int32_t) * (size_t)(n - at - 1));
            const int32_t s = (int32_t)(k % c->n_seq);
            seq[at] = s;
            pos[at] = k % 3 == 0 ? rand_below(c->len[s]) : c->len[s] - 1;
        }
        break;
    case ROWS_RANDOM:
        for (int64_t r = 0; r < n; r++) {
            seq[r] = rand_below(c->n_seq);
            pos[r] = rand_below(c->len[seq[r]]);
        }
        break;
    case ROWS_DECODE:
        for (int64_t r = 0; r < n; r++)
            seq[r] = (int32_t)(r % c->n_seq), pos[r] = c->len[seq[r]] - 1 - (int32_t)(r / c->n_seq);
        break;
    }
}

/* out[n, h*hd] in double: the attention of rows ar over host pools (scores and softmax in
 * double), the oracle both backends are measured against. */
static void attention_double(double *out, const float *q, const void *kp, const void *vp, bool f16,
                             const attn_rows *ar) {
    const int64_t group = ar->h / ar->hk, kvd = ar->hk * ar->hd, qd = ar->h * ar->hd;
    double *sc = malloc(sizeof(double) * (size_t)(attn_rows_limit(ar, 0) + 1));
    int64_t cap = attn_rows_limit(ar, 0) + 1;
    for (int64_t r = 0; r < ar->n; r++) {
        const int64_t p = attn_rows_limit(ar, r),
                      lo = ar->window > 0 && ar->pos[r] - ar->window + 1 > 0
                               ? ar->pos[r] - ar->window + 1
                               : 0;
        const int32_t *table = ar->tables + (int64_t)ar->seq[r] * ar->table_cols;
        if (p + 1 > cap) sc = realloc(sc, sizeof(double) * (size_t)(cap = p + 1));
        CELER_ASSERT(sc != NULL);
        for (int64_t i = 0; i < ar->h; i++) {
            const float *qi = q + r * qd + i * ar->hd;
            const int64_t off = (i / group) * ar->hd;
            double mx = -INFINITY, sum = 0;
            for (int64_t j = lo; j <= p; j++) {
                const int64_t at =
                    ((int64_t)table[j / ar->block_size] * ar->block_size + j % ar->block_size) *
                        kvd +
                    off;
                double dot = 0;
                for (int64_t c = 0; c < ar->hd; c++)
                    dot += (double)qi[c] * (f16 ? f16_to_f32(((const uint16_t *)kp)[at + c])
                                                : ((const float *)kp)[at + c]);
                sc[j] = dot * ar->scale;
                if (ar->softcap > 0) sc[j] = ar->softcap * tanh(sc[j] / ar->softcap);
                mx = fmax(mx, sc[j]);
            }
            for (int64_t j = lo; j <= p; j++) sum += (sc[j] = exp(sc[j] - mx));
            double *o = out + r * qd + i * ar->hd;
            for (int64_t c = 0; c < ar->hd; c++) o[c] = 0;
            for (int64_t j = lo; j <= p; j++) {
                const int64_t at =
                    ((int64_t)table[j / ar->block_size] * ar->block_size + j % ar->block_size) *
                        kvd +
                    off;
                for (int64_t c = 0; c < ar->hd; c++)
                    o[c] += sc[j] / sum *
                            (f16 ? f16_to_f32(((const uint16_t *)vp)[at + c])
                                 : ((const float *)vp)[at + c]);
            }
        }
    }
    free(sc);
}

/* max |a - b| / max |b| against the double oracle. */
static double rel_to_double(const float *a, const double *b, int64_t m) {
    double d = 0, mx = 0;
    for (int64_t i = 0; i < m; i++) {
        const double e = fabs((double)a[i] - b[i]);
        d = e != e ? INFINITY : fmax(d, e);
        mx = fmax(mx, fabs(b[i]));
    }
    return d / mx;
}

#define ATT_MAX_KEYS 2600

/* One case: sequences of random K and V in shuffled blocks (stored by each backend's own
 * kv_store), random queries; the device against the reference backend and against the
 * double oracle, each relative to the largest value of what it is compared with. */
static void attention_case(const att_case *c, float softcap, double tol_ref, double tol_oracle) {
    const int64_t n = c->n, kvd = c->hk * c->hd, qd = c->h * c->hd, bs = c->bs;
    int64_t blocks = 0, cols = 0, max_len = 0; /* max_len: a bound of every row's position + 1 */
    for (int s = 0; s < c->n_seq; s++) {
        const int64_t b = (c->len[s] + bs - 1) / bs;
        max_len = c->len[s] > max_len ? c->len[s] : max_len;
        blocks += b;
        cols = b > cols ? b : cols;
        CELER_ASSERT(c->len[s] <= ATT_MAX_KEYS);
    }
    cols += 1; /* a column more than any sequence uses */
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)blocks),
            *tables = malloc(sizeof(int32_t) * (size_t)(c->n_seq * cols));
    for (int64_t i = 0; i < blocks; i++) perm[i] = (int32_t)i;
    for (int64_t i = blocks - 1; i > 0; i--) { /* the blocks in a random order */
        const int32_t j = rand_below((int32_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int64_t next = 0, stored = 0;
    for (int s = 0; s < c->n_seq; s++)
        for (int64_t b = 0; b < cols; b++)
            tables[s * cols + b] = b < (c->len[s] + bs - 1) / bs ? perm[next++] : 0;
    for (int s = 0; s < c->n_seq; s++) stored += c->len[s];
    int32_t *slot = malloc(sizeof(int32_t) * (size_t)stored);
    for (int s = 0, k = 0; s < c->n_seq; s++)
        for (int32_t p = 0; p < c->len[s]; p++, k++)
            slot[k] = tables[s * cols + p / bs] * (int32_t)bs + p % (int32_t)bs;

    const weight_set ws = {0};
    const backend_params bp =
        params(c->f16, n > 512 ? n : 512, qd > 1024 ? qd : 1024, ATT_MAX_KEYS, c->hd);
    device d;
    backend *ref = open_pair(&d, &ws, &bp);
    if (!ref) {
        free(perm), free(tables), free(slot);
        return;
    }
    backend *be = d.be;
    float *k = rand_vec(stored * kvd, 1.0f), *v = rand_vec(stored * kvd, 1.0f);
    const size_t pool = (size_t)(blocks * bs * kvd * backend_kv_bytes(c->f16));
    void *kp = calloc(1, pool), *vp = calloc(1, pool), *dkp = put(be, NULL, pool),
         *dvp = put(be, NULL, pool);
    float *dk = put(be, k, sizeof(float) * (size_t)(stored * kvd)),
          *dv = put(be, v, sizeof(float) * (size_t)(stored * kvd));
    int32_t *dslot = put(be, slot, sizeof(int32_t) * (size_t)stored);
    for (int64_t r0 = 0; r0 < stored; r0 += 512) {
        const int64_t m = stored - r0 < 512 ? stored - r0 : 512;
        be->ops->kv_store(be, dkp, dvp, dk + r0 * kvd, dv + r0 * kvd, dslot + r0, m, kvd);
        ref->ops->kv_store(ref, kp, vp, k + r0 * kvd, v + r0 * kvd, slot + r0, m, kvd);
    }
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)n), *pos = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *limit = c->block ? malloc(sizeof(int32_t) * (size_t)n) : NULL;
    att_rows(c, seq, pos);
    if (limit) att_limits(c, pos, limit);
    float *q = rand_vec(n * qd, c->qscale), *out = malloc(sizeof(float) * (size_t)(n * qd)),
          *outd = malloc(sizeof(float) * (size_t)(n * qd));
    double *oracle = malloc(sizeof(double) * (size_t)(n * qd));
    float *dq = put(be, q, sizeof(float) * (size_t)(n * qd)), *dout = put_nan(be, n * qd);
    int32_t *dpos = put(be, pos, sizeof(int32_t) * (size_t)n),
            *dseq = put(be, seq, sizeof(int32_t) * (size_t)n),
            *dtab = put(be, tables, sizeof(int32_t) * (size_t)(c->n_seq * cols)),
            *dlim = limit ? put(be, limit, sizeof(int32_t) * (size_t)n) : NULL;
    const attn_rows rows = {.n = n,
                            .pos = pos,
                            .limit = limit,
                            .seq = seq,
                            .tables = tables,
                            .table_cols = cols,
                            .block_size = bs,
                            .window = c->window,
                            .h = c->h,
                            .hk = c->hk,
                            .hd = c->hd,
                            .scale = 1.0f / sqrtf((float)c->hd),
                            .softcap = softcap,
                            .seqs =
                                c->n_seq, /* test_attention's cases leave both 0 (not counted) */
                            .keys = max_len};
    attn_rows drows = rows;
    drows.pos = dpos, drows.seq = dseq, drows.tables = dtab, drows.limit = dlim;
    be->ops->attention(be, dout, dq, dkp, dvp, &drows);
    ref->ops->attention(ref, out, q, kp, vp, &rows);
    get(be, outd, dout, sizeof(float) * (size_t)(n * qd));
    attention_double(oracle, q, kp, vp, c->f16, &rows);
    const double mx = max_abs(out, n * qd), diff = max_abs_diff(outd, out, n * qd) / mx;
    static const char *const layouts[] = {"run", "mixed", "random", "decode"};
    int32_t keys = 0;
    for (int s = 0; s < c->n_seq; s++) keys = c->len[s] > keys ? c->len[s] : keys;
    char what[160];
    snprintf(what, sizeof what,
             "attention %s: %lld %s rows, %d seq <= %d, %lld/%lld x %lld bs %lld%s%s%s%s", c->path,
             (long long)n, layouts[c->layout], c->n_seq, (int)keys, (long long)c->h,
             (long long)c->hk, (long long)c->hd, (long long)bs, c->window ? " win" : "",
             c->qscale > 2.0f ? " peaked" : "", c->f16 ? "" : " fp32",
             softcap > 0 ? " softcap" : "");
    report(what, diff, tol_ref);
    if (limit) { /* the same rows without their limits (causal) must be seen */
        attn_rows causal = rows;
        causal.limit = NULL;
        ref->ops->attention(ref, out, q, kp, vp, &causal);
        report_wrong("  ... against the reference with causal rows instead of image blocks",
                     max_abs_diff(outd, out, n * qd) / mx, tol_ref);
        ref->ops->attention(ref, out, q, kp, vp, &rows);
    }
    snprintf(what, sizeof what, "  ... against the double oracle (the reference: %.3g)",
             rel_to_double(out, oracle, n * qd));
    report(what, rel_to_double(outd, oracle, n * qd), tol_oracle);
    if (c->layout == ROWS_MIXED) { /* one row read as another sequence's must be seen */
        int32_t *wrong = malloc(sizeof(int32_t) * (size_t)n);
        memcpy(wrong, seq, sizeof(int32_t) * (size_t)n);
        for (int64_t r = 0; r < n; r++) { /* the first row another sequence holds a key at */
            const int32_t other = (seq[r] + 1) % c->n_seq;
            if (pos[r] >= c->len[other]) continue;
            wrong[r] = other;
            attn_rows wr = rows;
            wr.seq = wrong;
            ref->ops->attention(ref, out, q, kp, vp, &wr);
            report_wrong("  ... against the reference with one row of another sequence",
                         max_abs_diff(outd, out, n * qd) / mx, tol_ref);
            break;
        }
        free(wrong);
    }
    drop(be, dkp), drop(be, dvp), drop(be, dk), drop(be, dv), drop(be, dslot);
    drop(be, dq), drop(be, dout), drop(be, dpos), drop(be, dseq), drop(be, dtab);
    if (dlim) drop(be, dlim);
    free(k), free(v), free(kp), free(vp), free(q), free(out), free(outd), free(oracle);
    free(seq), free(pos), free(limit), free(perm), free(tables), free(slot);
    device_close(&d);
    backend_destroy(ref);
}

/* Cases for each kernel cuda_attention picks (the name says which): more than 32 rows with
 * fp16 pools and a head dim of 64..256 in steps of 16 take the tiles; up to 32 rows, or
 * other head dims, the decode kernel (GQA groups of 1, 2, 3, 4 and 8), split for spans
 * of more than 64 keys; fp32 pools the simple kernel. Bounds, relative to the largest value: 4e-6
 * against the reference backend, whose fp32 scores are themselves up to ~3e-6 off on long or peaked
 * rows, and 2e-6 against the double oracle. */
static void test_attention_paths(void) {
    const att_case cases[] = {
        {"tiles", 300, 8, 2, 128, 16, 0, 1, {300}, ROWS_RUN, 2.0f, true, 0},
        {"tiles", 200, 8, 8, 64, 7, 0, 1, {1200}, ROWS_RUN, 2.0f, true, 0},
        {"tiles", 150, 16, 2, 128, 16, 37, 1, {400}, ROWS_RUN, 2.0f, true, 0},
        {"tiles", 100, 4, 1, 80, 16, 0, 3, {700, 300, 1200}, ROWS_MIXED, 2.0f, true, 0},
        {"tiles", 90, 8, 2, 128, 16, 50, 3, {500, 260, 900}, ROWS_MIXED, 2.0f, true, 0},
        {"tiles", 77, 6, 3, 96, 7, 0, 4, {50, 500, 90, 260}, ROWS_RANDOM, 2.0f, true, 0},
        {"tiles", 65, 4, 2, 256, 16, 0, 1, {333}, ROWS_RUN, 2.0f, true, 0},
        {"tiles", 40, 4, 1, 256, 16, 100, 2, {333, 150}, ROWS_MIXED, 2.0f, true, 0},
        {"tiles", 33, 8, 2, 112, 16, 0, 1, {140}, ROWS_RUN, 2.0f, true, 0},
        {"tiles", 40, 4, 2, 160, 7, 0, 1, {90}, ROWS_RUN, 2.0f, true, 0},
        {"tiles", 47, 6, 6, 192, 16, 0, 2, {200, 77}, ROWS_RANDOM, 2.0f, true, 0},
        {"tiles", 200, 8, 2, 128, 16, 0, 1, {700}, ROWS_RUN, 8.0f, true, 0}, /* peaked scores */
        {"tiles", 160, 8, 2, 128, 16, 0, 3, {500, 260, 900}, ROWS_MIXED, 2.0f, true, 0},
        {"tiles", 130, 6, 3, 96, 7, 0, 4, {50, 500, 90, 260}, ROWS_RANDOM, 2.0f, true, 0},
        {"tiles", 128, 4, 2, 256, 16, 9, 2, {333, 150}, ROWS_MIXED, 2.0f, true, 0},
        {"tiles", 33, 8, 2, 128, 16, 0, 1, {500}, ROWS_RUN, 2.0f, true, 0},
        {"tiles", 48, 8, 2, 128, 16, 0, 1, {500}, ROWS_RUN, 2.0f, true, 0},
        {"tiles", 64, 8, 2, 128, 16, 0, 1, {500}, ROWS_RUN, 2.0f, true, 0},
        {"tiles", 65, 8, 2, 128, 16, 0, 1, {500}, ROWS_RUN, 2.0f, true, 0},
        {"tiles", 40, 8, 2, 128, 16, 0, 4, {2500, 2049, 130, 1000}, ROWS_DECODE, 2.0f, true, 0},
        /* grids of at least 4 fast blocks an SM (608 and 672 of them, on up to 152 SMs):
         * CUDA's wide kernels */
        {"tiles", 600, 64, 32, 64, 16, 0, 1, {600}, ROWS_RUN, 2.0f, true, 0},
        {"tiles", 660, 64, 16, 128, 16, 0, 1, {700}, ROWS_RUN, 2.0f, true, 0},
        {"tiles", 600, 64, 32, 64, 7, 90, 3, {900, 700, 1000}, ROWS_MIXED, 2.0f, true, 0},
        {"split", 1, 32, 8, 128, 16, 0, 1, {2500}, ROWS_DECODE, 2.0f, true, 0},
        {"split", 4, 8, 2, 128, 16, 0, 4, {2500, 2049, 130, 1}, ROWS_DECODE, 2.0f, true, 0},
        {"split", 8, 8, 2, 128, 7, 1000, 2, {2500, 1800}, ROWS_DECODE, 2.0f, true, 0},
        {"split", 2, 4, 4, 64, 16, 0, 1, {2100}, ROWS_DECODE, 2.0f, true, 0},
        {"split", 2, 4, 2, 40, 16, 0, 2, {1500, 129}, ROWS_DECODE, 2.0f, true, 0},
        {"split", 3, 16, 2, 128, 16, 0, 3, {2500, 700, 64}, ROWS_DECODE, 2.0f, true, 0},
        {"split", 5, 6, 2, 96, 7, 0, 2, {1000, 300}, ROWS_DECODE, 2.0f, true, 0},
        {"split", 32, 8, 2, 128, 16, 0, 4, {2500, 2049, 130, 1000}, ROWS_DECODE, 2.0f, true, 0},
        {"split", 17, 8, 2, 128, 16, 0, 1, {500}, ROWS_RUN, 2.0f, true, 0},
        {"split", 4, 8, 2, 128, 16, 0, 2, {60, 33}, ROWS_DECODE, 2.0f, true, 0}, /* one split: no
                                                                                    merge */
        {"split", 3, 8, 2, 128, 16, 0, 3, {120, 64, 9}, ROWS_DECODE, 2.0f, true, 0}, /* two at most
                                                                                      */
        {"decode", 3, 8, 2, 128, 16, 0, 1, {500}, ROWS_RUN, 2.0f, true, 0},
        {"decode", 30, 4, 2, 40, 16, 0, 2, {600, 129}, ROWS_RANDOM, 2.0f, true, 0},
        {"simple", 50, 8, 2, 128, 16, 0, 3, {300, 100, 200}, ROWS_MIXED, 2.0f, false, 0},
        {"simple", 3, 8, 2, 128, 16, 0, 3, {2000, 100, 200}, ROWS_DECODE, 2.0f, false, 0},
        /* image blocks (Gemma 3 prefill): rows that see past their position, the simple
         * kernel on fp16 and fp32 pools, with a window shorter than a block */
        {"limits", 300, 8, 2, 128, 16, 0, 1, {300}, ROWS_RUN, 2.0f, true, 37},
        {"limits", 100, 4, 2, 256, 16, 20, 1, {400}, ROWS_RUN, 2.0f, true, 33},
        {"limits", 64, 8, 4, 64, 7, 0, 1, {90}, ROWS_RUN, 2.0f, false, 16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* prefill rows: a device's fp16 fast path (not rows with limits: the simple kernel) */
        const bool fast = cases[i].n >= FAST_ROWS && !cases[i].block;
        attention_case(&cases[i], 0.0f, fast ? 1e-3 : 4e-6, fast ? 1e-3 : 2e-6);
    }
    /* soft-capped scores (Gemma 2) on each path: prefill rows take the exact kernels */
    const size_t capped[] = {0, 5, 21, 24, 30, 35, 36, 37};
    for (size_t i = 0; i < sizeof capped / sizeof capped[0]; i++)
        attention_case(&cases[capped[i]], 1.5f, 4e-6, 2e-6);
}

/* ==== attention_full ==== */

static void test_attention_full(void) {
    const struct {
        int64_t n, seg, h, hk, hd;
    } cases[] = {
        {3 * 37, 37, 6, 2, 40}, {2 * 50, 50, 4, 4, 80},    {4 * 32, 32, 8, 1, 64},
        {3 * 5, 5, 2, 1, 16},   {2 * 17, 17, 16, 16, 128}, {2 * 577, 577, 4, 4, 64},
        {2 * 9, 9, 2, 1, 256},
    };
    const weight_set ws = {0};
    const backend_params p = params(false, 2 * 577, 1024, 64, 256);
    device d;
    backend *ref = open_pair(&d, &ws, &p);
    if (!ref) return;
    backend *be = d.be;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t n = cases[c].n, seg = cases[c].seg, h = cases[c].h, hk = cases[c].hk,
                      hd = cases[c].hd;
        const int64_t qd = h * hd, kvd = hk * hd;
        const float scale = 1.0f / sqrtf((float)hd);
        /* one K and V row more than the op reads: the shifted negative case reads it */
        float *q = rand_vec(n * qd, 2.0f), *k = rand_vec((n + 1) * kvd, 1.0f),
              *v = rand_vec((n + 1) * kvd, 1.0f);
        float *out = malloc(sizeof(float) * (size_t)(n * qd)),
              *outd = malloc(sizeof(float) * (size_t)(n * qd));
        float *dq = put(be, q, sizeof(float) * (size_t)(n * qd)),
              *dk = put(be, k, sizeof(float) * (size_t)(n * kvd));
        float *dv = put(be, v, sizeof(float) * (size_t)(n * kvd)), *dout = put_nan(be, n * qd);
        be->ops->attention_full(be, dout, dq, dk, dv, n, seg, h, hk, hd, scale);
        ref->ops->attention_full(ref, out, q, k, v, n, seg, h, hk, hd, scale);
        get(be, outd, dout, sizeof(float) * (size_t)(n * qd));
        char what[128];
        snprintf(what, sizeof what, "attention_full %lld x %lld rows, heads %lld/%lld, hd %lld",
                 (long long)(n / seg), (long long)seg, (long long)h, (long long)hk, (long long)hd);
        report(what, max_abs_diff(outd, out, n * qd), 2e-5);
        if (c == 0) { /* every segment's keys and values one row later must be seen */
            ref->ops->attention_full(ref, out, q, k + kvd, v + kvd, n, seg, h, hk, hd, scale);
            report_wrong("  ... against segments moved by one row", max_abs_diff(outd, out, n * qd),
                         2e-5);
        }
        drop(be, dq), drop(be, dk), drop(be, dv), drop(be, dout);
        free(q), free(k), free(v), free(out), free(outd);
    }
    device_close(&d);
    backend_destroy(ref);
}

/* Products of prefill rows (n >= 128), which a device may take through a fast path of
 * DESIGN.md's numerics: the CUDA device rounds W and x to fp16 once each (so a bound of
 * 1e-3 of the largest value, where a wrong row, column or chunk is off by the whole
 * value), in chunks of 16384 rows of a 4096-wide W (the large matrix takes two). Each
 * product also by matmul_multi over a set of one input, and an MLP by swiglu_mlp. */
static void test_matmul_prefill(void) {
    enum { NM = 8 };
    static test_mat mats[NM];
    matview *list[NM];
    mat_affine(&mats[0], 4, 64, DTYPE_F16, 300, 192);
    mat_affine(&mats[1], 8, 32, DTYPE_BF16, 100, 320);
    mat_affine(&mats[2], 4, 128, DTYPE_F32, 37, 640);
    mat_affine(&mats[3], 4, 64, DTYPE_F16, 33, 192);     /* a set with mats[0] */
    mat_affine(&mats[4], 4, 64, DTYPE_F16, 16400, 4096); /* more than 64 Mi weights */
    mat_affine(&mats[5], 4, 64, DTYPE_F16, 256, 192);    /* an MLP: gate, up, down */
    mat_affine(&mats[6], 4, 64, DTYPE_F16, 256, 192);
    mat_affine(&mats[7], 4, 64, DTYPE_BF16, 192, 256);
    const weight_set ws = mats_set(mats, list, NM, NULL, 0);
    const int64_t max_n = 300, max_cols = 4096;
    const backend_params p = params(false, max_n, max_cols, 16, 64);
    device d;
    backend *ref = open_pair(&d, &ws, &p);
    if (!ref) goto out;
    backend *be = d.be;
    float *x = malloc(sizeof(float) * (size_t)(max_n * max_cols));
    float *yr = malloc(sizeof(float) * (size_t)(max_n * 16400)),
          *yd = malloc(sizeof(float) * (size_t)(max_n * 16400));
    float *dx = put(be, NULL, sizeof(float) * (size_t)(max_n * max_cols));
    CELER_ASSERT(x && yr && yd);
    const int64_t ns[] = {128, 129, 300};
    for (int i = 0; i < 5; i++) {
        const matview *w = &mats[i].w;
        double diff = 0, mx = 0;
        for (int k = 0; k < (i == 4 ? 1 : 3); k++) /* the large one once */
            matmul_case(be, ref, w, ns[k], x, dx, yr, yd, &diff, &mx);
        char what[128];
        snprintf(what, sizeof what, "matmul %s n=%s", mats[i].desc, i == 4 ? "128" : "128,129,300");
        report(what, diff, 1e-3 * mx);
    }
    /* the bound sees an output row out of place: the 300-row product against its
     * reference moved by one row */
    {
        const matview *w = &mats[0].w;
        double diff = 0, mx = 0;
        matmul_case(be, ref, w, 128, x, dx, yr, yd, &diff, &mx);
        report_wrong("  ... 4-bit g64 F16 [300 x 192] n=128 against its reference one row on",
                     max_abs_diff(yd, yr + 1, 128 * w->rows - 1), 1e-3 * mx);
    }
    /* SwiGLU fused where x goes to fp16 (inputs of 2 n cols fit x and dx) */
    for (int i = 0; i < 3; i++) {
        double diff = 0, mx = 0, self = 0;
        for (int k = 0; k < 3; k++)
            swiglu_case(be, ref, &mats[i].w, ns[k], x, dx, yr, yd, &diff, &mx, &self,
                        BACKEND_ACT_SILU);
        char what[128];
        snprintf(what, sizeof what, "swiglu_matmul %s n=128,129,300", mats[i].desc);
        report(what, diff, 1e-3 * mx);
        CHECK(
            self == 0,
            "swiglu_matmul %s at prefill rows: %g from the device's swiglu then matmul (must be 0)",
            mats[i].desc, self);
    }
    /* the MLP in one op: the device's own ops exactly below the prefill rows; from there
     * gate and up may be rounded to fp16 like x */
    {
        const int64_t mn[] = {1, 37, 128, 300};
        for (int k = 0; k < 8; k++) {
            const backend_act act = k < 4 ? BACKEND_ACT_SILU : BACKEND_ACT_GELU_TANH;
            const char *an = k < 4 ? "swiglu" : "geglu (tanh)";
            double diff = 0, mx = 0, self = 0;
            mlp_case(be, ref, &mats[5].w, &mats[6].w, &mats[7].w, mn[k % 4], x, dx, yr, yd, &diff,
                     &mx, &self, act);
            char what[128];
            snprintf(what, sizeof what, "glu_mlp %s 4-bit g64 [256 x 192] x2, [192 x 256] n=%lld",
                     an, (long long)mn[k % 4]);
            report(what, diff, 1e-3 * mx);
            if (mn[k % 4] < 128 || act != BACKEND_ACT_SILU)
                CHECK(self == 0,
                      "glu_mlp %s at n=%lld: %g from the device's matmul_multi then glu_matmul "
                      "(must be 0)",
                      an, (long long)mn[k % 4], self);
        }
    }
    /* the set: each output against its own product */
    {
        const matview *mw[2] = {&mats[0].w, &mats[3].w};
        double diff = 0, mx = 0;
        multi_case(be, ref, mw, 2, 200, x, dx, yr, yd, &diff, &mx);
        report("matmul_multi 4-bit g64 F16, rows 300/33, n=200", diff, 1e-3 * mx);
    }
    drop(be, dx);
    free(x), free(yr), free(yd);
    device_close(&d);
    backend_destroy(ref);
out:
    for (int i = 0; i < NM; i++) mat_free(&mats[i]);
}

int main(void) {
    const char *dev = harness_device();
    if (!dev) {
        SKIP("no device under test (make test-cuda sets CELER_TEST_DEVICE)");
        return harness_done("test_device_ops");
    }
    celer_error e = {{0}};
    if (!CHECK(backend_find(dev, &cls, &dev_index, &e) == CELER_OK, "%s", e.msg))
        return harness_done("test_device_ops");
    char name[256];
    cls->device_name(dev_index, name, sizeof name);
    printf("%s (%s) against the reference backend:\n", dev, name);
    test_matmul();
    test_matmul_prefill();
    test_embed();
    test_vector_ops();
    const int64_t hds[2] = {40, 128};
    for (int i = 0; i < 2; i++) {
        test_rope(hds[i]);
        test_attention(hds[i], false);
        test_attention(hds[i], true);
        test_rope_store(hds[i], false, 37);
        test_rope_store(hds[i], true, 37);
        test_rope_store(hds[i], true, 100);
    }
    test_attention_paths();
    test_attention_full();
    return harness_done("test_device_ops");
}

/*
 * test_affine.cu - the CUDA affine products against the double reference of affine.cu
 * (one thread per output, reading the checkpoint layout, not the tiled copy), and the
 * rows that embeddings and prefill products read against the checkpoint on the host.
 *
 * Every bits x group x scale dtype (F16, BF16, F32) on awkward sizes (rows not a multiple
 * of 16, columns one group, three groups, or not a whole tile), n = 1..16, through the host
 * upload path, with every plan (staged slices of 4, 8, 12, 16 column tiles; streamed
 * slices of 4 .. 64, with and without the L2 prefetch, those whose x does not fit shared
 * memory refused) and with
 * programmatic dependent launch. Data: x ~ N(0, 1), codes uniform, scales ~ U(0.005,
 * 0.02), biases ~ -8 * scale. A product passes when max|y - ref| <= 2e-6 max|ref|
 * (max|ref| over the matrix's 16 token rows; on matrices of >= 1000 rows also over the n
 * rows of the case, see test_matrix), every output was written (y is poisoned with NaN
 * before each product) and nothing past it (a poisoned guard after y). Rows
 * (cuda_affine_rows) must equal the CPU reference's s * q + b bit for bit and leave rows
 * of negative ids alone; cuda_affine_dequant's fp16 rows must be that value rounded
 * once. The prefill product (cuda_affine_gemm) on the same configurations at n = 1 ..
 * 300, and both products over sets of three matrices of one input in one launch
 * (cuda_affine_gemv_set, cuda_affine_gemm_set), each output against its own reference.
 * The last line is "N passed, N failed"; the exit code is non-zero on any failure.
 */
#include "backend/cuda/affine.h"
#include "check.h"
#include "base/half.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL 2e-6
#define MAXN CUDA_AFFINE_MAX_N /* rows of x a decode product takes */
#define GUARD 1024 /* floats after y that must stay untouched */

static int passed, failed;

static void expect(int ok, const char *what) {
    if (ok) {
        passed++;
    } else {
        failed++;
        printf("FAIL %s\n", what);
    }
}

/* ==== Random data ==== */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(void) { return (double)(rng_next() >> 11) * (1.0 / 9007199254740992.0); }

static double rng_normal(void) {
    const double u = rng_unit() + 1e-300, v = rng_unit();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static const char *scale_name(dtype t) { return t == DTYPE_BF16 ? "BF16" : t == DTYPE_F32 ? "F32" : "F16"; }

static size_t scale_size(dtype t) { return t == DTYPE_F32 ? 4 : 2; }

/* Element i of a scale array of type t: stored as t rounds f; read as float, exactly. */
static void scale_store(dtype t, void *p, int64_t i, float f) {
    if (t == DTYPE_F32) ((float *)p)[i] = f;
    else ((uint16_t *)p)[i] = t == DTYPE_BF16 ? f32_to_bf16(f) : f32_to_f16(f);
}

static float scale_load(dtype t, const void *p, int64_t i) {
    if (t == DTYPE_F32) return ((const float *)p)[i];
    const uint16_t u = ((const uint16_t *)p)[i];
    return t == DTYPE_BF16 ? bf16_to_f32(u) : f16_to_f32(u);
}

/* W[r, c] of a host matrix as the CPU reference forms it: s * q + b in float, the product
 * and the sum rounded apart. */
static float host_value(const matview *w, int64_t r, int64_t c) {
    const int per = 32 / w->quant_bits;
    const uint32_t word = ((const uint32_t *)w->data)[r * (w->cols / per) + c / per];
    const uint32_t q = (word >> ((c % per) * w->quant_bits)) & ((1u << w->quant_bits) - 1u);
    const int64_t g = r * (w->cols / w->group) + c / w->group;
    const volatile float p = scale_load(w->scale_type, w->scales, g) * (float)q;
    return p + scale_load(w->scale_type, w->biases, g);
}

/* A host matrix in the checkpoint layout; free with host_free. */
static matview host_matrix(int64_t rows, int64_t cols, int bits, int64_t group, dtype st) {
    const int64_t words = rows * cols * bits / 32, groups = rows * (cols / group);
    uint32_t *codes = (uint32_t *)malloc((size_t)words * 4);
    void *s = malloc((size_t)groups * scale_size(st)), *b = malloc((size_t)groups * scale_size(st));
    for (int64_t i = 0; i < words; i++) codes[i] = (uint32_t)rng_next();
    for (int64_t i = 0; i < groups; i++) {
        const float sc = (float)(0.005 + 0.015 * rng_unit());
        scale_store(st, s, i, sc);
        /* near -2^(bits-1) s, as checkpoints store it (the group's minimum): the bias term
         * then nearly cancels the codes' sum, which the products must survive */
        scale_store(st, b, i, sc * (float)(-(double)(1 << (bits - 1)) + (rng_unit() - 0.5)));
    }
    return affine_view(codes, s, b, rows, cols, bits, group, st);
}

static void host_free(matview *w) {
    free((void *)w->data);
    free((void *)w->scales);
    free((void *)w->biases);
}

/* The same matrix with its arrays copied to the device (for the reference). */
static matview device_copy(const matview *h) {
    matview d = *h;
    const size_t cb = (size_t)(h->rows * h->cols * h->quant_bits / 8);
    const size_t sb = (size_t)(h->rows * (h->cols / h->group)) * scale_size(h->scale_type);
    void *p;
    CHECK(cudaMalloc(&p, cb));
    CHECK(cudaMemcpy(p, h->data, cb, cudaMemcpyHostToDevice));
    d.data = p;
    CHECK(cudaMalloc(&p, sb));
    CHECK(cudaMemcpy(p, h->scales, sb, cudaMemcpyHostToDevice));
    d.scales = p;
    CHECK(cudaMalloc(&p, sb));
    CHECK(cudaMemcpy(p, h->biases, sb, cudaMemcpyHostToDevice));
    d.biases = p;
    return d;
}

static void device_free(matview *d) {
    cudaFree((void *)d->data);
    cudaFree((void *)d->scales);
    cudaFree((void *)d->biases);
}

/* ==== One matrix ==== */

typedef struct ctx {
    cudaStream_t s;
    float *x, *y;   /* device x[16, cols_max], y[16, rows_max] + GUARD */
    double *ref;    /* device */
    void *work;
    size_t work_size;
    float *hy;
    double *href;
    float *gx, *gy, *hgy; /* the prefill product's x[GEMM_MAX_N, cols_max], y[GEMM_MAX_N, rows] */
    double *gref, *hgref;
    void *gwork;          /* its own work: the decode product's must stay zero */
    size_t gwork_size;
} ctx;

/* dx[m] on the device: m draws of rng_normal. */
static void put_normal(float *dx, int64_t m) {
    float *hx = (float *)malloc((size_t)m * 4);
    for (int64_t i = 0; i < m; i++) hx[i] = (float)rng_normal();
    CHECK(cudaMemcpy(dx, hx, (size_t)m * 4, cudaMemcpyHostToDevice));
    free(hx);
}

/* href[n, d->rows] = the double reference of W (d: its checkpoint layout in device memory)
 * on n rows of dx, through dref on the device; returns max |ref|. */
static double reference(double *href, double *dref, const float *dx, int64_t n, const matview *d, cudaStream_t s) {
    CHECK(cuda_affine_ref(dref, dx, n, d, s));
    CHECK(cudaMemcpy(href, dref, (size_t)(n * d->rows) * 8, cudaMemcpyDeviceToHost));
    double mag = 0;
    for (int64_t i = 0; i < n * d->rows; i++) mag = fmax(mag, fabs(href[i]));
    return mag;
}

/* Largest |y - ref| over n token rows, divided by mag; -1 if an output is unwritten or the
 * guard after y was touched. */
static double compare(ctx *c, int64_t n, int64_t rows, double mag) {
    CHECK(cudaMemcpy(c->hy, c->y, (size_t)(n * rows + GUARD) * 4, cudaMemcpyDeviceToHost));
    double err = 0;
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n * rows; i++) {
        if (!isfinite(c->hy[i])) {
            if (bad++ == 0) first = i;
            continue;
        }
        err = fmax(err, fabs(c->hy[i] - c->href[i]));
    }
    int64_t gb = 0;
    for (int64_t i = n * rows; i < n * rows + GUARD; i++) gb += !isnan(c->hy[i]);
    if (!bad && !gb) return err / mag;
    printf("  n=%lld, %lld rows: %lld outputs not finite (the first at %lld), %lld past y written\n", (long long)n,
           (long long)rows, (long long)bad, (long long)first, (long long)gb);
    return -1;
}

static double run_plan(ctx *c, const cuda_affine *w, int64_t n, int plan_given, cuda_affine_plan p,
                       unsigned flags, double mag) {
    CHECK(cudaMemsetAsync(c->y, 0xff, (size_t)(n * w->rows + GUARD) * 4, c->s)); /* NaN */
    cudaError_t e = plan_given ? cuda_affine_gemv_plan(c->y, c->x, n, w, c->work, c->s, flags, p)
                               : cuda_affine_gemv(c->y, c->x, n, w, c->work, c->s, flags);
    CHECK(e);
    CHECK(cudaStreamSynchronize(c->s));
    return compare(c, n, w->rows, mag);
}

/* Rows of w through cuda_affine_rows (every row once, in a shuffled order, with negative
 * ids between them) against the host; counts one check. */
static void test_rows(ctx *c, const cuda_affine *w, const matview *h, const char *what) {
    const int64_t rows = h->rows, cols = h->cols, n = rows + 3;
    int32_t *ids = (int32_t *)malloc((size_t)n * 4);
    for (int64_t i = 0; i < rows; i++) ids[i] = (int32_t)i;
    for (int64_t i = rows - 1; i > 0; i--) {
        const int64_t j = (int64_t)(rng_next() % (uint64_t)(i + 1));
        const int32_t t = ids[i];
        ids[i] = ids[j], ids[j] = t;
    }
    ids[rows] = ids[0], ids[0] = -1, ids[rows + 1] = -7, ids[rows + 2] = ids[rows / 2], ids[rows / 2] = -1;
    int32_t *dids;
    float *dy, *hy = (float *)malloc((size_t)(n * cols) * 4);
    CHECK(cudaMalloc((void **)&dids, (size_t)n * 4));
    CHECK(cudaMalloc((void **)&dy, (size_t)(n * cols) * 4 + GUARD * 2));
    CHECK(cudaMemcpy(dids, ids, (size_t)n * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dy, 0x7f, (size_t)(n * cols) * 4)); /* what negative ids keep */
    CHECK(cuda_affine_rows(dy, w, dids, n, c->s));
    CHECK(cudaMemcpy(hy, dy, (size_t)(n * cols) * 4, cudaMemcpyDeviceToHost));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < cols; k++) {
            const float v = hy[i * cols + k];
            if (ids[i] < 0) bad += v != f32_from_bits(0x7f7f7f7fu);
            else bad += v != host_value(h, ids[i], k);
        }
    char line[512];
    snprintf(line, sizeof line, "%s rows: %lld values differ from the CPU reference", what, (long long)bad);
    expect(bad == 0, line);

    /* cuda_affine_dequant: rows r0 .. rows - 1 in fp16, the value above rounded once, and
     * nothing written past them; rows outside W refused */
    const int64_t r0 = rows / 3, k = rows - r0, halves = k * cols;
    uint16_t *hh = (uint16_t *)malloc((size_t)(halves + GUARD) * 2);
    __half *dh = (__half *)dy; /* n * cols floats hold the rows and the guard */
    CHECK(cudaMemset(dh, 0xff, (size_t)(halves + GUARD) * 2));
    CHECK(cuda_affine_dequant(dh, w, r0, k, c->s));
    CHECK(cudaMemcpy(hh, dh, (size_t)(halves + GUARD) * 2, cudaMemcpyDeviceToHost));
    bad = 0;
    for (int64_t i = 0; i < k; i++)
        for (int64_t j = 0; j < cols; j++) bad += hh[i * cols + j] != f32_to_f16(host_value(h, r0 + i, j));
    for (int64_t i = halves; i < halves + GUARD; i++) bad += hh[i] != 0xffffu;
    snprintf(line, sizeof line, "%s dequant rows %lld..%lld: %lld halves differ from fp16(s * q + b) or past them",
             what, (long long)r0, (long long)rows - 1, (long long)bad);
    expect(bad == 0, line);
    snprintf(line, sizeof line, "%s dequant of rows past W refused", what);
    expect(cuda_affine_dequant(dh, w, r0, k + 1, c->s) == cudaErrorInvalidValue &&
               cuda_affine_dequant(dh, w, -1, 1, c->s) == cudaErrorInvalidValue,
           line);
    free(hh);

    cudaFree(dy);
    cudaFree(dids);
    free(hy);
    free(ids);
}

/* h (a random host matrix), d (its device copy) and w (its tiled upload), named in what;
 * false (a failed check) when the upload refuses. */
static bool matrix_open(ctx *c, const char *kind, int64_t rows, int64_t cols, int bits, int64_t group, dtype st,
                        char *what, size_t what_size, matview *h, matview *d, cuda_affine *w) {
    char err[256];
    *h = host_matrix(rows, cols, bits, group, st);
    *d = device_copy(h);
    snprintf(what, what_size, "%s%d-bit g%lld %s %lld x %lld", kind, bits, (long long)group, scale_name(st),
             (long long)rows, (long long)cols);
    if (cuda_affine_upload(w, h, c->s, err, sizeof err) == 0) return true;
    printf("%s: %s\n", what, err);
    expect(0, what);
    device_free(d);
    host_free(h);
    return false;
}

/* The figure of one product is max|y - ref| / max|ref|. With a handful of outputs (rows 1
 * or 7 at n = 1) max|ref| is one or a few random draws and can sit near zero, so every n
 * is held to TOL of the largest |ref| of the matrix's 16-token reference; *strict gets
 * the worst figure with max|ref| over the n token rows themselves (the two agree at n = 16
 * and on large matrices). Returns the worst figure; counts each check. */
static double test_matrix(ctx *c, int64_t rows, int64_t cols, int bits, int64_t group, dtype st,
                          double *strict) {
    char what[160], line[256];
    matview h, d;
    cuda_affine w;
    if (!matrix_open(c, "", rows, cols, bits, group, st, what, sizeof what, &h, &d, &w)) return 1;
    put_normal(c->x, MAXN * cols);
    const double mag_all = reference(c->href, c->ref, c->x, MAXN, &d, c->s);
    if (rows < 1000) test_rows(c, &w, &h, what); /* the host side is slow on the large ones */
    double worst = 0;
    const cuda_affine_plan plans[] = {{4, 0}, {8, 0}, {12, 0}, {16, 0}, {4, 1}, {8, 1}, {20, 1}, {32, 1}, {64, 1},
                                      {4, 2}, {16, 2}, {64, 2}};
    static const char *const kernel[3] = {"", " streamed", " streamed+prefetch"};
    for (int64_t n = 1; n <= MAXN; n++) {
        /* the reference rows for n tokens are the first n of the 16-token reference */
        double mag = 0;
        for (int64_t i = 0; i < n * rows; i++) mag = fmax(mag, fabs(c->href[i]));
        for (int pi = -1; pi < (int)(sizeof plans / sizeof plans[0]); pi++) {
            const cuda_affine_plan p = pi < 0 ? cuda_affine_plan_for(&w, n) : plans[pi];
            if (!cuda_affine_plan_fits(&w, n, p)) {
                snprintf(line, sizeof line, "%s n=%lld slice=%d%s: refused", what, (long long)n, p.slice,
                         kernel[p.stream]);
                expect(pi >= 0 && cuda_affine_gemv_plan(c->y, c->x, n, &w, c->work, c->s, 0, p) == cudaErrorInvalidValue,
                       line);
                continue;
            }
            if (cuda_affine_plan_work_size(&w, n, p) > c->work_size) {
                printf("%s: work buffer too small\n", what);
                expect(0, what);
                continue;
            }
            const unsigned flags = (pi == -1 && n % 2 == 0) ? CUDA_AFFINE_PDL : 0;
            const double e = run_plan(c, &w, n, pi >= 0, p, flags, mag_all);
            const double es = e < 0 ? e : e * mag_all / mag;
            snprintf(line, sizeof line, "%s n=%lld plan slice=%d%s split=%lld%s: %.3g (of max|ref| over n rows %.3g)",
                     what, (long long)n, p.slice, kernel[p.stream], (long long)cuda_affine_plan_split(&w, p),
                     flags ? " pdl" : "", e, es);
            expect(e >= 0 && e <= TOL && (rows < 1000 || es <= TOL), line);
            if (e < 0 || e > worst) worst = e < 0 ? 1e9 : e;
            if (es < 0 || es > *strict) *strict = es < 0 ? 1e9 : es;
        }
    }
    cuda_affine_free(&w);
    device_free(&d);
    host_free(&h);
    return worst;
}

/* ==== Prefill product ==== */

#define GEMM_MAX_N 300

/* cuda_affine_gemm on n token rows against the double reference; max|ref| over the case's
 * n rows. Returns the worst figure through worst. */
static void test_gemm_matrix(ctx *c, int64_t rows, int64_t cols, int bits, int64_t group, dtype st, double *worst) {
    char what[160], line[256];
    matview h, d;
    cuda_affine w;
    if (!matrix_open(c, "gemm ", rows, cols, bits, group, st, what, sizeof what, &h, &d, &w)) return;
    const int64_t ns[] = {1, 9, 31, 128, 129, GEMM_MAX_N};
    for (int ni = 0; ni < 6; ni++) {
        const int64_t n = ns[ni];
        put_normal(c->gx, n * cols);
        const double mag = reference(c->hgref, c->gref, c->gx, n, &d, c->s);
        if (cuda_affine_gemm_work_size(&w, n) > c->gwork_size ||
            cuda_affine_gemm_work_size(&w, n) > cuda_affine_gemm_work_bound(n, cols)) {
            snprintf(line, sizeof line, "%s n=%lld: work size above the buffer or the bound", what, (long long)n);
            expect(0, line);
            continue;
        }
        /* each tensor-core product the device has; with work for the staged x only K is not
         * split, with the whole buffer a launch of these few rows splits K wherever the
         * matrix has 16 stages or more */
        for (int pw = 0; pw < 4; pw++) {
            const cuda_gemm_path path = pw < 2 ? CUDA_GEMM_MMA : CUDA_GEMM_WGMMA;
            const int whole = pw & 1;
            if (path == CUDA_GEMM_WGMMA && !cuda_affine_gemm_has_wgmma()) continue;
            const size_t ws = whole ? c->gwork_size : cuda_affine_gemm_work_size(&w, n);
            float *gy = c->gy;
            const cuda_affine *wp = &w;
            CHECK(cudaMemsetAsync(c->gy, 0xff, (size_t)(n * rows + GUARD) * 4, c->s)); /* NaN */
            CHECK(cuda_affine_gemm_set_path(&gy, &wp, 1, c->gx, n, c->gwork, ws, c->s, path));
            CHECK(cudaStreamSynchronize(c->s));
            CHECK(cudaMemcpy(c->hgy, c->gy, (size_t)(n * rows + GUARD) * 4, cudaMemcpyDeviceToHost));
            double e = 0;
            for (int64_t i = 0; i < n * rows; i++)
                e = isfinite(c->hgy[i]) ? fmax(e, fabs(c->hgy[i] - c->hgref[i]) / mag) : 1e9;
            for (int64_t i = n * rows; i < n * rows + GUARD; i++)
                if (!isnan(c->hgy[i])) e = 1e9;
            snprintf(line, sizeof line, "%s n=%lld %s%s: %.3g", what, (long long)n,
                     path == CUDA_GEMM_WGMMA ? "wgmma" : "mma", whole ? " (K split)" : "", e);
            expect(e <= TOL, line);
            *worst = fmax(*worst, e);
        }
    }
    cuda_affine_free(&w);
    device_free(&d);
    host_free(&h);
}

static void test_gemm(ctx *c) {
    const int64_t rows[] = {7, 33, 300};
    printf("prefill product (mma%s): max |y - ref| / max |ref|, n = 1, 9, 31, 128, 129, 300:\n",
           cuda_affine_gemm_has_wgmma() ? " and wgmma" : "");
    printf("%-5s %-6s %-5s %12s\n", "bits", "group", "scale", "worst");
    for (int bits = 4; bits <= 8; bits += 4)
        for (int64_t group = 32; group <= 128; group *= 2)
            for (int si = 0; si < 3; si++) {
                const dtype st = si == 2 ? DTYPE_F32 : si ? DTYPE_BF16 : DTYPE_F16;
                const int64_t cols[] = {group, 3 * group, 4160 % group == 0 ? 4160 : 33 * group};
                double worst = 0;
                for (int ri = 0; ri < 3; ri++)
                    for (int ci = 0; ci < 3; ci++) test_gemm_matrix(c, rows[ri], cols[ci], bits, group, st, &worst);
                printf("%-5d %-6lld %-5s %12.3g\n", bits, (long long)group, scale_name(st), worst);
            }
}

/* ==== Products of a set of matrices in one launch ==== */

/* cuda_affine_gemv_set (n = 1, 3, 8, 13) and cuda_affine_gemm_set (n = 17, 129: the warpgroup product where the device has it) on three
 * matrices of one input (rows 300, 65, 65, as q, k and v), each output against its own
 * double reference; outputs start as NaN, a guard after each must stay NaN. */
static void test_set(ctx *c, int bits, int64_t group, dtype st) {
    enum { K = 3 };
    const int64_t rows[K] = {300, 65, 65}, cols = 4160 % group == 0 ? 4160 : 33 * group;
    char what[K][160], line[512];
    matview h[K], d[K];
    cuda_affine w[K];
    float *y[K];
    int opened = 0;
    for (; opened < K; opened++)
        if (!matrix_open(c, "set ", rows[opened], cols, bits, group, st, what[opened], sizeof what[0], &h[opened],
                         &d[opened], &w[opened]))
            break;
    if (opened == K) {
        const cuda_affine *ws[K] = {&w[0], &w[1], &w[2]};
        for (int i = 0; i < K; i++) CHECK(cudaMalloc((void **)&y[i], (size_t)(129 * rows[i] + GUARD) * 4));
        const int64_t ns[] = {1, 3, 8, 13, 17, 129};
        for (int ni = 0; ni < 6; ni++) {
            const int64_t n = ns[ni];
            put_normal(c->gx, n * cols);
            for (int i = 0; i < K; i++) CHECK(cudaMemsetAsync(y[i], 0xff, (size_t)(n * rows[i] + GUARD) * 4, c->s));
            cudaError_t e;
            if (n <= CUDA_AFFINE_MAX_N) {
                const size_t need = cuda_affine_gemv_set_work_size(ws, K, n);
                e = need <= c->work_size ? cuda_affine_gemv_set(y, ws, K, c->gx, n, c->work, c->work_size, c->s, 0)
                                         : cudaErrorInvalidValue;
            } else {
                e = cuda_affine_gemm_set(y, ws, K, c->gx, n, c->gwork, c->gwork_size, c->s);
            }
            snprintf(line, sizeof line, "set of 3 (%s ...) n=%lld: launched", what[0], (long long)n);
            expect(e == cudaSuccess, line);
            CHECK(cudaStreamSynchronize(c->s));
            for (int i = 0; i < K; i++) {
                const double mag = reference(c->hgref, c->gref, c->gx, n, &d[i], c->s);
                CHECK(cudaMemcpy(c->hgy, y[i], (size_t)(n * rows[i] + GUARD) * 4, cudaMemcpyDeviceToHost));
                double err = 0;
                for (int64_t j = 0; j < n * rows[i]; j++)
                    err = isfinite(c->hgy[j]) ? fmax(err, fabs(c->hgy[j] - c->hgref[j]) / mag) : 1e9;
                for (int64_t j = n * rows[i]; j < n * rows[i] + GUARD; j++)
                    if (!isnan(c->hgy[j])) err = 1e9;
                snprintf(line, sizeof line, "%s in a set of 3, n=%lld: %.3g", what[i], (long long)n, err);
                expect(err <= TOL, line);
            }
        }
        for (int i = 0; i < K; i++) cudaFree(y[i]);
        /* matrices of other widths cannot share a launch */
        matview ho, dd;
        cuda_affine wo;
        char wwhat[160];
        if (matrix_open(c, "other ", 16, cols + group, bits, group, st, wwhat, sizeof wwhat, &ho, &dd, &wo)) {
            const cuda_affine *mixed[2] = {&w[0], &wo};
            float *ys2[2] = {c->gy, c->gy};
            expect(cuda_affine_gemv_set(ys2, mixed, 2, c->gx, 1, c->work, c->work_size, c->s, 0) ==
                       cudaErrorInvalidValue,
                   "a set of matrices of other widths refused");
            cuda_affine_free(&wo);
            device_free(&dd);
            host_free(&ho);
        }
    }
    for (int i = 0; i < opened; i++) {
        cuda_affine_free(&w[i]);
        device_free(&d[i]);
        host_free(&h[i]);
    }
}

/* A test must be able to fail: one flipped code word in the tiled copy must show. */
static void test_detects_corruption(ctx *c) {
    char err[256];
    matview h = host_matrix(33, 256, 4, 64, DTYPE_F16);
    matview d = device_copy(&h);
    cuda_affine w;
    if (cuda_affine_upload(&w, &h, c->s, err, sizeof err)) {
        expect(0, err);
        return;
    }
    put_normal(c->x, 8 * 256);
    const double mag = reference(c->href, c->ref, c->x, 1, &d, c->s);
    const double clean = run_plan(c, &w, 1, 0, cuda_affine_plan_for(&w, 1), 0, mag);
    uint32_t word;
    CHECK(cudaMemcpy(&word, w.codes + 300, 4, cudaMemcpyDeviceToHost));
    word ^= 0x77777777u;
    CHECK(cudaMemcpy(w.codes + 300, &word, 4, cudaMemcpyHostToDevice));
    const double bad = run_plan(c, &w, 1, 0, cuda_affine_plan_for(&w, 1), 0, mag);
    printf("corruption check: clean %.3g, one flipped word %.3g\n", clean, bad);
    expect(clean >= 0 && clean <= TOL, "clean product before corruption");
    expect(bad > TOL, "a flipped code word is detected");
    cuda_affine_free(&w);
    device_free(&d);
    host_free(&h);
}

static void test_bad_input(ctx *c) {
    char err[256] = "";
    matview h = host_matrix(16, 96, 4, 32, DTYPE_F16);
    cuda_affine w;
    matview b = h;
    b.quant_bits = 3;
    expect(cuda_affine_upload(&w, &b, c->s, err, sizeof err) != 0 && strstr(err, "bits"), "3 bits refused");
    b = h;
    b.group = 64; /* 96 is not a multiple of 64 */
    expect(cuda_affine_upload(&w, &b, c->s, err, sizeof err) != 0 && strstr(err, "multiple"), "cols % group refused");
    b = h;
    b.group = 16;
    expect(cuda_affine_upload(&w, &b, c->s, err, sizeof err) != 0 && strstr(err, "group"), "group 16 refused");
    b = h;
    b.scale_type = DTYPE_U32;
    expect(cuda_affine_upload(&w, &b, c->s, err, sizeof err) != 0 && strstr(err, "scales"), "U32 scales refused");
    if (cuda_affine_upload(&w, &h, c->s, err, sizeof err) == 0) {
        expect(cuda_affine_gemv(c->y, c->x, MAXN + 1, &w, c->work, c->s, 0) == cudaErrorInvalidValue,
               "n = 17 refused");
        expect(cuda_affine_gemv(c->y, c->x, 0, &w, c->work, c->s, 0) == cudaErrorInvalidValue, "n = 0 refused");
        expect(cuda_affine_gemv(c->y, c->x + 1, 1, &w, c->work, c->s, 0) == cudaErrorInvalidValue,
               "x not 16-byte aligned refused");
        expect(cuda_affine_gemv_plan(c->y, c->x, 1, &w, c->work, c->s, 0, (cuda_affine_plan){6, 0}) ==
                   cudaErrorInvalidValue,
               "slice 6 refused");
        expect(cuda_affine_gemm(c->gy, c->gx, 9, &w, c->gwork, cuda_affine_gemm_work_size(&w, 9) - 1, c->s) ==
                   cudaErrorInvalidValue,
               "prefill product: work below the staged x refused");
        cuda_affine_free(&w);
    } else {
        expect(0, err);
    }
    host_free(&h);
}

int main(void) {
    int dev = 0;
    if (cudaGetDeviceCount(&dev) != cudaSuccess || dev < 1) {
        printf("no CUDA device\n0 passed, 1 failed\n");
        return 1;
    }
    ctx c;
    memset(&c, 0, sizeof c);
    const int64_t rows_max = 49152, cols_max = 4224;
    CHECK(cudaStreamCreate(&c.s));
    CHECK(cudaMalloc((void **)&c.x, (size_t)(MAXN * cols_max) * 4));
    CHECK(cudaMalloc((void **)&c.y, (size_t)(MAXN * rows_max + GUARD) * 4));
    CHECK(cudaMalloc((void **)&c.ref, (size_t)(MAXN * rows_max) * 8));
    c.work_size = (size_t)64 << 20;
    CHECK(cudaMalloc(&c.work, c.work_size));
    CHECK(cudaMemset(c.work, 0, c.work_size));
    c.hy = (float *)malloc((size_t)(MAXN * rows_max + GUARD) * 4);
    c.href = (double *)malloc((size_t)(MAXN * rows_max) * 8);

    const int64_t g_rows = 300;
    CHECK(cudaMalloc((void **)&c.gx, (size_t)(GEMM_MAX_N * cols_max) * 4));
    CHECK(cudaMalloc((void **)&c.gy, (size_t)(GEMM_MAX_N * g_rows + GUARD) * 4));
    CHECK(cudaMalloc((void **)&c.gref, (size_t)(GEMM_MAX_N * g_rows) * 8));
    /* room for 8 splits of the largest set (430 rows) */
    c.gwork_size = cuda_affine_gemm_work_bound(GEMM_MAX_N, cols_max) + 256 + cuda_affine_gemm_split_bytes(GEMM_MAX_N, 448, 8);
    CHECK(cudaMalloc(&c.gwork, c.gwork_size));
    c.hgy = (float *)malloc((size_t)(GEMM_MAX_N * g_rows + GUARD) * 4);
    c.hgref = (double *)malloc((size_t)(GEMM_MAX_N * g_rows) * 8);

    test_bad_input(&c);
    test_detects_corruption(&c);
    test_gemm(&c);
    test_set(&c, 4, 64, DTYPE_F16);
    test_set(&c, 4, 32, DTYPE_BF16);
    test_set(&c, 8, 64, DTYPE_F16);
    test_set(&c, 8, 128, DTYPE_F32);

    /* a small real model's shapes (SmolLM2-135M: 4-bit g32 layers, an 8-bit g32 tied head),
     * K of 9, 18 and 24 tiles, on the work buffer the products before them used: the
     * head's 384 blocks after products of 5 to 24 (their partial sums once overwrote its
     * counters, and its rows past 8192 stayed unwritten) */
    {
        static const int64_t shapes[][3] = {{4, 576, 576}, {4, 192, 576}, {4, 1536, 576}, {4, 576, 1536},
                                            {8, 49152, 576}};
        for (int i = 0; i < 5; i++) {
            double strict = 0;
            const double e = test_matrix(&c, shapes[i][1], shapes[i][2], (int)shapes[i][0], 32, DTYPE_F16, &strict);
            printf("model shape %lld-bit g32 F16 %lld x %lld: %.3g\n", (long long)shapes[i][0], (long long)shapes[i][1],
                   (long long)shapes[i][2], e);
        }
    }
    const int64_t rows[] = {1, 7, 33, 1000, 4097};
    printf("max |y - ref| / max |ref| per configuration, n = 1..16, every plan:\n");
    printf("%-5s %-6s %-5s %12s %16s %18s\n", "bits", "group", "scale", "all sizes", "per n, all sizes",
           "per n, rows >= 1000");
    for (int bits = 4; bits <= 8; bits += 4)
        for (int64_t group = 32; group <= 128; group *= 2)
            for (int si = 0; si < 3; si++) {
                const dtype st = si == 2 ? DTYPE_F32 : si ? DTYPE_BF16 : DTYPE_F16;
                const int64_t cols[] = {group, 3 * group, 4160 % group == 0 ? 4160 : 33 * group};
                double worst = 0, strict_all = 0, strict_big = 0;
                for (int ri = 0; ri < 5; ri++)
                    for (int ci = 0; ci < 3; ci++) {
                        double strict = 0;
                        const double e = test_matrix(&c, rows[ri], cols[ci], bits, group, st, &strict);
                        worst = fmax(worst, e);
                        strict_all = fmax(strict_all, strict);
                        if (rows[ri] >= 1000) strict_big = fmax(strict_big, strict);
                    }
                printf("%-5d %-6lld %-5s %12.3g %16.3g %18.3g\n", bits, (long long)group, scale_name(st), worst,
                       strict_all, strict_big);
            }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

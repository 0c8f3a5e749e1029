/*
 * test_kernels.c - every reference kernel against a plain double-precision computation
 * on random inputs, with sizes that are not multiples of 8 or 16; also the fp16/bf16
 * conversions and the thread pool. Prints the max difference of each comparison.
 */
#include "harness.h"

#include "backend/cpu/threadpool.h"
#include "base/half.h"
#include "kernels/ref/ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float *rand_vec(int64_t n, float scale) {
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = rand_uniform(&rng) * scale;
    return v;
}

static void report(const char *what, double diff, double tol) {
    printf("  %-44s max diff %.3g (tol %.3g)\n", what, diff, tol);
    CHECK(diff <= tol, "%s: max diff %g > %g", what, diff, tol);
}

/* ==== matmul ==== */

static void test_dense(dtype t, int64_t rows, int64_t cols, int64_t n) {
    float *wf = rand_vec(rows * cols, 1.0f), *x = rand_vec(n * cols, 1.0f);
    void *data = malloc((size_t)(rows * cols) * 4);
    double *wd = malloc(sizeof(double) * (size_t)(rows * cols));
    for (int64_t i = 0; i < rows * cols; i++) {
        if (t == DTYPE_F32) ((float *)data)[i] = wf[i], wd[i] = wf[i];
        else if (t == DTYPE_F16) ((uint16_t *)data)[i] = f32_to_f16(wf[i]), wd[i] = f16_to_f32(((uint16_t *)data)[i]);
        else ((uint16_t *)data)[i] = f32_to_bf16(wf[i]), wd[i] = bf16_to_f32(((uint16_t *)data)[i]);
    }
    matview w = {.rows = rows, .cols = cols, .type = t, .data = data};
    float *y = malloc(sizeof(float) * (size_t)(n * rows)), *scratch = malloc(sizeof(float) * (size_t)cols);
    ref_matmul(y, &w, x, n, 0, rows, scratch);
    double diff = 0, mx = 0;
    for (int64_t tk = 0; tk < n; tk++)
        for (int64_t r = 0; r < rows; r++) {
            double acc = 0;
            for (int64_t c = 0; c < cols; c++) acc += wd[r * cols + c] * x[tk * cols + c];
            diff = fmax(diff, fabs(acc - y[tk * rows + r]));
            mx = fmax(mx, fabs(acc));
        }
    char what[96];
    snprintf(what, sizeof what, "matmul %s [%lld x %lld] n=%lld", dtype_name(t), (long long)rows, (long long)cols, (long long)n);
    report(what, diff, 1e-6 * fmax(mx, 1.0) * sqrt((double)cols));
    free(wf), free(x), free(data), free(wd), free(y), free(scratch);
}

static void test_affine(int bits, int64_t group, dtype st, int64_t rows, int64_t cols, int64_t n) {
    const int per_word = 32 / bits;
    const int64_t groups = cols / group, words = cols / per_word;
    uint32_t *codes = calloc((size_t)(rows * words), 4);
    uint8_t *q = malloc((size_t)(rows * cols));
    uint16_t *sc = malloc(2 * (size_t)(rows * groups)), *bi = malloc(2 * (size_t)(rows * groups));
    for (int64_t i = 0; i < rows * cols; i++) {
        q[i] = (uint8_t)(((uint64_t)((rand_uniform(&rng) + 1.0f) * 0.5f * (float)(1 << bits))) & ((1u << bits) - 1));
        codes[i / per_word] |= (uint32_t)q[i] << ((i % per_word) * bits);
    }
    for (int64_t i = 0; i < rows * groups; i++) {
        float s = rand_uniform(&rng) * 0.1f, b = rand_uniform(&rng);
        sc[i] = st == DTYPE_F16 ? f32_to_f16(s) : f32_to_bf16(s);
        bi[i] = st == DTYPE_F16 ? f32_to_f16(b) : f32_to_bf16(b);
    }
    matview w = {.rows = rows, .cols = cols, .type = DTYPE_U32, .data = codes, .quant_bits = bits,
                 .group = group, .scale_type = st, .scales = sc, .biases = bi};
    float *x = rand_vec(n * cols, 1.0f), *y = malloc(sizeof(float) * (size_t)(n * rows));
    float *scratch = malloc(sizeof(float) * (size_t)cols);
    ref_matmul(y, &w, x, n, 0, rows, scratch);
    double diff = 0, mx = 0;
    for (int64_t tk = 0; tk < n; tk++)
        for (int64_t r = 0; r < rows; r++) {
            double acc = 0;
            for (int64_t c = 0; c < cols; c++) {
                int64_t g = r * groups + c / group;
                double s = st == DTYPE_F16 ? f16_to_f32(sc[g]) : bf16_to_f32(sc[g]);
                double b = st == DTYPE_F16 ? f16_to_f32(bi[g]) : bf16_to_f32(bi[g]);
                acc += (s * q[r * cols + c] + b) * x[tk * cols + c];
            }
            diff = fmax(diff, fabs(acc - y[tk * rows + r]));
            mx = fmax(mx, fabs(acc));
        }
    char what[96];
    snprintf(what, sizeof what, "matmul %d-bit g%lld %s [%lld x %lld] n=%lld", bits, (long long)group,
             dtype_name(st), (long long)rows, (long long)cols, (long long)n);
    report(what, diff, 1e-6 * fmax(mx, 1.0) * sqrt((double)cols));
    /* ref_mat_row: the dequantized row equals s*q+b exactly in fp32. */
    float *row = malloc(sizeof(float) * (size_t)cols);
    ref_mat_row(row, &w, rows - 1);
    double rd = 0;
    for (int64_t c = 0; c < cols; c++) {
        int64_t g = (rows - 1) * groups + c / group;
        float s = st == DTYPE_F16 ? f16_to_f32(sc[g]) : bf16_to_f32(sc[g]);
        float b = st == DTYPE_F16 ? f16_to_f32(bi[g]) : bf16_to_f32(bi[g]);
        rd = fmax(rd, fabs((double)(s * (float)q[(rows - 1) * cols + c] + b) - row[c]));
    }
    snprintf(what, sizeof what, "dequant row %d-bit g%lld", bits, (long long)group);
    report(what, rd, 0);
    free(codes), free(q), free(sc), free(bi), free(x), free(y), free(scratch), free(row);
}

/* ==== elementwise ==== */

static void test_rmsnorm(int64_t d) {
    float *x = rand_vec(d, 3.0f), *w = rand_vec(d, 1.0f), *y = malloc(sizeof(float) * (size_t)d);
    ref_rmsnorm(y, x, w, d, 1e-5f);
    double ss = 0, diff = 0;
    for (int64_t i = 0; i < d; i++) ss += (double)x[i] * x[i];
    double inv = 1.0 / sqrt(ss / (double)d + 1e-5);
    for (int64_t i = 0; i < d; i++) diff = fmax(diff, fabs(w[i] * x[i] * inv - y[i]));
    report("rmsnorm d=77", diff, 1e-5);
    free(x), free(w), free(y);
}

static void test_rope(bool traditional) {
    const int64_t h = 3, hd = 22, pos = 37;
    float *x = rand_vec(h * hd, 1.0f), *y = malloc(sizeof(float) * (size_t)(h * hd));
    float inv_freq[11];
    for (int i = 0; i < 11; i++) inv_freq[i] = (float)(1.0 / pow(10000.0, 2.0 * i / (double)hd));
    memcpy(y, x, sizeof(float) * (size_t)(h * hd));
    ref_rope(y, h, hd, pos, inv_freq, 1.25f, traditional);
    double diff = 0;
    for (int64_t k = 0; k < h; k++)
        for (int64_t i = 0; i < hd / 2; i++) {
            double a = (double)pos * inv_freq[i], c = cos(a) * 1.25, s = sin(a) * 1.25;
            int64_t i0 = traditional ? 2 * i : i, i1 = traditional ? 2 * i + 1 : i + hd / 2;
            double x0 = x[k * hd + i0], x1 = x[k * hd + i1];
            diff = fmax(diff, fabs(x0 * c - x1 * s - y[k * hd + i0]));
            diff = fmax(diff, fabs(x1 * c + x0 * s - y[k * hd + i1]));
        }
    report(traditional ? "rope traditional h=3 hd=22" : "rope half-split h=3 hd=22", diff, 2e-5);
    free(x), free(y);
}

static void test_softmax_silu(void) {
    const int64_t n = 53;
    float *x = rand_vec(n, 8.0f), *y = malloc(sizeof(float) * (size_t)n);
    memcpy(y, x, sizeof(float) * (size_t)n);
    ref_softmax(y, n);
    double mx = -1e300, sum = 0, diff = 0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, x[i]);
    for (int64_t i = 0; i < n; i++) sum += exp(x[i] - mx);
    for (int64_t i = 0; i < n; i++) diff = fmax(diff, fabs(exp(x[i] - mx) / sum - y[i]));
    report("softmax n=53", diff, 1e-6);
    float *g = rand_vec(n, 6.0f), *u = rand_vec(n, 2.0f);
    ref_swiglu(y, g, u, n);
    diff = 0;
    for (int64_t i = 0; i < n; i++) diff = fmax(diff, fabs(g[i] / (1.0 + exp(-(double)g[i])) * u[i] - y[i]));
    report("swiglu n=53", diff, 1e-5);
    free(x), free(y), free(g), free(u);
}

/* ==== attention over a shuffled paged cache ==== */

static void test_attention(int64_t window) {
    const int64_t h = 6, hk = 2, hd = 12, n_pos = 45, bs = 8, n_blocks = 8;
    const int64_t kvd = hk * hd;
    int32_t blocks[8] = {5, 2, 7, 0, 3, 6, 1, 4}; /* position p in block blocks[p/8] */
    float *k = calloc((size_t)(n_blocks * bs * kvd), sizeof(float)), *v = calloc((size_t)(n_blocks * bs * kvd), sizeof(float));
    float *kc = rand_vec(n_pos * kvd, 1.0f), *vc = rand_vec(n_pos * kvd, 1.0f), *q = rand_vec(h * hd, 2.0f);
    kv_span kv = {k, v, blocks, bs, false};
    for (int64_t p = 0; p < n_pos; p++) {
        memcpy(k + kv_span_slot(&kv, p) * kvd, kc + p * kvd, sizeof(float) * (size_t)kvd);
        memcpy(v + kv_span_slot(&kv, p) * kvd, vc + p * kvd, sizeof(float) * (size_t)kvd);
    }
    const int64_t pos = n_pos - 1;
    float *out = malloc(sizeof(float) * (size_t)(h * hd)), scores[64];
    const float scale = 1.0f / sqrtf((float)hd);
    ref_attention(out, q, &kv, pos, window, h, hk, hd, scale, scores);
    double diff = 0;
    const int64_t lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
    for (int64_t i = 0; i < h; i++) {
        const int64_t kh = i / (h / hk);
        double s[64], mx = -1e300, sum = 0;
        for (int64_t p = lo; p <= pos; p++) {
            double dot = 0;
            for (int64_t c = 0; c < hd; c++) dot += (double)q[i * hd + c] * kc[p * kvd + kh * hd + c];
            s[p] = dot * scale;
            mx = fmax(mx, s[p]);
        }
        for (int64_t p = lo; p <= pos; p++) sum += exp(s[p] - mx);
        for (int64_t c = 0; c < hd; c++) {
            double o = 0;
            for (int64_t p = lo; p <= pos; p++) o += exp(s[p] - mx) / sum * vc[p * kvd + kh * hd + c];
            diff = fmax(diff, fabs(o - out[i * hd + c]));
        }
    }
    char what[96];
    snprintf(what, sizeof what, "attention GQA 6/2 hd=12 pos=44 window=%lld", (long long)window);
    report(what, diff, 1e-5);
    free(k), free(v), free(kc), free(vc), free(q), free(out);
}

/* ==== conversions and threads ==== */

static void test_half(void) {
    CHECK(f16_to_f32(0x3c00) == 1.0f && f16_to_f32(0xc000) == -2.0f, "f16 decode of 1 and -2");
    CHECK(f16_to_f32(0x0001) == ldexpf(1.0f, -24), "f16 smallest subnormal");
    CHECK(f16_to_f32(0x7bff) == 65504.0f, "f16 max");
    CHECK(bf16_to_f32(0x3f80) == 1.0f && f32_to_bf16(1.0f) == 0x3f80, "bf16 1.0");
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        uint16_t x = (uint16_t)h;
        if (((x >> 10) & 0x1f) == 0x1f && (x & 0x3ff)) continue; /* NaN payloads */
        if (f32_to_f16(f16_to_f32(x)) != x) bad++;
    }
    CHECK(bad == 0, "f16 round trip of every non-NaN value: %d mismatches", bad);
    CHECK(f32_to_f16(1.0f + ldexpf(1.0f, -11)) == 0x3c00, "f16 ties to even (down)");
    CHECK(f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)) == 0x3c02, "f16 ties to even (up)");
}

typedef struct pool_job {
    threadpool_counter counter;
    atomic_llong sum;
    atomic_int seen[8];
} pool_job;

static void pool_task(void *p, int ith, int nth) {
    pool_job *j = p;
    atomic_fetch_add(&j->seen[ith], 1);
    int64_t lo, hi;
    while (threadpool_chunk(&j->counter, 1001, 7, &lo, &hi))
        for (int64_t i = lo; i < hi; i++) atomic_fetch_add(&j->sum, i);
    (void)nth;
}

static void test_threadpool(void) {
    threadpool *pool = threadpool_create(3);
    CHECK(pool && threadpool_size(pool) == 3, "pool of 3 threads");
    static pool_job j;
    bool ok = true;
    for (int rep = 0; rep < 200; rep++) {
        atomic_store(&j.counter.next, 0);
        atomic_store(&j.sum, 0);
        threadpool_run(pool, pool_task, &j);
        ok = ok && atomic_load(&j.sum) == 1001 * 1000 / 2;
    }
    CHECK(ok, "200 jobs over chunks sum 0..1000 exactly");
    CHECK(j.seen[0] == 200 && j.seen[1] == 200 && j.seen[2] == 200, "each thread ran each job once");
    threadpool_destroy(pool);
}

int main(void) {
    test_dense(DTYPE_F32, 37, 75, 3);
    test_dense(DTYPE_F16, 29, 83, 2);
    test_dense(DTYPE_BF16, 19, 131, 5);
    test_affine(4, 32, DTYPE_BF16, 13, 96, 3);
    test_affine(4, 64, DTYPE_F16, 11, 192, 2);
    test_affine(4, 128, DTYPE_BF16, 7, 384, 1);
    test_affine(8, 32, DTYPE_BF16, 17, 160, 3);
    test_affine(8, 64, DTYPE_F16, 9, 192, 2);
    test_affine(8, 128, DTYPE_BF16, 5, 256, 4);
    test_rmsnorm(77);
    test_rope(false);
    test_rope(true);
    test_softmax_silu();
    test_attention(0);
    test_attention(9);
    test_half();
    test_threadpool();
    return harness_done("test_kernels");
}

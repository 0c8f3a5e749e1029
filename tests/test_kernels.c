/*
 * test_kernels.c - every reference kernel against a plain double-precision computation
 * on random inputs, with sizes that are not multiples of 8 or 16 (matmul, RMSNorm,
 * LayerNorm, RoPE, softmax, SwiGLU, the GELU activations, paged and full attention); also
 * the fp16/bf16 conversions and the thread pool. Prints the max difference of each
 * comparison.
 */
#include "harness.h"

#include "base/threadpool.h"
#include "base/half.h"
#include "backend/ref/ref.h"

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
        if (t == DTYPE_F32)
            ((float *)data)[i] = wf[i], wd[i] = wf[i];
        else if (t == DTYPE_F16)
            ((uint16_t *)data)[i] = f32_to_f16(wf[i]), wd[i] = f16_to_f32(((uint16_t *)data)[i]);
        else
            ((uint16_t *)data)[i] = f32_to_bf16(wf[i]), wd[i] = bf16_to_f32(((uint16_t *)data)[i]);
    }
    matview w = {.rows = rows, .cols = cols, .type = t, .data = data};
    float *y = malloc(sizeof(float) * (size_t)(n * rows)),
          *scratch = malloc(sizeof(float) * (size_t)cols);
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
    snprintf(what, sizeof what, "matmul %s [%lld x %lld] n=%lld", dtype_name(t), (long long)rows,
             (long long)cols, (long long)n);
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
        q[i] = (uint8_t)(((uint64_t)((rand_uniform(&rng) + 1.0f) * 0.5f * (float)(1 << bits))) &
                         ((1u << bits) - 1));
        codes[i / per_word] |= (uint32_t)q[i] << ((i % per_word) * bits);
    }
    for (int64_t i = 0; i < rows * groups; i++) {
        float s = rand_uniform(&rng) * 0.1f, b = rand_uniform(&rng);
        sc[i] = st == DTYPE_F16 ? f32_to_f16(s) : f32_to_bf16(s);
        bi[i] = st == DTYPE_F16 ? f32_to_f16(b) : f32_to_bf16(b);
    }
    matview w = {.rows = rows,
                 .cols = cols,
                 .type = DTYPE_U32,
                 .data = codes,
                 .quant_bits = bits,
                 .group = group,
                 .scale_type = st,
                 .scales = sc,
                 .biases = bi};
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
    snprintf(what, sizeof what, "matmul %d-bit g%lld %s [%lld x %lld] n=%lld", bits,
             (long long)group, dtype_name(st), (long long)rows, (long long)cols, (long long)n);
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

/* Rotation of the first dims values of each head (0: all of hd); the rest must pass
 * through unchanged. */
static void test_rope(bool traditional, int64_t dims) {
    const int64_t h = 3, hd = 22, pos = 37, r = dims ? dims : hd;
    float *x = rand_vec(h * hd, 1.0f), *y = malloc(sizeof(float) * (size_t)(h * hd));
    float inv_freq[11];
    for (int i = 0; i < r / 2; i++) inv_freq[i] = (float)(1.0 / pow(10000.0, 2.0 * i / (double)r));
    memcpy(y, x, sizeof(float) * (size_t)(h * hd));
    const rope_params rp = {
        .inv_freq = inv_freq, .dims = dims, .mscale = 1.25f, .traditional = traditional};
    ref_rope(y, h, hd, pos, &rp);
    double diff = 0;
    for (int64_t k = 0; k < h; k++) {
        for (int64_t i = 0; i < r / 2; i++) {
            double a = (double)pos * inv_freq[i], c = cos(a) * 1.25, s = sin(a) * 1.25;
            int64_t i0 = traditional ? 2 * i : i, i1 = traditional ? 2 * i + 1 : i + r / 2;
            double x0 = x[k * hd + i0], x1 = x[k * hd + i1];
            diff = fmax(diff, fabs(x0 * c - x1 * s - y[k * hd + i0]));
            diff = fmax(diff, fabs(x1 * c + x0 * s - y[k * hd + i1]));
        }
        for (int64_t i = r; i < hd; i++) diff = fmax(diff, fabs(x[k * hd + i] - y[k * hd + i]));
    }
    char what[96];
    snprintf(what, sizeof what, "rope %s h=3 hd=22 rotating %lld",
             traditional ? "traditional" : "half-split", (long long)r);
    report(what, diff, 2e-5);
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
    ref_glu(y, g, u, n, BACKEND_ACT_SILU);
    diff = 0;
    for (int64_t i = 0; i < n; i++)
        diff = fmax(diff, fabs(g[i] / (1.0 + exp(-(double)g[i])) * u[i] - y[i]));
    report("swiglu n=53", diff, 1e-5);
    /* soft-capping: cap tanh(x / cap), against double, and bounded by the cap */
    memcpy(y, x, sizeof(float) * (size_t)n);
    ref_softcap(y, 3.0f, n);
    diff = 0;
    bool bounded = true;
    for (int64_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs(3.0 * tanh((double)x[i] / 3.0) - y[i]));
        bounded = bounded && fabsf(y[i]) <= 3.0f;
    }
    report("softcap 3 n=53", diff, 1e-6);
    CHECK(bounded, "softcap: |y| <= cap");
    free(x), free(y), free(g), free(u);
}

/* Two-pass LayerNorm in double; bias optional. Also checks that y may alias x. */
static void test_layernorm(int64_t d, bool bias) {
    float *x = rand_vec(d, 2.0f), *w = rand_vec(d, 1.5f), *b = bias ? rand_vec(d, 0.5f) : NULL;
    /* an offset mean: a one-pass variance would lose it */
    for (int64_t i = 0; i < d; i++) x[i] += 3.0f;
    float *y = malloc(sizeof(float) * (size_t)d);
    ref_layernorm(y, x, w, b, d, 1e-5f);
    double mean = 0, var = 0, diff = 0, mx = 0;
    for (int64_t i = 0; i < d; i++) mean += x[i];
    mean /= (double)d;
    for (int64_t i = 0; i < d; i++) var += (x[i] - mean) * (x[i] - mean);
    const double inv = 1.0 / sqrt(var / (double)d + 1e-5);
    for (int64_t i = 0; i < d; i++) {
        const double e = (x[i] - mean) * inv * w[i] + (b ? b[i] : 0.0);
        diff = fmax(diff, fabs(e - y[i]));
        mx = fmax(mx, fabs(e));
    }
    char what[96];
    snprintf(what, sizeof what, "layernorm d=%lld %s (relative)", (long long)d,
             bias ? "with bias" : "no bias");
    report(what, diff / mx, 1e-6);
    ref_layernorm(x, x, w, b, d, 1e-5f);
    CHECK(!memcmp(x, y, sizeof(float) * (size_t)d), "layernorm in place equals out of place");
    /* the bias is added: without it every row would differ by b */
    if (bias) {
        float *y0 = malloc(sizeof(float) * (size_t)d);
        ref_layernorm(y0, y, w, NULL, d, 1e-5f);
        CHECK(max_abs_diff(y, y0, d) > 0.1, "layernorm bias changes the output");
        free(y0);
    }
    free(x), free(w), free(b), free(y);
}

static double act_double(double x, backend_act kind) {
    switch (kind) {
    case BACKEND_ACT_SILU:
        return x / (1.0 + exp(-x));
    case BACKEND_ACT_GELU_ERF:
        return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case BACKEND_ACT_GELU_TANH:
        return 0.5 * x *
               (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
    case BACKEND_ACT_QUICK_GELU:
        return x / (1.0 + exp(-1.702 * x));
    }
    return x;
}

/* Each activation on a grid over [-12, 12], random points and large |x| up to 1e4, against
 * double precision: |diff| / max(1, |y|). */
static void test_act(backend_act kind, const char *name) {
    enum { N = 2400 + 400 + 12 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    int64_t m = 0;
    for (int i = 0; i < 2400; i++) x[m++] = -12.0f + 24.0f * (float)i / 2399.0f;
    for (int i = 0; i < 400; i++) x[m++] = rand_uniform(&rng) * 6.0f;
    const float big[12] = {-1e4f,  -3e3f, -100.0f, -30.0f, -15.0f, -0.0f,
                           1e-30f, 15.0f, 30.0f,   100.0f, 3e3f,   1e4f};
    for (int i = 0; i < 12; i++) x[m++] = big[i];
    ref_act(y, x, m, kind);
    double diff = 0;
    bool finite = true;
    for (int64_t i = 0; i < m; i++) {
        const double e = act_double(x[i], kind);
        diff = fmax(diff, fabs(e - y[i]) / fmax(1.0, fabs(e)));
        finite = finite && isfinite(y[i]);
    }
    CHECK(finite, "%s: non-finite output for a finite input", name);
    char what[96];
    snprintf(what, sizeof what, "%s n=%lld, |x| <= 1e4 (relative)", name, (long long)m);
    report(what, diff, 1e-6);
    /* in place */
    ref_act(x, x, m, kind);
    CHECK(!memcmp(x, y, sizeof(float) * (size_t)m), "%s in place equals out of place", name);
    /* gating: act(gate) * up */
    float *g = rand_vec(m, 6.0f), *u = rand_vec(m, 2.0f);
    ref_glu(y, g, u, m, kind);
    diff = 0;
    for (int64_t i = 0; i < m; i++) {
        const double e = act_double(g[i], kind) * u[i];
        diff = fmax(diff, fabs(e - y[i]) / fmax(1.0, fabs(e)));
    }
    snprintf(what, sizeof what, "%s gating n=%lld (relative)", name, (long long)m);
    report(what, diff, 1e-6);
    free(x), free(y), free(g), free(u);
}

/* ==== attention over a shuffled paged cache ==== */

/* A row at position pos = 44 - ahead seeing the keys up to 44 (ahead > 0: a row of an image
 * block, which sees the rest of its block). */
static void test_attention(int64_t window, float softcap, int64_t ahead) {
    const int64_t h = 6, hk = 2, hd = 12, n_pos = 45, bs = 8, n_blocks = 8;
    const int64_t kvd = hk * hd;
    int32_t blocks[8] = {5, 2, 7, 0, 3, 6, 1, 4}; /* position p in block blocks[p/8] */
    float *k = calloc((size_t)(n_blocks * bs * kvd), sizeof(float)),
          *v = calloc((size_t)(n_blocks * bs * kvd), sizeof(float));
    float *kc = rand_vec(n_pos * kvd, 1.0f), *vc = rand_vec(n_pos * kvd, 1.0f),
          *q = rand_vec(h * hd, 2.0f);
    kv_span kv = {k, v, blocks, bs, false};
    for (int64_t p = 0; p < n_pos; p++) {
        memcpy(k + kv_span_slot(&kv, p) * kvd, kc + p * kvd, sizeof(float) * (size_t)kvd);
        memcpy(v + kv_span_slot(&kv, p) * kvd, vc + p * kvd, sizeof(float) * (size_t)kvd);
    }
    const int64_t limit = n_pos - 1, pos = limit - ahead;
    float *out = malloc(sizeof(float) * (size_t)(h * hd)), scores[64];
    const float scale = 1.0f / sqrtf((float)hd);
    ref_attention(out, q, &kv, pos, limit, window, h, hk, hd, scale, softcap, scores);
    double diff = 0;
    const int64_t lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
    for (int64_t i = 0; i < h; i++) {
        const int64_t kh = i / (h / hk);
        double s[64], mx = -1e300, sum = 0;
        for (int64_t p = lo; p <= limit; p++) {
            double dot = 0;
            for (int64_t c = 0; c < hd; c++)
                dot += (double)q[i * hd + c] * kc[p * kvd + kh * hd + c];
            s[p] = dot * scale;
            if (softcap > 0) s[p] = softcap * tanh(s[p] / softcap);
            mx = fmax(mx, s[p]);
        }
        for (int64_t p = lo; p <= limit; p++) sum += exp(s[p] - mx);
        for (int64_t c = 0; c < hd; c++) {
            double o = 0;
            for (int64_t p = lo; p <= limit; p++)
                o += exp(s[p] - mx) / sum * vc[p * kvd + kh * hd + c];
            diff = fmax(diff, fabs(o - out[i * hd + c]));
        }
    }
    char what[96];
    snprintf(what, sizeof what, "attention GQA 6/2 hd=12 pos=%lld limit=44 window=%lld softcap=%g",
             (long long)pos, (long long)window, (double)softcap);
    report(what, diff, 1e-5);
    free(k), free(v), free(kc), free(vc), free(q), free(out);
}

/* ==== full attention over segments ==== */

/* Row t of every segment against a double-precision softmax over the keys [lo, lo + nk)
 * of k and v [*, hk*hd]; max |diff| over out[t, h*hd]. */
static double full_row_diff(const float *out, const float *q, const float *k, const float *v,
                            int64_t lo, int64_t nk, int64_t h, int64_t hk, int64_t hd,
                            float scale) {
    const int64_t kvd = hk * hd;
    double diff = 0, *s = malloc(sizeof(double) * (size_t)nk);
    for (int64_t i = 0; i < h; i++) {
        const int64_t off = i / (h / hk) * hd;
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < nk; j++) {
            double dot = 0;
            for (int64_t c = 0; c < hd; c++)
                dot += (double)q[i * hd + c] * k[(lo + j) * kvd + off + c];
            s[j] = dot * scale;
            mx = fmax(mx, s[j]);
        }
        for (int64_t j = 0; j < nk; j++) sum += exp(s[j] - mx);
        for (int64_t c = 0; c < hd; c++) {
            double o = 0;
            for (int64_t j = 0; j < nk; j++)
                o += exp(s[j] - mx) / sum * v[(lo + j) * kvd + off + c];
            diff = fmax(diff, fabs(o - out[i * hd + c]));
        }
    }
    free(s);
    return diff;
}

/* Three segments of 37 rows (not a multiple of 16), GQA 6/2: each row's output from
 * ref_attention_full over its own segment, against double precision; the same check with
 * the segment boundary moved by one row must fail. */
static void test_attention_full(int64_t hd) {
    const int64_t seg = 37, n = 3 * seg, h = 6, hk = 2, qd = h * hd, kvd = hk * hd;
    float *q = rand_vec(n * qd, 2.0f), *k = rand_vec(n * kvd, 1.0f), *v = rand_vec(n * kvd, 1.0f);
    float *out = malloc(sizeof(float) * (size_t)(n * qd)), scores[37];
    const float scale = 1.0f / sqrtf((float)hd);
    for (int64_t t = 0; t < n; t++) {
        const int64_t first = t / seg * seg;
        ref_attention_full(out + t * qd, q + t * qd, k + first * kvd, v + first * kvd, seg, h, hk,
                           hd, scale, scores);
    }
    double diff = 0, shifted = 1e300;
    for (int64_t t = 0; t < n; t++) {
        const int64_t first = t / seg * seg;
        diff =
            fmax(diff, full_row_diff(out + t * qd, q + t * qd, k, v, first, seg, h, hk, hd, scale));
        /* a segment one row later (the next segment's first row in, this one's out), or one
         * row earlier for the last segment */
        const int64_t lo = first + seg < n ? first + 1 : first - 1;
        shifted =
            fmin(shifted, full_row_diff(out + t * qd, q + t * qd, k, v, lo, seg, h, hk, hd, scale));
    }
    char what[96];
    snprintf(what, sizeof what, "attention_full 3 x 37 rows GQA 6/2 hd=%lld", (long long)hd);
    report(what, diff, 1e-6);
    printf("  %-44s min diff %.3g\n", "  ... against segments moved by one row", shifted);
    CHECK(shifted > 1e-4, "attention_full: a segment boundary moved by one row goes unnoticed (%g)",
          shifted);
    free(q), free(k), free(v), free(out);
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
    CHECK(j.seen[0] == 200 && j.seen[1] == 200 && j.seen[2] == 200,
          "each thread ran each job once");
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
    test_rope(false, 0);
    test_rope(true, 0);
    test_rope(false, 16);
    test_rope(true, 6);
    test_softmax_silu();
    test_layernorm(77, false);
    test_layernorm(77, true);
    test_layernorm(1030, true);
    test_act(BACKEND_ACT_SILU, "silu");
    test_act(BACKEND_ACT_GELU_ERF, "gelu erf");
    test_act(BACKEND_ACT_GELU_TANH, "gelu tanh");
    test_act(BACKEND_ACT_QUICK_GELU, "quick gelu");
    test_attention(0, 0.0f, 0);
    test_attention(9, 0.0f, 0);
    test_attention(0, 1.5f, 0);
    test_attention(9, 1.5f, 0);
    test_attention(0, 0.0f, 3); /* a row of an image block: keys past its own position */
    test_attention(5, 1.5f, 3); /* ... under a window shorter than the block */
    test_attention_full(64);
    test_attention_full(80);
    test_half();
    test_threadpool();
    return harness_done("test_kernels");
}

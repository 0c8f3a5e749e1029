/*
 * test_cpu_kernels.c - every fast CPU kernel table (generic C, AVX2, AVX-512 VNNI, AMX;
 * each ISA the machine has, the rest reported as skipped) against the scalar reference
 * kernels on random inputs of awkward sizes: the packed quantized product, activation
 * quantization, dense products, attention pieces, LayerNorm and the GELU activations, and
 * the whole backend ops (matmul, attention with GQA, windows and paged blocks, RoPE,
 * SwiGLU, LayerNorm, activations, full attention over segments). Prints each max
 * difference.
 *
 * Tolerances: kernels fed the same int8 activations agree to float rounding (1e-5
 * relative); a single int8 pass against exact fp32 arithmetic agrees to about 1/127 of
 * a block's largest value per product, so 2e-2 of the output's scale; value + residual
 * pairs (the backend's default) to 2e-4.
 */
#include "harness.h"

#include "backend/cpu/backend_cpu.h"
#include "backend/cpu/kernels.h"
#include "base/half.h"
#include "backend/ref/backend_ref.h"
#include "backend/ref/ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x2545f4914f6cdd1dull;

static float *rand_vec(int64_t n, float scale) {
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = rand_uniform(&rng) * scale;
    return v;
}

static void report(const char *what, double diff, double tol) {
    printf("  %-60s max diff %.3g (tol %.3g)\n", what, diff, tol);
    CHECK(diff <= tol, "%s: max diff %g > %g", what, diff, tol);
}

/* A random affine matrix in MLX layout: codes, scales and biases owned by the caller. */
typedef struct rand_affine {
    matview w;
    uint32_t *codes;
    void *scales, *biases;
} rand_affine;

static void store_scale(dtype st, void *p, int64_t i, float v) {
    if (st == DTYPE_F32)
        ((float *)p)[i] = v;
    else if (st == DTYPE_F16)
        ((uint16_t *)p)[i] = f32_to_f16(v);
    else
        ((uint16_t *)p)[i] = f32_to_bf16(v);
}

static rand_affine make_affine(int bits, int64_t group, dtype st, int64_t rows, int64_t cols) {
    rand_affine a;
    const int per_word = 32 / bits;
    const int64_t groups = cols / group, words = cols / per_word;
    a.codes = calloc((size_t)(rows * words), 4);
    a.scales = malloc((size_t)(rows * groups) * 4);
    a.biases = malloc((size_t)(rows * groups) * 4);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const uint32_t q =
                (uint32_t)(rand_uniform(&rng) * 0.5f + 0.5f) * 0u +
                (uint32_t)((rand_uniform(&rng) * 0.5f + 0.5f) * (float)((1 << bits) - 1) + 0.5f);
            a.codes[r * words + c / per_word] |= (q & ((1u << bits) - 1u))
                                                 << ((c % per_word) * bits);
        }
    for (int64_t i = 0; i < rows * groups; i++) {
        /* F32 scales that are exact in f16, as GGUF-derived and mlx files carry */
        const float s = f16_to_f32(f32_to_f16(0.01f + 0.02f * fabsf(rand_uniform(&rng))));
        const float b = f16_to_f32(
            f32_to_f16(-s * (float)(1 << (bits - 1)) * (1.0f + 0.1f * rand_uniform(&rng))));
        store_scale(st, a.scales, i, s);
        store_scale(st, a.biases, i, b);
    }
    a.w = (matview){.rows = rows,
                    .cols = cols,
                    .type = DTYPE_U32,
                    .data = a.codes,
                    .quant_bits = bits,
                    .group = group,
                    .scale_type = st,
                    .scales = a.scales,
                    .biases = a.biases};
    return a;
}

static void free_affine(rand_affine *a) {
    free(a->codes), free(a->scales), free(a->biases);
}

/* Single int8 rows, with the sums of half blocks (for weights in groups of 16). */
static qrows quantize_rows(const cpu_kernels *k, const float *x, int64_t n, int64_t cols) {
    qrows q = {.n = n,
               .cols = cols,
               .q = malloc((size_t)(n * cols)),
               .d = malloc(sizeof(float) * (size_t)(n * cols / QBLOCK)),
               .s = malloc(sizeof(float) * (size_t)(n * cols / QBLOCK)),
               .s16 = calloc((size_t)(n * (cols / 16)), sizeof(float))};
    for (int64_t t = 0; t < n; t++) {
        k->quantize_row(q.q + t * cols, q.d + t * cols / QBLOCK, q.s + t * cols / QBLOCK,
                        x + t * cols, cols);
        for (int64_t c = 0; c < cols; c++) q.s16[t * (cols / 16) + c / 16] += x[t * cols + c];
    }
    return q;
}

/* Value and residual rows, as the backend makes them for pairs (pack.h), with the sums of
 * half blocks (for weights in groups of 16). */
static qrows quantize_pairs(const cpu_kernels *k, const float *x, int64_t n, int64_t cols) {
    const int64_t nb = cols / QBLOCK;
    qrows q = {.n = 2 * n,
               .cols = cols,
               .pairs = 1,
               .q = malloc((size_t)(2 * n * cols)),
               .d = malloc(sizeof(float) * (size_t)(2 * n * nb)),
               .s = malloc(sizeof(float) * (size_t)(2 * n * nb)),
               .s16 = calloc((size_t)(2 * n * (cols / 16)), sizeof(float))};
    for (int64_t t = 0; t < n; t++)
        for (int64_t c = 0; c < cols; c++) q.s16[2 * t * (cols / 16) + c / 16] += x[t * cols + c];
    float *res = malloc(sizeof(float) * (size_t)cols);
    for (int64_t t = 0; t < n; t++) {
        int8_t *qt = q.q + 2 * t * cols;
        float *d = q.d + 2 * t * nb, *s = q.s + 2 * t * nb;
        k->quantize_row(qt, d, s, x + t * cols, cols);
        for (int64_t c = 0; c < cols; c++) res[c] = x[t * cols + c] - d[c / QBLOCK] * (float)qt[c];
        k->quantize_row(qt + cols, d + nb, s + nb, res, cols);
        memset(s + nb, 0, sizeof(float) * (size_t)nb);
    }
    free(res);
    return q;
}

static void free_qrows(qrows *q) {
    free(q->q), free(q->d), free(q->s), free(q->s16);
}

/* ==== packed layout ==== */

static void test_pack_rows(void) {
    const int bits[] = {4, 8};
    double diff = 0;
    for (int b = 0; b < 2; b++) {
        rand_affine a = make_affine(bits[b], 64, DTYPE_BF16, 37, 192);
        arena mem = {0};
        const packed_mat *p = pack_matrix(&a.w, &mem);
        CHECK(p != NULL, "pack_matrix %d-bit", bits[b]);
        float r1[192], r2[192];
        for (int64_t r = 0; p && r < a.w.rows; r++) {
            matview_row(r1, &a.w, r);
            packed_row(r2, p, r);
            for (int c = 0; c < 192; c++) diff = fmax(diff, fabs((double)r1[c] - r2[c]));
        }
        arena_free(&mem);
        free_affine(&a);
    }
    report("packed rows == MLX rows (4/8-bit, 37 x 192, g64)", diff, 0.0);
    /* what the packer must refuse */
    rand_affine a = make_affine(4, 32, DTYPE_F32, 4, 64);
    ((float *)a.scales)[3] = 1.0f + 1e-7f; /* exact in neither f16 nor bf16 */
    CHECK(!pack_supported(&a.w), "pack_supported refuses inexact F32 scales");
    free_affine(&a);
}

/* ==== quantized product ==== */

static void test_gemm_q(const cpu_kernels *k, int bits, int64_t group, dtype st, int64_t rows,
                        int64_t cols, int64_t n) {
    rand_affine a = make_affine(bits, group, st, rows, cols);
    arena mem = {0};
    const packed_mat *p = pack_matrix(&a.w, &mem);
    float *x = rand_vec(n * cols, 1.0f);
    qrows qg = quantize_rows(&cpu_kernels_generic, x, n, cols), qk = quantize_rows(k, x, n, cols);
    /* the ISA's quantizer against the generic one: same codes, same scales */
    double qdiff = 0;
    for (int64_t i = 0; i < n * cols; i++) qdiff = fmax(qdiff, abs(qg.q[i] - qk.q[i]));
    for (int64_t i = 0; i < n * cols / QBLOCK; i++) {
        qdiff = fmax(qdiff, fabs((double)qg.d[i] - qk.d[i]));
        qdiff = fmax(qdiff, fabs((double)qg.s[i] - qk.s[i]) / 16.0);
    }
    float *yk = malloc(sizeof(float) * (size_t)(n * rows)),
          *yg = malloc(sizeof(float) * (size_t)(n * rows));
    float *yr = malloc(sizeof(float) * (size_t)(n * rows)),
          *wrow = malloc(sizeof(float) * (size_t)cols);
    for (int64_t i = 0; i < n * rows; i++) yk[i] = yg[i] = NAN;
    k->gemm_q(yk, rows, p, 0, p->tiles, &qg);
    cpu_kernels_generic.gemm_q(yg, rows, p, 0, p->tiles, &qg);
    ref_matmul(yr, &a.w, x, n, 0, rows, wrow);
    double dk = 0, dr = 0, mx = 0;
    for (int64_t i = 0; i < n * rows; i++) {
        dk = fmax(dk, isnan(yk[i]) ? INFINITY : fabs((double)yk[i] - yg[i]));
        dr = fmax(dr, fabs((double)yg[i] - yr[i]));
        mx = fmax(mx, fabs(yr[i]));
    }
    char what[128];
    snprintf(what, sizeof what, "%s quantize %d-bit g%lld [%lld x %lld] n=%lld",
             cpu_isa_name(k->isa), bits, (long long)group, (long long)rows, (long long)cols,
             (long long)n);
    report(what, qdiff, 1e-6);
    snprintf(what, sizeof what, "%s gemm_q %d-bit g%lld %s [%lld x %lld] n=%lld vs generic",
             cpu_isa_name(k->isa), bits, (long long)group, dtype_name(st), (long long)rows,
             (long long)cols, (long long)n);
    report(what, dk, 1e-5 * fmax(mx, 1.0));
    if (k->isa == CPU_ISA_GENERIC) {
        snprintf(what, sizeof what, "generic gemm_q %d-bit g%lld [%lld x %lld] n=%lld vs ref", bits,
                 (long long)group, (long long)rows, (long long)cols, (long long)n);
        report(what, dr, 2e-2 * fmax(mx, 1.0));
    }
    /* value + residual pairs: near fp32 accuracy */
    qrows pg = quantize_pairs(&cpu_kernels_generic, x, n, cols);
    for (int64_t i = 0; i < n * rows; i++) yk[i] = yg[i] = NAN;
    k->gemm_q(yk, rows, p, 0, p->tiles, &pg);
    cpu_kernels_generic.gemm_q(yg, rows, p, 0, p->tiles, &pg);
    dk = dr = 0;
    for (int64_t i = 0; i < n * rows; i++) {
        dk = fmax(dk, isnan(yk[i]) ? INFINITY : fabs((double)yk[i] - yg[i]));
        dr = fmax(dr, fabs((double)yg[i] - yr[i]));
    }
    snprintf(what, sizeof what, "%s gemm_q pairs %d-bit g%lld [%lld x %lld] n=%lld vs generic",
             cpu_isa_name(k->isa), bits, (long long)group, (long long)rows, (long long)cols,
             (long long)n);
    report(what, dk, 1e-5 * fmax(mx, 1.0));
    if (k->isa == CPU_ISA_GENERIC) {
        snprintf(what, sizeof what, "generic gemm_q pairs %d-bit g%lld [%lld x %lld] n=%lld vs ref",
                 bits, (long long)group, (long long)rows, (long long)cols, (long long)n);
        report(what, dr, 2e-4 * fmax(mx, 1.0));
    }
    free_qrows(&pg);
    free(yk), free(yg), free(yr), free(wrow), free(x);
    free_qrows(&qg), free_qrows(&qk);
    arena_free(&mem);
    free_affine(&a);
}

/* x[n, cols] as the bf16 product's activation rows (zero rows up to a multiple of 16). */
static brows split_rows(const cpu_kernels *k, const float *x, int64_t n, int64_t cols) {
    const int64_t padded = (n + 15) / 16 * 16;
    brows xb = {.n = n, .cols = cols, .t = calloc((size_t)(2 * padded * cols), sizeof(uint16_t))};
    for (int64_t t = 0; t < n; t++) k->split_bf16(brows_row(&xb, t), x + t * cols, cols);
    return xb;
}

/* The largest |y - reference| / sum |w * x| over the rows of y = x W^T (NaN: infinity). */
static double worst_vs_ref(const matview *w, const float *x, const float *y, int64_t n,
                           int64_t rows, int64_t cols) {
    float *yr = malloc(sizeof(float) * (size_t)(n * rows)),
          *wrow = malloc(sizeof(float) * (size_t)cols);
    ref_matmul(yr, w, x, n, 0, rows, wrow);
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        matview_row(wrow, w, r);
        for (int64_t t = 0; t < n; t++) {
            double mag = 0;
            for (int64_t c = 0; c < cols; c++) mag += fabs((double)wrow[c] * x[t * cols + c]);
            const double e = isnan(y[t * rows + r])
                                 ? INFINITY
                                 : fabs((double)y[t * rows + r] - yr[t * rows + r]);
            worst = fmax(worst, e / fmax(mag, 1e-30));
        }
    }
    free(yr), free(wrow);
    return worst;
}

/* The bf16 tile product (AMX): every row against the float reference within 2e-5 of
 * sum |w * x| (about 16 bits of each factor), tile ranges split at odd places, and each
 * output row the same bits whichever rows came with it. */
static void test_gemm_bf16(const cpu_kernels *k, int64_t group, dtype st, int64_t rows,
                           int64_t cols, int64_t n) {
    rand_affine a = make_affine(4, group, st, rows, cols);
    arena mem = {0};
    const packed_mat *p = pack_matrix(&a.w, &mem);
    float *x = rand_vec(n * cols, 1.0f);
    brows xb = split_rows(k, x, n, cols);
    void *scratch = aligned_alloc(64, BF16_SCRATCH);
    float *yk = malloc(sizeof(float) * (size_t)(n * rows));
    for (int64_t i = 0; i < n * rows; i++) yk[i] = NAN;
    /* two calls, split after the second tile */
    const int64_t mid = p->tiles > 2 ? 2 : p->tiles;
    k->gemm_bf16(yk, rows, p, 0, mid, &xb, scratch);
    if (mid < p->tiles) k->gemm_bf16(yk, rows, p, mid, p->tiles, &xb, scratch);
    const double worst = worst_vs_ref(&a.w, x, yk, n, rows, cols);
    char what[128];
    snprintf(what, sizeof what, "%s gemm_bf16 4-bit g%lld %s [%lld x %lld] n=%lld vs ref / sum|wx|",
             cpu_isa_name(k->isa), (long long)group, dtype_name(st), (long long)rows,
             (long long)cols, (long long)n);
    report(what, worst, 2e-5);
    /* rows [16, n) on their own: the same bits */
    if (n > 16) {
        const brows tail = {.n = n - 16, .cols = cols, .t = brows_row(&xb, 16)};
        float *yt = malloc(sizeof(float) * (size_t)((n - 16) * rows));
        k->gemm_bf16(yt, rows, p, 0, p->tiles, &tail, scratch);
        CHECK(!memcmp(yt, yk + 16 * rows, sizeof(float) * (size_t)((n - 16) * rows)),
              "%s gemm_bf16 n=%lld: rows 16.. alone differ from the same rows in one call",
              cpu_isa_name(k->isa), (long long)n);
        free(yt);
    }
    free(yk), free(x), free(xb.t), free(scratch);
    arena_free(&mem);
    free_affine(&a);
}

/* ==== the other packed layouts: bit planes, 2- and 3-bit codes, zero points, two-level
 * scales, codebooks, 8-bit scales ==== */

static const int8_t iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};
static const int8_t fp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* Each layout as a matview describes it: scales one-level (F16, BF16, E8M0, F8E4M3) or
 * two-level under F16 factors per 256 columns (U8, I8, U4LO: the scale and min nibbles of one
 * byte). */
static const struct variant {
    const char *name;
    int bits;
    int64_t group;
    dtype st;
    bool biased;
    int zero;
    const int8_t *lut;
    int lut_shift;
} variants[] = {
    {"5-bit g32 biases", 5, 32, DTYPE_F16, true, 0, NULL, 0},
    {"6-bit g64 bf16 biases", 6, 64, DTYPE_BF16, true, 0, NULL, 0},
    {"5-bit g32 zero 16", 5, 32, DTYPE_F16, false, 16, NULL, 0},
    {"4-bit K (two-level, mins)", 4, 32, DTYPE_U8, true, 0, NULL, 0},
    {"5-bit K (two-level)", 5, 32, DTYPE_U8, true, 0, NULL, 0},
    {"IQ4_NL (codebook)", 4, 32, DTYPE_F16, false, 0, iq4_values, 0},
    {"IQ4_XS (codebook, K)", 4, 32, DTYPE_I8, false, 0, iq4_values, 0},
    {"6-bit K g16 zero 32", 6, 16, DTYPE_I8, false, 32, NULL, 0},
    {"Q2_K (2-bit K g16, u4 scales and mins)", 2, 16, DTYPE_U4LO, true, 0, NULL, 0},
    {"Q3_K (3-bit K g16, zero 4)", 3, 16, DTYPE_I8, false, 4, NULL, 0},
    {"2-bit g32 bf16 biases", 2, 32, DTYPE_BF16, true, 0, NULL, 0},
    {"2-bit g64 biases", 2, 64, DTYPE_F16, true, 0, NULL, 0},
    {"2-bit g128 biases", 2, 128, DTYPE_F16, true, 0, NULL, 0},
    {"3-bit g32 biases", 3, 32, DTYPE_F16, true, 0, NULL, 0},
    {"3-bit g64 bf16 biases", 3, 64, DTYPE_BF16, true, 0, NULL, 0},
    {"3-bit g128 biases", 3, 128, DTYPE_F16, true, 0, NULL, 0},
    {"mxfp4 (e2m1 codebook, e8m0 g32)", 4, 32, DTYPE_E8M0, false, 0, fp4_values, 1},
    {"nvfp4 (e2m1 codebook, e4m3 g16)", 4, 16, DTYPE_F8E4M3, false, 0, fp4_values, 1},
    {"8-bit g32 zero 128", 8, 32, DTYPE_F16, false, 128, NULL, 0},
};
#define V_COUNT ((int)(sizeof variants / sizeof variants[0]))

typedef struct rand_variant {
    matview w;
    uint8_t *codes, *scales, *biases;
    uint16_t *supers, *super_m;
} rand_variant;

/* A random 8-bit scale: e8m0 mostly 2^-9 .. 2^0, now and then 2^-127 (the subnormal one) or
 * 2^-126; e4m3 mostly 2^-3 .. 2^1, now and then a subnormal or a negative one. */
static uint8_t rand_scale8(dtype st) {
    const float u = rand_uniform(&rng) * 0.5f + 0.5f, r = rand_uniform(&rng) * 0.5f + 0.5f;
    if (st == DTYPE_E8M0) return r < 0.05f ? (uint8_t)(r < 0.025f ? 0 : 1) : (uint8_t)(118 + 9 * u);
    if (r < 0.05f) return (uint8_t)(1 + 6 * u); /* subnormal: m * 2^-9 */
    return (uint8_t)((r > 0.95f ? 0x80 : 0) | (0x20 + (int)(32 * u)));
}

static rand_variant make_variant(const struct variant *vs, int64_t rows, int64_t cols) {
    rand_variant v = {0};
    const int bits = vs->bits;
    const int64_t group = vs->group, groups = cols / group;
    const bool two = vs->st == DTYPE_U8 || vs->st == DTYPE_I8 || vs->st == DTYPE_U4LO,
               bytes = vs->st == DTYPE_E8M0 || vs->st == DTYPE_F8E4M3;
    v.codes = calloc((size_t)(rows * cols * bits / 8 + 4), 1);
    for (int64_t i = 0; i < rows * cols; i++) {
        const uint32_t q =
            (uint32_t)((rand_uniform(&rng) * 0.5f + 0.5f) * (float)((1 << bits) - 1) + 0.5f);
        for (int k = 0; k < bits; k++)
            v.codes[(i * bits + k) / 8] |= (uint8_t)(((q >> k) & 1u) << ((i * bits + k) % 8));
    }
    v.scales = malloc((size_t)(rows * groups) * 2);
    v.biases = malloc((size_t)(rows * groups) * 2);
    for (int64_t i = 0; i < rows * groups; i++) {
        if (vs->st == DTYPE_U4LO) { /* a 4-bit scale and min in one byte */
            v.scales[i] = (uint8_t)((uint8_t)(rand_uniform(&rng) * 7.5f + 8.0f) |
                                    (uint8_t)(rand_uniform(&rng) * 7.5f + 8.0f) << 4);
            continue;
        }
        if (two) { /* small integers: u8 scales and mins (K), or signed i8 scales */
            v.scales[i] = vs->st == DTYPE_I8
                              ? (uint8_t)(int8_t)(rand_uniform(&rng) * 31.0f)
                              : (uint8_t)(1 + (rand_uniform(&rng) * 0.5f + 0.5f) * 62.0f);
            v.biases[i] = (uint8_t)((rand_uniform(&rng) * 0.5f + 0.5f) * 63.0f);
            continue;
        }
        if (bytes) {
            v.scales[i] = rand_scale8(vs->st);
            continue;
        }
        const float sc = 0.01f + 0.02f * fabsf(rand_uniform(&rng));
        store_scale(vs->st, v.scales, i, sc);
        store_scale(vs->st, v.biases, i,
                    -sc * (float)(1 << (bits - 1)) * (1.0f + 0.1f * rand_uniform(&rng)));
    }
    v.w = (matview){.rows = rows,
                    .cols = cols,
                    .type = DTYPE_U32,
                    .data = v.codes,
                    .quant_bits = bits,
                    .group = group,
                    .scale_type = vs->st,
                    .scales = v.scales,
                    .biases = !vs->biased            ? NULL
                              : vs->st == DTYPE_U4LO ? v.scales
                                                     : v.biases,
                    .zero = vs->zero,
                    .lut = vs->lut,
                    .lut_shift = vs->lut_shift};
    if (two) {
        const int64_t supers = rows * (cols / 256);
        v.supers = malloc(sizeof(uint16_t) * (size_t)supers);
        v.super_m = malloc(sizeof(uint16_t) * (size_t)supers);
        for (int64_t i = 0; i < supers; i++) {
            v.supers[i] = f32_to_f16(0.0005f + 0.0005f * fabsf(rand_uniform(&rng)));
            v.super_m[i] = f32_to_f16(-0.001f * fabsf(rand_uniform(&rng)));
        }
        v.w.super = 256;
        v.w.super_scales = v.supers;
        v.w.super_biases = vs->biased ? v.super_m : NULL;
    }
    return v;
}

/* Layouts no GGUF or MLX file holds, which the packer leaves to the row-at-a-time path (the
 * kernels are instantiated for the others only): one-level scales in groups of 16, two-level
 * groups of 16 for 4-bit codes or of 32 for 2-bit ones, fp4 scales over a wide codebook. */
static void test_pack_refusals(void) {
    static const struct variant refused[] = {
        {"4-bit g16 biases", 4, 16, DTYPE_F16, true, 0, NULL, 0},
        {"4-bit K g16", 4, 16, DTYPE_U8, true, 0, NULL, 0},
        {"2-bit K g32", 2, 32, DTYPE_U8, true, 0, NULL, 0},
        {"e8m0 scales over IQ4's codebook", 4, 32, DTYPE_E8M0, false, 0, iq4_values, 0},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        rand_variant v = make_variant(&refused[i], 16, 256);
        CHECK(!pack_supported(&v.w), "pack_supported refuses %s", refused[i].name);
        free(v.codes), free(v.scales), free(v.biases), free(v.supers), free(v.super_m);
    }
}

/* The ISA's product against the generic one, and the generic one against the float
 * reference, with value + residual pairs (as the backend runs them). */
static void test_gemm_variant(const cpu_kernels *k, int kind, int64_t rows, int64_t cols,
                              int64_t n) {
    rand_variant v = make_variant(&variants[kind], rows, cols);
    arena mem = {0};
    CHECK(pack_supported(&v.w), "%s: pack_supported", variants[kind].name);
    const packed_mat *p = pack_matrix(&v.w, &mem);
    if (!CHECK(p != NULL, "%s: pack_matrix", variants[kind].name)) return;
    float *x = rand_vec(n * cols, 1.0f);
    qrows pg = quantize_pairs(&cpu_kernels_generic, x, n, cols);
    float *yk = malloc(sizeof(float) * (size_t)(n * rows)),
          *yg = malloc(sizeof(float) * (size_t)(n * rows)),
          *yr = malloc(sizeof(float) * (size_t)(n * rows)),
          *wrow = malloc(sizeof(float) * (size_t)cols),
          *prow = malloc(sizeof(float) * (size_t)cols);
    for (int64_t i = 0; i < n * rows; i++) yk[i] = yg[i] = NAN;
    k->gemm_q(yk, rows, p, 0, p->tiles, &pg);
    cpu_kernels_generic.gemm_q(yg, rows, p, 0, p->tiles, &pg);
    ref_matmul(yr, &v.w, x, n, 0, rows, wrow);
    double dk = 0, dr = 0, mx = 0, drow = 0;
    for (int64_t i = 0; i < n * rows; i++) {
        dk = fmax(dk, isnan(yk[i]) ? INFINITY : fabs((double)yk[i] - yg[i]));
        dr = fmax(dr, fabs((double)yg[i] - yr[i]));
        mx = fmax(mx, fabs(yr[i]));
    }
    /* single int8 rows (CELER_ACT=int8): the ISA's product against the generic one */
    qrows q1 = quantize_rows(&cpu_kernels_generic, x, n, cols);
    float *y1 = malloc(sizeof(float) * (size_t)(n * rows));
    for (int64_t i = 0; i < n * rows; i++) y1[i] = yg[i] = NAN;
    k->gemm_q(y1, rows, p, 0, p->tiles, &q1);
    cpu_kernels_generic.gemm_q(yg, rows, p, 0, p->tiles, &q1);
    double d1 = 0;
    for (int64_t i = 0; i < n * rows; i++)
        d1 = fmax(d1, isnan(y1[i]) ? INFINITY : fabs((double)y1[i] - yg[i]));
    free(y1);
    free_qrows(&q1);
    for (int64_t r = 0; r < rows; r++) { /* packed rows (embedding lookups) */
        matview_row(wrow, &v.w, r);
        packed_row(prow, p, r);
        for (int64_t c = 0; c < cols; c++)
            drow = fmax(drow, fabs((double)wrow[c] - prow[c]) / fmax(fabs(wrow[c]), 1e-3));
    }
    char what[160];
    snprintf(what, sizeof what, "%s gemm_q %s [%lld x %lld] n=%lld vs generic",
             cpu_isa_name(k->isa), variants[kind].name, (long long)rows, (long long)cols,
             (long long)n);
    report(what, dk, 1e-5 * fmax(mx, 1.0));
    snprintf(what, sizeof what, "%s gemm_q %s [%lld x %lld] n=%lld int8 rows vs generic",
             cpu_isa_name(k->isa), variants[kind].name, (long long)rows, (long long)cols,
             (long long)n);
    report(what, d1, 1e-5 * fmax(mx, 1.0));
    if (k->isa == CPU_ISA_GENERIC) {
        snprintf(what, sizeof what, "generic gemm_q %s [%lld x %lld] n=%lld vs ref",
                 variants[kind].name, (long long)rows, (long long)cols, (long long)n);
        report(what, dr, 2e-4 * fmax(mx, 1.0));
        snprintf(what, sizeof what, "packed rows %s vs matview rows (relative)",
                 variants[kind].name);
        report(what, drow, 1e-6);
    }
    free(yk), free(yg), free(yr), free(wrow), free(prow), free(x);
    free_qrows(&pg);
    arena_free(&mem);
    free(v.codes), free(v.scales), free(v.biases), free(v.supers), free(v.super_m);
}

/* The bf16 tile product on the other layouts: every row within 2e-5 of sum |w * x| of the
 * float reference (6-bit codes under two-level scales keep about 16 of their bits). */
static void test_bf16_variant(const cpu_kernels *k, int kind, int64_t rows, int64_t cols,
                              int64_t n) {
    rand_variant v = make_variant(&variants[kind], rows, cols);
    arena mem = {0};
    const packed_mat *p = pack_matrix(&v.w, &mem);
    if (!CHECK(p != NULL, "%s: pack_matrix", variants[kind].name)) return;
    float *x = rand_vec(n * cols, 1.0f);
    brows xb = split_rows(k, x, n, cols);
    void *scratch = aligned_alloc(64, BF16_SCRATCH);
    float *yk = malloc(sizeof(float) * (size_t)(n * rows));
    k->gemm_bf16(yk, rows, p, 0, p->tiles, &xb, scratch);
    const double worst = worst_vs_ref(&v.w, x, yk, n, rows, cols);
    char what[160];
    snprintf(what, sizeof what, "%s gemm_bf16 %s [%lld x %lld] n=%lld vs ref / sum|wx|",
             cpu_isa_name(k->isa), variants[kind].name, (long long)rows, (long long)cols,
             (long long)n);
    report(what, worst, 2e-5);
    free(yk), free(x), free(xb.t), free(scratch);
    arena_free(&mem);
    free(v.codes), free(v.scales), free(v.biases), free(v.supers), free(v.super_m);
}

/* ==== dense product and attention pieces ==== */

static void test_dense(const cpu_kernels *k, dtype t, int64_t rows, int64_t cols, int64_t n) {
    float *wf = rand_vec(rows * cols, 1.0f), *x = rand_vec(n * cols, 1.0f);
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)(rows * cols));
    for (int64_t i = 0; i < rows * cols; i++)
        h[i] = t == DTYPE_F16 ? f32_to_f16(wf[i]) : f32_to_bf16(wf[i]);
    const matview w = {
        .rows = rows, .cols = cols, .type = t, .data = t == DTYPE_F32 ? (void *)wf : (void *)h};
    float *yk = malloc(sizeof(float) * (size_t)(n * rows)),
          *yr = malloc(sizeof(float) * (size_t)(n * rows));
    float *wrow = malloc(sizeof(float) * (size_t)cols);
    k->gemm_dense(yk, rows, &w, 0, rows, x, n);
    ref_matmul(yr, &w, x, n, 0, rows, wrow);
    double d = 0;
    for (int64_t i = 0; i < n * rows; i++) d = fmax(d, fabs((double)yk[i] - yr[i]));
    char what[128];
    snprintf(what, sizeof what, "%s gemm_dense %s [%lld x %lld] n=%lld", cpu_isa_name(k->isa),
             dtype_name(t), (long long)rows, (long long)cols, (long long)n);
    report(what, d, 1e-5 * sqrt((double)cols));
    free(wf), free(x), free(h), free(yk), free(yr), free(wrow);
}

static void test_pieces(const cpu_kernels *k) {
    const int64_t hd = 72, nk = 13, ld = 100, nq = 7;
    float *q = rand_vec(nq * ld, 1.0f), *kv = rand_vec(nk * ld, 1.0f), *p = rand_vec(nk, 1.0f);
    float *kt = rand_vec(hd * ATT_BLOCK, 1.0f), s[7 * ATT_BLOCK], o[72], o_ref[72];
    double d = 0;
    k->attn_scores(s, q, ld, nq, kt, hd);
    for (int64_t i = 0; i < nq; i++)
        for (int64_t j = 0; j < ATT_BLOCK; j++) {
            double acc = 0;
            for (int64_t c = 0; c < hd; c++) acc += (double)q[i * ld + c] * kt[c * ATT_BLOCK + j];
            d = fmax(d, fabs(acc - s[i * ATT_BLOCK + j]));
        }
    report("attn_scores hd=72 nq=7", d, 1e-5);
    free(kt);
    /* probabilities of nq vectors times a block of values (rows ld apart), into outputs ld apart */
    float *pv = rand_vec(nq * ATT_BLOCK, 1.0f), *vb = rand_vec(ATT_BLOCK * ld, 1.0f),
          *ob = rand_vec(nq * ld, 1.0f);
    float *ob0 = malloc(sizeof(float) * (size_t)(nq * ld)), corr[7];
    memcpy(ob0, ob, sizeof(float) * (size_t)(nq * ld));
    for (int i = 0; i < nq; i++) corr[i] = 0.25f * (float)i;
    k->attn_pv(ob, ld, corr, pv, nq, vb, ld, hd);
    d = 0;
    for (int64_t i = 0; i < nq; i++)
        for (int64_t c = 0; c < hd; c++) {
            double acc = (double)ob0[i * ld + c] * corr[i];
            for (int j = 0; j < ATT_BLOCK; j++)
                acc += (double)pv[i * ATT_BLOCK + j] * vb[j * ld + c];
            d = fmax(d, fabs(acc - ob[i * ld + c]));
        }
    report("attn_pv hd=72 nq=7", d, 1e-5);
    free(pv), free(vb), free(ob), free(ob0);
    (void)o, (void)o_ref, (void)p;
    float e[37], e0[37];
    for (int i = 0; i < 37; i++) e[i] = e0[i] = rand_uniform(&rng) * 40.0f;
    const float sum = k->exp_sum(e, 37, 3.0f);
    double dsum = 0, de = 0;
    for (int i = 0; i < 37; i++) {
        const double ex = exp((double)e0[i] - 3.0);
        dsum += ex;
        de = fmax(de, fabs(ex - e[i]) / ex);
    }
    report("exp_sum n=37 (relative)", fmax(de, fabs(dsum - sum) / dsum), 2e-6);
    float g[45], u[45], y[45];
    for (int i = 0; i < 45; i++) g[i] = rand_uniform(&rng) * 20.0f, u[i] = rand_uniform(&rng);
    k->glu(y, g, u, 45, BACKEND_ACT_SILU);
    d = 0;
    for (int i = 0; i < 45; i++) d = fmax(d, fabs((double)ref_silu(g[i]) * u[i] - y[i]));
    report("swiglu n=45", d, 1e-5);
    /* fp16 widening: exact, over normal, subnormal, zero, inf and odd lengths */
    uint16_t hx[37];
    float hy[37];
    for (int i = 0; i < 37; i++) hx[i] = (uint16_t)(i * 1777u + (i % 3 ? 0x3c00u : 0x0003u));
    hx[0] = 0x7c00, hx[1] = 0x8000;
    k->f16_to_f32(hy, hx, 37);
    d = 0;
    for (int i = 0; i < 37; i++)
        d = fmax(d, fabs((double)f16_to_f32(hx[i]) - hy[i]) * (isinf(hy[i]) ? 0 : 1));
    CHECK(isinf(hy[0]) && hy[1] == 0.0f, "f16_to_f32: inf and -0 not kept");
    report("f16_to_f32 n=37 vs half.h", d, 0.0);
    free(q), free(kv), free(p);
}

/* ==== LayerNorm and activations ==== */

static void test_layernorm_entry(const cpu_kernels *k, int64_t d, bool bias) {
    float *x = rand_vec(d, 2.0f), *w = rand_vec(d, 1.5f), *b = bias ? rand_vec(d, 0.5f) : NULL;
    for (int64_t i = 0; i < d; i++) x[i] += 3.0f;
    float *y = malloc(sizeof(float) * (size_t)d), *yr = malloc(sizeof(float) * (size_t)d);
    k->layernorm(y, x, w, b, d, 1e-5f);
    ref_layernorm(yr, x, w, b, d, 1e-5f);
    char what[96];
    snprintf(what, sizeof what, "layernorm d=%lld %s (relative)", (long long)d,
             bias ? "with bias" : "no bias");
    report(what, max_abs_diff(y, yr, d) / max_abs(yr, d), 1e-5);
    k->layernorm(x, x, w, b, d, 1e-5f);
    CHECK(!memcmp(x, y, sizeof(float) * (size_t)d), "layernorm entry in place equals out of place");
    free(x), free(w), free(b), free(y), free(yr);
}

/* The table's activation on a grid over [-12, 12], random points and |x| up to 1e4,
 * against ref_act: the max abs difference on |x| <= 10, and |diff| / max(1, |y|) over all. */
static void test_act_entry(const cpu_kernels *k, backend_act kind, const char *name) {
    enum { N = 2400 + 403 + 14 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N),
          *yr = malloc(sizeof(float) * N);
    int64_t m = 0;
    for (int i = 0; i < 2400; i++) x[m++] = -12.0f + 24.0f * (float)i / 2399.0f;
    for (int i = 0; i < 403; i++) x[m++] = rand_uniform(&rng) * 6.0f;
    const float big[14] = {-1e4f, -3e3f, -100.0f, -30.0f, -15.0f, -0.0f,  1e-30f,
                           15.0f, 30.0f, 100.0f,  3e3f,   1e4f,   -1e-7f, 0.5f};
    for (int i = 0; i < 14; i++) x[m++] = big[i];
    k->act(y, x, m, kind);
    ref_act(yr, x, m, kind);
    double abs10 = 0, rel = 0;
    bool finite = true;
    for (int64_t i = 0; i < m; i++) {
        const double d = fabs((double)y[i] - yr[i]);
        if (fabsf(x[i]) <= 10.0f) abs10 = fmax(abs10, d);
        rel = fmax(rel, d / fmax(1.0, fabs(yr[i])));
        finite = finite && isfinite(y[i]);
    }
    CHECK(finite, "%s %s: non-finite output for a finite input", cpu_isa_name(k->isa), name);
    char what[96];
    snprintf(what, sizeof what, "%s n=%lld, |x| <= 10 (absolute)", name, (long long)m);
    report(what, abs10, 1e-6);
    snprintf(what, sizeof what, "%s n=%lld, |x| <= 1e4 (relative)", name, (long long)m);
    report(what, rel, 1e-6);
    k->act(x, x, m, kind);
    CHECK(!memcmp(x, y, sizeof(float) * (size_t)m), "%s entry in place equals out of place", name);
    /* gating a second input (the tail of m % 8 included), against ref_glu */
    float *g = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N);
    for (int64_t i = 0; i < m; i++)
        g[i] = rand_uniform(&rng) * 12.0f, u[i] = rand_uniform(&rng) * 2.0f;
    k->glu(y, g, u, m, kind);
    ref_glu(yr, g, u, m, kind);
    rel = 0;
    for (int64_t i = 0; i < m; i++)
        rel = fmax(rel, fabs((double)y[i] - yr[i]) / fmax(1.0, fabs(yr[i])));
    snprintf(what, sizeof what, "%s gating n=%lld (relative)", name, (long long)m);
    report(what, rel, 2e-6);
    free(x), free(y), free(yr), free(g), free(u);
}

/* Soft-capping against ref_softcap (tanh in double) at Gemma 2's caps, over scores and
 * logits from tiny to far past the cap, the tail of n % 8 included: absolute difference,
 * since what reads a capped value is a softmax. */
static void test_softcap_entry(const cpu_kernels *k) {
    enum { N = 2003 };
    const float caps[2] = {50.0f, 30.0f};
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    for (int c = 0; c < 2; c++) {
        for (int i = 0; i < N; i++) {
            const float u = rand_uniform(&rng);
            x[i] = i % 3 == 0 ? u * 1e-3f : i % 3 == 1 ? u * 3.0f * caps[c] : u * 1e4f;
        }
        x[0] = 0.0f, x[1] = -0.0f, x[2] = 1e-30f, x[3] = -1e30f, x[4] = 3e38f;
        memcpy(y, x, sizeof(float) * N);
        k->softcap(y, caps[c], N);
        ref_softcap(x, caps[c], N);
        double d = 0;
        bool finite = true;
        for (int i = 0; i < N; i++) {
            d = fmax(d, fabs((double)y[i] - x[i]));
            finite = finite && isfinite(y[i]) && fabsf(y[i]) <= caps[c];
        }
        CHECK(finite, "%s softcap %g: an output is not finite or exceeds the cap",
              cpu_isa_name(k->isa), caps[c]);
        char what[96];
        snprintf(what, sizeof what, "softcap %g n=%d (absolute)", caps[c], N);
        report(what, d, 1e-6 * caps[c]);
    }
    free(x), free(y);
}

static void test_norm_act(const cpu_kernels *k) {
    test_softcap_entry(k);
    test_layernorm_entry(k, 77, false);
    test_layernorm_entry(k, 77, true);
    test_layernorm_entry(k, 1030, true);
    test_act_entry(k, BACKEND_ACT_SILU, "silu");
    test_act_entry(k, BACKEND_ACT_GELU_ERF, "gelu erf");
    test_act_entry(k, BACKEND_ACT_GELU_TANH, "gelu tanh");
    test_act_entry(k, BACKEND_ACT_QUICK_GELU, "quick gelu");
}

/* ==== whole backend ops against the reference backend ==== */

/* kv_f16: both backends keep the KV pools in fp16 (each reads back the same rounded
 * values, so the bound stays that of fp32 pools). */
static void test_backend_ops(cpu_isa isa, bool kv_f16) {
    const int64_t h = 6, hk = 2, hd = 40, bs = 16, n_ctx = 80, n = 37, kvd = hk * hd;
    const backend_cpu_sizes sz = {.max_rows = n, .max_cols = 256, .max_keys = n_ctx, .hd = hd};
    backend *fast = backend_cpu_create(isa, 3, &sz, kv_f16),
            *ref = backend_ref_create(3, 256, n_ctx, kv_f16);
    /* attention: two sequences' rows, 5 cache blocks each in shuffled order */
    const int32_t blocks_a[] = {3, 0, 7, 5, 9}, blocks_b[] = {1, 2, 4, 6, 8};
    /* each backend stores the same keys and values in its own block layout */
    float *kin = rand_vec(10 * bs * kvd, 1.0f), *vin = rand_vec(10 * bs * kvd, 1.0f);
    float *kpool = calloc((size_t)(10 * bs * kvd), sizeof(float)),
          *vpool = calloc((size_t)(10 * bs * kvd), sizeof(float));
    float *kpool_r = calloc((size_t)(10 * bs * kvd), sizeof(float)),
          *vpool_r = calloc((size_t)(10 * bs * kvd), sizeof(float));
    int32_t slots[160];
    for (int i = 0; i < 160; i++) slots[i] = i;
    fast->ops->kv_store(fast, kpool, vpool, kin, vin, slots, 160, kvd);
    ref->ops->kv_store(ref, kpool_r, vpool_r, kin, vin, slots, 160, kvd);
    float *q = rand_vec(n * h * hd, 2.0f), *of = malloc(sizeof(float) * (size_t)(n * h * hd));
    float *orf = malloc(sizeof(float) * (size_t)(n * h * hd));
    int32_t pos[37], seq[37], tables[10];
    memcpy(tables, blocks_a, sizeof blocks_a);
    memcpy(tables + 5, blocks_b, sizeof blocks_b);
    for (int64_t r = 0; r < n;
         r++) { /* rows 0..29: prefill of a at 40..69; the rest decode rows of b */
        pos[r] = r < 30 ? (int32_t)(40 + r) : (int32_t)(7 * (r - 29));
        seq[r] = r < 30 ? 0 : 1;
    }
    /* rows 10..22 of a's prefill: an image block, each row seeing up to the block's end */
    int32_t limit[37];
    for (int64_t r = 0; r < n; r++) limit[r] = r >= 10 && r < 23 ? pos[22] : pos[r];
    const int64_t windows[] = {0, 9, 0, 9, 0, 9};
    const float caps[] = {0.0f, 0.0f, 1.5f, 1.5f, 0.0f, 1.5f};
    for (int wi = 0; wi < 6; wi++) {
        attn_rows ar = {.n = n,
                        .pos = pos,
                        .limit = wi >= 4 ? limit : NULL,
                        .seq = seq,
                        .tables = tables,
                        .table_cols = 5,
                        .block_size = bs,
                        .window = windows[wi],
                        .h = h,
                        .hk = hk,
                        .hd = hd,
                        .scale = 0.158f,
                        .softcap = caps[wi]};
        fast->ops->attention(fast, of, q, kpool, vpool, &ar);
        ref->ops->attention(ref, orf, q, kpool_r, vpool_r, &ar);
        double d = 0;
        for (int64_t i = 0; i < n * h * hd; i++) d = fmax(d, fabs((double)of[i] - orf[i]));
        char what[96];
        snprintf(what, sizeof what,
                 "%s attention GQA 6/2 paged, %s cache, window %lld, softcap %g%s",
                 cpu_isa_name(isa), kv_f16 ? "fp16" : "fp32", (long long)windows[wi],
                 (double)caps[wi], wi >= 4 ? ", an image block" : "");
        report(what, d, 2e-5);
        if (wi >= 4) { /* the block's rows read causally must be seen */
            ar.limit = NULL;
            ref->ops->attention(ref, orf, q, kpool_r, vpool_r, &ar);
            CHECK(max_abs_diff(of, orf, n * h * hd) > 1e-3,
                  "%s attention: the image block's limits change the output", cpu_isa_name(isa));
        }
    }
    /* soft-capping must change the output: the test sees it applied */
    {
        attn_rows ar = {.n = n,
                        .pos = pos,
                        .seq = seq,
                        .tables = tables,
                        .table_cols = 5,
                        .block_size = bs,
                        .h = h,
                        .hk = hk,
                        .hd = hd,
                        .scale = 0.158f,
                        .softcap = 1.5f};
        fast->ops->attention(fast, of, q, kpool, vpool, &ar);
        ar.softcap = 0.0f;
        fast->ops->attention(fast, orf, q, kpool, vpool, &ar);
        CHECK(max_abs_diff(of, orf, n * h * hd) > 1e-2,
              "%s attention: softcap 1.5 changes the output", cpu_isa_name(isa));
    }
    /* RoPE (table against direct) and the matmul op with a packed matrix */
    float inv_freq[20];
    for (int i = 0; i < 20; i++) inv_freq[i] = powf(10000.0f, -(float)(2 * i) / (float)hd);
    /* six kinds of RoPE take turns (the backend keeps a table per kind, by the parameters'
     * address, as a model's live as long as it): full and partial, two scales */
    rope_params rps[6];
    for (int trad = 0; trad < 6; trad++) {
        const int64_t dims = trad < 2 ? 0 : trad < 4 ? 24 : 0;
        rps[trad] = (rope_params){.inv_freq = inv_freq,
                                  .dims = dims,
                                  .mscale = trad < 4 ? 1.1f : 0.9f,
                                  .traditional = trad % 2};
        const rope_params rp = rps[trad];
        float *x1 = rand_vec(n * h * hd, 1.0f), *x2 = malloc(sizeof(float) * (size_t)(n * h * hd));
        memcpy(x2, x1, sizeof(float) * (size_t)(n * h * hd));
        fast->ops->rope(fast, x1, pos, n, h, hd, &rps[trad]);
        ref->ops->rope(ref, x2, pos, n, h, hd, &rp);
        double d = 0;
        for (int64_t i = 0; i < n * h * hd; i++) d = fmax(d, fabs((double)x1[i] - x2[i]));
        char what[96];
        snprintf(what, sizeof what, "rope %s, rotating %lld of %lld (op)",
                 trad % 2 ? "traditional" : "half-split", (long long)(dims ? dims : hd),
                 (long long)hd);
        report(what, d, 0.0);
        free(x1), free(x2);
    }
    /* soft-capping and the embedding scale */
    {
        float *y1 = rand_vec(n * 100, 20.0f), *y2 = malloc(sizeof(float) * (size_t)(n * 100));
        memcpy(y2, y1, sizeof(float) * (size_t)(n * 100));
        fast->ops->softcap(fast, y1, 30.0f, n * 100);
        ref->ops->softcap(ref, y2, 30.0f, n * 100);
        report("softcap 30 (op) vs ref", max_abs_diff(y1, y2, n * 100), 1e-5);
        free(y1), free(y2);
    }
    /* the class's prepared set: the F16 matrix packed, the inexact F32 one left as it is */
    rand_affine a = make_affine(4, 32, DTYPE_F16, 100, 256),
                b = make_affine(4, 32, DTYPE_F32, 100, 256);
    ((float *)b.scales)[5] = 1.0f + 1e-7f;
    a.w.id = 1, b.w.id = 2;
    matview *mats[] = {&a.w, &b.w};
    const weight_set ws = {.mats = mats, .n_mats = 2};
    cpu_weights *cw = NULL;
    CHECK(pack_weights(&ws, &backend_cpu_class, 2, &cw, NULL) == CELER_OK && cw->mats[0] &&
              !cw->mats[1],
          "pack_weights packs the F16 matrix and leaves the inexact F32 one");
    fast->weights = &cw->base;
    float *x = rand_vec(n * 256, 1.0f), *yf = malloc(sizeof(float) * (size_t)(n * 100));
    float *yr = malloc(sizeof(float) * (size_t)(n * 100));
    fast->ops->matmul(fast, yf, &a.w, x, n);
    ref->ops->matmul(ref, yr, &a.w, x, n);
    double d = 0, mx = 0;
    for (int64_t i = 0; i < n * 100; i++)
        d = fmax(d, fabs((double)yf[i] - yr[i])), mx = fmax(mx, fabs(yr[i]));
    report("matmul op 4-bit g32 [100 x 256] n=37 vs ref", d, 2e-4 * mx);
    /* an unpackable matrix takes the row-at-a-time path and matches the reference exactly */
    fast->ops->matmul(fast, yf, &b.w, x, n);
    ref->ops->matmul(ref, yr, &b.w, x, n);
    d = 0;
    for (int64_t i = 0; i < n * 100; i++) d = fmax(d, fabs((double)yf[i] - yr[i]));
    report("matmul op, unpackable F32 scales, vs ref", d, 1e-4);
    /* embedding rows times a scale; a row with a negative id is left as it was */
    {
        const int32_t ids[4] = {3, -1, 99, 0};
        float *e1 = rand_vec(4 * 256, 1.0f), *e2 = malloc(sizeof(float) * 4 * 256);
        memcpy(e2, e1, sizeof(float) * 4 * 256);
        fast->ops->embed(fast, e1, &a.w, ids, 4, 8.0f);
        ref->ops->embed(ref, e2, &a.w, ids, 4, 8.0f);
        report("embed op x 8.0 vs ref", max_abs_diff(e1, e2, 4 * 256), 1e-5);
        float row[256];
        ref_mat_row(row, &a.w, 99);
        double dr = 0;
        for (int c = 0; c < 256; c++) dr = fmax(dr, fabs(8.0 * row[c] - e1[2 * 256 + c]));
        report("embed op row 99 = 8 x the dequantized row", dr, 1e-5);
        free(e1), free(e2);
    }
    free_affine(&b);
    pack_weights_free(cw);
    free_affine(&a);
    free(x), free(yf), free(yr), free(kpool), free(vpool), free(kpool_r), free(vpool_r), free(kin),
        free(vin), free(q), free(of), free(orf);
    backend_destroy(fast);
    backend_destroy(ref);
}

/* attention_full of n rows in segments of seg, fast against reference backend; returns
 * the max difference. */
static double full_diff(backend *fast, backend *ref, int64_t n, int64_t seg, int64_t h, int64_t hk,
                        int64_t hd) {
    const int64_t qd = h * hd, kvd = hk * hd;
    float *q = rand_vec(n * qd, 2.0f), *k = rand_vec(n * kvd, 1.0f), *v = rand_vec(n * kvd, 1.0f);
    float *of = malloc(sizeof(float) * (size_t)(n * qd)),
          *orf = malloc(sizeof(float) * (size_t)(n * qd));
    const float scale = 1.0f / sqrtf((float)hd);
    fast->ops->attention_full(fast, of, q, k, v, n, seg, h, hk, hd, scale);
    ref->ops->attention_full(ref, orf, q, k, v, n, seg, h, hk, hd, scale);
    const double d = max_abs_diff(of, orf, n * qd);
    /* the reference with every segment starting one row later (the last one earlier) must
     * be far off: the test sees a segment boundary */
    if (n / seg > 1) {
        float scores[1024];
        double shifted = 0;
        CHECK(seg <= 1024, "score row");
        for (int64_t t = 0; t < n; t++) {
            const int64_t first = t / seg * seg, lo = first + seg < n ? first + 1 : first - 1;
            ref_attention_full(orf + t * qd, q + t * qd, k + lo * kvd, v + lo * kvd, seg, h, hk, hd,
                               scale, scores);
        }
        shifted = max_abs_diff(of, orf, n * qd);
        CHECK(shifted > 1e-2, "attention_full: segments moved by one row give max diff %g",
              shifted);
    }
    free(q), free(k), free(v), free(of), free(orf);
    return d;
}

/* LayerNorm, activations and full attention through the ops, pool-sized and inline-sized,
 * against the reference backend. The backends' n_ctx (64) is below the 577-row segment of
 * a CLIP ViT-L/14-336 tile, which both must still take. */
static void test_vision_ops(cpu_isa isa) {
    const backend_cpu_sizes sz = {.max_rows = 1154, .max_cols = 1024, .max_keys = 64, .hd = 128};
    backend *fast = backend_cpu_create(isa, 3, &sz, false),
            *ref = backend_ref_create(3, 1024, 64, false);
    const char *name = cpu_isa_name(isa);
    char what[128];
    for (int bias = 0; bias < 2; bias++) {
        const int64_t n = 37, d = 1030;
        float *x = rand_vec(n * d, 2.0f), *w = rand_vec(d, 1.5f), *b = rand_vec(d, 0.5f);
        float *yf = malloc(sizeof(float) * (size_t)(n * d)),
              *yr = malloc(sizeof(float) * (size_t)(n * d));
        fast->ops->layernorm(fast, yf, x, w, bias ? b : NULL, n, d, 1e-6f);
        ref->ops->layernorm(ref, yr, x, w, bias ? b : NULL, n, d, 1e-6f);
        snprintf(what, sizeof what, "%s layernorm op [37 x 1030] %s (relative)", name,
                 bias ? "bias" : "no bias");
        report(what, max_abs_diff(yf, yr, n * d) / max_abs(yr, n * d), 1e-5);
        free(x), free(w), free(b), free(yf), free(yr);
    }
    const backend_act kinds[] = {BACKEND_ACT_GELU_ERF, BACKEND_ACT_GELU_TANH,
                                 BACKEND_ACT_QUICK_GELU};
    const char *const kind_names[] = {"gelu erf", "gelu tanh", "quick gelu"};
    const int64_t ms[] = {13, 37 * 1031};
    for (int a = 0; a < 3; a++)
        for (int mi = 0; mi < 2; mi++) {
            const int64_t m = ms[mi];
            float *x = rand_vec(m, 8.0f), *yf = malloc(sizeof(float) * (size_t)m);
            float *yr = malloc(sizeof(float) * (size_t)m);
            fast->ops->act(fast, yf, x, m, kinds[a]);
            ref->ops->act(ref, yr, x, m, kinds[a]);
            double rel = 0;
            for (int64_t i = 0; i < m; i++)
                rel = fmax(rel, fabs((double)yf[i] - yr[i]) / fmax(1.0, fabs(yr[i])));
            snprintf(what, sizeof what, "%s act op %s m=%lld (relative)", name, kind_names[a],
                     (long long)m);
            report(what, rel, 1e-5);
            free(x), free(yf), free(yr);
        }
    /* segments: GQA, not multiples of 16, exact multiples, tiny (inline), one long */
    const struct {
        int64_t n, seg, h, hk, hd;
    } cases[] = {
        {3 * 37, 37, 6, 2, 64}, {2 * 50, 50, 4, 4, 80},    {4 * 32, 32, 8, 1, 64},
        {3 * 5, 5, 2, 1, 16},   {2 * 17, 17, 16, 16, 128}, {2 * 577, 577, 4, 4, 64},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const double d =
            full_diff(fast, ref, cases[c].n, cases[c].seg, cases[c].h, cases[c].hk, cases[c].hd);
        snprintf(what, sizeof what, "%s attention_full %lld x %lld rows, heads %lld/%lld, hd %lld",
                 name, (long long)(cases[c].n / cases[c].seg), (long long)cases[c].seg,
                 (long long)cases[c].h, (long long)cases[c].hk, (long long)cases[c].hd);
        report(what, d, 1e-5);
    }
    backend_destroy(fast);
    backend_destroy(ref);
}

int main(void) {
    test_pack_rows();
    test_pack_refusals();
    const cpu_isa isas[] = {CPU_ISA_GENERIC, CPU_ISA_AVX2, CPU_ISA_AVX512, CPU_ISA_AMX};
    for (int i = 0; i < 4; i++) {
        if (!cpu_isa_supported(isas[i])) {
            SKIP("%s: this CPU lacks the instructions", cpu_isa_name(isas[i]));
            continue;
        }
        const cpu_kernels *k = cpu_kernels_for(isas[i]);
        printf("%s:\n", cpu_isa_name(isas[i]));
        const int64_t ns[] = {1, 3, 4, 9, 37, 70};
        for (int j = 0; j < 6; j++) {
            test_gemm_q(k, 4, 32, DTYPE_F16, 45, 96, ns[j]);
            test_gemm_q(k, 8, 64, DTYPE_BF16, 29, 192, ns[j]);
        }
        test_gemm_q(k, 4, 128, DTYPE_F32, 64, 384, 33);
        test_gemm_q(k, 8, 32, DTYPE_F16, 17, 64, 2);
        /* columns over several of the AMX kernel's 64-block chunks, tokens past a tile */
        test_gemm_q(k, 4, 32, DTYPE_F16, 33, 4192, 37);
        test_gemm_q(k, 8, 32, DTYPE_F16, 18, 4192, 35);
        for (int v = 0; v < V_COUNT; v++) {
            test_gemm_variant(k, v, 40, 256, 1); /* decode; a tile of 8 rows */
            test_gemm_variant(k, v, 48, 512, 3);
            test_gemm_variant(k, v, 33, 768, 9);
        }
        for (int v = 0; k->gemm_bf16 && v < V_COUNT; v++) /* layouts of one code plane */
            if (variants[v].bits != 8) test_bf16_variant(k, v, 48, 512, 37);
        if (k->gemm_bf16) {
            const int64_t nb[] = {1, 15, 16, 17, 37, 70};
            for (int j = 0; j < 6; j++) test_gemm_bf16(k, 32, DTYPE_F16, 48, 96, nb[j]);
            test_gemm_bf16(k, 64, DTYPE_BF16, 64, 4160, 33);
            test_gemm_bf16(k, 32, DTYPE_F16, 32, 4192, 21);
            test_gemm_bf16(k, 32, DTYPE_F16, 16 * 37, 544, 19); /* past one set of tiles */
            test_gemm_bf16(k, 128, DTYPE_F32, 16, 384, 20);
        }
        test_dense(k, DTYPE_F32, 13, 77, 5);
        test_dense(k, DTYPE_F16, 16, 64, 3);
        test_dense(k, DTYPE_BF16, 9, 130, 1);
        test_pieces(k);
        test_norm_act(k);
        test_backend_ops(isas[i], false);
        test_backend_ops(isas[i], true);
        test_vision_ops(isas[i]);
    }
    return harness_done("test_cpu_kernels");
}

/*
 * kernels.h - the CPU backend's function table: one per instruction set, chosen once at
 * context creation (cpuid.h). Each kernels_<isa>.c is compiled with its own -m flags and
 * fills a table; an ISA may reuse a narrower ISA's entry where it has nothing better.
 * Every entry is tested against the scalar reference (tests/test_cpu_kernels.c).
 *
 * Shapes follow docs/architecture.md ("Names and shapes"): y rows are tokens (stride ldy), columns
 * are output rows.
 */
#ifndef CELER_BACKEND_CPU_KERNELS_H
#define CELER_BACKEND_CPU_KERNELS_H

/* Positions per KV cache block the CPU attention reads (the engine's block size). */
#define ATT_BLOCK 16

#include "backend/backend.h"
#include "backend/cpu/cpuid.h"
#include "backend/cpu/pack.h"

/* The bf16 product dequantizes BF16_TILES weight tiles by BF16_BLOCKS column blocks at a
 * time (2 KiB of B tiles each), which stay in L2 while every group of 16 rows passes. */
#define BF16_TILES   16
#define BF16_BLOCKS  16
#define BF16_SCRATCH (BF16_TILES * BF16_BLOCKS * 2048 + BF16_TILES * 1024)

/* The shape of a packed layout (pack.h) as the SIMD products take it: code planes, bits of a
 * code plane's fields, bit planes, groups of 16, a codebook, whether a block's products fit
 * int16 sums (one code plane, every value it gives at most 15 in magnitude), and the kind of
 * scales. */
enum { QS_HALF, QS_BYTE, QS_TWO }; /* one-level f16/bf16, one-level e8m0/e4m3, two-level */
typedef struct qshape {
    int planes, lowbits, hibits, g16, lut, s16, scales;
} qshape;

static inline int qshape_scales(const packed_mat *w) {
    return w->super ? QS_TWO : packed_byte_scales(w) ? QS_BYTE : QS_HALF;
}

/* F(shape) with w's shape as a constant, so a product inlined into F is instantiated, its
 * loops unrolled and its scale loads chosen, per layout: the layouts pack_supported takes,
 * which are the ones GGUF and MLX files hold. Fields: planes, lowbits, hibits, g16, lut, s16,
 * scales. */
#define QSHAPE_DISPATCH(w, F)                                                                      \
    do {                                                                                           \
        const int two_ = (w)->super != 0;                                                          \
        if (packed_byte_scales(w)) /* nvfp4, mxfp4 */                                              \
            QSHAPE_PICK((w)->group == 16, ((qshape){1, 4, 0, 1, 1, 1, QS_BYTE}),                   \
                        ((qshape){1, 4, 0, 0, 1, 1, QS_BYTE}), F);                                 \
        else if ((w)->planes == 2) /* 8-bit */                                                     \
            F(((qshape){2, 4, 0, 0, 0, 0, QS_HALF}));                                              \
        else if ((w)->lut) /* IQ4_XS, IQ4_NL */                                                    \
            QSHAPE_PICK(two_, ((qshape){1, 4, 0, 0, 1, 0, QS_TWO}),                                \
                        ((qshape){1, 4, 0, 0, 1, 0, QS_HALF}), F);                                 \
        else if ((w)->lowbits == 2 && (w)->hibits) /* Q3_K, 3-bit */                               \
            QSHAPE_PICK(two_, ((qshape){1, 2, 1, 1, 0, 1, QS_TWO}),                                \
                        ((qshape){1, 2, 1, 0, 0, 1, QS_HALF}), F);                                 \
        else if ((w)->lowbits == 2) /* Q2_K, 2-bit */                                              \
            QSHAPE_PICK(two_, ((qshape){1, 2, 0, 1, 0, 1, QS_TWO}),                                \
                        ((qshape){1, 2, 0, 0, 0, 1, QS_HALF}), F);                                 \
        else if ((w)->hibits == 0) /* Q4_K, 4-bit */                                               \
            QSHAPE_PICK(two_, ((qshape){1, 4, 0, 0, 0, 1, QS_TWO}),                                \
                        ((qshape){1, 4, 0, 0, 0, 1, QS_HALF}), F);                                 \
        else if ((w)->hibits == 1) /* Q5_K, 5-bit */                                               \
            QSHAPE_PICK(two_, ((qshape){1, 4, 1, 0, 0, 0, QS_TWO}),                                \
                        ((qshape){1, 4, 1, 0, 0, 0, QS_HALF}), F);                                 \
        else /* Q6_K, 6-bit */                                                                     \
            QSHAPE_PICK(two_, ((qshape){1, 4, 2, 1, 0, 0, QS_TWO}),                                \
                        ((qshape){1, 4, 2, 0, 0, 0, QS_HALF}), F);                                 \
    } while (0)
#define QSHAPE_PICK(COND, A, B, F)                                                                 \
    do {                                                                                           \
        if (COND)                                                                                  \
            F(A);                                                                                  \
        else                                                                                       \
            F(B);                                                                                  \
    } while (0)

typedef struct cpu_kernels {
    cpu_isa isa;
    /* q[cols], d[cols/QBLOCK], s[cols/QBLOCK] of the row x[cols]; cols % QBLOCK == 0 */
    void (*quantize_row)(int8_t *q, float *d, float *s, const float *x, int64_t cols);
    /* y[t, r] = x[t, :] . W[r, :] for t < x->n and the rows of tiles [t0, t1) */
    void (*gemm_q)(float *y, int64_t ldy, const packed_mat *w, int64_t t0, int64_t t1,
                   const qrows *x);
    /* The bf16 tile product, NULL where the ISA has none. split_bf16 writes row x[cols] into
     * a brows at dst = brows_row(..) (pack.h). gemm_bf16: y[t, r] = x[t, :] . W[r, :] for
     * t < x->n and the rows of tiles [t0, t1) of a W of one nibble plane (4-, 5- or 6-bit
     * codes, any scale layout of pack.h) whose rows are a multiple of
     * PACK_ROWS, with BF16_SCRATCH bytes of the calling thread (64-byte aligned). A row of y
     * sums in the same order whatever other rows come with it. */
    void (*split_bf16)(uint16_t *dst, const float *x, int64_t cols);
    void (*gemm_bf16)(float *y, int64_t ldy, const packed_mat *w, int64_t t0, int64_t t1,
                      const brows *x, void *scratch);
    /* y[t, r] = x[t, :] . W[r, :] for t < n, r0 <= r < r1; W dense F32/F16/BF16 [rows, cols] */
    void (*gemm_dense)(float *y, int64_t ldy, const matview *w, int64_t r0, int64_t r1,
                       const float *x, int64_t n);
    /* s[i, j] = q[i * ldq + :hd] . kt[:, j] for i < nq, j < ATT_BLOCK: the scores of nq query
     * vectors against one cache block of keys stored transposed, kt[hd, ATT_BLOCK] */
    void (*attn_scores)(float *s, const float *q, int64_t ldq, int64_t nq, const float *kt,
                        int64_t hd);
    /* o[i, :hd] = o[i, :hd] * corr[i] + sum_j p[i, j] * v[j * ldv + :hd] for i < nq, j <
     * ATT_BLOCK: the probabilities of nq query vectors times one cache block of values */
    void (*attn_pv)(float *o, int64_t ldo, const float *corr, const float *p, int64_t nq,
                    const float *v, int64_t ldv, int64_t hd);
    /* x[j] = exp(x[j] - m) for j < n; returns the sum */
    float (*exp_sum)(float *x, int64_t n, float m);
    /* y[n] = x[n] widened from IEEE binary16 */
    void (*f16_to_f32)(float *y, const uint16_t *x, int64_t n);
    /* y[m] = act(gate[m]) * up[m] (y may alias gate) */
    void (*glu)(float *y, const float *gate, const float *up, int64_t m, backend_act act);
    /* y[d] = (x[d] - mean) / sqrt(var + eps) * w[d] + b[d], two passes in fp32 as
     * ref_layernorm; b may be NULL; y may alias x */
    void (*layernorm)(float *y, const float *x, const float *w, const float *b, int64_t d,
                      float eps);
    /* y[m] = act(x[m]) (y may alias x) */
    void (*act)(float *y, const float *x, int64_t m, backend_act kind);
    /* y[n] = cap * tanh(y[n] / cap): Gemma 2's attention-score and final-logit capping */
    void (*softcap)(float *y, float cap, int64_t n);
} cpu_kernels;

extern const cpu_kernels cpu_kernels_generic;
extern const cpu_kernels cpu_kernels_avx2;
extern const cpu_kernels cpu_kernels_avx512;
extern const cpu_kernels cpu_kernels_amx;

/* AVX2 entries that the AVX-512 tables reuse where 256-bit code is as fast (attention
 * pieces and elementwise work are small or memory-bound next to the matrix products). */
void avx2_quantize_row(int8_t *q, float *d, float *s, const float *x, int64_t cols);
void avx2_gemm_dense(float *y, int64_t ldy, const matview *w, int64_t r0, int64_t r1,
                     const float *x, int64_t n);
void avx2_attn_scores(float *s, const float *q, int64_t ldq, int64_t nq, const float *kt,
                      int64_t hd);
void avx2_softcap(float *y, float cap, int64_t n);
void avx2_attn_pv(float *o, int64_t ldo, const float *corr, const float *p, int64_t nq,
                  const float *v, int64_t ldv, int64_t hd);
float avx2_exp_sum(float *x, int64_t n, float m);
void avx2_glu(float *y, const float *gate, const float *up, int64_t m, backend_act act);
void avx2_layernorm(float *y, const float *x, const float *w, const float *b, int64_t d, float eps);
void avx2_act(float *y, const float *x, int64_t m, backend_act kind);
void avx2_f16_to_f32(float *y, const uint16_t *x, int64_t n);

/* The AVX-512 VNNI product, which the AMX table uses for short inputs and odd tiles. */
void avx512_gemm_q(float *y, int64_t ldy, const packed_mat *w, int64_t t0, int64_t t1,
                   const qrows *x);

/* The table of a supported isa other than CPU_ISA_REF. */
const cpu_kernels *cpu_kernels_for(cpu_isa isa);

#endif

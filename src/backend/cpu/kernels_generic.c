/*
 * kernels_generic.c - the fast path's kernels in plain C: the packed layout and int8
 * activations without SIMD. Runs anywhere, serves as the first check of the layout, and
 * fills the table for CPUs without AVX2.
 */
#include "backend/cpu/kernels.h"
#include "backend/ref/ref.h"

#include "base/error.h"
#include "base/half.h"

#include <math.h>

static void quantize_row(int8_t *q, float *d, float *s, const float *x, int64_t cols) {
    for (int64_t b = 0; b < cols / QBLOCK; b++) {
        const float *xb = x + b * QBLOCK;
        float amax = 0.0f, sum = 0.0f;
        for (int j = 0; j < QBLOCK; j++) {
            amax = fmaxf(amax, fabsf(xb[j]));
            sum += xb[j];
        }
        const float db = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int j = 0; j < QBLOCK; j++) q[b * QBLOCK + j] = (int8_t)lrintf(xb[j] * id);
        d[b] = db;
        s[b] = sum;
    }
}

static void gemm_q(float *y, int64_t ldy, const packed_mat *w, int64_t t0, int64_t t1,
                   const qrows *x) {
    const int64_t blocks = w->cols / QBLOCK, tile_bytes = packed_tile_bytes(w),
                  tile_sb = packed_tile_sb(w), block_bytes = packed_block_bytes(w);
    for (int64_t t = t0; t < t1; t++) {
        const uint8_t *tile = w->codes + t * tile_bytes;
        const uint16_t *sb = w->sb + t * tile_sb;
        const int64_t nr =
            w->rows - t * PACK_ROWS < PACK_ROWS ? w->rows - t * PACK_ROWS : PACK_ROWS;
        for (int64_t n = 0; n < x->n; n++) {
            const int8_t *xq = x->q + n * x->cols;
            const float *xd = x->d + n * blocks, *xs = x->s + n * blocks;
            float acc[PACK_ROWS] = {0};
            for (int64_t b = 0; b < blocks; b++) {
                const uint8_t *blk = tile + b * block_bytes;
                /* groups of 16 take two scales a block, and the sums of its halves */
                const int halves = w->group == 16 ? 2 : 1, width = QBLOCK / halves;
                for (int h = 0; h < halves; h++) {
                    float sc[PACK_ROWS], bi[PACK_ROWS];
                    packed_group_scales(w, sb, b * QBLOCK + h * width, sc, bi);
                    const float sum = halves == 2 ? x->s16[n * (x->cols / 16) + 2 * b + h] : xs[b];
                    for (int i = 0; i < PACK_ROWS; i++) {
                        int32_t isum = 0;
                        for (int c = h * width; c < (h + 1) * width; c++)
                            isum += (int32_t)packed_code(w, blk, i, c) * xq[b * QBLOCK + c];
                        acc[i] += (float)isum * (sc[i] * xd[b]);
                        acc[i] += bi[i] * sum;
                    }
                }
            }
            /* pairs: row n + 1 is row n's residual and adds into the same output row */
            float *dst = y + (n >> x->pairs) * ldy + t * PACK_ROWS;
            for (int i = 0; i < nr; i++) dst[i] = x->pairs && (n & 1) ? dst[i] + acc[i] : acc[i];
        }
    }
}

static void gemm_dense(float *y, int64_t ldy, const matview *w, int64_t r0, int64_t r1,
                       const float *x, int64_t n) {
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t = 0; t < n; t++) {
            const float *xt = x + t * w->cols;
            float acc = 0.0f;
            for (int64_t c = 0; c < w->cols; c++)
                acc += dtype_load_f32(w->type, w->data, r * w->cols + c) * xt[c];
            y[t * ldy + r] = acc;
        }
}

static void attn_scores(float *s, const float *q, int64_t ldq, int64_t nq, const float *kt,
                        int64_t hd) {
    for (int64_t i = 0; i < nq; i++)
        for (int j = 0; j < ATT_BLOCK; j++) {
            float acc = 0.0f;
            for (int64_t c = 0; c < hd; c++) acc += q[i * ldq + c] * kt[c * ATT_BLOCK + j];
            s[i * ATT_BLOCK + j] = acc;
        }
}

static void attn_pv(float *o, int64_t ldo, const float *corr, const float *p, int64_t nq,
                    const float *v, int64_t ldv, int64_t hd) {
    for (int64_t i = 0; i < nq; i++)
        for (int64_t c = 0; c < hd; c++) {
            float acc = o[i * ldo + c] * corr[i];
            for (int j = 0; j < ATT_BLOCK; j++) acc += p[i * ATT_BLOCK + j] * v[j * ldv + c];
            o[i * ldo + c] = acc;
        }
}

static float exp_sum(float *x, int64_t n, float m) {
    float sum = 0.0f;
    for (int64_t j = 0; j < n; j++) sum += (x[j] = expf(x[j] - m));
    return sum;
}

static void f16_to_f32_row(float *y, const uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = f16_to_f32(x[i]);
}

const cpu_kernels cpu_kernels_generic = {
    .isa = CPU_ISA_GENERIC,
    .quantize_row = quantize_row,
    .gemm_q = gemm_q,
    .gemm_dense = gemm_dense,
    .attn_scores = attn_scores,
    .attn_pv = attn_pv,
    .exp_sum = exp_sum,
    .glu = ref_glu,
    .f16_to_f32 = f16_to_f32_row,
    .layernorm = ref_layernorm,
    .act = ref_act,
    .softcap = ref_softcap,
};

const cpu_kernels *cpu_kernels_for(cpu_isa isa) {
    switch (isa) {
    case CPU_ISA_GENERIC:
        return &cpu_kernels_generic;
    case CPU_ISA_AVX2:
        return &cpu_kernels_avx2;
    case CPU_ISA_AVX512:
        return &cpu_kernels_avx512;
    case CPU_ISA_AMX:
        return &cpu_kernels_amx;
    default:
        CELER_ASSERT(!"no kernel table for this isa");
        return NULL;
    }
}

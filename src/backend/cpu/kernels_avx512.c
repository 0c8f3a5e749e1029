/*
 * kernels_avx512.c - AVX-512 VNNI kernels (compiled with -mavx512f -mavx512bw -mavx512vl
 * -mavx512vnni): the packed product with vpdpbusd, one 64-byte load feeding all 16 rows
 * of a tile. vpdpbusd multiplies unsigned codes by signed int8 activations and adds
 * four products straight into int32 lanes, so no int16 stage (and no saturation bound)
 * is needed. Every layout of pack.h runs the one tile kernel, instantiated per layout
 * (kernels.h's qshape: code planes of 4- or 2-bit fields, bit planes, groups of 16, codebook,
 * kind of scales). Everything else reuses the AVX2 entries.
 */
#include "backend/cpu/kernels.h"
#include "backend/cpu/avx512_common.h"

#include <immintrin.h>
#include <string.h>

#define UNROLL _Pragma("GCC unroll 8")

INLINE __m512i bcast32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* The codes of run k of a plane's vector raw (pack.h): fields of L bits at k * L. */
INLINE __m512i run_codes(__m512i raw, int k, int L) {
    const __m512i field = _mm512_set1_epi8((char)((1 << L) - 1));
    return _mm512_and_si512(k ? _mm512_srli_epi16(raw, k * L) : raw, field);
}

/* One tile (16 rows) times T activation rows from n0, stored to y, for the layout S
 * (kernels.h): code planes of L-bit fields; bit planes above them, each added into its code
 * bytes through a byte mask; with groups of 16 each half block (runs 0-3 and 4-7) sums on its
 * own; a codebook's signed values put their signs onto the activations. */
INLINE void q_tile(float *y, int64_t ldy, const packed_mat *w, const uint8_t *tile,
                   const uint16_t *sb, const qrows *x, int64_t n0, int T, int P, const qshape S,
                   __mmask16 rows) {
    const int64_t blocks = w->cols / QBLOCK, block_bytes = packed_block_bytes(w);
    const int L = S.lowbits, V = L, E = 8 / L; /* vectors of a plane, runs of a vector */
    const int G = 1 + S.g16, VG = V / G;       /* groups of a block, vectors of a group */
    const __m512i lut = S.lut ? _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)w->lut))
                              : _mm512_setzero_si512();
    __m512 acc[8];
    UNROLL for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *blk = tile + b * block_bytes;
        if (T <= 2) /* decode waits on the weight stream: ask for it a few blocks ahead */
            UNROLL for (int k = 0; k < S.planes * V + S.hibits; k++)
                _mm_prefetch((const char *)(blk + 1024 + k * PACK_STEP), _MM_HINT_T0);
        __m512i i32[8], hi32[8];
        UNROLL for (int t = 0; t < T; t++) i32[t] = hi32[t] = _mm512_setzero_si512();
        /* plane pl's vectors of group g (all of them, but for groups of 16): g and pl pick the
         * accumulator, so they are constants; the loop over the vectors is not unrolled */
        UNROLL for (int pl = 0; pl < S.planes; pl++)
            UNROLL for (int g = 0; g < G; g++) for (int v = g * VG; v < (g + 1) * VG; v++) {
            const __m512i raw = _mm512_loadu_si512(blk + (pl * V + v) * PACK_STEP);
            UNROLL for (int k = 0; k < E; k++) {
                const int e = v * E + k; /* columns 4e .. 4e + 3 */
                __m512i c = run_codes(raw, k, L);
                UNROLL for (int h = 0; h < S.hibits; h++) { /* bit L+h of each code */
                    uint64_t m;
                    memcpy(&m, blk + S.planes * V * PACK_STEP + h * PACK_STEP + 8 * e, 8);
                    c = _mm512_mask_add_epi8(c, m, c, _mm512_set1_epi8((char)(1 << (L + h))));
                }
                __mmask64 neg = 0;
                if (S.lut) { /* codebook values: their magnitudes, their signs onto x */
                    c = _mm512_shuffle_epi8(lut, c);
                    neg = _mm512_movepi8_mask(c);
                    c = _mm512_abs_epi8(c);
                }
                UNROLL for (int t = 0; t < T; t++) {
                    const int8_t *xk = x->q + (n0 + t) * x->cols + b * QBLOCK + 4 * e;
                    __m512i *a = (S.planes == 2 && pl == 0) || g ? &hi32[t] : &i32[t];
                    __m512i xv = bcast32(xk);
                    if (S.lut) xv = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
                    *a = _mm512_dpbusd_epi32(*a, c, xv);
                }
            }
        }
        __m512 sc, bi, sc2 = _mm512_setzero_ps(), bi2 = _mm512_setzero_ps();
        group_scales(w, sb, b * QBLOCK, &sc, &bi, S.scales, S.lut);
        if (S.g16) group_scales(w, sb, b * QBLOCK + 16, &sc2, &bi2, S.scales, S.lut);
        /* P: rows come in (value, residual) pairs; the residual's product follows the
         * value's in the token's one accumulator (its sums are 0), the order the AMX
         * kernel keeps, so a product is the same whichever kernel a row count picks */
        UNROLL for (int t = 0; t < T; t++) {
            const int64_t xi = (n0 + t) * blocks + b;
            const int a = t - (t & P), residual = t & P;
            const __m512 d = _mm512_set1_ps(x->d[xi]);
            if (S.g16) { /* two groups: each half's product and its own sum */
                acc[a] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(i32[t]), d), sc, acc[a]);
                acc[a] =
                    _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(hi32[t]), d), sc2, acc[a]);
                if (!residual) {
                    const float *h = x->s16 + (n0 + t) * (x->cols / 16) + 2 * b;
                    acc[a] = _mm512_fmadd_ps(bi, _mm512_set1_ps(h[0]), acc[a]);
                    acc[a] = _mm512_fmadd_ps(bi2, _mm512_set1_ps(h[1]), acc[a]);
                }
                continue;
            }
            const __m512i isum =
                S.planes == 2 ? _mm512_add_epi32(i32[t], _mm512_slli_epi32(hi32[t], 4)) : i32[t];
            acc[a] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(isum), d), sc, acc[a]);
            if (!residual) acc[a] = _mm512_fmadd_ps(bi, _mm512_set1_ps(x->s[xi]), acc[a]);
        }
    }
    UNROLL for (int t = 0; t < T; t += 1 + P)
        _mm512_mask_storeu_ps(y + ((n0 + t) >> P) * ldy, rows, acc[t]);
}

INLINE void gemm_q_shape(float *y, int64_t ldy, const packed_mat *w, int64_t t0, int64_t t1,
                         const qrows *x, int P, const qshape S) {
    const int64_t tile_bytes = packed_tile_bytes(w), tile_sb = packed_tile_sb(w);
    for (int64_t t = t0; t < t1; t++) {
        const uint8_t *tile = w->codes + t * tile_bytes;
        const uint16_t *sb = w->sb + t * tile_sb;
        const int64_t r0 = t * PACK_ROWS, nr = w->rows - r0 < PACK_ROWS ? w->rows - r0 : PACK_ROWS;
        const __mmask16 rows = (__mmask16)((1u << nr) - 1u);
        int64_t n = 0;
        /* two shapes of rows per layout keep the instantiations (and the build) small */
        for (; n + 8 <= x->n; n += 8) q_tile(y + r0, ldy, w, tile, sb, x, n, 8, P, S, rows);
        for (; n < x->n; n += 1 + P) q_tile(y + r0, ldy, w, tile, sb, x, n, 1 + P, P, S, rows);
    }
}

/* One layout's product, with or without activation pairs. */
#define PRODUCT(S)                                                                                 \
    do {                                                                                           \
        if (x->pairs)                                                                              \
            gemm_q_shape(y, ldy, w, t0, t1, x, 1, S);                                              \
        else                                                                                       \
            gemm_q_shape(y, ldy, w, t0, t1, x, 0, S);                                              \
    } while (0)

void avx512_gemm_q(float *y, int64_t ldy, const packed_mat *w, int64_t t0, int64_t t1,
                   const qrows *x) {
    QSHAPE_DISPATCH(w, PRODUCT);
}

const cpu_kernels cpu_kernels_avx512 = {
    .isa = CPU_ISA_AVX512,
    .quantize_row = avx2_quantize_row,
    .gemm_q = avx512_gemm_q,
    .gemm_dense = avx2_gemm_dense,
    .attn_scores = avx2_attn_scores,
    .attn_pv = avx2_attn_pv,
    .exp_sum = avx2_exp_sum,
    .glu = avx2_glu,
    .layernorm = avx2_layernorm,
    .act = avx2_act,
    .f16_to_f32 = avx2_f16_to_f32,
    .softcap = avx2_softcap,
};

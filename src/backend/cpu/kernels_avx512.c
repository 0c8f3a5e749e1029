/*
 * kernels_avx512.c - AVX-512 VNNI kernels (compiled with -mavx512f -mavx512bw -mavx512vl
 * -mavx512vnni): the packed product with vpdpbusd, one 64-byte load feeding all 16 rows
 * of a tile. vpdpbusd multiplies unsigned codes by signed int8 activations and adds
 * four products straight into int32 lanes, so no int16 stage (and no saturation bound)
 * is needed. Everything else reuses the AVX2 entries.
 */
#include "backend/cpu/kernels.h"
#include "backend/cpu/avx512_common.h"

#include <immintrin.h>
#include <string.h>

INLINE __m512i bcast32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* One tile (16 rows) times T activation rows from n0, stored to y. HB: bit planes above the
 * nibble (5- and 6-bit codes), each added into its code bytes through a byte mask. G16:
 * groups of 16 columns, so each half block (steps 0-1 and 2-3) sums on its own. */
INLINE void q_tile(float *y, int64_t ldy, const packed_mat *w, const uint8_t *tile,
                   const uint16_t *sb, const qrows *x, int64_t n0, int T, int planes, int P, int HB,
                   int G16, __mmask16 rows) {
    const int64_t blocks = w->cols / QBLOCK, block_bytes = packed_block_bytes(w);
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i lut = w->lut ? _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)w->lut))
                               : _mm512_setzero_si512();
    __m512 acc[8];
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *blk = tile + b * block_bytes;
        if (T <= 2) /* decode waits on the weight stream: ask for it a few blocks ahead */
            for (int k = 0; k < planes * 4 + HB; k++)
                _mm_prefetch((const char *)(blk + 1024 + k * PACK_STEP), _MM_HINT_T0);
        __m512i i32[8], hi32[8];
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) i32[t] = hi32[t] =
            _mm512_setzero_si512();
        for (int pl = 0; pl < planes; pl++)
            for (int s = 0; s < 4; s++) {
                const __m512i raw = _mm512_loadu_si512(blk + (pl * 4 + s) * PACK_STEP);
                __m512i lo = _mm512_and_si512(raw, m4),
                        hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
                for (int h = 0; h < HB; h++) { /* bit 4+h of each code */
                    const uint8_t *mk = blk + 4 * PACK_STEP + h * PACK_STEP + s * 16;
                    uint64_t ml, mh;
                    memcpy(&ml, mk, 8);
                    memcpy(&mh, mk + 8, 8);
                    const __m512i bit = _mm512_set1_epi8((char)(16 << h));
                    lo = _mm512_mask_add_epi8(lo, ml, lo, bit);
                    hi = _mm512_mask_add_epi8(hi, mh, hi, bit);
                }
                __mmask64 nlo = 0, nhi = 0;
                if (w->lut) { /* codebook values: their magnitudes, their signs onto x */
                    lo = _mm512_shuffle_epi8(lut, lo);
                    hi = _mm512_shuffle_epi8(lut, hi);
                    nlo = _mm512_movepi8_mask(lo), nhi = _mm512_movepi8_mask(hi);
                    lo = _mm512_abs_epi8(lo), hi = _mm512_abs_epi8(hi);
                }
                _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                    const int8_t *xk = x->q + (n0 + t) * x->cols + b * QBLOCK + 8 * s;
                    __m512i *a = (planes == 2 && pl == 0) || (G16 && s >= 2) ? &hi32[t] : &i32[t];
                    __m512i xl = bcast32(xk), xh = bcast32(xk + 4);
                    if (w->lut) {
                        xl = _mm512_mask_sub_epi8(xl, nlo, _mm512_setzero_si512(), xl);
                        xh = _mm512_mask_sub_epi8(xh, nhi, _mm512_setzero_si512(), xh);
                    }
                    *a = _mm512_dpbusd_epi32(*a, lo, xl);
                    *a = _mm512_dpbusd_epi32(*a, hi, xh);
                }
            }
        __m512 sc, bi, sc2 = _mm512_setzero_ps(), bi2 = _mm512_setzero_ps();
        group_scales(w, sb, b * QBLOCK, &sc, &bi);
        if (G16) group_scales(w, sb, b * QBLOCK + 16, &sc2, &bi2);
        /* P: rows come in (value, residual) pairs; the residual's product follows the
         * value's in the token's one accumulator (its sums are 0), the order the AMX
         * kernel keeps, so a product is the same whichever kernel a row count picks */
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
            const int64_t xi = (n0 + t) * blocks + b;
            const int a = t - (t & P), residual = t & P;
            if (G16) { /* two groups: each half's product and its own sum */
                const __m512 d = _mm512_set1_ps(x->d[xi]);
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
                planes == 2 ? _mm512_add_epi32(i32[t], _mm512_slli_epi32(hi32[t], 4)) : i32[t];
            const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(x->d[xi]));
            acc[a] = _mm512_fmadd_ps(f, sc, acc[a]);
            if (!residual) acc[a] = _mm512_fmadd_ps(bi, _mm512_set1_ps(x->s[xi]), acc[a]);
        }
    }
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t += 1 + P)
        _mm512_mask_storeu_ps(y + ((n0 + t) >> P) * ldy, rows, acc[t]);
}

INLINE void gemm_q_planes(float *y, int64_t ldy, const packed_mat *w, int64_t t0, int64_t t1,
                          const qrows *x, int planes, int P, int HB, int G16) {
    const int64_t tile_bytes = packed_tile_bytes(w), tile_sb = packed_tile_sb(w);
    for (int64_t t = t0; t < t1; t++) {
        const uint8_t *tile = w->codes + t * tile_bytes;
        const uint16_t *sb = w->sb + t * tile_sb;
        const int64_t r0 = t * PACK_ROWS, nr = w->rows - r0 < PACK_ROWS ? w->rows - r0 : PACK_ROWS;
        const __mmask16 rows = (__mmask16)((1u << nr) - 1u);
        int64_t n = 0;
        for (; n + 8 <= x->n; n += 8)
            q_tile(y + r0, ldy, w, tile, sb, x, n, 8, planes, P, HB, G16, rows);
        for (; n + 4 <= x->n; n += 4)
            q_tile(y + r0, ldy, w, tile, sb, x, n, 4, planes, P, HB, G16, rows);
        for (; n < x->n; n += 1 + P)
            q_tile(y + r0, ldy, w, tile, sb, x, n, 1 + P, planes, P, HB, G16, rows);
    }
}

/* Each layout's product, its shape parameters constant (planes, pairs, bit planes, groups of
 * 16), so every inner loop is unrolled for it. */
#define PRODUCT(PL, HB, G16)                                                                       \
    do {                                                                                           \
        if (x->pairs)                                                                              \
            gemm_q_planes(y, ldy, w, t0, t1, x, PL, 1, HB, G16);                                   \
        else                                                                                       \
            gemm_q_planes(y, ldy, w, t0, t1, x, PL, 0, HB, G16);                                   \
    } while (0)

void avx512_gemm_q(float *y, int64_t ldy, const packed_mat *w, int64_t t0, int64_t t1,
                   const qrows *x) {
    if (w->planes == 2)
        PRODUCT(2, 0, 0);
    else if (w->group == 16 && w->hibits == 2) /* Q6_K */
        PRODUCT(1, 2, 1);
    else if (w->group == 16)
        PRODUCT(1, w->hibits, 1);
    else if (w->hibits == 0)
        PRODUCT(1, 0, 0);
    else if (w->hibits == 1)
        PRODUCT(1, 1, 0);
    else
        PRODUCT(1, 2, 0);
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

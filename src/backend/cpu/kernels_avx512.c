/*
 * kernels_avx512.c - AVX-512 VNNI kernels (compiled with -mavx512f -mavx512bw -mavx512vl
 * -mavx512vnni): the packed product with vpdpbusd, one 64-byte load feeding all 16 rows
 * of a tile. vpdpbusd multiplies unsigned codes by signed int8 activations and adds
 * four products straight into int32 lanes, so no int16 stage (and no saturation bound)
 * is needed. Every layout of pack.h runs the one tile kernel, instantiated per layout (code
 * planes of 4- or 2-bit fields, bit planes, groups of 16). Everything else reuses the AVX2
 * entries.
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

/* The codes of run k of a plane's vector raw (pack.h): fields of L bits at k * L. */
INLINE __m512i run_codes(__m512i raw, int k, int L) {
    const __m512i field = _mm512_set1_epi8((char)((1 << L) - 1));
    return _mm512_and_si512(k ? _mm512_srli_epi16(raw, k * L) : raw, field);
}

/* One tile (16 rows) times T activation rows from n0, stored to y. PL code planes of L-bit
 * fields (pack.h); HB: bit planes above them, each added into its code bytes through a byte
 * mask. G16: groups of 16 columns, so each half block (runs 0-3 and 4-7) sums on its own. */
INLINE void q_tile(float *y, int64_t ldy, const packed_mat *w, const uint8_t *tile,
                   const uint16_t *sb, const qrows *x, int64_t n0, int T, int PL, int L, int P,
                   int HB, int G16, __mmask16 rows) {
    const int64_t blocks = w->cols / QBLOCK, block_bytes = packed_block_bytes(w);
    const int V = L, E = 8 / L; /* vectors of a plane, runs of a vector */
    const __m512i lut = w->lut ? _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)w->lut))
                               : _mm512_setzero_si512();
    __m512 acc[8];
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *blk = tile + b * block_bytes;
        if (T <= 2) /* decode waits on the weight stream: ask for it a few blocks ahead */
            for (int k = 0; k < PL * V + HB; k++)
                _mm_prefetch((const char *)(blk + 1024 + k * PACK_STEP), _MM_HINT_T0);
        __m512i i32[8], hi32[8];
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) i32[t] = hi32[t] =
            _mm512_setzero_si512();
        for (int pl = 0; pl < PL; pl++)
            for (int v = 0; v < V; v++) {
                const __m512i raw = _mm512_loadu_si512(blk + (pl * V + v) * PACK_STEP);
                _Pragma("GCC unroll 4") for (int k = 0; k < E; k++) {
                    const int e = v * E + k; /* columns 4e .. 4e + 3 */
                    __m512i c = run_codes(raw, k, L);
                    for (int h = 0; h < HB; h++) { /* bit L+h of each code */
                        uint64_t m;
                        memcpy(&m, blk + PL * V * PACK_STEP + h * PACK_STEP + 8 * e, 8);
                        c = _mm512_mask_add_epi8(c, m, c, _mm512_set1_epi8((char)(1 << (L + h))));
                    }
                    __mmask64 neg = 0;
                    if (w->lut) { /* codebook values: their magnitudes, their signs onto x */
                        c = _mm512_shuffle_epi8(lut, c);
                        neg = _mm512_movepi8_mask(c);
                        c = _mm512_abs_epi8(c);
                    }
                    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                        const int8_t *xk = x->q + (n0 + t) * x->cols + b * QBLOCK + 4 * e;
                        __m512i *a = (PL == 2 && pl == 0) || (G16 && e >= 4) ? &hi32[t] : &i32[t];
                        __m512i xv = bcast32(xk);
                        if (w->lut) xv = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
                        *a = _mm512_dpbusd_epi32(*a, c, xv);
                    }
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
            const __m512 d = _mm512_set1_ps(x->d[xi]);
            if (G16) { /* two groups: each half's product and its own sum */
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
                PL == 2 ? _mm512_add_epi32(i32[t], _mm512_slli_epi32(hi32[t], 4)) : i32[t];
            acc[a] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(isum), d), sc, acc[a]);
            if (!residual) acc[a] = _mm512_fmadd_ps(bi, _mm512_set1_ps(x->s[xi]), acc[a]);
        }
    }
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t += 1 + P)
        _mm512_mask_storeu_ps(y + ((n0 + t) >> P) * ldy, rows, acc[t]);
}
INLINE void gemm_q_layout(float *y, int64_t ldy, const packed_mat *w, int64_t t0, int64_t t1,
                          const qrows *x, int PL, int L, int P, int HB, int G16) {
    const int64_t tile_bytes = packed_tile_bytes(w), tile_sb = packed_tile_sb(w);
    for (int64_t t = t0; t < t1; t++) {
        const uint8_t *tile = w->codes + t * tile_bytes;
        const uint16_t *sb = w->sb + t * tile_sb;
        const int64_t r0 = t * PACK_ROWS, nr = w->rows - r0 < PACK_ROWS ? w->rows - r0 : PACK_ROWS;
        const __mmask16 rows = (__mmask16)((1u << nr) - 1u);
        int64_t n = 0;
        for (; n + 8 <= x->n; n += 8)
            q_tile(y + r0, ldy, w, tile, sb, x, n, 8, PL, L, P, HB, G16, rows);
        for (; n + 4 <= x->n; n += 4)
            q_tile(y + r0, ldy, w, tile, sb, x, n, 4, PL, L, P, HB, G16, rows);
        for (; n < x->n; n += 1 + P)
            q_tile(y + r0, ldy, w, tile, sb, x, n, 1 + P, PL, L, P, HB, G16, rows);
    }
}

/* Each layout's product, its shape constant (code planes, field bits, bit planes, groups of
 * 16; activation pairs), so every inner loop is unrolled for it. */
#define PRODUCT(PL, L, HB, G16)                                                                    \
    do {                                                                                           \
        if (x->pairs)                                                                              \
            gemm_q_layout(y, ldy, w, t0, t1, x, PL, L, 1, HB, G16);                                \
        else                                                                                       \
            gemm_q_layout(y, ldy, w, t0, t1, x, PL, L, 0, HB, G16);                                \
    } while (0)
#define PRODUCT_G(PL, L, HB)                                                                       \
    do {                                                                                           \
        if (w->group == 16)                                                                        \
            PRODUCT(PL, L, HB, 1);                                                                 \
        else                                                                                       \
            PRODUCT(PL, L, HB, 0);                                                                 \
    } while (0)

void avx512_gemm_q(float *y, int64_t ldy, const packed_mat *w, int64_t t0, int64_t t1,
                   const qrows *x) {
    if (w->planes == 2) /* 8-bit */
        PRODUCT(2, 4, 0, 0);
    else if (w->lowbits == 2 && w->hibits == 0) /* 2-bit */
        PRODUCT_G(1, 2, 0);
    else if (w->lowbits == 2) /* 3-bit */
        PRODUCT_G(1, 2, 1);
    else if (w->hibits == 0) /* 4-bit, codebooks */
        PRODUCT_G(1, 4, 0);
    else if (w->hibits == 1) /* 5-bit */
        PRODUCT_G(1, 4, 1);
    else /* 6-bit */
        PRODUCT_G(1, 4, 2);
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

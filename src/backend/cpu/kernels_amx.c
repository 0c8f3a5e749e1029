/*
 * kernels_amx.c - AMX int8 tiles for prefill (compiled with the AVX-512 flags plus
 * -mamx-tile -mamx-int8; the process asks Linux for tile state in cpuid.c).
 *
 * One tdpbsud multiplies 16 tokens' int8 activations (A: 16 x 32 bytes, one quantization
 * block, loaded straight from the activation rows) by one weight tile's unsigned codes
 * (B: 8 x 64 bytes). The packed layout already is AMX's B layout once the nibbles are
 * split: step s's low nibbles are B row 2s (columns 8s..8s+3 of 16 rows) and its high
 * nibbles B row 2s+1. Each block's int32 result is scaled into float accumulators with
 * the block's activation scale and the weight group's scale and bias, as in the VNNI
 * kernel. Short inputs, token remainders and 8-bit matrices use the AVX-512 product.
 */
#include "backend/cpu/kernels.h"

#include <immintrin.h>
#include <string.h>

#define AMX_TOKENS 32 /* two A tiles of 16 rows */

typedef struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static void configure(void) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 2; t++) c.rows[t] = 16, c.colsb[t] = QBLOCK;      /* A: tokens x 32 */
    c.rows[2] = QBLOCK / 4, c.colsb[2] = 64;                                /* B: 8 x (16 rows x 4) */
    for (int t = 4; t < 6; t++) c.rows[t] = 16, c.colsb[t] = 64;            /* C: tokens x 16 int32 */
    _tile_loadconfig(&c);
}

static inline __m512 load_half16(const uint16_t *p, int bf16) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
}

/* Weight tile t times tokens [n0, n0 + 32). */
static void amx_tile(float *y, int64_t ldy, const packed_mat *w, int64_t t, const qrows *x, int64_t n0) {
    const int64_t blocks = w->cols / QBLOCK;
    const uint8_t *tile = w->codes + t * packed_tile_bytes(w);
    const uint16_t *sb = w->sb + t * packed_tile_sb(w);
    const __m512i m4 = _mm512_set1_epi8(15);
    _Alignas(64) uint8_t bbuf[QBLOCK / 4][64];
    _Alignas(64) int32_t cbuf[AMX_TOKENS][16];
    _Alignas(64) float acc[AMX_TOKENS][16];
    memset(acc, 0, sizeof acc);
    const int8_t *xq = x->q + n0 * x->cols;
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *blk = tile + b * 4 * PACK_STEP;
        for (int s = 0; s < 4; s++) {
            const __m512i raw = _mm512_loadu_si512(blk + s * PACK_STEP);
            _mm512_store_si512(bbuf[2 * s], _mm512_and_si512(raw, m4));
            _mm512_store_si512(bbuf[2 * s + 1], _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4));
        }
        _tile_loadd(0, xq + b * QBLOCK, x->cols);
        _tile_loadd(1, xq + 16 * x->cols + b * QBLOCK, x->cols);
        _tile_loadd(2, bbuf, 64);
        _tile_zero(4);
        _tile_zero(5);
        _tile_dpbsud(4, 0, 2);
        _tile_dpbsud(5, 1, 2);
        _tile_stored(4, cbuf[0], 64);
        _tile_stored(5, cbuf[16], 64);
        const uint16_t *g = sb + (b * QBLOCK / w->group) * 2 * PACK_ROWS;
        const __m512 sc = load_half16(g, w->bf16), bi = load_half16(g + PACK_ROWS, w->bf16);
        for (int i = 0; i < AMX_TOKENS; i++) {
            const int64_t xi = (n0 + i) * blocks + b;
            const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cbuf[i])), _mm512_set1_ps(x->d[xi]));
            __m512 a = _mm512_fmadd_ps(f, sc, _mm512_load_ps(acc[i]));
            _mm512_store_ps(acc[i], _mm512_fmadd_ps(bi, _mm512_set1_ps(x->s[xi]), a));
        }
    }
    const int64_t r0 = t * PACK_ROWS, nr = w->rows - r0 < PACK_ROWS ? w->rows - r0 : PACK_ROWS;
    const __mmask16 rows = (__mmask16)((1u << nr) - 1u);
    const int P = x->pairs; /* (value, residual) row pairs add into one output row */
    for (int i = 0; i < AMX_TOKENS; i += 1 + P) {
        const __m512 v = _mm512_load_ps(acc[i]);
        _mm512_mask_storeu_ps(y + ((n0 + i) >> P) * ldy + r0, rows, P ? _mm512_add_ps(v, _mm512_load_ps(acc[i + 1])) : v);
    }
}

static void amx_gemm_q(float *y, int64_t ldy, const packed_mat *w, int64_t t0, int64_t t1, const qrows *x) {
    const int64_t n_amx = w->planes == 1 ? x->n / AMX_TOKENS * AMX_TOKENS : 0;
    if (n_amx > 0) {
        configure();
        for (int64_t t = t0; t < t1; t++)
            for (int64_t n0 = 0; n0 < n_amx; n0 += AMX_TOKENS) amx_tile(y, ldy, w, t, x, n0);
        _tile_release();
    }
    if (n_amx < x->n) {
        const int64_t nb = x->cols / QBLOCK;
        const qrows rest = {.n = x->n - n_amx, .cols = x->cols, .pairs = x->pairs,
                            .q = x->q + n_amx * x->cols, .d = x->d + n_amx * nb, .s = x->s + n_amx * nb};
        avx512_gemm_q(y + (n_amx >> x->pairs) * ldy, ldy, w, t0, t1, &rest);
    }
}

const cpu_kernels cpu_kernels_amx = {
    .isa = CPU_ISA_AMX,
    .quantize_row = avx2_quantize_row,
    .gemm_q = amx_gemm_q,
    .gemm_dense = avx2_gemm_dense,
    .attn_scores = avx2_attn_scores,
    .attn_pv = avx2_attn_pv,
    .exp_sum = avx2_exp_sum,
    .glu = avx2_glu,
    .layernorm = avx2_layernorm,
    .act = avx2_act,
    .f16_to_f32 = avx2_f16_to_f32,
};

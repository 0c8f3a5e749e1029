/*
 * kernels_amx.c - AMX tiles for prefill (compiled with the AVX-512 flags plus -mamx-tile
 * -mamx-int8 -mamx-bf16; the process asks Linux for tile state in cpuid.c). Two products:
 *
 * bf16 (every layout of one code plane: 2- to 6-bit codes, codebooks). Each weight is
 * dequantized into two bf16 parts, high and low (a 4-bit code times a 16-bit scale plus bias
 * keeps about 16 significant bits, all of them for Q4_0), and each activation is split the same way
 * (brows, pack.h). Three tdpbf16ps per block, hi*hi + lo*hi + hi*lo, accumulate in the C tile
 * across the whole row, so a tile is stored once per chunk of columns rather than scaled once per
 * block: the scaling round trip is what bounds the int8 product below. Activations come in tile
 * order (brows), so an A tile is one 1 KiB piece: rows 4 KiB apart would share one L1 set. Weight
 * tiles are dequantized BF16_TILES x BF16_BLOCKS at a time into B tiles that stay in L2 while every
 * group of 16 tokens passes over them, two weight tiles per group sharing its A tiles; the
 * group's A tiles of those blocks (32 KiB) stay in L1 across the weight tiles.
 *
 * int8 (8-bit weights, and 4-bit ones where the backend passes int8 rows). One tdpbsud multiplies
 * 16 tokens' int8 activations of one quantization block (A: 16 rows x 32 bytes, loaded straight
 * from the activation rows) by one weight tile's unsigned codes of that block (B: 8 x 64 bytes).
 * The packed layout is AMX's B layout once the nibbles are split: step s's low nibbles are B row 2s
 * (columns 8s..8s+3 of 16 rows) and its high nibbles B row 2s+1; an 8-bit matrix joins its two
 * planes back into whole codes, so it takes one product too.
 *
 * Weight scales change every group, so every block's int32 result is scaled into float
 * accumulators (as in the VNNI kernel); what makes this fast is where things live:
 *   - a weight tile's B blocks are unpacked once per chunk of columns into a buffer on the
 *     stack and reused by every group of 16 tokens;
 *   - each group's 16 x 16 float accumulators stay in registers across the chunk;
 *   - with activation pairs (pack.h) the value rows and the residual rows are two A
 *     tiles over the same B, scaled into the token's one accumulator;
 *   - two sets of B and C tiles alternate, so one block's products run in the tile unit
 *     while the previous block's are scaled.
 * Token remainders (below 16) and short inputs use the AVX-512 product, which adds in the
 * same order, so a row's result does not depend on how many rows came with it.
 */
#include "backend/cpu/kernels.h"
#include "backend/cpu/avx512_common.h"

#include <immintrin.h>
#include <string.h>

#define AMX_TOKENS 16 /* rows of an A tile: tokens per group */
#define KCHUNK     64 /* blocks of 32 columns unpacked at once: 32 KiB of B */
#define B_BYTES    (QBLOCK / 4 * 64)

typedef struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Tiles 0, 1: A (value rows, residual rows); 2, 3: B; 4, 5 and 6, 7: C of 0 and 1. */
static void configure(void) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 2; t++) c.rows[t] = AMX_TOKENS, c.colsb[t] = QBLOCK;
    for (int t = 2; t < 4; t++) c.rows[t] = QBLOCK / 4, c.colsb[t] = 64;
    for (int t = 4; t < 8; t++) c.rows[t] = AMX_TOKENS, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

/* B tiles of blocks [b0, b0 + nb) of one weight tile: whole unsigned codes, AMX layout. */
static void unpack_b(uint8_t (*bbuf)[B_BYTES], const packed_mat *w, const uint8_t *tile, int64_t b0,
                     int64_t nb) {
    const __m512i m4 = _mm512_set1_epi8(15);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = tile + (b0 + b) * packed_block_bytes(w);
        for (int s = 0; s < 4; s++) {
            const __m512i raw = _mm512_loadu_si512(blk + s * PACK_STEP);
            __m512i lo = _mm512_and_si512(raw, m4),
                    hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
            if (w->planes == 2) { /* raw held the high nibbles; the low ones follow */
                const __m512i low = _mm512_loadu_si512(blk + (4 + s) * PACK_STEP);
                lo = _mm512_or_si512(_mm512_slli_epi16(lo, 4), _mm512_and_si512(low, m4));
                hi = _mm512_or_si512(_mm512_slli_epi16(hi, 4),
                                     _mm512_and_si512(_mm512_srli_epi16(low, 4), m4));
            }
            _mm512_store_si512(bbuf[b] + 2 * s * 64, lo);
            _mm512_store_si512(bbuf[b] + (2 * s + 1) * 64, hi);
        }
    }
}

/* Block b's products into C tiles c0 (value rows) and c0 + 1 (residual rows), with B in
 * tile bt. Tile numbers are immediates, hence a macro. */
#define ISSUE(bt, c0, c1, b)                                                                       \
    do {                                                                                           \
        _tile_loadd(bt, bbuf[(b)-b0], 64);                                                         \
        _tile_loadd(0, xq + (b)*QBLOCK, lda);                                                      \
        _tile_zero(c0);                                                                            \
        _tile_dpbsud(c0, 0, bt);                                                                   \
        if (P) {                                                                                   \
            _tile_loadd(1, xq + x->cols + (b)*QBLOCK, lda);                                        \
            _tile_zero(c1);                                                                        \
            _tile_dpbsud(c1, 1, bt);                                                               \
        }                                                                                          \
    } while (0)
#define STORE(c0, c1)                                                                              \
    do {                                                                                           \
        _tile_stored(c0, c[0], 64);                                                                \
        if (P) _tile_stored(c1, c[1], 64);                                                         \
    } while (0)

/* Tokens [n0, n0 + 16) times blocks [b0, b0 + nb) of the weight tile whose scales are sb,
 * added to (or, first chunk, stored as) y's 16 columns. P: activation rows are pairs. */
static inline __attribute__((always_inline)) void
group(float *y, int64_t ldy, const packed_mat *w, const uint16_t *sb, uint8_t (*bbuf)[B_BYTES],
      const qrows *x, int64_t n0, int64_t b0, int64_t nb, int P, __mmask16 rows) {
    const int64_t blocks = w->cols / QBLOCK, lda = x->cols << P, step = blocks << P;
    const int64_t per_group = w->group / QBLOCK, end = b0 + nb;
    _Alignas(64) int32_t c[2][AMX_TOKENS][16];
    __m512 acc[AMX_TOKENS];
    _Pragma("GCC unroll 16") for (int i = 0; i < AMX_TOKENS; i++) acc[i] =
        b0 ? _mm512_maskz_loadu_ps(rows, y + (n0 + i) * ldy) : _mm512_setzero_ps();
    const int8_t *xq = x->q + (n0 << P) * x->cols;
    const float *xd = x->d + (n0 << P) * blocks, *xs = x->s + (n0 << P) * blocks;
    const uint16_t *g = sb + (b0 / per_group) * 2 * PACK_ROWS;
    int64_t in_group = b0 % per_group;
    ISSUE(2, 4, 5, b0);
    for (int64_t b = b0; b < end; b++) {
        if ((b - b0) & 1) {
            STORE(6, 7);
            if (b + 1 < end) ISSUE(2, 4, 5, b + 1);
        } else {
            STORE(4, 5);
            if (b + 1 < end) ISSUE(3, 6, 7, b + 1);
        }
        const int bf16 = w->sc_type == DTYPE_BF16;
        const __m512 sc = load_half16(g, bf16), bi = load_half16(g + PACK_ROWS, bf16);
        /* token i's value-row scale and sum at d[i * step] and sum[i * step] */
        const float *d = xd + b, *sum = xs + b;
        _Pragma("GCC unroll 16") for (int i = 0; i < AMX_TOKENS; i++) {
            const __m512 f =
                _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[0][i])), _mm512_set1_ps(d[0]));
            acc[i] = _mm512_fmadd_ps(f, sc, acc[i]);
            acc[i] = _mm512_fmadd_ps(bi, _mm512_set1_ps(sum[0]), acc[i]);
            if (P) { /* the residual row: its sums are 0, so only the product counts */
                const __m512 r = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[1][i])),
                                               _mm512_set1_ps(d[blocks]));
                acc[i] = _mm512_fmadd_ps(r, sc, acc[i]);
            }
            d += step, sum += step;
        }
        if (++in_group == per_group) in_group = 0, g += 2 * PACK_ROWS;
    }
    _Pragma("GCC unroll 16") for (int i = 0; i < AMX_TOKENS; i++)
        _mm512_mask_storeu_ps(y + (n0 + i) * ldy, rows, acc[i]);
}

static void gemm_tiles(float *y, int64_t ldy, const packed_mat *w, int64_t t0, int64_t t1,
                       const qrows *x, int64_t tokens, int P) {
    const int64_t blocks = w->cols / QBLOCK, tile_bytes = packed_tile_bytes(w),
                  tile_sb = packed_tile_sb(w);
    _Alignas(64) uint8_t bbuf[KCHUNK][B_BYTES];
    for (int64_t t = t0; t < t1; t++) {
        const int64_t r0 = t * PACK_ROWS, nr = w->rows - r0 < PACK_ROWS ? w->rows - r0 : PACK_ROWS;
        const __mmask16 rows = (__mmask16)((1u << nr) - 1u);
        for (int64_t b0 = 0; b0 < blocks; b0 += KCHUNK) {
            const int64_t nb = blocks - b0 < KCHUNK ? blocks - b0 : KCHUNK;
            unpack_b(bbuf, w, w->codes + t * tile_bytes, b0, nb);
            for (int64_t n0 = 0; n0 < tokens; n0 += AMX_TOKENS)
                group(y + r0, ldy, w, w->sb + t * tile_sb, bbuf, x, n0, b0, nb, P, rows);
        }
    }
}

static void amx_gemm_q(float *y, int64_t ldy, const packed_mat *w, int64_t t0, int64_t t1,
                       const qrows *x) {
    if (!packed_plain(w)) { /* bit planes, two-level scales, zero points, codebooks */
        avx512_gemm_q(y, ldy, w, t0, t1, x);
        return;
    }
    const int P = x->pairs;
    const int64_t tokens = (x->n >> P) / AMX_TOKENS * AMX_TOKENS; /* through the tiles */
    if (tokens > 0) {
        configure();
        if (P)
            gemm_tiles(y, ldy, w, t0, t1, x, tokens, 1);
        else
            gemm_tiles(y, ldy, w, t0, t1, x, tokens, 0);
        _tile_release();
    }
    const int64_t done = tokens << P;
    if (done < x->n) {
        const int64_t nb = x->cols / QBLOCK;
        const qrows rest = {.n = x->n - done,
                            .cols = x->cols,
                            .pairs = P,
                            .q = x->q + done * x->cols,
                            .d = x->d + done * nb,
                            .s = x->s + done * nb};
        avx512_gemm_q(y + tokens * ldy, ldy, w, t0, t1, &rest);
    }
}

/* ==== bf16 tiles ==== */

typedef uint32_t btile[PACK_ROWS][16]; /* B: [column pair][weight row], bf16 pairs */

/* All eight tiles 16 x 64 bytes: 0, 1 A (activation high, low parts); 2, 3 and 4, 5 B of
 * two weight tiles (high, low); 6, 7 C of the two weight tiles. */
static void configure_bf16(void) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.rows[t] = 16, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

/* The float bits v rounded to their upper 16 (half away from zero), low half cleared. */
static inline __m512i round_top(__m512i v) {
    return _mm512_and_si512(_mm512_add_epi32(v, _mm512_set1_epi32(0x8000)),
                            _mm512_set1_epi32((int)0xffff0000u));
}

static void amx_split_bf16(uint16_t *dst, const float *x, int64_t cols) {
    for (int64_t c = 0; c < cols; c += 16) {
        const __mmask16 m = cols - c >= 16 ? 0xffff : (__mmask16)((1u << (cols - c)) - 1u);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + c);
        const __m512i h = round_top(_mm512_castps_si512(v));
        const __m512i l = round_top(_mm512_castps_si512(_mm512_sub_ps(v, _mm512_castsi512_ps(h))));
        uint16_t *o = dst + c / QBLOCK * BROWS_BLOCK + c % QBLOCK;
        _mm512_mask_cvtepi32_storeu_epi16(o, m, _mm512_srli_epi32(h, 16));
        _mm512_mask_cvtepi32_storeu_epi16(o + 16 * QBLOCK, m, _mm512_srli_epi32(l, 16));
    }
}

/* B tiles of blocks [b0, b0 + nb) of weight tile t (one code plane of 4- or 2-bit fields,
 * with its bit planes): pair row p holds columns 2p and 2p + 1 of the block for the 16 rows;
 * bb[b][0] the high parts (the weight's upper 16 bits), bb[b][1] the low parts (the rest,
 * rounded). */
static void dequant_b(btile (*bb)[2], const packed_mat *w, int64_t t, int64_t b0, int64_t nb) {
    const uint8_t *codes = w->codes + t * packed_tile_bytes(w);
    const uint16_t *sb = w->sb + t * packed_tile_sb(w);
    const int64_t block_bytes = packed_block_bytes(w), plane_bytes = packed_plane_bytes(w);
    const int L = w->lowbits, per = 8 / L; /* field bits, runs of a vector */
    const int sk = qshape_scales(w), lut_on = w->lut != NULL;
    const __m512i field = _mm512_set1_epi32((1 << L) - 1),
                  top = _mm512_set1_epi32((int)0xffff0000u), half = _mm512_set1_epi32(0x8000),
                  one = _mm512_set1_epi32(1);
    /* a codebook's 16 values as int32 lanes; bit planes: lane i reads bit (i % 8) * 4 + j of
     * the half of a 64-bit mask that holds its row */
    const __m512i lut = w->lut ? _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)w->lut))
                               : _mm512_setzero_si512();
    const __m512i row_shift =
        _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    for (int64_t b = 0; b < nb; b++) {
        __m512 sc[2], bi[2];
        group_scales(w, sb, (b0 + b) * QBLOCK, &sc[0], &bi[0], sk, lut_on);
        if (w->group == 16)
            group_scales(w, sb, (b0 + b) * QBLOCK + 16, &sc[1], &bi[1], sk, lut_on);
        else
            sc[1] = sc[0], bi[1] = bi[0];
        const uint8_t *blk = codes + (b0 + b) * block_bytes;
        for (int s = 0; s < 4; s++) { /* columns 8s .. 8s + 7: runs 2s and 2s + 1 */
            const __m512i raw = _mm512_loadu_si512(blk + 2 * s / per * PACK_STEP);
            __m512i masks[2]
                         [2]; /* [bit plane][run 2s, 2s + 1]: the two 32-bit halves of its mask */
            for (int hb = 0; hb < w->hibits; hb++)
                for (int k = 0; k < 2; k++) {
                    uint32_t m[2];
                    memcpy(m, blk + plane_bytes + hb * PACK_STEP + 8 * (2 * s + k), 8);
                    masks[hb][k] = _mm512_inserti64x4(_mm512_set1_epi32((int)m[0]),
                                                      _mm256_set1_epi32((int)m[1]), 1);
                }
            __m512i h[8], l[8];
            _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) { /* column 8s + u */
                const int e = 2 * s + u / 4, shift = 8 * (u % 4) + e % per * L;
                __m512i q = _mm512_and_si512(_mm512_srli_epi32(raw, shift), field);
                for (int hb = 0; hb < w->hibits; hb++) {
                    const __m512i sh = _mm512_add_epi32(row_shift, _mm512_set1_epi32(u % 4));
                    const __m512i bit =
                        _mm512_and_si512(_mm512_srlv_epi32(masks[hb][u / 4], sh), one);
                    q = _mm512_add_epi32(q, _mm512_slli_epi32(bit, L + hb));
                }
                if (w->lut) q = _mm512_permutexvar_epi32(q, lut);
                const int g = s >= 2; /* the half block's group, for groups of 16 */
                const __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), sc[g], bi[g]);
                h[u] = _mm512_and_si512(_mm512_castps_si512(v), top);
                l[u] = _mm512_add_epi32(
                    _mm512_castps_si512(_mm512_sub_ps(v, _mm512_castsi512_ps(h[u]))), half);
            }
            _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
                const __m512i hp = _mm512_or_si512(_mm512_srli_epi32(h[2 * p], 16), h[2 * p + 1]);
                /* a | (b & c) */
                const __m512i lp = _mm512_ternarylogic_epi32(_mm512_srli_epi32(l[2 * p], 16),
                                                             l[2 * p + 1], top, 0xf8);
                _mm512_store_si512(bb[b][0][4 * s + p], hp);
                _mm512_store_si512(bb[b][1][4 * s + p], lp);
            }
        }
    }
}

/* Blocks [0, nb) into C tile 6 from B tiles b0t (and C tile 7 from b1t when TWO), A tiles
 * from a: hi*hi, lo*hi, hi*lo for each block, in that order. */
#define BF16_BLOCKS_OF(TWO)                                                                        \
    for (int64_t b = 0; b < nb; b++) {                                                             \
        _tile_loadd(0, a + b * BROWS_BLOCK, 64);                                                   \
        _tile_loadd(2, b0t[b][0], 64);                                                             \
        _tile_dpbf16ps(6, 0, 2);                                                                   \
        if (TWO) {                                                                                 \
            _tile_loadd(4, b1t[b][0], 64);                                                         \
            _tile_dpbf16ps(7, 0, 4);                                                               \
        }                                                                                          \
        _tile_loadd(1, a + b * BROWS_BLOCK + 16 * QBLOCK, 64);                                     \
        _tile_dpbf16ps(6, 1, 2);                                                                   \
        if (TWO) _tile_dpbf16ps(7, 1, 4);                                                          \
        _tile_loadd(3, b0t[b][1], 64);                                                             \
        _tile_dpbf16ps(6, 0, 3);                                                                   \
        if (TWO) {                                                                                 \
            _tile_loadd(5, b1t[b][1], 64);                                                         \
            _tile_dpbf16ps(7, 0, 5);                                                               \
        }                                                                                          \
    }

/* Tiles [s0, s1) (at most BF16_TILES) over every group of x: each C tile accumulates across
 * all columns, through y between column chunks (or part, for a last group of fewer than 16). */
static void bf16_set(float *y, int64_t ldy, const packed_mat *w, int64_t s0, int64_t s1,
                     const brows *x, btile (*bb)[BF16_BLOCKS][2], float (*part)[16][16]) {
    const int64_t blocks = w->cols / QBLOCK, full = x->n / 16, groups = (x->n + 15) / 16;
    const int64_t ldc = ldy * (int64_t)sizeof(float);
    for (int64_t b0 = 0; b0 < blocks; b0 += BF16_BLOCKS) {
        const int64_t nb = blocks - b0 < BF16_BLOCKS ? blocks - b0 : BF16_BLOCKS;
        for (int64_t t = s0; t < s1; t++) dequant_b(bb[t - s0], w, t, b0, nb);
        for (int64_t g = 0; g < groups; g++) {
            const uint16_t *a = x->t + (g * blocks + b0) * BROWS_BLOCK;
            for (int64_t t = s0; t < s1; t += 2) {
                const int two = t + 1 < s1;
                btile(*b0t)[2] = bb[t - s0], (*b1t)[2] = bb[t - s0 + two];
                float *c0 = g < full ? y + g * 16 * ldy + t * PACK_ROWS : part[t - s0][0];
                float *c1 = g < full ? c0 + PACK_ROWS : part[t - s0 + two][0];
                const int64_t ld = g < full ? ldc : 16 * (int64_t)sizeof(float);
                if (b0 == 0) {
                    _tile_zero(6);
                    _tile_zero(7);
                } else {
                    _tile_loadd(6, c0, ld);
                    if (two) _tile_loadd(7, c1, ld);
                }
                if (two) {
                    BF16_BLOCKS_OF(1)
                } else {
                    BF16_BLOCKS_OF(0)
                }
                _tile_stored(6, c0, ld);
                if (two) _tile_stored(7, c1, ld);
            }
        }
    }
    for (int64_t i = full * 16; i < x->n; i++) /* the last group's rows that exist */
        for (int64_t t = s0; t < s1; t++)
            memcpy(y + i * ldy + t * PACK_ROWS, part[t - s0][i - full * 16], sizeof part[0][0]);
}

static void amx_gemm_bf16(float *y, int64_t ldy, const packed_mat *w, int64_t t0, int64_t t1,
                          const brows *x, void *scratch) {
    btile(*bb)[BF16_BLOCKS][2] = scratch;
    float(*part)[16][16] = (void *)((char *)scratch + BF16_TILES * BF16_BLOCKS * sizeof(btile[2]));
    configure_bf16();
    for (int64_t s0 = t0; s0 < t1; s0 += BF16_TILES)
        bf16_set(y, ldy, w, s0, t1 - s0 < BF16_TILES ? t1 : s0 + BF16_TILES, x, bb, part);
    _tile_release();
}

const cpu_kernels cpu_kernels_amx = {
    .isa = CPU_ISA_AMX,
    .quantize_row = avx2_quantize_row,
    .gemm_q = amx_gemm_q,
    .split_bf16 = amx_split_bf16,
    .gemm_bf16 = amx_gemm_bf16,
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

/*
 * pack.h - the fast kernels' weight layout and int8 activation rows.
 *
 * Affine 4-bit and 8-bit matrices are repacked once at load into tiles of 16 output
 * rows, so one 64-byte load feeds 16 rows of a dot product (an AVX-512 register of
 * int32 lanes, or two AVX2 registers):
 *
 *   codes: [tile][k32 block][plane][step 0..3][row 0..15][byte 0..3]
 *          byte j of (row, step s) holds the code of column 8s+j in its low nibble and
 *          of column 8s+4+j in its high nibble (columns relative to the 32-block).
 *          4-bit matrices have one plane; 8-bit ones two: the high nibbles (q >> 4)
 *          first, then the low nibbles, so q = 16*hi + lo runs through the same code.
 *          5- and 6-bit codes keep their low four bits there and add one or two bit
 *          planes per block (hibits): for plane h and step s, two 64-bit masks whose bit
 *          i*4+j is bit 4+h of the code the low- and the high-nibble byte (i, j) holds.
 *   sb:    [tile][group][scale 0..15, bias 0..15] as f16 or bf16 (the checkpoint's own
 *          16-bit type, so no precision is lost and decode reads no more bytes). Without
 *          biases (a zero point: bias = -zero * scale) only the scales. Two-level scales
 *          (GGUF K-quants, super > 0) per super-block: [D 0..15 (f16), M 0..15 (f16)], then
 *          per group of it [sc 0..15 (u8 or i8), m 0..15 (u8)] two to a 16-bit word, scale =
 *          D * sc, bias = M * m (M and m only with biases).
 *   lut:   for a codebook (GGUF IQ4), the 16 code values as int8: the kernels map each 4-bit
 *          code through it and multiply the signed values (no zero point).
 *
 * Rows past the end of the matrix are padded with zero codes and zero scales. Activations
 * are quantized per row in blocks of 32 to int8 with a float scale and the block's float
 * sum, which gives sum(w*x) = scale*dx*sum(q*xq) + bias*sum(x) for every weight group.
 *
 * This file knows layouts only; kernels live in kernels_*.c.
 */
#ifndef CELER_BACKEND_CPU_PACK_H
#define CELER_BACKEND_CPU_PACK_H

#include "backend/backend.h"
#include "base/arena.h"
#include "base/tensor.h"

#include <stdbool.h>
#include <stdint.h>

#define PACK_ROWS 16 /* output rows per tile */
#define QBLOCK    32 /* activation quantization block (columns) */
#define PACK_STEP 64 /* bytes of one step: 16 rows x 4 bytes */

typedef struct packed_mat {
    int64_t rows, cols, tiles; /* tiles = ceil(rows / PACK_ROWS) */
    int bits;                  /* 4, 5, 6 or 8 */
    int planes;                /* nibble planes: 2 for 8-bit, else 1 */
    int hibits;                /* bit planes above the nibble: 1 for 5-bit, 2 for 6-bit */
    int64_t group;             /* columns per scale/bias: 16 or a multiple of QBLOCK */
    bool bf16;                 /* sb holds bf16 (else f16) */
    bool biased;               /* sb holds biases; else bias = -zero * scale */
    int zero;
    int64_t super;     /* two-level scales: columns per super-block; else 0 */
    bool sc_signed;    /* two-level group scales are i8 (else u8) */
    const int8_t *lut; /* [16] code values, or NULL */
    const uint8_t *codes;
    const uint16_t *sb;
} packed_mat;

/* Whether p is plain 4- or 8-bit codes with one-level scales and biases: the layout the AMX
 * tiles and the AVX2 product take (the others run the AVX-512 and generic products). */
static inline bool packed_plain(const packed_mat *p) {
    return !p->hibits && p->biased && !p->super && !p->lut;
}

/* Bytes of one block's codes in a tile (nibble planes, then bit planes). */
static inline int64_t packed_block_bytes(const packed_mat *p) {
    return p->planes * 4 * PACK_STEP + p->hibits * PACK_STEP;
}
/* Bytes of codes in one tile, and 16-bit scale/bias words in one tile. */
static inline int64_t packed_tile_bytes(const packed_mat *p) {
    return (p->cols / QBLOCK) * packed_block_bytes(p);
}
/* 16-bit words of one super-block's factors and group scales (two-level). */
static inline int64_t packed_super_words(const packed_mat *p) {
    const int parts = p->biased ? 2 : 1;
    return parts * PACK_ROWS + (p->super / p->group) * parts * PACK_ROWS / 2;
}
static inline int64_t packed_tile_sb(const packed_mat *p) {
    if (p->super) return (p->cols / p->super) * packed_super_words(p);
    return (p->cols / p->group) * (p->biased ? 2 : 1) * PACK_ROWS;
}
/* The scales and biases of the 16 rows of a tile's sb for the group holding column c
 * (scalar; the SIMD kernels read the same layout with vectors). */
void packed_group_scales(const packed_mat *p, const uint16_t *sb, int64_t c, float sc[PACK_ROWS],
                         float bi[PACK_ROWS]);
/* Row i's code of column c (< QBLOCK) of a tile's block blk, through the codebook if any. */
static inline int packed_code(const packed_mat *p, const uint8_t *blk, int i, int c) {
    const int s = c / 8, j = c % 4, half = c % 8 / 4;
    unsigned q = 0;
    for (int pl = 0; pl < p->planes; pl++) {
        const uint8_t byte = blk[(pl * 4 + s) * PACK_STEP + i * 4 + j];
        q = q * 16 + (half ? byte >> 4 : byte & 15u);
    }
    for (int h = 0; h < p->hibits; h++) {
        const uint8_t *m = blk + p->planes * 4 * PACK_STEP + h * PACK_STEP + s * 16 + half * 8;
        q |= (unsigned)((m[(i * 4 + j) / 8] >> ((i * 4 + j) % 8)) & 1) << (4 + h);
    }
    return p->lut ? p->lut[q] : (int)q;
}

/* Whether w can be packed: affine 4/8-bit, group a multiple of QBLOCK, and scales that are
 * F16/BF16 (or F32 values that are exact in one of them). */
bool pack_supported(const matview *w);
/* Repacks w into memory from a (64-byte aligned); returns NULL when unsupported or out of
 * memory. The result lives as long as the arena. */
packed_mat *pack_matrix(const matview *w, arena *a);
/* out[cols] = row r of p, dequantized (embedding lookups). */
void packed_row(float *out, const packed_mat *p, int64_t r);

/* The CPU classes' prepared weights: the packed layout of every matrix the packer takes,
 * by matview id (NULL where it did not: dense matrices are read in place). */
typedef struct cpu_weights {
    backend_weights base;
    const packed_mat **mats; /* [n] */
    int64_t n;
    arena mem;
} cpu_weights;

/* Packs every matrix of ws (ws->done after each, so the source pages can go at once);
 * *out NULL when none can be packed. */
celer_status pack_weights(const weight_set *ws, const backend_class *cls, cpu_weights **out,
                          celer_error *e);
void pack_weights_free(cpu_weights *w);

/* Activation rows quantized for the packed kernels: n rows of cols columns.
 *
 * With pairs set, row 2t holds token t quantized and row 2t+1 the int8 quantization of
 * what that left over (its sums s are 0, so the bias counts once); the kernels add the
 * two products into output row t. Two int8 passes carry about 15 bits of each block,
 * at twice the integer work but the same weight traffic. */
typedef struct qrows {
    int64_t n, cols;
    int pairs;
    int8_t *q;  /* [n, cols] */
    float *d;   /* [n, cols / QBLOCK] scale: x ~ d * q */
    float *s;   /* [n, cols / QBLOCK] sum of the block's float values */
    float *s16; /* [n, cols / 16] sums of each half block (0 in residual rows), for weights in
                 * groups of 16; NULL when no product needs them */
} qrows;

/* Activation rows for the AMX bf16 product, in the order its A tiles are read: each value
 * as two bf16 parts, x ~ hi + lo (hi rounded to bf16, lo the rest rounded again: about 16
 * significant bits). Groups of 16 rows (a tile's rows), then column blocks:
 *   t: [row / 16][column block][part: hi, lo][row % 16][QBLOCK]
 * so a tile is 1 KiB in one piece. Rows past n, up to the next multiple of 16, are zero. */
typedef struct brows {
    int64_t n, cols;
    uint16_t *t;
} brows;

#define BROWS_BLOCK (2 * 16 * QBLOCK) /* elements of one group's column block, both parts */

/* Where row r's block 0 starts; its block b's high part is at + b * BROWS_BLOCK, the low
 * part 16 * QBLOCK after that. */
static inline uint16_t *brows_row(const brows *x, int64_t r) {
    return x->t + (r / 16) * (x->cols / QBLOCK) * BROWS_BLOCK + (r % 16) * QBLOCK;
}

#endif

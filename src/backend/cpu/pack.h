/*
 * pack.h - the fast kernels' weight layout and int8 activation rows.
 *
 * Affine matrices of 2- to 8-bit codes are repacked once at load into tiles of 16 output
 * rows, so one 64-byte load feeds 16 rows of a dot product (an AVX-512 register of int32
 * lanes, or two AVX2 registers):
 *
 *   codes: [tile][k32 block][code plane][vector][row 0..15][byte 0..3], then the block's bit
 *          planes. A block's 32 columns come as 8 runs of 4: run e is columns 4e..4e+3, and
 *          byte j of a row's 4 holds column 4e+j, so a vector's run times 4 broadcast
 *          activation bytes is one vpdpbusd.
 *          Nibble planes (lowbits 4) are 4 vectors: vector s holds run 2s in its low nibbles
 *          and run 2s+1 in its high ones. 4-bit matrices have one plane; 8-bit ones two: the
 *          high nibbles (q >> 4) first, then the low nibbles, so q = 16*hi + lo runs through
 *          the same code.
 *          Crumb planes (lowbits 2) are 2 vectors: vector v holds run 4v+k in bits 2k..2k+1
 *          of each byte. 2-bit matrices have one, 2 bits a weight as in the file.
 *          Bit planes (hibits) add the code's bits above the plane, one 64-byte plane each:
 *          for plane h, run e's 64-bit mask (bytes 8e..8e+7) has bit 4i+j set where bit
 *          lowbits+h of the code of row i, column 4e+j is. 5- and 6-bit codes are a nibble
 *          plane and one or two bit planes; 3-bit codes a crumb plane and one bit plane.
 *   sb:    one-level scales: [tile][group][scale 0..15, bias 0..15] as f16 or bf16 (the
 *          checkpoint's own 16-bit type, so no precision is lost and decode reads no more
 *          bytes); without biases (a zero point: bias = -zero * scale) only the scales. The
 *          fp4 modes keep their 8-bit scales, [group][scale byte 0..15]: e8m0 (mxfp4, 2^(b -
 *          127), beyond f16's range) or e4m3 (nvfp4); the kernels widen them exactly.
 *          Two-level scales (GGUF K-quants, super > 0) per super-block: [D 0..15 (f16), M
 *          0..15 (f16)], then per group of it [sc 0..15 (u8 or i8), m 0..15 (u8)] bytes,
 *          scale = D * sc, bias = M * m (M and m only with biases). GGUF Q2_K's 4-bit scale
 *          and min stay in one byte per group (u4lo: sc the low nibble, m the high one), so
 *          the layout holds the file's bytes.
 *   lut:   for a codebook (GGUF IQ4, MLX fp4's e2m1 values doubled), the 16 code values as
 *          int8: the kernels map each 4-bit code through it and multiply the signed values
 *          (no zero point). Its fractional bits (lut_shift) go into the scales, exactly.
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
#include "base/threadpool.h"
#include "base/tensor.h"

#include <stdbool.h>
#include <stdint.h>

#define PACK_ROWS 16 /* output rows per tile */
#define QBLOCK    32 /* activation quantization block (columns) */
#define PACK_STEP 64 /* bytes of one vector of a plane: 16 rows x 4 bytes */

typedef struct packed_mat {
    int64_t rows, cols, tiles; /* tiles = ceil(rows / PACK_ROWS) */
    int bits;                  /* 2, 3, 4, 5, 6 or 8 */
    int lowbits;               /* bits of a code in each code plane: 4 (nibbles) or 2 (crumbs) */
    int planes;                /* code planes: 2 for 8-bit, else 1 */
    int hibits;                /* bit planes above the code plane: 5- and 3-bit 1, 6-bit 2 */
    int64_t group;  /* columns per scale/bias: a multiple of QBLOCK, or 16 (below 8 bits) */
    int glog, slog; /* log2 of group and super (both powers of two): the kernels shift */
    dtype sc_type;  /* one-level: F16, BF16, E8M0 or F8E4M3; two-level: U8, I8 or U4LO */
    bool biased;    /* sb holds biases; else bias = -zero * scale */
    int zero;
    int64_t super;     /* two-level scales: columns per super-block; else 0 */
    const int8_t *lut; /* [16] code values, or NULL */
    int lut_shift;     /* fractional bits of the code values */
    const uint8_t *codes;
    const uint16_t *sb;
} packed_mat;

/* Whether p is plain 4- or 8-bit codes with one-level 16-bit scales and biases in groups of
 * QBLOCK or more: the layout the AMX int8 tiles take. */
static inline bool packed_plain(const packed_mat *p) {
    return p->lowbits == 4 && !p->hibits && p->biased && !p->super && !p->lut &&
           p->group % QBLOCK == 0;
}

/* Whether one-level scales are bytes (the fp4 modes' e8m0 or e4m3), 16 to a group. */
static inline bool packed_byte_scales(const packed_mat *p) {
    return p->sc_type == DTYPE_E8M0 || p->sc_type == DTYPE_F8E4M3;
}

/* Bytes of one code plane of a block, and of a block's codes in a tile (code planes, then bit
 * planes). */
static inline int64_t packed_plane_bytes(const packed_mat *p) {
    return p->lowbits * PACK_STEP;
}
static inline int64_t packed_block_bytes(const packed_mat *p) {
    return p->planes * packed_plane_bytes(p) + p->hibits * PACK_STEP;
}
/* Bytes of codes in one tile. */
static inline int64_t packed_tile_bytes(const packed_mat *p) {
    return (p->cols / QBLOCK) * packed_block_bytes(p);
}
/* 16-bit words of one group's one-level scales (and biases). */
static inline int64_t packed_group_words(const packed_mat *p) {
    return packed_byte_scales(p) ? PACK_ROWS / 2 : (p->biased ? 2 : 1) * PACK_ROWS;
}
/* Bytes of one group's integer scales (and mins) in a two-level super-block. */
static inline int64_t packed_sub_bytes(const packed_mat *p) {
    return (p->biased && p->sc_type != DTYPE_U4LO ? 2 : 1) * PACK_ROWS;
}
/* 16-bit words of one super-block's factors and group scales (two-level). */
static inline int64_t packed_super_words(const packed_mat *p) {
    return (p->biased ? 2 : 1) * PACK_ROWS + (p->super >> p->glog) * packed_sub_bytes(p) / 2;
}
/* 16-bit scale/bias words in one tile. */
static inline int64_t packed_tile_sb(const packed_mat *p) {
    if (p->super) return (p->cols / p->super) * packed_super_words(p);
    return (p->cols / p->group) * packed_group_words(p);
}
/* Where the scales of the group holding column c sit in a tile's sb: one-level, its words (the
 * 16 scales, then the 16 biases; bytes for e8m0 and e4m3); two-level, its bytes (the 16
 * scales, then the 16 mins; one byte each for u4lo), with *sup set to the super-block's
 * factors (D 0..15, then M 0..15). */
static inline const void *packed_group_at(const packed_mat *p, const uint16_t *sb, int64_t c,
                                          const uint16_t **sup) {
    if (!p->super) return sb + (c >> p->glog) * packed_group_words(p);
    *sup = sb + (c >> p->slog) * packed_super_words(p);
    return (const uint8_t *)(*sup + (p->biased ? 2 : 1) * PACK_ROWS) +
           ((c & (p->super - 1)) >> p->glog) * packed_sub_bytes(p);
}
/* The scales and biases of the 16 rows of a tile's sb for the group holding column c, the
 * codebook's fractional bits applied (scalar; the SIMD kernels read the same layout with
 * vectors). */
void packed_group_scales(const packed_mat *p, const uint16_t *sb, int64_t c, float sc[PACK_ROWS],
                         float bi[PACK_ROWS]);
/* Row i's code of column c (< QBLOCK) of a tile's block blk, through the codebook if any. */
static inline int packed_code(const packed_mat *p, const uint8_t *blk, int i, int c) {
    const int e = c / 4, j = c % 4, per = 8 / p->lowbits, shift = e % per * p->lowbits;
    unsigned q = 0;
    for (int pl = 0; pl < p->planes; pl++) {
        const uint8_t byte = blk[pl * packed_plane_bytes(p) + e / per * PACK_STEP + i * 4 + j];
        q = q << p->lowbits | ((unsigned)byte >> shift & ((1u << p->lowbits) - 1u));
    }
    const uint8_t *m = blk + p->planes * packed_plane_bytes(p) + 8 * e;
    for (int h = 0; h < p->hibits; h++)
        q |= (unsigned)(m[h * PACK_STEP + (i * 4 + j) / 8] >> ((i * 4 + j) % 8) & 1)
             << (p->lowbits + h);
    return p->lut ? p->lut[q] : (int)q;
}

/* Whether w can be packed: affine 2- to 8-bit codes in the layouts GGUF and MLX files hold:
 * one-level F16/BF16 scales (or F32 values exact in one of them) in groups of 32, 64, ...;
 * two-level U8/I8/U4LO scales in groups of 16 (2-, 3- and 6-bit codes) or 32 and up; the fp4
 * modes' E8M0/F8E4M3 scales over a codebook; a codebook over 4-bit codes. */
bool pack_supported(const matview *w);
/* Repacks w into memory from a (64-byte aligned); returns NULL when unsupported or out of
 * memory. The result lives as long as the arena. */
packed_mat *pack_matrix(const matview *w, arena *a);
/* The same, its tiles spread over pool's threads (NULL: the caller's alone). */
packed_mat *pack_matrix_on(const matview *w, arena *a, threadpool *pool);
/* Bytes of p's codes, scales and codebook (padding rows included). */
int64_t packed_bytes(const packed_mat *p);
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

/* Packs every matrix of ws on n_threads threads (0: every online CPU), ws->done after
 * each, so the source pages can go at once; *out NULL when none can be packed. */
celer_status pack_weights(const weight_set *ws, const backend_class *cls, int n_threads,
                          cpu_weights **out, celer_error *e);
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

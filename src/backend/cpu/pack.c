/*
 * pack.c - repacking affine matrices (MLX's layout, which GGUF blocks are bound as) into the
 * tiled layout of pack.h, and reading rows back. Runs once per matrix at load; not a hot path.
 */
#define _POSIX_C_SOURCE 200809L
#include "backend/cpu/pack.h"

#include "base/half.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The type the packed one-level scales use for w (its own 16-bit or 8-bit type, or for F32
 * scales the 16-bit one that holds them exactly), or false when there is none: F32 values
 * exact in neither f16 nor bf16, or a NaN among 8-bit scales (the reference's NaN). */
static bool scale_format(const matview *w, dtype *t) {
    const int64_t n = w->rows * (w->cols / w->group);
    *t = w->scale_type;
    if (w->scale_type == DTYPE_F16 || w->scale_type == DTYPE_BF16) return true;
    if (w->scale_type == DTYPE_E8M0 || w->scale_type == DTYPE_F8E4M3) {
        for (int64_t i = 0; i < n; i++) {
            const uint8_t b = ((const uint8_t *)w->scales)[i];
            if (w->scale_type == DTYPE_E8M0 ? b == 255 : (b & 127) == 127) return false;
        }
        return true;
    }
    if (w->scale_type != DTYPE_F32) return false;
    bool f16_ok = true, bf16_ok = true;
    for (int64_t i = 0; i < n && (f16_ok || bf16_ok); i++)
        for (int k = 0; k < (w->biases ? 2 : 1); k++) {
            const float v = dtype_load_f32(DTYPE_F32, k ? w->biases : w->scales, i);
            f16_ok = f16_ok && f16_to_f32(f32_to_f16(v)) == v;
            bf16_ok = bf16_ok && bf16_to_f32(f32_to_bf16(v)) == v;
        }
    *t = f16_ok ? DTYPE_F16 : DTYPE_BF16;
    return f16_ok || bf16_ok;
}

/* The largest |value| of a codebook. */
static int lut_max(const int8_t *lut) {
    int m = 0;
    for (int q = 0; q < 16; q++) m = abs(lut[q]) > m ? abs(lut[q]) : m;
    return m;
}

/* The layouts the kernels are built for (kernels.h's QSHAPE_DISPATCH) are the ones GGUF and
 * MLX files hold; anything else runs the exact row-at-a-time path. */
bool pack_supported(const matview *w) {
    const int bits = w->quant_bits;
    const bool g16 = w->group == 16;
    if (bits < 2 || bits > 8 || bits == 7 || w->group <= 0 || (w->group & (w->group - 1)) ||
        (w->group % QBLOCK && !g16) || w->cols % w->group || w->cols % QBLOCK ||
        (w->lut && (bits != 4 || w->biases || w->lut_shift < 0 || w->lut_shift > 8)))
        return false;
    if (w->super) { /* K-quants: integer group scales under F16 factors, groups of 16 for 2-,
                     * 3- and 6-bit codes (Q2_K, Q3_K, Q6_K), 32 for the rest */
        if ((w->super & (w->super - 1)) || w->super < w->group || w->cols % w->super ||
            g16 != (!w->lut && (bits == 2 || bits == 3 || bits == 6)))
            return false;
        if (w->scale_type == DTYPE_U4LO) /* Q2_K: scale and min in one byte */
            return w->biases == w->scales && w->super_biases;
        return w->scale_type == DTYPE_U8 || w->scale_type == DTYPE_I8;
    }
    dtype t;
    if (w->scale_type == DTYPE_E8M0 || w->scale_type == DTYPE_F8E4M3) /* the fp4 modes */
        return w->lut && lut_max(w->lut) <= 15 && scale_format(w, &t);
    return !g16 && scale_format(w, &t);
}

static uint16_t scale_bits(const matview *w, const void *p, int64_t i, dtype t) {
    uint16_t h;
    if (w->scale_type != DTYPE_F32) {
        memcpy(&h, (const unsigned char *)p + 2 * i, 2);
        return h;
    }
    const float v = dtype_load_f32(DTYPE_F32, p, i);
    return t == DTYPE_BF16 ? f32_to_bf16(v) : f32_to_f16(v);
}

/* Row i of tile sb's scales: one-level 16- or 8-bit values, or the two-level factors and
 * bytes. */
static void pack_row_scales(const matview *w, const packed_mat *p, uint16_t *sb, int64_t r, int i) {
    const int64_t groups = w->cols / w->group;
    if (!p->super) {
        for (int64_t g = 0; g < groups; g++) {
            uint16_t *dst = sb + g * packed_group_words(p);
            if (packed_byte_scales(p)) {
                ((uint8_t *)dst)[i] = ((const uint8_t *)w->scales)[r * groups + g];
                continue;
            }
            dst[i] = scale_bits(w, w->scales, r * groups + g, p->sc_type);
            if (p->biased)
                dst[PACK_ROWS + i] = scale_bits(w, w->biases, r * groups + g, p->sc_type);
        }
        return;
    }
    const int64_t supers = w->cols / w->super, per = w->super / w->group;
    const int parts = p->biased ? 2 : 1;
    for (int64_t k = 0; k < supers; k++) {
        uint16_t *sup = sb + k * packed_super_words(p);
        memcpy(&sup[i], (const uint8_t *)w->super_scales + 2 * (r * supers + k), 2);
        if (p->biased)
            memcpy(&sup[PACK_ROWS + i], (const uint8_t *)w->super_biases + 2 * (r * supers + k), 2);
        uint8_t *bytes = (uint8_t *)(sup + parts * PACK_ROWS);
        for (int64_t g = 0; g < per; g++) {
            uint8_t *dst = bytes + g * packed_sub_bytes(p);
            dst[i] = ((const uint8_t *)w->scales)[r * groups + k * per + g]; /* u4lo: both */
            if (p->biased && p->sc_type != DTYPE_U4LO)
                dst[PACK_ROWS + i] = ((const uint8_t *)w->biases)[r * groups + k * per + g];
        }
    }
}

static float half_value(dtype t, uint16_t h) {
    return t == DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

void packed_group_scales(const packed_mat *p, const uint16_t *sb, int64_t c, float sc[PACK_ROWS],
                         float bi[PACK_ROWS]) {
    const float unit = ldexpf(1.0f, -p->lut_shift); /* the codebook's fractional bits */
    const uint16_t *sup = NULL;
    const void *at = packed_group_at(p, sb, c, &sup);
    if (!p->super) {
        const uint16_t *g = at;
        for (int i = 0; i < PACK_ROWS; i++) {
            sc[i] = (packed_byte_scales(p) ? dtype_load_f32(p->sc_type, g, i)
                                           : half_value(p->sc_type, g[i])) *
                    unit;
            bi[i] = p->biased ? half_value(p->sc_type, g[PACK_ROWS + i]) : -(float)p->zero * sc[i];
        }
        return;
    }
    const uint8_t *g = at;
    const bool u4 = p->sc_type == DTYPE_U4LO;
    for (int i = 0; i < PACK_ROWS; i++) {
        const float q = u4                       ? (float)(g[i] & 15)
                        : p->sc_type == DTYPE_I8 ? (float)(int8_t)g[i]
                                                 : (float)g[i];
        sc[i] = f16_to_f32(sup[i]) * q * unit;
        bi[i] = p->biased
                    ? f16_to_f32(sup[PACK_ROWS + i]) * (float)(u4 ? g[i] >> 4 : g[PACK_ROWS + i])
                    : -(float)p->zero * sc[i];
    }
}

/* Row i of a tile from its codes q[cols]: packed_code's inverse. Nibble planes take a row's
 * bytes whole (vector s's byte j of row i holds runs 2s and 2s + 1); crumb planes place each
 * code by its field's byte and shift, worked out once for the QBLOCK columns of a block; bit
 * planes take a run's 4 bits of row i as one nibble of a byte. */
static void put_row(const packed_mat *p, uint8_t *tile, int i, const uint8_t *q) {
    const int per = 8 / p->lowbits, L = p->lowbits;
    const unsigned low = (1u << L) - 1u;
    const int64_t plane = packed_plane_bytes(p), block = packed_block_bytes(p);
    int at[QBLOCK], shift[QBLOCK];
    for (int c = 0; c < QBLOCK; c++)
        at[c] = c / 4 / per * PACK_STEP + i * 4 + c % 4, shift[c] = c / 4 % per * L;
    for (int64_t b = 0; b < p->cols / QBLOCK; b++) {
        uint8_t *blk = tile + b * block;
        const uint8_t *qb = q + b * QBLOCK;
        for (int pl = 0; pl < p->planes; pl++) {
            const int sh = (p->planes - 1 - pl) * L;
            if (L == 4)
                for (int s = 0; s < 4; s++)
                    for (int j = 0; j < 4; j++)
                        blk[pl * plane + s * PACK_STEP + i * 4 + j] =
                            (uint8_t)((qb[8 * s + j] >> sh & 15u) | (qb[8 * s + 4 + j] >> sh & 15u)
                                                                        << 4);
            else
                for (int c = 0; c < QBLOCK; c++)
                    blk[pl * plane + at[c]] |= (uint8_t)((qb[c] >> sh & low) << shift[c]);
        }
        for (int h = 0; h < p->hibits; h++)
            for (int e = 0; e < QBLOCK / 4; e++) {
                unsigned nib = 0;
                for (int j = 0; j < 4; j++) nib |= (qb[4 * e + j] >> (L + h) & 1u) << j;
                blk[p->planes * plane + h * PACK_STEP + 8 * e + i / 2] |=
                    (uint8_t)(nib << 4 * (i % 2));
            }
    }
}

static int log2_of(int64_t v) {
    int k = 0;
    while ((int64_t)1 << k < v) k++;
    return k;
}

/* Tiles of one matrix to pack, shared by the threads that take them. */
struct pack_job {
    const matview *w;
    const packed_mat *p;
    uint8_t *codes;
    uint16_t *sb;
    threadpool_counter counter;
    atomic_bool failed;
};

/* threadpool_fn: whole tiles at a time (two rows of a tile share its high planes' bytes). */
static void pack_tiles(void *arg, int ith, int nth) {
    struct pack_job *j = arg;
    const matview *w = j->w;
    const packed_mat *p = j->p;
    const int64_t tile_bytes = packed_tile_bytes(p), tile_sb = packed_tile_sb(p);
    uint8_t *q = malloc((size_t)w->cols);
    if (!q) {
        atomic_store(&j->failed, true);
        return;
    }
    int64_t lo, hi;
    while (threadpool_chunk(&j->counter, p->tiles, 4, &lo, &hi))
        for (int64_t t = lo; t < hi; t++)
            for (int64_t r = t * PACK_ROWS; r < w->rows && r < (t + 1) * PACK_ROWS; r++) {
                const int i = (int)(r - t * PACK_ROWS);
                matview_codes(q, w, r);
                put_row(p, j->codes + t * tile_bytes, i, q);
                pack_row_scales(w, p, j->sb + t * tile_sb, r, i);
            }
    free(q);
}

packed_mat *pack_matrix_on(const matview *w, arena *a, threadpool *pool) {
    dtype st = w->scale_type;
    if (!pack_supported(w) || (!w->super && !scale_format(w, &st))) return NULL;
    packed_mat *p = arena_alloc(a, sizeof *p);
    if (!p) return NULL;
    const int bits = w->quant_bits;
    *p = (packed_mat){.rows = w->rows,
                      .cols = w->cols,
                      .tiles = (w->rows + PACK_ROWS - 1) / PACK_ROWS,
                      .bits = bits,
                      .lowbits = bits <= 3 ? 2 : 4,
                      .planes = bits == 8 ? 2 : 1,
                      .hibits = bits == 3                ? 1
                                : bits == 5 || bits == 6 ? bits - 4
                                                         : 0,
                      .group = w->group,
                      .glog = log2_of(w->group),
                      .slog = w->super ? log2_of(w->super) : 0,
                      .sc_type = st,
                      .biased = w->biases != NULL,
                      .zero = w->lut ? 0 : w->zero,
                      .super = w->super,
                      .lut_shift = w->lut ? w->lut_shift : 0};
    if (w->lut) { /* the codebook's values */
        int8_t *lut = arena_alloc(a, 16);
        if (!lut) return NULL;
        memcpy(lut, w->lut, 16);
        p->lut = lut;
    }
    const int64_t tile_bytes = packed_tile_bytes(p), tile_sb = packed_tile_sb(p);
    uint8_t *codes = arena_alloc(a, (size_t)(p->tiles * tile_bytes));
    uint16_t *sb = arena_alloc(a, sizeof(uint16_t) * (size_t)(p->tiles * tile_sb));
    if (!codes || !sb) return NULL;
    memset(codes, 0, (size_t)(p->tiles * tile_bytes));
    memset(sb, 0, sizeof(uint16_t) * (size_t)(p->tiles * tile_sb));
    struct pack_job j = {w, p, codes, sb, .failed = false};
    atomic_store(&j.counter.next, 0);
    if (pool)
        threadpool_run(pool, pack_tiles, &j);
    else
        pack_tiles(&j, 0, 1);
    if (j.failed) return NULL;
    p->codes = codes;
    p->sb = sb;
    return p;
}

packed_mat *pack_matrix(const matview *w, arena *a) {
    return pack_matrix_on(w, a, NULL);
}

int64_t packed_bytes(const packed_mat *p) {
    return p->tiles * (packed_tile_bytes(p) + 2 * packed_tile_sb(p)) + (p->lut ? 16 : 0);
}

void packed_row(float *out, const packed_mat *p, int64_t r) {
    const int64_t t = r / PACK_ROWS, blocks = p->cols / QBLOCK;
    const int i = (int)(r % PACK_ROWS);
    const uint8_t *tile = p->codes + t * packed_tile_bytes(p);
    const uint16_t *sb = p->sb + t * packed_tile_sb(p);
    float sc[PACK_ROWS], bi[PACK_ROWS];
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *blk = tile + b * packed_block_bytes(p);
        for (int c = 0; c < QBLOCK; c++) {
            if (c % 16 == 0)
                packed_group_scales(p, sb, b * QBLOCK + c, sc, bi); /* groups of 16 and up */
            out[b * QBLOCK + c] = sc[i] * (float)packed_code(p, blk, i, c) + bi[i];
        }
    }
}

/* ==== A model's prepared set ==== */

celer_status pack_weights(const weight_set *ws, const backend_class *cls, int n_threads,
                          cpu_weights **out, celer_error *e) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    *out = NULL;
    threadpool *pool = NULL;
    cpu_weights *w = calloc(1, sizeof *w);
    if (w) w->mats = calloc((size_t)(ws->n_mats > 0 ? ws->n_mats : 1), sizeof *w->mats);
    if (!w || !w->mats) goto oom;
    w->base.cls = cls;
    w->n = ws->n_mats;
    pool = threadpool_create(n_threads > 0 ? n_threads : threadpool_cpu_count());
    if (!pool) goto oom;
    for (int64_t i = 0; i < ws->n_mats; i++) {
        const matview *m = ws->mats[i];
        CELER_ASSERT(m->id == i + 1);
        if (!pack_supported(m)) continue;
        if (!(w->mats[i] = pack_matrix_on(m, &w->mem, pool))) goto oom;
        if (ws->done) ws->done(ws->arg, m);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    w->base.bytes = (int64_t)w->mem.bytes;
    w->base.ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
    threadpool_destroy(pool);
    *out = w;
    return CELER_OK;
oom:
    threadpool_destroy(pool);
    pack_weights_free(w);
    return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory repacking weights");
}

void pack_weights_free(cpu_weights *w) {
    if (!w) return;
    arena_free(&w->mem);
    free(w->mats);
    free(w);
}

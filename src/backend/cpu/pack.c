/*
 * pack.c - repacking MLX affine matrices into the tiled layout of pack.h, and reading
 * rows back. Runs once per matrix at load; not a hot path.
 */
#define _POSIX_C_SOURCE 200809L
#include "backend/cpu/pack.h"

#include "base/half.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The 16-bit format the packed scales use for w, or false when F32 scales are exact in
 * neither f16 nor bf16. */
static bool scale_format(const matview *w, bool *bf16) {
    if (w->scale_type == DTYPE_F16 || w->scale_type == DTYPE_BF16) {
        *bf16 = w->scale_type == DTYPE_BF16;
        return true;
    }
    if (w->scale_type != DTYPE_F32) return false;
    const int64_t n = w->rows * (w->cols / w->group);
    bool f16_ok = true, bf16_ok = true;
    for (int64_t i = 0; i < n && (f16_ok || bf16_ok); i++)
        for (int k = 0; k < (w->biases ? 2 : 1); k++) {
            const float v = dtype_load_f32(DTYPE_F32, k ? w->biases : w->scales, i);
            f16_ok = f16_ok && f16_to_f32(f32_to_f16(v)) == v;
            bf16_ok = bf16_ok && bf16_to_f32(f32_to_bf16(v)) == v;
        }
    *bf16 = !f16_ok;
    return f16_ok || bf16_ok;
}

bool pack_supported(const matview *w) {
    bool bf16;
    const int bits = w->quant_bits;
    if ((bits != 4 && bits != 5 && bits != 6 && bits != 8) || w->group <= 0 ||
        (w->group % QBLOCK && w->group != 16) || w->cols % w->group || w->cols % QBLOCK ||
        (w->lut && (bits != 4 || w->lut_shift)))
        return false;
    if (w->super) /* K-quants: integer group scales under F16 factors */
        return bits != 8 && w->super % w->group == 0 && w->cols % w->super == 0 &&
               (w->scale_type == DTYPE_U8 || w->scale_type == DTYPE_I8);
    return scale_format(w, &bf16);
}

static uint16_t scale_bits(const matview *w, const void *p, int64_t i, bool bf16) {
    uint16_t h;
    if (w->scale_type != DTYPE_F32) {
        memcpy(&h, (const unsigned char *)p + 2 * i, 2);
        return h;
    }
    const float v = dtype_load_f32(DTYPE_F32, p, i);
    return bf16 ? f32_to_bf16(v) : f32_to_f16(v);
}

/* Row i of tile sb's scales: one-level 16-bit values, or the two-level factors and bytes. */
static void pack_row_scales(const matview *w, const packed_mat *p, uint16_t *sb, int64_t r, int i) {
    const int64_t groups = w->cols / w->group;
    if (!p->super) {
        const int parts = p->biased ? 2 : 1;
        for (int64_t g = 0; g < groups; g++) {
            uint16_t *dst = sb + g * parts * PACK_ROWS;
            dst[i] = scale_bits(w, w->scales, r * groups + g, p->bf16);
            if (p->biased) dst[PACK_ROWS + i] = scale_bits(w, w->biases, r * groups + g, p->bf16);
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
            uint8_t *dst = bytes + g * parts * PACK_ROWS;
            dst[i] = ((const uint8_t *)w->scales)[r * groups + k * per + g];
            if (p->biased)
                dst[PACK_ROWS + i] = ((const uint8_t *)w->biases)[r * groups + k * per + g];
        }
    }
}

void packed_group_scales(const packed_mat *p, const uint16_t *sb, int64_t c, float sc[PACK_ROWS],
                         float bi[PACK_ROWS]) {
    const int parts = p->biased ? 2 : 1;
    if (!p->super) {
        const uint16_t *g = sb + (c / p->group) * parts * PACK_ROWS;
        for (int i = 0; i < PACK_ROWS; i++) {
            sc[i] = p->bf16 ? bf16_to_f32(g[i]) : f16_to_f32(g[i]);
            bi[i] = p->biased
                        ? (p->bf16 ? bf16_to_f32(g[PACK_ROWS + i]) : f16_to_f32(g[PACK_ROWS + i]))
                        : -(float)p->zero * sc[i];
        }
        return;
    }
    const uint16_t *sup = sb + (c / p->super) * packed_super_words(p);
    const uint8_t *g =
        (const uint8_t *)(sup + parts * PACK_ROWS) + (c % p->super / p->group) * parts * PACK_ROWS;
    for (int i = 0; i < PACK_ROWS; i++) {
        sc[i] = f16_to_f32(sup[i]) * (p->sc_signed ? (float)(int8_t)g[i] : (float)g[i]);
        bi[i] = p->biased ? f16_to_f32(sup[PACK_ROWS + i]) * (float)g[PACK_ROWS + i]
                          : -(float)p->zero * sc[i];
    }
}

packed_mat *pack_matrix(const matview *w, arena *a) {
    bool bf16 = false;
    if (!pack_supported(w) || (!w->super && !scale_format(w, &bf16))) return NULL;
    packed_mat *p = arena_alloc(a, sizeof *p);
    if (!p) return NULL;
    const int bits = w->quant_bits;
    *p = (packed_mat){.rows = w->rows,
                      .cols = w->cols,
                      .tiles = (w->rows + PACK_ROWS - 1) / PACK_ROWS,
                      .bits = bits,
                      .planes = bits == 8 ? 2 : 1,
                      .hibits = bits == 5 || bits == 6 ? bits - 4 : 0,
                      .group = w->group,
                      .bf16 = bf16,
                      .biased = w->biases != NULL,
                      .zero = w->zero,
                      .super = w->super,
                      .sc_signed = w->scale_type == DTYPE_I8};
    if (w->lut) { /* the codebook's values */
        int8_t *lut = arena_alloc(a, 16);
        if (!lut) return NULL;
        memcpy(lut, w->lut, 16);
        p->lut = lut;
    }
    const int64_t tile_bytes = packed_tile_bytes(p), tile_sb = packed_tile_sb(p);
    const int64_t blocks = w->cols / QBLOCK, block_bytes = packed_block_bytes(p);
    uint8_t *codes = arena_alloc(a, (size_t)(p->tiles * tile_bytes));
    uint16_t *sb = arena_alloc(a, sizeof(uint16_t) * (size_t)(p->tiles * tile_sb));
    if (!codes || !sb) return NULL;
    memset(codes, 0, (size_t)(p->tiles * tile_bytes));
    memset(sb, 0, sizeof(uint16_t) * (size_t)(p->tiles * tile_sb));
    uint8_t *row = malloc((size_t)w->cols); /* one row's codes, unpacked */
    if (!row) return NULL;
    for (int64_t r = 0; r < w->rows; r++) {
        const int64_t t = r / PACK_ROWS;
        const int i = (int)(r % PACK_ROWS);
        for (int64_t c = 0; c < w->cols; c++) row[c] = (uint8_t)matview_code(w, r, c);
        for (int64_t b = 0; b < blocks; b++) {
            const uint8_t *col = row + b * QBLOCK;
            uint8_t *blk = codes + t * tile_bytes + b * block_bytes;
            for (int s = 0; s < 4; s++)
                for (int j = 0; j < 4; j++) {
                    const unsigned lo = col[8 * s + j], hi = col[8 * s + 4 + j];
                    if (p->planes == 1) {
                        blk[s * PACK_STEP + i * 4 + j] = (uint8_t)((lo & 15u) | (hi & 15u) << 4);
                    } else {
                        blk[s * PACK_STEP + i * 4 + j] = (uint8_t)(lo >> 4 | (hi >> 4) << 4);
                        blk[(4 + s) * PACK_STEP + i * 4 + j] =
                            (uint8_t)((lo & 15u) | (hi & 15u) << 4);
                    }
                    for (int h = 0; h < p->hibits; h++) { /* bit 4+h into the two masks of step s */
                        uint8_t *m = blk + 4 * PACK_STEP + h * PACK_STEP + s * 16;
                        const int bit = i * 4 + j;
                        m[bit / 8] |= (uint8_t)(((lo >> (4 + h)) & 1u) << (bit % 8));
                        m[8 + bit / 8] |= (uint8_t)(((hi >> (4 + h)) & 1u) << (bit % 8));
                    }
                }
        }
        pack_row_scales(w, p, sb + t * tile_sb, r, i);
    }
    free(row);
    p->codes = codes;
    p->sb = sb;
    return p;
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

celer_status pack_weights(const weight_set *ws, const backend_class *cls, cpu_weights **out,
                          celer_error *e) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    *out = NULL;
    cpu_weights *w = calloc(1, sizeof *w);
    if (w) w->mats = calloc((size_t)(ws->n_mats > 0 ? ws->n_mats : 1), sizeof *w->mats);
    if (!w || !w->mats) goto oom;
    w->base.cls = cls;
    w->n = ws->n_mats;
    for (int64_t i = 0; i < ws->n_mats; i++) {
        const matview *m = ws->mats[i];
        CELER_ASSERT(m->id == i + 1);
        if (!pack_supported(m)) continue;
        if (!(w->mats[i] = pack_matrix(m, &w->mem))) goto oom;
        if (ws->done) ws->done(ws->arg, m);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    w->base.bytes = (int64_t)w->mem.bytes;
    w->base.ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
    *out = w;
    return CELER_OK;
oom:
    pack_weights_free(w);
    return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory repacking weights");
}

void pack_weights_free(cpu_weights *w) {
    if (!w) return;
    arena_free(&w->mem);
    free(w->mats);
    free(w);
}

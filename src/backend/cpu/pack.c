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
    for (int64_t i = 0; i < n && (f16_ok || bf16_ok); i++) {
        const float v[2] = {dtype_load_f32(DTYPE_F32, w->scales, i), dtype_load_f32(DTYPE_F32, w->biases, i)};
        for (int k = 0; k < 2; k++) {
            f16_ok = f16_ok && f16_to_f32(f32_to_f16(v[k])) == v[k];
            bf16_ok = bf16_ok && bf16_to_f32(f32_to_bf16(v[k])) == v[k];
        }
    }
    *bf16 = !f16_ok;
    return f16_ok || bf16_ok;
}

bool pack_supported(const matview *w) {
    bool bf16;
    /* a zero point instead of biases, two-level scales (GGUF's K-quants) or a codebook (IQ4) is not packed */
    return (w->quant_bits == 4 || w->quant_bits == 8) && w->biases && !w->super && !w->lut && w->group > 0 && w->group % QBLOCK == 0 &&
           w->cols % w->group == 0 && scale_format(w, &bf16);
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

packed_mat *pack_matrix(const matview *w, arena *a) {
    bool bf16;
    if (!pack_supported(w) || !scale_format(w, &bf16)) return NULL;
    packed_mat *p = arena_alloc(a, sizeof *p);
    if (!p) return NULL;
    *p = (packed_mat){.rows = w->rows, .cols = w->cols, .tiles = (w->rows + PACK_ROWS - 1) / PACK_ROWS,
                      .bits = w->quant_bits, .planes = w->quant_bits == 8 ? 2 : 1,
                      .group = w->group, .bf16 = bf16};
    const int64_t tile_bytes = packed_tile_bytes(p), tile_sb = packed_tile_sb(p);
    const int64_t groups = w->cols / w->group, blocks = w->cols / QBLOCK;
    uint8_t *codes = arena_alloc(a, (size_t)(p->tiles * tile_bytes));
    uint16_t *sb = arena_alloc(a, sizeof(uint16_t) * (size_t)(p->tiles * tile_sb));
    if (!codes || !sb) return NULL;
    uint8_t *row = malloc((size_t)w->cols); /* one row's codes, unpacked */
    if (!row) return NULL;
    const int per_word = 32 / w->quant_bits;
    const uint32_t mask = (1u << w->quant_bits) - 1u;
    const unsigned char *src = w->data;
    for (int64_t r = 0; r < w->rows; r++) {
        const int64_t t = r / PACK_ROWS, i = r % PACK_ROWS;
        for (int64_t c = 0; c < w->cols; c += per_word) {
            uint32_t word;
            memcpy(&word, src + 4 * ((r * w->cols + c) / per_word), 4);
            for (int k = 0; k < per_word; k++) row[c + k] = (uint8_t)((word >> (k * w->quant_bits)) & mask);
        }
        for (int64_t b = 0; b < blocks; b++) {
            const uint8_t *col = row + b * QBLOCK;
            uint8_t *blk = codes + t * tile_bytes + b * p->planes * 4 * PACK_STEP + i * 4;
            for (int s = 0; s < 4; s++)
                for (int j = 0; j < 4; j++) {
                    const unsigned lo = col[8 * s + j], hi = col[8 * s + 4 + j];
                    if (p->planes == 1) {
                        blk[s * PACK_STEP + j] = (uint8_t)(lo | hi << 4);
                    } else {
                        blk[s * PACK_STEP + j] = (uint8_t)(lo >> 4 | (hi >> 4) << 4);
                        blk[(4 + s) * PACK_STEP + j] = (uint8_t)((lo & 15u) | (hi & 15u) << 4);
                    }
                }
        }
        for (int64_t g = 0; g < groups; g++) {
            uint16_t *dst = sb + t * tile_sb + g * 2 * PACK_ROWS;
            dst[i] = scale_bits(w, w->scales, r * groups + g, bf16);
            dst[PACK_ROWS + i] = scale_bits(w, w->biases, r * groups + g, bf16);
        }
    }
    free(row);
    p->codes = codes;
    p->sb = sb;
    return p;
}

static float sb_value(const packed_mat *p, uint16_t h) { return p->bf16 ? bf16_to_f32(h) : f16_to_f32(h); }

void packed_row(float *out, const packed_mat *p, int64_t r) {
    const int64_t t = r / PACK_ROWS, i = r % PACK_ROWS, blocks = p->cols / QBLOCK;
    const uint8_t *tile = p->codes + t * packed_tile_bytes(p);
    const uint16_t *sb = p->sb + t * packed_tile_sb(p);
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *blk = tile + b * p->planes * 4 * PACK_STEP;
        const int64_t g = b * QBLOCK / p->group;
        const float s = sb_value(p, sb[g * 2 * PACK_ROWS + i]), bias = sb_value(p, sb[g * 2 * PACK_ROWS + PACK_ROWS + i]);
        for (int st = 0; st < 4; st++)
            for (int j = 0; j < 4; j++) {
                unsigned lo = 0, hi = 0;
                for (int pl = 0; pl < p->planes; pl++) {
                    const uint8_t byte = blk[(pl * 4 + st) * PACK_STEP + i * 4 + j];
                    const unsigned mul = p->planes == 2 && pl == 0 ? 16u : 1u;
                    lo += mul * (byte & 15u);
                    hi += mul * (byte >> 4);
                }
                out[b * QBLOCK + 8 * st + j] = s * (float)lo + bias;
                out[b * QBLOCK + 8 * st + 4 + j] = s * (float)hi + bias;
            }
    }
}

/* ==== A model's prepared set ==== */

celer_status pack_weights(const weight_set *ws, const backend_class *cls, cpu_weights **out, celer_error *e) {
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

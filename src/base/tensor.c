/*
 * tensor.c - dtype names and sizes.
 */
#include "base/tensor.h"

#include "base/error.h"
#include "base/half.h"

#include <math.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtype_info[DTYPE_COUNT_] = {
    [DTYPE_UNKNOWN] = {"?", 0}, [DTYPE_F32] = {"F32", 4},       [DTYPE_F16] = {"F16", 2},
    [DTYPE_BF16] = {"BF16", 2}, [DTYPE_U32] = {"U32", 4},       [DTYPE_I32] = {"I32", 4},
    [DTYPE_U8] = {"U8", 1},     [DTYPE_I8] = {"I8", 1},         [DTYPE_F64] = {"F64", 8},
    [DTYPE_I64] = {"I64", 8},   [DTYPE_U16] = {"U16", 2},       [DTYPE_I16] = {"I16", 2},
    [DTYPE_BOOL] = {"BOOL", 1}, [DTYPE_U4LO] = {"U4LO", 1},     [DTYPE_U4HI] = {"U4HI", 1},
    [DTYPE_E8M0] = {"E8M0", 1}, [DTYPE_F8E4M3] = {"F8E4M3", 1},
};

size_t dtype_size(dtype t) {
    return (t > 0 && t < DTYPE_COUNT_) ? dtype_info[t].size : 0;
}

const char *dtype_name(dtype t) {
    return (t > 0 && t < DTYPE_COUNT_) ? dtype_info[t].name : "?";
}

dtype dtype_from_name(const char *s) {
    for (int t = 1; t < DTYPE_U4LO; t++) /* the nibble views are celer's own, never a file's */
        if (strcmp(dtype_info[t].name, s) == 0) return (dtype)t;
    return DTYPE_UNKNOWN;
}

/* Weights sit in the mmap at whatever offset the file gives them (MLX does not align
 * its safetensors data), so every load goes through memcpy: no unaligned typed access. */
float dtype_load_f32(dtype t, const void *p, int64_t i) {
    const unsigned char *b = p;
    float f;
    uint16_t h;
    switch (t) {
    case DTYPE_F32:
        memcpy(&f, b + 4 * i, 4);
        return f;
    case DTYPE_F16:
        memcpy(&h, b + 2 * i, 2);
        return f16_to_f32(h);
    case DTYPE_BF16:
        memcpy(&h, b + 2 * i, 2);
        return bf16_to_f32(h);
    case DTYPE_U8:
        return (float)b[i];
    case DTYPE_I8:
        return (float)(int8_t)b[i];
    case DTYPE_U4LO:
        return (float)(b[i] & 15);
    case DTYPE_U4HI:
        return (float)(b[i] >> 4);
    case DTYPE_E8M0:
        return b[i] == 255 ? NAN : ldexpf(1.0f, b[i] - 127);
    case DTYPE_F8E4M3: {
        const int e = (b[i] >> 3) & 15, m = b[i] & 7;
        const float v = e == 15 && m == 7 ? NAN
                        : e               ? ldexpf(1.0f + (float)m / 8.0f, e - 7)
                                          : ldexpf((float)m, -9);
        return b[i] & 0x80 ? -v : v;
    }
    default:
        CELER_ASSERT(!"bad weight dtype");
        return 0;
    }
}

uint32_t matview_code(const matview *w, int64_t r, int64_t c) {
    const int bits = w->quant_bits;
    const int64_t bit = c * bits;
    const unsigned char *row = (const unsigned char *)w->data + (size_t)(r * w->cols * bits / 8);
    uint32_t v = row[bit / 8];
    if (bit % 8 + bits > 8) v |= (uint32_t)row[bit / 8 + 1] << 8; /* the code spans two bytes */
    return (v >> (bit % 8)) & ((1u << bits) - 1u);
}

void matview_codes(uint8_t *out, const matview *w, int64_t r) {
    const int bits = w->quant_bits;
    const unsigned char *row = (const unsigned char *)w->data + (size_t)(r * w->cols * bits / 8);
    const uint32_t mask = (1u << bits) - 1u;
    if (bits == 8) {
        memcpy(out, row, (size_t)w->cols);
        return;
    }
    if (bits == 4) { /* two codes a byte, the low nibble first */
        for (int64_t c = 0; c < w->cols; c += 2)
            out[c] = row[c / 2] & 15u, out[c + 1] = (uint8_t)(row[c / 2] >> 4);
        return;
    }
    /* a bit buffer refilled a byte at a time: codes come out in order */
    uint32_t acc = 0;
    int have = 0;
    for (int64_t c = 0; c < w->cols; c++) {
        while (have < bits) acc |= (uint32_t)*row++ << have, have += 8;
        out[c] = (uint8_t)(acc & mask);
        acc >>= bits, have -= bits;
    }
}

void matview_row(float *out, const matview *w, int64_t r) {
    const int64_t cols = w->cols;
    if (w->quant_bits == 0) {
        for (int64_t c = 0; c < cols; c++) out[c] = dtype_load_f32(w->type, w->data, r * cols + c);
        return;
    }
    const int64_t groups = cols / w->group, supers = w->super ? cols / w->super : 0;
    const dtype bias_type = w->scale_type == DTYPE_U4LO ? DTYPE_U4HI : w->scale_type;
    for (int64_t g = 0; g < groups; g++) {
        float s = dtype_load_f32(w->scale_type, w->scales, r * groups + g), b = 0;
        if (w->super) { /* the super-block's factor times the group's integer: exact in fp32 */
            const int64_t k = r * supers + g * w->group / w->super;
            s = dtype_load_f32(DTYPE_F16, w->super_scales, k) * s;
            if (w->biases)
                b = dtype_load_f32(DTYPE_F16, w->super_biases, k) *
                    dtype_load_f32(bias_type, w->biases, r * groups + g);
        } else if (w->biases) {
            b = dtype_load_f32(w->scale_type, w->biases, r * groups + g);
        }
        if (!w->biases) {
            for (int64_t c = g * w->group; c < (g + 1) * w->group; c++) {
                const int q = (int)matview_code(w, r, c);
                out[c] =
                    s * (w->lut ? ldexpf((float)w->lut[q], -w->lut_shift) : (float)(q - w->zero));
            }
            continue;
        }
        for (int64_t c = g * w->group; c < (g + 1) * w->group; c++)
            out[c] = s * (float)matview_code(w, r, c) + b;
    }
}

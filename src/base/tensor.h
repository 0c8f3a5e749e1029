/*
 * tensor.h - plain views of weights: element types and the matrix view every matmul,
 * embedding lookup and LM head takes.
 *
 * A view never owns memory: its pointers reach into a read-only mmap (or a load-time
 * arena) and stay valid until the model is closed.
 */
#ifndef CELER_BASE_TENSOR_H
#define CELER_BASE_TENSOR_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum dtype {
    DTYPE_UNKNOWN = 0,
    DTYPE_F32,
    DTYPE_F16,
    DTYPE_BF16,
    DTYPE_U32,
    DTYPE_I32,
    DTYPE_U8,
    DTYPE_I8,
    DTYPE_F64,
    DTYPE_I64,
    DTYPE_U16,
    DTYPE_I16,
    DTYPE_BOOL,
    DTYPE_U4LO,   /* the low nibble of each byte (GGUF Q2_K's scales) */
    DTYPE_U4HI,   /* the high nibble of each byte (its mins, the same bytes) */
    DTYPE_E8M0,   /* a power of two, 2^(b - 127) (MLX mxfp4's scales) */
    DTYPE_F8E4M3, /* fp8: sign, 4 exponent bits biased 7, 3 mantissa bits (nvfp4's scales) */
    DTYPE_COUNT_
} dtype;

/* Bytes per element (0 for DTYPE_UNKNOWN). */
size_t dtype_size(dtype t);
/* The safetensors name ("F32", "BF16", ...). */
const char *dtype_name(dtype t);
/* Parses a safetensors dtype name; DTYPE_UNKNOWN when unknown. */
dtype dtype_from_name(const char *s);

/* A weight matrix W[rows, cols] used as y = x @ W^T (rows = outputs, cols = inputs).
 *
 * Dense (quant_bits == 0): data is [rows, cols] of dtype F32, F16 or BF16.
 * Affine (quant_bits 2 to 8, MLX's layout): data is uint32 codes [rows, cols * bits / 32],
 * each row a little-endian bit string with code c at bits c*bits .. c*bits+bits-1 (for 4
 * and 8 bits: element j of a word in bits j*bits ..); scales are [rows, cols / group] of
 * scale_type, and so are the biases, w[r, c] = scale[r, c/group] * q[r, c] + bias[r,
 * c/group]. Without biases (GGUF's symmetric blocks) the bias is -zero * scale:
 * w = scale * (q - zero), computed in that order (as ggml and gguf-py do).
 * Two-level scales (GGUF's K-quants, super > 0): scales and biases are small integers
 * (U8 or I8) per group, each a multiple of its super-block's F16 factor, super_scales and
 * super_biases [rows, cols / super]: scale = super_scale * scales[..], bias = super_bias *
 * biases[..] (super_biases NULL with a zero point). U4LO scales come with U4HI biases: the
 * two nibbles of the same bytes (GGUF Q2_K).
 * A codebook (GGUF's IQ4_NL and IQ4_XS, MLX's fp4 modes; lut non-NULL, no biases) maps each
 * code to an integer first: w = scale * lut[q] / 2^lut_shift (fp4's e2m1 values are halves). */
typedef struct matview {
    int64_t rows, cols;
    dtype type; /* dense element type, or DTYPE_U32 for affine codes */
    const void *data;
    int quant_bits; /* 0 = dense */
    int64_t group;  /* affine group size along cols */
    dtype scale_type;
    const void *scales, *biases; /* biases NULL: w = scale * (q - zero) */
    int zero;
    int64_t super;                           /* columns per super-block; 0: one-level scales */
    const void *super_scales, *super_biases; /* F16 [rows, cols / super] */
    const int8_t *lut;                       /* [1 << quant_bits] code values, or NULL */
    int lut_shift;                           /* fractional bits of the code values */
    int32_t id; /* 1 + index in its model's matrix list (a backend's prepared copy); 0: none */
} matview;

/* Element i of an F32/F16/BF16 (or U8/I8) array p (unaligned-safe). */
float dtype_load_f32(dtype t, const void *p, int64_t i);
/* Code c of row r of an affine matrix (the uint32 words of w->data, unaligned-safe). */
uint32_t matview_code(const matview *w, int64_t r, int64_t c);
/* Every code of row r (w quantized, codes of at most 8 bits): out[c] = matview_code(w, r, c). */
void matview_codes(uint8_t *out, const matview *w, int64_t r);
/* out[cols] = row r of w as floats (dense converted, affine dequantized). */
void matview_row(float *out, const matview *w, int64_t r);

/* One sequence's keys and values in the paged KV cache of one layer. The pools hold
 * [n_slots, hk * hd] floats; position p of the sequence lives in slot
 * blocks[p / block_size] * block_size + p % block_size. */
typedef struct kv_span {
    const void *k, *v; /* fp16 (f16 set) or fp32 values, [slots, hk*hd] */
    const int32_t *blocks;
    int64_t block_size;
    bool f16;
} kv_span;

static inline int64_t kv_span_slot(const kv_span *kv, int64_t pos) {
    return (int64_t)kv->blocks[pos / kv->block_size] * kv->block_size + pos % kv->block_size;
}

#endif

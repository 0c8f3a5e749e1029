/*
 * gguf.h - GGUF v2/v3 files (llama.cpp's format) as checkpoints.
 *
 * gguf_parse reads the header, metadata and tensor table of an untrusted buffer with
 * every length and offset checked. gguf_open_checkpoint then presents a GGUF file of
 * architecture llama, qwen2 or cohere2 as a checkpoint in the MLX layout: config.json fields are
 * synthesized from the metadata, tensors get their Hugging Face names, Q4_0/Q4_1/Q8_0
 * blocks are repacked losslessly into MLX affine codes with fp16 scales and biases
 * (group 32), and the q/k rows llama.cpp's converter permuted for its interleaved RoPE
 * are put back in order. The tokenizer metadata is kept for the tokenizer to read.
 */
#ifndef CELER_IO_GGUF_H
#define CELER_IO_GGUF_H

#include "io/checkpoint.h"

/* ggml tensor types celer reads. */
enum {
    GGML_F32 = 0,
    GGML_F16 = 1,
    GGML_Q4_0 = 2,
    GGML_Q4_1 = 3,
    GGML_Q5_0 = 6,
    GGML_Q5_1 = 7,
    GGML_Q8_0 = 8,
    GGML_Q2_K = 10,
    GGML_Q3_K = 11,
    GGML_Q4_K = 12,
    GGML_Q5_K = 13,
    GGML_Q6_K = 14,
    GGML_IQ4_NL = 20,
    GGML_IQ4_XS = 23,
    GGML_BF16 = 30
};

typedef enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT_
} gguf_type;

/* One metadata value; scalars are widened, strings and arrays point into the file. */
typedef struct gguf_value {
    gguf_type type;
    union {
        uint64_t u;
        int64_t i;
        double f;
    } num;
    const char *str; /* STRING: not NUL-terminated, str_len bytes */
    uint64_t str_len;
    gguf_type arr_type; /* ARRAY */
    uint64_t arr_len;
    const uint8_t *arr_data; /* first element */
} gguf_value;

typedef struct gguf_kv {
    char *key;
    gguf_value val;
} gguf_kv;

typedef struct gguf_tensor {
    char *name;
    uint32_t ggml_type;
    int ndim;
    int64_t ne[4]; /* ne[0] is the innermost (contiguous) dimension */
    const uint8_t *data;
    size_t nbytes;
} gguf_tensor;

typedef struct gguf_file {
    uint32_t version;
    gguf_kv *kv;
    size_t n_kv;
    gguf_tensor *tensors;
    size_t n_tensors;
    uint64_t alignment;
} gguf_file;

/* ggml's name of tensor type t ("Q4_K", "F32"), or "an unknown type". */
const char *gguf_type_name(uint32_t t);

/* Parses buf[len] (not copied). label names it in errors. Free with gguf_free (also
 * after a failure). */
celer_status gguf_parse(gguf_file *g, const char *label, const uint8_t *buf, size_t len,
                        celer_error *e);
void gguf_free(gguf_file *g);

const gguf_kv *gguf_find_kv(const gguf_file *g, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name);

/* Opens path (a .gguf file) into ck as described above. */
celer_status gguf_open_checkpoint(checkpoint *ck, const char *path, celer_error *e);
/* The converted matrices' memory (gguf_checkpoint.c): drop the whole pages of [p, p + n)
 * when they are ck's, fill every dropped matrix again from the file, unmap them all. */
void gguf_release_derived(const checkpoint *ck, const void *p, size_t n);
void gguf_restore_derived(checkpoint *ck);
void gguf_free_derived(checkpoint *ck);

#endif

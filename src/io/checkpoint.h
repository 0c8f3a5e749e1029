/*
 * checkpoint.h - an MLX / Hugging Face checkpoint directory: config.json, one or more
 * *.safetensors (sharded through model.safetensors.index.json), and the MLX
 * quantization settings (global block plus per-module overrides).
 *
 * It finds tensors and answers "how is module P quantized", and reads config fields with
 * errors that name the file and the field. It does not know any architecture.
 */
#ifndef CELER_IO_CHECKPOINT_H
#define CELER_IO_CHECKPOINT_H

#include "base/arena.h"
#include "base/error.h"
#include "io/safetensors.h"

#include <jansson.h>
#include <stdbool.h>

typedef struct checkpoint {
    char *dir;
    char *config_path;
    json_t *config;
    safetensors *shards;
    size_t n_shards;
    /* MLX quantization: the global block, and the object holding per-module entries. */
    bool has_quant;
    int quant_bits;
    int64_t quant_group;
    int quant_mode;      /* quant_mode of the global block */
    const json_t *quant; /* borrowed from config; NULL when has_quant is false */
    /* A GGUF file opened as a checkpoint: its map, parsed header and repacked tensors. */
    struct gguf_file *gguf;
    mapped_file gguf_map;
    mapped_file *gguf_parts; /* a split file's other parts (their tensors are in gguf's) */
    size_t n_gguf_parts;
    struct gguf_derived *derived; /* its converted matrices (gguf_checkpoint.c) */
    size_t n_derived;
    arena mem;
} checkpoint;

/* Opens a checkpoint directory, or a .gguf file (see gguf.h). */
celer_status checkpoint_open(checkpoint *ck, const char *path, celer_error *e);
void checkpoint_close(checkpoint *ck);
/* Drops the resident pages of every mapped file (see mapped_file_release): after a GGUF
 * file's blocks were converted, or after the weights were repacked. */
void checkpoint_release_pages(const checkpoint *ck);
/* The same for the pages of one range, when it lies in one of the mapped files or in a
 * converted GGUF matrix. A file's pages fault back in when read; converted ones do not:
 * call checkpoint_restore before anything reads them in place again. */
void checkpoint_release_range(const checkpoint *ck, const void *p, size_t n);
/* Converts again, from the file, every GGUF matrix some of whose pages went. */
void checkpoint_restore(checkpoint *ck);

/* Writes ck (opened from a GGUF file) as an MLX-layout directory dir: config.json with a
 * quantization block, and model.safetensors. */
celer_status checkpoint_write_mlx(const checkpoint *ck, const char *dir, celer_error *e);

/* The tensor called name in any shard, or NULL; *shard_path (if not NULL) names its file. */
const st_tensor *checkpoint_find(const checkpoint *ck, const char *name, const char **shard_path);

/* What config.json says about module path (e.g. "model.layers.0.mlp.down_proj"). */
typedef enum quant_rule {
    QUANT_RULE_SILENT,  /* no quantization block: go by the tensors */
    QUANT_RULE_DEFAULT, /* the global block applies (no per-module entry) */
    QUANT_RULE_MODULE,  /* a per-module {bits, group_size} entry */
    QUANT_RULE_DENSE,   /* a per-module `false`: stored unquantized */
} quant_rule;

/* MLX's quantization modes: affine codes, or fp4 (e2m1) codes under e8m0 scales per 32
 * (mxfp4) or e4m3 scales per 16 (nvfp4), without biases. */
typedef enum quant_mode { QUANT_AFFINE, QUANT_MXFP4, QUANT_NVFP4 } quant_mode;

typedef struct quant_spec {
    quant_rule rule;
    int bits;
    int64_t group;
    quant_mode mode;
} quant_spec;

celer_status checkpoint_quant_for(const checkpoint *ck, const char *module, quant_spec *q,
                                  celer_error *e);

/* ==== config.json fields: each reports the file and the field when wrong ==== */

/* Integer field; def when absent or null. Fails on a non-integer value. */
celer_status config_int(const checkpoint *ck, const json_t *obj, const char *key, int64_t def,
                        int64_t *out, celer_error *e);
/* Required integer field > 0. */
celer_status config_pos_int(const checkpoint *ck, const json_t *obj, const char *key, int64_t *out,
                            celer_error *e);
/* Number field (integer or real); def when absent or null. */
celer_status config_num(const checkpoint *ck, const json_t *obj, const char *key, double def,
                        double *out, celer_error *e);
/* Boolean field; def when absent or null. */
celer_status config_bool(const checkpoint *ck, const json_t *obj, const char *key, bool def,
                         bool *out, celer_error *e);
/* String field or NULL when absent or null (borrowed). Fails on a non-string. */
celer_status config_str(const checkpoint *ck, const json_t *obj, const char *key, const char **out,
                        celer_error *e);

#endif

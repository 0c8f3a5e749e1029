/*
 * checkpoint_write.c - writing a checkpoint as an MLX-layout directory: config.json and
 * one model.safetensors (tensors sorted by name, 8-byte aligned data).
 *
 * Used by `celer convert` to turn a GGUF file into the layout mlx-lm reads: the affine
 * codes, scales and biases the loader built are written as they are, with a
 * "quantization" block naming the most common bits and group size and a per-module
 * entry for every quantized module that differs.
 */
#define _POSIX_C_SOURCE 200809L
#include "io/checkpoint.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* bits and group of the quantized module whose codes are t. GGUF blocks always hold 32
 * values, so the loader's scales have cols / 32 columns. */
static bool module_quant(const checkpoint *ck, const st_tensor *t, int *bits, int64_t *group) {
    char name[300];
    const size_t base = strlen(t->name) - strlen(".weight");
    snprintf(name, sizeof name, "%.*s.scales", (int)base, t->name);
    const st_tensor *sc = checkpoint_find(ck, name, NULL);
    if (t->type != DTYPE_U32 || !sc || sc->ndim != 2 || t->ndim != 2 || sc->shape[1] == 0)
        return false;
    const int64_t cols = sc->shape[1] * 32;
    *group = 32;
    *bits = (int)(t->shape[1] * 32 / cols);
    return true;
}

static celer_status quant_block(const checkpoint *ck, json_t *cfg, celer_error *e) {
    int count[9] = {0};
    const safetensors *st = &ck->shards[0];
    for (size_t i = 0; i < st->n_tensors; i++) {
        int bits;
        int64_t group;
        if (ends_with(st->tensors[i].name, ".weight") &&
            module_quant(ck, &st->tensors[i], &bits, &group))
            count[bits]++;
    }
    int main_bits = 0; /* the most common width; 4 before 8 before the others on a tie */
    static const int order[] = {4, 8, 2, 3, 5, 6};
    for (int k = 0; k < 6; k++)
        if (count[order[k]] > (main_bits ? count[main_bits] : 0)) main_bits = order[k];
    if (!main_bits) return CELER_OK;
    json_t *q = json_pack("{s:i, s:i, s:s}", "group_size", 32, "bits", main_bits, "mode", "affine");
    if (!q) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < st->n_tensors; i++) {
        const st_tensor *t = &st->tensors[i];
        int bits;
        int64_t group;
        if (!ends_with(t->name, ".weight") || !module_quant(ck, t, &bits, &group)) continue;
        if (bits == main_bits && group == 32) continue;
        char module[300];
        snprintf(module, sizeof module, "%.*s", (int)(strlen(t->name) - strlen(".weight")),
                 t->name);
        json_object_set_new(q, module,
                            json_pack("{s:I, s:i, s:s}", "group_size", (json_int_t)group, "bits",
                                      bits, "mode", "affine"));
    }
    json_object_set(cfg, "quantization", q);
    json_object_set_new(cfg, "quantization_config", q);
    return CELER_OK;
}

static celer_status write_safetensors(const checkpoint *ck, const char *path, celer_error *e) {
    const safetensors *st = &ck->shards[0];
    json_t *h = json_pack("{s:{s:s}}", "__metadata__", "format", "mlx");
    uint64_t off = 0;
    for (size_t i = 0; i < st->n_tensors; i++) {
        const st_tensor *t = &st->tensors[i];
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_object_set_new(h, t->name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", dtype_name(t->type), "shape",
                                      shape, "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + t->nbytes)));
        off += t->nbytes;
    }
    char *text = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(h);
    if (!text) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    size_t hlen = strlen(text), padded = (hlen + 7) & ~(size_t)7;
    FILE *f = fopen(path, "wb");
    celer_status s = CELER_OK;
    if (!f) {
        free(text);
        return error_set(e, CELER_STATUS_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    bool ok = fwrite(len8, 1, 8, f) == 8 && fwrite(text, 1, hlen, f) == hlen;
    for (size_t i = hlen; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    for (size_t i = 0; ok && i < st->n_tensors; i++)
        ok = fwrite(st->tensors[i].data, 1, st->tensors[i].nbytes, f) == st->tensors[i].nbytes;
    if (fclose(f) != 0 || !ok) s = error_set(e, CELER_STATUS_IO, "%s: write failed", path);
    free(text);
    return s;
}

/* What MLX's affine layout cannot hold as the loader keeps it: a zero point instead of
 * biases (Q5_0), two levels of scales (the K-quants), a codebook (IQ4), codes of a width
 * MLX has no kernels for (7 bits). Q5_1 is MLX's 5-bit affine, group 32, as it is. */
static celer_status check_mlx_layout(const checkpoint *ck, celer_error *e) {
    const safetensors *st = &ck->shards[0];
    for (size_t i = 0; i < st->n_tensors; i++) {
        const st_tensor *t = &st->tensors[i];
        const char *why = ends_with(t->name, ".zero") ? "a zero point instead of biases (GGUF Q5_0)"
                          : ends_with(t->name, ".super_scales")
                              ? "two levels of scales (a GGUF K-quant)"
                          : ends_with(t->name, ".lut") ? "a codebook of code values (GGUF IQ4)"
                                                       : NULL;
        int bits;
        int64_t group;
        if (!why && ends_with(t->name, ".weight") && module_quant(ck, t, &bits, &group) &&
            (bits < 2 || bits == 7 || bits > 8))
            why = "codes of a width MLX has no layout for";
        if (why)
            return error_set(
                e, CELER_STATUS_UNSUPPORTED,
                "%s: tensor %s: %s; celer convert writes MLX's affine layout (2, 3, 4, 5, 6 or 8 bits, one level of scales and biases) only",
                ck->config_path, t->name, why);
    }
    return CELER_OK;
}

celer_status checkpoint_write_mlx(const checkpoint *ck, const char *dir, celer_error *e) {
    if (!ck->gguf)
        return error_set(e, CELER_STATUS_UNSUPPORTED,
                         "%s: only GGUF files convert (this is already a checkpoint directory)",
                         ck->dir);
    celer_status c = check_mlx_layout(ck, e);
    if (c != CELER_OK) return c;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return error_set(e, CELER_STATUS_IO, "%s: cannot create: %s", dir, strerror(errno));
    char path[4096];
    json_t *cfg = json_deep_copy(ck->config);
    if (!cfg) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    celer_status s = quant_block(ck, cfg, e);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (s == CELER_OK && json_dump_file(cfg, path, JSON_INDENT(4) | JSON_SORT_KEYS) != 0)
        s = error_set(e, CELER_STATUS_IO, "%s: cannot write", path);
    json_decref(cfg);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (s == CELER_OK) s = write_safetensors(ck, path, e);
    return s;
}

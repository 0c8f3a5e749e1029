/*
 * checkpoint.c - model directory resolution, shard lookup, quantization settings and
 * config.json field readers.
 */
#define _POSIX_C_SOURCE 200809L
#include "io/checkpoint.h"

#include "io/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Shard file names: from the index's weight_map, else the single model.safetensors. */
static celer_status list_shards(const char *dir, char ***names, size_t *n, celer_error *e) {
    *names = NULL;
    *n = 0;
    char *index_path = path_join(dir, "model.safetensors.index.json");
    if (!index_path) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    if (!file_exists(index_path)) {
        free(index_path);
        char *single = path_join(dir, "model.safetensors");
        if (!single) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        bool ok = file_exists(single);
        free(single);
        if (!ok)
            return error_set(e, CELER_STATUS_IO,
                             "%s: no model.safetensors or model.safetensors.index.json", dir);
        *names = malloc(sizeof **names);
        if (!*names || !((*names)[0] = strdup("model.safetensors"))) {
            free(*names);
            *names = NULL;
            return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        }
        *n = 1;
        return CELER_OK;
    }
    celer_status s = CELER_OK;
    json_error_t jerr;
    json_t *index = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    const json_t *map = index ? json_object_get(index, "weight_map") : NULL;
    if (!index) {
        s = error_set(e, CELER_STATUS_BAD_FILE, "%s: line %d column %d: %s", index_path, jerr.line,
                      jerr.column, jerr.text);
        goto out;
    }
    if (!json_is_object(map)) {
        s = error_set(e, CELER_STATUS_BAD_FILE, "%s: weight_map: expected an object", index_path);
        goto out;
    }
    size_t cap = json_object_size(map);
    char **v = calloc(cap ? cap : 1, sizeof *v);
    if (!v) {
        s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    *names = v;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)map, key, val) {
        const char *file = json_string_value(val);
        if (!file || strchr(file, '/') || strcmp(file, "..") == 0) {
            s = error_set(e, CELER_STATUS_BAD_FILE,
                          "%s: weight_map[%s]: expected a file name in the same directory",
                          index_path, key);
            goto out;
        }
        bool seen = false;
        for (size_t i = 0; i < *n && !seen; i++) seen = strcmp(v[i], file) == 0;
        if (seen) continue;
        if (!(v[*n] = strdup(file))) {
            s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
            goto out;
        }
        (*n)++;
    }
    qsort(v, *n, sizeof *v, cmp_str);
    if (*n == 0) s = error_set(e, CELER_STATUS_BAD_FILE, "%s: weight_map is empty", index_path);
out:
    json_decref(index);
    free(index_path);
    return s;
}

/* obj's "mode" (def when absent): "affine", "mxfp4" or "nvfp4". */
static celer_status read_mode(const checkpoint *ck, const json_t *obj, const char *field, int def,
                              int *out, celer_error *e) {
    const json_t *v = json_object_get(obj, "mode");
    const char *mode = json_string_value(v);
    *out = def;
    if (!v) return CELER_OK;
    if (mode && !strcmp(mode, "affine"))
        *out = QUANT_AFFINE;
    else if (mode && !strcmp(mode, "mxfp4"))
        *out = QUANT_MXFP4;
    else if (mode && !strcmp(mode, "nvfp4"))
        *out = QUANT_NVFP4;
    else
        return error_set(e, CELER_STATUS_UNSUPPORTED,
                         "%s: %s: expected \"affine\", \"mxfp4\" or \"nvfp4\", found %s",
                         ck->config_path, field, mode ? mode : "a non-string");
    return CELER_OK;
}

static celer_status read_quant(checkpoint *ck, celer_error *e) {
    const json_t *q = json_object_get(ck->config, "quantization");
    if (!q || json_is_null(q)) {
        /* Some files carry only quantization_config: MLX's copy, or a foreign method. */
        const json_t *qc = json_object_get(ck->config, "quantization_config");
        if (json_is_object(qc) && json_object_get(qc, "bits")) {
            q = qc;
        } else if (json_is_object(qc)) {
            const char *method = json_string_value(json_object_get(qc, "quant_method"));
            return error_set(e, CELER_STATUS_UNSUPPORTED,
                             "%s: quantization_config.quant_method: expected MLX affine "
                             "quantization, found %s",
                             ck->config_path, method ? method : "(unnamed)");
        } else {
            return CELER_OK;
        }
    }
    if (!json_is_object(q))
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: quantization: expected an object",
                         ck->config_path);
    int mode;
    celer_status ms = read_mode(ck, q, "quantization.mode", QUANT_AFFINE, &mode, e);
    if (ms != CELER_OK) return ms;
    ck->quant_mode = mode;
    int64_t bits, group;
    celer_status s;
    if ((s = config_pos_int(ck, q, "bits", &bits, e)) != CELER_OK) return s;
    if ((s = config_pos_int(ck, q, "group_size", &group, e)) != CELER_OK) return s;
    ck->has_quant = true;
    ck->quant_bits = (int)bits;
    ck->quant_group = group;
    ck->quant = q;
    return CELER_OK;
}

celer_status checkpoint_open(checkpoint *ck, const char *dir, celer_error *e) {
    memset(ck, 0, sizeof *ck);
    celer_status s = CELER_OK;
    char **names = NULL;
    size_t n_names = 0;
    struct stat st;
    if (stat(dir, &st) == 0 && S_ISREG(st.st_mode)) return gguf_open_checkpoint(ck, dir, e);
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        return error_set(e, CELER_STATUS_IO, "%s: not a checkpoint directory or .gguf file", dir);
    }
    if (!(ck->dir = strdup(dir)) || !(ck->config_path = path_join(dir, "config.json"))) {
        s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    json_error_t jerr;
    ck->config = json_load_file(ck->config_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!ck->config) {
        s = file_exists(ck->config_path)
                ? error_set(e, CELER_STATUS_BAD_CONFIG, "%s: line %d column %d: %s",
                            ck->config_path, jerr.line, jerr.column, jerr.text)
                : error_set(e, CELER_STATUS_IO, "%s: cannot open", ck->config_path);
        goto fail;
    }
    if (!json_is_object(ck->config)) {
        s = error_set(e, CELER_STATUS_BAD_CONFIG, "%s: expected a JSON object", ck->config_path);
        goto fail;
    }
    if ((s = read_quant(ck, e)) != CELER_OK) goto fail;
    if ((s = list_shards(dir, &names, &n_names, e)) != CELER_OK) goto fail;
    if (!(ck->shards = calloc(n_names, sizeof *ck->shards))) {
        s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < n_names; i++) {
        char *path = path_join(dir, names[i]);
        if (!path) {
            s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
            goto fail;
        }
        s = safetensors_open(&ck->shards[i], path, e);
        free(path);
        if (s != CELER_OK) goto fail;
        ck->n_shards++;
    }
    goto done;
fail:
    checkpoint_close(ck);
done:
    for (size_t i = 0; i < n_names; i++) free(names[i]);
    free(names);
    return s;
}

void checkpoint_close(checkpoint *ck) {
    for (size_t i = 0; i < ck->n_shards; i++) safetensors_close(&ck->shards[i]);
    free(ck->shards);
    json_decref(ck->config);
    if (ck->gguf) gguf_free(ck->gguf);
    free(ck->gguf);
    gguf_free_derived(ck);
    mapped_file_close(&ck->gguf_map);
    for (size_t i = 0; i < ck->n_gguf_parts; i++) mapped_file_close(&ck->gguf_parts[i]);
    free(ck->gguf_parts);
    arena_free(&ck->mem);
    free(ck->config_path);
    free(ck->dir);
    memset(ck, 0, sizeof *ck);
}

const st_tensor *checkpoint_find(const checkpoint *ck, const char *name, const char **shard_path) {
    for (size_t i = 0; i < ck->n_shards; i++) {
        const st_tensor *t = safetensors_find(&ck->shards[i], name);
        if (t) {
            if (shard_path) *shard_path = ck->shards[i].path;
            return t;
        }
    }
    return NULL;
}

celer_status checkpoint_quant_for(const checkpoint *ck, const char *module, quant_spec *q,
                                  celer_error *e) {
    memset(q, 0, sizeof *q);
    if (!ck->has_quant) {
        q->rule = QUANT_RULE_SILENT;
        return CELER_OK;
    }
    const json_t *m = json_object_get(ck->quant, module);
    if (!m) {
        q->rule = QUANT_RULE_DEFAULT;
        q->bits = ck->quant_bits;
        q->group = ck->quant_group;
        q->mode = ck->quant_mode;
        return CELER_OK;
    }
    if (json_is_false(m)) {
        q->rule = QUANT_RULE_DENSE;
        return CELER_OK;
    }
    if (!json_is_object(m))
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: quantization.%s: expected an object or false", ck->config_path,
                         module);
    char field[300];
    snprintf(field, sizeof field, "quantization.%s.mode", module);
    int mode;
    celer_status s = read_mode(ck, m, field, ck->quant_mode, &mode, e);
    if (s != CELER_OK) return s;
    q->mode = mode;
    int64_t bits, group;
    if ((s = config_int(ck, m, "bits", ck->quant_bits, &bits, e)) != CELER_OK) return s;
    if ((s = config_int(ck, m, "group_size", ck->quant_group, &group, e)) != CELER_OK) return s;
    q->rule = QUANT_RULE_MODULE;
    q->bits = (int)bits;
    q->group = group;
    return CELER_OK;
}

/* ==== config.json fields ==== */

celer_status config_int(const checkpoint *ck, const json_t *obj, const char *key, int64_t def,
                        int64_t *out, celer_error *e) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return CELER_OK;
    }
    if (json_is_real(v) && json_real_value(v) == (double)(int64_t)json_real_value(v)) {
        *out = (int64_t)json_real_value(v);
        return CELER_OK;
    }
    if (!json_is_integer(v))
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: %s: expected an integer", ck->config_path,
                         key);
    *out = json_integer_value(v);
    return CELER_OK;
}

celer_status config_pos_int(const checkpoint *ck, const json_t *obj, const char *key, int64_t *out,
                            celer_error *e) {
    celer_status s = config_int(ck, obj, key, -1, out, e);
    if (s != CELER_OK) return s;
    if (!json_object_get(obj, key) || json_is_null(json_object_get(obj, key)))
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: %s: required field is missing",
                         ck->config_path, key);
    if (*out <= 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: %s: expected a positive integer, found %lld", ck->config_path, key,
                         (long long)*out);
    return CELER_OK;
}

celer_status config_num(const checkpoint *ck, const json_t *obj, const char *key, double def,
                        double *out, celer_error *e) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return CELER_OK;
    }
    if (!json_is_number(v))
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: %s: expected a number", ck->config_path,
                         key);
    *out = json_number_value(v);
    return CELER_OK;
}

celer_status config_bool(const checkpoint *ck, const json_t *obj, const char *key, bool def,
                         bool *out, celer_error *e) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return CELER_OK;
    }
    if (!json_is_boolean(v))
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: %s: expected true or false",
                         ck->config_path, key);
    *out = json_is_true(v);
    return CELER_OK;
}

celer_status config_str(const checkpoint *ck, const json_t *obj, const char *key, const char **out,
                        celer_error *e) {
    const json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v || json_is_null(v)) return CELER_OK;
    if (!json_is_string(v))
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: %s: expected a string", ck->config_path,
                         key);
    *out = json_string_value(v);
    return CELER_OK;
}

void checkpoint_release_pages(const checkpoint *ck) {
    mapped_file_release(&ck->gguf_map);
    for (size_t i = 0; i < ck->n_gguf_parts; i++) mapped_file_release(&ck->gguf_parts[i]);
    for (size_t i = 0; i < ck->n_shards; i++) mapped_file_release(&ck->shards[i].map);
}

void checkpoint_release_range(const checkpoint *ck, const void *p, size_t n) {
    mapped_file_release_range(&ck->gguf_map, p, n);
    for (size_t i = 0; i < ck->n_gguf_parts; i++)
        mapped_file_release_range(&ck->gguf_parts[i], p, n);
    for (size_t i = 0; i < ck->n_shards; i++) mapped_file_release_range(&ck->shards[i].map, p, n);
    gguf_release_derived(ck, p, n);
}

void checkpoint_restore(checkpoint *ck) {
    gguf_restore_derived(ck);
}

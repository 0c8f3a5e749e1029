/*
 * safetensors.c - the safetensors header parser. Untrusted input: every length and
 * offset is checked before use; this is the fuzz target's entry point.
 */
#define _POSIX_C_SOURCE 200809L
#include "io/safetensors.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Headers above this are refused rather than parsed (the format's own limit is 100 MB). */
#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

const char *shape_str(char *buf, size_t size, const int64_t *shape, int ndim) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, size - k, "[");
    for (int i = 0; i < ndim && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (k < size) snprintf(buf + k, size - k, "]");
    return buf;
}

static int cmp_by_name(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static int cmp_by_offset(const void *a, const void *b) {
    const st_tensor *x = a, *y = b;
    if (x->data != y->data) return x->data < y->data ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Reads a non-negative JSON integer into *v; 0 on success. */
static int json_u64(const json_t *j, uint64_t *v) {
    if (!json_is_integer(j)) return -1;
    json_int_t x = json_integer_value(j);
    if (x < 0) return -1;
    *v = (uint64_t)x;
    return 0;
}

/* One header entry -> t. data_len is the size of the data section. */
static celer_status parse_entry(st_tensor *t, const char *label, const char *name,
                                const json_t *obj, const uint8_t *data, uint64_t data_len,
                                celer_error *e) {
    if (!json_is_object(obj))
        return error_set(e, CELER_STATUS_BAD_FILE, "%s: tensor %s: header entry is not an object",
                         label, name);
    const json_t *jd = json_object_get(obj, "dtype");
    const json_t *js = json_object_get(obj, "shape");
    const json_t *jo = json_object_get(obj, "data_offsets");
    if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo))
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: tensor %s: expected dtype, shape and data_offsets", label, name);
    t->type = dtype_from_name(json_string_value(jd));
    if (t->type == DTYPE_UNKNOWN)
        return error_set(e, CELER_STATUS_UNSUPPORTED, "%s: tensor %s: dtype %s is not supported",
                         label, name, json_string_value(jd));
    size_t nd = json_array_size(js);
    if (nd > ST_MAX_DIMS)
        return error_set(e, CELER_STATUS_BAD_FILE, "%s: tensor %s: %zu dimensions, at most %d",
                         label, name, nd, ST_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t count = 1;
    for (size_t i = 0; i < nd; i++) {
        uint64_t dim;
        if (json_u64(json_array_get(js, i), &dim) != 0 || dim > INT64_MAX)
            return error_set(e, CELER_STATUS_BAD_FILE,
                             "%s: tensor %s: shape[%zu] is not a non-negative integer", label,
                             name, i);
        t->shape[i] = (int64_t)dim;
        if (dim != 0 && count > UINT64_MAX / dim)
            return error_set(e, CELER_STATUS_BAD_FILE, "%s: tensor %s: element count overflows",
                             label, name);
        count *= dim;
    }
    uint64_t esize = dtype_size(t->type), begin, end;
    if (count > UINT64_MAX / esize)
        return error_set(e, CELER_STATUS_BAD_FILE, "%s: tensor %s: byte size overflows", label,
                         name);
    if (json_array_size(jo) != 2 || json_u64(json_array_get(jo, 0), &begin) != 0 ||
        json_u64(json_array_get(jo, 1), &end) != 0)
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: tensor %s: data_offsets must be two non-negative integers", label,
                         name);
    if (begin > end || end > data_len)
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: tensor %s: data_offsets [%llu, %llu] outside the data section "
                         "(%llu bytes)",
                         label, name, (unsigned long long)begin, (unsigned long long)end,
                         (unsigned long long)data_len);
    if (end - begin != count * esize)
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: tensor %s: data_offsets span %llu bytes, expected %llu for %s %s",
                         label, name, (unsigned long long)(end - begin),
                         (unsigned long long)(count * esize), dtype_name(t->type),
                         shape_str((char[160]){0}, 160, t->shape, t->ndim));
    t->data = data + begin;
    t->nbytes = (size_t)(end - begin);
    return CELER_OK;
}

celer_status safetensors_parse(safetensors *st, const char *label, const uint8_t *buf,
                               size_t len, celer_error *e) {
    celer_status s = CELER_OK;
    json_t *root = NULL;
    if (!st->path && !(st->path = strdup(label)))
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "%s: out of memory", label);
    if (len < 8)
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: truncated: %zu bytes, expected at least the 8-byte header length",
                         label, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > len - 8)
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: header length %llu runs past the end of the file (%zu bytes)",
                         label, (unsigned long long)hlen, len);
    if (hlen > ST_MAX_HEADER)
        return error_set(e, CELER_STATUS_BAD_FILE, "%s: header length %llu exceeds %llu", label,
                         (unsigned long long)hlen, (unsigned long long)ST_MAX_HEADER);
    json_error_t jerr;
    root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return error_set(e, CELER_STATUS_BAD_FILE, "%s: header JSON, line %d column %d: %s",
                         label, jerr.line, jerr.column, jerr.text);
    if (!json_is_object(root)) {
        s = error_set(e, CELER_STATUS_BAD_FILE, "%s: header JSON is not an object", label);
        goto out;
    }
    size_t cap = json_object_size(root);
    st->tensors = calloc(cap ? cap : 1, sizeof *st->tensors);
    if (!st->tensors) {
        s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "%s: out of memory", label);
        goto out;
    }
    const uint8_t *data = buf + 8 + hlen;
    uint64_t data_len = len - 8 - hlen;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        st_tensor *t = &st->tensors[st->n_tensors];
        if ((s = parse_entry(t, label, key, val, data, data_len, e)) != CELER_OK) goto out;
        if (!(t->name = strdup(key))) {
            s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "%s: out of memory", label);
            goto out;
        }
        st->n_tensors++;
    }
    /* No two tensors may share bytes: sort by offset and check neighbours. */
    qsort(st->tensors, st->n_tensors, sizeof *st->tensors, cmp_by_offset);
    for (size_t i = 1; i < st->n_tensors; i++) {
        const st_tensor *a = &st->tensors[i - 1], *b = &st->tensors[i];
        if (a->nbytes && b->nbytes && b->data < a->data + a->nbytes) {
            s = error_set(e, CELER_STATUS_BAD_FILE,
                          "%s: tensors %s and %s overlap (data_offsets [%zu, %zu] and "
                          "[%zu, %zu])",
                          label, a->name, b->name, (size_t)(a->data - data),
                          (size_t)(a->data - data) + a->nbytes, (size_t)(b->data - data),
                          (size_t)(b->data - data) + b->nbytes);
            goto out;
        }
    }
    qsort(st->tensors, st->n_tensors, sizeof *st->tensors, cmp_by_name);
out:
    json_decref(root);
    return s;
}

celer_status safetensors_open(safetensors *st, const char *path, celer_error *e) {
    memset(st, 0, sizeof *st);
    celer_status s = mapped_file_open(path, &st->map, e);
    if (s != CELER_OK) return s;
    s = safetensors_parse(st, path, st->map.data, st->map.size, e);
    if (s != CELER_OK) safetensors_close(st);
    return s;
}

void safetensors_close(safetensors *st) {
    for (size_t i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    free(st->path);
    mapped_file_close(&st->map);
    memset(st, 0, sizeof *st);
}

void safetensors_index(safetensors *st) {
    qsort(st->tensors, st->n_tensors, sizeof *st->tensors, cmp_by_name);
}

const st_tensor *safetensors_find(const safetensors *st, const char *name) {
    st_tensor key = {.name = (char *)name};
    return bsearch(&key, st->tensors, st->n_tensors, sizeof key, cmp_by_name);
}

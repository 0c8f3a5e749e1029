/*
 * safetensors.h - parse and map .safetensors files.
 *
 * Layout: u64 little-endian header length H, H bytes of JSON
 * {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the data.
 * Every offset is checked with overflow-safe arithmetic; tensors may not overlap or leave
 * the file. Views into the map are const and valid until safetensors_close. This module
 * does not know what the tensors mean.
 */
#ifndef CELER_IO_SAFETENSORS_H
#define CELER_IO_SAFETENSORS_H

#include "base/error.h"
#include "base/mapped_file.h"
#include "base/tensor.h"

#define ST_MAX_DIMS 8

typedef struct st_tensor {
    char *name;
    dtype type;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const uint8_t *data; /* into the file's bytes */
    size_t nbytes;
} st_tensor;

typedef struct safetensors {
    char *path;         /* for error messages */
    mapped_file map;    /* empty when parsed from a caller buffer */
    st_tensor *tensors; /* sorted by name */
    size_t n_tensors;
} safetensors;

/* Parses buf[len] (not copied; it must outlive st). label names it in errors. */
celer_status safetensors_parse(safetensors *st, const char *label, const uint8_t *buf,
                               size_t len, celer_error *e);
/* Maps and parses a file. */
celer_status safetensors_open(safetensors *st, const char *path, celer_error *e);
/* Frees everything; safe on a zeroed or half-built struct. */
void safetensors_close(safetensors *st);

/* Sorts st->tensors by name, for a table built by hand (as GGUF loading does). */
void safetensors_index(safetensors *st);

/* The tensor called name, or NULL. */
const st_tensor *safetensors_find(const safetensors *st, const char *name);

/* "[a, b, c]" into buf, for messages. */
const char *shape_str(char *buf, size_t size, const int64_t *shape, int ndim);

#endif

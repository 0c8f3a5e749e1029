/*
 * tensor.c - dtype names and sizes.
 */
#include "base/tensor.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtype_info[DTYPE_COUNT_] = {
    [DTYPE_UNKNOWN] = {"?", 0}, [DTYPE_F32] = {"F32", 4},   [DTYPE_F16] = {"F16", 2},
    [DTYPE_BF16] = {"BF16", 2}, [DTYPE_U32] = {"U32", 4},   [DTYPE_I32] = {"I32", 4},
    [DTYPE_U8] = {"U8", 1},     [DTYPE_I8] = {"I8", 1},     [DTYPE_F64] = {"F64", 8},
    [DTYPE_I64] = {"I64", 8},   [DTYPE_U16] = {"U16", 2},   [DTYPE_I16] = {"I16", 2},
    [DTYPE_BOOL] = {"BOOL", 1},
};

size_t dtype_size(dtype t) { return (t > 0 && t < DTYPE_COUNT_) ? dtype_info[t].size : 0; }

const char *dtype_name(dtype t) { return (t > 0 && t < DTYPE_COUNT_) ? dtype_info[t].name : "?"; }

dtype dtype_from_name(const char *s) {
    for (int t = 1; t < DTYPE_COUNT_; t++)
        if (strcmp(dtype_info[t].name, s) == 0) return (dtype)t;
    return DTYPE_UNKNOWN;
}

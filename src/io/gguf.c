/*
 * gguf.c - the GGUF parser and its mapping onto the checkpoint layout (see gguf.h).
 *
 * Untrusted input: a cursor reads every field with a bounds check, counts are checked
 * against the bytes that remain before anything is allocated, and tensor data must lie
 * inside the file. This is the fuzz target's entry point.
 */
#define _POSIX_C_SOURCE 200809L
#include "io/gguf.h"

#include "base/half.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QK   32  /* elements per Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 block */
#define QK_K 256 /* elements per K-quant super-block */

/* ==== Parsing ==== */

typedef struct cursor {
    const uint8_t *p, *end;
    const char *label;
    celer_error *e;
    celer_status s;
} cursor;

static bool need(cursor *c, uint64_t n, const char *what) {
    if (c->s != CELER_OK) return false;
    if ((uint64_t)(c->end - c->p) < n) {
        c->s = error_set(c->e, CELER_STATUS_BAD_FILE, "%s: truncated while reading %s", c->label,
                         what);
        return false;
    }
    return true;
}

static uint64_t rd_u(cursor *c, int size, const char *what) {
    if (!need(c, (uint64_t)size, what)) return 0;
    uint64_t v = 0;
    for (int i = size - 1; i >= 0; i--) v = v << 8 | c->p[i];
    c->p += size;
    return v;
}

static const char *rd_str(cursor *c, uint64_t *len, const char *what) {
    *len = rd_u(c, 8, what);
    if (!need(c, *len, what)) return NULL;
    const char *s = (const char *)c->p;
    c->p += *len;
    return s;
}

static const int type_size[GGUF_TYPE_COUNT_] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

static void rd_scalar(cursor *c, gguf_type t, gguf_value *v, const char *what) {
    uint64_t raw = rd_u(c, type_size[t], what);
    switch (t) {
    case GGUF_TYPE_INT8:
        v->num.i = (int8_t)raw;
        break;
    case GGUF_TYPE_INT16:
        v->num.i = (int16_t)raw;
        break;
    case GGUF_TYPE_INT32:
        v->num.i = (int32_t)raw;
        break;
    case GGUF_TYPE_INT64:
        v->num.i = (int64_t)raw;
        break;
    case GGUF_TYPE_FLOAT32:
        v->num.f = f32_from_bits((uint32_t)raw);
        break;
    case GGUF_TYPE_FLOAT64:
        memcpy(&v->num.f, &raw, 8);
        break;
    default:
        v->num.u = raw;
        break;
    }
}

static void rd_value(cursor *c, gguf_type t, gguf_value *v, const char *key) {
    v->type = t;
    if (t >= GGUF_TYPE_COUNT_) {
        c->s = error_set(c->e, CELER_STATUS_BAD_FILE, "%s: metadata %s: unknown value type %u",
                         c->label, key, t);
        return;
    }
    if (t == GGUF_TYPE_STRING) {
        v->str = rd_str(c, &v->str_len, key);
        return;
    }
    if (t != GGUF_TYPE_ARRAY) {
        rd_scalar(c, t, v, key);
        return;
    }
    v->arr_type = (gguf_type)rd_u(c, 4, key);
    v->arr_len = rd_u(c, 8, key);
    v->arr_data = c->p;
    if (c->s != CELER_OK) return;
    if (v->arr_type >= GGUF_TYPE_COUNT_ || v->arr_type == GGUF_TYPE_ARRAY) {
        c->s = error_set(c->e, CELER_STATUS_BAD_FILE,
                         "%s: metadata %s: unsupported array element type %u", c->label, key,
                         v->arr_type);
        return;
    }
    if (v->arr_type == GGUF_TYPE_STRING) {
        for (uint64_t i = 0; i < v->arr_len && c->s == CELER_OK; i++) {
            uint64_t len;
            rd_str(c, &len, key);
        }
        return;
    }
    const uint64_t es = (uint64_t)type_size[v->arr_type];
    if (v->arr_len > (uint64_t)(c->end - c->p) / es) {
        c->s = error_set(c->e, CELER_STATUS_BAD_FILE,
                         "%s: metadata %s: array of %llu elements runs past the end", c->label, key,
                         (unsigned long long)v->arr_len);
        return;
    }
    c->p += v->arr_len * es;
}

/* Bytes of a tensor of ggml type t with ne[0] x rows elements; 0 when unsupported. */
static uint64_t ggml_row_bytes(uint32_t t, int64_t ne0) {
    switch (t) {
    case GGML_F32:
        return 4 * (uint64_t)ne0;
    case GGML_F16:
    case GGML_BF16:
        return 2 * (uint64_t)ne0;
    case GGML_Q4_0:
        return ne0 % QK ? 0 : (uint64_t)ne0 / QK * 18;
    case GGML_Q4_1:
        return ne0 % QK ? 0 : (uint64_t)ne0 / QK * 20;
    case GGML_Q5_0:
        return ne0 % QK ? 0 : (uint64_t)ne0 / QK * 22;
    case GGML_Q5_1:
        return ne0 % QK ? 0 : (uint64_t)ne0 / QK * 24;
    case GGML_IQ4_NL:
        return ne0 % QK ? 0 : (uint64_t)ne0 / QK * 18;
    case GGML_Q2_K:
        return ne0 % QK_K ? 0 : (uint64_t)ne0 / QK_K * 84;
    case GGML_Q3_K:
        return ne0 % QK_K ? 0 : (uint64_t)ne0 / QK_K * 110;
    case GGML_Q4_K:
        return ne0 % QK_K ? 0 : (uint64_t)ne0 / QK_K * 144;
    case GGML_Q5_K:
        return ne0 % QK_K ? 0 : (uint64_t)ne0 / QK_K * 176;
    case GGML_Q6_K:
        return ne0 % QK_K ? 0 : (uint64_t)ne0 / QK_K * 210;
    case GGML_IQ4_XS:
        return ne0 % QK_K ? 0 : (uint64_t)ne0 / QK_K * 136;
    case GGML_Q8_0:
        return ne0 % QK ? 0 : (uint64_t)ne0 / QK * 34;
    default:
        return 0;
    }
}

const char *gguf_type_name(uint32_t t) {
    static const char *const names[] = {"F32",     "F16",   "Q4_0",   "Q4_1",  "Q4_2",    "Q4_3",
                                        "Q5_0",    "Q5_1",  "Q8_0",   "Q8_1",  "Q2_K",    "Q3_K",
                                        "Q4_K",    "Q5_K",  "Q6_K",   "Q8_K",  "IQ2_XXS", "IQ2_XS",
                                        "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S",   "IQ4_XS",
                                        "I8",      "I16",   "I32",    "I64",   "F64",     "IQ1_M"};
    if (t < sizeof names / sizeof *names) return names[t];
    return t == GGML_BF16 ? "BF16" : "an unknown type";
}

celer_status gguf_parse(gguf_file *g, const char *label, const uint8_t *buf, size_t len,
                        celer_error *e) {
    memset(g, 0, sizeof *g);
    cursor c = {buf, buf + len, label, e, CELER_OK};
    if (len < 4 || memcmp(buf, "GGUF", 4) != 0)
        return error_set(e, CELER_STATUS_BAD_FILE, "%s: not a GGUF file (expected magic \"GGUF\")",
                         label);
    c.p += 4;
    g->version = (uint32_t)rd_u(&c, 4, "the version");
    uint64_t n_tensors = rd_u(&c, 8, "the tensor count"), n_kv = rd_u(&c, 8, "the metadata count");
    if (c.s != CELER_OK) return c.s;
    if (g->version != 2 && g->version != 3)
        return error_set(e, CELER_STATUS_UNSUPPORTED, "%s: GGUF version %u (expected 2 or 3)",
                         label, g->version);
    /* Each entry takes at least 12 (kv) or 24 (tensor) bytes: bound the counts first. */
    const uint64_t left = (uint64_t)(c.end - c.p);
    if (n_kv > left / 12 || n_tensors > left / 24)
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: %llu metadata entries and %llu tensors cannot fit in %zu bytes",
                         label, (unsigned long long)n_kv, (unsigned long long)n_tensors, len);
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors)
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "%s: out of memory", label);
    g->alignment = 32;
    for (uint64_t i = 0; i < n_kv && c.s == CELER_OK; i++) {
        uint64_t klen;
        const char *k = rd_str(&c, &klen, "a metadata key");
        if (c.s != CELER_OK) break;
        gguf_kv *kv = &g->kv[g->n_kv];
        if (!(kv->key = strndup(k, klen)))
            return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        g->n_kv++;
        rd_value(&c, (gguf_type)rd_u(&c, 4, kv->key), &kv->val, kv->key);
        if (c.s == CELER_OK && strcmp(kv->key, "general.alignment") == 0) {
            if (kv->val.type != GGUF_TYPE_UINT32 || kv->val.num.u == 0 ||
                (kv->val.num.u & (kv->val.num.u - 1)))
                return error_set(e, CELER_STATUS_BAD_FILE,
                                 "%s: general.alignment: expected a power of two", label);
            g->alignment = kv->val.num.u;
        }
    }
    for (uint64_t i = 0; i < n_tensors && c.s == CELER_OK; i++) {
        gguf_tensor *t = &g->tensors[g->n_tensors];
        uint64_t nlen;
        const char *name = rd_str(&c, &nlen, "a tensor name");
        if (c.s != CELER_OK) break;
        if (!(t->name = strndup(name, nlen)))
            return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        g->n_tensors++;
        uint32_t nd = (uint32_t)rd_u(&c, 4, t->name);
        if (c.s == CELER_OK && (nd < 1 || nd > 4))
            return error_set(e, CELER_STATUS_BAD_FILE,
                             "%s: tensor %s: %u dimensions (expected 1 to 4)", label, t->name, nd);
        t->ndim = (int)nd;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t ne = rd_u(&c, 8, t->name);
            if (ne > INT32_MAX)
                c.s = error_set(e, CELER_STATUS_BAD_FILE, "%s: tensor %s: dimension %llu too large",
                                label, t->name, (unsigned long long)ne);
            t->ne[d] = (int64_t)ne;
        }
        t->ggml_type = (uint32_t)rd_u(&c, 4, t->name);
        uint64_t off = rd_u(&c, 8, t->name);
        t->data =
            (const uint8_t *)(uintptr_t)off; /* resolved below, once the data start is known */
    }
    if (c.s != CELER_OK) return c.s;
    const uint64_t header = (uint64_t)(c.p - buf);
    const uint64_t start = (header + g->alignment - 1) / g->alignment * g->alignment;
    for (size_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        const uint64_t off = (uint64_t)(uintptr_t)t->data;
        t->data = NULL;
        uint64_t rows = 1;
        for (int d = 1; d < t->ndim; d++) rows *= (uint64_t)(t->ne[d] ? t->ne[d] : 0);
        const uint64_t rb = ggml_row_bytes(t->ggml_type, t->ne[0]);
        if (rb == 0 && t->ne[0] != 0)
            return error_set(
                e, CELER_STATUS_UNSUPPORTED,
                "%s: tensor %s: type %s is not supported (expected F32, F16, BF16, Q8_0, Q4_0, "
                "Q4_1, Q5_0, Q5_1, IQ4_NL with rows of whole 32-element blocks, or Q2_K, Q3_K, "
                "Q4_K, Q5_K, Q6_K, IQ4_XS with rows of whole 256-element super-blocks)",
                label, t->name, gguf_type_name(t->ggml_type));
        if (rows && rb > UINT64_MAX / rows)
            return error_set(e, CELER_STATUS_BAD_FILE, "%s: tensor %s: byte size overflows", label,
                             t->name);
        const uint64_t nbytes = rb * rows;
        if (off % g->alignment || start > len || off > len - start || nbytes > len - start - off)
            return error_set(e, CELER_STATUS_BAD_FILE,
                             "%s: tensor %s: data at offset %llu (+%llu bytes) lies outside the "
                             "file (%zu bytes) or is misaligned",
                             label, t->name, (unsigned long long)off, (unsigned long long)nbytes,
                             len);
        t->data = buf + start + off;
        t->nbytes = (size_t)nbytes;
    }
    return CELER_OK;
}

void gguf_free(gguf_file *g) {
    for (size_t i = 0; i < g->n_kv; i++) free(g->kv[i].key);
    for (size_t i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    memset(g, 0, sizeof *g);
}

const gguf_kv *gguf_find_kv(const gguf_file *g, const char *key) {
    for (size_t i = 0; i < g->n_kv; i++)
        if (strcmp(g->kv[i].key, key) == 0) return &g->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name) {
    for (size_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0) return &g->tensors[i];
    return NULL;
}

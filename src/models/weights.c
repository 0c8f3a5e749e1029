/*
 * weights.c - binding checkpoint tensors to weight views, with every name, dtype and
 * shape checked against what the architecture expects (expected vs found in errors),
 * driven by a family's weight tables. Names are canonical; a model's layout rules
 * rename them to what the checkpoint holds. Nothing here knows an architecture.
 */
#include "models/model.h"

#include "base/half.h"

#include <stdio.h>
#include <string.h>

static const char *shp(char *buf, const st_tensor *t) {
    return shape_str(buf, 96, t->shape, t->ndim);
}

const char *model_tensor_name(const celer_model *m, const char *canonical, char *out, size_t size) {
    for (int i = 0; i < m->n_rename; i++) {
        const size_t n = strlen(m->rename[i].from);
        if (strncmp(canonical, m->rename[i].from, n) == 0) {
            snprintf(out, size, "%s%s", m->rename[i].to, canonical + n);
            return out;
        }
    }
    snprintf(out, size, "%s", canonical);
    return out;
}

/* The tensor checkpoint name (already renamed), or an error naming it. */
static celer_status find(const celer_model *m, const char *name, const st_tensor **t,
                         const char **file, celer_error *e) {
    *t = checkpoint_find(&m->ck, name, file);
    if (!*t) return error_set(e, CELER_STATUS_BAD_FILE, "%s: missing tensor %s", m->ck.dir, name);
    return CELER_OK;
}

static bool is_float(dtype t) {
    return t == DTYPE_F32 || t == DTYPE_F16 || t == DTYPE_BF16;
}

static celer_status bind_affine(const celer_model *m, const char *module, const st_tensor *w,
                                const char *file, int64_t rows, int64_t cols, const quant_spec *q,
                                matview *out, celer_error *e) {
    char name[256], b1[96], b2[96];
    const st_tensor *sc, *bi;
    const char *sfile, *bfile;
    celer_status s;
    snprintf(name, sizeof name, "%s.scales", module);
    if ((s = find(m, name, &sc, &sfile, e)) != CELER_OK) return s;
    /* a GGUF symmetric block type names its zero point instead (gguf_checkpoint.c) */
    int zero = 0;
    snprintf(name, sizeof name, "%s.zero", module);
    const st_tensor *zt = checkpoint_find(&m->ck, name, &bfile);
    if (zt) {
        if (zt->type != DTYPE_I32 || zt->nbytes != sizeof zero)
            return error_set(e, CELER_STATUS_BAD_FILE,
                             "%s: tensor %s: expected one I32, found %s %s", bfile, name,
                             dtype_name(zt->type), shp(b1, zt));
        memcpy(&zero, zt->data, sizeof zero);
        bi = sc;
    } else if (q->mode != QUANT_AFFINE) { /* fp4: no biases */
        bi = sc;
    } else {
        snprintf(name, sizeof name, "%s.biases", module);
        if ((s = find(m, name, &bi, &bfile, e)) != CELER_OK) return s;
    }
    const bool fp4 = q->mode != QUANT_AFFINE, no_biases = zt != NULL || fp4;
    if (w->ndim != 2 || w->shape[0] != rows)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: tensor %s.weight: expected [%lld, packed] uint32 codes for a "
                         "[%lld, %lld] linear (config.json), found %s",
                         file, module, (long long)rows, (long long)rows, (long long)cols,
                         shp(b1, w));
    if (sc->ndim != 2 || sc->shape[0] != rows || sc->shape[1] <= 0 || cols % sc->shape[1] != 0)
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: tensor %s.scales: expected [%lld, %lld / group_size], found %s",
                         sfile, module, (long long)rows, (long long)cols, shp(b1, sc));
    if (bi->ndim != 2 || bi->shape[0] != sc->shape[0] || bi->shape[1] != sc->shape[1] ||
        (bi->type != sc->type && !(sc->type == DTYPE_U4LO && bi->type == DTYPE_U4HI)))
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: tensor %s.biases: expected %s %s like the scales, found %s %s", bfile,
                         module, dtype_name(sc->type), shp(b1, sc), dtype_name(bi->type),
                         shp(b2, bi));
    /* K-quants: integer scales per group under F16 factors per super-block (gguf_checkpoint.c) */
    const st_tensor *ss = NULL, *sm = NULL;
    const char *ssfile;
    snprintf(name, sizeof name, "%s.super_scales", module);
    if ((ss = checkpoint_find(&m->ck, name, &ssfile))) {
        snprintf(name, sizeof name, "%s.super_biases", module);
        sm = checkpoint_find(&m->ck, name, &ssfile);
        if (ss->type != DTYPE_F16 || ss->ndim != 2 || ss->shape[0] != rows || ss->shape[1] <= 0 ||
            cols % ss->shape[1] || (cols / ss->shape[1]) % (cols / sc->shape[1]) ||
            (sc->type != DTYPE_U8 && sc->type != DTYPE_I8 && sc->type != DTYPE_U4LO) ||
            !sm != no_biases ||
            (sm && (sm->type != DTYPE_F16 || sm->ndim != 2 || sm->shape[0] != rows ||
                    sm->shape[1] != ss->shape[1])))
            return error_set(
                e, CELER_STATUS_BAD_FILE,
                "%s: tensor %s.super_scales: expected F16 [%lld, super-blocks] over U8/I8 "
                "group scales (and super_biases like it where there are biases), found %s "
                "%s over %s",
                ssfile, module, (long long)rows, dtype_name(ss->type), shp(b1, ss),
                dtype_name(sc->type));
    } else if (fp4 ? sc->type != DTYPE_U8 : !is_float(sc->type))
        return error_set(e, CELER_STATUS_UNSUPPORTED, "%s: tensor %s.scales: expected %s, found %s",
                         sfile, module, fp4 ? "U8 (fp4 scales)" : "F32, F16 or BF16",
                         dtype_name(sc->type));
    const int64_t packed = w->shape[1], group = cols / sc->shape[1];
    /* fp4: e2m1 codes (their values doubled, so integers) under e8m0 or e4m3 scales */
    static const int8_t fp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    if (fp4 && (packed * 8 != cols || group != (q->mode == QUANT_MXFP4 ? 32 : 16)))
        return error_set(
            e, CELER_STATUS_BAD_FILE,
            "%s: tensor %s: %s expects 4-bit codes in groups of %d, found %lld packed words "
            "for %lld columns in groups of %lld",
            file, module, q->mode == QUANT_MXFP4 ? "mxfp4" : "nvfp4",
            q->mode == QUANT_MXFP4 ? 32 : 16, (long long)packed, (long long)cols, (long long)group);
    /* a codebook of code values (IQ4_NL, IQ4_XS: gguf_checkpoint.c), with a zero point of 0 */
    const int8_t *lut = fp4 ? fp4_values : NULL;
    snprintf(name, sizeof name, "%s.lut", module);
    const st_tensor *lt = checkpoint_find(&m->ck, name, &ssfile);
    if (lt) {
        if (lt->type != DTYPE_I8 || !no_biases || zero != 0 || packed * 32 % cols ||
            lt->nbytes != (size_t)1 << (packed * 32 / cols))
            return error_set(
                e, CELER_STATUS_BAD_FILE,
                "%s: tensor %s: expected I8 [2^bits] code values beside a zero point of "
                "0, found %s %s",
                ssfile, name, dtype_name(lt->type), shp(b1, lt));
        lut = (const int8_t *)lt->data;
    }
    if ((packed * 32) % cols != 0)
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: tensor %s.weight: %lld packed words per row do not hold %lld "
                         "codes of a whole number of bits",
                         file, module, (long long)packed, (long long)cols);
    const int bits = (int)(packed * 32 / cols);
    if (bits < 2 || bits > 8 || bits == 7)
        return error_set(e, CELER_STATUS_UNSUPPORTED,
                         "%s: tensor %s.weight: %d-bit affine quantization is not supported "
                         "(expected 2, 3, 4, 5, 6 or 8)",
                         file, module, bits);
    if (q->rule == QUANT_RULE_MODULE && (q->bits != bits || q->group != group))
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: quantization.%s: expected bits %d group_size %lld as the tensors "
                         "have, found bits %d group_size %lld",
                         m->ck.config_path, module, bits, (long long)group, q->bits,
                         (long long)q->group);
    *out = (matview){.rows = rows,
                     .cols = cols,
                     .type = DTYPE_U32,
                     .data = w->data,
                     .quant_bits = bits,
                     .group = group,
                     .scale_type = !fp4                     ? sc->type
                                   : q->mode == QUANT_MXFP4 ? DTYPE_E8M0
                                                            : DTYPE_F8E4M3,
                     .scales = sc->data,
                     .biases = no_biases ? NULL : bi->data,
                     .zero = zero,
                     .super = ss ? cols / ss->shape[1] : 0,
                     .super_scales = ss ? ss->data : NULL,
                     .super_biases = sm ? sm->data : NULL,
                     .lut = lut,
                     .lut_shift = fp4 ? 1 : 0};
    return CELER_OK;
}

celer_status bind_matrix(const celer_model *m, const char *canonical, int64_t rows, int64_t cols,
                         matview *out, celer_error *e) {
    char module[240], name[256], b1[96];
    model_tensor_name(m, canonical, module, sizeof module);
    const st_tensor *w;
    const char *file;
    quant_spec q;
    celer_status s;
    snprintf(name, sizeof name, "%s.weight", module);
    if ((s = find(m, name, &w, &file, e)) != CELER_OK) return s;
    if ((s = checkpoint_quant_for(&m->ck, module, &q, e)) != CELER_OK) return s;
    if (w->type == DTYPE_U32) {
        if (q.rule == QUANT_RULE_DENSE)
            return error_set(e, CELER_STATUS_BAD_CONFIG,
                             "%s: tensor %s: config.json says quantization.%s is false, found "
                             "U32 codes",
                             file, name, module);
        return bind_affine(m, module, w, file, rows, cols, &q, out, e);
    }
    if (!is_float(w->type))
        return error_set(e, CELER_STATUS_UNSUPPORTED,
                         "%s: tensor %s: expected F32, F16, BF16 or U32 (affine codes), found %s",
                         file, name, dtype_name(w->type));
    if (q.rule == QUANT_RULE_MODULE)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: tensor %s: config.json quantizes %s to %d bits, found dense %s", file,
                         name, module, q.bits, dtype_name(w->type));
    if (w->ndim != 2 || w->shape[0] != rows || w->shape[1] != cols)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: tensor %s: expected shape [%lld, %lld] (config.json), found %s", file,
                         name, (long long)rows, (long long)cols, shp(b1, w));
    *out = (matview){.rows = rows, .cols = cols, .type = w->type, .data = w->data};
    return CELER_OK;
}

celer_status bind_vector(celer_model *m, const char *canonical, int64_t d, bool required,
                         const float **out, celer_error *e) {
    char name[256], b1[96];
    const char *file;
    model_tensor_name(m, canonical, name, sizeof name);
    *out = NULL;
    const st_tensor *t = checkpoint_find(&m->ck, name, &file);
    if (!t && !required) return CELER_OK;
    celer_status s = find(m, name, &t, &file, e);
    if (s != CELER_OK) return s;
    if (!is_float(t->type))
        return error_set(e, CELER_STATUS_UNSUPPORTED,
                         "%s: tensor %s: expected F32, F16 or BF16, found %s", file, name,
                         dtype_name(t->type));
    if (t->ndim != 1 || t->shape[0] != d)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: tensor %s: expected shape [%lld] (config.json), found %s", file, name,
                         (long long)d, shp(b1, t));
    float *v = arena_alloc(&m->vectors, sizeof(float) * (size_t)d);
    if (!v) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "%s: out of memory", name);
    for (int64_t i = 0; i < d; i++) {
        if (t->type == DTYPE_F32)
            memcpy(&v[i], t->data + 4 * i, 4);
        else {
            uint16_t h;
            memcpy(&h, t->data + 2 * i, 2);
            v[i] = t->type == DTYPE_F16 ? f16_to_f32(h) : bf16_to_f32(h);
        }
    }
    *out = v;
    return CELER_OK;
}

celer_status reject_tensor(const celer_model *m, const char *canonical, const char *why,
                           celer_error *e) {
    char name[256];
    const char *file;
    model_tensor_name(m, canonical, name, sizeof name);
    if (checkpoint_find(&m->ck, name, &file))
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: unexpected tensor %s (%s)", file, name,
                         why);
    return CELER_OK;
}

/* module.weight, a dense tensor [rows, ...] whose trailing dimensions hold cols values
 * (a convolution kernel in any channel order), as a matrix [rows, cols]. */
static celer_status bind_kernel(const celer_model *m, const char *canonical, int64_t rows,
                                int64_t cols, matview *out, celer_error *e) {
    char module[240], name[256], b1[96];
    const st_tensor *w;
    const char *file;
    snprintf(name, sizeof name, "%s.weight",
             model_tensor_name(m, canonical, module, sizeof module));
    celer_status s = find(m, name, &w, &file, e);
    if (s != CELER_OK) return s;
    int64_t n = 1;
    for (int i = 1; i < w->ndim; i++) n *= w->shape[i];
    if (!is_float(w->type))
        return error_set(e, CELER_STATUS_UNSUPPORTED,
                         "%s: tensor %s: expected F32, F16 or BF16, found %s", file, name,
                         dtype_name(w->type));
    if (w->ndim < 2 || w->shape[0] != rows || n != cols)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: tensor %s: expected [%lld, ...] holding %lld values per row "
                         "(config.json), found %s",
                         file, name, (long long)rows, (long long)cols, shp(b1, w));
    *out = (matview){.rows = rows, .cols = cols, .type = w->type, .data = w->data};
    return CELER_OK;
}

/* The dense tensor canonical, stored [cols, rows] (a parameter a model multiplies as
 * x @ W), as a matrix [rows, cols]: transposed once into m->mem, in its own float type. */
static celer_status bind_transposed(celer_model *m, const char *canonical, int64_t rows,
                                    int64_t cols, matview *out, celer_error *e) {
    char name[256], b1[96];
    const st_tensor *w;
    const char *file;
    model_tensor_name(m, canonical, name, sizeof name);
    celer_status s = find(m, name, &w, &file, e);
    if (s != CELER_OK) return s;
    if (!is_float(w->type))
        return error_set(e, CELER_STATUS_UNSUPPORTED,
                         "%s: tensor %s: expected F32, F16 or BF16, found %s", file, name,
                         dtype_name(w->type));
    if (w->ndim != 2 || w->shape[0] != cols || w->shape[1] != rows)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: tensor %s: expected [%lld, %lld] (config.json), found %s", file, name,
                         (long long)cols, (long long)rows, shp(b1, w));
    const size_t es = dtype_size(w->type);
    uint8_t *t = arena_alloc(&m->mem, es * (size_t)(rows * cols));
    if (!t) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "%s: out of memory", name);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            memcpy(t + (size_t)(r * cols + c) * es, w->data + (size_t)(c * rows + r) * es, es);
    *out = (matview){.rows = rows, .cols = cols, .type = w->type, .data = t};
    return CELER_OK;
}

/* Rows [r0, r0 + n) of w as a matrix of their own (codes, scales and biases of an affine
 * matrix are row-major, so a run of rows is one range of each). */
static matview matview_rows(const matview *w, int64_t r0, int64_t n) {
    matview v = *w;
    v.rows = n;
    if (!w->quant_bits) {
        v.data = (const uint8_t *)w->data + (size_t)(r0 * w->cols) * dtype_size(w->type);
        return v;
    }
    const size_t groups = (size_t)(r0 * (w->cols / w->group)) * dtype_size(w->scale_type);
    v.data = (const uint8_t *)w->data + (size_t)(r0 * w->cols * w->quant_bits / 8);
    v.scales = (const uint8_t *)w->scales + groups;
    v.biases = w->biases ? (const uint8_t *)w->biases + groups : NULL;
    if (w->super) {
        const size_t supers = (size_t)(r0 * (w->cols / w->super)) * sizeof(uint16_t);
        v.super_scales = (const uint8_t *)w->super_scales + supers;
        v.super_biases = w->super_biases ? (const uint8_t *)w->super_biases + supers : NULL;
    }
    return v;
}

/* One part of a fused matrix: the stored tensor must have exactly dims[total] rows. */
static celer_status bind_part(const celer_model *m, const char *name, const int64_t *dims,
                              const weight_spec *sp, matview *out, celer_error *e) {
    matview whole;
    celer_status s = bind_matrix(m, name, dims[sp->total], dims[sp->cols], &whole, e);
    if (s != CELER_OK) return s;
    CELER_ASSERT(dims[sp->first] + dims[sp->rows] <= dims[sp->total]);
    *out = matview_rows(&whole, dims[sp->first], dims[sp->rows]);
    return CELER_OK;
}

/* ==== Tables ==== */

void model_add_table(celer_model *m, const weight_table *t) {
    CELER_ASSERT(m->n_tables < MODEL_MAX_TABLES);
    m->tables[m->n_tables++] = *t;
}

/* Binds one entry of t into the struct at base, struct index i. */
static celer_status bind_spec(celer_model *m, const weight_table *t, const weight_spec *sp,
                              char *base, int64_t i, celer_error *e) {
    char name[200];
    if (t->count > 1 || t->indexed)
        snprintf(name, sizeof name, "%s%lld.%s", t->prefix, (long long)i, sp->name);
    else
        snprintf(name, sizeof name, "%s%s", t->prefix, sp->name);
    const bool present = sp->when == WEIGHT_ALWAYS || (sp->when >= 0 && t->flags[sp->when]);
    if (sp->when >= 0 && !present) {
        char tensor[220];
        snprintf(tensor, sizeof tensor, "%s%s", name, sp->kind != WEIGHT_VECTOR ? ".weight" : "");
        return reject_tensor(m, tensor, "config.json rules it out", e);
    }
    if (sp->kind == WEIGHT_VECTOR)
        return bind_vector(m, name, t->dims[sp->rows], present, (const float **)(base + sp->offset),
                           e);
    if (sp->kind == WEIGHT_KERNEL)
        return bind_kernel(m, name, t->dims[sp->rows], t->dims[sp->cols],
                           (matview *)(base + sp->offset), e);
    if (sp->kind == WEIGHT_TRANSPOSED)
        return bind_transposed(m, name, t->dims[sp->rows], t->dims[sp->cols],
                               (matview *)(base + sp->offset), e);
    matview *w = (matview *)(base + sp->offset);
    if (sp->kind == WEIGHT_PART) return bind_part(m, name, t->dims, sp, w, e);
    if (!present) {
        char tensor[220], real[240];
        snprintf(tensor, sizeof tensor, "%s.weight", name);
        if (!checkpoint_find(&m->ck, model_tensor_name(m, tensor, real, sizeof real), NULL))
            return CELER_OK;
    }
    return bind_matrix(m, name, t->dims[sp->rows], t->dims[sp->cols], w, e);
}

celer_status model_bind(celer_model *m, celer_error *e) {
    for (int k = 0; k < m->n_tables; k++) {
        const weight_table *t = &m->tables[k];
        for (int64_t i = 0; i < t->count; i++) {
            char *base = (char *)t->base + (size_t)i * t->stride;
            for (int64_t j = 0; j < t->n_spec; j++) {
                celer_status s = bind_spec(m, t, &t->spec[j], base, i, e);
                if (s != CELER_OK) return s;
            }
        }
    }
    return CELER_OK;
}

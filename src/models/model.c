/*
 * model.c - model_type dispatch, and the contract entry points over a family's one
 * hidden_states body: the LM head runs on exactly the rows a caller reads.
 */
#define _POSIX_C_SOURCE 200809L
#include "models/model.h"

#include "io/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t model_matrices(celer_model *m, matview **out, int64_t cap);

static const model_family *const families[] = {&llama_family, &gemma_family, &gemma3_family,
                                               &cohere2_family, &llava_next_family};
/* gemma3_vision_family is reached through gemma3_family's load (a gemma3 checkpoint with a
 * vision_config), not by a model_type of its own. */

void model_types_known(char *out, size_t size) {
    size_t at = 0;
    out[0] = 0;
    for (size_t i = 0; i < sizeof families / sizeof *families; i++)
        for (const char *const *t = families[i]->model_types; *t; t++)
            if (at < size) at += (size_t)snprintf(out + at, size - at, "%s%s", at ? ", " : "", *t);
}

const model_family *model_family_for(const char *type) {
    for (size_t i = 0; type && i < sizeof families / sizeof *families; i++)
        for (const char *const *t = families[i]->model_types; *t; t++)
            if (strcmp(*t, type) == 0) return families[i];
    return NULL;
}

celer_status model_open(const char *dir, size_t size, celer_model **out, celer_error *e) {
    *out = NULL;
    CELER_ASSERT(size >= sizeof(celer_model));
    celer_model *m = calloc(1, size);
    if (!m) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    pthread_mutex_init(&m->prep_mu, NULL);
    celer_status s = checkpoint_open(&m->ck, dir, e);
    if (s != CELER_OK) goto fail;
    m->cfg = m->ck.config;
    const char *type;
    if ((s = config_str(&m->ck, m->cfg, "model_type", &type, e)) != CELER_OK) goto fail;
    if (!type) {
        s = error_set(e, CELER_STATUS_BAD_CONFIG, "%s: model_type: required field is missing",
                      m->ck.config_path);
        goto fail;
    }
    if (!(m->family = model_family_for(type))) {
        char types[256];
        model_types_known(types, sizeof types);
        s = error_set(e, CELER_STATUS_UNSUPPORTED, "%s: model_type: expected one of %s, found %s",
                      m->ck.config_path, types, type);
        goto fail;
    }
    if ((s = m->family->load(m, e)) != CELER_OK) goto fail;
    m->n_mats = (int32_t)model_matrices(m, NULL, 0);
    /* GGUF blocks were converted into memory of their own: the file's pages can go */
    if (m->ck.gguf) checkpoint_release_pages(&m->ck);
    *out = m;
    return CELER_OK;
fail:
    model_close(m);
    return s;
}

void model_close(celer_model *m) {
    if (!m) return;
    model_close(m->text);
    json_decref(m->owned_json);
    for (int i = 0; i < m->n_prepared; i++) m->prepared[i].cls->unprepare(m->prepared[i].w);
    arena_free(&m->mem);
    arena_free(&m->vectors);
    pthread_mutex_destroy(&m->prep_mu);
    if (!m->borrowed_ck) checkpoint_close(&m->ck);
    free(m);
}

/* ==== Weight tables: parameter count and matrix list ==== */

/* Calls fn on every bound weight of m's tables and of its text model. */
typedef void (*weight_fn)(void *arg, const weight_table *t, const weight_spec *sp, void *field);

static void each_weight(const celer_model *m, weight_fn fn, void *arg) {
    for (int k = 0; k < m->n_tables; k++) {
        const weight_table *t = &m->tables[k];
        for (int64_t i = 0; i < t->count; i++)
            for (int64_t j = 0; j < t->n_spec; j++) {
                /* an entry the flags rule out may share its field with one they keep (a
                 * fused matrix's part and the split matrix) */
                if (t->spec[j].when >= 0 && !t->flags[t->spec[j].when]) continue;
                void *field = (char *)t->base + (size_t)i * t->stride + t->spec[j].offset;
                const bool bound = t->spec[j].kind == WEIGHT_VECTOR
                                       ? *(const float **)field != NULL
                                       : ((matview *)field)->data != NULL;
                if (bound) fn(arg, t, &t->spec[j], field);
            }
    }
    if (m->text) each_weight(m->text, fn, arg);
}

typedef struct weight_sum {
    int64_t params, bytes;
} weight_sum;

static void sum_weight(void *arg, const weight_table *t, const weight_spec *sp, void *field) {
    weight_sum *s = arg;
    if (sp->kind != WEIGHT_VECTOR) {
        const matview *w = field;
        s->params += w->rows * w->cols;
        s->bytes += matview_bytes(w);
    } else {
        s->params += t->dims[sp->rows];
        s->bytes += 4 * t->dims[sp->rows];
    }
}

void model_count(const celer_model *m, int64_t *params, int64_t *bytes) {
    weight_sum s = {0, 0};
    each_weight(m, sum_weight, &s);
    *params = s.params, *bytes = s.bytes;
}

typedef struct matrix_list {
    matview **out;
    int64_t n, cap;
} matrix_list;

/* Numbers every bound matrix and lists it (a tied head is not bound: it is the
 * embedding's own view). */
static void list_matrix(void *arg, const weight_table *t, const weight_spec *sp, void *field) {
    (void)t;
    matrix_list *l = arg;
    matview *w = field;
    if (sp->kind == WEIGHT_VECTOR) return;
    w->id = (int32_t)(l->n + 1);
    if (l->n < l->cap) l->out[l->n] = w;
    l->n++;
}

/* The matrices of m (its text model's included), numbered 1..n by matview.id; returns n. */
static int64_t model_matrices(celer_model *m, matview **out, int64_t cap) {
    matrix_list l = {out, 0, cap};
    each_weight(m, list_matrix, &l);
    return l.n;
}

/* Adds the id or ids of j (from file) to m->eos. */
static celer_status add_eos(celer_model *m, const json_t *j, const char *file, celer_error *e) {
    if (!j || json_is_null(j)) return CELER_OK;
    const size_t n = json_is_array(j) ? json_array_size(j) : 1;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_is_array(j) ? json_array_get(j, i) : j;
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= m->dims.v)
            return error_set(e, CELER_STATUS_BAD_CONFIG,
                             "%s: eos_token_id: expected ids in [0, %lld)", file,
                             (long long)m->dims.v);
        const int32_t id = (int32_t)json_integer_value(v);
        if (!celer_model_is_eos(m, id) && m->n_eos < CELER_MAX_EOS) m->eos[m->n_eos++] = id;
    }
    return CELER_OK;
}

celer_status model_read_eos(celer_model *m, celer_error *e) {
    m->n_eos = 0;
    celer_status s =
        add_eos(m, json_object_get(m->ck.config, "eos_token_id"), m->ck.config_path, e);
    if (s != CELER_OK || m->ck.gguf) return s;
    /* generation_config.json often lists more stop ids (Llama 3: <|eot_id|>, <|eom_id|>). */
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", m->ck.dir);
    json_error_t je;
    json_t *g = json_load_file(path, 0, &je);
    if (!g) return CELER_OK;
    s = add_eos(m, json_object_get(g, "eos_token_id"), path, e);
    json_decref(g);
    return s;
}

bool celer_model_is_eos(const celer_model *m, int32_t token) {
    for (int i = 0; i < m->n_eos; i++)
        if (m->eos[i] == token) return true;
    return false;
}

const float *celer_logits_at_position(const float *hidden, int64_t n, int64_t d, int64_t pos) {
    if (!hidden || pos < 0 || pos >= n || d <= 0) return NULL;
    return hidden + pos * d;
}

/* A weight set's done hook: the backend no longer reads w's source pages. */
static void release_source(void *arg, const matview *w) {
    celer_model *m = arg;
    if (!w->quant_bits || m->sources_pinned) return;
    m->released_bytes += matview_bytes(w);
    const size_t groups = (size_t)(w->rows * (w->cols / w->group));
    checkpoint_release_range(&m->ck, w->data, (size_t)(w->rows * w->cols * w->quant_bits / 8));
    checkpoint_release_range(&m->ck, w->scales, groups * dtype_size(w->scale_type));
    if (w->biases) checkpoint_release_range(&m->ck, w->biases, groups * dtype_size(w->scale_type));
    if (w->super) {
        const size_t supers = (size_t)(w->rows * (w->cols / w->super)) * sizeof(uint16_t);
        checkpoint_release_range(&m->ck, w->super_scales, supers);
        if (w->super_biases) checkpoint_release_range(&m->ck, w->super_biases, supers);
    }
}

/* Every source in memory again (m->prep_mu held). */
static void restore_sources(celer_model *m) {
    checkpoint_restore(&m->ck);
    m->released_bytes = 0;
}

void model_keep_sources(celer_model *m) {
    pthread_mutex_lock(&m->prep_mu);
    restore_sources(m);
    m->sources_pinned = true;
    pthread_mutex_unlock(&m->prep_mu);
}

celer_status model_prepare(celer_model *m, const backend_class *cls, const backend_params *p,
                           const backend_weights **out, celer_error *e) {
    celer_status s = CELER_OK;
    *out = NULL;
    pthread_mutex_lock(&m->prep_mu);
    for (int i = 0; i < m->n_prepared; i++)
        if (m->prepared[i].cls == cls && m->prepared[i].device == p->device) {
            *out = m->prepared[i].w;
            goto done;
        }
    if (m->n_prepared == MODEL_MAX_PREPARED) {
        s = error_set(e, CELER_STATUS_UNSUPPORTED, "%s: prepared for %d backends already", m->desc,
                      MODEL_MAX_PREPARED);
        goto done;
    }
    const int64_t n = m->n_mats;
    matview **mats = malloc(sizeof *mats * (size_t)(n > 0 ? n : 1));
    if (!mats) {
        s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    model_matrices(m, mats, n);
    /* converted GGUF matrices another class's prepare let go are read again here */
    restore_sources(m);
    const arena *vectors[2] = {&m->vectors, m->text ? &m->text->vectors : NULL};
    const weight_set ws = {.mats = mats,
                           .n_mats = n,
                           .vectors = vectors,
                           .n_vectors = m->text ? 2 : 1,
                           .done = release_source,
                           .arg = m};
    backend_weights *w = NULL;
    s = cls->prepare(&ws, p, &w, e);
    free(mats);
    /* nothing prepared (the kernels read the weights in place): a later call asks again,
     * and no later prepare may let the sources go */
    if (s == CELER_OK && !w) m->sources_pinned = true;
    if (s != CELER_OK || !w) goto done;
    m->prepared[m->n_prepared++] = (struct model_prepared){cls, p->device, w};
    *out = w;
    /* the kernels read the prepared copy; pages of the files fault back in for whatever
     * still reads them (dense matrices, a reference context) */
    checkpoint_release_pages(&m->ck);
done:
    pthread_mutex_unlock(&m->prep_mu);
    return s;
}

int64_t model_resident_source_bytes(celer_model *m) {
    int64_t params, bytes;
    model_count(m, &params, &bytes);
    pthread_mutex_lock(&m->prep_mu);
    bytes -= m->released_bytes;
    pthread_mutex_unlock(&m->prep_mu);
    return bytes;
}

void model_prepared_info(const celer_model *m, int64_t *bytes, double *ms) {
    *bytes = 0, *ms = 0;
    for (int i = 0; i < m->n_prepared; i++)
        *bytes += m->prepared[i].w->bytes, *ms += m->prepared[i].w->ms;
}

/* ==== Ops a backend must have ==== */

/* What every text forward calls (model_embed_step, model_attention, model_mlp, the head,
 * model_forward_rows), and the memory ops the engine uses. */
static const model_op model_common_ops[] = {
    MODEL_OP(alloc),     MODEL_OP(release),  MODEL_OP(upload),    MODEL_OP(download),
    MODEL_OP(copy_rows), MODEL_OP(matmul),   MODEL_OP(embed),     MODEL_OP(rmsnorm),
    MODEL_OP(rope),      MODEL_OP(kv_store), MODEL_OP(attention), MODEL_OP(glu),
    MODEL_OP(add),       MODEL_OP(add_bias), MODEL_OP(scale),     {0, NULL},
};

static celer_status check_ops(const celer_model *m, const backend *be, const model_op *ops,
                              celer_error *e) {
    for (const model_op *o = ops; o && o->name; o++) {
        void (*fn)(void);
        memcpy(&fn, (const char *)be->ops + o->offset, sizeof fn);
        if (!fn)
            return error_set(e, CELER_STATUS_UNSUPPORTED,
                             "%s: the %s backend has no %s op, which this model needs", m->desc,
                             be->ops->name, o->name);
    }
    return CELER_OK;
}

celer_status model_check_backend(const celer_model *m, const backend *be, celer_error *e) {
    celer_status s = check_ops(m, be, model_common_ops, e);
    if (s == CELER_OK) s = check_ops(m, be, m->family->ops, e);
    if (s == CELER_OK && m->attn_softcap && !be->ops->attention_softcap)
        s = error_set(
            e, CELER_STATUS_UNSUPPORTED,
            "%s: the %s backend's attention does not soft-cap scores, which this model needs",
            m->desc, be->ops->name);
    if (s == CELER_OK && m->image_blocks && !be->ops->attention_limit)
        s = error_set(e, CELER_STATUS_UNSUPPORTED,
                      "%s: the %s backend's attention cannot let an image block's rows see the "
                      "whole block, which this "
                      "model needs",
                      m->desc, be->ops->name);
    if (s == CELER_OK && m->text) s = model_check_backend(m->text, be, e);
    return s;
}

/* ==== The contract's entry points ==== */

/* A vision-language wrapper forwards every entry point to its text model, so the text
 * family's own body and last-row head run unchanged; image rows arrive as embedding rows
 * of the step. */
#define TEXT_MODEL(m) ((m)->text ? (m)->text : (m))

int model_rope_kinds(const celer_model *m) {
    m = TEXT_MODEL(m);
    return m->rope_kinds > 0 ? m->rope_kinds : 1;
}

int64_t model_scratch_floats(const celer_model *m, int64_t n) {
    m = TEXT_MODEL(m);
    return m->family->scratch_floats(m, n);
}

void model_hidden_states(const celer_model *m, backend *be, const model_step *step,
                         const model_kv *kv, float *scratch, float *hidden) {
    m = TEXT_MODEL(m);
    m->family->hidden_states(m, be, step, kv, scratch, hidden);
}

/* logits[n, v] = the family's LM head over hidden[n, d]: the one place the head runs.
 * Returns n, the rows it ran on. */
static int64_t model_head(const celer_model *m, backend *be, float *logits, const float *hidden,
                          int64_t n) {
    be->ops->matmul(be, logits, m->family->head(m), hidden, n);
    const float scale = m->family->logit_scale ? m->family->logit_scale(m) : 0.0f;
    if (scale != 0.0f) be->ops->scale(be, logits, scale, n * m->dims.v);
    const float cap = m->family->logit_softcap ? m->family->logit_softcap(m) : 0.0f;
    if (cap != 0.0f) be->ops->softcap(be, logits, cap, n * m->dims.v);
    return n;
}

int64_t model_forward(const celer_model *m, backend *be, const model_step *step, const model_kv *kv,
                      float *scratch, float *hidden, float *logits) {
    m = TEXT_MODEL(m);
    model_hidden_states(m, be, step, kv, scratch, hidden);
    return model_head(m, be, logits, hidden, step->n);
}

int64_t model_forward_last_logits(const celer_model *m, backend *be, const model_step *step,
                                  const model_kv *kv, float *scratch, float *hidden,
                                  int64_t last_pos, float *logits) {
    m = TEXT_MODEL(m);
    model_hidden_states(m, be, step, kv, scratch, hidden);
    const float *row = celer_logits_at_position(hidden, step->n, m->dims.d, last_pos);
    CELER_ASSERT(row != NULL);
    return model_head(m, be, logits, row, 1);
}

int64_t model_forward_rows(const celer_model *m, backend *be, const model_step *step,
                           const model_kv *kv, float *scratch, float *hidden, const int8_t *want,
                           float *logits) {
    m = TEXT_MODEL(m);
    model_hidden_states(m, be, step, kv, scratch, hidden);
    const int64_t d = m->dims.d;
    int64_t k = 0;
    for (int64_t r = 0; r < step->n; r++) {
        if (!want[r]) continue;
        /* Compact the wanted rows to the front (k <= r keeps the order safe). */
        if (k != r)
            be->ops->copy_rows(be, hidden + k * d, d,
                               celer_logits_at_position(hidden, step->n, d, r), d, 1, d);
        k++;
    }
    return k ? model_head(m, be, logits, hidden, k) : 0;
}

/* The factor token rows are embedded with. */
static float embed_scale(const celer_model *m) {
    const float s = m->family->embed_scale ? m->family->embed_scale(m) : 0.0f;
    return s != 0.0f ? s : 1.0f;
}

void model_embed(const celer_model *m, backend *be, const int32_t *ids, int64_t n, float *embd) {
    m = TEXT_MODEL(m);
    be->ops->embed(be, embd, m->family->embedding(m), ids, n, embed_scale(m));
}

/* ==== Wrappers: a text model inside a vision-language checkpoint ==== */

celer_status model_text_layout(const celer_model *m, name_rule *rule, celer_error *e) {
    if (checkpoint_find(&m->ck, "model.language_model.embed_tokens.weight", NULL))
        *rule = (name_rule){"model.", "model.language_model."};
    else if (checkpoint_find(&m->ck, "language_model.model.embed_tokens.weight", NULL))
        *rule = (name_rule){"", "language_model."};
    else
        return error_set(
            e, CELER_STATUS_BAD_FILE,
            "%s: missing tensor language_model.model.embed_tokens.weight (or "
            "model.language_model.embed_tokens.weight): not a vision-language layout celer knows",
            m->ck.dir);
    return CELER_OK;
}

celer_status model_load_text(celer_model *m, const json_t *tcfg, const name_rule *rules,
                             int n_rules, celer_error *e) {
    CELER_ASSERT(n_rules <= MODEL_MAX_RENAMES);
    celer_model *t = calloc(1, sizeof *t);
    if (!t) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    pthread_mutex_init(&t->prep_mu, NULL);
    m->text = t;
    t->ck = m->ck;
    t->borrowed_ck = true;
    t->cfg = tcfg;
    memcpy(t->rename, rules, sizeof *rules * (size_t)n_rules);
    t->n_rename = n_rules;
    t->family = model_family_for(json_string_value(json_object_get(tcfg, "model_type")));
    if (!t->family || t->family->encode_image)
        return error_set(e, CELER_STATUS_UNSUPPORTED,
                         "%s: text_config.model_type: not a text model celer runs",
                         m->ck.config_path);
    celer_status s = t->family->load(t, e);
    if (s != CELER_OK) return s;
    m->dims = t->dims;
    memcpy(m->eos, t->eos, sizeof m->eos);
    m->n_eos = t->n_eos;
    return CELER_OK;
}

/* ==== Pieces shared by the families ==== */

void model_norm_plus_one(const float *w, int64_t n) {
    float *v = (float *)w;
    for (int64_t i = 0; i < n; i++) v[i] += 1.0f;
}

const char *model_probe_prefix(const celer_model *m, const char *const *candidates,
                               const char *name) {
    for (; *candidates; candidates++) {
        char full[256];
        snprintf(full, sizeof full, "%s%s", *candidates, name);
        if (checkpoint_find(&m->ck, full, NULL)) return *candidates;
    }
    return NULL;
}

void model_embed_step(const celer_model *m, backend *be, const model_step *st, float *x) {
    const int64_t d = m->dims.d;
    /* embedding rows first; the lookup then fills every token row (ids >= 0) */
    if (st->embd) be->ops->copy_rows(be, x, d, st->embd, d, st->n, d);
    if (st->token) be->ops->embed(be, x, m->family->embedding(m), st->token, st->n, embed_scale(m));
}

celer_status model_act_parse(const checkpoint *ck, const char *key, const char *name,
                             backend_act def, backend_act *out, celer_error *e) {
    static const struct {
        const char *name;
        backend_act act;
    } acts[] = {
        {"silu", BACKEND_ACT_SILU},          {"swish", BACKEND_ACT_SILU},
        {"gelu", BACKEND_ACT_GELU_ERF},      {"gelu_pytorch_tanh", BACKEND_ACT_GELU_TANH},
        {"gelu_new", BACKEND_ACT_GELU_TANH}, {"quick_gelu", BACKEND_ACT_QUICK_GELU},
    };
    *out = def;
    if (!name) return CELER_OK;
    for (size_t i = 0; i < sizeof acts / sizeof *acts; i++)
        if (!strcmp(name, acts[i].name)) {
            *out = acts[i].act;
            return CELER_OK;
        }
    return error_set(
        e, CELER_STATUS_UNSUPPORTED,
        "%s: %s: expected silu, gelu, gelu_pytorch_tanh, gelu_new or quick_gelu, found %s",
        ck->config_path, key, name);
}

celer_status model_layer_kinds(celer_model *m, int64_t default_pattern, bool *sliding,
                               celer_error *e) {
    const checkpoint *ck = &m->ck;
    const json_t *types = json_object_get(m->cfg, "layer_types");
    const int64_t n_layer = m->dims.n_layer;
    if (types && !json_is_null(types)) {
        if (!json_is_array(types) || (int64_t)json_array_size(types) != n_layer)
            return error_set(e, CELER_STATUS_BAD_CONFIG,
                             "%s: layer_types: expected a list of %lld layer types",
                             ck->config_path, (long long)n_layer);
        for (int64_t l = 0; l < n_layer; l++) {
            const char *t = json_string_value(json_array_get(types, (size_t)l));
            sliding[l] = t && !strcmp(t, "sliding_attention");
            if (!sliding[l] && !(t && !strcmp(t, "full_attention")))
                return error_set(
                    e, CELER_STATUS_BAD_CONFIG,
                    "%s: layer_types[%lld]: expected \"sliding_attention\" or \"full_attention\", "
                    "found %s",
                    ck->config_path, (long long)l, t ? t : "a non-string");
        }
        return CELER_OK;
    }
    int64_t pattern;
    celer_status s = config_int(ck, m->cfg, "sliding_window_pattern", default_pattern, &pattern, e);
    if (s != CELER_OK) return s;
    if (pattern <= 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: sliding_window_pattern: expected > 0, found %lld", ck->config_path,
                         (long long)pattern);
    for (int64_t l = 0; l < n_layer; l++) sliding[l] = (l + 1) % pattern != 0;
    return CELER_OK;
}

void model_linear(backend *be, float *y, const matview *w, const float *b, const float *x,
                  int64_t n) {
    be->ops->matmul(be, y, w, x, n);
    if (b) be->ops->add_bias(be, y, b, n, w->rows);
}

/* model_linear for k matrices of one input, as one product where the backend can. */
static void model_linear_multi(backend *be, float *const *ys, const matview *const *ws,
                               const float *const *bs, int k, const float *x, int64_t n) {
    backend_matmul_multi(be, ys, ws, k, x, n);
    for (int i = 0; i < k; i++)
        if (bs[i]) be->ops->add_bias(be, ys[i], bs[i], n, ws[i]->rows);
}

void model_text_dims(const celer_model *m, int64_t dims[TEXT_N_DIMS]) {
    const model_dims *dm = &m->dims;
    dims[TEXT_D] = dm->d, dims[TEXT_QD] = dm->h * dm->hd, dims[TEXT_KVD] = dm->hk * dm->hd;
    dims[TEXT_F] = dm->f, dims[TEXT_V] = dm->v, dims[TEXT_HD] = dm->hd, dims[TEXT_ZERO] = 0;
    dims[TEXT_QK] = dims[TEXT_QD] + dims[TEXT_KVD], dims[TEXT_QKV] = dims[TEXT_QK] + dims[TEXT_KVD];
    dims[TEXT_FF] = 2 * dm->f;
}

void model_add_text_tables(celer_model *m, const weight_spec *global, int64_t n_global, void *w,
                           const weight_spec *layer, int64_t n_layer_spec, void *layers,
                           size_t stride, const int64_t *dims, const bool *flags) {
    model_add_table(m, &(weight_table){.spec = global,
                                       .n_spec = n_global,
                                       .base = w,
                                       .count = 1,
                                       .prefix = "",
                                       .dims = dims,
                                       .flags = flags});
    model_add_table(m, &(weight_table){.spec = layer,
                                       .n_spec = n_layer_spec,
                                       .base = layers,
                                       .count = m->dims.n_layer,
                                       .stride = stride,
                                       .prefix = "model.layers.",
                                       .indexed = true,
                                       .dims = dims,
                                       .flags = flags});
}

int64_t model_text_scratch_floats(const celer_model *m, int64_t n) {
    const int64_t a = model_attention_scratch(m, n), f = model_mlp_scratch(m, n);
    return n * 3 * m->dims.d + (a > f ? a : f);
}

int64_t model_attention_scratch(const celer_model *m, int64_t n) {
    const model_dims *dm = &m->dims;
    return n * (2 * dm->h * dm->hd + 2 * dm->hk * dm->hd); /* q, att; k, v */
}

int64_t model_mlp_scratch(const celer_model *m, int64_t n) {
    return n * 2 * m->dims.f;
}

void model_attention(const celer_model *m, backend *be, const model_step *st, const model_kv *kv,
                     int64_t l, const attn_block *a, const rope_params *rope, float scale,
                     const float *xb, float *scratch, float *out) {
    const backend_ops *op = be->ops;
    const model_dims *dm = &m->dims;
    const int64_t n = st->n, qd = dm->h * dm->hd, kvd = dm->hk * dm->hd;
    float *q = scratch, *att = q + n * qd, *k = att + n * qd, *v = k + n * kvd;
    float *const ys[3] = {q, k, v};
    const matview *const ws[3] = {&a->wq, &a->wk, &a->wv};
    const float *const bs[3] = {a->bq, a->bk, a->bv};
    model_linear_multi(be, ys, ws, bs, 3, xb, n);
    /* per-head norms see each head's hd values as one row */
    if (a->q_norm) op->rmsnorm(be, q, q, a->q_norm, n * dm->h, dm->hd, a->norm_eps);
    if (a->k_norm) op->rmsnorm(be, k, k, a->k_norm, n * dm->hk, dm->hd, a->norm_eps);
    if (a->no_rope)
        op->kv_store(be, kv->k[l], kv->v[l], k, v, st->slot, n, kvd);
    else
        backend_rope_store(be, q, k, v, kv->k[l], kv->v[l], st->pos, st->slot, n, dm->h, dm->hk,
                           dm->hd, rope);
    const attn_rows ar = {.n = n,
                          .pos = st->pos,
                          .limit = st->limit,
                          .seq = st->seq,
                          .tables = st->tables,
                          .table_cols = st->table_cols,
                          .block_size = st->block_size,
                          .window = a->window,
                          .h = dm->h,
                          .hk = dm->hk,
                          .hd = dm->hd,
                          .scale = scale,
                          .softcap = a->softcap,
                          .seqs = st->seqs,
                          .keys = st->keys};
    op->attention(be, att, q, kv->k[l], kv->v[l], &ar);
    model_linear(be, out, &a->wo, a->bo, att, n);
}

void model_mlp(const celer_model *m, backend *be, const mlp_block *p, const float *xb, int64_t n,
               float *scratch, float *out) {
    const int64_t f = m->dims.f;
    float *gate = scratch, *up = gate + n * f;
    if (p->b_gate || p->b_up) { /* biases between the products */
        float *const ys[2] = {gate, up};
        const matview *const ws[2] = {&p->gate, &p->up};
        const float *const bs[2] = {p->b_gate, p->b_up};
        model_linear_multi(be, ys, ws, bs, 2, xb, n);
        backend_glu_matmul(be, out, &p->down, gate, up, n, p->act);
    } else {
        backend_glu_mlp(be, out, &p->gate, &p->up, &p->down, xb, gate, up, n, p->act);
    }
    if (p->b_down) be->ops->add_bias(be, out, p->b_down, n, p->down.rows);
}

const char *model_quant_desc(const matview *w, char *out, size_t size) {
    char super[32] = "", zero[16] = "";
    if (w->super) snprintf(super, sizeof super, "/%lld", (long long)w->super);
    if (w->quant_bits && !w->biases) snprintf(zero, sizeof zero, " z%d", w->zero);
    if (w->quant_bits)
        snprintf(out, size, "%d-bit g%lld%s%s", w->quant_bits, (long long)w->group, super, zero);
    else
        snprintf(out, size, "%s", dtype_name(w->type));
    return out;
}

void model_formats(const celer_model *m, char *out, size_t size) {
    enum { KINDS = 16 };
    char name[KINDS][48];
    int64_t count[KINDS] = {0};
    int kinds = 0;
    const gguf_file *g = m->ck.gguf;
    const int64_t n = g ? (int64_t)g->n_tensors : m->n_mats;
    matview **mats = g ? NULL : malloc(sizeof *mats * (size_t)(n > 0 ? n : 1));
    if (!g && mats) model_matrices((celer_model *)m, mats, n); /* only read here */
    for (int64_t i = 0; i < n && (g || mats); i++) {
        char d[48];
        if (g)
            snprintf(d, sizeof d, "%s", gguf_type_name(g->tensors[i].ggml_type));
        else
            model_quant_desc(mats[i], d, sizeof d);
        int k = 0;
        while (k < kinds && strcmp(name[k], d)) k++;
        if (k == kinds && kinds < KINDS) snprintf(name[kinds++], sizeof name[0], "%s", d);
        if (k < kinds) count[k]++;
    }
    free(mats);
    size_t used = 0;
    out[0] = 0;
    for (int k = 0; k < kinds; k++) /* most common first */
        for (int j = k + 1; j < kinds; j++)
            if (count[j] > count[k]) {
                char t[48];
                const int64_t c = count[k];
                memcpy(t, name[k], sizeof t), memcpy(name[k], name[j], sizeof t),
                    memcpy(name[j], t, sizeof t);
                count[k] = count[j], count[j] = c;
            }
    for (int k = 0; k < kinds && used < size; k++)
        used += (size_t)snprintf(out + used, size - used, "%s%s x%lld", k ? ", " : "", name[k],
                                 (long long)count[k]);
    if (g && used < size)
        snprintf(out + used, size - used, " (GGUF tensors)");
    else if (used < size)
        snprintf(out + used, size - used, " (matrices)");
}

int64_t matview_bytes(const matview *w) {
    if (!w->quant_bits) return w->rows * w->cols * (int64_t)dtype_size(w->type);
    /* Q2_K's scales and mins share their bytes */
    const int64_t parts = w->biases ? 2 : 1, group_parts = w->biases == w->scales ? 1 : parts;
    return w->rows * w->cols * w->quant_bits / 8 +
           group_parts * w->rows * (w->cols / w->group) * (int64_t)dtype_size(w->scale_type) +
           (w->super ? parts * w->rows * (w->cols / w->super) * 2 : 0);
}

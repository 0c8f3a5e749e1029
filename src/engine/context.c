/*
 * context.c - the public model and context API: opens models, owns the KV cache, the
 * backend and every activation buffer, and plans each step (positions, cache slots,
 * block tables) before handing it to the model contract in src/models/.
 *
 * Inputs longer than n_batch run in chunks through the whole model; every buffer is
 * sized at creation, so no forward allocates, but for one: a backend with memory of its
 * own gets its logits buffer at the first call that asks for more rows than it holds
 * (before the call changes anything), so sampling one row a step holds one row.
 */
#include "celer.h"

#include "base/error.h"
#include "engine/context.h"
#include "engine/image.h"
#include "models/model.h"
#include "sampling/sampling.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KV_BLOCK_SIZE 16

struct celer_context {
    celer_model *model;
    const backend_class *cls;
    char device[32];     /* "cpu", "cuda:0" */
    const char *kernels; /* the kernel set the backend runs (a static string) */
    backend *be;
    backend *vbe; /* the vision tower's backend (vision-language models), or NULL */
    model_vision_sizes vsz;
    int64_t tiles_per_call;
    float *vscratch;   /* [vsz.scratch_floats], memory of vbe */
    int64_t head_rows; /* rows the LM head ran on in the last call */
    int32_t n_threads;
    kv_cache kv;
    int64_t n_batch;
    int64_t buffer_bytes; /* what the context allocated through be and vbe (not the KV pools) */
    /* memory of be */
    float *scratch;   /* model activations for n_batch rows */
    float *hidden;    /* [n_batch, d] */
    float *out;       /* [out_rows, v] logits a backend of its own memory writes (else NULL) */
    int64_t out_rows; /* the most logits rows a step has asked for so far */
    int32_t *out_ids; /* [n_batch] their argmax where the backend takes it (else NULL) */
    int32_t *in_token, *in_pos, *in_slot, *in_seq, *in_tables,
        *in_limit;  /* step inputs (else NULL) */
    float *in_embd; /* [n_batch, d] (else NULL) */
    /* host */
    float *logits;             /* [v]: the generate loop's row */
    int32_t *pos, *slot, *seq; /* [n_batch] */
    int32_t *limit;            /* [n_batch] the rows' limits where image blocks see ahead */
    int32_t *tables;           /* [n_batch, kv.max_blocks] the step's block tables (else NULL) */
    int32_t *seq_row;          /* [n_seq] row of tables of each sequence in the step */
    int64_t *add, *next;       /* [n_seq] */
    celer_error err;
};

/* ==== Model ==== */

celer_status celer_model_open(const char *path, const celer_model_params *params, celer_model **out,
                              char *err, size_t err_size) {
    (void)params;
    celer_error e = {{0}};
    if (!path || !out) {
        error_set(&e, CELER_STATUS_INVALID_ARGUMENT, "celer_model_open: path and out are required");
        error_copy(&e, err, err_size);
        return CELER_STATUS_INVALID_ARGUMENT;
    }
    celer_status s = image_model_open(path, out, &e);
    error_copy(&e, err, err_size);
    return s;
}

void celer_model_close(celer_model *model) {
    image_model_close(model);
}
int64_t celer_model_n_vocab(const celer_model *m) {
    return m->dims.v;
}
int64_t celer_model_n_embd(const celer_model *m) {
    return m->dims.d;
}
int64_t celer_model_n_layer(const celer_model *m) {
    return m->dims.n_layer;
}
int64_t celer_model_n_ctx_train(const celer_model *m) {
    return m->dims.n_ctx_train;
}
const char *celer_model_desc(const celer_model *m) {
    return m->desc;
}

void celer_model_formats(const celer_model *m, char *out, size_t size) {
    model_formats(m, out, size);
}

celer_status celer_model_convert(const celer_model *m, const char *dir, char *err,
                                 size_t err_size) {
    celer_error e = {{0}};
    celer_status s = checkpoint_write_mlx(&m->ck, dir, &e);
    error_copy(&e, err, err_size);
    return s;
}

celer_model_info celer_model_get_info(const celer_model *m) {
    celer_model_info info = {0};
    model_count(m, &info.n_params, &info.weight_bytes);
    /* fp16 K and V (the default cache type) for every layer */
    model_prepared_info(m, &info.packed_bytes, &info.pack_ms);
    info.kv_bytes_per_token =
        2 * m->dims.n_layer * m->dims.hk * m->dims.hd * backend_kv_bytes(true);
    return info;
}

/* ==== Context ==== */

celer_context_params celer_context_default_params(void) {
    return (celer_context_params){.n_ctx = 4096, .n_seq = 1, .n_batch = 0, .n_threads = 0};
}

/* bytes of be's memory for ctx, counted in ctx->buffer_bytes */
static void *ctx_alloc(celer_context *ctx, backend *be, size_t bytes) {
    void *p = be->ops->alloc(be, bytes);
    if (p) ctx->buffer_bytes += (int64_t)bytes;
    return p;
}

static void release(backend *be, void *p) {
    if (be && p) be->ops->release(be, p);
}

void celer_context_destroy(celer_context *ctx) {
    if (!ctx) return;
    kv_cache_destroy(&ctx->kv);
    backend *be = ctx->be;
    release(be, ctx->scratch);
    release(be, ctx->hidden);
    release(be, ctx->out);
    release(be, ctx->in_token);
    release(be, ctx->in_pos);
    release(be, ctx->in_slot);
    release(be, ctx->in_seq);
    release(be, ctx->out_ids);
    release(be, ctx->in_tables);
    release(be, ctx->in_embd);
    release(be, ctx->in_limit);
    release(ctx->vbe, ctx->vscratch);
    backend_destroy(ctx->be);
    backend_destroy(ctx->vbe);
    free(ctx->logits);
    free(ctx->pos);
    free(ctx->slot);
    free(ctx->seq);
    free(ctx->limit);
    free(ctx->tables);
    free(ctx->seq_row);
    free(ctx->add);
    free(ctx->next);
    free(ctx);
}

/* A vision tower runs on a backend of its own, sized for its rows and head size, with
 * its scratch made here: several tiles per call while they fit about 1024 rows. */
static celer_status vision_backend(celer_context *ctx, const backend_params *tp,
                                   const backend_weights *w, celer_error *e) {
    const celer_model *m = ctx->model;
    if (!m->family->encode_image) return CELER_OK;
    m->family->vision_sizes(m, 1, &ctx->vsz);
    ctx->tiles_per_call = 1024 / ctx->vsz.tile_rows;
    if (ctx->tiles_per_call < 1) ctx->tiles_per_call = 1;
    if (ctx->tiles_per_call > 8) ctx->tiles_per_call = 8;
    m->family->vision_sizes(m, ctx->tiles_per_call, &ctx->vsz);
    const model_vision_sizes *v = &ctx->vsz;
    backend_params p = *tp;
    p.max_rows = v->rows, p.max_cols = v->cols, p.max_keys = v->keys, p.hd = v->hd;
    if (!(ctx->vbe = ctx->cls->create(&p, w, e))) return CELER_STATUS_OUT_OF_MEMORY;
    ctx->vscratch = ctx_alloc(ctx, ctx->vbe, sizeof(float) * (size_t)v->scratch_floats);
    if (!ctx->vscratch)
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "context: out of memory (vision)");
    return CELER_OK;
}

/* Backend buffers of a context: activations, and where the backend has memory of its own,
 * the step's inputs (the logits it writes come with the first step that asks for them). */
static bool context_buffers(celer_context *ctx, int64_t n_batch) {
    backend *be = ctx->be;
    const model_dims *dm = &ctx->model->dims;
    const size_t nb = (size_t)n_batch, d = (size_t)dm->d;
    ctx->scratch =
        ctx_alloc(ctx, be, sizeof(float) * (size_t)model_scratch_floats(ctx->model, n_batch));
    ctx->hidden = ctx_alloc(ctx, be, sizeof(float) * nb * d);
    if (!ctx->scratch || !ctx->hidden) return false;
    if (be->host) return true;
    const size_t tables = nb * (size_t)ctx->kv.max_blocks;
    ctx->in_token = ctx_alloc(ctx, be, sizeof(int32_t) * nb);
    ctx->in_pos = ctx_alloc(ctx, be, sizeof(int32_t) * nb);
    ctx->in_slot = ctx_alloc(ctx, be, sizeof(int32_t) * nb);
    ctx->in_seq = ctx_alloc(ctx, be, sizeof(int32_t) * nb);
    if (be->ops->argmax_rows) ctx->out_ids = ctx_alloc(ctx, be, sizeof(int32_t) * nb);
    ctx->in_tables = ctx_alloc(ctx, be, sizeof(int32_t) * tables);
    ctx->in_embd = ctx_alloc(ctx, be, sizeof(float) * nb * d);
    if (ctx->model->image_blocks && !(ctx->in_limit = ctx_alloc(ctx, be, sizeof(int32_t) * nb)))
        return false;
    ctx->tables = malloc(sizeof(int32_t) * tables);
    return ctx->in_token && ctx->in_pos && ctx->in_slot && ctx->in_seq && ctx->in_tables &&
           ctx->in_embd && ctx->tables && (ctx->out_ids || !be->ops->argmax_rows);
}

celer_status celer_context_create(celer_model *model, const celer_context_params *params,
                                  celer_context **out, char *err, size_t err_size) {
    celer_error e = {{0}};
    celer_status s = CELER_OK;
    celer_context_params p = params ? *params : celer_context_default_params();
    *out = NULL;
    if (p.n_ctx <= 0 || p.n_seq <= 0 || p.n_batch < 0 || p.n_threads < 0 || p.kv_positions < 0) {
        s = error_set(&e, CELER_STATUS_INVALID_ARGUMENT,
                      "context: n_ctx and n_seq must be positive, n_batch, n_threads and "
                      "kv_positions >= 0");
        error_copy(&e, err, err_size);
        return s;
    }
    if (p.n_threads == 0) p.n_threads = backend_host_class()->default_threads();
    const char *kv_type = p.kv_type ? p.kv_type : "f16";
    const bool kv_f16 = !strcmp(kv_type, "f16");
    if (!kv_f16 && strcmp(kv_type, "f32")) {
        s = error_set(&e, CELER_STATUS_INVALID_ARGUMENT,
                      "KV cache type \"%s\": expected f16 or f32", kv_type);
        error_copy(&e, err, err_size);
        return s;
    }
    celer_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) goto oom;
    const model_dims *dm = &model->dims;
    ctx->model = model;
    ctx->n_threads = p.n_threads;
    int device;
    if ((s = backend_find(p.device ? p.device : getenv("CELER_DEVICE"), &ctx->cls, &device, &e)) !=
        CELER_OK)
        goto fail;
    if (p.n_batch == 0) p.n_batch = ctx->cls->rows_per_step;
    ctx->n_batch = p.n_batch;
    if (!strcmp(ctx->cls->name, "cpu"))
        snprintf(ctx->device, sizeof ctx->device, "cpu");
    else
        snprintf(ctx->device, sizeof ctx->device, "%s:%d", ctx->cls->name, device);
    int64_t max_cols = dm->d;
    if (dm->h * dm->hd > max_cols) max_cols = dm->h * dm->hd;
    if (dm->f > max_cols) max_cols = dm->f;
    const char *kernels = p.kernels ? p.kernels : getenv("CELER_CPU");
    const backend_params bp = {.device = device,
                               .kernels = kernels,
                               .n_threads = p.n_threads,
                               .kv_f16 = kv_f16,
                               .max_rows = p.n_batch,
                               .max_cols = max_cols,
                               .max_keys = p.n_ctx,
                               .hd = dm->hd,
                               .rope_kinds = model_rope_kinds(model)};
    const backend_weights *w;
    if (!(ctx->be = ctx->cls->create(&bp, NULL, &e))) {
        s = CELER_STATUS_INVALID_ARGUMENT;
        goto fail;
    }
    /* a model the backend cannot run is refused before its weights are copied */
    if ((s = model_check_backend(model, ctx->be, &e)) != CELER_OK) goto fail;
    /* the kernel set is known (and checked) once a backend exists; weights are prepared for
     * it, or kept where they lie for one that reads them there */
    if (ctx->be->in_place)
        w = NULL, model_keep_sources(model);
    else if ((s = model_prepare(model, ctx->cls, &bp, &w, &e)) != CELER_OK)
        goto fail;
    ctx->be->weights = w;
    ctx->kernels = ctx->be->kernels;
    const int64_t n_blocks = (p.kv_positions + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE;
    if ((s = kv_cache_create(&ctx->kv, dm->n_layer, dm->hk * dm->hd, backend_kv_bytes(kv_f16),
                             p.n_ctx, p.n_seq, n_blocks, KV_BLOCK_SIZE, ctx->be, &e)) != CELER_OK)
        goto fail;
    if ((s = vision_backend(ctx, &bp, w, &e)) != CELER_OK) goto fail;
    ctx->logits = malloc(sizeof(float) * (size_t)dm->v);
    ctx->pos = malloc(sizeof(int32_t) * (size_t)p.n_batch);
    ctx->slot = malloc(sizeof(int32_t) * (size_t)p.n_batch);
    ctx->seq = malloc(sizeof(int32_t) * (size_t)p.n_batch);
    ctx->limit = malloc(sizeof(int32_t) * (size_t)p.n_batch);
    ctx->seq_row = malloc(sizeof(int32_t) * (size_t)p.n_seq);
    ctx->add = calloc((size_t)p.n_seq, sizeof(int64_t));
    ctx->next = calloc((size_t)p.n_seq, sizeof(int64_t));
    if (!context_buffers(ctx, p.n_batch) || !ctx->logits || !ctx->pos || !ctx->slot || !ctx->seq ||
        !ctx->limit || !ctx->seq_row || !ctx->add || !ctx->next)
        goto oom;
    *out = ctx;
    return CELER_OK;
oom:
    s = error_set(&e, CELER_STATUS_OUT_OF_MEMORY, "context: out of memory");
fail:
    celer_context_destroy(ctx);
    error_copy(&e, err, err_size);
    return s;
}

const char *celer_context_last_error(const celer_context *ctx) {
    return ctx->err.msg;
}
int64_t celer_context_head_rows(const celer_context *ctx) {
    return ctx->head_rows;
}
kv_cache *context_kv(celer_context *ctx) {
    return &ctx->kv;
}
const char *celer_context_kernels(const celer_context *ctx) {
    return ctx->kernels;
}
const char *celer_context_device(const celer_context *ctx) {
    return ctx->device;
}

static int64_t backend_work(const backend *be) {
    return be && be->ops->work_bytes ? be->ops->work_bytes(be) : 0;
}

celer_context_memory celer_context_get_memory(const celer_context *ctx) {
    celer_context_memory mem = {0};
    const backend_weights *w = ctx->be->weights;
    if (w) mem.weights = w->bytes;
    if (!w || !w->whole) /* the backend also reads the checkpoint in place */
        mem.weights += model_resident_source_bytes(ctx->model);
    const kv_cache *kv = &ctx->kv;
    mem.kv = 2 * kv->n_layer * kv->n_blocks * kv->block_size * kv->kvd * kv->elem_bytes;
    mem.buffers = ctx->buffer_bytes + backend_work(ctx->be) + backend_work(ctx->vbe);
    return mem;
}

bool celer_device_at(int i, char *name, size_t name_size, char *desc, size_t desc_size) {
    for (int k = 0; backend_class_name(k); k++) {
        const backend_class *c = backend_class_get(k, NULL);
        celer_error e = {{0}};
        const int n = c ? c->device_count(&e) : 0;
        if (i >= n) {
            i -= n;
            continue;
        }
        if (!strcmp(c->name, "cpu"))
            snprintf(name, name_size, "cpu");
        else
            snprintf(name, name_size, "%s:%d", c->name, i);
        c->device_name(i, desc, desc_size);
        return true;
    }
    return false;
}

bool celer_device_missing_at(int i, char *name, size_t name_size, char *why, size_t why_size) {
    for (int k = 0; backend_class_name(k); k++) {
        celer_error e = {{0}};
        const backend_class *c = backend_class_get(k, &e);
        if (c && c->device_count(&e) > 0) continue;
        if (i-- > 0) continue;
        snprintf(name, name_size, "%s", backend_class_name(k));
        if (c)
            snprintf(why, why_size, "no %s device found%s%s", c->name, e.msg[0] ? ": " : "", e.msg);
        else
            error_copy(&e, why, why_size);
        return true;
    }
    return false;
}

int32_t celer_context_n_threads(const celer_context *ctx) {
    return ctx->n_threads;
}
int64_t celer_context_n_batch(const celer_context *ctx) {
    return ctx->n_batch;
}

bool celer_kernels_supported(const char *name) {
    return backend_host_class()->kernels_supported(name);
}

int32_t celer_physical_cores(void) {
    return backend_host_class()->default_threads();
}

celer_status celer_seq_reset(celer_context *ctx, int32_t seq_id) {
    if (seq_id < 0 || seq_id >= ctx->kv.n_seq)
        return error_set(&ctx->err, CELER_STATUS_INVALID_ARGUMENT, "sequence id %d outside [0, %d)",
                         seq_id, ctx->kv.n_seq);
    kv_cache_seq_reset(&ctx->kv, seq_id);
    return CELER_OK;
}

celer_status celer_seq_truncate(celer_context *ctx, int32_t seq_id, int64_t len, int64_t *kept) {
    if (seq_id < 0 || seq_id >= ctx->kv.n_seq)
        return error_set(&ctx->err, CELER_STATUS_INVALID_ARGUMENT, "sequence id %d outside [0, %d)",
                         seq_id, ctx->kv.n_seq);
    if (len < 0 || len > ctx->kv.len[seq_id])
        return error_set(&ctx->err, CELER_STATUS_INVALID_ARGUMENT,
                         "truncate: sequence %d holds %lld positions, cannot keep %lld", seq_id,
                         (long long)ctx->kv.len[seq_id], (long long)len);
    const int64_t k = kv_cache_seq_truncate(&ctx->kv, seq_id, len);
    if (kept) *kept = k;
    return CELER_OK;
}

int64_t celer_seq_length(const celer_context *ctx, int32_t seq_id) {
    if (seq_id < 0 || seq_id >= ctx->kv.n_seq) return -1;
    return ctx->kv.len[seq_id];
}

/* ==== Running a batch ==== */

typedef enum run_output {
    RUN_HIDDEN, /* out: hidden[n, d] */
    RUN_ALL,    /* out: logits[n, v] */
    RUN_ROW,    /* out: logits[v] of row last_pos */
    RUN_WANTED, /* out: logits[k, v] of the rows batch->logits marks (and ids[k], their argmax) */
} run_output;

static int32_t row_seq(const celer_batch *b, int32_t force_seq, int64_t r) {
    return force_seq >= 0 ? force_seq : b->seq_id ? b->seq_id[r] : 0;
}

/* The end of the image block batch row r starts (m->image_blocks: a run of embedding rows
 * of one sequence, docs/architecture.md "Image blocks"), or r + 1 for any other row. */
static int64_t block_end(const celer_context *ctx, const celer_batch *b, int32_t force_seq,
                         int64_t r) {
    int64_t end = r + 1;
    if (!ctx->model->image_blocks || !b->token || !b->embd || b->token[r] >= 0) return end;
    while (end < b->n && b->token[end] < 0 &&
           row_seq(b, force_seq, end) == row_seq(b, force_seq, r))
        end++;
    return end;
}

/* Rows of the step starting at batch row off: n_batch at most, and never an image block cut
 * in two (check_batch saw that each fits n_batch). */
static int64_t step_rows(const celer_context *ctx, const celer_batch *b, int32_t force_seq,
                         int64_t off) {
    int64_t n = b->n - off < ctx->n_batch ? b->n - off : ctx->n_batch;
    if (!ctx->model->image_blocks || off + n == b->n) return n;
    for (int64_t r = off; r < off + n;) {
        const int64_t end = block_end(ctx, b, force_seq, r);
        if (end > off + n) return r - off; /* r > off: the block fits a step of its own */
        r = end;
    }
    return n;
}

static celer_status check_batch(celer_context *ctx, const celer_batch *b, int32_t force_seq,
                                run_output kind, int64_t last_pos) {
    const celer_model *m = ctx->model;
    celer_error *e = &ctx->err;
    if (!b || b->n <= 0)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "batch: expected at least one row");
    if (!b->token && !b->embd)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "batch: expected token ids, embeddings or both");
    if (kind == RUN_ROW && (last_pos < 0 || last_pos >= b->n))
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "last_pos %lld outside the batch of %lld rows", (long long)last_pos,
                         (long long)b->n);
    if (kind == RUN_WANTED && !b->logits)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "batch: logits flags are required");
    memset(ctx->add, 0, sizeof(int64_t) * (size_t)ctx->kv.n_seq);
    for (int64_t r = 0; r < b->n; r++) {
        const int32_t s = row_seq(b, force_seq, r);
        if (s < 0 || s >= ctx->kv.n_seq)
            return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                             "batch row %lld: sequence id %d outside [0, %d)", (long long)r, s,
                             ctx->kv.n_seq);
        if (b->token && b->token[r] >= m->dims.v)
            return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                             "batch row %lld: token id %d outside the vocabulary [0, %lld)",
                             (long long)r, b->token[r], (long long)m->dims.v);
        if (b->token && b->token[r] < 0 && !b->embd)
            return error_set(
                e, CELER_STATUS_INVALID_ARGUMENT,
                "batch row %lld: an embedding row (token %d) but the batch has no embeddings",
                (long long)r, b->token[r]);
        ctx->add[s]++;
    }
    for (int64_t r = 0; r < b->n;) { /* an image block runs whole in one step */
        const int64_t end = block_end(ctx, b, force_seq, r);
        if (end - r > ctx->n_batch)
            return error_set(
                e, CELER_STATUS_INVALID_ARGUMENT,
                "batch rows %lld..%lld: an image block of %lld rows is longer than the context's "
                "n_batch %lld (its rows attend to each other in one step)",
                (long long)r, (long long)end - 1, (long long)(end - r), (long long)ctx->n_batch);
        r = end;
    }
    return CELER_OK;
}

/* The step of batch rows [off, off + n): positions, cache slots and block tables, in
 * backend memory. A host backend reads the batch and the cache's tables where they lie;
 * otherwise the inputs go up, with only the tables of the step's sequences. */
static model_step plan_step(celer_context *ctx, const celer_batch *b, int32_t force_seq,
                            int64_t off, int64_t n) {
    backend *be = ctx->be;
    const kv_cache *kv = &ctx->kv;
    const int64_t d = ctx->model->dims.d, cols = kv->max_blocks;
    int64_t n_tables = 0, keys = 0;
    for (int64_t r = 0; r < n; r++) {
        const int32_t sq = row_seq(b, force_seq, off + r);
        const int64_t p = ctx->next[sq]++;
        if (p + 1 > keys) keys = p + 1;
        ctx->pos[r] = (int32_t)p;
        ctx->slot[r] = kv_cache_slot(kv, sq, p);
        ctx->seq[r] = sq;
        if (be->host) continue;
        /* the first row of a sequence copies its table (every block it reaches: the cache
         * reserved them before the step) */
        if (ctx->seq_row[sq] < 0) {
            memcpy(ctx->tables + n_tables * cols, kv_cache_table(kv, sq),
                   sizeof(int32_t) * (size_t)cols);
            ctx->seq_row[sq] = (int32_t)n_tables++;
        }
        ctx->seq[r] = ctx->seq_row[sq];
    }
    /* image blocks: each row sees up to its block's last position */
    bool ahead = false;
    for (int64_t r = 0; ctx->model->image_blocks && r < n;) {
        const int64_t end = block_end(ctx, b, force_seq, off + r) - off;
        for (int64_t i = r; i < end; i++) ctx->limit[i] = ctx->pos[end - 1];
        if (end - r > 1) ahead = true;
        if (ctx->pos[end - 1] + 1 > keys) keys = ctx->pos[end - 1] + 1;
        r = end;
    }
    model_step st = {.n = n,
                     .token = b->token ? b->token + off : NULL,
                     .embd = b->embd ? b->embd + off * d : NULL,
                     .pos = ctx->pos,
                     .limit = ahead ? ctx->limit : NULL,
                     .slot = ctx->slot,
                     .seq = ctx->seq,
                     .tables = kv->tables,
                     .table_cols = cols,
                     .block_size = kv->block_size,
                     .seqs = n_tables,
                     .keys = keys};
    if (be->host) return st;
    const size_t ni = sizeof(int32_t) * (size_t)n;
    if (st.token) be->ops->upload(be, ctx->in_token, st.token, ni), st.token = ctx->in_token;
    if (st.embd)
        be->ops->upload(be, ctx->in_embd, st.embd, sizeof(float) * (size_t)(n * d)),
            st.embd = ctx->in_embd;
    be->ops->upload(be, ctx->in_pos, ctx->pos, ni);
    be->ops->upload(be, ctx->in_slot, ctx->slot, ni);
    be->ops->upload(be, ctx->in_seq, ctx->seq, ni);
    be->ops->upload(be, ctx->in_tables, ctx->tables, sizeof(int32_t) * (size_t)(n_tables * cols));
    st.pos = ctx->in_pos, st.slot = ctx->in_slot, st.seq = ctx->in_seq, st.tables = ctx->in_tables;
    if (ahead) be->ops->upload(be, ctx->in_limit, ctx->limit, ni), st.limit = ctx->in_limit;
    return st;
}

/* The wanted rows of a step whose backend has memory of its own, from its logits
 * dst[rows, v] (row k: the k-th of the n rows that flags marks): each one's argmax into
 * ids, by the backend where it takes it (then only the logits of rows flagged
 * CELER_ROW_LOGITS come down), else on the host from every row taken down. */
static void take_wanted(celer_context *ctx, const int8_t *flags, int64_t n, const float *dst,
                        int64_t rows, float *out, int32_t *ids) {
    backend *be = ctx->be;
    const int64_t v = ctx->model->dims.v;
    const size_t row_bytes = sizeof(float) * (size_t)v;
    if (!be->ops->argmax_rows) {
        be->ops->download(be, out, dst, row_bytes * (size_t)rows);
        for (int64_t k = 0; k < rows; k++) ids[k] = sampling_argmax(out + k * v, v);
        return;
    }
    be->ops->argmax_rows(be, ctx->out_ids, dst, rows, v);
    be->ops->download(be, ids, ctx->out_ids, sizeof(int32_t) * (size_t)rows);
    /* the logits rows: wanted row k is row k of dst and of out; each run of consecutive
     * CELER_ROW_LOGITS rows comes down in one copy */
    int64_t k = 0, first = 0, count = 0;
    for (int64_t r = 0; r < n; r++) {
        if (!flags[r]) continue;
        if (flags[r] == CELER_ROW_ARGMAX) {
            if (count)
                be->ops->download(be, out + first * v, dst + first * v, row_bytes * (size_t)count);
            count = 0;
        } else if (count++ == 0) {
            first = k;
        }
        k++;
    }
    if (count) be->ops->download(be, out + first * v, dst + first * v, row_bytes * (size_t)count);
}

/* The most logits rows one step of a call makes. */
static int64_t step_logits_rows(const celer_context *ctx, const celer_batch *b, int32_t force_seq,
                                run_output kind, int64_t last_pos) {
    int64_t most = 0;
    for (int64_t off = 0, n; off < b->n; off += n) {
        n = step_rows(ctx, b, force_seq, off);
        int64_t rows = kind == RUN_ALL   ? n
                       : kind == RUN_ROW ? (last_pos >= off && last_pos < off + n)
                                         : 0;
        if (kind == RUN_WANTED)
            for (int64_t r = off; r < off + n; r++) rows += b->logits[r] != 0;
        if (rows > most) most = rows;
    }
    return most;
}

/* Room in ctx->out (a backend with memory of its own) for rows logits rows. The buffer
 * grows to the most rows a step has asked for: a context that samples a row a step holds
 * that row, not n_batch of them (a Llama 3 row is 501 KiB). */
static celer_status out_reserve(celer_context *ctx, int64_t rows) {
    if (rows <= ctx->out_rows) return CELER_OK;
    const size_t row_bytes = sizeof(float) * (size_t)ctx->model->dims.v;
    release(ctx->be, ctx->out);
    ctx->buffer_bytes -= (int64_t)row_bytes * ctx->out_rows;
    ctx->out_rows = 0;
    if (!(ctx->out = ctx_alloc(ctx, ctx->be, row_bytes * (size_t)rows)))
        return error_set(&ctx->err, CELER_STATUS_OUT_OF_MEMORY,
                         "context: out of %s memory for %lld rows of logits", ctx->device,
                         (long long)rows);
    ctx->out_rows = rows;
    return CELER_OK;
}

static celer_status run(celer_context *ctx, const celer_batch *b, int32_t force_seq,
                        run_output kind, int64_t last_pos, float *out, int32_t *ids) {
    const celer_model *m = ctx->model;
    backend *be = ctx->be;
    const int64_t d = m->dims.d, v = m->dims.v;
    celer_status s = backend_status(be, &ctx->err); /* a lost device fails at once */
    if (s == CELER_OK) s = check_batch(ctx, b, force_seq, kind, last_pos);
    if (s == CELER_OK && !be->host)
        s = out_reserve(ctx, step_logits_rows(ctx, b, force_seq, kind, last_pos));
    if (s == CELER_OK) s = kv_cache_reserve(&ctx->kv, ctx->add, &ctx->err);
    if (s != CELER_OK) return s;
    memcpy(ctx->next, ctx->kv.len, sizeof(int64_t) * (size_t)ctx->kv.n_seq);
    const model_kv kv = {ctx->kv.k, ctx->kv.v};
    int64_t head_rows = 0;
    for (int64_t off = 0, n; off < b->n; off += n) {
        n = step_rows(ctx, b, force_seq, off);
        if (!be->host)
            for (int32_t q = 0; q < ctx->kv.n_seq; q++) ctx->seq_row[q] = -1;
        const model_step st = plan_step(ctx, b, force_seq, off, n);
        /* a host backend writes the caller's memory; others write their own, then only
         * the rows made come down */
        float *dst = be->host ? out : kind == RUN_HIDDEN ? ctx->hidden : ctx->out;
        int64_t rows = 0, width = v;
        do {
            backend_begin(be, n);
            switch (kind) {
            case RUN_HIDDEN:
                model_hidden_states(m, be, &st, &kv, ctx->scratch, be->host ? out + off * d : dst);
                rows = n, width = d;
                break;
            case RUN_ALL:
                rows = model_forward(m, be, &st, &kv, ctx->scratch, ctx->hidden,
                                     be->host ? out + off * v : dst);
                break;
            case RUN_ROW:
                if (last_pos >= off && last_pos < off + n)
                    rows = model_forward_last_logits(m, be, &st, &kv, ctx->scratch, ctx->hidden,
                                                     last_pos - off, dst);
                else
                    model_hidden_states(m, be, &st, &kv, ctx->scratch, ctx->hidden);
                break;
            case RUN_WANTED:
                rows = model_forward_rows(m, be, &st, &kv, ctx->scratch, ctx->hidden,
                                          b->logits + off, dst);
                break;
            }
        } while (!backend_end(be));
        if (!be->host && rows && kind == RUN_WANTED && ids)
            take_wanted(ctx, b->logits + off, n, dst, rows, out, ids);
        else if (!be->host && rows)
            be->ops->download(be, kind == RUN_HIDDEN || kind == RUN_ALL ? out + off * width : out,
                              dst, sizeof(float) * (size_t)(rows * width));
        else if (kind == RUN_WANTED && ids)
            for (int64_t k = 0; k < rows; k++) ids[k] = sampling_argmax(out + k * v, v);
        if ((s = backend_status(be, &ctx->err)) != CELER_OK) {
            /* nothing of the call is committed: the positions its earlier steps wrote
             * are written again by whatever comes next */
            kv_cache_unreserve(&ctx->kv, ctx->add);
            return s;
        }
        if (kind != RUN_HIDDEN) head_rows += rows;
        if (kind == RUN_WANTED) out += v * rows;
        if (ids) ids += rows;
    }
    ctx->head_rows = head_rows;
    kv_cache_commit(&ctx->kv, ctx->add);
    ctx->err.msg[0] = '\0';
    return CELER_OK;
}

celer_status celer_batch_decode(celer_context *ctx, const celer_batch *batch, float *logits) {
    return run(ctx, batch, -1, RUN_WANTED, 0, logits, NULL);
}

celer_status celer_batch_decode_ids(celer_context *ctx, const celer_batch *batch, float *logits,
                                    int32_t *ids) {
    if (!ids) return error_set(&ctx->err, CELER_STATUS_INVALID_ARGUMENT, "batch: ids is NULL");
    return run(ctx, batch, -1, RUN_WANTED, 0, logits, ids);
}

celer_status celer_hidden_states(celer_context *ctx, const celer_batch *batch, float *hidden) {
    return run(ctx, batch, -1, RUN_HIDDEN, 0, hidden, NULL);
}

celer_status celer_forward(celer_context *ctx, const celer_batch *batch, float *logits) {
    return run(ctx, batch, -1, RUN_ALL, 0, logits, NULL);
}

celer_status celer_forward_last_logits(celer_context *ctx, const celer_batch *batch,
                                       int64_t last_pos, float *logits) {
    return run(ctx, batch, 0, RUN_ROW, last_pos, logits, NULL);
}

celer_status celer_forward_last_logits_with_sequence_id(celer_context *ctx,
                                                        const celer_batch *batch, int32_t seq_id,
                                                        int64_t last_pos, float *logits) {
    if (seq_id < 0)
        return error_set(&ctx->err, CELER_STATUS_INVALID_ARGUMENT, "sequence id %d is negative",
                         seq_id);
    return run(ctx, batch, seq_id, RUN_ROW, last_pos, logits, NULL);
}

celer_status celer_forward_last_logits_with_embeddings_and_sequence_id(celer_context *ctx,
                                                                       const float *embd, int64_t n,
                                                                       int32_t seq_id,
                                                                       int64_t last_pos,
                                                                       float *logits) {
    const celer_batch b = {.n = n, .embd = embd};
    return celer_forward_last_logits_with_sequence_id(ctx, &b, seq_id, last_pos, logits);
}

celer_status celer_embed_tokens(celer_context *ctx, const int32_t *ids, int64_t n, float *embd) {
    const int64_t v = ctx->model->dims.v;
    for (int64_t r = 0; r < n; r++)
        if (ids[r] < 0 || ids[r] >= v)
            return error_set(&ctx->err, CELER_STATUS_INVALID_ARGUMENT,
                             "token id %d outside the vocabulary [0, %lld)", ids[r], (long long)v);
    backend *be = ctx->be;
    celer_status s = backend_status(be, &ctx->err);
    if (s != CELER_OK) return s;
    if (be->host) {
        model_embed(ctx->model, be, ids, n, embd);
        return CELER_OK;
    }
    const int64_t d = ctx->model->dims.d;
    for (int64_t off = 0; off < n; off += ctx->n_batch) {
        const int64_t k = n - off < ctx->n_batch ? n - off : ctx->n_batch;
        be->ops->upload(be, ctx->in_token, ids + off, sizeof(int32_t) * (size_t)k);
        do {
            backend_begin(be, k);
            model_embed(ctx->model, be, ctx->in_token, k, ctx->hidden);
        } while (!backend_end(be));
        be->ops->download(be, embd + off * d, ctx->hidden, sizeof(float) * (size_t)(k * d));
        if ((s = backend_status(be, &ctx->err)) != CELER_OK) return s;
    }
    return CELER_OK;
}

celer_status celer_image_encode(celer_context *ctx, const celer_image *img, float *embd) {
    if (!ctx->vbe)
        return error_set(&ctx->err, CELER_STATUS_INVALID_ARGUMENT, "%s reads no images",
                         ctx->model->desc);
    celer_status s = image_encode(ctx->model, ctx->vbe, ctx->tiles_per_call, ctx->vscratch, img,
                                  embd, &ctx->err);
    if (s == CELER_OK) ctx->err.msg[0] = '\0';
    return s;
}

/* ==== Greedy generation ==== */

celer_status celer_generate_greedy(celer_context *ctx, const int32_t *prompt, int64_t n_prompt,
                                   const celer_generate_params *params, int32_t *out,
                                   int64_t *n_out) {
    const int32_t seq = params->seq_id;
    const int64_t v = ctx->model->dims.v;
    *n_out = 0;
    if (celer_seq_length(ctx, seq) != 0)
        return error_set(&ctx->err, CELER_STATUS_INVALID_ARGUMENT,
                         "generate: sequence %d is not empty", seq);
    celer_batch b = celer_batch_tokens(prompt, n_prompt);
    celer_status s =
        celer_forward_last_logits_with_sequence_id(ctx, &b, seq, n_prompt - 1, ctx->logits);
    for (int64_t i = 0; s == CELER_OK && i < params->n_predict; i++) {
        const int32_t tok = sampling_argmax(ctx->logits, v);
        out[(*n_out)++] = tok;
        if (params->stop_at_eos && celer_model_is_eos(ctx->model, tok)) break;
        if (i + 1 == params->n_predict) break;
        b = celer_batch_tokens(&out[i], 1);
        s = celer_forward_last_logits_with_sequence_id(ctx, &b, seq, 0, ctx->logits);
    }
    return s;
}

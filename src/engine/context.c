/*
 * context.c - the public model and context API: opens models, owns the KV cache, the
 * backend and every activation buffer, and plans each step (positions, cache slots,
 * block tables) before handing it to the model contract in src/models/.
 *
 * Inputs longer than n_batch run in chunks through the whole model; every buffer is
 * sized at creation, so no forward allocates.
 */
#include "celer.h"

#include "base/error.h"
#include "engine/context.h"
#include "engine/image.h"
#include "backend/cpu/backend_cpu.h"
#include "backend/cpu/cpuid.h"
#include "kernels/ref/backend_ref.h"
#include "models/model.h"
#include "sampling/sampling.h"

#include <stdlib.h>
#include <string.h>

#define KV_BLOCK_SIZE 16

struct celer_context {
    celer_model *model;
    backend *be;
    backend *vbe;             /* the vision tower's backend (vision-language models), or NULL */
    model_vision_sizes vsz;
    int64_t tiles_per_call;
    float *vscratch;          /* [vsz.scratch_floats] */
    int64_t head_rows;        /* rows the LM head ran on in the last call */
    cpu_isa isa;
    int32_t n_threads;
    kv_cache kv;
    int64_t n_batch;
    float *scratch;    /* model activations for n_batch rows */
    float *hidden;     /* [n_batch, d] */
    float *logits;     /* [v]: the generate loop's row */
    int32_t *pos, *slot;            /* [n_batch] */
    const int32_t **blocks;         /* [n_batch] */
    int64_t *add, *next;            /* [n_seq] */
    celer_error err;
};

/* ==== Model ==== */

celer_status celer_model_open(const char *path, const celer_model_params *params,
                              celer_model **out, char *err, size_t err_size) {
    (void)params;
    celer_error e = {{0}};
    if (!path || !out) {
        error_set(&e, CELER_STATUS_INVALID_ARGUMENT, "celer_model_open: path and out are required");
        error_copy(&e, err, err_size);
        return CELER_STATUS_INVALID_ARGUMENT;
    }
    celer_status s = model_open(path, out, &e);
    if (s == CELER_OK && (s = image_model_init(*out, &e)) != CELER_OK) {
        model_close(*out);
        *out = NULL;
    }
    error_copy(&e, err, err_size);
    return s;
}

void celer_model_close(celer_model *model) { model_close(model); }
int64_t celer_model_n_vocab(const celer_model *m) { return m->dims.v; }
int64_t celer_model_n_embd(const celer_model *m) { return m->dims.d; }
int64_t celer_model_n_layer(const celer_model *m) { return m->dims.n_layer; }
int64_t celer_model_n_ctx_train(const celer_model *m) { return m->dims.n_ctx_train; }
const char *celer_model_desc(const celer_model *m) { return m->desc; }

celer_status celer_model_convert(const celer_model *m, const char *dir, char *err, size_t err_size) {
    celer_error e = {{0}};
    celer_status s = checkpoint_write_mlx(&m->ck, dir, &e);
    error_copy(&e, err, err_size);
    return s;
}

celer_model_info celer_model_get_info(const celer_model *m) {
    celer_model_info info = {0};
    model_count(m, &info.n_params, &info.weight_bytes);
    /* fp16 K and V (the default cache type) for every layer */
    info.packed_bytes = (int64_t)m->packed_mem.bytes;
    info.pack_ms = m->pack_ms;
    info.kv_bytes_per_token = 2 * m->dims.n_layer * m->dims.hk * m->dims.hd * backend_kv_bytes(true);
    return info;
}

/* ==== Context ==== */

celer_context_params celer_context_default_params(void) {
    return (celer_context_params){.n_ctx = 4096, .n_seq = 1, .n_batch = 512, .n_threads = 0};
}

void celer_context_destroy(celer_context *ctx) {
    if (!ctx) return;
    backend_destroy(ctx->be);
    backend_destroy(ctx->vbe);
    free(ctx->vscratch);
    kv_cache_destroy(&ctx->kv);
    free(ctx->scratch);
    free(ctx->hidden);
    free(ctx->logits);
    free(ctx->pos);
    free(ctx->slot);
    free(ctx->blocks);
    free(ctx->add);
    free(ctx->next);
    free(ctx);
}

/* A vision tower runs on a backend of its own, sized for its rows and head size, with
 * its scratch made here: several tiles per call while they fit about 1024 rows. */
static celer_status vision_backend(celer_context *ctx, cpu_isa isa, int n_threads, celer_error *e) {
    const celer_model *m = ctx->model;
    if (!m->family->encode_image) return CELER_OK;
    m->family->vision_sizes(m, 1, &ctx->vsz);
    ctx->tiles_per_call = 1024 / ctx->vsz.tile_rows;
    if (ctx->tiles_per_call < 1) ctx->tiles_per_call = 1;
    if (ctx->tiles_per_call > 8) ctx->tiles_per_call = 8;
    m->family->vision_sizes(m, ctx->tiles_per_call, &ctx->vsz);
    const model_vision_sizes *v = &ctx->vsz;
    if (isa == CPU_ISA_REF) {
        ctx->vbe = backend_ref_create(n_threads, v->cols, v->keys, false);
    } else {
        const backend_cpu_sizes sz = {.max_rows = v->rows, .max_cols = v->cols, .max_keys = v->keys, .hd = v->hd};
        ctx->vbe = backend_cpu_create(isa, n_threads, &sz, false);
    }
    ctx->vscratch = malloc(sizeof(float) * (size_t)v->scratch_floats);
    if (!ctx->vbe || !ctx->vscratch) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "context: out of memory (vision)");
    return CELER_OK;
}

celer_status celer_context_create(celer_model *model, const celer_context_params *params,
                                  celer_context **out, char *err, size_t err_size) {
    celer_error e = {{0}};
    celer_status s = CELER_OK;
    celer_context_params p = params ? *params : celer_context_default_params();
    *out = NULL;
    if (p.n_ctx <= 0 || p.n_seq <= 0 || p.n_batch <= 0 || p.n_threads < 0 || p.kv_positions < 0) {
        s = error_set(&e, CELER_STATUS_INVALID_ARGUMENT,
                      "context: n_ctx, n_seq and n_batch must be positive, n_threads and "
                      "kv_positions >= 0");
        error_copy(&e, err, err_size);
        return s;
    }
    if (p.n_threads == 0) p.n_threads = cpu_physical_cores();
    const char *kernels = p.kernels ? p.kernels : getenv("CELER_CPU");
    cpu_isa isa = CPU_ISA_REF;
    if (!kernels || !*kernels) kernels = "auto";
    if (!cpu_isa_from_name(kernels, &isa)) {
        s = error_set(&e, CELER_STATUS_INVALID_ARGUMENT,
                      "kernels \"%s\": expected auto, ref, generic, avx2, avx512 or amx", kernels);
        error_copy(&e, err, err_size);
        return s;
    }
    if (!cpu_isa_supported(isa)) {
        s = error_set(&e, CELER_STATUS_UNSUPPORTED, "kernels \"%s\": this CPU lacks the instructions",
                      kernels);
        error_copy(&e, err, err_size);
        return s;
    }
    const char *kv_type = p.kv_type ? p.kv_type : "f16";
    const bool kv_f16 = !strcmp(kv_type, "f16");
    if (!kv_f16 && strcmp(kv_type, "f32")) {
        s = error_set(&e, CELER_STATUS_INVALID_ARGUMENT, "KV cache type \"%s\": expected f16 or f32",
                      kv_type);
        error_copy(&e, err, err_size);
        return s;
    }
    celer_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) goto oom;
    ctx->isa = isa;
    ctx->n_threads = p.n_threads;
    const model_dims *dm = &model->dims;
    ctx->model = model;
    ctx->n_batch = p.n_batch;
    const int64_t n_blocks = (p.kv_positions + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE;
    if ((s = kv_cache_create(&ctx->kv, dm->n_layer, dm->hk * dm->hd, backend_kv_bytes(kv_f16), p.n_ctx,
                             p.n_seq, n_blocks, KV_BLOCK_SIZE, &e)) != CELER_OK)
        goto fail;
    int64_t max_cols = dm->d;
    if (dm->h * dm->hd > max_cols) max_cols = dm->h * dm->hd;
    if (dm->f > max_cols) max_cols = dm->f;
    if (isa == CPU_ISA_REF) {
        ctx->be = backend_ref_create(p.n_threads, max_cols, p.n_ctx, kv_f16);
    } else {
        if ((s = model_pack(model, &e)) != CELER_OK) goto fail;
        const backend_cpu_sizes sz = {.max_rows = p.n_batch, .max_cols = max_cols, .max_keys = p.n_ctx,
                                      .hd = dm->hd};
        ctx->be = backend_cpu_create(isa, p.n_threads, &sz, kv_f16);
    }
    if ((s = vision_backend(ctx, isa, p.n_threads, &e)) != CELER_OK) goto fail;
    ctx->scratch = malloc(sizeof(float) * (size_t)model_scratch_floats(model, p.n_batch));
    ctx->hidden = malloc(sizeof(float) * (size_t)(p.n_batch * dm->d));
    ctx->logits = malloc(sizeof(float) * (size_t)dm->v);
    ctx->pos = malloc(sizeof(int32_t) * (size_t)p.n_batch);
    ctx->slot = malloc(sizeof(int32_t) * (size_t)p.n_batch);
    ctx->blocks = malloc(sizeof(int32_t *) * (size_t)p.n_batch);
    ctx->add = calloc((size_t)p.n_seq, sizeof(int64_t));
    ctx->next = calloc((size_t)p.n_seq, sizeof(int64_t));
    if (!ctx->be || !ctx->scratch || !ctx->hidden || !ctx->logits || !ctx->pos || !ctx->slot ||
        !ctx->blocks || !ctx->add || !ctx->next)
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

const char *celer_context_last_error(const celer_context *ctx) { return ctx->err.msg; }
int64_t celer_context_head_rows(const celer_context *ctx) { return ctx->head_rows; }
kv_cache *context_kv(celer_context *ctx) { return &ctx->kv; }
const char *celer_context_kernels(const celer_context *ctx) { return cpu_isa_name(ctx->isa); }
int32_t celer_context_n_threads(const celer_context *ctx) { return ctx->n_threads; }

bool celer_kernels_supported(const char *name) {
    cpu_isa isa;
    return name && cpu_isa_from_name(name, &isa) && cpu_isa_supported(isa);
}

int32_t celer_physical_cores(void) { return cpu_physical_cores(); }

celer_status celer_seq_reset(celer_context *ctx, int32_t seq_id) {
    if (seq_id < 0 || seq_id >= ctx->kv.n_seq)
        return error_set(&ctx->err, CELER_STATUS_INVALID_ARGUMENT,
                         "sequence id %d outside [0, %d)", seq_id, ctx->kv.n_seq);
    kv_cache_seq_reset(&ctx->kv, seq_id);
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
    RUN_WANTED, /* out: logits[k, v] of the rows batch->logits marks */
} run_output;

static int32_t row_seq(const celer_batch *b, int32_t force_seq, int64_t r) {
    return force_seq >= 0 ? force_seq : b->seq_id ? b->seq_id[r] : 0;
}

static celer_status check_batch(celer_context *ctx, const celer_batch *b, int32_t force_seq,
                                run_output kind, int64_t last_pos) {
    const celer_model *m = ctx->model;
    celer_error *e = &ctx->err;
    if (!b || b->n <= 0)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "batch: expected at least one row");
    if (!b->token && !b->embd)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "batch: expected token ids, embeddings or both");
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
            return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                             "batch row %lld: an embedding row (token %d) but the batch has no embeddings",
                             (long long)r, b->token[r]);
        ctx->add[s]++;
    }
    return CELER_OK;
}

static celer_status run(celer_context *ctx, const celer_batch *b, int32_t force_seq,
                        run_output kind, int64_t last_pos, float *out) {
    const celer_model *m = ctx->model;
    const int64_t d = m->dims.d, v = m->dims.v;
    celer_status s = check_batch(ctx, b, force_seq, kind, last_pos);
    if (s == CELER_OK) s = kv_cache_reserve(&ctx->kv, ctx->add, &ctx->err);
    if (s != CELER_OK) return s;
    memcpy(ctx->next, ctx->kv.len, sizeof(int64_t) * (size_t)ctx->kv.n_seq);
    const model_kv kv = {ctx->kv.k, ctx->kv.v};
    int64_t head_rows = 0;
    for (int64_t off = 0; off < b->n; off += ctx->n_batch) {
        const int64_t n = b->n - off < ctx->n_batch ? b->n - off : ctx->n_batch;
        for (int64_t r = 0; r < n; r++) {
            const int32_t sq = row_seq(b, force_seq, off + r);
            const int64_t p = ctx->next[sq]++;
            ctx->pos[r] = (int32_t)p;
            ctx->slot[r] = kv_cache_slot(&ctx->kv, sq, p);
            ctx->blocks[r] = kv_cache_table(&ctx->kv, sq);
        }
        const model_step st = {.n = n,
                               .token = b->token ? b->token + off : NULL,
                               .embd = b->embd ? b->embd + off * d : NULL,
                               .pos = ctx->pos,
                               .slot = ctx->slot,
                               .blocks = ctx->blocks,
                               .block_size = ctx->kv.block_size};
        switch (kind) {
        case RUN_HIDDEN: model_hidden_states(m, ctx->be, &st, &kv, ctx->scratch, out + off * d); break;
        case RUN_ALL: head_rows += model_forward(m, ctx->be, &st, &kv, ctx->scratch, ctx->hidden, out + off * v); break;
        case RUN_ROW:
            if (last_pos >= off && last_pos < off + n)
                head_rows += model_forward_last_logits(m, ctx->be, &st, &kv, ctx->scratch, ctx->hidden,
                                                       last_pos - off, out);
            else
                model_hidden_states(m, ctx->be, &st, &kv, ctx->scratch, ctx->hidden);
            break;
        case RUN_WANTED: {
            const int64_t k = model_forward_rows(m, ctx->be, &st, &kv, ctx->scratch, ctx->hidden, b->logits + off, out);
            head_rows += k;
            out += v * k;
            break;
        }
        }
    }
    ctx->head_rows = head_rows;
    kv_cache_commit(&ctx->kv, ctx->add);
    ctx->err.msg[0] = '\0';
    return CELER_OK;
}

celer_status celer_batch_decode(celer_context *ctx, const celer_batch *batch, float *logits) {
    return run(ctx, batch, -1, RUN_WANTED, 0, logits);
}

celer_status celer_hidden_states(celer_context *ctx, const celer_batch *batch, float *hidden) {
    return run(ctx, batch, -1, RUN_HIDDEN, 0, hidden);
}

celer_status celer_forward(celer_context *ctx, const celer_batch *batch, float *logits) {
    return run(ctx, batch, -1, RUN_ALL, 0, logits);
}

celer_status celer_forward_last_logits(celer_context *ctx, const celer_batch *batch,
                                       int64_t last_pos, float *logits) {
    return run(ctx, batch, 0, RUN_ROW, last_pos, logits);
}

celer_status celer_forward_last_logits_with_sequence_id(celer_context *ctx,
                                                        const celer_batch *batch, int32_t seq_id,
                                                        int64_t last_pos, float *logits) {
    if (seq_id < 0)
        return error_set(&ctx->err, CELER_STATUS_INVALID_ARGUMENT, "sequence id %d is negative",
                         seq_id);
    return run(ctx, batch, seq_id, RUN_ROW, last_pos, logits);
}

celer_status celer_forward_last_logits_with_embeddings_and_sequence_id(
    celer_context *ctx, const float *embd, int64_t n, int32_t seq_id, int64_t last_pos,
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
    model_embed(ctx->model, ctx->be, ids, n, embd);
    return CELER_OK;
}

celer_status celer_image_encode(celer_context *ctx, const celer_image *img, float *embd) {
    if (!ctx->vbe)
        return error_set(&ctx->err, CELER_STATUS_INVALID_ARGUMENT, "%s reads no images", ctx->model->desc);
    celer_status s = image_encode(ctx->model, ctx->vbe, ctx->tiles_per_call, ctx->vscratch, img, embd, &ctx->err);
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
    celer_status s = celer_forward_last_logits_with_sequence_id(ctx, &b, seq, n_prompt - 1, ctx->logits);
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

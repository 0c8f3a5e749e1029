/*
 * cohere2.c - the Cohere2 family (Command R7B): model_type cohere2.
 *
 * One LayerNorm (no bias) per layer feeds attention and the MLP in parallel:
 * x += attn(ln(x)) + mlp(ln(x)). Layers are sliding-window or global, from layer_types
 * or the older sliding_window_pattern (every pattern-th layer global); only sliding
 * layers rotate q and k, in the interleaved form (pairs 2i, 2i+1); global layers get no
 * positions but the causal mask. The head is the tied embedding table, its logits
 * multiplied by logit_scale. Names and options as transformers and mlx-lm write them.
 */
#include "models/model.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef struct cohere2_layer {
    const float *norm_w, *norm_b; /* [d], [d] or NULL */
    attn_block attn;
    mlp_block mlp;
} cohere2_layer;

typedef struct cohere2_weights {
    matview embed;           /* [v, d] */
    matview head;            /* [v, d]; unbound when tied (the head is embed) */
    const float *norm_w, *norm_b; /* [d], [d] or NULL */
    cohere2_layer *layers;   /* [n_layer] */
    float eps, attn_scale, logit_scale;
    rope_params rope;
    int64_t dims[TEXT_N_DIMS];
    bool flags[3];
} cohere2_weights;

/* ==== Weight tables ==== */

enum cohere2_flag { HAS_ATTN_BIAS, HAS_NORM_BIAS, UNTIED };

#define MAT(name, field, r, c, when) {name, WEIGHT_MATRIX, r, c, when, offsetof(cohere2_layer, field), 0, 0}
#define VEC(name, field, r, when) {name, WEIGHT_VECTOR, r, 0, when, offsetof(cohere2_layer, field), 0, 0}
static const weight_spec cohere2_layer_spec[] = {
    VEC("input_layernorm.weight", norm_w, TEXT_D, WEIGHT_ALWAYS),
    VEC("input_layernorm.bias", norm_b, TEXT_D, HAS_NORM_BIAS),
    MAT("self_attn.q_proj", attn.wq, TEXT_QD, TEXT_D, WEIGHT_ALWAYS),
    VEC("self_attn.q_proj.bias", attn.bq, TEXT_QD, HAS_ATTN_BIAS),
    MAT("self_attn.k_proj", attn.wk, TEXT_KVD, TEXT_D, WEIGHT_ALWAYS),
    VEC("self_attn.k_proj.bias", attn.bk, TEXT_KVD, HAS_ATTN_BIAS),
    MAT("self_attn.v_proj", attn.wv, TEXT_KVD, TEXT_D, WEIGHT_ALWAYS),
    VEC("self_attn.v_proj.bias", attn.bv, TEXT_KVD, HAS_ATTN_BIAS),
    MAT("self_attn.o_proj", attn.wo, TEXT_D, TEXT_QD, WEIGHT_ALWAYS),
    VEC("self_attn.o_proj.bias", attn.bo, TEXT_D, HAS_ATTN_BIAS),
    MAT("mlp.gate_proj", mlp.gate, TEXT_F, TEXT_D, WEIGHT_ALWAYS),
    MAT("mlp.up_proj", mlp.up, TEXT_F, TEXT_D, WEIGHT_ALWAYS),
    MAT("mlp.down_proj", mlp.down, TEXT_D, TEXT_F, WEIGHT_ALWAYS),
};
#undef MAT
#undef VEC
static const weight_spec cohere2_global_spec[] = {
    {"model.embed_tokens", WEIGHT_MATRIX, TEXT_V, TEXT_D, WEIGHT_ALWAYS, offsetof(cohere2_weights, embed), 0, 0},
    {"model.norm.weight", WEIGHT_VECTOR, TEXT_D, 0, WEIGHT_ALWAYS, offsetof(cohere2_weights, norm_w), 0, 0},
    {"model.norm.bias", WEIGHT_VECTOR, TEXT_D, 0, HAS_NORM_BIAS, offsetof(cohere2_weights, norm_b), 0, 0},
    {"lm_head", WEIGHT_MATRIX, TEXT_V, TEXT_D, UNTIED, offsetof(cohere2_weights, head), 0, 0},
};

/* ==== Loading ==== */

/* Marks the sliding layers: layer_types when given, else every fourth layer global. */
static celer_status cohere2_layer_kinds(celer_model *m, cohere2_weights *w, int64_t window,
                                        celer_error *e) {
    bool *sliding = arena_alloc(&m->mem, sizeof(bool) * (size_t)m->dims.n_layer);
    if (!sliding) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    celer_status s = model_layer_kinds(m, 4, sliding, e);
    for (int64_t l = 0; s == CELER_OK && l < m->dims.n_layer; l++) {
        w->layers[l].attn.window = sliding[l] ? window : 0;
        w->layers[l].attn.no_rope = !sliding[l];
    }
    return s;
}

static celer_status cohere2_load(celer_model *m, celer_error *e) {
    const checkpoint *ck = &m->ck;
    const json_t *cfg = m->cfg;
    model_dims *dm = &m->dims;
    celer_status s;
    double eps, logit_scale;
    int64_t window, head_dim;
    bool tie, attn_bias, norm_bias;
    const char *act;
#define TRY(x) do { if ((s = (x)) != CELER_OK) return s; } while (0)
    TRY(model_read_dims(m, e));
    /* transformers derives head_dim from the shapes and ignores the key; mlx-lm reads it */
    TRY(config_int(ck, cfg, "head_dim", dm->d / dm->h, &head_dim, e));
    if (head_dim * dm->h != dm->d)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: head_dim: expected hidden_size / num_attention_heads = %lld, found %lld",
                         ck->config_path, (long long)(dm->d / dm->h), (long long)head_dim);
    TRY(config_num(ck, cfg, "layer_norm_eps", 1e-5, &eps, e));
    TRY(config_num(ck, cfg, "logit_scale", 0.0625, &logit_scale, e));
    TRY(config_int(ck, cfg, "sliding_window", 4096, &window, e));
    TRY(config_bool(ck, cfg, "attention_bias", false, &attn_bias, e));
    TRY(config_bool(ck, cfg, "layer_norm_bias", false, &norm_bias, e));
    TRY(config_bool(ck, cfg, "tie_word_embeddings", true, &tie, e));
    TRY(config_str(ck, cfg, "hidden_act", &act, e));
    if (act && strcmp(act, "silu") != 0)
        return error_set(e, CELER_STATUS_UNSUPPORTED, "%s: hidden_act: expected silu, found %s",
                         ck->config_path, act);
    if (window <= 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: sliding_window: expected > 0, found %lld",
                         ck->config_path, (long long)window);
    TRY(model_read_eos(m, e));

    cohere2_weights *w = arena_alloc(&m->mem, sizeof *w);
    if (!w) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    memset(w, 0, sizeof *w);
    m->weights = w;
    w->layers = arena_alloc(&m->mem, sizeof *w->layers * (size_t)dm->n_layer);
    if (!w->layers) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    memset(w->layers, 0, sizeof *w->layers * (size_t)dm->n_layer);
    w->eps = (float)eps;
    w->logit_scale = (float)logit_scale;
    w->attn_scale = (float)(1.0 / sqrt((double)dm->hd));
    TRY(model_read_rope(m, true, &w->rope, e));
    TRY(cohere2_layer_kinds(m, w, window, e));

    model_text_dims(m, w->dims);
    w->flags[HAS_ATTN_BIAS] = attn_bias;
    w->flags[HAS_NORM_BIAS] = norm_bias;
    w->flags[UNTIED] = !tie;
    model_add_text_tables(m, cohere2_global_spec, sizeof cohere2_global_spec / sizeof *cohere2_global_spec, w,
                          cohere2_layer_spec, sizeof cohere2_layer_spec / sizeof *cohere2_layer_spec, w->layers,
                          sizeof *w->layers, w->dims, w->flags);
    TRY(model_bind(m, e));
#undef TRY
    int64_t n_global = 0;
    for (int64_t l = 0; l < dm->n_layer; l++) n_global += w->layers[l].attn.window == 0;
    char quant[64];
    snprintf(m->desc, sizeof m->desc,
             "cohere2, %lld layers (%lld global, window %lld), d=%lld, heads %lld/%lld x %lld, ffn %lld, "
             "vocab %lld, %s%s",
             (long long)dm->n_layer, (long long)n_global, (long long)window, (long long)dm->d,
             (long long)dm->h, (long long)dm->hk, (long long)dm->hd, (long long)dm->f, (long long)dm->v,
             model_quant_desc(&w->layers[0].attn.wq, quant, sizeof quant), tie ? ", tied head" : "");
    return CELER_OK;
}

/* ==== Forward ==== */

static void cohere2_hidden_states(const celer_model *m, backend *be, const model_step *st,
                                  const model_kv *kv, float *scratch, float *hidden) {
    const cohere2_weights *w = m->weights;
    const backend_ops *op = be->ops;
    const int64_t n = st->n, d = m->dims.d;
    float *x = scratch, *xb = x + n * d, *xo = xb + n * d, *tmp = xo + n * d;

    model_embed_step(m, be, st, x);
    for (int64_t l = 0; l < m->dims.n_layer; l++) {
        const cohere2_layer *L = &w->layers[l];
        /* x += attn(ln(x)) + mlp(ln(x)), both from the same normed rows */
        op->layernorm(be, xb, x, L->norm_w, L->norm_b, n, d, w->eps);
        model_attention(m, be, st, kv, l, &L->attn, &w->rope, w->attn_scale, xb, tmp, xo);
        op->add(be, x, xo, n * d);
        model_mlp(m, be, &L->mlp, xb, n, tmp, xo);
        op->add(be, x, xo, n * d);
    }
    op->layernorm(be, hidden, x, w->norm_w, w->norm_b, n, d, w->eps);
}

static const matview *cohere2_embedding(const celer_model *m) {
    return &((const cohere2_weights *)m->weights)->embed;
}

static const matview *cohere2_head(const celer_model *m) {
    const cohere2_weights *w = m->weights;
    return w->flags[UNTIED] ? &w->head : &w->embed;
}

static float cohere2_logit_scale(const celer_model *m) {
    return ((const cohere2_weights *)m->weights)->logit_scale;
}

static const char *const cohere2_types[] = {"cohere2", NULL};

static const model_op cohere2_ops[] = {MODEL_OP(layernorm), {0, NULL}};

const model_family cohere2_family = {
    .model_types = cohere2_types,
    .ops = cohere2_ops,
    .load = cohere2_load,
    .scratch_floats = model_text_scratch_floats,
    .hidden_states = cohere2_hidden_states,
    .embedding = cohere2_embedding,
    .head = cohere2_head,
    .logit_scale = cohere2_logit_scale,
};

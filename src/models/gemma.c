/*
 * gemma.c - the Gemma family: model_type gemma2 and gemma3_text (the text model of a gemma3
 * checkpoint too: gemma3.c).
 *
 * Four RMSNorms a layer, each scaling by (1 + w): before and after attention, before and
 * after the MLP, whose outputs are normed before they join the residual. GeGLU
 * (gelu_pytorch_tanh gating), the embedding multiplied by sqrt(hidden_size), queries
 * scaled by query_pre_attn_scalar^-1/2, sliding-window and global layers (layer_types, or
 * Gemma 2's alternation and Gemma 3's sliding_window_pattern). Gemma 2 soft-caps attention
 * scores and the final logits; Gemma 3 norms each head of q and k and gives its local
 * layers their own RoPE base (rope_local_base_freq) while global layers take rope_theta
 * with rope_scaling. Tied heads as the checkpoints have them.
 *
 * The (1 + w) is folded into the weights at load: llama.cpp's converter already stored
 * 1 + w in GGUF files, so only safetensors checkpoints are shifted. One forward body
 * (gemma_hidden_states); the LM head and its soft-capping live in model.c.
 */
#include "models/model.h"

#include "base/half.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef struct gemma_layer {
    const float *attn_norm, *post_attn_norm; /* [d] each, 1 + w */
    const float *mlp_norm, *post_mlp_norm;   /* [d] each, 1 + w */
    attn_block attn;                         /* q_norm, k_norm [hd] (Gemma 3), 1 + w */
    mlp_block mlp;
    const rope_params *rope; /* the local or the global RoPE */
} gemma_layer;

typedef struct gemma_weights {
    matview embed;       /* [v, d] */
    matview head;        /* [v, d]; unbound when tied (the head is embed) */
    const float *norm;   /* [d], 1 + w */
    gemma_layer *layers; /* [n_layer] */
    float eps, attn_scale, embed_scale, final_softcap;
    rope_params rope_global, rope_local;
    int64_t dims[TEXT_N_DIMS];
    bool flags[2];
} gemma_weights;

/* ==== Weight tables ==== */

enum gemma_flag { HAS_QK_NORM, UNTIED };

#define MAT(name, field, r, c, when)                                                               \
    { name, WEIGHT_MATRIX, r, c, when, offsetof(gemma_layer, field), 0, 0 }
#define VEC(name, field, r, when)                                                                  \
    { name, WEIGHT_VECTOR, r, 0, when, offsetof(gemma_layer, field), 0, 0 }
static const weight_spec gemma_layer_spec[] = {
    VEC("input_layernorm.weight", attn_norm, TEXT_D, WEIGHT_ALWAYS),
    MAT("self_attn.q_proj", attn.wq, TEXT_QD, TEXT_D, WEIGHT_ALWAYS),
    MAT("self_attn.k_proj", attn.wk, TEXT_KVD, TEXT_D, WEIGHT_ALWAYS),
    MAT("self_attn.v_proj", attn.wv, TEXT_KVD, TEXT_D, WEIGHT_ALWAYS),
    MAT("self_attn.o_proj", attn.wo, TEXT_D, TEXT_QD, WEIGHT_ALWAYS),
    VEC("self_attn.q_norm.weight", attn.q_norm, TEXT_HD, HAS_QK_NORM),
    VEC("self_attn.k_norm.weight", attn.k_norm, TEXT_HD, HAS_QK_NORM),
    VEC("post_attention_layernorm.weight", post_attn_norm, TEXT_D, WEIGHT_ALWAYS),
    VEC("pre_feedforward_layernorm.weight", mlp_norm, TEXT_D, WEIGHT_ALWAYS),
    MAT("mlp.gate_proj", mlp.gate, TEXT_F, TEXT_D, WEIGHT_ALWAYS),
    MAT("mlp.up_proj", mlp.up, TEXT_F, TEXT_D, WEIGHT_ALWAYS),
    MAT("mlp.down_proj", mlp.down, TEXT_D, TEXT_F, WEIGHT_ALWAYS),
    VEC("post_feedforward_layernorm.weight", post_mlp_norm, TEXT_D, WEIGHT_ALWAYS),
};
#undef MAT
#undef VEC
static const weight_spec gemma_global_spec[] = {
    {"model.embed_tokens", WEIGHT_MATRIX, TEXT_V, TEXT_D, WEIGHT_ALWAYS,
     offsetof(gemma_weights, embed), 0, 0},
    {"model.norm.weight", WEIGHT_VECTOR, TEXT_D, 0, WEIGHT_ALWAYS, offsetof(gemma_weights, norm), 0,
     0},
    {"lm_head", WEIGHT_MATRIX, TEXT_V, TEXT_D, UNTIED, offsetof(gemma_weights, head), 0, 0},
};

/* ==== Loading ==== */

/* sqrt(d) as the embedding is scaled: rounded to the checkpoint's float type, as
 * transformers does running the checkpoint in its dtype and mlx-lm does always; a GGUF
 * file keeps fp32, as llama.cpp does. */
static float embed_scale_of(const celer_model *m, const matview *embed) {
    const float s = sqrtf((float)m->dims.d);
    const dtype t = embed->quant_bits ? embed->scale_type : embed->type;
    if (m->ck.gguf || t == DTYPE_F32) return s;
    return t == DTYPE_BF16 ? bf16_to_f32(f32_to_bf16(s)) : f16_to_f32(f32_to_f16(s));
}

/* The RoPE blocks: transformers 5 nests rope_parameters by layer kind
 * ({"full_attention": {...}, "sliding_attention": {...}}); older configs have rope_theta,
 * rope_scaling and (Gemma 3) rope_local_base_freq at the top level. */
static celer_status gemma_rope(celer_model *m, gemma_weights *w, bool gemma3, celer_error *e) {
    const checkpoint *ck = &m->ck;
    const json_t *cfg = m->cfg, *params = json_object_get(cfg, "rope_parameters");
    const json_t *full = json_is_object(params) ? json_object_get(params, "full_attention") : NULL;
    const json_t *local =
        json_is_object(params) ? json_object_get(params, "sliding_attention") : NULL;
    celer_status s;
    double theta, local_theta;
    if (json_is_object(full)) {
        if ((s = config_num(ck, full, "rope_theta", 1e6, &theta, e)) != CELER_OK) return s;
        if ((s = model_rope_from(m, full, theta, m->dims.hd, false, &w->rope_global, e)) !=
            CELER_OK)
            return s;
    } else if ((s = model_read_rope(m, false, &w->rope_global, e)) != CELER_OK) {
        return s;
    }
    if (!gemma3) return CELER_OK;
    if (json_is_object(local)) {
        if ((s = config_num(ck, local, "rope_theta", 10000.0, &local_theta, e)) != CELER_OK)
            return s;
        return model_rope_from(m, local, local_theta, m->dims.hd, false, &w->rope_local, e);
    }
    if ((s = config_num(ck, cfg, "rope_local_base_freq", 10000.0, &local_theta, e)) != CELER_OK)
        return s;
    return model_rope_from(m, NULL, local_theta, m->dims.hd, false, &w->rope_local, e);
}

static celer_status gemma_load(celer_model *m, celer_error *e) {
    const checkpoint *ck = &m->ck;
    const json_t *cfg = m->cfg;
    model_dims *dm = &m->dims;
    const char *type = json_string_value(json_object_get(cfg, "model_type"));
    const bool gemma3 = strcmp(type, "gemma2") != 0;
    celer_status s;
    double eps, qpas, attn_cap, final_cap;
    int64_t window;
    bool tie;
    const char *act;
    backend_act mlp_act;
#define TRY(x)                                                                                     \
    do {                                                                                           \
        if ((s = (x)) != CELER_OK) return s;                                                       \
    } while (0)
    TRY(model_read_dims(m, e));
    TRY(config_num(ck, cfg, "rms_norm_eps", 1e-6, &eps, e));
    TRY(config_num(ck, cfg, "query_pre_attn_scalar", 256.0, &qpas, e));
    TRY(config_num(ck, cfg, "attn_logit_softcapping", 0.0, &attn_cap, e));
    TRY(config_num(ck, cfg, "final_logit_softcapping", 0.0, &final_cap, e));
    TRY(config_int(ck, cfg, "sliding_window", 4096, &window, e));
    TRY(config_str(ck, cfg, "hidden_activation", &act, e));
    if (!act) TRY(config_str(ck, cfg, "hidden_act", &act, e));
    TRY(model_act_parse(ck, "hidden_activation", act, BACKEND_ACT_GELU_TANH, &mlp_act, e));
    if (qpas <= 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: query_pre_attn_scalar: expected > 0, found %g", ck->config_path,
                         qpas);
    if (attn_cap < 0 || final_cap < 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: attn_logit_softcapping and final_logit_softcapping: "
                         "expected > 0 or null, found %g and %g",
                         ck->config_path, attn_cap, final_cap);
    if (window <= 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: sliding_window: expected > 0, found %lld",
                         ck->config_path, (long long)window);
    TRY(model_read_eos(m, e));

    gemma_weights *w = arena_alloc(&m->mem, sizeof *w);
    bool *sliding = arena_alloc(&m->mem, sizeof(bool) * (size_t)dm->n_layer);
    if (!w || !sliding) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    memset(w, 0, sizeof *w);
    m->weights = w;
    w->eps = (float)eps;
    w->attn_scale = (float)(1.0 / sqrt(qpas));
    w->final_softcap = (float)final_cap;
    w->layers = arena_alloc(&m->mem, sizeof *w->layers * (size_t)dm->n_layer);
    if (!w->layers) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    memset(w->layers, 0, sizeof *w->layers * (size_t)dm->n_layer);
    TRY(gemma_rope(m, w, gemma3, e));
    /* Gemma 2 alternates (layer 0 sliding); Gemma 3 has five local layers to a global one */
    TRY(model_layer_kinds(m, gemma3 ? 6 : 2, sliding, e));

    const bool tie_set = json_is_boolean(json_object_get(cfg, "tie_word_embeddings"));
    TRY(config_bool(ck, cfg, "tie_word_embeddings", true, &tie, e));
    if (!tie_set) {
        char name[128];
        tie = checkpoint_find(ck, model_tensor_name(m, "lm_head.weight", name, sizeof name),
                              NULL) == NULL;
    }
    model_text_dims(m, w->dims);
    w->flags[HAS_QK_NORM] = gemma3;
    w->flags[UNTIED] = !tie;
    model_add_text_tables(m, gemma_global_spec,
                          sizeof gemma_global_spec / sizeof *gemma_global_spec, w, gemma_layer_spec,
                          sizeof gemma_layer_spec / sizeof *gemma_layer_spec, w->layers,
                          sizeof *w->layers, w->dims, w->flags);
    TRY(model_bind(m, e));
#undef TRY
    const int64_t d = dm->d, hd = dm->hd;
    if (!ck->gguf) model_norm_plus_one(w->norm, d);
    for (int64_t l = 0; l < dm->n_layer; l++) {
        gemma_layer *L = &w->layers[l];
        if (!ck->gguf) {
            model_norm_plus_one(L->attn_norm, d), model_norm_plus_one(L->post_attn_norm, d);
            model_norm_plus_one(L->mlp_norm, d), model_norm_plus_one(L->post_mlp_norm, d);
            if (L->attn.q_norm)
                model_norm_plus_one(L->attn.q_norm, hd), model_norm_plus_one(L->attn.k_norm, hd);
        }
        L->attn.window = sliding[l] ? window : 0;
        L->attn.softcap = (float)attn_cap;
        L->attn.norm_eps = w->eps;
        L->mlp.act = mlp_act;
        L->rope = gemma3 && sliding[l] ? &w->rope_local : &w->rope_global;
    }
    m->attn_softcap = attn_cap > 0;
    w->embed_scale = embed_scale_of(m, &w->embed);
    char quant[64];
    snprintf(
        m->desc, sizeof m->desc,
        "%s, %lld layers, d=%lld, heads %lld/%lld x %lld, ffn %lld, vocab %lld, window %lld, %s%s",
        type, (long long)dm->n_layer, (long long)d, (long long)dm->h, (long long)dm->hk,
        (long long)hd, (long long)dm->f, (long long)dm->v, (long long)window,
        model_quant_desc(&w->layers[0].attn.wq, quant, sizeof quant), tie ? ", tied head" : "");
    return CELER_OK;
}

/* ==== Forward ==== */

static void gemma_hidden_states(const celer_model *m, backend *be, const model_step *st,
                                const model_kv *kv, float *scratch, float *hidden) {
    const gemma_weights *w = m->weights;
    const backend_ops *op = be->ops;
    const int64_t n = st->n, d = m->dims.d;
    float *x = scratch, *xb = x + n * d, *xo = xb + n * d, *tmp = xo + n * d;

    model_embed_step(m, be, st, x);
    op->rmsnorm(be, xb, x, w->layers[0].attn_norm, n, d, w->eps);
    for (int64_t l = 0; l < m->dims.n_layer; l++) {
        const gemma_layer *L = &w->layers[l];
        const bool last = l + 1 == m->dims.n_layer;
        /* x += post_norm(attn(xb)); xb = pre_mlp_norm(x) */
        model_attention(m, be, st, kv, l, &L->attn, L->rope, w->attn_scale, xb, tmp, xo);
        op->rmsnorm(be, xo, xo, L->post_attn_norm, n, d, w->eps);
        backend_add_rmsnorm(be, xb, x, xo, L->mlp_norm, n, d, w->eps);
        /* x += post_norm(mlp(xb)); then the next layer's norm (the final one last) */
        model_mlp(m, be, &L->mlp, xb, n, tmp, xo);
        op->rmsnorm(be, xo, xo, L->post_mlp_norm, n, d, w->eps);
        backend_add_rmsnorm(be, last ? hidden : xb, x, xo,
                            last ? w->norm : w->layers[l + 1].attn_norm, n, d, w->eps);
    }
}

static const matview *gemma_embedding(const celer_model *m) {
    return &((const gemma_weights *)m->weights)->embed;
}

static const matview *gemma_head(const celer_model *m) {
    const gemma_weights *w = m->weights;
    return w->flags[UNTIED] ? &w->head : &w->embed;
}

static float gemma_logit_softcap(const celer_model *m) {
    return ((const gemma_weights *)m->weights)->final_softcap;
}

static float gemma_embed_scale(const celer_model *m) {
    return ((const gemma_weights *)m->weights)->embed_scale;
}

static const model_op gemma_ops[] = {MODEL_OP(softcap), {0, NULL}};

static const char *const gemma_types[] = {"gemma2", "gemma3_text", NULL};

const model_family gemma_family = {
    .model_types = gemma_types,
    .load = gemma_load,
    .scratch_floats = model_text_scratch_floats,
    .hidden_states = gemma_hidden_states,
    .embedding = gemma_embedding,
    .head = gemma_head,
    .logit_softcap = gemma_logit_softcap,
    .embed_scale = gemma_embed_scale,
    .ops = gemma_ops,
};

/*
 * llama.c - the Llama family: model_type llama (Llama 2/3.x), mistral, qwen2, qwen3 and
 * phi3 (Phi-3, Phi-3.5, Phi-4-mini, Phi-4).
 *
 * RMSNorm, grouped-query attention with RoPE (default, linear, llama3 and YaRN scaling;
 * traditional or half-split pairs), optional sliding window, SwiGLU MLP, optional
 * biases (Llama's attention_bias/mlp_bias, Qwen2's q/k/v bias), optional per-head RMSNorm
 * of q and k before RoPE (Qwen3's q_norm and k_norm), Phi-3's fused qkv_proj and
 * gate_up_proj (bound as parts of the stored matrices), partial rotary embeddings and
 * longrope, whose long factors a step takes once a row lies past
 * original_max_position_embeddings (transformers decides per forward by its largest
 * position the same way). Every shape and option is read from
 * config.json and checked against the tensors. One forward body (llama_hidden_states)
 * serves every entry point; the LM head lives in model.c.
 */
#include "models/model.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef struct llama_layer {
    const float *attn_norm; /* [d] */
    attn_block attn;
    const float *mlp_norm;  /* [d] */
    mlp_block mlp;
} llama_layer;

typedef struct llama_weights {
    matview embed;       /* [v, d] */
    matview head;        /* [v, d]; unbound when tied (the head is embed) */
    const float *norm;   /* [d] */
    llama_layer *layers; /* [n_layer] */
    float eps;
    rope_params rope;
    rope_params rope_long; /* longrope's long factors, from long_from positions on */
    int64_t long_from;     /* 0: one RoPE */
    float attn_scale;
    int64_t dims[TEXT_N_DIMS];     /* the tables' shapes, by enum text_dim */
    bool flags[7];       /* the tables' options, by enum llama_flag */
} llama_weights;

/* ==== Weight tables ==== */

enum llama_flag { HAS_QKV_BIAS, HAS_O_BIAS, HAS_MLP_BIAS, UNTIED, HAS_QK_NORM, SPLIT, FUSED };

#define MAT(name, field, r, c, when) {name, WEIGHT_MATRIX, r, c, when, offsetof(llama_layer, field), 0, 0}
#define VEC(name, field, r, when) {name, WEIGHT_VECTOR, r, 0, when, offsetof(llama_layer, field), 0, 0}
#define PART(name, field, r, first, total, when)                                                                 \
    {name, WEIGHT_PART, r, TEXT_D, when, offsetof(llama_layer, field), first, total}
static const weight_spec llama_layer_spec[] = {
    VEC("input_layernorm.weight", attn_norm, TEXT_D, WEIGHT_ALWAYS),
    MAT("self_attn.q_proj", attn.wq, TEXT_QD, TEXT_D, SPLIT),
    PART("self_attn.qkv_proj", attn.wq, TEXT_QD, TEXT_ZERO, TEXT_QKV, FUSED),
    PART("self_attn.qkv_proj", attn.wk, TEXT_KVD, TEXT_QD, TEXT_QKV, FUSED),
    PART("self_attn.qkv_proj", attn.wv, TEXT_KVD, TEXT_QK, TEXT_QKV, FUSED),
    VEC("self_attn.q_proj.bias", attn.bq, TEXT_QD, HAS_QKV_BIAS),
    MAT("self_attn.k_proj", attn.wk, TEXT_KVD, TEXT_D, SPLIT),
    VEC("self_attn.k_proj.bias", attn.bk, TEXT_KVD, HAS_QKV_BIAS),
    MAT("self_attn.v_proj", attn.wv, TEXT_KVD, TEXT_D, SPLIT),
    VEC("self_attn.v_proj.bias", attn.bv, TEXT_KVD, HAS_QKV_BIAS),
    MAT("self_attn.o_proj", attn.wo, TEXT_D, TEXT_QD, WEIGHT_ALWAYS),
    VEC("self_attn.o_proj.bias", attn.bo, TEXT_D, HAS_O_BIAS),
    VEC("self_attn.q_norm.weight", attn.q_norm, TEXT_HD, HAS_QK_NORM),
    VEC("self_attn.k_norm.weight", attn.k_norm, TEXT_HD, HAS_QK_NORM),
    VEC("post_attention_layernorm.weight", mlp_norm, TEXT_D, WEIGHT_ALWAYS),
    MAT("mlp.gate_proj", mlp.gate, TEXT_F, TEXT_D, SPLIT),
    PART("mlp.gate_up_proj", mlp.gate, TEXT_F, TEXT_ZERO, TEXT_FF, FUSED),
    PART("mlp.gate_up_proj", mlp.up, TEXT_F, TEXT_F, TEXT_FF, FUSED),
    VEC("mlp.gate_proj.bias", mlp.b_gate, TEXT_F, HAS_MLP_BIAS),
    MAT("mlp.up_proj", mlp.up, TEXT_F, TEXT_D, SPLIT),
    VEC("mlp.up_proj.bias", mlp.b_up, TEXT_F, HAS_MLP_BIAS),
    MAT("mlp.down_proj", mlp.down, TEXT_D, TEXT_F, WEIGHT_ALWAYS),
    VEC("mlp.down_proj.bias", mlp.b_down, TEXT_D, HAS_MLP_BIAS),
};
#undef MAT
#undef VEC
#undef PART
#define MAT(name, field, r, c, when) {name, WEIGHT_MATRIX, r, c, when, offsetof(llama_weights, field), 0, 0}
static const weight_spec llama_global_spec[] = {
    MAT("model.embed_tokens", embed, TEXT_V, TEXT_D, WEIGHT_ALWAYS),
    {"model.norm.weight", WEIGHT_VECTOR, TEXT_D, 0, WEIGHT_ALWAYS, offsetof(llama_weights, norm), 0, 0},
    MAT("lm_head", head, TEXT_V, TEXT_D, UNTIED),
};
#undef MAT

/* ==== Loading ==== */

/* The RoPE of every layer: int(hd * partial) values of a head rotate (transformers'
 * rule); longrope scaling gives a short and a long set. */
static celer_status llama_rope(celer_model *m, llama_weights *w, double partial, bool traditional, celer_error *e) {
    const checkpoint *ck = &m->ck;
    const int64_t dims = (int64_t)((double)m->dims.hd * partial);
    if (!(partial > 0 && partial <= 1) || dims < 2 || dims % 2)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: partial_rotary_factor: %g of head_dim %lld gives %lld rotary dimensions (expected an "
                         "even number >= 2)",
                         ck->config_path, partial, (long long)m->dims.hd, (long long)dims);
    const json_t *params = json_object_get(m->cfg, "rope_parameters"), *scaling = json_object_get(m->cfg, "rope_scaling");
    if (!json_is_object(scaling)) scaling = json_is_object(params) ? params : NULL;
    const char *type = NULL;
    celer_status s;
    if (scaling && (s = config_str(ck, scaling, "rope_type", &type, e)) != CELER_OK) return s;
    if (scaling && !type && (s = config_str(ck, scaling, "type", &type, e)) != CELER_OK) return s;
    if (!type || strcmp(type, "longrope")) {
        if (dims == m->dims.hd) return model_read_rope(m, traditional, &w->rope, e);
        double theta;
        if ((s = config_num(ck, params && json_is_object(params) ? params : m->cfg, "rope_theta", 10000.0, &theta,
                            e)) != CELER_OK)
            return s;
        return model_rope_from(m, scaling, theta, dims, traditional, &w->rope, e);
    }
    double theta;
    if ((s = config_num(ck, json_is_object(params) ? params : m->cfg, "rope_theta", 10000.0, &theta, e)) != CELER_OK)
        return s;
    return model_read_longrope(m, scaling, theta, dims, &w->rope, &w->rope_long, &w->long_from, e);
}

static celer_status llama_load(celer_model *m, celer_error *e) {
    const checkpoint *ck = &m->ck;
    const json_t *cfg = m->cfg;
    model_dims *dm = &m->dims;
    const char *type = json_string_value(json_object_get(cfg, "model_type"));
    const bool is_qwen3 = strcmp(type, "qwen3") == 0, is_mistral = strcmp(type, "mistral") == 0;
    const bool is_qwen2 = strcmp(type, "qwen2") == 0; /* q/k/v biases always */
    const bool is_phi3 = strcmp(type, "phi3") == 0;   /* fused matrices, a window on every layer */
    celer_status s;
    int64_t max_window_layers, window;
    double eps;
    bool tie, attn_bias, mlp_bias, traditional, use_sw;
    const char *act;
#define TRY(x) do { if ((s = (x)) != CELER_OK) return s; } while (0)
    TRY(model_read_dims(m, e));
    TRY(config_num(ck, cfg, "rms_norm_eps", 1e-6, &eps, e));
    TRY(config_bool(ck, cfg, "attention_bias", false, &attn_bias, e));
    TRY(config_bool(ck, cfg, "mlp_bias", false, &mlp_bias, e));
    TRY(config_bool(ck, cfg, "rope_traditional", false, &traditional, e));
    TRY(config_bool(ck, cfg, "use_sliding_window", false, &use_sw, e));
    TRY(config_int(ck, cfg, "sliding_window", 0, &window, e));
    TRY(config_int(ck, cfg, "max_window_layers", 0, &max_window_layers, e));
    TRY(config_str(ck, cfg, "hidden_act", &act, e));
    const bool tie_set = json_is_boolean(json_object_get(cfg, "tie_word_embeddings"));
    TRY(config_bool(ck, cfg, "tie_word_embeddings", false, &tie, e));
    backend_act mlp_act; /* transformers' LlamaMLP gates with ACT2FN[hidden_act] */
    TRY(model_act_parse(ck, "hidden_act", act, BACKEND_ACT_SILU, &mlp_act, e));
    double partial;
    TRY(config_num(ck, cfg, "partial_rotary_factor", 1.0, &partial, e));
    if (window < 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: sliding_window: expected >= 0",
                         ck->config_path);
    TRY(model_read_eos(m, e));

    llama_weights *w = arena_alloc(&m->mem, sizeof *w);
    if (!w) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    memset(w, 0, sizeof *w);
    m->weights = w;
    w->eps = (float)eps;
    w->attn_scale = (float)(1.0 / sqrt((double)dm->hd));
    w->layers = arena_alloc(&m->mem, sizeof *w->layers * (size_t)dm->n_layer);
    if (!w->layers) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    memset(w->layers, 0, sizeof *w->layers * (size_t)dm->n_layer);
    TRY(llama_rope(m, w, partial, traditional, e));

    /* Without the key, the presence of lm_head decides (HF and MLX defaults differ). */
    if (!tie_set) {
        char name[128];
        tie = checkpoint_find(ck, model_tensor_name(m, "lm_head.weight", name, sizeof name), NULL) == NULL;
    }
    model_text_dims(m, w->dims);
    w->flags[HAS_QKV_BIAS] = attn_bias || is_qwen2;
    w->flags[HAS_O_BIAS] = attn_bias && !is_qwen2;
    w->flags[HAS_MLP_BIAS] = mlp_bias;
    w->flags[UNTIED] = !tie;
    w->flags[HAS_QK_NORM] = is_qwen3;
    w->flags[FUSED] = is_phi3;
    w->flags[SPLIT] = !is_phi3;
    model_add_text_tables(m, llama_global_spec, sizeof llama_global_spec / sizeof *llama_global_spec, w,
                          llama_layer_spec, sizeof llama_layer_spec / sizeof *llama_layer_spec, w->layers,
                          sizeof *w->layers, w->dims, w->flags);
    TRY(model_bind(m, e));
    /* Mistral windows every layer; Qwen2 and Qwen3 window the layers layer_types marks
     * (transformers 5 writes it), else those from max_window_layers on when
     * use_sliding_window is set; Llama has no window. */
    bool *sliding = arena_alloc(&m->mem, sizeof(bool) * (size_t)dm->n_layer);
    if (!sliding) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    const bool qwen = is_qwen2 || is_qwen3, types = json_is_array(json_object_get(cfg, "layer_types"));
    if (qwen && types) TRY(model_layer_kinds(m, 0, sliding, e));
    for (int64_t l = 0; l < dm->n_layer; l++) {
        if (qwen && !types) sliding[l] = use_sw && l >= max_window_layers;
        if (is_mistral || is_phi3 || (qwen && sliding[l])) w->layers[l].attn.window = window;
        w->layers[l].attn.norm_eps = w->eps;
        w->layers[l].mlp.act = mlp_act;
    }
#undef TRY
    char quant[64];
    snprintf(m->desc, sizeof m->desc,
             "%s, %lld layers, d=%lld, heads %lld/%lld x %lld, ffn %lld, vocab %lld, %s%s", type,
             (long long)dm->n_layer, (long long)dm->d, (long long)dm->h, (long long)dm->hk,
             (long long)dm->hd, (long long)dm->f, (long long)dm->v,
             model_quant_desc(&w->layers[0].attn.wq, quant, sizeof quant), tie ? ", tied head" : "");
    return CELER_OK;
}

/* ==== Forward ==== */

static void llama_hidden_states(const celer_model *m, backend *be, const model_step *st,
                                const model_kv *kv, float *scratch, float *hidden) {
    const llama_weights *w = m->weights;
    const backend_ops *op = be->ops;
    const int64_t n = st->n, d = m->dims.d;
    float *x = scratch, *xb = x + n * d, *xo = xb + n * d, *tmp = xo + n * d;

    /* longrope: the long factors once a row lies past the original context */
    const rope_params *rope = w->long_from && st->keys > w->long_from ? &w->rope_long : &w->rope;
    model_embed_step(m, be, st, x);
    op->rmsnorm(be, xb, x, w->layers[0].attn_norm, n, d, w->eps);
    for (int64_t l = 0; l < m->dims.n_layer; l++) {
        const llama_layer *L = &w->layers[l];
        const bool last = l + 1 == m->dims.n_layer;
        /* x += o_proj(attn(rope(q), rope(k), v)) of xb = rmsnorm(x); xb = rmsnorm(x) */
        model_attention(m, be, st, kv, l, &L->attn, rope, w->attn_scale, xb, tmp, xo);
        backend_add_rmsnorm(be, xb, x, xo, L->mlp_norm, n, d, w->eps);
        /* x += down(silu(gate) * up) of xb; then the next layer's norm (the final one last) */
        model_mlp(m, be, &L->mlp, xb, n, tmp, xo);
        backend_add_rmsnorm(be, last ? hidden : xb, x, xo, last ? w->norm : w->layers[l + 1].attn_norm, n, d,
                            w->eps);
    }
}

static const matview *llama_embedding(const celer_model *m) {
    return &((const llama_weights *)m->weights)->embed;
}

static const matview *llama_head(const celer_model *m) {
    const llama_weights *w = m->weights;
    return w->flags[UNTIED] ? &w->head : &w->embed;
}

static const char *const llama_types[] = {"llama", "mistral", "qwen2", "qwen3", "phi3", NULL};

const model_family llama_family = {
    .model_types = llama_types,
    .load = llama_load,
    .scratch_floats = model_text_scratch_floats,
    .hidden_states = llama_hidden_states,
    .embedding = llama_embedding,
    .head = llama_head,
};

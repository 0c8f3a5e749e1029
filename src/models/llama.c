/*
 * llama.c - the Llama family: model_type llama (Llama 2/3.x), mistral and qwen2.
 *
 * RMSNorm, grouped-query attention with RoPE (default, linear, llama3 and YaRN scaling;
 * traditional or half-split pairs), optional sliding window, SwiGLU MLP, optional
 * biases (Llama's attention_bias/mlp_bias, Qwen2's q/k/v bias). Every shape and option is
 * read from config.json and checked against the tensors. One forward body
 * (llama_hidden_states) serves every entry point; the LM head lives in model.c.
 */
#include "models/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROPE_PI 3.14159265358979323846

typedef struct llama_layer {
    const float *attn_norm;           /* [d] */
    matview wq, wk, wv, wo;           /* [h*hd, d], [hk*hd, d], [hk*hd, d], [d, h*hd] */
    const float *bq, *bk, *bv, *bo;   /* [h*hd], [hk*hd], [hk*hd], [d] or NULL */
    const float *mlp_norm;            /* [d] */
    matview w_gate, w_up, w_down;     /* [f, d], [f, d], [d, f] */
    const float *b_gate, *b_up, *b_down; /* [f], [f], [d] or NULL */
    int64_t window;                   /* sliding window, 0 = full causal */
} llama_layer;

typedef struct llama_weights {
    matview embed;       /* [v, d] */
    matview head;        /* [v, d]; the embedding table when tied */
    const float *norm;   /* [d] */
    llama_layer *layers; /* [n_layer] */
    float eps;
    rope_params rope;
    float attn_scale;
} llama_weights;

/* ==== RoPE frequencies ==== */

/* inv_freq[hd/2] and the cos/sin factor for the rope_scaling block (NULL: plain RoPE),
 * following the definitions of Hugging Face transformers' modeling_rope_utils. */
static celer_status rope_init(celer_model *m, const json_t *scaling, double theta,
                              float *inv_freq, float *mscale, celer_error *e) {
    const checkpoint *ck = &m->ck;
    const int64_t hd = m->dims.hd, half = hd / 2;
    for (int64_t i = 0; i < half; i++) inv_freq[i] = (float)(1.0 / pow(theta, (double)(2 * i) / (double)hd));
    *mscale = 1.0f;
    if (!scaling || json_is_null(scaling)) return CELER_OK;
    if (!json_is_object(scaling))
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: rope_scaling: expected an object or null",
                         ck->config_path);
    const char *type;
    celer_status s = config_str(ck, scaling, "rope_type", &type, e);
    if (s == CELER_OK && !type) s = config_str(ck, scaling, "type", &type, e);
    if (s != CELER_OK) return s;
    if (!type || strcmp(type, "default") == 0) return CELER_OK;
    double factor;
    if ((s = config_num(ck, scaling, "factor", 1.0, &factor, e)) != CELER_OK) return s;
    if (factor <= 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: rope_scaling.factor: expected > 0, found %g",
                         ck->config_path, factor);
    if (strcmp(type, "linear") == 0) {
        for (int64_t i = 0; i < half; i++) inv_freq[i] = (float)(inv_freq[i] / factor);
        return CELER_OK;
    }
    int64_t orig;
    if ((s = config_int(ck, scaling, "original_max_position_embeddings", m->dims.n_ctx_train, &orig, e)) != CELER_OK)
        return s;
    if (orig <= 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: rope_scaling.original_max_position_embeddings: expected > 0",
                         ck->config_path);
    if (strcmp(type, "llama3") == 0) {
        double lo_f, hi_f;
        if ((s = config_num(ck, scaling, "low_freq_factor", 1.0, &lo_f, e)) != CELER_OK ||
            (s = config_num(ck, scaling, "high_freq_factor", 4.0, &hi_f, e)) != CELER_OK)
            return s;
        if (hi_f <= lo_f)
            return error_set(e, CELER_STATUS_BAD_CONFIG,
                             "%s: rope_scaling: high_freq_factor %g must exceed low_freq_factor %g",
                             ck->config_path, hi_f, lo_f);
        const double lo_wavelen = (double)orig / lo_f, hi_wavelen = (double)orig / hi_f;
        for (int64_t i = 0; i < half; i++) {
            const double f = inv_freq[i], wavelen = 2.0 * ROPE_PI / f;
            double out = wavelen > lo_wavelen ? f / factor : f;
            if (!(wavelen < hi_wavelen) && !(wavelen > lo_wavelen)) {
                const double smooth = ((double)orig / wavelen - lo_f) / (hi_f - lo_f);
                out = (1.0 - smooth) * f / factor + smooth * f;
            }
            inv_freq[i] = (float)out;
        }
        return CELER_OK;
    }
    if (strcmp(type, "yarn") == 0) {
        double attn_factor, ms, ms_all, beta_fast, beta_slow;
        bool truncate;
        if ((s = config_num(ck, scaling, "attention_factor", -1.0, &attn_factor, e)) != CELER_OK ||
            (s = config_num(ck, scaling, "mscale", 0.0, &ms, e)) != CELER_OK ||
            (s = config_num(ck, scaling, "mscale_all_dim", 0.0, &ms_all, e)) != CELER_OK ||
            (s = config_num(ck, scaling, "beta_fast", 32.0, &beta_fast, e)) != CELER_OK ||
            (s = config_num(ck, scaling, "beta_slow", 1.0, &beta_slow, e)) != CELER_OK ||
            (s = config_bool(ck, scaling, "truncate", true, &truncate, e)) != CELER_OK)
            return s;
        if (beta_fast == 0) beta_fast = 32.0; /* transformers treats 0 as unset */
        if (beta_slow == 0) beta_slow = 1.0;
#define YARN_MSCALE(scale, k) ((scale) <= 1.0 ? 1.0 : 0.1 * (k) * log(scale) + 1.0)
        if (attn_factor < 0)
            attn_factor = (ms != 0 && ms_all != 0) ? YARN_MSCALE(factor, ms) / YARN_MSCALE(factor, ms_all)
                                                   : YARN_MSCALE(factor, 1.0);
#undef YARN_MSCALE
        const double dim = (double)hd;
#define YARN_DIM(rot) (dim * log((double)orig / ((rot) * 2.0 * ROPE_PI)) / (2.0 * log(theta)))
        double lo = YARN_DIM(beta_fast), hi = YARN_DIM(beta_slow);
#undef YARN_DIM
        if (truncate) {
            lo = floor(lo);
            hi = ceil(hi);
        }
        if (lo < 0) lo = 0;
        if (hi > dim - 1) hi = dim - 1;
        if (lo == hi) hi += 0.001;
        for (int64_t i = 0; i < half; i++) {
            double ramp = ((double)i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            const double extra = 1.0 - ramp; /* weight of the unscaled frequency */
            const double f = inv_freq[i];
            inv_freq[i] = (float)(f / factor * (1.0 - extra) + f * extra);
        }
        *mscale = (float)attn_factor;
        return CELER_OK;
    }
    return error_set(e, CELER_STATUS_UNSUPPORTED,
                     "%s: rope_scaling type \"%s\" is not supported (expected default, linear, "
                     "llama3 or yarn)",
                     ck->config_path, type);
}

/* ==== Loading ==== */

static celer_status bind_linear(celer_model *m, const char *prefix, const char *name, int64_t rows,
                                int64_t cols, bool bias, matview *w, const float **b,
                                celer_error *e) {
    char module[200], bname[220];
    snprintf(module, sizeof module, "%s.%s", prefix, name);
    snprintf(bname, sizeof bname, "%s.bias", module);
    celer_status s = bind_matrix(m, module, rows, cols, w, e);
    if (s != CELER_OK) return s;
    if (bias) return bind_vector(m, bname, rows, true, b, e);
    return reject_tensor(m, bname, "config.json has no bias for this projection", e);
}

static celer_status llama_load(celer_model *m, celer_error *e) {
    const checkpoint *ck = &m->ck;
    const json_t *cfg = ck->config;
    model_dims *dm = &m->dims;
    const char *type = json_string_value(json_object_get(cfg, "model_type"));
    const bool is_qwen2 = strcmp(type, "qwen2") == 0, is_mistral = strcmp(type, "mistral") == 0;
    celer_status s;
    int64_t max_window_layers, window;
    double eps, theta;
    bool tie, tie_set, attn_bias, mlp_bias, traditional, use_sw;
    const char *act;
#define TRY(x) do { if ((s = (x)) != CELER_OK) return s; } while (0)
    TRY(config_pos_int(ck, cfg, "hidden_size", &dm->d, e));
    TRY(config_pos_int(ck, cfg, "intermediate_size", &dm->f, e));
    TRY(config_pos_int(ck, cfg, "num_attention_heads", &dm->h, e));
    TRY(config_pos_int(ck, cfg, "num_hidden_layers", &dm->n_layer, e));
    TRY(config_pos_int(ck, cfg, "vocab_size", &dm->v, e));
    TRY(config_int(ck, cfg, "num_key_value_heads", dm->h, &dm->hk, e));
    TRY(config_int(ck, cfg, "head_dim", dm->d / dm->h, &dm->hd, e));
    TRY(config_int(ck, cfg, "max_position_embeddings", 4096, &dm->n_ctx_train, e));
    TRY(config_num(ck, cfg, "rms_norm_eps", 1e-6, &eps, e));
    /* transformers 5 writes rope_theta and the scaling type into one rope_parameters
     * block; older configs have rope_theta and rope_scaling at the top level. */
    const json_t *rope_params = json_object_get(cfg, "rope_parameters");
    const json_t *rope_scaling = json_object_get(cfg, "rope_scaling");
    if (!json_is_object(rope_params)) rope_params = NULL;
    if ((!rope_scaling || json_is_null(rope_scaling)) && rope_params) rope_scaling = rope_params;
    TRY(config_num(ck, rope_params ? rope_params : cfg, "rope_theta", 10000.0, &theta, e));
    TRY(config_bool(ck, cfg, "attention_bias", false, &attn_bias, e));
    TRY(config_bool(ck, cfg, "mlp_bias", false, &mlp_bias, e));
    TRY(config_bool(ck, cfg, "rope_traditional", false, &traditional, e));
    TRY(config_bool(ck, cfg, "use_sliding_window", false, &use_sw, e));
    TRY(config_int(ck, cfg, "sliding_window", 0, &window, e));
    TRY(config_int(ck, cfg, "max_window_layers", 0, &max_window_layers, e));
    TRY(config_str(ck, cfg, "hidden_act", &act, e));
    tie_set = json_is_boolean(json_object_get(cfg, "tie_word_embeddings"));
    TRY(config_bool(ck, cfg, "tie_word_embeddings", false, &tie, e));
    if (act && strcmp(act, "silu") != 0)
        return error_set(e, CELER_STATUS_UNSUPPORTED, "%s: hidden_act: expected silu, found %s",
                         ck->config_path, act);
    if (dm->hk <= 0 || dm->h % dm->hk != 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: num_key_value_heads: expected a divisor of num_attention_heads %lld, "
                         "found %lld",
                         ck->config_path, (long long)dm->h, (long long)dm->hk);
    if (dm->hd <= 0 || dm->hd % 2 != 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: head_dim: expected a positive even number, found %lld",
                         ck->config_path, (long long)dm->hd);
    const json_t *prf = json_object_get(cfg, "partial_rotary_factor");
    if (prf && !json_is_null(prf) && json_number_value(prf) != 1.0)
        return error_set(e, CELER_STATUS_UNSUPPORTED,
                         "%s: partial_rotary_factor: only 1.0 is supported, found %g",
                         ck->config_path, json_number_value(prf));
    if (window < 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: sliding_window: expected >= 0",
                         ck->config_path);
    TRY(model_read_eos(m, e));

    llama_weights *w = arena_alloc(&m->mem, sizeof *w);
    if (!w) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    m->weights = w;
    w->eps = (float)eps;
    w->attn_scale = (float)(1.0 / sqrt((double)dm->hd));
    float *inv_freq = arena_alloc(&m->mem, sizeof(float) * (size_t)(dm->hd / 2));
    w->layers = arena_alloc(&m->mem, sizeof *w->layers * (size_t)dm->n_layer);
    if (!inv_freq || !w->layers) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    TRY(rope_init(m, rope_scaling, theta, inv_freq, &w->rope.mscale, e));
    w->rope.inv_freq = inv_freq;
    w->rope.traditional = traditional;

    const int64_t d = dm->d, qd = dm->h * dm->hd, kvd = dm->hk * dm->hd, f = dm->f;
    const bool qkv_bias = attn_bias || is_qwen2, o_bias = attn_bias && !is_qwen2;
    TRY(bind_matrix(m, "model.embed_tokens", dm->v, d, &w->embed, e));
    TRY(bind_vector(m, "model.norm.weight", d, true, &w->norm, e));
    /* Without the key, the presence of lm_head decides (HF and MLX defaults differ). */
    if (!tie_set) tie = checkpoint_find(ck, "lm_head.weight", NULL) == NULL;
    if (tie) w->head = w->embed;
    else TRY(bind_matrix(m, "lm_head", dm->v, d, &w->head, e));

    for (int64_t l = 0; l < dm->n_layer; l++) {
        llama_layer *L = &w->layers[l];
        char p[96], name[160];
        snprintf(p, sizeof p, "model.layers.%lld.self_attn", (long long)l);
        TRY(bind_linear(m, p, "q_proj", qd, d, qkv_bias, &L->wq, &L->bq, e));
        TRY(bind_linear(m, p, "k_proj", kvd, d, qkv_bias, &L->wk, &L->bk, e));
        TRY(bind_linear(m, p, "v_proj", kvd, d, qkv_bias, &L->wv, &L->bv, e));
        TRY(bind_linear(m, p, "o_proj", d, qd, o_bias, &L->wo, &L->bo, e));
        snprintf(p, sizeof p, "model.layers.%lld.mlp", (long long)l);
        TRY(bind_linear(m, p, "gate_proj", f, d, mlp_bias, &L->w_gate, &L->b_gate, e));
        TRY(bind_linear(m, p, "up_proj", f, d, mlp_bias, &L->w_up, &L->b_up, e));
        TRY(bind_linear(m, p, "down_proj", d, f, mlp_bias, &L->w_down, &L->b_down, e));
        snprintf(name, sizeof name, "model.layers.%lld.input_layernorm.weight", (long long)l);
        TRY(bind_vector(m, name, d, true, &L->attn_norm, e));
        snprintf(name, sizeof name, "model.layers.%lld.post_attention_layernorm.weight", (long long)l);
        TRY(bind_vector(m, name, d, true, &L->mlp_norm, e));
        /* Mistral windows every layer; Qwen2 windows layers from max_window_layers on
         * when use_sliding_window is set; Llama has no window. */
        if (is_mistral) L->window = window;
        else if (is_qwen2 && use_sw && l >= max_window_layers) L->window = window;
    }
#undef TRY
    const matview *q = &w->layers[0].wq;
    char quant[64] = "dense";
    if (q->quant_bits) snprintf(quant, sizeof quant, "%d-bit g%lld", q->quant_bits, (long long)q->group);
    else snprintf(quant, sizeof quant, "%s", dtype_name(q->type));
    snprintf(m->desc, sizeof m->desc,
             "%s, %lld layers, d=%lld, heads %lld/%lld x %lld, ffn %lld, vocab %lld, %s%s", type,
             (long long)dm->n_layer, (long long)d, (long long)dm->h, (long long)dm->hk,
             (long long)dm->hd, (long long)f, (long long)dm->v, quant, tie ? ", tied head" : "");
    return CELER_OK;
}

/* ==== Forward ==== */

static int64_t llama_scratch_floats(const celer_model *m, int64_t n) {
    const model_dims *dm = &m->dims;
    const int64_t qd = dm->h * dm->hd, kvd = dm->hk * dm->hd;
    /* x, xb, xo [d]; q, att [qd]; k, v [kvd]; gate, up [f] */
    return n * (3 * dm->d + 2 * qd + 2 * kvd + 2 * dm->f);
}

static void linear(backend *be, float *y, const matview *w, const float *b, const float *x, int64_t n) {
    be->ops->matmul(be, y, w, x, n);
    if (b) be->ops->add_bias(be, y, b, n, w->rows);
}

static void llama_hidden_states(const celer_model *m, backend *be, const model_step *st,
                                const model_kv *kv, float *scratch, float *hidden) {
    const llama_weights *w = m->weights;
    const model_dims *dm = &m->dims;
    const backend_ops *op = be->ops;
    const int64_t n = st->n, d = dm->d, qd = dm->h * dm->hd, kvd = dm->hk * dm->hd, f = dm->f;
    float *x = scratch, *xb = x + n * d, *xo = xb + n * d, *q = xo + n * d, *att = q + n * qd;
    float *k = att + n * qd, *v = k + n * kvd, *gate = v + n * kvd, *up = gate + n * f;

    if (st->token) op->embed(be, x, &w->embed, st->token, n);
    else memcpy(x, st->embd, sizeof(float) * (size_t)(n * d));

    attn_rows ar = {.n = n, .pos = st->pos, .blocks = st->blocks, .block_size = st->block_size,
                    .h = dm->h, .hk = dm->hk, .hd = dm->hd, .scale = w->attn_scale};
    for (int64_t l = 0; l < dm->n_layer; l++) {
        const llama_layer *L = &w->layers[l];
        /* attention block: x += o_proj(attn(rope(q), rope(k), v)) */
        op->rmsnorm(be, xb, x, L->attn_norm, n, d, w->eps);
        linear(be, q, &L->wq, L->bq, xb, n);
        linear(be, k, &L->wk, L->bk, xb, n);
        linear(be, v, &L->wv, L->bv, xb, n);
        op->rope(be, q, st->pos, n, dm->h, dm->hd, &w->rope);
        op->rope(be, k, st->pos, n, dm->hk, dm->hd, &w->rope);
        op->kv_store(be, kv->k[l], kv->v[l], k, v, st->slot, n, kvd);
        ar.window = L->window;
        op->attention(be, att, q, kv->k[l], kv->v[l], &ar);
        linear(be, xo, &L->wo, L->bo, att, n);
        op->add(be, x, xo, n * d);
        /* MLP block: x += down(silu(gate(x)) * up(x)) */
        op->rmsnorm(be, xb, x, L->mlp_norm, n, d, w->eps);
        linear(be, gate, &L->w_gate, L->b_gate, xb, n);
        linear(be, up, &L->w_up, L->b_up, xb, n);
        op->swiglu(be, gate, gate, up, n * f);
        linear(be, xo, &L->w_down, L->b_down, gate, n);
        op->add(be, x, xo, n * d);
    }
    op->rmsnorm(be, hidden, x, w->norm, n, d, w->eps);
}

static const matview *llama_embedding(const celer_model *m) {
    return &((const llama_weights *)m->weights)->embed;
}

static const matview *llama_head(const celer_model *m) {
    return &((const llama_weights *)m->weights)->head;
}

static void llama_count(const celer_model *m, int64_t *params, int64_t *bytes) {
    const llama_weights *w = m->weights;
    const model_dims *dm = &m->dims;
    const bool tied = w->head.data == w->embed.data;
    *params = 0, *bytes = 0;
#define ADD_MAT(x) (*params += (x).rows * (x).cols, *bytes += matview_bytes(&(x)))
#define ADD_VEC(p, n) ((p) ? (*params += (n), *bytes += 4 * (n)) : 0)
    ADD_MAT(w->embed);
    if (!tied) ADD_MAT(w->head);
    ADD_VEC(w->norm, dm->d);
    for (int64_t l = 0; l < dm->n_layer; l++) {
        const llama_layer *L = &w->layers[l];
        ADD_MAT(L->wq), ADD_MAT(L->wk), ADD_MAT(L->wv), ADD_MAT(L->wo);
        ADD_MAT(L->w_gate), ADD_MAT(L->w_up), ADD_MAT(L->w_down);
        ADD_VEC(L->attn_norm, dm->d), ADD_VEC(L->mlp_norm, dm->d);
        ADD_VEC(L->bq, L->wq.rows), ADD_VEC(L->bk, L->wk.rows), ADD_VEC(L->bv, L->wv.rows), ADD_VEC(L->bo, L->wo.rows);
        ADD_VEC(L->b_gate, L->w_gate.rows), ADD_VEC(L->b_up, L->w_up.rows), ADD_VEC(L->b_down, L->w_down.rows);
    }
#undef ADD_MAT
#undef ADD_VEC
}

static int64_t llama_matrices(celer_model *m, matview **out, int64_t cap) {
    llama_weights *w = m->weights;
    int64_t n = 0;
#define PUT(x) (n < cap ? (void)(out[n] = &(x)) : (void)0, n++)
    PUT(w->embed);
    PUT(w->head);
    for (int64_t l = 0; l < m->dims.n_layer; l++) {
        llama_layer *L = &w->layers[l];
        PUT(L->wq), PUT(L->wk), PUT(L->wv), PUT(L->wo), PUT(L->w_gate), PUT(L->w_up), PUT(L->w_down);
    }
#undef PUT
    return n;
}

static const char *const llama_types[] = {"llama", "mistral", "qwen2", NULL};

const model_family llama_family = {
    .model_types = llama_types,
    .load = llama_load,
    .scratch_floats = llama_scratch_floats,
    .hidden_states = llama_hidden_states,
    .embedding = llama_embedding,
    .head = llama_head,
    .matrices = llama_matrices,
    .count = llama_count,
};

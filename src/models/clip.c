/*
 * clip.c - the ViT vision towers (see clip.h), as transformers' CLIPVisionModel and
 * SiglipVisionModel compute them: embeddings = [class (CLIP)], conv(pixels) (+ its bias,
 * SigLIP), + positions, then pre_layrnorm (CLIP); each layer x += attn(ln1(x)),
 * x += fc2(act(fc1(ln2(x)))); hidden_states[i] is the output of layer i (hidden_states[0]
 * the embeddings, after pre_layrnorm). post_layernorm is bound only where the tower's output
 * is read (SigLIP's last_hidden_state, Gemma 3); CLIP's feeds only the pooled output, which
 * LLaVA never reads. SigLIP's attention-pooling head (vision_use_head) is never read either.
 */
#include "models/clip.h"

#include "base/half.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum clip_dim { DIM_VD, DIM_VF, DIM_PATCH, DIM_POS, DIM_ONE };
enum clip_flag { HAS_CLASS, HAS_PRE, HAS_PATCH_BIAS };

#define MAT(name, field, r, c)                                                                     \
    { name, WEIGHT_MATRIX, r, c, WEIGHT_ALWAYS, offsetof(clip_layer, field), 0, 0 }
#define VEC(name, field, r)                                                                        \
    { name, WEIGHT_VECTOR, r, 0, WEIGHT_ALWAYS, offsetof(clip_layer, field), 0, 0 }
static const weight_spec clip_layer_spec[] = {
    VEC("layer_norm1.weight", ln1_w, DIM_VD),
    VEC("layer_norm1.bias", ln1_b, DIM_VD),
    MAT("self_attn.q_proj", attn.wq, DIM_VD, DIM_VD),
    VEC("self_attn.q_proj.bias", attn.bq, DIM_VD),
    MAT("self_attn.k_proj", attn.wk, DIM_VD, DIM_VD),
    VEC("self_attn.k_proj.bias", attn.bk, DIM_VD),
    MAT("self_attn.v_proj", attn.wv, DIM_VD, DIM_VD),
    VEC("self_attn.v_proj.bias", attn.bv, DIM_VD),
    MAT("self_attn.out_proj", attn.wo, DIM_VD, DIM_VD),
    VEC("self_attn.out_proj.bias", attn.bo, DIM_VD),
    VEC("layer_norm2.weight", ln2_w, DIM_VD),
    VEC("layer_norm2.bias", ln2_b, DIM_VD),
    MAT("mlp.fc1", fc1, DIM_VF, DIM_VD),
    VEC("mlp.fc1.bias", b1, DIM_VF),
    MAT("mlp.fc2", fc2, DIM_VD, DIM_VF),
    VEC("mlp.fc2.bias", b2, DIM_VD),
};
#undef MAT
#undef VEC
static const weight_spec clip_global_spec[] = {
    {"embeddings.patch_embedding", WEIGHT_KERNEL, DIM_VD, DIM_PATCH, WEIGHT_ALWAYS,
     offsetof(clip_tower, patch_w), 0, 0},
    {"embeddings.patch_embedding.bias", WEIGHT_VECTOR, DIM_VD, 0, HAS_PATCH_BIAS,
     offsetof(clip_tower, patch_b), 0, 0},
    {"embeddings.class_embedding", WEIGHT_VECTOR, DIM_VD, 0, HAS_CLASS,
     offsetof(clip_tower, class_emb), 0, 0},
    {"embeddings.position_embedding", WEIGHT_MATRIX, DIM_POS, DIM_VD, WEIGHT_ALWAYS,
     offsetof(clip_tower, pos_emb), 0, 0},
    {"pre_layrnorm.weight", WEIGHT_VECTOR, DIM_VD, 0, HAS_PRE, offsetof(clip_tower, pre_w), 0, 0},
    {"pre_layrnorm.bias", WEIGHT_VECTOR, DIM_VD, 0, HAS_PRE, offsetof(clip_tower, pre_b), 0, 0},
};
/* Only where the tower's output is read: CLIP checkpoints have it too, unused. */
static const weight_spec clip_post_spec[] = {
    {"post_layernorm.weight", WEIGHT_VECTOR, DIM_VD, 0, WEIGHT_ALWAYS, offsetof(clip_tower, post_w),
     0, 0},
    {"post_layernorm.bias", WEIGHT_VECTOR, DIM_VD, 0, WEIGHT_ALWAYS, offsetof(clip_tower, post_b),
     0, 0},
};

/* ==== Loading ==== */

/* t->feature from feature_layer: one index or a list, negative counting from the end of
 * hidden_states (n_layer + 1 entries). */
static celer_status read_feature_layers(const checkpoint *ck, const json_t *fl, clip_tower *t,
                                        celer_error *e) {
    const bool list = json_is_array(fl);
    const size_t n = list ? json_array_size(fl) : 1;
    if (!fl || json_is_null(fl)) {
        t->feature[0] = t->n_layer - 1; /* transformers' default: -2 */
        t->n_feature = 1;
        return CELER_OK;
    }
    if (n == 0 || n > CLIP_MAX_FEATURE_LAYERS)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: vision_feature_layer: expected 1 to %d layers", ck->config_path,
                         CLIP_MAX_FEATURE_LAYERS);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = list ? json_array_get(fl, i) : fl;
        const int64_t idx = json_is_integer(v) ? (int64_t)json_integer_value(v) : INT64_MIN;
        const int64_t at = idx < 0 ? t->n_layer + 1 + idx : idx;
        if (idx == INT64_MIN || at < 0 || at > t->n_layer)
            return error_set(
                e, CELER_STATUS_BAD_CONFIG,
                "%s: vision_feature_layer: expected integers in [%lld, %lld] for %lld layers",
                ck->config_path, (long long)-(t->n_layer + 1), (long long)t->n_layer,
                (long long)t->n_layer);
        t->feature[i] = at;
        if (at > t->n_run) t->n_run = at;
    }
    t->n_feature = (int)n;
    return CELER_OK;
}

/* Each kind's config class defaults: checkpoints often store only what differs. */
static const struct clip_defaults {
    const char *model_type;
    int64_t vd, vf, n_layer, h, image_size, patch;
    double eps;
    backend_act act;
} clip_defaults[] = {
    [CLIP_VIT] = {"clip_vision_model", 768, 3072, 12, 12, 224, 32, 1e-5, BACKEND_ACT_QUICK_GELU},
    [CLIP_SIGLIP] = {"siglip_vision_model", 768, 3072, 12, 12, 224, 16, 1e-6,
                     BACKEND_ACT_GELU_TANH},
};

/* The kind vcfg's model_type names (kind when it names none). */
static celer_status clip_kind_of(const checkpoint *ck, const json_t *vcfg, clip_kind *kind,
                                 celer_error *e) {
    const char *type = json_string_value(json_object_get(vcfg, "model_type"));
    if (!type) return CELER_OK;
    if (!strcmp(type, "clip_vision_model") || !strcmp(type, "clip"))
        *kind = CLIP_VIT;
    else if (!strcmp(type, "siglip_vision_model") || !strcmp(type, "siglip"))
        *kind = CLIP_SIGLIP;
    else
        return error_set(e, CELER_STATUS_UNSUPPORTED,
                         "%s: vision_config.model_type: expected clip_vision_model or "
                         "siglip_vision_model, found %s",
                         ck->config_path, type);
    return CELER_OK;
}

celer_status clip_load(celer_model *m, const json_t *vcfg, clip_kind kind,
                       const json_t *feature_layer, bool output, const char *prefix, clip_tower *t,
                       celer_error *e) {
    const checkpoint *ck = &m->ck;
    celer_status s;
    int64_t channels;
    double eps;
    const char *act;
    memset(t, 0, sizeof *t);
    if (!json_is_object(vcfg))
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: vision_config: expected an object",
                         ck->config_path);
#define TRY(x)                                                                                     \
    do {                                                                                           \
        if ((s = (x)) != CELER_OK) return s;                                                       \
    } while (0)
    TRY(clip_kind_of(ck, vcfg, &kind, e));
    const struct clip_defaults *df = &clip_defaults[kind];
    t->kind = kind;
    TRY(config_int(ck, vcfg, "hidden_size", df->vd, &t->vd, e));
    TRY(config_int(ck, vcfg, "intermediate_size", df->vf, &t->vf, e));
    TRY(config_int(ck, vcfg, "num_hidden_layers", df->n_layer, &t->n_layer, e));
    TRY(config_int(ck, vcfg, "num_attention_heads", df->h, &t->h, e));
    TRY(config_int(ck, vcfg, "image_size", df->image_size, &t->image_size, e));
    TRY(config_int(ck, vcfg, "patch_size", df->patch, &t->patch, e));
    TRY(config_int(ck, vcfg, "num_channels", 3, &channels, e));
    TRY(config_num(ck, vcfg, "layer_norm_eps", df->eps, &eps, e));
    TRY(config_str(ck, vcfg, "hidden_act", &act, e));
    TRY(model_act_parse(ck, "vision_config.hidden_act", act, df->act, &t->act, e));
    if (t->vd <= 0 || t->vf <= 0 || t->n_layer <= 0 || t->h <= 0 || t->vd % t->h != 0 ||
        (t->vd / t->h) % 2 != 0)
        return error_set(
            e, CELER_STATUS_BAD_CONFIG,
            "%s: vision_config: expected positive sizes with hidden_size %lld a multiple of "
            "num_attention_heads %lld and an even head size",
            ck->config_path, (long long)t->vd, (long long)t->h);
    if (t->patch <= 0 || t->image_size <= 0 || t->image_size % t->patch != 0 ||
        t->image_size / t->patch > 1024)
        return error_set(
            e, CELER_STATUS_BAD_CONFIG,
            "%s: vision_config: image_size %lld must be a positive multiple of patch_size %lld",
            ck->config_path, (long long)t->image_size, (long long)t->patch);
    if (channels != 3)
        return error_set(e, CELER_STATUS_UNSUPPORTED,
                         "%s: vision_config.num_channels: expected 3, found %lld", ck->config_path,
                         (long long)channels);
    if (output) {
        t->feature[0] = t->n_run = t->n_layer;
        t->n_feature = 1;
    } else {
        TRY(read_feature_layers(ck, feature_layer, t, e));
    }
#undef TRY
    t->hd = t->vd / t->h;
    t->grid = t->image_size / t->patch;
    t->lead = kind == CLIP_VIT ? 1 : 0;
    t->n_pos = t->grid * t->grid + t->lead;
    t->eps = (float)eps;
    t->scale = (float)(1.0 / sqrt((double)t->hd));
    t->layers = arena_alloc(&m->mem, sizeof *t->layers * (size_t)t->n_layer);
    if (!t->layers) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    memset(t->layers, 0, sizeof *t->layers * (size_t)t->n_layer);
    t->dims[DIM_VD] = t->vd, t->dims[DIM_VF] = t->vf, t->dims[DIM_PATCH] = 3 * t->patch * t->patch;
    t->dims[DIM_POS] = t->n_pos, t->dims[DIM_ONE] = 1;
    t->flags[HAS_CLASS] = t->flags[HAS_PRE] = kind == CLIP_VIT;
    t->flags[HAS_PATCH_BIAS] = kind == CLIP_SIGLIP;
    char *global = arena_alloc(&m->mem, strlen(prefix) + 16),
         *layers = arena_alloc(&m->mem, strlen(prefix) + 32);
    if (!global || !layers) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    strcpy(global, prefix);
    strcpy(layers, prefix);
    t->prefix = global;
    strcat(layers, "encoder.layers.");
    model_add_table(m, &(weight_table){.spec = clip_global_spec,
                                       .n_spec = sizeof clip_global_spec / sizeof *clip_global_spec,
                                       .base = t,
                                       .count = 1,
                                       .prefix = global,
                                       .dims = t->dims,
                                       .flags = t->flags});
    if (output)
        model_add_table(m, &(weight_table){.spec = clip_post_spec,
                                           .n_spec = sizeof clip_post_spec / sizeof *clip_post_spec,
                                           .base = t,
                                           .count = 1,
                                           .prefix = global,
                                           .dims = t->dims});
    /* layers past the deepest selected hidden state are never run: not bound, not packed */
    if (t->n_run > 0)
        model_add_table(m,
                        &(weight_table){.spec = clip_layer_spec,
                                        .n_spec = sizeof clip_layer_spec / sizeof *clip_layer_spec,
                                        .base = t->layers,
                                        .count = t->n_run,
                                        .stride = sizeof *t->layers,
                                        .prefix = layers,
                                        .indexed = true,
                                        .dims = t->dims});
    return CELER_OK;
}

celer_status clip_finish(celer_model *m, clip_tower *t, celer_error *e) {
    /* The patch convolution is [vd, 3, p, p] in transformers' layout and [vd, p, p, 3]
     * (channels last) in mlx-vlm's; the flattened kernel is read in its own order. */
    char name[256];
    const char *file;
    snprintf(name, sizeof name, "%sembeddings.patch_embedding.weight", t->prefix);
    const st_tensor *pw = checkpoint_find(&m->ck, name, &file);
    const int64_t p = t->patch, vd = t->vd;
    CELER_ASSERT(pw != NULL); /* bound already */
    const bool torch_order =
        pw->ndim == 4 && pw->shape[1] == 3 && pw->shape[2] == p && pw->shape[3] == p;
    const bool mlx_order =
        pw->ndim == 4 && pw->shape[1] == p && pw->shape[2] == p && pw->shape[3] == 3;
    if (!torch_order && !mlx_order) {
        char b[96];
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: tensor %s: expected [%lld, 3, %lld, %lld] or [%lld, %lld, %lld, 3] "
                         "(config.json), found %s",
                         file, name, (long long)vd, (long long)p, (long long)p, (long long)vd,
                         (long long)p, (long long)p, shape_str(b, sizeof b, pw->shape, pw->ndim));
    }
    t->channels_last = !torch_order;
    /* position rows in fp32, the class embedding folded into row 0, the convolution's bias
     * into every patch row */
    float *pos = arena_alloc(&m->vectors, sizeof(float) * (size_t)(t->n_pos * vd));
    if (!pos) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int64_t r = 0; r < t->n_pos; r++) {
        matview_row(pos + r * vd, &t->pos_emb, r);
        const float *add = r < t->lead ? t->class_emb : t->patch_b;
        for (int64_t c = 0; add && c < vd; c++) pos[r * vd + c] += add[c];
    }
    t->pos = pos;
    return CELER_OK;
}

/* ==== Forward ==== */

int64_t clip_max_cols(const clip_tower *t) {
    int64_t c = t->vf > t->vd ? t->vf : t->vd;
    return 3 * t->patch * t->patch > c ? 3 * t->patch * t->patch : c;
}

int64_t clip_scratch_floats(const clip_tower *t, int64_t n_tiles) {
    const int64_t rows = n_tiles * t->n_pos;
    /* x, xb, xo, q, k, v, att [vd]; fc1 output [vf]; patches [3 p p] (a zero row for
     * the class token included) */
    return rows * (7 * t->vd + t->vf + 3 * t->patch * t->patch);
}

/* Copies x[rows, vd] into column block j of feats[rows, vd * n_feature] for every j
 * that selects this layer's hidden state. */
static void put_selected(const clip_tower *t, backend *be, float *feats, const float *x,
                         int64_t rows, int64_t layer) {
    const int64_t vd = t->vd, cols = clip_feature_cols(t);
    for (int j = 0; j < t->n_feature; j++)
        if (t->feature[j] == layer) be->ops->copy_rows(be, feats + j * vd, cols, x, vd, rows, vd);
}

void clip_forward(const clip_tower *t, backend *be, const float *pixels, int64_t n_tiles,
                  float *scratch, float *feats) {
    const backend_ops *op = be->ops;
    const int64_t vd = t->vd, np = t->n_pos, rows = n_tiles * np;
    float *x = scratch, *xb = x + rows * vd, *xo = xb + rows * vd, *q = xo + rows * vd;
    float *k = q + rows * vd, *v = k + rows * vd, *att = v + rows * vd, *hid = att + rows * vd;
    float *patches = hid + rows * t->vf;

    /* embeddings: the convolution as one product over every patch of every tile, each
     * tile's rows [class, patches] (a zero row where CLIP's class token goes: its
     * convolution has no bias), plus the position rows (the class embedding or the
     * convolution's bias folded in) */
    op->patches(be, patches, pixels, n_tiles, t->image_size, t->patch, t->channels_last,
                t->lead > 0);
    op->matmul(be, x, &t->patch_w, patches, rows);
    op->add_bias(be, x, t->pos, n_tiles, np * vd);
    if (t->pre_w) op->layernorm(be, x, x, t->pre_w, t->pre_b, rows, vd, t->eps);
    put_selected(t, be, feats, x, rows, 0);

    for (int64_t l = 0; l < t->n_run; l++) {
        const clip_layer *L = &t->layers[l];
        /* x += out_proj(attention over the tile's positions) of ln1(x) */
        op->layernorm(be, xb, x, L->ln1_w, L->ln1_b, rows, vd, t->eps);
        model_linear(be, q, &L->attn.wq, L->attn.bq, xb, rows);
        model_linear(be, k, &L->attn.wk, L->attn.bk, xb, rows);
        model_linear(be, v, &L->attn.wv, L->attn.bv, xb, rows);
        op->attention_full(be, att, q, k, v, rows, np, t->h, t->h, t->hd, t->scale);
        model_linear(be, xo, &L->attn.wo, L->attn.bo, att, rows);
        op->add(be, x, xo, rows * vd);
        /* x += fc2(act(fc1(ln2(x)))) */
        op->layernorm(be, xb, x, L->ln2_w, L->ln2_b, rows, vd, t->eps);
        model_linear(be, hid, &L->fc1, L->b1, xb, rows);
        op->act(be, hid, hid, rows * t->vf, t->act);
        model_linear(be, xo, &L->fc2, L->b2, hid, rows);
        op->add(be, x, xo, rows * vd);
        /* the tower's output (only ever the last layer's) through post_layernorm */
        if (t->post_w && l + 1 == t->n_layer)
            op->layernorm(be, x, x, t->post_w, t->post_b, rows, vd, t->eps);
        put_selected(t, be, feats, x, rows, l + 1);
    }
}

/*
 * gemma3.c - Gemma 3 checkpoints, model_type gemma3: a Gemma text model (gemma.c) that the
 * text_config describes, and, where config.json has a vision_config, the image side: a
 * SigLIP tower (clip.c) and Gemma3MultiModalProjector.
 *
 * The wrapper has no forward of its own: model.c sends every contract entry point to the
 * text model. The image side, as transformers' Gemma3Model computes it: each tile (the
 * whole image, then pan-and-scan crops) through the tower to its last layer's output after
 * post_layernorm [grid^2, vd]; average pooling of k x k windows (k = grid / sqrt(T)) to T =
 * mm_tokens_per_image rows; the soft-embedding RMSNorm (1 + w, folded at load, with the
 * tower's layer_norm_eps); then x @ mm_input_projection_weight, which is stored [vd, td] (a
 * parameter, not a Linear: transposed at load). Each tile's T rows replace one image token
 * of the prompt, and those rows attend to each other at prefill (m->image_blocks; the
 * engine keeps a block whole within a step).
 *
 * A gemma3 checkpoint without vision_config runs as its text model alone (mlx-lm's
 * conversions drop the tower).
 *
 * Checkpoint layouts, told apart by their tensor names: language_model.model.*,
 * vision_tower.vision_model.*, multi_modal_projector.* (the Hub's checkpoints and
 * transformers' save_pretrained of them; mlx-vlm, with channels-last patch kernels and the
 * tied head written out as language_model.lm_head.weight), and model.language_model.*,
 * model.vision_tower[.vision_model].*, model.multi_modal_projector.* (transformers'
 * in-memory names).
 */
#include "models/clip.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef struct gemma3_weights {
    clip_tower tower;
    matview proj;      /* [td, vd]: mm_input_projection_weight, transposed */
    const float *norm; /* [vd] mm_soft_emb_norm, 1 + w */
    int64_t tokens;    /* T = mm_tokens_per_image rows per tile */
    int64_t pool;      /* k: the pooling window's side */
    int32_t image_token, boi, eoi;
    int64_t dims[2];
} gemma3_weights;

enum gemma3_dim { DIM_TD, DIM_VD };

static const weight_spec gemma3_proj_spec[] = {
    {"mm_input_projection_weight", WEIGHT_TRANSPOSED, DIM_TD, DIM_VD, WEIGHT_ALWAYS,
     offsetof(gemma3_weights, proj), 0, 0},
    {"mm_soft_emb_norm.weight", WEIGHT_VECTOR, DIM_VD, 0, WEIGHT_ALWAYS,
     offsetof(gemma3_weights, norm), 0, 0},
};

/* ==== Loading ==== */

/* Gemma3TextConfig's defaults (real text_config blocks are sparse). */
static const struct {
    const char *key;
    double value;
} gemma3_defaults[] = {
    {"vocab_size", 262208},
    {"hidden_size", 2304},
    {"intermediate_size", 9216},
    {"num_hidden_layers", 26},
    {"num_attention_heads", 8},
    {"num_key_value_heads", 4},
    {"head_dim", 256},
    {"query_pre_attn_scalar", 256},
    {"sliding_window", 4096},
    {"rope_theta", 1000000.0},
    {"rope_local_base_freq", 10000.0},
    {"rms_norm_eps", 1e-6},
    {"max_position_embeddings", 131072},
};

/* The text model: text_config with its defaults, the checkpoint's top level deciding tying and
 * end of sequence (transformers), under the layout's text rule. A head the checkpoint holds is
 * read (mlx-vlm writes the tied head out). */
static celer_status load_text(celer_model *m, celer_error *e) {
    const json_t *tc = json_object_get(m->cfg, "text_config");
    json_t *c = json_is_object(tc) ? json_deep_copy(tc) : json_object();
    if (!c) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    m->owned_json = c;
    json_object_set_new(c, "model_type", json_string("gemma3_text"));
    for (size_t i = 0; i < sizeof gemma3_defaults / sizeof *gemma3_defaults; i++)
        if (!json_object_get(c, gemma3_defaults[i].key)) {
            const double v = gemma3_defaults[i].value;
            json_object_set_new(c, gemma3_defaults[i].key,
                                v == (double)(json_int_t)v ? json_integer((json_int_t)v)
                                                           : json_real(v));
        }
    const char *const top[] = {"tie_word_embeddings", "eos_token_id"};
    for (int i = 0; i < 2; i++)
        if (json_object_get(m->cfg, top[i]))
            json_object_set(c, top[i], json_object_get(m->cfg, top[i]));
    name_rule rule;
    celer_status s = model_text_layout(m, &rule, e);
    if (s != CELER_OK) return s;
    celer_model named = {.n_rename = 1, .rename = {rule}}; /* only its name map is read */
    char head[128];
    if (checkpoint_find(&m->ck, model_tensor_name(&named, "lm_head.weight", head, sizeof head),
                        NULL))
        json_object_set_new(c, "tie_word_embeddings", json_false());
    return model_load_text(m, c, &rule, 1, e);
}

/* An image token id of config.json: key, else alt (a newer name), else def. */
static celer_status token_id(celer_model *m, const char *key, const char *alt, int64_t def,
                             int32_t *out, celer_error *e) {
    int64_t v;
    celer_status s = config_int(&m->ck, m->cfg, key, -1, &v, e);
    if (s == CELER_OK && v < 0) s = config_int(&m->ck, m->cfg, alt, def, &v, e);
    if (s != CELER_OK) return s;
    if (v < 0 || v >= m->dims.v)
        return error_set(e, CELER_STATUS_BAD_CONFIG, "%s: %s %lld outside the vocabulary of %lld",
                         m->ck.config_path, key, (long long)v, (long long)m->dims.v);
    *out = (int32_t)v;
    return CELER_OK;
}

static celer_status gemma3_load(celer_model *m, celer_error *e) {
    const checkpoint *ck = &m->ck;
    const json_t *vcfg = json_object_get(m->cfg, "vision_config");
    celer_status s;
#define TRY(x)                                                                                     \
    do {                                                                                           \
        if ((s = (x)) != CELER_OK) return s;                                                       \
    } while (0)
    TRY(load_text(m, e));
    if (!vcfg || json_is_null(vcfg)) {
        snprintf(m->desc, sizeof m->desc, "gemma3 (text model): %.200s", m->text->desc);
        return CELER_OK;
    }
    /* the vision wrapper: its image entry points are those of gemma3_vision_family */
    m->family = &gemma3_vision_family;
    static const char *const towers[] = {"vision_tower.vision_model.", "vision_tower.",
                                         "model.vision_tower.vision_model.", "model.vision_tower.",
                                         NULL};
    static const char *const projs[] = {"multi_modal_projector.", "model.multi_modal_projector.",
                                        NULL};
    const char *tower = model_probe_prefix(m, towers, "embeddings.patch_embedding.weight");
    const char *proj = model_probe_prefix(m, projs, "mm_input_projection_weight");
    if (!tower)
        return error_set(
            e, CELER_STATUS_BAD_FILE,
            "%s: missing tensor vision_tower.vision_model.embeddings.patch_embedding.weight",
            ck->dir);
    if (!proj)
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: missing tensor multi_modal_projector.mm_input_projection_weight",
                         ck->dir);
    gemma3_weights *w = arena_alloc(&m->mem, sizeof *w);
    if (!w) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    memset(w, 0, sizeof *w);
    m->weights = w;
    TRY(token_id(m, "image_token_index", "image_token_id", 262144, &w->image_token, e));
    TRY(token_id(m, "boi_token_index", "boi_token_id", 255999, &w->boi, e));
    TRY(token_id(m, "eoi_token_index", "eoi_token_id", 256000, &w->eoi, e));
    TRY(config_int(ck, m->cfg, "mm_tokens_per_image", 256, &w->tokens, e));
    TRY(clip_load(m, vcfg, CLIP_SIGLIP, NULL, true, tower, &w->tower, e));
    if (w->tower.kind != CLIP_SIGLIP)
        return error_set(e, CELER_STATUS_UNSUPPORTED,
                         "%s: vision_config.model_type: expected siglip_vision_model, found %s",
                         ck->config_path, json_string_value(json_object_get(vcfg, "model_type")));
    /* T rows per tile from a grid x grid map: a square whose side divides the grid */
    const int64_t g = w->tower.grid,
                  side = (int64_t)llround(sqrt((double)(w->tokens > 0 ? w->tokens : 0)));
    if (w->tokens <= 0 || side * side != w->tokens)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: mm_tokens_per_image: expected a square number, found %lld",
                         ck->config_path, (long long)w->tokens);
    if (g % side != 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: mm_tokens_per_image %lld: a %lld x %lld side does not divide the "
                         "%lld x %lld patch grid "
                         "(vision_config image_size %lld / patch_size %lld)",
                         ck->config_path, (long long)w->tokens, (long long)side, (long long)side,
                         (long long)g, (long long)g, (long long)w->tower.image_size,
                         (long long)w->tower.patch);
    w->pool = g / side;
    w->dims[DIM_TD] = m->dims.d;
    w->dims[DIM_VD] = w->tower.vd;
    model_add_table(m, &(weight_table){.spec = gemma3_proj_spec,
                                       .n_spec = 2,
                                       .base = w,
                                       .count = 1,
                                       .prefix = proj,
                                       .dims = w->dims});
    TRY(model_bind(m, e));
    TRY(clip_finish(m, &w->tower, e));
#undef TRY
    model_norm_plus_one(w->norm, w->tower.vd);
    m->image_blocks = true;
    const clip_tower *t = &w->tower;
    snprintf(m->desc, sizeof m->desc,
             "gemma3: %.150s; SigLIP %lld layers, d=%lld, %lldpx/%lld, %lld rows an image%s",
             m->text->desc, (long long)t->n_layer, (long long)t->vd, (long long)t->image_size,
             (long long)t->patch, (long long)w->tokens,
             t->channels_last ? ", channels-last patches" : "");
    return CELER_OK;
}

/* ==== Images ==== */

static int64_t gemma3_image_positions(const celer_model *m, const model_image_grid *g) {
    return g->n_tiles * ((const gemma3_weights *)m->weights)->tokens;
}

static int64_t gemma3_image_blocks(const celer_model *m, const model_image_grid *g) {
    (void)m;
    return g->n_tiles;
}

static int64_t gemma3_tile_positions(const celer_model *m) {
    return ((const gemma3_weights *)m->weights)->tokens;
}

static void gemma3_vision_sizes(const celer_model *m, int64_t tiles, model_vision_sizes *out) {
    const gemma3_weights *w = m->weights;
    const clip_tower *t = &w->tower;
    const int64_t rows = tiles * t->n_pos, td = m->dims.d, pooled = tiles * w->tokens;
    const int64_t cols = clip_max_cols(t);
    out->rows = rows;
    out->cols = td > cols ? td : cols;
    out->hd = t->hd;
    out->keys = t->n_pos;
    /* the tower's scratch, then its output [rows, vd] and the pooled rows [pooled, vd] */
    out->scratch_floats = clip_scratch_floats(t, tiles) + rows * t->vd + pooled * t->vd;
    out->tile_rows = t->n_pos;
    out->image_size = t->image_size;
}

/* The tiles' rows in order: each block of T rows is one tile's. */
static void gemma3_image_layout(const celer_model *m, const model_image_grid *g, int32_t *idx) {
    const int64_t n = gemma3_image_positions(m, g);
    for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)i;
}

static void gemma3_encode_image(const celer_model *m, backend *be, const float *pixels,
                                const model_image_grid *gr, int64_t tiles_per_call, float *scratch,
                                float *tiles, const int32_t *layout, float *out) {
    const gemma3_weights *w = m->weights;
    const clip_tower *t = &w->tower;
    const backend_ops *op = be->ops;
    const int64_t td = m->dims.d, vd = t->vd, T = w->tokens, px = 3 * t->image_size * t->image_size;
    float *feats = scratch + clip_scratch_floats(t, tiles_per_call);
    float *pooled = feats + tiles_per_call * t->n_pos * vd;
    (void)tiles, (void)layout; /* the layout is the tiles' order: rows go straight to out */
    for (int64_t t0 = 0; t0 < gr->n_tiles; t0 += tiles_per_call) {
        const int64_t n = gr->n_tiles - t0 < tiles_per_call ? gr->n_tiles - t0 : tiles_per_call;
        clip_forward(t, be, pixels + t0 * px, n, scratch, feats);
        op->avg_pool(be, pooled, feats, n, t->grid, w->pool, vd);
        op->rmsnorm(be, pooled, pooled, w->norm, n * T, vd, t->eps);
        op->matmul(be, out + t0 * T * td, &w->proj, pooled, n * T);
    }
}

static int32_t gemma3_image_token(const celer_model *m) {
    return ((const gemma3_weights *)m->weights)->image_token;
}

static void gemma3_image_wrap(const celer_model *m, int32_t *boi, int32_t *eoi) {
    const gemma3_weights *w = m->weights;
    *boi = w->boi, *eoi = w->eoi;
}

static const char *const gemma3_types[] = {"gemma3", NULL};

const model_family gemma3_family = {
    .model_types = gemma3_types,
    .load = gemma3_load,
};

/* The tower's and the projector's ops (the text model checks its own). */
static const model_op gemma3_ops[] = {
    MODEL_OP(layernorm), MODEL_OP(act),      MODEL_OP(attention_full),
    MODEL_OP(patches),   MODEL_OP(avg_pool), MODEL_OP(rmsnorm),
    {0, NULL},
};

const model_family gemma3_vision_family = {
    .model_types = gemma3_types,
    .ops = gemma3_ops,
    .load = gemma3_load,
    .processor = "gemma3",
    .image_token = gemma3_image_token,
    .image_wrap = gemma3_image_wrap,
    .image_positions = gemma3_image_positions,
    .image_blocks = gemma3_image_blocks,
    .tile_positions = gemma3_tile_positions,
    .vision_sizes = gemma3_vision_sizes,
    .image_layout = gemma3_image_layout,
    .encode_image = gemma3_encode_image,
};

/*
 * llava_next.c - LLaVA-NeXT (LLaVA 1.6), model_type llava_next: a CLIP vision tower
 * (clip.c), a two-layer projector, image_newline, and a text model of another family
 * (Mistral, Llama, Qwen2) that this wrapper owns.
 *
 * The wrapper has no forward of its own: model.c sends every contract entry point to the
 * text model, whose last-row path then runs unchanged. What it adds is the image side:
 * tiles -> tower -> selected hidden states -> projector, then the anyres layout exactly as
 * transformers' pack_image_features builds it (the base tile's features, then the grid of
 * tile features unpadded back to the image's aspect with image_newline after each row).
 * The merged rows replace the image placeholder tokens of a prompt (model_step rows with
 * token < 0).
 *
 * Checkpoint layouts, told apart by their tensor names: language_model.model.*,
 * language_model.lm_head, vision_tower[.vision_model].*, multi_modal_projector.*,
 * image_newline (transformers' save_pretrained, and mlx-vlm with channels-last patch
 * kernels and a quantized language model), and model.language_model.*, lm_head,
 * model.vision_tower[.vision_model].*, model.multi_modal_projector.*, model.image_newline
 * (transformers' in-memory names, which some conversions write).
 */
#include "models/clip.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct llava_weights {
    clip_tower tower;
    matview proj1, proj2;           /* [td, vd * layers], [td, td] */
    const float *proj1_b, *proj2_b; /* [td], [td] or NULL */
    const float *newline;           /* [td] */
    backend_act proj_act;
    bool drop_cls; /* vision_feature_select_strategy "default" */
    int32_t image_token;
    int64_t dims[3];
    bool flags[1];
} llava_weights;

enum llava_dim { DIM_TD, DIM_FEAT };
enum llava_flag { HAS_PROJ_BIAS };

static const weight_spec llava_proj_spec[] = {
    {"linear_1", WEIGHT_MATRIX, DIM_TD, DIM_FEAT, WEIGHT_ALWAYS, offsetof(llava_weights, proj1), 0,
     0},
    {"linear_1.bias", WEIGHT_VECTOR, DIM_TD, 0, HAS_PROJ_BIAS, offsetof(llava_weights, proj1_b), 0,
     0},
    {"linear_2", WEIGHT_MATRIX, DIM_TD, DIM_TD, WEIGHT_ALWAYS, offsetof(llava_weights, proj2), 0,
     0},
    {"linear_2.bias", WEIGHT_VECTOR, DIM_TD, 0, HAS_PROJ_BIAS, offsetof(llava_weights, proj2_b), 0,
     0},
};
static const weight_spec llava_newline_spec[] = {
    {"image_newline", WEIGHT_VECTOR, DIM_TD, 0, WEIGHT_ALWAYS, offsetof(llava_weights, newline), 0,
     0},
};

/* ==== Loading ==== */

/* Defaults of the transformers config classes for keys a text_config may leave out
 * (checkpoints written by older transformers store only what differs). */
typedef struct config_default {
    const char *key;
    double value;
} config_default;

static const config_default llama_defaults[] = {
    {"vocab_size", 32000},        {"hidden_size", 4096},
    {"intermediate_size", 11008}, {"num_hidden_layers", 32},
    {"num_attention_heads", 32},  {"max_position_embeddings", 2048},
    {"rms_norm_eps", 1e-6},       {NULL, 0}};
static const config_default mistral_defaults[] = {{"vocab_size", 32000},
                                                  {"hidden_size", 4096},
                                                  {"intermediate_size", 14336},
                                                  {"num_hidden_layers", 32},
                                                  {"num_attention_heads", 32},
                                                  {"num_key_value_heads", 8},
                                                  {"max_position_embeddings", 131072},
                                                  {"rms_norm_eps", 1e-6},
                                                  {"sliding_window", 4096},
                                                  {NULL, 0}};
static const config_default qwen2_defaults[] = {{"vocab_size", 151936},
                                                {"hidden_size", 4096},
                                                {"intermediate_size", 22016},
                                                {"num_hidden_layers", 32},
                                                {"num_attention_heads", 32},
                                                {"num_key_value_heads", 32},
                                                {"max_position_embeddings", 32768},
                                                {"rms_norm_eps", 1e-6},
                                                {NULL, 0}};

/* A copy of text_config with the defaults of its model_type filled in (owned by m). */
static celer_status text_config(celer_model *m, const json_t **out, celer_error *e) {
    const checkpoint *ck = &m->ck;
    const json_t *tc = json_object_get(m->cfg, "text_config");
    json_t *c = tc && json_is_object(tc) ? json_deep_copy(tc) : json_object();
    if (!c) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    m->owned_json = c;
    if (!json_object_get(c, "model_type"))
        json_object_set_new(c, "model_type", json_string("llama"));
    const char *type = json_string_value(json_object_get(c, "model_type"));
    const config_default *d = !type                      ? NULL
                              : !strcmp(type, "llama")   ? llama_defaults
                              : !strcmp(type, "mistral") ? mistral_defaults
                              : !strcmp(type, "qwen2")   ? qwen2_defaults
                                                         : NULL;
    if (!d)
        return error_set(e, CELER_STATUS_UNSUPPORTED,
                         "%s: text_config.model_type: expected llama, mistral or qwen2, found %s",
                         ck->config_path, type ? type : "a non-string");
    for (; d->key; d++)
        if (!json_object_get(c, d->key))
            json_object_set_new(c, d->key,
                                d->value == (double)(json_int_t)d->value
                                    ? json_integer((json_int_t)d->value)
                                    : json_real(d->value));
    /* a sliding_window the config sets to null means none (transformers' Mistral) */
    if (json_is_null(json_object_get(c, "sliding_window")))
        json_object_set_new(c, "sliding_window", json_integer(0));
    /* the top-level eos, as LLaVA configs often keep it there */
    if (!json_object_get(c, "eos_token_id") && json_object_get(m->cfg, "eos_token_id"))
        json_object_set(c, "eos_token_id", json_object_get(m->cfg, "eos_token_id"));
    *out = c;
    return CELER_OK;
}

/* The layout's prefixes: text-model renames, vision tower, projector, newline. */
typedef struct llava_layout {
    name_rule text[2];
    int n_text;
    const char *tower, *proj, *newline;
} llava_layout;

static celer_status detect_layout(const celer_model *m, llava_layout *lay, celer_error *e) {
    static const char *const towers[] = {"vision_tower.vision_model.", "vision_tower.",
                                         "model.vision_tower.vision_model.", "model.vision_tower.",
                                         NULL};
    static const char *const projs[] = {"multi_modal_projector.", "model.multi_modal_projector.",
                                        NULL};
    static const char *const newlines[] = {"", "model.", NULL};
    memset(lay, 0, sizeof *lay);
    celer_status s = model_text_layout(m, &lay->text[0], e);
    if (s != CELER_OK) return s;
    lay->n_text = 1;
    lay->tower = model_probe_prefix(m, towers, "embeddings.patch_embedding.weight");
    lay->proj = model_probe_prefix(m, projs, "linear_1.weight");
    lay->newline = model_probe_prefix(m, newlines, "image_newline");
    if (!lay->tower)
        return error_set(
            e, CELER_STATUS_BAD_FILE,
            "%s: missing tensor vision_tower.vision_model.embeddings.patch_embedding.weight",
            m->ck.dir);
    if (!lay->proj)
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: missing tensor multi_modal_projector.linear_1.weight", m->ck.dir);
    if (!lay->newline)
        return error_set(e, CELER_STATUS_BAD_FILE, "%s: missing tensor image_newline", m->ck.dir);
    return CELER_OK;
}

static celer_status llava_load(celer_model *m, celer_error *e) {
    const checkpoint *ck = &m->ck;
    const json_t *cfg = m->cfg;
    celer_status s;
    llava_layout lay;
    const json_t *tcfg = NULL;
    int64_t image_token;
    bool proj_bias;
    const char *strategy, *proj_act;
#define TRY(x)                                                                                     \
    do {                                                                                           \
        if ((s = (x)) != CELER_OK) return s;                                                       \
    } while (0)
    TRY(detect_layout(m, &lay, e));
    TRY(text_config(m, &tcfg, e));
    /* image_token_index (older) or image_token_id (newer) */
    TRY(config_int(ck, cfg, "image_token_index", -1, &image_token, e));
    if (image_token < 0) TRY(config_int(ck, cfg, "image_token_id", 32000, &image_token, e));
    TRY(config_bool(ck, cfg, "multimodal_projector_bias", true, &proj_bias, e));
    TRY(config_str(ck, cfg, "vision_feature_select_strategy", &strategy, e));
    TRY(config_str(ck, cfg, "projector_hidden_act", &proj_act, e));

    llava_weights *w = arena_alloc(&m->mem, sizeof *w);
    if (!w) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    memset(w, 0, sizeof *w);
    m->weights = w;
    /* "full" keeps each tile's class token, so a tile's features are not a grid of
     * patches and the anyres layout cannot place them: transformers' LlavaNext fails on
     * every such image (its view over the tiles does not fit). Refused here, clearly. */
    if (strategy && !strcmp(strategy, "full"))
        return error_set(e, CELER_STATUS_UNSUPPORTED,
                         "%s: vision_feature_select_strategy \"full\" with anyres tiles: the class "
                         "token of each tile "
                         "leaves no grid to lay out (transformers' LlavaNext cannot run it "
                         "either); expected default",
                         ck->config_path);
    if (strategy && strcmp(strategy, "default") != 0)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: vision_feature_select_strategy: expected default or full, found %s",
                         ck->config_path, strategy);
    w->drop_cls = true;
    TRY(model_act_parse(ck, "projector_hidden_act", proj_act, BACKEND_ACT_GELU_ERF, &w->proj_act,
                        e));

    /* the text model: another family over the same checkpoint, its names renamed */
    TRY(model_load_text(m, tcfg, lay.text, lay.n_text, e));
    if (image_token >= m->dims.v)
        return error_set(e, CELER_STATUS_BAD_CONFIG,
                         "%s: image_token_index %lld outside the vocabulary of %lld",
                         ck->config_path, (long long)image_token, (long long)m->dims.v);
    w->image_token = (int32_t)image_token;

    TRY(clip_load(m, json_object_get(cfg, "vision_config"), CLIP_VIT,
                  json_object_get(cfg, "vision_feature_layer"), false, lay.tower, &w->tower, e));
    if (w->tower.kind != CLIP_VIT)
        return error_set(e, CELER_STATUS_UNSUPPORTED,
                         "%s: vision_config.model_type: expected clip_vision_model, found %s",
                         ck->config_path,
                         json_string_value(
                             json_object_get(json_object_get(cfg, "vision_config"), "model_type")));
    w->dims[DIM_TD] = m->dims.d;
    w->dims[DIM_FEAT] = clip_feature_cols(&w->tower);
    w->flags[HAS_PROJ_BIAS] = proj_bias;
    model_add_table(m, &(weight_table){.spec = llava_proj_spec,
                                       .n_spec = 4,
                                       .base = w,
                                       .count = 1,
                                       .prefix = lay.proj,
                                       .dims = w->dims,
                                       .flags = w->flags});
    model_add_table(m, &(weight_table){.spec = llava_newline_spec,
                                       .n_spec = 1,
                                       .base = w,
                                       .count = 1,
                                       .prefix = lay.newline,
                                       .dims = w->dims,
                                       .flags = w->flags});
    TRY(model_bind(m, e));
    TRY(clip_finish(m, &w->tower, e));
#undef TRY
    const clip_tower *ct = &w->tower;
    snprintf(m->desc, sizeof m->desc,
             "llava_next: %.160s; CLIP %lld layers (%lld run), d=%lld, %lldpx/%lld%s",
             m->text->desc, (long long)ct->n_layer, (long long)ct->n_run, (long long)ct->vd,
             (long long)ct->image_size, (long long)ct->patch,
             ct->channels_last ? ", channels-last patches" : "");
    return CELER_OK;
}

/* ==== Images ==== */

static int64_t llava_tile_features(const llava_weights *w) {
    return w->tower.n_pos - (w->drop_cls ? 1 : 0);
}

static int64_t llava_image_positions(const celer_model *m, const model_image_grid *g) {
    const llava_weights *w = m->weights;
    const int64_t base = llava_tile_features(w);
    if (g->n_tiles <= 1) return base + 1; /* one tile: its features and one newline */
    return base + g->unpadded_h * (g->unpadded_w + 1);
}

static void llava_vision_sizes(const celer_model *m, int64_t tiles, model_vision_sizes *out) {
    const llava_weights *w = m->weights;
    const clip_tower *t = &w->tower;
    const int64_t rows = tiles * t->n_pos, td = m->dims.d, fc = clip_feature_cols(t);
    int64_t cols = clip_max_cols(t);
    if (fc > cols) cols = fc;
    if (td > cols) cols = td;
    out->rows = rows;
    out->cols = cols;
    out->hd = t->hd;
    out->keys = t->n_pos;
    /* the tower's scratch, then its features [rows, fc] and the projector's two
     * outputs [rows, td] */
    out->scratch_floats = clip_scratch_floats(t, tiles) + rows * (fc + 2 * td);
    out->tile_rows = t->n_pos;
    out->image_size = t->image_size;
}

/* idx[positions] = the anyres layout of an image's tile features (rows of tiles[n_tiles *
 * per, td], per = features of a tile): base tile first, then the grid of tiles as one
 * feature map [grid_rows * g, grid_cols * g], cropped to the unpadded window (centred, as
 * transformers' unpad_image cuts it), -1 (image_newline) after every row. */
static void llava_image_layout(const celer_model *m, const model_image_grid *gr, int32_t *idx) {
    const llava_weights *w = m->weights;
    const int64_t per = llava_tile_features(w), g = w->tower.grid;
    CELER_ASSERT(gr->unpadded_h <= gr->grid_rows * g && gr->unpadded_w <= gr->grid_cols * g);
    int64_t k = 0;
    for (int64_t i = 0; i < per; i++) idx[k++] = (int32_t)i;
    if (gr->n_tiles <= 1) {
        idx[k] = -1;
        return;
    }
    const int64_t full_h = gr->grid_rows * g, full_w = gr->grid_cols * g;
    const int64_t top = (full_h - gr->unpadded_h) / 2, left = (full_w - gr->unpadded_w) / 2;
    const int64_t skip = per - g * g; /* a kept class token comes first in each tile */
    for (int64_t y = top; y < top + gr->unpadded_h; y++) {
        for (int64_t x = left; x < left + gr->unpadded_w; x++) {
            const int64_t tile = 1 + (y / g) * gr->grid_cols + x / g;
            idx[k++] = (int32_t)(tile * per + (y % g) * g + x % g + skip);
        }
        idx[k++] = -1;
    }
}

static void llava_encode_image(const celer_model *m, backend *be, const float *pixels,
                               const model_image_grid *gr, int64_t tiles_per_call, float *scratch,
                               float *tiles, const int32_t *layout, float *out) {
    const llava_weights *w = m->weights;
    const clip_tower *t = &w->tower;
    const int64_t td = m->dims.d, fc = clip_feature_cols(t), np = t->n_pos,
                  per = llava_tile_features(w);
    const int64_t px = 3 * t->image_size * t->image_size;
    float *feats = scratch + clip_scratch_floats(t, tiles_per_call);
    float *h1 = feats + tiles_per_call * np * fc, *proj = h1 + tiles_per_call * np * td;
    for (int64_t t0 = 0; t0 < gr->n_tiles; t0 += tiles_per_call) {
        const int64_t n = gr->n_tiles - t0 < tiles_per_call ? gr->n_tiles - t0 : tiles_per_call,
                      rows = n * np;
        clip_forward(t, be, pixels + t0 * px, n, scratch, feats);
        model_linear(be, h1, &w->proj1, w->proj1_b, feats, rows);
        be->ops->act(be, h1, h1, rows * td, w->proj_act);
        model_linear(be, proj, &w->proj2, w->proj2_b, h1, rows);
        /* the positions read: all of them, or all but each tile's class token */
        for (int64_t i = 0; i < n; i++)
            be->ops->copy_rows(be, tiles + (t0 + i) * per * td, td,
                               proj + (i * np + (np - per)) * td, td, per, td);
    }
    be->ops->gather_rows(be, out, tiles, layout, w->newline, llava_image_positions(m, gr), td);
}

static int64_t llava_tile_positions(const celer_model *m) {
    return llava_tile_features(m->weights);
}

static int32_t llava_image_token(const celer_model *m) {
    return ((const llava_weights *)m->weights)->image_token;
}

static const char *const llava_types[] = {"llava_next", NULL};

/* The vision tower's and the projector's ops (the text model checks its own). */
static const model_op llava_ops[] = {
    MODEL_OP(layernorm), MODEL_OP(act),         MODEL_OP(attention_full),
    MODEL_OP(patches),   MODEL_OP(gather_rows), {0, NULL},
};

const model_family llava_next_family = {
    .model_types = llava_types,
    .ops = llava_ops,
    .load = llava_load,
    .processor = "llava_next",
    .image_token = llava_image_token,
    .image_positions = llava_image_positions,
    .tile_positions = llava_tile_positions,
    .vision_sizes = llava_vision_sizes,
    .image_layout = llava_image_layout,
    .encode_image = llava_encode_image,
};

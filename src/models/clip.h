/*
 * clip.h - the ViT vision towers of vision-language models, in two kinds that differ only
 * in options: CLIP (LLaVA-NeXT: a class token, pre_layrnorm, quick-GELU, the hidden states
 * of the layers the model selects by vision_feature_layer) and SigLIP (Gemma 3: no class
 * token, a bias on the patch convolution, GELU-tanh, the last layer's output through
 * post_layernorm). Both: patch embedding as a convolution, learned position embeddings,
 * pre-norm encoder layers (LayerNorm with bias, attention over all positions of a tile, an
 * MLP with biases).
 *
 * It runs every tile of a batch as its own attention segment, on the backend ops, and
 * stops after the last layer anybody reads. It knows nothing of projectors, image
 * layouts or text models (llava_next.c, gemma3.c).
 */
#ifndef CELER_MODELS_CLIP_H
#define CELER_MODELS_CLIP_H

#include "models/model.h"

#define CLIP_MAX_FEATURE_LAYERS 8

typedef struct clip_layer {
    const float *ln1_w, *ln1_b; /* [vd] */
    attn_block attn;            /* q, k, v, o [vd, vd] with biases [vd] */
    const float *ln2_w, *ln2_b; /* [vd] */
    matview fc1, fc2;           /* [vf, vd], [vd, vf] */
    const float *b1, *b2;       /* [vf], [vd] */
} clip_layer;

typedef enum clip_kind {
    CLIP_VIT,    /* clip_vision_model */
    CLIP_SIGLIP, /* siglip_vision_model */
} clip_kind;

typedef struct clip_tower {
    clip_kind kind;
    int64_t vd, vf, h, hd;           /* hidden, MLP, heads, head dim */
    int64_t image_size, patch, grid; /* grid = image_size / patch */
    int64_t lead;                    /* rows before a tile's patches: 1 (CLIP's class token) or 0 */
    int64_t n_pos;                   /* grid * grid + lead: rows of one tile */
    int64_t n_layer;                 /* layers in the checkpoint */
    int64_t n_run;                   /* layers run: the deepest selected one */
    int64_t feature[CLIP_MAX_FEATURE_LAYERS]; /* selected hidden states, 0 = embeddings */
    int n_feature;
    float eps, scale;
    backend_act act;
    bool channels_last;           /* patch weights [vd, p, p, 3] (mlx-vlm), else [vd, 3, p, p] */
    matview patch_w;              /* [vd, 3 p p] */
    const float *patch_b;         /* [vd] (SigLIP) or NULL */
    const float *class_emb;       /* [vd] (CLIP) or NULL */
    matview pos_emb;              /* [n_pos, vd] */
    const float *pos;             /* [n_pos, vd] fp32; the class embedding (row 0) or the patch
                                     bias (every row) folded in */
    const float *pre_w, *pre_b;   /* [vd] (CLIP's pre_layrnorm) or NULL */
    const float *post_w, *post_b; /* [vd] post_layernorm, read only with the tower's output */
    clip_layer *layers;           /* [n_layer] (only n_run are bound) */
    const char *prefix;           /* tensor names: prefix + "embeddings...", in m->mem */
    int64_t dims[5];
    bool flags[4];
} clip_tower;

/* Reads vcfg (a CLIPVisionConfig or SiglipVisionConfig block by its model_type, kind when
 * it names none; transformers' defaults where keys are missing) and adds the tower's
 * weight tables (names under prefix, e.g. "vision_tower.vision_model.") to m. The tower
 * gives feature_layer's hidden states (an index into hidden_states, negative from the end,
 * or a list of them), or with feature_layer NULL and output set, the last layer's output
 * through post_layernorm (what SiglipVisionModel returns as last_hidden_state). Binding
 * happens in model_bind; then call clip_finish. */
celer_status clip_load(celer_model *m, const json_t *vcfg, clip_kind kind,
                       const json_t *feature_layer, bool output, const char *prefix, clip_tower *t,
                       celer_error *e);
/* After model_bind: the patch layout from the bound shapes, the fp32 position rows. */
celer_status clip_finish(celer_model *m, clip_tower *t, celer_error *e);

/* Columns of one feature row: vd times the number of selected layers. */
static inline int64_t clip_feature_cols(const clip_tower *t) {
    return t->vd * t->n_feature;
}

/* Floats of scratch clip_forward needs for n_tiles tiles. */
int64_t clip_scratch_floats(const clip_tower *t, int64_t n_tiles);
/* Largest row width any op of the tower sees (for sizing a backend). */
int64_t clip_max_cols(const clip_tower *t);

/* feats[n_tiles * n_pos, clip_feature_cols] = the selected hidden states of every position
 * (a class token first) of the tiles pixels[n_tiles, 3, image_size, image_size]. */
void clip_forward(const clip_tower *t, backend *be, const float *pixels, int64_t n_tiles,
                  float *scratch, float *feats);

#endif

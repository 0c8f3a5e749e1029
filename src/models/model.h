/*
 * model.h - a loaded model and the model contract (docs/architecture.md, "The model contract") at
 * the level below the engine: each entry point runs the family's one hidden_states body over a
 * prepared step, then the LM head on exactly the rows somebody reads.
 *
 * The engine owns the KV cache and plans each step (positions, cache slots, block
 * tables); model code only reads that plan. Family files (llama.c) provide the weights
 * and the forward body; this file dispatches on model_type.
 */
#ifndef CELER_MODELS_MODEL_H
#define CELER_MODELS_MODEL_H

#include "backend/backend.h"
#include "base/arena.h"
#include "base/error.h"
#include "io/checkpoint.h"

#include <pthread.h>
#include <stddef.h>

/* Shapes every family shares (docs/architecture.md, "Names and shapes"). */
typedef struct model_dims {
    int64_t v, d, n_layer, h, hk, hd, f;
    int64_t n_ctx_train;
} model_dims;

/* One planned step of n rows (n <= the context's n_batch), every array in backend
 * memory. */
typedef struct model_step {
    int64_t n;
    const int32_t *token;  /* [n], or NULL: every row is an embedding row */
    const float *embd;     /* [n, d]: row r is read when token is NULL or token[r] < 0 */
    const int32_t *pos;    /* [n] position of each row in its sequence */
    const int32_t *limit;  /* [n] the last position each row's attention sees (an image block's
                              rows see the whole block, m->image_blocks), or NULL: its own */
    const int32_t *slot;   /* [n] cache slot each row's K/V goes to */
    const int32_t *seq;    /* [n] row of tables holding each row's sequence's block table */
    const int32_t *tables; /* [*, table_cols] */
    int64_t table_cols;
    int64_t block_size;
    int64_t seqs; /* distinct sequences among the rows (0 where not counted) */
    int64_t keys; /* the largest position (or limit) among the rows + 1 */
} model_step;

/* The KV cache pools, one [n_slots, hk*hd] pair per layer. */
typedef struct model_kv {
    void *const *k; /* fp16 or fp32, as the backend was created */
    void *const *v;
} model_kv;

typedef struct model_family model_family;

/* ==== Weight tables (docs/architecture.md: a family is a table) ====
 *
 * A family describes its weights once, as tables; the same tables drive binding at load,
 * the parameter count and the list of matrices the fast kernels repack. Names are the
 * canonical (transformers) ones; a model's name map rewrites them for other checkpoint
 * layouts (mlx-vlm, newer transformers) before lookup. */

typedef enum weight_kind {
    WEIGHT_MATRIX,     /* module.weight (+ .scales/.biases when affine) -> matview */
    WEIGHT_VECTOR,     /* one tensor -> const float * (fp32 copy) */
    WEIGHT_KERNEL,     /* module.weight, a dense convolution kernel [rows, ...] -> matview [rows,
                          prod(...)] */
    WEIGHT_PART,       /* rows [first, first + rows) of a matrix stored fused with others (Phi-3's
                        * qkv_proj, gate_up_proj) of total rows -> matview of its own */
    WEIGHT_TRANSPOSED, /* a dense parameter stored [cols, rows] (a product x @ W, Gemma 3's
                        * mm_input_projection_weight) -> matview [rows, cols], transposed once
                        * at load into m->mem */
} weight_kind;

#define WEIGHT_ALWAYS   (-1) /* required */
#define WEIGHT_OPTIONAL (-2) /* bound when the checkpoint has it */

typedef struct weight_spec {
    const char *name; /* after the table's prefix: a module (matrix) or a tensor (vector) */
    weight_kind kind;
    int8_t rows, cols;   /* indices into the table's dims; a vector has dims[rows] values */
    int8_t when;         /* WEIGHT_ALWAYS, WEIGHT_OPTIONAL, or i: present iff flags[i] */
    size_t offset;       /* of the matview or const float * in the struct it fills */
    int8_t first, total; /* WEIGHT_PART: indices into the table's dims */
} weight_spec;

typedef struct weight_table {
    const weight_spec *spec;
    int64_t n_spec;
    void *base;    /* the first struct the offsets point into */
    int64_t count; /* structs (1, or one per layer) stride bytes apart */
    size_t stride;
    const char *prefix; /* names are prefix + (count > 1 or indexed: "<i>.") + spec name */
    bool indexed;
    const int64_t *dims;
    const bool *flags;
} weight_table;

#define MODEL_MAX_TABLES     8
#define MODEL_MAX_PREPARED   4
#define MODEL_MAX_RENAMES    4
#define MODEL_MAX_ROPE_KINDS 4

/* A checkpoint layout: the first rule whose from is a prefix of a canonical name
 * replaces that prefix by to. */
typedef struct name_rule {
    const char *from, *to;
} name_rule;

#define CELER_MAX_EOS 8

struct celer_model {
    const model_family *family;
    checkpoint ck;
    bool borrowed_ck;  /* ck belongs to an outer model (a VLM's text model) */
    const json_t *cfg; /* the config object this model reads (config.json or a sub-block) */
    name_rule rename[MODEL_MAX_RENAMES];
    int n_rename;
    model_dims dims;
    int32_t eos[CELER_MAX_EOS]; /* end-of-sequence ids from config.json */
    int n_eos;
    char desc[256];
    arena mem;     /* weight structs, RoPE frequencies, names */
    arena vectors; /* every weight vector an op reads (fp32): a backend mirrors this arena */
    void *weights; /* the family's weight struct */
    weight_table tables[MODEL_MAX_TABLES];
    int n_tables;
    celer_model *text;  /* a vision-language model's text model, or NULL */
    json_t *owned_json; /* config built at load (a text_config with defaults), or NULL */
    bool attn_softcap;  /* some layer soft-caps attention scores (the backend must) */
    bool image_blocks;  /* at prefill the rows of an image block attend to the whole block
                           (Gemma 3; model_step.limit, the backend's attention_limit) */
    int rope_kinds; /* distinct rope_params the forward passes (kinds of layer, short and long) */
    int32_t n_mats; /* matrices numbered 1..n_mats (matview.id), the text model's included */
    /* Backends' prepared copies of the weights, one per class and device, made once by
     * model_prepare and shared by every context. */
    pthread_mutex_t prep_mu;
    struct model_prepared {
        const backend_class *cls;
        int device;
        backend_weights *w;
    } prepared[MODEL_MAX_PREPARED];
    int n_prepared;
    bool sources_pinned;    /* a backend reads the weights in place: prepares keep the sources */
    int64_t released_bytes; /* of the weights' sources, what the last prepare let go */
};

/* The tiles of one image and where their features go (see vision.h for how an image
 * becomes tiles): the base image, then grid_rows x grid_cols tiles row-major, whose
 * feature map keeps unpadded_h x unpadded_w positions. */
typedef struct model_image_grid {
    int64_t n_tiles;
    int64_t grid_rows, grid_cols;
    int64_t unpadded_h, unpadded_w;
} model_image_grid;

/* What a backend running a vision tower must hold, for a number of tiles per call. */
typedef struct model_vision_sizes {
    int64_t rows, cols, hd, keys; /* rows per op, widest row, head dim, attention span */
    int64_t scratch_floats;
    int64_t tile_rows;  /* encoder positions per tile */
    int64_t image_size; /* tile side in pixels */
} model_vision_sizes;

struct model_family {
    const char *const *model_types; /* NULL-terminated */
    /* Reads m->cfg, fills m->dims, m->weights and m->tables, then calls model_bind. */
    celer_status (*load)(celer_model *m, celer_error *e);
    /* Floats of activation scratch hidden_states needs for n rows. */
    int64_t (*scratch_floats)(const celer_model *m, int64_t n);
    /* hidden[n, d] = final-normed hidden states of the step's rows. */
    void (*hidden_states)(const celer_model *m, backend *be, const model_step *step,
                          const model_kv *kv, float *scratch, float *hidden);
    const matview *(*embedding)(const celer_model *m);
    /* The LM head matrix [v, d] (the embedding table when tied). */
    const matview *(*head)(const celer_model *m);
    /* Multiplies every logit (Cohere's logit_scale), or 0 for none. */
    float (*logit_scale)(const celer_model *m);
    /* Soft-caps every logit after that: cap * tanh(logit / cap) (Gemma 2), or 0 for none. */
    float (*logit_softcap)(const celer_model *m);
    /* Multiplies the embedding rows of token ids (Gemma's sqrt(d)), or 0 for none;
     * embedding rows a caller passes in (image features) are taken as they are. */
    float (*embed_scale)(const celer_model *m);
    /* Ops beyond model_common_ops that the forward calls (NULL-terminated list, or NULL). */
    const struct model_op *ops;

    /* Vision-language families (NULL otherwise); the text entry points go to m->text. */
    /* The processor whose prompts and pixels the family follows: "llava_next", "gemma3". */
    const char *processor;
    int32_t (*image_token)(const celer_model *m);
    /* The ids that wrap each image block in a prompt's text (Gemma 3's start and end of
     * image, which the processor puts around the image token), or NULL: none. */
    void (*image_wrap)(const celer_model *m, int32_t *boi, int32_t *eoi);
    /* Prompt positions of an image laid out as g. */
    int64_t (*image_positions)(const celer_model *m, const model_image_grid *g);
    /* Image tokens an image laid out as g takes in a prompt (its blocks: Gemma 3's whole
     * image and pan-and-scan crops), each standing for image_positions / blocks rows; NULL:
     * one. */
    int64_t (*image_blocks)(const celer_model *m, const model_image_grid *g);
    /* Positions each tile contributes before the layout (tiles buffer rows per tile). */
    int64_t (*tile_positions)(const celer_model *m);
    void (*vision_sizes)(const celer_model *m, int64_t tiles_per_call, model_vision_sizes *out);
    /* idx[positions] (host memory) = where each of an image's rows comes from: a row of
     * the tile features encode_image makes, or -1 for a row of the family's own */
    void (*image_layout)(const celer_model *m, const model_image_grid *g, int32_t *idx);
    /* out[positions, d] = the rows that replace an image's placeholder tokens, from
     * pixels[n_tiles, 3, s, s], tiles_per_call at a time, laid out by layout[positions]
     * (image_layout's); tiles[n_tiles * tile_positions, d] and scratch (vision_sizes) are
     * work space. Every buffer is backend memory. */
    void (*encode_image)(const celer_model *m, backend *be, const float *pixels,
                         const model_image_grid *g, int64_t tiles_per_call, float *scratch,
                         float *tiles, const int32_t *layout, float *out);
};

/* The family that runs model_type, or NULL. */
const model_family *model_family_for(const char *type);
/* "llama, mistral, ..." : every model_type a family runs, for errors. */
void model_types_known(char *out, size_t size);

/* The rename rule of a vision-language checkpoint's text model: transformers >= 4.52
 * (model.language_model.*) or the original names (language_model.model.*). */
celer_status model_text_layout(const celer_model *m, name_rule *rule, celer_error *e);
/* m->text = the family of tcfg's model_type over m's checkpoint, its names renamed by
 * rules[n_rules]; m takes the text model's dims and end-of-sequence ids. tcfg must live as
 * long as m (m->owned_json). */
celer_status model_load_text(celer_model *m, const json_t *tcfg, const name_rule *rules,
                             int n_rules, celer_error *e);

/* An op of backend_ops a forward calls, by its place in the table, with its name. */
typedef struct model_op {
    size_t offset;
    const char *name;
} model_op;
#define MODEL_OP(field)                                                                            \
    { offsetof(backend_ops, field), #field }

/* Whether be runs every op m's forward calls (the text model's included); else one line
 * naming the first op it lacks. Checked before a context is made, so a model a backend
 * cannot run is refused at load instead of failing inside a step. */
celer_status model_check_backend(const celer_model *m, const backend *be, celer_error *e);

/* Binds every weight of m->tables, checking names, dtypes and shapes. */
celer_status model_bind(celer_model *m, celer_error *e);

/* Adds a table to m (at most MODEL_MAX_TABLES). */
void model_add_table(celer_model *m, const weight_table *t);

/* The checkpoint name of canonical name (after m's layout rules) in out[size]. */
const char *model_tensor_name(const celer_model *m, const char *canonical, char *out, size_t size);

/* Parameters and stored bytes of every bound weight (a VLM's text model included). */
void model_count(const celer_model *m, int64_t *params, int64_t *bytes);

/* Stored bytes of one weight view (codes + scales + biases, or dense data). */
int64_t matview_bytes(const matview *w);

/* Opens dir, reads config.json and binds every weight; *out NULL on failure. size: the bytes
 * to allocate, sizeof(celer_model) or a caller's struct that begins with one (the engine's
 * adds what it reads beside the weights; model_close frees the whole block). */
celer_status model_open(const char *dir, size_t size, celer_model **out, celer_error *e);
void model_close(celer_model *m);

/* *out = cls's prepared copy of m's weights for p->device, made on the first call and
 * shared afterwards (safe from several threads); NULL when cls reads the weights where
 * they lie. Once a copy is made, the pages of the sources it holds are let go: the file's,
 * and the converted GGUF matrices' (converted again before the next prepare). */
celer_status model_prepare(celer_model *m, const backend_class *cls, const backend_params *p,
                           const backend_weights **out, celer_error *e);
/* For a backend that reads the weights where they lie: every source back in memory (see
 * model_prepare), and kept there by later prepares. */
void model_keep_sources(celer_model *m);
/* Bytes of every prepared copy and the milliseconds making them took. */
void model_prepared_info(const celer_model *m, int64_t *bytes, double *ms);
/* Bytes of the checkpoint's weights still resident for backends that read them in place:
 * all of them less the sources every prepared copy let go. */
int64_t model_resident_source_bytes(celer_model *m);

/* The distinct RoPE parameter sets the forward passes (at least 1). */
int model_rope_kinds(const celer_model *m);

/* Floats of activation scratch the entry points need for n rows. */
int64_t model_scratch_floats(const celer_model *m, int64_t n);

/* hidden[n, d] for every row (no head). */
void model_hidden_states(const celer_model *m, backend *be, const model_step *step,
                         const model_kv *kv, float *scratch, float *hidden);
/* The entry points below return the rows the LM head ran on. */

/* logits[n, v] for every row. hidden is [n, d] scratch. */
int64_t model_forward(const celer_model *m, backend *be, const model_step *step, const model_kv *kv,
                      float *scratch, float *hidden, float *logits);
/* logits[v] of row last_pos only: the head sees one row. */
int64_t model_forward_last_logits(const celer_model *m, backend *be, const model_step *step,
                                  const model_kv *kv, float *scratch, float *hidden,
                                  int64_t last_pos, float *logits);
/* logits[k, v] for the k rows with want[r] != 0, in order; returns k. */
int64_t model_forward_rows(const celer_model *m, backend *be, const model_step *step,
                           const model_kv *kv, float *scratch, float *hidden, const int8_t *want,
                           float *logits);
/* embd[n, d] = the embedding rows of ids. */
void model_embed(const celer_model *m, backend *be, const int32_t *ids, int64_t n, float *embd);

/* Reads eos_token_id (an id or a list of ids) from config.json into m->eos. */
celer_status model_read_eos(celer_model *m, celer_error *e);

/* ==== Pieces shared by the text families ==== */

/* m->dims from m->cfg: hidden_size, intermediate_size, num_attention_heads,
 * num_hidden_layers, vocab_size (required); num_key_value_heads, head_dim,
 * max_position_embeddings (defaults); checks that heads divide and head_dim is even. */
celer_status model_read_dims(celer_model *m, celer_error *e);

/* RoPE frequencies from m->cfg (rope_theta and rope_scaling, or transformers 5's
 * rope_parameters), following transformers' modeling_rope_utils; tables in m->mem. */
celer_status model_read_rope(celer_model *m, bool traditional, rope_params *out, celer_error *e);

/* Phi-3's longrope: inv_freq = 1 / (factor[i] theta^(2i/dims)) with the short and the
 * long factor lists of scaling, cos and sin times the attention factor (given, else
 * sqrt(1 + ln(max / orig) / ln(orig))); *orig = original_max_position_embeddings, past
 * which a step takes the long factors. Counts two kinds in m->rope_kinds. */
celer_status model_read_longrope(celer_model *m, const json_t *scaling, double theta, int64_t dims,
                                 rope_params *short_rp, rope_params *long_rp, int64_t *orig,
                                 celer_error *e);

/* RoPE of dims rotated values a head (<= hd, even) with base theta and the scaling block
 * scaling (rope_scaling's keys: rope_type or type, factor, ...; NULL or "default": none),
 * for families whose layers differ (Gemma 3's local and global layers) or rotate part of
 * a head (Phi-3's partial_rotary_factor). Counts a kind in m->rope_kinds. */
celer_status model_rope_from(celer_model *m, const json_t *scaling, double theta, int64_t dims,
                             bool traditional, rope_params *out, celer_error *e);

/* x[n, d] = the step's input rows: token rows looked up in the embedding table,
 * embedding rows copied (a row is an embedding row when token is NULL or token[r] < 0). */
void model_embed_step(const celer_model *m, backend *be, const model_step *st, float *x);

/* *out = the activation Hugging Face calls name (silu, gelu, gelu_pytorch_tanh, gelu_new,
 * quick_gelu), or def where name is NULL; else one line naming key (the config field). */
celer_status model_act_parse(const checkpoint *ck, const char *key, const char *name,
                             backend_act def, backend_act *out, celer_error *e);

/* sliding[n_layer]: whether each layer attends through a sliding window, from m->cfg's
 * layer_types ("sliding_attention" or "full_attention") where present, else from
 * sliding_window_pattern (default_pattern where absent): every pattern-th layer
 * (counting from 1) global, the others sliding. */
celer_status model_layer_kinds(celer_model *m, int64_t default_pattern, bool *sliding,
                               celer_error *e);

/* y[n, w.rows] = x[n, w.cols] @ W^T (+ b[w.rows] when b is set). */
void model_linear(backend *be, float *y, const matview *w, const float *b, const float *x,
                  int64_t n);

/* The attention block of one layer (the weights a family's table binds, and the layer's
 * options). */
typedef struct attn_block {
    matview wq, wk, wv, wo;         /* [h*hd, d], [hk*hd, d], [hk*hd, d], [d, h*hd] */
    const float *bq, *bk, *bv, *bo; /* [h*hd], [hk*hd], [hk*hd], [d] or NULL */
    const float *q_norm, *k_norm;   /* [hd]: RMSNorm of each head of q and k before RoPE, or NULL */
    float norm_eps;                 /* of q_norm and k_norm */
    float softcap;                  /* scores soft-capped (Gemma 2), 0 = none */
    int64_t window;                 /* sliding window in positions, 0 = full causal */
    bool no_rope;                   /* positions come from the mask alone (Cohere2 global layers) */
} attn_block;

/* A gated MLP: down(act(gate(x)) * up(x)), act SiLU (SwiGLU) unless set (GeGLU). */
typedef struct mlp_block {
    matview gate, up, down;              /* [f, d], [f, d], [d, f] */
    const float *b_gate, *b_up, *b_down; /* [f], [f], [d] or NULL */
    backend_act act;
} mlp_block;

/* The shapes a text family's weight tables index (weight_spec rows/cols). */
/* TEXT_ZERO, TEXT_QK (qd + kvd), TEXT_QKV (qd + 2 kvd) and TEXT_FF (2 f) place the parts
 * of fused matrices (WEIGHT_PART). */
enum text_dim {
    TEXT_D,
    TEXT_QD,
    TEXT_KVD,
    TEXT_F,
    TEXT_V,
    TEXT_HD,
    TEXT_ZERO,
    TEXT_QK,
    TEXT_QKV,
    TEXT_FF,
    TEXT_N_DIMS
};
void model_text_dims(const celer_model *m, int64_t dims[TEXT_N_DIMS]);

/* Adds a text family's tables: global[n_global] (canonical names from the root) over the
 * struct w, and layer[n_layer_spec] under "model.layers.<i>." over m->dims.n_layer structs
 * at layers, stride bytes apart. */
void model_add_text_tables(celer_model *m, const weight_spec *global, int64_t n_global, void *w,
                           const weight_spec *layer, int64_t n_layer_spec, void *layers,
                           size_t stride, const int64_t *dims, const bool *flags);

/* Scratch of a text body that keeps x, xb, xo [n, d] and runs model_attention and
 * model_mlp on the rest: a family's scratch_floats. */
int64_t model_text_scratch_floats(const celer_model *m, int64_t n);

/* Floats of scratch model_attention and model_mlp need for n rows. */
int64_t model_attention_scratch(const celer_model *m, int64_t n);
int64_t model_mlp_scratch(const celer_model *m, int64_t n);

/* out[n, d] = o_proj(attention(rope(q), rope(k), v)) over the normed rows xb[n, d] of
 * layer l: K and V of the step go to the cache first, then every row attends over its
 * sequence's cache. */
void model_attention(const celer_model *m, backend *be, const model_step *st, const model_kv *kv,
                     int64_t l, const attn_block *a, const rope_params *rope, float scale,
                     const float *xb, float *scratch, float *out);
/* out[n, d] = the gated MLP of xb[n, d]. */
void model_mlp(const celer_model *m, backend *be, const mlp_block *p, const float *xb, int64_t n,
               float *scratch, float *out);

/* "<quant>" of a matrix for descriptions: "4-bit g64", "bf16". */
const char *model_quant_desc(const matview *w, char *out, size_t size);
/* The mix of formats in out, most common first: a GGUF file's tensor types ("Q5_0 x81,
 * F32 x109, ... (GGUF tensors)"), else the matrices' model_quant_desc ("4-bit g64 x112,
 * BF16 x1 (matrices)"). */
void model_formats(const celer_model *m, char *out, size_t size);

/* ==== Weight binding shared by families (docs/architecture.md, "Weights and families") ==== */

/* Binds module.weight as W[rows, cols] (canonical names, renamed by m's layout): dense
 * F32/F16/BF16, or MLX affine codes with module.scales and module.biases. Quantization comes from
 * config.json's block and the per-module entries, bits and group size from the shapes where the
 * config is silent. */
celer_status bind_matrix(const celer_model *m, const char *module, int64_t rows, int64_t cols,
                         matview *out, celer_error *e);
/* Binds name as a vector [d] converted to fp32 in m->mem; NULL (and OK) when absent and
 * not required. */
celer_status bind_vector(celer_model *m, const char *name, int64_t d, bool required,
                         const float **out, celer_error *e);
/* w[n] += 1: Gemma's RMSNorm weights (1 + w) folded into the model's fp32 copy at load. */
void model_norm_plus_one(const float *w, int64_t n);

/* The first of candidates[] (NULL-terminated prefixes) under which prefix + name is a tensor
 * of m's checkpoint, or NULL: how a vision-language family tells its layouts apart. */
const char *model_probe_prefix(const celer_model *m, const char *const *candidates,
                               const char *name);

/* Fails when a tensor name exists (an unexpected bias, say) that the config rules out. */
celer_status reject_tensor(const celer_model *m, const char *name, const char *why, celer_error *e);

extern const model_family llama_family;
extern const model_family gemma_family;
extern const model_family gemma3_family;
extern const model_family cohere2_family;
extern const model_family llava_next_family;
extern const model_family gemma3_vision_family;

#endif

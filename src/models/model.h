/*
 * model.h - a loaded model and the model contract (DESIGN.md section 2) at the level
 * below the engine: each entry point runs the family's one hidden_states body over a
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

/* Shapes every family shares (STYLE.md rule 5 letters). */
typedef struct model_dims {
    int64_t v, d, n_layer, h, hk, hd, f;
    int64_t n_ctx_train;
} model_dims;

/* One planned step of n rows (n <= the context's n_batch). */
typedef struct model_step {
    int64_t n;
    const int32_t *token; /* [n], or NULL when embd is set */
    const float *embd;    /* [n, d] */
    const int32_t *pos;   /* [n] position of each row in its sequence */
    const int32_t *slot;  /* [n] cache slot each row's K/V goes to */
    const int32_t *const *blocks; /* [n] block table of each row's sequence */
    int64_t block_size;
} model_step;

/* The KV cache pools, one [n_slots, hk*hd] pair per layer. */
typedef struct model_kv {
    void *const *k; /* fp16 or fp32, as the backend was created */
    void *const *v;
} model_kv;

typedef struct model_family model_family;

#define CELER_MAX_EOS 8

struct celer_model {
    const model_family *family;
    checkpoint ck;
    model_dims dims;
    int32_t eos[CELER_MAX_EOS]; /* end-of-sequence ids from config.json */
    int n_eos;
    char desc[256];
    arena mem;     /* fp32 copies of vectors, RoPE tables */
    void *weights; /* the family's weight struct */
    /* The fast kernels' layout of every affine matrix, made once by model_pack. */
    pthread_mutex_t pack_mu;
    bool packed;
    arena packed_mem;
    double pack_ms;
};

struct model_family {
    const char *const *model_types; /* NULL-terminated */
    celer_status (*load)(celer_model *m, celer_error *e);
    /* Floats of activation scratch hidden_states needs for n rows. */
    int64_t (*scratch_floats)(const celer_model *m, int64_t n);
    /* hidden[n, d] = final-normed hidden states of the step's rows. */
    void (*hidden_states)(const celer_model *m, backend *be, const model_step *step,
                          const model_kv *kv, float *scratch, float *hidden);
    const matview *(*embedding)(const celer_model *m);
    const matview *(*head)(const celer_model *m);
    /* Writes pointers to the family's weight matrices into out (at most cap) and returns
     * how many there are (a tied head is listed too; it shares the embedding's data). */
    int64_t (*matrices)(celer_model *m, matview **out, int64_t cap);
    /* Adds up the parameters and stored bytes of every weight the family binds. */
    void (*count)(const celer_model *m, int64_t *params, int64_t *bytes);
};

/* Stored bytes of one weight view (codes + scales + biases, or dense data). */
int64_t matview_bytes(const matview *w);

/* Opens dir, reads config.json and binds every weight; *out NULL on failure. */
celer_status model_open(const char *dir, celer_model **out, celer_error *e);
void model_close(celer_model *m);

/* Repacks every affine matrix for the fast CPU kernels (matview.packed), once per model
 * and safe to call from several threads; matrices the packer cannot take stay NULL. */
celer_status model_pack(celer_model *m, celer_error *e);

/* hidden[n, d] for every row (no head). */
void model_hidden_states(const celer_model *m, backend *be, const model_step *step,
                         const model_kv *kv, float *scratch, float *hidden);
/* logits[n, v] for every row. hidden is [n, d] scratch. */
void model_forward(const celer_model *m, backend *be, const model_step *step, const model_kv *kv,
                   float *scratch, float *hidden, float *logits);
/* logits[v] of row last_pos only: the head sees one row. */
void model_forward_last_logits(const celer_model *m, backend *be, const model_step *step,
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

/* ==== Weight binding shared by families (STYLE.md rule 10) ==== */

/* Binds module.weight as W[rows, cols]: dense F32/F16/BF16, or MLX affine codes with
 * module.scales and module.biases. Quantization comes from config.json's block and the
 * per-module entries, bits and group size from the shapes where the config is silent. */
celer_status bind_matrix(const celer_model *m, const char *module, int64_t rows, int64_t cols,
                         matview *out, celer_error *e);
/* Binds name as a vector [d] converted to fp32 in m->mem; NULL (and OK) when absent and
 * not required. */
celer_status bind_vector(celer_model *m, const char *name, int64_t d, bool required,
                         const float **out, celer_error *e);
/* Fails when a tensor name exists (an unexpected bias, say) that the config rules out. */
celer_status reject_tensor(const celer_model *m, const char *name, const char *why,
                           celer_error *e);

extern const model_family llama_family;

#endif

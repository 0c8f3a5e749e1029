/*
 * backend.h - the op interface model code is written against (docs/architecture.md, "The
 * model contract"), and the registry of backend classes (cpu, and cuda in a module loaded on
 * first use: registry.c).
 *
 * A backend runs each op over whole batches of rows on memory it owns: activations, KV
 * pools, step inputs and outputs live in buffers its alloc made (host memory for the CPU
 * backends, device memory for a GPU one); callers move data in with upload and out with
 * download, only the rows they read. A host backend (be->host) addresses host memory
 * directly, so callers may hand it their own buffers. Weights reach ops as the views the
 * model bound: a matrix is found in the backend's prepared set by its id (the CPU repack,
 * a device layout), and weight vectors (norm weights, biases, position tables) are
 * pointers into the model's vector arena, which a backend with memory of its own mirrors
 * when it prepares. A backend never sees a model, a config or a tokenizer.
 *
 * A step (one forward) runs between begin and end, and is run again while end answers
 * false: a GPU backend may first only note the ops of a step (not run them) and replay a
 * recorded step that made the very same calls, or ask for the step again to record it.
 * So between begin and end, ops are the only effects a step may have. download waits for
 * the work queued before it.
 *
 * Failures. Ops return nothing: a backend that fails (a device error, out of device memory)
 * records the first failure in be->fault (backend_fail) and the rest of the step does
 * nothing: later ops, uploads and downloads are skipped (a download leaves dst as it is),
 * alloc answers NULL, and end answers true (never "again"). The caller asks backend_status
 * after a step's end and its downloads (or after any call outside steps): it reports the
 * failure once, with its line, and clears it, so the next step runs. A sticky failure (the
 * device is unusable, as after an illegal address on a GPU) is never cleared: every later
 * call does nothing and backend_status reports the same failure again. A host backend
 * never fails on its own; CELER_FAULT_STEP (backend_fault_init) makes any backend fail a
 * given step on purpose, for tests.
 *
 * attention reads the paged KV cache causally (text models): row r sees the keys up to its
 * own position, or up to limit[r] where the rows carry limits (the rows of a Gemma 3 image
 * block see the whole block during prefill; docs/architecture.md, "Image blocks");
 * attention_full has no cache and no mask (a vision encoder): its n rows form n / seg
 * independent segments of seg consecutive rows (n % seg == 0, one image tile each), and
 * every row attends to every row of its own segment. Query head i reads KV head i / (h / hk)
 * in both.
 */
#ifndef CELER_BACKEND_H
#define CELER_BACKEND_H

#include "base/arena.h"
#include "base/error.h"
#include "base/tensor.h"

#include <stdbool.h>
#include <stdint.h>

/* Rotary embedding parameters of one model (or one kind of layer), precomputed at load.
 * Only the first dims values of each head rotate (partial rotary embeddings); the rest
 * pass through. */
typedef struct rope_params {
    const float *inv_freq; /* [dims / 2] */
    int64_t dims;          /* rotated values of a head: even, <= hd; 0 means all of hd */
    float mscale;          /* multiplies cos and sin (YaRN or longrope attention factor; else 1) */
    bool traditional;      /* rotate (2i, 2i+1) instead of (i, i + dims/2) */
} rope_params;

/* The rotated values of a head of hd under rp. */
static inline int64_t rope_dims(const rope_params *rp, int64_t hd) {
    return rp->dims ? rp->dims : hd;
}

/* The rows of one attention call: row r sits at position pos[r] of the sequence whose
 * block table is row seq[r] of tables, and attends over that sequence's cache: the keys at
 * positions (pos[r] - window, limit[r]] (from 0 without a window). */
typedef struct attn_rows {
    int64_t n;
    const int32_t *pos;    /* [n] */
    const int32_t *limit;  /* [n] the last position row r sees (>= pos[r]; along the rows of a
                              sequence, never smaller than the row before's), or NULL: pos[r] */
    const int32_t *seq;    /* [n] */
    const int32_t *tables; /* [*, table_cols] cache block of each block_size positions */
    int64_t table_cols;
    int64_t block_size;
    int64_t window; /* sliding window in positions; 0 = none */
    int64_t h, hk, hd;
    float scale;   /* multiplies q . k */
    float softcap; /* scores become softcap * tanh(score / softcap) before the softmax; 0 = none */
    int64_t seqs;  /* distinct sequences among the rows, or 0 where not counted */
    int64_t keys;  /* the most keys a row reads (its limit + 1, at most), or 0 where not counted */
} attn_rows;

/* Elementwise activations of the act and gated (glu) ops, each as Hugging Face names it. */
typedef enum backend_act {
    BACKEND_ACT_SILU,       /* "silu": x sigmoid(x) */
    BACKEND_ACT_GELU_ERF,   /* "gelu": 0.5 x (1 + erf(x / sqrt 2)) */
    BACKEND_ACT_GELU_TANH,  /* "gelu_pytorch_tanh": 0.5 x (1 + tanh(0.79788 (x + 0.044715 x^3))) */
    BACKEND_ACT_QUICK_GELU, /* "quick_gelu" (CLIP): x sigmoid(1.702 x) */
} backend_act;

typedef struct backend backend;
typedef struct backend_class backend_class;

/* What a step fails on purpose as (CELER_FAULT_STEP=N[:error|:oom|:sticky]). */
typedef enum backend_fault_kind {
    BACKEND_FAULT_ERROR,  /* a device error the next step recovers from (CELER_STATUS_DEVICE) */
    BACKEND_FAULT_OOM,    /* out of device memory (CELER_STATUS_OUT_OF_MEMORY) */
    BACKEND_FAULT_STICKY, /* the device is lost (CELER_STATUS_DEVICE_LOST) */
} backend_fault_kind;

/* A backend's failure state (the header's "Failures"). */
typedef struct backend_fault {
    celer_status status; /* the first failure not yet reported, or CELER_OK */
    bool sticky;         /* the device is unusable: reported at every backend_status */
    char msg[CELER_ERROR_LEN];
    int64_t steps;       /* steps begun (a step run again counts once) */
    int64_t inject_step; /* the step that fails on purpose, or 0 */
    backend_fault_kind inject_kind;
} backend_fault;

/* A class's prepared copy of a model's weights; each class extends it. */
typedef struct backend_weights {
    const backend_class *cls;
    int64_t bytes; /* of the copy */
    double ms;     /* making it took */
    bool whole;    /* the copy holds every weight: the backend reads nothing of the checkpoint */
} backend_weights;

typedef struct backend_ops {
    const char *name;
    void (*destroy)(backend *be);

    /* ---- memory ---- */
    /* bytes of zeroed backend memory, or NULL; freed by release */
    void *(*alloc)(backend *be, size_t bytes);
    void (*release)(backend *be, void *p);
    /* host -> backend, backend -> host (after the work queued before it) */
    void (*upload)(backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(backend *be, void *dst, const void *src, size_t bytes);
    /* y[n, d] (rows ldy floats apart) = x[n, d] (rows ldx apart) */
    void (*copy_rows)(backend *be, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t n,
                      int64_t d);
    /* y[n, d]: row i = x[idx[i]], or the weight vector fill[d] where idx[i] < 0 */
    void (*gather_rows)(backend *be, float *y, const float *x, const int32_t *idx,
                        const float *fill, int64_t n, int64_t d);
    /* bytes of the backend's own work buffers (NULL: none worth counting) */
    int64_t (*work_bytes)(const backend *be);
    /* ---- steps ---- */
    /* a step of rows rows starts; its end: false when the ops must be called again (never
     * once the backend failed) */
    void (*begin)(backend *be, int64_t rows);
    bool (*end)(backend *be);

    /* ---- ops ---- */
    /* y[n, w.rows] = x[n, w.cols] @ W^T */
    void (*matmul)(backend *be, float *y, const matview *w, const float *x, int64_t n);
    /* y[n, w.cols] = rows ids[n] of W (an embedding table, dequantized) times scale; a row
     * whose id is negative is left as it is */
    void (*embed)(backend *be, float *y, const matview *w, const int32_t *ids, int64_t n,
                  float scale);
    /* y[n, d] = rmsnorm(x[n, d]) * w[d] */
    void (*rmsnorm)(backend *be, float *y, const float *x, const float *w, int64_t n, int64_t d,
                    float eps);
    /* y[n, d] = (x[n, d] - mean) / sqrt(var + eps) * w[d] + b[d], per row; b may be NULL */
    void (*layernorm)(backend *be, float *y, const float *x, const float *w, const float *b,
                      int64_t n, int64_t d, float eps);
    /* x[n, h, hd] rotated in place, row r at position pos[r]: the first rope_dims values of
     * each head (rp->inv_freq is a weight vector) */
    void (*rope)(backend *be, float *x, const int32_t *pos, int64_t n, int64_t h, int64_t hd,
                 const rope_params *rp);
    /* k, v [n, hk*hd] stored into the pools at slots slot[n], as fp16 or fp32 values
     * (backend_kv_bytes). How a cache block is laid out inside the pools is the backend's
     * own business: only its attention reads them. */
    void (*kv_store)(backend *be, void *kpool, void *vpool, const float *k, const float *v,
                     const int32_t *slot, int64_t n, int64_t kvd);
    /* out[n, h*hd] = attention of q[n, h*hd] over the pools; rows->softcap only where
     * attention_softcap is set, rows->limit only where attention_limit is (a model that
     * needs either is refused elsewhere) */
    bool attention_softcap;
    bool attention_limit;
    void (*attention)(backend *be, float *out, const float *q, const void *kpool, const void *vpool,
                      const attn_rows *rows);
    /* out[n, h*hd] = attention of q[n, h*hd] over k, v[n, hk*hd] within segments of seg rows */
    void (*attention_full)(backend *be, float *out, const float *q, const float *k, const float *v,
                           int64_t n, int64_t seg, int64_t h, int64_t hk, int64_t hd, float scale);
    /* y[m] = act(gate[m]) * up[m] (y may alias gate) */
    void (*glu)(backend *be, float *y, const float *gate, const float *up, int64_t m,
                backend_act act);
    /* y[m] = act(x[m]) */
    void (*act)(backend *be, float *y, const float *x, int64_t m, backend_act kind);
    /* y[m] = cap * tanh(y[m] / cap) */
    void (*softcap)(backend *be, float *y, float cap, int64_t m);
    /* y[m] += x[m] */
    void (*add)(backend *be, float *y, const float *x, int64_t m);
    /* y[n, d] += bias[d] for every row */
    void (*add_bias)(backend *be, float *y, const float *bias, int64_t n, int64_t d);
    /* y[m] *= s */
    void (*scale)(backend *be, float *y, float s, int64_t m);
    /* y[n * (s/p)^2, 3 p p] = the p x p patches of images x[n, 3, s, s], row-major per
     * image, each flattened (channel, row, column), or (row, column, channel) when
     * channels_last: a convolution of stride p as one matrix product; with lead set, each
     * image's rows start with one row of zeros (a class token's place) */
    void (*patches)(backend *be, float *y, const float *x, int64_t n, int64_t s, int64_t p,
                    bool channels_last, bool lead);
    /* y[n * (s/k)^2, d] = the means of the k x k windows (stride k) of the n maps x[n, s, s, d]
     * (rows row-major), each window summed row by row in fp32, then divided by k^2 (torch's
     * AvgPool2d; Gemma 3's projector) */
    void (*avg_pool)(backend *be, float *y, const float *x, int64_t n, int64_t s, int64_t k,
                     int64_t d);

    /* ---- fused ops: optional (NULL: the backend_* helper below calls the ops above) ---- */
    /* ys[i][n, ws[i]->rows] = x[n, cols] @ W_i^T for i < k: products of one input (q, k and
     * v; gate and up), which a backend may run as one */
    void (*matmul_multi)(backend *be, float *const *ys, const matview *const *ws, int k,
                         const float *x, int64_t n);
    /* x[n, d] += r[n, d], then y[n, d] = rmsnorm(x) * w[d] */
    void (*add_rmsnorm)(backend *be, float *y, float *x, const float *r, const float *w, int64_t n,
                        int64_t d, float eps);
    /* rope on q[n, h*hd] and k[n, hk*hd] in place, then kv_store of k and v */
    void (*rope_store)(backend *be, float *q, float *k, const float *v, void *kpool, void *vpool,
                       const int32_t *pos, const int32_t *slot, int64_t n, int64_t h, int64_t hk,
                       int64_t hd, const rope_params *rp);
    /* y[n, w.rows] = (act(gate) * up)[n, w.cols] @ W^T (an MLP's down projection); gate
     * may be overwritten */
    void (*glu_matmul)(backend *be, float *y, const matview *w, float *gate, const float *up,
                       int64_t n, backend_act act);
    /* y[n, down.rows] = (act(x @ G^T) * (x @ U^T)) @ D^T, a gated MLP without biases; gate
     * and up [n, G.rows] are scratch the backend may use in any form (their contents after
     * the call are unspecified) */
    void (*glu_mlp)(backend *be, float *y, const matview *g, const matview *u, const matview *down,
                    const float *x, float *gate, float *up, int64_t n, backend_act act);

    /* ---- optional, for backends whose memory is not the host's (NULL: the caller takes
     * the rows down and works on the host) ---- */
    /* ids[n] (backend memory) = the index of the largest value of each row of x[n, v]:
     * the first of equal ones, NaN never (a row of NaN gives v - 1), as sampling_argmax */
    void (*argmax_rows)(backend *be, int32_t *ids, const float *x, int64_t n, int64_t v);
} backend_ops;

struct backend {
    const backend_ops *ops;
    const char *kernels; /* the kernel set it runs: "avx2", "ref", "cuda" */
    bool kv_f16;         /* the KV pools hold fp16 values (else fp32); fixed at creation */
    bool host;           /* ops address host memory: callers' own buffers may be passed in */
    bool in_place;       /* reads every weight where it lies: nothing is prepared for it */
    const backend_weights *weights; /* the prepared set ops look matrices up in, or NULL */
    backend_fault fault;            /* zeroed at creation, then backend_fault_init */
};

/* ==== Weights and classes ==== */

/* What a class prepares for one model: every matrix, mats[i]->id == i + 1, and the
 * arenas every weight vector lives in. done(arg, w) says the backend no longer reads w's
 * source (its file pages may go). */
typedef struct weight_set {
    matview *const *mats;
    int64_t n_mats;
    const arena *const *vectors;
    int64_t n_vectors;
    void (*done)(void *arg, const matview *w);
    void *arg;
} weight_set;

/* What a backend is made for: the largest op it will see. */
typedef struct backend_params {
    int device;          /* index among the class's devices */
    const char *kernels; /* the CPU's kernel set: auto, ref, generic, avx2, avx512, amx */
    int n_threads;
    bool kv_f16;
    int64_t max_rows;   /* rows in one op call */
    int64_t max_cols;   /* widest matrix input (and row of the elementwise ops) */
    int64_t max_keys;   /* positions one attention row reads */
    int64_t hd;         /* head dimension */
    int64_t rope_kinds; /* distinct RoPE parameter sets a forward passes (0 counts as 1) */
} backend_params;

/* A kind of backend: cpu, cuda. */
struct backend_class {
    const char *name;
    /* rows per step where the caller leaves n_batch 0: as many as pay for their buffers */
    int64_t rows_per_step;
    /* devices this machine has (0 with the reason in e when none) */
    int (*device_count)(celer_error *e);
    /* a line naming device i: "NVIDIA H200, 139 GiB", "AMD EPYC 9454 (avx512)" */
    void (*device_name)(int device, char *out, size_t size);
    /* *out = a copy of ws laid out for the class's kernels on p->device (NULL when its
     * kernels read every weight where it lies) */
    celer_status (*prepare)(const weight_set *ws, const backend_params *p, backend_weights **out,
                            celer_error *e);
    void (*unprepare)(backend_weights *w);
    /* a backend running with weights w (may be NULL), or NULL (e says why) */
    backend *(*create)(const backend_params *p, const backend_weights *w, celer_error *e);
    /* host classes (NULL elsewhere): the threads a context takes when it names none, and
     * whether a kernel set name ("avx2", "ref") runs on this machine */
    int (*default_threads)(void);
    bool (*kernels_supported)(const char *name);
};

/* The class and device index a device string names ("cpu", "cuda", "cuda:1"; NULL or
 * empty is "cpu"), checking that the device exists. */
celer_status backend_find(const char *device, const backend_class **cls, int *index,
                          celer_error *e);
/* The name of class i of those this build knows, in device-list order (0: the host class
 * "cpu", built in; then "cuda", a module), or NULL past the last. Knowing a name loads nothing. */
const char *backend_class_name(int i);
/* Class i (below the count backend_class_name gives), its module loaded on first use (the
 * outcome is kept): the class, or NULL with the one-line reason in e (the module is missing,
 * unloadable or from another build; this build has none). */
const backend_class *backend_class_get(int i, celer_error *e);
/* The host class ("cpu"). */
const backend_class *backend_host_class(void);

/* ==== Failures ==== */

/* Records a failure in f unless one is already there (the first one wins); sticky: the
 * device is unusable. */
void backend_fail(backend_fault *f, celer_status s, bool sticky, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Reads CELER_FAULT_STEP into f: N (the N-th step a backend begins fails, counting from
 * 1) and the kind after a colon (error, the default; oom; sticky). Unset, empty or
 * malformed: no fault (malformed says so on stderr). */
void backend_fault_init(backend_fault *f);
/* Counts a step begun; true when it is the one that must fail. */
bool backend_fault_step(backend_fault *f);

static inline bool backend_failed(const backend *be) {
    return be->fault.status != CELER_OK;
}

/* CELER_OK, or be's failure with its line in e (may be NULL); a failure that is not
 * sticky is cleared by being reported. */
static inline celer_status backend_status(backend *be, celer_error *e) {
    const celer_status s = be->fault.status;
    if (s == CELER_OK) return CELER_OK;
    error_set(e, s, "%s", be->fault.msg);
    if (!be->fault.sticky) be->fault.status = CELER_OK;
    return s;
}

/* Bytes of one cached K or V value. */
static inline int64_t backend_kv_bytes(bool kv_f16) {
    return kv_f16 ? 2 : 4;
}

/* ==== Host memory: what every CPU backend shares ==== */

/* The memory entries of a host backend's op table. */
#define BACKEND_HOST_MEMORY_OPS                                                                    \
    .alloc = backend_host_alloc, .release = backend_host_release, .upload = backend_host_copy,     \
    .download = backend_host_copy, .copy_rows = backend_host_copy_rows,                            \
    .gather_rows = backend_host_gather_rows

void *backend_host_alloc(backend *be, size_t bytes);
void backend_host_release(backend *be, void *p);
void backend_host_copy(backend *be, void *dst, const void *src, size_t bytes);
void backend_host_copy_rows(backend *be, float *y, int64_t ldy, const float *x, int64_t ldx,
                            int64_t n, int64_t d);
void backend_host_gather_rows(backend *be, float *y, const float *x, const int32_t *idx,
                              const float *fill, int64_t n, int64_t d);

/* The begin of a host backend: counts the step and fails it where CELER_FAULT_STEP says
 * (the step still runs: only its status says it failed). */
void backend_host_begin(backend *be, int64_t rows);

/* y[m] += x[m], y[n, d] += bias[d] and y[m] *= s on host memory: plain loops that every CPU backend
 * uses as its add and add_bias ops (memory-bound; nothing to gain from more). */
static inline void backend_host_add(backend *be, float *y, const float *x, int64_t m) {
    (void)be;
    for (int64_t i = 0; i < m; i++) y[i] += x[i];
}

static inline void backend_host_add_bias(backend *be, float *y, const float *bias, int64_t n,
                                         int64_t d) {
    (void)be;
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < d; i++) y[t * d + i] += bias[i];
}

static inline void backend_host_scale(backend *be, float *y, float s, int64_t m) {
    (void)be;
    for (int64_t i = 0; i < m; i++) y[i] *= s;
}

/* The patches op on host memory (data movement only; both CPU backends use it). */
void backend_host_patches(backend *be, float *y, const float *x, int64_t n, int64_t s, int64_t p,
                          bool channels_last, bool lead);
/* The avg_pool op on host memory (both CPU backends use it). */
void backend_host_avg_pool(backend *be, float *y, const float *x, int64_t n, int64_t s, int64_t k,
                           int64_t d);

/* The last position row r of ar sees. */
static inline int64_t attn_rows_limit(const attn_rows *ar, int64_t r) {
    return ar->limit ? ar->limit[r] : ar->pos[r];
}

/* ==== Fused ops: one op where the backend has it, else the ops it stands for ==== */

static inline void backend_matmul_multi(backend *be, float *const *ys, const matview *const *ws,
                                        int k, const float *x, int64_t n) {
    if (be->ops->matmul_multi) {
        be->ops->matmul_multi(be, ys, ws, k, x, n);
        return;
    }
    for (int i = 0; i < k; i++) be->ops->matmul(be, ys[i], ws[i], x, n);
}

static inline void backend_add_rmsnorm(backend *be, float *y, float *x, const float *r,
                                       const float *w, int64_t n, int64_t d, float eps) {
    if (be->ops->add_rmsnorm) {
        be->ops->add_rmsnorm(be, y, x, r, w, n, d, eps);
        return;
    }
    be->ops->add(be, x, r, n * d);
    be->ops->rmsnorm(be, y, x, w, n, d, eps);
}

static inline void backend_rope_store(backend *be, float *q, float *k, const float *v, void *kpool,
                                      void *vpool, const int32_t *pos, const int32_t *slot,
                                      int64_t n, int64_t h, int64_t hk, int64_t hd,
                                      const rope_params *rp) {
    if (be->ops->rope_store) {
        be->ops->rope_store(be, q, k, v, kpool, vpool, pos, slot, n, h, hk, hd, rp);
        return;
    }
    be->ops->rope(be, q, pos, n, h, hd, rp);
    be->ops->rope(be, k, pos, n, hk, hd, rp);
    be->ops->kv_store(be, kpool, vpool, k, v, slot, n, hk * hd);
}

static inline void backend_glu_matmul(backend *be, float *y, const matview *w, float *gate,
                                      const float *up, int64_t n, backend_act act) {
    if (be->ops->glu_matmul) {
        be->ops->glu_matmul(be, y, w, gate, up, n, act);
        return;
    }
    be->ops->glu(be, gate, gate, up, n * w->cols, act);
    be->ops->matmul(be, y, w, gate, n);
}

static inline void backend_glu_mlp(backend *be, float *y, const matview *g, const matview *u,
                                   const matview *down, const float *x, float *gate, float *up,
                                   int64_t n, backend_act act) {
    if (be->ops->glu_mlp) {
        be->ops->glu_mlp(be, y, g, u, down, x, gate, up, n, act);
        return;
    }
    float *const ys[2] = {gate, up};
    const matview *const ws[2] = {g, u};
    backend_matmul_multi(be, ys, ws, 2, x, n);
    backend_glu_matmul(be, y, down, gate, up, n, act);
}

static inline void backend_destroy(backend *be) {
    if (be) be->ops->destroy(be);
}

static inline void backend_begin(backend *be, int64_t rows) {
    if (be->ops->begin) be->ops->begin(be, rows);
}

/* Whether the step ran; false: call its ops again (from backend_begin). */
static inline bool backend_end(backend *be) {
    return be->ops->end ? be->ops->end(be) : true;
}

#endif

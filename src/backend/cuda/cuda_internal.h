/*
 * cuda_internal.h - what the CUDA backend's files share: the prepared weights, the
 * backend struct and the kernel launchers (each .cu file owns one concern: the class and
 * its memory, elementwise kernels, attention, matrix products).
 *
 * Device layouts. Dense matrices stay in their checkpoint type (F32, F16, BF16)
 * [rows, cols]. Affine matrices of 4 or 8 bits with one-level scales and biases are held
 * once, in affine.h's tiled layout, which the decode product, the prefill product and the
 * embedding rows all read; every other quantized form (K-quants, zero points, codebooks,
 * 2/3/5/6-bit codes) in the host's own layout (qmat.h).
 * K and V pools are [slot, hk * hd] of fp16 or fp32.
 */
#ifndef CELER_BACKEND_CUDA_INTERNAL_H
#define CELER_BACKEND_CUDA_INTERNAL_H

extern "C" {
#include "backend/backend.h"
#include "backend/cuda/backend_cuda.h"
}
#include "backend/cuda/affine.h"
#include "backend/cuda/qmat.h"
#include "backend/cuda/trace.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdint.h>

/* Failures (backend.h): a failed CUDA or cuBLAS call is recorded, never fatal. While a
 * cuda_scope is open on this thread, CUDA_CHECK(x) and CUBLAS_CHECK(x) record a failure of
 * x in the scope's fault (the first one wins) as one line naming the scope, the call, its
 * file:line and CUDA's reason, and answer whether x succeeded. The status says what the
 * caller can do: CELER_STATUS_OUT_OF_MEMORY or CELER_STATUS_DEVICE, after which the next
 * step runs; CELER_STATUS_DEVICE_LOST (sticky) when CUDA names the error as one that
 * leaves the context unusable (illegal address, launch failure, ...) or the error
 * outlives cudaGetLastError. Code after a failed call goes on only where it cannot touch
 * memory the call was to provide (a failed allocation leaves its buffer NULL and the op
 * returns). */
#define CUDA_CHECK(x) cuda_check((x), #x, __FILE__, __LINE__)
bool cuda_check(cudaError_t err, const char *what, const char *file, int line);
#define CUBLAS_CHECK(x) cublas_check((x), #x, __FILE__, __LINE__)
bool cublas_check(cublasStatus_t st, const char *what, const char *file, int line);

/* Where this thread's failed calls go while it lives (nested scopes restore the outer one
 * at their end), and the name they are reported under ("rmsnorm", "prepare"). Its end
 * also records a kernel launch that failed without a check (<<<...>>> sets CUDA's last
 * error). Outside every scope a failure is only printed. */
struct cuda_scope {
    backend_fault *prev;
    const char *prev_what;
    cuda_scope(backend_fault *f, const char *what);
    ~cuda_scope();
    cuda_scope(const cuda_scope &) = delete;
    cuda_scope &operator=(const cuda_scope &) = delete;
};

/* cuBLAS's entries, found by cuda_blas_open (blas.cu): the module does not link it. */
typedef struct cuda_blas_api {
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    decltype(&cublasSetWorkspace_v2) set_workspace;
    decltype(&cublasGetStatusString) status_string;
    decltype(&cublasGetStatusName) status_name;
    /* cublasGemmEx (C++ sees an overload taking a cudaDataType compute type too) */
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int m, int n,
                              int k, const void *alpha, const void *a, cudaDataType at, int lda,
                              const void *b, cudaDataType bt, int ldb, const void *beta, void *c,
                              cudaDataType ct, int ldc, cublasComputeType_t compute,
                              cublasGemmAlgo_t algo);
} cuda_blas_api;
extern cuda_blas_api cuda_blas;
/* Opens cuBLAS once a process (later calls answer the same): CELER_OK once cuda_blas is
 * filled in, else e says why in one line. */
celer_status cuda_blas_open(celer_error *e);

/* Elementwise kernels: THREADS a block, enough blocks for m elements (capped: each thread
 * then strides over the rest with GRID_STRIDE). */
#define THREADS 256
static inline unsigned blocks_for(int64_t m) {
    const int64_t b = (m + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 8 ? 65535 * 8 : b);
}
#define GRID_STRIDE(i, m)                                                                          \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (m);                      \
         i += (int64_t)gridDim.x * blockDim.x)

/* Programmatic dependent launch: a kernel launched with launch_pdl may start while the
 * previous kernel of its stream finishes. It must begin with PDL_ENTRY (or call
 * pdl_wait_prev before touching memory the previous kernel writes); pdl_launch_next lets
 * the next kernel start early in turn. Decode steps are chains of small kernels, so each
 * one's launch hides behind the one before. PDL_ENTRY also opens the kernel's trace
 * scope (trace.h: empty unless tracing), tag its cuda_trace_tag. */
__device__ __forceinline__ void pdl_launch_next() {
    asm volatile("griddepcontrol.launch_dependents;");
}
__device__ __forceinline__ void pdl_wait_prev() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
}
#define PDL_ENTRY(tag)                                                                             \
    trace_scope trace_scope_(tag);                                                                 \
    pdl_launch_next();                                                                             \
    pdl_wait_prev();                                                                               \
    trace_scope_.ready()

/* SwiGLU of one element: cuda_glu's (SiLU) and the fused products' (the same bits); of four. */
__device__ __forceinline__ float swiglu_of(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}
__device__ __forceinline__ float4 swiglu4(float4 g, float4 u) {
    return make_float4(swiglu_of(g.x, u.x), swiglu_of(g.y, u.y), swiglu_of(g.z, u.z),
                       swiglu_of(g.w, u.w));
}

/* The current device's SMs, or fallback where they cannot be read (the error cleared). */
static inline int cuda_sm_count(int fallback) {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        cudaGetLastError();
        return fallback;
    }
    return sms;
}

template <typename... P, typename... A>
static inline void launch_pdl(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                              A... a) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, k, (P)a...));
}

/* One matrix on the device. */
typedef struct cuda_mat {
    int64_t rows, cols;
    int bits; /* 0: dense; else quantized: aff, or q where q.codes is set */
    int64_t group;
    int type;        /* dense: DTYPE_F32, DTYPE_F16 or DTYPE_BF16 */
    void *dense;     /* dense [rows, cols] */
    cuda_affine aff; /* 4- or 8-bit affine with one-level scales and biases */
    cuda_qmat q;     /* every other quantized form (qmat.h) */
} cuda_mat;

/* Whether m is held in qmat.h's layout (else dense or affine.h's tiles). */
static inline bool cuda_mat_general(const cuda_mat *m) { return m->q.codes != NULL; }

/* A block of a model's vector arena and its device mirror. */
typedef struct cuda_vec_block {
    const char *host;
    char *dev;
    size_t bytes;
} cuda_vec_block;

typedef struct cuda_weights {
    backend_weights base;
    int device;
    cuda_mat *mats; /* [n] by matview id - 1 */
    int64_t n;
    cuda_vec_block *vec;
    int64_t n_vec;
    size_t gemv_work;     /* the largest work buffer an affine product of <= GEMV_ROWS rows needs */
    int64_t affine_elems; /* the most weights (rows x cols) of one affine matrix */
    int64_t affine_cols;  /* the widest affine matrix's columns */
} cuda_weights;

/* How a step's ops are run (backend.h: begin/end). */
typedef enum step_mode {
    STEP_EAGER,   /* queued as called (outside steps, and steps of many rows) */
    STEP_CHECK,   /* only noted: end replays the recorded graph of the same calls */
    STEP_CAPTURE, /* queued into a graph that end records, then launches */
} step_mode;

#define GRAPH_ROWS  32 /* steps of at most this many rows are recorded and replayed */
#define GRAPH_CACHE 16 /* recorded steps kept (least recently used goes) */

typedef struct cuda_graph {
    uint64_t sig; /* what the step's calls hash to */
    cudaGraphExec_t exec;
    uint64_t used;
} cuda_graph;

#define GRAPH_FAILURES_MAX                                                                         \
    4 /* recording or launching a graph failing this often in a row: no more graphs */

typedef struct cuda_backend {
    backend base;
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_work; /* cuBLAS's workspace, so products can be captured */
    backend_params p;
    void *gemm_work;       /* the affine prefill product's staged x and split partial sums */
    size_t gemm_work_size; /* bytes of gemm_work (gemm_work_bytes) */
    void *xs;              /* [2, max_rows, max_cols] 16-bit activations (high, low parts) */
    void *gemv_work;       /* the affine GEMV's work, zero between products */
    size_t gemv_work_size; /* bytes of it (cuda_weights.gemv_work once reserved) */
    /* The dense prefill product's two fp16 buffers of W's rows (matmul.cu): a chunk is
     * dequantized into one on the side stream while cuBLAS reads the other. */
    __half *wh[2];
    int64_t wh_elems;                 /* halves of each (cuda_dense_elems once reserved) */
    cudaStream_t side;                /* the dequantization's stream */
    cudaEvent_t wh_ready[2];          /* recorded on side when a buffer's chunk is in */
    cudaEvent_t wh_free[2];           /* recorded on stream when a product has read it */
    const struct cuda_mat *wh_mat[2]; /* the matrix whose chunk a buffer holds (or is getting) */
    int64_t wh_row[2], wh_rows[2];    /* and which rows */
    int wh_next;                      /* the buffer the next chunk not already held goes to */
    step_mode mode;
    uint64_t sig;       /* hash of the current step's calls */
    bool recapture;     /* the last check found no graph: record the step again */
    bool again;         /* end answered false: the next begin runs the same step */
    bool eager_once;    /* a graph failed (not sticky): run the step again queued as called */
    int graph_failures; /* graphs that failed to record or launch in a row */
    float *att_part;    /* split attention's partial results (cuda_attention_scratch_bytes) */
    int64_t att_part_floats;
    cuda_graph graphs[GRAPH_CACHE];
    uint64_t tick;
} cuda_backend;

/* The device copy of a weight vector (a pointer into a model's vector arena). */
const float *cuda_vec(const cuda_backend *cb, const float *host);
/* The device matrix of a matview. */
const cuda_mat *cuda_mat_of(const cuda_backend *cb, const matview *w);

/* ==== Products (matmul.cu) ==== */

/* Steps of at least this many rows (prefill) take the fp16 fast paths (docs/architecture.md,
 * numerics): affine products on cuBLAS over fp16 weights and x (matmul.cu), and flash
 * attention's single fp16 query and probabilities (attention_flash.cu). */
#define FAST_FROM_ROWS 128

#define GEMV_ROWS CUDA_AFFINE_MAX_N /* products of at most this many rows stream affine weights */

/* Halves of the fp16 weight buffer the products need at most (0 when no step of the
 * backend's rows takes the dense prefill product). */
int64_t cuda_dense_elems(const cuda_backend *cb);
/* Rows of x the affine prefill product (gemm_work) needs room for. */
int64_t cuda_gemm_rows(const cuda_backend *cb);

/* y[n, m->rows] = x[n, m->cols] @ W^T on cb's stream. */
void cuda_product(cuda_backend *cb, float *y, const cuda_mat *m, const float *x, int64_t n);
/* The same of x = silu(gate) * up; gate may be overwritten. */
void cuda_product_swiglu(cuda_backend *cb, float *y, const cuda_mat *m, float *gate,
                         const float *up, int64_t n);
/* ys[i] = x @ W_i^T for k <= CUDA_AFFINE_SET matrices of one input: one launch where they
 * are compatible affine matrices (and, for the GEMV, the work buffer holds the set), else
 * cuda_product for each. */
void cuda_product_set(cuda_backend *cb, float *const *ys, const cuda_mat *const *ms, int k,
                      const float *x, int64_t n);
/* y = (silu(x @ G^T) * (x @ U^T)) @ D^T; gate and up are scratch (at prefill rows they hold
 * fp16 values) */
void cuda_product_mlp(cuda_backend *cb, float *y, const cuda_mat *g, const cuda_mat *u,
                      const cuda_mat *d, const float *x, float *gate, float *up, int64_t n);

/* ==== Kernels (kernels.cu) ==== */

void cuda_embed(cudaStream_t s, float *y, const cuda_mat *w, const int32_t *ids, int64_t n,
                float scale);
void cuda_rmsnorm(cudaStream_t s, float *y, const float *x, const float *w, int64_t n, int64_t d,
                  float eps);
void cuda_add_rmsnorm(cudaStream_t s, float *y, float *x, const float *r, const float *w, int64_t n,
                      int64_t d, float eps);
void cuda_layernorm(cudaStream_t s, float *y, const float *x, const float *w, const float *b,
                    int64_t n, int64_t d, float eps);
void cuda_rope(cudaStream_t s, float *x, const int32_t *pos, int64_t n, int64_t h, int64_t hd,
               int64_t dims, const float *inv_freq, float mscale, bool traditional);
void cuda_rope_store(cudaStream_t s, float *q, float *k, const float *v, void *kpool, void *vpool,
                     const int32_t *pos, const int32_t *slot, int64_t n, int64_t h, int64_t hk,
                     int64_t hd, const float *inv_freq, float mscale, bool traditional, bool f16);
void cuda_kv_store(cudaStream_t s, void *kpool, void *vpool, const float *k, const float *v,
                   const int32_t *slot, int64_t n, int64_t kvd, bool f16);
void cuda_glu(cudaStream_t s, float *y, const float *gate, const float *up, int64_t m,
              backend_act act);
void cuda_softcap(cudaStream_t s, float *y, float cap, int64_t m);
void cuda_argmax_rows(cudaStream_t s, int32_t *ids, const float *x, int64_t n, int64_t v);
void cuda_act(cudaStream_t s, float *y, const float *x, int64_t m, backend_act kind);
void cuda_add(cudaStream_t s, float *y, const float *x, int64_t m);
void cuda_add_bias(cudaStream_t s, float *y, const float *bias, int64_t n, int64_t d);
void cuda_scale(cudaStream_t s, float *y, float a, int64_t m);
void cuda_gather_rows(cudaStream_t s, float *y, const float *x, const int32_t *idx,
                      const float *fill, int64_t n, int64_t d);
void cuda_patches(cudaStream_t s, float *y, const float *x, int64_t n, int64_t sz, int64_t p,
                  bool channels_last, bool lead);
void cuda_avg_pool(cudaStream_t s, float *y, const float *x, int64_t n, int64_t sz, int64_t k,
                   int64_t d);

/* ==== Attention (attention.cu, attention_flash.cu) ==== */

/* The first key a row at position p reads (window 0: none). */
__device__ static inline int first_key(int p, int64_t window) {
    return window > 0 && p - window + 1 > 0 ? p - (int)window + 1 : 0;
}

/* The pool row of key j of a sequence with block table table (blocks of bs positions). */
__device__ static inline int64_t kv_slot(const int32_t *table, int bs, int j) {
    return (int64_t)table[j / bs] * bs + j % bs;
}

/* out[n, h*hd] = attention of q[n, h*hd] over cb's pools as rows ar says; picks the kernel
 * (attention.cu's header). Splits of decode rows use cb->att_part. */
void cuda_attention(cuda_backend *cb, float *out, const float *q, const void *kpool,
                    const void *vpool, const attn_rows *ar);
/* k_decode's splits for ar's rows: what a recorded step depends on, not ar->keys itself. */
int cuda_attention_splits(const cuda_backend *cb, const attn_rows *ar);
/* Bytes of the split partials' scratch for head dims up to hd. */
size_t cuda_attention_scratch_bytes(int64_t hd);
/* The tensor-core kernel for fp16 pools: whether it has head dim hd; the shared-memory
 * limits its kernels need (once, at backend creation); the launch. */
bool cuda_attention_flash_fits(int64_t hd);
void cuda_attention_flash_init(void);
void cuda_attention_flash(cudaStream_t s, float *out, const float *q, const void *kpool,
                          const void *vpool, const attn_rows *ar);
void cuda_attention_full(cudaStream_t s, float *out, const float *q, const float *k, const float *v,
                         int64_t n, int64_t seg, int64_t h, int64_t hk, int64_t hd, float scale);

#endif

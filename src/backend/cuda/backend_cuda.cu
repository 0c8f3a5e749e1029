/*
 * backend_cuda.cu - the "cuda" backend class: devices, the weights' device copy, a
 * backend's stream and memory, and the op table that queues kernels (kernels.cu,
 * attention.cu) and cuBLAS products on that stream; and the entry point of the module
 * (celer-cuda.so) the class is built into.
 *
 * Every op is queued on the backend's one stream and returns at once; only download waits.
 * Products are matmul.cu's. No op allocates.
 *
 * Steps of few rows (decode) are recorded as CUDA graphs and replayed: a step first only
 * hashes its calls (op, pointers, sizes, scalars); when a recorded step made the very same
 * calls its graph is launched, otherwise end asks for the step again and records it.
 *
 * Failures (backend.h, cuda_internal.h): every entry point opens a cuda_scope on the
 * backend's fault, and once it holds a failure the ops, uploads and downloads do nothing.
 * A graph that cannot be recorded, instantiated or launched (and did not lose the device)
 * is dropped and the step asked for again, run as called; after GRAPH_FAILURES_MAX such
 * failures in a row the backend stops recording graphs. CELER_FAULT_STEP makes a step fail
 * for real (inject): a launch the device refuses, an allocation it cannot give, or a store
 * to address 0 that loses the device.
 */
#include "backend/cuda/cuda_internal.h"

extern "C" {
#include "backend/module.h"
#include "base/error.h"
}

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLAS_WORKSPACE ((size_t)32 << 20)

/* ==== Failures ==== */

static thread_local backend_fault *scope_fault; /* the open cuda_scope's, or NULL */
static thread_local const char *scope_what;

cuda_scope::cuda_scope(backend_fault *f, const char *what) : prev(scope_fault), prev_what(scope_what) {
    scope_fault = f;
    scope_what = what;
}

/* The errors CUDA documents as leaving the process's context unusable. */
static bool sticky_code(cudaError_t err) {
    switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorECCUncorrectable:
        return true;
    default:
        return false;
    }
}

/* Clears a recoverable error from CUDA's last-error state (so the next call is not blamed
 * for it); whether err left the device unusable: a sticky code, or an error that stays. */
static bool sticky_after(cudaError_t err) {
    cudaGetLastError();
    return sticky_code(err) || cudaPeekAtLastError() != cudaSuccess;
}

/* Records a failure in the open scope's fault (file NULL: found after the fact). */
static void note(bool sticky, bool oom, const char *what, const char *file, int line, const char *reason,
                 const char *name) {
    const celer_status s = sticky ? CELER_STATUS_DEVICE_LOST : oom ? CELER_STATUS_OUT_OF_MEMORY : CELER_STATUS_DEVICE;
    char where[256] = "";
    if (file) snprintf(where, sizeof where, " at %s:%d", file, line);
    const char *tail = sticky ? "; the device is unusable until the process restarts" : "";
    if (!scope_fault) {
        fprintf(stderr, "celer: cuda: %s%s: %s (%s)%s\n", what, where, reason, name, tail);
        return;
    }
    backend_fail(scope_fault, s, sticky, "cuda: %s: %s%s: %s (%s)%s", scope_what, what, where, reason, name, tail);
}

bool cuda_check(cudaError_t err, const char *what, const char *file, int line) {
    if (err == cudaSuccess) return true;
    note(sticky_after(err), err == cudaErrorMemoryAllocation, what, file, line, cudaGetErrorString(err),
         cudaGetErrorName(err));
    return false;
}

bool cublas_check(cublasStatus_t st, const char *what, const char *file, int line) {
    if (st == CUBLAS_STATUS_SUCCESS) return true;
    /* cuBLAS fails on a lost device too: CUDA's own state tells */
    note(sticky_after(cudaSuccess), st == CUBLAS_STATUS_ALLOC_FAILED, what, file, line, cuda_blas.status_string(st),
         cuda_blas.status_name(st));
    return false;
}

cuda_scope::~cuda_scope() {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        note(sticky_after(err), err == cudaErrorMemoryAllocation, "a kernel launch", NULL, 0,
             cudaGetErrorString(err), cudaGetErrorName(err));
    scope_fault = prev;
    scope_what = prev_what;
}

const float *cuda_vec(const cuda_backend *cb, const float *host) {
    if (!host) return NULL;
    const cuda_weights *w = (const cuda_weights *)cb->base.weights;
    const char *p = (const char *)host;
    for (int64_t i = 0; w && i < w->n_vec; i++)
        if (p >= w->vec[i].host && p < w->vec[i].host + w->vec[i].bytes)
            return (const float *)(w->vec[i].dev + (p - w->vec[i].host));
    CELER_ASSERT(!"a weight vector outside the model's vector arenas");
    return NULL;
}

const cuda_mat *cuda_mat_of(const cuda_backend *cb, const matview *w) {
    const cuda_weights *cw = (const cuda_weights *)cb->base.weights;
    CELER_ASSERT(cw && w->id > 0 && w->id <= cw->n);
    return &cw->mats[w->id - 1];
}

/* ==== Step signatures ==== */

enum {
    OP_MATMUL = 1, OP_EMBED, OP_RMSNORM, OP_LAYERNORM, OP_ROPE, OP_KV_STORE, OP_ATTENTION, OP_ATTENTION_FULL,
    OP_GLU, OP_ACT, OP_SOFTCAP, OP_ADD, OP_ADD_BIAS, OP_SCALE, OP_PATCHES, OP_COPY_ROWS, OP_GATHER_ROWS, OP_ADD_RMSNORM,
    OP_ROPE_STORE, OP_MATMUL_MULTI, OP_GLU_MATMUL, OP_GLU_MLP, OP_AVG_POOL, OP_COUNT_
};

/* The names failures are reported under. */
static const char *const op_names[OP_COUNT_] = {
    "", "matmul", "embed", "rmsnorm", "layernorm", "rope", "kv_store", "attention", "attention_full", "glu", "act",
    "softcap", "add", "add_bias", "scale", "patches", "copy_rows", "gather_rows", "add_rmsnorm", "rope_store",
    "matmul_multi", "glu_matmul", "glu_mlp", "avg_pool",
};

static cuda_backend *cb_of(backend *be) { return (cuda_backend *)be; }

/* The scope of one call into cb: its failures go to cb's fault under the op's name. */
struct op_scope : cuda_scope {
    op_scope(cuda_backend *cb, const char *what) : cuda_scope(&cb->base.fault, what) {}
    op_scope(cuda_backend *cb, int op) : cuda_scope(&cb->base.fault, op_names[op]) {}
};

/* FNV-1a over the bytes of each argument (pointers, sizes, scalars: no padding). */
template <typename T> static void mix(uint64_t *h, const T &v) {
    const unsigned char *p = (const unsigned char *)&v;
    for (size_t i = 0; i < sizeof v; i++) *h = (*h ^ p[i]) * 0x100000001b3ull;
}
static void mix_all(uint64_t *h) { (void)h; }
template <typename T, typename... R> static void mix_all(uint64_t *h, const T &v, const R &...r) {
    mix(h, v);
    mix_all(h, r...);
}

/* Adds a call to the step's signature; true when it must not be queued (a step being
 * checked against its recorded graph, or a backend that failed). */
template <typename... A> static bool noted(cuda_backend *cb, int op, const A &...a) {
    if (backend_failed(&cb->base)) return true;
    if (cb->mode == STEP_EAGER) return false;
    mix(&cb->sig, op);
    mix_all(&cb->sig, a...);
    return cb->mode == STEP_CHECK;
}

/* ==== Devices ==== */

static int cuda_device_count(celer_error *e) {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        /* cudart says "driver version is insufficient" where there is no driver at all */
        if (err == cudaErrorInsufficientDriver && !dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD))
            error_set(e, CELER_STATUS_UNSUPPORTED, "no NVIDIA driver (libcuda.so.1) is installed");
        else
            error_set(e, CELER_STATUS_UNSUPPORTED, "%s", cudaGetErrorString(err));
        return 0;
    }
    return n;
}

static void cuda_device_name(int device, char *out, size_t size) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        snprintf(out, size, "CUDA device %d (unreadable)", device);
        return;
    }
    snprintf(out, size, "%s, %.0f GiB, sm_%d%d, %d SMs", prop.name, (double)prop.totalGlobalMem / (1 << 30),
             prop.major, prop.minor, prop.multiProcessorCount);
}

/* ==== Weights ==== */

/* Device memory for bytes, or NULL with e set. */
static void *dev_alloc(size_t bytes, celer_error *e) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        error_set(e, CELER_STATUS_OUT_OF_MEMORY, "cuda: out of device memory (%zu bytes)", bytes);
        return NULL;
    }
    return p;
}

static void free_mat(cuda_mat *m) {
    cudaFree(m->dense);
    cuda_affine_free(&m->aff);
    cuda_qmat_free(&m->q);
}

static void cuda_unprepare(backend_weights *bw) {
    cuda_weights *w = (cuda_weights *)bw;
    if (!w) return;
    cudaSetDevice(w->device);
    for (int64_t i = 0; i < w->n; i++) free_mat(&w->mats[i]);
    for (int64_t i = 0; i < w->n_vec; i++) cudaFree(w->vec[i].dev);
    free(w->mats);
    free(w->vec);
    free(w);
    cudaGetLastError(); /* what failed here is nobody's to report */
}

/* The device copy of w: dense as stored, affine in affine.h's tiled layout, other quantized
 * forms as the host holds them (qmat.h); one copy each. */
static celer_status prepare_mat(cudaStream_t s, cuda_mat *d, const matview *w, int64_t *bytes, celer_error *e) {
    d->rows = w->rows, d->cols = w->cols, d->bits = w->quant_bits, d->group = w->group, d->type = w->type;
    if (!w->quant_bits) {
        const size_t n = (size_t)(w->rows * w->cols) * dtype_size(w->type);
        if (!(d->dense = dev_alloc(n, e))) return CELER_STATUS_OUT_OF_MEMORY;
        *bytes += (int64_t)n;
        CUDA_CHECK(cudaMemcpyAsync(d->dense, w->data, n, cudaMemcpyHostToDevice, s)); /* the caller sees a failure */
        return CELER_OK;
    }
    char msg[256];
    if (!cuda_affine_takes(w)) { /* every other quantized form: the host's layout (qmat.h) */
        if (!cuda_qmat_supported(w, msg, sizeof msg))
            return error_set(e, CELER_STATUS_UNSUPPORTED, "cuda: %s", msg);
        if (cuda_qmat_upload(&d->q, w, s, msg, sizeof msg))
            return error_set(e, sticky_after(cudaSuccess) ? CELER_STATUS_DEVICE_LOST : CELER_STATUS_OUT_OF_MEMORY,
                             "cuda: quantized weights [%lld x %lld]: %s", (long long)w->rows, (long long)w->cols, msg);
        *bytes += (int64_t)d->q.bytes;
        return CELER_OK;
    }
    if (cuda_affine_upload(&d->aff, w, s, msg, sizeof msg))
        return error_set(e, sticky_after(cudaSuccess) ? CELER_STATUS_DEVICE_LOST : CELER_STATUS_OUT_OF_MEMORY,
                         "cuda: affine weights [%lld x %lld]: %s", (long long)w->rows, (long long)w->cols, msg);
    *bytes += (int64_t)d->aff.bytes;
    return CELER_OK;
}

/* cuda_prepare's work; a failed CUDA call lands in f (the loops stop at it). */
static celer_status prepare_weights(const weight_set *ws, const backend_params *p, backend_weights **out,
                                    const backend_fault *f, celer_error *e) {
    cuda_weights *w = (cuda_weights *)calloc(1, sizeof *w);
    celer_status s = CELER_OK;
    cudaStream_t st = NULL;
    if (!w || !(w->mats = (cuda_mat *)calloc((size_t)(ws->n_mats > 0 ? ws->n_mats : 1), sizeof *w->mats))) {
        s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    w->base.cls = &backend_cuda_class;
    w->base.whole = true; /* every matrix and vector is copied */
    w->device = p->device;
    w->n = ws->n_mats;
    if (!CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking))) {
        st = NULL;
        goto out;
    }
    for (int64_t i = 0; i < ws->n_mats && s == CELER_OK && f->status == CELER_OK; i++) {
        CELER_ASSERT(ws->mats[i]->id == i + 1);
        s = prepare_mat(st, &w->mats[i], ws->mats[i], &w->base.bytes, e);
        if (s == CELER_OK && ws->done) ws->done(ws->arg, ws->mats[i]);
        if (w->mats[i].bits && w->mats[i].rows * w->mats[i].cols > w->affine_elems)
            w->affine_elems = w->mats[i].rows * w->mats[i].cols;
        if (w->mats[i].bits && w->mats[i].cols > w->affine_cols) w->affine_cols = w->mats[i].cols;
        for (int64_t n = 1; s == CELER_OK && w->mats[i].bits && !cuda_mat_general(&w->mats[i]) && n <= GEMV_ROWS; n++) {
            const size_t need = cuda_affine_work_size(&w->mats[i].aff, n);
            if (need > w->gemv_work) w->gemv_work = need;
        }
    }
    /* products of one input come in model order (q, k, v; gate, up): room for any run of
     * consecutive matrices that can share a launch (a set that does not fit runs its
     * products one by one) */
    for (int64_t i = 0; i < w->n && s == CELER_OK; i++) {
        const cuda_affine *run[CUDA_AFFINE_SET];
        int k = 0;
        while (k < CUDA_AFFINE_SET && i + k < w->n && w->mats[i + k].bits && !cuda_mat_general(&w->mats[i + k]) &&
               !cuda_mat_general(&w->mats[i]) && cuda_affine_compatible(&w->mats[i].aff, &w->mats[i + k].aff))
            run[k] = &w->mats[i + k].aff, k++;
        for (int64_t n = 1; k > 1 && n <= GEMV_ROWS; n++) {
            const size_t need = cuda_affine_gemv_set_work_size(run, k, n);
            if (need > w->gemv_work) w->gemv_work = need;
        }
    }
    /* every block of the vector arenas, mirrored as it is */
    for (int64_t a = 0; a < ws->n_vectors && s == CELER_OK && f->status == CELER_OK; a++) {
        const void *base;
        size_t used;
        for (int64_t b = 0; s == CELER_OK && arena_block_at(ws->vectors[a], b, &base, &used); b++) {
            cuda_vec_block *nv = (cuda_vec_block *)realloc(w->vec, sizeof *w->vec * (size_t)(w->n_vec + 1));
            if (!nv) {
                s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
                break;
            }
            w->vec = nv;
            cuda_vec_block *vb = &w->vec[w->n_vec];
            vb->host = (const char *)base, vb->bytes = used;
            if (!(vb->dev = (char *)dev_alloc(used, e))) {
                s = CELER_STATUS_OUT_OF_MEMORY;
                break;
            }
            w->n_vec++;
            w->base.bytes += (int64_t)used;
            CUDA_CHECK(cudaMemcpyAsync(vb->dev, base, used, cudaMemcpyHostToDevice, st));
        }
    }
    CUDA_CHECK(cudaStreamSynchronize(st));
out:
    if (st) cudaStreamDestroy(st);
    *out = w ? &w->base : NULL;
    return s;
}

static celer_status cuda_prepare(const weight_set *ws, const backend_params *p, backend_weights **out,
                                 celer_error *e) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    *out = NULL;
    backend_fault f = {};
    backend_weights *w = NULL;
    celer_status s;
    {
        const cuda_scope scope(&f, "prepare");
        s = CUDA_CHECK(cudaSetDevice(p->device)) ? prepare_weights(ws, p, &w, &f, e) : CELER_OK;
    }
    if (s == CELER_OK && f.status != CELER_OK) s = error_set(e, f.status, "%s", f.msg);
    if (s != CELER_OK) {
        cuda_unprepare(w);
        return s;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    w->ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
    *out = w;
    return CELER_OK;
}

/* ==== Memory ==== */

/* NULL when the device has no room: the caller says so, so only a lost device is
 * recorded. */
static void *cuda_alloc(backend *be, size_t bytes) {
    cuda_backend *cb = cb_of(be);
    CELER_ASSERT(cb->mode == STEP_EAGER);
    if (backend_failed(be)) return NULL;
    const op_scope scope(cb, "alloc");
    void *p = NULL;
    if (!CUDA_CHECK(cudaSetDevice(cb->device))) return NULL;
    const cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        if (sticky_after(err))
            note(true, false, "cudaMalloc", __FILE__, __LINE__, cudaGetErrorString(err), cudaGetErrorName(err));
        return NULL;
    }
    if (!CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cb->stream))) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_release(backend *be, void *p) {
    const op_scope scope(cb_of(be), "release");
    if (CUDA_CHECK(cudaSetDevice(cb_of(be)->device))) CUDA_CHECK(cudaFree(p));
}

static void cuda_upload(backend *be, void *dst, const void *src, size_t bytes) {
    cuda_backend *cb = cb_of(be);
    CELER_ASSERT(cb->mode == STEP_EAGER); /* inputs go up before a step */
    if (backend_failed(be)) return;
    const op_scope scope(cb, "upload");
    if (CUDA_CHECK(cudaSetDevice(cb->device)))
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cb->stream));
}

/* Where the step failed dst is left as it is. */
static void cuda_download(backend *be, void *dst, const void *src, size_t bytes) {
    cuda_backend *cb = cb_of(be);
    CELER_ASSERT(cb->mode == STEP_EAGER); /* rows come down after a step */
    if (backend_failed(be)) return;
    const op_scope scope(cb, "download");
    if (CUDA_CHECK(cudaSetDevice(cb->device)) &&
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cb->stream)))
        CUDA_CHECK(cudaStreamSynchronize(cb->stream));
}

static void cuda_copy_rows(backend *be, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t n, int64_t d) {
    if (noted(cb_of(be), OP_COPY_ROWS, y, ldy, x, ldx, n, d)) return;
    const op_scope scope(cb_of(be), OP_COPY_ROWS);
    CUDA_CHECK(cudaMemcpy2DAsync(y, sizeof(float) * (size_t)ldy, x, sizeof(float) * (size_t)ldx,
                                 sizeof(float) * (size_t)d, (size_t)n, cudaMemcpyDeviceToDevice, cb_of(be)->stream));
}

static void cuda_gather(backend *be, float *y, const float *x, const int32_t *idx, const float *fill, int64_t n,
                        int64_t d) {
    cuda_backend *cb = cb_of(be);
    if (noted(cb, OP_GATHER_ROWS, y, x, idx, fill, n, d)) return;
    const op_scope scope(cb, OP_GATHER_ROWS);
    cuda_gather_rows(cb->stream, y, x, idx, cuda_vec(cb, fill), n, d);
}

/* The prefill product's work: x staged for the widest input, and room for the partial sums
 * of K splits (two splits of max_cols output rows, or more of fewer rows: the products
 * that leave the device idle have few rows, as the 4096-row o and down of an 8B model). */
static size_t gemm_work_bytes(int64_t rows, int64_t max_cols) {
    if (!rows) return 0;
    return cuda_affine_gemm_work_bound(rows, max_cols) + 256 + cuda_affine_gemm_split_bytes(rows, max_cols, 2);
}

/* *buf regrown to bytes (what it held goes; the free waits for the work using it), or
 * false with *buf NULL where the device has no room. */
static bool regrow(void **buf, size_t bytes) {
    CUDA_CHECK(cudaFree(*buf));
    *buf = NULL;
    if (CUDA_CHECK(cudaMalloc(buf, bytes))) return true;
    *buf = NULL;
    return false;
}

/* The products' buffers that grow with the weights attached to cb (a context attaches them
 * after create): the GEMV's work, the dense prefill product's fp16 rows, and the affine
 * prefill product's work (for fewer rows where the dense path takes the rest). Called where
 * nothing is being recorded: before a step, and by products queued as called. false where
 * the device has no room (the failure is noted; the buffer is tried again at the next call). */
static bool work_reserve(cuda_backend *cb) {
    const cuda_weights *w = (const cuda_weights *)cb->base.weights;
    const size_t need = w ? w->gemv_work : 0;
    if (need > cb->gemv_work_size) {
        CELER_ASSERT(cb->mode == STEP_EAGER);
        cb->gemv_work_size = 0;
        if (!regrow(&cb->gemv_work, need) || !CUDA_CHECK(cudaMemsetAsync(cb->gemv_work, 0, need, cb->stream)))
            return false;
        cb->gemv_work_size = need;
    }
    const int64_t halves = cuda_dense_elems(cb);
    if (halves > cb->wh_elems) {
        CELER_ASSERT(cb->mode == STEP_EAGER);
        CUDA_CHECK(cudaStreamSynchronize(cb->side)); /* no dequantization into the old ones */
        cb->wh_elems = 0;
        for (int b = 0; b < 2; b++) {
            cb->wh_mat[b] = NULL;
            if (!regrow((void **)&cb->wh[b], sizeof(__half) * (size_t)halves)) return false;
        }
        cb->wh_elems = halves;
    }
    const size_t gemm = gemm_work_bytes(cuda_gemm_rows(cb), cb->p.max_cols);
    if (gemm > cb->gemm_work_size) {
        CELER_ASSERT(cb->mode == STEP_EAGER);
        cb->gemm_work_size = 0;
        if (!regrow(&cb->gemm_work, gemm)) return false;
        cb->gemm_work_size = gemm;
    }
    return true;
}

/* A store to address 0: the kernel dies, and the context with it. */
__global__ static void k_fault(int *p) { *(volatile int *)p = 1; }

/* The failure CELER_FAULT_STEP asks for, for real, on the stream ahead of the step. */
static void inject(cuda_backend *cb) {
    switch (cb->base.fault.inject_kind) {
    case BACKEND_FAULT_ERROR: /* more threads a block than any GPU has: refused at launch */
        k_fault<<<1, 4096, 0, cb->stream>>>(nullptr);
        cuda_check(cudaGetLastError(), "k_fault<<<1, 4096>>> (CELER_FAULT_STEP)", __FILE__, __LINE__);
        break;
    case BACKEND_FAULT_OOM: {
        void *p = NULL;
        if (CUDA_CHECK(cudaMalloc(&p, (size_t)1 << 60))) cudaFree(p);
        break;
    }
    case BACKEND_FAULT_STICKY: /* found where the next call waits for the device */
        k_fault<<<1, 1, 0, cb->stream>>>(nullptr);
        break;
    }
}

static void cuda_begin(backend *be, int64_t rows) {
    cuda_backend *cb = cb_of(be);
    const op_scope scope(cb, "begin");
    const bool again = cb->again, eager = cb->eager_once;
    cb->again = cb->eager_once = false;
    cb->mode = STEP_EAGER;
    if (backend_failed(be) || !CUDA_CHECK(cudaSetDevice(cb->device))) return;
    if (!again && backend_fault_step(&be->fault)) inject(cb);
    if (backend_failed(be) || !work_reserve(cb)) return;
    cuda_trace_begin(cb->stream);
    cb->sig = 0xcbf29ce484222325ull;
    mix(&cb->sig, rows);
    if (rows > GRAPH_ROWS || eager || cb->graph_failures >= GRAPH_FAILURES_MAX) {
        cb->mode = STEP_EAGER;
    } else if (cb->recapture) {
        if (CUDA_CHECK(cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal))) cb->mode = STEP_CAPTURE;
    } else {
        cb->mode = STEP_CHECK;
    }
}

static cuda_graph *graph_find(cuda_backend *cb, uint64_t sig) {
    for (int i = 0; i < GRAPH_CACHE; i++)
        if (cb->graphs[i].exec && cb->graphs[i].sig == sig) return &cb->graphs[i];
    return NULL;
}

/* The slot a new graph goes to: a free one, else the least recently used. */
static cuda_graph *graph_slot(cuda_backend *cb) {
    cuda_graph *g = &cb->graphs[0];
    for (int i = 0; i < GRAPH_CACHE; i++) {
        if (!cb->graphs[i].exec) return &cb->graphs[i];
        if (cb->graphs[i].used < g->used) g = &cb->graphs[i];
    }
    CUDA_CHECK(cudaGraphExecDestroy(g->exec));
    g->exec = NULL;
    return g;
}

/* A graph that could not be recorded, instantiated or launched (err, of the call what at
 * line): a lost device fails the step; otherwise the step is asked for again and run as
 * called, and after GRAPH_FAILURES_MAX of these in a row no step is recorded again. */
static bool graph_failed(cuda_backend *cb, cudaError_t err, const char *what, int line) {
    if (sticky_after(err)) {
        note(true, false, what, __FILE__, line, cudaGetErrorString(err), cudaGetErrorName(err));
        return true;
    }
    if (++cb->graph_failures == GRAPH_FAILURES_MAX)
        fprintf(stderr, "celer: cuda: %s failed %d times in a row (%s): steps run without CUDA graphs from now on\n",
                what, GRAPH_FAILURES_MAX, cudaGetErrorString(err));
    cb->eager_once = cb->again = true;
    return false;
}

static bool cuda_end(backend *be) {
    cuda_backend *cb = cb_of(be);
    const op_scope scope(cb, "end");
    const step_mode mode = cb->mode;
    cb->mode = STEP_EAGER;
    if (backend_failed(be)) {
        if (mode == STEP_CAPTURE) { /* the stream leaves capture; what was recorded goes */
            cudaGraph_t graph = NULL;
            if (cudaStreamEndCapture(cb->stream, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
            cudaGetLastError();
        }
        return true;
    }
    if (mode == STEP_EAGER) {
        cuda_trace_end(cb->stream);
        return true;
    }
    cuda_graph *g;
    if (mode == STEP_CHECK) {
        if (!(g = graph_find(cb, cb->sig))) {
            cb->recapture = cb->again = true; /* never seen: call the ops again, recording them */
            return false;
        }
    } else {
        cudaGraph_t graph = NULL;
        cudaGraphExec_t exec = NULL;
        cudaError_t err = cudaStreamEndCapture(cb->stream, &graph);
        if (err != cudaSuccess) return graph_failed(cb, err, "cudaStreamEndCapture", __LINE__);
        err = cudaGraphInstantiate(&exec, graph, 0);
        cudaGraphDestroy(graph);
        if (err != cudaSuccess) return graph_failed(cb, err, "cudaGraphInstantiate", __LINE__);
        g = graph_slot(cb);
        g->exec = exec;
        g->sig = cb->sig;
        cb->recapture = false;
    }
    g->used = ++cb->tick;
    const cudaError_t err = cudaGraphLaunch(g->exec, cb->stream);
    if (err != cudaSuccess) {
        cudaGraphExecDestroy(g->exec);
        g->exec = NULL;
        return graph_failed(cb, err, "cudaGraphLaunch", __LINE__);
    }
    cb->graph_failures = 0;
    cuda_trace_end(cb->stream);
    return true;
}

/* ==== Ops ==== */

static void cuda_matmul(backend *be, float *y, const matview *w, const float *x, int64_t n) {
    cuda_backend *cb = cb_of(be);
    if (noted(cb, OP_MATMUL, y, w, x, n)) return;
    const op_scope scope(cb, OP_MATMUL);
    const cuda_mat *m = cuda_mat_of(cb, w);
    CELER_ASSERT(n <= cb->p.max_rows && m->cols <= cb->p.max_cols);
    if (cb->mode == STEP_EAGER && !work_reserve(cb)) return;
    cuda_product(cb, y, m, x, n);
}

static void cuda_op_glu(backend *be, float *y, const float *gate, const float *up, int64_t m, backend_act act) {
    if (noted(cb_of(be), OP_GLU, y, gate, up, m, act)) return;
    const op_scope scope(cb_of(be), OP_GLU);
    cuda_glu(cb_of(be)->stream, y, gate, up, m, act);
}

/* SwiGLU is staged inside the products (decode) or written in fp16 for them (prefill);
 * another activation is a glu launch before the plain product. */
static void cuda_op_glu_matmul(backend *be, float *y, const matview *w, float *gate, const float *up, int64_t n,
                               backend_act act) {
    cuda_backend *cb = cb_of(be);
    if (act != BACKEND_ACT_SILU) {
        cuda_op_glu(be, gate, gate, up, n * w->cols, act);
        cuda_matmul(be, y, w, gate, n);
        return;
    }
    if (noted(cb, OP_GLU_MATMUL, y, w, gate, up, n)) return;
    const op_scope scope(cb, OP_GLU_MATMUL);
    const cuda_mat *m = cuda_mat_of(cb, w);
    CELER_ASSERT(n <= cb->p.max_rows && m->cols <= cb->p.max_cols);
    if (cb->mode == STEP_EAGER && !work_reserve(cb)) return;
    cuda_product_swiglu(cb, y, m, gate, up, n);
}

static void cuda_op_matmul_multi(backend *be, float *const *ys, const matview *const *ws, int k, const float *x,
                                 int64_t n);

static void cuda_op_glu_mlp(backend *be, float *y, const matview *g, const matview *u, const matview *down,
                            const float *x, float *gate, float *up, int64_t n, backend_act act) {
    cuda_backend *cb = cb_of(be);
    if (act != BACKEND_ACT_SILU) {
        float *const ys[2] = {gate, up};
        const matview *const ws[2] = {g, u};
        cuda_op_matmul_multi(be, ys, ws, 2, x, n);
        cuda_op_glu_matmul(be, y, down, gate, up, n, act);
        return;
    }
    if (noted(cb, OP_GLU_MLP, y, g, u, down, x, gate, up, n)) return;
    const op_scope scope(cb, OP_GLU_MLP);
    const cuda_mat *mg = cuda_mat_of(cb, g), *mu = cuda_mat_of(cb, u), *md = cuda_mat_of(cb, down);
    CELER_ASSERT(n <= cb->p.max_rows && mg->cols <= cb->p.max_cols && md->cols <= cb->p.max_cols);
    if (cb->mode == STEP_EAGER && !work_reserve(cb)) return;
    cuda_product_mlp(cb, y, mg, mu, md, x, gate, up, n);
}

static void cuda_op_matmul_multi(backend *be, float *const *ys, const matview *const *ws, int k, const float *x,
                                 int64_t n) {
    cuda_backend *cb = cb_of(be);
    if (k > CUDA_AFFINE_SET) {
        for (int i = 0; i < k; i++) cuda_matmul(be, ys[i], ws[i], x, n);
        return;
    }
    if (cb->mode != STEP_EAGER)
        for (int i = 0; i < k; i++) mix_all(&cb->sig, ys[i], ws[i]);
    if (noted(cb, OP_MATMUL_MULTI, k, x, n)) return;
    const op_scope scope(cb, OP_MATMUL_MULTI);
    const cuda_mat *ms[CUDA_AFFINE_SET];
    for (int i = 0; i < k; i++) {
        ms[i] = cuda_mat_of(cb, ws[i]);
        CELER_ASSERT(n <= cb->p.max_rows && ms[i]->cols <= cb->p.max_cols);
    }
    if (cb->mode == STEP_EAGER && !work_reserve(cb)) return;
    cuda_product_set(cb, ys, ms, k, x, n);
}

static void cuda_op_embed(backend *be, float *y, const matview *w, const int32_t *ids, int64_t n, float scale) {
    cuda_backend *cb = cb_of(be);
    if (noted(cb, OP_EMBED, y, w, ids, n, scale)) return;
    const op_scope scope(cb, OP_EMBED);
    cuda_embed(cb->stream, y, cuda_mat_of(cb, w), ids, n, scale);
}

static void cuda_op_rmsnorm(backend *be, float *y, const float *x, const float *w, int64_t n, int64_t d, float eps) {
    cuda_backend *cb = cb_of(be);
    if (noted(cb, OP_RMSNORM, y, x, w, n, d, eps)) return;
    const op_scope scope(cb, OP_RMSNORM);
    cuda_rmsnorm(cb->stream, y, x, cuda_vec(cb, w), n, d, eps);
}

static void cuda_op_layernorm(backend *be, float *y, const float *x, const float *w, const float *b, int64_t n,
                              int64_t d, float eps) {
    cuda_backend *cb = cb_of(be);
    if (noted(cb, OP_LAYERNORM, y, x, w, b, n, d, eps)) return;
    const op_scope scope(cb, OP_LAYERNORM);
    cuda_layernorm(cb->stream, y, x, cuda_vec(cb, w), cuda_vec(cb, b), n, d, eps);
}

static void cuda_op_rope(backend *be, float *x, const int32_t *pos, int64_t n, int64_t h, int64_t hd,
                         const rope_params *rp) {
    cuda_backend *cb = cb_of(be);
    if (noted(cb, OP_ROPE, x, pos, n, h, hd, rp)) return;
    const op_scope scope(cb, OP_ROPE);
    cuda_rope(cb->stream, x, pos, n, h, hd, rope_dims(rp, hd), cuda_vec(cb, rp->inv_freq), rp->mscale,
              rp->traditional);
}

static void cuda_op_kv_store(backend *be, void *kpool, void *vpool, const float *k, const float *v,
                             const int32_t *slot, int64_t n, int64_t kvd) {
    if (noted(cb_of(be), OP_KV_STORE, kpool, vpool, k, v, slot, n, kvd)) return;
    const op_scope scope(cb_of(be), OP_KV_STORE);
    cuda_kv_store(cb_of(be)->stream, kpool, vpool, k, v, slot, n, kvd, be->kv_f16);
}

static void cuda_op_attention(backend *be, float *out, const float *q, const void *kpool, const void *vpool,
                              const attn_rows *rows) {
    const attn_rows *r = rows;
    /* the decode splits, not r->keys: a recorded step is replayed while they stay the same */
    if (noted(cb_of(be), OP_ATTENTION, out, q, kpool, vpool, r->n, r->pos, r->limit, r->seq, r->tables, r->table_cols,
              r->block_size, r->window, r->h, r->hk, r->hd, r->scale, r->softcap, r->seqs, cuda_attention_splits(cb_of(be), r)))
        return;
    const op_scope scope(cb_of(be), OP_ATTENTION);
    cuda_attention(cb_of(be), out, q, kpool, vpool, rows);
}

static void cuda_op_attention_full(backend *be, float *out, const float *q, const float *k, const float *v,
                                   int64_t n, int64_t seg, int64_t h, int64_t hk, int64_t hd, float scale) {
    if (noted(cb_of(be), OP_ATTENTION_FULL, out, q, k, v, n, seg, h, hk, hd, scale)) return;
    const op_scope scope(cb_of(be), OP_ATTENTION_FULL);
    cuda_attention_full(cb_of(be)->stream, out, q, k, v, n, seg, h, hk, hd, scale);
}

static void cuda_op_softcap(backend *be, float *y, float cap, int64_t m) {
    if (noted(cb_of(be), OP_SOFTCAP, y, cap, m)) return;
    const op_scope scope(cb_of(be), OP_SOFTCAP);
    cuda_softcap(cb_of(be)->stream, y, cap, m);
}

/* Between steps, on the stream (the download after it waits for it). */
static void cuda_op_argmax_rows(backend *be, int32_t *ids, const float *x, int64_t n, int64_t v) {
    if (backend_failed(be)) return;
    const op_scope scope(cb_of(be), "argmax_rows");
    cuda_argmax_rows(cb_of(be)->stream, ids, x, n, v);
}

static void cuda_op_act(backend *be, float *y, const float *x, int64_t m, backend_act kind) {
    if (noted(cb_of(be), OP_ACT, y, x, m, kind)) return;
    const op_scope scope(cb_of(be), OP_ACT);
    cuda_act(cb_of(be)->stream, y, x, m, kind);
}

static void cuda_op_add(backend *be, float *y, const float *x, int64_t m) {
    if (noted(cb_of(be), OP_ADD, y, x, m)) return;
    const op_scope scope(cb_of(be), OP_ADD);
    cuda_add(cb_of(be)->stream, y, x, m);
}

static void cuda_op_add_bias(backend *be, float *y, const float *bias, int64_t n, int64_t d) {
    cuda_backend *cb = cb_of(be);
    if (noted(cb, OP_ADD_BIAS, y, bias, n, d)) return;
    const op_scope scope(cb, OP_ADD_BIAS);
    cuda_add_bias(cb->stream, y, cuda_vec(cb, bias), n, d);
}

static void cuda_op_scale(backend *be, float *y, float s, int64_t m) {
    if (noted(cb_of(be), OP_SCALE, y, s, m)) return;
    const op_scope scope(cb_of(be), OP_SCALE);
    cuda_scale(cb_of(be)->stream, y, s, m);
}

static void cuda_op_patches(backend *be, float *y, const float *x, int64_t n, int64_t s, int64_t p,
                            bool channels_last, bool lead) {
    if (noted(cb_of(be), OP_PATCHES, y, x, n, s, p, channels_last, lead)) return;
    const op_scope scope(cb_of(be), OP_PATCHES);
    cuda_patches(cb_of(be)->stream, y, x, n, s, p, channels_last, lead);
}

static void cuda_op_avg_pool(backend *be, float *y, const float *x, int64_t n, int64_t s, int64_t k, int64_t d) {
    if (noted(cb_of(be), OP_AVG_POOL, y, x, n, s, k, d)) return;
    const op_scope scope(cb_of(be), OP_AVG_POOL);
    cuda_avg_pool(cb_of(be)->stream, y, x, n, s, k, d);
}

static void cuda_op_add_rmsnorm(backend *be, float *y, float *x, const float *r, const float *w, int64_t n, int64_t d,
                                float eps) {
    cuda_backend *cb = cb_of(be);
    if (noted(cb, OP_ADD_RMSNORM, y, x, r, w, n, d, eps)) return;
    const op_scope scope(cb, OP_ADD_RMSNORM);
    cuda_add_rmsnorm(cb->stream, y, x, r, cuda_vec(cb, w), n, d, eps);
}

static void cuda_op_rope_store(backend *be, float *q, float *k, const float *v, void *kpool, void *vpool,
                               const int32_t *pos, const int32_t *slot, int64_t n, int64_t h, int64_t hk, int64_t hd,
                               const rope_params *rp) {
    cuda_backend *cb = cb_of(be);
    if (rope_dims(rp, hd) != hd) { /* partial rotary: the fused kernel stores turned pairs only */
        cuda_op_rope(be, q, pos, n, h, hd, rp);
        cuda_op_rope(be, k, pos, n, hk, hd, rp);
        cuda_op_kv_store(be, kpool, vpool, k, v, slot, n, hk * hd);
        return;
    }
    if (noted(cb, OP_ROPE_STORE, q, k, v, kpool, vpool, pos, slot, n, h, hk, hd, rp)) return;
    const op_scope scope(cb, OP_ROPE_STORE);
    cuda_rope_store(cb->stream, q, k, v, kpool, vpool, pos, slot, n, h, hk, hd, cuda_vec(cb, rp->inv_freq), rp->mscale,
                    rp->traditional, be->kv_f16);
}

/* What the backend holds, with the buffers that grow with the weights counted at the size
 * the first step gives them (the weights arrive after the backend). */
static int64_t cuda_work_bytes(const backend *be) {
    const cuda_backend *cb = (const cuda_backend *)be;
    const cuda_weights *w = (const cuda_weights *)cb->base.weights;
    const size_t gemv = w && w->gemv_work > cb->gemv_work_size ? w->gemv_work : cb->gemv_work_size;
    const size_t gemm_need = gemm_work_bytes(cuda_gemm_rows(cb), cb->p.max_cols);
    const size_t gemm = gemm_need > cb->gemm_work_size ? gemm_need : cb->gemm_work_size;
    const int64_t dense = cuda_dense_elems(cb), halves = dense > cb->wh_elems ? dense : cb->wh_elems;
    return (int64_t)(gemm + 4 * (size_t)(cb->p.max_rows * cb->p.max_cols) + gemv +
                     2 * sizeof(__half) * (size_t)halves + BLAS_WORKSPACE +
                     sizeof(float) * (size_t)cb->att_part_floats);
}

static void cuda_destroy(backend *be) {
    cuda_backend *cb = cb_of(be);
    cudaSetDevice(cb->device);
    if (cb->stream) cudaStreamSynchronize(cb->stream);
    if (cb->side) cudaStreamSynchronize(cb->side);
    for (int i = 0; i < GRAPH_CACHE; i++)
        if (cb->graphs[i].exec) cudaGraphExecDestroy(cb->graphs[i].exec);
    cudaFree(cb->gemm_work);
    cudaFree(cb->xs);
    cudaFree(cb->gemv_work);
    for (int b = 0; b < 2; b++) {
        cudaFree(cb->wh[b]);
        if (cb->wh_ready[b]) cudaEventDestroy(cb->wh_ready[b]);
        if (cb->wh_free[b]) cudaEventDestroy(cb->wh_free[b]);
    }
    if (cb->side) cudaStreamDestroy(cb->side);
    cudaFree(cb->att_part);
    cudaFree(cb->blas_work);
    if (cb->blas) cuda_blas.destroy(cb->blas);
    if (cb->stream) cudaStreamDestroy(cb->stream);
    cudaGetLastError(); /* what failed here is nobody's to report */
    free(cb);
}

static const backend_ops cuda_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy_rows = cuda_copy_rows,
    .gather_rows = cuda_gather,
    .work_bytes = cuda_work_bytes,
    .begin = cuda_begin,
    .end = cuda_end,
    .matmul = cuda_matmul,
    .embed = cuda_op_embed,
    .rmsnorm = cuda_op_rmsnorm,
    .layernorm = cuda_op_layernorm,
    .rope = cuda_op_rope,
    .kv_store = cuda_op_kv_store,
    .attention_softcap = true,
    .attention_limit = true,
    .attention = cuda_op_attention,
    .attention_full = cuda_op_attention_full,
    .glu = cuda_op_glu,
    .act = cuda_op_act,
    .softcap = cuda_op_softcap,
    .add = cuda_op_add,
    .add_bias = cuda_op_add_bias,
    .scale = cuda_op_scale,
    .patches = cuda_op_patches,
    .avg_pool = cuda_op_avg_pool,
    .matmul_multi = cuda_op_matmul_multi,
    .add_rmsnorm = cuda_op_add_rmsnorm,
    .rope_store = cuda_op_rope_store,
    .glu_matmul = cuda_op_glu_matmul,
    .glu_mlp = cuda_op_glu_mlp,
    .argmax_rows = cuda_op_argmax_rows,
};

static backend *cuda_create(const backend_params *p, const backend_weights *w, celer_error *e) {
    if (p->kernels && *p->kernels && strcmp(p->kernels, "auto") != 0) {
        error_set(e, CELER_STATUS_INVALID_ARGUMENT, "kernels \"%s\": the cuda device has one kernel set (auto)",
                  p->kernels);
        return NULL;
    }
    if (cuda_blas_open(e) != CELER_OK) return NULL;
    cuda_backend *cb = (cuda_backend *)calloc(1, sizeof *cb);
    if (!cb) {
        error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    cb->base.ops = &cuda_ops;
    cb->base.kernels = "cuda";
    cb->base.kv_f16 = p->kv_f16;
    cb->base.host = false;
    cb->base.weights = w;
    cb->device = p->device;
    cb->p = *p;
    const size_t att_bytes = cuda_attention_scratch_bytes(p->hd);
    cb->att_part_floats = (int64_t)(att_bytes / sizeof(float));
    {
        const op_scope scope(cb, "create");
        const bool ok = CUDA_CHECK(cudaSetDevice(p->device)) &&
                        CUDA_CHECK(cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking)) &&
                        CUDA_CHECK(cudaStreamCreateWithFlags(&cb->side, cudaStreamNonBlocking)) &&
                        CUDA_CHECK(cudaEventCreateWithFlags(&cb->wh_ready[0], cudaEventDisableTiming)) &&
                        CUDA_CHECK(cudaEventCreateWithFlags(&cb->wh_ready[1], cudaEventDisableTiming)) &&
                        CUDA_CHECK(cudaEventCreateWithFlags(&cb->wh_free[0], cudaEventDisableTiming)) &&
                        CUDA_CHECK(cudaEventCreateWithFlags(&cb->wh_free[1], cudaEventDisableTiming)) &&
                        CUBLAS_CHECK(cuda_blas.create(&cb->blas)) &&
                        CUDA_CHECK(cudaMalloc(&cb->xs, 4 * (size_t)(p->max_rows * p->max_cols))) &&
                        CUDA_CHECK(cudaMalloc(&cb->blas_work, BLAS_WORKSPACE)) &&
                        CUDA_CHECK(cudaMalloc((void **)&cb->att_part, att_bytes)) && work_reserve(cb) &&
                        CUBLAS_CHECK(cuda_blas.set_stream(cb->blas, cb->stream)) &&
                        CUBLAS_CHECK(cuda_blas.set_workspace(cb->blas, cb->blas_work, BLAS_WORKSPACE));
        if (ok) {
            cuda_attention_flash_init();
            cuda_trace_open();
        }
    }
    if (backend_status(&cb->base, e) != CELER_OK) {
        cuda_destroy(&cb->base);
        return NULL;
    }
    backend_fault_init(&cb->base.fault);
    return &cb->base;
}

const backend_class backend_cuda_class = {
    .name = "cuda",
    /* a step dequantizes each affine weight to fp16 once for all its rows: a 2048-token
     * prompt in 512-row steps did it four times (pp2048 21,150 against 30,120 tok/s on
     * the 8B 4-bit model, H200) */
    .rows_per_step = 2048,
    .device_count = cuda_device_count,
    .device_name = cuda_device_name,
    .prepare = cuda_prepare,
    .unprepare = cuda_unprepare,
    .create = cuda_create,
    .default_threads = NULL,
    .kernels_supported = NULL,
};

/* ==== The module's entry point (module.h) ==== */

/* The one symbol celer-cuda.so exports (module.map); the registry checks abi before it
 * reads cls. */
extern "C" __attribute__((visibility("default"))) const backend_module *celer_backend_module(void) {
    static const backend_module mod = {CELER_MODULE_ABI, &backend_cuda_class};
    return &mod;
}

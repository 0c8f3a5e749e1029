/*
 * trace.h - a step's timeline, block by block, in a build made with CELER_CUDA_TRACE
 * (`make CUDA_TRACE=1 BUILD=build/trace build/trace/celer`; tools/cuda_trace.py says how
 * to take and read one). In every other build trace_scope is empty and the kernels
 * compile to the instructions they have without it.
 *
 * A traced kernel opens a trace_scope before anything else. Each of its blocks then
 * notes, in one record: the global timer when it started and when its last warp left
 * (ns, comparable across SMs), and the SM's cycles from its start to the moment the
 * kernel before it had finished (past griddepcontrol.wait), to the moment its warps were
 * done with their own work (before the partial sums of a split product) and to its end.
 * backend_cuda.cu writes one decode step's records to a file (CELER_CUDA_TRACE) and
 * tools/cuda_trace.py turns them into per-launch times.
 *
 * Launches need no argument of their own to be told apart: a block takes its record from
 * one counter and only then lets the next kernel start (griddepcontrol.launch_dependents
 * after a barrier), and a launch's dependents start only once all its blocks have done
 * so; so each launch's records are one run of indices, in stream order.
 */
#ifndef CELER_BACKEND_CUDA_TRACE_H
#define CELER_BACKEND_CUDA_TRACE_H

#include <cuda_runtime.h>
#include <stdint.h>

/* What a record's tag names: the kernel (template arguments aside). */
#define CUDA_TRACE_TAGS(X)                                                                         \
    X(TR_GEMV, "gemv")                                                                             \
    X(TR_GEMV_STREAM, "gemv_stream")                                                               \
    X(TR_RMSNORM, "rmsnorm")                                                                       \
    X(TR_ROPE, "rope")                                                                             \
    X(TR_ROPE_STORE, "rope_store")                                                                 \
    X(TR_KV_STORE, "kv_store")                                                                     \
    X(TR_SWIGLU, "swiglu")                                                                         \
    X(TR_ADD, "add")                                                                               \
    X(TR_ADD_BIAS, "add_bias")                                                                     \
    X(TR_ATT_DECODE, "attention_decode")                                                           \
    X(TR_ATT_MERGE, "attention_merge")                                                             \
    X(TR_EMBED, "embed")                                                                           \
    X(TR_ROWS, "affine_rows")                                                                      \
    X(TR_QGEMV, "qmat_gemv")                                                                       \
    X(TR_QROWS, "qmat_rows")                                                                       \
    X(TR_ARGMAX, "argmax")

#define CUDA_TRACE_ENUM(tag, name) tag,
enum cuda_trace_tag { CUDA_TRACE_TAGS(CUDA_TRACE_ENUM) CUDA_TRACE_NTAGS };
#undef CUDA_TRACE_ENUM

/* One block of one launch (48 bytes; tools/cuda_trace.py reads this layout). */
typedef struct cuda_trace_rec {
    uint64_t begin_ns, end_ns;             /* global timer: start, the last warp's end */
    uint32_t ready_cyc, work_cyc, end_cyc; /* SM cycles after the start */
    uint32_t tag, blocks, block, sm, pad;  /* blocks: the launch's; block: linear index */
} cuda_trace_rec;

/* The device buffer: this header, then capacity records. */
typedef struct cuda_trace_buf {
    unsigned next, capacity;
    unsigned pad[2];
} cuda_trace_buf;

#ifdef CELER_CUDA_TRACE

/* Each .cu file has its own copy of this pointer (no relocatable device code), so each
 * defines its binder with CUDA_TRACE_UNIT and trace.cu calls them all. */
static __device__ cuda_trace_buf *cuda_trace_dev;
#define CUDA_TRACE_UNIT(name)                                                                      \
    extern "C" cudaError_t cuda_trace_bind_##name(cuda_trace_buf *b) {                             \
        return cudaMemcpyToSymbol(cuda_trace_dev, &b, sizeof b);                                   \
    }

/* trace.cu: the buffer, bound to every unit (once, at the first backend); the counter
 * reset before the traced step; its records written after it. */
void cuda_trace_open(void);
void cuda_trace_begin(cudaStream_t s);
void cuda_trace_end(cudaStream_t s);

__device__ __forceinline__ uint64_t trace_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

struct trace_scope {
    cuda_trace_rec *r;
    long long c0;
    __device__ __forceinline__ unsigned cyc() const { return (unsigned)(clock64() - c0); }
    /* Every thread of the block, first thing in the kernel. */
    __device__ explicit trace_scope(int tag) {
        __shared__ cuda_trace_rec *slot;
        const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
        if (tid == 0) {
            cuda_trace_buf *b = cuda_trace_dev;
            slot = NULL;
            const unsigned i = b ? atomicAdd(&b->next, 1u) : 0u;
            if (b && i < b->capacity) {
                cuda_trace_rec *r = (cuda_trace_rec *)(b + 1) + i;
                unsigned sm;
                asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
                r->begin_ns = trace_ns();
                r->end_ns = 0;
                r->ready_cyc = r->work_cyc = r->end_cyc = 0;
                r->tag = (unsigned)tag;
                r->blocks = gridDim.x * gridDim.y * gridDim.z;
                r->block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
                r->sm = sm;
                slot = r;
            }
        }
        __syncthreads(); /* the record taken before the next launch may start */
        r = slot;
        c0 = clock64();
    }
    /* Past griddepcontrol.wait (any thread may call; the first warp's lane 0 notes it). */
    __device__ void ready() {
        if (r && threadIdx.x == 0) r->ready_cyc = cyc();
    }
    /* This warp's own work done (the latest warp's time is kept). */
    __device__ void work() {
        if (r && (threadIdx.x & 31) == 0) atomicMax(&r->work_cyc, cyc());
    }
    __device__ ~trace_scope() {
        if (r && (threadIdx.x & 31) == 0) {
            atomicMax(&r->end_cyc, cyc());
            atomicMax((unsigned long long *)&r->end_ns, (unsigned long long)trace_ns());
        }
    }
};

#else

#define CUDA_TRACE_UNIT(name)
static inline void cuda_trace_open(void) {}
static inline void cuda_trace_begin(cudaStream_t) {}
static inline void cuda_trace_end(cudaStream_t) {}
struct trace_scope {
    __device__ __forceinline__ explicit trace_scope(int) {}
    __device__ __forceinline__ void ready() {}
    __device__ __forceinline__ void work() {}
};

#endif

#endif

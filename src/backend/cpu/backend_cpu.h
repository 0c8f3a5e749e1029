/*
 * backend_cpu.h - the fast CPU backend: the op interface of backend.h run by one of the
 * kernel tables of kernels.h (generic C, AVX2, AVX-512 VNNI, AMX) on a thread pool.
 *
 * Affine matrices are read in their packed layout (the class's prepared set, made by
 * pack_weights at load); dense F32/F16/BF16 matrices are used in place from the mmap. A
 * matrix that could not be packed is dequantized a row at a time (slow, but correct).
 */
#ifndef CELER_BACKEND_CPU_BACKEND_CPU_H
#define CELER_BACKEND_CPU_BACKEND_CPU_H

#include "backend/backend.h"
#include "backend/cpu/cpuid.h"

/* Largest sizes the backend's buffers must hold, fixed at creation. */
typedef struct backend_cpu_sizes {
    int64_t max_rows;   /* rows in one op call (the context's n_batch) */
    int64_t max_cols;   /* widest matrix input */
    int64_t max_keys;   /* positions one attention row can read (n_ctx) */
    int64_t hd;         /* head dimension (RoPE table width) */
    int64_t rope_kinds; /* RoPE parameter sets a forward passes (0 counts as 1) */
} backend_cpu_sizes;

/* isa must be supported and not CPU_ISA_REF; kv_f16: the KV pools hold fp16 values.
 * NULL when out of memory. Matrices are looked up in be->weights (pack.h's cpu_weights),
 * which the caller sets. */
backend *backend_cpu_create(cpu_isa isa, int n_threads, const backend_cpu_sizes *sz, bool kv_f16);

/* The "cpu" class: the kernels of backend_params.kernels (the reference backend for
 * "ref"), weights packed once per model. With CELER_CPU_STAGED=1 in the environment its
 * backends say their memory is their own (backend.host false): callers then move inputs
 * and outputs as they do for a GPU, which tests that path on any machine. */
extern const backend_class backend_cpu_class;

#endif

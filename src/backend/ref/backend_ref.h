/*
 * backend_ref.h - the reference backend: the backend interface run by the scalar
 * kernels of this folder, split across a thread pool. It is the correctness path that
 * every faster backend is compared with (and, until those exist, the one in use).
 */
#ifndef CELER_KERNELS_REF_BACKEND_REF_H
#define CELER_KERNELS_REF_BACKEND_REF_H

#include "backend/backend.h"

/* max_cols: the widest matrix any matmul will see; max_keys: the most positions any
 * attention row reads. attention_full takes segments of up to max_cols + max_keys rows.
 * Returns NULL when out of memory. */
backend *backend_ref_create(int n_threads, int64_t max_cols, int64_t max_keys, bool kv_f16);

#endif

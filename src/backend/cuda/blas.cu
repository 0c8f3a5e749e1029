/*
 * blas.cu - cuBLAS, opened by the first backend created instead of linked. The module
 * (celer-cuda.so) links only cudart, statically, so loading it to list devices maps no
 * cuBLAS: mapping libcublas and libcublasLt alone takes 0.06 s and 215 MB of resident
 * memory on the CPU machine (docs/benchmarks.md), which celer inspect would otherwise pay
 * on every machine. The library comes from the module's run path (the toolkit's lib64 at
 * build time), else the loader's usual search. It is never closed.
 */
#include "backend/cuda/cuda_internal.h"

extern "C" {
#include "base/error.h"
}

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#define STR_(x) #x
#define STR(x) STR_(x)
#define CUBLAS_SONAME "libcublas.so." STR(CUBLAS_VER_MAJOR)

cuda_blas_api cuda_blas;

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static char blas_why[256]; /* empty once every entry is found */

static void blas_load(void) {
    void *h = dlopen(CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(blas_why, sizeof blas_why, "%s", dlerror());
        return;
    }
    /* cublas_v2.h's names are macros for these */
    const struct {
        void **fn;
        const char *name;
    } syms[] = {
        {(void **)&cuda_blas.create, "cublasCreate_v2"},
        {(void **)&cuda_blas.destroy, "cublasDestroy_v2"},
        {(void **)&cuda_blas.set_stream, "cublasSetStream_v2"},
        {(void **)&cuda_blas.set_workspace, "cublasSetWorkspace_v2"},
        {(void **)&cuda_blas.gemm_ex, "cublasGemmEx"},
        {(void **)&cuda_blas.status_string, "cublasGetStatusString"},
        {(void **)&cuda_blas.status_name, "cublasGetStatusName"},
    };
    for (const auto &s : syms)
        if (!(*s.fn = dlsym(h, s.name))) {
            snprintf(blas_why, sizeof blas_why, "%s", dlerror());
            return;
        }
}

celer_status cuda_blas_open(celer_error *e) {
    pthread_once(&blas_once, blas_load);
    if (!blas_why[0]) return CELER_OK;
    return error_set(e, CELER_STATUS_UNSUPPORTED, "cuda: cuBLAS (%s) could not be loaded: %s", CUBLAS_SONAME,
                     blas_why);
}

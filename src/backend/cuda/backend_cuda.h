/*
 * backend_cuda.h - the CUDA backend: the op interface of backend.h run as kernels on one
 * stream of an NVIDIA GPU, with weights, KV pools and activations in device memory.
 *
 * Built only where nvcc exists (CUDA=0 leaves it out), into a module of its own
 * (celer-cuda.so beside the binary, module.h) that the registry loads on first use: the
 * binary links no CUDA library. On machines without a GPU or driver the module loads and
 * the class reports no device and the reason.
 */
#ifndef CELER_BACKEND_CUDA_BACKEND_CUDA_H
#define CELER_BACKEND_CUDA_BACKEND_CUDA_H

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const backend_class backend_cuda_class;

#ifdef __cplusplus
}
#endif

#endif

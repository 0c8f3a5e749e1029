/*
 * affine.h - MLX affine-quantized weight matrices on an NVIDIA GPU: the device layout made
 * at load, and the products y = x @ W^T that read it (decode, n = 1..8 rows of x).
 *
 *     cuda_affine w;
 *     if (cuda_affine_upload(&w, &view, stream, err, sizeof err)) fail(err);
 *     void *work = NULL;                        // zero-filled once, reused by every call
 *     size_t ws = cuda_affine_work_size(&w, 8);
 *     cudaMalloc(&work, ws); cudaMemset(work, 0, ws);
 *     cuda_affine_gemv(y, x, n, &w, work, stream, 0); // y[n, rows] = x[n, cols] @ W^T
 *     cuda_affine_free(&w);
 *
 * Layout (what cuda_affine_upload writes; nothing else reads it). W is cut into tiles of
 * 16 rows x 512 bytes of codes (64 columns at 4 bits, 32 at 8 bits); row tile rt, column
 * tile kt is 512 contiguous bytes at codes + (rt * k_tiles + kt) * 128 words, so one warp
 * reads a whole tile with one 16-byte load per lane. Lane l = 4 * r + t holds the codes
 * that the tensor-core product mma.m16n8k16 needs in its A fragments: rows r and r + 8 of
 * the tile, and in each 16-column step the four columns 4t .. 4t+3, packed so that a mask
 * and an OR with 0x6400 make a half2 (1024 + q) with no shifts across words. The product
 * reads the matching four fp32 values of x as one float4 (the order of k inside an mma
 * step is free as long as A and B agree). Scales and biases stay 16-bit: half2
 * (scale, bias) per row and group, in fp16 (bf16 checkpoints are converted: exact for
 * every value in fp16's normal range, within 2^-25 absolute below it), grouped per tile
 * row pair, [row_tiles][groups / gpb][8][2 * gpb] words with gpb = 2 at 4 bits group 32
 * (two groups in a tile), else 1. Rows are padded to 16 and columns to a whole tile with
 * zero codes, scales and biases, so the padding adds nothing.
 *
 * Numerics: each weight is dequantized to fp16 by one fused multiply-add (s * q + b,
 * rounded once), x is rounded to fp16, and the tensor cores accumulate in fp32 over all
 * of K. x must stay within fp16's range (|x| < 65504).
 *
 * Not here: prefill (n > 8), dense weights, 2/3/5/6-bit codes.
 */
#ifndef CELER_BACKEND_CUDA_AFFINE_H
#define CELER_BACKEND_CUDA_AFFINE_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/tensor.h"

/* One affine matrix W[rows, cols] in the device layout above. */
typedef struct cuda_affine {
    int64_t rows, cols;
    int bits;                   /* 4 or 8 */
    int64_t group;              /* 32, 64 or 128 */
    int64_t row_tiles, k_tiles; /* 16-row tiles; 512-byte tiles along cols */
    int64_t group_blocks;       /* sb entries per row pair: ceil(k_tiles * tile_cols / group / gpb) */
    uint32_t *codes;            /* [row_tiles][k_tiles][32 lanes][4] */
    uint32_t *sb;               /* [row_tiles][group_blocks][8][2 * gpb] half2 (scale, bias) */
    size_t bytes;               /* device bytes held (codes + sb) */
} cuda_affine;

/* Bits in the flags of cuda_affine_gemv. */
enum {
    /* Launched with programmatic dependent launch: the kernel starts loading weights
     * while the previous kernel in the stream finishes, and waits for it only before
     * reading x. Every kernel before it in the stream must allow that (it does). */
    CUDA_AFFINE_PDL = 1u,
};

/* Copies the host matrix w (quant_bits 4 or 8, group 32/64/128, scales F16 or BF16) to
 * the device in the tiled layout, on stream s (synchronized before returning). 0 on
 * success; otherwise -1 with a message in err. The caller frees with cuda_affine_free. */
int cuda_affine_upload(cuda_affine *out, const matview *w, cudaStream_t s, char *err,
                       size_t err_size);

/* The same from a matview whose data, scales and biases already sit in device memory
 * (read, not kept). */
int cuda_affine_upload_device(cuda_affine *out, const matview *w, cudaStream_t s, char *err,
                              size_t err_size);

/* Frees what cuda_affine_upload allocated; the struct is zeroed. NULL-safe. */
void cuda_affine_free(cuda_affine *w);

/* Bytes of the work buffer cuda_affine_gemv needs for up to n rows of x (0 when none).
 * The buffer must be zero-filled before its first use; every call leaves it so. */
size_t cuda_affine_work_size(const cuda_affine *w, int64_t n);

/* y[n, rows] = x[n, cols] @ W^T, 1 <= n <= 8; x and y fp32, row-major, in device memory,
 * x 16-byte aligned. Enqueued on s; returns the launch's error (cudaSuccess). */
cudaError_t cuda_affine_gemv(float *y, const float *x, int64_t n, const cuda_affine *w,
                             void *work, cudaStream_t s, unsigned flags);

/* How a product is cut: rb row tiles per block (1 or 2), split blocks along K
 * (partial sums reduced by the last block of each row block). */
typedef struct cuda_affine_plan {
    int rb, split;
} cuda_affine_plan;

/* The plan cuda_affine_gemv uses for n rows. */
cuda_affine_plan cuda_affine_plan_for(const cuda_affine *w, int64_t n);

/* Bytes of work a given plan needs for n rows. */
size_t cuda_affine_plan_work_size(const cuda_affine *w, int64_t n, cuda_affine_plan p);

/* cuda_affine_gemv with a given plan (benchmarks compare plans). */
cudaError_t cuda_affine_gemv_plan(float *y, const float *x, int64_t n, const cuda_affine *w,
                                  void *work, cudaStream_t s, unsigned flags,
                                  cuda_affine_plan p);

/* The reference: y[n, rows] = x[n, cols] @ W^T in double from the checkpoint layout
 * (w's data, scales and biases in device memory, as in cuda_affine_upload_device), one
 * thread per output, any n. For tests. */
cudaError_t cuda_affine_ref(double *y, const float *x, int64_t n, const matview *w,
                            cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif

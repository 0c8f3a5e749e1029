/*
 * matmul.cu - matrix products on the GPU: y[n, rows] = x[n, cols] @ W^T.
 *
 * Few rows (decode, n <= GEMV_ROWS) on affine weights: affine.cu's GEMV, which reads each
 * weight once from the tiled layout and is exact to fp32 level. More rows: the products
 * go through the tensor cores by cuBLAS with fp32 accumulation, every 16-bit operand
 * split into a high and a low part (v = hi + lo to about 22 bits), because one fp16
 * rounding of weights and activations moves a model's logits by about 2e-3:
 *   - affine: a slab of rows dequantized (s*q + b in fp32) from the tiled layout into fp16
 *     hi and lo (cuda_affine_dequant), the activations likewise:
 *     W_hi X_hi + W_hi X_lo + W_lo X_hi;
 *   - dense bf16 / fp16: the weights as stored (exact), activations hi and lo: two products;
 *   - dense fp32: plain fp32 SGEMM.
 * Nothing allocates: the 16-bit activations, the dequantized slab and the GEMV's partial
 * sums live in buffers sized at creation.
 */
#include "backend/cuda/cuda_internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>



/* ==== Activations in 16 bits ==== */

/* hi[m] = x rounded to T; lo[m] = what that left over, rounded to T (lo may be NULL). */
template <typename T> __global__ static void k_split(T *hi, T *lo, const float *x, int64_t m) {
    GRID_STRIDE(i, m) {
        const T h = (T)x[i];
        hi[i] = h;
        if (lo) lo[i] = (T)(x[i] - (float)h);
    }
}

/* ==== Products ==== */

/* y[n, rows] (rows ldy apart) = x[n, cols] @ W^T in cuBLAS's column-major terms:
 * Y^T (rows x n) = W (cols x rows)^T X^T (cols x n). */
static void gemm(cuda_backend *cb, float *y, int64_t ldy, const void *w, cudaDataType wt, const void *x,
                 cudaDataType xt, int64_t rows, int64_t cols, int64_t n, float beta) {
    const float one = 1.0f;
    const cublasComputeType_t ct = wt == CUDA_R_32F ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)cols, &one, w, wt, (int)cols,
                              x, xt, (int)cols, &beta, y, CUDA_R_32F, (int)ldy, ct, CUBLAS_GEMM_DEFAULT));
}

bool cuda_product(cuda_backend *cb, float *y, const cuda_mat *m, const float *x, int64_t n, bool pdl) {
    cudaStream_t s = cb->stream;
    const int64_t xm = n * m->cols;
    if (m->bits && n <= GEMV_ROWS && ((uintptr_t)x & 15) == 0) { /* the GEMV reads x as float4 */
        CUDA_CHECK(cuda_affine_gemv(y, x, n, &m->aff, cb->gemv_work, s, pdl ? CUDA_AFFINE_PDL : 0));
        return true;
    }
    if (!m->bits && m->type == DTYPE_F32) {
        gemm(cb, y, m->rows, m->dense, CUDA_R_32F, x, CUDA_R_32F, m->rows, m->cols, n, 0.0f);
        return false;
    }
    if (!m->bits) {
        /* 16-bit weights as stored; x = hi + lo in the same type */
        const bool bf = m->type == DTYPE_BF16;
        const cudaDataType t = bf ? CUDA_R_16BF : CUDA_R_16F;
        void *hi = cb->xs, *lo = (char *)cb->xs + 2 * (size_t)xm;
        if (bf) k_split<__nv_bfloat16><<<blocks_for(xm), THREADS, 0, s>>>((__nv_bfloat16 *)hi, (__nv_bfloat16 *)lo, x, xm);
        else k_split<__half><<<blocks_for(xm), THREADS, 0, s>>>((__half *)hi, (__half *)lo, x, xm);
        gemm(cb, y, m->rows, m->dense, t, hi, t, m->rows, m->cols, n, 0.0f);
        gemm(cb, y, m->rows, m->dense, t, lo, t, m->rows, m->cols, n, 1.0f);
        return false;
    }
    /* affine: a slab of dequantized rows at a time, weights and activations in two parts */
    __half *xhi = (__half *)cb->xs, *xlo = xhi + xm;
    k_split<__half><<<blocks_for(xm), THREADS, 0, s>>>(xhi, xlo, x, xm);
    const int64_t slab = cb->deq_rows;
    for (int64_t r0 = 0; r0 < m->rows; r0 += slab) {
        const int64_t r1 = m->rows - r0 < slab ? m->rows : r0 + slab, dm = (r1 - r0) * m->cols;
        __half *whi = (__half *)cb->deq, *wlo = whi + dm;
        CUDA_CHECK(cuda_affine_dequant(whi, wlo, &m->aff, r0, r1, s));
        gemm(cb, y + r0, m->rows, whi, CUDA_R_16F, xhi, CUDA_R_16F, r1 - r0, m->cols, n, 0.0f);
        gemm(cb, y + r0, m->rows, whi, CUDA_R_16F, xlo, CUDA_R_16F, r1 - r0, m->cols, n, 1.0f);
        gemm(cb, y + r0, m->rows, wlo, CUDA_R_16F, xhi, CUDA_R_16F, r1 - r0, m->cols, n, 1.0f);
    }
    return false;
}

/*
 * matmul.cu - matrix products on the GPU: y[n, rows] = x[n, cols] @ W^T.
 *
 * Few rows (decode, n <= GEMV_ROWS) on affine weights: a GEMV that reads each weight once
 * and dequantizes in registers, one warp per output row, fp32 throughout. More rows: the
 * products go through the tensor cores by cuBLAS with fp32 accumulation, every 16-bit
 * operand split into a high and a low part (v = hi + lo to about 22 bits), because one
 * fp16 rounding of weights and activations moves a model's logits by about 2e-3:
 *   - affine: a slab of rows dequantized (s*q + b in fp32) into fp16 hi and lo, the
 *     activations likewise: W_hi X_hi + W_hi X_lo + W_lo X_hi;
 *   - dense bf16 / fp16: the weights as stored (exact), activations hi and lo: two products;
 *   - dense fp32: plain fp32 SGEMM.
 * Nothing allocates: the 16-bit activations and the dequantized slab live in buffers
 * sized at creation.
 */
#include "backend/cuda/cuda_internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define THREADS 256

static unsigned blocks_for(int64_t m) {
    int64_t b = (m + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 8 ? 65535 * 8 : b);
}

#define GRID_STRIDE(i, m) for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (m); \
                               i += (int64_t)gridDim.x * blockDim.x)

/* ==== Activations in 16 bits ==== */

/* hi[m] = x rounded to T; lo[m] = what that left over, rounded to T (lo may be NULL). */
template <typename T> __global__ static void k_split(T *hi, T *lo, const float *x, int64_t m) {
    GRID_STRIDE(i, m) {
        const T h = (T)x[i];
        hi[i] = h;
        if (lo) lo[i] = (T)(x[i] - (float)h);
    }
}

/* ==== Dequantization to fp16 ==== */

/* hi, lo [rows r0.., cols] = the affine values of a slab of rows, split in two fp16 parts. */
__global__ static void k_dequant_f16(__half *hi, __half *lo, const cuda_mat w, int64_t r0, int64_t m) {
    const int64_t per = 32 / w.bits, words = w.cols / per, gpr = w.cols / w.group;
    GRID_STRIDE(i, m) {
        const int64_t r = r0 + i / w.cols, c = i % w.cols;
        const uint32_t q = (w.codes[r * words + c / per] >> ((c % per) * w.bits)) & ((1u << w.bits) - 1u);
        const int64_t g = r * gpr + c / w.group;
        const float v = w.scales[g] * (float)q + w.biases[g];
        const __half h = __float2half_rn(v);
        hi[i] = h;
        lo[i] = __float2half_rn(v - __half2float(h));
    }
}

/* ==== GEMV for few rows ==== */

/* One warp per output row: each lane reads 16 bytes of codes at a time (32 4-bit or 16
 * 8-bit codes, all in one group), so a row is streamed once for all n input rows; per
 * chunk sum(q * x) and sum(x) give s * sum(q x) + b * sum(x). */
template <int BITS, int N>
__global__ static void k_gemv(float *y, const cuda_mat w, const float *__restrict__ x) {
    constexpr int PER_WORD = 32 / BITS, PER_CHUNK = 4 * PER_WORD;
    const int64_t r = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (r >= w.rows) return;
    const int64_t cols = w.cols, chunks = cols / PER_CHUNK, gpr = cols / w.group;
    const uint4 *codes = (const uint4 *)(w.codes + r * (cols / PER_WORD));
    float acc[N];
    for (int t = 0; t < N; t++) acc[t] = 0.0f;
    for (int64_t k = lane; k < chunks; k += 32) {
        const uint4 c4 = codes[k];
        const uint32_t word[4] = {c4.x, c4.y, c4.z, c4.w};
        const int64_t c0 = k * PER_CHUNK, g = r * gpr + c0 / w.group;
        const float s = w.scales[g], b = w.biases[g];
        for (int t = 0; t < N; t++) {
            const float4 *xv = (const float4 *)(x + t * cols + c0);
            float qx = 0.0f, sx = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < PER_WORD; e += 4) {
                    const float4 v = __ldg(xv + (j * PER_WORD + e) / 4);
                    const uint32_t q = word[j] >> (e * BITS);
                    constexpr uint32_t M = (1u << BITS) - 1u;
                    qx += (float)(q & M) * v.x + (float)((q >> BITS) & M) * v.y + (float)((q >> 2 * BITS) & M) * v.z +
                          (float)((q >> 3 * BITS) & M) * v.w;
                    sx += v.x + v.y + v.z + v.w;
                }
            acc[t] += s * qx + b * sx;
        }
    }
    for (int t = 0; t < N; t++) {
        float v = acc[t];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) y[t * w.rows + r] = v;
    }
}

template <int BITS>
static void gemv_bits(cudaStream_t s, float *y, const cuda_mat *w, const float *x, int64_t n) {
    const unsigned rows_per_block = 8, grid = (unsigned)((w->rows + rows_per_block - 1) / rows_per_block);
    const dim3 block(32 * rows_per_block);
    switch (n) {
    case 1: k_gemv<BITS, 1><<<grid, block, 0, s>>>(y, *w, x); break;
    case 2: k_gemv<BITS, 2><<<grid, block, 0, s>>>(y, *w, x); break;
    case 3: k_gemv<BITS, 3><<<grid, block, 0, s>>>(y, *w, x); break;
    case 4: k_gemv<BITS, 4><<<grid, block, 0, s>>>(y, *w, x); break;
    case 5: k_gemv<BITS, 5><<<grid, block, 0, s>>>(y, *w, x); break;
    case 6: k_gemv<BITS, 6><<<grid, block, 0, s>>>(y, *w, x); break;
    case 7: k_gemv<BITS, 7><<<grid, block, 0, s>>>(y, *w, x); break;
    default: k_gemv<BITS, 8><<<grid, block, 0, s>>>(y, *w, x); break;
    }
}

/* The GEMV reads 16-byte chunks of codes within one group, and x as float4. */
static bool gemv_fits(const cuda_mat *w, const float *x, int64_t n) {
    const int64_t chunk = w->bits ? 4 * (32 / w->bits) : 1;
    return w->bits && n <= GEMV_ROWS && w->cols % chunk == 0 && w->group % chunk == 0 && ((uintptr_t)x & 15) == 0;
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

void cuda_product(cuda_backend *cb, float *y, const cuda_mat *m, const float *x, int64_t n) {
    cudaStream_t s = cb->stream;
    const int64_t xm = n * m->cols;
    if (gemv_fits(m, x, n)) {
        if (m->bits == 4) gemv_bits<4>(s, y, m, x, n);
        else gemv_bits<8>(s, y, m, x, n);
        return;
    }
    if (!m->bits && m->type == DTYPE_F32) {
        gemm(cb, y, m->rows, m->dense, CUDA_R_32F, x, CUDA_R_32F, m->rows, m->cols, n, 0.0f);
        return;
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
        return;
    }
    /* affine: a slab of dequantized rows at a time, weights and activations in two parts */
    __half *xhi = (__half *)cb->xs, *xlo = xhi + xm;
    k_split<__half><<<blocks_for(xm), THREADS, 0, s>>>(xhi, xlo, x, xm);
    const int64_t slab = cb->deq_rows;
    for (int64_t r0 = 0; r0 < m->rows; r0 += slab) {
        const int64_t r1 = m->rows - r0 < slab ? m->rows : r0 + slab, dm = (r1 - r0) * m->cols;
        __half *whi = (__half *)cb->deq, *wlo = whi + dm;
        k_dequant_f16<<<blocks_for(dm), THREADS, 0, s>>>(whi, wlo, *m, r0, dm);
        gemm(cb, y + r0, m->rows, whi, CUDA_R_16F, xhi, CUDA_R_16F, r1 - r0, m->cols, n, 0.0f);
        gemm(cb, y + r0, m->rows, whi, CUDA_R_16F, xlo, CUDA_R_16F, r1 - r0, m->cols, n, 1.0f);
        gemm(cb, y + r0, m->rows, wlo, CUDA_R_16F, xhi, CUDA_R_16F, r1 - r0, m->cols, n, 1.0f);
    }
}

/*
 * matmul.cu - matrix products on the GPU: y[n, rows] = x[n, cols] @ W^T.
 *
 * Affine weights stay in affine.h's tiled layout. Few rows (decode, n <= GEMV_CHUNKED_ROWS)
 * go through the GEMV, which streams each weight once per GEMV_ROWS rows, more through the
 * tensor-core GEMM (affine_gemm.cu); both give fp32-level results (codes exact on the
 * tensor cores, x as fp16 hi + lo, scales and biases applied per group in fp32). From
 * DENSE_FROM_ROWS rows (prefill), W is rounded to fp16 a chunk of rows at a time and x
 * once, and cuBLAS multiplies them with fp32 sums: the fast path of docs/architecture.md's numerics,
 * like the CPU's int8 activations (its error is bounded by the tests), and the way to
 * the tensor cores' dense rate, which the exact products reach a fifth of. The chunks go
 * through two buffers: while cuBLAS reads one, the side stream dequantizes the next chunk
 * into the other (the product is bound by the tensor cores, the dequantization by
 * memory), and after a matrix's last chunk, the first of the matrix after it in the
 * model's order (q, k, v, o, gate, up, down: the order the model calls them), which the
 * next product finds ready when the guess was right. An MLP's gate and up (swiglu_mlp)
 * leave cuBLAS in fp16, and SwiGLU reads them and writes the down projection's fp16 x:
 * a quarter of the bytes of fp32 gate and up between the products.
 * Dense weights go through cuBLAS with fp32 accumulation at every n: bf16 / fp16 as stored
 * (exact) against x split in hi and lo parts of the same type, two products; fp32 by
 * SGEMM. (One fp16 rounding of weights and activations moved the fixtures' logits by about
 * 2e-3 against transformers: the exact products are the reference the fast path is held
 * to.)
 * Nothing allocates: the 16-bit activations and weights, the GEMM's staged x and the
 * GEMV's partial sums live in buffers sized before the first step.
 */
#include "backend/cuda/cuda_internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

/* ==== Activations in 16 bits ==== */

/* hi[m] = x rounded to T; lo[m] (unless NULL) = what that left over, rounded to T. */
template <typename T> __global__ static void k_split(T *hi, T *lo, const float *x, int64_t m) {
    GRID_STRIDE(i, m) {
        const T h = (T)x[i];
        hi[i] = h;
        if (lo) lo[i] = (T)(x[i] - (float)h);
    }
}

/* y[m8] = silu(gate) * up of fp16 values, rounded to fp16, eight values a thread (16-byte
 * loads and store). */
__global__ static void k_swiglu_h8(uint4 *y, const uint4 *gate, const uint4 *up, int64_t m8) {
    GRID_STRIDE(i, m8) {
        const uint4 g = gate[i], u = up[i];
        const uint32_t gw[4] = {g.x, g.y, g.z, g.w}, uw[4] = {u.x, u.y, u.z, u.w};
        uint32_t o[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float2 gf = __half22float2(*(const __half2 *)&gw[j]), uf = __half22float2(*(const __half2 *)&uw[j]);
            const __half2 h = __floats2half2_rn(swiglu_of(gf.x, uf.x), swiglu_of(gf.y, uf.y));
            o[j] = *(const uint32_t *)&h;
        }
        y[i] = make_uint4(o[0], o[1], o[2], o[3]);
    }
}

/* y[m4] = x rounded to fp16, or silu(x) * up where up is given, four values a thread (16-byte
 * loads, one 8-byte store). */
__global__ static void k_half4(uint2 *y, const float4 *x, const float4 *up, int64_t m4) {
    GRID_STRIDE(i, m4) {
        const float4 v = up ? swiglu4(x[i], up[i]) : x[i];
        const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
        y[i] = make_uint2(*(const uint32_t *)&a, *(const uint32_t *)&b);
    }
}

/* ==== Products ==== */

/* y[n, rows] (rows ldy apart, of type yt) = x[n, cols] @ W^T in cuBLAS's column-major
 * terms: Y^T (rows x n) = W (cols x rows)^T X^T (cols x n). Sums in fp32. */
static void gemm_to(cuda_backend *cb, void *y, cudaDataType yt, int64_t ldy, const void *w, cudaDataType wt,
                    const void *x, cudaDataType xt, int64_t rows, int64_t cols, int64_t n, float beta) {
    const float one = 1.0f;
    CUBLAS_CHECK(cuda_blas.gemm_ex(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)cols,
                                   &one, w, wt, (int)cols, x, xt, (int)cols, &beta, y, yt, (int)ldy,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void gemm(cuda_backend *cb, float *y, int64_t ldy, const void *w, cudaDataType wt, const void *x,
                 cudaDataType xt, int64_t rows, int64_t cols, int64_t n, float beta) {
    gemm_to(cb, y, CUDA_R_32F, ldy, w, wt, x, xt, rows, cols, n, beta);
}

/* Rows of x up to which the decode product, GEMV_ROWS rows a launch, beats the prefill
 * product (bench_affine --gemm, 8B shapes on the H200). */
#define GEMV_CHUNKED_ROWS 32

/* Whether x's chunks of GEMV_ROWS rows are all 16-byte aligned (the GEMV reads float4). */
static bool gemv_aligned(const float *x, int64_t cols) { return ((uintptr_t)x & 15) == 0 && cols % 4 == 0; }

/* Rows of x from which affine products take the dense fp16 path (bench_affine --gemm, one
 * 8B layer on the H200: 0.44 ms against the warpgroup product's 0.55 at 128 rows, 0.42
 * against 0.34 at 64), and the most halves each of its two weight buffers holds (128 MiB:
 * one 8B MLP matrix whole, an LM head in 8 chunks). */
#define DENSE_FROM_ROWS FAST_FROM_ROWS
#define DENSE_MAX_ELEMS ((int64_t)64 << 20)

int64_t cuda_dense_elems(const cuda_backend *cb) {
    const cuda_weights *w = (const cuda_weights *)cb->base.weights;
    if (!w || cb->p.max_rows < DENSE_FROM_ROWS) return 0;
    return w->affine_elems < DENSE_MAX_ELEMS ? w->affine_elems : DENSE_MAX_ELEMS;
}

/* Rows of x the prefill product needs room for in gemm_work: fewer than DENSE_FROM_ROWS
 * where every affine matrix takes the dense path from there (its wh chunks hold 16 rows
 * of it), else a whole step's (0 without affine weights). */
int64_t cuda_gemm_rows(const cuda_backend *cb) {
    const cuda_weights *w = (const cuda_weights *)cb->base.weights;
    if (!w || !w->affine_elems) return 0;
    const int64_t halves = cuda_dense_elems(cb);
    return halves && halves / w->affine_cols >= 16 ? DENSE_FROM_ROWS - 1 : cb->p.max_rows;
}

/* Rows of W a dense product takes at once: what wh holds, in whole 16s (aligned outputs). */
static int64_t dense_chunk(const cuda_backend *cb, const cuda_mat *m) {
    const int64_t rows = cb->wh_elems / m->cols / 16 * 16;
    return rows < m->rows ? rows : m->rows;
}

/* Rows of m from row r on that one chunk of `chunk` rows takes. */
static int64_t chunk_rows(const cuda_mat *m, int64_t r, int64_t chunk) {
    return m->rows - r < chunk ? m->rows - r : chunk;
}

/* Whether the dense path takes m's product at n rows: quantized, enough rows (past the
 * decode product for matrices in qmat.h's layout, which have no tensor-core product of
 * their own), and W's rows fit the buffer 16 at a time. */
static bool dense_takes(const cuda_backend *cb, const cuda_mat *m, int64_t n) {
    const int64_t from = cuda_mat_general(m) ? GEMV_CHUNKED_ROWS + 1 : DENSE_FROM_ROWS;
    return m->bits && n >= from && dense_chunk(cb, m) > 0;
}

/* y[n, rows] = x @ W^T for a matrix in qmat.h's layout by its decode product, GEMV_ROWS
 * rows of x at a time (what the dense path does not take); x's int8 form goes to xs. */
static void general_gemv(cuda_backend *cb, float *y, const cuda_mat *m, const float *x, int64_t n) {
    CELER_ASSERT(cuda_qmat_work_bytes(GEMV_ROWS < n ? GEMV_ROWS : n, m->cols) <=
                 4 * (size_t)(cb->p.max_rows * cb->p.max_cols));
    for (int64_t c = 0; c < n; c += GEMV_ROWS)
        CUDA_CHECK(cuda_qmat_gemv(y + c * m->rows, x + c * m->cols, n - c < GEMV_ROWS ? n - c : GEMV_ROWS, &m->q,
                                  cb->xs, cb->stream));
}

/* Whether k_half4 takes m values of x (and up): whole float4s, 16-byte aligned. */
static bool half4_fits(const float *x, const float *up, int64_t m) {
    return m % 4 == 0 && (((uintptr_t)x | (uintptr_t)up) & 15) == 0;
}

/* x[n, cols], or silu(x) * up where up is given (and half4_fits), in fp16 for the dense
 * path, in xs's first half. */
static const __half *x_half(cuda_backend *cb, const float *x, const float *up, int64_t m) {
    __half *h = (__half *)cb->xs;
    if (half4_fits(x, up, m)) {
        k_half4<<<blocks_for(m / 4), THREADS, 0, cb->stream>>>((uint2 *)h, (const float4 *)x, (const float4 *)up,
                                                                m / 4);
    } else {
        CELER_ASSERT(!up);
        k_split<__half><<<blocks_for(m), THREADS, 0, cb->stream>>>(h, (__half *)nullptr, x, m);
    }
    return h;
}

/* Rows r .. r + k - 1 of m into buffer b, on the side stream once the product that read
 * the buffer last is done; wh_ready[b] says when they are in. */
static void chunk_into(cuda_backend *cb, int b, const cuda_mat *m, int64_t r, int64_t k) {
    CUDA_CHECK(cudaStreamWaitEvent(cb->side, cb->wh_free[b], 0));
    CUDA_CHECK(cuda_mat_general(m) ? cuda_qmat_dequant(cb->wh[b], &m->q, r, k, cb->side)
                                   : cuda_affine_dequant(cb->wh[b], &m->aff, r, k, cb->side));
    CUDA_CHECK(cudaEventRecord(cb->wh_ready[b], cb->side));
    cb->wh_mat[b] = m, cb->wh_row[b] = r, cb->wh_rows[b] = k;
}

/* The buffer holding (or getting) rows r .. r + k - 1 of m, or -1. */
static int held(const cuda_backend *cb, const cuda_mat *m, int64_t r, int64_t k) {
    for (int b = 0; b < 2; b++)
        if (cb->wh_mat[b] == m && cb->wh_row[b] == r && cb->wh_rows[b] == k) return b;
    return -1;
}

/* The matrix the model multiplies after m, as far as the weights' order tells (NULL at the
 * end, for dense matrices and for ones of more than two buffers, as an LM head, whose
 * first chunk would often go unused). */
static const cuda_mat *next_mat(const cuda_backend *cb, const cuda_mat *m) {
    const cuda_weights *w = (const cuda_weights *)cb->base.weights;
    if (m < w->mats || m + 1 >= w->mats + w->n) return NULL;
    const cuda_mat *nx = m + 1;
    return nx->bits && dense_chunk(cb, nx) > 0 && nx->rows * nx->cols <= 2 * cb->wh_elems ? nx : NULL;
}

/* y[n, rows] = xh @ W^T, y of type yt (fp32 or fp16): W's rows in fp16, a buffer's worth
 * a product, each chunk dequantized while the one before it is multiplied. */
static void affine_dense_to(cuda_backend *cb, void *y, cudaDataType yt, const cuda_mat *m, const __half *xh,
                            int64_t n) {
    const size_t ysize = yt == CUDA_R_16F ? sizeof(__half) : sizeof(float);
    const int64_t chunk = dense_chunk(cb, m);
    for (int64_t r = 0; r < m->rows; r += chunk) {
        const int64_t k = chunk_rows(m, r, chunk);
        int b = held(cb, m, r, k);
        if (b < 0) chunk_into(cb, b = cb->wh_next, m, r, k);
        /* the other buffer gets what comes next while this chunk is multiplied */
        if (r + k < m->rows) {
            const int64_t k2 = chunk_rows(m, r + k, chunk);
            if (held(cb, m, r + k, k2) < 0) chunk_into(cb, 1 - b, m, r + k, k2);
        } else if (const cuda_mat *nx = next_mat(cb, m)) {
            const int64_t k2 = dense_chunk(cb, nx);
            if (held(cb, nx, 0, k2) < 0) chunk_into(cb, 1 - b, nx, 0, k2);
        }
        CUDA_CHECK(cudaStreamWaitEvent(cb->stream, cb->wh_ready[b], 0));
        gemm_to(cb, (char *)y + r * ysize, yt, m->rows, cb->wh[b], CUDA_R_16F, xh, CUDA_R_16F, k, m->cols, n, 0.0f);
        CUDA_CHECK(cudaEventRecord(cb->wh_free[b], cb->stream));
        cb->wh_mat[b] = NULL; /* read: the buffer is free once the product is done */
        cb->wh_next = 1 - b;
    }
}

static void affine_dense(cuda_backend *cb, float *y, const cuda_mat *m, const __half *xh, int64_t n) {
    affine_dense_to(cb, y, CUDA_R_32F, m, xh, n);
}

void cuda_product(cuda_backend *cb, float *y, const cuda_mat *m, const float *x, int64_t n) {
    cudaStream_t s = cb->stream;
    const int64_t xm = n * m->cols;
    if (cuda_mat_general(m) && !dense_takes(cb, m, n)) {
        general_gemv(cb, y, m, x, n);
        return;
    }
    if (m->bits && n <= GEMV_CHUNKED_ROWS && gemv_aligned(x, m->cols)) {
        /* its weight loads start while the kernel before it (PDL_ENTRY) finishes */
        for (int64_t c = 0; c < n; c += GEMV_ROWS)
            CUDA_CHECK(cuda_affine_gemv(y + c * m->rows, x + c * m->cols, n - c < GEMV_ROWS ? n - c : GEMV_ROWS,
                                        &m->aff, cb->gemv_work, s, CUDA_AFFINE_PDL));
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
    if (dense_takes(cb, m, n)) {
        affine_dense(cb, y, m, x_half(cb, x, nullptr, xm), n);
        return;
    }
    /* affine: the tensor-core product on the tiled layout */
    CUDA_CHECK(cuda_affine_gemm(y, x, n, &m->aff, cb->gemm_work, cb->gemm_work_size, s));
}

void cuda_product_swiglu(cuda_backend *cb, float *y, const cuda_mat *m, float *gate, const float *up, int64_t n) {
    if (m->bits && !cuda_mat_general(m) && n <= GEMV_CHUNKED_ROWS && gemv_aligned(gate, m->cols) &&
        gemv_aligned(up, m->cols)) {
        /* silu(gate) * up computed where the decode product stages x: no launch for it */
        for (int64_t c = 0; c < n; c += GEMV_ROWS)
            CUDA_CHECK(cuda_affine_gemv_swiglu(y + c * m->rows, gate + c * m->cols, up + c * m->cols,
                                               n - c < GEMV_ROWS ? n - c : GEMV_ROWS, &m->aff, cb->gemv_work,
                                               cb->stream, CUDA_AFFINE_PDL));
        return;
    }
    const int64_t xm = n * m->cols;
    if (dense_takes(cb, m, n) && half4_fits(gate, up, xm)) { /* prefill: where x goes to fp16 */
        affine_dense(cb, y, m, x_half(cb, gate, up, xm), n);
        return;
    }
    cuda_glu(cb->stream, gate, gate, up, xm, BACKEND_ACT_SILU);
    cuda_product(cb, y, m, gate, n);
}

void cuda_product_set(cuda_backend *cb, float *const *ys, const cuda_mat *const *ms, int k, const float *x, int64_t n) {
    bool one = k > 1 && k <= CUDA_AFFINE_SET;
    const cuda_affine *ws[CUDA_AFFINE_SET];
    for (int i = 0; one && i < k; i++) {
        one = ms[i]->bits && !cuda_mat_general(ms[i]) && !cuda_mat_general(ms[0]) &&
              cuda_affine_compatible(&ms[0]->aff, &ms[i]->aff);
        ws[i] = &ms[i]->aff;
    }
    bool dense = k > 1;
    for (int i = 0; i < k; i++) dense = dense && dense_takes(cb, ms[i], n) && ms[i]->cols == ms[0]->cols;
    if (dense) { /* x rounded once for all */
        const __half *xh = x_half(cb, x, nullptr, n * ms[0]->cols);
        for (int i = 0; i < k; i++) affine_dense(cb, ys[i], ms[i], xh, n);
        return;
    }
    if (one && n > GEMV_CHUNKED_ROWS) {
        CUDA_CHECK(cuda_affine_gemm_set(ys, ws, k, x, n, cb->gemm_work, cb->gemm_work_size, cb->stream));
        return;
    }
    const int64_t chunk = n < GEMV_ROWS ? n : GEMV_ROWS;
    if (one && gemv_aligned(x, ms[0]->cols) && cuda_affine_gemv_set_work_size(ws, k, chunk) <= cb->gemv_work_size) {
        for (int64_t c = 0; c < n; c += GEMV_ROWS) {
            float *yc[CUDA_AFFINE_SET];
            for (int i = 0; i < k; i++) yc[i] = ys[i] + c * ms[i]->rows;
            CUDA_CHECK(cuda_affine_gemv_set(yc, ws, k, x + c * ms[0]->cols, n - c < GEMV_ROWS ? n - c : GEMV_ROWS,
                                            cb->gemv_work, cb->gemv_work_size, cb->stream, CUDA_AFFINE_PDL));
        }
        return;
    }
    for (int i = 0; i < k; i++) cuda_product(cb, ys[i], ms[i], x, n);
}

void cuda_product_mlp(cuda_backend *cb, float *y, const cuda_mat *g, const cuda_mat *u, const cuda_mat *d,
                      const float *x, float *gate, float *up, int64_t n) {
    const int64_t f = g->rows;
    const bool fp16 = dense_takes(cb, g, n) && dense_takes(cb, u, n) && dense_takes(cb, d, n) && u->rows == f &&
                      u->cols == g->cols && d->cols == f && f % 8 == 0 && half4_fits(x, nullptr, n * g->cols) &&
                      (((uintptr_t)gate | (uintptr_t)up) & 15) == 0;
    if (!fp16) {
        float *const ys[2] = {gate, up};
        const cuda_mat *const ms[2] = {g, u};
        cuda_product_set(cb, ys, ms, 2, x, n);
        cuda_product_swiglu(cb, y, d, gate, up, n);
        return;
    }
    /* prefill: gate and up leave cuBLAS in fp16 (in the first half of their buffers), and
     * silu(gate) * up goes to fp16 in xs, which held x */
    const __half *xh = x_half(cb, x, nullptr, n * g->cols);
    affine_dense_to(cb, gate, CUDA_R_16F, g, xh, n);
    affine_dense_to(cb, up, CUDA_R_16F, u, xh, n);
    __half *h = (__half *)cb->xs;
    k_swiglu_h8<<<blocks_for(n * f / 8), THREADS, 0, cb->stream>>>((uint4 *)h, (const uint4 *)gate,
                                                                   (const uint4 *)up, n * f / 8);
    affine_dense(cb, y, d, h, n);
}

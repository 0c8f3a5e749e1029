/*
 * affine.h - MLX affine-quantized weight matrices on an NVIDIA GPU: the device layout made
 * at load, and what reads it: the decode product y = x @ W^T (n = 1..16 rows of x), the
 * prefill product (any n, affine_gemm.cu) and the rows of an embedding table.
 *
 *     cuda_affine w;
 *     if (cuda_affine_upload(&w, &view, stream, err, sizeof err)) fail(err);
 *     size_t ws = 0;                            // the most any n needs
 *     for (int n = 1; n <= CUDA_AFFINE_MAX_N; n++) ws = max(ws, cuda_affine_work_size(&w, n));
 *     void *work = NULL;                        // zero-filled once, reused by every call
 *     cudaMalloc(&work, ws); cudaMemset(work, 0, ws);
 *     cuda_affine_gemv(y, x, n, &w, work, stream, 0); // y[n, rows] = x[n, cols] @ W^T
 *     cuda_affine_free(&w);
 *
 * Layout (what cuda_affine_upload writes; only this module reads it). W is cut into tiles
 * of 16 rows x 512 bytes of codes (64 columns at 4 bits, 32 at 8 bits); row tile rt,
 * column tile kt is 512 contiguous bytes at codes + (rt * k_tiles + kt) * 128 words, so a
 * warp reads a whole tile with one 16-byte load per lane. Lane l = 4 * r + t holds the
 * codes that the tensor-core product mma.m16n8k16 needs in its A fragments: rows r and
 * r + 8 of the tile, and in each 16-column step the four columns 4t .. 4t+3, packed so
 * that a mask and an OR with 0x6400 make a half2 (1024 + q) with no shifts across words.
 * Scales and biases keep the checkpoint's values exactly: (scale, bias) pairs of 16-bit
 * words (F16 or BF16 bits as stored) or of fp32 (F32 checkpoints), grouped per tile row
 * pair, [row_tiles][group_blocks][8][2 * gpb] pairs with gpb = 2 at 4 bits group 32 (two
 * groups in a tile), else 1; pair 2 * jg + h of row r is row r + 8h, group jg of the
 * block. Rows are padded to 16 and columns to a whole tile with zero codes, scales and
 * biases, so the padding adds nothing.
 *
 * Numerics of the product (fp32-exact to about 1e-7): the codes q go to the tensor cores
 * exactly (fp16 integers), x as two fp16 parts hi + lo (x to about 22 bits), accumulated
 * in fp32 per group; each group's scale and bias are applied in fp32:
 * y += s * sum_g(q x) + b * sum_g(x), sum_g(x) summed in fp32 from x. x must stay within
 * fp16's range (|x| < 65504), as in the prefill products.
 *
 * Not here: dense weights, 2/3/5/6-bit codes, groups other than 32/64/128.
 */
#ifndef CELER_BACKEND_CUDA_AFFINE_H
#define CELER_BACKEND_CUDA_AFFINE_H

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/tensor.h"

#define CUDA_AFFINE_MAX_N 16 /* rows of x a decode product takes */
#define CUDA_AFFINE_SET 4   /* matrices one product launch takes (the _set products) */

/* How a matrix's scales and biases are stored on the device. */
typedef enum cuda_affine_sb {
    CUDA_AFFINE_SB_F16 = 0,  /* pairs of fp16 bits, one 32-bit word each */
    CUDA_AFFINE_SB_BF16 = 1, /* pairs of bf16 bits, one 32-bit word each */
    CUDA_AFFINE_SB_F32 = 2,  /* pairs of fp32, two words each */
} cuda_affine_sb;

/* How a decode product is cut: each block of 8 warps takes 8 row tiles (one a warp) and
 * `slice` column tiles; ceil(k_tiles / slice) blocks split each row block's K, and the last
 * of them to finish adds the partial sums in a fixed order. The staged kernel (stream 0)
 * copies a warp's codes into shared memory, slices of 4, 8, 12 or 16; the streamed one
 * (stream 1) loads them into registers a chunk ahead of the product, slices of 4 .. 64 in
 * steps of 4 (those whose x fits the kernels' shared memory). Stream 2 is the streamed
 * kernel with each warp's codes past its first chunk asked of L2 by one bulk prefetch
 * before the wait for the previous kernel (bytes on their way while that one finishes). */
typedef struct cuda_affine_plan {
    int slice;
    int stream;
} cuda_affine_plan;

/* One affine matrix W[rows, cols] in the device layout above. */
typedef struct cuda_affine {
    int64_t rows, cols;
    int bits;                   /* 4 or 8 */
    int64_t group;              /* 32, 64 or 128 */
    int sb_kind;                /* cuda_affine_sb */
    int64_t row_tiles, k_tiles; /* 16-row tiles; 512-byte tiles along cols */
    int64_t group_blocks;       /* sb blocks per row tile: k_tiles * tile_cols / group / gpb */
    uint32_t *codes;            /* [row_tiles][k_tiles][32 lanes][4] */
    uint32_t *sb;               /* [row_tiles][group_blocks][8][2 * gpb] (scale, bias) pairs */
    size_t bytes;               /* device bytes held (codes + sb) */
    unsigned char plan[CUDA_AFFINE_MAX_N + 1]; /* each n's plan: slice / 4 | stream << 5 (cuda_affine_plan_for) */
} cuda_affine;

/* Bits in the flags of cuda_affine_gemv. */
enum {
    /* Launched with programmatic dependent launch: the kernel starts loading weights
     * while the previous kernel in the stream finishes, and waits for it before reading x
     * or writing anything but shared memory. Correct after any kernel; a gain after one
     * that lets its dependents start early (this product does). */
    CUDA_AFFINE_PDL = 1u,
};

/* Whether w is a matrix this layout holds: 4- or 8-bit codes, groups of 32, 64 or 128,
 * F16, BF16 or F32 scales with biases, one level, no codebook (cuda_affine_upload's). */
bool cuda_affine_takes(const matview *w);

/* Copies the host matrix w (quant_bits 4 or 8, group 32/64/128, scales F16, BF16 or F32)
 * to the device in the tiled layout, on stream s (synchronized before returning), and
 * picks the plan of each n. 0 on success; otherwise -1 with a message in err. The caller
 * frees with cuda_affine_free. */
int cuda_affine_upload(cuda_affine *out, const matview *w, cudaStream_t s, char *err,
                       size_t err_size);

/* The same from a matview whose data, scales and biases already sit in device memory
 * (read, not kept). */
int cuda_affine_upload_device(cuda_affine *out, const matview *w, cudaStream_t s, char *err,
                              size_t err_size);

/* Frees what cuda_affine_upload allocated; the struct is zeroed. NULL-safe. */
void cuda_affine_free(cuda_affine *w);

/* Bytes of the work buffer cuda_affine_gemv needs for n rows of x (0 when none). The
 * buffer must be zero-filled before its first use; every call leaves its counters so,
 * and any products (single or _set) may share it one after another on a stream. */
size_t cuda_affine_work_size(const cuda_affine *w, int64_t n);

/* y[n, rows] = x[n, cols] @ W^T, 1 <= n <= 16; x and y fp32, row-major, in device memory,
 * x 16-byte aligned. Enqueued on s (capturable: no allocation, no synchronization);
 * returns the launch's error (cudaSuccess). */
cudaError_t cuda_affine_gemv(float *y, const float *x, int64_t n, const cuda_affine *w,
                             void *work, cudaStream_t s, unsigned flags);

/* The same with x = silu(gate) * up (gate and up [n, cols], 16-byte aligned), computed
 * where the product stages x, bit for bit as cuda_glu's SiLU: an MLP's down projection
 * without the SwiGLU launch before it. */
cudaError_t cuda_affine_gemv_swiglu(float *y, const float *gate, const float *up, int64_t n, const cuda_affine *w,
                                    void *work, cudaStream_t s, unsigned flags);

/* Whether a and b can go through one launch of the _set products: the same input width,
 * bits, group and scale type. */
bool cuda_affine_compatible(const cuda_affine *a, const cuda_affine *b);

/* ys[i][n, w[i]->rows] = x[n, cols] @ W_i^T for i < k <= CUDA_AFFINE_SET compatible
 * matrices of one input, 1 <= n <= 16, as one launch: the decode product over the set as
 * if its matrices were one (their rows one after another). Work: at least
 * cuda_affine_gemv_set_work_size bytes, zero-filled before the first use as for
 * cuda_affine_gemv. cudaErrorInvalidValue (nothing queued) when the matrices cannot
 * share a launch or work_size is too small. */
cudaError_t cuda_affine_gemv_set(float *const *ys, const cuda_affine *const *w, int k, const float *x, int64_t n,
                                 void *work, size_t work_size, cudaStream_t s, unsigned flags);
size_t cuda_affine_gemv_set_work_size(const cuda_affine *const *w, int k, int64_t n);

/* The plan cuda_affine_gemv uses for n rows, and the K split a plan makes. */
cuda_affine_plan cuda_affine_plan_for(const cuda_affine *w, int64_t n);
int64_t cuda_affine_plan_split(const cuda_affine *w, cuda_affine_plan p);

/* Bytes of work a given plan needs for n rows. */
size_t cuda_affine_plan_work_size(const cuda_affine *w, int64_t n, cuda_affine_plan p);

/* Whether a plan can run at n rows: a valid slice whose block fits the kernels' shared
 * memory (at n > 8 the widest slices of fp32 scales do not). */
bool cuda_affine_plan_fits(const cuda_affine *w, int64_t n, cuda_affine_plan p);

/* cuda_affine_gemv with a given plan (tests and benchmarks compare plans); a plan that does
 * not fit is cudaErrorInvalidValue, nothing queued. */
cudaError_t cuda_affine_gemv_plan(float *y, const float *x, int64_t n, const cuda_affine *w,
                                  void *work, cudaStream_t s, unsigned flags,
                                  cuda_affine_plan p);

/* y[n, rows] = x[n, cols] @ W^T for any n >= 1 (meant for prefill: n > 8) on the tensor
 * cores, from the tiled layout, with the decode product's numerics (x staged in work as
 * fp16 hi + lo with its fp32 sums per group). x and y fp32, row-major, device memory;
 * work holds work_size >= cuda_affine_gemm_work_size bytes. What work holds past that
 * lets a launch too small to fill the device split K: s splits keep their partial sums
 * there (cuda_affine_gemm_split_bytes(n, rows, s) after the staged x rounded up to 256
 * bytes) and a second kernel adds them in split order, so a result does not depend on
 * timing, only on n and the shape. Enqueued on s (capturable); returns the launch's
 * error (cudaErrorInvalidValue, nothing queued, when work_size is too small). */
cudaError_t cuda_affine_gemm(float *y, const float *x, int64_t n, const cuda_affine *w, void *work,
                             size_t work_size, cudaStream_t s);
size_t cuda_affine_gemm_split_bytes(int64_t n, int64_t rows, int splits);

/* Which tensor-core product cuda_affine_gemm runs: chosen by n and the device (AUTO: the
 * warpgroup product from WG_MIN_N rows on a compute capability 9.0 GPU), or one forced
 * (tests and benchmarks compare them; WGMMA elsewhere is cudaErrorNotSupported). */
typedef enum cuda_gemm_path { CUDA_GEMM_AUTO = 0, CUDA_GEMM_MMA = 1, CUDA_GEMM_WGMMA = 2 } cuda_gemm_path;
cudaError_t cuda_affine_gemm_set_path(float *const *ys, const cuda_affine *const *w, int k, const float *x,
                                      int64_t n, void *work, size_t work_size, cudaStream_t s, cuda_gemm_path path);
/* Whether the current device runs the warpgroup product. */
bool cuda_affine_gemm_has_wgmma(void);

/* Bytes of work cuda_affine_gemm needs for n rows of x; the bound for any matrix of at
 * most cols columns: cuda_affine_gemm_work_bound. */
size_t cuda_affine_gemm_work_size(const cuda_affine *w, int64_t n);
size_t cuda_affine_gemm_work_bound(int64_t n, int64_t cols);

/* cuda_affine_gemm for k <= CUDA_AFFINE_SET compatible matrices of one input: x staged
 * once, one launch; the same staged x as one matrix (cuda_affine_gemm_work_size of any
 * of them), split K's partial sums over the rows of all of them. cudaErrorInvalidValue
 * (nothing queued) when they cannot share a launch. */
cudaError_t cuda_affine_gemm_set(float *const *ys, const cuda_affine *const *w, int k, const float *x, int64_t n,
                                 void *work, size_t work_size, cudaStream_t s);

/* y[i, cols] = row ids[i] of W as fp32 (s * q + b, rounded as the CPU reference rounds)
 * for i < n; rows of negative ids are left as they are. Enqueued on s; returns the
 * launch's error. */
cudaError_t cuda_affine_rows(float *y, const cuda_affine *w, const int32_t *ids, int64_t n,
                             cudaStream_t s);

/* y[r, cols] = row row0 + r of W rounded to fp16 (from the fp32 value cuda_affine_rows
 * gives) for r < rows, row-major, cols apart: W in the form a dense fp16 product reads.
 * Enqueued on s; cudaErrorInvalidValue (nothing queued) for rows outside W. */
cudaError_t cuda_affine_dequant(__half *y, const cuda_affine *w, int64_t row0, int64_t rows, cudaStream_t s);

/* The reference: y[n, rows] = x[n, cols] @ W^T in double from the checkpoint layout
 * (w's data, scales and biases in device memory, as in cuda_affine_upload_device), one
 * thread per output, any n. For tests. */
cudaError_t cuda_affine_ref(double *y, const float *x, int64_t n, const matview *w,
                            cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif

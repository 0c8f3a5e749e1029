/*
 * qmat.h - quantized weight matrices on an NVIDIA GPU in every form affine.h's tiles do not
 * take: GGUF's K-quants (two-level scales), its symmetric blocks with a zero point (Q5_0,
 * Q3_K, Q6_K), codebooks (IQ4_NL, IQ4_XS, MLX's mxfp4 and nvfp4) and codes of 2, 3, 5 and
 * 6 bits (MLX affine, Q5_1). What reads them: the decode product y = x @ W^T (n = 1..16
 * rows of x), W's rows in fp16 for the dense prefill product (matmul.cu), and the rows of
 * an embedding table.
 *
 *     cuda_qmat w;
 *     if (cuda_qmat_upload(&w, &view, stream, err, sizeof err)) fail(err);
 *     cuda_qmat_gemv(y, x, n, &w, work, stream); // y[n, rows] = x[n, cols] @ W^T
 *     cuda_qmat_free(&w);
 *
 * Layout: the host matview's own (tensor.h), copied as it is into one device allocation,
 * so the device holds exactly the bytes the CPU binds (within 5% of the file's): codes as
 * per-row little-endian bit strings [rows, cols * bits / 32] words, group scales and
 * biases [rows, cols / group] in their stored type (F32, F16, BF16, U8, I8, the two nibbles
 * of Q2_K's bytes, E8M0, F8E4M3), super-block factors F16 [rows, cols / super], and the
 * codebook (at most 16 values) inside the struct. 32 codes always fill whole words, so a
 * thread takes 32 columns at a time: bits words, one or two groups (16 or >= 32 columns).
 *
 * Numerics: values are formed exactly as matview_row forms them (the rows and the fp16
 * dequantization round that fp32 value once). The decode product quantizes x per block of
 * 32 columns into int8 codes (d = max|x| / 127) and the residual's int8 codes (d / 254),
 * about 16 bits in all, as the CPU's fast kernels pair a row with its residual; it sums
 * v(q) times each part per group exactly in int32 (v: the code, or the codebook's value),
 * then adds s * (d sum1 + d / 254 sum2 - zero * sum(x's value)) + b * sum(x) in fp32.
 */
#ifndef CELER_BACKEND_CUDA_QMAT_H
#define CELER_BACKEND_CUDA_QMAT_H

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/tensor.h"

#define CUDA_QMAT_MAX_N 16 /* rows of x a decode product takes */

/* One quantized matrix W[rows, cols] in the layout above (passed to kernels by value). */
typedef struct cuda_qmat {
    int64_t rows, cols;
    int bits;                       /* 2 .. 8 */
    int64_t group;                  /* 16, or a multiple of 32 */
    int64_t super;                  /* columns per super-block; 0: one-level scales */
    int group_shift, super_shift;   /* log2 of group and super: indices by shifts */
    int64_t groups_row, supers_row; /* groups and super-blocks a row */
    int scale_type, bias_type;      /* dtype of the group scales and biases */
    int zero;                       /* w = s * (q - zero) without biases */
    int lut_shift;                  /* fractional bits of the codebook's values */
    int has_lut;                    /* lut holds the code values */
    int8_t lut[16];                 /* the codebook (codes of at most 4 bits) */
    const uint32_t *codes;          /* [rows, cols * bits / 32] */
    const uint8_t *scales, *biases; /* [rows, cols / group]; biases NULL: a zero point */
    const __half *super_scales;     /* [rows, cols / super], or NULL */
    const __half *super_biases;     /* [rows, cols / super], or NULL */
    void *mem;                      /* the one allocation everything above lives in */
    size_t bytes;                   /* device bytes held */
} cuda_qmat;

/* Whether cuda_qmat_upload takes w (an affine matview); if not, why in err. */
int cuda_qmat_supported(const matview *w, char *err, size_t err_size);

/* Copies the host matrix w to the device on stream s (synchronized before returning). 0 on
 * success; otherwise -1 with a message in err. The caller frees with cuda_qmat_free. */
int cuda_qmat_upload(cuda_qmat *out, const matview *w, cudaStream_t s, char *err, size_t err_size);

/* Frees what cuda_qmat_upload allocated; the struct is zeroed. NULL-safe. */
void cuda_qmat_free(cuda_qmat *w);

/* Bytes of the workspace cuda_qmat_gemv takes for n rows of x of cols columns. */
size_t cuda_qmat_work_bytes(int64_t n, int64_t cols);

/* y[n, rows] = x[n, cols] @ W^T, 1 <= n <= CUDA_QMAT_MAX_N; x and y fp32, row-major, in
 * device memory; work: cuda_qmat_work_bytes(n, cols) bytes of device memory, 16-byte
 * aligned, for x's int8 form. Enqueued on s (capturable); returns the launch's error. */
cudaError_t cuda_qmat_gemv(float *y, const float *x, int64_t n, const cuda_qmat *w, void *work,
                           cudaStream_t s);

/* y[i, cols] = row ids[i] of W as fp32, exactly as matview_row gives it, for i < n (rows
 * whose id is negative are left as they are). Enqueued on s. */
cudaError_t cuda_qmat_rows(float *y, const cuda_qmat *w, const int32_t *ids, int64_t n,
                           cudaStream_t s);

/* y[r, cols] = row row0 + r of W rounded to fp16 (from the fp32 value cuda_qmat_rows
 * gives), r < rows, row-major: W in the form a dense fp16 product reads. Enqueued on s;
 * cudaErrorInvalidValue (nothing queued) for rows outside W. */
cudaError_t cuda_qmat_dequant(__half *y, const cuda_qmat *w, int64_t row0, int64_t rows,
                              cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif

/*
 * qmat.cu - quantized matrices in the host's own layout on the GPU (qmat.h): upload, the
 * decode product, embedding rows and the fp16 rows of the dense prefill product.
 *
 * A unit of work is a chunk: 32 columns of one row, `bits` whole words of codes and one
 * group (groups of 32 and more) or two (groups of 16). The decode product gives each warp
 * an output row, its lanes taking every 32nd chunk, so a warp's loads of codes are
 * contiguous (512 bytes a step at 4 bits) and so are its group scales. It first quantizes
 * x to two int8 parts (codes and the residual's codes, about 16 bits together); a chunk's
 * values go to int8 words (a mask and two byte permutes per 8 codes at 4 bits) and dp4a
 * sums them against each part, so a weight costs about two instructions, where fp32
 * products cost six.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/qmat.h"
#include "backend/cuda/trace.h"

#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define QMAT_WARPS 8 /* output rows a decode block takes, one a warp */
/* Chunks of the decode loop unrolled: two a lane in flight (Q4_K_M 8B tg128 on an H100:
 * 94.7 tok/s against 91.6 at one) */
static constexpr int QMAT_UNROLL = 2;

CUDA_TRACE_UNIT(qmat)

/* ==== Values as matview_row forms them ==== */

/* Element i of a group-scale array of type t (tensor.h's dtype_load_f32 on the device). */
__device__ __forceinline__ float scale_at(int t, const uint8_t *p, int64_t i) {
    switch (t) {
    case DTYPE_F32:
        return ((const float *)p)[i];
    case DTYPE_F16:
        return __half2float(((const __half *)p)[i]);
    case DTYPE_BF16:
        return __uint_as_float((uint32_t)((const uint16_t *)p)[i] << 16);
    case DTYPE_U8:
        return (float)p[i];
    case DTYPE_I8:
        return (float)(int8_t)p[i];
    case DTYPE_U4LO:
        return (float)(p[i] & 15);
    case DTYPE_U4HI:
        return (float)(p[i] >> 4);
    case DTYPE_E8M0:
        return p[i] == 255 ? __int_as_float(0x7fc00000) : ldexpf(1.0f, (int)p[i] - 127);
    default: { /* DTYPE_F8E4M3 */
        const int e = (p[i] >> 3) & 15, m = p[i] & 7;
        const float v = e == 15 && m == 7 ? __int_as_float(0x7fc00000)
                        : e               ? ldexpf(1.0f + (float)m / 8.0f, e - 7)
                                          : ldexpf((float)m, -9);
        return p[i] & 0x80 ? -v : v;
    }
    }
}

/* Group g of row r: its scale and bias (0 without biases: the zero point or the codebook
 * is in the code values), rounded as matview_row rounds them. Indices by multiplies and
 * shifts: a 64-bit division is a long software sequence on the GPU. */
__device__ __forceinline__ void group_sb(const cuda_qmat &w, int64_t r, int64_t g, float &s,
                                         float &b) {
    const int64_t i = r * w.groups_row + g;
    s = scale_at(w.scale_type, w.scales, i);
    b = 0.0f;
    if (w.super) {
        const int64_t k = r * w.supers_row + (g >> (w.super_shift - w.group_shift));
        s = __fmul_rn(__half2float(w.super_scales[k]), s);
        if (w.biases)
            b = __fmul_rn(__half2float(w.super_biases[k]), scale_at(w.bias_type, w.biases, i));
    } else if (w.biases) {
        b = scale_at(w.bias_type, w.biases, i);
    }
}

/* The bits words of chunk c of row r (16-byte loads where the words allow them). */
template <int BITS>
__device__ __forceinline__ void load_chunk(uint32_t (&q)[BITS], const cuda_qmat &w, int64_t r,
                                           int64_t c) {
    const uint32_t *p = w.codes + (r * (w.cols / 32) + c) * BITS;
    if constexpr (BITS % 4 == 0) {
#pragma unroll
        for (int k = 0; k < BITS; k += 4) {
            const uint4 v = __ldg((const uint4 *)p + k / 4);
            q[k] = v.x, q[k + 1] = v.y, q[k + 2] = v.z, q[k + 3] = v.w;
        }
    } else if constexpr (BITS == 2) {
        const uint2 v = __ldg((const uint2 *)p);
        q[0] = v.x, q[1] = v.y;
    } else {
#pragma unroll
        for (int k = 0; k < BITS; k++) q[k] = __ldg(p + k);
    }
}

/* Code j (0..31) of a chunk: bits j*BITS .. of its little-endian bit string. */
template <int BITS> __device__ __forceinline__ int code_of(const uint32_t (&q)[BITS], int j) {
    const int bit = j * BITS, k = bit >> 5, sh = bit & 31;
    uint32_t v = q[k] >> sh;
    if (sh + BITS > 32) v |= q[k + 1] << (32 - sh);
    return (int)(v & ((1u << BITS) - 1u));
}

/* The 32 code values of a chunk: q - zero, or the codebook's value (lut: in shared). */
template <int BITS, bool LUT>
__device__ __forceinline__ void chunk_values(float (&v)[32], const uint32_t (&q)[BITS], int zero,
                                             const float *lut) {
#pragma unroll
    for (int j = 0; j < 32; j++)
        v[j] = LUT ? lut[code_of<BITS>(q, j)] : (float)(code_of<BITS>(q, j) - zero);
}

/* The codebook's values as matview_row forms them (ldexpf(lut[q], -shift)), into shared. */
__device__ __forceinline__ void stage_lut(float *lut, const cuda_qmat &w) {
    if (threadIdx.x < 16) lut[threadIdx.x] = ldexpf((float)w.lut[threadIdx.x], -w.lut_shift);
    __syncthreads();
}

/* Offsets into the one allocation, each 16-byte aligned. */
static size_t take(size_t *at, size_t bytes) {
    const size_t o = *at;
    *at += (bytes + 15) & ~(size_t)15;
    return o;
}

/* ==== Decode product ==== */

/* x quantized for the product in two int8 parts: per row, codes q1 with one scale d a
 * block of 32 columns, then the residual's codes q2 at scale d / 254, so q1 d + q2 d / 254
 * is x to about 16 bits (as the CPU's fast kernels pair a row with its residual); and a
 * half block of 16's sums: of x (the biases' term) and of its quantized value (the zero
 * points' correction). */
struct q8x {
    const int8_t *q1, *q2; /* [n, cols] */
    const float *d;        /* [n, cols / 32] */
    const float *fs, *qs;  /* [n, cols / 16] */
};

#define Q8X_LO (1.0f / 254.0f) /* the residual's scale, of d */

/* Offsets of q8x's arrays in the workspace (q1 at 0), each 16-byte aligned. */
struct q8x_at {
    size_t q2, d, fs, qs, end;
};
static q8x_at q8x_layout(int64_t n, int64_t cols) {
    q8x_at o;
    size_t at = 0;
    take(&at, (size_t)(n * cols));
    o.q2 = take(&at, (size_t)(n * cols));
    o.d = take(&at, sizeof(float) * (size_t)(n * cols / 32));
    o.fs = take(&at, sizeof(float) * (size_t)(n * cols / 16));
    o.qs = take(&at, sizeof(float) * (size_t)(n * cols / 16));
    o.end = at;
    return o;
}

/* Four int8 codes into one word, in column order. */
__device__ __forceinline__ uint32_t pack4(const int (&c)[4]) {
    return (uint32_t)(c[0] & 0xff) | (uint32_t)(c[1] & 0xff) << 8 | (uint32_t)(c[2] & 0xff) << 16 |
           (uint32_t)(c[3] & 0xff) << 24;
}

/* One block of 32 columns a thread: d = max|x| / 127, q1 = rint(x / d), q2 = rint((x - q1
 * d) / (d / 254)). */
__global__ static void k_quantize_x(int8_t *q1, int8_t *q2, float *d, float *fs, float *qs,
                                    const float *x, int64_t blocks) {
    GRID_STRIDE(i, blocks) {
        const float *xb = x + i * 32;
        float v[32], amax = 0.0f;
#pragma unroll
        for (int j = 0; j < 32; j++) v[j] = xb[j], amax = fmaxf(amax, fabsf(v[j]));
        const float hi = amax / 127.0f, lo = hi * Q8X_LO;
        const float inv = amax > 0.0f ? 1.0f / hi : 0.0f, inv_lo = amax > 0.0f ? 1.0f / lo : 0.0f;
        uint32_t w1[8], w2[8];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float f = 0.0f;
            int s1 = 0, s2 = 0;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int c1[4], c2[4];
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    const int j = 16 * h + 4 * k + b;
                    c1[b] = __float2int_rn(v[j] * inv);
                    c2[b] =
                        min(127, max(-127, __float2int_rn((v[j] - (float)c1[b] * hi) * inv_lo)));
                    f += v[j], s1 += c1[b], s2 += c2[b];
                }
                w1[4 * h + k] = pack4(c1), w2[4 * h + k] = pack4(c2);
            }
            fs[2 * i + h] = f, qs[2 * i + h] = (float)s1 * hi + (float)s2 * lo;
        }
        uint4 *o1 = (uint4 *)(q1 + i * 32), *o2 = (uint4 *)(q2 + i * 32);
        o1[0] = make_uint4(w1[0], w1[1], w1[2], w1[3]),
        o1[1] = make_uint4(w1[4], w1[5], w1[6], w1[7]);
        o2[0] = make_uint4(w2[0], w2[1], w2[2], w2[3]),
        o2[1] = make_uint4(w2[4], w2[5], w2[6], w2[7]);
        d[i] = hi;
    }
}

/* The chunk's 32 values as int8, four a word (word k: columns 4k .. 4k + 3): the codes
 * themselves (8-bit: less 128, which the product adds back), or the codebook's values
 * (lut8: in shared). */
template <int BITS, bool LUT>
__device__ __forceinline__ void chunk_bytes(int (&v)[8], const uint32_t (&q)[BITS],
                                            const int8_t *lut8) {
    if constexpr (BITS == 4 && !LUT) {
#pragma unroll
        for (int k = 0; k < 4; k++) { /* word k holds codes 8k .. 8k + 7, a nibble each */
            const uint32_t lo = q[k] & 0x0f0f0f0fu, hi = (q[k] >> 4) & 0x0f0f0f0fu;
            v[2 * k] = (int)__byte_perm(lo, hi, 0x5140);
            v[2 * k + 1] = (int)__byte_perm(lo, hi, 0x7362);
        }
    } else if constexpr (BITS == 8) {
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = (int)(q[k] ^ 0x80808080u);
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) {
            uint32_t word = 0;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int c = code_of<BITS>(q, 4 * k + b);
                word |= (uint32_t)(uint8_t)(LUT ? lut8[c] : (int8_t)c) << (8 * b);
            }
            v[k] = (int)word;
        }
    }
}

/* y[n, rows] = x[n, cols] @ W^T for n <= NR, one row of W a warp, x as q8x: per group,
 * dp4a sums the int8 values times each part of x exactly; then acc += s * (d sum1 +
 * d / 254 sum2 - zero * sum of quantized x) + b * sum(x). G16: groups of 16 (two a chunk),
 * else one group covers the chunk. */
template <int BITS, bool LUT, bool G16, int NR>
__global__ static void __launch_bounds__(QMAT_WARPS * 32)
    k_gemv(float *y, const q8x x, int n, const cuda_qmat w) {
    constexpr int HALVES = G16 ? 2 : 1, WORDS = 8 / HALVES;
    trace_scope tr(TR_QGEMV);
    __shared__ int8_t lut8[16];
    if (LUT) {
        if (threadIdx.x < 16) lut8[threadIdx.x] = w.lut[threadIdx.x];
        __syncthreads();
    }
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * QMAT_WARPS + (threadIdx.x >> 5);
    if (r >= w.rows) return;
    const int64_t chunks = w.cols / 32;
    /* what the values lack of the codes less the zero point: 8-bit codes' 128 less it */
    const float shift = (float)((BITS == 8 && !LUT ? 128 : 0) - (w.biases || LUT ? 0 : w.zero));
    const float unit = LUT ? ldexpf(1.0f, -w.lut_shift) : 1.0f;
    float acc[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) acc[i] = 0.0f;
#pragma unroll QMAT_UNROLL
    for (int64_t c = lane; c < chunks; c += 32) {
        uint32_t q[BITS];
        load_chunk<BITS>(q, w, r, c);
        int v[8];
        chunk_bytes<BITS, LUT>(v, q, lut8);
        float s[HALVES], b[HALVES];
#pragma unroll
        for (int h = 0; h < HALVES; h++) {
            group_sb(w, r, G16 ? 2 * c + h : (c << 5) >> w.group_shift, s[h], b[h]);
            s[h] *= unit;
        }
#pragma unroll
        for (int i = 0; i < NR; i++) {
            if (i >= n) break;
            const int64_t xb = i * chunks + c;
            const uint4 *p1 = (const uint4 *)(x.q1 + xb * 32),
                        *p2 = (const uint4 *)(x.q2 + xb * 32);
            const uint4 a0 = __ldg(p1), a1 = __ldg(p1 + 1), b0 = __ldg(p2), b1 = __ldg(p2 + 1);
            const int x1[8] = {(int)a0.x, (int)a0.y, (int)a0.z, (int)a0.w,
                               (int)a1.x, (int)a1.y, (int)a1.z, (int)a1.w};
            const int x2[8] = {(int)b0.x, (int)b0.y, (int)b0.z, (int)b0.w,
                               (int)b1.x, (int)b1.y, (int)b1.z, (int)b1.w};
            const float d = __ldg(x.d + xb);
            const float2 fs = __ldg((const float2 *)(x.fs + 2 * xb)),
                         qs = __ldg((const float2 *)(x.qs + 2 * xb));
            const float fh[2] = {fs.x, fs.y}, qh[2] = {qs.x, qs.y};
#pragma unroll
            for (int h = 0; h < HALVES; h++) {
                int d1 = 0, d2 = 0;
#pragma unroll
                for (int k = h * WORDS; k < (h + 1) * WORDS; k++)
                    d1 = __dp4a(v[k], x1[k], d1), d2 = __dp4a(v[k], x2[k], d2);
                const float xq = G16 ? qh[h] : qh[0] + qh[1], xf = G16 ? fh[h] : fh[0] + fh[1];
                const float dot = fmaf(d, (float)d1, fmaf(d * Q8X_LO, (float)d2, shift * xq));
                acc[i] = fmaf(s[h], dot, fmaf(b[h], xf, acc[i]));
            }
        }
    }
#pragma unroll
    for (int i = 0; i < NR; i++) {
        if (i >= n) break;
        float a = acc[i];
#pragma unroll
        for (int o = 16; o; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        if (lane == 0) y[i * w.rows + r] = a;
    }
}

typedef void (*gemv_fn)(float *, const q8x, int, const cuda_qmat);

template <int BITS, bool LUT, bool G16> static gemv_fn gemv_for(int64_t n) {
    return n <= 1   ? k_gemv<BITS, LUT, G16, 1>
           : n <= 2 ? k_gemv<BITS, LUT, G16, 2>
           : n <= 4 ? k_gemv<BITS, LUT, G16, 4>
           : n <= 8 ? k_gemv<BITS, LUT, G16, 8>
                    : k_gemv<BITS, LUT, G16, 16>;
}

template <bool G16> static gemv_fn gemv_bits(const cuda_qmat *w, int64_t n) {
    switch (w->bits) {
    case 2:
        return gemv_for<2, false, G16>(n);
    case 3:
        return gemv_for<3, false, G16>(n);
    case 4:
        return w->has_lut ? gemv_for<4, true, G16>(n) : gemv_for<4, false, G16>(n);
    case 5:
        return gemv_for<5, false, G16>(n);
    case 6:
        return gemv_for<6, false, G16>(n);
    default:
        return gemv_for<8, false, G16>(n);
    }
}

static gemv_fn pick_gemv(const cuda_qmat *w, int64_t n) {
    return w->group == 16 ? gemv_bits<true>(w, n) : gemv_bits<false>(w, n);
}

extern "C" size_t cuda_qmat_work_bytes(int64_t n, int64_t cols) {
    return q8x_layout(n, cols).end;
}

extern "C" cudaError_t cuda_qmat_gemv(float *y, const float *x, int64_t n, const cuda_qmat *w,
                                      void *work, cudaStream_t s) {
    if (n < 1 || n > CUDA_QMAT_MAX_N || ((uintptr_t)work & 15)) return cudaErrorInvalidValue;
    const q8x_at o = q8x_layout(n, w->cols);
    char *m = (char *)work;
    const int64_t blocks = n * w->cols / 32;
    k_quantize_x<<<blocks_for(blocks), THREADS, 0, s>>>((int8_t *)m, (int8_t *)(m + o.q2),
                                                        (float *)(m + o.d), (float *)(m + o.fs),
                                                        (float *)(m + o.qs), x, blocks);
    const q8x xq = {(const int8_t *)m, (const int8_t *)(m + o.q2), (const float *)(m + o.d),
                    (const float *)(m + o.fs), (const float *)(m + o.qs)};
    const unsigned grid = (unsigned)((w->rows + QMAT_WARPS - 1) / QMAT_WARPS);
    pick_gemv(w, n)<<<grid, QMAT_WARPS * 32, 0, s>>>(y, xq, (int)n, *w);
    return cudaGetLastError();
}

/* ==== Rows: embeddings (fp32) and the dense product's fp16 ==== */

__device__ __forceinline__ void store_chunk(float *y, const float (&v)[32]) {
#pragma unroll
    for (int j = 0; j < 32; j++) y[j] = v[j];
}
__device__ __forceinline__ void store_chunk(__half *y, const float (&v)[32]) {
#pragma unroll
    for (int j = 0; j < 32; j += 8) {
        uint32_t o[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const __half2 h = __floats2half2_rn(v[j + 2 * k], v[j + 2 * k + 1]);
            o[k] = *(const uint32_t *)&h;
        }
        *(uint4 *)(y + j) = make_uint4(o[0], o[1], o[2], o[3]);
    }
}

/* out[i, cols] = row (ids ? ids[i] : row0 + i) of W for i < m / chunks, one chunk a
 * thread, each value rounded as matview_row rounds it. */
template <int BITS, bool LUT, bool G16, typename T>
__global__ static void k_rows(T *out, const cuda_qmat w, const int32_t *ids, int64_t row0,
                              int64_t m) {
    constexpr int HALVES = G16 ? 2 : 1, SPAN = 32 / HALVES;
    trace_scope tr(TR_QROWS);
    __shared__ float lut[16];
    if (LUT) stage_lut(lut, w);
    const int64_t chunks = w.cols / 32;
    GRID_STRIDE(i, m) {
        const int64_t t = i / chunks, c = i % chunks;
        const int64_t r = ids ? (int64_t)ids[t] : row0 + t;
        if (r < 0) continue; /* a row the caller fills: left as it is */
        uint32_t q[BITS];
        load_chunk<BITS>(q, w, r, c);
        float v[32];
        chunk_values<BITS, LUT>(v, q, w.zero, lut);
#pragma unroll
        for (int h = 0; h < HALVES; h++) {
            float s, b;
            group_sb(w, r, G16 ? 2 * c + h : (c << 5) >> w.group_shift, s, b);
#pragma unroll
            for (int j = h * SPAN; j < (h + 1) * SPAN; j++)
                v[j] = w.biases ? __fadd_rn(__fmul_rn(s, v[j]), b) : __fmul_rn(s, v[j]);
        }
        store_chunk(out + t * w.cols + c * 32, v);
    }
}

template <int BITS, bool LUT, typename T>
static void rows_g(T *out, const cuda_qmat *w, const int32_t *ids, int64_t row0, int64_t m,
                   cudaStream_t s) {
    if (w->group == 16)
        k_rows<BITS, LUT, true, T><<<blocks_for(m), THREADS, 0, s>>>(out, *w, ids, row0, m);
    else
        k_rows<BITS, LUT, false, T><<<blocks_for(m), THREADS, 0, s>>>(out, *w, ids, row0, m);
}

template <typename T>
static cudaError_t launch_rows(T *out, const cuda_qmat *w, const int32_t *ids, int64_t row0,
                               int64_t n, cudaStream_t s) {
    const int64_t m = n * (w->cols / 32);
    if (m <= 0) return cudaSuccess;
    switch (w->bits) {
    case 2:
        rows_g<2, false>(out, w, ids, row0, m, s);
        break;
    case 3:
        rows_g<3, false>(out, w, ids, row0, m, s);
        break;
    case 4:
        w->has_lut ? rows_g<4, true>(out, w, ids, row0, m, s)
                   : rows_g<4, false>(out, w, ids, row0, m, s);
        break;
    case 5:
        rows_g<5, false>(out, w, ids, row0, m, s);
        break;
    case 6:
        rows_g<6, false>(out, w, ids, row0, m, s);
        break;
    default:
        rows_g<8, false>(out, w, ids, row0, m, s);
        break;
    }
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_qmat_rows(float *y, const cuda_qmat *w, const int32_t *ids, int64_t n,
                                      cudaStream_t s) {
    return launch_rows(y, w, ids, 0, n, s);
}

extern "C" cudaError_t cuda_qmat_dequant(__half *y, const cuda_qmat *w, int64_t row0, int64_t rows,
                                         cudaStream_t s) {
    if (row0 < 0 || rows < 0 || row0 + rows > w->rows) return cudaErrorInvalidValue;
    return launch_rows(y, w, (const int32_t *)nullptr, row0, rows, s);
}

/* ==== Upload ==== */

static bool scale_type_ok(dtype t) {
    return t == DTYPE_F32 || t == DTYPE_F16 || t == DTYPE_BF16 || t == DTYPE_U8 || t == DTYPE_I8 ||
           t == DTYPE_U4LO || t == DTYPE_E8M0 || t == DTYPE_F8E4M3;
}

extern "C" int cuda_qmat_supported(const matview *w, char *err, size_t err_size) {
    const int bits = w->quant_bits;
    const char *why = NULL;
    if (bits < 2 || bits > 8 || bits == 7)
        why = "codes of 2, 3, 4, 5, 6 or 8 bits";
    else if (w->cols % 32 || w->group <= 0 || w->cols % w->group ||
             (w->group != 16 && w->group % 32))
        why = "columns a multiple of 32, groups of 16 or a multiple of 32";
    else if (!scale_type_ok(w->scale_type))
        why = "scales of F32, F16, BF16, U8, I8, U4, E8M0 or F8E4M3";
    else if (w->group & (w->group - 1))
        why = "groups of a power of two";
    else if (w->super && (w->super % w->group || w->cols % w->super || (w->super & (w->super - 1))))
        why = "super-blocks of whole groups, a power of two";
    else if (w->lut && bits != 4)
        why = "a codebook of 4-bit codes";
    if (!why) return 1;
    snprintf(err, err_size, "%d-bit weights with group %lld and %s scales are not supported (%s)",
             bits, (long long)w->group, dtype_name(w->scale_type), why);
    return 0;
}

extern "C" int cuda_qmat_upload(cuda_qmat *out, const matview *w, cudaStream_t s, char *err,
                                size_t err_size) {
    memset(out, 0, sizeof *out);
    if (!cuda_qmat_supported(w, err, err_size)) return -1;
    cuda_qmat q = {};
    q.rows = w->rows, q.cols = w->cols, q.bits = w->quant_bits, q.group = w->group,
    q.super = w->super;
    q.groups_row = w->cols / w->group, q.supers_row = w->super ? w->cols / w->super : 0;
    while ((int64_t)1 << q.group_shift < w->group) q.group_shift++;
    while (w->super && (int64_t)1 << q.super_shift < w->super) q.super_shift++;
    q.scale_type = w->scale_type;
    q.bias_type = w->scale_type == DTYPE_U4LO ? DTYPE_U4HI : w->scale_type;
    q.zero = w->biases ? 0 : w->zero;
    q.has_lut = w->lut != NULL, q.lut_shift = w->lut_shift;
    if (w->lut) memcpy(q.lut, w->lut, 16);
    const size_t code_bytes = (size_t)(w->rows * w->cols / 32 * w->quant_bits) * 4;
    const size_t sb_bytes = (size_t)(w->rows * (w->cols / w->group)) * dtype_size(w->scale_type);
    const size_t super_bytes = w->super ? (size_t)(w->rows * (w->cols / w->super)) * 2 : 0;
    const bool shared_bytes = w->biases == w->scales; /* Q2_K: scales and mins in one byte */
    size_t at = 0;
    const size_t o_codes = take(&at, code_bytes), o_scales = take(&at, sb_bytes);
    const size_t o_biases = w->biases && !shared_bytes ? take(&at, sb_bytes) : o_scales;
    const size_t o_ss = take(&at, super_bytes), o_sb = take(&at, w->biases ? super_bytes : 0);
    char *mem = NULL;
    cudaError_t e = cudaMalloc((void **)&mem, at ? at : 1);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(mem + o_codes, w->data, code_bytes, cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(mem + o_scales, w->scales, sb_bytes, cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess && w->biases && !shared_bytes)
        e = cudaMemcpyAsync(mem + o_biases, w->biases, sb_bytes, cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess && super_bytes)
        e = cudaMemcpyAsync(mem + o_ss, w->super_scales, super_bytes, cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess && super_bytes && w->biases)
        e = cudaMemcpyAsync(mem + o_sb, w->super_biases, super_bytes, cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) {
        snprintf(err, err_size, "%s (%zu bytes)", cudaGetErrorString(e), at);
        cudaFree(mem);
        cudaGetLastError();
        return -1;
    }
    q.mem = mem, q.bytes = at;
    q.codes = (const uint32_t *)(mem + o_codes);
    q.scales = (const uint8_t *)(mem + o_scales);
    q.biases = w->biases ? (const uint8_t *)(mem + o_biases) : NULL;
    q.super_scales = super_bytes ? (const __half *)(mem + o_ss) : NULL;
    q.super_biases = super_bytes && w->biases ? (const __half *)(mem + o_sb) : NULL;
    *out = q;
    return 0;
}

extern "C" void cuda_qmat_free(cuda_qmat *w) {
    if (!w) return;
    cudaFree(w->mem);
    memset(w, 0, sizeof *w);
}

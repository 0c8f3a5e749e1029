/*
 * qmat.cu - quantized matrices in the host's own layout on the GPU (qmat.h): upload, the
 * decode product, embedding rows and the fp16 rows of the dense prefill product.
 *
 * A unit of work is a chunk: 32 columns of one row, `bits` whole words of codes and one
 * group (groups of 32 and more) or two (groups of 16). The decode product gives each warp
 * an output row, its lanes taking every 32nd chunk, so a warp's loads of codes are
 * contiguous (512 bytes a step at 4 bits) and so are its group scales.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/qmat.h"

#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define QMAT_WARPS 8 /* output rows a decode block takes, one a warp */

/* ==== Values as matview_row forms them ==== */

/* Element i of a group-scale array of type t (tensor.h's dtype_load_f32 on the device). */
__device__ __forceinline__ float scale_at(int t, const uint8_t *p, int64_t i) {
    switch (t) {
    case DTYPE_F32: return ((const float *)p)[i];
    case DTYPE_F16: return __half2float(((const __half *)p)[i]);
    case DTYPE_BF16: return __uint_as_float((uint32_t)((const uint16_t *)p)[i] << 16);
    case DTYPE_U8: return (float)p[i];
    case DTYPE_I8: return (float)(int8_t)p[i];
    case DTYPE_U4LO: return (float)(p[i] & 15);
    case DTYPE_U4HI: return (float)(p[i] >> 4);
    case DTYPE_E8M0: return p[i] == 255 ? __int_as_float(0x7fc00000) : ldexpf(1.0f, (int)p[i] - 127);
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
 * is in the code values), rounded as matview_row rounds them. */
__device__ __forceinline__ void group_sb(const cuda_qmat &w, int64_t r, int64_t g, float &s, float &b) {
    const int64_t i = r * (w.cols / w.group) + g;
    s = scale_at(w.scale_type, w.scales, i);
    b = 0.0f;
    if (w.super) {
        const int64_t k = r * (w.cols / w.super) + g * w.group / w.super;
        s = __fmul_rn(__half2float(w.super_scales[k]), s);
        if (w.biases) b = __fmul_rn(__half2float(w.super_biases[k]), scale_at(w.bias_type, w.biases, i));
    } else if (w.biases) {
        b = scale_at(w.bias_type, w.biases, i);
    }
}

/* The bits words of chunk c of row r (16-byte loads where the words allow them). */
template <int BITS> __device__ __forceinline__ void load_chunk(uint32_t (&q)[BITS], const cuda_qmat &w, int64_t r, int64_t c) {
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
__device__ __forceinline__ void chunk_values(float (&v)[32], const uint32_t (&q)[BITS], int zero, const float *lut) {
#pragma unroll
    for (int j = 0; j < 32; j++) v[j] = LUT ? lut[code_of<BITS>(q, j)] : (float)(code_of<BITS>(q, j) - zero);
}

/* The codebook's values as matview_row forms them (ldexpf(lut[q], -shift)), into shared. */
__device__ __forceinline__ void stage_lut(float *lut, const cuda_qmat &w) {
    if (threadIdx.x < 16) lut[threadIdx.x] = ldexpf((float)w.lut[threadIdx.x], -w.lut_shift);
    __syncthreads();
}

/* ==== Decode product ==== */

/* y[n, rows] = x[n, cols] @ W^T for n <= NR, one row of W a warp; G16: groups of 16 (two
 * a chunk), else one group covers the chunk. */
template <int BITS, bool LUT, bool G16, int NR>
__global__ static void __launch_bounds__(QMAT_WARPS * 32) k_gemv(float *y, const float *x, int n, const cuda_qmat w) {
    constexpr int HALVES = G16 ? 2 : 1, SPAN = 32 / HALVES;
    __shared__ float lut[16];
    if (LUT) stage_lut(lut, w);
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * QMAT_WARPS + (threadIdx.x >> 5);
    if (r >= w.rows) return;
    const int64_t chunks = w.cols / 32;
    float acc[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) acc[i] = 0.0f;
    for (int64_t c = lane; c < chunks; c += 32) {
        uint32_t q[BITS];
        load_chunk<BITS>(q, w, r, c);
        float v[32];
        chunk_values<BITS, LUT>(v, q, w.zero, lut);
#pragma unroll
        for (int h = 0; h < HALVES; h++) {
            float s, b;
            group_sb(w, r, G16 ? 2 * c + h : c * 32 / w.group, s, b);
#pragma unroll
            for (int i = 0; i < NR; i++) {
                if (i >= n) break;
                const float4 *xp = (const float4 *)(x + i * w.cols + c * 32 + h * SPAN);
                float dot = 0.0f, sx = 0.0f;
#pragma unroll
                for (int j4 = 0; j4 < SPAN / 4; j4++) {
                    const float4 xv = __ldg(xp + j4);
                    const int j = h * SPAN + 4 * j4;
                    dot = fmaf(v[j], xv.x, dot), dot = fmaf(v[j + 1], xv.y, dot);
                    dot = fmaf(v[j + 2], xv.z, dot), dot = fmaf(v[j + 3], xv.w, dot);
                    sx += (xv.x + xv.y) + (xv.z + xv.w);
                }
                acc[i] = fmaf(s, dot, fmaf(b, sx, acc[i]));
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

typedef void (*gemv_fn)(float *, const float *, int, const cuda_qmat);

template <int BITS, bool LUT, bool G16> static gemv_fn gemv_for(int64_t n) {
    return n <= 1   ? k_gemv<BITS, LUT, G16, 1>
           : n <= 2 ? k_gemv<BITS, LUT, G16, 2>
           : n <= 4 ? k_gemv<BITS, LUT, G16, 4>
           : n <= 8 ? k_gemv<BITS, LUT, G16, 8>
                    : k_gemv<BITS, LUT, G16, 16>;
}

template <bool G16> static gemv_fn gemv_bits(const cuda_qmat *w, int64_t n) {
    switch (w->bits) {
    case 2: return gemv_for<2, false, G16>(n);
    case 3: return gemv_for<3, false, G16>(n);
    case 4: return w->has_lut ? gemv_for<4, true, G16>(n) : gemv_for<4, false, G16>(n);
    case 5: return gemv_for<5, false, G16>(n);
    case 6: return gemv_for<6, false, G16>(n);
    default: return gemv_for<8, false, G16>(n);
    }
}

static gemv_fn pick_gemv(const cuda_qmat *w, int64_t n) {
    return w->group == 16 ? gemv_bits<true>(w, n) : gemv_bits<false>(w, n);
}

extern "C" cudaError_t cuda_qmat_gemv(float *y, const float *x, int64_t n, const cuda_qmat *w, cudaStream_t s) {
    if (n < 1 || n > CUDA_QMAT_MAX_N) return cudaErrorInvalidValue;
    const unsigned blocks = (unsigned)((w->rows + QMAT_WARPS - 1) / QMAT_WARPS);
    pick_gemv(w, n)<<<blocks, QMAT_WARPS * 32, 0, s>>>(y, x, (int)n, *w);
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
__global__ static void k_rows(T *out, const cuda_qmat w, const int32_t *ids, int64_t row0, int64_t m) {
    constexpr int HALVES = G16 ? 2 : 1, SPAN = 32 / HALVES;
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
            group_sb(w, r, G16 ? 2 * c + h : c * 32 / w.group, s, b);
#pragma unroll
            for (int j = h * SPAN; j < (h + 1) * SPAN; j++)
                v[j] = w.biases ? __fadd_rn(__fmul_rn(s, v[j]), b) : __fmul_rn(s, v[j]);
        }
        store_chunk(out + t * w.cols + c * 32, v);
    }
}

template <int BITS, bool LUT, typename T>
static void rows_g(T *out, const cuda_qmat *w, const int32_t *ids, int64_t row0, int64_t m, cudaStream_t s) {
    if (w->group == 16) k_rows<BITS, LUT, true, T><<<blocks_for(m), THREADS, 0, s>>>(out, *w, ids, row0, m);
    else k_rows<BITS, LUT, false, T><<<blocks_for(m), THREADS, 0, s>>>(out, *w, ids, row0, m);
}

template <typename T>
static cudaError_t launch_rows(T *out, const cuda_qmat *w, const int32_t *ids, int64_t row0, int64_t n, cudaStream_t s) {
    const int64_t m = n * (w->cols / 32);
    if (m <= 0) return cudaSuccess;
    switch (w->bits) {
    case 2: rows_g<2, false>(out, w, ids, row0, m, s); break;
    case 3: rows_g<3, false>(out, w, ids, row0, m, s); break;
    case 4: w->has_lut ? rows_g<4, true>(out, w, ids, row0, m, s) : rows_g<4, false>(out, w, ids, row0, m, s); break;
    case 5: rows_g<5, false>(out, w, ids, row0, m, s); break;
    case 6: rows_g<6, false>(out, w, ids, row0, m, s); break;
    default: rows_g<8, false>(out, w, ids, row0, m, s); break;
    }
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_qmat_rows(float *y, const cuda_qmat *w, const int32_t *ids, int64_t n, cudaStream_t s) {
    return launch_rows(y, w, ids, 0, n, s);
}

extern "C" cudaError_t cuda_qmat_dequant(__half *y, const cuda_qmat *w, int64_t row0, int64_t rows, cudaStream_t s) {
    if (row0 < 0 || rows < 0 || row0 + rows > w->rows) return cudaErrorInvalidValue;
    return launch_rows(y, w, (const int32_t *)nullptr, row0, rows, s);
}

/* ==== Upload ==== */

static bool scale_type_ok(dtype t) {
    return t == DTYPE_F32 || t == DTYPE_F16 || t == DTYPE_BF16 || t == DTYPE_U8 || t == DTYPE_I8 || t == DTYPE_U4LO ||
           t == DTYPE_E8M0 || t == DTYPE_F8E4M3;
}

extern "C" int cuda_qmat_supported(const matview *w, char *err, size_t err_size) {
    const int bits = w->quant_bits;
    const char *why = NULL;
    if (bits < 2 || bits > 8 || bits == 7) why = "codes of 2, 3, 4, 5, 6 or 8 bits";
    else if (w->cols % 32 || w->group <= 0 || w->cols % w->group || (w->group != 16 && w->group % 32))
        why = "columns a multiple of 32, groups of 16 or a multiple of 32";
    else if (!scale_type_ok(w->scale_type)) why = "scales of F32, F16, BF16, U8, I8, U4, E8M0 or F8E4M3";
    else if (w->super && (w->super % w->group || w->cols % w->super)) why = "super-blocks of whole groups";
    else if (w->lut && bits != 4) why = "a codebook of 4-bit codes";
    if (!why) return 1;
    snprintf(err, err_size, "%d-bit weights with group %lld and %s scales are not supported (%s)", bits,
             (long long)w->group, dtype_name(w->scale_type), why);
    return 0;
}

/* Offsets into the one allocation, each 16-byte aligned. */
static size_t take(size_t *at, size_t bytes) {
    const size_t o = *at;
    *at += (bytes + 15) & ~(size_t)15;
    return o;
}

extern "C" int cuda_qmat_upload(cuda_qmat *out, const matview *w, cudaStream_t s, char *err, size_t err_size) {
    memset(out, 0, sizeof *out);
    if (!cuda_qmat_supported(w, err, err_size)) return -1;
    cuda_qmat q = {};
    q.rows = w->rows, q.cols = w->cols, q.bits = w->quant_bits, q.group = w->group, q.super = w->super;
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
    if (e == cudaSuccess) e = cudaMemcpyAsync(mem + o_codes, w->data, code_bytes, cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess) e = cudaMemcpyAsync(mem + o_scales, w->scales, sb_bytes, cudaMemcpyHostToDevice, s);
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

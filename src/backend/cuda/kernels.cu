/*
 * kernels.cu - the CUDA backend's elementwise and data-movement kernels: embedding rows
 * (affine tables through affine.cu), RMSNorm/LayerNorm (one block per row), RoPE (a thread
 * per pair), K/V stores, SwiGLU and the GELU family, adds, scales, row gathers and the
 * patch layout of a vision tower. Each computes what the scalar
 * reference in src/backend/ref computes, in fp32; none allocates.
 */
#include "backend/cuda/cuda_internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

CUDA_TRACE_UNIT(kernels)

/* A norm's row belongs to one block, whose threads hold its first NORM_ROW values in
 * registers: 1024 threads one value at a time, or 256 with float4 loads where rows are
 * 16-byte aligned (decode's single rows too: fewer warps to reduce over; tg128 +4% on the
 * 8B shape). */
#define NORM_THREADS 1024
#define NORM_ROW 8192

template <int V> struct vec_of;
template <> struct vec_of<1> { typedef float type; };
template <> struct vec_of<4> { typedef float4 type; };

/* Blocks for kernels that take rows one block at a time (striding past 65535). */
static unsigned grid_rows(int64_t n) { return (unsigned)(n < 65535 ? n : 65535); }

/* ==== Embedding rows ==== */

__device__ static float load_any(const void *x, int t, int64_t i) {
    switch (t) {
    case DTYPE_F16: return __half2float(((const __half *)x)[i]);
    case DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)x)[i]);
    default: return ((const float *)x)[i];
    }
}

/* Rows of a dense table; affine tables are read by affine.cu's cuda_affine_rows. */
__global__ static void k_embed(float *y, const void *table, int t, int64_t cols, const int32_t *ids, int64_t m) {
    trace_scope tr(TR_EMBED);
    GRID_STRIDE(i, m) {
        const int64_t r = i / cols, c = i % cols;
        const int32_t id = ids[r];
        if (id < 0) continue; /* an embedding row: left as it is */
        y[i] = load_any(table, t, (int64_t)id * cols + c);
    }
}

/* The looked-up rows (ids >= 0) of y[n, cols] times a. */
__global__ static void k_scale_rows(float *y, const int32_t *ids, int64_t cols, float a, int64_t m) {
    GRID_STRIDE(i, m) if (ids[i / cols] >= 0) y[i] *= a;
}

void cuda_embed(cudaStream_t s, float *y, const cuda_mat *w, const int32_t *ids, int64_t n, float scale) {
    const int64_t m = n * w->cols;
    if (cuda_mat_general(w)) CUDA_CHECK(cuda_qmat_rows(y, &w->q, ids, n, s));
    else if (w->bits) CUDA_CHECK(cuda_affine_rows(y, &w->aff, ids, n, s));
    else k_embed<<<blocks_for(m), THREADS, 0, s>>>(y, w->dense, w->type, w->cols, ids, m);
    /* a second pass, only where a family scales its embedding (Gemma) */
    if (scale != 1.0f) k_scale_rows<<<blocks_for(m), THREADS, 0, s>>>(y, ids, w->cols, scale, m);
}

/* ==== Norms: one block per row ==== */

/* The sum of v over the block (every thread gets it). */
__device__ static float block_sum(float v) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads(); /* part may still be read by an earlier call */
    if (lane == 0) part[warp] = v;
    __syncthreads();
    float t = lane < nw ? part[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
}

/* Rows of a norm, one block at a time; each thread keeps its first values of x and w (NT
 * threads, NORM_ROW of a row in registers, V at a time: float4 where rows allow) with
 * every load in flight at once, so a row costs one round trip to memory before the
 * reduction. With r, x gets r added first (and keeps the sum). */
template <int NT, int V>
__global__ static void __launch_bounds__(NT) k_rmsnorm(float *y, float *x, const float *__restrict__ r,
                                                       const float *__restrict__ w, int64_t n, int64_t d, float eps) {
    constexpr int NV = NORM_ROW / NT / V; /* vectors a thread holds */
    typedef typename vec_of<V>::type vec;
    PDL_ENTRY(TR_RMSNORM);
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        float *xr = x + row * d, *yr = y + row * d;
        const float *rr = r ? r + row * d : NULL;
        float v[NV][V], wv[NV][V], ss = 0.0f;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t i = (threadIdx.x + (int64_t)k * NT) * V;
            vec a = {}, b = {}, c = {};
            if (i < d) {
                a = *(const vec *)(xr + i), b = *(const vec *)(w + i);
                if (rr) c = *(const vec *)(rr + i);
            }
            memcpy(v[k], &a, sizeof a), memcpy(wv[k], &b, sizeof b);
            if (rr) {
                float cv[V];
                memcpy(cv, &c, sizeof c);
#pragma unroll
                for (int e = 0; e < V; e++) v[k][e] += cv[e];
                memcpy(&a, v[k], sizeof a);
                if (i < d) *(vec *)(xr + i) = a;
            }
#pragma unroll
            for (int e = 0; e < V; e++) ss += v[k][e] * v[k][e];
        }
        for (int64_t i = NORM_ROW + threadIdx.x; i < d; i += NT) {
            if (rr) xr[i] += rr[i];
            ss += xr[i] * xr[i];
        }
        const float inv = 1.0f / sqrtf(block_sum(ss) / (float)d + eps);
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t i = (threadIdx.x + (int64_t)k * NT) * V;
            float o[V];
#pragma unroll
            for (int e = 0; e < V; e++) o[e] = wv[k][e] * (v[k][e] * inv);
            vec a;
            memcpy(&a, o, sizeof a);
            if (i < d) *(vec *)(yr + i) = a;
        }
        for (int64_t i = NORM_ROW + threadIdx.x; i < d; i += NT) yr[i] = w[i] * (xr[i] * inv);
    }
}

/* Rows take blocks of 256 threads with float4 loads where every row and weight is 16-byte
 * aligned, others the wide blocks. */
static void rmsnorm_launch(cudaStream_t s, float *y, float *x, const float *r, const float *w, int64_t n, int64_t d,
                           float eps) {
    if (n <= 0) return;
    const bool v4 = d % 4 == 0 && ((uintptr_t)y | (uintptr_t)x | (uintptr_t)r | (uintptr_t)w) % 16 == 0;
    if (v4) launch_pdl(k_rmsnorm<NORM_THREADS / 4, 4>, grid_rows(n), NORM_THREADS / 4, 0, s, y, x, r, w, n, d, eps);
    else launch_pdl(k_rmsnorm<NORM_THREADS, 1>, grid_rows(n), NORM_THREADS, 0, s, y, x, r, w, n, d, eps);
}

void cuda_rmsnorm(cudaStream_t s, float *y, const float *x, const float *w, int64_t n, int64_t d, float eps) {
    rmsnorm_launch(s, y, (float *)x, NULL, w, n, d, eps);
}

void cuda_add_rmsnorm(cudaStream_t s, float *y, float *x, const float *r, const float *w, int64_t n, int64_t d,
                      float eps) {
    rmsnorm_launch(s, y, x, r, w, n, d, eps);
}

__global__ static void __launch_bounds__(NORM_THREADS) k_layernorm(float *y, const float *x, const float *w, const float *b,
                                                                   int64_t n, int64_t d, float eps) {
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const float *xr = x + row * d;
        float *yr = y + row * d;
        float sum = 0.0f;
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x) sum += xr[i];
        const float mean = block_sum(sum) / (float)d;
        float ss = 0.0f;
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ss += (xr[i] - mean) * (xr[i] - mean);
        const float inv = 1.0f / sqrtf(block_sum(ss) / (float)d + eps);
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x) yr[i] = (xr[i] - mean) * inv * w[i] + (b ? b[i] : 0.0f);
    }
}

void cuda_layernorm(cudaStream_t s, float *y, const float *x, const float *w, const float *b, int64_t n,
                    int64_t d, float eps) {
    if (n > 0) k_layernorm<<<grid_rows(n), NORM_THREADS, 0, s>>>(y, x, w, b, n, d, eps);
}

/* ==== RoPE and the KV cache ==== */

/* The cosine and sine (times mscale) of the angle pos * inv_freq[i], formed in fp32 with
 * its cosine and sine in double, as the reference does. */
__device__ static void rope_cs(int32_t pos, int64_t i, const float *inv_freq, float mscale, float *c, float *sn) {
    const float ang = (float)pos * inv_freq[i];
    double sd, cd;
    sincos((double)ang, &sd, &cd);
    *c = (float)cd * mscale, *sn = (float)sd * mscale;
}

/* Pair (a, b) of the head vector v turned by (c, sn); the turned pair is also returned in
 * y0, y1. */
__device__ static void rope_turn(float *v, int64_t a, int64_t b, float c, float sn, float *y0, float *y1) {
    const float x0 = v[a], x1 = v[b];
    *y0 = x0 * c - x1 * sn;
    *y1 = x1 * c + x0 * sn;
    v[a] = *y0;
    v[b] = *y1;
}

/* Pair i of the head vector v (hd = 2 half) turned by the angle pos * inv_freq[i]. */
__device__ static void rope_pair(float *v, int32_t pos, int64_t i, int64_t half, const float *inv_freq, float mscale,
                                 bool traditional, float *y0, float *y1) {
    const int64_t a = traditional ? 2 * i : i, b = traditional ? 2 * i + 1 : i + half;
    float c, sn;
    rope_cs(pos, i, inv_freq, mscale, &c, &sn);
    rope_turn(v, a, b, c, sn, y0, y1);
}

/* x[n, h, hd] turned, one thread per pair of the first dims values of each head: each
 * forms its own angle, so a row needs no shared table and one round trip to memory. */
__global__ static void k_rope(float *x, const int32_t *pos, int64_t h, int64_t hd, int64_t dims, const float *inv_freq,
                              float mscale, bool traditional, int64_t m) {
    PDL_ENTRY(TR_ROPE);
    const int64_t half = dims / 2;
    GRID_STRIDE(j, m) { /* j = (t * h + head) * half + i */
        const int64_t i = j % half, th = j / half;
        float y0, y1;
        rope_pair(x + th * hd, pos[th / h], i, half, inv_freq, mscale, traditional, &y0, &y1);
    }
}

void cuda_rope(cudaStream_t s, float *x, const int32_t *pos, int64_t n, int64_t h, int64_t hd, int64_t dims,
               const float *inv_freq, float mscale, bool traditional) {
    const int64_t m = n * h * (dims / 2);
    if (m > 0)
        launch_pdl(k_rope, blocks_for(m), THREADS, 0, s, x, pos, h, hd, dims, inv_freq, mscale, traditional, m);
}

template <typename T> __device__ static T kv_value(float v);
template <> __device__ __half kv_value<__half>(float v) { return __float2half_rn(v); }
template <> __device__ float kv_value<float>(float v) { return v; }

/* Rows of h + 2 hk heads (q, k, v): q's pairs turned; k's pairs turned and stored at slot[t]
 * of the key pool; v's pairs stored. Block (t, y) is token t, its thread (i, g) pair i of
 * heads y hpt G + g + G r for r < hpt (G = blockDim.x / half): the angle, a double
 * sine and cosine, is formed once for hpt heads. */
template <typename T>
__global__ static void k_rope_store(float *__restrict__ q, float *__restrict__ k, const float *__restrict__ v,
                                    T *__restrict__ kpool, T *__restrict__ vpool, const int32_t *__restrict__ pos,
                                    const int32_t *__restrict__ slot, int h, int hk, int hd, int hpt,
                                    const float *__restrict__ inv_freq, float mscale, bool traditional) {
    PDL_ENTRY(TR_ROPE_STORE);
    const int half = hd / 2, G = blockDim.x / half, i = threadIdx.x % half, kvd = hk * hd;
    const int64_t t = blockIdx.x;
    const int a = traditional ? 2 * i : i, b = traditional ? 2 * i + 1 : i + half;
    float c, sn;
    rope_cs(pos[t], i, inv_freq, mscale, &c, &sn);
    T *kdst = kpool + (int64_t)slot[t] * kvd, *vdst = vpool + (int64_t)slot[t] * kvd;
    for (int r = 0; r < hpt; r++) {
        const int head = (int)blockIdx.y * hpt * G + (int)threadIdx.x / half + G * r;
        if (head >= h + 2 * hk) break;
        if (head >= h + hk) { /* a pair of v */
            const int o = (head - h - hk) * hd;
            vdst[o + a] = kv_value<T>(v[t * kvd + o + a]);
            vdst[o + b] = kv_value<T>(v[t * kvd + o + b]);
            continue;
        }
        float y0, y1;
        rope_turn(head < h ? q + (t * h + head) * hd : k + t * kvd + (head - h) * hd, a, b, c, sn, &y0, &y1);
        if (head >= h) {
            kdst[(head - h) * hd + a] = kv_value<T>(y0);
            kdst[(head - h) * hd + b] = kv_value<T>(y1);
        }
    }
}

/* Heads a thread of k_rope_store turns: several for many rows (one angle for all), one for
 * few (decode, where a step waits on the kernel's latency). */
#define ROPE_HEADS_PER_THREAD 8
#define ROPE_SHARED_FROM_ROWS 64

void cuda_rope_store(cudaStream_t s, float *q, float *k, const float *v, void *kpool, void *vpool, const int32_t *pos,
                     const int32_t *slot, int64_t n, int64_t h, int64_t hk, int64_t hd, const float *inv_freq,
                     float mscale, bool traditional, bool f16) {
    const int64_t half = hd / 2, heads = h + 2 * hk;
    if (n <= 0 || half <= 0) return;
    const int64_t g = half < THREADS ? THREADS / half : 1; /* heads a block takes at once */
    const int hpt = n >= ROPE_SHARED_FROM_ROWS ? ROPE_HEADS_PER_THREAD : 1;
    const dim3 grid((unsigned)n, (unsigned)((heads + g * hpt - 1) / (g * hpt)));
    CELER_ASSERT(half * g <= 1024);
    if (f16)
        launch_pdl(k_rope_store<__half>, grid, dim3((unsigned)(half * g)), 0, s, q, k, v, (__half *)kpool,
                   (__half *)vpool, pos, slot, (int)h, (int)hk, (int)hd, hpt, inv_freq, mscale, traditional);
    else
        launch_pdl(k_rope_store<float>, grid, dim3((unsigned)(half * g)), 0, s, q, k, v, (float *)kpool,
                   (float *)vpool, pos, slot, (int)h, (int)hk, (int)hd, hpt, inv_freq, mscale, traditional);
}

__global__ static void k_kv_store(void *kpool, void *vpool, const float *k, const float *v, const int32_t *slot,
                                  int64_t kvd, bool f16, int64_t m) {
    PDL_ENTRY(TR_KV_STORE);
    GRID_STRIDE(i, m) {
        const int64_t at = (int64_t)slot[i / kvd] * kvd + i % kvd;
        if (f16) {
            ((__half *)kpool)[at] = __float2half_rn(k[i]);
            ((__half *)vpool)[at] = __float2half_rn(v[i]);
        } else {
            ((float *)kpool)[at] = k[i];
            ((float *)vpool)[at] = v[i];
        }
    }
}

void cuda_kv_store(cudaStream_t s, void *kpool, void *vpool, const float *k, const float *v, const int32_t *slot,
                   int64_t n, int64_t kvd, bool f16) {
    const int64_t m = n * kvd;
    launch_pdl(k_kv_store, blocks_for(m), THREADS, 0, s, kpool, vpool, k, v, slot, kvd, f16, m);
}

/* ==== Elementwise ==== */

/* The activations of backend_act in the reference's formulas. */
__device__ __forceinline__ static float act_of(float v, backend_act kind) {
    switch (kind) {
    case BACKEND_ACT_SILU: return v / (1.0f + expf(-v));
    case BACKEND_ACT_GELU_ERF: return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    case BACKEND_ACT_GELU_TANH: return 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    case BACKEND_ACT_QUICK_GELU: return v / (1.0f + expf(-1.702f * v));
    }
    return v;
}

/* The activation is a template argument, so SwiGLU's kernel is the fused products' bits
 * (swiglu_of) with no branch. */
template <backend_act ACT> __global__ static void k_glu(float *y, const float *gate, const float *up, int64_t m) {
    PDL_ENTRY(TR_SWIGLU);
    GRID_STRIDE(i, m) y[i] = ACT == BACKEND_ACT_SILU ? swiglu_of(gate[i], up[i]) : act_of(gate[i], ACT) * up[i];
}

void cuda_glu(cudaStream_t s, float *y, const float *gate, const float *up, int64_t m, backend_act act) {
    switch (act) {
    case BACKEND_ACT_SILU: launch_pdl(k_glu<BACKEND_ACT_SILU>, blocks_for(m), THREADS, 0, s, y, gate, up, m); break;
    case BACKEND_ACT_GELU_ERF:
        launch_pdl(k_glu<BACKEND_ACT_GELU_ERF>, blocks_for(m), THREADS, 0, s, y, gate, up, m);
        break;
    case BACKEND_ACT_GELU_TANH:
        launch_pdl(k_glu<BACKEND_ACT_GELU_TANH>, blocks_for(m), THREADS, 0, s, y, gate, up, m);
        break;
    case BACKEND_ACT_QUICK_GELU:
        launch_pdl(k_glu<BACKEND_ACT_QUICK_GELU>, blocks_for(m), THREADS, 0, s, y, gate, up, m);
        break;
    }
}

__global__ static void k_act(float *y, const float *x, int64_t m, backend_act kind) {
    GRID_STRIDE(i, m) y[i] = act_of(x[i], kind);
}

void cuda_act(cudaStream_t s, float *y, const float *x, int64_t m, backend_act kind) {
    k_act<<<blocks_for(m), THREADS, 0, s>>>(y, x, m, kind);
}

__global__ static void k_softcap(float *y, float cap, int64_t m) {
    GRID_STRIDE(i, m) y[i] = cap * tanhf(y[i] / cap);
}

void cuda_softcap(cudaStream_t s, float *y, float cap, int64_t m) {
    k_softcap<<<blocks_for(m), THREADS, 0, s>>>(y, cap, m);
}

__global__ static void k_add(float *y, const float *x, int64_t m) {
    PDL_ENTRY(TR_ADD);
    GRID_STRIDE(i, m) y[i] += x[i];
}

void cuda_add(cudaStream_t s, float *y, const float *x, int64_t m) {
    launch_pdl(k_add, blocks_for(m), THREADS, 0, s, y, x, m);
}

__global__ static void k_add_bias(float *y, const float *bias, int64_t d, int64_t m) {
    PDL_ENTRY(TR_ADD_BIAS);
    GRID_STRIDE(i, m) y[i] += bias[i % d];
}

void cuda_add_bias(cudaStream_t s, float *y, const float *bias, int64_t n, int64_t d) {
    launch_pdl(k_add_bias, blocks_for(n * d), THREADS, 0, s, y, bias, d, n * d);
}

__global__ static void k_scale(float *y, float a, int64_t m) {
    GRID_STRIDE(i, m) y[i] *= a;
}

void cuda_scale(cudaStream_t s, float *y, float a, int64_t m) {
    k_scale<<<blocks_for(m), THREADS, 0, s>>>(y, a, m);
}

/* ==== Data movement ==== */

__global__ static void k_gather_rows(float *y, const float *x, const int32_t *idx, const float *fill, int64_t d,
                                     int64_t m) {
    GRID_STRIDE(i, m) {
        const int32_t r = idx[i / d];
        y[i] = r >= 0 ? x[(int64_t)r * d + i % d] : fill[i % d];
    }
}

void cuda_gather_rows(cudaStream_t s, float *y, const float *x, const int32_t *idx, const float *fill, int64_t n,
                      int64_t d) {
    k_gather_rows<<<blocks_for(n * d), THREADS, 0, s>>>(y, x, idx, fill, d, n * d);
}

/* y[n * (g*g + lead), 3 p p]: each image's patches (g = sz / p per side), after a zero
 * row when lead is set; a patch flattened (channel, row, column), or (row, column,
 * channel) when channels_last. */
__global__ static void k_patches(float *y, const float *x, int64_t sz, int64_t p, bool channels_last, int64_t lead,
                                 int64_t m) {
    const int64_t g = sz / p, cols = 3 * p * p, per = g * g + lead;
    GRID_STRIDE(i, m) {
        const int64_t row = i / cols, e = i % cols, t = row / per, k = row % per - lead;
        if (k < 0) {
            y[i] = 0.0f;
            continue;
        }
        int64_t c, ky, kx;
        if (channels_last) c = e % 3, kx = (e / 3) % p, ky = e / (3 * p);
        else c = e / (p * p), ky = (e / p) % p, kx = e % p;
        const int64_t py = k / g, px = k % g;
        y[i] = x[((t * 3 + c) * sz + py * p + ky) * sz + px * p + kx];
    }
}

void cuda_patches(cudaStream_t s, float *y, const float *x, int64_t n, int64_t sz, int64_t p, bool channels_last,
                  bool lead) {
    const int64_t g = sz / p, m = n * (g * g + (lead ? 1 : 0)) * 3 * p * p;
    k_patches<<<blocks_for(m), THREADS, 0, s>>>(y, x, sz, p, channels_last, lead ? 1 : 0, m);
}

/* y[n * g * g, d] (g = sz / k): the means of the k x k windows of x[n, sz, sz, d], each
 * window summed row by row, then divided by k * k (torch's AvgPool2d). */
__global__ static void k_avg_pool(float *y, const float *x, int64_t sz, int64_t k, int64_t d, int64_t m) {
    const int64_t g = sz / k;
    const float area = (float)(k * k);
    GRID_STRIDE(i, m) {
        const int64_t c = i % d, o = i / d, t = o / (g * g), oy = (o / g) % g, ox = o % g;
        float sum = 0.0f;
        for (int64_t ky = 0; ky < k; ky++)
            for (int64_t kx = 0; kx < k; kx++) sum += x[((t * sz + oy * k + ky) * sz + ox * k + kx) * d + c];
        y[i] = sum / area;
    }
}

void cuda_avg_pool(cudaStream_t s, float *y, const float *x, int64_t n, int64_t sz, int64_t k, int64_t d) {
    const int64_t g = sz / k, m = n * g * g * d;
    k_avg_pool<<<blocks_for(m), THREADS, 0, s>>>(y, x, sz, k, d, m);
}

/* ==== The argmax of rows (greedy decoding) ==== */

/* Whether (av, ai) beats (bv, bi): a larger value, or an equal one at a smaller index; an
 * index below 0 is no value (every one seen was NaN). */
__device__ static bool argmax_beats(float av, int ai, float bv, int bi) {
    if (ai < 0) return false;
    if (bi < 0) return true;
    return av > bv || (av == bv && ai < bi);
}

/* The warp's best (value, index) by argmax_beats, in every lane. */
__device__ static void warp_argmax(float &bv, int &bi) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (argmax_beats(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
}

/* ids[row] = the first index of the largest non-NaN value of x[row, v] (v - 1 when every
 * value is NaN), one block a row: each thread the first largest of its stride, then the
 * block's candidates merged by argmax_beats. */
__global__ static void __launch_bounds__(NORM_THREADS) k_argmax_rows(int32_t *ids, const float *__restrict__ x,
                                                                     int64_t n, int v) {
    __shared__ float wv[32];
    __shared__ int wi[32];
    trace_scope tr(TR_ARGMAX);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const float *xr = x + row * v;
        float bv = -INFINITY;
        int bi = -1;
        for (int i = threadIdx.x; i < v; i += blockDim.x) {
            const float xv = xr[i];
            if (xv > bv || (bi < 0 && xv == xv)) bv = xv, bi = i;
        }
        warp_argmax(bv, bi);
        if (lane == 0) wv[warp] = bv, wi[warp] = bi;
        __syncthreads();
        if (warp == 0) {
            const int nw = (int)(blockDim.x >> 5);
            bv = lane < nw ? wv[lane] : -INFINITY;
            bi = lane < nw ? wi[lane] : -1;
            warp_argmax(bv, bi);
            if (lane == 0) ids[row] = bi < 0 ? v - 1 : bi;
        }
        __syncthreads(); /* wv, wi are written again */
    }
}

void cuda_argmax_rows(cudaStream_t s, int32_t *ids, const float *x, int64_t n, int64_t v) {
    if (n > 0) k_argmax_rows<<<grid_rows(n), NORM_THREADS, 0, s>>>(ids, x, n, (int)v);
}

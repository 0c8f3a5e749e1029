/*
 * kernels.cu - the CUDA backend's elementwise and data-movement kernels: embedding rows
 * (affine tables through affine.cu), RMSNorm/LayerNorm (one block per row),
 * RoPE, K/V stores, SwiGLU and the GELU family, adds, scales, row
 * gathers and the patch layout of a vision tower. Each computes what the scalar
 * reference in src/kernels/ref computes, in fp32; none allocates.
 */
#include "backend/cuda/cuda_internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

/* A norm's row belongs to one block: decode has one row, so the block is wide and each
 * thread's chain of dependent loads and adds short. */
#define NORM_THREADS 1024


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
    GRID_STRIDE(i, m) {
        const int64_t r = i / cols, c = i % cols;
        const int32_t id = ids[r];
        if (id < 0) continue; /* an embedding row: left as it is */
        y[i] = load_any(table, t, (int64_t)id * cols + c);
    }
}

void cuda_embed(cudaStream_t s, float *y, const cuda_mat *w, const int32_t *ids, int64_t n) {
    if (w->bits) {
        CUDA_CHECK(cuda_affine_rows(y, &w->aff, ids, n, s));
        return;
    }
    const int64_t m = n * w->cols;
    k_embed<<<blocks_for(m), THREADS, 0, s>>>(y, w->dense, w->type, w->cols, ids, m);
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

__global__ static void __launch_bounds__(NORM_THREADS) k_rmsnorm(float *y, const float *x, const float *w, int64_t d, float eps) {
    const float *xr = x + blockIdx.x * d;
    float *yr = y + blockIdx.x * d;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = 1.0f / sqrtf(block_sum(ss) / (float)d + eps);
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) yr[i] = w[i] * (xr[i] * inv);
}

void cuda_rmsnorm(cudaStream_t s, float *y, const float *x, const float *w, int64_t n, int64_t d, float eps) {
    k_rmsnorm<<<(unsigned)n, NORM_THREADS, 0, s>>>(y, x, w, d, eps);
}

__global__ static void __launch_bounds__(NORM_THREADS) k_layernorm(float *y, const float *x, const float *w, const float *b, int64_t d, float eps) {
    const float *xr = x + blockIdx.x * d;
    float *yr = y + blockIdx.x * d;
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) sum += xr[i];
    const float mean = block_sum(sum) / (float)d;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ss += (xr[i] - mean) * (xr[i] - mean);
    const float inv = 1.0f / sqrtf(block_sum(ss) / (float)d + eps);
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) yr[i] = (xr[i] - mean) * inv * w[i] + (b ? b[i] : 0.0f);
}

void cuda_layernorm(cudaStream_t s, float *y, const float *x, const float *w, const float *b, int64_t n,
                    int64_t d, float eps) {
    k_layernorm<<<(unsigned)n, NORM_THREADS, 0, s>>>(y, x, w, b, d, eps);
}

/* ==== RoPE and the KV cache ==== */

/* x[n, h, hd]: pair i of every head of row t turned by the angle pos[t] * inv_freq[i],
 * formed in fp32 with its cosine and sine in double, as the reference does; one thread
 * per (row, pair) turns that pair in every head. */
__global__ static void k_rope(float *x, const int32_t *pos, int64_t h, int64_t hd, const float *inv_freq,
                              float mscale, bool traditional, int64_t m) {
    const int64_t half = hd / 2;
    GRID_STRIDE(j, m) { /* j = t * half + i */
        const int64_t i = j % half, t = j / half;
        const float ang = (float)pos[t] * inv_freq[i];
        double sd, cd;
        sincos((double)ang, &sd, &cd);
        const float c = (float)cd * mscale, sn = (float)sd * mscale;
        const int64_t a = traditional ? 2 * i : i, b = traditional ? 2 * i + 1 : i + half;
        for (int64_t head = 0; head < h; head++) {
            float *v = x + (t * h + head) * hd;
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * sn;
            v[b] = x1 * c + x0 * sn;
        }
    }
}

void cuda_rope(cudaStream_t s, float *x, const int32_t *pos, int64_t n, int64_t h, int64_t hd, const float *inv_freq,
               float mscale, bool traditional) {
    const int64_t m = n * (hd / 2);
    k_rope<<<blocks_for(m), THREADS, 0, s>>>(x, pos, h, hd, inv_freq, mscale, traditional, m);
}

__global__ static void k_kv_store(void *kpool, void *vpool, const float *k, const float *v, const int32_t *slot,
                                  int64_t kvd, bool f16, int64_t m) {
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
    k_kv_store<<<blocks_for(m), THREADS, 0, s>>>(kpool, vpool, k, v, slot, kvd, f16, m);
}

/* ==== Elementwise ==== */

__global__ static void k_swiglu(float *y, const float *gate, const float *up, int64_t m) {
    GRID_STRIDE(i, m) {
        const float g = gate[i];
        y[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void cuda_swiglu(cudaStream_t s, float *y, const float *gate, const float *up, int64_t m) {
    k_swiglu<<<blocks_for(m), THREADS, 0, s>>>(y, gate, up, m);
}

__global__ static void k_act(float *y, const float *x, int64_t m, backend_act kind) {
    GRID_STRIDE(i, m) {
        const float v = x[i];
        switch (kind) {
        case BACKEND_ACT_GELU_ERF: y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); break;
        case BACKEND_ACT_GELU_TANH:
            y[i] = 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
            break;
        case BACKEND_ACT_QUICK_GELU: y[i] = v / (1.0f + expf(-1.702f * v)); break;
        }
    }
}

void cuda_act(cudaStream_t s, float *y, const float *x, int64_t m, backend_act kind) {
    k_act<<<blocks_for(m), THREADS, 0, s>>>(y, x, m, kind);
}

__global__ static void k_add(float *y, const float *x, int64_t m) {
    GRID_STRIDE(i, m) y[i] += x[i];
}

void cuda_add(cudaStream_t s, float *y, const float *x, int64_t m) {
    k_add<<<blocks_for(m), THREADS, 0, s>>>(y, x, m);
}

__global__ static void k_add_bias(float *y, const float *bias, int64_t d, int64_t m) {
    GRID_STRIDE(i, m) y[i] += bias[i % d];
}

void cuda_add_bias(cudaStream_t s, float *y, const float *bias, int64_t n, int64_t d) {
    k_add_bias<<<blocks_for(n * d), THREADS, 0, s>>>(y, bias, d, n * d);
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

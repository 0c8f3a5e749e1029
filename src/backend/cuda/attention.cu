/*
 * attention.cu - attention on the GPU: causal attention of rows over the paged KV cache
 * (grouped-query, sliding windows, fp16 or fp32 pools) and full attention within
 * segments of rows (a vision encoder's tiles).
 *
 * One block of ATT_WARPS warps per (query head, row). Each warp takes every ATT_WARPS-th
 * key, holds the query and its running output spread over its lanes (hd up to
 * 32 * ATT_MAX_PER_LANE), and keeps an online softmax (running max and sum), so no score
 * row is stored; the warps' partial results are merged at the end. GQA reads a KV head
 * for each of its query heads without copies. This is the correct, simple form; it reads
 * each key once per query row.
 */
#include "backend/cuda/cuda_internal.h"

#include <cuda_fp16.h>
#include <math.h>

#define ATT_WARPS 4
#define ATT_MAX_PER_LANE 8 /* head dims up to 256 */

/* Where key j of a row's span lives. */
struct paged_keys {
    const int32_t *table; /* the sequence's block table */
    int64_t block_size;
    __device__ int64_t row(int64_t j) const { return (int64_t)table[j / block_size] * block_size + j % block_size; }
};

struct plain_keys {
    int64_t first; /* row of the segment's first key */
    __device__ int64_t row(int64_t j) const { return first + j; }
};

__device__ static float kv_load(const void *p, bool f16, int64_t i) {
    return f16 ? __half2float(((const __half *)p)[i]) : ((const float *)p)[i];
}

/* out[hd] = softmax(q . K[lo..hi] * scale) V[lo..hi] for one query vector; keys and values
 * at row keys.row(j) of pools [*, kvd], head offset koff. */
template <typename Keys>
__device__ static void attend(float *out, const float *q, const void *kpool, const void *vpool, bool f16,
                              Keys keys, int64_t lo, int64_t hi, int64_t kvd, int64_t koff, int hd, float scale) {
    __shared__ float part_m[ATT_WARPS], part_l[ATT_WARPS];
    __shared__ float part_o[ATT_WARPS][32 * ATT_MAX_PER_LANE];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float qv[ATT_MAX_PER_LANE], acc[ATT_MAX_PER_LANE];
    for (int i = 0; i < ATT_MAX_PER_LANE; i++) {
        const int c = lane + 32 * i;
        qv[i] = c < hd ? q[c] * scale : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = lo + warp; j <= hi; j += ATT_WARPS) {
        const int64_t base = keys.row(j) * kvd + koff;
        float dot = 0.0f;
        for (int i = 0; i < ATT_MAX_PER_LANE; i++) {
            const int c = lane + 32 * i;
            if (c < hd) dot += qv[i] * kv_load(kpool, f16, base + c);
        }
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        const float mn = fmaxf(m, dot), corr = expf(m - mn), p = expf(dot - mn);
        l = l * corr + p;
        for (int i = 0; i < ATT_MAX_PER_LANE; i++) {
            const int c = lane + 32 * i;
            acc[i] = acc[i] * corr + (c < hd ? p * kv_load(vpool, f16, base + c) : 0.0f);
        }
        m = mn;
    }
    if (lane == 0) part_m[warp] = m, part_l[warp] = l;
    for (int i = 0; i < ATT_MAX_PER_LANE; i++) part_o[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    float mx = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) mx = fmaxf(mx, part_m[w]);
    float sum = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++) sum += part_m[w] == -INFINITY ? 0.0f : part_l[w] * expf(part_m[w] - mx);
    for (int c = threadIdx.x; c < hd; c += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (part_m[w] != -INFINITY) o += part_o[w][c] * expf(part_m[w] - mx);
        out[c] = o / sum;
    }
}

/* grid (h, n): query head blockIdx.x of row blockIdx.y over its sequence's cache. */
__global__ static void k_attention(float *out, const float *q, const void *kpool, const void *vpool, bool f16,
                                   attn_rows ar) {
    const int64_t r = blockIdx.y, head = blockIdx.x, group = ar.h / ar.hk, kvd = ar.hk * ar.hd;
    const int64_t p = ar.pos[r];
    const int64_t lo = ar.window > 0 && p - ar.window + 1 > 0 ? p - ar.window + 1 : 0;
    const paged_keys keys = {ar.tables + (int64_t)ar.seq[r] * ar.table_cols, ar.block_size};
    const int64_t qd = ar.h * ar.hd;
    attend(out + r * qd + head * ar.hd, q + r * qd + head * ar.hd, kpool, vpool, f16, keys, lo, p, kvd,
           (head / group) * ar.hd, (int)ar.hd, ar.scale);
}

void cuda_attention(cudaStream_t s, float *out, const float *q, const void *kpool, const void *vpool,
                    const attn_rows *ar, bool f16) {
    CELER_ASSERT(ar->hd <= 32 * ATT_MAX_PER_LANE && ar->hk > 0 && ar->h % ar->hk == 0);
    k_attention<<<dim3((unsigned)ar->h, (unsigned)ar->n), 32 * ATT_WARPS, 0, s>>>(out, q, kpool, vpool, f16, *ar);
}

__global__ static void k_attention_full(float *out, const float *q, const float *k, const float *v, int64_t seg,
                                        int64_t h, int64_t hk, int64_t hd, float scale) {
    const int64_t r = blockIdx.y, head = blockIdx.x, group = h / hk, kvd = hk * hd, qd = h * hd;
    const plain_keys keys = {r / seg * seg};
    attend(out + r * qd + head * hd, q + r * qd + head * hd, k, v, false, keys, 0, seg - 1, kvd, (head / group) * hd,
           (int)hd, scale);
}

void cuda_attention_full(cudaStream_t s, float *out, const float *q, const float *k, const float *v, int64_t n,
                         int64_t seg, int64_t h, int64_t hk, int64_t hd, float scale) {
    CELER_ASSERT(hd <= 32 * ATT_MAX_PER_LANE && hk > 0 && h % hk == 0 && seg > 0 && n % seg == 0);
    k_attention_full<<<dim3((unsigned)h, (unsigned)n), 32 * ATT_WARPS, 0, s>>>(out, q, k, v, seg, h, hk, hd, scale);
}

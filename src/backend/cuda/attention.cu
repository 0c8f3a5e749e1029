/*
 * attention.cu - attention on the GPU: causal attention of rows over the paged KV cache
 * (grouped-query, sliding windows, fp16 or fp32 pools) and full attention within
 * segments of rows (a vision encoder's tiles). cuda_attention picks the kernel:
 *
 *   - many rows, fp16 pools, a head dim attention_flash.cu has: its tensor-core tiles;
 *   - otherwise fp16 pools (head dims multiples of 8 up to 256): the decode kernel here,
 *     with each row's keys split across blocks when the rows alone leave the GPU idle;
 *   - anything else (fp32 pools), and rows that see keys past their own position (the
 *     limits of a Gemma 3 image block at prefill): the simple kernel, also the form the
 *     others are checked against.
 *
 * The simple kernel: one block of ATT_WARPS warps per (query head, row). Each warp takes
 * every ATT_WARPS-th key, holds the query and its running output spread over its lanes
 * (hd up to 32 * ATT_MAX_PER_LANE), and keeps an online softmax (running max and sum), so
 * no score row is stored; the warps' partial results are merged at the end. GQA reads a
 * KV head for each of its query heads without copies. It reads each key once per query
 * row, one dependent step per key. attention_full (plain fp32 K and V) uses it too.
 *
 * The decode kernel: one block per (row, split, and up to 8 query heads of one KV head,
 * which share every K and V read). A key row is read by hd / 8 lanes, 16 bytes each
 * (several keys per warp at once); the scores of up to DEC_SUB keys go to shared memory,
 * a warp per head updates its softmax, then the probabilities weigh V rows read the
 * same way. A split's keys are a contiguous part of the row's span: the number of splits is
 * worked out on the device from the span (one per SPLIT_KEYS keys, at most smax, which
 * the host chooses from the step's longest span and the scratch), each split writes its
 * (max, sum, unnormalized output) to the backend's scratch, and a second kernel merges
 * them in split order, so results do not depend on timing. With smax 1 the decode
 * kernel writes the output itself.
 */
#include "backend/cuda/cuda_internal.h"

#include <cuda_fp16.h>
#include <math.h>

CUDA_TRACE_UNIT(attention)

#define ATT_WARPS 4
#define ATT_MAX_PER_LANE 8 /* head dims up to 256 */

/* Where key j of a row's span lives. */
struct paged_keys {
    const int32_t *table; /* the sequence's block table */
    int64_t block_size;
    __device__ int64_t row(int64_t j) const { return kv_slot(table, (int)block_size, (int)j); }
};

struct plain_keys {
    int64_t first; /* row of the segment's first key */
    __device__ int64_t row(int64_t j) const { return first + j; }
};

__device__ static float kv_load(const void *p, bool f16, int64_t i) {
    return f16 ? __half2float(((const __half *)p)[i]) : ((const float *)p)[i];
}

/* out[hd] = softmax(q . K[lo..hi] * scale) V[lo..hi] for one query vector, each score
 * soft-capped to cap tanh(s / cap) where cap > 0; keys and values at row keys.row(j) of
 * pools [*, kvd], head offset koff. */
template <typename Keys>
__device__ static void attend(float *out, const float *q, const void *kpool, const void *vpool, bool f16,
                              Keys keys, int64_t lo, int64_t hi, int64_t kvd, int64_t koff, int hd, float scale,
                              float cap) {
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
        if (cap > 0.0f) dot = cap * tanhf(dot / cap);
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
    const int64_t p = ar.pos[r], hi = ar.limit ? ar.limit[r] : p;
    const paged_keys keys = {ar.tables + (int64_t)ar.seq[r] * ar.table_cols, ar.block_size};
    const int64_t qd = ar.h * ar.hd;
    attend(out + r * qd + head * ar.hd, q + r * qd + head * ar.hd, kpool, vpool, f16, keys,
           first_key((int)p, ar.window), hi, kvd, (head / group) * ar.hd, (int)ar.hd, ar.scale, ar.softcap);
}

/* ==== Decode: split keys, merged in order ==== */

#define DEC_THREADS 128
#define DEC_SUB 256     /* keys scored at once */
#define SPLIT_KEYS 64   /* keys a split takes at least */
#define SPLIT_MAX 64    /* splits of a row at most */
#define SPLIT_PARTS 4096 /* (row, head, split) partial results the scratch holds */
/* Calls of at most this many rows take the decode kernel even where the tiles could run:
 * such steps are mostly decode rows of as many sequences, where a tile would spend its
 * 16-row products on one row and could not split a long span (16 decode rows at depth
 * 2048 on the H200: 190 us by splits, 440 us by tiles); a short prefill chunk pays
 * instead (32 rows reading their keys once per row and KV head). */
#define DECODE_ROWS 32

/* The splits a row of span keys takes, of at most smax. */
__device__ static int splits_for(int span, int smax) {
    const int s = (span + SPLIT_KEYS - 1) / SPLIT_KEYS;
    return s < smax ? s : smax;
}

/* q[8] . the 8 fp16 values of w, in fp32 */
__device__ static float dot8(const float q[8], uint4 w) {
    const __half2 *h = (const __half2 *)&w;
    float d = 0.0f;
    for (int i = 0; i < 4; i++) {
        const float2 f = __half22float2(h[i]);
        d = fmaf(q[2 * i], f.x, d);
        d = fmaf(q[2 * i + 1], f.y, d);
    }
    return d;
}

/* grid (h / HPB, n, smax), fp16 pools: split blockIdx.z of the keys of row blockIdx.y for
 * HPB query heads of one KV head (block x: heads HPB * x ..), which share each K and V
 * read. gl lanes (a power of two >= hd / 8) read a key row, 8 values each. smax 1:
 * out[r, head] directly; else part[(r * h + head) * smax + split][hd + 2] = (max, sum,
 * sum of p v) over the split's keys (max -inf, sum 0 for none). */
template <int HPB>
__global__ static void k_decode(float *out, float *part, const float *q, const __half *kpool, const __half *vpool,
                                attn_rows ar, int smax, int gl) {
    __shared__ float sc[HPB][DEC_SUB];
    __shared__ float hm[HPB], hl[HPB], hcorr[HPB]; /* each head's running max and sum */
    __shared__ float oacc[DEC_THREADS * 8];        /* [groups][gl * 8]: the key groups' outputs */
    PDL_ENTRY(TR_ATT_DECODE);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, split = blockIdx.z, hd = (int)ar.hd;
    const int64_t r = blockIdx.y, group = ar.h / ar.hk, kvh = blockIdx.x / (group / HPB);
    const int64_t head0 = kvh * group + (blockIdx.x % (group / HPB)) * HPB;
    const int p = ar.pos[r], lo = first_key(p, ar.window), span = p - lo + 1, ns = splits_for(span, smax);
    if (split >= ns) return;
    const int chunk = (span + ns - 1) / ns, a = lo + split * chunk, b = min(p, a + chunk - 1);
    const int lane_k = tid % gl, grp = tid / gl, groups = DEC_THREADS / gl, c0 = lane_k * 8;
    const bool act = c0 < hd;
    const int64_t qd = ar.h * ar.hd, kvd = ar.hk * ar.hd, koff = kvh * ar.hd;
    const int32_t *table = ar.tables + (int64_t)ar.seq[r] * ar.table_cols;
    const int bs = (int)ar.block_size;
    float qv[HPB][8], acc[HPB][8];
#pragma unroll
    for (int g = 0; g < HPB; g++)
#pragma unroll
        for (int i = 0; i < 8; i++) {
            qv[g][i] = act ? q[r * qd + (head0 + g) * hd + c0 + i] : 0.0f;
            acc[g][i] = 0.0f;
        }
    if (tid < HPB) hm[tid] = -INFINITY, hl[tid] = 0.0f;
    for (int s0 = a; s0 <= b; s0 += DEC_SUB) {
        const int cnt = min(DEC_SUB, b - s0 + 1);
        /* scores; the loop is uniform over the warp (the shuffles need every lane) */
#pragma unroll 2
        for (int j0 = 0; j0 < cnt; j0 += groups) {
            const int j = j0 + grp;
            float dot[HPB];
#pragma unroll
            for (int g = 0; g < HPB; g++) dot[g] = 0.0f;
            if (act && j < cnt) {
                const uint4 w = *(const uint4 *)(kpool + kv_slot(table, bs, s0 + j) * kvd + koff + c0);
#pragma unroll
                for (int g = 0; g < HPB; g++) dot[g] = dot8(qv[g], w);
            }
#pragma unroll
            for (int g = 0; g < HPB; g++)
                for (int o = gl / 2; o > 0; o >>= 1) dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], o);
            if (lane_k == 0 && j < cnt)
#pragma unroll
                for (int g = 0; g < HPB; g++) {
                    const float v = dot[g] * ar.scale;
                    sc[g][j] = ar.softcap > 0.0f ? ar.softcap * tanhf(v / ar.softcap) : v;
                }
        }
        __syncthreads();
        /* each head's softmax update by one warp, in a fixed order */
        for (int g = warp; g < HPB; g += DEC_THREADS / 32) {
            const float m0 = hm[g];
            float mx = -INFINITY, sum = 0.0f;
            for (int j = lane; j < cnt; j += 32) mx = fmaxf(mx, sc[g][j]);
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float mn = fmaxf(m0, mx), corr = expf(m0 - mn); /* 0 while nothing was seen */
            for (int j = lane; j < cnt; j += 32) {
                const float e = expf(sc[g][j] - mn);
                sc[g][j] = e;
                sum += e;
            }
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            if (lane == 0) hm[g] = mn, hl[g] = hl[g] * corr + sum, hcorr[g] = corr;
        }
        __syncthreads();
#pragma unroll
        for (int g = 0; g < HPB; g++)
#pragma unroll
            for (int i = 0; i < 8; i++) acc[g][i] *= hcorr[g];
        if (act) {
#pragma unroll 2
            for (int j = grp; j < cnt; j += groups) {
                const uint4 w = *(const uint4 *)(vpool + kv_slot(table, bs, s0 + j) * kvd + koff + c0);
                const __half2 *h = (const __half2 *)&w;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float2 f = __half22float2(h[i]);
#pragma unroll
                    for (int g = 0; g < HPB; g++) {
                        const float pj = sc[g][j];
                        acc[g][2 * i] = fmaf(pj, f.x, acc[g][2 * i]);
                        acc[g][2 * i + 1] = fmaf(pj, f.y, acc[g][2 * i + 1]);
                    }
                }
            }
        }
        __syncthreads(); /* sc is scored again */
    }
#pragma unroll
    for (int g = 0; g < HPB; g++) {
#pragma unroll
        for (int i = 0; i < 8; i++) oacc[grp * gl * 8 + c0 + i] = acc[g][i];
        __syncthreads();
        const int64_t head = head0 + g;
        float *pp = part + ((r * ar.h + head) * smax + split) * (ar.hd + 2);
        if (smax > 1 && tid == 0) pp[0] = hm[g], pp[1] = hl[g];
        for (int c = tid; c < hd; c += DEC_THREADS) {
            float o = 0.0f;
            for (int k = 0; k < groups; k++) o += oacc[k * gl * 8 + c];
            if (smax == 1)
                out[r * qd + head * hd + c] = o / hl[g];
            else
                pp[2 + c] = o;
        }
        __syncthreads(); /* oacc is written again */
    }
}

/* grid (h, n): out[r, head] = the splits of k_decode merged in split order. */
__global__ static void k_decode_merge(float *out, const float *part, attn_rows ar, int smax) {
    __shared__ float wt[SPLIT_MAX];
    __shared__ float sum;
    PDL_ENTRY(TR_ATT_MERGE);
    const int64_t r = blockIdx.y, head = blockIdx.x, stride = ar.hd + 2;
    const int p = ar.pos[r], ns = splits_for(p - first_key(p, ar.window) + 1, smax);
    const float *pp = part + (r * ar.h + head) * smax * stride;
    if (threadIdx.x == 0) {
        float mx = -INFINITY, l = 0.0f;
        for (int s = 0; s < ns; s++) mx = fmaxf(mx, pp[s * stride]);
        for (int s = 0; s < ns; s++) {
            wt[s] = expf(pp[s * stride] - mx); /* 0 for an empty split (max -inf) */
            l += pp[s * stride + 1] * wt[s];
        }
        sum = l;
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < ar.hd; c += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < ns; s++) o += pp[s * stride + 2 + c] * wt[s];
        out[r * ar.h * ar.hd + head * ar.hd + c] = o / sum;
    }
}

size_t cuda_attention_scratch_bytes(int64_t hd) {
    return sizeof(float) * (size_t)(SPLIT_PARTS * ((hd > 0 ? hd : 256) + 2));
}

/* The splits a decode launch has room for (k_decode's smax): enough for the longest span of
 * the step's rows (ar->keys; else of the context), rounded up to a power of two so that a
 * recorded step stays valid while the spans grow (a server's streams come and go), as the
 * scratch allows. With one split the decode kernel writes the output and no merge is
 * launched. A row's splits are min(its span / SPLIT_KEYS, smax), so results do not depend
 * on ar->keys. */
int cuda_attention_splits(const cuda_backend *cb, const attn_rows *ar) {
    const int64_t keys = ar->keys > 0 ? ar->keys : cb->p.max_keys;
    int64_t smax = 1;
    while (smax * SPLIT_KEYS < keys) smax *= 2;
    const int64_t cap = cb->att_part_floats / ((ar->hd + 2) * ar->n * ar->h);
    smax = smax > SPLIT_MAX ? SPLIT_MAX : smax;
    smax = smax > cap ? cap : smax;
    return smax < 1 ? 1 : (int)smax;
}

void cuda_attention(cuda_backend *cb, float *out, const float *q, const void *kpool, const void *vpool,
                    const attn_rows *ar) {
    const cudaStream_t s = cb->stream;
    const bool f16 = cb->base.kv_f16;
    CELER_ASSERT(ar->hd <= 32 * ATT_MAX_PER_LANE && ar->hk > 0 && ar->h % ar->hk == 0);
    if (ar->n <= 0) return;
    const int64_t group = ar->h / ar->hk;
    /* rows that see past their own position (an image block's) take the simple kernel,
     * which reads each row's span as it is given */
    if (ar->limit) {
        k_attention<<<dim3((unsigned)ar->h, (unsigned)ar->n), 32 * ATT_WARPS, 0, s>>>(out, q, kpool, vpool, f16, *ar);
        return;
    }
    if (f16 && ar->n > DECODE_ROWS && cuda_attention_flash_fits(ar->hd)) {
        cuda_attention_flash(s, out, q, kpool, vpool, ar);
        return;
    }
    if (f16 && ar->hd % 8 == 0) {
        int gl = 1;
        while (gl * 8 < ar->hd) gl *= 2;
        const int smax = cuda_attention_splits(cb, ar);
        const int hpb = group % 8 == 0 ? 8 : group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;
        const dim3 grid((unsigned)(ar->h / hpb), (unsigned)ar->n, (unsigned)smax);
        const __half *kp = (const __half *)kpool, *vp = (const __half *)vpool;
        if (hpb == 8)
            launch_pdl(k_decode<8>, grid, DEC_THREADS, 0, s, out, cb->att_part, q, kp, vp, *ar, (int)smax, gl);
        else if (hpb == 4)
            launch_pdl(k_decode<4>, grid, DEC_THREADS, 0, s, out, cb->att_part, q, kp, vp, *ar, (int)smax, gl);
        else if (hpb == 2)
            launch_pdl(k_decode<2>, grid, DEC_THREADS, 0, s, out, cb->att_part, q, kp, vp, *ar, (int)smax, gl);
        else
            launch_pdl(k_decode<1>, grid, DEC_THREADS, 0, s, out, cb->att_part, q, kp, vp, *ar, (int)smax, gl);
        if (smax > 1)
            launch_pdl(k_decode_merge, dim3((unsigned)ar->h, (unsigned)ar->n), DEC_THREADS, 0, s, out,
                       (const float *)cb->att_part, *ar, (int)smax);
        return;
    }
    k_attention<<<dim3((unsigned)ar->h, (unsigned)ar->n), 32 * ATT_WARPS, 0, s>>>(out, q, kpool, vpool, f16, *ar);
}

__global__ static void k_attention_full(float *out, const float *q, const float *k, const float *v, int64_t seg,
                                        int64_t h, int64_t hk, int64_t hd, float scale) {
    const int64_t r = blockIdx.y, head = blockIdx.x, group = h / hk, kvd = hk * hd, qd = h * hd;
    const plain_keys keys = {r / seg * seg};
    attend(out + r * qd + head * hd, q + r * qd + head * hd, k, v, false, keys, 0, seg - 1, kvd, (head / group) * hd,
           (int)hd, scale, 0.0f);
}

void cuda_attention_full(cudaStream_t s, float *out, const float *q, const float *k, const float *v, int64_t n,
                         int64_t seg, int64_t h, int64_t hk, int64_t hd, float scale) {
    CELER_ASSERT(hd <= 32 * ATT_MAX_PER_LANE && hk > 0 && h % hk == 0 && seg > 0 && n % seg == 0);
    k_attention_full<<<dim3((unsigned)h, (unsigned)n), 32 * ATT_WARPS, 0, s>>>(out, q, k, v, seg, h, hk, hd, scale);
}

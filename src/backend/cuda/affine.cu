/*
 * affine.cu - MLX affine weights on the GPU: the load-time repack into the tiled layout of
 * affine.h, the decode product y[n, rows] = x[n, cols] @ W^T for n = 1..16, the rows of W
 * as fp32 (embeddings) or fp16 (the dense prefill product), and a double reference for the
 * tests.
 *
 * The product is bound by memory: every weight byte is read once, and at n <= 16 a byte
 * feeds at most 16 flops. A block of 8 warps owns 8 row tiles (128 rows, one tile row a
 * warp) and a slice of 4..16 column tiles. Each warp first puts every code and scale
 * load of its slice in flight (cp.async into shared memory, one commit group per 4
 * tiles), then the block waits for the previous kernel (programmatic dependent launch)
 * and stages the slice of x once for all its warps as fp16 B fragments, hi and lo parts,
 * with fp32 sums of x per group; then each warp takes its tiles as they land: one LOP3
 * and one half2 op per two codes give the exact codes q, mma.m16n8k16 sums q * x per
 * group in fp32, and s * sum(q x) + b * sum(x) goes to fp32 accumulators. Up to 4 tokens
 * share one mma (hi parts in columns 0..3, lo parts in 4..7, added at the end); 5..8
 * tokens take two mma a step (hi, then lo), 9..16 four (hi, lo of tokens 0..7, then of
 * 8..15). Blocks along K write partial sums; the last
 * block of a row block to finish adds them in a fixed order (no atomics on y, so results
 * do not depend on timing).
 *
 * A second kernel takes the large matrices: the streamed one (k_affine_gemv_stream) loads
 * codes straight into registers, a chunk of SU tiles ahead of the one a warp multiplies,
 * so shared memory holds only x and the scales, 4 blocks fit an SM at n <= 4 (2 above),
 * and a block pays its fixed costs (staging x, the barrier, the partial sums) over 16
 * tiles a warp instead of 8; same numerics, same tile product.
 *
 * Measured (H200, Llama-3.1-8B 4-bit g64, graph + PDL, bench_affine --quick): 46% of the
 * device-to-device copy bandwidth at n = 1 for the whole token (the gate, up and down
 * projections 53-55%, the LM head 82%, q/k/v/o 11-32% on the staged kernel), 20% at n = 16
 * (tests/cuda/NOTES.md).
 *
 * Not here: dense weights, products of more than 16 rows (affine_gemm.cu).
 */
#include "backend/cuda/affine.h"
#include "backend/cuda/affine_device.cuh"
#include "backend/cuda/cuda_internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdio.h>
#include <string.h>

CUDA_TRACE_UNIT(affine)

#define NW 8                      /* warps per block: one row tile each */
#define TILE_WORDS 128            /* 512 bytes: 16 rows of one tile */
#define CH 4                      /* tiles per cp.async commit group */
#define MAX_SLICE 16              /* column tiles per block */
#define MAX_G (MAX_SLICE / CH)    /* commit groups per warp */
#define SU 4                      /* tiles a chunk of the streamed kernel */
#define STREAM_BLOCKS 4           /* its blocks an SM (registers: 64 a thread) */
#define STREAM_FILL 3             /* the fewest of its blocks an SM its plans allow */
#define STREAM_FILL_WIDE 2        /* the same at n > 4 (2 blocks an SM: registers) */
#define STREAM_MIN_SLICE 8        /* the slices its plans choose from */
#define STREAM_MAX_SLICE 16
#define STREAM_SLICE 64           /* the longest slice it runs (tests and benchmarks) */
#define SMEM_MAX (160 * 1024)     /* dynamic shared memory the kernels may ask for */
#define MAX_N CUDA_AFFINE_MAX_N

/* On failure: the call, file:line and CUDA's message into err, then to the cleanup label. */
#define CUDA_TRY(call)                                                                      \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            snprintf(err, err_size, "%s:%d: %s: %s", __FILE__, __LINE__, #call,             \
                     cudaGetErrorString(e_));                                               \
            goto fail;                                                                      \
        }                                                                                   \
    } while (0)

/* ==== Load: repack into the tiled layout ==== */

/* Code (row, col) of a checkpoint-layout matrix; 0 outside it (the padding). */
__device__ static uint32_t raw_code(const uint32_t *data, int64_t rows, int64_t cols, int bits,
                                    int64_t row, int64_t col) {
    if (row >= rows || col >= cols) return 0;
    const int per = 32 / bits;
    const uint32_t w = data[row * (cols / per) + col / per];
    return (w >> ((col % per) * bits)) & ((1u << bits) - 1u);
}

/* One word of the tiled layout per thread. Word j of lane l = 4r + t of tile (rt, kt) holds
 * row rt*16 + r (+8 for j >= 2); its part j & 1 of the tile's mma steps. The element
 * that the product reads as half e of the A register for k-pair kp of step m comes from
 * column kt * tile_cols + 16m + 4t + 2kp + e. At 4 bits that element is nibble
 * p = 4e + 2(m & 1) + kp (a mask 0x000f000f or 0x00f000f0, on the word or the word >> 8,
 * yields a (e = 0, e = 1) pair); at 8 bits, byte p = 2e + kp (byte_perm 0x4240 / 0x4341). */
__global__ static void k_pack_codes(uint32_t *out, const uint32_t *data, int64_t rows,
                                    int64_t cols, int bits, int64_t k_tiles, int64_t words) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= words) return;
    const int64_t tile = i / TILE_WORDS, rt = tile / k_tiles, kt = tile % k_tiles;
    const int lane = (int)(i % TILE_WORDS) / 4, j = (int)(i % 4);
    const int r = lane / 4, t = lane % 4;
    const int64_t row = rt * 16 + r + (j >= 2 ? 8 : 0);
    const int64_t col0 = kt * tile_cols(bits) + 4 * t;
    uint32_t w = 0;
    if (bits == 4) {
        for (int p = 0; p < 8; p++) {
            const int e = p >> 2, m = 2 * (j & 1) + ((p >> 1) & 1), kp = p & 1;
            w |= raw_code(data, rows, cols, 4, row, col0 + 16 * m + 2 * kp + e) << (4 * p);
        }
    } else {
        for (int p = 0; p < 4; p++) {
            const int e = p >> 1, m = j & 1, kp = p & 1;
            w |= raw_code(data, rows, cols, 8, row, col0 + 16 * m + 2 * kp + e) << (8 * p);
        }
    }
    out[i] = w;
}

/* One (scale, bias) pair per thread: pair i of [row_tiles][group_blocks][8][2 * gpb] is
 * row rt*16 + r + 8h, group gb * gpb + jg, with i % (2 gpb) = 2 jg + h. The checkpoint's
 * values are kept exactly: 16-bit bits as stored (scale low, bias high), or fp32. */
__global__ static void k_pack_sb(uint32_t *out, const void *scales, const void *biases, int kind,
                                 int64_t rows, int64_t groups, int gpb, int64_t group_blocks,
                                 int64_t pairs) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= pairs) return;
    const int wl = 2 * gpb;
    const int64_t rt = i / (group_blocks * 8 * wl);
    const int64_t gb = (i / (8 * wl)) % group_blocks;
    const int r = (int)(i / wl) % 8, w = (int)(i % wl);
    const int64_t row = rt * 16 + r + 8 * (w & 1), g = gb * gpb + w / 2;
    const bool in = row < rows && g < groups;
    const int64_t k = row * groups + g;
    if (kind == CUDA_AFFINE_SB_F32) {
        out[2 * i] = in ? ((const uint32_t *)scales)[k] : 0u;
        out[2 * i + 1] = in ? ((const uint32_t *)biases)[k] : 0u;
    } else {
        out[i] = in ? (uint32_t)((const uint16_t *)scales)[k] | (uint32_t)((const uint16_t *)biases)[k] << 16 : 0u;
    }
}

static int check_view(const matview *w, char *err, size_t err_size) {
    const char *why = NULL;
    if (w->quant_bits != 4 && w->quant_bits != 8) why = "bits must be 4 or 8";
    else if (w->group != 32 && w->group != 64 && w->group != 128) why = "group must be 32, 64 or 128";
    else if (w->rows < 1 || w->cols < w->group || w->cols % w->group) why = "cols must be a multiple of the group";
    else if (w->scale_type != DTYPE_F16 && w->scale_type != DTYPE_BF16 && w->scale_type != DTYPE_F32)
        why = "scales must be F16, BF16 or F32";
    else if ((double)w->rows * (double)w->cols * w->quant_bits / 32 >= 2147483647.0) why = "too large";
    if (!why) return 0;
    snprintf(err, err_size, "cuda affine: %lld x %lld, %d bits, group %lld: %s", (long long)w->rows,
             (long long)w->cols, w->quant_bits, (long long)w->group, why);
    return -1;
}

static void choose_plans(cuda_affine *a);
static cudaError_t init_kernels(void);

/* The tiled copy of w, whose pointers are device memory. */
static int pack(cuda_affine *out, const matview *w, cudaStream_t s, char *err, size_t err_size) {
    cuda_affine a;
    memset(&a, 0, sizeof a);
    a.rows = w->rows;
    a.cols = w->cols;
    a.bits = w->quant_bits;
    a.group = w->group;
    a.sb_kind = w->scale_type == DTYPE_F32 ? CUDA_AFFINE_SB_F32
              : w->scale_type == DTYPE_BF16 ? CUDA_AFFINE_SB_BF16 : CUDA_AFFINE_SB_F16;
    a.row_tiles = (w->rows + 15) / 16;
    const int tc = tile_cols(a.bits), gpb = groups_per_block(a.bits, a.group);
    a.k_tiles = (w->cols + tc - 1) / tc;
    a.group_blocks = a.k_tiles * tc / a.group / gpb;
    if (a.group_blocks < 1) a.group_blocks = 1;
    const int64_t code_words = a.row_tiles * a.k_tiles * TILE_WORDS;
    const int64_t sb_pairs = a.row_tiles * a.group_blocks * 16 * gpb;
    const int64_t sb_words = sb_pairs * pair_words(a.sb_kind);
    a.bytes = (size_t)(code_words + sb_words) * 4;
    CUDA_TRY(init_kernels());
    CUDA_TRY(cudaMalloc((void **)&a.codes, (size_t)code_words * 4));
    CUDA_TRY(cudaMalloc((void **)&a.sb, (size_t)sb_words * 4));
    k_pack_codes<<<(unsigned)((code_words + 255) / 256), 256, 0, s>>>(
        a.codes, (const uint32_t *)w->data, w->rows, w->cols, a.bits, a.k_tiles, code_words);
    CUDA_TRY(cudaGetLastError());
    k_pack_sb<<<(unsigned)((sb_pairs + 255) / 256), 256, 0, s>>>(a.sb, w->scales, w->biases, a.sb_kind, w->rows,
                                                                 w->cols / w->group, gpb, a.group_blocks, sb_pairs);
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(cudaStreamSynchronize(s));
    choose_plans(&a);
    CUDA_TRY(cudaGetLastError());
    *out = a;
    return 0;
fail:
    cudaFree(a.codes);
    cudaFree(a.sb);
    return -1;
}

extern "C" int cuda_affine_upload_device(cuda_affine *out, const matview *w, cudaStream_t s,
                                         char *err, size_t err_size) {
    memset(out, 0, sizeof *out);
    if (check_view(w, err, err_size)) return -1;
    return pack(out, w, s, err, err_size);
}

extern "C" bool cuda_affine_takes(const matview *w) {
    const bool scales_ok = w->scale_type == DTYPE_F16 || w->scale_type == DTYPE_BF16 || w->scale_type == DTYPE_F32;
    return (w->quant_bits == 4 || w->quant_bits == 8) && (w->group == 32 || w->group == 64 || w->group == 128) &&
           w->cols % w->group == 0 && scales_ok && w->biases && !w->super && !w->lut;
}

extern "C" int cuda_affine_upload(cuda_affine *out, const matview *w, cudaStream_t s, char *err,
                                  size_t err_size) {
    memset(out, 0, sizeof *out);
    if (check_view(w, err, err_size)) return -1;
    const size_t code_bytes = (size_t)(w->rows * w->cols * w->quant_bits / 8);
    const size_t sb_bytes = (size_t)(w->rows * (w->cols / w->group)) * (w->scale_type == DTYPE_F32 ? 4 : 2);
    matview d = *w;
    void *codes = NULL, *scales = NULL, *biases = NULL;
    int rc = -1;
    CUDA_TRY(cudaMalloc(&codes, code_bytes));
    CUDA_TRY(cudaMalloc(&scales, sb_bytes));
    CUDA_TRY(cudaMalloc(&biases, sb_bytes));
    CUDA_TRY(cudaMemcpyAsync(codes, w->data, code_bytes, cudaMemcpyHostToDevice, s));
    CUDA_TRY(cudaMemcpyAsync(scales, w->scales, sb_bytes, cudaMemcpyHostToDevice, s));
    CUDA_TRY(cudaMemcpyAsync(biases, w->biases, sb_bytes, cudaMemcpyHostToDevice, s));
    d.data = codes;
    d.scales = scales;
    d.biases = biases;
    rc = pack(out, &d, s, err, err_size);
fail:
    if (codes || scales || biases) cudaStreamSynchronize(s);
    cudaFree(codes);
    cudaFree(scales);
    cudaFree(biases);
    return rc;
}

extern "C" void cuda_affine_free(cuda_affine *w) {
    if (!w) return;
    cudaFree(w->codes);
    cudaFree(w->sb);
    memset(w, 0, sizeof *w);
}

/* ==== Decode product ==== */

template <int BITS, int GROUP> struct kshape {
    static constexpr int TC = BITS == 4 ? 64 : 32;                    /* columns of a tile */
    static constexpr int MP = TC / 32;                                /* B uint4 per lane, operand and tile */
    static constexpr int GPB = (BITS == 4 && GROUP == 32) ? 2 : 1;    /* groups per sb block */
    static constexpr int SH = GROUP * GPB == TC ? 0 : GROUP * GPB == 2 * TC ? 1 : 2; /* sb block = tile >> SH */
    static constexpr int EU = TC / GPB;                               /* columns of one scaling */
};

/* Columns of a block's sums of x per scaling unit: 8 tokens (hi and lo columns at nb 1),
 * 16 at nb 4. */
__host__ __device__ constexpr int xsum_cols(int nb) { return nb == 4 ? 16 : 8; }

/* Shared memory of a block, bytes: codes [NW][slice][32] uint4; per warp its sb blocks;
 * x fragments [slice][MP][nb][32] uint4; x sums [slice * gpb][xsum_cols(nb)] floats. */
typedef struct gemv_layout {
    int sb, sb_warp, xs, xsum, total;
} gemv_layout;

__host__ __device__ static gemv_layout gemv_layout_of(int bits, int group, int kind, int nb, int slice, bool stream) {
    const int tc = tile_cols(bits), gpb = groups_per_block(bits, group);
    const int blocks = slice * tc / (group * gpb); /* sb blocks of a slice (slice is a multiple of 4) */
    gemv_layout L;
    L.sb = stream ? 0 : NW * slice * 512; /* the streamed kernel keeps its codes in registers */
    L.sb_warp = blocks * 16 * gpb * 4 * pair_words(kind);
    L.xs = L.sb + NW * L.sb_warp;
    L.xsum = L.xs + slice * (tc / 32) * nb * 512;
    L.total = L.xsum + slice * gpb * xsum_cols(nb) * 4;
    return L;
}

/* The block's slice of x (tokens 0 .. n-1, columns of tiles kb .. kb + slice - 1; zero
 * past the matrix) as B fragments: float4 unit c4 of a token holds columns 4c4 .. 4c4+3
 * of the slice, which in tile kk, step m are k rows 2t, 2t+1 (b0) and 2t+8, 2t+9 (b1) of
 * lane 4 * column + t, with t = c4 & 3. With one operand, token tok's hi part is column
 * tok and its lo part column tok + 4; with two or four, operand 2o holds the hi parts of
 * tokens 8o .. 8o + 7 and 2o + 1 their lo parts. xsum[eu][column]: the fp32 sum of x over
 * each scaling unit (0 for lo columns), xsum_cols(NB) columns a unit.
 * Columns of tokens >= n are not written: the mma keeps columns apart, and their sums are
 * never stored. */
template <int BITS, int GROUP, int NB>
__device__ __forceinline__ void stage_x(uint4 *xs, float *xsum, const float *__restrict__ x,
                                        const float *__restrict__ up, int n, int cols, int kb, int slice) {
    using K = kshape<BITS, GROUP>;
    constexpr int UPT = K::TC / 4, UPE = K::EU / 4, TOKS = 4 * NB; /* float4 units per tile / scaling */
    const int upt = slice * UPT;
    const float *xb = x + (size_t)kb * K::TC, *ub = up + (size_t)kb * K::TC;
    const int lim = cols - kb * K::TC;
    /* upt is a multiple of 32: whole warps take part in the shuffles, and a scaling
     * unit's UPE units sit in aligned lanes of one warp */
    for (int c4 = threadIdx.x; c4 < upt; c4 += NW * 32) {
        float4 v[TOKS]; /* every load in flight first */
#pragma unroll
        for (int tok = 0; tok < TOKS; tok++) {
            v[tok] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (tok < n && 4 * c4 < lim) v[tok] = __ldcg((const float4 *)(xb + (size_t)tok * cols + 4 * c4));
        }
        if (up) /* x = silu(gate) * up */
#pragma unroll
            for (int tok = 0; tok < TOKS; tok++) {
                if (tok >= n || 4 * c4 >= lim) continue;
                v[tok] = swiglu4(v[tok], __ldcg((const float4 *)(ub + (size_t)tok * cols + 4 * c4)));
            }
        const int kk = c4 / UPT, cc = c4 % UPT, m = cc >> 2, tt = cc & 3;
        uint2 *d = (uint2 *)(xs + (kk * K::MP + (m >> 1)) * NB * 32 + tt) + (m & 1);
        float *xe = xsum + (kk * K::GPB + cc / UPE) * xsum_cols(NB);
#pragma unroll
        for (int tok = 0; tok < TOKS; tok++) {
            if (tok >= n) break;
            const float4 a = v[tok];
            const __half2 h01 = __floats2half2_rn(a.x, a.y), h23 = __floats2half2_rn(a.z, a.w);
            const float2 f01 = __half22float2(h01), f23 = __half22float2(h23);
            const __half2 l01 = __floats2half2_rn(a.x - f01.x, a.y - f01.y);
            const __half2 l23 = __floats2half2_rn(a.z - f23.x, a.w - f23.y);
            const int at = 8 * (tok & 7) + 128 * (tok >> 3); /* lane 4 tok + t of operand 2 (tok / 8) */
            d[at] = make_uint2(h2_bits(h01), h2_bits(h23));
            d[at + (NB == 1 ? 32 : 64)] = make_uint2(h2_bits(l01), h2_bits(l23)); /* lo column / operand */
            float sx = (a.x + a.y) + (a.z + a.w);
#pragma unroll
            for (int o = 1; o < UPE; o <<= 1) sx += __shfl_xor_sync(0xffffffffu, sx, o);
            if (cc % UPE == 0) {
                xe[tok] = sx;
                if (NB == 1) xe[tok + 4] = 0.0f;
            }
        }
    }
}

/* acc[rows r, r+8][columns 2t, 2t+1] += s * c + b * sum(x) for one scaling unit; p: the sb
 * pair of row r (row r + 8 is p + 1); xe: the unit's sums of x at column 2t. */
template <int BITS>
__device__ __forceinline__ void scale_add(float acc[4], float c[4], const uint32_t *sb, int kind, int p,
                                          const float *xe) {
    float s0, b0, s1, b1;
    sb_centered<BITS>(sb, kind, p, s0, b0);
    sb_centered<BITS>(sb, kind, p + 1, s1, b1);
    const float2 sx = *(const float2 *)xe;
    acc[0] = fmaf(s0, c[0], fmaf(b0, sx.x, acc[0]));
    acc[1] = fmaf(s0, c[1], fmaf(b0, sx.y, acc[1]));
    acc[2] = fmaf(s1, c[2], fmaf(b1, sx.x, acc[2]));
    acc[3] = fmaf(s1, c[3], fmaf(b1, sx.y, acc[3]));
#pragma unroll
    for (int i = 0; i < 4; i++) c[i] = 0.0f;
}

/* Groups of 8 token columns a kernel of NB operands accumulates apart: the hi and lo
 * operands of a group share its accumulators. */
template <int NB> struct octets {
    static constexpr int N = NB == 4 ? 2 : 1;
};

/* acc += tile u of the warp's slice (16 rows) @ x. cw: the lane's codes (x, y: row r, z, w:
 * row r + 8; 4 bits: steps 0-1, 2-3; 8 bits: steps 0, 1); sb: the warp's sb blocks. */
template <int BITS, int GROUP, int NB>
__device__ __forceinline__ void tile_product(float acc[][4], uint4 cw, const uint32_t *sb, int kind,
                                             const uint4 *xs, const float *xsum, int u, int lane) {
    using K = kshape<BITS, GROUP>;
    constexpr int NO = octets<NB>::N, XC = xsum_cols(NB);
    const int r = lane >> 2, t = lane & 3;
    const uint4 *xb = xs + u * K::MP * NB * 32 + lane;
    const int p = ((u >> K::SH) * 8 + r) * 2 * K::GPB;
    float c[NO][4];
#pragma unroll
    for (int o = 0; o < NO; o++)
#pragma unroll
        for (int e = 0; e < 4; e++) c[o][e] = 0.0f;
    if (BITS == 4) {
#pragma unroll
        for (int jj = 0; jj < 2; jj++) {
            uint32_t ar[4], a8[4];
            codes4(ar, jj ? cw.y : cw.x);
            codes4(a8, jj ? cw.w : cw.z);
#pragma unroll
            for (int op = 0; op < NB; op++) {
                const uint4 b = xb[(jj * NB + op) * 32];
                mma16816(c[op >> 1], ar[0], a8[0], ar[1], a8[1], b.x, b.y);
                mma16816(c[op >> 1], ar[2], a8[2], ar[3], a8[3], b.z, b.w);
            }
            if (K::GPB == 2)
#pragma unroll
                for (int o = 0; o < NO; o++)
                    scale_add<BITS>(acc[o], c[o], sb, kind, p + 2 * jj, xsum + (u * 2 + jj) * XC + 8 * o + 2 * t);
        }
        if (K::GPB == 1)
#pragma unroll
            for (int o = 0; o < NO; o++) scale_add<BITS>(acc[o], c[o], sb, kind, p, xsum + u * XC + 8 * o + 2 * t);
    } else {
        uint4 b[NB];
#pragma unroll
        for (int op = 0; op < NB; op++) b[op] = xb[op * 32];
        uint32_t ar[2], a8[2];
        codes8(ar, cw.x);
        codes8(a8, cw.z);
#pragma unroll
        for (int op = 0; op < NB; op++) mma16816(c[op >> 1], ar[0], a8[0], ar[1], a8[1], b[op].x, b[op].y);
        codes8(ar, cw.y);
        codes8(a8, cw.w);
#pragma unroll
        for (int op = 0; op < NB; op++) mma16816(c[op >> 1], ar[0], a8[0], ar[1], a8[1], b[op].z, b[op].w);
#pragma unroll
        for (int o = 0; o < NO; o++) scale_add<BITS>(acc[o], c[o], sb, kind, p, xsum + u * XC + 8 * o + 2 * t);
    }
}

/* Where a decode product's warp works: its matrix of the set, its row tile rt (active
 * when the matrix has it) and its column tiles kb .. kb + nt - 1. */
typedef struct gemv_place {
    set_member mb;
    int lane, warp, rt, kb, nt;
    bool active;
} gemv_place;

__device__ __forceinline__ gemv_place place_of(const affine_set &set, int k_tiles, int slice) {
    gemv_place g;
    g.mb = member_of(set, blockIdx.x);
    g.lane = threadIdx.x & 31, g.warp = threadIdx.x >> 5;
    g.rt = (blockIdx.x - g.mb.block0) * NW + g.warp;
    g.active = g.rt < g.mb.row_tiles;
    g.kb = blockIdx.y * slice;
    g.nt = min(slice, k_tiles - g.kb);
    return g;
}

/* Starts the copy of warp row tile rt's (scale, bias) blocks for column tiles kb .. kb + nt - 1
 * into sbs (cp.async, not committed). */
template <int BITS, int GROUP>
__device__ __forceinline__ void stage_sb(uint32_t *sbs, const set_member &mb, int rt, int kb, int nt, int kind,
                                         int lane) {
    using K = kshape<BITS, GROUP>;
    const int block_bytes = 16 * K::GPB * 4 * pair_words(kind);
    const int gb0 = kb >> K::SH, sb_bytes = (((kb + nt - 1) >> K::SH) - gb0 + 1) * block_bytes;
    const unsigned char *src = (const unsigned char *)mb.sb + ((size_t)rt * mb.group_blocks + gb0) * block_bytes;
    for (int o = lane * 16; o < sb_bytes; o += 32 * 16) cp_async16((unsigned char *)sbs + o, src + o);
}

/* The block's results from each warp's accumulators (c0, c1: row r, tokens 2t, 2t + 1;
 * c2, c3: row r + 8): y itself when K is not split; otherwise partial sums, and the last
 * block of the row block to finish adds them in split order and leaves its counter zero
 * for the next product using this work buffer. */
template <int NB>
__device__ __forceinline__ void gemv_finish(float acc[][4], const set_member &mb, int rt, bool active, int n,
                                            int tiles_total, float *__restrict__ part, unsigned *__restrict__ count) {
    constexpr int NO = octets<NB>::N;
    __shared__ int last;
    const int lane = threadIdx.x & 31, t = lane & 3;
    /* one operand: columns 2t + 4, 2t + 5 (lo parts) of lane t + 2 onto lanes t < 2 */
    if (NB == 1) {
#pragma unroll
        for (int i = 0; i < 4; i++) acc[0][i] += __shfl_down_sync(0xffffffffu, acc[0][i], 2);
    }
    const int rows = mb.rows, row0 = rt * 16 + (lane >> 2), tok0 = 2 * t;
    const bool holds = active && (NB > 1 || t < 2);
    const int split = gridDim.y;
    /* token tok's rows r, r + 8 go to dst + tok * ld + r (those below lim; every partial
     * row exists: lim < 0) */
    auto store = [&](float *dst, size_t ld, int r, int lim) {
        if (!holds) return;
#pragma unroll
        for (int o = 0; o < NO; o++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int tok = tok0 + 8 * o + e;
                if (tok >= n) continue;
                float *d = dst + (size_t)tok * ld;
                if (lim < 0 || r < lim) d[r] = acc[o][e];
                if (lim < 0 || r + 8 < lim) d[r + 8] = acc[o][2 + e];
            }
    };
    if (split == 1) {
        store(mb.y, (size_t)rows, row0, rows);
        return;
    }

    /* partial rows [split][n][the set's row tiles x 16]; this matrix's from tile0 on */
    const int rows_p = tiles_total * 16;
    store(part + (size_t)blockIdx.y * n * rows_p, (size_t)rows_p, mb.tile0 * 16 + row0, -1);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&count[blockIdx.x], 1u) == (unsigned)split - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int rb0 = (blockIdx.x - mb.block0) * NW * 16;
    for (int idx = threadIdx.x; idx < NW * 16 * n; idx += NW * 32) {
        const int rl = idx % (NW * 16), tok = idx / (NW * 16), row = rb0 + rl;
        if (row >= rows) continue;
        float v = 0.0f;
        for (int s = 0; s < split; s++) v += __ldcg(part + ((size_t)s * n + tok) * rows_p + mb.tile0 * 16 + row);
        mb.y[(size_t)tok * rows + row] = v;
    }
    if (threadIdx.x == 0) count[blockIdx.x] = 0;
}

/* y[n, rows] = x[n, cols] @ W^T (NB = 1: n <= 4, 2: n <= 8, 4: n <= 16). Block (bx, by): row tiles
 * bx * NW + warp, column tiles by * slice .. + slice - 1. prefetch is the streamed kernel's
 * (the two share one launch); this one puts every load of its slice in flight before the
 * wait already. */
template <int BITS, int GROUP, int NB>
__global__ static void __launch_bounds__(NW * 32, NB == 1 ? 4 : NB == 2 ? 3 : 2)
k_affine_gemv(const affine_set set, const float *__restrict__ x, const float *__restrict__ up, int n, int kind, int cols,
              int k_tiles, int slice, int tiles_total, float *__restrict__ part, unsigned *__restrict__ count,
              int prefetch) {
    extern __shared__ __align__(16) unsigned char smem[];
    trace_scope tr(TR_GEMV);
    pdl_launch_next();
    const gemv_place g = place_of(set, k_tiles, slice);
    const set_member &mb = g.mb;
    const int lane = g.lane, warp = g.warp, rt = g.rt, kb = g.kb, nt = g.nt;
    const bool active = g.active;
    const gemv_layout L = gemv_layout_of(BITS, GROUP, kind, NB, slice, false);
    uint4 *cs = (uint4 *)smem + warp * slice * 32;
    uint32_t *sbs = (uint32_t *)(smem + L.sb + warp * L.sb_warp);

    /* Every weight load of the warp in flight before anything waits: the sb blocks of the
     * slice with the first group, then CH tiles of codes per group. */
    if (active) {
        const uint4 *src = mb.codes + ((size_t)rt * k_tiles + kb) * 32 + lane;
        stage_sb<BITS, GROUP>(sbs, mb, rt, kb, nt, kind, lane);
#pragma unroll
        for (int g = 0; g < MAX_G; g++) {
#pragma unroll
            for (int i = 0; i < CH; i++)
                if (g * CH + i < nt) cp_async16(cs + (g * CH + i) * 32 + lane, src + (g * CH + i) * 32);
            cp_async_commit();
        }
    }

    pdl_wait_prev(); /* x, y and the work buffer are touched only after this */
    tr.ready();
    stage_x<BITS, GROUP, NB>((uint4 *)(smem + L.xs), (float *)(smem + L.xsum), x, up, n, cols, kb, slice);
    __syncthreads();

    constexpr int NO = octets<NB>::N;
    float acc[NO][4];
#pragma unroll
    for (int o = 0; o < NO; o++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[o][e] = 0.0f;
    if (active) {
        const uint4 *xs = (const uint4 *)(smem + L.xs);
        const float *xsum = (const float *)(smem + L.xsum);
        for (int g = 0; g * CH < nt; g++) {
            cp_async_wait_until(MAX_G - 1 - g);
            __syncwarp(); /* the sb blocks came in through every lane */
#pragma unroll
            for (int i = 0; i < CH; i++) {
                const int u = g * CH + i;
                if (u < nt) tile_product<BITS, GROUP, NB>(acc, cs[u * 32 + lane], sbs, kind, xs, xsum, u, lane);
            }
        }
    }
    tr.work();
    gemv_finish<NB>(acc, mb, rt, active, n, tiles_total, part, count);
}

/* 16 bytes of codes into registers, past L1 (each is read once). */
__device__ __forceinline__ uint4 ld_codes(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* bytes (a multiple of 16) from p (16-byte aligned) toward L2: one instruction, no
 * registers; the loads that read them later find them there or on their way. */
__device__ __forceinline__ void prefetch_l2(const void *p, unsigned bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

/* Tiles u0 .. u0 + SU - 1 (those below nt) of a warp's slice into c. */
__device__ __forceinline__ void load_chunk(uint4 c[SU], const uint4 *src, int u0, int nt) {
#pragma unroll
    for (int i = 0; i < SU; i++)
        if (u0 + i < nt) c[i] = ld_codes(src + (size_t)(u0 + i) * 32);
}

template <int BITS, int GROUP, int NB>
__device__ __forceinline__ void mul_chunk(float acc[][4], const uint4 c[SU], int u0, int nt, const uint32_t *sbs,
                                          int kind, const uint4 *xs, const float *xsum, int lane) {
#pragma unroll
    for (int i = 0; i < SU; i++)
        if (u0 + i < nt) tile_product<BITS, GROUP, NB>(acc, c[i], sbs, kind, xs, xsum, u0 + i, lane);
}

/* The streamed product: as k_affine_gemv, but the codes go straight into registers, SU
 * tiles a chunk, the next chunk in flight while a warp multiplies the current one. Shared
 * memory holds only x and the (scale, bias) blocks, so a slice can be long (up to
 * STREAM_SLICE tiles): a block's fixed costs (x staging, the barrier, the partial sums)
 * are paid over more tiles. */
template <int BITS, int GROUP, int NB>
__global__ static void __launch_bounds__(NW * 32, NB == 1 ? STREAM_BLOCKS : 2)
k_affine_gemv_stream(const affine_set set, const float *__restrict__ x, const float *__restrict__ up, int n, int kind,
                     int cols, int k_tiles, int slice, int tiles_total, float *__restrict__ part,
                     unsigned *__restrict__ count, int prefetch) {
    extern __shared__ __align__(16) unsigned char smem[];
    trace_scope tr(TR_GEMV_STREAM);
    pdl_launch_next();
    const gemv_place g = place_of(set, k_tiles, slice);
    const set_member &mb = g.mb;
    const int lane = g.lane, warp = g.warp, rt = g.rt, kb = g.kb, nt = g.active ? g.nt : 0;
    const bool active = g.active;
    const gemv_layout L = gemv_layout_of(BITS, GROUP, kind, NB, slice, true);
    uint32_t *sbs = (uint32_t *)(smem + L.sb + warp * L.sb_warp);
    const uint4 *src = mb.codes + ((size_t)rt * k_tiles + kb) * 32 + lane;
    uint4 ca[SU], cb[SU];
    if (active) stage_sb<BITS, GROUP>(sbs, mb, rt, kb, nt, kind, lane);
    cp_async_commit();
    load_chunk(ca, src, 0, nt);
    if (prefetch && lane == 0 && nt > SU) prefetch_l2(src + SU * 32, (unsigned)(nt - SU) * TILE_WORDS * 4);

    pdl_wait_prev(); /* x, y and the work buffer are touched only after this */
    tr.ready();
    stage_x<BITS, GROUP, NB>((uint4 *)(smem + L.xs), (float *)(smem + L.xsum), x, up, n, cols, kb, slice);
    cp_async_wait<0>();
    __syncthreads();

    constexpr int NO = octets<NB>::N;
    float acc[NO][4];
#pragma unroll
    for (int o = 0; o < NO; o++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[o][e] = 0.0f;
    const uint4 *xs = (const uint4 *)(smem + L.xs);
    const float *xsum = (const float *)(smem + L.xsum);
#pragma unroll 1
    for (int u0 = 0; u0 < nt; u0 += 2 * SU) {
        load_chunk(cb, src, u0 + SU, nt);
        mul_chunk<BITS, GROUP, NB>(acc, ca, u0, nt, sbs, kind, xs, xsum, lane);
        load_chunk(ca, src, u0 + 2 * SU, nt);
        mul_chunk<BITS, GROUP, NB>(acc, cb, u0 + SU, nt, sbs, kind, xs, xsum, lane);
    }
    tr.work();
    gemv_finish<NB>(acc, mb, rt, active, n, tiles_total, part, count);
}

typedef void (*gemv_kernel)(const affine_set, const float *, const float *, int, int, int, int, int, int, float *,
                            unsigned *, int);

template <int BITS, int GROUP> static gemv_kernel pick_nb(int nb, bool stream) {
    if (stream)
        return nb == 4 ? k_affine_gemv_stream<BITS, GROUP, 4>
             : nb == 2 ? k_affine_gemv_stream<BITS, GROUP, 2> : k_affine_gemv_stream<BITS, GROUP, 1>;
    return nb == 4 ? k_affine_gemv<BITS, GROUP, 4> : nb == 2 ? k_affine_gemv<BITS, GROUP, 2> : k_affine_gemv<BITS, GROUP, 1>;
}

static gemv_kernel pick(int bits, int64_t group, int nb, bool stream) {
    if (bits == 4) {
        if (group == 32) return pick_nb<4, 32>(nb, stream);
        if (group == 64) return pick_nb<4, 64>(nb, stream);
        return pick_nb<4, 128>(nb, stream);
    }
    if (group == 32) return pick_nb<8, 32>(nb, stream);
    if (group == 64) return pick_nb<8, 64>(nb, stream);
    return pick_nb<8, 128>(nb, stream);
}

/* Every decode kernel may take SMEM_MAX of shared memory, and prefers shared memory to L1
 * (the weights stream past L1); the prefill product's kernels get what they need. On the
 * current device. */
static cudaError_t init_kernels(void) {
    static const int bits[2] = {4, 8}, groups[3] = {32, 64, 128};
    for (int b = 0; b < 2; b++)
        for (int g = 0; g < 3; g++)
            for (int ki = 0; ki < 6; ki++) { /* staged, streamed x 1, 2, 4 operands */
                const gemv_kernel k = pick(bits[b], groups[g], 1 << (ki % 3), ki >= 3);
                cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_MAX);
                if (e == cudaSuccess)
                    e = cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                             cudaSharedmemCarveoutMaxShared);
                if (e != cudaSuccess) return e;
            }
    return affine_gemm_init();
}

static int nb_of(int64_t n) { return n <= 4 ? 1 : n <= 8 ? 2 : 4; }
static int64_t row_blocks(const cuda_affine *w) { return (w->row_tiles + NW - 1) / NW; }

extern "C" int64_t cuda_affine_plan_split(const cuda_affine *w, cuda_affine_plan p) {
    return p.slice > 0 ? (w->k_tiles + p.slice - 1) / p.slice : 0;
}

static bool plan_valid(int64_t n, cuda_affine_plan p) {
    const int most = p.stream ? STREAM_SLICE : MAX_SLICE;
    return n >= 1 && n <= MAX_N && p.stream >= 0 && p.stream <= 2 && p.slice >= 4 && p.slice <= most &&
           p.slice % 4 == 0;
}

static int plan_smem(int bits, int64_t group, int kind, int nb, cuda_affine_plan p) {
    return gemv_layout_of(bits, (int)group, kind, nb, p.slice, p.stream != 0).total;
}

/* Blocks of plan p's kernel at nb operands that fit an SM (registers, shared memory); 0
 * where its block does not fit the kernels' shared memory or the query fails. */
static int plan_blocks_per_sm(int bits, int64_t group, int kind, int nb, cuda_affine_plan p) {
    const int smem = plan_smem(bits, group, kind, nb, p);
    int per_sm = 0;
    if (smem > SMEM_MAX || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, pick(bits, group, nb, p.stream != 0),
                                                                        NW * 32, (size_t)smem) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return per_sm;
}

static cuda_affine_plan stream_plan(int bits, int64_t group, int kind, int nb, int64_t row_blocks, int64_t k_tiles);

/* The plan for blocks of nb operands over row_blocks blocks of 8 row tiles and k_tiles
 * column tiles: the streamed plan where one fills the device; otherwise the
 * staged slice with the least estimated time: waves of blocks (resident blocks per SM
 * from the kernel's registers and shared memory) times the tiles a block streams, plus
 * about four tiles' worth for a block's start (x staging, the first loads' latency) and
 * its partial sums. */
static cuda_affine_plan best_plan(int bits, int64_t group, int kind, int nb, int64_t row_blocks, int64_t k_tiles) {
    const cuda_affine_plan sp = stream_plan(bits, group, kind, nb, row_blocks, k_tiles);
    if (sp.slice) return sp;
    const int sms = cuda_sm_count(132);
    cuda_affine_plan best = {4, 0};
    double best_cost = 1e300;
    for (int slice = 4; slice <= MAX_SLICE; slice += 4) {
        if (slice > 4 && slice - 4 >= k_tiles) break; /* a smaller slice holds all of K */
        const cuda_affine_plan p = {slice, 0};
        const int per_sm = plan_blocks_per_sm(bits, group, kind, nb, p);
        if (per_sm < 1) continue;
        const int64_t blocks = row_blocks * ((k_tiles + slice - 1) / slice);
        const int64_t slots = (int64_t)sms * per_sm, waves = (blocks + slots - 1) / slots;
        const double cost = (double)waves * (double)((slice < k_tiles ? slice : k_tiles) + 4);
        if (cost <= best_cost) best = p, best_cost = cost;
    }
    return best;
}

/* The streamed plan for nb operands, or slice 0 where none fits: K cut into the fewest
 * splits of at most STREAM_MAX_SLICE tiles (each split's slice rounded up to 4, so no
 * split is much shorter than the others) that still give every SM STREAM_FILL blocks
 * (STREAM_FILL_WIDE at n > 4), since a block's warps hold only a chunk or two of loads in
 * flight and an SM with fewer blocks leaves bandwidth unused. Measured on the 8B shapes
 * at n = 1 (bench_affine): slices of 24 and 32 were slower than 16 (a warp's tiles come
 * one after another), and slices under 8 lose to the staged kernel. */
static cuda_affine_plan stream_plan(int bits, int64_t group, int kind, int nb, int64_t row_blocks, int64_t k_tiles) {
    const int sms = cuda_sm_count(132);
    int last = 0;
    for (int64_t split = (k_tiles + STREAM_MAX_SLICE - 1) / STREAM_MAX_SLICE; split <= k_tiles; split++) {
        const int slice = (int)((k_tiles + split - 1) / split + 3) / 4 * 4;
        if (slice < STREAM_MIN_SLICE) break;
        if (slice == last) continue;
        last = slice;
        const cuda_affine_plan p = {slice, 1};
        const int per_sm = plan_blocks_per_sm(bits, group, kind, nb, p);
        const int fill = nb == 1 ? STREAM_FILL : STREAM_FILL_WIDE;
        const int64_t blocks = row_blocks * ((k_tiles + slice - 1) / slice);
        if (per_sm >= fill && blocks >= (int64_t)fill * sms) return p;
    }
    return (cuda_affine_plan){0, 0};
}

static void choose_plans(cuda_affine *a) {
    for (int nb = 1; nb <= 4; nb *= 2) {
        const cuda_affine_plan best = best_plan(a->bits, a->group, a->sb_kind, nb, row_blocks(a), a->k_tiles);
        for (int n = 1; n <= MAX_N; n++)
            if (nb_of(n) == nb) a->plan[n] = (unsigned char)(best.slice / 4 | best.stream << 5);
    }
}

extern "C" cuda_affine_plan cuda_affine_plan_for(const cuda_affine *w, int64_t n) {
    cuda_affine_plan p = {4, 0};
    if (n >= 1 && n <= MAX_N && w->plan[n]) p = (cuda_affine_plan){(w->plan[n] & 31) * 4, w->plan[n] >> 5};
    return p;
}

extern "C" bool cuda_affine_compatible(const cuda_affine *a, const cuda_affine *b) {
    return a->cols == b->cols && a->bits == b->bits && a->group == b->group && a->sb_kind == b->sb_kind;
}

/* Counters first, GEMV_COUNTERS of them whatever the product (one per block of row
 * tiles), then the partial sums [split][n][row tiles x 16]. The counters stay where they
 * are for every product that shares the buffer: partial sums of a product of few blocks
 * must never land on the counters of a later one of many (a counter left nonzero makes
 * its block's rows unwritten). */
#define GEMV_COUNTERS 16384 /* blocks of 128 rows: products of up to 2 Mi rows */

static size_t work_bytes(int64_t tiles, int64_t split, int64_t n) {
    if (split <= 1) return 0;
    return (size_t)GEMV_COUNTERS * 4 + (size_t)split * (size_t)n * (size_t)tiles * 16 * 4;
}

extern "C" size_t cuda_affine_plan_work_size(const cuda_affine *w, int64_t n, cuda_affine_plan p) {
    return work_bytes(w->row_tiles, cuda_affine_plan_split(w, p), n);
}

extern "C" size_t cuda_affine_work_size(const cuda_affine *w, int64_t n) {
    return cuda_affine_plan_work_size(w, n, cuda_affine_plan_for(w, n));
}

/* One launch over a set with a given plan. */
static cudaError_t gemv_launch(const affine_set *set, const cuda_affine *w0, const float *x, const float *up, int64_t n,
                               void *work, cudaStream_t s, unsigned flags, cuda_affine_plan p) {
    const int64_t split = cuda_affine_plan_split(w0, p); /* 0 for a slice of 0: refused below */
    if (!plan_valid(n, p) || split > 65535 || (split > 1 && !work) || ((uintptr_t)x & 15) || ((uintptr_t)up & 15))
        return cudaErrorInvalidValue;
    const int nb = nb_of(n), blocks = affine_set_blocks(set);
    const int smem = plan_smem(w0->bits, w0->group, w0->sb_kind, nb, p);
    if (smem > SMEM_MAX || (split > 1 && blocks > GEMV_COUNTERS)) return cudaErrorInvalidValue;
    unsigned *count = (unsigned *)work;
    float *part = split > 1 ? (float *)((char *)work + (size_t)GEMV_COUNTERS * 4) : NULL;

    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)blocks, (unsigned)split, 1);
    cfg.blockDim = dim3(NW * 32, 1, 1);
    cfg.dynamicSmemBytes = (size_t)smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    if (flags & CUDA_AFFINE_PDL) {
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, pick(w0->bits, w0->group, nb, p.stream != 0), *set, x, up, (int)n, w0->sb_kind,
                              (int)w0->cols, (int)w0->k_tiles, p.slice, affine_set_tiles(set), part, count,
                              (int)(p.stream == 2));
}

extern "C" bool cuda_affine_plan_fits(const cuda_affine *w, int64_t n, cuda_affine_plan p) {
    return plan_valid(n, p) && plan_smem(w->bits, w->group, w->sb_kind, nb_of(n), p) <= SMEM_MAX;
}

extern "C" cudaError_t cuda_affine_gemv_plan(float *y, const float *x, int64_t n, const cuda_affine *w,
                                             void *work, cudaStream_t s, unsigned flags, cuda_affine_plan p) {
    affine_set set;
    affine_set_of(&set, &y, &w, 1);
    return gemv_launch(&set, w, x, NULL, n, work, s, flags, p);
}

extern "C" cudaError_t cuda_affine_gemv(float *y, const float *x, int64_t n, const cuda_affine *w, void *work,
                                        cudaStream_t s, unsigned flags) {
    return cuda_affine_gemv_plan(y, x, n, w, work, s, flags, cuda_affine_plan_for(w, n));
}

extern "C" cudaError_t cuda_affine_gemv_swiglu(float *y, const float *gate, const float *up, int64_t n,
                                               const cuda_affine *w, void *work, cudaStream_t s, unsigned flags) {
    affine_set set;
    affine_set_of(&set, &y, &w, 1);
    return gemv_launch(&set, w, gate, up, n, work, s, flags, cuda_affine_plan_for(w, n));
}

/* The plan of a set's launch: the best for the set's rows as one matrix. */
static cuda_affine_plan set_plan(const affine_set *set, const cuda_affine *w0, int64_t n) {
    return best_plan(w0->bits, w0->group, w0->sb_kind, nb_of(n), affine_set_blocks(set), w0->k_tiles);
}

extern "C" size_t cuda_affine_gemv_set_work_size(const cuda_affine *const *w, int k, int64_t n) {
    affine_set set;
    float *ys[CUDA_AFFINE_SET] = {NULL, NULL, NULL, NULL};
    if (n < 1 || n > MAX_N || !affine_set_of(&set, ys, w, k)) return 0;
    const cuda_affine_plan p = set_plan(&set, w[0], n);
    return work_bytes(affine_set_tiles(&set), cuda_affine_plan_split(w[0], p), n);
}

extern "C" cudaError_t cuda_affine_gemv_set(float *const *ys, const cuda_affine *const *w, int k, const float *x,
                                            int64_t n, void *work, size_t work_size, cudaStream_t s, unsigned flags) {
    affine_set set;
    if (n < 1 || n > MAX_N || !affine_set_of(&set, ys, w, k)) return cudaErrorInvalidValue;
    const cuda_affine_plan p = set_plan(&set, w[0], n);
    if (work_bytes(affine_set_tiles(&set), cuda_affine_plan_split(w[0], p), n) > work_size)
        return cudaErrorInvalidValue;
    return gemv_launch(&set, w[0], x, NULL, n, work, s, flags, p);
}

/* ==== Rows of W: embeddings ==== */

/* The (scale, bias) of row r16 of row tile rt, group g, in the sb layout of affine.h. */
__device__ __forceinline__ void group_sb(const cuda_affine &w, int64_t rt, int r16, int64_t g, float &s, float &b) {
    const int gpb = groups_per_block(w.bits, w.group);
    sb_pair(w.sb, w.sb_kind, ((rt * w.group_blocks + g / gpb) * 8 + (r16 & 7)) * 2 * gpb + 2 * (g % gpb) + (r16 >> 3),
            s, b);
}

/* v[e] = s * q + b for the 4 adjacent columns 16m + 4t + e (e < 4) that a lane's code word
 * of mma step m holds (k_pack_codes' order), in fp32, the product and the sum rounded
 * apart, as the CPU reference does. */
__device__ __forceinline__ void word_values(float v[4], uint32_t word, int bits, int m, float s, float b) {
    const uint32_t mask = (1u << bits) - 1u;
#pragma unroll
    for (int e4 = 0; e4 < 4; e4++) {
        const int kp = e4 >> 1, e = e4 & 1;
        const int pos = bits == 4 ? 4 * e + 2 * (m & 1) + kp : 2 * e + kp;
        v[e4] = __fadd_rn(__fmul_rn(s, (float)((word >> (bits * pos)) & mask)), b);
    }
}

/* v[e] = W[row, c + e], e < 4, c a multiple of 4 (one code word, one group). */
__device__ static void affine_quad(float v[4], const cuda_affine &w, int64_t row, int64_t c) {
    const int tc = tile_cols(w.bits);
    const int64_t rt = row >> 4, kt = c / tc;
    const int r16 = (int)(row & 15), cc = (int)(c % tc), m = cc >> 4, t = (cc >> 2) & 3;
    const int j = (w.bits == 4 ? m >> 1 : m) + (r16 >= 8 ? 2 : 0);
    const uint32_t word = w.codes[((rt * w.k_tiles + kt) * 32 + 4 * (r16 & 7) + t) * 4 + j];
    float s, b;
    group_sb(w, rt, r16, c / w.group, s, b);
    word_values(v, word, w.bits, m, s, b);
}

__global__ static void k_rows(float *y, const cuda_affine w, const int32_t *ids, int64_t m) {
    trace_scope tr(TR_ROWS);
    const int64_t quads = w.cols / 4;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t tok = i / quads, c = 4 * (i % quads);
        const int32_t id = ids[tok];
        if (id < 0) continue; /* a row the caller fills: left as it is */
        float v[4];
        affine_quad(v, w, id, c);
        float *yr = y + tok * w.cols + c;
#pragma unroll
        for (int e = 0; e < 4; e++) yr[e] = v[e];
    }
}

extern "C" cudaError_t cuda_affine_rows(float *y, const cuda_affine *w, const int32_t *ids, int64_t n,
                                        cudaStream_t s) {
    const int64_t m = n * (w->cols / 4);
    if (m <= 0) return cudaSuccess;
    k_rows<<<blocks_for(m), THREADS, 0, s>>>(y, *w, ids, m);
    return cudaGetLastError();
}

/* Rows row0 .. row0 + rows - 1 of W as fp16 (y[row - row0, col]), one tile a warp: each
 * lane reads its 16 bytes of the tile (the warp the whole 512) and writes, per word and
 * mma step, the 4 adjacent columns it holds of one row as 8 bytes (a warp's store fills
 * whole 32-byte sectors). Values as affine_quad forms them. Measured on the 8B shapes:
 * 2.0 TB/s of fp16 written; four tiles a warp with their loads in flight together ran
 * slower (fewer warps). */
template <int BITS>
__device__ __forceinline__ void dequant_tile(__half *y, const cuda_affine &w, int64_t row0, int64_t rows, int64_t tile,
                                             uint4 q4, int lane) {
    const int r = lane >> 2, t = lane & 3;
    const int64_t rt = (row0 >> 4) + tile / w.k_tiles, kt = tile % w.k_tiles;
    const uint32_t words[4] = {q4.x, q4.y, q4.z, q4.w};
    const int tc = BITS == 4 ? 64 : 32;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int r16 = r + (j >= 2 ? 8 : 0);
        const int64_t out = rt * 16 + r16 - row0;
        if (out < 0 || out >= rows) continue;
#pragma unroll
        for (int mm = 0; mm < (BITS == 4 ? 2 : 1); mm++) {
            const int m = BITS == 4 ? 2 * (j & 1) + mm : (j & 1);
            const int64_t c = kt * tc + 16 * m + 4 * t;
            if (c >= w.cols) continue;
            float s, b, v[4];
            group_sb(w, rt, r16, c >> (31 - __clz((int)w.group)), s, b); /* groups are powers of 2 */
            word_values(v, words[j], BITS, m, s, b);
            const __half2 lo = __floats2half2_rn(v[0], v[1]), hi = __floats2half2_rn(v[2], v[3]);
            *(uint2 *)(y + out * w.cols + c) = make_uint2(h2_bits(lo), h2_bits(hi));
        }
    }
}

template <int BITS>
__global__ static void __launch_bounds__(256) k_dequant(__half *y, const cuda_affine w, int64_t row0, int64_t rows,
                                                        int64_t tiles) {
    const int64_t tile = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    if (tile >= tiles) return;
    const int lane = threadIdx.x & 31;
    const uint4 q4 = ((const uint4 *)w.codes)[((row0 >> 4) * w.k_tiles + tile) * 32 + lane];
    dequant_tile<BITS>(y, w, row0, rows, tile, q4, lane);
}

extern "C" cudaError_t cuda_affine_dequant(__half *y, const cuda_affine *w, int64_t row0, int64_t rows,
                                           cudaStream_t s) {
    if (row0 < 0 || rows < 0 || row0 + rows > w->rows) return cudaErrorInvalidValue;
    if (rows == 0) return cudaSuccess;
    const int64_t tiles = ((row0 + rows + 15) / 16 - row0 / 16) * w->k_tiles;
    const unsigned blocks = (unsigned)((tiles + 7) / 8);
    if (w->bits == 4) k_dequant<4><<<blocks, 256, 0, s>>>(y, *w, row0, rows, tiles);
    else k_dequant<8><<<blocks, 256, 0, s>>>(y, *w, row0, rows, tiles);
    return cudaGetLastError();
}

/* ==== Reference ==== */

__device__ static double load_scale(const void *p, int64_t i, dtype t) {
    if (t == DTYPE_F32) return (double)((const float *)p)[i];
    const uint16_t u = ((const uint16_t *)p)[i];
    return t == DTYPE_BF16 ? (double)__bfloat162float(__ushort_as_bfloat16(u)) : (double)__half2float(__ushort_as_half(u));
}

/* One thread per output: y[tok, row] = sum_c (s * q + b) * x[tok, c] in double. */
__global__ static void k_ref(double *y, const float *x, int64_t n, const uint32_t *data, const void *scales,
                             const void *biases, dtype st, int64_t rows, int64_t cols, int bits, int64_t group) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n * rows) return;
    const int64_t tok = i / rows, row = i % rows, groups = cols / group;
    double sum = 0.0;
    for (int64_t g = 0; g < groups; g++) {
        const double s = load_scale(scales, row * groups + g, st);
        const double b = load_scale(biases, row * groups + g, st);
        for (int64_t c = g * group; c < (g + 1) * group; c++) {
            const double q = (double)raw_code(data, rows, cols, bits, row, c);
            sum += (s * q + b) * (double)x[tok * cols + c];
        }
    }
    y[i] = sum;
}

extern "C" cudaError_t cuda_affine_ref(double *y, const float *x, int64_t n, const matview *w, cudaStream_t s) {
    const int64_t m = n * w->rows;
    k_ref<<<(unsigned)((m + 127) / 128), 128, 0, s>>>(y, x, n, (const uint32_t *)w->data, w->scales, w->biases,
                                                      w->scale_type, w->rows, w->cols, w->quant_bits, w->group);
    return cudaGetLastError();
}

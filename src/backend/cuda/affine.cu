/*
 * affine.cu - MLX affine weights on the GPU: the load-time repack into the tiled layout of
 * affine.h, the decode product y[n, rows] = x[n, cols] @ W^T for n = 1..8, and a double
 * reference for the tests.
 *
 * The product is bound by memory: every weight byte is read once, and at n <= 8 a byte
 * feeds at most 16 flops. Each warp takes a chunk of 8 (or 4 x 2 row tiles) 512-byte
 * tiles: it issues all their 16-byte code loads and the scale loads at once, then, while
 * they are in flight, copies the chunk's x into its own shared memory as fp16 B fragments
 * (one LDS.128 per lane and two mma steps later), then turns each code word into fp16
 * with one LOP3 (mask | 0x6400) and two half2 operations per pair (the code, then
 * s * q + b) and lets mma.m16n8k16 do the multiply-adds in fp32 with the tokens as its
 * 8 columns (columns of absent tokens are computed and dropped). A block of 8 warps owns
 * 16 or 32 rows and splits K among its warps; on long rows K is also split across
 * blocks, and the last block of a row block to finish adds the partial sums in a fixed
 * order (no atomics on y, so results do not depend on timing).
 *
 * Measured (H200, Llama-3.1-8B 4-bit g64, n = 1, graph + PDL): about 52% of the
 * device-to-device copy bandwidth; the kernel is latency- and issue-bound, not DRAM-bound
 * (tests/cuda/NOTES.md).
 *
 * Not here: the prefill product, dense weights.
 */
#include "backend/cuda/affine.h"

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include <stdio.h>
#include <string.h>

#define NW 8                  /* warps per block */
#define TILE_WORDS 128        /* 512 bytes: 16 rows of one tile */
#define MAX_N 8               /* columns of one mma: tokens per product */

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

__host__ __device__ static int tile_cols(int bits) { return 4096 / (16 * bits); } /* 64 at 4 bits, 32 at 8 */
static int groups_per_block(int bits, int64_t group) { return bits == 4 && group == 32 ? 2 : 1; }

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

__device__ static uint16_t to_f16_bits(const uint16_t *p, int64_t i, int bf16) {
    const float f = bf16 ? __bfloat162float(__ushort_as_bfloat16(p[i])) : __half2float(__ushort_as_half(p[i]));
    return __half_as_ushort(__float2half_rn(f));
}

/* One word of sb per thread: [row_tiles][group_blocks][8][2 * gpb], word 2 * jg + h of
 * row r is half2 (scale, bias) of row r + 8h, group gb * gpb + jg. */
__global__ static void k_pack_sb(uint32_t *out, const uint16_t *scales, const uint16_t *biases,
                                 int bf16, int64_t rows, int64_t groups, int gpb,
                                 int64_t group_blocks, int64_t words) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= words) return;
    const int wl = 2 * gpb;
    const int64_t rt = i / (group_blocks * 8 * wl);
    const int64_t gb = (i / (8 * wl)) % group_blocks;
    const int r = (int)(i / wl) % 8, w = (int)(i % wl);
    const int64_t row = rt * 16 + r + 8 * (w & 1), g = gb * gpb + w / 2;
    uint32_t v = 0;
    if (row < rows && g < groups) {
        const int64_t k = row * groups + g;
        v = (uint32_t)to_f16_bits(scales, k, bf16) | (uint32_t)to_f16_bits(biases, k, bf16) << 16;
    }
    out[i] = v;
}

static int check_view(const matview *w, char *err, size_t err_size) {
    const char *why = NULL;
    if (w->quant_bits != 4 && w->quant_bits != 8) why = "bits must be 4 or 8";
    else if (w->group != 32 && w->group != 64 && w->group != 128) why = "group must be 32, 64 or 128";
    else if (w->rows < 1 || w->cols < w->group || w->cols % w->group) why = "cols must be a multiple of the group";
    else if (w->scale_type != DTYPE_F16 && w->scale_type != DTYPE_BF16) why = "scales must be F16 or BF16";
    else if ((double)w->rows * (double)w->cols * w->quant_bits / 32 >= 2147483647.0) why = "too large";
    if (!why) return 0;
    snprintf(err, err_size, "cuda affine: %lld x %lld, %d bits, group %lld: %s", (long long)w->rows,
             (long long)w->cols, w->quant_bits, (long long)w->group, why);
    return -1;
}

typedef void (*gemv_kernel)(float *, const float *, int, const uint4 *, const uint32_t *, int, int,
                            int, int, int, int, float *, unsigned *);
static gemv_kernel pick(int bits, int64_t group, int rb);
static size_t gemv_smem(int bits, int rb, int64_t n);

/* The tiled copy of w, whose pointers are device memory. */
static int pack(cuda_affine *out, const matview *w, cudaStream_t s, char *err, size_t err_size) {
    cuda_affine a;
    memset(&a, 0, sizeof a);
    a.rows = w->rows;
    a.cols = w->cols;
    a.bits = w->quant_bits;
    a.group = w->group;
    a.row_tiles = (w->rows + 15) / 16;
    const int tc = tile_cols(a.bits), gpb = groups_per_block(a.bits, a.group);
    a.k_tiles = (w->cols + tc - 1) / tc;
    a.group_blocks = a.k_tiles * tc / a.group / gpb;
    if (a.group_blocks < 1) a.group_blocks = 1;
    const int64_t code_words = a.row_tiles * a.k_tiles * TILE_WORDS;
    const int64_t sb_words = a.row_tiles * a.group_blocks * 16 * gpb;
    a.bytes = (size_t)(code_words + sb_words) * 4;
    CUDA_TRY(cudaMalloc((void **)&a.codes, (size_t)code_words * 4));
    CUDA_TRY(cudaMalloc((void **)&a.sb, (size_t)sb_words * 4));
    k_pack_codes<<<(unsigned)((code_words + 255) / 256), 256, 0, s>>>(
        a.codes, (const uint32_t *)w->data, w->rows, w->cols, a.bits, a.k_tiles, code_words);
    CUDA_TRY(cudaGetLastError());
    k_pack_sb<<<(unsigned)((sb_words + 255) / 256), 256, 0, s>>>(
        a.sb, (const uint16_t *)w->scales, (const uint16_t *)w->biases, w->scale_type == DTYPE_BF16,
        w->rows, w->cols / w->group, gpb, a.group_blocks, sb_words);
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(cudaStreamSynchronize(s));
    for (int rb = 1; rb <= 2; rb++) /* the x fragments of n = 8 can pass 48 KB */
        CUDA_TRY(cudaFuncSetAttribute(pick(a.bits, a.group, rb), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)gemv_smem(a.bits, rb, MAX_N)));
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

extern "C" int cuda_affine_upload(cuda_affine *out, const matview *w, cudaStream_t s, char *err,
                                  size_t err_size) {
    memset(out, 0, sizeof *out);
    if (check_view(w, err, err_size)) return -1;
    const size_t code_bytes = (size_t)(w->rows * w->cols * w->quant_bits / 8);
    const size_t sb_bytes = (size_t)(w->rows * (w->cols / w->group)) * 2;
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

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t *>(&h); }
__device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *reinterpret_cast<__half2 *>(&u); }

/* (w & mask) | 0x64006400 in one LOP3 (the compiler would split it in two). */
template <uint32_t MASK> __device__ __forceinline__ uint32_t mask_or_magic(uint32_t w) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(w), "n"(MASK), "r"(0x64006400u));
    return r;
}

/* Four A-register half2 (k-pairs of two mma steps) of one row from a 4-bit word:
 * (n0, n4), (n1, n5), (n2, n6), (n3, n7), each s * q + b; sb is half2 (s, b). */
__device__ __forceinline__ void dequant4(uint32_t a[4], uint32_t w, __half2 sb) {
    const uint32_t w8 = w >> 8;
    const __half2 s = __low2half2(sb), b = __high2half2(sb);
    const __half2 k1024 = __float2half2_rn(1024.0f), k16th = __float2half2_rn(1.0f / 16.0f),
                  km64 = __float2half2_rn(-64.0f);
    const __half2 q0 = __hsub2(bits_h2(mask_or_magic<0x000f000fu>(w)), k1024);
    const __half2 q1 = __hfma2(bits_h2(mask_or_magic<0x00f000f0u>(w)), k16th, km64);
    const __half2 q2 = __hsub2(bits_h2(mask_or_magic<0x000f000fu>(w8)), k1024);
    const __half2 q3 = __hfma2(bits_h2(mask_or_magic<0x00f000f0u>(w8)), k16th, km64);
    a[0] = h2_bits(__hfma2(q0, s, b));
    a[1] = h2_bits(__hfma2(q1, s, b));
    a[2] = h2_bits(__hfma2(q2, s, b));
    a[3] = h2_bits(__hfma2(q3, s, b));
}

/* Two A-register half2 of one row from an 8-bit word: (b0, b2), (b1, b3). */
__device__ __forceinline__ void dequant8(uint32_t a[2], uint32_t w, __half2 sb) {
    const __half2 s = __low2half2(sb), b = __high2half2(sb);
    const __half2 k1024 = __float2half2_rn(1024.0f);
    const __half2 q0 = __hsub2(bits_h2(__byte_perm(w, 0x64646464u, 0x4240)), k1024);
    const __half2 q1 = __hsub2(bits_h2(__byte_perm(w, 0x64646464u, 0x4341)), k1024);
    a[0] = h2_bits(__hfma2(q0, s, b));
    a[1] = h2_bits(__hfma2(q1, s, b));
}

/* c[16 rows, 8 tokens] += A[16, 16] @ B[16, 8], fp16 in, fp32 accumulate. */
__device__ __forceinline__ void mma16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 load_stream(const uint4 *p) { return __ldcs(p); }

/* Programmatic dependent launch: let the next kernel start; wait for the previous one. */
__device__ __forceinline__ void pdl_launch_next() { asm volatile("griddepcontrol.launch_dependents;"); }
__device__ __forceinline__ void pdl_wait_prev() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

/* Scale-bias words of one tile for one lane: rows r and r + 8 of gpb groups. */
template <int GPB> struct sb_words;
template <> struct sb_words<1> {
    uint2 v;
    __device__ __forceinline__ void load(const uint32_t *p) { v = __ldg((const uint2 *)p); }
    __device__ __forceinline__ uint32_t at(int jg, int h) const { return h ? v.y : v.x; }
};
template <> struct sb_words<2> {
    uint4 v;
    __device__ __forceinline__ void load(const uint32_t *p) { v = __ldg((const uint4 *)p); }
    __device__ __forceinline__ uint32_t at(int jg, int h) const {
        return jg ? (h ? v.w : v.z) : (h ? v.y : v.x);
    }
};

/* acc += tile (16 rows) @ B for the tile's mma steps. cw: the lane's codes; sb: its scales;
 * bq[mp]: B registers of steps 2mp, 2mp + 1. */
template <int BITS, int GPB>
__device__ __forceinline__ void tile_mma(float acc[4], uint4 cw, const sb_words<GPB> &sb,
                                         const uint4 bq[]) {
    const uint32_t wr[2] = {cw.x, cw.y}, w8[2] = {cw.z, cw.w};
    if (BITS == 4) {
#pragma unroll
        for (int jj = 0; jj < 2; jj++) { /* steps 2jj, 2jj + 1 */
            uint32_t ar[4], a8[4];
            dequant4(ar, wr[jj], bits_h2(sb.at(GPB == 2 ? jj : 0, 0)));
            dequant4(a8, w8[jj], bits_h2(sb.at(GPB == 2 ? jj : 0, 1)));
            mma16816(acc, ar[0], a8[0], ar[1], a8[1], bq[jj].x, bq[jj].y);
            mma16816(acc, ar[2], a8[2], ar[3], a8[3], bq[jj].z, bq[jj].w);
        }
    } else {
        uint32_t ar[2], a8[2];
        dequant8(ar, wr[0], bits_h2(sb.at(0, 0)));
        dequant8(a8, w8[0], bits_h2(sb.at(0, 1)));
        mma16816(acc, ar[0], a8[0], ar[1], a8[1], bq[0].x, bq[0].y);
        dequant8(ar, wr[1], bits_h2(sb.at(0, 0)));
        dequant8(a8, w8[1], bits_h2(sb.at(0, 1)));
        mma16816(acc, ar[0], a8[0], ar[1], a8[1], bq[0].z, bq[0].w);
    }
}

/* Tiles per chunk (a warp's unit of work) and shared memory of the x fragments. */
__host__ __device__ constexpr int chunk_tiles(int rb) { return 8 / rb; }
static size_t gemv_smem(int bits, int rb, int64_t n) {
    return (size_t)NW * chunk_tiles(rb) * (bits == 4 ? 2 : 1) * 4 * (size_t)n * 16;
}

/* Blocks per SM the register budget is cut for: three (80 registers) where the codes and
 * scales in flight fit, else two. */
__host__ __device__ constexpr int min_blocks(int bits, int group, int rb) {
    return rb == 1 && !(bits == 4 && group == 32) ? 3 : 2;
}

template <int BITS> struct tile_shape {
    static constexpr int TC = BITS == 4 ? 64 : 32; /* columns of a tile */
    static constexpr int STEPS = TC / 16;          /* mma steps of a tile */
    static constexpr int MP = STEPS / 2;           /* B uint4 per lane and tile */
};

/* One chunk of U tiles starting at tile k0 of row tiles rt0 .. rt0 + RB - 1 for one warp
 * (FULL: all U tiles exist, so nothing is predicated). xs: the warp's x fragments,
 * [U][MP][ln] uint4; lane bl reads them (lanes of tokens >= n read token 0's: their
 * output columns are never stored). first: the warp's first chunk, which waits for the
 * previous kernel after issuing its weight loads. */
template <int BITS, int GROUP, int RB, bool FULL>
__device__ __forceinline__ void gemv_chunk(float (&acc)[RB][4], const uint4 *__restrict__ codes,
                                           const uint32_t *__restrict__ sbp, const float *__restrict__ x,
                                           int n, int cols, int row_tiles, int k_tiles, int group_blocks,
                                           int rt0, int k0, int cnt, uint4 *xs, int ln, int bl, bool first) {
    constexpr int TC = tile_shape<BITS>::TC, STEPS = tile_shape<BITS>::STEPS, MP = tile_shape<BITS>::MP;
    constexpr int GPB = (BITS == 4 && GROUP == 32) ? 2 : 1;
    constexpr int U = chunk_tiles(RB);
    /* group block of tile k: k >> SH */
    constexpr int SH = (GROUP * GPB == TC) ? 0 : (GROUP * GPB == 2 * TC) ? 1 : 2;
    const int lane = threadIdx.x & 31, r = lane >> 2;
    const uint4 *cp[RB];
    const uint32_t *sp[RB];
#pragma unroll
    for (int rb = 0; rb < RB; rb++) {
        const int rt = min(rt0 + rb, row_tiles - 1);
        cp[rb] = codes + ((size_t)rt * k_tiles + k0) * 32 + lane;
        sp[rb] = sbp + (((size_t)rt * group_blocks + (k0 >> SH)) * 8 + r) * 2 * GPB;
    }
    uint4 cw[U][RB];
    sb_words<GPB> sb[U][RB];
#pragma unroll
    for (int u = 0; u < U; u++) {
        if (FULL || u < cnt) {
#pragma unroll
            for (int rb = 0; rb < RB; rb++) {
                cw[u][rb] = load_stream(cp[rb] + u * 32);
                sb[u][rb].load(sp[rb] + (u >> SH) * 16 * GPB);
            }
        }
    }
    if (first) pdl_wait_prev();

    /* x of the chunk -> fp16 B fragments: float4 unit i = ((tok * U + u) * STEPS + m) * 4
     * + t holds columns (k0 + u) * TC + 16m + 4t .. +3 of token tok, and goes to half
     * m & 1 of uint4 (u, m / 2, lane 4 * tok + t). Columns past cols read as zero. */
    __syncwarp();
    const int units = n * U * STEPS * 4;
    const float *xc = x + (size_t)k0 * TC;
    const int lim = cols - k0 * TC;
    for (int i0 = lane; i0 < units; i0 += 4 * 32) {
        float4 v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int i = i0 + 32 * j, col = (i % (U * STEPS * 4)) * 4;
            v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (i < units && (FULL || col < lim))
                v[j] = __ldg((const float4 *)(xc + (size_t)(i / (U * STEPS * 4)) * cols + col));
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int i = i0 + 32 * j;
            if (i >= units) break;
            const int tt = i & 3, m = (i >> 2) % STEPS, u = (i / (4 * STEPS)) % U, tok = i / (4 * STEPS * U);
            uint2 h;
            h.x = h2_bits(__floats2half2_rn(v[j].x, v[j].y));
            h.y = h2_bits(__floats2half2_rn(v[j].z, v[j].w));
            ((uint2 *)(xs + (u * MP + m / 2) * ln + 4 * tok + tt))[m & 1] = h;
        }
    }
    __syncwarp();

    const uint4 *xb = xs + bl;
#pragma unroll
    for (int u = 0; u < U; u++) {
        if (FULL || u < cnt) {
            uint4 bq[MP];
#pragma unroll
            for (int mp = 0; mp < MP; mp++) bq[mp] = xb[(u * MP + mp) * ln];
#pragma unroll
            for (int rb = 0; rb < RB; rb++) tile_mma<BITS, GPB>(acc[rb], cw[u][rb], sb[u][rb], bq);
        }
    }
}

/* y[n, rows] = x[n, cols] @ W^T. Block: RB row tiles (16 * RB rows) x one K slice of
 * blockIdx.y. Each warp takes chunks of U column tiles: it issues the U * RB 16-byte code
 * loads, then copies the chunk's x (n tokens) into its own shared memory as fp16 B
 * fragments while they are in flight, then dequantizes and multiplies. The warps' sums
 * are added through shared memory; with a K split, the last block of a row block adds
 * the partial sums in order and zeroes them (the work buffer stays zero). */
template <int BITS, int GROUP, int RB>
__global__ static void __launch_bounds__(NW * 32, min_blocks(BITS, GROUP, RB))
k_affine_gemv(float *__restrict__ y, const float *__restrict__ x, int n, const uint4 *__restrict__ codes,
       const uint32_t *__restrict__ sbp, int rows, int cols, int row_tiles, int k_tiles,
       int group_blocks, int split, float *__restrict__ part, unsigned *__restrict__ count) {
    constexpr int U = chunk_tiles(RB);
    constexpr int MP = tile_shape<BITS>::MP;
    __shared__ float red[NW][RB * 16][MAX_N];
    __shared__ int last;
    extern __shared__ uint4 xs_all[]; /* per warp [U][MP][4n] uint4 */

    pdl_launch_next();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r = lane >> 2, t = lane & 3;
    const int rt0 = blockIdx.x * RB;
    const int ln = 4 * n;               /* lanes holding a token */
    const int bl = lane < ln ? lane : t; /* the lane whose x fragments this lane reads */
    uint4 *xs = xs_all + (size_t)warp * U * MP * ln;
    float acc[RB][4];
#pragma unroll
    for (int rb = 0; rb < RB; rb++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[rb][i] = 0.0f;

    /* K is cut in chunks of U consecutive tiles; warp w of split s takes chunks
     * s * NW + w, stepping NW * split. Inside a chunk every address is a constant offset
     * from a base pointer (U is a multiple of 4, so the group block of tile u is the
     * chunk's plus u >> SH); only a last, partial chunk is predicated. */
    const int chunks = (k_tiles + U - 1) / U;
    const int cstep = NW * split;
    for (int c = blockIdx.y * NW + warp, it = 0; c < chunks; c += cstep, it++) {
        const int k0 = c * U, cnt = min(U, k_tiles - k0);
        if (cnt == U)
            gemv_chunk<BITS, GROUP, RB, true>(acc, codes, sbp, x, n, cols, row_tiles, k_tiles, group_blocks,
                                              rt0, k0, cnt, xs, ln, bl, it == 0);
        else
            gemv_chunk<BITS, GROUP, RB, false>(acc, codes, sbp, x, n, cols, row_tiles, k_tiles, group_blocks,
                                               rt0, k0, cnt, xs, ln, bl, it == 0);
    }
    pdl_wait_prev(); /* warps with no tiles: y and part are written only after the wait */

    /* c0, c1: row r, tokens 2t, 2t+1; c2, c3: row r + 8 */
#pragma unroll
    for (int rb = 0; rb < RB; rb++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            red[warp][rb * 16 + r + (i >> 1) * 8][2 * t + (i & 1)] = acc[rb][i];
    __syncthreads();
    const int rows_p = row_tiles * 16;
    for (int idx = threadIdx.x; idx < RB * 16 * MAX_N; idx += blockDim.x) {
        const int rl = idx % (RB * 16), tok = idx / (RB * 16), row = rt0 * 16 + rl;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) v += red[w][rl][tok];
        if (tok >= n || row >= rows_p) continue;
        if (split == 1) {
            if (row < rows) y[(size_t)tok * rows + row] = v;
        } else {
            part[((size_t)blockIdx.y * n + tok) * rows_p + row] = v;
        }
    }
    if (split == 1) return;

    /* The last block of this row block to finish adds the splits in order, and leaves the
     * partial sums and the counter zero for the next product using this work buffer. */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&count[blockIdx.x], 1u) == (unsigned)split - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int idx = threadIdx.x; idx < RB * 16 * MAX_N; idx += blockDim.x) {
        const int rl = idx % (RB * 16), tok = idx / (RB * 16), row = rt0 * 16 + rl;
        if (tok >= n || row >= rows_p) continue;
        float v = 0.0f;
        for (int s = 0; s < split; s++) {
            float *p = part + ((size_t)s * n + tok) * rows_p + row;
            v += __ldcg(p);
            *p = 0.0f;
        }
        if (row < rows) y[(size_t)tok * rows + row] = v;
    }
    if (threadIdx.x == 0) count[blockIdx.x] = 0;
}


template <int BITS, int GROUP> static gemv_kernel pick_rb(int rb) {
    return rb == 2 ? k_affine_gemv<BITS, GROUP, 2> : k_affine_gemv<BITS, GROUP, 1>;
}

static gemv_kernel pick(int bits, int64_t group, int rb) {
    if (bits == 4) {
        if (group == 32) return pick_rb<4, 32>(rb);
        if (group == 64) return pick_rb<4, 64>(rb);
        return pick_rb<4, 128>(rb);
    }
    if (group == 32) return pick_rb<8, 32>(rb);
    if (group == 64) return pick_rb<8, 64>(rb);
    return pick_rb<8, 128>(rb);
}

static int64_t row_blocks(const cuda_affine *w, cuda_affine_plan p) {
    return (w->row_tiles + p.rb - 1) / p.rb;
}

/* Counters first (one per row block, 256-byte aligned), then the partial sums. */
static size_t counter_bytes(const cuda_affine *w, cuda_affine_plan p) {
    return ((size_t)row_blocks(w, p) * 4 + 255) & ~(size_t)255;
}

extern "C" size_t cuda_affine_plan_work_size(const cuda_affine *w, int64_t n, cuda_affine_plan p) {
    if (p.split <= 1) return 0;
    return counter_bytes(w, p) + (size_t)p.split * (size_t)n * (size_t)w->row_tiles * 16 * 4;
}

/* From the plan sweep of bench_affine on an H200 (Llama-3.1-8B shapes, 4-bit g64): one
 * row tile a block (three blocks per SM, the most bytes in flight) wins at n = 1 on every
 * shape but down; two row tiles a block (the x fragments a warp prepares feed twice the
 * weights) win from n = 2 on tall matrices (gate/up, head), from n = 4 on all but k/v,
 * and at any n on long rows (down, 4096 x 14336). Splitting K across blocks pays only
 * when every warp still keeps two chunks (down again). */
extern "C" cuda_affine_plan cuda_affine_plan_for(const cuda_affine *w, int64_t n) {
    cuda_affine_plan p = {1, 1};
    if (w->row_tiles > 64 && (n >= 4 || (n >= 2 && w->row_tiles >= 512) || w->k_tiles >= 128)) p.rb = 2;
    const int64_t chunks = (w->k_tiles + chunk_tiles(p.rb) - 1) / chunk_tiles(p.rb);
    if (chunks >= 4 * NW) p.split = 2;
    return p;
}

extern "C" size_t cuda_affine_work_size(const cuda_affine *w, int64_t n) {
    return cuda_affine_plan_work_size(w, n, cuda_affine_plan_for(w, n));
}

extern "C" cudaError_t cuda_affine_gemv_plan(float *y, const float *x, int64_t n,
                                             const cuda_affine *w, void *work, cudaStream_t s,
                                             unsigned flags, cuda_affine_plan p) {
    if (n < 1 || n > MAX_N || (p.rb != 1 && p.rb != 2) || p.split < 1 || p.split > 64 ||
        (p.split > 1 && !work))
        return cudaErrorInvalidValue;
    unsigned *count = (unsigned *)work;
    float *part = p.split > 1 ? (float *)((char *)work + counter_bytes(w, p)) : NULL;

    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)row_blocks(w, p), (unsigned)p.split, 1);
    cfg.blockDim = dim3(NW * 32, 1, 1);
    cfg.dynamicSmemBytes = gemv_smem(w->bits, p.rb, n);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    if (flags & CUDA_AFFINE_PDL) {
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, pick(w->bits, w->group, p.rb), y, x, (int)n,
                              (const uint4 *)w->codes, (const uint32_t *)w->sb, (int)w->rows,
                              (int)w->cols, (int)w->row_tiles, (int)w->k_tiles,
                              (int)w->group_blocks, p.split, part, count);
}

extern "C" cudaError_t cuda_affine_gemv(float *y, const float *x, int64_t n, const cuda_affine *w,
                                        void *work, cudaStream_t s, unsigned flags) {
    return cuda_affine_gemv_plan(y, x, n, w, work, s, flags, cuda_affine_plan_for(w, n));
}

/* ==== Reference ==== */

__device__ static double load_scale(const void *p, int64_t i, int bf16) {
    const uint16_t u = ((const uint16_t *)p)[i];
    return bf16 ? (double)__bfloat162float(__ushort_as_bfloat16(u)) : (double)__half2float(__ushort_as_half(u));
}

/* One thread per output: y[tok, row] = sum_c (s * q + b) * x[tok, c] in double. */
__global__ static void k_ref(double *y, const float *x, int64_t n, const uint32_t *data,
                             const void *scales, const void *biases, int bf16, int64_t rows,
                             int64_t cols, int bits, int64_t group) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n * rows) return;
    const int64_t tok = i / rows, row = i % rows, groups = cols / group;
    double sum = 0.0;
    for (int64_t g = 0; g < groups; g++) {
        const double s = load_scale(scales, row * groups + g, bf16);
        const double b = load_scale(biases, row * groups + g, bf16);
        for (int64_t c = g * group; c < (g + 1) * group; c++) {
            const double q = (double)raw_code(data, rows, cols, bits, row, c);
            sum += (s * q + b) * (double)x[tok * cols + c];
        }
    }
    y[i] = sum;
}

extern "C" cudaError_t cuda_affine_ref(double *y, const float *x, int64_t n, const matview *w,
                                       cudaStream_t s) {
    const int64_t m = n * w->rows;
    k_ref<<<(unsigned)((m + 127) / 128), 128, 0, s>>>(y, x, n, (const uint32_t *)w->data, w->scales,
                                                      w->biases, w->scale_type == DTYPE_BF16, w->rows,
                                                      w->cols, w->quant_bits, w->group);
    return cudaGetLastError();
}

/*
 * affine_gemm.cu - the prefill product y[n, rows] = x[n, cols] @ W^T of an affine matrix
 * for many rows of x, on the tensor cores, reading affine.h's tiled layout directly (no
 * dequantized copy of W).
 *
 * Numerics are the decode product's (affine.h): the codes go to the tensor cores as exact
 * fp16 integers, x as two fp16 parts hi + lo (every k-step takes two mma), sums per group
 * in fp32, and s * sum(q x) + b * sum(x) added in fp32. Rounding x to fp16 once instead
 * is about 25% faster and moved the fixtures' logits by up to 6e-3 relative against
 * transformers (bound 2e-3), so it is not offered.
 *
 * First x is staged once per product (k_stage_x): each 64-column stage of a
 * token row is permuted so that the 16 values one lane feeds to the mma's B operand over
 * the stage's four k-steps (columns 16m + 4t .. 16m + 4t + 3, m = 0..3) sit in two
 * 16-byte units, and the fp32 sums of x per group go beside it.
 *
 * A block of 8 warps computes 128 rows of W (8 row tiles) x 128 tokens. Stages of 64
 * columns (one 4-bit tile, two 8-bit tiles) with their (scale, bias) blocks and sums of x
 * stream through shared memory in a ring of GM_STAGES with cp.async, so loads of later
 * stages overlap the products of this one and nothing in the inner loop waits on global
 * memory. A warp owns 2 row tiles x 64 tokens: per k-step it turns its codes into exact
 * fp16 integers (affine_device.cuh) and multiplies them by 8 token fragments, hi and lo
 * (32 mma); at the end of each group it scales the group's sums into its accumulators.
 * With fewer than 128 tokens (the FEW kernels) fragments past n are neither loaded nor
 * multiplied, so a product of a few rows (the decode steps of many sequences) streams the
 * weights instead of computing empty tiles; the full kernels keep the unguarded loop.
 *
 * A launch too small to fill the device splits K (choose_splits): at n <= 128 an 8B
 * model's 4096-row products make 32 blocks for 132 SMs.
 *
 * On a compute capability 9.0 GPU (H100, H200) products of 64 rows or more take the
 * warpgroup kernel instead (k_affine_wgmma, sm_90a code): two warpgroups of a block each
 * compute 64 rows of W x 64 tokens with wgmma.m64n64k16, the codes as register A
 * fragments (the tiled layout's fragments are wgmma's too), x hi and lo as B from shared
 * memory in the 128-byte-swizzled K-major layout, staged with each 16 columns in the
 * order the codes stand in (k_stage_x<true>). The group's sums go to registers
 * asynchronously; at the group's end the warpgroup waits for them and scales them into
 * its accumulators as the mma kernel does. Same numerics; cuda_affine_gemm_set_path
 * forces either kernel for tests and benchmarks.
 */
#include "backend/cuda/affine.h"
#include "backend/cuda/affine_device.cuh"
#include "backend/cuda/cuda_internal.h"

#include <cuda_fp16.h>

#define GM_WARPS 8
#define GM_BM 128  /* rows of W a block computes: 8 row tiles */
#define GM_BN 128  /* tokens a block computes */
#define GM_BK 64   /* columns of a stage */
#define GM_STAGES 4
#define GM_SPLIT_MAX 8 /* splits of K a launch may take (choose_splits) */
#define GM_SPLIT_MIN 8 /* stages a split takes at least */

static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/* Columns of the staged x: whole stages. */
static int64_t staged_cols(const cuda_affine *w) { return round_up(w->cols, GM_BK); }
/* Groups of the staged x (the sums of x per group). */
static int64_t staged_groups(const cuda_affine *w) { return staged_cols(w) / w->group; }

/* ==== x in fp16, permuted per stage, and its sums per group ==== */

/* Position of column c (0..63) of a stage in the permuted stage row: lane t's values for
 * steps 2j and 2j + 1 are the 16-byte unit 2t + j. */
__device__ __forceinline__ int stage_pos(int c) {
    const int m = c >> 4, t = (c >> 2) & 3, e = c & 3;
    return (2 * t + (m >> 1)) * 8 + (m & 1) * 4 + e;
}

/* xh, xl [n_pad, kx] = x[n, cols] as two fp16 parts (x = hi + lo to about 22 bits),
 * permuted per stage, zero past the matrix and past n; xsum[g, n_pad] = the fp32 sum of x
 * over group g of each token (0 past the matrix and past n). One thread per four columns
 * of a token: a group's 8, 16 or 32 threads are aligned lanes of one warp (kx is a whole
 * number of stages and m of warps), which add their sums by shuffles.
 * WG: the warpgroup product's order instead of stage_pos: each 16 columns in the order of
 * the hardware k index the codes stand at (the tiled layout gives lane t columns 4t..4t+3
 * of a step where the A fragment holds k = 2t, 2t+1 and 2t+8, 2t+9), so that wgmma, which
 * reads B in k order from shared memory, pairs each x with its code. */
template <bool WG>
__global__ static void k_stage_x(__half *xh, __half *xl, float *xsum, const float *__restrict__ x, int64_t n,
                                 int64_t n_pad, int64_t cols, int64_t kx, int64_t group, int64_t m) {
    GRID_STRIDE(i, m) {
        const int64_t tok = i / (kx / 4), c = 4 * (i % (kx / 4));
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (tok < n && c < cols)
#pragma unroll
            for (int e = 0; e < 4; e++) v[e] = x[tok * cols + c + e];
        const __half2 h01 = __floats2half2_rn(v[0], v[1]), h23 = __floats2half2_rn(v[2], v[3]);
        const float2 f01 = __half22float2(h01), f23 = __half22float2(h23);
        const __half2 l01 = __floats2half2_rn(v[0] - f01.x, v[1] - f01.y);
        const __half2 l23 = __floats2half2_rn(v[2] - f23.x, v[3] - f23.y);
        if (WG) { /* columns 4t, 4t+1 of a step at k 2t, 2t+1; 4t+2, 4t+3 at 2t+8, 2t+9 */
            const int64_t o = tok * kx + (c & ~(int64_t)15) + ((c & 15) >> 1);
            *(__half2 *)(xh + o) = h01, *(__half2 *)(xh + o + 8) = h23;
            *(__half2 *)(xl + o) = l01, *(__half2 *)(xl + o + 8) = l23;
        } else {
            const int64_t o = tok * kx + (c & ~(int64_t)(GM_BK - 1)) + stage_pos((int)(c & (GM_BK - 1)));
            *(uint2 *)(xh + o) = make_uint2(h2_bits(h01), h2_bits(h23));
            *(uint2 *)(xl + o) = make_uint2(h2_bits(l01), h2_bits(l23));
        }
        float sx = (v[0] + v[1]) + (v[2] + v[3]);
        for (int off = 1; off < group / 4; off <<= 1) sx += __shfl_xor_sync(0xffffffffu, sx, off);
        if (c % group == 0) xsum[(c / group) * n_pad + tok] = sx;
    }
}

/* ==== The product ==== */

/* 16 bytes global -> shared, or zeros when !valid (src is not read). */
__device__ __forceinline__ void cp_async16_or_zero(void *dst, const void *src, bool valid) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}

/* A stage in shared memory, in 16-byte units: codes [8 row tiles][TPS tiles][32 lanes],
 * x hi and lo [BN tokens][8 units], the sb blocks [8 row tiles][SB_RT], the sums of x
 * [GPS groups][BN tokens]; whole KiB, so that x hi and lo of every ring slot start on a
 * 1024-byte boundary, as the warpgroup product's swizzled operands must. */
template <int BITS, int GROUP, int BN> struct gshape {
    static constexpr int TPS = BITS == 4 ? 1 : 2;                        /* W tiles per stage */
    static constexpr int TC = BITS == 4 ? 64 : 32;                       /* columns of a tile */
    static constexpr int GPB = (BITS == 4 && GROUP == 32) ? 2 : 1;       /* groups per sb block */
    static constexpr int SH = GROUP * GPB == TC ? 0 : GROUP * GPB == 2 * TC ? 1 : 2; /* sb block = tile >> SH */
    static constexpr int NSB = (TPS >> SH) > 0 ? (TPS >> SH) : 1;        /* sb blocks per stage */
    static constexpr int GPS = GROUP < GM_BK ? GM_BK / GROUP : 1;        /* groups whose sums a stage holds */
    static constexpr int GS = GROUP / 16;                                /* k-steps of a group */
    static constexpr int CODES = 0;
    static constexpr int XH = CODES + 8 * TPS * 32;
    static constexpr int XL = XH + BN * 8;
    static constexpr int SB = XL + BN * 8;
    static constexpr int SB_RT = NSB * GPB * 16 * 2 * 4 / 16;            /* units of a row tile's sb (fp32 pairs) */
    static constexpr int XSUM = SB + 8 * SB_RT;
    static constexpr int UNITS = (XSUM + GPS * BN * 4 / 16 + 63) / 64 * 64;
};

/* Dynamic shared memory of a kernel: its ring, and 1 KiB to align the ring's start. */
template <int BITS, int GROUP, int BN, int STAGES> static size_t ring_smem() {
    return (size_t)gshape<BITS, GROUP, BN>::UNITS * 16 * STAGES + 1024;
}

/* The first 1024-byte boundary in the dynamic shared memory. */
__device__ __forceinline__ uint4 *ring_start(unsigned char *smem) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    return (uint4 *)(smem + ((1024 - (a & 1023)) & 1023));
}

/* What a block of either product stages: its set member's codes and sb blocks, the staged
 * x, and where the block stands (its first row tile and token, its split's stages). */
struct gemm_src {
    const uint4 *codes;
    const uint32_t *sb;
    const __half *xh, *xl;
    const float *xsum;
    int kind, rt0, row_tiles, k_tiles, group_blocks, tok0, n, n_pad, kx, s_lo, s_hi;
};

/* Block (bx, by, bz)'s: row tiles 8 bx .. of its member mb, tokens bn by .., split bz of
 * sps stages. */
__device__ __forceinline__ gemm_src block_src(const set_member &mb, int bn, const __half *xh, const __half *xl,
                                              const float *xsum, int n, int n_pad, int kx, int kind, int k_tiles,
                                              int sps) {
    gemm_src g;
    g.codes = mb.codes, g.sb = mb.sb, g.xh = xh, g.xl = xl, g.xsum = xsum;
    g.kind = kind, g.rt0 = (blockIdx.x - mb.block0) * 8, g.row_tiles = mb.row_tiles, g.k_tiles = k_tiles;
    g.group_blocks = mb.group_blocks, g.tok0 = blockIdx.y * bn, g.n = n, g.n_pad = n_pad, g.kx = kx;
    g.s_lo = blockIdx.z * sps, g.s_hi = min(kx / GM_BK, g.s_lo + sps);
    return g;
}

/* Stage ks (codes, x, sb blocks and sums of x of the block's row tiles and tokens) into
 * ring slot st. */
template <int BITS, int GROUP, int BN, bool FEW>
__device__ __forceinline__ void load_stage(uint4 *st, int ks, const gemm_src &g) {
    using S = gshape<BITS, GROUP, BN>;
    const uint4 *const codes = g.codes;
    const uint32_t *const sb = g.sb;
    const int kind = g.kind, rt0 = g.rt0, row_tiles = g.row_tiles, k_tiles = g.k_tiles, group_blocks = g.group_blocks;
    const int tok0 = g.tok0, n = g.n, n_pad = g.n_pad, kx = g.kx;
    for (int i = threadIdx.x; i < 8 * S::TPS * 32; i += GM_WARPS * 32) {
        const int rtl = i / (S::TPS * 32), u = (i / 32) % S::TPS, l = i % 32;
        const int rt = rt0 + rtl, kt = ks * S::TPS + u;
        const bool ok = rt < row_tiles && kt < k_tiles;
        cp_async16_or_zero(st + S::CODES + i, ok ? codes + ((size_t)rt * k_tiles + kt) * 32 + l : codes, ok);
    }
    /* x: token rows of 8 units, as many as the block's fragments read (whole fragments of
     * 8 up to n); unit c of token row r lands at c ^ (r & 7), so the 8 rows a quarter-warp
     * reads fall in distinct banks */
    const int nr = FEW ? min(BN, (n - tok0 + 7) & ~7) : BN;
    for (int i = threadIdx.x; i < nr * 8; i += GM_WARPS * 32) {
        const int r = i >> 3, c = i & 7;
        const bool ok = tok0 + r < n;
        const size_t o = (size_t)(ok ? tok0 + r : 0) * kx + ks * GM_BK + c * 8;
        cp_async16_or_zero(st + S::XH + r * 8 + (c ^ (r & 7)), g.xh + o, ok);
        cp_async16_or_zero(st + S::XL + r * 8 + (c ^ (r & 7)), g.xl + o, ok);
    }
    /* the sb blocks of the stage's tiles, row tile by row tile */
    const int block_units = 16 * S::GPB * pair_words(kind) * 4 / 16, gb0 = (ks * S::TPS) >> S::SH;
    for (int i = threadIdx.x; i < 8 * S::NSB * block_units; i += GM_WARPS * 32) {
        const int rtl = i / (S::NSB * block_units), o = i % (S::NSB * block_units);
        const int rt = rt0 + rtl, gb = gb0 + o / block_units;
        const bool ok = rt < row_tiles && gb < group_blocks;
        const uint4 *src = (const uint4 *)sb + ((size_t)rt * group_blocks + gb0) * block_units + o;
        cp_async16_or_zero(st + S::SB + rtl * S::SB_RT + o, ok ? src : (const uint4 *)sb, ok);
    }
    /* sums of x: the groups that end in this stage (or span it) */
    const int g0 = ks * GM_BK / GROUP;
    for (int i = threadIdx.x; i < S::GPS * BN / 4; i += GM_WARPS * 32) {
        const int gi = g0 + i / (BN / 4), c = i % (BN / 4);
        cp_async16_or_zero(st + S::XSUM + i, g.xsum + (size_t)gi * n_pad + tok0 + 4 * c, true);
    }
}

/* y[n, rows] = x @ W^T. Block (bx, by, bz): row tiles 8 bx .., tokens 128 by .., stages
 * sps bz .. sps (bz + 1) - 1 of K. With one split (gridDim.z == 1) the block writes y;
 * else its partial sums go to part[bz][n][ldp] (rows of the set one after another, ldp
 * of them) and k_gemm_reduce adds them. */
template <int BITS, int GROUP, bool FEW>
__global__ static void __launch_bounds__(GM_WARPS * 32, 1)
k_affine_gemm(const affine_set set, const __half *__restrict__ xh, const __half *__restrict__ xl,
              const float *__restrict__ xsum, int n, int n_pad, int kx, int kind, int k_tiles, int sps,
              float *__restrict__ part, int ldp) {
    using S = gshape<BITS, GROUP, GM_BN>;
    extern __shared__ unsigned char smem[];
    uint4 *const ring = ring_start(smem);
    const set_member mb = member_of(set, blockIdx.x);
    const gemm_src blk = block_src(mb, GM_BN, xh, xl, xsum, n, n_pad, kx, kind, k_tiles, sps);
    float *__restrict__ y = mb.y;
    const int rows = mb.rows, rt0 = blk.rt0, tok0 = blk.tok0, s_lo = blk.s_lo, s_hi = blk.s_hi;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r = lane >> 2, t = lane & 3;
    const int wm = warp & 3, wn = warp >> 2;

#pragma unroll
    for (int s = 0; s < GM_STAGES - 1; s++) {
        if (s_lo + s < s_hi)
            load_stage<BITS, GROUP, GM_BN, FEW>(ring + s * S::UNITS, s_lo + s, blk);
        cp_async_commit();
    }

    float acc[2][8][4], c[2][8][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = c[i][j][e] = 0.0f;

    for (int ks = s_lo; ks < s_hi; ks++) {
        const int kr = ks - s_lo; /* the ring slot of stage ks is kr % GM_STAGES */
        cp_async_wait<GM_STAGES - 2>();
        __syncthreads(); /* stage ks landed for every thread; slot ks - 1 is free again */
        if (ks + GM_STAGES - 1 < s_hi)
            load_stage<BITS, GROUP, GM_BN, FEW>(ring + ((kr + GM_STAGES - 1) % GM_STAGES) * S::UNITS, ks + GM_STAGES - 1, blk);
        cp_async_commit();

        const uint4 *st = ring + (kr % GM_STAGES) * S::UNITS;
        uint4 cw[2][S::TPS];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int u = 0; u < S::TPS; u++) cw[i][u] = st[S::CODES + ((wm * 2 + i) * S::TPS + u) * 32 + lane];
        const uint4 *xs = st + S::XH + (wn * 64 + r) * 8;

#pragma unroll
        for (int jj = 0; jj < 2; jj++) { /* k-steps 2 jj and 2 jj + 1 */
            /* A fragments of both steps: [row tile][step][rows r, r + 8][k-pair] */
            uint32_t a[2][2][2][2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                if (BITS == 4) {
                    uint32_t top[4], bot[4];
                    codes4(top, jj ? cw[i][0].y : cw[i][0].x);
                    codes4(bot, jj ? cw[i][0].w : cw[i][0].z);
#pragma unroll
                    for (int sub = 0; sub < 2; sub++)
#pragma unroll
                        for (int kp = 0; kp < 2; kp++)
                            a[i][sub][0][kp] = top[2 * sub + kp], a[i][sub][1][kp] = bot[2 * sub + kp];
                } else {
                    uint32_t top[2], bot[2];
#pragma unroll
                    for (int sub = 0; sub < 2; sub++) {
                        codes8(top, sub ? cw[i][jj].y : cw[i][jj].x);
                        codes8(bot, sub ? cw[i][jj].w : cw[i][jj].z);
#pragma unroll
                        for (int kp = 0; kp < 2; kp++) a[i][sub][0][kp] = top[kp], a[i][sub][1][kp] = bot[kp];
                    }
                }
            }
            const int step = ks * 4 + 2 * jj + 1; /* the later of the two */
            const bool ends = (step + 1) % S::GS == 0;
            const int g = step / S::GS;
            float sc[2][2], bi[2][2];
            if (ends) {
                /* this group's pairs of rows r, r + 8 from the stage's sb blocks */
                const int lb = g / S::GPB - ((ks * S::TPS) >> S::SH), p = (lb * 8 + r) * 2 * S::GPB + 2 * (g % S::GPB);
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const uint32_t *sbs = (const uint32_t *)(st + S::SB + (wm * 2 + i) * S::SB_RT);
                    sb_centered<BITS>(sbs, kind, p, sc[i][0], bi[i][0]);
                    sb_centered<BITS>(sbs, kind, p + 1, sc[i][1], bi[i][1]);
                }
            }
            const float *xe = (const float *)(st + S::XSUM) + (g - ks * GM_BK / GROUP) * GM_BN + wn * 64 + 2 * t;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                if (FEW && tok0 + wn * 64 + j * 8 >= n) continue; /* no products of empty fragments */
                const int unit = (2 * t + jj) ^ r; /* token row j * 8 + r: (r & 7) == r */
                const uint4 bh = xs[j * 64 + unit], bl = xs[(S::XL - S::XH) + j * 64 + unit];
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    mma16816(c[i][j], a[i][0][0][0], a[i][0][1][0], a[i][0][0][1], a[i][0][1][1], bh.x, bh.y);
                    mma16816(c[i][j], a[i][1][0][0], a[i][1][1][0], a[i][1][0][1], a[i][1][1][1], bh.z, bh.w);
                    mma16816(c[i][j], a[i][0][0][0], a[i][0][1][0], a[i][0][0][1], a[i][0][1][1], bl.x, bl.y);
                    mma16816(c[i][j], a[i][1][0][0], a[i][1][1][0], a[i][1][0][1], a[i][1][1][1], bl.z, bl.w);
                }
                if (ends) {
                    const float2 sx = *(const float2 *)(xe + j * 8);
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        acc[i][j][0] = fmaf(sc[i][0], c[i][j][0], fmaf(bi[i][0], sx.x, acc[i][j][0]));
                        acc[i][j][1] = fmaf(sc[i][0], c[i][j][1], fmaf(bi[i][0], sx.y, acc[i][j][1]));
                        acc[i][j][2] = fmaf(sc[i][1], c[i][j][2], fmaf(bi[i][1], sx.x, acc[i][j][2]));
                        acc[i][j][3] = fmaf(sc[i][1], c[i][j][3], fmaf(bi[i][1], sx.y, acc[i][j][3]));
#pragma unroll
                        for (int e = 0; e < 4; e++) c[i][j][e] = 0.0f;
                    }
                }
            }
        }
    }
    cp_async_wait<0>();

    /* c0, c1: row r, tokens 2t, 2t + 1; c2, c3: row r + 8 */
    float *out = gridDim.z == 1 ? y : part + (size_t)blockIdx.z * n * ldp;
    const int ld = gridDim.z == 1 ? rows : ldp, first = gridDim.z == 1 ? 0 : mb.tile0 * 16;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int row = (rt0 + wm * 2 + i) * 16 + r;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int tok = tok0 + wn * 64 + j * 8 + 2 * t;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int rr = row + (e >> 1) * 8, tt = tok + (e & 1);
                if (rr < rows && tt < n) out[(size_t)tt * ld + first + rr] = acc[i][j][e];
            }
        }
    }
}

/* y of each member of the set = the sum of its splits' partial rows, in split order (the
 * same order every run). One thread per (token, row of the set). */
__global__ static void k_gemm_reduce(const affine_set set, const float *__restrict__ part, int64_t n, int ldp,
                                     int splits) {
    const int64_t m = n * ldp;
    GRID_STRIDE(i, m) {
        const int64_t tok = i / ldp;
        const int g = (int)(i % ldp), tile = g / 16;
        int k = 0;
#pragma unroll
        for (int j = 1; j < CUDA_AFFINE_SET; j++)
            if (j < set.k && tile >= set.first_tile[j]) k = j;
        const int row = g - set.first_tile[k] * 16;
        if (row >= set.rows[k]) continue;
        float v = 0.0f;
        for (int sp = 0; sp < splits; sp++) v += part[sp * m + i];
        set.y[k][tok * set.rows[k] + row] = v;
    }
}

/* ==== The warpgroup product (wgmma, sm_90a) ==== */

#define WG_BN 64     /* tokens a block computes: the n of wgmma.m64n64k16 */
#define WG_STAGES 4
#define WG_MIN_N 64  /* rows of x from which cuda_affine_gemm takes it */

/* The wgmma instructions, and the register fences that keep the compiler from moving
 * accesses of their registers across them (their accumulators are written
 * asynchronously). Only the sm_90a build has them; elsewhere they are never reached. */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_ARCH 1
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

__device__ __forceinline__ void wg_touch(float d[32]) {
#pragma unroll
    for (int i = 0; i < 32; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* d[64 rows, 64 tokens] (+)= A[64, 16] @ B[16, 64]: A from each warp's four registers (its
 * 16 rows, mma.m16n8k16's A layout), B from shared memory through desc; d is overwritten
 * when !accumulate. */
__device__ __forceinline__ void wgmma_m64n64k16(float d[32], const uint32_t a[4], uint64_t desc, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                   "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
}
#else
#define WG_ARCH 0
#endif

/* The descriptor of a K-major operand in shared memory with the 128-byte swizzle: rows of
 * 128 bytes (64 fp16 of k), 8-row blocks of 1024 bytes one after another (the stride
 * between blocks), 16-byte unit u of row r stored at u ^ (r % 8) within its block (as
 * load_stage places x), the block 1024-byte aligned. p may point 32 * j bytes into the
 * rows for k-step j: the hardware applies the swizzle to the whole address. */
__device__ __forceinline__ uint64_t sw128_desc(const void *p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    return (uint64_t)((a >> 4) & 0x3fffu) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

/* y[n, rows] = x @ W^T, the warpgroup way. Block (bx, by, bz): row tiles 8 bx .. (warp w
 * takes tile w; warpgroup g the 64 rows of tiles 4g .. 4g + 3), tokens 64 by .., stages of
 * split bz; partial sums as k_affine_gemm's. x staged by k_stage_x<true>. */
template <int BITS, int GROUP>
__global__ static void __launch_bounds__(GM_WARPS * 32, 2)
k_affine_wgmma(const affine_set set, const __half *__restrict__ xh, const __half *__restrict__ xl,
               const float *__restrict__ xsum, int n, int n_pad, int kx, int kind, int k_tiles, int sps,
               float *__restrict__ part, int ldp) {
#if WG_ARCH
    using S = gshape<BITS, GROUP, WG_BN>;
    extern __shared__ unsigned char smem[];
    uint4 *const ring = ring_start(smem);
    const set_member mb = member_of(set, blockIdx.x);
    const gemm_src blk = block_src(mb, WG_BN, xh, xl, xsum, n, n_pad, kx, kind, k_tiles, sps);
    float *__restrict__ y = mb.y;
    const int rows = mb.rows, rt0 = blk.rt0, tok0 = blk.tok0, s_lo = blk.s_lo, s_hi = blk.s_hi;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r = lane >> 2, t = lane & 3;

#pragma unroll
    for (int s = 0; s < WG_STAGES - 1; s++) {
        if (s_lo + s < s_hi)
            load_stage<BITS, GROUP, WG_BN, false>(ring + s * S::UNITS, s_lo + s, blk);
        cp_async_commit();
    }

    float acc[32], c[32];
#pragma unroll
    for (int i = 0; i < 32; i++) acc[i] = c[i] = 0.0f;

    for (int ks = s_lo; ks < s_hi; ks++) {
        const int kr = ks - s_lo;
        cp_async_wait<WG_STAGES - 2>();
        /* the stage's bytes came in through the generic proxy; wgmma reads them through
         * the async proxy */
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads(); /* stage ks landed for every thread; slot ks - 1 is free again */
        if (ks + WG_STAGES - 1 < s_hi)
            load_stage<BITS, GROUP, WG_BN, false>(ring + ((kr + WG_STAGES - 1) % WG_STAGES) * S::UNITS, ks + WG_STAGES - 1, blk);
        cp_async_commit();

        const uint4 *st = ring + (kr % WG_STAGES) * S::UNITS;
        /* A fragments of the stage's four k-steps: this warp's row tile */
        uint32_t a[4][4];
#pragma unroll
        for (int u = 0; u < S::TPS; u++) {
            const uint4 cw = st[S::CODES + (warp * S::TPS + u) * 32 + lane];
            if (BITS == 4) {
                uint32_t top[4], bot[4];
#pragma unroll
                for (int half = 0; half < 2; half++) { /* steps 2 half, 2 half + 1 */
                    codes4(top, half ? cw.y : cw.x);
                    codes4(bot, half ? cw.w : cw.z);
#pragma unroll
                    for (int sub = 0; sub < 2; sub++) {
                        uint32_t *f = a[2 * half + sub];
                        f[0] = top[2 * sub], f[1] = bot[2 * sub], f[2] = top[2 * sub + 1], f[3] = bot[2 * sub + 1];
                    }
                }
            } else {
                uint32_t top[2], bot[2];
#pragma unroll
                for (int sub = 0; sub < 2; sub++) { /* steps 2u, 2u + 1 */
                    codes8(top, sub ? cw.y : cw.x);
                    codes8(bot, sub ? cw.w : cw.z);
                    uint32_t *f = a[2 * u + sub];
                    f[0] = top[0], f[1] = bot[0], f[2] = top[1], f[3] = bot[1];
                }
            }
        }
        const uint64_t dh = sw128_desc(st + S::XH), dl = sw128_desc(st + S::XL);
        wg_touch(c);
        wg_fence();
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const int step = ks * 4 + m;
            /* +2 a step: 32 bytes of k, in the descriptor's 16-byte units */
            wgmma_m64n64k16(c, a[m], dh + 2 * m, step % S::GS != 0);
            wgmma_m64n64k16(c, a[m], dl + 2 * m, 1);
            if ((step + 1) % S::GS == 0) { /* the group ends: its sums scaled into acc */
                wg_commit();
                wg_wait_all();
                wg_touch(c);
                const int g = step / S::GS;
                const int lb = g / S::GPB - ((ks * S::TPS) >> S::SH), p = (lb * 8 + r) * 2 * S::GPB + 2 * (g % S::GPB);
                const uint32_t *sbs = (const uint32_t *)(st + S::SB + warp * S::SB_RT);
                float s0, b0, s1, b1;
                sb_centered<BITS>(sbs, kind, p, s0, b0);
                sb_centered<BITS>(sbs, kind, p + 1, s1, b1);
                const float *xe = (const float *)(st + S::XSUM) + (g - ks * GM_BK / GROUP) * WG_BN + 2 * t;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const float2 sx = *(const float2 *)(xe + j * 8);
                    acc[4 * j] = fmaf(s0, c[4 * j], fmaf(b0, sx.x, acc[4 * j]));
                    acc[4 * j + 1] = fmaf(s0, c[4 * j + 1], fmaf(b0, sx.y, acc[4 * j + 1]));
                    acc[4 * j + 2] = fmaf(s1, c[4 * j + 2], fmaf(b1, sx.x, acc[4 * j + 2]));
                    acc[4 * j + 3] = fmaf(s1, c[4 * j + 3], fmaf(b1, sx.y, acc[4 * j + 3]));
                }
                wg_touch(c);
                wg_fence(); /* c is read above and written by the next group's first product */
            }
        }
        /* every product of the stage done before its slot is loaded again */
        wg_commit();
        wg_wait_all();
        wg_touch(c);
    }
    cp_async_wait<0>();

    /* c[4j + e]: row r (e < 2) or r + 8, token 8j + 2t + (e & 1) */
    float *out = gridDim.z == 1 ? y : part + (size_t)blockIdx.z * n * ldp;
    const int ld = gridDim.z == 1 ? rows : ldp, first = gridDim.z == 1 ? 0 : mb.tile0 * 16;
    const int row = (rt0 + warp) * 16 + r;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int tok = tok0 + j * 8 + 2 * t;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int rr = row + (e >> 1) * 8, tt = tok + (e & 1);
            if (rr < rows && tt < n) out[(size_t)tt * ld + first + rr] = acc[4 * j + e];
        }
    }
#else
    __trap(); /* the host launches it only where the sm_90a code exists */
#endif
}

typedef void (*gemm_kernel)(const affine_set, const __half *, const __half *, const float *, int, int, int, int, int,
                            int, float *, int);

/* The kernel of a shape; few: n < GM_BN (one partial block of tokens). */
static gemm_kernel pick(int bits, int64_t group, bool few, size_t *smem) {
#define GEMM_CASE(B, G)                                                                                               \
    if (bits == B && group == G) {                                                                                    \
        *smem = ring_smem<B, G, GM_BN, GM_STAGES>();                                                                  \
        return few ? k_affine_gemm<B, G, true> : k_affine_gemm<B, G, false>;                                          \
    }
    GEMM_CASE(4, 32) GEMM_CASE(4, 64) GEMM_CASE(4, 128) GEMM_CASE(8, 32) GEMM_CASE(8, 64) GEMM_CASE(8, 128)
#undef GEMM_CASE
    return NULL;
}

/* The warpgroup kernel of a shape. */
static gemm_kernel pick_wg(int bits, int64_t group, size_t *smem) {
#define WG_CASE(B, G)                                                                                                 \
    if (bits == B && group == G) {                                                                                    \
        *smem = ring_smem<B, G, WG_BN, WG_STAGES>();                                                                  \
        return k_affine_wgmma<B, G>;                                                                                  \
    }
    WG_CASE(4, 32) WG_CASE(4, 64) WG_CASE(4, 128) WG_CASE(8, 32) WG_CASE(8, 64) WG_CASE(8, 128)
#undef WG_CASE
    return NULL;
}

/* Whether the current device runs the sm_90a code (compute capability 9.0: H100, H200). */
static bool wgmma_device(void) {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev)) {
        cudaGetLastError();
        return false;
    }
    return major == 9 && minor == 0;
}

extern "C" bool cuda_affine_gemm_has_wgmma(void) { return wgmma_device(); }

cudaError_t affine_gemm_init(void) {
    static const int bits[2] = {4, 8}, groups[3] = {32, 64, 128};
    const bool wg = wgmma_device();
    for (int b = 0; b < 2; b++)
        for (int g = 0; g < 3; g++)
            for (int kind = 0; kind < 3; kind++) { /* mma, mma FEW, wgmma */
                if (kind == 2 && !wg) continue;
                size_t smem = 0;
                const gemm_kernel k = kind == 2 ? pick_wg(bits[b], groups[g], &smem) : pick(bits[b], groups[g], kind, &smem);
                const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
                if (e != cudaSuccess) return e;
            }
    return cudaSuccess;
}

/* x's fp16 parts [2, n_pad, kx], then its sums per group [groups, n_pad]. */
static size_t work_bytes(int64_t n, int64_t kx, int64_t groups) {
    const int64_t n_pad = round_up(n, GM_BN);
    return (size_t)round_up(2 * n_pad * kx * 2, 256) + (size_t)(groups * n_pad * 4);
}

extern "C" size_t cuda_affine_gemm_work_size(const cuda_affine *w, int64_t n) {
    return work_bytes(n, staged_cols(w), staged_groups(w));
}

extern "C" size_t cuda_affine_gemm_work_bound(int64_t n, int64_t cols) {
    const int64_t kx = round_up(cols, GM_BK);
    return work_bytes(n, kx, kx / 32); /* groups of 32 are the smallest */
}

extern "C" size_t cuda_affine_gemm_split_bytes(int64_t n, int64_t rows, int splits) {
    return (size_t)splits * (size_t)n * (size_t)round_up(rows, 16) * sizeof(float);
}

/* Splits of K for a launch of `blocks` blocks (per_sm of them on an SM at a time) over
 * `stages` stages, with room for the partial sums of `per_split` bytes each: the fewest
 * that keep the device's SMs at least 85% busy over the waves, at most GM_SPLIT_MAX,
 * every split at least GM_SPLIT_MIN stages. */
static int choose_splits(int blocks, int per_sm, int stages, size_t room, size_t per_split) {
    const int sms = cuda_sm_count(0);
    if (sms < 1) return 1;
    int best = 1;
    for (int sp = 1; sp <= GM_SPLIT_MAX && sp * GM_SPLIT_MIN <= stages; sp++) {
        if (sp > 1 && (size_t)sp * per_split > room) break;
        const double waves = (double)blocks * sp / ((double)sms * per_sm);
        best = sp;
        if (waves / ceil(waves) >= 0.85) break;
    }
    return best;
}

extern "C" cudaError_t cuda_affine_gemm_set_path(float *const *ys, const cuda_affine *const *ws, int k,
                                                 const float *x, int64_t n, void *work, size_t work_size,
                                                 cudaStream_t s, cuda_gemm_path path) {
    affine_set set;
    if (!affine_set_of(&set, ys, ws, k)) return cudaErrorInvalidValue;
    const cuda_affine *w = ws[0];
    const bool wg = path == CUDA_GEMM_WGMMA || (path == CUDA_GEMM_AUTO && n >= WG_MIN_N && wgmma_device());
    if (path == CUDA_GEMM_WGMMA && !wgmma_device()) return cudaErrorNotSupported;
    const int bn = wg ? WG_BN : GM_BN;
    size_t smem = 0;
    const gemm_kernel kern = wg ? pick_wg(w->bits, w->group, &smem) : pick(w->bits, w->group, n < GM_BN, &smem);
    const size_t staged = cuda_affine_gemm_work_size(w, n);
    if (n < 1 || !work || !kern || n > 65535 * (int64_t)bn || work_size < staged) return cudaErrorInvalidValue;
    /* x staged for bn-token blocks (GM_BN's padding, which work_size counts, holds it) */
    const int64_t n_pad = round_up(n, bn), kx = staged_cols(w);
    __half *xh = (__half *)work, *xl = xh + n_pad * kx;
    float *xsum = (float *)((char *)work + round_up(2 * n_pad * kx * 2, 256));
    const size_t part_at = (size_t)round_up((int64_t)staged, 256);
    float *part = (float *)((char *)work + part_at);
    const size_t room = work_size > part_at ? work_size - part_at : 0;

    const int64_t m = n_pad * (kx / 4); /* a multiple of 32: whole warps in k_stage_x's shuffles */
    if (wg) k_stage_x<true><<<blocks_for(m), THREADS, 0, s>>>(xh, xl, xsum, x, n, n_pad, w->cols, kx, w->group, m);
    else k_stage_x<false><<<blocks_for(m), THREADS, 0, s>>>(xh, xl, xsum, x, n, n_pad, w->cols, kx, w->group, m);
    const int blocks = affine_set_blocks(&set) * (int)(n_pad / bn), stages = (int)(kx / GM_BK);
    const int ldp = affine_set_tiles(&set) * 16;
    int splits = choose_splits(blocks, wg ? 2 : 1, stages, room, cuda_affine_gemm_split_bytes(n, ldp, 1));
    /* stages per split: whole groups of 128 columns (2 stages), so no group is cut */
    const int sps = (int)round_up((stages + splits - 1) / splits, 2);
    splits = (stages + sps - 1) / sps;
    const dim3 grid((unsigned)affine_set_blocks(&set), (unsigned)(n_pad / bn), (unsigned)splits);
    kern<<<grid, GM_WARPS * 32, smem, s>>>(set, xh, xl, xsum, (int)n, (int)n_pad, (int)kx, w->sb_kind, (int)w->k_tiles,
                                           sps, part, ldp);
    if (splits > 1) k_gemm_reduce<<<blocks_for(n * ldp), THREADS, 0, s>>>(set, part, n, ldp, splits);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_affine_gemm_set(float *const *ys, const cuda_affine *const *ws, int k, const float *x,
                                            int64_t n, void *work, size_t work_size, cudaStream_t s) {
    return cuda_affine_gemm_set_path(ys, ws, k, x, n, work, work_size, s, CUDA_GEMM_AUTO);
}

extern "C" cudaError_t cuda_affine_gemm(float *y, const float *x, int64_t n, const cuda_affine *w, void *work,
                                        size_t work_size, cudaStream_t s) {
    return cuda_affine_gemm_set_path(&y, &w, 1, x, n, work, work_size, s, CUDA_GEMM_AUTO);
}

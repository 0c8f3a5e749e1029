/*
 * affine_device.cuh - what the affine kernels share on the device (affine.cu's decode
 * product, rows and repack; affine_gemm.cu's prefill product): the tile geometry of
 * affine.h's layout, the exact codes as fp16 A fragments, the tensor-core product,
 * asynchronous copies and the (scale, bias) pairs.
 * Only .cu files of src/backend/cuda include it.
 */
#ifndef CELER_BACKEND_CUDA_AFFINE_DEVICE_CUH
#define CELER_BACKEND_CUDA_AFFINE_DEVICE_CUH

#include "backend/cuda/affine.h"

#include <cuda_fp16.h>
#include <stdint.h>

__host__ __device__ static inline int tile_cols(int bits) { return bits == 4 ? 64 : 32; }
__host__ __device__ static inline int groups_per_block(int bits, int64_t group) { return bits == 4 && group == 32 ? 2 : 1; }
__host__ __device__ static inline int pair_words(int kind) { return kind == CUDA_AFFINE_SB_F32 ? 2 : 1; }

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t *>(&h); }
__device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *reinterpret_cast<__half2 *>(&u); }

/* (w & mask) | 0x64006400 in one LOP3 (the compiler would split it in two). */
template <uint32_t MASK> __device__ __forceinline__ uint32_t mask_or_magic(uint32_t w) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(w), "n"(MASK), "r"(0x64006400u));
    return r;
}

/* The exact centered codes q - 8 of one row from a 4-bit word as four A-register half2
 * (k-pairs of two mma steps): (n0, n4), (n1, n5), (n2, n6), (n3, n7). (1024 + q) - 1032
 * and (1024 + 16q) / 16 - 72 are exact in fp16. Centered codes keep the products' partial
 * sums near the result: with q itself, s * sum(q x) and b * sum(x) (b near -8 s, as
 * checkpoints store it) nearly cancel, and the tensor cores' truncated fp32 sums lose
 * what remains. */
__device__ __forceinline__ void codes4(uint32_t a[4], uint32_t w) {
    const uint32_t w8 = w >> 8;
    const __half2 k1032 = __float2half2_rn(1032.0f), k16th = __float2half2_rn(1.0f / 16.0f),
                  km72 = __float2half2_rn(-72.0f);
    a[0] = h2_bits(__hsub2(bits_h2(mask_or_magic<0x000f000fu>(w)), k1032));
    a[1] = h2_bits(__hfma2(bits_h2(mask_or_magic<0x00f000f0u>(w)), k16th, km72));
    a[2] = h2_bits(__hsub2(bits_h2(mask_or_magic<0x000f000fu>(w8)), k1032));
    a[3] = h2_bits(__hfma2(bits_h2(mask_or_magic<0x00f000f0u>(w8)), k16th, km72));
}

/* The exact centered codes q - 128 of one row from an 8-bit word: (b0, b2), (b1, b3). */
__device__ __forceinline__ void codes8(uint32_t a[2], uint32_t w) {
    const __half2 k1152 = __float2half2_rn(1152.0f);
    a[0] = h2_bits(__hsub2(bits_h2(__byte_perm(w, 0x64646464u, 0x4240)), k1152));
    a[1] = h2_bits(__hsub2(bits_h2(__byte_perm(w, 0x64646464u, 0x4341)), k1152));
}

/* c[16 rows, 8 columns] += A[16, 16] @ B[16, 8], fp16 in, fp32 accumulate. */
__device__ __forceinline__ void mma16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* 16 bytes global -> shared, in flight until a cp.async wait; L2 only (streamed once). */
__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
/* Waits until at most `pending` of this thread's commit groups are still in flight. */
__device__ __forceinline__ void cp_async_wait_until(int pending) {
    switch (pending) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    default: cp_async_wait<3>(); break;
    }
}


/* (scale, bias) pair p of an sb array as fp32, exactly. */
__device__ __forceinline__ void sb_pair(const uint32_t *sb, int kind, int64_t p, float &s, float &b) {
    if (kind == CUDA_AFFINE_SB_F32) {
        const float2 v = ((const float2 *)sb)[p];
        s = v.x, b = v.y;
        return;
    }
    const uint32_t w = sb[p];
    if (kind == CUDA_AFFINE_SB_BF16) {
        s = __uint_as_float(w << 16), b = __uint_as_float(w & 0xffff0000u);
    } else {
        const float2 f = __half22float2(bits_h2(w));
        s = f.x, b = f.y;
    }
}

/* A group's (scale, bias) for products over centered codes: s * q + b = s * (q - c) +
 * (b + c s), c = 2^(bits - 1); c s is exact and the sum rounded once. */
template <int BITS> __device__ __forceinline__ void sb_centered(const uint32_t *sb, int kind, int64_t p, float &s, float &b) {
    sb_pair(sb, kind, p, s, b);
    b = fmaf((float)(1 << (BITS - 1)), s, b);
}

/* Matrices of one input that one product launch takes (q, k and v; gate and up): blocks
 * along x are blocks of 8 row tiles, matrix i's from first_block[i] on. All share cols,
 * bits, group and scale type (cuda_affine_compatible). */
typedef struct affine_set {
    const uint4 *codes[CUDA_AFFINE_SET];
    const uint32_t *sb[CUDA_AFFINE_SET];
    float *y[CUDA_AFFINE_SET];
    int rows[CUDA_AFFINE_SET], row_tiles[CUDA_AFFINE_SET], group_blocks[CUDA_AFFINE_SET];
    int first_block[CUDA_AFFINE_SET]; /* blocks of 8 row tiles before matrix i */
    int first_tile[CUDA_AFFINE_SET];  /* row tiles before matrix i */
    int k;
} affine_set;

/* What block bx of a set's launch works on. */
typedef struct set_member {
    const uint4 *codes;
    const uint32_t *sb;
    float *y;
    int rows, row_tiles, group_blocks;
    int block0, tile0; /* the matrix's first block and row tile in the launch */
} set_member;

__device__ __forceinline__ set_member member_of(const affine_set &s, int bx) {
    set_member m = {s.codes[0], s.sb[0], s.y[0], s.rows[0], s.row_tiles[0], s.group_blocks[0], 0, 0};
#pragma unroll
    for (int i = 1; i < CUDA_AFFINE_SET; i++)
        if (i < s.k && bx >= s.first_block[i])
            m = {s.codes[i], s.sb[i], s.y[i], s.rows[i], s.row_tiles[i], s.group_blocks[i], s.first_block[i],
                 s.first_tile[i]};
    return m;
}

/* The set of ws[0..k-1] with outputs ys; false when k is out of range or the matrices
 * cannot share a launch. */
static inline bool affine_set_of(affine_set *s, float *const *ys, const cuda_affine *const *ws, int k) {
    if (k < 1 || k > CUDA_AFFINE_SET) return false;
    int blocks = 0, tiles = 0;
    for (int i = 0; i < k; i++) {
        if (!cuda_affine_compatible(ws[0], ws[i])) return false;
        s->codes[i] = (const uint4 *)ws[i]->codes;
        s->sb[i] = (const uint32_t *)ws[i]->sb;
        s->y[i] = ys[i];
        s->rows[i] = (int)ws[i]->rows;
        s->row_tiles[i] = (int)ws[i]->row_tiles;
        s->group_blocks[i] = (int)ws[i]->group_blocks;
        s->first_block[i] = blocks;
        s->first_tile[i] = tiles;
        blocks += (int)((ws[i]->row_tiles + 7) / 8);
        tiles += (int)ws[i]->row_tiles;
    }
    for (int i = k; i < CUDA_AFFINE_SET; i++) {
        s->codes[i] = NULL, s->sb[i] = NULL, s->y[i] = NULL;
        s->rows[i] = s->row_tiles[i] = s->group_blocks[i] = 0;
        s->first_block[i] = blocks, s->first_tile[i] = tiles;
    }
    s->k = k;
    return true;
}

/* Blocks of 8 row tiles and row tiles of a set. */
static inline int affine_set_blocks(const affine_set *s) {
    return s->first_block[s->k - 1] + (s->row_tiles[s->k - 1] + 7) / 8;
}
static inline int affine_set_tiles(const affine_set *s) { return s->first_tile[s->k - 1] + s->row_tiles[s->k - 1]; }

/* Raises the prefill product's kernels' shared memory limit on the current device
 * (affine_gemm.cu; the matrix upload calls it with its own kernels'). */
cudaError_t affine_gemm_init(void);

#endif

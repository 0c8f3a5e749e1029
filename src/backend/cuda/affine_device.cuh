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

/* The exact codes of one row from a 4-bit word as four A-register half2 (k-pairs of two
 * mma steps): (n0, n4), (n1, n5), (n2, n6), (n3, n7). (1024 + q) - 1024 and
 * (1024 + 16q) / 16 - 64 are exact in fp16. */
__device__ __forceinline__ void codes4(uint32_t a[4], uint32_t w) {
    const uint32_t w8 = w >> 8;
    const __half2 k1024 = __float2half2_rn(1024.0f), k16th = __float2half2_rn(1.0f / 16.0f),
                  km64 = __float2half2_rn(-64.0f);
    a[0] = h2_bits(__hsub2(bits_h2(mask_or_magic<0x000f000fu>(w)), k1024));
    a[1] = h2_bits(__hfma2(bits_h2(mask_or_magic<0x00f000f0u>(w)), k16th, km64));
    a[2] = h2_bits(__hsub2(bits_h2(mask_or_magic<0x000f000fu>(w8)), k1024));
    a[3] = h2_bits(__hfma2(bits_h2(mask_or_magic<0x00f000f0u>(w8)), k16th, km64));
}

/* The exact codes of one row from an 8-bit word: (b0, b2), (b1, b3). */
__device__ __forceinline__ void codes8(uint32_t a[2], uint32_t w) {
    const __half2 k1024 = __float2half2_rn(1024.0f);
    a[0] = h2_bits(__hsub2(bits_h2(__byte_perm(w, 0x64646464u, 0x4240)), k1024));
    a[1] = h2_bits(__hsub2(bits_h2(__byte_perm(w, 0x64646464u, 0x4341)), k1024));
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

/* Raises the prefill product's kernels' shared memory limit on the current device
 * (affine_gemm.cu; the matrix upload calls it with its own kernels'). */
cudaError_t affine_gemm_init(void);

#endif

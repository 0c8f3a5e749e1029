/*
 * attention_flash.cu - causal attention of many rows over the paged fp16 KV pool on the
 * tensor cores (prefill, and mixed prefill + decode batches): flash-style tiles, online
 * softmax in fp32, scores and products by mma.sync m16n8k16 (fp16 inputs, fp32 sums).
 *
 * A block is 4 warps sharing one KV head: each warp holds 16 query rows of one query
 * head; the warps take hq query heads of the head's group (4, 2 or 1, whichever divides
 * the group) times 4/hq runs of 16 rows, so GQA reads each K/V tile once for hq heads
 * and nothing is copied. K and V tiles of BN keys come from the paged pool (key j of a
 * sequence at pool row table[j / block_size] * block_size + j % block_size) by cp.async
 * into two shared-memory stages, so the next tile loads while this one is computed.
 *
 * Rows are general: the rows of a tile may belong to several sequences at any positions
 * (continuous batching). Up to FLASH_SEQ_BLOCKS blocks (no more than the step's
 * sequences) share a tile: each takes every gridDim.z-th of its distinct sequences and
 * walks them in turn, each over the union of its rows' key ranges; every score is masked
 * by its row's sequence, causal bound (pos) and window, and a warp skips key tiles none of
 * its rows reads. One sequence with consecutive positions (a prefill chunk) is one pass of
 * one block (a step of one sequence launches no partners).
 *
 * Exactness. K and V are fp16 in the pool, so they enter the tensor cores exactly. The
 * fp32 query is scaled per row by a power of two (its largest element to [2^14, 2^15))
 * and split into fp16 hi + lo, and each probability (times 2^12) likewise: two products
 * each, which carry about 22 bits. The tensor cores sum in fp32 but truncate, so no
 * accumulator chains more than one k-step (16 products, hi then lo): every partial is
 * added to the running scores and outputs in ordinary fp32. Exponentials are expf of the
 * scaled score minus the running max, as the reference computes them.
 *
 * The fast kernels (FAST, steps of FAST_FROM_ROWS rows and more: prefill, the fp16
 * fast path as for the dense products) take the query and the probabilities as one fp16
 * each, scaled the same way, and chain the tensor cores' sums over a tile: a third of the
 * instructions, on tiles of twice the keys. Their scores are in base 2 (the scale times
 * log2 e) for the hardware's 2^x, whose error is far below the probabilities' fp16 rounding,
 * and the scale, the running max and the 2^12 go into one FFMA before it. Grids of many
 * blocks an SM (a long prefill) take the wide kernels: 32 rows a warp as two m tiles, so
 * every K and V fragment read from shared memory feeds two products (flash_shape).
 *
 * Not here: fp32 pools, head dims outside FLASH_HDS, and few-row steps (attention.cu).
 */
#include "backend/cuda/cuda_internal.h"

#include <cuda_fp16.h>
#include <limits.h>
#include <math.h>

#define FLASH_WARPS 4
#define FLASH_THREADS (32 * FLASH_WARPS)
#define FLASH_MT 2           /* 16-row m tiles of a warp at most */
#define FLASH_ROWS (FLASH_WARPS * 16 * FLASH_MT) /* rows of a block at most (one head) */
#define P_SCALE 4096.0f      /* probabilities are split at p * 2^12: no fp16 subnormals */
#define P_LOG2 12.0f         /* log2 P_SCALE */
#define FLASH_SEQ_BLOCKS 8   /* blocks sharing a tile whose rows are of several sequences */

/* The head dims with a kernel (multiples of 16). */
#define FLASH_HDS(X) X(64) X(80) X(96) X(112) X(128) X(160) X(192) X(256)

/* The kernels: exact; fast (fp16 query and probabilities, the query's fragments in
 * registers, 2 blocks an SM at head dims to 128); wide (fast, for grids of many blocks an
 * SM at head dims to 128: two 16-row m tiles a warp, so each K and V fragment read from
 * shared memory feeds two products, the query read from shared memory each tile, tiles of
 * 32 keys at head dims over 64). */
enum { FLASH_EXACT, FLASH_FAST, FLASH_WIDE };

template <int HD, int KIND> struct flash_shape {
    static constexpr bool FAST = KIND != FLASH_EXACT, QREG = KIND == FLASH_FAST;
    static constexpr int MT = KIND == FLASH_WIDE ? 2 : 1; /* 16-row m tiles of a warp */
    /* keys per tile (registers: acc is HD / 2 floats a thread, the scores BN / 2; the
     * exact kernels also hold a step's partial products) */
    static constexpr int BN = KIND == FLASH_FAST     ? (HD <= 128 ? 64 : 32)
                              : KIND == FLASH_WIDE   ? (HD <= 64 ? 64 : 32)
                              : HD <= 96             ? 64
                              : HD <= 128            ? 32
                                                     : 16;
    static constexpr int LD = HD + 8; /* halves per shared row: 16 bytes of pad keep
                                         ldmatrix's 8 rows on distinct banks */
    /* each warp's query rows (exact: hi and lo; wide: one fp16; fast: none, they pass
     * through the first K stage into registers), then two stages of K and V tiles */
    static constexpr int QROWS = KIND == FLASH_EXACT ? FLASH_WARPS * 2 * 16 : QREG ? 0 : FLASH_WARPS * 16 * MT;
    static constexpr size_t SMEM = sizeof(__half) * (size_t)LD * (QROWS + 4 * BN);
    static constexpr int MIN_BLOCKS = FAST && HD <= 128 ? 2 : 1;
    static_assert(!QREG || 2 * BN >= FLASH_WARPS * 16, "the query rows fit the K stages");
};

/* ==== Tensor-core and copy primitives ==== */

__device__ static inline uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16 bytes global -> shared, zero-filled when !ok (src is not read then). */
__device__ static inline void cp_async16(void *dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(__cvta_generic_to_global(src)), "r"(ok ? 16 : 0));
}
__device__ static inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ static inline void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ static inline void ldsm_x4(uint32_t r[4], const __half *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ static inline void ldsm_x4_t(uint32_t r[4], const __half *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

/* c[16x8] += a[16x16] b[16x8] (fp16 in, fp32 sums). */
__device__ static inline void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* c0 += a b[0..1], c1 += a b[2..3]: the two 8-column B fragments of one ldmatrix x4. */
__device__ static inline void mma16816_x2(float c0[4], float c1[4], const uint32_t a[4], const uint32_t b[4]) {
    mma16816(c0, a, b[0], b[1]);
    mma16816(c1, a, b[2], b[3]);
}

/* c[2][16x8] = a[16x16] (hi + lo) times two b[16x8] (b[0..1], b[2..3]), from zero. */
__device__ static inline void mma_hilo2(float c[2][4], const uint32_t hi[4], const uint32_t lo[4],
                                        const uint32_t b[4]) {
    for (int i = 0; i < 4; i++) c[0][i] = c[1][i] = 0.0f;
    mma16816(c[0], hi, b[0], b[1]);
    mma16816(c[0], lo, b[0], b[1]);
    mma16816(c[1], hi, b[2], b[3]);
    mma16816(c[1], lo, b[2], b[3]);
}

/* acc[4] += c[4] in fp32, kept in program order (volatile): left to itself the compiler
 * holds every fresh accumulator of an unrolled loop until its end. */
__device__ static inline void add4(float acc[4], const float c[4]) {
    for (int i = 0; i < 4; i++) asm volatile("add.rn.f32 %0, %0, %1;\n" : "+f"(acc[i]) : "f"(c[i]));
}

/* Two fp32 values (a pair of columns) as fp16 hi and lo pairs: x = hi + lo to ~22 bits. */
__device__ static inline void split_pair(float x0, float x1, uint32_t *hi, uint32_t *lo) {
    const __half h0 = __float2half_rn(x0), h1 = __float2half_rn(x1);
    const __half l0 = __float2half_rn(x0 - __half2float(h0)), l1 = __float2half_rn(x1 - __half2float(h1));
    const __half2 h = __halves2half2(h0, h1), l = __halves2half2(l0, l1);
    *hi = *(const uint32_t *)&h;
    *lo = *(const uint32_t *)&l;
}

/* 2^x by the special function unit (about 2 ulp; 0 at -inf). */
__device__ static inline float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* ==== The kernel ==== */

/* What a block knows of its rows (the 16 MT * 4/hq rows from r0). */
struct flash_rows {
    int seq[FLASH_ROWS], pos[FLASH_ROWS], lo[FLASH_ROWS]; /* seq -1: past the call's rows */
    float fac[FLASH_WARPS][16 * FLASH_MT];               /* scale / the query row's power of two (fast: x log2 e) */
    bool own[FLASH_ROWS];                                /* the row's sequence is this block's */
    int next, klo, khi;
};

/* The warp's 16 MT query rows of its head, scaled per row by a power of two and split into
 * fp16 hi [16 MT][LD] and lo [16][LD] (exact); fac[i] = scale / that power. */
template <int HD, int KIND>
__device__ static void flash_load_q(__half *qh, __half *ql, float *fac, const float *q, const attn_rows &ar,
                                    int64_t r0, int64_t head, int lane) {
    constexpr int LD = flash_shape<HD, KIND>::LD, PER = (HD + 31) / 32;
    constexpr bool FAST = flash_shape<HD, KIND>::FAST;
    const int64_t qd = ar.h * HD;
    for (int i = 0; i < 16 * flash_shape<HD, KIND>::MT; i++) {
        const int64_t r = r0 + i;
        float v[PER], mx = 0.0f;
#pragma unroll
        for (int k = 0; k < PER; k++) {
            const int c = lane + 32 * k;
            v[k] = r < ar.n && c < HD ? q[r * qd + head * HD + c] : 0.0f;
            mx = fmaxf(mx, fabsf(v[k]));
        }
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        int e = 0;
        frexpf(mx, &e); /* mx < 2^e */
        const int up = mx > 0.0f ? max(-100, min(100, 15 - e)) : 0;
#pragma unroll
        for (int k = 0; k < PER; k++) {
            const int c = lane + 32 * k;
            if (c < HD) {
                const float x = ldexpf(v[k], up);
                const __half h = __float2half_rn(x);
                qh[i * LD + c] = h;
                if (!FAST) ql[i * LD + c] = __float2half_rn(x - __half2float(h));
            }
        }
        if (lane == 0) fac[i] = ldexpf(FAST ? ar.scale * 1.4426950408889634f : ar.scale, -up); /* log2 e */
    }
}

/* Keys k0 .. k0+BN-1 of a sequence (those past khi zero-filled) into K and V stage
 * tiles [BN][LD]. A thread copies one 16-byte chunk (ch) of keys KSTEP apart, walking
 * the block table from its first key's block: one division a tile, not one a chunk. */
template <int HD, int KIND>
__device__ static void flash_load_kv(__half *kt, __half *vt, const __half *kpool, const __half *vpool,
                                     const int32_t *table, int bs, int64_t kvd, int64_t koff, int k0, int khi,
                                     int tid) {
    constexpr int BN = flash_shape<HD, KIND>::BN, LD = flash_shape<HD, KIND>::LD, CH = HD / 8;
    constexpr int KSTEP = FLASH_THREADS / CH; /* threads past CH * KSTEP copy nothing */
    if (tid >= CH * KSTEP) return;
    const int ch = tid % CH, key0 = tid / CH;
    int blk = (k0 + key0) / bs, off = (k0 + key0) % bs;
#pragma unroll
    for (int key = key0; key < BN; key += KSTEP) {
        const bool ok = k0 + key <= khi;
        const int64_t at = ok ? ((int64_t)table[blk] * bs + off) * kvd + koff + ch * 8 : 0;
        cp_async16(kt + key * LD + ch * 8, kpool + at, ok);
        cp_async16(vt + key * LD + ch * 8, vpool + at, ok);
        for (off += KSTEP; off >= bs; off -= bs) blk++;
    }
}

/* The keys a thread's rows (g + 8 w + 16 mt of its warp's, row index 2 mt + w) read of one
 * sequence: lo[i] .. hi[i] (empty when the row is of another sequence), and their score
 * factors. */
struct row_pair {
    int lo[2 * FLASH_MT], hi[2 * FLASH_MT];
    float fac[2 * FLASH_MT];
    float cap; /* exact kernels: scores soft-capped to cap tanh(s / cap); 0 none */
};

/* A fragment of P for keys 16 kk .. 16 kk + 15 from the probabilities s (two 8-key chunks
 * of the scores' accumulator layout are the A layout of one 16-key step). */
__device__ static inline void p_frag(uint32_t p[4], const float s[][4], int kk) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const __half2 h = __floats2half2_rn(s[2 * kk + i / 2][2 * (i % 2)], s[2 * kk + i / 2][2 * (i % 2) + 1]);
        p[i] = *(const uint32_t *)&h;
    }
}

/* One tile: scores s = Q K^T (masked, scaled), the online softmax update of m, l, acc,
 * and acc += P V; for each of the warp's MT m tiles (row index 2 mt + w of m, l, rp). */
template <int HD, int KIND>
__device__ static void flash_tile(float acc[][HD / 8][4], float m[], float l[], const uint32_t qf[][4],
                                  const __half *qh, const __half *ql, const __half *kt, const __half *vt,
                                  const row_pair &rp, int k0, int lane) {
    using shape = flash_shape<HD, KIND>;
    constexpr int BN = shape::BN, LD = shape::LD, NC = BN / 8, ND = HD / 8, MT = shape::MT;
    constexpr bool FAST = shape::FAST;
    static_assert(FAST || MT == 1, "the exact kernels take one m tile");
    const int t = lane % 4;
    float s[MT][NC][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int c = 0; c < NC; c++) s[mt][c][0] = s[mt][c][1] = s[mt][c][2] = s[mt][c][3] = 0.0f;
    if constexpr (FAST) { /* s = Q K^T, the tensor cores' sums chained; a K fragment serves every m tile */
        const __half *qa = qh + (lane % 16) * LD + (lane / 16) * 8;
        const __half *ka = kt + ((lane / 16) * 8 + lane % 8) * LD + ((lane / 8) % 2) * 8;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t a[MT][4]; /* the query's fragments: held (fast) or read (wide) */
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
#pragma unroll
                for (int i = 0; i < 4; i++) a[mt][i] = qf[shape::QREG ? kk : 0][i];
                if constexpr (!shape::QREG) ldsm_x4(a[mt], qa + mt * 16 * LD + kk * 16);
            }
#pragma unroll
            for (int c = 0; c < NC; c += 2) {
                uint32_t b[4];
                ldsm_x4(b, ka + c * 8 * LD + kk * 16);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) mma16816_x2(s[mt][c], s[mt][c + 1], a[mt], b);
            }
        }
    } else {
        /* s += Q K^T: steps u of (16 dims, 16 keys); a step's operands are loaded a step
         * ahead and its products added a step behind, so neither waits on the one before */
        constexpr int PAIRS = NC / 2, STEPS = HD / 16 * PAIRS;
        const __half *qa = qh + (lane % 16) * LD + (lane / 16) * 8, *qb = ql + (lane % 16) * LD + (lane / 16) * 8;
        const __half *ka = kt + ((lane / 16) * 8 + lane % 8) * LD + ((lane / 8) % 2) * 8;
        uint32_t ah[4], al[4], b[4];
        float cprev[2][4];
        ldsm_x4(ah, qa);
        ldsm_x4(al, qb);
        ldsm_x4(b, ka);
#pragma unroll
        for (int u = 0; u < STEPS; u++) {
            uint32_t nh[4], nl[4], nb[4];
            if (u + 1 < STEPS) {
                const int nk = (u + 1) / PAIRS, ncol = ((u + 1) % PAIRS) * 2;
                if (ncol == 0) ldsm_x4(nh, qa + nk * 16), ldsm_x4(nl, qb + nk * 16);
                ldsm_x4(nb, ka + ncol * 8 * LD + nk * 16);
            }
            float cur[2][4];
            mma_hilo2(cur, ah, al, b);
            if (u > 0) {
                const int pc = ((u - 1) % PAIRS) * 2;
                add4(s[0][pc], cprev[0]);
                add4(s[0][pc + 1], cprev[1]);
            }
            for (int i = 0; i < 4; i++) cprev[0][i] = cur[0][i], cprev[1][i] = cur[1][i], b[i] = nb[i];
            if (u + 1 < STEPS && ((u + 1) % PAIRS) == 0)
                for (int i = 0; i < 4; i++) ah[i] = nh[i], al[i] = nl[i];
        }
        add4(s[0][NC - 2], cprev[0]);
        add4(s[0][NC - 1], cprev[1]);
    }
    /* masks (where the tile is not wholly inside every row's range), the running max; the
     * fast kernels keep scores and max unscaled (fac > 0) and scale in the exponent's FFMA */
    const int k1 = k0 + BN - 1;
    bool whole = true;
#pragma unroll
    for (int r = 0; r < 2 * MT; r++) whole = whole && k0 >= rp.lo[r] && k1 <= rp.hi[r];
    float mx[2 * MT];
#pragma unroll
    for (int r = 0; r < 2 * MT; r++) mx[r] = m[r];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = 2 * mt + e / 2, j = k0 + c * 8 + 2 * t + (e & 1);
                float v = FAST ? s[mt][c][e] : s[mt][c][e] * rp.fac[r];
                if (!FAST && rp.cap > 0.0f) v = rp.cap * tanhf(v / rp.cap);
                s[mt][c][e] = whole || (j >= rp.lo[r] && j <= rp.hi[r]) ? v : -INFINITY;
                mx[r] = fmaxf(mx[r], s[mt][c][e]);
            }
    float base[2 * MT];
#pragma unroll
    for (int r = 0; r < 2 * MT; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        base[r] = mx[r] == -INFINITY ? 0.0f : mx[r];
        /* 0 while nothing was seen */
        const float corr = FAST ? exp2_approx((m[r] - base[r]) * rp.fac[r]) : expf(m[r] - base[r]);
        l[r] *= corr;
        m[r] = mx[r];
        const int mt = r / 2, w = r % 2;
#pragma unroll
        for (int d = 0; d < ND; d++) acc[mt][d][2 * w] *= corr, acc[mt][d][2 * w + 1] *= corr;
    }
    if constexpr (FAST) { /* p * 2^12 = 2^(s fac - base fac + 12); l sums them so scaled */
        float off[2 * MT];
#pragma unroll
        for (int r = 0; r < 2 * MT; r++) off[r] = base[r] * rp.fac[r] - P_LOG2;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int c = 0; c < NC; c++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = 2 * mt + e / 2;
                    s[mt][c][e] = exp2_approx(fmaf(s[mt][c][e], rp.fac[r], -off[r]));
                    l[r] += s[mt][c][e];
                }
    } else {
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = expf(s[0][c][e] - base[e / 2]);
                l[e / 2] += p;
                s[0][c][e] = p * P_SCALE;
            }
    }
    /* acc += P V, steps of (16 keys, 16 dims) as above; P's fragment is the scores'
     * accumulator layout, and a V fragment serves every m tile */
    if constexpr (FAST) {
        const __half *va = vt + (lane % 16) * LD + (lane / 16) * 8;
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t p[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) p_frag(p[mt], s[mt], kk);
#pragma unroll
            for (int d = 0; d < ND; d += 2) {
                uint32_t b[4];
                ldsm_x4_t(b, va + kk * 16 * LD + d * 8);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) mma16816_x2(acc[mt][d], acc[mt][d + 1], p[mt], b);
            }
        }
    } else {
        constexpr int PAIRS = ND / 2, STEPS = BN / 16 * PAIRS;
        const __half *va = vt + (lane % 16) * LD + (lane / 16) * 8;
        uint32_t ph[4], pl[4], b[4];
        float cprev[2][4];
        ldsm_x4_t(b, va);
#pragma unroll
        for (int u = 0; u < STEPS; u++) {
            const int kk = u / PAIRS, d = (u % PAIRS) * 2;
            uint32_t nb[4];
            if (u + 1 < STEPS) ldsm_x4_t(nb, va + ((u + 1) / PAIRS) * 16 * LD + ((u + 1) % PAIRS) * 16);
            if (d == 0) {
                split_pair(s[0][2 * kk][0], s[0][2 * kk][1], &ph[0], &pl[0]);
                split_pair(s[0][2 * kk][2], s[0][2 * kk][3], &ph[1], &pl[1]);
                split_pair(s[0][2 * kk + 1][0], s[0][2 * kk + 1][1], &ph[2], &pl[2]);
                split_pair(s[0][2 * kk + 1][2], s[0][2 * kk + 1][3], &ph[3], &pl[3]);
            }
            float cur[2][4];
            mma_hilo2(cur, ph, pl, b);
            if (u > 0) {
                const int pd = ((u - 1) % PAIRS) * 2;
                add4(acc[0][pd], cprev[0]);
                add4(acc[0][pd + 1], cprev[1]);
            }
            for (int i = 0; i < 4; i++) cprev[0][i] = cur[0][i], cprev[1][i] = cur[1][i], b[i] = nb[i];
        }
        add4(acc[0][ND - 2], cprev[0]);
        add4(acc[0][ND - 1], cprev[1]);
    }
}

/* grid (h / hq, row tiles, up to FLASH_SEQ_BLOCKS): block x takes query heads hq * x .. of KV head
 * x / (group / hq), block y the row tile counted from the end (longer spans start first),
 * block z the tile's sequences z, z + gridDim.z, ... in order of their first row
 * (their rows' outputs; blocks past the tile's sequences leave at once). */
template <int HD, int KIND>
__global__ static void __launch_bounds__(FLASH_THREADS, flash_shape<HD, KIND>::MIN_BLOCKS)
    k_flash(float *out, const float *q, const __half *kpool, const __half *vpool, attn_rows ar, int hq) {
    using shape = flash_shape<HD, KIND>;
    constexpr int BN = shape::BN, LD = shape::LD, ND = HD / 8, MT = shape::MT;
    constexpr bool FAST = shape::FAST;
    extern __shared__ __align__(16) unsigned char flash_smem[];
    __shared__ flash_rows rows;
    __half *qs = (__half *)flash_smem;         /* [warps][hi, lo][16][LD]; fast: [warps][16 MT][LD] */
    __half *ks = qs + shape::QROWS * LD;       /* [2 stages][BN][LD] (fast: from qs) */
    __half *vs = ks + 2 * BN * LD;             /* [2 stages][BN][LD] */

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4;
    const int bm = 16 * MT * (FLASH_WARPS / hq), wrow = (warp / hq) * 16 * MT;
    const int64_t group = ar.h / ar.hk, per_kv = group / hq, kvh = blockIdx.x / per_kv;
    const int64_t head = kvh * group + (blockIdx.x % per_kv) * hq + warp % hq;
    const int64_t r0 = (int64_t)(gridDim.y - 1 - blockIdx.y) * bm, kvd = ar.hk * HD, qd = ar.h * HD;
    const int bs = (int)ar.block_size;

    if (tid < bm) {
        const int64_t r = r0 + tid;
        int sq = -1, p = 0;
        if (r < ar.n) sq = ar.seq[r], p = ar.pos[r];
        rows.seq[tid] = sq, rows.pos[tid] = p;
        rows.lo[tid] = first_key(p, ar.window);
        rows.own[tid] = false;
    }
    __syncthreads();
    if (blockIdx.z > 0) { /* leave unless the rows hold more than blockIdx.z sequences */
        const int s0 = rows.seq[0];
        if (!__syncthreads_or(tid < bm && rows.seq[tid] >= 0 && rows.seq[tid] != s0)) return;
        bool first = tid < bm && rows.seq[tid] >= 0;
        for (int i = 0; first && i < tid; i++) first = rows.seq[i] != rows.seq[tid];
        if ((int)blockIdx.z >= __syncthreads_count(first)) return;
    }
    __half *qh = qs + warp * (FAST ? MT : 2) * 16 * LD, *ql = qh + 16 * LD;
    flash_load_q<HD, KIND>(qh, ql, rows.fac[warp], q, ar, r0 + wrow, head, lane);
    uint32_t qf[shape::QREG ? HD / 16 : 1][4] = {}; /* fast: the query's A fragments, before the K stages are loaded */
    if constexpr (shape::QREG) {
        __syncwarp();
        const __half *qa = qh + (lane % 16) * LD + (lane / 16) * 8;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) ldsm_x4(qf[kk], qa + kk * 16);
    }

    float acc[MT][ND][4], m[2 * MT], l[2 * MT];
#pragma unroll
    for (int r = 0; r < 2 * MT; r++) m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int d = 0; d < ND; d++) acc[mt][d][0] = acc[mt][d][1] = acc[mt][d][2] = acc[mt][d][3] = 0.0f;

    bool done = true; /* thread tid < bm: its row's sequence has been seen */
    if (tid < bm) done = rows.seq[tid] < 0;
    for (int k = 0;; k++) {
        /* the sequence of the first row not yet done, and its rows' key range */
        __syncthreads();
        if (tid == 0) rows.next = bm, rows.klo = INT_MAX, rows.khi = -1;
        __syncthreads();
        if (!done) atomicMin(&rows.next, tid);
        __syncthreads();
        const int first = rows.next;
        if (first == bm) break;
        const int sq = rows.seq[first];
        const bool ours = k % (int)gridDim.z == (int)blockIdx.z; /* the block's k-th sequence */
        if (!done && rows.seq[tid] == sq) {
            done = true;
            rows.own[tid] = ours;
            atomicMin(&rows.klo, rows.lo[tid]);
            atomicMax(&rows.khi, rows.pos[tid]);
        }
        __syncthreads();
        if (!ours) continue;
        const int klo = rows.klo, khi = rows.khi;

        /* this warp's rows of the sequence: their key range, and this thread's 2 MT rows */
        const int mine = wrow + lane % (16 * MT);
        const bool in = rows.seq[mine] == sq;
        int wlo = in ? rows.lo[mine] : INT_MAX, whi = in ? rows.pos[mine] : -1;
        for (int o = 16; o > 0; o >>= 1) {
            wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
            whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
        }
        row_pair rp;
        rp.cap = ar.softcap;
#pragma unroll
        for (int r = 0; r < 2 * MT; r++) {
            const int i = wrow + g + 8 * r; /* row index r = 2 mt + w: rows g + 8 w + 16 mt */
            const bool own = rows.seq[i] == sq;
            rp.lo[r] = own ? rows.lo[i] : INT_MAX, rp.hi[r] = own ? rows.pos[i] : -1;
            rp.fac[r] = rows.fac[warp][g + 8 * r];
        }

        const int32_t *table = ar.tables + (int64_t)sq * ar.table_cols;
        const int tiles = (khi - klo) / BN + 1;
        flash_load_kv<HD, KIND>(ks, vs, kpool, vpool, table, bs, kvd, kvh * HD, klo, khi, tid);
        cp_async_commit();
        for (int it = 0; it < tiles; it++) {
            const int st = it & 1, k0 = klo + it * BN;
            if (it + 1 < tiles) {
                flash_load_kv<HD, KIND>(ks + (st ^ 1) * BN * LD, vs + (st ^ 1) * BN * LD, kpool, vpool, table, bs, kvd,
                                  kvh * HD, k0 + BN, khi, tid);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            if (k0 <= whi && k0 + BN - 1 >= wlo)
                flash_tile<HD, KIND>(acc, m, l, qf, qh, ql, ks + st * BN * LD, vs + st * BN * LD, rp, k0, lane);
            __syncthreads(); /* the stage is loaded again two tiles on */
        }
    }

    /* out = acc / (l * 2^12), l summed over the row's four threads */
#pragma unroll
    for (int i = 0; i < 2 * MT; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        const int64_t r = r0 + wrow + g + 8 * i;
        if (r >= ar.n || !rows.own[wrow + g + 8 * i]) continue;
        const float den = FAST ? l[i] : l[i] * P_SCALE; /* fast: l sums p * 2^12 */
        float *o = out + r * qd + head * HD + 2 * (lane % 4);
        const int mt = i / 2, w = i % 2;
#pragma unroll
        for (int d = 0; d < ND; d++)
            *(float2 *)(o + d * 8) = make_float2(acc[mt][d][2 * w] / den, acc[mt][d][2 * w + 1] / den);
    }
}

/* ==== Launch ==== */

/* Grids of the fast kernels of at least this many blocks an SM take the wide kernels
 * (half as many blocks, of twice the rows): a 2048-row prefill of one sequence of an 8B
 * model is 1,024 fast blocks on 132 SMs, a 512-row one 256 (where the wide kernels' 128
 * blocks would leave SMs idle). */
#define WIDE_FROM_BLOCKS_PER_SM 4

template <int HD, int KIND> static void flash_attr() {
    CUDA_CHECK(cudaFuncSetAttribute(k_flash<HD, KIND>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)flash_shape<HD, KIND>::SMEM));
}

template <int HD> static void flash_attrs() {
    flash_attr<HD, FLASH_EXACT>();
    flash_attr<HD, FLASH_FAST>();
    if constexpr (HD <= 128) flash_attr<HD, FLASH_WIDE>();
}

void cuda_attention_flash_init(void) {
#define FLASH_ATTRS(H) flash_attrs<H>();
    FLASH_HDS(FLASH_ATTRS)
#undef FLASH_ATTRS
}

bool cuda_attention_flash_fits(int64_t hd) {
#define FLASH_FITS(H) if (hd == H) return true;
    FLASH_HDS(FLASH_FITS)
#undef FLASH_FITS
    return false;
}

template <int HD, int KIND>
static void flash_launch(cudaStream_t s, dim3 grid, float *out, const float *q, const void *kpool, const void *vpool,
                         const attn_rows *ar, int hq) {
    k_flash<HD, KIND><<<grid, FLASH_THREADS, flash_shape<HD, KIND>::SMEM, s>>>(
        out, q, (const __half *)kpool, (const __half *)vpool, *ar, hq);
}

template <int HD>
static void flash_run(cudaStream_t s, dim3 grid, int kind, float *out, const float *q, const void *kpool,
                      const void *vpool, const attn_rows *ar, int hq) {
    if constexpr (HD <= 128)
        if (kind == FLASH_WIDE) return flash_launch<HD, FLASH_WIDE>(s, grid, out, q, kpool, vpool, ar, hq);
    if (kind == FLASH_FAST) return flash_launch<HD, FLASH_FAST>(s, grid, out, q, kpool, vpool, ar, hq);
    flash_launch<HD, FLASH_EXACT>(s, grid, out, q, kpool, vpool, ar, hq);
}

void cuda_attention_flash(cudaStream_t s, float *out, const float *q, const void *kpool, const void *vpool,
                          const attn_rows *ar) {
    const int64_t group = ar->h / ar->hk;
    const int hq = group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;
    const int64_t x = ar->h / hq, bm = 16 * (FLASH_WARPS / hq); /* a fast block's rows */
    /* the fast max is of unscaled scores, so a soft-cap (a function of the scaled ones) takes
     * the exact kernels */
    int kind = ar->n >= FAST_FROM_ROWS && ar->scale > 0.0f && ar->softcap == 0.0f ? FLASH_FAST : FLASH_EXACT;
    const int sms = cuda_sm_count(132);
    if (kind == FLASH_FAST && ar->hd <= 128 && x * ((ar->n + bm - 1) / bm) >= (int64_t)WIDE_FROM_BLOCKS_PER_SM * sms)
        kind = FLASH_WIDE;
    const int64_t rows = kind == FLASH_WIDE ? 2 * bm : bm;
    /* blocks sharing a row tile: one a sequence, at most FLASH_SEQ_BLOCKS (a prefill of one
     * sequence launches no blocks that would only leave) */
    const int64_t z = ar->seqs > 0 && ar->seqs < FLASH_SEQ_BLOCKS ? ar->seqs : FLASH_SEQ_BLOCKS;
    const dim3 grid((unsigned)x, (unsigned)((ar->n + rows - 1) / rows), (unsigned)z);
    CELER_ASSERT(ar->n > 0 && ar->n <= (int64_t)65535 * rows);
#define FLASH_RUN(H)                                                                  \
    if (ar->hd == H) return flash_run<H>(s, grid, kind, out, q, kpool, vpool, ar, hq);
    FLASH_HDS(FLASH_RUN)
#undef FLASH_RUN
    CELER_ASSERT(!"cuda_attention_flash: a head dim without a kernel");
}

/*
 * kernels_avx2.c - AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c).
 *
 * The quantized product uses maddubs: unsigned codes times signed int8 activations into
 * int16 pairs. Where codes are at most 15 (4-bit, 2- and 3-bit, fp4's codebook) and |xq| at
 * most 127, the eight maddubs of one 32-column block (16 products per int16 lane) stay below
 * 16*15*127 = 30480 and are summed in int16 before one widening madd per block. 8-bit
 * matrices run the same code on their two nibble planes; 5- and 6-bit codes and IQ4's
 * codebook widen every step. One kernel serves every layout of pack.h.
 */
#include "backend/cpu/kernels.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

/* ==== helpers ==== */

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE __m256i bcast32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* 8 f16 or bf16 values as floats. */
INLINE __m256 load_half8(const void *p, int bf16) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    return bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                : _mm256_cvtph_ps(h);
}

/* exp(x) for x in float range: Cephes-style reduction x = n ln2 + r, degree-6 polynomial
 * in r, then scaling by 2^n through the exponent bits. */
INLINE __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* erf(z): z + z P(z^2) below |z| = 1, 1 - exp(-z^2) R(z) above, sign restored; erf rounds
 * to 1 in fp32 beyond |z| = 4, where R is clamped. P and R are Chebyshev fits in double
 * precision of erf(sqrt s) / sqrt s - 1 on s in [0, 1] (error 1.2e-9) and of erfc(z) exp(z^2)
 * in z - 2.5 on [1, 4] (error 1e-8). Max abs error 6.2e-8 over all floats, as glibc's erff. */
INLINE __m256 erf8(__m256 z) {
    static const float p[7] = {1.283791671e-1f, -3.761262667e-1f, 1.128359472e-1f, -2.685421201e-2f,
                               5.189087423e-3f, -8.016864287e-4f, 7.875875063e-5f};
    static const float r[12] = {2.108063577e-1f,  -7.434734529e-2f, 2.493819891e-2f,
                                -8.001617248e-3f, 2.465999634e-3f,  -7.333448751e-4f,
                                2.129504692e-4f,  -5.932730341e-5f, 1.436468237e-5f,
                                -3.834632179e-6f, 1.669836759e-6f,  -4.12314282e-7f};
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    const __m256 a = _mm256_andnot_ps(sign, z);
    /* |z| < 1; the clamp keeps lanes that take the other branch finite */
    const __m256 s = _mm256_min_ps(_mm256_mul_ps(a, a), one);
    __m256 ps = _mm256_set1_ps(p[6]);
    for (int i = 5; i >= 0; i--) ps = _mm256_fmadd_ps(ps, s, _mm256_set1_ps(p[i]));
    const __m256 small = _mm256_fmadd_ps(a, ps, a);
    /* 1 <= |z| */
    const __m256 zb = _mm256_min_ps(_mm256_max_ps(a, one), _mm256_set1_ps(4.0f));
    const __m256 w = _mm256_sub_ps(zb, _mm256_set1_ps(2.5f));
    __m256 rs = _mm256_set1_ps(r[11]);
    for (int i = 10; i >= 0; i--) rs = _mm256_fmadd_ps(rs, w, _mm256_set1_ps(r[i]));
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(zb, zb)));
    const __m256 large = _mm256_fnmadd_ps(e, rs, one);
    const __m256 v = _mm256_blendv_ps(large, small, _mm256_cmp_ps(a, one, _CMP_LT_OQ));
    return _mm256_or_ps(v, _mm256_and_ps(sign, z));
}

/* ==== activation quantization ==== */

void avx2_quantize_row(int8_t *q, float *d, float *s, const float *x, int64_t cols) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < cols / QBLOCK; b++) {
        const float *xb = x + b * QBLOCK;
        __m256 v[4];
        for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(xb + 8 * i);
        __m256 amax = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
            _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float mx = _mm_cvtss_f32(m);
        d[b] = mx / 127.0f;
        s[b] = hsum8(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])));
        const __m256 id = _mm256_set1_ps(mx > 0.0f ? 127.0f / mx : 0.0f);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], id)),
                i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], id));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], id)),
                i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], id));
        /* packs work within 128-bit lanes; the permute restores column order */
        const __m256i w01 = _mm256_packs_epi32(i0, i1), w23 = _mm256_packs_epi32(i2, i3);
        const __m256i b8 = _mm256_packs_epi16(w01, w23);
        _mm256_storeu_si256(
            (__m256i *)(q + b * QBLOCK),
            _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
}

/* ==== packed quantized product ==== */

/* The first n (up to 8) lanes of v to dst. */
INLINE void store_rows(float *dst, __m256 v, int n) {
    if (n >= 8) {
        _mm256_storeu_ps(dst, v);
        return;
    }
    float tmp[8];
    _mm256_storeu_ps(tmp, v);
    for (int i = 0; i < n; i++) dst[i] = tmp[i];
}

/* 0xff in byte k of 32 where bit k of m is set. */
INLINE __m256i bits_to_bytes(uint32_t m) {
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                         2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m), sel);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* 8 e8m0 or e4m3 scales at p widened to fp32, times unit (a power of two), as
 * avx512_common.h's load_scales16 widens them. */
INLINE __m256 load_scales8(const uint8_t *p, dtype t, float unit) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)p);
    if (t == DTYPE_E8M0) {
        const __m256i e = _mm256_slli_epi32(_mm256_cvtepu8_epi32(b), 23);
        return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_max_epi32(e, _mm256_set1_epi32(1 << 22))),
                             _mm256_set1_ps(unit));
    }
    const __m128i w = _mm_cvtepu8_epi16(b);
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(127)), 7),
                                   _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(128)), 8));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(unit * 256.0f));
}

/* The scales and biases of one half tile's 8 rows for the group holding column c, scales of
 * kind SK (kernels.h), the codebook's fractional bits applied. */
INLINE void half_scales(const packed_mat *w, const uint16_t *sb, int64_t c, int half, __m256 *sc,
                        __m256 *bi, int SK, int LUT) {
    const uint16_t *sup = NULL;
    const void *at = packed_group_at(w, sb, c, &sup);
    const float unit = LUT ? 1.0f / (float)(1 << w->lut_shift) : 1.0f;
    if (SK == QS_BYTE) { /* the fp4 modes: no biases */
        *sc = load_scales8((const uint8_t *)at + 8 * half, w->sc_type, unit);
        *bi = _mm256_setzero_ps();
        return;
    }
    if (SK == QS_HALF) {
        const uint16_t *g = (const uint16_t *)at + 8 * half;
        const int bf16 = w->sc_type == DTYPE_BF16;
        *sc = load_half8(g, bf16);
        if (LUT) *sc = _mm256_mul_ps(*sc, _mm256_set1_ps(unit));
        *bi = w->biased ? load_half8(g + PACK_ROWS, bf16)
                        : _mm256_mul_ps(*sc, _mm256_set1_ps(-(float)w->zero));
        return;
    }
    const uint8_t *g = (const uint8_t *)at + 8 * half;
    const __m128i gs = _mm_loadl_epi64((const __m128i *)g);
    const int u4 = w->sc_type == DTYPE_U4LO;
    const __m256i gi = w->sc_type == DTYPE_I8 ? _mm256_cvtepi8_epi32(gs)
                       : u4 ? _mm256_and_si256(_mm256_cvtepu8_epi32(gs), _mm256_set1_epi32(15))
                            : _mm256_cvtepu8_epi32(gs);
    *sc = _mm256_mul_ps(load_half8(sup + 8 * half, 0), _mm256_cvtepi32_ps(gi));
    if (LUT) *sc = _mm256_mul_ps(*sc, _mm256_set1_ps(unit));
    if (w->biased) {
        const __m256i gm =
            u4 ? _mm256_srli_epi32(_mm256_cvtepu8_epi32(gs), 4)
               : _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(g + PACK_ROWS)));
        *bi = _mm256_mul_ps(load_half8(sup + PACK_ROWS + 8 * half, 0), _mm256_cvtepi32_ps(gm));
    } else {
        *bi = _mm256_mul_ps(*sc, _mm256_set1_ps(-(float)w->zero));
    }
}

/* The codes of run k of 32 bytes of a plane's vector (pack.h): fields of L bits at k * L. */
INLINE __m256i run_codes(__m256i raw, int k, int L) {
    const __m256i field = _mm256_set1_epi8((char)((1 << L) - 1));
    return _mm256_and_si256(k ? _mm256_srli_epi16(raw, k * L) : raw, field);
}

/* 8*H rows of a tile from half h0 (H = 2: all 16) times T tokens from n0, for the layout S
 * (kernels.h; a codebook's signed values put their signs onto the activations). maddubs
 * multiplies unsigned codes by signed activations into int16 pairs; with S.s16 (one plane)
 * a block's eight runs (16 products a lane, at most 16 * 15 * 127 = 30480) sum in int16 and
 * widen once, else every run widens to int32 (8-bit: its high plane's times 16). Fewer live
 * sums beat fewer instructions there: summing each 8-bit plane in int16 spilled in prefill,
 * so only decode does. Whole tiles (decode) use each 64-byte vector whole as it arrives and
 * prefetch the weight stream a few blocks ahead, since decode waits on how fast the weights
 * arrive. P: rows come in (value, residual) pairs that add into one output row. */
INLINE void q_rows(float *y, int64_t ldy, const packed_mat *w, const uint8_t *tile,
                   const uint16_t *sb, int h0, const qrows *x, int64_t n0, int T, int H, int P,
                   const qshape S, int nrow) {
    const int64_t blocks = w->cols / QBLOCK, block_bytes = packed_block_bytes(w);
    const int L = S.lowbits, V = L, E = 8 / L, G = 1 + S.g16; /* vectors, runs of a vector */
    /* 8-bit decode sums each plane in int16 (T <= 2 leaves the registers for it) */
    const int W16 = S.planes == 2 && H == 2;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i lut = S.lut
                            ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)w->lut))
                            : _mm256_setzero_si256();
    __m256 acc[4][2];
    UNROLL for (int t = 0; t < 4; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *blk = tile + b * block_bytes;
        if (H == 2)
            UNROLL for (int k = 0; k < S.planes * V + S.hibits; k++)
                _mm_prefetch((const char *)(blk + 1024 + k * PACK_STEP), _MM_HINT_T0);
        /* [token][half][group of 16]: the block's sums, int16 pairs with s16, else int32 */
        __m256i a[4][2][2];
        UNROLL for (int t = 0; t < T; t++) UNROLL for (int h = 0; h < H; h++)
            UNROLL for (int g = 0; g < G; g++) a[t][h][g] = _mm256_setzero_si256();
        UNROLL for (int pl = 0; pl < S.planes; pl++) {
            /* 8-bit: the high nibbles' plane counts 16 times */
            const __m256i mul = S.planes == 2 && pl == 0 ? _mm256_set1_epi16(16) : ones;
            __m256i p16[2][2][2]; /* 8-bit decode: the plane's int16 sums */
            if (W16)
                UNROLL for (int t = 0; t < T; t++) UNROLL for (int h = 0; h < H; h++)
                    UNROLL for (int g = 0; g < G; g++) p16[t][h][g] = _mm256_setzero_si256();
            /* group g's vectors (all of them, but for groups of 16); the loop over them is
             * not unrolled: unrolled, the compiler spills the sums */
            UNROLL for (int g = 0; g < G; g++) for (int v = g * V / G; v < (g + 1) * V / G; v++) {
                __m256i raw[2];
                UNROLL for (int h = 0; h < H; h++) raw[h] = _mm256_loadu_si256(
                    (const __m256i *)(blk + (pl * V + v) * PACK_STEP + (h0 + h) * 32));
                UNROLL for (int k = 0; k < E; k++) {
                    const int e = v * E + k; /* columns 4e .. 4e + 3 */
                    __m256i c[2], cx[2];
                    UNROLL for (int h = 0; h < H; h++) {
                        c[h] = run_codes(raw[h], k, L);
                        UNROLL for (int hb = 0; hb < S.hibits; hb++) { /* bit L+hb, its mask */
                            uint32_t m;
                            memcpy(&m,
                                   blk + S.planes * V * PACK_STEP + hb * PACK_STEP + 8 * e +
                                       4 * (h0 + h),
                                   4);
                            const __m256i bit = _mm256_set1_epi8((char)(1 << (L + hb)));
                            c[h] = _mm256_add_epi8(c[h], _mm256_and_si256(bits_to_bytes(m), bit));
                        }
                        if (S.lut) { /* |value|; the sign goes onto x */
                            cx[h] = _mm256_shuffle_epi8(lut, c[h]);
                            c[h] = _mm256_sign_epi8(cx[h], cx[h]);
                        }
                    }
                    UNROLL for (int t = 0; t < T; t++) {
                        const __m256i xv = bcast32(x->q + (n0 + t) * x->cols + b * QBLOCK + 4 * e);
                        UNROLL for (int h = 0; h < H; h++) {
                            const __m256i p = _mm256_maddubs_epi16(
                                c[h], S.lut ? _mm256_sign_epi8(xv, cx[h]) : xv);
                            if (W16)
                                p16[t][h][g] = _mm256_add_epi16(p16[t][h][g], p);
                            else if (S.s16)
                                a[t][h][g] = _mm256_add_epi16(a[t][h][g], p);
                            else
                                a[t][h][g] =
                                    _mm256_add_epi32(a[t][h][g], _mm256_madd_epi16(p, mul));
                        }
                    }
                }
            }
            if (W16)
                UNROLL for (int t = 0; t < T; t++) UNROLL for (int h = 0; h < H; h++)
                    UNROLL for (int g = 0; g < G; g++) a[t][h][g] =
                        _mm256_add_epi32(a[t][h][g], _mm256_madd_epi16(p16[t][h][g], mul));
        }
        __m256 sc[2][2], bi[2][2];
        UNROLL for (int h = 0; h < H; h++) UNROLL for (int g = 0; g < G; g++)
            half_scales(w, sb, b * QBLOCK + 16 * g, h0 + h, &sc[h][g], &bi[h][g], S.scales, S.lut);
        UNROLL for (int t = 0; t < T; t++) {
            const int64_t xi = (n0 + t) * blocks + b;
            const __m256 d = _mm256_set1_ps(x->d[xi]);
            UNROLL for (int h = 0; h < H; h++) UNROLL for (int g = 0; g < G; g++) {
                const __m256i i32 = S.s16 ? _mm256_madd_epi16(a[t][h][g], ones) : a[t][h][g];
                const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(i32), d);
                acc[t][h] = _mm256_fmadd_ps(f, sc[h][g], acc[t][h]);
                if (t & P) continue; /* a residual row: its sums are 0 */
                const float sum = S.g16 ? x->s16[(n0 + t) * (x->cols / 16) + 2 * b + g] : x->s[xi];
                acc[t][h] = _mm256_fmadd_ps(bi[h][g], _mm256_set1_ps(sum), acc[t][h]);
            }
        }
    }
    /* P: row t + 1 is row t's residual and adds into the same output row */
    UNROLL for (int t = 0; t < T; t += 1 + P) {
        float *dst = y + ((n0 + t) >> P) * ldy;
        UNROLL for (int h = 0; h < H; h++) {
            const __m256 v = P ? _mm256_add_ps(acc[t][h], acc[t + P][h]) : acc[t][h];
            store_rows(dst + 8 * h, v, nrow - 8 * h);
        }
    }
}

/* Three shapes of rows per layout keep the instantiations (and the build) small: 4 rows by
 * half tiles; pairs of rows (decode, or the last of a prompt) and a single row by whole
 * tiles. */
INLINE void gemm_q_shape(float *y, int64_t ldy, const packed_mat *w, int64_t t0, int64_t t1,
                         const qrows *x, int P, const qshape S) {
    const int64_t tile_bytes = packed_tile_bytes(w), tile_sb = packed_tile_sb(w);
    for (int64_t t = t0; t < t1; t++) {
        const uint8_t *tile = w->codes + t * tile_bytes;
        const uint16_t *sb = w->sb + t * tile_sb;
        const int64_t r0 = t * PACK_ROWS;
        const int nrow = w->rows - r0 < PACK_ROWS ? (int)(w->rows - r0) : PACK_ROWS;
        int64_t n = 0;
        if (x->n > 2) { /* prefill */
            n = x->n / 4 * 4;
            for (int h = 0; h < 2 && 8 * h < nrow; h++)
                for (int64_t k = 0; k < n; k += 4)
                    q_rows(y + r0 + 8 * h, ldy, w, tile, sb, h, x, k, 4, 1, P, S, nrow - 8 * h);
        }
        for (; n + 2 <= x->n; n += 2) q_rows(y + r0, ldy, w, tile, sb, 0, x, n, 2, 2, P, S, nrow);
        if (n < x->n) q_rows(y + r0, ldy, w, tile, sb, 0, x, n, 1, 2, P, S, nrow);
    }
}

static void gemm_q(float *y, int64_t ldy, const packed_mat *w, int64_t t0, int64_t t1,
                   const qrows *x) {
#define PRODUCT(S)                                                                                 \
    do {                                                                                           \
        if (x->pairs)                                                                              \
            gemm_q_shape(y, ldy, w, t0, t1, x, 1, S);                                              \
        else                                                                                       \
            gemm_q_shape(y, ldy, w, t0, t1, x, 0, S);                                              \
    } while (0)
    QSHAPE_DISPATCH(w, PRODUCT);
#undef PRODUCT
}

/* ==== dense product ==== */

INLINE __m256 load_w8(const void *base, int64_t i, dtype t) {
    if (t == DTYPE_F32) return _mm256_loadu_ps((const float *)base + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + i));
    if (t == DTYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* R rows from r times T tokens from n0. */
INLINE void dense_tile(float *y, int64_t ldy, const matview *w, int64_t r, const float *x,
                       int64_t n0, int R, int T, dtype type) {
    const int64_t k = w->cols, k8 = k & ~(int64_t)7;
    __m256 acc[4][2];
    _Pragma("GCC unroll 8") for (int i = 0; i < R; i++)
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) acc[i][t] = _mm256_setzero_ps();
    for (int64_t c = 0; c < k8; c += 8) {
        __m256 xv[2];
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) xv[t] =
            _mm256_loadu_ps(x + (n0 + t) * k + c);
        _Pragma("GCC unroll 8") for (int i = 0; i < R; i++) {
            const __m256 wv = load_w8(w->data, (r + i) * k + c, type);
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) acc[i][t] =
                _mm256_fmadd_ps(wv, xv[t], acc[i][t]);
        }
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < R; i++)
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
        float s = hsum8(acc[i][t]);
        for (int64_t c = k8; c < k; c++)
            s += dtype_load_f32(type, w->data, (r + i) * k + c) * x[(n0 + t) * k + c];
        y[(n0 + t) * ldy + r + i] = s;
    }
}

INLINE void gemm_dense_type(float *y, int64_t ldy, const matview *w, int64_t r0, int64_t r1,
                            const float *x, int64_t n, dtype type) {
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        int64_t t = 0;
        for (; t + 2 <= n; t += 2) dense_tile(y, ldy, w, r, x, t, 4, 2, type);
        if (t < n) dense_tile(y, ldy, w, r, x, t, 4, 1, type);
    }
    for (; r < r1; r++) {
        int64_t t = 0;
        for (; t + 2 <= n; t += 2) dense_tile(y, ldy, w, r, x, t, 1, 2, type);
        if (t < n) dense_tile(y, ldy, w, r, x, t, 1, 1, type);
    }
}

void avx2_gemm_dense(float *y, int64_t ldy, const matview *w, int64_t r0, int64_t r1,
                     const float *x, int64_t n) {
    switch (w->type) {
    case DTYPE_F32:
        gemm_dense_type(y, ldy, w, r0, r1, x, n, DTYPE_F32);
        break;
    case DTYPE_F16:
        gemm_dense_type(y, ldy, w, r0, r1, x, n, DTYPE_F16);
        break;
    default:
        gemm_dense_type(y, ldy, w, r0, r1, x, n, DTYPE_BF16);
        break;
    }
}

/* ==== attention pieces ==== */

/* Four query vectors at a time: each row of kt (one dimension, 16 keys) is loaded once
 * and feeds 4 x 2 accumulators; no horizontal sums. */
INLINE void scores_rows(float *s, const float *q, int64_t ldq, const float *kt, int64_t hd, int R) {
    __m256 acc[4][2];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t c = 0; c < hd; c++) {
        const __m256 k0 = _mm256_loadu_ps(kt + c * ATT_BLOCK),
                     k1 = _mm256_loadu_ps(kt + c * ATT_BLOCK + 8);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const __m256 qb = _mm256_broadcast_ss(q + r * ldq + c);
            acc[r][0] = _mm256_fmadd_ps(qb, k0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(qb, k1, acc[r][1]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(s + r * ATT_BLOCK, acc[r][0]);
        _mm256_storeu_ps(s + r * ATT_BLOCK + 8, acc[r][1]);
    }
}

void avx2_attn_scores(float *s, const float *q, int64_t ldq, int64_t nq, const float *kt,
                      int64_t hd) {
    int64_t i = 0;
    for (; i + 4 <= nq; i += 4) scores_rows(s + i * ATT_BLOCK, q + i * ldq, ldq, kt, hd, 4);
    for (; i < nq; i++) scores_rows(s + i * ATT_BLOCK, q + i * ldq, ldq, kt, hd, 1);
}

/* Four query vectors at a time: each value row chunk is loaded once for all four. */
INLINE void pv_rows(float *o, int64_t ldo, const float *corr, const float *p, const float *v,
                    int64_t ldv, int64_t hd, int R) {
    const int64_t h8 = hd & ~(int64_t)7;
    for (int64_t c = 0; c < h8; c += 8) {
        __m256 acc[4];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] =
            _mm256_mul_ps(_mm256_loadu_ps(o + r * ldo + c), _mm256_set1_ps(corr[r]));
        for (int j = 0; j < ATT_BLOCK; j++) {
            const __m256 vj = _mm256_loadu_ps(v + j * ldv + c);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] =
                _mm256_fmadd_ps(_mm256_broadcast_ss(p + r * ATT_BLOCK + j), vj, acc[r]);
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
            _mm256_storeu_ps(o + r * ldo + c, acc[r]);
    }
    for (int r = 0; r < R; r++)
        for (int64_t c = h8; c < hd; c++) {
            float acc = o[r * ldo + c] * corr[r];
            for (int j = 0; j < ATT_BLOCK; j++) acc += p[r * ATT_BLOCK + j] * v[j * ldv + c];
            o[r * ldo + c] = acc;
        }
}

void avx2_attn_pv(float *o, int64_t ldo, const float *corr, const float *p, int64_t nq,
                  const float *v, int64_t ldv, int64_t hd) {
    int64_t i = 0;
    for (; i + 4 <= nq; i += 4)
        pv_rows(o + i * ldo, ldo, corr + i, p + i * ATT_BLOCK, v, ldv, hd, 4);
    for (; i < nq; i++) pv_rows(o + i * ldo, ldo, corr + i, p + i * ATT_BLOCK, v, ldv, hd, 1);
}

float avx2_exp_sum(float *x, int64_t n, float m) {
    const __m256 mv = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), mv));
        _mm256_storeu_ps(x + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    float s = hsum8(sum);
    for (; j < n; j++) s += (x[j] = expf(x[j] - m));
    return s;
}

/* F16C: eight halves per instruction, exact. */
void avx2_f16_to_f32(float *y, const uint16_t *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = _cvtsh_ss(x[i]);
}

/* ==== LayerNorm and activations ==== */

void avx2_layernorm(float *y, const float *x, const float *w, const float *b, int64_t d,
                    float eps) {
    const int64_t d8 = d & ~(int64_t)7;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < d8; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + i));
    float sum = hsum8(acc);
    for (int64_t i = d8; i < d; i++) sum += x[i];
    const float mean = sum / (float)d;
    const __m256 mv = _mm256_set1_ps(mean);
    acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < d8; i += 8) {
        const __m256 t = _mm256_sub_ps(_mm256_loadu_ps(x + i), mv);
        acc = _mm256_fmadd_ps(t, t, acc);
    }
    float ss = hsum8(acc);
    for (int64_t i = d8; i < d; i++) ss += (x[i] - mean) * (x[i] - mean);
    const float inv = 1.0f / sqrtf(ss / (float)d + eps);
    const __m256 iv = _mm256_set1_ps(inv);
    for (int64_t i = 0; i < d8; i += 8) {
        const __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv), iv);
        const __m256 bias = b ? _mm256_loadu_ps(b + i) : _mm256_setzero_ps();
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(t, _mm256_loadu_ps(w + i), bias));
    }
    for (int64_t i = d8; i < d; i++) y[i] = (x[i] - mean) * inv * w[i] + (b ? b[i] : 0.0f);
}

static __m256 gelu_erf8(__m256 x) {
    const __m256 e = erf8(_mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f)));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x),
                         _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* 0.5 (1 + tanh u) = 1 / (1 + exp(-2u)): no tanh needed, and no cancellation in 1 + tanh u
 * for negative u. u is formed in the reference's order. */
static __m256 gelu_tanh8(__m256 x) {
    const __m256 x3 =
        _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), x), x), x);
    const __m256 u2 =
        _mm256_mul_ps(_mm256_set1_ps(-2.0f * 0.79788456080286536f), _mm256_add_ps(x, x3));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(u2)));
}

static __m256 quick_gelu8(__m256 x) {
    const __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(-1.702f), x));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* f over x[m] in steps of 8; the tail goes through the same f from a padded copy, so every
 * element gets the same arithmetic. */
INLINE void act_rows(float *y, const float *x, int64_t m, __m256 (*f)(__m256)) {
    int64_t i = 0;
    for (; i + 8 <= m; i += 8) _mm256_storeu_ps(y + i, f(_mm256_loadu_ps(x + i)));
    if (i < m) {
        float t[8] = {0};
        memcpy(t, x + i, sizeof(float) * (size_t)(m - i));
        _mm256_storeu_ps(t, f(_mm256_loadu_ps(t)));
        memcpy(y + i, t, sizeof(float) * (size_t)(m - i));
    }
}

static __m256 silu8(__m256 x) {
    return _mm256_div_ps(
        x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

/* y[m] = f(gate[m]) * up[m] in steps of 8, the tail from padded copies as in act_rows. */
INLINE void glu_rows(float *y, const float *gate, const float *up, int64_t m, __m256 (*f)(__m256)) {
    int64_t i = 0;
    for (; i + 8 <= m; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_mul_ps(f(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
    if (i < m) {
        float g[8] = {0}, u[8] = {0};
        memcpy(g, gate + i, sizeof(float) * (size_t)(m - i));
        memcpy(u, up + i, sizeof(float) * (size_t)(m - i));
        _mm256_storeu_ps(g, _mm256_mul_ps(f(_mm256_loadu_ps(g)), _mm256_loadu_ps(u)));
        memcpy(y + i, g, sizeof(float) * (size_t)(m - i));
    }
}

void avx2_glu(float *y, const float *gate, const float *up, int64_t m, backend_act act) {
    switch (act) {
    case BACKEND_ACT_SILU:
        glu_rows(y, gate, up, m, silu8);
        break;
    case BACKEND_ACT_GELU_ERF:
        glu_rows(y, gate, up, m, gelu_erf8);
        break;
    case BACKEND_ACT_GELU_TANH:
        glu_rows(y, gate, up, m, gelu_tanh8);
        break;
    case BACKEND_ACT_QUICK_GELU:
        glu_rows(y, gate, up, m, quick_gelu8);
        break;
    }
}

void avx2_act(float *y, const float *x, int64_t m, backend_act kind) {
    switch (kind) {
    case BACKEND_ACT_SILU:
        act_rows(y, x, m, silu8);
        break;
    case BACKEND_ACT_GELU_ERF:
        act_rows(y, x, m, gelu_erf8);
        break;
    case BACKEND_ACT_GELU_TANH:
        act_rows(y, x, m, gelu_tanh8);
        break;
    case BACKEND_ACT_QUICK_GELU:
        act_rows(y, x, m, quick_gelu8);
        break;
    }
}

/* tanh u = sign(u) (1 - e) / (1 + e) with e = exp(-2|u|) in (0, 1]: nothing overflows, and
 * near 0 the absolute error stays near fp32's epsilon (what capped scores and logits feed
 * is a softmax, which sees absolute differences). */
static __m256 tanh8(__m256 u) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    const __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign, u)));
    const __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    return _mm256_or_ps(t, _mm256_and_ps(sign, u));
}

void avx2_softcap(float *x, float cap, int64_t n) {
    const __m256 c = _mm256_set1_ps(cap);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(c, tanh8(_mm256_div_ps(_mm256_loadu_ps(x + i), c))));
    if (i < n) { /* the tail through the same arithmetic, from a padded copy */
        float t[8] = {0};
        memcpy(t, x + i, sizeof(float) * (size_t)(n - i));
        _mm256_storeu_ps(t, _mm256_mul_ps(c, tanh8(_mm256_div_ps(_mm256_loadu_ps(t), c))));
        memcpy(x + i, t, sizeof(float) * (size_t)(n - i));
    }
}

const cpu_kernels cpu_kernels_avx2 = {
    .isa = CPU_ISA_AVX2,
    .quantize_row = avx2_quantize_row,
    .gemm_q = gemm_q,
    .gemm_dense = avx2_gemm_dense,
    .attn_scores = avx2_attn_scores,
    .attn_pv = avx2_attn_pv,
    .exp_sum = avx2_exp_sum,
    .glu = avx2_glu,
    .f16_to_f32 = avx2_f16_to_f32,
    .layernorm = avx2_layernorm,
    .act = avx2_act,
    .softcap = avx2_softcap,
};

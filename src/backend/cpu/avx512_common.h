/*
 * avx512_common.h - AVX-512 pieces the AVX-512 and AMX kernel files share (each is compiled
 * with the AVX-512 flags; never include this elsewhere): scale loads (16-bit, e8m0, e4m3) and
 * the scales of a packed tile's group (pack.h's layouts).
 */
#ifndef CELER_BACKEND_CPU_AVX512_COMMON_H
#define CELER_BACKEND_CPU_AVX512_COMMON_H

#include "backend/cpu/kernels.h"

#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

/* 16 f16 or bf16 values widened to fp32. */
INLINE __m512 load_half16(const uint16_t *p, int bf16) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                : _mm512_cvtph_ps(h);
}

/* 16 e8m0 or e4m3 scales at p widened to fp32, times unit (exact: a power of two). e8m0
 * byte b is 2^(b - 127): b << 23 as float bits, and 2^-127 (a subnormal) for b = 0. e4m3 bits
 * shifted into f16's places are the same value over 2^8 (subnormals included), which unit
 * takes back. */
INLINE __m512 load_scales16(const uint8_t *p, dtype t, float unit) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    if (t == DTYPE_E8M0) {
        const __m512i e = _mm512_slli_epi32(_mm512_cvtepu8_epi32(b), 23);
        return _mm512_mul_ps(_mm512_castsi512_ps(_mm512_max_epi32(e, _mm512_set1_epi32(1 << 22))),
                             _mm512_set1_ps(unit));
    }
    const __m256i w = _mm256_cvtepu8_epi16(b);
    const __m256i h =
        _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(127)), 7),
                        _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(128)), 8));
    return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(unit * 256.0f));
}

/* The scales and biases of the group holding column c for the 16 rows of a tile (pack.h's
 * layouts), scales of kind SK (kernels.h), the codebook's fractional bits applied (LUT: w has
 * a codebook). Products pass SK and LUT as constants, so only their kind's loads remain. */
INLINE void group_scales(const packed_mat *w, const uint16_t *sb, int64_t c, __m512 *sc, __m512 *bi,
                         int SK, int LUT) {
    const uint16_t *sup = NULL;
    const void *at = packed_group_at(w, sb, c, &sup);
    const float unit = LUT ? 1.0f / (float)(1 << w->lut_shift) : 1.0f;
    if (SK == QS_BYTE) { /* the fp4 modes: no biases */
        *sc = load_scales16(at, w->sc_type, unit);
        *bi = _mm512_setzero_ps();
        return;
    }
    if (SK == QS_HALF) {
        const uint16_t *g = at;
        const int bf16 = w->sc_type == DTYPE_BF16;
        *sc = load_half16(g, bf16);
        if (LUT) *sc = _mm512_mul_ps(*sc, _mm512_set1_ps(unit));
        *bi = w->biased ? load_half16(g + PACK_ROWS, bf16)
                        : _mm512_mul_ps(*sc, _mm512_set1_ps(-(float)w->zero));
        return;
    }
    const uint8_t *g = at;
    const __m128i gs = _mm_loadu_si128((const __m128i *)g);
    const int u4 = w->sc_type == DTYPE_U4LO;
    const __m512i gi = w->sc_type == DTYPE_I8 ? _mm512_cvtepi8_epi32(gs)
                       : u4 ? _mm512_and_si512(_mm512_cvtepu8_epi32(gs), _mm512_set1_epi32(15))
                            : _mm512_cvtepu8_epi32(gs);
    *sc = _mm512_mul_ps(load_half16(sup, 0), _mm512_cvtepi32_ps(gi));
    if (LUT) *sc = _mm512_mul_ps(*sc, _mm512_set1_ps(unit));
    if (w->biased) {
        const __m512i gm =
            u4 ? _mm512_srli_epi32(_mm512_cvtepu8_epi32(gs), 4)
               : _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(g + PACK_ROWS)));
        *bi = _mm512_mul_ps(load_half16(sup + PACK_ROWS, 0), _mm512_cvtepi32_ps(gm));
    } else {
        *bi = _mm512_mul_ps(*sc, _mm512_set1_ps(-(float)w->zero));
    }
}

#endif

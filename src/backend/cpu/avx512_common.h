/*
 * avx512_common.h - AVX-512 pieces the AVX-512 and AMX kernel files share (each is compiled
 * with the AVX-512 flags; never include this elsewhere): 16-bit scale loads and the
 * scales of a packed tile's group (pack.h's layouts).
 */
#ifndef CELER_BACKEND_CPU_AVX512_COMMON_H
#define CELER_BACKEND_CPU_AVX512_COMMON_H

#include "backend/cpu/pack.h"

#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

/* 16 f16 or bf16 values widened to fp32. */
INLINE __m512 load_half16(const uint16_t *p, int bf16) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                : _mm512_cvtph_ps(h);
}

/* The scales and biases of the group holding column c for the 16 rows of a tile (pack.h's
 * layouts). */
INLINE void group_scales(const packed_mat *w, const uint16_t *sb, int64_t c, __m512 *sc,
                         __m512 *bi) {
    const int parts = w->biased ? 2 : 1;
    if (!w->super) {
        const uint16_t *g = sb + (c / w->group) * parts * PACK_ROWS;
        *sc = load_half16(g, w->bf16);
        *bi = w->biased ? load_half16(g + PACK_ROWS, w->bf16)
                        : _mm512_mul_ps(*sc, _mm512_set1_ps(-(float)w->zero));
        return;
    }
    const uint16_t *sup = sb + (c / w->super) * packed_super_words(w);
    const uint8_t *g =
        (const uint8_t *)(sup + parts * PACK_ROWS) + (c % w->super / w->group) * parts * PACK_ROWS;
    const __m128i gs = _mm_loadu_si128((const __m128i *)g);
    const __m512i gi = w->sc_signed ? _mm512_cvtepi8_epi32(gs) : _mm512_cvtepu8_epi32(gs);
    *sc = _mm512_mul_ps(load_half16(sup, 0), _mm512_cvtepi32_ps(gi));
    if (w->biased) {
        const __m128i gm = _mm_loadu_si128((const __m128i *)(g + PACK_ROWS));
        *bi = _mm512_mul_ps(load_half16(sup + PACK_ROWS, 0),
                            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(gm)));
    } else {
        *bi = _mm512_mul_ps(*sc, _mm512_set1_ps(-(float)w->zero));
    }
}

#endif

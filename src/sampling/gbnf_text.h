/*
 * gbnf_text.h - writing GBNF text (llama.cpp's grammar syntax): a growable text buffer with
 * a size cap, string literals and character classes escaped for GBNF, code point sets, and a
 * UTF-8 decoder. Shared by the JSON Schema and regex compilers (json_schema.c, regex_gbnf.c).
 *
 * It does not parse GBNF or check a grammar; the grammar engine does that.
 */
#ifndef CELER_SAMPLING_GBNF_TEXT_H
#define CELER_SAMPLING_GBNF_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The largest grammar text either compiler writes (bytes); above it compiling fails with a
 * message rather than growing without bound. */
#define GBNF_TEXT_MAX ((size_t)4 << 20)

/* The largest count a bounded repetition {m,n} may carry (maxItems, maxLength, regex
 * {m,n}); larger counts are refused. */
#define GBNF_REPEAT_MAX 1000

typedef struct gbnf_buf {
    char *s; /* NUL-terminated when len > 0 or after any append */
    size_t len, cap;
    int failed; /* 0, GBNF_BUF_NO_MEMORY or GBNF_BUF_TOO_LARGE: later appends do nothing */
} gbnf_buf;

enum { GBNF_BUF_NO_MEMORY = 1, GBNF_BUF_TOO_LARGE = 2 };

void gbnf_buf_putn(gbnf_buf *b, const char *s, size_t n);
void gbnf_buf_puts(gbnf_buf *b, const char *s);
void gbnf_buf_printf(gbnf_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void gbnf_buf_free(gbnf_buf *b);

/* Appends a GBNF string literal ("...") matching exactly the UTF-8 bytes s[n]. */
void gbnf_put_literal(gbnf_buf *b, const char *s, size_t n);

/* A set of Unicode code points as sorted, disjoint, non-adjacent ranges. */
typedef struct gbnf_range {
    uint32_t lo, hi;
} gbnf_range;
typedef struct gbnf_cset {
    gbnf_range *r;
    size_t n, cap;
    bool failed; /* out of memory */
} gbnf_cset;

#define GBNF_CP_MAX 0x10FFFFu

void gbnf_cset_add(gbnf_cset *s, uint32_t lo, uint32_t hi);
void gbnf_cset_add_set(gbnf_cset *s, const gbnf_cset *t);
/* Sorts and merges; every other cset function expects (and keeps) a normalized set. */
void gbnf_cset_normalize(gbnf_cset *s);
/* Replaces s with its complement in [0, GBNF_CP_MAX]. */
void gbnf_cset_negate(gbnf_cset *s);
/* Removes [lo, hi] from s. */
void gbnf_cset_remove(gbnf_cset *s, uint32_t lo, uint32_t hi);
bool gbnf_cset_has(const gbnf_cset *s, uint32_t cp);
void gbnf_cset_free(gbnf_cset *s);
/* Appends s as one GBNF character class "[...]" (s must not be empty). */
void gbnf_put_cset(gbnf_buf *b, const gbnf_cset *s);

/* The longest root name or rule prefix accepted. */
#define GBNF_NAME_MAX 64
/* Whether s is a GBNF rule name (letters, digits, '-'; at most GBNF_NAME_MAX bytes). */
bool gbnf_name_ok(const char *s, bool allow_empty);

/* Decodes one UTF-8 code point from s[n] (n > 0): its length in bytes, or 0 when the bytes
 * are not valid UTF-8 (overlong forms, surrogates and truncation included). */
size_t gbnf_utf8_decode(const char *s, size_t n, uint32_t *cp);
/* Encodes code point cp (at most U+10FFFF) as UTF-8 into out[4]; returns its length. */
size_t gbnf_utf8_encode(uint32_t cp, char *out);

#endif

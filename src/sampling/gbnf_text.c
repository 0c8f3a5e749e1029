/*
 * gbnf_text.c - the GBNF writing helpers of gbnf_text.h: buffer, escaping, code point sets.
 *
 * Escaping follows llama.cpp's GBNF: inside "..." and [...] the characters " \ ] [ - ^ and
 * every control or non-printing ASCII byte are written as escapes (\" \\ \] \x1f ...); other
 * code points are written as raw UTF-8.
 */
#include "sampling/gbnf_text.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== Buffer ==== */

static bool buf_reserve(gbnf_buf *b, size_t extra) {
    if (b->failed) return false;
    if (extra > GBNF_TEXT_MAX || b->len + extra > GBNF_TEXT_MAX) {
        b->failed = GBNF_BUF_TOO_LARGE;
        return false;
    }
    if (b->len + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) {
        b->failed = GBNF_BUF_NO_MEMORY;
        return false;
    }
    b->s = s, b->cap = cap;
    return true;
}

void gbnf_buf_putn(gbnf_buf *b, const char *s, size_t n) {
    if (!buf_reserve(b, n)) return;
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

void gbnf_buf_puts(gbnf_buf *b, const char *s) {
    gbnf_buf_putn(b, s, strlen(s));
}

void gbnf_buf_printf(gbnf_buf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        gbnf_buf_putn(b, tmp, (size_t)n);
        return;
    }
    if (!buf_reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void gbnf_buf_free(gbnf_buf *b) {
    free(b->s);
    *b = (gbnf_buf){0};
}

/* ==== Escaping ==== */

/* Appends code point cp as it must appear inside a literal or a class. */
static void put_char(gbnf_buf *b, uint32_t cp, bool in_class) {
    char tmp[16];
    if (cp == '"' || cp == '\\' ||
        (in_class && (cp == ']' || cp == '[' || cp == '-' || cp == '^'))) {
        tmp[0] = '\\', tmp[1] = (char)cp;
        gbnf_buf_putn(b, tmp, 2);
    } else if (cp == '\n') {
        gbnf_buf_puts(b, "\\n");
    } else if (cp == '\r') {
        gbnf_buf_puts(b, "\\r");
    } else if (cp == '\t') {
        gbnf_buf_puts(b, "\\t");
    } else if (cp < 0x20 || cp == 0x7f) {
        gbnf_buf_printf(b, "\\x%02X", (unsigned)cp);
    } else if (cp < 0x80) {
        tmp[0] = (char)cp;
        gbnf_buf_putn(b, tmp, 1);
    } else if (cp < 0xA0 || cp >= 0xD800) {
        /* C1 controls, surrogates and private use have no printable form; the rest above
         * U+D7FF is escaped too, to keep the text readable in any terminal. */
        if (cp > 0xFFFF)
            gbnf_buf_printf(b, "\\U%08X", (unsigned)cp);
        else
            gbnf_buf_printf(b, "\\u%04X", (unsigned)cp);
    } else {
        gbnf_buf_putn(b, tmp, gbnf_utf8_encode(cp, tmp));
    }
}

void gbnf_put_literal(gbnf_buf *b, const char *s, size_t n) {
    gbnf_buf_putn(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = gbnf_utf8_decode(s + i, n - i, &cp);
        if (!k) cp = (unsigned char)s[i], k = 1; /* not UTF-8 (callers check): one code point */
        put_char(b, cp, false);
        i += k;
    }
    gbnf_buf_putn(b, "\"", 1);
}

/* ==== Code point sets ==== */

void gbnf_cset_add(gbnf_cset *s, uint32_t lo, uint32_t hi) {
    if (s->failed || lo > hi) return;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        gbnf_range *r = realloc(s->r, cap * sizeof *r);
        if (!r) {
            s->failed = true;
            return;
        }
        s->r = r, s->cap = cap;
    }
    s->r[s->n++] = (gbnf_range){lo, hi};
}

void gbnf_cset_add_set(gbnf_cset *s, const gbnf_cset *t) {
    for (size_t i = 0; i < t->n; i++) gbnf_cset_add(s, t->r[i].lo, t->r[i].hi);
    if (t->failed) s->failed = true;
}

static int range_cmp(const void *a, const void *b) {
    const gbnf_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

void gbnf_cset_normalize(gbnf_cset *s) {
    if (s->n < 2) return;
    qsort(s->r, s->n, sizeof *s->r, range_cmp);
    size_t k = 0;
    for (size_t i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[k].hi + 1) {
            if (s->r[i].hi > s->r[k].hi) s->r[k].hi = s->r[i].hi;
        } else {
            s->r[++k] = s->r[i];
        }
    }
    s->n = k + 1;
}

void gbnf_cset_negate(gbnf_cset *s) {
    gbnf_cset t = {0};
    uint32_t next = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->r[i].lo > next) gbnf_cset_add(&t, next, s->r[i].lo - 1);
        next = s->r[i].hi + 1;
    }
    if (next <= GBNF_CP_MAX) gbnf_cset_add(&t, next, GBNF_CP_MAX);
    t.failed |= s->failed;
    free(s->r);
    *s = t;
}

void gbnf_cset_remove(gbnf_cset *s, uint32_t lo, uint32_t hi) {
    gbnf_cset t = {0};
    for (size_t i = 0; i < s->n; i++) {
        gbnf_range r = s->r[i];
        if (r.hi < lo || r.lo > hi) {
            gbnf_cset_add(&t, r.lo, r.hi);
            continue;
        }
        if (r.lo < lo) gbnf_cset_add(&t, r.lo, lo - 1);
        if (r.hi > hi) gbnf_cset_add(&t, hi + 1, r.hi);
    }
    t.failed |= s->failed;
    free(s->r);
    *s = t;
}

bool gbnf_cset_has(const gbnf_cset *s, uint32_t cp) {
    for (size_t i = 0; i < s->n; i++)
        if (cp >= s->r[i].lo && cp <= s->r[i].hi) return true;
    return false;
}

void gbnf_cset_free(gbnf_cset *s) {
    free(s->r);
    *s = (gbnf_cset){0};
}

void gbnf_put_cset(gbnf_buf *b, const gbnf_cset *s) {
    gbnf_buf_putn(b, "[", 1);
    for (size_t i = 0; i < s->n; i++) {
        put_char(b, s->r[i].lo, true);
        if (s->r[i].hi != s->r[i].lo) {
            if (s->r[i].hi > s->r[i].lo + 1) gbnf_buf_putn(b, "-", 1);
            put_char(b, s->r[i].hi, true);
        }
    }
    gbnf_buf_putn(b, "]", 1);
}

/* ==== Names and UTF-8 ==== */

bool gbnf_name_ok(const char *s, bool allow_empty) {
    size_t n = strlen(s);
    if ((!n && !allow_empty) || n > GBNF_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-'))
            return false;
    }
    return true;
}

size_t gbnf_utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) return out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12), out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18), out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F)), out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t gbnf_utf8_decode(const char *s, size_t n, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) {
        *cp = u[0];
        return 1;
    }
    size_t len;
    uint32_t c, min;
    if ((u[0] & 0xE0) == 0xC0)
        len = 2, c = u[0] & 0x1F, min = 0x80;
    else if ((u[0] & 0xF0) == 0xE0)
        len = 3, c = u[0] & 0x0F, min = 0x800;
    else if ((u[0] & 0xF8) == 0xF0)
        len = 4, c = u[0] & 0x07, min = 0x10000;
    else
        return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80) return 0;
        c = (c << 6) | (u[i] & 0x3F);
    }
    if (c < min || c > GBNF_CP_MAX || (c >= 0xD800 && c < 0xE000)) return 0;
    *cp = c;
    return len;
}

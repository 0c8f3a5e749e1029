/*
 * tok_text.c - the text stages of a tokenizer: UTF-8 helpers, patterns (PCRE2 or
 * literal), normalizers, pre-tokenizers and decoders, each as Hugging Face `tokenizers`
 * defines them.
 *
 * Only the token ids matter here, so pieces carry no offsets back into the input
 * (Hugging Face tracks alignments; celer does not need them). Regexes are compiled by
 * tok_load.c through pattern_compile and matched with PCRE2 in UTF + UCP mode, JIT when
 * the platform has it. This file does not parse JSON.
 */
#include "tokenizer/tok_impl.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ==== Strings ==== */

bool sbuf_add(sbuf *b, const void *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return false;
        b->p = q, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

bool sbuf_addc(sbuf *b, char c) { return sbuf_add(b, &c, 1); }

bool pieces_add(pieces *l, const char *s, size_t n, bool first) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        piece *v = realloc(l->v, sizeof *v * cap);
        if (!v) return false;
        l->v = v, l->cap = cap;
    }
    char *c = malloc(n + 1);
    if (!c) return false;
    if (n) memcpy(c, s, n);
    c[n] = 0;
    l->v[l->n++] = (piece){c, n, first};
    return true;
}

void pieces_free(pieces *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i].s);
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* ==== UTF-8 ==== */

int utf8_next(const char *s, size_t n, uint32_t *cp, int *bad) {
    const uint8_t *u = (const uint8_t *)s;
    if (bad) *bad = 1;
    if (n == 0) return 0;
    uint8_t c = u[0];
    if (c < 0x80) return *cp = c, 1;
    int len;
    uint8_t lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) len = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    else return 0;
    uint32_t v = c & (0x3f >> (len - 1));
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return 0;
        uint8_t b = u[i];
        if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xbf)) return 0;
        if (bad) *bad = i + 1;
        v = v << 6 | (b & 0x3f);
    }
    *cp = v;
    return len;
}

size_t utf8_check(const char *s, size_t n) {
    size_t i = 0;
    uint32_t cp;
    while (i < n) {
        int l = utf8_next(s + i, n - i, &cp, NULL);
        if (!l) return i;
        i += (size_t)l;
    }
    return n;
}

int utf8_put(char *out, uint32_t cp) {
    return (int)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)out);
}

bool utf8_lossy(sbuf *out, const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int bad, l = utf8_next(s + i, n - i, &cp, &bad);
        if (l) {
            if (!sbuf_add(out, s + i, (size_t)l)) return false;
            i += (size_t)l;
        } else {
            if (!sbuf_add(out, "\xef\xbf\xbd", 3)) return false;
            i += (size_t)bad;
        }
    }
    return sbuf_add(out, "", 0);
}

bool unicode_is_space(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000;
}

static bool unicode_is_numeric(uint32_t cp) {
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

/* ==== Patterns ==== */

celer_status pattern_compile(pattern *p, const char *re, size_t n, const char *where,
                             const char *file, celer_error *e) {
    int err;
    PCRE2_SIZE off;
    p->re = pcre2_compile((PCRE2_SPTR)re, n, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    if (!p->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return error_set(e, CELER_STATUS_BAD_FILE, "%s: %s: bad regex at offset %zu: %s", file, where,
                         (size_t)off, (const char *)msg);
    }
    pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE); /* the interpreter serves if JIT is absent */
    return CELER_OK;
}

void pattern_free(pattern *p) {
    free(p->lit);
    if (p->re) pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

typedef struct span {
    size_t a, b;
    bool match;
} span;

typedef struct spans {
    span *v;
    size_t n, cap;
} spans;

static bool spans_add(spans *l, size_t a, size_t b, bool match) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        span *v = realloc(l->v, sizeof *v * cap);
        if (!v) return false;
        l->v = v, l->cap = cap;
    }
    l->v[l->n++] = (span){a, b, match};
    return true;
}

/* Splits s[n] into alternating non-match/match spans covering all of it, as Hugging
 * Face's Pattern::find_matches does (an empty input is one empty non-match). */
static celer_status find_matches(const pattern *p, const char *s, size_t n, spans *out,
                                 celer_error *e) {
    out->n = 0;
    if (n == 0) return spans_add(out, 0, 0, false) ? CELER_OK : error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    size_t prev = 0;
    bool ok = true;
    if (!p->re) {
        for (size_t i = 0; p->lit_n && i + p->lit_n <= n;) {
            if (memcmp(s + i, p->lit, p->lit_n)) {
                i++;
                continue;
            }
            if (i != prev) ok &= spans_add(out, prev, i, false);
            ok &= spans_add(out, i, i + p->lit_n, true);
            prev = i += p->lit_n;
        }
    } else {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(p->re, NULL);
        if (!md) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        size_t pos = 0;
        while (pos <= n) {
            int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
            if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
                rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(rc, msg, sizeof msg);
                pcre2_match_data_free(md);
                return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "regex match failed: %s", (const char *)msg);
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t a = ov[0], b = ov[1];
            if (a != prev) ok &= spans_add(out, prev, a, false);
            ok &= spans_add(out, a, b, true);
            prev = b;
            if (b == a) { /* an empty match: step over one character */
                if (b >= n) break;
                uint32_t cp;
                int l = utf8_next(s + b, n - b, &cp, NULL);
                pos = b + (size_t)(l ? l : 1);
            } else {
                pos = b;
            }
        }
        pcre2_match_data_free(md);
    }
    if (prev != n) ok &= spans_add(out, prev, n, false);
    return ok ? CELER_OK : error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
}

/* Rewrites the spans of one split as Hugging Face's SplitDelimiterBehavior does; the
 * kept spans have match = false, except Removed which drops matches. */
static void apply_behavior(spans *l, split_behavior b) {
    size_t k = 0;
    bool prev_match = false;
    switch (b) {
    case SPLIT_ISOLATED:
        return;
    case SPLIT_REMOVED:
        for (size_t i = 0; i < l->n; i++)
            if (!l->v[i].match) l->v[k++] = l->v[i];
        break;
    case SPLIT_MERGED_WITH_PREVIOUS:
        for (size_t i = 0; i < l->n; i++) {
            span s = l->v[i];
            if (s.match && !prev_match && k > 0) l->v[k - 1].b = s.b;
            else l->v[k++] = s;
            prev_match = s.match;
        }
        break;
    case SPLIT_MERGED_WITH_NEXT:
        /* Walk from the end, merging a match into the span after it. */
        k = l->n;
        for (size_t i = l->n; i-- > 0;) {
            span s = l->v[i];
            if (s.match && !prev_match && k < l->n) l->v[k].a = s.a;
            else l->v[--k] = s;
            prev_match = s.match;
        }
        memmove(l->v, l->v + k, sizeof *l->v * (l->n - k));
        k = l->n - k;
        break;
    case SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < l->n; i++) {
            span s = l->v[i];
            if (s.match == prev_match && k > 0) l->v[k - 1].b = s.b;
            else l->v[k++] = s;
            prev_match = s.match;
        }
        break;
    }
    l->n = k;
}

/* Replaces every piece of *l by its spans under pattern p (or, when p is NULL, under the
 * character class of Digits). */
static celer_status split_pieces(pieces *l, const pattern *p, split_behavior beh, bool invert,
                                 bool digits, celer_error *e) {
    pieces out = {0};
    spans sp = {0};
    celer_status st = CELER_OK;
    for (size_t i = 0; i < l->n && st == CELER_OK; i++) {
        const piece *pc = &l->v[i];
        if (p) {
            st = find_matches(p, pc->s, pc->n, &sp, e);
        } else {
            sp.n = 0;
            for (size_t j = 0; j < pc->n;) {
                uint32_t cp;
                int cl = utf8_next(pc->s + j, pc->n - j, &cp, NULL);
                if (!cl) cl = 1;
                if (!spans_add(&sp, j, j + (size_t)cl, unicode_is_numeric(cp))) st = CELER_STATUS_OUT_OF_MEMORY;
                j += (size_t)cl;
            }
            /* Merge neighbouring non-digits: Hugging Face sees them as one non-match. */
            size_t k = 0;
            for (size_t j = 0; j < sp.n; j++) {
                if (k > 0 && !sp.v[j].match && !sp.v[k - 1].match) sp.v[k - 1].b = sp.v[j].b;
                else sp.v[k++] = sp.v[j];
            }
            sp.n = k;
        }
        if (st != CELER_OK) break;
        if (invert)
            for (size_t j = 0; j < sp.n; j++) sp.v[j].match = !sp.v[j].match;
        apply_behavior(&sp, beh);
        for (size_t j = 0; j < sp.n; j++) {
            if (sp.v[j].a == sp.v[j].b) continue;
            if (!pieces_add(&out, pc->s + sp.v[j].a, sp.v[j].b - sp.v[j].a, pc->first && sp.v[j].a == 0))
                st = CELER_STATUS_OUT_OF_MEMORY;
        }
    }
    free(sp.v);
    if (st != CELER_OK) {
        pieces_free(&out);
        return st == CELER_STATUS_OUT_OF_MEMORY ? error_set(e, st, "out of memory") : st;
    }
    pieces_free(l);
    *l = out;
    return CELER_OK;
}

/* ==== Normalizers ==== */

void normalizer_free(normalizer *nz) {
    if (!nz) return;
    pattern_free(&nz->pat);
    free(nz->str);
    for (size_t i = 0; i < nz->n_sub; i++) normalizer_free(&nz->sub[i]);
    free(nz->sub);
}

celer_status normalize(const normalizer *nz, const char *s, size_t n, sbuf *out, celer_error *e) {
    out->n = 0;
    if (!sbuf_add(out, s, n)) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    if (!nz) return CELER_OK;
    switch (nz->kind) {
    case NORM_NFC:
    case NORM_NFKC: {
        if (n == 0) return CELER_OK;
        utf8proc_uint8_t *r = NULL;
        int opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE | (nz->kind == NORM_NFKC ? UTF8PROC_COMPAT : 0);
        utf8proc_ssize_t rn = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &r, opt);
        if (rn < 0) return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "normalization failed: %s", utf8proc_errmsg(rn));
        out->n = 0;
        bool ok = sbuf_add(out, r, (size_t)rn);
        free(r);
        return ok ? CELER_OK : error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    case NORM_PREPEND: {
        if (n == 0) return CELER_OK;
        out->n = 0;
        bool ok = sbuf_add(out, nz->str, nz->str_n) && sbuf_add(out, s, n);
        return ok ? CELER_OK : error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    case NORM_REPLACE: {
        spans sp = {0};
        celer_status st = find_matches(&nz->pat, s, n, &sp, e);
        out->n = 0;
        bool ok = sbuf_add(out, "", 0);
        for (size_t i = 0; st == CELER_OK && i < sp.n; i++)
            ok &= sp.v[i].match ? sbuf_add(out, nz->str, nz->str_n) : sbuf_add(out, s + sp.v[i].a, sp.v[i].b - sp.v[i].a);
        free(sp.v);
        if (st != CELER_OK) return st;
        return ok ? CELER_OK : error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    case NORM_SEQUENCE: {
        sbuf tmp = {0};
        celer_status st = CELER_OK;
        for (size_t i = 0; i < nz->n_sub && st == CELER_OK; i++) {
            st = normalize(&nz->sub[i], out->p, out->n, &tmp, e);
            sbuf x = *out;
            *out = tmp, tmp = x;
        }
        free(tmp.p);
        return st;
    }
    }
    return CELER_OK;
}

/* ==== Pre-tokenizers ==== */

void pretok_free(pretok *p) {
    if (!p) return;
    pattern_free(&p->pat);
    for (size_t i = 0; i < p->n_sub; i++) pretok_free(&p->sub[i]);
    free(p->sub);
}

uint32_t byte_level_char(uint8_t b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    if (b <= 32) return 256u + b;
    if (b <= 160) return 256u + 33 + (b - 127u);
    return 256u + 33 + 34; /* 173 */
}

/* The byte of a ByteLevel code point, or -1. */
static int byte_level_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
    if (cp >= 256 && cp < 256 + 33) return (int)(cp - 256);
    if (cp >= 256 + 33 && cp < 256 + 67) return (int)(cp - 256 - 33 + 127);
    if (cp == 256 + 67) return 173;
    return -1;
}

/* Replaces each piece by its ByteLevel image (every byte as one code point). */
static celer_status byte_level_map(pieces *l, celer_error *e) {
    sbuf b = {0};
    for (size_t i = 0; i < l->n; i++) {
        b.n = 0;
        for (size_t j = 0; j < l->v[i].n; j++) {
            char u[4];
            int k = utf8_put(u, byte_level_char((uint8_t)l->v[i].s[j]));
            if (!sbuf_add(&b, u, (size_t)k)) {
                free(b.p);
                return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
            }
        }
        char *c = malloc(b.n + 1);
        if (!c) {
            free(b.p);
            return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        }
        memcpy(c, b.p ? b.p : "", b.n + 1);
        free(l->v[i].s);
        l->v[i].s = c, l->v[i].n = b.n;
    }
    free(b.p);
    return CELER_OK;
}

/* Replaces piece i's text by prefix + text (+ nothing when prefix is NULL). */
static bool piece_prepend(piece *pc, const char *prefix, size_t pn) {
    char *c = malloc(pc->n + pn + 1);
    if (!c) return false;
    memcpy(c, prefix, pn);
    memcpy(c + pn, pc->s, pc->n + 1);
    free(pc->s);
    pc->s = c, pc->n += pn;
    return true;
}

static celer_status metaspace(const pretok *p, pieces *l, celer_error *e) {
    char rep[4];
    size_t rn = (size_t)utf8_put(rep, p->replacement);
    sbuf b = {0};
    for (size_t i = 0; i < l->n; i++) {
        piece *pc = &l->v[i];
        b.n = 0;
        bool ok = sbuf_add(&b, "", 0);
        for (size_t j = 0; j < pc->n; j++) ok &= pc->s[j] == ' ' ? sbuf_add(&b, rep, rn) : sbuf_addc(&b, pc->s[j]);
        bool starts = b.n >= rn && !memcmp(b.p, rep, rn);
        if (!starts && (p->scheme == PREPEND_ALWAYS || (p->scheme == PREPEND_FIRST && pc->first))) {
            sbuf c = {0};
            ok &= sbuf_add(&c, rep, rn) && sbuf_add(&c, b.p, b.n);
            free(b.p);
            b = c;
        }
        if (!ok) {
            free(b.p);
            return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        }
        free(pc->s);
        pc->s = b.p, pc->n = b.n;
        b = (sbuf){0};
    }
    if (!p->split) return CELER_OK;
    pattern pat = {rep, rn, NULL};
    return split_pieces(l, &pat, SPLIT_MERGED_WITH_NEXT, false, false, e);
}

celer_status pretokenize(const pretok *p, pieces *l, celer_error *e) {
    if (!p) return CELER_OK;
    switch (p->kind) {
    case PRE_SPLIT:
        return split_pieces(l, &p->pat, p->behavior, p->invert, false, e);
    case PRE_DIGITS:
        return split_pieces(l, NULL, p->individual_digits ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS, false, true, e);
    case PRE_BYTE_LEVEL:
        if (p->add_prefix_space)
            for (size_t i = 0; i < l->n; i++)
                if ((l->v[i].n == 0 || l->v[i].s[0] != ' ') && !piece_prepend(&l->v[i], " ", 1))
                    return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        if (p->use_regex) {
            celer_status st = split_pieces(l, &p->pat, SPLIT_ISOLATED, false, false, e);
            if (st != CELER_OK) return st;
        }
        return byte_level_map(l, e);
    case PRE_METASPACE:
        return metaspace(p, l, e);
    case PRE_SEQUENCE:
        for (size_t i = 0; i < p->n_sub; i++) {
            celer_status st = pretokenize(&p->sub[i], l, e);
            if (st != CELER_OK) return st;
        }
        return CELER_OK;
    }
    return CELER_OK;
}

/* ==== Decoders ==== */

void decoder_free(decoder *d) {
    if (!d) return;
    pattern_free(&d->pat);
    free(d->str);
    for (size_t i = 0; i < d->n_sub; i++) decoder_free(&d->sub[i]);
    free(d->sub);
}

/* Replaces the list by the single piece b. */
static celer_status pieces_set_one(pieces *l, sbuf *b, celer_error *e) {
    pieces out = {0};
    bool ok = pieces_add(&out, b->p ? b->p : "", b->n, true);
    free(b->p);
    *b = (sbuf){0};
    if (!ok) {
        pieces_free(&out);
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    pieces_free(l);
    *l = out;
    return CELER_OK;
}

static int byte_token(const piece *pc) {
    if (pc->n != 6 || memcmp(pc->s, "<0x", 3) || pc->s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = pc->s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static celer_status dec_byte_fallback(pieces *l, bool raw, celer_error *e) {
    pieces out = {0};
    sbuf bytes = {0};
    bool ok = true;
    for (size_t i = 0; i <= l->n; i++) {
        int b = i < l->n ? byte_token(&l->v[i]) : -1;
        if (b >= 0) {
            ok &= sbuf_addc(&bytes, (char)b);
            continue;
        }
        if (bytes.n) {
            if (raw || utf8_check(bytes.p, bytes.n) == bytes.n) ok &= pieces_add(&out, bytes.p, bytes.n, false);
            else
                for (size_t k = 0; k < bytes.n; k++) ok &= pieces_add(&out, "\xef\xbf\xbd", 3, false);
            bytes.n = 0;
        }
        if (i < l->n) ok &= pieces_add(&out, l->v[i].s, l->v[i].n, false);
    }
    free(bytes.p);
    if (!ok) {
        pieces_free(&out);
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    pieces_free(l);
    *l = out;
    return CELER_OK;
}

celer_status decode_tokens(const decoder *d, pieces *l, bool raw, celer_error *e) {
    if (!d) return CELER_OK;
    sbuf b = {0};
    switch (d->kind) {
    case DEC_BYTE_LEVEL: {
        sbuf bytes = {0};
        bool ok = sbuf_add(&bytes, "", 0);
        for (size_t i = 0; i < l->n; i++) {
            const piece *pc = &l->v[i];
            size_t start = bytes.n;
            bool all = true;
            for (size_t j = 0; j < pc->n && all;) {
                uint32_t cp;
                int cl = utf8_next(pc->s + j, pc->n - j, &cp, NULL);
                int by = cl ? byte_level_byte(cp) : -1;
                if (by < 0) all = false;
                else ok &= sbuf_addc(&bytes, (char)by);
                j += cl ? (size_t)cl : 1;
            }
            if (!all) { /* a character outside the map: the token's own bytes */
                bytes.n = start;
                ok &= sbuf_add(&bytes, pc->s, pc->n);
            }
        }
        if (raw) b = bytes;
        else ok &= utf8_lossy(&b, bytes.p, bytes.n), free(bytes.p);
        if (!ok) {
            free(b.p);
            return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        }
        return pieces_set_one(l, &b, e);
    }
    case DEC_BYTE_FALLBACK:
        return dec_byte_fallback(l, raw, e);
    case DEC_FUSE: {
        bool ok = sbuf_add(&b, "", 0);
        for (size_t i = 0; i < l->n; i++) ok &= sbuf_add(&b, l->v[i].s, l->v[i].n);
        if (!ok) {
            free(b.p);
            return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        }
        return pieces_set_one(l, &b, e);
    }
    case DEC_STRIP: {
        char c[4];
        size_t cn = (size_t)utf8_put(c, d->ch);
        for (size_t i = 0; i < l->n; i++) {
            piece *pc = &l->v[i];
            size_t a = 0, z = pc->n;
            for (int64_t k = 0; k < d->start && z - a >= cn && !memcmp(pc->s + a, c, cn); k++) a += cn;
            for (int64_t k = 0; k < d->stop && z - a >= cn && !memcmp(pc->s + z - cn, c, cn); k++) z -= cn;
            memmove(pc->s, pc->s + a, z - a);
            pc->n = z - a;
            pc->s[pc->n] = 0;
        }
        return CELER_OK;
    }
    case DEC_REPLACE: {
        spans sp = {0};
        for (size_t i = 0; i < l->n; i++) {
            piece *pc = &l->v[i];
            celer_status st = find_matches(&d->pat, pc->s, pc->n, &sp, e);
            b.n = 0;
            bool ok = st == CELER_OK && sbuf_add(&b, "", 0);
            for (size_t j = 0; ok && j < sp.n; j++)
                ok &= sp.v[j].match ? sbuf_add(&b, d->str, d->str_n) : sbuf_add(&b, pc->s + sp.v[j].a, sp.v[j].b - sp.v[j].a);
            if (!ok) {
                free(sp.v), free(b.p);
                return st != CELER_OK ? st : error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
            }
            free(pc->s);
            pc->s = b.p, pc->n = b.n;
            b = (sbuf){0};
        }
        free(sp.v);
        return CELER_OK;
    }
    case DEC_METASPACE: {
        char rep[4];
        size_t rn = (size_t)utf8_put(rep, d->ch);
        for (size_t i = 0; i < l->n; i++) {
            piece *pc = &l->v[i];
            size_t k = 0;
            for (size_t j = 0; j < pc->n;) {
                if (pc->n - j >= rn && !memcmp(pc->s + j, rep, rn)) {
                    if (!(i == 0 && d->scheme != PREPEND_NEVER)) pc->s[k++] = ' ';
                    j += rn;
                } else {
                    pc->s[k++] = pc->s[j++];
                }
            }
            pc->n = k;
            pc->s[k] = 0;
        }
        return CELER_OK;
    }
    case DEC_SEQUENCE:
        for (size_t i = 0; i < d->n_sub; i++) {
            celer_status st = decode_tokens(&d->sub[i], l, raw, e);
            if (st != CELER_OK) return st;
        }
        return CELER_OK;
    }
    return CELER_OK;
}

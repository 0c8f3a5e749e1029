/*
 * regex_gbnf.c - regex -> GBNF by recursive descent (regex_gbnf.h).
 *
 * The parser writes GBNF as it reads: every atom becomes one GBNF primary (a literal, a
 * class or a parenthesized group) so a quantifier can follow it. It builds no automaton and
 * does not simplify; the grammar engine matches the result. Nesting is capped at
 * RX_DEPTH_MAX groups, counts at GBNF_REPEAT_MAX, the text at GBNF_TEXT_MAX.
 */
#include "sampling/regex_gbnf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RX_DEPTH_MAX 64

typedef struct rx {
    const char *s;
    size_t n, i;
    bool json;            /* write characters as the body of a JSON string */
    bool search;          /* unanchored branches get any_char* around them */
    const char *any_char; /* with search */
    int depth;
    celer_error *e;
    celer_status st; /* CELER_OK until the first error */
} rx;

static bool rx_fail(rx *r, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool rx_fail(rx *r, size_t at, const char *fmt, ...) {
    if (r->st != CELER_OK) return false;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->st = error_set(r->e, CELER_STATUS_UNSUPPORTED, "regex at offset %zu: %s", at, msg);
    return false;
}

static bool at_end(const rx *r) {
    return r->i >= r->n;
}
static char peek(const rx *r) {
    return at_end(r) ? 0 : r->s[r->i];
}

/* ==== Character sets ==== */

static void cset_digit(gbnf_cset *s) {
    gbnf_cset_add(s, '0', '9');
}
static void cset_word(gbnf_cset *s) {
    gbnf_cset_add(s, '0', '9'), gbnf_cset_add(s, 'A', 'Z'), gbnf_cset_add(s, 'a', 'z');
    gbnf_cset_add(s, '_', '_');
}
static void cset_space(gbnf_cset *s) {
    gbnf_cset_add(s, '\t', '\r'), gbnf_cset_add(s, ' ', ' ');
}

/* Writes the one-character set s as a GBNF primary. In JSON mode the characters JSON
 * requires escaped leave the class and come back as escape alternatives. */
static bool emit_cset(rx *r, gbnf_cset *s, size_t at, gbnf_buf *out) {
    gbnf_cset_normalize(s);
    gbnf_cset_remove(s, 0xD800, 0xDFFF); /* not characters: UTF-8 cannot carry them */
    if (s->failed) return rx_fail(r, at, "out of memory");
    if (!r->json) {
        if (!s->n) return rx_fail(r, at, "character class matches nothing");
        gbnf_put_cset(out, s);
        return true;
    }
    gbnf_cset plain = {0};
    gbnf_cset_add_set(&plain, s);
    gbnf_cset_remove(&plain, 0, 0x1F);
    gbnf_cset_remove(&plain, '"', '"');
    gbnf_cset_remove(&plain, '\\', '\\');
    int alts = 0;
    gbnf_buf_puts(out, "(");
    if (plain.n) gbnf_put_cset(out, &plain), alts++;
    gbnf_cset_free(&plain);
    static const char short_esc[][2] = {{'\b', 'b'}, {'\f', 'f'}, {'\n', 'n'}, {'\r', 'r'},
                                        {'\t', 't'}, {'"', '"'},  {'\\', '\\'}};
    for (uint32_t c = 0; c < 0x60; c++) {
        if (c > 0x1F && c != '"' && c != '\\') continue;
        if (!gbnf_cset_has(s, c)) continue;
        if (alts++) gbnf_buf_puts(out, " | ");
        char lit[8] = {0};
        for (size_t k = 0; k < sizeof short_esc / sizeof *short_esc; k++)
            if ((uint32_t)short_esc[k][0] == c) lit[0] = '\\', lit[1] = short_esc[k][1];
        if (lit[0]) {
            gbnf_put_literal(out, lit, 2);
        } else {
            const char *hex = "0123456789abcdef";
            gbnf_buf_printf(out, "\"\\\\u00%c\"", hex[c >> 4]);
            char lo = hex[c & 15];
            if (lo >= 'a')
                gbnf_buf_printf(out, " [%c%c]", lo, lo - 'a' + 'A');
            else
                gbnf_buf_printf(out, " \"%c\"", lo);
        }
    }
    gbnf_buf_puts(out, ")");
    if (!alts) return rx_fail(r, at, "character class matches nothing");
    return true;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Reads n hex digits (or {H...} when braced) after the escape letter. */
static bool read_hex(rx *r, size_t at, int n, bool braces_ok, uint32_t *cp) {
    uint32_t v = 0;
    if (braces_ok && peek(r) == '{') {
        r->i++;
        int k = 0;
        while (!at_end(r) && peek(r) != '}') {
            int h = hexval(peek(r));
            if (h < 0 || ++k > 8) return rx_fail(r, at, "malformed hex escape");
            v = v * 16 + (uint32_t)h, r->i++;
        }
        if (at_end(r) || !k) return rx_fail(r, at, "malformed hex escape");
        r->i++;
    } else {
        for (int k = 0; k < n; k++) {
            int h = hexval(peek(r));
            if (h < 0) return rx_fail(r, at, "malformed hex escape");
            v = v * 16 + (uint32_t)h, r->i++;
        }
    }
    if (v > GBNF_CP_MAX) return rx_fail(r, at, "code point beyond U+10FFFF");
    *cp = v;
    return true;
}

/* Parses one escape after '\' (r->i at the letter): a single code point into *cp, or a
 * class escape into set (then *is_set). */
static bool parse_escape(rx *r, bool in_class, uint32_t *cp, gbnf_cset *set, bool *is_set) {
    size_t at = r->i - 1;
    if (at_end(r)) return rx_fail(r, at, "pattern ends with a backslash");
    char c = r->s[r->i++];
    *is_set = false;
    switch (c) {
    case 'd':
    case 'D':
    case 'w':
    case 'W':
    case 's':
    case 'S': {
        gbnf_cset t = {0};
        char l = (char)(c | 0x20);
        if (l == 'd') cset_digit(&t);
        if (l == 'w') cset_word(&t);
        if (l == 's') cset_space(&t);
        gbnf_cset_normalize(&t);
        if (c != l) gbnf_cset_negate(&t);
        gbnf_cset_add_set(set, &t);
        gbnf_cset_free(&t);
        *is_set = true;
        return true;
    }
    case 'n':
        *cp = '\n';
        return true;
    case 'r':
        *cp = '\r';
        return true;
    case 't':
        *cp = '\t';
        return true;
    case 'f':
        *cp = '\f';
        return true;
    case 'v':
        *cp = '\v';
        return true;
    case 'x':
        return read_hex(r, at, 2, true, cp);
    case 'u':
        return read_hex(r, at, 4, true, cp);
    case '0':
        if (peek(r) >= '0' && peek(r) <= '9')
            return rx_fail(r, at, "octal escape is not supported");
        *cp = 0;
        return true;
    case 'b':
        if (in_class) {
            *cp = '\b';
            return true;
        }
        return rx_fail(r, at, "word boundary \\b is not supported");
    case 'B':
        return rx_fail(r, at, "word boundary \\B is not supported");
    case 'p':
    case 'P':
        return rx_fail(r, at, "Unicode property \\%c is not supported", c);
    case 'k':
        return rx_fail(r, at, "backreference \\k is not supported");
    case 'A':
    case 'z':
    case 'Z':
    case 'G':
        return rx_fail(r, at, "anchor \\%c is not supported", c);
    case 'Q':
    case 'E':
        return rx_fail(r, at, "quoting \\%c is not supported", c);
    case 'c':
        return rx_fail(r, at, "control escape \\c is not supported");
    default:
        break;
    }
    if (c >= '1' && c <= '9') return rx_fail(r, at, "backreference \\%c is not supported", c);
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return rx_fail(r, at, "unknown escape \\%c", c);
    r->i--;
    size_t k = gbnf_utf8_decode(r->s + r->i, r->n - r->i, cp);
    if (!k) return rx_fail(r, r->i, "not valid UTF-8");
    r->i += k;
    return true;
}

/* One literal code point of the pattern (r->i at it). */
static bool read_char(rx *r, uint32_t *cp) {
    size_t k = gbnf_utf8_decode(r->s + r->i, r->n - r->i, cp);
    if (!k) return rx_fail(r, r->i, "not valid UTF-8");
    r->i += k;
    return true;
}

static bool parse_class(rx *r, gbnf_buf *out) {
    size_t at = r->i++; /* '[' */
    bool neg = false;
    if (peek(r) == '^') neg = true, r->i++;
    if (peek(r) == ']') return rx_fail(r, at, "empty class or leading ] is not supported");
    gbnf_cset s = {0};
    bool ok = true;
    while (ok) {
        if (at_end(r)) {
            ok = rx_fail(r, at, "unterminated character class");
            break;
        }
        if (peek(r) == ']') {
            r->i++;
            break;
        }
        if (peek(r) == '[' && r->i + 1 < r->n &&
            (r->s[r->i + 1] == ':' || r->s[r->i + 1] == '=' || r->s[r->i + 1] == '.')) {
            ok = rx_fail(r, r->i, "POSIX class is not supported");
            break;
        }
        uint32_t lo, hi;
        bool is_set = false;
        size_t item_at = r->i;
        if (peek(r) == '\\') {
            r->i++;
            ok = parse_escape(r, true, &lo, &s, &is_set);
        } else {
            ok = read_char(r, &lo);
        }
        if (!ok || is_set) continue;
        hi = lo;
        if (peek(r) == '-' && r->i + 1 < r->n && r->s[r->i + 1] != ']') {
            r->i++;
            bool hi_set = false;
            if (peek(r) == '\\') {
                r->i++;
                ok = parse_escape(r, true, &hi, &s, &hi_set);
            } else {
                ok = read_char(r, &hi);
            }
            if (!ok) break;
            if (hi_set) {
                ok = rx_fail(r, item_at, "range with a class escape as an end");
                break;
            }
            if (hi < lo) {
                ok = rx_fail(r, item_at, "range out of order");
                break;
            }
        }
        gbnf_cset_add(&s, lo, hi);
    }
    if (ok) {
        gbnf_cset_normalize(&s);
        if (neg) gbnf_cset_negate(&s);
        ok = emit_cset(r, &s, at, out);
    }
    gbnf_cset_free(&s);
    return ok;
}

/* ==== Expressions ==== */

static bool parse_alt(rx *r, gbnf_buf *out, bool top);

/* Reads a {m}, {m,} or {m,n} at r->i; false (r->i unchanged) when the text there is not
 * one, which makes the '{' a literal as in PCRE. max = -1 for no upper bound. */
static bool read_count(rx *r, long *min, long *max) {
    size_t j = r->i + 1;
    long a = 0, b;
    int k = 0;
    while (j < r->n && r->s[j] >= '0' && r->s[j] <= '9' && k < 9)
        a = a * 10 + (r->s[j++] - '0'), k++;
    if (!k || j >= r->n || (j < r->n && r->s[j] >= '0' && r->s[j] <= '9')) return false;
    b = a;
    if (r->s[j] == ',') {
        j++;
        b = -1;
        if (j < r->n && r->s[j] >= '0' && r->s[j] <= '9') {
            b = 0, k = 0;
            while (j < r->n && r->s[j] >= '0' && r->s[j] <= '9' && k < 9)
                b = b * 10 + (r->s[j++] - '0'), k++;
            if (j < r->n && r->s[j] >= '0' && r->s[j] <= '9') return false;
        }
    }
    if (j >= r->n || r->s[j] != '}') return false;
    r->i = j + 1;
    *min = a, *max = b;
    return true;
}

static bool parse_quantifier(rx *r, gbnf_buf *out) {
    size_t at = r->i;
    char c = peek(r);
    long min, max;
    if (c == '*' || c == '+' || c == '?') {
        r->i++;
        gbnf_buf_putn(out, &c, 1);
    } else if (c == '{' && read_count(r, &min, &max)) {
        if (min > GBNF_REPEAT_MAX || max > GBNF_REPEAT_MAX)
            return rx_fail(r, at, "repetition count above %d is not supported", GBNF_REPEAT_MAX);
        if (max >= 0 && max < min) return rx_fail(r, at, "repetition {m,n} with n < m");
        if (max < 0)
            gbnf_buf_printf(out, "{%ld,}", min);
        else if (max == min)
            gbnf_buf_printf(out, "{%ld}", min);
        else
            gbnf_buf_printf(out, "{%ld,%ld}", min, max);
    } else {
        return true;
    }
    if (peek(r) == '?')
        r->i++; /* lazy: the same language */
    else if (peek(r) == '+')
        return rx_fail(r, r->i, "possessive quantifier is not supported");
    c = peek(r);
    if (c == '*' || c == '+' || c == '?' || (c == '{' && read_count(r, &min, &max)))
        return rx_fail(r, at, "quantifier follows a quantifier");
    return true;
}

/* One atom and its quantifier. */
static bool parse_atom(rx *r, gbnf_buf *out) {
    size_t at = r->i;
    char c = peek(r);
    gbnf_cset s = {0};
    uint32_t cp;
    bool ok = true;
    if (c == '(') {
        r->i++;
        if (peek(r) == '?') {
            const char *g = r->s + r->i + 1;
            size_t left = r->n - r->i - 1;
            if (left >= 1 && g[0] == ':') {
                r->i += 2;
            } else if (left >= 1 && (g[0] == '=' || g[0] == '!')) {
                return rx_fail(r, at, "lookahead is not supported");
            } else if (left >= 2 && g[0] == '<' && (g[1] == '=' || g[1] == '!')) {
                return rx_fail(r, at, "lookbehind is not supported");
            } else if (left >= 1 && (g[0] == '<' || (g[0] == 'P' && left >= 2 && g[1] == '<'))) {
                size_t j = r->i + (g[0] == 'P' ? 3 : 2);
                while (j < r->n && r->s[j] != '>') j++;
                if (j >= r->n) return rx_fail(r, at, "unterminated group name");
                r->i = j + 1;
            } else {
                return rx_fail(r, at,
                               "group syntax (? other than (?: and (?<name> (inline "
                               "flags, atomic or conditional groups) is not supported");
            }
        }
        if (++r->depth > RX_DEPTH_MAX)
            return rx_fail(r, at, "groups nested deeper than %d", RX_DEPTH_MAX);
        gbnf_buf_puts(out, "(");
        if (!parse_alt(r, out, false)) return false;
        r->depth--;
        if (peek(r) != ')') return rx_fail(r, at, "unbalanced parenthesis");
        r->i++;
        gbnf_buf_puts(out, ")");
    } else if (c == '[') {
        if (!parse_class(r, out)) return false;
    } else if (c == '.') {
        r->i++;
        gbnf_cset_add(&s, '\n', '\n');
        gbnf_cset_negate(&s);
        ok = emit_cset(r, &s, at, out);
    } else if (c == '*' || c == '+' || c == '?') {
        return rx_fail(r, at, "quantifier %c without an atom before it", c);
    } else if (c == '^' || c == '$') {
        return rx_fail(r, at, "anchor %c inside the pattern is not supported (only at the ends)",
                       c);
    } else {
        bool is_set = false;
        if (c == '\\') {
            r->i++;
            ok = parse_escape(r, false, &cp, &s, &is_set);
        } else {
            ok = read_char(r, &cp);
        }
        if (ok && !is_set) gbnf_cset_add(&s, cp, cp);
        if (ok && !is_set && !r->json) {
            char tmp[4];
            const size_t k = gbnf_utf8_encode(cp, tmp);
            if (cp >= 0xD800 && cp < 0xE000)
                ok = rx_fail(r, at, "surrogate code point");
            else
                gbnf_put_literal(out, tmp, k);
        } else if (ok) {
            ok = emit_cset(r, &s, at, out);
        }
    }
    gbnf_cset_free(&s);
    if (!ok) return false;
    return parse_quantifier(r, out);
}

/* A sequence up to '|', ')' or the end; at the top level a trailing '$' ends it and sets
 * *anchored_end. */
static bool parse_seq(rx *r, gbnf_buf *out, bool top, bool *anchored_end) {
    int n = 0;
    while (!at_end(r) && peek(r) != '|' && peek(r) != ')') {
        if (top && peek(r) == '$') {
            size_t at = r->i++;
            if (!at_end(r) && peek(r) != '|')
                return rx_fail(r, at,
                               "anchor $ inside the pattern is not supported (only at the ends)");
            *anchored_end = true;
            break;
        }
        if (n++) gbnf_buf_puts(out, " ");
        if (!parse_atom(r, out)) return false;
    }
    return true;
}

static bool parse_alt(rx *r, gbnf_buf *out, bool top) {
    for (int branch = 0;; branch++) {
        if (branch) gbnf_buf_puts(out, " | ");
        bool start = false, end = false;
        if (top && peek(r) == '^') r->i++, start = true;
        if (top && r->search && !start) gbnf_buf_printf(out, "%s* ", r->any_char);
        if (!parse_seq(r, out, top, &end)) return false;
        if (top && r->search && !end) gbnf_buf_printf(out, " %s*", r->any_char);
        if (peek(r) != '|') break;
        r->i++;
    }
    if (top && !at_end(r)) return rx_fail(r, r->i, "unbalanced parenthesis");
    return true;
}

/* ==== Entry points ==== */

static celer_status rx_run(rx *r, gbnf_buf *out) {
    gbnf_buf_puts(out, "(");
    if (!parse_alt(r, out, true)) return r->st;
    gbnf_buf_puts(out, ")");
    if (out->failed)
        return error_set(r->e,
                         out->failed == GBNF_BUF_TOO_LARGE ? CELER_STATUS_UNSUPPORTED
                                                           : CELER_STATUS_OUT_OF_MEMORY,
                         "regex: grammar larger than %zu bytes", GBNF_TEXT_MAX);
    return CELER_OK;
}

celer_status regex_to_gbnf(const char *re, size_t len, const char *root, const char *prefix,
                           char **gbnf, celer_error *e) {
    *gbnf = NULL;
    if (!re || !root || !prefix || !gbnf_name_ok(root, false) || !gbnf_name_ok(prefix, true))
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "regex: root and prefix must be GBNF names (letters, digits, '-')");
    rx r = {.s = re, .n = len, .e = e};
    gbnf_buf out = {0};
    gbnf_buf_printf(&out, "%s ::= ", root);
    celer_status st = rx_run(&r, &out);
    gbnf_buf_puts(&out, "\n");
    if (st == CELER_OK && out.failed)
        st = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "regex: out of memory");
    if (st != CELER_OK) {
        gbnf_buf_free(&out);
        return st;
    }
    *gbnf = out.s;
    return CELER_OK;
}

celer_status regex_gbnf_json_pattern(const char *re, size_t len, const char *any_char,
                                     gbnf_buf *out, celer_error *e) {
    rx r = {.s = re, .n = len, .json = true, .search = true, .any_char = any_char, .e = e};
    return rx_run(&r, out);
}

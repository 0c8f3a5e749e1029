/*
 * chat_template.c - the evaluator of the chat template Jinja subset, and loading a
 * template from a model directory.
 *
 * Values are a small tagged union; strings, lists and dicts live in an arena that is
 * freed when the render ends, so nothing is refcounted. Semantics follow Jinja under
 * Python as transformers runs it: Python truthiness, str() and repr() of values, integer
 * and float arithmetic, json.dumps(ensure_ascii=False) for tojson, the sandbox's
 * read-only lists and dicts (only namespace objects change). Unknown filters, tests,
 * methods and functions fail with the template line and column. Loop iterations,
 * macro recursion, memory and output size are bounded. Not here: parsing (see
 * chat_template_parse.c), finding a model's template and the public API
 * (chat_template_load.c), autoescaping, string % formatting, str.format.
 */
#define _DEFAULT_SOURCE
#include "tokenizer/chat_template_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#define MAX_STEPS 5000000     /* statements and loop iterations per render */
#define MAX_CALL_DEPTH 64     /* nested macro calls */
#define MAX_BYTES (256u << 20) /* arena and output */

/* ==== Values ==== */

typedef enum vt { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_LOOP, V_MACRO, V_METHOD, V_FUNC } vt;

typedef struct vlist vlist;
typedef struct vdict vdict;
typedef struct loopst loopst;
typedef struct method method;

typedef struct val {
    vt t;
    union {
        int64_t i; /* bool, int, function id */
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        vlist *l;
        vdict *d; /* dict, namespace */
        loopst *loop;
        const ct_node *macro;
        method *m;
    };
} val;

struct vlist {
    size_t n;
    val *v;
};

struct vdict {
    size_t n, cap;
    bool heap; /* arrays from malloc (scopes, freed when the scope ends), else from the arena */
    val *k; /* strings */
    val *v;
};

struct loopst {
    int64_t index0, length;
    const val *items;
};

typedef struct method_def method_def;

struct method {
    val self;
    const method_def *def; /* its row of the method table */
};

enum { F_RAISE, F_NAMESPACE, F_RANGE, F_DICT, F_STRFTIME };

typedef struct scope scope;
struct scope {
    scope *parent;
    vdict vars;
};

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

typedef struct rctx {
    ct_pool *pool;
    size_t bytes;
    celer_error *e;
    const chat_template_opts *o;
    sbuf *out;
    scope *sc, *root;
    size_t steps;
    int call_depth;
    int ctl; /* 1 break, 2 continue */
} rctx;

static const val undef = {.t = V_UNDEF};
static const val none = {.t = V_NONE};

static val mkbool(bool b) { return (val){.t = V_BOOL, .i = b}; }
static val mkint(int64_t i) { return (val){.t = V_INT, .i = i}; }
static val mkfloat(double f) { return (val){.t = V_FLOAT, .f = f}; }
static val mkstr(const char *p, size_t n) {
    val v = {.t = V_STR};
    v.s.p = p, v.s.n = n;
    return v;
}
static val cstr(const char *p) { return mkstr(p, strlen(p)); }

#define TRY(x)                                                                                               \
    do {                                                                                                     \
        celer_status st_ = (x);                                                                              \
        if (st_ != CELER_OK) return st_;                                                                     \
    } while (0)

static celer_status rerr(rctx *r, const ct_node *n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static celer_status rerr(rctx *r, const ct_node *n, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n) return error_set(r->e, CELER_STATUS_INVALID_ARGUMENT, "template line %d column %d: %s", n->line, n->col, msg);
    return error_set(r->e, CELER_STATUS_INVALID_ARGUMENT, "template: %s", msg);
}

static void *ralloc(rctx *r, size_t size) {
    if (size > MAX_BYTES || r->bytes + size > MAX_BYTES) return NULL;
    r->bytes += size;
    return ct_pool_alloc(&r->pool, size);
}

#define OOM(r, n) rerr(r, n, "out of memory (the render is limited to %u MiB)", MAX_BYTES >> 20)

static bool sb_put(sbuf *b, const char *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        if (cap > MAX_BYTES + 1) return false;
        char *q = realloc(b->p, cap);
        if (!q) return false;
        b->p = q, b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}
static bool sb_puts(sbuf *b, const char *s) { return sb_put(b, s, strlen(s)); }

/* A copy of b's bytes in the arena, as a string value; b is emptied. */
static celer_status sb_take(rctx *r, sbuf *b, const ct_node *n, val *out) {
    char *p = ralloc(r, b->n + 1);
    if (!p) return free(b->p), memset(b, 0, sizeof *b), OOM(r, n);
    if (b->n) memcpy(p, b->p, b->n);
    *out = mkstr(p, b->n);
    free(b->p);
    memset(b, 0, sizeof *b);
    return CELER_OK;
}

static val *dict_find(const vdict *d, const char *k, size_t kn) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].s.n == kn && !memcmp(d->k[i].s.p, k, kn)) return &d->v[i];
    return NULL;
}

static bool dict_set(rctx *r, vdict *d, val k, val v) {
    val *slot = dict_find(d, k.s.p, k.s.n);
    if (slot) return *slot = v, true;
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        if (d->heap) {
            val *nk = realloc(d->k, cap * sizeof *nk);
            if (!nk) return false;
            d->k = nk;
            val *nv = realloc(d->v, cap * sizeof *nv);
            if (!nv) return false;
            d->v = nv, d->cap = cap;
        } else {
            val *nk = ralloc(r, cap * sizeof *nk), *nv = ralloc(r, cap * sizeof *nv);
            if (!nk || !nv) return false;
            if (d->n) memcpy(nk, d->k, d->n * sizeof *nk), memcpy(nv, d->v, d->n * sizeof *nv);
            d->k = nk, d->v = nv, d->cap = cap;
        }
    }
    d->k[d->n] = k, d->v[d->n] = v;
    d->n++;
    return true;
}

static val *list_alloc(rctx *r, size_t n, val *out) {
    vlist *l = ralloc(r, sizeof *l);
    val *v = ralloc(r, (n ? n : 1) * sizeof *v);
    if (!l || !v) return NULL;
    l->n = n, l->v = v;
    *out = (val){.t = V_LIST, .l = l};
    return v;
}

static const char *type_name(val v) {
    static const char *const names[] = {"undefined", "none", "boolean", "integer", "float", "string", "list",
                                        "dict", "namespace", "loop", "macro", "method", "function"};
    return names[v.t];
}

static bool truthy(val v) {
    switch (v.t) {
    case V_UNDEF: case V_NONE: return false;
    case V_BOOL: case V_INT: return v.i != 0;
    case V_FLOAT: return v.f != 0;
    case V_STR: return v.s.n > 0;
    case V_LIST: return v.l->n > 0;
    case V_DICT: return v.d->n > 0;
    default: return true;
    }
}

static bool is_num(val v) { return v.t == V_BOOL || v.t == V_INT || v.t == V_FLOAT; }
static double num(val v) { return v.t == V_FLOAT ? v.f : (double)v.i; }

static bool py_eq(val a, val b) {
    if (is_num(a) && is_num(b)) {
        if (a.t != V_FLOAT && b.t != V_FLOAT) return a.i == b.i;
        return num(a) == num(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case V_UNDEF: case V_NONE: return true;
    case V_STR: return a.s.n == b.s.n && !memcmp(a.s.p, b.s.p, a.s.n);
    case V_LIST:
        if (a.l->n != b.l->n) return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!py_eq(a.l->v[i], b.l->v[i])) return false;
        return true;
    case V_DICT: case V_NS:
        if (a.d->n != b.d->n) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            val *o = dict_find(b.d, a.d->k[i].s.p, a.d->k[i].s.n);
            if (!o || !py_eq(a.d->v[i], *o)) return false;
        }
        return true;
    default: return a.l == b.l;
    }
}

/* ==== UTF-8 and Python string helpers ==== */

/* Decodes one code point at s[*i] (advancing *i); invalid bytes decode as themselves. */
static uint32_t utf8_next(const char *s, size_t n, size_t *i) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &cp);
    if (k <= 0) return (uint32_t)(unsigned char)s[(*i)++];
    *i += (size_t)k;
    return (uint32_t)cp;
}

static size_t utf8_len(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n;) utf8_next(s, n, &i), c++;
    return c;
}

/* Python's str.isspace */
static bool py_space(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

static bool in_chars(uint32_t c, val chars) {
    for (size_t i = 0; i < chars.s.n;)
        if (utf8_next(chars.s.p, chars.s.n, &i) == c) return true;
    return false;
}

/* str.strip / lstrip / rstrip; chars is a string or none (whitespace). */
static val py_strip(val s, val chars, bool left, bool right) {
    size_t b = 0, e = s.s.n;
    bool ws = chars.t != V_STR;
    while (left && b < e) {
        size_t k = b;
        uint32_t c = utf8_next(s.s.p, e, &k);
        if (!(ws ? py_space(c) : in_chars(c, chars))) break;
        b = k;
    }
    while (right && e > b) {
        size_t k = e - 1;
        while (k > b && ((unsigned char)s.s.p[k] & 0xC0) == 0x80) k--;
        size_t j = k;
        uint32_t c = utf8_next(s.s.p, e, &j);
        if (!(ws ? py_space(c) : in_chars(c, chars))) break;
        e = k;
    }
    return mkstr(s.s.p + b, e - b);
}

/* mode 0 lower, 1 upper, 2 title (Jinja's title filter), 3 capitalize */
static celer_status py_case(rctx *r, const ct_node *n, val s, int mode, val *out) {
    sbuf b = {0};
    bool word_start = true, first = true;
    for (size_t i = 0; i < s.s.n;) {
        uint32_t c = utf8_next(s.s.p, s.s.n, &i);
        uint32_t o;
        if (mode == 0) o = (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
        else if (mode == 1) o = (uint32_t)utf8proc_toupper((utf8proc_int32_t)c);
        else if (mode == 2) {
            o = word_start ? (uint32_t)utf8proc_toupper((utf8proc_int32_t)c) : (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
            word_start = py_space(c) || c == '-' || c == '(' || c == '[' || c == '{' || c == '<';
        } else {
            o = first ? (uint32_t)utf8proc_toupper((utf8proc_int32_t)c) : (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
        }
        first = false;
        char enc[4];
        utf8proc_ssize_t k = utf8proc_encode_char((utf8proc_int32_t)o, (utf8proc_uint8_t *)enc);
        if (!sb_put(&b, enc, (size_t)k)) return free(b.p), OOM(r, n);
    }
    return sb_take(r, &b, n, out);
}

static bool starts_with(val s, val p) { return p.s.n <= s.s.n && !memcmp(s.s.p, p.s.p, p.s.n); }
static bool ends_with(val s, val p) { return p.s.n <= s.s.n && !memcmp(s.s.p + s.s.n - p.s.n, p.s.p, p.s.n); }

static const char *find_sub(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return h;
    for (size_t i = 0; i + nn <= hn; i++)
        if (!memcmp(h + i, nd, nn)) return h + i;
    return NULL;
}

/* Python's float repr: the shortest digits that read back, exponent outside 1e-4..1e16. */
static void py_float(double f, char *out, size_t cap) {
    if (isnan(f)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    int p = 1;
    for (; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    /* e = [-]D.DDDDe[+-]XX */
    char digits[32];
    size_t nd = 0;
    const char *q = e;
    bool neg = *q == '-';
    if (neg) q++;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    size_t k = 0;
    if (neg) out[k++] = '-';
    if (exp < -4 || exp >= 16) {
        out[k++] = digits[0];
        if (nd > 1) {
            out[k++] = '.';
            for (size_t i = 1; i < nd; i++) out[k++] = digits[i];
        }
        snprintf(out + k, cap - k, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        return;
    }
    if (exp < 0) {
        out[k++] = '0', out[k++] = '.';
        for (int i = -1; i > exp; i--) out[k++] = '0';
        for (size_t i = 0; i < nd; i++) out[k++] = digits[i];
    } else {
        for (int i = 0; i <= exp; i++) out[k++] = (size_t)i < nd ? digits[i] : '0';
        out[k++] = '.';
        if ((size_t)exp + 1 < nd)
            for (size_t i = (size_t)exp + 1; i < nd; i++) out[k++] = digits[i];
        else out[k++] = '0';
    }
    out[k] = 0;
}

static bool py_repr_str(sbuf *b, val s) {
    bool has_sq = memchr(s.s.p, '\'', s.s.n) != NULL, has_dq = memchr(s.s.p, '"', s.s.n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    bool ok = sb_put(b, &q, 1);
    for (size_t i = 0; i < s.s.n && ok; i++) {
        unsigned char c = (unsigned char)s.s.p[i];
        char esc[8];
        if (c == (unsigned char)q || c == '\\') esc[0] = '\\', esc[1] = (char)c, ok = sb_put(b, esc, 2);
        else if (c == '\n') ok = sb_puts(b, "\\n");
        else if (c == '\r') ok = sb_puts(b, "\\r");
        else if (c == '\t') ok = sb_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f) snprintf(esc, sizeof esc, "\\x%02x", c), ok = sb_puts(b, esc);
        else ok = sb_put(b, (const char *)&c, 1);
    }
    return ok && sb_put(b, &q, 1);
}

/* Python str(v) (repr for items inside lists and dicts) appended to b. */
static bool py_str(sbuf *b, val v, bool repr) {
    char tmp[64];
    switch (v.t) {
    case V_UNDEF: return true;
    case V_NONE: return sb_puts(b, "None");
    case V_BOOL: return sb_puts(b, v.i ? "True" : "False");
    case V_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)v.i); return sb_puts(b, tmp);
    case V_FLOAT: py_float(v.f, tmp, sizeof tmp); return sb_puts(b, tmp);
    case V_STR: return repr ? py_repr_str(b, v) : sb_put(b, v.s.p, v.s.n);
    case V_LIST: {
        bool ok = sb_puts(b, "[");
        for (size_t i = 0; i < v.l->n && ok; i++) ok = (!i || sb_puts(b, ", ")) && py_str(b, v.l->v[i], true);
        return ok && sb_puts(b, "]");
    }
    case V_DICT: {
        bool ok = sb_puts(b, "{");
        for (size_t i = 0; i < v.d->n && ok; i++)
            ok = (!i || sb_puts(b, ", ")) && py_str(b, v.d->k[i], true) && sb_puts(b, ": ") && py_str(b, v.d->v[i], true);
        return ok && sb_puts(b, "}");
    }
    case V_NS: return sb_puts(b, "<Namespace>");
    default: return sb_puts(b, "<function>");
    }
}

static celer_status to_str(rctx *r, const ct_node *n, val v, val *out) {
    if (v.t == V_STR) return *out = v, CELER_OK;
    sbuf b = {0};
    if (!py_str(&b, v, false)) return free(b.p), OOM(r, n);
    return sb_take(r, &b, n, out);
}

/* json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=sort) */
static bool json_str(sbuf *b, val s, bool ascii) {
    bool ok = sb_puts(b, "\"");
    for (size_t i = 0; i < s.s.n && ok; i++) {
        unsigned char c = (unsigned char)s.s.p[i];
        char esc[16];
        if (c >= 0x80 && ascii) {
            uint32_t cp = utf8_next(s.s.p, s.s.n, &i);
            i--;
            if (cp >= 0x10000)
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF));
            else snprintf(esc, sizeof esc, "\\u%04x", cp);
            ok = sb_puts(b, esc);
            continue;
        }
        switch (c) {
        case '"': ok = sb_puts(b, "\\\""); break;
        case '\\': ok = sb_puts(b, "\\\\"); break;
        case '\n': ok = sb_puts(b, "\\n"); break;
        case '\r': ok = sb_puts(b, "\\r"); break;
        case '\t': ok = sb_puts(b, "\\t"); break;
        case '\b': ok = sb_puts(b, "\\b"); break;
        case '\f': ok = sb_puts(b, "\\f"); break;
        default:
            if (c < 0x20) snprintf(esc, sizeof esc, "\\u%04x", c), ok = sb_puts(b, esc);
            else ok = sb_put(b, (const char *)&c, 1);
        }
    }
    return ok && sb_puts(b, "\"");
}

static int key_cmp(const void *a, const void *b) {
    const val *x = *(const val *const *)a, *y = *(const val *const *)b;
    size_t n = x->s.n < y->s.n ? x->s.n : y->s.n;
    int c = memcmp(x->s.p, y->s.p, n);
    return c ? c : (x->s.n > y->s.n) - (x->s.n < y->s.n);
}

static bool newline_indent(sbuf *b, int indent, int level) {
    if (!sb_puts(b, "\n")) return false;
    for (int i = 0; i < indent * level; i++)
        if (!sb_puts(b, " ")) return false;
    return true;
}

/* 0 ok, 1 out of memory, 2 not serializable */
static int to_json(sbuf *b, val v, int indent, bool sort, bool ascii, int level) {
    char tmp[64];
    if (level > 100) return 2;
    switch (v.t) {
    case V_NONE: return !sb_puts(b, "null");
    case V_BOOL: return !sb_puts(b, v.i ? "true" : "false");
    case V_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)v.i); return !sb_puts(b, tmp);
    case V_FLOAT:
        if (isnan(v.f)) return !sb_puts(b, "NaN");
        if (isinf(v.f)) return !sb_puts(b, v.f < 0 ? "-Infinity" : "Infinity");
        py_float(v.f, tmp, sizeof tmp);
        return !sb_puts(b, tmp);
    case V_STR: return !json_str(b, v, ascii);
    case V_LIST: {
        if (!v.l->n) return !sb_puts(b, "[]");
        if (!sb_puts(b, "[")) return 1;
        for (size_t i = 0; i < v.l->n; i++) {
            if (i && !sb_puts(b, indent >= 0 ? "," : ", ")) return 1;
            if (indent >= 0 && !newline_indent(b, indent, level + 1)) return 1;
            int rc = to_json(b, v.l->v[i], indent, sort, ascii, level + 1);
            if (rc) return rc;
        }
        if (indent >= 0 && !newline_indent(b, indent, level)) return 1;
        return !sb_puts(b, "]");
    }
    case V_DICT: case V_NS: {
        if (!v.d->n) return !sb_puts(b, "{}");
        const val **keys = malloc(v.d->n * sizeof *keys);
        if (!keys) return 1;
        for (size_t i = 0; i < v.d->n; i++) keys[i] = &v.d->k[i];
        if (sort) qsort(keys, v.d->n, sizeof *keys, key_cmp);
        int rc = !sb_puts(b, "{");
        for (size_t i = 0; i < v.d->n && !rc; i++) {
            if (i && !sb_puts(b, indent >= 0 ? "," : ", ")) rc = 1;
            else if (indent >= 0 && !newline_indent(b, indent, level + 1)) rc = 1;
            else if (!json_str(b, *keys[i], ascii) || !sb_puts(b, ": ")) rc = 1;
            else rc = to_json(b, v.d->v[keys[i] - v.d->k], indent, sort, ascii, level + 1);
        }
        free(keys);
        if (rc) return rc;
        if (indent >= 0 && !newline_indent(b, indent, level)) return 1;
        return !sb_puts(b, "}");
    }
    default: return 2;
    }
}

/* ==== Converting the JSON inputs ==== */

static celer_status from_json(rctx *r, const json_t *j, val *out, int depth) {
    if (depth > 200) return rerr(r, NULL, "input JSON nested too deeply");
    switch (json_typeof(j)) {
    case JSON_NULL: *out = none; return CELER_OK;
    case JSON_TRUE: *out = mkbool(true); return CELER_OK;
    case JSON_FALSE: *out = mkbool(false); return CELER_OK;
    case JSON_INTEGER: *out = mkint((int64_t)json_integer_value(j)); return CELER_OK;
    case JSON_REAL: *out = mkfloat(json_real_value(j)); return CELER_OK;
    case JSON_STRING: *out = mkstr(json_string_value(j), json_string_length(j)); return CELER_OK;
    case JSON_ARRAY: {
        val *v = list_alloc(r, json_array_size(j), out);
        if (!v) return OOM(r, NULL);
        for (size_t i = 0; i < json_array_size(j); i++) TRY(from_json(r, json_array_get(j, i), &v[i], depth + 1));
        return CELER_OK;
    }
    case JSON_OBJECT: {
        vdict *d = ralloc(r, sizeof *d);
        if (!d) return OOM(r, NULL);
        *out = (val){.t = V_DICT, .d = d};
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)j, k, x) {
            val v;
            TRY(from_json(r, x, &v, depth + 1));
            if (!dict_set(r, d, cstr(k), v)) return OOM(r, NULL);
        }
        return CELER_OK;
    }
    }
    return rerr(r, NULL, "unexpected JSON value");
}

/* As transformers does before rendering: a message whose reasoning is under any of its names
 * (the first of reasoning_content, thinking, reasoning that is not null) gets it as
 * reasoning_content, and as thinking unless it has that key, which goes first: the message
 * becomes {"thinking": r, **message, "reasoning_content": r}. */
static celer_status alias_reasoning(rctx *r, val *msg) {
    static const char *const names[] = {"reasoning_content", "thinking", "reasoning"};
    if (msg->t != V_DICT) return CELER_OK;
    const val *reasoning = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !reasoning; i++) {
        const val *v = dict_find(msg->d, names[i], strlen(names[i]));
        if (v && v->t != V_NONE) reasoning = v;
    }
    if (!reasoning) return CELER_OK;
    vdict *d = ralloc(r, sizeof *d);
    if (!d || !dict_set(r, d, cstr("thinking"), *reasoning)) return OOM(r, NULL);
    for (size_t i = 0; i < msg->d->n; i++)
        if (!dict_set(r, d, msg->d->k[i], msg->d->v[i])) return OOM(r, NULL);
    if (!dict_set(r, d, cstr("reasoning_content"), *reasoning)) return OOM(r, NULL);
    msg->d = d;
    return CELER_OK;
}

/* ==== Evaluation ==== */

static celer_status eval(rctx *r, const ct_node *n, val *out);
static celer_status exec(rctx *r, const ct_node *n);

static void scope_end(scope *s) {
    free(s->vars.k);
    free(s->vars.v);
}

static val lookup(rctx *r, const char *name, size_t len) {
    for (scope *s = r->sc; s; s = s->parent) {
        val *v = dict_find(&s->vars, name, len);
        if (v) return *v;
    }
    return undef;
}

static bool assign(rctx *r, const char *name, size_t len, val v) { return dict_set(r, &r->sc->vars, mkstr(name, len), v); }

static const method_def *find_method(vt self, const char *name);

/* obj.name as a bound method when obj's type has one of that name (*bound_ then true). */
static celer_status bind_method(rctx *r, const ct_node *n, val obj, const char *name, val *out, bool *bound_) {
    const method_def *d = find_method(obj.t, name);
    *bound_ = d != NULL;
    if (!d) return CELER_OK;
    method *m = ralloc(r, sizeof *m);
    if (!m) return OOM(r, n);
    m->self = obj, m->def = d;
    *out = (val){.t = V_METHOD, .m = m};
    return CELER_OK;
}

static celer_status get_attr(rctx *r, const ct_node *n, val obj, const char *name, val *out) {
    if (obj.t == V_UNDEF) return rerr(r, n, "undefined value has no attribute '%s'", name);
    bool is_method;
    TRY(bind_method(r, n, obj, name, out, &is_method));
    if (is_method) return CELER_OK;
    switch (obj.t) {
    case V_DICT:
    case V_NS: {
        val *v = dict_find(obj.d, name, strlen(name));
        *out = v ? *v : undef;
        return CELER_OK;
    }
    case V_LOOP: {
        loopst *l = obj.loop;
        int64_t i = l->index0, len = l->length;
        if (!strcmp(name, "index")) *out = mkint(i + 1);
        else if (!strcmp(name, "index0")) *out = mkint(i);
        else if (!strcmp(name, "revindex")) *out = mkint(len - i);
        else if (!strcmp(name, "revindex0")) *out = mkint(len - i - 1);
        else if (!strcmp(name, "first")) *out = mkbool(i == 0);
        else if (!strcmp(name, "last")) *out = mkbool(i == len - 1);
        else if (!strcmp(name, "length")) *out = mkint(len);
        else if (!strcmp(name, "previtem")) *out = i > 0 ? l->items[i - 1] : undef;
        else if (!strcmp(name, "nextitem")) *out = i + 1 < len ? l->items[i + 1] : undef;
        else return rerr(r, n, "unknown loop attribute '%s'", name);
        return CELER_OK;
    }
    default: break;
    }
    *out = undef;
    return CELER_OK;
}

static celer_status get_index(rctx *r, const ct_node *n, val obj, val key, val *out) {
    if (obj.t == V_UNDEF) return rerr(r, n, "undefined value cannot be subscripted");
    if ((obj.t == V_DICT || obj.t == V_NS) && key.t == V_STR) {
        val *v = dict_find(obj.d, key.s.p, key.s.n);
        *out = v ? *v : undef;
        return CELER_OK;
    }
    if ((obj.t == V_LIST || obj.t == V_STR) && (key.t == V_INT || key.t == V_BOOL)) {
        int64_t i = key.i;
        if (obj.t == V_LIST) {
            int64_t len = (int64_t)obj.l->n;
            if (i < 0) i += len;
            *out = i >= 0 && i < len ? obj.l->v[i] : undef;
            return CELER_OK;
        }
        int64_t len = (int64_t)utf8_len(obj.s.p, obj.s.n);
        if (i < 0) i += len;
        if (i < 0 || i >= len) return *out = undef, CELER_OK;
        size_t pos = 0;
        for (int64_t k = 0; k < i; k++) utf8_next(obj.s.p, obj.s.n, &pos);
        size_t end = pos;
        utf8_next(obj.s.p, obj.s.n, &end);
        *out = mkstr(obj.s.p + pos, end - pos);
        return CELER_OK;
    }
    if (key.t == V_STR) {
        char name[64];
        if (key.s.n < sizeof name && !memchr(key.s.p, 0, key.s.n)) {
            memcpy(name, key.s.p, key.s.n), name[key.s.n] = 0;
            if (obj.t != V_DICT) return get_attr(r, n, obj, name, out) == CELER_OK && out->t != V_METHOD
                                           ? CELER_OK
                                           : (*out = undef, CELER_OK);
        }
    }
    *out = undef;
    return CELER_OK;
}

/* Python slice bounds for len items. */
static void slice_bounds(int64_t len, val a, val b, int64_t step, int64_t *start, int64_t *stop) {
    bool has_a = a.t == V_INT || a.t == V_BOOL, has_b = b.t == V_INT || b.t == V_BOOL;
    int64_t lo = step < 0 ? -1 : 0, hi = step < 0 ? len - 1 : len;
    if (has_a) {
        *start = a.i < 0 ? a.i + len : a.i;
        if (*start < lo) *start = lo;
        if (*start > hi) *start = hi;
    } else *start = step < 0 ? hi : lo;
    if (has_b) {
        *stop = b.i < 0 ? b.i + len : b.i;
        if (*stop < lo) *stop = lo;
        if (*stop > hi) *stop = hi;
    } else *stop = step < 0 ? lo : hi;
}

static celer_status get_slice(rctx *r, const ct_node *n, val obj, val a, val b, val c, val *out) {
    for (int k = 0; k < 3; k++) {
        val x = k == 0 ? a : k == 1 ? b : c;
        if (x.t != V_INT && x.t != V_BOOL && x.t != V_NONE && x.t != V_UNDEF)
            return rerr(r, n, "slice indices must be integers, not %s", type_name(x));
    }
    int64_t step = c.t == V_INT || c.t == V_BOOL ? c.i : 1;
    if (step == 0) return rerr(r, n, "slice step cannot be zero");
    if (obj.t != V_LIST && obj.t != V_STR) return rerr(r, n, "cannot slice %s", type_name(obj));
    /* strings slice by code point */
    size_t ncp = obj.t == V_STR ? utf8_len(obj.s.p, obj.s.n) : obj.l->n;
    size_t *off = NULL;
    if (obj.t == V_STR) {
        off = malloc((ncp + 1) * sizeof *off);
        if (!off) return OOM(r, n);
        size_t pos = 0;
        for (size_t k = 0; k < ncp; k++) off[k] = pos, utf8_next(obj.s.p, obj.s.n, &pos);
        off[ncp] = obj.s.n;
    }
    int64_t start, stop;
    slice_bounds((int64_t)ncp, a, b, step, &start, &stop);
    size_t cnt = 0;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) cnt++;
    celer_status st = CELER_OK;
    if (obj.t == V_LIST) {
        val *v = list_alloc(r, cnt, out);
        if (!v) return OOM(r, n);
        size_t k = 0;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) v[k++] = obj.l->v[i];
    } else {
        sbuf sb = {0};
        bool ok = true;
        for (int64_t i = start; ok && (step > 0 ? i < stop : i > stop); i += step)
            ok = sb_put(&sb, obj.s.p + off[i], off[i + 1] - off[i]);
        if (!ok) free(sb.p), st = OOM(r, n);
        else if (cnt == 0) free(sb.p), *out = mkstr("", 0);
        else st = sb_take(r, &sb, n, out);
    }
    free(off);
    return st;
}

static celer_status iter_items(rctx *r, const ct_node *n, val v, val *out_list) {
    switch (v.t) {
    case V_UNDEF: return list_alloc(r, 0, out_list) ? CELER_OK : OOM(r, n);
    case V_LIST: *out_list = v; return CELER_OK;
    case V_DICT: {
        val *k = list_alloc(r, v.d->n, out_list);
        if (!k) return OOM(r, n);
        memcpy(k, v.d->k, v.d->n * sizeof *k);
        return CELER_OK;
    }
    case V_STR: {
        size_t cnt = utf8_len(v.s.p, v.s.n), pos = 0;
        val *c = list_alloc(r, cnt, out_list);
        if (!c) return OOM(r, n);
        for (size_t k = 0; k < cnt; k++) {
            size_t b = pos;
            utf8_next(v.s.p, v.s.n, &pos);
            c[k] = mkstr(v.s.p + b, pos - b);
        }
        return CELER_OK;
    }
    default: return rerr(r, n, "%s is not iterable", type_name(v));
    }
}

static celer_status contains(rctx *r, const ct_node *n, val item, val seq, bool *out) {
    if (seq.t == V_STR) {
        if (item.t != V_STR) return rerr(r, n, "'in <string>' requires a string, not %s", type_name(item));
        *out = find_sub(seq.s.p, seq.s.n, item.s.p, item.s.n) != NULL;
        return CELER_OK;
    }
    if (seq.t == V_DICT || seq.t == V_NS) {
        *out = item.t == V_STR && dict_find(seq.d, item.s.p, item.s.n);
        return CELER_OK;
    }
    if (seq.t == V_LIST) {
        *out = false;
        for (size_t i = 0; i < seq.l->n && !*out; i++) *out = py_eq(item, seq.l->v[i]);
        return CELER_OK;
    }
    if (seq.t == V_UNDEF) return *out = false, CELER_OK; /* Jinja's Undefined iterates as empty */
    return rerr(r, n, "'in' needs a string, list or dict, not %s", type_name(seq));
}

static int64_t floordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

static celer_status binop(rctx *r, const ct_node *n, int op, val a, val b, val *out) {
    if (op == CT_OP_CONCAT) {
        sbuf sb = {0};
        if (!py_str(&sb, a, false) || !py_str(&sb, b, false)) return free(sb.p), OOM(r, n);
        if (!sb.n) return free(sb.p), *out = mkstr("", 0), CELER_OK;
        return sb_take(r, &sb, n, out);
    }
    if (op == CT_OP_EQ) return *out = mkbool(py_eq(a, b)), CELER_OK;
    if (op == CT_OP_NE) return *out = mkbool(!py_eq(a, b)), CELER_OK;
    if (op == CT_OP_IN || op == CT_OP_NOTIN) {
        bool c;
        TRY(contains(r, n, a, b, &c));
        *out = mkbool(op == CT_OP_IN ? c : !c);
        return CELER_OK;
    }
    if (op >= CT_OP_LT && op <= CT_OP_GE) {
        int c;
        if (is_num(a) && is_num(b)) {
            double x = num(a), y = num(b);
            if (a.t != V_FLOAT && b.t != V_FLOAT) c = (a.i > b.i) - (a.i < b.i);
            else c = (x > y) - (x < y);
        } else if (a.t == V_STR && b.t == V_STR) {
            size_t m = a.s.n < b.s.n ? a.s.n : b.s.n;
            c = memcmp(a.s.p, b.s.p, m);
            c = c ? (c > 0) - (c < 0) : (a.s.n > b.s.n) - (a.s.n < b.s.n);
        } else {
            return rerr(r, n, "cannot compare %s with %s", type_name(a), type_name(b));
        }
        bool res = op == CT_OP_LT ? c < 0 : op == CT_OP_LE ? c <= 0 : op == CT_OP_GT ? c > 0 : c >= 0;
        *out = mkbool(res);
        return CELER_OK;
    }
    if (op == CT_OP_ADD && a.t == V_STR && b.t == V_STR) {
        if (!a.s.n) return *out = b, CELER_OK;
        if (!b.s.n) return *out = a, CELER_OK;
        char *p = ralloc(r, a.s.n + b.s.n + 1);
        if (!p) return OOM(r, n);
        memcpy(p, a.s.p, a.s.n), memcpy(p + a.s.n, b.s.p, b.s.n);
        *out = mkstr(p, a.s.n + b.s.n);
        return CELER_OK;
    }
    if (op == CT_OP_ADD && a.t == V_LIST && b.t == V_LIST) {
        val *v = list_alloc(r, a.l->n + b.l->n, out);
        if (!v) return OOM(r, n);
        if (a.l->n) memcpy(v, a.l->v, a.l->n * sizeof *v);
        if (b.l->n) memcpy(v + a.l->n, b.l->v, b.l->n * sizeof *v);
        return CELER_OK;
    }
    bool ai = a.t == V_INT || a.t == V_BOOL, bi = b.t == V_INT || b.t == V_BOOL;
    if (op == CT_OP_MUL && ((a.t == V_LIST && bi) || (ai && b.t == V_LIST))) {
        val l = a.t == V_LIST ? a : b;
        int64_t k = a.t == V_LIST ? b.i : a.i;
        if (k <= 0 || !l.l->n) return list_alloc(r, 0, out) ? CELER_OK : OOM(r, n);
        if ((uint64_t)k > 1000000 / l.l->n) return OOM(r, n);
        val *v = list_alloc(r, l.l->n * (size_t)k, out);
        if (!v) return OOM(r, n);
        for (int64_t i = 0; i < k; i++) memcpy(v + (size_t)i * l.l->n, l.l->v, l.l->n * sizeof *v);
        return CELER_OK;
    }
    if (op == CT_OP_MUL && ((a.t == V_STR && bi) || (ai && b.t == V_STR))) {
        val s = a.t == V_STR ? a : b;
        int64_t k = a.t == V_STR ? b.i : a.i;
        if (k <= 0 || !s.s.n) return *out = mkstr("", 0), CELER_OK;
        if ((uint64_t)k > MAX_BYTES / s.s.n) return OOM(r, n);
        sbuf sb = {0};
        for (int64_t i = 0; i < k; i++)
            if (!sb_put(&sb, s.s.p, s.s.n)) return free(sb.p), OOM(r, n);
        return sb_take(r, &sb, n, out);
    }
    if (!is_num(a) || !is_num(b)) {
        static const char *const sym[] = {"", "+", "-", "*", "/", "//", "%", "**"};
        return rerr(r, n, "unsupported operand types for %s: %s and %s", op <= CT_OP_POW ? sym[op] : "?",
                    type_name(a), type_name(b));
    }
    bool ints = a.t != V_FLOAT && b.t != V_FLOAT;
    int64_t x = a.i, y = b.i;
    double fx = num(a), fy = num(b);
    switch (op) {
    case CT_OP_ADD:
        if (ints) {
            int64_t z;
            if (__builtin_add_overflow(x, y, &z)) return rerr(r, n, "integer overflow");
            *out = mkint(z);
        } else *out = mkfloat(fx + fy);
        return CELER_OK;
    case CT_OP_SUB:
        if (ints) {
            int64_t z;
            if (__builtin_sub_overflow(x, y, &z)) return rerr(r, n, "integer overflow");
            *out = mkint(z);
        } else *out = mkfloat(fx - fy);
        return CELER_OK;
    case CT_OP_MUL:
        if (ints) {
            int64_t z;
            if (__builtin_mul_overflow(x, y, &z)) return rerr(r, n, "integer overflow");
            *out = mkint(z);
        } else *out = mkfloat(fx * fy);
        return CELER_OK;
    case CT_OP_DIV:
        if (fy == 0) return rerr(r, n, "division by zero");
        *out = mkfloat(fx / fy);
        return CELER_OK;
    case CT_OP_FLOORDIV:
    case CT_OP_MOD:
        if (fy == 0) return rerr(r, n, "division by zero");
        if (ints) {
            if (x == INT64_MIN && y == -1) return rerr(r, n, "integer overflow");
            int64_t q = floordiv(x, y);
            *out = mkint(op == CT_OP_FLOORDIV ? q : x - q * y);
        } else {
            double q = floor(fx / fy);
            *out = mkfloat(op == CT_OP_FLOORDIV ? q : fx - q * fy);
        }
        return CELER_OK;
    case CT_OP_POW:
        if (ints && y >= 0) {
            int64_t z = 1;
            for (int64_t i = 0; i < y; i++)
                if (__builtin_mul_overflow(z, x, &z)) return rerr(r, n, "integer overflow");
            *out = mkint(z);
        } else *out = mkfloat(pow(fx, fy));
        return CELER_OK;
    }
    return rerr(r, n, "unknown operator");
}

/* ==== Call arguments ==== */

#define MAX_ARGS 16

typedef struct args {
    size_t n;
    val v[MAX_ARGS];
    const char *kw[MAX_ARGS];
} args;

static celer_status eval_args(rctx *r, const ct_node *n, args *a) {
    if (n->n > MAX_ARGS) return rerr(r, n, "too many arguments");
    a->n = n->n;
    for (size_t i = 0; i < n->n; i++) {
        TRY(eval(r, n->kids[i], &a->v[i]));
        a->kw[i] = n->kw[i];
    }
    return CELER_OK;
}

/* Argument pos (or keyword name) of a call, or dflt. */
static val arg(const args *a, size_t pos, const char *name, val dflt) {
    size_t p = 0;
    for (size_t i = 0; i < a->n; i++) {
        if (a->kw[i]) {
            if (name && !strcmp(a->kw[i], name)) return a->v[i];
        } else if (p++ == pos) {
            return a->v[i];
        }
    }
    return dflt;
}

static size_t n_positional(const args *a) {
    size_t p = 0;
    for (size_t i = 0; i < a->n; i++) p += !a->kw[i];
    return p;
}

static celer_status need_str(rctx *r, const ct_node *n, val v, const char *what) {
    return v.t == V_STR ? CELER_OK : rerr(r, n, "%s needs a string, got %s", what, type_name(v));
}

/* ==== Tests ==== */

static celer_status run_test(rctx *r, const ct_node *n, const char *name, val v, const args *a, bool *out) {
    val x = arg(a, 0, NULL, undef);
    if (!strcmp(name, "defined")) *out = v.t != V_UNDEF;
    else if (!strcmp(name, "undefined")) *out = v.t == V_UNDEF;
    else if (!strcmp(name, "none")) *out = v.t == V_NONE;
    else if (!strcmp(name, "string")) *out = v.t == V_STR;
    else if (!strcmp(name, "mapping")) *out = v.t == V_DICT;
    /* Jinja's Undefined iterates as empty, has a length and can be called (to fail) */
    else if (!strcmp(name, "iterable") || !strcmp(name, "sequence"))
        *out = v.t == V_STR || v.t == V_LIST || v.t == V_DICT || v.t == V_UNDEF;
    else if (!strcmp(name, "number")) *out = is_num(v);
    else if (!strcmp(name, "integer")) *out = v.t == V_INT;
    else if (!strcmp(name, "float")) *out = v.t == V_FLOAT;
    else if (!strcmp(name, "boolean")) *out = v.t == V_BOOL;
    else if (!strcmp(name, "true")) *out = v.t == V_BOOL && v.i;
    else if (!strcmp(name, "false")) *out = v.t == V_BOOL && !v.i;
    else if (!strcmp(name, "callable")) *out = v.t == V_MACRO || v.t == V_METHOD || v.t == V_FUNC || v.t == V_UNDEF;
    else if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        if (!is_num(v)) return rerr(r, n, "test '%s' needs a number", name);
        bool odd = v.t == V_FLOAT ? fmod(v.f, 2) != 0 : v.i % 2 != 0;
        *out = odd == (name[0] == 'o');
    } else if (!strcmp(name, "divisibleby")) {
        if ((v.t != V_INT && v.t != V_BOOL) || x.t != V_INT || x.i == 0) return rerr(r, n, "bad operands for 'divisibleby'");
        *out = v.i % x.i == 0;
    } else if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==") || !strcmp(name, "sameas"))
        *out = py_eq(v, x);
    else if (!strcmp(name, "ne") || !strcmp(name, "!=")) *out = !py_eq(v, x);
    else if (!strcmp(name, "lt") || !strcmp(name, "gt") || !strcmp(name, "le") || !strcmp(name, "ge") ||
             !strcmp(name, "lessthan") || !strcmp(name, "greaterthan")) {
        int op = name[0] == 'l' ? (name[1] == 'e' && name[2] == 0 ? CT_OP_LE : CT_OP_LT)
                                : (name[1] == 'e' && name[2] == 0 ? CT_OP_GE : CT_OP_GT);
        val b;
        TRY(binop(r, n, op, v, x, &b));
        *out = b.i;
    } else if (!strcmp(name, "in")) TRY(contains(r, n, v, x, out));
    else if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        /* str.isupper / islower: unchanged by the case, and holding a cased character */
        if (v.t != V_STR) TRY(to_str(r, n, v, &v)); /* Jinja tests str(value) */
        val same, other;
        TRY(py_case(r, n, v, name[0] == 'u', &same));
        TRY(py_case(r, n, v, name[0] == 'u' ? 0 : 1, &other));
        *out = py_eq(same, v) && !py_eq(other, v);
    } else return rerr(r, n, "unknown test '%s'", name);
    return CELER_OK;
}

/* ==== Filters ==== */

static celer_status do_join(rctx *r, const ct_node *n, val seq, val sep, val attr, val *out) {
    val items;
    TRY(iter_items(r, n, seq, &items));
    sbuf sb = {0};
    bool ok = true;
    for (size_t i = 0; i < items.l->n && ok; i++) {
        val x = items.l->v[i];
        if (attr.t == V_STR) {
            celer_status st = get_index(r, n, x, attr, &x);
            if (st != CELER_OK) return free(sb.p), st;
        }
        ok = (i == 0 || sep.t != V_STR || sb_put(&sb, sep.s.p, sep.s.n)) && py_str(&sb, x, false);
    }
    if (!ok) return free(sb.p), OOM(r, n);
    if (!sb.n) return free(sb.p), *out = mkstr("", 0), CELER_OK;
    return sb_take(r, &sb, n, out);
}

static celer_status do_replace(rctx *r, const ct_node *n, val s, val old, val new, val count, val *out) {
    TRY(need_str(r, n, s, "replace"));
    TRY(need_str(r, n, old, "replace"));
    TRY(need_str(r, n, new, "replace"));
    int64_t max = count.t == V_INT ? count.i : -1;
    sbuf sb = {0};
    size_t i = 0;
    bool ok = true;
    int64_t done = 0;
    if (!old.s.n) {
        /* Python inserts new between every character */
        size_t pos = 0;
        while (ok && (max < 0 || done < max)) {
            ok = sb_put(&sb, new.s.p, new.s.n), done++;
            if (pos >= s.s.n) break;
            size_t b = pos;
            utf8_next(s.s.p, s.s.n, &pos);
            ok = ok && sb_put(&sb, s.s.p + b, pos - b);
        }
        i = pos;
    } else {
        while (ok && (max < 0 || done < max)) {
            const char *f = find_sub(s.s.p + i, s.s.n - i, old.s.p, old.s.n);
            if (!f) break;
            size_t at = (size_t)(f - s.s.p);
            ok = sb_put(&sb, s.s.p + i, at - i) && sb_put(&sb, new.s.p, new.s.n);
            i = at + old.s.n, done++;
        }
    }
    ok = ok && sb_put(&sb, s.s.p + i, s.s.n - i);
    if (!ok) return free(sb.p), OOM(r, n);
    if (!sb.n) return free(sb.p), *out = mkstr("", 0), CELER_OK;
    return sb_take(r, &sb, n, out);
}

static celer_status do_split(rctx *r, const ct_node *n, val s, val sep, val maxsplit, val *out) {
    int64_t max = maxsplit.t == V_INT ? maxsplit.i : -1;
    val parts[4096];
    size_t np = 0;
    if (sep.t == V_STR) {
        if (!sep.s.n) return rerr(r, n, "split: empty separator");
        size_t i = 0;
        for (;;) {
            if (np + 1 >= sizeof parts / sizeof parts[0]) return rerr(r, n, "split: too many parts");
            const char *f = (max < 0 || (int64_t)np < max) ? find_sub(s.s.p + i, s.s.n - i, sep.s.p, sep.s.n) : NULL;
            if (!f) {
                parts[np++] = mkstr(s.s.p + i, s.s.n - i);
                break;
            }
            parts[np++] = mkstr(s.s.p + i, (size_t)(f - s.s.p) - i);
            i = (size_t)(f - s.s.p) + sep.s.n;
        }
    } else if (sep.t == V_NONE || sep.t == V_UNDEF) {
        size_t i = 0;
        for (;;) {
            while (i < s.s.n) {
                size_t k = i;
                if (!py_space(utf8_next(s.s.p, s.s.n, &k))) break;
                i = k;
            }
            if (i >= s.s.n) break;
            if (np + 1 >= sizeof parts / sizeof parts[0]) return rerr(r, n, "split: too many parts");
            if (max >= 0 && (int64_t)np >= max) {
                val rest = py_strip(mkstr(s.s.p + i, s.s.n - i), none, false, true);
                parts[np++] = rest;
                break;
            }
            size_t b = i;
            while (i < s.s.n) {
                size_t k = i;
                if (py_space(utf8_next(s.s.p, s.s.n, &k))) break;
                i = k;
            }
            parts[np++] = mkstr(s.s.p + b, i - b);
        }
    } else {
        return rerr(r, n, "split: separator must be a string");
    }
    val *v = list_alloc(r, np, out);
    if (!v) return OOM(r, n);
    memcpy(v, parts, np * sizeof *v);
    return CELER_OK;
}

/* select / reject / selectattr / rejectattr / map */
static celer_status do_select(rctx *r, const ct_node *n, const char *fname, val seq, const args *a, val *out) {
    bool attr = !strcmp(fname, "selectattr") || !strcmp(fname, "rejectattr");
    bool keep = !strcmp(fname, "select") || !strcmp(fname, "selectattr");
    val items;
    if (!truthy(seq)) return list_alloc(r, 0, out) ? CELER_OK : OOM(r, n); /* as Jinja: nothing to select from */
    TRY(iter_items(r, n, seq, &items));
    val *v = list_alloc(r, items.l->n, out);
    if (!v) return OOM(r, n);
    size_t k = 0;
    size_t first = attr ? 1 : 0;
    val aname = arg(a, 0, NULL, undef);
    if (attr && aname.t != V_STR) return rerr(r, n, "%s needs an attribute name", fname);
    val tname = arg(a, first, NULL, undef);
    if (tname.t != V_UNDEF && tname.t != V_STR) return rerr(r, n, "%s: test name must be a string", fname);
    args targs = {0};
    for (size_t i = 0, p = 0; i < a->n; i++)
        if (!a->kw[i] && p++ > first) targs.v[targs.n++] = a->v[i];
    char tn[32];
    if (tname.t == V_STR) {
        if (tname.s.n >= sizeof tn) return rerr(r, n, "unknown test");
        memcpy(tn, tname.s.p, tname.s.n), tn[tname.s.n] = 0;
    }
    for (size_t i = 0; i < items.l->n; i++) {
        val x = items.l->v[i], probe = x;
        if (attr) TRY(get_index(r, n, x, aname, &probe));
        bool ok;
        if (tname.t == V_STR) TRY(run_test(r, n, tn, probe, &targs, &ok));
        else ok = truthy(probe);
        if (ok == keep) v[k++] = x;
    }
    out->l->n = k;
    return CELER_OK;
}

/* Keyword arguments a filter understands; any other is an error, never ignored. */
static celer_status check_kwargs(rctx *r, const ct_node *n, const char *f, const args *a) {
    static const struct {
        const char *filter, *kw;
    } known[] = {
        {"trim", "chars"},          {"tojson", "indent"},  {"tojson", "sort_keys"}, {"tojson", "ensure_ascii"},
        {"default", "default_value"}, {"default", "boolean"}, {"d", "default_value"}, {"d", "boolean"},
        {"join", "d"},              {"join", "attribute"}, {"replace", "count"},    {"int", "default"},
        {"float", "default"},       {"map", "attribute"},  {"map", "default"},
    };
    for (size_t i = 0; i < a->n; i++) {
        if (!a->kw[i]) continue;
        bool ok = false;
        for (size_t k = 0; k < sizeof known / sizeof known[0] && !ok; k++)
            ok = !strcmp(known[k].filter, f) && !strcmp(known[k].kw, a->kw[i]);
        if (!ok) return rerr(r, n, "filter '%s' has no supported argument '%s'", f, a->kw[i]);
    }
    return CELER_OK;
}

static celer_status apply_filter(rctx *r, const ct_node *n, const char *f, val v, const args *a, val *out) {
    val a0 = arg(a, 0, NULL, undef);
    TRY(check_kwargs(r, n, f, a));
    if (v.t == V_UNDEF && (!strcmp(f, "int") || !strcmp(f, "float")))
        return rerr(r, n, "filter '%s' of an undefined value", f);
    if (!strcmp(f, "trim")) {
        val s, chars = arg(a, 0, "chars", none);
        TRY(to_str(r, n, v, &s));
        if (chars.t != V_NONE && chars.t != V_UNDEF) TRY(need_str(r, n, chars, "filter 'trim'"));
        *out = py_strip(s, chars, true, true);
    } else if (!strcmp(f, "tojson")) {
        val ind = arg(a, 0, "indent", none);
        if (ind.t != V_NONE && ind.t != V_INT) return rerr(r, n, "tojson: indent must be an integer");
        val sk = arg(a, 99, "sort_keys", mkbool(false));
        sbuf sb = {0};
        bool ascii = truthy(arg(a, 99, "ensure_ascii", mkbool(false)));
        int rc = to_json(&sb, v, ind.t == V_INT ? (int)(ind.i < 0 ? 0 : ind.i > 64 ? 64 : ind.i) : -1, truthy(sk),
                         ascii, 0);
        if (rc) {
            free(sb.p);
            return rc == 1 ? OOM(r, n) : rerr(r, n, "tojson: %s is not JSON serializable", type_name(v));
        }
        return sb_take(r, &sb, n, out);
    } else if (!strcmp(f, "length") || !strcmp(f, "count")) {
        if (v.t == V_STR) *out = mkint((int64_t)utf8_len(v.s.p, v.s.n));
        else if (v.t == V_LIST) *out = mkint((int64_t)v.l->n);
        else if (v.t == V_DICT || v.t == V_NS) *out = mkint((int64_t)v.d->n);
        else if (v.t == V_UNDEF) *out = mkint(0);
        else return rerr(r, n, "%s has no length", type_name(v));
    } else if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "title") || !strcmp(f, "capitalize")) {
        val s;
        TRY(to_str(r, n, v, &s));
        return py_case(r, n, s, f[0] == 'l' ? 0 : f[0] == 'u' ? 1 : f[0] == 't' ? 2 : 3, out);
    } else if (!strcmp(f, "default") || !strcmp(f, "d")) {
        bool boolean = truthy(arg(a, 1, "boolean", mkbool(false)));
        *out = (v.t == V_UNDEF || (boolean && !truthy(v))) ? arg(a, 0, "default_value", mkstr("", 0)) : v;
    } else if (!strcmp(f, "join")) {
        return do_join(r, n, v, arg(a, 0, "d", mkstr("", 0)), arg(a, 1, "attribute", none), out);
    } else if (!strcmp(f, "list")) {
        val items;
        TRY(iter_items(r, n, v, &items));
        *out = items;
    } else if (!strcmp(f, "first") || !strcmp(f, "last")) {
        val items;
        TRY(iter_items(r, n, v, &items));
        *out = items.l->n ? items.l->v[f[0] == 'f' ? 0 : items.l->n - 1] : undef;
    } else if (!strcmp(f, "replace")) {
        val s;
        TRY(to_str(r, n, v, &s));
        return do_replace(r, n, s, a0, arg(a, 1, NULL, undef), arg(a, 2, "count", none), out);
    } else if (!strcmp(f, "string")) {
        return to_str(r, n, v, out);
    } else if (!strcmp(f, "int")) {
        if (v.t == V_INT || v.t == V_BOOL) *out = mkint(v.i);
        else if (v.t == V_FLOAT) *out = isfinite(v.f) ? mkint((int64_t)v.f) : arg(a, 0, "default", mkint(0));
        else if (v.t == V_STR) {
            char buf[64];
            val t = py_strip(v, none, true, true);
            char *end;
            if (t.s.n && t.s.n < sizeof buf) {
                memcpy(buf, t.s.p, t.s.n), buf[t.s.n] = 0;
                long long x = strtoll(buf, &end, 10);
                if (!*end) return *out = mkint(x), CELER_OK;
                double d = strtod(buf, &end);
                if (!*end && isfinite(d)) return *out = mkint((int64_t)d), CELER_OK;
            }
            *out = arg(a, 0, "default", mkint(0));
        } else *out = arg(a, 0, "default", mkint(0));
    } else if (!strcmp(f, "float")) {
        if (is_num(v)) *out = mkfloat(num(v));
        else *out = arg(a, 0, "default", mkfloat(0));
    } else if (!strcmp(f, "abs")) {
        if (v.t == V_INT || v.t == V_BOOL) *out = mkint(v.i < 0 ? -v.i : v.i);
        else if (v.t == V_FLOAT) *out = mkfloat(fabs(v.f));
        else return rerr(r, n, "abs of %s", type_name(v));
    } else if (!strcmp(f, "items")) {
        if (v.t == V_UNDEF) return list_alloc(r, 0, out) ? CELER_OK : OOM(r, n);
        if (v.t != V_DICT) return rerr(r, n, "filter 'items' needs a dict, got %s", type_name(v));
        val *l = list_alloc(r, v.d->n, out);
        if (!l) return OOM(r, n);
        for (size_t i = 0; i < v.d->n; i++) {
            val *p = list_alloc(r, 2, &l[i]);
            if (!p) return OOM(r, n);
            p[0] = v.d->k[i], p[1] = v.d->v[i];
        }
    } else if (!strcmp(f, "select") || !strcmp(f, "reject") || !strcmp(f, "selectattr") || !strcmp(f, "rejectattr")) {
        return do_select(r, n, f, v, a, out);
    } else if (!strcmp(f, "map")) {
        val at = arg(a, 99, "attribute", undef);
        if (at.t != V_STR) return rerr(r, n, "filter 'map' is supported with attribute= only");
        val items;
        TRY(iter_items(r, n, v, &items));
        val *l = list_alloc(r, items.l->n, out);
        if (!l) return OOM(r, n);
        for (size_t i = 0; i < items.l->n; i++) {
            TRY(get_index(r, n, items.l->v[i], at, &l[i]));
            if (l[i].t == V_UNDEF) l[i] = arg(a, 99, "default", undef);
        }
    } else if (!strcmp(f, "reverse")) {
        if (v.t == V_STR) {
            val m1 = mkint(-1);
            return get_slice(r, n, v, none, none, m1, out);
        }
        val items;
        TRY(iter_items(r, n, v, &items));
        val *l = list_alloc(r, items.l->n, out);
        if (!l) return OOM(r, n);
        for (size_t i = 0; i < items.l->n; i++) l[i] = items.l->v[items.l->n - 1 - i];
    } else if (!strcmp(f, "safe")) {
        *out = v;
    } else {
        return rerr(r, n, "unknown filter '%s'", f);
    }
    return CELER_OK;
}

/* ==== Methods ==== */

typedef celer_status (*method_fn)(rctx *r, const ct_node *n, val self, const method_def *d, const args *a,
                                  val *out);

struct method_def {
    const char *name;
    vt self; /* the type whose method it is */
    method_fn fn;
    int mode;
};

/* The methods of strings, dicts and loops: each takes its object, its row of the method
 * table (name and mode) and the call's arguments. */

static celer_status m_get(rctx *r, const ct_node *n, val s, const method_def *d, const args *a, val *out) {
    val key = arg(a, 0, NULL, undef);
    val *v = key.t == V_STR ? dict_find(s.d, key.s.p, key.s.n) : NULL;
    *out = v ? *v : arg(a, 1, NULL, none);
    return CELER_OK;
}

static celer_status m_items(rctx *r, const ct_node *n, val s, const method_def *d, const args *a, val *out) {
    return apply_filter(r, n, "items", s, a, out);
}

/* mode 0 keys, 1 values */
static celer_status m_keys(rctx *r, const ct_node *n, val s, const method_def *d, const args *a, val *out) {
    val *l = list_alloc(r, s.d->n, out);
    if (!l) return OOM(r, n);
    memcpy(l, d->mode ? s.d->v : s.d->k, s.d->n * sizeof *l);
    return CELER_OK;
}

static celer_status m_cycle(rctx *r, const ct_node *n, val s, const method_def *d, const args *a, val *out) {
    size_t np = n_positional(a);
    if (!np) return rerr(r, n, "loop.cycle needs arguments");
    *out = arg(a, (size_t)(s.loop->index0 % (int64_t)np), NULL, undef);
    return CELER_OK;
}

/* mode bit 1: strip the left, bit 2: the right */
static celer_status m_strip(rctx *r, const ct_node *n, val s, const method_def *d, const args *a, val *out) {
    val chars = arg(a, 0, NULL, undef);
    if (chars.t != V_UNDEF && chars.t != V_NONE) TRY(need_str(r, n, chars, d->name));
    *out = py_strip(s, chars, d->mode & 1, d->mode & 2);
    return CELER_OK;
}

/* mode 0 startswith, 1 endswith; the argument is a string or a tuple of them */
static celer_status m_affix(rctx *r, const ct_node *n, val s, const method_def *d, const args *a, val *out) {
    val x = arg(a, 0, NULL, undef);
    const val *alts = x.t == V_LIST ? x.l->v : &x;
    const size_t k = x.t == V_LIST ? x.l->n : 1;
    bool res = false;
    for (size_t i = 0; i < k; i++) {
        TRY(need_str(r, n, alts[i], d->name));
        res = res || (d->mode ? ends_with(s, alts[i]) : starts_with(s, alts[i]));
    }
    *out = mkbool(res);
    return CELER_OK;
}

static celer_status m_split(rctx *r, const ct_node *n, val s, const method_def *d, const args *a, val *out) {
    return do_split(r, n, s, arg(a, 0, "sep", none), arg(a, 1, "maxsplit", none), out);
}

/* py_case's modes: 0 lower, 1 upper, 3 capitalize */
static celer_status m_case(rctx *r, const ct_node *n, val s, const method_def *d, const args *a, val *out) {
    return py_case(r, n, s, d->mode, out);
}

/* str.title: every letter after a non-letter is upper-cased, the others lower-cased */
static celer_status m_title(rctx *r, const ct_node *n, val s, const method_def *d, const args *a, val *out) {
    sbuf sb = {0};
    bool prev_cased = false;
    for (size_t i = 0; i < s.s.n;) {
        uint32_t c = utf8_next(s.s.p, s.s.n, &i);
        const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)c);
        bool cased = p->category == UTF8PROC_CATEGORY_LU || p->category == UTF8PROC_CATEGORY_LL ||
                     p->category == UTF8PROC_CATEGORY_LT;
        uint32_t o = (uint32_t)(prev_cased ? utf8proc_tolower((utf8proc_int32_t)c) : utf8proc_toupper((utf8proc_int32_t)c));
        prev_cased = cased;
        char enc[4];
        utf8proc_ssize_t k = utf8proc_encode_char((utf8proc_int32_t)o, (utf8proc_uint8_t *)enc);
        if (!sb_put(&sb, enc, (size_t)k)) return free(sb.p), OOM(r, n);
    }
    return sb_take(r, &sb, n, out);
}

static celer_status m_replace(rctx *r, const ct_node *n, val s, const method_def *d, const args *a, val *out) {
    return do_replace(r, n, s, arg(a, 0, NULL, undef), arg(a, 1, NULL, undef), arg(a, 2, "count", none), out);
}

static celer_status m_join(rctx *r, const ct_node *n, val s, const method_def *d, const args *a, val *out) {
    return do_join(r, n, arg(a, 0, NULL, undef), s, none, out);
}

static celer_status m_find(rctx *r, const ct_node *n, val s, const method_def *d, const args *a, val *out) {
    val x = arg(a, 0, NULL, undef);
    TRY(need_str(r, n, x, d->name));
    const char *f = find_sub(s.s.p, s.s.n, x.s.p, x.s.n);
    *out = mkint(f ? (int64_t)utf8_len(s.s.p, (size_t)(f - s.s.p)) : -1);
    return CELER_OK;
}

static celer_status m_count(rctx *r, const ct_node *n, val s, const method_def *d, const args *a, val *out) {
    val x = arg(a, 0, NULL, undef);
    TRY(need_str(r, n, x, d->name));
    int64_t c = 0;
    if (!x.s.n) c = (int64_t)utf8_len(s.s.p, s.s.n) + 1;
    else
        for (const char *p = s.s.p, *f; (f = find_sub(p, s.s.n - (size_t)(p - s.s.p), x.s.p, x.s.n)); p = f + x.s.n) c++;
    *out = mkint(c);
    return CELER_OK;
}

static const method_def methods[] = {
    {"get", V_DICT, m_get, 0},           {"items", V_DICT, m_items, 0},     {"keys", V_DICT, m_keys, 0},
    {"values", V_DICT, m_keys, 1},       {"cycle", V_LOOP, m_cycle, 0},     {"strip", V_STR, m_strip, 3},
    {"lstrip", V_STR, m_strip, 1},       {"rstrip", V_STR, m_strip, 2},     {"startswith", V_STR, m_affix, 0},
    {"endswith", V_STR, m_affix, 1},     {"split", V_STR, m_split, 0},      {"lower", V_STR, m_case, 0},
    {"upper", V_STR, m_case, 1},         {"capitalize", V_STR, m_case, 3},  {"title", V_STR, m_title, 0},
    {"replace", V_STR, m_replace, 0},    {"join", V_STR, m_join, 0},        {"find", V_STR, m_find, 0},
    {"count", V_STR, m_count, 0},
};

static const method_def *find_method(vt self, const char *name) {
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (methods[i].self == self && !strcmp(methods[i].name, name)) return &methods[i];
    return NULL;
}

static celer_status call_method(rctx *r, const ct_node *n, method *m, const args *a, val *out) {
    return m->def->fn(r, n, m->self, m->def, a, out);
}

/* ==== Calls ==== */

static celer_status render_body(rctx *r, const ct_node *body, sbuf *into);

static celer_status call_macro(rctx *r, const ct_node *n, const ct_node *m, const args *a, val *out) {
    if (r->call_depth >= MAX_CALL_DEPTH) return rerr(r, n, "macro calls nested too deeply (limit %d)", MAX_CALL_DEPTH);
    scope sc = {.parent = r->root, .vars.heap = true};
    for (size_t i = 0; i < a->n; i++) {
        if (!a->kw[i]) continue;
        bool known = false;
        for (size_t k = 0; k < m->n; k++) known = known || !strcmp(m->kids[k]->s, a->kw[i]);
        if (!known) return rerr(r, n, "macro '%s' has no parameter '%s'", m->s, a->kw[i]);
    }
    if (n_positional(a) > m->n) return rerr(r, n, "macro '%s' takes %zu arguments", m->s, m->n);
    scope *saved = r->sc;
    r->sc = &sc;
    for (size_t k = 0; k < m->n; k++) {
        const ct_node *p = m->kids[k];
        val v = arg(a, k, p->s, undef);
        if (v.t == V_UNDEF && p->a) {
            celer_status st = eval(r, p->a, &v);
            if (st != CELER_OK) return r->sc = saved, scope_end(&sc), st;
        }
        if (!assign(r, p->s, p->slen, v)) return r->sc = saved, scope_end(&sc), OOM(r, n);
    }
    r->call_depth++;
    sbuf b = {0};
    celer_status st = render_body(r, m->b, &b);
    r->call_depth--;
    r->sc = saved;
    scope_end(&sc);
    if (st != CELER_OK) return free(b.p), st;
    if (!b.n) return free(b.p), *out = mkstr("", 0), CELER_OK;
    return sb_take(r, &b, n, out);
}

static celer_status call_func(rctx *r, const ct_node *n, int64_t f, const args *a, val *out) {
    switch (f) {
    case F_RAISE: {
        val m = arg(a, 0, NULL, mkstr("", 0));
        sbuf b = {0};
        if (!py_str(&b, m, false)) return free(b.p), OOM(r, n);
        celer_status st = error_set(r->e, CELER_STATUS_INVALID_ARGUMENT, "template line %d column %d: %s", n->line,
                                    n->col, b.p ? b.p : "");
        free(b.p);
        return st;
    }
    case F_NAMESPACE:
    case F_DICT: {
        vdict *d = ralloc(r, sizeof *d);
        if (!d) return OOM(r, n);
        val a0 = arg(a, 0, NULL, undef);
        if (a0.t == V_DICT || a0.t == V_NS)
            for (size_t i = 0; i < a0.d->n; i++)
                if (!dict_set(r, d, a0.d->k[i], a0.d->v[i])) return OOM(r, n);
        for (size_t i = 0; i < a->n; i++)
            if (a->kw[i] && !dict_set(r, d, cstr(a->kw[i]), a->v[i])) return OOM(r, n);
        *out = (val){.t = f == F_DICT ? V_DICT : V_NS, .d = d};
        return CELER_OK;
    }
    case F_RANGE: {
        size_t np = n_positional(a);
        val x = arg(a, 0, NULL, undef), y = arg(a, 1, NULL, undef), z = arg(a, 2, NULL, mkint(1));
        if (np < 1 || np > 3 || x.t != V_INT || (np > 1 && y.t != V_INT) || z.t != V_INT || z.i == 0)
            return rerr(r, n, "range() needs 1 to 3 integer arguments and a non-zero step");
        int64_t lo = np == 1 ? 0 : x.i, hi = np == 1 ? x.i : y.i, step = z.i;
        int64_t cnt = 0;
        if (step > 0 && hi > lo) cnt = (hi - lo + step - 1) / step;
        if (step < 0 && lo > hi) cnt = (lo - hi - step - 1) / -step;
        if (cnt > 1000000) return rerr(r, n, "range() of %lld items is over the limit", (long long)cnt);
        val *l = list_alloc(r, (size_t)cnt, out);
        if (!l) return OOM(r, n);
        for (int64_t i = 0; i < cnt; i++) l[i] = mkint(lo + i * step);
        return CELER_OK;
    }
    case F_STRFTIME: {
        val fmt = arg(a, 0, NULL, undef);
        TRY(need_str(r, n, fmt, "strftime_now"));
        time_t t = (time_t)(r->o && r->o->now ? r->o->now : 1721952000); /* 2024-07-26 */
        struct tm tm;
        gmtime_r(&t, &tm);
        char f[256], buf[512];
        if (fmt.s.n >= sizeof f) return rerr(r, n, "strftime_now: format too long");
        memcpy(f, fmt.s.p, fmt.s.n), f[fmt.s.n] = 0;
        size_t k = strftime(buf, sizeof buf, f, &tm);
        char *p = ralloc(r, k + 1);
        if (!p) return OOM(r, n);
        memcpy(p, buf, k);
        *out = mkstr(p, k);
        return CELER_OK;
    }
    }
    return rerr(r, n, "unknown function");
}

/* ==== Expressions ==== */

static celer_status eval(rctx *r, const ct_node *n, val *out) {
    val a, b, c;
    switch (n->kind) {
    case CT_LIT:
        switch (n->lit) {
        case CT_LIT_NONE: *out = none; break;
        case CT_LIT_BOOL: *out = mkbool(n->i); break;
        case CT_LIT_INT: *out = mkint(n->i); break;
        case CT_LIT_FLOAT: *out = mkfloat(n->f); break;
        default: *out = mkstr(n->s, n->slen); break;
        }
        return CELER_OK;
    case CT_NAME: *out = lookup(r, n->s, n->slen); return CELER_OK;
    case CT_LIST:
    case CT_TUPLE: {
        val *v = list_alloc(r, n->n, out);
        if (!v) return OOM(r, n);
        for (size_t i = 0; i < n->n; i++) TRY(eval(r, n->kids[i], &v[i]));
        return CELER_OK;
    }
    case CT_DICT: {
        vdict *d = ralloc(r, sizeof *d);
        if (!d) return OOM(r, n);
        for (size_t i = 0; i + 1 < n->n; i += 2) {
            TRY(eval(r, n->kids[i], &a));
            if (a.t != V_STR) return rerr(r, n->kids[i], "dict keys must be strings, got %s", type_name(a));
            TRY(eval(r, n->kids[i + 1], &b));
            if (!dict_set(r, d, a, b)) return OOM(r, n);
        }
        *out = (val){.t = V_DICT, .d = d};
        return CELER_OK;
    }
    case CT_ATTR:
        TRY(eval(r, n->a, &a));
        return get_attr(r, n, a, n->s, out);
    case CT_INDEX:
        TRY(eval(r, n->a, &a));
        TRY(eval(r, n->b, &b));
        return get_index(r, n, a, b, out);
    case CT_SLICE: {
        val p[3] = {none, none, none};
        TRY(eval(r, n->a, &a));
        for (int k = 0; k < 3; k++)
            if (n->kids[k]) TRY(eval(r, n->kids[k], &p[k]));
        return get_slice(r, n, a, p[0], p[1], p[2], out);
    }
    case CT_CALL: {
        args ar;
        TRY(eval(r, n->a, &a));
        TRY(eval_args(r, n, &ar));
        if (a.t == V_METHOD) return call_method(r, n, a.m, &ar, out);
        if (a.t == V_MACRO) return call_macro(r, n, a.macro, &ar, out);
        if (a.t == V_FUNC) return call_func(r, n, a.i, &ar, out);
        if (n->a->kind == CT_NAME) return rerr(r, n, "unknown function '%s'", n->a->s);
        if (n->a->kind == CT_ATTR) {
            val obj;
            TRY(eval(r, n->a->a, &obj));
            return rerr(r, n, "unknown method '%s' of %s", n->a->s, type_name(obj));
        }
        return rerr(r, n, "%s is not callable", type_name(a));
    }
    case CT_FILTER: {
        args ar;
        TRY(eval(r, n->a, &a));
        TRY(eval_args(r, n, &ar));
        return apply_filter(r, n, n->s, a, &ar, out);
    }
    case CT_TEST: {
        args ar;
        bool res;
        TRY(eval(r, n->a, &a));
        TRY(eval_args(r, n, &ar));
        TRY(run_test(r, n, n->s, a, &ar, &res));
        *out = mkbool(n->i ? !res : res);
        return CELER_OK;
    }
    case CT_UNARY:
        TRY(eval(r, n->a, &a));
        if (!is_num(a)) return rerr(r, n, "bad operand type for unary %c: %s", n->op == CT_OP_SUB ? '-' : '+', type_name(a));
        if (n->op == CT_OP_ADD) *out = a.t == V_FLOAT ? a : mkint(a.i);
        else if (a.t == V_FLOAT) *out = mkfloat(-a.f);
        else if (a.i == INT64_MIN) return rerr(r, n, "integer overflow");
        else *out = mkint(-a.i);
        return CELER_OK;
    case CT_BINARY:
        TRY(eval(r, n->a, &a));
        TRY(eval(r, n->b, &b));
        return binop(r, n, n->op, a, b, out);
    case CT_AND:
        TRY(eval(r, n->a, &a));
        if (!truthy(a)) return *out = a, CELER_OK;
        return eval(r, n->b, out);
    case CT_OR:
        TRY(eval(r, n->a, &a));
        if (truthy(a)) return *out = a, CELER_OK;
        return eval(r, n->b, out);
    case CT_NOT:
        TRY(eval(r, n->a, &a));
        *out = mkbool(!truthy(a));
        return CELER_OK;
    case CT_COND:
        TRY(eval(r, n->a, &c));
        if (truthy(c)) return eval(r, n->b, out);
        if (n->c) return eval(r, n->c, out);
        *out = undef;
        return CELER_OK;
    default: return rerr(r, n, "not an expression");
    }
}

/* ==== Statements ==== */

static celer_status emit(rctx *r, const ct_node *n, const char *p, size_t len) {
    if (!sb_put(r->out, p, len)) return rerr(r, n, "output over the limit of %u MiB", MAX_BYTES >> 20);
    return CELER_OK;
}

static celer_status bind_targets(rctx *r, const ct_node *n, val v) {
    if (n->n == 1) return assign(r, n->kids[0]->s, n->kids[0]->slen, v) ? CELER_OK : OOM(r, n);
    if (v.t != V_LIST || v.l->n != n->n)
        return rerr(r, n, "cannot unpack %s into %zu names", type_name(v), n->n);
    for (size_t i = 0; i < n->n; i++)
        if (!assign(r, n->kids[i]->s, n->kids[i]->slen, v.l->v[i])) return OOM(r, n);
    return CELER_OK;
}

static celer_status exec_for(rctx *r, const ct_node *n) {
    val seq, items;
    TRY(eval(r, n->a, &seq));
    if (seq.t == V_NONE) return rerr(r, n->a, "cannot loop over none");
    TRY(iter_items(r, n->a, seq, &items));
    if (n->d) {
        /* `for x in xs if cond`: filter first, so loop.* counts the kept items */
        val kept;
        val *k = list_alloc(r, items.l->n, &kept);
        if (!k) return OOM(r, n);
        size_t m = 0;
        for (size_t i = 0; i < items.l->n; i++) {
            scope sc = {.parent = r->sc, .vars.heap = true};
            r->sc = &sc;
            val c;
            celer_status st = bind_targets(r, n, items.l->v[i]);
            if (st == CELER_OK) st = eval(r, n->d, &c);
            r->sc = sc.parent;
            scope_end(&sc);
            if (st != CELER_OK) return st;
            if (truthy(c)) k[m++] = items.l->v[i];
        }
        kept.l->n = m;
        items = kept;
    }
    loopst ls = {.length = (int64_t)items.l->n, .items = items.l->v};
    val loopv = {.t = V_LOOP, .loop = &ls};
    for (size_t i = 0; i < items.l->n; i++) {
        if (++r->steps > MAX_STEPS) return rerr(r, n, "the render ran over %d steps", MAX_STEPS);
        ls.index0 = (int64_t)i;
        scope sc = {.parent = r->sc, .vars.heap = true};
        r->sc = &sc;
        celer_status st = assign(r, "loop", 4, loopv) ? CELER_OK : OOM(r, n);
        if (st == CELER_OK) st = bind_targets(r, n, items.l->v[i]);
        if (st == CELER_OK) st = exec(r, n->b);
        r->sc = sc.parent;
        scope_end(&sc);
        if (st != CELER_OK) return st;
        if (r->ctl == 1) {
            r->ctl = 0;
            break;
        }
        r->ctl = 0;
    }
    if (items.l->n == 0 && n->c) return exec(r, n->c);
    return CELER_OK;
}

static celer_status exec(rctx *r, const ct_node *n) {
    val v;
    if (++r->steps > MAX_STEPS) return rerr(r, n, "the render ran over %d steps", MAX_STEPS);
    switch (n->kind) {
    case CT_BODY:
        for (size_t i = 0; i < n->n && !r->ctl; i++) TRY(exec(r, n->kids[i]));
        return CELER_OK;
    case CT_TEXT: return emit(r, n, n->s, n->slen);
    case CT_OUTPUT: {
        TRY(eval(r, n->a, &v));
        if (v.t == V_STR) return emit(r, n, v.s.p, v.s.n);
        sbuf b = {0};
        if (!py_str(&b, v, false)) return free(b.p), OOM(r, n);
        celer_status st = emit(r, n, b.p ? b.p : "", b.n);
        free(b.p);
        return st;
    }
    case CT_IF:
        TRY(eval(r, n->a, &v));
        if (truthy(v)) return exec(r, n->b);
        return n->c ? exec(r, n->c) : CELER_OK;
    case CT_FOR: return exec_for(r, n);
    case CT_SET:
        TRY(eval(r, n->a, &v));
        return bind_targets(r, n, v);
    case CT_SET_ATTR: {
        val obj = lookup(r, n->a->s, n->a->slen);
        if (obj.t != V_NS) return rerr(r, n, "cannot set attribute '%s' on %s (only on a namespace)", n->s, type_name(obj));
        TRY(eval(r, n->b, &v));
        return dict_set(r, obj.d, mkstr(n->s, n->slen), v) ? CELER_OK : OOM(r, n);
    }
    case CT_SET_BLOCK: {
        sbuf b = {0};
        celer_status st = render_body(r, n->b, &b);
        if (st != CELER_OK) return free(b.p), st;
        if (!b.n) free(b.p), v = mkstr("", 0);
        else TRY(sb_take(r, &b, n, &v));
        return assign(r, n->s, n->slen, v) ? CELER_OK : OOM(r, n);
    }
    case CT_MACRO:
        return assign(r, n->s, n->slen, (val){.t = V_MACRO, .macro = n}) ? CELER_OK : OOM(r, n);
    case CT_BREAK: r->ctl = 1; return CELER_OK;
    case CT_CONTINUE: r->ctl = 2; return CELER_OK;
    default: return rerr(r, n, "not a statement");
    }
}

/* Renders body into a fresh buffer (macro bodies, block sets). */
static celer_status render_body(rctx *r, const ct_node *body, sbuf *into) {
    sbuf *saved = r->out;
    r->out = into;
    celer_status st = exec(r, body);
    r->out = saved;
    r->ctl = 0;
    return st;
}

celer_status chat_template_render(const chat_template *t, const json_t *messages, const chat_template_opts *o,
                                  char **out, size_t *out_len, celer_error *e) {
    *out = NULL;
    if (out_len) *out_len = 0;
    rctx r = {.e = e, .o = o};
    scope root = {.vars.heap = true};
    r.sc = r.root = &root;
    sbuf b = {0};
    r.out = &b;
    celer_status st = CELER_OK;
    val msgs;
    if (!json_is_array(messages)) {
        st = rerr(&r, NULL, "messages must be a JSON array");
        goto done;
    }
    if ((st = from_json(&r, messages, &msgs, 0)) != CELER_OK) goto done;
    for (size_t i = 0; i < msgs.l->n && st == CELER_OK; i++) st = alias_reasoning(&r, &msgs.l->v[i]);
    if (st != CELER_OK) goto done;
    static const struct {
        const char *name;
        int f;
    } funcs[] = {{"raise_exception", F_RAISE}, {"namespace", F_NAMESPACE}, {"range", F_RANGE}, {"dict", F_DICT},
                 {"strftime_now", F_STRFTIME}};
    bool ok = true;
    for (size_t i = 0; i < sizeof funcs / sizeof funcs[0]; i++)
        ok = ok && assign(&r, funcs[i].name, strlen(funcs[i].name), (val){.t = V_FUNC, .i = funcs[i].f});
    ok = ok && assign(&r, "messages", 8, msgs) && assign(&r, "tools", 5, none) && assign(&r, "documents", 9, none);
    ok = ok && assign(&r, "add_generation_prompt", 21, mkbool(o && o->add_generation_prompt));
    if (o && o->bos_token) ok = ok && assign(&r, "bos_token", 9, cstr(o->bos_token));
    if (o && o->eos_token) ok = ok && assign(&r, "eos_token", 9, cstr(o->eos_token));
    if (!ok) {
        st = OOM(&r, NULL);
        goto done;
    }
    if (o && o->vars) {
        if (!json_is_object(o->vars)) {
            st = rerr(&r, NULL, "extra template variables must be a JSON object");
            goto done;
        }
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)o->vars, k, x) {
            val v;
            if ((st = from_json(&r, x, &v, 0)) != CELER_OK) goto done;
            if (!assign(&r, k, strlen(k), v)) {
                st = OOM(&r, NULL);
                goto done;
            }
        }
    }
    st = exec(&r, t->root);
done:
    scope_end(&root);
    ct_pool_free(r.pool);
    if (st != CELER_OK) {
        free(b.p);
        return st;
    }
    if (!b.p && !(b.p = calloc(1, 1))) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "template: out of memory");
    *out = b.p;
    if (out_len) *out_len = b.n;
    return CELER_OK;
}

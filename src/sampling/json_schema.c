/*
 * json_schema.c - JSON Schema -> GBNF (json_schema.h).
 *
 * One walk over the schema writes GBNF rules: an object, an array, a property and a $ref
 * target each become a named rule (prefix + a hint from the schema + a counter, so names
 * never collide); scalars are written inline. The shared pieces (whitespace, string
 * characters, numbers, formats) are rules written once on first use. Every keyword is
 * checked against the supported and annotation lists before anything is written, so an
 * unsupported keyword is refused wherever it sits in a compiled subschema.
 *
 * Not done here: instance validation (the grammar engine's job), remote $ref, and any
 * keyword a grammar cannot state exactly (refused by name; docs/structured_outputs.md).
 * oneOf is compiled as anyOf: exclusivity between branches is not enforced.
 */
#include "sampling/json_schema.h"

#include "sampling/gbnf_text.h"
#include "sampling/regex_gbnf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== Compiler state ==== */

enum prim {
    PRIM_WS,
    PRIM_CHAR,
    PRIM_STRING,
    PRIM_NUMBER,
    PRIM_INTEGER,
    PRIM_BOOLEAN,
    PRIM_NULL,
    PRIM_VALUE,
    PRIM_OBJECT,
    PRIM_ARRAY,
    PRIM_KEYCHAR,
    PRIM_DATE,
    PRIM_TIME,
    PRIM_DATE_TIME,
    PRIM_UUID,
    PRIM_EMAIL,
    PRIM_COUNT_
};

static const char *const prim_names[PRIM_COUNT_] = {
    "ws",     "char",  "string",  "number", "integer", "boolean",   "null", "value",
    "object", "array", "keychar", "date",   "time",    "date-time", "uuid", "email",
};

typedef struct ref_entry {
    char *ptr;   /* the JSON pointer after '#' */
    char *name;  /* its rule */
    int barrier; /* the barrier it was entered under (left-recursion check) */
    bool done;
} ref_entry;

typedef struct jsc {
    const json_t *doc;
    const char *prefix;
    gbnf_buf rules;
    gbnf_buf path;  /* JSON pointer of the schema being compiled */
    unsigned prims; /* bit per emitted primitive */
    ref_entry *refs;
    size_t n_refs, cap_refs;
    char pn[PRIM_COUNT_][GBNF_NAME_MAX + 16]; /* the primitives' rule names */
    long counter;
    int depth;
    int barrier, next_barrier; /* a new barrier after every consumed token */
    celer_error *e;
    celer_status st;
} jsc;

static bool fail(jsc *c, celer_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool fail(jsc *c, celer_status st, const char *fmt, ...) {
    if (c->st != CELER_OK) return false;
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->st = error_set(c->e, st, "schema: \"%.*s\": %s", 200, c->path.s ? c->path.s : "", msg);
    return false;
}

static size_t path_push(jsc *c, const char *key) {
    size_t mark = c->path.len;
    gbnf_buf_puts(&c->path, "/");
    for (const char *p = key; *p; p++) {
        if (*p == '~')
            gbnf_buf_puts(&c->path, "~0");
        else if (*p == '/')
            gbnf_buf_puts(&c->path, "~1");
        else
            gbnf_buf_putn(&c->path, p, 1);
    }
    return mark;
}
static size_t path_push_index(jsc *c, size_t i) {
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%zu", i);
    return path_push(c, tmp);
}
static void path_pop(jsc *c, size_t mark) {
    c->path.len = mark;
    if (c->path.s) c->path.s[mark] = 0;
}

/* A fresh rule name: prefix + the hint's letters and digits + a counter (malloc'd). */
static char *rule_name(jsc *c, const char *hint) {
    gbnf_buf b = {0};
    gbnf_buf_puts(&b, c->prefix);
    size_t n = 0;
    bool dash = false;
    for (const char *p = hint; *p && n < 24; p++) {
        char ch = *p;
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')) {
            if (dash && n) gbnf_buf_puts(&b, "-"), n++;
            gbnf_buf_putn(&b, &ch, 1), n++;
            dash = false;
        } else {
            dash = true;
        }
    }
    gbnf_buf_printf(&b, "%s%ld", n ? "-" : "s", ++c->counter);
    if (b.failed) {
        gbnf_buf_free(&b);
        fail(c, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    return b.s;
}

static void emit_rule(jsc *c, const char *name, const char *body) {
    gbnf_buf_printf(&c->rules, "%s ::= ", name);
    gbnf_buf_puts(&c->rules, body ? body : "");
    gbnf_buf_puts(&c->rules, "\n");
}

/* ==== Shared rules ==== */

static const char *prim(jsc *c, enum prim p);

static const char *prim(jsc *c, enum prim p) {
    const char *name = c->pn[p];
    if (c->prims & (1u << p)) return name;
    c->prims |= 1u << p;
    gbnf_buf b = {0};
    const char *ws = c->pn[PRIM_WS];
    switch (p) {
    case PRIM_WS:
        gbnf_buf_printf(&b, "( \" \" | \"\\n\" \" \"{0,%d} )?", JSON_SCHEMA_INDENT_MAX);
        break;
    case PRIM_CHAR:
        /* a backslash-u escape names a character: surrogates only as a high-low pair */
        gbnf_buf_puts(
            &b, "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-Ce-fE-F] "
                "[0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | [dD] [89abAB] [0-9a-fA-F]{2} "
                "\"\\\\u\" [dD] [c-fC-F] [0-9a-fA-F]{2} ) )");
        break;
    case PRIM_KEYCHAR:
        gbnf_buf_puts(&b, "[^\"\\\\\\x00-\\x1F]");
        break;
    case PRIM_STRING:
        gbnf_buf_printf(&b, "\"\\\"\" %s* \"\\\"\"", prim(c, PRIM_CHAR));
        break;
    case PRIM_INTEGER:
        gbnf_buf_puts(&b, "\"-\"? ( \"0\" | [1-9] [0-9]{0,17} )");
        break;
    case PRIM_NUMBER:
        gbnf_buf_puts(&b, "\"-\"? ( \"0\" | [1-9] [0-9]{0,17} ) ( \".\" [0-9]{1,20} )? "
                          "( [eE] [-+]? [0-9]{1,2} )?");
        break;
    case PRIM_BOOLEAN:
        gbnf_buf_puts(&b, "\"true\" | \"false\"");
        break;
    case PRIM_NULL:
        gbnf_buf_puts(&b, "\"null\"");
        break;
    case PRIM_VALUE: {
        const enum prim kinds[] = {PRIM_OBJECT, PRIM_ARRAY,   PRIM_STRING,
                                   PRIM_NUMBER, PRIM_BOOLEAN, PRIM_NULL};
        for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
            gbnf_buf_printf(&b, "%s%s", i ? " | " : "", prim(c, kinds[i]));
        break;
    }
    case PRIM_OBJECT: {
        const char *s = prim(c, PRIM_STRING), *v = prim(c, PRIM_VALUE);
        prim(c, PRIM_WS);
        gbnf_buf_printf(
            &b, "\"{\" %s ( %s %s \":\" %s %s ( %s \",\" %s %s %s \":\" %s %s )* %s )? \"}\"", ws,
            s, ws, ws, v, ws, ws, s, ws, ws, v, ws);
        break;
    }
    case PRIM_ARRAY: {
        const char *v = prim(c, PRIM_VALUE);
        prim(c, PRIM_WS);
        gbnf_buf_printf(&b, "\"[\" %s ( %s ( %s \",\" %s %s )* %s )? \"]\"", ws, v, ws, ws, v, ws);
        break;
    }
    case PRIM_DATE: {
        /* YYYY-MM-DD, a real calendar date: year 0001-9999, days per month, 29 February in
         * leap years only (divisible by 4, centuries only when divisible by 400). */
        gbnf_buf_puts(
            &b,
            "( [1-9] [0-9]{3} | \"0\" [1-9] [0-9]{2} | \"00\" [1-9] [0-9] | \"000\" [1-9] ) \"-\" "
            "( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] )"
            " | ( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" )"
            " | \"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) )"
            " | ( [0-9]{2} ( \"0\" [48] | [2468] [048] | [13579] [26] )"
            " | ( \"0\" [48] | [2468] [048] | [13579] [26] ) \"00\" ) \"-02-29\"");
        break;
    }
    case PRIM_TIME:
        /* HH:MM:SS, optional fraction of 1-9 digits, then Z or a +HH:MM/-HH:MM offset. */
        gbnf_buf_puts(&b, "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] "
                          "( \".\" [0-9]{1,9} )? ( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" "
                          "[0-5] [0-9] )");
        break;
    case PRIM_DATE_TIME:
        gbnf_buf_printf(&b, "%s \"T\" ", prim(c, PRIM_DATE));
        gbnf_buf_puts(&b, prim(c, PRIM_TIME));
        break;
    case PRIM_UUID:
        gbnf_buf_puts(&b, "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
                          "[0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}");
        break;
    case PRIM_EMAIL:
        /* dot-atom local part @ a domain of at least two labels of letters, digits and
         * inner hyphens. */
        gbnf_buf_puts(
            &b, "[A-Za-z0-9!#$%&'*+/=?^_`{|}~\\-]+ ( \".\" [A-Za-z0-9!#$%&'*+/=?^_`{|}~\\-]+ )* "
                "\"@\" [A-Za-z0-9] ( [A-Za-z0-9\\-]{0,61} [A-Za-z0-9] )? "
                "( \".\" [A-Za-z0-9] ( [A-Za-z0-9\\-]{0,61} [A-Za-z0-9] )? )+");
        break;
    case PRIM_COUNT_:
        break;
    }
    if (b.failed)
        fail(c, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    else
        emit_rule(c, name, b.s);
    gbnf_buf_free(&b);
    return name;
}

/* ==== Keywords ==== */

static const char *const annotations[] = {"title",    "description", "examples", "$comment",
                                          "default",  "$schema",     "$id",      "deprecated",
                                          "readOnly", "writeOnly",   "$defs",    "definitions"};
static const char *const supported[] = {"type",
                                        "properties",
                                        "required",
                                        "additionalProperties",
                                        "enum",
                                        "const",
                                        "anyOf",
                                        "oneOf",
                                        "allOf",
                                        "items",
                                        "prefixItems",
                                        "minItems",
                                        "maxItems",
                                        "minLength",
                                        "maxLength",
                                        "pattern",
                                        "format",
                                        "minimum",
                                        "maximum",
                                        "exclusiveMinimum",
                                        "exclusiveMaximum",
                                        "$ref"};

static bool in_list(const char *k, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(k, list[i])) return true;
    return false;
}
#define IN(k, list) in_list((k), (list), sizeof(list) / sizeof *(list))

static bool is_annotation(const char *k) {
    return IN(k, annotations);
}

/* Every key of s is supported or an annotation. */
static bool check_keywords(jsc *c, const json_t *s) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (is_annotation(k) || IN(k, supported)) continue;
        size_t m = path_push(c, k);
        fail(c, CELER_STATUS_UNSUPPORTED, "keyword %s is not supported", k);
        path_pop(c, m);
        return false;
    }
    return true;
}

/* Only annotations besides `keyword` (and the keys in also[]). */
static bool check_alone(jsc *c, const json_t *s, const char *keyword, const char *const *also,
                        size_t n_also) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (!strcmp(k, keyword) || is_annotation(k) || in_list(k, also, n_also)) continue;
        return fail(c, CELER_STATUS_UNSUPPORTED, "keyword %s beside %s is not supported", k,
                    keyword);
    }
    return true;
}

/* A non-negative integer keyword (absent: *out unchanged), at most GBNF_REPEAT_MAX. */
static bool get_count(jsc *c, const json_t *s, const char *key, long *out) {
    json_t *v = json_object_get(s, key);
    if (!v) return true;
    size_t m = path_push(c, key);
    bool ok = false;
    double d = json_is_integer(v) ? (double)json_integer_value(v)
               : json_is_real(v)  ? json_real_value(v)
                                  : -1;
    if (!json_is_number(v) || d != floor(d) || d < 0)
        fail(c, CELER_STATUS_INVALID_ARGUMENT, "%s must be a non-negative integer", key);
    else if (d > GBNF_REPEAT_MAX)
        fail(c, CELER_STATUS_UNSUPPORTED, "%s above %d is not supported", key, GBNF_REPEAT_MAX);
    else
        *out = (long)d, ok = true;
    path_pop(c, m);
    return ok;
}

/* ==== Literals (enum, const) ==== */

static void put_json_string(gbnf_buf *b, const char *s, size_t n) {
    gbnf_buf_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"')
            gbnf_buf_puts(b, "\\\"");
        else if (ch == '\\')
            gbnf_buf_puts(b, "\\\\");
        else if (ch == '\n')
            gbnf_buf_puts(b, "\\n");
        else if (ch == '\r')
            gbnf_buf_puts(b, "\\r");
        else if (ch == '\t')
            gbnf_buf_puts(b, "\\t");
        else if (ch == '\b')
            gbnf_buf_puts(b, "\\b");
        else if (ch == '\f')
            gbnf_buf_puts(b, "\\f");
        else if (ch < 0x20)
            gbnf_buf_printf(b, "\\u%04x", ch);
        else
            gbnf_buf_putn(b, s + i, 1);
    }
    gbnf_buf_puts(b, "\"");
}

/* The shortest decimal that reads back as d, in JSON's form (1.0, 1e+20). */
static void put_json_real(gbnf_buf *b, double d) {
    char tmp[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*g", p, d);
        if (strtod(tmp, NULL) == d) break;
    }
    gbnf_buf_puts(b, tmp);
    if (!strpbrk(tmp, ".e")) gbnf_buf_puts(b, ".0");
}

static bool gen_literal(jsc *c, const json_t *v, gbnf_buf *out, int depth) {
    if (depth > JSON_SCHEMA_DEPTH_MAX)
        return fail(c, CELER_STATUS_UNSUPPORTED, "value nested too deep");
    const char *ws = prim(c, PRIM_WS);
    gbnf_buf t = {0};
    switch (json_typeof(v)) {
    case JSON_STRING:
        put_json_string(&t, json_string_value(v), json_string_length(v));
        gbnf_put_literal(out, t.s, t.len);
        break;
    case JSON_INTEGER:
        gbnf_buf_printf(out, "\"%lld\"", (long long)json_integer_value(v));
        break;
    case JSON_REAL:
        put_json_real(&t, json_real_value(v));
        gbnf_put_literal(out, t.s, t.len);
        break;
    case JSON_TRUE:
        gbnf_buf_puts(out, "\"true\"");
        break;
    case JSON_FALSE:
        gbnf_buf_puts(out, "\"false\"");
        break;
    case JSON_NULL:
        gbnf_buf_puts(out, "\"null\"");
        break;
    case JSON_ARRAY: {
        gbnf_buf_printf(out, "( \"[\" %s ", ws);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) gbnf_buf_printf(out, " %s \",\" %s ", ws, ws);
            if (!gen_literal(c, json_array_get(v, i), out, depth + 1)) break;
        }
        gbnf_buf_printf(out, "%s%s \"]\" )", json_array_size(v) ? " " : "",
                        json_array_size(v) ? ws : "");
        break;
    }
    case JSON_OBJECT: {
        gbnf_buf_printf(out, "( \"{\" %s ", ws);
        const char *k;
        json_t *x;
        size_t i = 0;
        json_object_foreach((json_t *)v, k, x) {
            if (i++) gbnf_buf_printf(out, " %s \",\" %s ", ws, ws);
            t.len = 0;
            put_json_string(&t, k, strlen(k));
            gbnf_put_literal(out, t.s, t.len);
            gbnf_buf_printf(out, " %s \":\" %s ", ws, ws);
            if (!gen_literal(c, x, out, depth + 1)) break;
        }
        gbnf_buf_printf(out, "%s%s \"}\" )", i ? " " : "", i ? ws : "");
        break;
    }
    }
    gbnf_buf_free(&t);
    return c->st == CELER_OK;
}

static bool has_type(const json_t *v, const char *type) {
    if (!strcmp(type, "null")) return json_is_null(v);
    if (!strcmp(type, "boolean")) return json_is_boolean(v);
    if (!strcmp(type, "string")) return json_is_string(v);
    if (!strcmp(type, "number")) return json_is_number(v);
    if (!strcmp(type, "integer"))
        return json_is_integer(v) ||
               (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    if (!strcmp(type, "object")) return json_is_object(v);
    if (!strcmp(type, "array")) return json_is_array(v);
    return false;
}

/* ==== Schemas ==== */

static bool gen(jsc *c, const json_t *s, gbnf_buf *out, bool *empty);

/* Compiles s (at path key below the current one) into a rule of its own named after hint;
 * writes the rule's name. */
static bool gen_rule(jsc *c, const json_t *s, const char *key, const char *hint, gbnf_buf *out,
                     bool *empty) {
    size_t m = key ? path_push(c, key) : c->path.len;
    gbnf_buf body = {0};
    bool ok = gen(c, s, &body, empty);
    if (ok && !*empty) {
        char *name = rule_name(c, hint);
        if (name) {
            emit_rule(c, name, body.s);
            gbnf_buf_puts(out, name);
            free(name);
        }
    }
    gbnf_buf_free(&body);
    path_pop(c, m);
    return c->st == CELER_OK;
}

/* Writes alternatives alt[n] as one expression (parenthesized when more than one). */
static void put_alternatives(gbnf_buf *out, gbnf_buf *alt, size_t n) {
    if (n > 1) gbnf_buf_puts(out, "( ");
    for (size_t i = 0; i < n; i++) gbnf_buf_printf(out, "%s%s", i ? " | " : "", alt[i].s);
    if (n > 1) gbnf_buf_puts(out, " )");
}

/* ---- $ref ---- */

static const json_t *resolve_pointer(const json_t *doc, const char *ptr) {
    const json_t *v = doc;
    const char *p = ptr;
    char tok[512];
    while (*p) {
        if (*p != '/') return NULL;
        p++;
        size_t n = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '~' && (*p == '0' || *p == '1'))
                ch = *p++ == '0' ? '~' : '/';
            else if (ch == '%' && p[0] && p[1]) {
                int hi = p[0], lo = p[1];
                hi = hi <= '9' ? hi - '0' : (hi | 32) - 'a' + 10;
                lo = lo <= '9' ? lo - '0' : (lo | 32) - 'a' + 10;
                if (hi < 0 || hi > 15 || lo < 0 || lo > 15) return NULL;
                ch = (char)(hi * 16 + lo), p += 2;
            }
            if (n + 1 >= sizeof tok) return NULL;
            tok[n++] = ch;
        }
        tok[n] = 0;
        if (json_is_object(v)) {
            v = json_object_get(v, tok);
        } else if (json_is_array(v)) {
            char *end;
            unsigned long i = strtoul(tok, &end, 10);
            if (!n || *end || (n > 1 && tok[0] == '0')) return NULL;
            v = json_array_get(v, i);
        } else {
            return NULL;
        }
        if (!v) return NULL;
    }
    return v;
}

static bool gen_ref(jsc *c, const json_t *s, gbnf_buf *out, bool *empty) {
    if (!check_alone(c, s, "$ref", NULL, 0)) return false;
    const json_t *r = json_object_get(s, "$ref");
    size_t m = path_push(c, "$ref");
    if (!json_is_string(r)) {
        fail(c, CELER_STATUS_INVALID_ARGUMENT, "$ref must be a string");
        path_pop(c, m);
        return false;
    }
    const char *ref = json_string_value(r);
    if (ref[0] != '#') {
        fail(c, CELER_STATUS_UNSUPPORTED,
             "$ref to %.100s is not supported (only local references such as #/$defs/NAME)", ref);
        path_pop(c, m);
        return false;
    }
    const char *ptr = ref + 1;
    for (size_t i = 0; i < c->n_refs; i++) {
        ref_entry *x = &c->refs[i];
        if (strcmp(x->ptr, ptr)) continue;
        if (!x->done && x->barrier == c->barrier)
            fail(c, CELER_STATUS_UNSUPPORTED,
                 "$ref %.100s refers back to itself before any JSON token (a cycle with no base "
                 "case)",
                 ref);
        else
            gbnf_buf_puts(out, x->name);
        path_pop(c, m);
        return c->st == CELER_OK;
    }
    const json_t *target = resolve_pointer(c->doc, ptr);
    if (!target) {
        fail(c, CELER_STATUS_INVALID_ARGUMENT, "$ref target %.100s not found", ref);
        path_pop(c, m);
        return false;
    }
    path_pop(c, m);
    if (c->n_refs == c->cap_refs) {
        size_t cap = c->cap_refs ? c->cap_refs * 2 : 8;
        ref_entry *x = realloc(c->refs, cap * sizeof *x);
        if (!x) return fail(c, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        c->refs = x, c->cap_refs = cap;
    }
    const char *last = strrchr(ptr, '/');
    size_t idx = c->n_refs;
    size_t plen = strlen(ptr);
    char *dup = malloc(plen + 1);
    if (dup) memcpy(dup, ptr, plen + 1);
    ref_entry x = {dup, rule_name(c, last ? last + 1 : "root"), c->barrier, false};
    if (!x.ptr || !x.name) {
        free(x.ptr), free(x.name);
        return fail(c, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    c->refs[c->n_refs++] = x;
    /* Errors inside the target name the target's pointer. */
    gbnf_buf saved = c->path;
    c->path = (gbnf_buf){0};
    gbnf_buf_puts(&c->path, ptr);
    gbnf_buf body = {0};
    bool ok = gen(c, target, &body, empty);
    gbnf_buf_free(&c->path);
    c->path = saved;
    if (ok && *empty) {
        size_t mm = path_push(c, "$ref");
        fail(c, CELER_STATUS_UNSUPPORTED, "$ref target %.100s accepts no value", ref);
        path_pop(c, mm);
    } else if (ok) {
        emit_rule(c, c->refs[idx].name, body.s);
        gbnf_buf_puts(out, c->refs[idx].name);
    }
    c->refs[idx].done = true;
    gbnf_buf_free(&body);
    return c->st == CELER_OK;
}

/* ---- anyOf, oneOf, enum, const ---- */

/* oneOf compiles as anyOf: a grammar does not check that exactly one branch matches. */
static bool gen_anyof(jsc *c, const json_t *s, const char *key, gbnf_buf *out, bool *empty) {
    if (!check_alone(c, s, key, NULL, 0)) return false;
    const json_t *a = json_object_get(s, key);
    size_t m = path_push(c, key);
    if (!json_is_array(a) || !json_array_size(a)) {
        fail(c, CELER_STATUS_INVALID_ARGUMENT, "%s must be a non-empty array of schemas", key);
        path_pop(c, m);
        return false;
    }
    size_t n = json_array_size(a), k = 0;
    gbnf_buf *alt = calloc(n, sizeof *alt);
    if (!alt) fail(c, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; alt && i < n && c->st == CELER_OK; i++) {
        size_t mi = path_push_index(c, i);
        bool e;
        if (gen(c, json_array_get(a, i), &alt[k], &e) && !e)
            k++;
        else
            gbnf_buf_free(&alt[k]);
        path_pop(c, mi);
    }
    path_pop(c, m);
    if (c->st == CELER_OK) {
        *empty = k == 0;
        put_alternatives(out, alt, k);
    }
    for (size_t i = 0; alt && i < n; i++) gbnf_buf_free(&alt[i]);
    free(alt);
    return c->st == CELER_OK;
}

/* Type names of s (absent: every type). Returns how many, into types[7]. */
static int get_types(jsc *c, const json_t *s, const char **types) {
    static const char *const all[] = {"null",   "boolean", "object", "array",
                                      "string", "number",  "integer"};
    const json_t *t = json_object_get(s, "type");
    if (!t) {
        for (int i = 0; i < 6; i++) types[i] = all[i];
        return 6;
    }
    size_t m = path_push(c, "type");
    int n = 0;
    size_t count = json_is_array(t) ? json_array_size(t) : 1;
    for (size_t i = 0; i < count && c->st == CELER_OK; i++) {
        const json_t *x = json_is_array(t) ? json_array_get(t, i) : t;
        const char *name = json_string_value(x);
        int k = 0;
        while (name && k < 7 && strcmp(name, all[k])) k++;
        if (!name || k == 7) {
            fail(c, CELER_STATUS_INVALID_ARGUMENT,
                 "type must be one of null, boolean, object, array, string, number, integer, "
                 "or an array of them");
            break;
        }
        bool seen = false;
        for (int j = 0; j < n; j++) seen |= types[j] == all[k];
        if (!seen) types[n++] = all[k];
    }
    path_pop(c, m);
    return c->st == CELER_OK ? n : -1;
}

static bool gen_enum(jsc *c, const json_t *s, gbnf_buf *out, bool *empty) {
    const char *key = json_object_get(s, "enum") ? "enum" : "const";
    static const char *const also[] = {"type"};
    if (!check_alone(c, s, key, also, 1)) return false;
    const char *types[7];
    int nt = get_types(c, s, types);
    if (nt < 0) return false;
    const json_t *v = json_object_get(s, key);
    size_t m = path_push(c, key);
    size_t n = 1;
    if (!strcmp(key, "enum")) {
        if (!json_is_array(v)) {
            fail(c, CELER_STATUS_INVALID_ARGUMENT, "enum must be an array");
            path_pop(c, m);
            return false;
        }
        n = json_array_size(v);
    }
    size_t k = 0;
    gbnf_buf alts = {0};
    for (size_t i = 0; i < n && c->st == CELER_OK; i++) {
        const json_t *x = strcmp(key, "enum") ? v : json_array_get(v, i);
        bool typed = false;
        for (int j = 0; j < nt; j++) typed |= has_type(x, types[j]);
        if (!typed) continue;
        if (k++) gbnf_buf_puts(&alts, " | ");
        gen_literal(c, x, &alts, 0);
    }
    path_pop(c, m);
    *empty = k == 0;
    if (k > 1) gbnf_buf_puts(out, "( ");
    if (k) gbnf_buf_puts(out, alts.s);
    if (k > 1) gbnf_buf_puts(out, " )");
    gbnf_buf_free(&alts);
    return c->st == CELER_OK;
}

/* ---- Strings ---- */

static bool gen_string(jsc *c, const json_t *s, gbnf_buf *out, bool *empty) {
    const json_t *fmt = json_object_get(s, "format"), *pat = json_object_get(s, "pattern");
    bool has_len = json_object_get(s, "minLength") || json_object_get(s, "maxLength");
    const char *q = "\"\\\"\"";
    if (fmt) {
        static const char *const names[] = {"date", "time", "date-time", "uuid", "email"};
        static const enum prim prims[] = {PRIM_DATE, PRIM_TIME, PRIM_DATE_TIME, PRIM_UUID,
                                          PRIM_EMAIL};
        size_t m = path_push(c, "format");
        const char *f = json_string_value(fmt);
        size_t k = 0;
        while (f && k < 5 && strcmp(f, names[k])) k++;
        if (!f)
            fail(c, CELER_STATUS_INVALID_ARGUMENT, "format must be a string");
        else if (k == 5)
            fail(c, CELER_STATUS_UNSUPPORTED, "format %.60s is not supported", f);
        else if (pat || has_len)
            fail(c, CELER_STATUS_UNSUPPORTED, "format together with %s is not supported",
                 pat ? "pattern" : "minLength/maxLength");
        else
            gbnf_buf_printf(out, "%s %s %s", q, prim(c, prims[k]), q);
        path_pop(c, m);
        return c->st == CELER_OK;
    }
    if (pat) {
        size_t m = path_push(c, "pattern");
        if (!json_is_string(pat)) {
            fail(c, CELER_STATUS_INVALID_ARGUMENT, "pattern must be a string");
        } else if (has_len) {
            fail(c, CELER_STATUS_UNSUPPORTED,
                 "pattern together with minLength/maxLength is not supported");
        } else {
            celer_error re;
            gbnf_buf body = {0};
            celer_status st = regex_gbnf_json_pattern(
                json_string_value(pat), json_string_length(pat), prim(c, PRIM_CHAR), &body, &re);
            if (st != CELER_OK)
                fail(c, st, "%s", re.msg);
            else
                gbnf_buf_printf(out, "%s %s %s", q, body.s, q);
            gbnf_buf_free(&body);
        }
        path_pop(c, m);
        return c->st == CELER_OK;
    }
    long min = 0, max = -1;
    if (!get_count(c, s, "minLength", &min) || !get_count(c, s, "maxLength", &max)) return false;
    const char *ch = prim(c, PRIM_CHAR);
    if (max >= 0 && max < min)
        *empty = true;
    else if (max < 0 && min == 0)
        gbnf_buf_puts(out, prim(c, PRIM_STRING));
    else if (max < 0)
        gbnf_buf_printf(out, "%s %s{%ld,} %s", q, ch, min, q);
    else if (max == min)
        gbnf_buf_printf(out, "%s %s{%ld} %s", q, ch, min, q);
    else
        gbnf_buf_printf(out, "%s %s{%ld,%ld} %s", q, ch, min, max, q);
    return true;
}

/* ---- Integers and numbers ---- */

#define BOUND_MAX 1e18

typedef struct bounds {
    bool has_lo, has_hi;
    double lo, hi; /* as written */
    bool lo_excl, hi_excl;
} bounds;

static bool get_bounds(jsc *c, const json_t *s, bounds *b) {
    static const char *const keys[] = {"minimum", "exclusiveMinimum", "maximum",
                                       "exclusiveMaximum"};
    *b = (bounds){0};
    for (int i = 0; i < 4; i++) {
        const json_t *v = json_object_get(s, keys[i]);
        if (!v) continue;
        size_t m = path_push(c, keys[i]);
        if (!json_is_number(v))
            fail(c, CELER_STATUS_INVALID_ARGUMENT, "%s must be a number", keys[i]);
        else if (fabs(json_number_value(v)) >= BOUND_MAX)
            fail(c, CELER_STATUS_UNSUPPORTED, "%s of 1e18 or more in magnitude is not supported",
                 keys[i]);
        path_pop(c, m);
        if (c->st != CELER_OK) return false;
        double d = json_number_value(v);
        bool excl = i == 1 || i == 3;
        if (i < 2) {
            /* the tighter of minimum and exclusiveMinimum */
            if (!b->has_lo || d > b->lo || (d == b->lo && excl))
                b->has_lo = true, b->lo = d, b->lo_excl = excl;
        } else {
            if (!b->has_hi || d < b->hi || (d == b->hi && excl))
                b->has_hi = true, b->hi = d, b->hi_excl = excl;
        }
    }
    return true;
}

/* Decimal digits of v (no sign, no leading zeros) into d[24]; returns the count. */
static int digits_of(unsigned long long v, char *d) {
    int n = snprintf(d, 24, "%llu", v);
    return n;
}

/* Digit strings A..B of equal length L (A <= B), as a GBNF sequence. */
static void put_same_len(gbnf_buf *out, const char *A, const char *B, int L) {
    int i = 0;
    while (i < L && A[i] == B[i]) gbnf_buf_printf(out, "\"%c\" ", A[i]), i++;
    if (i == L) return;
    bool low_rest = true, high_rest = true; /* A's rest all 0, B's rest all 9 */
    for (int j = i + 1; j < L; j++) low_rest &= A[j] == '0', high_rest &= B[j] == '9';
    int rest = L - i - 1;
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines), memset(zeros, '0', sizeof zeros);
    gbnf_buf_puts(out, "( ");
    if (low_rest && high_rest) {
        gbnf_buf_printf(out, "[%c-%c]", A[i], B[i]);
        if (rest) gbnf_buf_printf(out, " [0-9]{%d}", rest);
    } else {
        char lo = A[i], hi = B[i];
        if (!low_rest) {
            gbnf_buf_printf(out, "\"%c\" ", A[i]);
            put_same_len(out, A + i + 1, nines, rest);
            gbnf_buf_puts(out, " | ");
            lo++;
        }
        if (!high_rest) hi--;
        if (lo <= hi) {
            gbnf_buf_printf(out, "[%c-%c]", lo, hi);
            if (rest) gbnf_buf_printf(out, " [0-9]{%d}", rest);
            if (!high_rest) gbnf_buf_puts(out, " | ");
        }
        if (!high_rest) {
            gbnf_buf_printf(out, "\"%c\" ", B[i]);
            put_same_len(out, zeros, B + i + 1, rest);
        }
    }
    gbnf_buf_puts(out, " )");
}

/* Non-negative integers a..b (b < 0: no upper bound; 18 digits at most) in canonical form,
 * as one parenthesized expression. */
static void put_uint_range(gbnf_buf *out, unsigned long long a, long long b) {
    char A[24], B[24], lo[24], hi[24];
    int la = digits_of(a, A);
    int lb = b >= 0 ? digits_of((unsigned long long)b, B) : la;
    gbnf_buf_puts(out, "( ");
    for (int L = la; L <= lb; L++) {
        if (L > la) gbnf_buf_puts(out, " | ");
        if (L == la)
            memcpy(lo, A, 24);
        else
            lo[0] = '1', memset(lo + 1, '0', (size_t)L - 1), lo[L] = 0;
        if (b >= 0 && L == lb)
            memcpy(hi, B, 24);
        else
            memset(hi, '9', (size_t)L), hi[L] = 0;
        put_same_len(out, lo, hi, L);
    }
    if (b < 0 && la < 18) gbnf_buf_printf(out, " | [1-9] [0-9]{%d,17}", la);
    gbnf_buf_puts(out, " )");
}

static bool gen_integer(jsc *c, const json_t *s, gbnf_buf *out, bool *empty) {
    bounds b;
    if (!get_bounds(c, s, &b)) return false;
    if (!b.has_lo && !b.has_hi) {
        gbnf_buf_puts(out, prim(c, PRIM_INTEGER));
        return true;
    }
    long long lo = 0, hi = 0;
    if (b.has_lo) lo = b.lo_excl ? (long long)floor(b.lo) + 1 : (long long)ceil(b.lo);
    if (b.has_hi) hi = b.hi_excl ? (long long)ceil(b.hi) - 1 : (long long)floor(b.hi);
    if (b.has_lo && b.has_hi && lo > hi) {
        *empty = true;
        return true;
    }
    int n = 0;
    gbnf_buf_puts(out, "( ");
    if (!b.has_lo || lo < 0) { /* negatives: "-" and |x| in [max(1, -hi), -lo] */
        unsigned long long a = b.has_hi && hi < 0 ? (unsigned long long)-hi : 1;
        gbnf_buf_puts(out, "\"-\" ");
        put_uint_range(out, a, b.has_lo ? -lo : -1);
        n++;
    }
    if (!b.has_hi || hi >= 0) {
        if (n++) gbnf_buf_puts(out, " | ");
        put_uint_range(out, b.has_lo && lo > 0 ? (unsigned long long)lo : 0, b.has_hi ? hi : -1);
    }
    gbnf_buf_puts(out, " )");
    return true;
}

/* Non-integer numbers with bounds: exact only for integral bounds, in plain decimal form
 * (no exponent): x = sign I.F, and a bound on x is a bound on I with one boundary case on
 * whether F is zero. Anything else is refused. */
static bool gen_number(jsc *c, const json_t *s, gbnf_buf *out, bool *empty) {
    bounds b;
    if (!get_bounds(c, s, &b)) return false;
    if (!b.has_lo && !b.has_hi) {
        gbnf_buf_puts(out, prim(c, PRIM_NUMBER));
        return true;
    }
    if ((b.has_lo && b.lo != floor(b.lo)) || (b.has_hi && b.hi != floor(b.hi)))
        return fail(c, CELER_STATUS_UNSUPPORTED,
                    "a non-integral bound on type number is not supported (integral bounds are)");
    (void)empty;
    /* Split by sign: y = |x| with y's bounds; each side is pieces over the integer part I
     * with F any, F zero ("" or .0+) or F non-zero. */
    const char *fany = "( \".\" [0-9]{1,20} )?";
    const char *fzero = "( \".\" \"0\"{1,20} )?";
    const char *fnz = "\".\" [0-9]{0,19} [1-9] [0-9]{0,19}";
    int n = 0;
    gbnf_buf_puts(out, "( ");
    for (int neg = 0; neg < 2; neg++) {
        /* y in [ylo, yhi] (y >= 0), each end inclusive or not, in terms of |x| */
        bool has_ylo, has_yhi, ylo_x, yhi_x;
        double ylo, yhi;
        if (!neg) {
            if (b.has_hi && (b.hi < 0 || (b.hi == 0 && b.hi_excl))) continue;
            has_ylo = true, ylo = b.has_lo && b.lo > 0 ? b.lo : 0;
            ylo_x = b.has_lo && b.lo >= 0 ? b.lo_excl : false;
            has_yhi = b.has_hi, yhi = b.hi, yhi_x = b.hi_excl;
        } else {
            if (b.has_lo && b.lo >= 0) continue;
            has_ylo = true, ylo = b.has_hi && b.hi < 0 ? -b.hi : 0;
            ylo_x = b.has_hi && b.hi < 0 ? b.hi_excl : true; /* x < 0 strictly */
            has_yhi = b.has_lo, yhi = -b.lo, yhi_x = b.lo_excl;
        }
        (void)has_ylo;
        long long L = (long long)ylo, H = has_yhi ? (long long)yhi : -1;
        if (has_yhi && (L > H || (L == H && (ylo_x || yhi_x)))) continue;
        const char *sign = neg ? "\"-\" " : "";
        /* I in [L + (ylo_x ? 1 : 0), H - 1] with any F; I == L with F != 0 when exclusive
         * at L; I == H with F == 0 when inclusive at H. */
        long long a = ylo_x ? L + 1 : L, z = has_yhi ? H - 1 : -1;
        if (!has_yhi || a <= z) {
            if (n++) gbnf_buf_puts(out, " | ");
            gbnf_buf_puts(out, sign);
            put_uint_range(out, (unsigned long long)a, z);
            gbnf_buf_printf(out, " %s", fany);
        }
        if (ylo_x && (!has_yhi || L < H)) {
            if (n++) gbnf_buf_puts(out, " | ");
            gbnf_buf_puts(out, sign);
            put_uint_range(out, (unsigned long long)L, L);
            gbnf_buf_printf(out, " %s", fnz);
        }
        if (has_yhi && !yhi_x && (H > L || !ylo_x)) {
            if (n++) gbnf_buf_puts(out, " | ");
            gbnf_buf_puts(out, sign);
            put_uint_range(out, (unsigned long long)H, H);
            gbnf_buf_printf(out, " %s", fzero);
        }
    }
    gbnf_buf_puts(out, " )");
    if (!n) *empty = true, out->len = 0;
    return true;
}

/* ---- Objects ---- */

typedef struct tnode {
    uint32_t cp;
    int child, next;
    bool term;
} tnode;

#define KEY_TRIE_NAME_MAX 256

/* The rule for the rest of a key below trie node i such that the whole key is none of the
 * names in the trie (additional properties must not reuse a declared name). Keys written
 * this way carry no escapes. */
static char *gen_key_rest(jsc *c, const tnode *t, int i) {
    gbnf_buf b = {0};
    const char *kc = prim(c, PRIM_KEYCHAR);
    if (t[i].child < 0) {
        gbnf_buf_printf(&b, "%s+", kc);
    } else {
        gbnf_cset other = {0};
        gbnf_cset_add(&other, 0x20, GBNF_CP_MAX);
        gbnf_cset_remove(&other, '"', '"');
        gbnf_cset_remove(&other, '\\', '\\');
        gbnf_cset_remove(&other, 0xD800, 0xDFFF);
        for (int k = t[i].child; k >= 0; k = t[k].next) gbnf_cset_remove(&other, t[k].cp, t[k].cp);
        gbnf_buf_puts(&b, "( ");
        int n = 0;
        if (other.n) gbnf_put_cset(&b, &other), gbnf_buf_printf(&b, " %s*", kc), n++;
        gbnf_cset_free(&other);
        for (int k = t[i].child; k >= 0 && c->st == CELER_OK; k = t[k].next) {
            char *sub = gen_key_rest(c, t, k);
            if (!sub) break;
            char u[4];
            const size_t len = gbnf_utf8_encode(t[k].cp, u);
            if (n++) gbnf_buf_puts(&b, " | ");
            gbnf_put_literal(&b, u, len);
            gbnf_buf_printf(&b, " %s", sub);
            free(sub);
        }
        gbnf_buf_printf(&b, " )%s", t[i].term ? "" : "?");
    }
    char *name = c->st == CELER_OK ? rule_name(c, "key") : NULL;
    if (name) emit_rule(c, name, b.s);
    gbnf_buf_free(&b);
    return name;
}

/* The expression of a JSON string that is none of names[n]. */
static bool gen_key_not_in(jsc *c, const char *const *names, size_t n, gbnf_buf *out) {
    size_t total = 1;
    for (size_t i = 0; i < n; i++) total += strlen(names[i]);
    tnode *t = malloc(total * sizeof *t);
    if (!t) return fail(c, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    int nt = 1;
    t[0] = (tnode){0, -1, -1, false};
    for (size_t i = 0; i < n && c->st == CELER_OK; i++) {
        const char *s = names[i];
        size_t len = strlen(s), depth = 0;
        int at = 0;
        for (size_t p = 0; p < len;) {
            uint32_t cp;
            size_t k = gbnf_utf8_decode(s + p, len - p, &cp);
            if (!k || ++depth > KEY_TRIE_NAME_MAX) {
                fail(c, CELER_STATUS_UNSUPPORTED,
                     "property name longer than %d characters beside additionalProperties",
                     KEY_TRIE_NAME_MAX);
                break;
            }
            p += k;
            int ch = t[at].child;
            while (ch >= 0 && t[ch].cp != cp) ch = t[ch].next;
            if (ch < 0) {
                t[nt] = (tnode){cp, -1, t[at].child, false};
                t[at].child = nt, ch = nt++;
            }
            at = ch;
        }
        t[at].term = true;
    }
    char *rest = c->st == CELER_OK ? gen_key_rest(c, t, 0) : NULL;
    if (rest) gbnf_buf_printf(out, "\"\\\"\" %s \"\\\"\"", rest);
    free(rest);
    free(t);
    return c->st == CELER_OK;
}

typedef struct prop {
    const char *key;
    const json_t *schema;
    bool required;
    char *rule; /* "KEY" ws ":" ws VALUE */
} prop;

/* Writes `"key" ws ":" ws` then value into a rule of its own. */
static char *gen_member(jsc *c, const char *key_expr_or_null, const char *key, const json_t *schema,
                        const char *path_key, bool *empty) {
    const char *ws = prim(c, PRIM_WS);
    gbnf_buf b = {0}, v = {0};
    if (key_expr_or_null) {
        gbnf_buf_puts(&b, key_expr_or_null);
    } else {
        gbnf_buf t = {0};
        put_json_string(&t, key, strlen(key));
        gbnf_put_literal(&b, t.s, t.len);
        gbnf_buf_free(&t);
    }
    char *name = NULL;
    size_t m = path_push(c, path_key);
    if (gen_rule(c, schema, NULL, key_expr_or_null ? "value" : key, &v, empty) && !*empty) {
        gbnf_buf_printf(&b, " %s \":\" %s %s", ws, ws, v.s);
        name = rule_name(c, key_expr_or_null ? "extra" : key);
        if (name) emit_rule(c, name, b.s);
    }
    path_pop(c, m);
    gbnf_buf_free(&b), gbnf_buf_free(&v);
    return name;
}

static bool gen_object(jsc *c, const json_t *s, gbnf_buf *out, bool *empty) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return fail(c, CELER_STATUS_INVALID_ARGUMENT, "properties must be an object");
    if (req && !json_is_array(req))
        return fail(c, CELER_STATUS_INVALID_ARGUMENT, "required must be an array of strings");
    for (size_t i = 0; i < json_array_size(req); i++)
        if (!json_is_string(json_array_get(req, i)))
            return fail(c, CELER_STATUS_INVALID_ARGUMENT, "required must be an array of strings");
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return fail(c, CELER_STATUS_INVALID_ARGUMENT, "additionalProperties must be a schema");
    size_t np = json_object_size(props), nr = json_array_size(req), n = 0;
    prop *p = calloc(np + nr + 1, sizeof *p);
    const char **names = calloc(np + nr + 1, sizeof *names);
    if (!p || !names) {
        free(p), free(names);
        return fail(c, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)props, k, v) {
        bool r = false;
        for (size_t i = 0; i < nr; i++) r |= !strcmp(k, json_string_value(json_array_get(req, i)));
        p[n++] = (prop){k, v, r, NULL};
    }
    /* required names not in properties take additionalProperties' schema */
    for (size_t i = 0; i < nr; i++) {
        const char *rk = json_string_value(json_array_get(req, i));
        bool seen = false;
        for (size_t j = 0; j < n; j++) seen |= !strcmp(p[j].key, rk);
        if (!seen) p[n++] = (prop){rk, addl ? addl : json_true(), true, NULL};
    }
    for (size_t i = 0; i < n; i++) names[i] = p[i].key;
    char *extra = NULL;
    const char *ws = prim(c, PRIM_WS);
    int saved_barrier = c->barrier;
    c->barrier = ++c->next_barrier; /* members follow a '{' */
    size_t live = 0;
    for (size_t i = 0; i < n && c->st == CELER_OK; i++) {
        bool e = false;
        bool declared = i < np;
        const char *pk = declared ? "properties" : "additionalProperties";
        size_t m = declared ? path_push(c, pk) : c->path.len;
        p[i].rule = gen_member(c, NULL, p[i].key, p[i].schema, declared ? p[i].key : pk, &e);
        if (declared) path_pop(c, m);
        if (c->st != CELER_OK) break;
        if (e && p[i].required) *empty = true;
        if (!e)
            p[live++] = p[i];
        else
            free(p[i].rule);
    }
    if (c->st == CELER_OK && !*empty && (!addl || !json_is_false(addl))) {
        bool e = false;
        gbnf_buf key = {0};
        if (n)
            gen_key_not_in(c, names, n, &key);
        else
            gbnf_buf_puts(&key, prim(c, PRIM_STRING));
        if (c->st == CELER_OK)
            extra =
                gen_member(c, key.s, NULL, addl ? addl : json_true(), "additionalProperties", &e);
        gbnf_buf_free(&key);
    }
    c->barrier = saved_barrier;
    n = live;
    if (c->st == CELER_OK && !*empty) {
        /* tail[i]: what may follow once a member before i was written */
        char **tail = calloc(n + 1, sizeof *tail);
        if (!tail) fail(c, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        for (size_t i = n + 1; tail && i-- > 1 && c->st == CELER_OK;) {
            gbnf_buf b = {0};
            if (i == n) {
                if (extra) gbnf_buf_printf(&b, "( %s \",\" %s %s )*", ws, ws, extra);
            } else {
                gbnf_buf_printf(&b, "%s%s \",\" %s %s%s", p[i].required ? "" : "( ", ws, ws,
                                p[i].rule, p[i].required ? "" : " )?");
                if (tail[i + 1]) gbnf_buf_printf(&b, " %s", tail[i + 1]);
            }
            if (b.len) {
                tail[i] = rule_name(c, "tail");
                if (tail[i]) emit_rule(c, tail[i], b.s);
            }
            gbnf_buf_free(&b);
        }
        size_t first_req = n;
        for (size_t i = 0; i < n && first_req == n; i++)
            if (p[i].required) first_req = i;
        gbnf_buf_printf(out, "\"{\" %s ", ws);
        if (n || extra) {
            bool optional = first_req == n;
            gbnf_buf_puts(out, optional ? "( ( " : "( ");
            int alts = 0;
            for (size_t i = 0; i < n && i <= first_req; i++) {
                gbnf_buf_printf(out, "%s%s", alts++ ? " | " : "", p[i].rule);
                if (tail && tail[i + 1]) gbnf_buf_printf(out, " %s", tail[i + 1]);
            }
            if (extra && first_req == n) {
                gbnf_buf_printf(out, "%s%s", alts++ ? " | " : "", extra);
                if (tail && tail[n]) gbnf_buf_printf(out, " %s", tail[n]);
            }
            gbnf_buf_printf(out, " ) %s %s", ws, optional ? ")? " : "");
        }
        gbnf_buf_puts(out, "\"}\"");
        for (size_t i = 0; tail && i <= n; i++) free(tail[i]);
        free(tail);
    }
    for (size_t i = 0; i < n; i++) free(p[i].rule);
    free(p), free(names), free(extra);
    return c->st == CELER_OK;
}

/* ---- Arrays ---- */

static bool gen_array(jsc *c, const json_t *s, gbnf_buf *out, bool *empty) {
    const json_t *items = json_object_get(s, "items"), *pre = json_object_get(s, "prefixItems");
    if (json_is_array(items))
        return fail(c, CELER_STATUS_UNSUPPORTED,
                    "items as an array (draft 2019 tuples) is not supported; use prefixItems");
    if (pre && !json_is_array(pre))
        return fail(c, CELER_STATUS_INVALID_ARGUMENT, "prefixItems must be an array of schemas");
    long min = 0, max = -1;
    if (!get_count(c, s, "minItems", &min) || !get_count(c, s, "maxItems", &max)) return false;
    size_t k = json_array_size(pre);
    if (k > GBNF_REPEAT_MAX)
        return fail(c, CELER_STATUS_UNSUPPORTED, "more than %d prefixItems is not supported",
                    GBNF_REPEAT_MAX);
    const char *ws = prim(c, PRIM_WS);
    int saved_barrier = c->barrier;
    c->barrier = ++c->next_barrier; /* elements follow a '[' */
    char **rule = calloc(k + 1, sizeof *rule);
    if (!rule) fail(c, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    /* an element schema that accepts nothing caps the length before it */
    size_t kk = 0;
    for (; rule && kk < k && c->st == CELER_OK; kk++) {
        gbnf_buf b = {0};
        bool e = false;
        size_t m = path_push(c, "prefixItems");
        path_push_index(c, kk);
        char hint[32];
        snprintf(hint, sizeof hint, "item%zu", kk);
        gen_rule(c, json_array_get(pre, kk), NULL, hint, &b, &e);
        path_pop(c, m);
        if (!e && c->st == CELER_OK)
            rule[kk] = b.s;
        else
            gbnf_buf_free(&b);
        if (e) {
            if (max < 0 || (long)kk < max) max = (long)kk;
            break;
        }
    }
    bool items_empty = false;
    if (rule && c->st == CELER_OK && (max < 0 || max > (long)k)) {
        gbnf_buf b = {0};
        gen_rule(c, items ? items : json_true(), items ? "items" : NULL, "item", &b, &items_empty);
        rule[k] = b.s;
        if (items_empty && (max < 0 || max > (long)k)) max = (long)k;
    }
    c->barrier = saved_barrier;
    if (c->st == CELER_OK && max >= 0 && min > max) *empty = true;
    if (c->st == CELER_OK && !*empty) {
        gbnf_buf_printf(out, "\"[\" %s ", ws);
        if (max != 0) {
            gbnf_buf_printf(out, "( %s", k ? rule[0] : rule[k]);
            int open = 0;
            for (long i = 1; max < 0 || i < max; i++) {
                if ((size_t)i < k) {
                    gbnf_buf_printf(out, " %s%s \",\" %s %s", i >= min ? "( " : "", ws, ws,
                                    rule[i]);
                    open += i >= min;
                    continue;
                }
                long a = min > i ? min - i : 0, z = max < 0 ? -1 : max - i;
                if (z < 0)
                    gbnf_buf_printf(out, " ( %s \",\" %s %s ){%ld,}", ws, ws, rule[k], a);
                else
                    gbnf_buf_printf(out, " ( %s \",\" %s %s ){%ld,%ld}", ws, ws, rule[k], a, z);
                break;
            }
            for (int i = 0; i < open; i++) gbnf_buf_puts(out, " )?");
            gbnf_buf_printf(out, " %s )%s ", ws, min == 0 ? "?" : "");
        }
        gbnf_buf_puts(out, "\"]\"");
    }
    for (size_t i = 0; rule && i <= k; i++) free(rule[i]);
    free(rule);
    return c->st == CELER_OK;
}

/* ---- allOf ---- */

/* Merges the object schema s (an allOf member, or the schema around allOf) into props and
 * req. Only object keywords can be merged: anything else is refused. */
static bool merge_object(jsc *c, const json_t *s, json_t *props, json_t *req, bool outer,
                         int depth) {
    if (depth > JSON_SCHEMA_DEPTH_MAX)
        return fail(c, CELER_STATUS_UNSUPPORTED, "allOf nested too deep");
    if (json_is_true(s)) return true;
    if (!json_is_object(s))
        return fail(c, CELER_STATUS_UNSUPPORTED, "allOf member that is not an object schema");
    if (!check_keywords(c, s)) return false;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (is_annotation(k)) continue;
        if (!strcmp(k, "type") && json_is_string(v) && !strcmp(json_string_value(v), "object"))
            continue;
        if (!strcmp(k, "additionalProperties") && json_is_true(v)) continue;
        if (!strcmp(k, "$ref") && !outer) {
            const json_t *t = json_is_string(v) && json_string_value(v)[0] == '#'
                                  ? resolve_pointer(c->doc, json_string_value(v) + 1)
                                  : NULL;
            if (!t)
                return fail(c, CELER_STATUS_UNSUPPORTED,
                            "allOf member $ref must be a local reference");
            if (!merge_object(c, t, props, req, false, depth + 1)) return false;
            continue;
        }
        if (!strcmp(k, "allOf") && !outer) {
            for (size_t i = 0; json_is_array(v) && i < json_array_size(v); i++)
                if (!merge_object(c, json_array_get(v, i), props, req, false, depth + 1))
                    return false;
            if (json_is_array(v)) continue;
        }
        if (!strcmp(k, "allOf") && outer) continue;
        if (!strcmp(k, "properties") && json_is_object(v)) {
            const char *pk;
            json_t *pv;
            json_object_foreach(v, pk, pv) {
                json_t *old = json_object_get(props, pk);
                if (old && !json_equal(old, pv))
                    return fail(c, CELER_STATUS_UNSUPPORTED,
                                "allOf members define property %.60s differently (cannot merge)",
                                pk);
                json_object_set(props, pk, pv);
            }
            continue;
        }
        if (!strcmp(k, "required") && json_is_array(v)) {
            for (size_t i = 0; i < json_array_size(v); i++) {
                if (!json_is_string(json_array_get(v, i)))
                    return fail(c, CELER_STATUS_INVALID_ARGUMENT,
                                "required must be an array of strings");
                json_array_append(req, json_array_get(v, i));
            }
            continue;
        }
        return fail(c, CELER_STATUS_UNSUPPORTED,
                    "keyword %s in allOf is not supported (allOf merges object schemas: type "
                    "object, properties, required)",
                    k);
    }
    return true;
}

static bool gen_allof(jsc *c, const json_t *s, gbnf_buf *out, bool *empty) {
    const json_t *a = json_object_get(s, "allOf");
    size_t m = path_push(c, "allOf");
    if (!json_is_array(a) || !json_array_size(a)) {
        fail(c, CELER_STATUS_INVALID_ARGUMENT, "allOf must be a non-empty array of schemas");
        path_pop(c, m);
        return false;
    }
    path_pop(c, m);
    bool alone = true;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) alone &= !strcmp(k, "allOf") || is_annotation(k);
    if (alone && json_array_size(a) == 1) {
        m = path_push(c, "allOf");
        size_t mi = path_push_index(c, 0);
        gen(c, json_array_get(a, 0), out, empty);
        path_pop(c, mi);
        path_pop(c, m);
        return c->st == CELER_OK;
    }
    json_t *merged = json_object(), *props = json_object(), *req = json_array();
    if (merged && props && req && merge_object(c, s, props, req, true, 0)) {
        m = path_push(c, "allOf");
        for (size_t i = 0; i < json_array_size(a) && c->st == CELER_OK; i++) {
            size_t mi = path_push_index(c, i);
            merge_object(c, json_array_get(a, i), props, req, false, 0);
            path_pop(c, mi);
        }
        if (c->st == CELER_OK) {
            json_object_set(merged, "properties", props);
            json_object_set(merged, "required", req);
            gen_object(c, merged, out, empty);
        }
        path_pop(c, m);
    } else if (c->st == CELER_OK) {
        fail(c, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    json_decref(merged), json_decref(props), json_decref(req);
    return c->st == CELER_OK;
}

/* ---- Dispatch ---- */

static bool gen_body(jsc *c, const json_t *s, gbnf_buf *out, bool *empty) {
    if (json_is_true(s)) {
        gbnf_buf_puts(out, prim(c, PRIM_VALUE));
        return true;
    }
    if (json_is_false(s)) {
        *empty = true;
        return true;
    }
    if (!json_is_object(s))
        return fail(c, CELER_STATUS_INVALID_ARGUMENT, "a schema must be an object or a boolean");
    if (!check_keywords(c, s)) return false;
    for (const json_t *d = json_object_get(s, "$defs"); d; d = NULL)
        if (!json_is_object(d))
            return fail(c, CELER_STATUS_INVALID_ARGUMENT, "$defs must be an object");
    if (json_object_get(s, "$ref")) return gen_ref(c, s, out, empty);
    if (json_object_get(s, "enum") || json_object_get(s, "const"))
        return gen_enum(c, s, out, empty);
    if (json_object_get(s, "anyOf")) return gen_anyof(c, s, "anyOf", out, empty);
    if (json_object_get(s, "oneOf")) return gen_anyof(c, s, "oneOf", out, empty);
    if (json_object_get(s, "allOf")) return gen_allof(c, s, out, empty);
    long dummy;
    static const char *const counts[] = {"minItems", "maxItems", "minLength", "maxLength"};
    for (int i = 0; i < 4; i++)
        if (!get_count(c, s, counts[i], &dummy)) return false;
    const char *types[7];
    int nt = get_types(c, s, types);
    if (nt < 0) return false;
    bool has_number = false;
    for (int i = 0; i < nt; i++) has_number |= !strcmp(types[i], "number");
    gbnf_buf alt[7] = {{0}};
    size_t n = 0;
    for (int i = 0; i < nt && c->st == CELER_OK; i++) {
        const char *t = types[i];
        bool e = false;
        if (!strcmp(t, "null"))
            gbnf_buf_puts(&alt[n], prim(c, PRIM_NULL));
        else if (!strcmp(t, "boolean"))
            gbnf_buf_puts(&alt[n], prim(c, PRIM_BOOLEAN));
        else if (!strcmp(t, "string"))
            gen_string(c, s, &alt[n], &e);
        else if (!strcmp(t, "integer") && has_number)
            continue;
        else if (!strcmp(t, "integer"))
            gen_integer(c, s, &alt[n], &e);
        else if (!strcmp(t, "number"))
            gen_number(c, s, &alt[n], &e);
        else if (!strcmp(t, "object"))
            gen_object(c, s, &alt[n], &e);
        else
            gen_array(c, s, &alt[n], &e);
        if (e)
            gbnf_buf_free(&alt[n]);
        else
            n++;
    }
    if (c->st == CELER_OK) {
        *empty = n == 0;
        put_alternatives(out, alt, n);
    }
    for (int i = 0; i < 7; i++) gbnf_buf_free(&alt[i]);
    return c->st == CELER_OK;
}

static bool gen(jsc *c, const json_t *s, gbnf_buf *out, bool *empty) {
    *empty = false;
    if (c->st != CELER_OK) return false;
    if (++c->depth > JSON_SCHEMA_DEPTH_MAX) {
        c->depth--;
        return fail(c, CELER_STATUS_UNSUPPORTED, "schema nested deeper than %d levels",
                    JSON_SCHEMA_DEPTH_MAX);
    }
    bool ok = gen_body(c, s, out, empty);
    c->depth--;
    if (c->rules.failed || out->failed)
        return fail(c,
                    c->rules.failed == GBNF_BUF_NO_MEMORY ? CELER_STATUS_OUT_OF_MEMORY
                                                          : CELER_STATUS_UNSUPPORTED,
                    "grammar larger than %zu bytes", GBNF_TEXT_MAX);
    return ok && c->st == CELER_OK;
}

/* ==== Entry points ==== */

static celer_status compile(const json_t *schema, const char *root, const char *prefix, char **gbnf,
                            celer_error *e) {
    *gbnf = NULL;
    if (!root || !prefix || !gbnf_name_ok(root, false) || !gbnf_name_ok(prefix, true))
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "schema: root and prefix must be GBNF names (letters, digits, '-')");
    jsc c = {.doc = schema, .prefix = prefix, .e = e};
    for (int p = 0; p < PRIM_COUNT_; p++) {
        snprintf(c.pn[p], sizeof c.pn[p], "%s%s", prefix, prim_names[p]);
        if (!strcmp(c.pn[p], root))
            return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                             "schema: root name %s is taken by a shared rule; give a prefix", root);
    }
    gbnf_buf_puts(&c.path, "");
    gbnf_buf body = {0};
    bool empty = false;
    if (!schema)
        gbnf_buf_printf(&body, "%s", prim(&c, PRIM_OBJECT));
    else if (gen(&c, schema, &body, &empty) && empty)
        fail(&c, CELER_STATUS_UNSUPPORTED, "schema accepts no value");
    gbnf_buf outb = {0};
    if (c.st == CELER_OK) {
        gbnf_buf_printf(&outb, "%s ::= %s\n", root, body.s);
        gbnf_buf_putn(&outb, c.rules.s ? c.rules.s : "", c.rules.len);
        if (outb.failed || c.rules.failed)
            error_set(e, CELER_STATUS_OUT_OF_MEMORY, "schema: out of memory"),
                c.st = CELER_STATUS_OUT_OF_MEMORY;
    }
    gbnf_buf_free(&body), gbnf_buf_free(&c.rules), gbnf_buf_free(&c.path);
    for (size_t i = 0; i < c.n_refs; i++) free(c.refs[i].ptr), free(c.refs[i].name);
    free(c.refs);
    if (c.st != CELER_OK) {
        gbnf_buf_free(&outb);
        return c.st;
    }
    *gbnf = outb.s;
    return CELER_OK;
}

celer_status json_schema_to_gbnf(const json_t *schema, const char *root, const char *prefix,
                                 char **gbnf, celer_error *e) {
    if (!schema) {
        *gbnf = NULL;
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "schema: no schema given");
    }
    return compile(schema, root, prefix, gbnf, e);
}

celer_status json_object_gbnf(const char *root, const char *prefix, char **gbnf, celer_error *e) {
    return compile(NULL, root, prefix, gbnf, e);
}

/*
 * tok_load.c - reads a Hugging Face tokenizer.json into a tokenizer.
 *
 * Strict: every component type is checked against what celer implements, and a field
 * of the wrong JSON type, a merge naming a token outside the vocabulary or an unknown
 * component gets one line naming the file and the JSON path
 * (`pre_tokenizer.pretokenizers[1].type: unsupported "Whitespace"`). Options that
 * would change the ids but are not implemented (dropout, truncation, padding) are
 * refused rather than ignored. This file does no encoding or decoding.
 */
#define _DEFAULT_SOURCE
#include "tokenizer/tok_impl.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_ID (1 << 24) /* ids beyond this are refused: no real vocabulary is near it */

/* The GPT-2 pre-tokenizer regex ByteLevel uses when use_regex is set. */
static const char gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef struct loader {
    const char *file;
    celer_error *e;
} loader;

static celer_status bad(loader *L, const char *path, const char *what) {
    return error_set(L->e, CELER_STATUS_BAD_FILE, "%s: %s: %s", L->file, path, what);
}

static celer_status oom(loader *L) { return error_set(L->e, CELER_STATUS_OUT_OF_MEMORY, "%s: out of memory", L->file); }

static void subpath(char *out, size_t cap, const char *path, const char *key) {
    snprintf(out, cap, "%s%s%s", path, *path ? "." : "", key);
}

/* ==== Typed field access: absent or null gives the default ==== */

static celer_status opt_bool(loader *L, json_t *o, const char *key, const char *path, bool def, bool *out) {
    json_t *v = json_object_get(o, key);
    char p[256];
    *out = def;
    if (!v || json_is_null(v)) return CELER_OK;
    if (!json_is_boolean(v)) return subpath(p, sizeof p, path, key), bad(L, p, "expected true or false");
    *out = json_is_true(v);
    return CELER_OK;
}

static celer_status opt_int(loader *L, json_t *o, const char *key, const char *path, int64_t def, int64_t *out) {
    json_t *v = json_object_get(o, key);
    char p[256];
    *out = def;
    if (!v || json_is_null(v)) return CELER_OK;
    if (!json_is_integer(v)) return subpath(p, sizeof p, path, key), bad(L, p, "expected an integer");
    *out = json_integer_value(v);
    return CELER_OK;
}

/* A string field (copied, NUL-terminated, *out NULL when absent or null). */
static celer_status opt_str(loader *L, json_t *o, const char *key, const char *path, char **out, size_t *n) {
    json_t *v = json_object_get(o, key);
    char p[256];
    *out = NULL;
    if (n) *n = 0;
    if (!v || json_is_null(v)) return CELER_OK;
    if (!json_is_string(v)) return subpath(p, sizeof p, path, key), bad(L, p, "expected a string");
    size_t len = json_string_length(v);
    if (!(*out = malloc(len + 1))) return oom(L);
    memcpy(*out, json_string_value(v), len + 1);
    if (n) *n = len;
    return CELER_OK;
}

static celer_status req_str(loader *L, json_t *o, const char *key, const char *path, char **out, size_t *n) {
    char p[256];
    celer_status st = opt_str(L, o, key, path, out, n);
    if (st == CELER_OK && !*out) return subpath(p, sizeof p, path, key), bad(L, p, "missing string");
    return st;
}

/* A one-character string field as a code point. */
static celer_status opt_char(loader *L, json_t *o, const char *key, const char *path, uint32_t def, uint32_t *out) {
    char *s, p[256];
    size_t n;
    *out = def;
    celer_status st = opt_str(L, o, key, path, &s, &n);
    if (st != CELER_OK || !s) return st;
    int l = utf8_next(s, n, out, NULL);
    free(s);
    if (l == 0 || (size_t)l != n) return subpath(p, sizeof p, path, key), bad(L, p, "expected one character");
    return CELER_OK;
}

/* The "type" of a component object. */
static celer_status comp_type(loader *L, json_t *o, const char *path, const char **type) {
    char p[256];
    if (!json_is_object(o)) return bad(L, *path ? path : "(root)", "expected an object");
    json_t *t = json_object_get(o, "type");
    subpath(p, sizeof p, path, "type");
    if (!json_is_string(t)) return bad(L, p, "missing string");
    *type = json_string_value(t);
    return CELER_OK;
}

static celer_status unsupported(loader *L, const char *path, const char *type) {
    return error_set(L->e, CELER_STATUS_UNSUPPORTED, "%s: %s.type: unsupported \"%s\"", L->file, path, type);
}

/* {"String": s} or {"Regex": r} */
static celer_status load_pattern(loader *L, json_t *o, const char *path, pattern *pat) {
    char p[256];
    subpath(p, sizeof p, path, "pattern");
    json_t *v = json_object_get(o, "pattern");
    if (!json_is_object(v) || json_object_size(v) != 1) return bad(L, p, "expected {\"String\": ...} or {\"Regex\": ...}");
    json_t *s = json_object_get(v, "String"), *r = json_object_get(v, "Regex");
    if (json_is_string(s)) {
        pat->lit_n = json_string_length(s);
        if (!(pat->lit = malloc(pat->lit_n + 1))) return oom(L);
        memcpy(pat->lit, json_string_value(s), pat->lit_n + 1);
        return CELER_OK;
    }
    if (json_is_string(r)) {
        char q[300];
        snprintf(q, sizeof q, "%s.Regex", p);
        return pattern_compile(pat, json_string_value(r), json_string_length(r), q, L->file, L->e);
    }
    return bad(L, p, "expected {\"String\": ...} or {\"Regex\": ...}");
}

/* The array field key of o as a list of n sub-objects. */
static celer_status sub_array(loader *L, json_t *o, const char *key, const char *path, json_t **arr, void **sub,
                              size_t elem, size_t *n) {
    char p[256];
    subpath(p, sizeof p, path, key);
    *arr = json_object_get(o, key);
    if (!json_is_array(*arr)) return bad(L, p, "expected an array");
    *n = json_array_size(*arr);
    if (!(*sub = calloc(*n ? *n : 1, elem))) return oom(L);
    return CELER_OK;
}

static celer_status load_prepend_scheme(loader *L, json_t *o, const char *path, prepend_scheme *out) {
    char p[256];
    json_t *v = json_object_get(o, "prepend_scheme");
    *out = PREPEND_ALWAYS;
    if (!v) { /* older files: add_prefix_space */
        bool aps;
        celer_status st = opt_bool(L, o, "add_prefix_space", path, true, &aps);
        *out = aps ? PREPEND_ALWAYS : PREPEND_NEVER;
        return st;
    }
    subpath(p, sizeof p, path, "prepend_scheme");
    const char *s = json_string_value(v);
    if (s && !strcmp(s, "always")) *out = PREPEND_ALWAYS;
    else if (s && !strcmp(s, "first")) *out = PREPEND_FIRST;
    else if (s && !strcmp(s, "never")) *out = PREPEND_NEVER;
    else return bad(L, p, "expected \"always\", \"first\" or \"never\"");
    return CELER_OK;
}

/* ==== Components ==== */

static celer_status load_normalizer(loader *L, json_t *o, const char *path, normalizer *nz) {
    const char *type;
    celer_status st = comp_type(L, o, path, &type);
    if (st != CELER_OK) return st;
    if (!strcmp(type, "NFC")) nz->kind = NORM_NFC;
    else if (!strcmp(type, "NFKC")) nz->kind = NORM_NFKC;
    else if (!strcmp(type, "Prepend")) nz->kind = NORM_PREPEND;
    else if (!strcmp(type, "Replace")) nz->kind = NORM_REPLACE;
    else if (!strcmp(type, "Sequence")) nz->kind = NORM_SEQUENCE;
    else return unsupported(L, path, type);
    switch (nz->kind) {
    case NORM_PREPEND:
        return req_str(L, o, "prepend", path, &nz->str, &nz->str_n);
    case NORM_REPLACE:
        st = load_pattern(L, o, path, &nz->pat);
        return st != CELER_OK ? st : req_str(L, o, "content", path, &nz->str, &nz->str_n);
    case NORM_SEQUENCE: {
        json_t *arr;
        st = sub_array(L, o, "normalizers", path, &arr, (void **)&nz->sub, sizeof *nz->sub, &nz->n_sub);
        for (size_t i = 0; st == CELER_OK && i < nz->n_sub; i++) {
            char p[256];
            snprintf(p, sizeof p, "%s.normalizers[%zu]", path, i);
            st = load_normalizer(L, json_array_get(arr, i), p, &nz->sub[i]);
        }
        return st;
    }
    default:
        return CELER_OK;
    }
}

static celer_status load_pretok(loader *L, json_t *o, const char *path, pretok *pt) {
    const char *type;
    celer_status st = comp_type(L, o, path, &type);
    if (st != CELER_OK) return st;
    if (!strcmp(type, "Split")) {
        pt->kind = PRE_SPLIT;
        st = load_pattern(L, o, path, &pt->pat);
        if (st == CELER_OK) st = opt_bool(L, o, "invert", path, false, &pt->invert);
        if (st != CELER_OK) return st;
        const char *b = json_string_value(json_object_get(o, "behavior"));
        char p[256];
        subpath(p, sizeof p, path, "behavior");
        if (!b) return bad(L, p, "missing string");
        if (!strcmp(b, "Removed")) pt->behavior = SPLIT_REMOVED;
        else if (!strcmp(b, "Isolated")) pt->behavior = SPLIT_ISOLATED;
        else if (!strcmp(b, "MergedWithPrevious")) pt->behavior = SPLIT_MERGED_WITH_PREVIOUS;
        else if (!strcmp(b, "MergedWithNext")) pt->behavior = SPLIT_MERGED_WITH_NEXT;
        else if (!strcmp(b, "Contiguous")) pt->behavior = SPLIT_CONTIGUOUS;
        else return error_set(L->e, CELER_STATUS_UNSUPPORTED, "%s: %s: unsupported \"%s\"", L->file, p, b);
        return CELER_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        pt->kind = PRE_BYTE_LEVEL;
        st = opt_bool(L, o, "add_prefix_space", path, true, &pt->add_prefix_space);
        if (st == CELER_OK) st = opt_bool(L, o, "use_regex", path, true, &pt->use_regex);
        if (st == CELER_OK && pt->use_regex)
            st = pattern_compile(&pt->pat, gpt2_regex, sizeof gpt2_regex - 1, "ByteLevel regex", L->file, L->e);
        return st;
    }
    if (!strcmp(type, "Metaspace")) {
        pt->kind = PRE_METASPACE;
        st = opt_char(L, o, "replacement", path, 0x2581, &pt->replacement);
        if (st == CELER_OK) st = load_prepend_scheme(L, o, path, &pt->scheme);
        if (st == CELER_OK) st = opt_bool(L, o, "split", path, true, &pt->split);
        return st;
    }
    if (!strcmp(type, "Digits")) {
        pt->kind = PRE_DIGITS;
        return opt_bool(L, o, "individual_digits", path, false, &pt->individual_digits);
    }
    if (!strcmp(type, "Sequence")) {
        pt->kind = PRE_SEQUENCE;
        json_t *arr;
        st = sub_array(L, o, "pretokenizers", path, &arr, (void **)&pt->sub, sizeof *pt->sub, &pt->n_sub);
        for (size_t i = 0; st == CELER_OK && i < pt->n_sub; i++) {
            char p[256];
            snprintf(p, sizeof p, "%s.pretokenizers[%zu]", path, i);
            st = load_pretok(L, json_array_get(arr, i), p, &pt->sub[i]);
        }
        return st;
    }
    return unsupported(L, path, type);
}

static celer_status load_decoder(loader *L, json_t *o, const char *path, decoder *d) {
    const char *type;
    celer_status st = comp_type(L, o, path, &type);
    if (st != CELER_OK) return st;
    if (!strcmp(type, "ByteLevel")) return d->kind = DEC_BYTE_LEVEL, CELER_OK;
    if (!strcmp(type, "ByteFallback")) return d->kind = DEC_BYTE_FALLBACK, CELER_OK;
    if (!strcmp(type, "Fuse")) return d->kind = DEC_FUSE, CELER_OK;
    if (!strcmp(type, "Strip")) {
        d->kind = DEC_STRIP;
        st = opt_char(L, o, "content", path, ' ', &d->ch);
        if (st == CELER_OK) st = opt_int(L, o, "start", path, 0, &d->start);
        if (st == CELER_OK) st = opt_int(L, o, "stop", path, 0, &d->stop);
        if (st == CELER_OK && (d->start < 0 || d->stop < 0)) return bad(L, path, "negative start or stop");
        return st;
    }
    if (!strcmp(type, "Replace")) {
        d->kind = DEC_REPLACE;
        st = load_pattern(L, o, path, &d->pat);
        return st != CELER_OK ? st : req_str(L, o, "content", path, &d->str, &d->str_n);
    }
    if (!strcmp(type, "Metaspace")) {
        d->kind = DEC_METASPACE;
        st = opt_char(L, o, "replacement", path, 0x2581, &d->ch);
        return st != CELER_OK ? st : load_prepend_scheme(L, o, path, &d->scheme);
    }
    if (!strcmp(type, "Sequence")) {
        d->kind = DEC_SEQUENCE;
        json_t *arr;
        st = sub_array(L, o, "decoders", path, &arr, (void **)&d->sub, sizeof *d->sub, &d->n_sub);
        for (size_t i = 0; st == CELER_OK && i < d->n_sub; i++) {
            char p[256];
            snprintf(p, sizeof p, "%s.decoders[%zu]", path, i);
            st = load_decoder(L, json_array_get(arr, i), p, &d->sub[i]);
        }
        return st;
    }
    return unsupported(L, path, type);
}

/* The id of a token named by a template: from special_tokens, else added/model vocab. */
static celer_status template_token(loader *L, tokenizer *t, json_t *specials, const char *name, const char *path,
                                   int32_t **ids, size_t *n, size_t *cap) {
    json_t *sp = json_object_get(specials, name);
    json_t *arr = json_object_get(sp, "ids");
    if (!json_is_array(arr)) {
        char m[300];
        snprintf(m, sizeof m, "special token \"%.200s\" missing from special_tokens", name);
        return bad(L, path, m);
    }
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_ID)
            return bad(L, path, "special_tokens ids must be token ids");
        if (*n == *cap) {
            *cap = *cap ? *cap * 2 : 8;
            int32_t *p = realloc(*ids, sizeof *p * *cap);
            if (!p) return oom(L);
            *ids = p;
        }
        (*ids)[(*n)++] = (int32_t)json_integer_value(v);
    }
    (void)t;
    return CELER_OK;
}

static celer_status load_post(loader *L, tokenizer *t, json_t *o, const char *path) {
    const char *type;
    celer_status st = comp_type(L, o, path, &type);
    if (st != CELER_OK) return st;
    if (!strcmp(type, "ByteLevel")) return CELER_OK; /* offsets only; ids unchanged */
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(o, "processors");
        char p[256];
        subpath(p, sizeof p, path, "processors");
        if (!json_is_array(arr)) return bad(L, p, "expected an array");
        for (size_t i = 0; st == CELER_OK && i < json_array_size(arr); i++) {
            char q[280];
            snprintf(q, sizeof q, "%s[%zu]", p, i);
            st = load_post(L, t, json_array_get(arr, i), q);
        }
        return st;
    }
    if (strcmp(type, "TemplateProcessing")) return unsupported(L, path, type);
    if (t->tmpl.present) return bad(L, path, "more than one TemplateProcessing");
    char p[256];
    subpath(p, sizeof p, path, "single");
    json_t *single = json_object_get(o, "single"), *specials = json_object_get(o, "special_tokens");
    if (!json_is_array(single)) return bad(L, p, "expected an array");
    size_t cap = 0;
    bool seen_a = false;
    t->tmpl.present = true;
    for (size_t i = 0; st == CELER_OK && i < json_array_size(single); i++) {
        json_t *it = json_array_get(single, i);
        char q[280];
        snprintf(q, sizeof q, "%s[%zu]", p, i);
        json_t *sp = json_object_get(it, "SpecialToken"), *sq = json_object_get(it, "Sequence");
        if (json_is_object(sp) && json_is_string(json_object_get(sp, "id"))) {
            st = template_token(L, t, specials, json_string_value(json_object_get(sp, "id")), q, &t->tmpl.ids,
                                &t->tmpl.n, &cap);
        } else if (json_is_object(sq) && json_is_string(json_object_get(sq, "id"))) {
            if (strcmp(json_string_value(json_object_get(sq, "id")), "A") || seen_a)
                return bad(L, q, "a single-sequence template holds sequence A once");
            seen_a = true;
            if (t->tmpl.n == cap) {
                cap = cap ? cap * 2 : 8;
                int32_t *np = realloc(t->tmpl.ids, sizeof *np * cap);
                if (!np) return oom(L);
                t->tmpl.ids = np;
            }
            t->tmpl.ids[t->tmpl.n++] = -1;
        } else {
            return bad(L, q, "expected {\"SpecialToken\": {...}} or {\"Sequence\": {...}}");
        }
    }
    if (st == CELER_OK && !seen_a) return bad(L, p, "sequence A missing");
    return st;
}

/* ==== The BPE model ==== */

static celer_status load_bpe(loader *L, json_t *m, bpe *b) {
    const char *type;
    celer_status st = comp_type(L, m, "model", &type);
    if (st != CELER_OK) return st;
    if (strcmp(type, "BPE")) return unsupported(L, "model", type);
    json_t *drop = json_object_get(m, "dropout");
    if (drop && !json_is_null(drop) && !(json_is_number(drop) && json_number_value(drop) == 0.0))
        return error_set(L->e, CELER_STATUS_UNSUPPORTED, "%s: model.dropout: unsupported (BPE dropout)", L->file);
    char *unk = NULL;
    st = opt_str(L, m, "unk_token", "model", &unk, NULL);
    if (st == CELER_OK) st = opt_bool(L, m, "byte_fallback", "model", false, &b->byte_fallback);
    if (st == CELER_OK) st = opt_bool(L, m, "fuse_unk", "model", false, &b->fuse_unk);
    if (st == CELER_OK) st = opt_bool(L, m, "ignore_merges", "model", false, &b->ignore_merges);
    if (st == CELER_OK) st = opt_str(L, m, "continuing_subword_prefix", "model", &b->prefix, &b->prefix_n);
    if (st == CELER_OK) st = opt_str(L, m, "end_of_word_suffix", "model", &b->suffix, &b->suffix_n);
    if (st != CELER_OK) return free(unk), st;
    if (b->prefix && !b->prefix_n) free(b->prefix), b->prefix = NULL;
    if (b->suffix && !b->suffix_n) free(b->suffix), b->suffix = NULL;

    json_t *vocab = json_object_get(m, "vocab");
    if (!json_is_object(vocab)) return free(unk), bad(L, "model.vocab", "expected an object");
    size_t bytes = 0;
    int64_t max_id = -1;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_ID) {
            char p[300];
            snprintf(p, sizeof p, "model.vocab[\"%.200s\"]", key);
            return free(unk), bad(L, p, "expected a token id in [0, 16777216)");
        }
        bytes += strlen(key) + 1;
        if (json_integer_value(v) > max_id) max_id = json_integer_value(v);
    }
    b->n_ids = max_id + 1;
    b->strs = malloc(bytes ? bytes : 1);
    b->id_off = malloc(sizeof *b->id_off * (size_t)(b->n_ids ? b->n_ids : 1));
    b->id_len = malloc(sizeof *b->id_len * (size_t)(b->n_ids ? b->n_ids : 1));
    if (!b->strs || !b->id_off || !b->id_len) return free(unk), oom(L);
    for (int64_t i = 0; i < b->n_ids; i++) b->id_off[i] = SIZE_MAX, b->id_len[i] = 0;
    if (!strmap_reserve(&b->vocab, json_object_size(vocab))) return free(unk), oom(L);
    size_t off = 0;
    json_object_foreach(vocab, key, v) {
        size_t n = strlen(key);
        int32_t id = (int32_t)json_integer_value(v);
        if (b->id_off[id] != SIZE_MAX) {
            char p[300];
            snprintf(p, sizeof p, "model.vocab[\"%.200s\"]", key);
            return free(unk), bad(L, p, "id used by two tokens");
        }
        memcpy(b->strs + off, key, n + 1);
        b->id_off[id] = off, b->id_len[id] = (uint32_t)n;
        if (!strmap_put(&b->vocab, b->strs + off, n, id)) return free(unk), oom(L);
        off += n + 1;
    }
    b->unk = -1;
    if (unk) {
        b->unk = strmap_get(&b->vocab, unk, strlen(unk));
        free(unk);
        if (b->unk < 0) return bad(L, "model.unk_token", "not in model.vocab");
    }
    for (int i = 0; i < 256; i++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", i);
        b->byte_id[i] = b->byte_fallback ? strmap_get(&b->vocab, s, 6) : -1;
    }

    json_t *merges = json_object_get(m, "merges");
    if (!json_is_array(merges)) return bad(L, "model.merges", "expected an array");
    b->n_merges = (int64_t)json_array_size(merges);
    if (b->n_merges >= INT32_MAX) return bad(L, "model.merges", "too many merges");
    b->merge_rank = malloc(sizeof *b->merge_rank * (size_t)(b->n_merges ? b->n_merges : 1));
    b->merge_new = malloc(sizeof *b->merge_new * (size_t)(b->n_merges ? b->n_merges : 1));
    if (!b->merge_rank || !b->merge_new || !u64map_reserve(&b->merges, (size_t)b->n_merges)) return oom(L);
    sbuf joined = {0};
    for (int64_t i = 0; i < b->n_merges; i++) {
        json_t *it = json_array_get(merges, (size_t)i);
        const char *l, *r;
        size_t ln, rn;
        char p[64];
        snprintf(p, sizeof p, "model.merges[%lld]", (long long)i);
        if (json_is_string(it)) {
            l = json_string_value(it);
            const char *sp = strchr(l, ' ');
            if (!sp) return free(joined.p), bad(L, p, "expected \"left right\"");
            ln = (size_t)(sp - l), r = sp + 1, rn = json_string_length(it) - ln - 1;
        } else if (json_is_array(it) && json_array_size(it) == 2 && json_is_string(json_array_get(it, 0)) &&
                   json_is_string(json_array_get(it, 1))) {
            l = json_string_value(json_array_get(it, 0)), ln = json_string_length(json_array_get(it, 0));
            r = json_string_value(json_array_get(it, 1)), rn = json_string_length(json_array_get(it, 1));
        } else {
            return free(joined.p), bad(L, p, "expected \"left right\" or [\"left\", \"right\"]");
        }
        int32_t a = strmap_get(&b->vocab, l, ln), c = strmap_get(&b->vocab, r, rn);
        size_t skip = b->prefix_n <= rn ? b->prefix_n : rn;
        joined.n = 0;
        if (!sbuf_add(&joined, l, ln) || !sbuf_add(&joined, r + skip, rn - skip)) return free(joined.p), oom(L);
        int32_t nw = strmap_get(&b->vocab, joined.p, joined.n);
        if (a < 0 || c < 0 || nw < 0) {
            char msg[300];
            snprintf(msg, sizeof msg, "token \"%.200s\" not in model.vocab",
                     a < 0 ? l : c < 0 ? r : joined.p);
            free(joined.p);
            return bad(L, p, msg);
        }
        b->merge_rank[i] = (int32_t)i, b->merge_new[i] = nw;
        if (!u64map_put(&b->merges, (uint64_t)(uint32_t)a << 32 | (uint32_t)c, (int32_t)i)) return free(joined.p), oom(L);
    }
    free(joined.p);
    return CELER_OK;
}

/* ==== Added tokens ==== */

static celer_status load_added(loader *L, tokenizer *t, json_t *arr) {
    if (!arr || json_is_null(arr)) return CELER_OK;
    if (!json_is_array(arr)) return bad(L, "added_tokens", "expected an array");
    t->n_added = json_array_size(arr);
    if (!(t->added = calloc(t->n_added ? t->n_added : 1, sizeof *t->added))) return oom(L);
    t->max_added_id = -1;
    for (size_t i = 0; i < t->n_added; i++) {
        json_t *o = json_array_get(arr, i);
        added_token *a = &t->added[i];
        char p[64];
        snprintf(p, sizeof p, "added_tokens[%zu]", i);
        if (!json_is_object(o)) return bad(L, p, "expected an object");
        int64_t id;
        celer_status st = opt_int(L, o, "id", p, -1, &id);
        if (st == CELER_OK && (id < 0 || id >= MAX_ID)) return bad(L, p, "missing or bad id");
        a->id = (int32_t)id;
        if (st == CELER_OK) st = req_str(L, o, "content", p, &a->s, &a->n);
        if (st == CELER_OK && a->n == 0) return bad(L, p, "empty content");
        if (st == CELER_OK) st = opt_bool(L, o, "lstrip", p, false, &a->lstrip);
        if (st == CELER_OK) st = opt_bool(L, o, "rstrip", p, false, &a->rstrip);
        if (st == CELER_OK) st = opt_bool(L, o, "single_word", p, false, &a->single_word);
        if (st == CELER_OK) st = opt_bool(L, o, "special", p, false, &a->special);
        if (st == CELER_OK) st = opt_bool(L, o, "normalized", p, !a->special, &a->normalized);
        if (st != CELER_OK) return st;
        if (utf8_check(a->s, a->n) != a->n) return bad(L, p, "content is not valid UTF-8");
        if (!strmap_put(&t->added_map, a->s, a->n, (int32_t)i)) return oom(L);
        if (a->id > t->max_added_id) t->max_added_id = a->id;
    }
    return CELER_OK;
}

/* ==== Entry points ==== */

static celer_status load_doc(json_t *doc, const char *name, tokenizer **out, celer_error *e) {
    loader L = {name, e};
    tokenizer *t = calloc(1, sizeof *t);
    celer_status st = CELER_STATUS_OUT_OF_MEMORY;
    if (!t || !(t->name = strdup(name))) {
        st = oom(&L);
        goto fail;
    }
    if (!json_is_object(doc)) {
        st = bad(&L, "(root)", "expected an object");
        goto fail;
    }
    static const char *const refused[] = {"truncation", "padding"};
    for (size_t i = 0; i < 2; i++) {
        json_t *v = json_object_get(doc, refused[i]);
        if (v && !json_is_null(v)) {
            st = error_set(e, CELER_STATUS_UNSUPPORTED, "%s: %s: unsupported (must be null)", name, refused[i]);
            goto fail;
        }
    }
    if ((st = load_bpe(&L, json_object_get(doc, "model"), &t->model)) != CELER_OK) goto fail;
    if ((st = load_added(&L, t, json_object_get(doc, "added_tokens"))) != CELER_OK) goto fail;
    json_t *v;
    if ((v = json_object_get(doc, "normalizer")) && !json_is_null(v)) {
        if (!(t->norm = calloc(1, sizeof *t->norm))) goto oom;
        if ((st = load_normalizer(&L, v, "normalizer", t->norm)) != CELER_OK) goto fail;
    }
    if ((v = json_object_get(doc, "pre_tokenizer")) && !json_is_null(v)) {
        if (!(t->pre = calloc(1, sizeof *t->pre))) goto oom;
        if ((st = load_pretok(&L, v, "pre_tokenizer", t->pre)) != CELER_OK) goto fail;
    }
    if ((v = json_object_get(doc, "post_processor")) && !json_is_null(v))
        if ((st = load_post(&L, t, v, "post_processor")) != CELER_OK) goto fail;
    if ((v = json_object_get(doc, "decoder")) && !json_is_null(v)) {
        if (!(t->dec = calloc(1, sizeof *t->dec))) goto oom;
        if ((st = load_decoder(&L, v, "decoder", t->dec)) != CELER_OK) goto fail;
    }
    if ((st = tok_index(t, e)) != CELER_OK) goto fail;
    *out = t;
    return CELER_OK;
oom:
    st = oom(&L);
fail:
    tok_destroy(t);
    *out = NULL;
    return st;
}

celer_status tok_load_json(const char *json, size_t len, const char *name, tokenizer **out, celer_error *e) {
    json_error_t je;
    *out = NULL;
    json_t *doc = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!doc) return error_set(e, CELER_STATUS_BAD_FILE, "%s:%d:%d: %s", name, je.line, je.column, je.text);
    celer_status st = load_doc(doc, name, out, e);
    json_decref(doc);
    return st;
}

celer_status tok_load(const char *path, tokenizer **out, celer_error *e) {
    char file[4096];
    struct stat sb;
    *out = NULL;
    if (stat(path, &sb) != 0) return error_set(e, CELER_STATUS_IO, "%s: no such file or directory", path);
    if (S_ISDIR(sb.st_mode)) snprintf(file, sizeof file, "%s/tokenizer.json", path);
    else snprintf(file, sizeof file, "%s", path);
    /* One read and an in-memory parse: jansson's file reader goes a byte at a time. */
    FILE *f = fopen(file, "rb");
    if (!f) return error_set(e, CELER_STATUS_IO, "%s: cannot open", file);
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            size_t c = cap ? cap * 2 : (size_t)1 << 20;
            char *p = realloc(buf, c);
            if (!p) {
                free(buf), fclose(f);
                return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "%s: out of memory", file);
            }
            buf = p, cap = c;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        if (k == 0) break;
        n += k;
    }
    bool read_error = ferror(f);
    fclose(f);
    if (read_error) {
        free(buf);
        return error_set(e, CELER_STATUS_IO, "%s: read error", file);
    }
    celer_status st = tok_load_json(buf, n, file, out, e);
    free(buf);
    return st;
}

void tok_destroy(tokenizer *t) {
    if (!t) return;
    bpe_free(&t->model);
    for (size_t i = 0; i < t->n_added; i++) {
        if (t->added[i].pat != t->added[i].s) free(t->added[i].pat);
        free(t->added[i].s);
    }
    free(t->added);
    strmap_free(&t->added_map);
    normalizer_free(t->norm), free(t->norm);
    pretok_free(t->pre), free(t->pre);
    decoder_free(t->dec), free(t->dec);
    free(t->tmpl.ids);
    free(t->match[0]), free(t->match[1]), free(t->added_index);
    free(t->name);
    free(t);
}

/*
 * tok_gguf.c - a tokenizer from the tokenizer.ggml.* metadata of a GGUF file.
 *
 * The metadata is turned into the tokenizer.json document Hugging Face transformers
 * builds from the same file (its GGUF converter), and that document goes through the
 * ordinary loader, so both paths share every line of tokenization code.
 *
 * Byte-level BPE (tokenizer.ggml.model "gpt2"): vocabulary from tokens, merges, control
 * and user-defined token types as special added tokens, BOS from add_bos_token, and the
 * pre-tokenizer chosen by tokenizer.ggml.pre ("llama-bpe" and "qwen2" use their Split
 * regexes; other names get the GPT-2 ByteLevel regex, as transformers does).
 *
 * SentencePiece (tokenizer.ggml.model "llama"): a BPE with byte fallback over the tokens
 * as spelled (U+2581 for a space). Without tokenizer.ggml.merges the merges are derived
 * from the vocabulary: each token split in two wherever both halves are tokens, ordered
 * by the token's score, or for Gemma by its position in the file. Gemma (gemma, gemma2,
 * gemma3) replaces spaces in a normalizer and splits after each one; Phi-3 prepends
 * U+2581 in a normalizer; every other architecture uses Metaspace, prepending U+2581 to
 * the first piece, with a decoder that strips it again. add_bos_token defaults to true
 * here, as llama.cpp does; add_space_prefix is read by neither transformers nor us.
 * Unigram (t5) and the other llama.cpp models are refused with a clear error.
 */
#define _POSIX_C_SOURCE 200809L
#include "tokenizer/tok_gguf.h"

#include "base/mapped_file.h"
#include "io/gguf.h"

#include "tokenizer/strmap.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* GGUF token types. */
enum {
    TOKEN_NORMAL = 1,
    TOKEN_UNKNOWN = 2,
    TOKEN_CONTROL = 3,
    TOKEN_USER_DEFINED = 4,
    TOKEN_BYTE = 6
};

static const char LLAMA3_REGEX[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{"
                                   "N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                                   "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2_REGEX[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{"
                                  "N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                                  "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static bool str_is(const gguf_kv *kv, const char *s) {
    return kv && kv->val.type == GGUF_TYPE_STRING && kv->val.str_len == strlen(s) &&
           memcmp(kv->val.str, s, kv->val.str_len) == 0;
}

/* Walks the strings of an array value: *p advances past each. */
static const char *next_str(const uint8_t **p, size_t *len) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | (*p)[i];
    const char *s = (const char *)*p + 8;
    *p += 8 + n;
    *len = (size_t)n;
    return s;
}

static int64_t int_at(const gguf_value *v, uint64_t i) {
    const uint8_t *p = v->arr_data;
    switch (v->arr_type) {
    case GGUF_TYPE_INT32: {
        int32_t x;
        memcpy(&x, p + 4 * i, 4);
        return x;
    }
    case GGUF_TYPE_UINT32: {
        uint32_t x;
        memcpy(&x, p + 4 * i, 4);
        return x;
    }
    case GGUF_TYPE_INT8:
        return (int8_t)p[i];
    case GGUF_TYPE_UINT8:
        return p[i];
    default:
        return TOKEN_NORMAL;
    }
}

static bool kv_id(const gguf_file *g, const char *key, int64_t *out) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return false;
    if (kv->val.type == GGUF_TYPE_INT32 || kv->val.type == GGUF_TYPE_INT64)
        *out = kv->val.num.i;
    else if (kv->val.type == GGUF_TYPE_UINT32 || kv->val.type == GGUF_TYPE_UINT64)
        *out = (int64_t)kv->val.num.u;
    else
        return false;
    return true;
}

static json_t *pre_tokenizer_for(const gguf_kv *pre) {
    const char *regex = str_is(pre, "llama-bpe") || str_is(pre, "llama3") ? LLAMA3_REGEX
                        : str_is(pre, "qwen2")                            ? QWEN2_REGEX
                                                                          : NULL;
    if (!regex)
        return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                         "trim_offsets", 1, "use_regex", 1);
    return json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type",
                     "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex", regex,
                     "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space",
                     0, "trim_offsets", 1, "use_regex", 0);
}

/* ==== SentencePiece vocabularies (tokenizer.ggml.model "llama") ==== */

/* The whitespace Python's str.strip() removes (Py_UNICODE_ISSPACE). */
static bool py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Decodes one code point of valid UTF-8 at s (jansson has checked the token already). */
static uint32_t utf8_at(const char *s, size_t *n) {
    const uint8_t *u = (const uint8_t *)s;
    if (u[0] < 0x80) return *n = 1, u[0];
    if (u[0] < 0xe0) return *n = 2, (uint32_t)(u[0] & 0x1f) << 6 | (u[1] & 0x3f);
    if (u[0] < 0xf0)
        return *n = 3, (uint32_t)(u[0] & 0x0f) << 12 | (uint32_t)(u[1] & 0x3f) << 6 | (u[2] & 0x3f);
    return *n = 4, (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3f) << 12 |
                       (uint32_t)(u[2] & 0x3f) << 6 | (u[3] & 0x3f);
}

static size_t utf8_count(const char *s, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += ((uint8_t)s[i] & 0xc0) != 0x80;
    return n;
}

/* Gemma files store a token of spaces as real spaces; its vocabulary spells them U+2581.
 * True when s (contains a space and is all whitespace) must be respelled. */
static bool gemma_space_token(const char *s, size_t len) {
    bool space = false;
    for (size_t i = 0, k; i < len; i += k) {
        uint32_t c = utf8_at(s + i, &k);
        if (!py_space(c)) return false;
        space |= c == ' ';
    }
    return space;
}

/* One derived merge: left and right token ids, the score of the token they make, their
 * lengths in code points and the order they were found in. */
typedef struct spm_merge {
    int32_t l, r;
    float score;
    uint32_t l_cp, r_cp;
    int64_t seq;
} spm_merge;

/* Best score first, then longer left, then longer right, then order found: the stable
 * sort transformers' generate_merges does with reverse=True. */
static int merge_cmp(const void *pa, const void *pb) {
    const spm_merge *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->l_cp != b->l_cp) return a->l_cp > b->l_cp ? -1 : 1;
    if (a->r_cp != b->r_cp) return a->r_cp > b->r_cp ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/* Within one token, pairs go by (left id, right id). */
static int local_cmp(const void *pa, const void *pb) {
    const spm_merge *a = pa, *b = pb;
    if (a->l != b->l) return a->l < b->l ? -1 : 1;
    return a->r < b->r ? -1 : a->r > b->r;
}

/* The vocabulary of a SentencePiece file as transformers sees it: token strings (Gemma's
 * space tokens respelled), and a map from string to the last id that spells it. */
typedef struct spm_vocab {
    const char **s;
    size_t *len;
    int64_t n;
    char *respelled; /* storage for respelled tokens */
    strmap map;
} spm_vocab;

static void spm_vocab_free(spm_vocab *v) {
    free(v->s);
    free(v->len);
    free(v->respelled);
    strmap_free(&v->map);
}

static const char METASPACE[] = "\xe2\x96\x81"; /* U+2581 */

static celer_status spm_vocab_init(spm_vocab *v, const gguf_value *tokens, bool gemma,
                                   const char *path, celer_error *e) {
    memset(v, 0, sizeof *v);
    v->n = (int64_t)tokens->arr_len;
    v->s = malloc(sizeof *v->s * (size_t)(v->n ? v->n : 1));
    v->len = malloc(sizeof *v->len * (size_t)(v->n ? v->n : 1));
    if (!v->s || !v->len || !strmap_reserve(&v->map, (size_t)v->n)) goto oom;
    size_t extra = 0;
    const uint8_t *p = tokens->arr_data;
    for (int64_t i = 0; i < v->n; i++) {
        v->s[i] = next_str(&p, &v->len[i]);
        json_t *check = json_stringn(v->s[i], v->len[i]);
        if (!check)
            return error_set(e, CELER_STATUS_BAD_FILE,
                             "%s: tokenizer.ggml.tokens[%lld]: not valid UTF-8", path,
                             (long long)i);
        json_decref(check);
        if (gemma && gemma_space_token(v->s[i], v->len[i]))
            extra += 3 * utf8_count(v->s[i], v->len[i]);
    }
    if (extra && !(v->respelled = malloc(extra))) goto oom;
    size_t off = 0;
    for (int64_t i = 0; i < v->n; i++) {
        if (gemma && gemma_space_token(v->s[i], v->len[i])) {
            const size_t cp = utf8_count(v->s[i], v->len[i]);
            for (size_t k = 0; k < cp; k++) memcpy(v->respelled + off + 3 * k, METASPACE, 3);
            v->s[i] = v->respelled + off, v->len[i] = 3 * cp, off += 3 * cp;
        }
        if (!strmap_put(&v->map, v->s[i], v->len[i], (int32_t)i)) goto oom;
    }
    return CELER_OK;
oom:
    return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
}

/* The merges a vocabulary implies, as transformers' generate_merges derives them: every
 * token cut in two at each code point where both halves are tokens, ordered by the score
 * of the token they make (Gemma: by its position in the file, earlier first). */
static celer_status spm_merges(json_t *out, const spm_vocab *v, const float *scores,
                               const char *path, celer_error *e) {
    size_t cap = 1024, n = 0;
    spm_merge *m = malloc(sizeof *m * cap);
    strmap seen = {0};
    celer_status st = CELER_OK;
    if (!m || !strmap_reserve(&seen, (size_t)v->n)) goto oom;
    for (int64_t i = 0; i < v->n; i++) {
        /* A token spelled twice is visited once, where it first appears, with the score of
         * its last spelling (a Python dict keeps the first key and the last value). */
        if (strmap_get(&seen, v->s[i], v->len[i]) >= 0) continue;
        if (!strmap_put(&seen, v->s[i], v->len[i], (int32_t)i)) goto oom;
        const int32_t last = strmap_get(&v->map, v->s[i], v->len[i]);
        const float score = scores ? scores[last] : (float)-last;
        const size_t first = n;
        uint32_t l_cp = 0;
        const uint32_t all_cp = (uint32_t)utf8_count(v->s[i], v->len[i]);
        for (size_t b = 0, k; b < v->len[i]; b += k) {
            utf8_at(v->s[i] + b, &k);
            if (b == 0) {
                l_cp++;
                continue;
            }
            const int32_t l = strmap_get(&v->map, v->s[i], b),
                          r = strmap_get(&v->map, v->s[i] + b, v->len[i] - b);
            if (l >= 0 && r >= 0) {
                if (n == cap) {
                    spm_merge *g = realloc(m, sizeof *m * (cap *= 2));
                    if (!g) goto oom;
                    m = g;
                }
                m[n++] = (spm_merge){l, r, score, l_cp, all_cp - l_cp, 0};
            }
            l_cp++;
        }
        if (n - first > 1) qsort(m + first, n - first, sizeof *m, local_cmp);
        for (size_t j = first; j < n; j++) m[j].seq = (int64_t)j;
    }
    if (n > 1) qsort(m, n, sizeof *m, merge_cmp);
    for (size_t j = 0; j < n; j++) {
        json_t *pair =
            json_pack("[s#, s#]", v->s[m[j].l], v->len[m[j].l], v->s[m[j].r], v->len[m[j].r]);
        if (!pair || json_array_append_new(out, pair)) goto oom;
    }
    goto done;
oom:
    st = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
done:
    free(m);
    strmap_free(&seen);
    return st;
}

/* ==== The document ==== */

/* The text of token id (a view into the file), or NULL when out of range. */
static const char *token_at(const gguf_value *tokens, int64_t id, size_t *len) {
    if (id < 0 || (uint64_t)id >= tokens->arr_len) return NULL;
    const uint8_t *p = tokens->arr_data;
    const char *s = NULL;
    for (int64_t i = 0; i <= id; i++) s = next_str(&p, len);
    return s;
}

/* Adds token id as special token `name` of a TemplateProcessing: to single, and to its
 * special_tokens. */
static bool template_add(json_t *single, json_t *specials, const gguf_value *tokens, int64_t id) {
    size_t len;
    const char *s = token_at(tokens, id, &len);
    json_t *text = s ? json_stringn(s, len) : NULL;
    if (!text) return false;
    json_array_append_new(single,
                          json_pack("{s:{s:O, s:i}}", "SpecialToken", "id", text, "type_id", 0));
    json_object_set_new(
        specials, json_string_value(text),
        json_pack("{s:O, s:[I], s:[O]}", "id", text, "ids", (json_int_t)id, "tokens", text));
    json_decref(text);
    return true;
}

/* The post-processor transformers sets from add_bos_token and add_eos_token: BOS, the
 * text, EOS, each special token only when asked for and present; null when neither is. */
static json_t *post_processor(const gguf_file *g, const gguf_value *tokens, bool bos_default) {
    const gguf_kv *ab = gguf_find_kv(g, "tokenizer.ggml.add_bos_token"),
                  *ae = gguf_find_kv(g, "tokenizer.ggml.add_eos_token");
    const bool add_bos = ab && ab->val.type == GGUF_TYPE_BOOL ? ab->val.num.u != 0 : bos_default;
    const bool add_eos = ae && ae->val.type == GGUF_TYPE_BOOL && ae->val.num.u != 0;
    int64_t bos = -1, eos = -1;
    const bool has_bos = add_bos && kv_id(g, "tokenizer.ggml.bos_token_id", &bos) &&
                         token_at(tokens, bos, &(size_t){0});
    const bool has_eos = add_eos && kv_id(g, "tokenizer.ggml.eos_token_id", &eos) &&
                         token_at(tokens, eos, &(size_t){0});
    if (!has_bos && !has_eos) return json_null();
    json_t *single = json_array(), *specials = json_object();
    if (has_bos) template_add(single, specials, tokens, bos);
    json_array_append_new(single, json_pack("{s:{s:s, s:i}}", "Sequence", "id", "A", "type_id", 0));
    if (has_eos) template_add(single, specials, tokens, eos);
    return json_pack("{s:s, s:o, s:[], s:o}", "type", "TemplateProcessing", "single", single,
                     "pair", "special_tokens", specials);
}

/* tokenizer.ggml.token_type, checked: absent (NULL) or n integers. */
static bool token_types(const gguf_file *g, uint64_t n, const gguf_value **out, const char *path,
                        celer_error *e) {
    const gguf_kv *types = gguf_find_kv(g, "tokenizer.ggml.token_type");
    *out = NULL;
    if (!types) return true;
    if (types->val.type != GGUF_TYPE_ARRAY ||
        (types->val.arr_type != GGUF_TYPE_INT32 && types->val.arr_type != GGUF_TYPE_UINT32) ||
        types->val.arr_len != n) {
        error_set(
            e, CELER_STATUS_BAD_FILE,
            "%s: tokenizer.ggml.token_type: expected %llu int32 (one per token), found %s%llu",
            path, (unsigned long long)n, types->val.type != GGUF_TYPE_ARRAY ? "a scalar, " : "",
            (unsigned long long)(types->val.type == GGUF_TYPE_ARRAY ? types->val.arr_len : 1));
        return false;
    }
    *out = &types->val;
    return true;
}

/* tokenizer.ggml.merges as an array of "left right" strings; NULL with e set on failure. */
static json_t *file_merges(const gguf_kv *merges, const char *path, celer_error *e) {
    if (merges->val.type != GGUF_TYPE_ARRAY || merges->val.arr_type != GGUF_TYPE_STRING) {
        error_set(e, CELER_STATUS_BAD_FILE,
                  "%s: tokenizer.ggml.merges: expected an array of strings", path);
        return NULL;
    }
    json_t *list = json_array();
    const uint8_t *p = merges->val.arr_data;
    for (uint64_t i = 0; i < merges->val.arr_len; i++) {
        size_t len;
        const char *s = next_str(&p, &len);
        json_t *m = json_stringn(s, len);
        if (!m) {
            error_set(e, CELER_STATUS_BAD_FILE, "%s: tokenizer.ggml.merges[%llu]: not valid UTF-8",
                      path, (unsigned long long)i);
            json_decref(list);
            return NULL;
        }
        json_array_append_new(list, m);
    }
    return list;
}

static json_t *bpe_model(json_t *unk, bool byte_fallback, json_t *vocab, json_t *merges) {
    return json_pack("{s:s, s:n, s:o, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout",
                     "unk_token", unk, "continuing_subword_prefix", "end_of_word_suffix",
                     "fuse_unk", byte_fallback, "byte_fallback", byte_fallback, "ignore_merges", 0,
                     "vocab", vocab, "merges", merges);
}

static json_t *document(json_t *added, json_t *normalizer, json_t *pre, json_t *post,
                        json_t *decoder, json_t *model) {
    return json_pack("{s:s, s:n, s:n, s:o, s:o, s:o, s:o, s:o, s:o}", "version", "1.0",
                     "truncation", "padding", "added_tokens", added, "normalizer", normalizer,
                     "pre_tokenizer", pre, "post_processor", post, "decoder", decoder, "model",
                     model);
}

static json_t *gpt2_document(const gguf_file *g, const gguf_value *tokens, const gguf_value *types,
                             const char *path, celer_status *st, celer_error *e) {
    const gguf_kv *merges = gguf_find_kv(g, "tokenizer.ggml.merges");
    if (!merges) {
        error_set(e, CELER_STATUS_BAD_FILE,
                  "%s: tokenizer.ggml.merges: expected an array of strings", path);
        return NULL;
    }
    json_t *mlist = file_merges(merges, path, e);
    if (!mlist) return NULL;
    json_t *vocab = json_object(), *added = json_array();
    const uint8_t *p = tokens->arr_data;
    for (uint64_t i = 0; i < tokens->arr_len; i++) {
        size_t len;
        const char *s = next_str(&p, &len);
        json_t *key = json_stringn(s, len);
        if (!key) {
            error_set(e, CELER_STATUS_BAD_FILE, "%s: tokenizer.ggml.tokens[%llu]: not valid UTF-8",
                      path, (unsigned long long)i);
            json_decref(vocab), json_decref(added), json_decref(mlist);
            return NULL;
        }
        json_object_set_new(vocab, json_string_value(key), json_integer((json_int_t)i));
        const int64_t type = types ? int_at(types, i) : TOKEN_NORMAL;
        if (type == TOKEN_CONTROL || type == TOKEN_USER_DEFINED)
            json_array_append_new(added, json_pack("{s:I, s:O, s:b, s:b, s:b, s:b, s:b}", "id",
                                                   (json_int_t)i, "content", key, "single_word", 0,
                                                   "lstrip", 0, "rstrip", 0, "normalized", 0,
                                                   "special", type == TOKEN_CONTROL));
        json_decref(key);
    }
    *st = CELER_STATUS_OUT_OF_MEMORY;
    return document(added, json_null(), pre_tokenizer_for(gguf_find_kv(g, "tokenizer.ggml.pre")),
                    post_processor(g, tokens, false),
                    json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 1,
                              "trim_offsets", 1, "use_regex", 1),
                    bpe_model(json_null(), false, vocab, mlist));
}

/* The added tokens transformers makes of a SentencePiece vocabulary: control tokens as
 * special, then user-defined ones as plain added tokens, each under the id the
 * vocabulary gives its text (a user-defined token Gemma respelled is no longer there). */
static json_t *spm_added(const spm_vocab *v, const gguf_value *tokens, const gguf_value *types) {
    json_t *added = json_array();
    strmap done = {0};
    if (!types) return added;
    for (int pass = 0; pass < 2; pass++) {
        const int64_t want = pass == 0 ? TOKEN_CONTROL : TOKEN_USER_DEFINED;
        const uint8_t *p = tokens->arr_data;
        for (uint64_t i = 0; i < tokens->arr_len; i++) {
            size_t len;
            const char *s = next_str(&p, &len);
            const int32_t id = strmap_get(&v->map, s, len);
            if (int_at(types, i) != want || id < 0 || strmap_get(&done, s, len) >= 0) continue;
            if (!strmap_put(&done, s, len, id)) goto oom;
            json_t *tok = json_pack("{s:I, s:s%, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)id,
                                    "content", s, len, "single_word", 0, "lstrip", 0, "rstrip", 0,
                                    "normalized", 0, "special", pass == 0);
            if (!tok || json_array_append_new(added, tok)) goto oom;
        }
    }
    strmap_free(&done);
    return added;
oom:
    strmap_free(&done);
    json_decref(added);
    return NULL;
}

static json_t *spm_document(const gguf_file *g, const gguf_value *tokens, const gguf_value *types,
                            const char *path, celer_status *st, celer_error *e) {
    const gguf_kv *arch = gguf_find_kv(g, "general.architecture");
    const bool gemma = str_is(arch, "gemma") || str_is(arch, "gemma2") || str_is(arch, "gemma3");
    const bool phi3 = str_is(arch, "phi3");
    const uint64_t n = tokens->arr_len;
    const gguf_kv *sc = gguf_find_kv(g, "tokenizer.ggml.scores"),
                  *merges = gguf_find_kv(g, "tokenizer.ggml.merges");
    if (sc && (sc->val.type != GGUF_TYPE_ARRAY || sc->val.arr_type != GGUF_TYPE_FLOAT32 ||
               sc->val.arr_len != n)) {
        error_set(e, CELER_STATUS_BAD_FILE,
                  "%s: tokenizer.ggml.scores: expected %llu float32 (one per token), found %s%llu",
                  path, (unsigned long long)n,
                  sc->val.type != GGUF_TYPE_ARRAY         ? "a scalar, "
                  : sc->val.arr_type != GGUF_TYPE_FLOAT32 ? "another type, "
                                                          : "",
                  (unsigned long long)(sc->val.type == GGUF_TYPE_ARRAY ? sc->val.arr_len : 1));
        return NULL;
    }
    if (!sc && !merges && !gemma) {
        error_set(e, CELER_STATUS_BAD_FILE,
                  "%s: tokenizer.ggml.scores: missing; a SentencePiece vocabulary without "
                  "tokenizer.ggml.merges needs "
                  "scores to order its merges",
                  path);
        return NULL;
    }
    float *scores = NULL;
    if (sc && !merges && !gemma) {
        if (!(scores = malloc(sizeof *scores * (size_t)(n ? n : 1))))
            return *st = CELER_STATUS_OUT_OF_MEMORY, NULL;
        memcpy(scores, sc->val.arr_data, sizeof *scores * (size_t)n);
        for (uint64_t i = 0; i < n; i++)
            if (isnan(scores[i])) {
                error_set(e, CELER_STATUS_BAD_FILE,
                          "%s: tokenizer.ggml.scores[%llu]: expected a number, found NaN", path,
                          (unsigned long long)i);
                free(scores);
                return NULL;
            }
    }
    spm_vocab v;
    celer_status s = spm_vocab_init(&v, tokens, gemma, path, e);
    json_t *vocab = NULL, *mlist = NULL, *added = NULL, *doc = NULL;
    if (s != CELER_OK) goto out;
    vocab = json_object();
    for (int64_t i = 0; vocab && i < v.n; i++) {
        json_t *id = json_integer((json_int_t)i);
        if (!id || json_object_setn_new(vocab, v.s[i], v.len[i], id))
            json_decref(vocab), vocab = NULL;
    }
    if (merges) {
        if (!(mlist = file_merges(merges, path, e))) s = CELER_STATUS_BAD_FILE;
    } else if ((mlist = json_array())) {
        s = spm_merges(mlist, &v, scores, path, e);
    }
    if (s != CELER_OK) goto out;
    added = spm_added(&v, tokens, types);
    if (!vocab || !mlist || !added) goto out;
    json_t *unk = gemma && strmap_get(&v.map, "<unk>", 5) >= 0 ? json_string("<unk>") : json_null();
    json_t *meta = json_string(METASPACE);
    json_t *normalizer =
        gemma  ? json_pack("{s:s, s:{s:s}, s:O}", "type", "Replace", "pattern", "String", " ",
                           "content", meta)
        : phi3 ? json_pack("{s:s, s:[{s:s, s:O}, {s:s, s:{s:s}, s:O}]}", "type", "Sequence",
                           "normalizers", "type", "Prepend", "prepend", meta, "type", "Replace",
                           "pattern", "String", " ", "content", meta)
               : json_null();
    json_t *pre = gemma  ? json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern",
                                     "String", " ", "behavior", "MergedWithPrevious", "invert", 0)
                  : phi3 ? json_null()
                         : json_pack("{s:s, s:O, s:s, s:b}", "type", "Metaspace", "replacement",
                                     meta, "prepend_scheme", "first", "split", 0);
    json_t *decoders =
        json_pack("[{s:s, s:{s:O}, s:s}, {s:s}, {s:s}]", "type", "Replace", "pattern", "String",
                  meta, "content", " ", "type", "ByteFallback", "type", "Fuse");
    if (!gemma && decoders)
        json_array_append_new(decoders, json_pack("{s:s, s:s, s:i, s:i}", "type", "Strip",
                                                  "content", " ", "start", 1, "stop", 0));
    json_decref(meta);
    doc = document(added, normalizer, pre, post_processor(g, tokens, true),
                   json_pack("{s:s, s:o}", "type", "Sequence", "decoders", decoders),
                   bpe_model(unk, true, vocab, mlist));
    vocab = mlist = added = NULL; /* the document owns them now */
out:
    if (!doc) *st = s != CELER_OK ? s : CELER_STATUS_OUT_OF_MEMORY;
    json_decref(vocab);
    json_decref(mlist);
    json_decref(added);
    spm_vocab_free(&v);
    free(scores);
    return doc;
}

/* The tokenizer.json document for g (caller decrefs); NULL with e set (and *st, unless
 * out of memory) on failure. */
static json_t *build_document(const gguf_file *g, const char *path, celer_status *st,
                              celer_error *e) {
    *st = CELER_STATUS_BAD_FILE;
    const gguf_kv *model = gguf_find_kv(g, "tokenizer.ggml.model");
    const gguf_kv *tokens = gguf_find_kv(g, "tokenizer.ggml.tokens");
    const gguf_value *types;
    if (!model || !tokens || tokens->val.type != GGUF_TYPE_ARRAY ||
        tokens->val.arr_type != GGUF_TYPE_STRING) {
        error_set(e, CELER_STATUS_BAD_FILE,
                  "%s: tokenizer.ggml.model and tokenizer.ggml.tokens (strings) are required",
                  path);
        return NULL;
    }
    if (tokens->val.arr_len == 0 || tokens->val.arr_len >= (1u << 24)) {
        error_set(e, CELER_STATUS_BAD_FILE,
                  "%s: tokenizer.ggml.tokens: expected 1 to 16777215 tokens, found %llu", path,
                  (unsigned long long)tokens->val.arr_len);
        return NULL;
    }
    if (!token_types(g, tokens->val.arr_len, &types, path, e)) return NULL;
    if (str_is(model, "gpt2")) return gpt2_document(g, &tokens->val, types, path, st, e);
    if (str_is(model, "llama")) return spm_document(g, &tokens->val, types, path, st, e);
    *st = error_set(e, CELER_STATUS_UNSUPPORTED,
                    "%s: tokenizer.ggml.model: expected gpt2 (byte-level BPE) or llama "
                    "(SentencePiece), found %.*s",
                    path, model->val.type == GGUF_TYPE_STRING ? (int)model->val.str_len : 1,
                    model->val.type == GGUF_TYPE_STRING ? model->val.str : "?");
    return NULL;
}

celer_status tok_load_gguf(const char *path, tokenizer **out, celer_error *e) {
    *out = NULL;
    mapped_file map;
    gguf_file g;
    celer_status s = mapped_file_open(path, &map, e);
    if (s != CELER_OK) return s;
    s = gguf_parse(&g, path, map.data, map.size, e);
    celer_status bs = CELER_OK;
    json_t *doc = s == CELER_OK ? build_document(&g, path, &bs, e) : NULL;
    if (s == CELER_OK && !doc)
        s = bs == CELER_STATUS_OUT_OF_MEMORY ? error_set(e, bs, "%s: out of memory", path) : bs;
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    if (doc && !text) s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
    if (text) s = tok_load_json(text, strlen(text), path, out, e);
    free(text);
    json_decref(doc);
    gguf_free(&g);
    mapped_file_close(&map);
    return s;
}

/* The text of token id, NUL-terminated and malloc'd, or NULL. */
static char *token_text(const gguf_file *g, int64_t id) {
    const gguf_kv *tokens = gguf_find_kv(g, "tokenizer.ggml.tokens");
    if (id < 0 || !tokens || tokens->val.type != GGUF_TYPE_ARRAY ||
        tokens->val.arr_type != GGUF_TYPE_STRING || (uint64_t)id >= tokens->val.arr_len)
        return NULL;
    const uint8_t *p = tokens->val.arr_data;
    const char *s = NULL;
    size_t len = 0;
    for (int64_t i = 0; i <= id; i++) s = next_str(&p, &len);
    return strndup(s, len);
}

celer_status chat_template_from_gguf(const char *path, char **template_src, char **bos_token,
                                     char **eos_token, celer_error *e) {
    *template_src = *bos_token = *eos_token = NULL;
    mapped_file map;
    gguf_file g;
    celer_status s = mapped_file_open(path, &map, e);
    if (s != CELER_OK) return s;
    if ((s = gguf_parse(&g, path, map.data, map.size, e)) == CELER_OK) {
        const gguf_kv *t = gguf_find_kv(&g, "tokenizer.chat_template");
        int64_t id;
        if (!t || t->val.type != GGUF_TYPE_STRING)
            s = error_set(e, CELER_STATUS_BAD_FILE,
                          "%s: tokenizer.chat_template: the file has no chat template", path);
        else if (!(*template_src = strndup(t->val.str, t->val.str_len)))
            s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
        if (s == CELER_OK && kv_id(&g, "tokenizer.ggml.bos_token_id", &id))
            *bos_token = token_text(&g, id);
        if (s == CELER_OK && kv_id(&g, "tokenizer.ggml.eos_token_id", &id))
            *eos_token = token_text(&g, id);
    }
    gguf_free(&g);
    mapped_file_close(&map);
    return s;
}

/*
 * tok_gguf.c - a tokenizer from the tokenizer.ggml.* metadata of a GGUF file.
 *
 * The metadata is turned into the tokenizer.json document Hugging Face transformers
 * builds from the same file (its GGUF converter), and that document goes through the
 * ordinary loader, so both paths share every line of tokenization code. Byte-level BPE
 * (tokenizer.ggml.model "gpt2") is supported: vocabulary from tokens, merges, control
 * and user-defined token types as special added tokens, BOS from add_bos_token, and the
 * pre-tokenizer chosen by tokenizer.ggml.pre ("llama-bpe" and "qwen2" use their Split
 * regexes; other names get the GPT-2 ByteLevel regex, as transformers does). The
 * SentencePiece model ("llama", scores without merges) is refused with a clear error.
 */
#define _POSIX_C_SOURCE 200809L
#include "tokenizer/tok_gguf.h"

#include "base/mapped_file.h"
#include "io/gguf.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* GGUF token types. */
enum { TOKEN_NORMAL = 1, TOKEN_UNKNOWN = 2, TOKEN_CONTROL = 3, TOKEN_USER_DEFINED = 4, TOKEN_BYTE = 6 };

static const char LLAMA3_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
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
    case GGUF_TYPE_INT32: { int32_t x; memcpy(&x, p + 4 * i, 4); return x; }
    case GGUF_TYPE_UINT32: { uint32_t x; memcpy(&x, p + 4 * i, 4); return x; }
    case GGUF_TYPE_INT8: return (int8_t)p[i];
    case GGUF_TYPE_UINT8: return p[i];
    default: return TOKEN_NORMAL;
    }
}

static bool kv_id(const gguf_file *g, const char *key, int64_t *out) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return false;
    if (kv->val.type == GGUF_TYPE_INT32 || kv->val.type == GGUF_TYPE_INT64) *out = kv->val.num.i;
    else if (kv->val.type == GGUF_TYPE_UINT32 || kv->val.type == GGUF_TYPE_UINT64) *out = (int64_t)kv->val.num.u;
    else return false;
    return true;
}

static json_t *pre_tokenizer_for(const gguf_kv *pre) {
    const char *regex = str_is(pre, "llama-bpe") || str_is(pre, "llama3") ? LLAMA3_REGEX
                        : str_is(pre, "qwen2")                           ? QWEN2_REGEX
                                                                         : NULL;
    if (!regex) return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 1);
    return json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type", "Sequence", "pretokenizers",
                     "type", "Split", "pattern", "Regex", regex, "behavior", "Isolated", "invert", 0,
                     "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0);
}

/* The tokenizer.json document for g (caller decrefs); NULL with e set on failure. */
static json_t *build_document(const gguf_file *g, const char *path, celer_status *st, celer_error *e) {
    *st = CELER_STATUS_BAD_FILE;
    const gguf_kv *model = gguf_find_kv(g, "tokenizer.ggml.model");
    const gguf_kv *tokens = gguf_find_kv(g, "tokenizer.ggml.tokens");
    const gguf_kv *merges = gguf_find_kv(g, "tokenizer.ggml.merges");
    const gguf_kv *types = gguf_find_kv(g, "tokenizer.ggml.token_type");
    if (!model || !tokens || tokens->val.type != GGUF_TYPE_ARRAY || tokens->val.arr_type != GGUF_TYPE_STRING) {
        error_set(e, CELER_STATUS_BAD_FILE, "%s: tokenizer.ggml.model and tokenizer.ggml.tokens (strings) are required", path);
        return NULL;
    }
    if (!str_is(model, "gpt2")) {
        *st = error_set(e, CELER_STATUS_UNSUPPORTED, "%s: tokenizer.ggml.model: expected gpt2 (byte-level BPE), found %.*s", path,
                  model->val.type == GGUF_TYPE_STRING ? (int)model->val.str_len : 1,
                  model->val.type == GGUF_TYPE_STRING ? model->val.str : "?");
        return NULL;
    }
    if (!merges || merges->val.type != GGUF_TYPE_ARRAY || merges->val.arr_type != GGUF_TYPE_STRING) {
        error_set(e, CELER_STATUS_BAD_FILE, "%s: tokenizer.ggml.merges: expected an array of strings", path);
        return NULL;
    }
    const uint64_t n = tokens->val.arr_len;
    const bool typed = types && types->val.type == GGUF_TYPE_ARRAY && types->val.arr_len == n &&
                       (types->val.arr_type == GGUF_TYPE_INT32 || types->val.arr_type == GGUF_TYPE_UINT32);
    json_t *vocab = json_object(), *added = json_array(), *mlist = json_array();
    const uint8_t *p = tokens->val.arr_data;
    for (uint64_t i = 0; i < n; i++) {
        size_t len;
        const char *s = next_str(&p, &len);
        json_t *key = json_stringn(s, len);
        if (!key) {
            error_set(e, CELER_STATUS_BAD_FILE, "%s: tokenizer.ggml.tokens[%llu]: not valid UTF-8", path, (unsigned long long)i);
            goto fail;
        }
        json_object_set_new(vocab, json_string_value(key), json_integer((json_int_t)i));
        const int64_t type = typed ? int_at(&types->val, i) : TOKEN_NORMAL;
        if (type == TOKEN_CONTROL || type == TOKEN_USER_DEFINED)
            json_array_append_new(added, json_pack("{s:I, s:O, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)i, "content", key,
                                                   "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                                                   "special", type == TOKEN_CONTROL));
        json_decref(key);
    }
    p = merges->val.arr_data;
    for (uint64_t i = 0; i < merges->val.arr_len; i++) {
        size_t len;
        const char *s = next_str(&p, &len);
        json_t *m = json_stringn(s, len);
        if (!m) {
            error_set(e, CELER_STATUS_BAD_FILE, "%s: tokenizer.ggml.merges[%llu]: not valid UTF-8", path, (unsigned long long)i);
            goto fail;
        }
        json_array_append_new(mlist, m);
    }
    int64_t bos = -1, add_bos = 0;
    const gguf_kv *ab = gguf_find_kv(g, "tokenizer.ggml.add_bos_token");
    if (ab && ab->val.type == GGUF_TYPE_BOOL) add_bos = ab->val.num.u != 0;
    json_t *post = json_null();
    if (add_bos && kv_id(g, "tokenizer.ggml.bos_token_id", &bos) && bos >= 0 && (uint64_t)bos < n) {
        const uint8_t *q = tokens->val.arr_data;
        size_t len = 0;
        const char *s = NULL;
        for (int64_t i = 0; i <= bos; i++) s = next_str(&q, &len);
        json_t *bos_tok = json_stringn(s, len);
        post = json_pack("{s:s, s:[{s:{s:O, s:i}}, {s:{s:s, s:i}}], s:[], s:{s:{s:O, s:[I], s:[O]}}}", "type",
                         "TemplateProcessing", "single", "SpecialToken", "id", bos_tok, "type_id", 0, "Sequence", "id", "A",
                         "type_id", 0, "pair", "special_tokens", json_string_value(bos_tok), "id", bos_tok, "ids",
                         (json_int_t)bos, "tokens", bos_tok);
        json_decref(bos_tok);
    }
    *st = CELER_STATUS_OUT_OF_MEMORY;
    return json_pack("{s:s, s:n, s:n, s:o, s:n, s:o, s:o, s:o, s:{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}}",
                     "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer", "pre_tokenizer",
                     pre_tokenizer_for(gguf_find_kv(g, "tokenizer.ggml.pre")), "post_processor", post, "decoder",
                     json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1),
                     "model", "type", "BPE", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                     "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges", mlist);
fail:
    json_decref(vocab);
    json_decref(added);
    json_decref(mlist);
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
    if (s == CELER_OK && !doc) s = bs == CELER_STATUS_OUT_OF_MEMORY ? error_set(e, bs, "%s: out of memory", path) : bs;
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
    if (id < 0 || !tokens || tokens->val.type != GGUF_TYPE_ARRAY || tokens->val.arr_type != GGUF_TYPE_STRING ||
        (uint64_t)id >= tokens->val.arr_len)
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
            s = error_set(e, CELER_STATUS_BAD_FILE, "%s: tokenizer.chat_template: the file has no chat template", path);
        else if (!(*template_src = strndup(t->val.str, t->val.str_len)))
            s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
        if (s == CELER_OK && kv_id(&g, "tokenizer.ggml.bos_token_id", &id)) *bos_token = token_text(&g, id);
        if (s == CELER_OK && kv_id(&g, "tokenizer.ggml.eos_token_id", &id)) *eos_token = token_text(&g, id);
    }
    gguf_free(&g);
    mapped_file_close(&map);
    return s;
}

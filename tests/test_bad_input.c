/*
 * test_bad_input.c - broken checkpoints through the real CLI ($CELER_BIN): each must
 * exit non-zero with exactly one line on stderr that names the file and the tensor or
 * field at fault (what was expected, what was found), and never crash. Under the
 * sanitizer build the same runs also catch memory errors and leaks, which would add
 * report lines to stderr.
 */
#define _GNU_SOURCE
#include "harness.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char work[256];

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) buf[0] = 0;
    if (buf) buf[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void write_all(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len) CHECK(false, "cannot write %s", path);
    if (f) fclose(f);
}

/* A fresh copy of fixture name in work/<case>; returns the directory. */
static const char *copy_fixture(const char *name, const char *tag) {
    static char dir[512];
    char src[4200], dst[600];
    snprintf(dir, sizeof dir, "%s/%s", work, tag);
    snprintf(dst, sizeof dst, "mkdir -p '%s'", dir);
    if (system(dst) != 0) CHECK(false, "mkdir");
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        size_t len;
        snprintf(src, sizeof src, "%s/%s", fixture_path(name), files[i]);
        char *buf = read_all(src, &len);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        if (buf) write_all(dst, buf, len);
        free(buf);
    }
    return dir;
}

/* Rewrites dir/model.safetensors with its header changed by edit (data unchanged). */
static void edit_header(const char *dir, void (*edit)(json_t *)) {
    char path[600];
    size_t len;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unsigned char *buf = (unsigned char *)read_all(path, &len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    json_t *h = json_loadb((char *)buf + 8, hlen, 0, NULL);
    edit(h);
    char *text = json_dumps(h, JSON_COMPACT);
    size_t tl = strlen(text);
    size_t padded = (tl + 7) & ~(size_t)7;
    unsigned char *out = malloc(8 + padded + (len - 8 - hlen));
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)(padded >> (8 * i));
    memcpy(out + 8, text, tl);
    memset(out + 8 + tl, ' ', padded - tl);
    memcpy(out + 8 + padded, buf + 8 + hlen, len - 8 - hlen);
    write_all(path, out, 8 + padded + (len - 8 - hlen));
    free(out), free(text), free(buf);
    json_decref(h);
}

static void edit_config(const char *dir, const char *key, json_t *value) {
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *c = json_load_file(path, 0, NULL);
    json_object_set_new(c, key, value);
    json_dump_file(c, path, JSON_INDENT(2));
    json_decref(c);
}

/* Runs `celer ARGS` (args holds %s for the model); checks the exit status and the one
 * stderr line. */
static void expect_error_of(const char *what, const char *args, const char *model,
                            const char *const *needles) {
    char cmd[2048], errpath[600], a[1200];
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", work);
    snprintf(a, sizeof a, args, model);
    snprintf(cmd, sizeof cmd, "'%s' %s 2>'%s' >/dev/null",
             getenv("CELER_BIN") ? getenv("CELER_BIN") : "build/celer", a, errpath);
    int rc = system(cmd);
    size_t len = 0;
    char *err = read_all(errpath, &len);
    int lines = 0;
    for (size_t i = 0; err && i < len; i++) lines += err[i] == '\n';
    bool exited = WIFEXITED(rc) && WEXITSTATUS(rc) != 0 && WEXITSTATUS(rc) < 128;
    CHECK(exited, "%s: expected a non-zero exit, got status %d", what, rc);
    CHECK(lines == 1, "%s: expected one line on stderr, got %d:\n%s", what, lines, err ? err : "");
    for (int i = 0; needles[i]; i++)
        CHECK(err && strstr(err, needles[i]), "%s: message lacks \"%s\": %s", what, needles[i],
              err ? err : "");
    printf("  %-26s %s", what, err ? err : "\n");
    free(err);
}

/* Runs `celer logits` on dir. */
static void expect_error(const char *what, const char *dir, const char *const *needles) {
    char args[600];
    snprintf(args, sizeof args, "logits -m '%%s' --ids 1,2,3 -o '%s/out.npy'", work);
    expect_error_of(what, args, dir, needles);
}

#define NEEDLES(...) ((const char *const[]){__VA_ARGS__, NULL})

static void overlap(json_t *h) {
    json_t *a = json_object_get(h, "model.norm.weight"),
           *b = json_object_get(h, "model.embed_tokens.weight");
    json_t *ob = json_object_get(b, "data_offsets");
    json_int_t begin = json_integer_value(json_array_get(ob, 0));
    json_t *oa = json_object_get(a, "data_offsets");
    json_int_t size =
        json_integer_value(json_array_get(oa, 1)) - json_integer_value(json_array_get(oa, 0));
    json_array_set_new(oa, 0, json_integer(begin + 2));
    json_array_set_new(oa, 1, json_integer(begin + 2 + size));
}

static void out_of_range(json_t *h) {
    json_t *o = json_object_get(json_object_get(h, "model.norm.weight"), "data_offsets");
    json_array_set_new(o, 0, json_integer(1 << 30));
    json_array_set_new(o, 1, json_integer((1 << 30) + 128));
}

static void drop_norm(json_t *h) {
    json_object_del(h, "model.norm.weight");
}

static void wrong_dtype(json_t *h) {
    json_object_set_new(json_object_get(h, "model.norm.weight"), "dtype", json_string("I16"));
}

/* q_proj of layer 0 as 2-bit codes: half the words per row, offsets shrunk to match. */
/* The projector's [vd, td] parameter written [td, vd] (same bytes). */
static void proj_transposed(json_t *h) {
    json_t *t = json_object_get(h, "multi_modal_projector.mm_input_projection_weight");
    json_object_set_new(t, "shape", json_pack("[i, i]", 64, 32));
}

static void drop_proj(json_t *h) {
    json_object_del(h, "multi_modal_projector.mm_input_projection_weight");
}

static void one_bit(json_t *h) {
    json_t *t = json_object_get(h, "model.layers.0.self_attn.q_proj.weight");
    json_t *shape = json_object_get(t, "shape"), *o = json_object_get(t, "data_offsets");
    json_int_t rows = json_integer_value(json_array_get(shape, 0)),
               cols = json_integer_value(json_array_get(shape, 1));
    json_array_set_new(shape, 1, json_integer(cols / 4));
    json_array_set_new(
        o, 1, json_integer(json_integer_value(json_array_get(o, 0)) + rows * (cols / 4) * 4));
}

/* Copies fixture dir/model.gguf to work/<tag>.gguf, applying patch to its bytes. */
static const char *gguf_variant(const char *fixture, const char *tag,
                                void (*patch)(char *, size_t *)) {
    static char dst[600];
    char src[4200];
    size_t len;
    snprintf(src, sizeof src, "%s/model.gguf", fixture_path(fixture));
    snprintf(dst, sizeof dst, "%s/%s.gguf", work, tag);
    char *buf = read_all(src, &len);
    if (!CHECK(buf != NULL, "read %s", src)) return dst;
    patch(buf, &len);
    write_all(dst, buf, len);
    free(buf);
    return dst;
}

/* work/tag/ holding the split fixture's parts as named: parts[i] is the part (1 to 3) written
 * as file i + 1 of 3, 0 for none; returns the first part's path, or first_as when set. */
static const char *split_variant(const char *tag, const int parts[3], const char *first_as) {
    static char first[700];
    char src[4200], dst[700];
    for (int i = 0; i < 3; i++) {
        if (!parts[i]) continue;
        size_t len;
        snprintf(src, sizeof src, "%s/model-%05d-of-00003.gguf",
                 fixture_path("llama-tied-gguf-q4_1-split"), parts[i]);
        char *buf = read_all(src, &len);
        if (!CHECK(buf != NULL, "read %s", src)) continue;
        snprintf(dst, sizeof dst, "mkdir -p '%s/%s'", work, tag);
        if (system(dst) != 0) CHECK(false, "mkdir");
        if (i == 0 && first_as)
            snprintf(dst, sizeof dst, "%s/%s/%s", work, tag, first_as);
        else
            snprintf(dst, sizeof dst, "%s/%s/model-%05d-of-00003.gguf", work, tag, i + 1);
        write_all(dst, buf, len);
        free(buf);
        if (i == 0) snprintf(first, sizeof first, "%s", dst);
    }
    return first;
}

/* A split GGUF opened from another part than the first, with a part missing, with the parts
 * out of order, or with its first part renamed: one line each, naming the file. */
static void split_cases(void) {
    char second[4300];
    snprintf(second, sizeof second, "%s/model-00002-of-00003.gguf",
             fixture_path("llama-tied-gguf-q4_1-split"));
    expect_error("gguf split: second part", second,
                 NEEDLES("model-00002-of-00003.gguf", "part 2 of 3", "open the first part"));
    expect_error("gguf split: part missing", split_variant("split_missing", (int[]){1, 2, 0}, NULL),
                 NEEDLES("model-00003-of-00003.gguf", "cannot open", "part 3 of 3"));
    expect_error("gguf split: parts swapped", split_variant("split_swap", (int[]){1, 3, 2}, NULL),
                 NEEDLES("model-00002-of-00003.gguf", "split.no 3", "expected part 2 of 3"));
    expect_error("gguf split: first renamed",
                 split_variant("split_renamed", (int[]){1, 2, 3}, "first.gguf"),
                 NEEDLES("first.gguf", "split.count says 3 parts", "-00001-of-00003.gguf"));
}

static char *find(char *buf, size_t len, const char *needle) {
    return memmem(buf, len, needle, strlen(needle));
}

static void gguf_truncate(char *buf, size_t *len) {
    (void)buf, *len = *len * 2 / 3;
}

/* The type field follows the name, the dimension count and two dimensions. */
static void gguf_q4_k(char *buf, size_t *len) {
    char *p = find(buf, *len, "blk.0.attn_q.weight");
    if (p) p[strlen("blk.0.attn_q.weight") + 4 + 16] = 12;
}

static void gguf_arch(char *buf, size_t *len) {
    char *p = find(buf, *len, "general.architecture");
    if (p && (p = find(p, *len - (size_t)(p - buf), "llama"))) memcpy(p, "bloom", 5);
}

static void gguf_header_count(char *buf, size_t *len) {
    (void)len;
    memset(buf + 8, 0x7f, 8); /* tensor count */
}

/* ==== SentencePiece tokenizer metadata ==== */

/* A GGUF (version 3) without tensors, holding only the metadata that the kv_ helpers add. */
typedef struct gguf_buf {
    char *p;
    size_t n, cap;
    uint64_t n_kv;
} gguf_buf;

static void put(gguf_buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n), b->n += n;
}

static void put_u32(gguf_buf *b, uint32_t v) {
    put(b, &v, 4);
}
static void put_u64(gguf_buf *b, uint64_t v) {
    put(b, &v, 8);
}
static void put_str(gguf_buf *b, const char *s) {
    put_u64(b, strlen(s)), put(b, s, strlen(s));
}
static void kv_head(gguf_buf *b, const char *key, uint32_t type) {
    put_str(b, key), put_u32(b, type), b->n_kv++;
}
static void kv_str(gguf_buf *b, const char *key, const char *v) {
    kv_head(b, key, 8), put_str(b, v);
}
static void kv_strs(gguf_buf *b, const char *key, const char *const *v, uint64_t n) {
    kv_head(b, key, 9), put_u32(b, 8), put_u64(b, n);
    for (uint64_t i = 0; i < n; i++) put_str(b, v[i]);
}
/* An array of n 4-byte values of GGUF type type (6 float32, 5 int32), from v. */
static void kv_arr4(gguf_buf *b, const char *key, uint32_t type, const void *v, uint64_t n) {
    kv_head(b, key, 9), put_u32(b, type), put_u64(b, n), put(b, v, 4 * n);
}

static const char *const TOKENS[] = {"<unk>",
                                     "<s>",
                                     "</s>",
                                     "\xe2\x96\x81",
                                     "a",
                                     "b",
                                     "ab",
                                     "\xe2\x96\x81\x61\x62" /* "▁ab" */};
#define N_TOKENS 8

/* Writes work/<tag>.gguf: a llama-architecture file with a SentencePiece vocabulary, each
 * piece present unless its flag drops it or a bad_* flag breaks it. */
enum {
    DROP_TOKENS = 1,
    DROP_SCORES = 2,
    SCORES_SHORT = 4,
    SCORES_INT = 8,
    SCORES_NAN = 16,
    TYPES_SHORT = 32
};
static const char *spm_file(const char *tag, int flags) {
    static char path[600];
    gguf_buf kv = {0}, out = {0};
    float scores[N_TOKENS] = {0, 0, 0, -1, -2, -3, -4, -5};
    int32_t types[N_TOKENS] = {2, 3, 3, 1, 1, 1, 1, 1};
    if (flags & SCORES_NAN) scores[5] = NAN;
    kv_str(&kv, "general.architecture", "llama");
    kv_str(&kv, "tokenizer.ggml.model", "llama");
    if (!(flags & DROP_TOKENS)) kv_strs(&kv, "tokenizer.ggml.tokens", TOKENS, N_TOKENS);
    if (!(flags & DROP_SCORES))
        kv_arr4(&kv, "tokenizer.ggml.scores", flags & SCORES_INT ? 5 : 6, scores,
                flags & SCORES_SHORT ? N_TOKENS - 1 : N_TOKENS);
    kv_arr4(&kv, "tokenizer.ggml.token_type", 5, types, flags & TYPES_SHORT ? 3 : N_TOKENS);
    put(&out, "GGUF", 4), put_u32(&out, 3), put_u64(&out, 0), put_u64(&out, kv.n_kv);
    put(&out, kv.p, kv.n);
    snprintf(path, sizeof path, "%s/%s.gguf", work, tag);
    write_all(path, out.p, out.n);
    free(kv.p), free(out.p);
    return path;
}

static void spm_cases(void) {
    const char *args = "tokenize -m '%s' --text 'ab ab'";
    /* The well-formed file tokenizes: the cases below fail for their one fault. */
    char cmd[1400], out[256] = {0};
    snprintf(cmd, sizeof cmd, "'%s' tokenize -m '%s' --text 'ab ab' 2>&1",
             getenv("CELER_BIN") ? getenv("CELER_BIN") : "build/celer", spm_file("spm_ok", 0));
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    int rc = p ? pclose(p) : -1;
    out[n] = 0;
    /* "ab ab" -> Metaspace "▁ab▁ab" -> two "▁ab"; no BOS, as the file names none. */
    CHECK(rc == 0 && !strcmp(out, "7 7\n"), "spm tokenizer: %s", out);
    printf("  %-26s %s", "spm well-formed", out);
    expect_error_of("spm tokens missing", args, spm_file("spm_notok", DROP_TOKENS),
                    NEEDLES("spm_notok.gguf", "tokenizer.ggml.tokens"));
    expect_error_of("spm scores missing", args, spm_file("spm_noscore", DROP_SCORES),
                    NEEDLES("spm_noscore.gguf", "tokenizer.ggml.scores", "missing"));
    expect_error_of("spm scores short", args, spm_file("spm_short", SCORES_SHORT),
                    NEEDLES("spm_short.gguf", "tokenizer.ggml.scores", "expected 8 float32", "7"));
    expect_error_of("spm scores int32", args, spm_file("spm_int", SCORES_INT),
                    NEEDLES("spm_int.gguf", "tokenizer.ggml.scores", "another type"));
    expect_error_of("spm score NaN", args, spm_file("spm_nan", SCORES_NAN),
                    NEEDLES("spm_nan.gguf", "tokenizer.ggml.scores[5]", "NaN"));
    expect_error_of("spm token_type short", args, spm_file("spm_types", TYPES_SHORT),
                    NEEDLES("spm_types.gguf", "tokenizer.ggml.token_type", "expected 8", "3"));
}

int main(void) {
    snprintf(work, sizeof work, "/tmp/celer-bad-XXXXXX");
    if (!mkdtemp(work)) return CHECK(false, "mkdtemp"), harness_done("test_bad_input");
    char path[700];
    const char *dir;
    size_t len;

    dir = copy_fixture("llama3-bf16", "truncated");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    char *buf = read_all(path, &len);
    write_all(path, buf, len / 2);
    free(buf);
    expect_error("truncated file", dir,
                 NEEDLES("model.safetensors", "data_offsets", "outside the data section"));

    dir = copy_fixture("llama3-bf16", "hlen");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    buf = read_all(path, &len);
    uint64_t big = (uint64_t)len * 4;
    for (int i = 0; i < 8; i++) buf[i] = (char)(big >> (8 * i));
    write_all(path, buf, len);
    free(buf);
    expect_error("header past end of file", dir,
                 NEEDLES("model.safetensors", "header length", "past the end"));

    dir = copy_fixture("llama3-bf16", "tiny");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_all(path, "\x10\x00\x00", 3);
    expect_error("3-byte file", dir, NEEDLES("model.safetensors", "truncated"));

    dir = copy_fixture("llama3-bf16", "overlap");
    edit_header(dir, overlap);
    expect_error("overlapping offsets", dir,
                 NEEDLES("model.safetensors", "overlap", "model.norm.weight"));

    dir = copy_fixture("llama3-bf16", "range");
    edit_header(dir, out_of_range);
    expect_error("offsets out of range", dir,
                 NEEDLES("model.safetensors", "model.norm.weight", "outside the data section"));

    dir = copy_fixture("llama3-bf16", "shape");
    edit_config(dir, "intermediate_size", json_integer(100));
    expect_error("shape vs config.json", dir,
                 NEEDLES("mlp.gate_proj.weight", "expected shape [100, 64]", "found [128, 64]"));

    dir = copy_fixture("llama3-bf16", "dtype");
    edit_header(dir, wrong_dtype);
    expect_error("dtype vs expectation", dir,
                 NEEDLES("model.norm.weight", "expected F32, F16 or BF16", "found I16"));

    dir = copy_fixture("llama3-bf16", "missing");
    edit_header(dir, drop_norm);
    expect_error("missing tensor", dir, NEEDLES("missing tensor model.norm.weight"));

    dir = copy_fixture("llama3-bf16", "arch");
    edit_config(dir, "model_type", json_string("gpt_neox"));
    expect_error("unknown model_type", dir, NEEDLES("config.json", "model_type", "gpt_neox"));

    dir = copy_fixture("llama3-q4g64", "bits");
    edit_header(dir, one_bit);
    expect_error("unsupported bits", dir,
                 NEEDLES("model.layers.0.self_attn.q_proj.weight", "1-bit", "expected 2, 3, 4, 5, 6 or 8"));

    dir = copy_fixture("llama3-q4g64", "mode");
    json_t *q = json_pack("{s:i, s:i, s:s}", "group_size", 32, "bits", 4, "mode", "mxfp8");
    edit_config(dir, "quantization", q);
    expect_error("unsupported mode", dir, NEEDLES("config.json", "quantization.mode", "mxfp8"));

    dir = copy_fixture("llama3-bf16", "json");
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_all(path, "{\"model_type\": \"llama\",\n \"hidden_size\": 64,,}\n", 46);
    expect_error("malformed config.json", dir, NEEDLES("config.json", "line 2"));

    dir = copy_fixture("llama3-bf16", "noconfig");
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    expect_error("missing config.json", dir, NEEDLES("config.json", "cannot open"));

    dir = copy_fixture("llama3-bf16", "heads");
    edit_config(dir, "num_key_value_heads", json_integer(3));
    expect_error("bad head counts", dir, NEEDLES("num_key_value_heads", "found 3"));

    dir = copy_fixture("cohere2-bf16", "layer_types");
    edit_config(dir, "layer_types", json_pack("[s, s]", "sliding_attention", "full_attention"));
    expect_error("cohere2 layer_types", dir, NEEDLES("config.json", "layer_types", "list of 5"));

    dir = copy_fixture("cohere2-bf16", "layer_type");
    edit_config(dir, "layer_types",
                json_pack("[s, s, s, s, s]", "sliding_attention", "sliding_attention",
                          "chunked_attention", "full_attention", "sliding_attention"));
    expect_error("cohere2 layer type", dir, NEEDLES("layer_types[2]", "chunked_attention"));

    dir = copy_fixture("cohere2-bf16", "head_dim");
    edit_config(dir, "head_dim", json_integer(32));
    expect_error(
        "cohere2 head_dim", dir,
        NEEDLES("head_dim", "expected hidden_size / num_attention_heads = 16", "found 32"));

    dir = copy_fixture("cohere2-bf16", "norm_bias");
    edit_config(dir, "layer_norm_bias", json_true());
    expect_error("cohere2 missing norm bias", dir, NEEDLES("missing tensor", "norm.bias"));

    dir = copy_fixture("gemma3-text-bf16", "g3_types");
    edit_config(dir, "layer_types",
                json_pack("[s, s, s, s, s, s]", "sliding_attention", "sliding_attention",
                          "sliding_attention", "chunked_attention", "sliding_attention",
                          "full_attention"));
    expect_error("gemma3 layer type", dir, NEEDLES("layer_types[3]", "chunked_attention"));

    dir = copy_fixture("gemma3-text-bf16", "g3_pattern");
    edit_config(dir, "sliding_window_pattern", json_integer(0));
    expect_error("gemma3 sliding pattern", dir,
                 NEEDLES("sliding_window_pattern", "expected > 0", "found 0"));

    dir = copy_fixture("gemma2-bf16", "g2_qpas");
    edit_config(dir, "query_pre_attn_scalar", json_integer(0));
    expect_error("gemma2 query scalar", dir, NEEDLES("query_pre_attn_scalar", "expected > 0"));

    dir = copy_fixture("qwen3-bf16", "q3_types");
    edit_config(dir, "layer_types", json_pack("[s]", "full_attention"));
    expect_error("qwen3 layer_types length", dir, NEEDLES("layer_types", "list of 2"));

    dir = copy_fixture("phi4-mini-bf16", "odd_rot");
    edit_config(dir, "partial_rotary_factor", json_real(0.7));
    expect_error("phi rotary fraction giving an odd dimension", dir,
                 NEEDLES("partial_rotary_factor", "gives 11 rotary dimensions"));

    dir = copy_fixture("phi3-bf16", "longrope_len");
    edit_config(dir, "rope_scaling",
                json_pack("{s:s, s:[f,f,f,f,f,f,f,f], s:[f,f,f]}", "type", "longrope",
                          "short_factor", 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, "long_factor",
                          1.0, 2.0, 3.0));
    expect_error("phi3 longrope factor length", dir,
                 NEEDLES("rope_scaling.long_factor", "list of 8"));

    dir = copy_fixture("llava-mistral-f32", "full");
    edit_config(dir, "vision_feature_select_strategy", json_string("full"));
    expect_error("llava strategy full", dir,
                 NEEDLES("vision_feature_select_strategy", "full", "expected default"));

    dir = copy_fixture("llava-mistral-f32", "text_type");
    edit_config(dir, "text_config", json_pack("{s:s}", "model_type", "gemma"));
    expect_error("llava text model type", dir, NEEDLES("text_config.model_type", "gemma"));

    dir = copy_fixture("llava-mistral-f32", "feature_layer");
    edit_config(dir, "vision_feature_layer", json_integer(-9));
    expect_error("llava feature layer", dir, NEEDLES("vision_feature_layer", "[-4, 3]"));

    dir = copy_fixture("llava-mistral-f32", "vision_size");
    edit_config(dir, "vision_config",
                json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:s}", "hidden_size", 48,
                          "intermediate_size", 64, "num_hidden_layers", 3, "num_attention_heads", 4,
                          "image_size", 56, "patch_size", 14, "hidden_act", "quick_gelu"));
    expect_error("llava vision shapes", dir,
                 NEEDLES("patch_embedding.weight", "expected [48, ...]", "found [32, 3, 14, 14]"));

    dir = copy_fixture("gemma3-vision-hf-bf16", "g3_tokens_square");
    edit_config(dir, "mm_tokens_per_image", json_integer(5));
    expect_error("gemma3 tokens not square", dir,
                 NEEDLES("config.json", "mm_tokens_per_image", "square", "found 5"));

    dir = copy_fixture("gemma3-vision-hf-bf16", "g3_tokens_grid");
    edit_config(dir, "mm_tokens_per_image", json_integer(9));
    expect_error("gemma3 tokens vs grid", dir,
                 NEEDLES("mm_tokens_per_image 9", "does not divide the 4 x 4 patch grid"));

    dir = copy_fixture("gemma3-vision-hf-bf16", "g3_proj_shape");
    edit_header(dir, proj_transposed);
    expect_error("gemma3 projector shape", dir,
                 NEEDLES("multi_modal_projector.mm_input_projection_weight", "expected [32, 64]",
                         "found [64, 32]"));

    dir = copy_fixture("gemma3-vision-hf-bf16", "g3_vision_size");
    edit_config(dir, "vision_config",
                json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i}", "model_type",
                          "siglip_vision_model", "hidden_size", 48, "intermediate_size", 64,
                          "num_hidden_layers", 2, "num_attention_heads", 2, "image_size", 56,
                          "patch_size", 14));
    expect_error("gemma3 vision size", dir,
                 NEEDLES("patch_embedding.weight", "expected [48, ...]", "found [32, 3, 14, 14]"));

    dir = copy_fixture("gemma3-vision-hf-bf16", "g3_no_proj");
    edit_header(dir, drop_proj);
    expect_error("gemma3 projector missing", dir,
                 NEEDLES("missing tensor", "mm_input_projection_weight"));

    dir = copy_fixture("gemma3-vision-hf-bf16", "g3_clip");
    edit_config(dir, "vision_config", json_pack("{s:s}", "model_type", "clip_vision_model"));
    expect_error("gemma3 clip tower", dir,
                 NEEDLES("vision_config.model_type", "siglip_vision_model"));

    expect_error("gguf truncated", gguf_variant("llama-tied-gguf-q4_1", "trunc", gguf_truncate),
                 NEEDLES("trunc.gguf", "outside the file"));
    expect_error("gguf tensor type Q4_K", gguf_variant("llama-tied-gguf-q4_1", "q4k", gguf_q4_k),
                 NEEDLES("q4k.gguf", "blk.0.attn_q.weight", "Q4_K is not supported"));
    expect_error("gguf architecture", gguf_variant("llama-tied-gguf-q4_1", "arch", gguf_arch),
                 NEEDLES("arch.gguf", "general.architecture", "bloom"));
    expect_error("gguf tensor count",
                 gguf_variant("llama-tied-gguf-q4_1", "count", gguf_header_count),
                 NEEDLES("count.gguf", "cannot fit"));

    split_cases();
    spm_cases();

    snprintf(path, sizeof path, "rm -rf '%s'", work);
    if (system(path) != 0) CHECK(false, "cleanup");
    return harness_done("test_bad_input");
}

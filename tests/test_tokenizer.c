/*
 * test_tokenizer.c - the tokenizer against Hugging Face `tokenizers`: every string of
 * tests/tokenizer/corpus.json through the real Llama 3.1, Qwen3 and Llama 2 tokenizers
 * (tests/tokenizers, see tokenizer_dir) must give the golden ids with and without special
 * tokens and the golden decoded text. Also the heap BPE on a tiny hand-written
 * tokenizer, the streaming detokenizer on split characters, and bad input (malformed
 * or unsupported tokenizer.json, invalid UTF-8), each a clear error.
 *
 * Goldens come from tools/make_tokenizer_goldens.py; no Python runs here.
 */
#define _DEFAULT_SOURCE
#include "harness.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool ids_equal(const int32_t *a, int64_t n, json_t *want) {
    if ((size_t)n != json_array_size(want)) return false;
    for (int64_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(want, (size_t)i)) != a[i]) return false;
    return true;
}

static void print_ids(const char *what, const int32_t *a, int64_t n, json_t *want) {
    fprintf(stderr, "  %s got:", what);
    for (int64_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", a[i]);
    fprintf(stderr, "\n  %s want:", what);
    for (size_t i = 0; i < json_array_size(want) && i < 40; i++)
        fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(want, i)));
    fprintf(stderr, "\n");
}

/* Every corpus string through t against the golden cases. */
static void check_cases(const char *name, const tokenizer *t, json_t *cases, json_t *corpus) {
    celer_error e;
    if (!CHECK(json_array_size(cases) == json_array_size(corpus), "%s: golden cases", name)) return;
    int checked = 0, mismatches = 0;
    for (size_t i = 0; i < json_array_size(corpus); i++) {
        json_t *c = json_array_get(cases, i), *s = json_array_get(corpus, i);
        const char *text = json_string_value(s);
        size_t len = json_string_length(s);
        bool ok = true;
        for (int sp = 0; sp < 2; sp++) {
            int32_t *ids;
            int64_t n;
            json_t *want = json_object_get(c, sp ? "ids" : "ids_plain");
            celer_status st = tok_encode(t, text, len, sp, &ids, &n, &e);
            bool same = st == CELER_OK && ids_equal(ids, n, want);
            if (!same) {
                fprintf(stderr, "  %s case %zu (%s) \"%.60s\": %s\n", name, i, sp ? "special" : "plain", text,
                        st == CELER_OK ? "ids differ" : e.msg);
                if (st == CELER_OK) print_ids("ids", ids, n, want);
            }
            ok &= same;
            if (st == CELER_OK && sp) {
                for (int skip = 0; skip < 2; skip++) {
                    char *dec;
                    size_t dn;
                    json_t *wd = json_object_get(c, skip ? "decoded_skip" : "decoded");
                    if (tok_decode(t, ids, n, skip, &dec, &dn, &e) != CELER_OK) {
                        fprintf(stderr, "  %s case %zu decode: %s\n", name, i, e.msg);
                        ok = false;
                        continue;
                    }
                    bool same_text = dn == json_string_length(wd) && !memcmp(dec, json_string_value(wd), dn);
                    if (!same_text)
                        fprintf(stderr, "  %s case %zu decode%s: got \"%.80s\" want \"%.80s\"\n", name, i,
                                skip ? " (skip special)" : "", dec, json_string_value(wd));
                    ok &= same_text;
                    free(dec);
                }
            }
            if (st == CELER_OK && !sp && json_is_true(json_object_get(c, "roundtrip"))) {
                char *dec;
                size_t dn;
                if (tok_decode(t, ids, n, false, &dec, &dn, &e) == CELER_OK) {
                    if (dn != len || memcmp(dec, text, len)) {
                        fprintf(stderr, "  %s case %zu: decode(encode(x)) != x\n", name, i);
                        ok = false;
                    }
                    free(dec);
                } else {
                    ok = false;
                }
            }
            if (st == CELER_OK) free(ids);
        }
        checked++;
        mismatches += !ok;
    }
    printf("%s: %d strings checked, %d mismatches\n", name, checked, mismatches);
    CHECK(mismatches == 0, "%s: %d of %d corpus strings differ from Hugging Face", name, mismatches, checked);
}

static void check_golden(const char *name, json_t *corpus) {
    char dir[4096], path[4200];
    if (!tokenizer_dir(name, dir, sizeof dir)) {
        SKIP_REQUIRED("%s", dir);
        return;
    }
    tokenizer *t;
    celer_error e;
    if (!CHECK(tok_load(dir, &t, &e) == CELER_OK, "load %s: %s", name, e.msg)) return;
    snprintf(path, sizeof path, "tests/tokenizer/golden_%s.json", name);
    json_t *g = json_load_file(path, 0, NULL);
    check_cases(name, t, json_object_get(g, "cases"), corpus);
    json_decref(g);
    tok_free(t);
}

/* Components the real files do not use: a real tokenizer.json with parts replaced as
 * tools/make_tokenizer_goldens.py replaced them ("added_tokens_extra" is appended). */
static void check_variants(json_t *corpus) {
    json_t *g = json_load_file("tests/tokenizer/golden_variants.json", 0, NULL);
    json_t *vs = json_object_get(g, "variants");
    CHECK(json_array_size(vs) >= 5, "golden_variants.json has the variants");
    for (size_t i = 0; i < json_array_size(vs); i++) {
        json_t *v = json_array_get(vs, i), *over = json_object_get(v, "override");
        const char *name = json_string_value(json_object_get(v, "name"));
        char dir[4096], path[4200];
        if (!tokenizer_dir(json_string_value(json_object_get(v, "base")), dir, sizeof dir)) {
            SKIP_REQUIRED("%s: %s", name, dir);
            continue;
        }
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        json_t *doc = json_load_file(path, 0, NULL);
        if (!CHECK(doc, "%s: base %s", name, path)) continue;
        const char *key;
        json_t *val;
        json_object_foreach(over, key, val) {
            if (!strcmp(key, "added_tokens_extra")) json_array_extend(json_object_get(doc, "added_tokens"), val);
            else json_object_set(doc, key, val);
        }
        char *text = json_dumps(doc, JSON_COMPACT);
        json_decref(doc);
        tokenizer *t;
        celer_error e;
        if (CHECK(tok_load_json(text, strlen(text), name, &t, &e) == CELER_OK, "%s: %s", name, e.msg)) {
            check_cases(name, t, json_object_get(v, "cases"), corpus);
            tok_free(t);
        }
        free(text);
    }
    json_decref(g);
}


/* ==== A tiny hand-written tokenizer: merge order, unk, added tokens ==== */

#define ADDED_S "{\"id\":10,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}"
#define ADDED_X "{\"id\":11,\"content\":\"[X]\",\"single_word\":false,\"lstrip\":true,\"rstrip\":true,\"normalized\":false,\"special\":false}"
#define TEMPLATE \
    "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}]," \
    "\"pair\":[],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[10],\"tokens\":[\"<s>\"]}}}"
#define VOCAB1 "{\"a\":0,\"b\":1,\"c\":2,\"d\":3,\"ab\":4,\"bc\":5,\"abc\":6,\"cd\":7,\"abcd\":8,\"<unk>\":9}"

static const char tiny1[] =
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[" ADDED_S "," ADDED_X "],"
    "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"Removed\",\"invert\":false},"
    "\"post_processor\":" TEMPLATE ",\"decoder\":null,"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":false,"
    "\"vocab\":" VOCAB1 ",\"merges\":[\"b c\",\"a b\",\"a bc\",\"c d\",\"abc d\"]}}";

/* Pair-style merges, Metaspace, byte fallback and the SentencePiece decoder chain. */
static const char tiny2[] =
    "{\"version\":\"1.0\",\"added_tokens\":[],\"normalizer\":null,"
    "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"always\",\"split\":true},"
    "\"post_processor\":null,\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},"
    "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"byte_fallback\":true,"
    "\"vocab\":{\"\\u2581\":0,\"h\":1,\"i\":2,\"\\u2581h\":3,\"\\u2581hi\":4,\"<0xC3>\":5,\"<0xA9>\":6,\"<unk>\":7},"
    "\"merges\":[[\"\\u2581\",\"h\"],[\"\\u2581h\",\"i\"]]}}";

/* continuing_subword_prefix / end_of_word_suffix and Strip; ids and text as Hugging Face
 * `tokenizers` 0.23 gives them for this file. */
static const char tiny3[] =
    "{\"version\":\"1.0\",\"added_tokens\":[],\"normalizer\":null,"
    "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"Removed\",\"invert\":false},"
    "\"post_processor\":null,\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Strip\",\"content\":\">\",\"start\":1,\"stop\":2}]},"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":null,\"continuing_subword_prefix\":\"##\",\"end_of_word_suffix\":\"</w>\","
    "\"vocab\":{\"h\":0,\"##i\":1,\"hi\":2,\"i\":3,\"x</w>\":4,\"##x</w>\":5,\"hix</w>\":6,\"h</w>\":7,\">>a>>>\":8},"
    "\"merges\":[[\"h\",\"##i\"],[\"hi\",\"##x</w>\"]]}}";

static void expect_ids(const tokenizer *t, const char *text, bool special, const int32_t *want, int64_t nw) {
    int32_t *ids;
    int64_t n;
    celer_error e;
    if (!CHECK(tok_encode(t, text, strlen(text), special, &ids, &n, &e) == CELER_OK, "encode \"%s\": %s", text, e.msg))
        return;
    bool same = n == nw;
    for (int64_t i = 0; same && i < n; i++) same = ids[i] == want[i];
    char got[256];
    size_t k = 0;
    for (int64_t i = 0; i < n && k < 200; i++) k += (size_t)snprintf(got + k, sizeof got - k, " %d", ids[i]);
    got[k] = 0;
    CHECK(same, "encode \"%s\"%s: got%s", text, special ? " (special)" : "", got);
    free(ids);
}

static void expect_text(const tokenizer *t, const int32_t *ids, int64_t n, bool skip, const char *want) {
    char *s;
    size_t len;
    celer_error e;
    if (!CHECK(tok_decode(t, ids, n, skip, &s, &len, &e) == CELER_OK, "decode: %s", e.msg)) return;
    CHECK(len == strlen(want) && !strcmp(s, want), "decode: got \"%s\", want \"%s\"", s, want);
    free(s);
}

static void check_tiny(void) {
    tokenizer *t;
    celer_error e;
    if (CHECK(tok_load_json(tiny1, sizeof tiny1 - 1, "tiny1", &t, &e) == CELER_OK, "tiny1: %s", e.msg)) {
        /* b c (rank 0) first, then a bc, then abc d: the stale "a b" entry is skipped. */
        expect_ids(t, "abcd", false, (int32_t[]){8}, 1);
        expect_ids(t, "abcd", true, (int32_t[]){10, 8}, 2);
        expect_ids(t, "abd", false, (int32_t[]){4, 3}, 2);
        expect_ids(t, "dcba", false, (int32_t[]){3, 2, 1, 0}, 4);
        expect_ids(t, "axyzb", false, (int32_t[]){0, 9, 1}, 3); /* fuse_unk */
        expect_ids(t, "ab  [X]  cd", false, (int32_t[]){4, 11, 7}, 3); /* lstrip, rstrip */
        expect_ids(t, "<s>ab<s>", false, (int32_t[]){10, 4, 10}, 3);
        expect_ids(t, "", true, (int32_t[]){10}, 1);
        expect_ids(t, "", false, NULL, 0);
        expect_text(t, (int32_t[]){10, 4, 11, 7}, 4, false, "<s> ab [X] cd");
        expect_text(t, (int32_t[]){10, 4, 11, 7}, 4, true, "ab [X] cd");
        CHECK(tok_vocab_size(t) == 12, "tiny1 vocab size %lld", (long long)tok_vocab_size(t));
        CHECK(tok_token_to_id(t, "abc", 3) == 6 && tok_token_to_id(t, "[X]", 3) == 11 && tok_token_to_id(t, "zz", 2) == -1,
              "token_to_id");
        CHECK(tok_id_to_token(t, 8) && !strcmp(tok_id_to_token(t, 8), "abcd") && !strcmp(tok_id_to_token(t, 10), "<s>") &&
                  !tok_id_to_token(t, 12) && !tok_id_to_token(t, -1),
              "id_to_token");
        /* A long word: the heap keeps this fast (the quadratic loop would not be). */
        size_t n = 200000;
        char *w = malloc(n + 1);
        for (size_t i = 0; i < n; i++) w[i] = "abcd"[i % 4];
        w[n] = 0;
        int32_t *ids;
        int64_t ni;
        CHECK(tok_encode(t, w, n, false, &ids, &ni, &e) == CELER_OK && ni == (int64_t)n / 4 && ids[0] == 8 &&
                  ids[ni - 1] == 8,
              "long word: %lld ids", (long long)ni);
        free(ids), free(w);
        tok_free(t);
    }
    if (CHECK(tok_load_json(tiny3, sizeof tiny3 - 1, "tiny3", &t, &e) == CELER_OK, "tiny3: %s", e.msg)) {
        expect_ids(t, "hix", false, (int32_t[]){6}, 1);
        expect_ids(t, "x", false, (int32_t[]){4}, 1);
        expect_ids(t, "hx", false, (int32_t[]){0, 5}, 2);
        expect_ids(t, "h", false, (int32_t[]){7}, 1);
        expect_ids(t, "hiq x", false, (int32_t[]){2, 4}, 2); /* no unk_token: "q" is dropped */
        expect_text(t, (int32_t[]){4, 4}, 2, false, "x</wx</w");
        expect_text(t, (int32_t[]){8, 4}, 2, false, ">a>x</w");
        tok_free(t);
    }
    if (CHECK(tok_load_json(tiny2, sizeof tiny2 - 1, "tiny2", &t, &e) == CELER_OK, "tiny2: %s", e.msg)) {
        expect_ids(t, "hi \xc3\xa9", false, (int32_t[]){4, 0, 5, 6}, 4);
        expect_ids(t, "hx", false, (int32_t[]){3, 7}, 2);
        expect_text(t, (int32_t[]){4, 0, 5, 6}, 4, false, "hi \xc3\xa9");
        expect_text(t, (int32_t[]){4, 5}, 2, false, "hi\xef\xbf\xbd"); /* a lone byte */

        /* The stream holds <0xC3> back until <0xA9> completes the character. */
        tok_stream *s;
        const char *out;
        size_t len;
        if (CHECK(tok_stream_create(t, false, &s, &e) == CELER_OK, "stream")) {
            static const char *const want[] = {"hi", " ", "", "\xc3\xa9", ""};
            const int32_t ids[] = {4, 0, 5, 6, 5};
            for (int i = 0; i < 5; i++) {
                CHECK(tok_stream_push(s, ids[i], &out, &len, &e) == CELER_OK && len == strlen(want[i]) &&
                          !memcmp(out, want[i], len),
                      "stream push %d: got \"%.*s\", want \"%s\"", i, (int)len, out, want[i]);
            }
            CHECK(tok_stream_flush(s, &out, &len, &e) == CELER_OK && len == 3 && !memcmp(out, "\xef\xbf\xbd", 3),
                  "stream flush gives U+FFFD for the held byte: \"%.*s\"", (int)len, out);
            CHECK(tok_stream_push(s, 99, &out, &len, &e) != CELER_OK, "stream refuses id 99");
            tok_stream_destroy(s);
        }
        tok_free(t);
    }
}

/* Streams every corpus string's ids through a real tokenizer one id at a time. */
static void check_stream(const char *name, json_t *corpus) {
    char dir[4096];
    if (!tokenizer_dir(name, dir, sizeof dir)) {
        SKIP_REQUIRED("%s", dir);
        return;
    }
    tokenizer *t;
    celer_error e;
    if (!CHECK(tok_load(dir, &t, &e) == CELER_OK, "load %s: %s", name, e.msg)) return;
    int bad = 0, held = 0;
    for (size_t i = 0; i < json_array_size(corpus); i++) {
        json_t *s = json_array_get(corpus, i);
        int32_t *ids;
        int64_t n;
        if (tok_encode(t, json_string_value(s), json_string_length(s), false, &ids, &n, &e) != CELER_OK) {
            bad++;
            continue;
        }
        char *full;
        size_t flen;
        tok_decode(t, ids, n, false, &full, &flen, &e);
        tok_stream *st;
        tok_stream_create(t, false, &st, &e);
        size_t k = 0;
        bool ok = true;
        for (int64_t j = 0; j <= n; j++) {
            const char *out;
            size_t len;
            if (j < n) tok_stream_push(st, ids[j], &out, &len, &e);
            else tok_stream_flush(st, &out, &len, &e);
            /* Every piece is whole UTF-8 and continues the full decoding. */
            ok &= k + len <= flen && !memcmp(full + k, out, len);
            for (size_t q = 0; q < len;) {
                int l = 0;
                unsigned char c = (unsigned char)out[q];
                l = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
                ok &= q + (size_t)l <= len;
                q += (size_t)l;
            }
            held += j < n && len == 0;
            k += len;
        }
        ok &= k == flen;
        bad += !ok;
        if (!ok) fprintf(stderr, "  %s stream case %zu differs\n", name, i);
        tok_stream_destroy(st);
        free(full), free(ids);
    }
    CHECK(bad == 0, "%s: %d corpus strings stream differently from decode", name, bad);
    CHECK(held > 0, "%s: some ids were held back (%d)", name, held);
    tok_free(t);
}

/* ==== Bad input ==== */

static void expect_load_error(const char *what, const char *json, celer_status want, const char *needle) {
    tokenizer *t = (tokenizer *)1;
    celer_error e = {{0}};
    celer_status st = tok_load_json(json, strlen(json), "bad.json", &t, &e);
    CHECK(st == want && !t && strstr(e.msg, needle) && strstr(e.msg, "bad.json") && !strchr(e.msg, '\n'),
          "%s: status %d, message \"%s\" (want \"%s\")", what, st, e.msg, needle);
    if (st == CELER_OK) tok_free(t);
}

static char *replace(const char *s, const char *from, const char *to) {
    const char *p = strstr(s, from);
    CELER_ASSERT(p);
    size_t a = (size_t)(p - s), fl = strlen(from), tl = strlen(to), n = strlen(s);
    char *r = malloc(n - fl + tl + 1);
    memcpy(r, s, a);
    memcpy(r + a, to, tl);
    memcpy(r + a + tl, p + fl, n - a - fl + 1);
    return r;
}

static void check_bad_input(void) {
    expect_load_error("truncated", "{\"model\": {\"type\": ", CELER_STATUS_BAD_FILE, "bad.json:1:");
    expect_load_error("not an object", "[1, 2]", CELER_STATUS_BAD_FILE, "(root)");
    expect_load_error("no model", "{\"added_tokens\": []}", CELER_STATUS_BAD_FILE, "model");
    struct {
        const char *what, *from, *to, *needle;
        celer_status st;
    } cases[] = {
        {"unknown pre-tokenizer", "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"Removed\",\"invert\":false}",
         "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"ByteLevel\"},{\"type\":\"Whitespace\"}]}",
         "pre_tokenizer.pretokenizers[1].type: unsupported \"Whitespace\"", CELER_STATUS_UNSUPPORTED},
        {"unknown normalizer", "\"normalizer\":null", "\"normalizer\":{\"type\":\"Lowercase\"}",
         "normalizer.type: unsupported \"Lowercase\"", CELER_STATUS_UNSUPPORTED},
        {"unknown model", "\"type\":\"BPE\"", "\"type\":\"WordPiece\"", "model.type: unsupported \"WordPiece\"",
         CELER_STATUS_UNSUPPORTED},
        {"unknown decoder", "\"decoder\":null", "\"decoder\":{\"type\":\"WordPiece\"}", "decoder.type: unsupported",
         CELER_STATUS_UNSUPPORTED},
        {"bad behavior", "\"Removed\"", "\"Sideways\"", "pre_tokenizer.behavior: unsupported \"Sideways\"",
         CELER_STATUS_UNSUPPORTED},
        {"bad regex", "{\"String\":\" \"}", "{\"Regex\":\"(a\"}", "pre_tokenizer.pattern.Regex: bad regex",
         CELER_STATUS_BAD_FILE},
        {"merge outside vocab", "\"b c\"", "\"b z\"", "model.merges[0]: token \"z\" not in model.vocab",
         CELER_STATUS_BAD_FILE},
        {"bad merge string", "\"b c\"", "\"bc\"", "model.merges[0]: expected", CELER_STATUS_BAD_FILE},
        {"bad vocab id", "\"a\":0", "\"a\":-3", "model.vocab[\"a\"]", CELER_STATUS_BAD_FILE},
        {"duplicate id", "\"b\":1", "\"b\":0", "id used by two tokens", CELER_STATUS_BAD_FILE},
        {"unk outside vocab", "\"unk_token\":\"<unk>\"", "\"unk_token\":\"<nope>\"", "model.unk_token",
         CELER_STATUS_BAD_FILE},
        {"bad flag type", "\"fuse_unk\":true", "\"fuse_unk\":\"yes\"", "model.fuse_unk: expected true or false",
         CELER_STATUS_BAD_FILE},
        {"dropout", "\"dropout\":null", "\"dropout\":0.1", "model.dropout: unsupported", CELER_STATUS_UNSUPPORTED},
        {"truncation", "\"truncation\":null", "\"truncation\":{\"max_length\":4}", "truncation: unsupported",
         CELER_STATUS_UNSUPPORTED},
        {"template without A", "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}", "{\"Sequence\":{\"id\":\"B\",\"type_id\":0}}",
         "post_processor.single[1]", CELER_STATUS_BAD_FILE},
        {"unknown special", "\"ids\":[10]", "\"idz\":[10]", "post_processor.single[0]", CELER_STATUS_BAD_FILE},
        {"template id outside vocab", "\"ids\":[10]", "\"ids\":[77]", "template token id 77", CELER_STATUS_BAD_FILE},
        {"added token id", "\"id\":11,", "\"id\":\"x\",", "added_tokens[1].id", CELER_STATUS_BAD_FILE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *j = replace(tiny1, cases[i].from, cases[i].to);
        expect_load_error(cases[i].what, j, cases[i].st, cases[i].needle);
        free(j);
    }
    tokenizer *t;
    celer_error e;
    CHECK(tok_load("/nonexistent/tok", &t, &e) == CELER_STATUS_IO && strstr(e.msg, "/nonexistent/tok"),
          "missing file: %s", e.msg);
    if (!CHECK(tok_load_json(tiny1, sizeof tiny1 - 1, "tiny1", &t, &e) == CELER_OK, "tiny1")) return;
    static const char *const invalid[] = {"\xff", "ab\xc3", "\xed\xa0\x80", "\xc0\x80", "a\x80", "\xf4\x90\x80\x80",
                                          "ok\xe2\x82"};
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
        int32_t *ids = (int32_t *)1;
        int64_t n = 7;
        celer_status st = tok_encode(t, invalid[i], strlen(invalid[i]), true, &ids, &n, &e);
        CHECK(st == CELER_STATUS_INVALID_ARGUMENT && !ids && n == 0 && strstr(e.msg, "not valid UTF-8"),
              "invalid UTF-8 %zu: status %d, %s", i, st, e.msg);
    }
    char *s;
    size_t len;
    CHECK(tok_decode(t, (int32_t[]){4, 12}, 2, false, &s, &len, &e) == CELER_STATUS_INVALID_ARGUMENT &&
              strstr(e.msg, "token id 12"),
          "decode id past vocab: %s", e.msg);
    tok_free(t);
}

int main(void) {
    json_error_t je;
    json_t *corpus = json_load_file("tests/tokenizer/corpus.json", 0, &je);
    if (CHECK(json_is_array(corpus) && json_array_size(corpus) >= 300, "corpus.json: %s", je.text)) {
        check_golden("llama3_1", corpus);
        check_golden("qwen3", corpus);
        check_golden("llama2", corpus);
        check_variants(corpus);
        check_stream("llama3_1", corpus);
        check_stream("llama2", corpus);
    }
    check_tiny();
    check_bad_input();
    json_decref(corpus);
    return harness_done("test_tokenizer");
}

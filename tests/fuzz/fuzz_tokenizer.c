/*
 * fuzz_tokenizer.c - libFuzzer target for the tokenizer.
 *
 * An input starting with '{' is a tokenizer.json document: it must load or fail with a
 * message, and a loaded one must encode a fixed text (and decode the result) without
 * crashing. Any other input is text for the real Llama 3.1 tokenizer (loaded once from
 * $CELER_SHARED or ../shared, if present): encode must succeed or reject invalid UTF-8,
 * and decode and the streaming detokenizer must accept the ids it produced. Never a
 * crash or a leak.
 */
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void exercise(const tokenizer *t, const char *text, size_t len) {
    celer_error e;
    int32_t *ids;
    int64_t n;
    if (tok_encode(t, text, len, true, &ids, &n, &e) != CELER_OK) return;
    char *s;
    size_t sl;
    if (tok_decode(t, ids, n, false, &s, &sl, &e) == CELER_OK) free(s);
    tok_stream *st;
    if (tok_stream_create(t, true, &st, &e) == CELER_OK) {
        const char *out;
        size_t ol;
        for (int64_t i = 0; i < n; i++)
            if (tok_stream_push(st, ids[i], &out, &ol, &e) != CELER_OK) __builtin_trap();
        tok_stream_flush(st, &out, &ol, &e);
        tok_stream_destroy(st);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static tokenizer *real;
    static int tried;
    celer_error e;
    if (size > 0 && data[0] == '{') {
        tokenizer *t;
        if (tok_load_json((const char *)data, size, "fuzz", &t, &e) == CELER_OK) {
            static const char text[] = "Hello world, it's 42 \xe4\xbd\xa0\xe5\xa5\xbd <s> \xf0\x9f\x98\x80";
            exercise(t, text, sizeof text - 1);
            exercise(t, "", 0);
            tok_free(t);
        } else if (!e.msg[0]) {
            __builtin_trap();
        }
        return 0;
    }
    if (!tried) {
        tried = 1;
        char path[4096];
        const char *root = getenv("CELER_SHARED") ? getenv("CELER_SHARED") : "../shared";
        snprintf(path, sizeof path, "%s/tokenizers/llama3_1/tokenizer.json", root);
        if (tok_load(path, &real, &e) != CELER_OK) real = NULL;
    }
    if (real) exercise(real, (const char *)data, size);
    return 0;
}

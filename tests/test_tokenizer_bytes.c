/*
 * test_tokenizer_bytes.c - tok_vocab_bytes against the decoder: for each real tokenizer
 * (Llama 2: Metaspace + byte fallback + Strip; Llama 3.1 and Qwen3: ByteLevel), the
 * concatenated bytes of the ids of many encoded texts equal tok_decode of those ids. The
 * ids are preceded by the token "x", so the decoder's first-token rule (strip a leading
 * space) does not apply. Special tokens have no bytes.
 */
#include "harness.h"

#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const texts[] = {
    "x",
    "Hello world",
    "x  two  spaces and\ttabs\nnewlines\n\n",
    "{\"name\": \"caf\xC3\xA9\", \"n\": [1, 2.5e-3, null], \"ok\": true}",
    "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xA8\xE4\xB8\xAD\xE6\x96\x87 mixed",
    "emoji \xF0\x9F\x98\x80\xF0\x9F\x8E\x89 and rare \xF0\x90\x8D\x88 chars \xE2\x80\xA8!",
    "code: for (int i = 0; i < n; i++) { x += a[i] * b[i]; }",
    "x\xE2\x96\x81literal lower block and <0x41> text",
    "numbers 1234567890 3.14159 -42",
    "a<|eot_id|>b</s><s>c",
};

int main(void) {
    static const char *names[] = {"llama2", "llama3_1", "qwen3"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        char dir[512];
        if (!tokenizer_dir(names[k], dir, sizeof dir)) {
            SKIP_REQUIRED("%s: %s", names[k], dir);
            continue;
        }
        tokenizer *t;
        celer_error e;
        if (tok_load(dir, &t, &e) != CELER_OK) {
            CHECK(false, "%s: %s", names[k], e.msg);
            continue;
        }
        char **bytes;
        size_t *len;
        if (!CHECK(tok_vocab_bytes(t, &bytes, &len, &e) == CELER_OK, "%s: %s", names[k], e.msg)) {
            tok_free(t);
            continue;
        }
        int64_t n_vocab = tok_vocab_size(t), n_special = 0;
        for (int64_t id = 0; id < n_vocab; id++)
            if (tok_is_special(t, (int32_t)id)) n_special += len[id] == 0;
        CHECK(n_special > 0, "%s: special tokens have no bytes", names[k]);
        int agree = 0, n_texts = (int)(sizeof texts / sizeof *texts);
        for (int i = 0; i < n_texts; i++) {
            int32_t *enc, x = tok_token_to_id(t, "x", 1);
            int64_t n;
            if (!CHECK(x >= 0, "%s: a token 'x'", names[k]) ||
                tok_encode(t, texts[i], strlen(texts[i]), false, &enc, &n, &e) != CELER_OK) {
                CHECK(false, "%s: encode: %s", names[k], e.msg);
                continue;
            }
            int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
            ids[0] = x;
            memcpy(ids + 1, enc, (size_t)n * sizeof *ids);
            free(enc);
            n++;
            char *dec;
            size_t dn;
            tok_decode(t, ids, n, true, &dec, &dn, &e);
            char *cat = malloc(strlen(texts[i]) * 4 + 64);
            size_t cn = 0;
            for (int64_t j = 0; j < n; j++)
                memcpy(cat + cn, bytes[ids[j]], len[ids[j]]), cn += len[ids[j]];
            bool ok = cn == dn && !memcmp(cat, dec, dn);
            agree += ok;
            CHECK(ok, "%s: text %d: bytes '%.*s' decode '%s'", names[k], i, (int)cn, cat, dec);
            free(cat), free(dec), free(ids);
        }
        printf("%s: %d of %d texts: token bytes agree with tok_decode\n", names[k], agree, n_texts);
        tok_vocab_bytes_free(bytes, len);
        tok_free(t);
    }
    return harness_done("test_tokenizer_bytes");
}

/*
 * fuzz_request.c - libFuzzer target for the server's request parser
 * (src/server/request.c).
 *
 * The input is an HTTP body, parsed as each endpoint's request in turn (chat for a
 * text-only and for a vision-language model, completion, tokenize, detokenize). Each parse
 * must either succeed with every field in its documented range, or fail with a 400 that
 * has a message; never crash, leak, or read past the input (which is not NUL-terminated).
 * The same bytes also go through the base64 decoder, whose output must encode back to
 * exactly the input.
 */
#include "server/request.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Aborts (a finding) when an accepted request breaks the parser's contract. */
static void check_request(const server_request *r, const request_limits *lim) {
    const bool generates = r->kind == REQUEST_CHAT || r->kind == REQUEST_COMPLETION;
    bool ok = r->n >= 1 && r->n <= REQUEST_MAX_N && r->n_stop >= 0 &&
              r->n_stop <= REQUEST_MAX_STOP && r->top_logprobs >= 0 &&
              r->top_logprobs <= CELER_MAX_TOP_LOGPROBS;
    ok = ok && (!generates || r->max_tokens == -1 ||
                (r->max_tokens >= 1 && r->max_tokens <= lim->max_tokens));
    ok = ok && r->sampling.temp >= 0 && r->sampling.temp <= 2 && r->sampling.top_p > 0 &&
         r->sampling.top_p <= 1 && r->sampling.top_k >= 0;
    for (int32_t i = 0; ok && i < r->n_stop; i++) ok = r->stop[i] && r->stop[i][0];
    for (int32_t i = 0; ok && i < r->n_bias; i++)
        ok = r->bias_ids[i] >= 0 && r->bias_ids[i] < lim->n_vocab && r->bias[i] >= -100 &&
             r->bias[i] <= 100;
    for (int64_t i = 0; ok && i < r->n_ids; i++) ok = r->ids[i] >= 0 && r->ids[i] < lim->n_vocab;
    if (r->kind == REQUEST_CHAT) ok = ok && r->messages_json && r->messages_json[0] == '[';
    ok = ok && r->n_images >= 0 && r->n_images <= REQUEST_MAX_IMAGES &&
         (lim->vision || r->n_images == 0) && (r->kind == REQUEST_CHAT || r->n_images == 0);
    for (int32_t i = 0; ok && i < r->n_images; i++)
        ok = r->images[i].data && r->images[i].len > 0 &&
             !strncmp(r->images[i].param, "messages[", 9);
    if (r->kind == REQUEST_COMPLETION) ok = ok && (r->text ? r->text_len > 0 : r->n_ids > 0);
    if (r->kind == REQUEST_TOKENIZE) ok = ok && r->text && strlen(r->text) == r->text_len;
    if (!ok) abort();
}

/* Decoded base64 must be the input's bytes: encoding them back gives the input. */
static void check_base64(const char *src, size_t n) {
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    unsigned char *out = malloc(n / 4 * 3 + 1);
    if (!out) return;
    const char *why = NULL;
    size_t at = 0;
    const int64_t got = request_base64_decode(src, n, out, &why, &at);
    if (got < 0) {
        if (!why || at > n) abort();
        free(out);
        return;
    }
    if ((size_t)got > n / 4 * 3 || (n > 0 && (size_t)got + 2 < n / 4 * 3)) abort();
    for (size_t i = 0, w = 0; i < (size_t)got; i += 3, w += 4) {
        const size_t k = (size_t)got - i < 3 ? (size_t)got - i : 3;
        unsigned v = (unsigned)out[i] << 16 | (k > 1 ? (unsigned)out[i + 1] << 8 : 0) |
                     (k > 2 ? out[i + 2] : 0);
        const char enc[4] = {digits[v >> 18 & 63], digits[v >> 12 & 63],
                             k > 1 ? digits[v >> 6 & 63] : '=', k > 2 ? digits[v & 63] : '='};
        if (w + 4 > n || memcmp(enc, src + w, 4) != 0) abort();
    }
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* The body in a buffer of exactly its size, so reading past it is caught. */
    char *body = malloc(size ? size : 1);
    if (!body) return 0;
    memcpy(body, data, size);
    const request_limits text = {1000, 4096, false, "text-model"};
    const request_limits vision = {1000, 4096, true, "vision-model"};
    for (int k = REQUEST_CHAT - 1; k <= REQUEST_DETOKENIZE; k++) {
        const request_limits *lim = k < REQUEST_CHAT ? &vision : &text;
        const request_kind kind = k < REQUEST_CHAT ? REQUEST_CHAT : (request_kind)k;
        server_request r;
        request_error e;
        if (request_parse(kind, body, size, lim, &r, &e)) {
            check_request(&r, lim);
            request_free(&r);
        } else if (e.status != 400 || !e.message[0]) {
            if (e.status != 500) abort(); /* 500 only when out of memory */
        }
    }
    check_base64(body, size);
    free(body);
    return 0;
}

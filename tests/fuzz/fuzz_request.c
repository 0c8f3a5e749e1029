/*
 * fuzz_request.c - libFuzzer target for the server's request parser
 * (src/server/request.c).
 *
 * The input is an HTTP body, parsed as each endpoint's request in turn (chat,
 * completion, tokenize, detokenize). Each parse must either succeed with every field in
 * its documented range, or fail with a 400 that has a message; never crash, leak, or read
 * past the input (which is not NUL-terminated).
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
    if (r->kind == REQUEST_COMPLETION) ok = ok && (r->text ? r->text_len > 0 : r->n_ids > 0);
    if (r->kind == REQUEST_TOKENIZE) ok = ok && r->text && strlen(r->text) == r->text_len;
    if (!ok) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* The body in a buffer of exactly its size, so reading past it is caught. */
    char *body = malloc(size ? size : 1);
    if (!body) return 0;
    memcpy(body, data, size);
    const request_limits lim = {1000, 4096};
    for (int k = REQUEST_CHAT; k <= REQUEST_DETOKENIZE; k++) {
        server_request r;
        request_error e;
        if (request_parse((request_kind)k, body, size, &lim, &r, &e)) {
            check_request(&r, &lim);
            request_free(&r);
        } else if (e.status != 400 || !e.message[0]) {
            if (e.status != 500) abort(); /* 500 only when out of memory */
        }
    }
    free(body);
    return 0;
}

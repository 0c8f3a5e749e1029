/*
 * request.h - the bodies of the OpenAI-compatible endpoints, parsed and checked.
 *
 * request_parse turns the bytes of a POST body into a server_request whose every field
 * is in range, or into a request_error: an HTTP status (400) and an OpenAI error naming
 * the field at fault ("messages[0].content[1].type", "temperature"). It is pure: no
 * HTTP, no engine, no tokenizer; what needs the model (rendering the chat template,
 * tokenizing, fitting the context) happens later in the server. This is the code the
 * fuzz target drives with arbitrary bytes.
 */
#ifndef CELER_SERVER_REQUEST_H
#define CELER_SERVER_REQUEST_H

#include "celer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum request_kind {
    REQUEST_CHAT,       /* POST /v1/chat/completions */
    REQUEST_COMPLETION, /* POST /v1/completions */
    REQUEST_TOKENIZE,   /* POST /tokenize */
    REQUEST_DETOKENIZE, /* POST /detokenize */
} request_kind;

#define REQUEST_MAX_STOP                4
#define REQUEST_MAX_N                   16
#define REQUEST_MAX_COMPLETION_LOGPROBS 5

/* What the parser needs to know of the model. */
typedef struct request_limits {
    int64_t n_vocab;    /* ids (prompt, logit_bias, detokenize) must be below it */
    int64_t max_tokens; /* largest max_tokens accepted: the context of one sequence */
} request_limits;

/* A request that passed every check. Owned strings and arrays; request_free frees them. */
typedef struct server_request {
    request_kind kind;
    /* chat: the messages as a JSON array of {"role", "content": string, ...}, content
     * parts already joined, ready for celer_chat_template_render */
    char *messages_json;
    /* completion: a text prompt (text != NULL) or token ids; tokenize: the text */
    char *text;
    size_t text_len;
    int32_t *ids; /* completion prompt ids, or detokenize ids */
    int64_t n_ids;
    bool add_special; /* tokenize */

    int64_t max_tokens; /* -1: until the context is full */
    int32_t n;
    celer_sampler_params sampling;
    bool seed_given; /* else the server draws one */
    float presence_penalty, frequency_penalty;
    int32_t *bias_ids; /* [n_bias] */
    float *bias;
    int32_t n_bias;
    char *stop[REQUEST_MAX_STOP];
    int32_t n_stop;
    bool logprobs;        /* chat: logprobs true; completion: logprobs given */
    int32_t top_logprobs; /* alternatives per token (chat: top_logprobs, completion: logprobs) */
    bool ignore_eos;      /* llama-server's extension */
    bool stream, include_usage;
} server_request;

/* An OpenAI error object: {"error": {"message", "type", "param", "code"}}. */
typedef struct request_error {
    int status;       /* HTTP status */
    const char *type; /* "invalid_request_error", ... (static) */
    const char *code; /* static, or NULL */
    char param[128];  /* the field at fault, "" for none */
    char message[512];
} request_error;

/* Parses body[len] as a request of the given kind. On success fills *out (free it with
 * request_free) and returns true; else fills *e (status 400, the field in param and the
 * message) and leaves *out empty. Never reads past body[len - 1]; body need not be
 * NUL-terminated. */
bool request_parse(request_kind kind, const char *body, size_t len, const request_limits *lim,
                   server_request *out, request_error *e);
void request_free(server_request *r);

/* Fills *e; param may be NULL. Returns false, so a caller can `return request_fail(...)`. */
bool request_fail(request_error *e, int status, const char *type, const char *code,
                  const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

#endif

/*
 * request.h - the bodies of the OpenAI-compatible endpoints, parsed and checked.
 *
 * request_parse turns the bytes of a POST body into a server_request whose every field
 * is in range, or into a request_error: an HTTP status (400) and an OpenAI error naming
 * the field at fault ("messages[0].content[1].type", "temperature"). It is pure: no
 * HTTP, no engine, no tokenizer, no image decoding; what needs the model (decoding the
 * images, rendering the chat template, tokenizing, fitting the context) happens later in
 * the server. This is the code the fuzz target drives with arbitrary bytes.
 *
 * Images come as "image_url" content parts of user messages whose URL is a base64 data:
 * URL of a PNG or JPEG file; the parser checks the URL, decodes the base64 (strictly)
 * and hands the file's bytes on. celer never fetches a URL.
 */
#ifndef CELER_SERVER_REQUEST_H
#define CELER_SERVER_REQUEST_H

#include "celer.h"

#include <jansson.h>
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
#define REQUEST_MAX_IMAGES              16 /* image parts in one chat request */

/* What the parser needs to know of the model. */
typedef struct request_limits {
    int64_t n_vocab;    /* ids (prompt, logit_bias, detokenize) must be below it */
    int64_t max_tokens; /* largest max_tokens accepted: the context of one sequence */
    bool vision;        /* the model takes images: "image_url" parts are accepted */
    const char *model;  /* its name, for the error a text-only model gives them; may be NULL */
} request_limits;

typedef enum request_tool_choice {
    REQUEST_TOOLS_AUTO = 0, /* the model may call tools or answer */
    REQUEST_TOOLS_REQUIRED, /* it must call one or more */
    REQUEST_TOOLS_NAMED,    /* it must call tool_name */
} request_tool_choice;

#define REQUEST_MAX_TOOLS 128

/* One "image_url" part: the bytes of the image file its data: URL holds. */
typedef struct request_image {
    unsigned char *data; /* [len] (malloc'd), len > 0 */
    size_t len;
    char param[160]; /* where it came from: "messages[0].content[1].image_url.url" */
} request_image;

/* A request that passed every check. Owned strings and arrays; request_free frees them. */
typedef struct server_request {
    request_kind kind;
    /* chat: the messages as a JSON array of {"role", "content", ...}, ready for
     * celer_chat_template_render. A message without image parts has its content as one
     * string (text parts joined); one with image parts keeps a list of parts in order,
     * {"type": "image"} and {"type": "text", "text": ...}, as transformers' processors
     * give them to the template. */
    char *messages_json;
    /* chat: "chat_template_kwargs", extra template variables as a JSON object's text
     * ({"enable_thinking": false}), or NULL when absent */
    char *template_kwargs;
    request_image *images; /* [n_images] the image parts of all messages, in order */
    int32_t n_images;
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
    /* The grammar the output must follow (GBNF text, malloc'd), or NULL: from OpenAI's
     * response_format (json_object, json_schema) or llama-server's json_schema and grammar
     * fields. A schema is compiled here (a keyword the compiler does not enforce is a 400
     * naming it); GBNF from "grammar" is checked when the engine compiles it. */
    char *grammar;
    bool stream, include_usage;
    /* chat: OpenAI tools. tools_json: the "tools" array as given (compact JSON text), or
     * NULL when there are none or tool_choice is "none"; tool_name: the function a
     * {"type": "function"} tool_choice names. */
    char *tools_json;
    request_tool_choice tool_choice;
    char tool_name[72];
    bool parallel_tool_calls;
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

/* Checks kwargs, extra chat template variables named param in errors: a JSON object
 * that sets none of the variables the server gives the template itself (messages,
 * add_generation_prompt, bos_token, eos_token) nor tools and documents, which are request
 * fields of their own. */
bool request_check_template_kwargs(const json_t *kwargs, const char *param, request_error *e);

/* The template variables of chat request r on a server whose default kwargs are
 * defaults (checked JSON object text, or NULL): r's chat_template_kwargs over them, as
 * vLLM's --default-chat-template-kwargs and llama-server's --chat-template-kwargs combine
 * with the request's. *out (malloc'd JSON text) is NULL when there are none. Returns false
 * only when out of memory. */
bool request_template_vars(const char *defaults, const server_request *r, char **out);

/* Decodes strict base64 (RFC 4648 section 4: the standard alphabet, padded with '=' to a
 * multiple of 4 characters, no whitespace, unused bits zero) src[n] into out, which has
 * room for n / 4 * 3 bytes. Returns the number of bytes written, or -1 with *why set to a
 * static reason and *at to the offset of the offending character (n for a bad length). */
int64_t request_base64_decode(const char *src, size_t n, unsigned char *out, const char **why,
                              size_t *at);

/* Fills *e; param may be NULL. Returns false, so a caller can `return request_fail(...)`. */
bool request_fail(request_error *e, int status, const char *type, const char *code,
                  const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

#endif

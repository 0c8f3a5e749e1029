/*
 * http.h - what the server's HTTP side (http.c) and its generation endpoints
 * (generate.c) share: the server, one exchange (a request and its response on one
 * connection), and the helpers that answer.
 *
 * Internal to src/server; the public face is server.h.
 */
#ifndef CELER_SERVER_HTTP_H
#define CELER_SERVER_HTTP_H

#include "server/jobs.h"
#include "server/openai.h"
#include "server/request.h"
#include "server/server.h"
#include "server/tool_calls.h"

#include <jansson.h>
#include <microhttpd.h>
#include <stdatomic.h>

enum { SERVER_LOADING, SERVER_READY, SERVER_DRAINING };

struct server {
    server_config cfg;
    char model_name[256];
    int64_t created; /* Unix seconds at start, for /v1/models */
    struct MHD_Daemon *daemon;
    int port;
    atomic_int state; /* SERVER_* */
    atomic_int live;  /* exchanges not yet freed: requests under way */
    celer_model *model;
    celer_tokenizer *tok;
    jobs *js;
    char *tmpl_src, *tmpl_bos, *tmpl_eos; /* the chat template, or NULL */
    int32_t stop_id;                      /* the template's eos text as one id, or -1 */
    tool_format tool_fmt;                 /* how the template's model writes tool calls */
    int64_t n_vocab;
    bool vision;         /* the model takes images */
    int32_t image_token; /* its image placeholder id, or -1 */
};

typedef enum route {
    ROUTE_NONE,
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
    ROUTE_MODELS,
    ROUTE_HEALTH,
    ROUTE_METRICS,
    ROUTE_TOKENIZE,
    ROUTE_DETOKENIZE,
} route;

/* One choice of a generation being answered. */
typedef struct choice_acc {
    char *text; /* non-streamed: the whole text */
    size_t len, cap;
    size_t offset;    /* characters of token text so far (legacy text_offset) */
    json_t *logprobs; /* non-streamed: chat array or legacy object; NULL if not asked */
    celer_finish_reason finish;
    bool ended;
    tool_stream *ts; /* streamed with tools: the calls parsed so far */
} choice_acc;

/* A request and its response. Refcounted: the connection holds one reference and a
 * streamed response's reader another; the last to let go frees it. */
typedef struct exchange {
    server *srv;
    atomic_int refs;
    char method[16];
    char path[128];
    route rt;
    int fd; /* the connection's socket, to notice a client that hung up */
    double t0;
    int status;   /* answered with, for the log line */
    bool checked; /* route, method, key and size were checked */
    bool answered, client_gone;
    char *body;
    size_t body_len, body_cap;
    bool body_too_large;
    /* generation */
    server_request req;
    bool have_req;
    celer_image **images; /* [n_images] the request's images, decoded; released at submit */
    int32_t n_images;
    job *job;
    char id[64];
    openai_meta meta;
    choice_acc *choices; /* [req.n] */
    openai_usage usage;
    char *error;        /* the model step failed */
    json_t *tools;      /* chat with tools: the request's tools (calls are parsed), or NULL */
    char *tool_grammar; /* the grammar that forces a call, or NULL */
    uint64_t tool_seed; /* of the calls' ids */
    /* streaming */
    char *out;
    size_t out_len, out_cap, out_off;
    bool stream_ended;
} exchange;

/* Queues obj (stolen) as the response with status; false when that failed. */
bool http_respond_json(exchange *ex, struct MHD_Connection *c, unsigned status, json_t *obj);
/* Queues an OpenAI error object. */
bool http_respond_error(exchange *ex, struct MHD_Connection *c, const request_error *e);
/* Adds the CORS headers when configured. */
void http_add_cors(const server *s, struct MHD_Response *r);
/* Whether the client hung up (its socket reports a hang-up; never blocks). */
bool http_client_gone(exchange *ex);
void exchange_unref(exchange *ex);

/* POST /v1/chat/completions and /v1/completions once the body is in. */
enum MHD_Result generate_handle(exchange *ex, struct MHD_Connection *c);

#endif

/*
 * server.h - `celer serve`: an OpenAI-compatible HTTP server over one model.
 *
 *     server *s = server_start(&cfg, err, sizeof err);   // listening; /health says 503
 *     ... open the model and its tokenizer ...
 *     server_load(s, model, tok, n_ctx, err, sizeof err); // engine up; /health says 200
 *     server_run(s);                                       // until SIGINT/SIGTERM
 *     server_destroy(s);
 *
 * Endpoints: POST /v1/chat/completions, /v1/completions, /tokenize, /detokenize; GET
 * /v1/models, /health, /metrics (with cfg.metrics); the unprefixed aliases
 * /chat/completions, /completions, /models and /v1/health. The server uses only the
 * public API (celer.h); it never exits the process on bad input. A model step that fails
 * answers 500 to the requests in it and the server goes on; after a lost device (every
 * step fails) /health says 503 "error".
 */
#ifndef CELER_SERVER_H
#define CELER_SERVER_H

#include "celer.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct server_config {
    const char *host;            /* address to bind ("127.0.0.1", "::", "0.0.0.0") */
    int port;                    /* 0: any free port (server_port says which) */
    const char *model_path;      /* for the chat template, and the model name */
    const char *alias;           /* the model's name in responses; NULL: the file name */
    const char *const *api_keys; /* [n_api_keys]; none: no authentication */
    int n_api_keys;
    bool metrics;               /* serve GET /metrics */
    const char *cors_origin;    /* Access-Control-Allow-Origin, or NULL */
    size_t max_body_bytes;      /* larger bodies get 413 */
    double drain_seconds;       /* on SIGINT/SIGTERM, how long running requests may finish */
    bool quiet;                 /* no log line per request on stderr */
    celer_engine_params engine; /* n_ctx comes with server_load */
    /* extra chat template variables for every chat request (a JSON object's text, which
     * server_start checks), under each request's chat_template_kwargs; or NULL */
    const char *chat_template_kwargs;
    /* the chat template's Jinja source instead of the model's (llama-server's
     * --chat-template-file: a file's contents), or NULL */
    const char *chat_template;
} server_config;

typedef struct server server;

/* Binds and starts answering (generation endpoints answer 503 until server_load). The
 * caller keeps cfg's strings alive until server_destroy. NULL on failure, err filled.
 * Blocks SIGINT and SIGTERM in the server's threads (server_run waits for them). */
server *server_start(const server_config *cfg, char *err, size_t err_size);

/* The port the server listens on. */
int server_port(const server *s);

/* Creates the engine over model and tok (which must outlive the server) with sequences
 * of n_ctx positions, and loads the chat template; from then on requests are served. */
celer_status server_load(server *s, celer_model *model, celer_tokenizer *tok, int64_t n_ctx,
                         char *err, size_t err_size);

/* Serves until SIGINT or SIGTERM, then stops accepting, lets running requests finish for
 * up to cfg.drain_seconds (a second signal cuts that short), ends the rest (streams get a
 * final chunk) and returns 0. */
int server_run(server *s);

void server_destroy(server *s);

#endif

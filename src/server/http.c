/*
 * http.c - the server's HTTP side over libmicrohttpd (server.h): the daemon, routing,
 * API keys, CORS, the body limit, the small endpoints (/health, /v1/models, /metrics,
 * /tokenize, /detokenize), one log line per request, and the server's life from
 * server_start to a drained shutdown.
 *
 * libmicrohttpd runs one thread per connection, so a handler may block: a generation
 * waits on its job in the connection's own thread (generate.c). Every error is an
 * OpenAI error object with a 4xx status for anything a client sent; nothing here exits
 * the process. The engine and its lock live in jobs.c.
 */
#define _GNU_SOURCE
#include "server/http.h"

#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ==== Answering ==== */

void http_add_cors(const server *s, struct MHD_Response *r) {
    if (!s->cfg.cors_origin) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", s->cfg.cors_origin);
    MHD_add_response_header(r, "Access-Control-Allow-Credentials", "true");
    MHD_add_response_header(r, "Access-Control-Expose-Headers", "Content-Type");
    if (strcmp(s->cfg.cors_origin, "*") != 0) MHD_add_response_header(r, "Vary", "Origin");
}

static bool respond_bytes(exchange *ex, struct MHD_Connection *c, unsigned status, char *bytes,
                          size_t len, const char *type, const char *allow) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, bytes, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(bytes);
        return false;
    }
    if (type) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    http_add_cors(ex->srv, r);
    ex->status = (int)status;
    ex->answered = true;
    const enum MHD_Result res = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return res == MHD_YES;
}

bool http_respond_json(exchange *ex, struct MHD_Connection *c, unsigned status, json_t *obj) {
    char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (!s) {
        static const char oom[] =
            "{\"error\":{\"message\":\"out of "
            "memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
        return (s = strdup(oom)) &&
               respond_bytes(ex, c, 500, s, strlen(s), "application/json", NULL);
    }
    return respond_bytes(ex, c, status, s, strlen(s), "application/json", NULL);
}

bool http_respond_error(exchange *ex, struct MHD_Connection *c, const request_error *e) {
    return http_respond_json(ex, c, (unsigned)e->status, openai_error(e));
}

static enum MHD_Result answer_error(exchange *ex, struct MHD_Connection *c, int status,
                                    const char *type, const char *code, const char *fmt,
                                    const char *arg) {
    request_error e;
    request_fail(&e, status, type, code, NULL, fmt, arg);
    return http_respond_error(ex, c, &e) ? MHD_YES : MHD_NO;
}

bool http_client_gone(exchange *ex) {
    if (ex->fd < 0) return false;
    struct pollfd p = {.fd = ex->fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/* ==== Routes ==== */

static const struct {
    const char *path;
    route rt;
    const char *allow; /* methods, besides OPTIONS */
} routes[] = {
    {"/v1/chat/completions", ROUTE_CHAT, "POST"},
    {"/chat/completions", ROUTE_CHAT, "POST"},
    {"/v1/completions", ROUTE_COMPLETIONS, "POST"},
    {"/completions", ROUTE_COMPLETIONS, "POST"},
    {"/v1/models", ROUTE_MODELS, "GET"},
    {"/models", ROUTE_MODELS, "GET"},
    {"/health", ROUTE_HEALTH, "GET"},
    {"/v1/health", ROUTE_HEALTH, "GET"},
    {"/metrics", ROUTE_METRICS, "GET"},
    {"/tokenize", ROUTE_TOKENIZE, "POST"},
    {"/detokenize", ROUTE_DETOKENIZE, "POST"},
};

static int route_find(const server *s, const char *url) {
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
        if (!strcmp(url, routes[i].path) && (routes[i].rt != ROUTE_METRICS || s->cfg.metrics))
            return (int)i;
    return -1;
}

/* ==== API keys ==== */

/* Whether given[glen] equals key, in time that depends only on key's length. */
static bool key_equal(const char *given, size_t glen, const char *key) {
    const size_t klen = strlen(key);
    unsigned char diff = glen != klen;
    for (size_t i = 0; i < klen; i++) diff |= (unsigned char)(key[i] ^ (i < glen ? given[i] : 0));
    return diff == 0;
}

/* Authorization: Bearer K, or X-Api-Key: K, against every configured key. */
static bool authorized(const server *s, struct MHD_Connection *c) {
    if (s->cfg.n_api_keys == 0) return true;
    const char *given = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Api-Key");
    const char *auth =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!given && auth && !strncasecmp(auth, "Bearer", 6) && (auth[6] == ' ' || auth[6] == '\t')) {
        given = auth + 6;
        while (*given == ' ' || *given == '\t') given++;
    }
    if (!given) return false;
    size_t glen = strlen(given);
    while (glen > 0 && (given[glen - 1] == ' ' || given[glen - 1] == '\t')) glen--;
    bool ok = false;
    for (int i = 0; i < s->cfg.n_api_keys; i++) ok |= key_equal(given, glen, s->cfg.api_keys[i]);
    return ok;
}

/* ==== Small endpoints ==== */

static enum MHD_Result answer_health(exchange *ex, struct MHD_Connection *c) {
    const int state = atomic_load(&ex->srv->state);
    if (state == SERVER_LOADING)
        return http_respond_json(ex, c, 503, json_pack("{s:s}", "status", "loading")) ? MHD_YES
                                                                                      : MHD_NO;
    /* a lost device fails every request: unhealthy, so whatever watches it restarts us */
    const char *lost = jobs_lost(ex->srv->js);
    if (lost)
        return http_respond_json(ex, c, 503,
                                 json_pack("{s:s, s:s}", "status", "error", "error", lost))
                   ? MHD_YES
                   : MHD_NO;
    return http_respond_json(ex, c, 200, json_pack("{s:s}", "status", "ok")) ? MHD_YES : MHD_NO;
}

static enum MHD_Result answer_models(exchange *ex, struct MHD_Connection *c) {
    const server *s = ex->srv;
    json_t *o =
        json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data", "id", s->model_name,
                  "object", "model", "created", (json_int_t)s->created, "owned_by", "celer");
    return http_respond_json(ex, c, 200, o) ? MHD_YES : MHD_NO;
}

static enum MHD_Result answer_metrics(exchange *ex, struct MHD_Connection *c) {
    char *text = jobs_metrics(ex->srv->js);
    if (!text) return answer_error(ex, c, 500, "server_error", NULL, "%s", "out of memory");
    return respond_bytes(ex, c, 200, text, strlen(text), "text/plain; version=0.0.4; charset=utf-8",
                         NULL)
               ? MHD_YES
               : MHD_NO;
}

static enum MHD_Result answer_tokens(exchange *ex, struct MHD_Connection *c) {
    const server *s = ex->srv;
    const bool tokenize = ex->rt == ROUTE_TOKENIZE;
    const request_limits lim = {celer_tokenizer_n_vocab(s->tok), 0, false, NULL};
    request_error e;
    if (!request_parse(tokenize ? REQUEST_TOKENIZE : REQUEST_DETOKENIZE, ex->body, ex->body_len,
                       &lim, &ex->req, &e))
        return http_respond_error(ex, c, &e) ? MHD_YES : MHD_NO;
    ex->have_req = true;
    char err[512];
    json_t *out = NULL;
    if (tokenize) {
        int32_t *ids = NULL;
        int64_t n = 0;
        if (celer_tokenize(s->tok, ex->req.text, ex->req.text_len, ex->req.add_special, &ids, &n,
                           err, sizeof err) != CELER_OK) {
            free(ids);
            request_fail(&e, 400, "invalid_request_error", NULL, "content", "content: %s", err);
            return http_respond_error(ex, c, &e) ? MHD_YES : MHD_NO;
        }
        json_t *arr = json_array();
        for (int64_t i = 0; arr && i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
        free(ids);
        out = json_pack("{s:o}", "tokens", arr);
    } else {
        char *text = NULL;
        size_t len = 0;
        if (celer_detokenize(s->tok, ex->req.ids, ex->req.n_ids, false, &text, &len, err,
                             sizeof err) != CELER_OK) {
            free(text);
            request_fail(&e, 400, "invalid_request_error", NULL, "tokens", "tokens: %s", err);
            return http_respond_error(ex, c, &e) ? MHD_YES : MHD_NO;
        }
        out = json_pack("{s:o}", "content", openai_string(text, len));
        free(text);
    }
    return http_respond_json(ex, c, 200, out) ? MHD_YES : MHD_NO;
}

/* ==== Exchanges ==== */

static exchange *exchange_new(server *s, struct MHD_Connection *c, const char *url,
                              const char *method) {
    exchange *ex = calloc(1, sizeof *ex);
    if (!ex) return NULL;
    ex->srv = s;
    atomic_init(&ex->refs, 1);
    atomic_fetch_add(&s->live, 1);
    snprintf(ex->method, sizeof ex->method, "%s", method);
    snprintf(ex->path, sizeof ex->path, "%s", url);
    ex->t0 = now_s();
    ex->fd = -1;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) ex->fd = ci->connect_fd;
    return ex;
}

void exchange_unref(exchange *ex) {
    if (!ex || atomic_fetch_sub(&ex->refs, 1) != 1) return;
    if (ex->job) job_release(ex->srv->js, ex->job);
    for (int32_t i = 0; ex->choices && i < ex->req.n; i++) {
        free(ex->choices[i].text);
        json_decref(ex->choices[i].logprobs);
        tool_stream_destroy(ex->choices[i].ts);
    }
    free(ex->choices);
    for (int32_t i = 0; i < ex->n_images; i++) celer_image_free(ex->images[i]);
    free(ex->images);
    if (ex->have_req) request_free(&ex->req);
    free(ex->body);
    free(ex->error);
    json_decref(ex->tools);
    free(ex->tool_grammar);
    free(ex->out);
    atomic_fetch_sub(&ex->srv->live, 1);
    free(ex);
}

/* MHD_OPTION_NOTIFY_COMPLETED: the request is over, well or not. A generation still
 * running (the client went away mid-stream) is cancelled here. Logs the request (status
 * 499, nginx's "client closed request", when it never got an answer). */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    exchange *ex = *con_cls;
    (void)cls, (void)c;
    if (!ex) return;
    *con_cls = NULL;
    if (ex->job) {
        job_release(ex->srv->js, ex->job); /* cancels if it has not finished */
        ex->job = NULL;
    }
    const bool gone = ex->client_gone || toe != MHD_REQUEST_TERMINATED_COMPLETED_OK;
    if (!ex->srv->cfg.quiet)
        fprintf(stderr, "celer serve: %s %s %d prompt=%lld cached=%lld completion=%lld %.3fs%s\n",
                ex->method, ex->path, ex->status ? ex->status : 499,
                (long long)ex->usage.prompt_tokens, (long long)ex->usage.cached_tokens,
                (long long)ex->usage.completion_tokens, now_s() - ex->t0,
                gone ? " (connection ended early)" : "");
    exchange_unref(ex);
}

/* The first call for a request: route, method, key and declared size are checked before
 * any body is read. Returns true when it answered. */
static bool answer_early(exchange *ex, struct MHD_Connection *c, const char *method,
                         enum MHD_Result *res) {
    server *s = ex->srv;
    const int ri = route_find(s, ex->path);
    *res = MHD_YES;
    if (ri < 0) {
        *res = answer_error(ex, c, 404, "invalid_request_error", "not_found",
                            "no such endpoint: %s", ex->path);
        return true;
    }
    ex->rt = routes[ri].rt;
    if (!strcmp(method, "OPTIONS")) { /* a CORS preflight: public */
        char *none = strdup("");
        struct MHD_Response *r =
            none ? MHD_create_response_from_buffer(0, none, MHD_RESPMEM_MUST_FREE) : NULL;
        if (!r) {
            free(none);
            *res = MHD_NO;
            return true;
        }
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW,
                                !strcmp(routes[ri].allow, "GET") ? "GET, HEAD, OPTIONS"
                                                                 : "POST, OPTIONS");
        if (s->cfg.cors_origin) {
            const char *req_headers =
                MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
            MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                    req_headers ? req_headers
                                                : "Authorization, Content-Type, X-Api-Key");
            MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
            http_add_cors(s, r);
        }
        ex->status = 204;
        ex->answered = true;
        *res = MHD_queue_response(c, 204, r);
        MHD_destroy_response(r);
        return true;
    }
    const bool get_route = !strcmp(routes[ri].allow, "GET");
    const bool method_ok =
        get_route ? !strcmp(method, "GET") || !strcmp(method, "HEAD") : !strcmp(method, "POST");
    if (!method_ok) {
        request_error e;
        request_fail(&e, 405, "invalid_request_error", "method_not_allowed", NULL,
                     "%s %s: expected %s", method, ex->path, routes[ri].allow);
        json_t *obj = openai_error(&e);
        char *body = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
        json_decref(obj);
        *res = body && respond_bytes(ex, c, 405, body, strlen(body), "application/json",
                                     get_route ? "GET, HEAD, OPTIONS" : "POST, OPTIONS")
                   ? MHD_YES
                   : MHD_NO;
        return true;
    }
    if (ex->rt != ROUTE_HEALTH && !authorized(s, c)) {
        *res = answer_error(
            ex, c, 401, "authentication_error", "invalid_api_key", "%s",
            "a valid API key is required: Authorization: Bearer KEY or X-Api-Key: KEY");
        return true;
    }
    const char *cl =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body_bytes) {
        char limit[32];
        snprintf(limit, sizeof limit, "%zu", s->cfg.max_body_bytes);
        *res = answer_error(ex, c, 413, "invalid_request_error", "request_too_large",
                            "the body is larger than the limit of %s bytes", limit);
        return true;
    }
    return false;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    server *s = cls;
    exchange *ex = *con_cls;
    (void)version;
    if (!ex) {
        if (!(ex = exchange_new(s, c, url, method))) return MHD_NO;
        *con_cls = ex;
        /* With a body coming, refuse before reading it; else answer on the next call, which
         * keeps the connection alive (MHD closes one answered before its body). */
        const bool body =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH) ||
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
        enum MHD_Result res;
        ex->checked = body;
        if (body && answer_early(ex, c, method, &res)) return res;
        return MHD_YES;
    }
    if (ex->answered) {
        *upload_size = 0; /* answered early: the rest of the body is dropped */
        return MHD_YES;
    }
    if (*upload_size > 0) {
        const size_t n = *upload_size;
        *upload_size = 0;
        if (ex->body_too_large || ex->body_len + n > s->cfg.max_body_bytes) {
            ex->body_too_large = true;
            return MHD_YES;
        }
        if (ex->body_len + n + 1 > ex->body_cap) {
            size_t cap = ex->body_cap ? ex->body_cap * 2 : 4096;
            while (cap < ex->body_len + n + 1) cap *= 2;
            char *b = realloc(ex->body, cap);
            if (!b)
                return answer_error(ex, c, 503, "unavailable_error", NULL, "%s", "out of memory");
            ex->body = b, ex->body_cap = cap;
        }
        memcpy(ex->body + ex->body_len, upload, n);
        ex->body_len += n;
        ex->body[ex->body_len] = '\0';
        return MHD_YES;
    }
    if (!ex->checked) {
        enum MHD_Result res;
        ex->checked = true;
        if (answer_early(ex, c, method, &res)) return res;
    }
    if (ex->body_too_large) {
        char limit[32];
        snprintf(limit, sizeof limit, "%zu", s->cfg.max_body_bytes);
        return answer_error(ex, c, 413, "invalid_request_error", "request_too_large",
                            "the body is larger than the limit of %s bytes", limit);
    }
    switch (ex->rt) {
    case ROUTE_HEALTH:
        return answer_health(ex, c);
    case ROUTE_MODELS:
        return answer_models(ex, c);
    default:
        break;
    }
    const int state = atomic_load(&s->state);
    if (state == SERVER_LOADING)
        return answer_error(ex, c, 503, "unavailable_error", "loading", "%s",
                            "the model is loading");
    switch (ex->rt) {
    case ROUTE_METRICS:
        return answer_metrics(ex, c);
    case ROUTE_TOKENIZE:
    case ROUTE_DETOKENIZE:
        return answer_tokens(ex, c);
    default:
        break;
    }
    if (state == SERVER_DRAINING)
        return answer_error(ex, c, 503, "unavailable_error", "shutting_down", "%s",
                            "the server is shutting down");
    return generate_handle(ex, c);
}

/* ==== The server's life ==== */

/* The file or directory name of a model path, without trailing slashes. */
static void model_name_of(const char *path, char *out, size_t cap) {
    size_t end = strlen(path);
    while (end > 1 && path[end - 1] == '/') end--;
    size_t start = end;
    while (start > 0 && path[start - 1] != '/') start--;
    snprintf(out, cap, "%.*s", (int)(end - start), path + start);
}

server *server_start(const server_config *cfg, char *err, size_t err_size) {
    server *s = calloc(1, sizeof *s);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    if (!s) {
        snprintf(err, err_size, "out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    s->stop_id = -1;
    s->image_token = -1;
    s->created = (int64_t)time(NULL);
    atomic_init(&s->state, SERVER_LOADING);
    atomic_init(&s->live, 0);
    if (cfg->alias)
        snprintf(s->model_name, sizeof s->model_name, "%s", cfg->alias);
    else
        model_name_of(cfg->model_path ? cfg->model_path : "model", s->model_name,
                      sizeof s->model_name);
    if (cfg->chat_template_kwargs) {
        json_t *kw = json_loads(cfg->chat_template_kwargs, JSON_REJECT_DUPLICATES, NULL);
        request_error re = {.message = "--chat-template-kwargs: not valid JSON"};
        const bool ok = kw && request_check_template_kwargs(kw, "--chat-template-kwargs", &re);
        json_decref(kw);
        if (!ok) {
            snprintf(err, err_size, "%s", re.message);
            goto fail;
        }
    }
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    const int gai = getaddrinfo(cfg->host, port, &hints, &ai);
    if (gai != 0 || !ai) {
        snprintf(err, err_size, "--host %s: %s", cfg->host, gai ? gai_strerror(gai) : "no address");
        goto fail;
    }
    struct sockaddr_storage addr;
    memcpy(&addr, ai->ai_addr, ai->ai_addrlen);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    /* MHD's threads inherit a mask without SIGINT/SIGTERM: server_run waits for them. */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    s->daemon = MHD_start_daemon(
        flags, (uint16_t)cfg->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)512, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
        MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_END);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    freeaddrinfo(ai);
    if (!s->daemon) {
        snprintf(err, err_size,
                 "cannot listen on %s port %d (in use, or not an address of this machine?)",
                 cfg->host, cfg->port);
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    return s;
fail:
    server_destroy(s);
    return NULL;
}

int server_port(const server *s) {
    return s->port;
}

celer_status server_load(server *s, celer_model *model, celer_tokenizer *tok, int64_t n_ctx,
                         char *err, size_t err_size) {
    s->cfg.engine.n_ctx = n_ctx;
    s->model = model;
    s->tok = tok;
    s->n_vocab = celer_model_n_vocab(model);
    s->vision = celer_model_has_vision(model);
    s->image_token = s->vision ? celer_model_image_token(model) : -1;
    char terr[512];
    if (celer_chat_template_load(s->cfg.model_path, &s->tmpl_src, &s->tmpl_bos, &s->tmpl_eos, terr,
                                 sizeof terr) != CELER_OK) {
        s->tmpl_src = s->tmpl_bos = s->tmpl_eos = NULL;
        fprintf(stderr, "celer serve: no chat template (%s); /v1/chat/completions answers 400\n",
                terr);
    }
    if (s->cfg.chat_template) { /* --chat-template-file: its source, the model's bos/eos */
        free(s->tmpl_src);
        if (!(s->tmpl_src = strdup(s->cfg.chat_template))) {
            snprintf(err, err_size, "out of memory");
            return CELER_STATUS_OUT_OF_MEMORY;
        }
    }
    s->tool_fmt = tool_format_detect(s->tmpl_src);
    if (s->tmpl_src && !s->cfg.quiet)
        fprintf(stderr, "celer serve: tool calls in the %s format\n",
                tool_format_name(s->tool_fmt));
    if (s->tmpl_eos) { /* the end-of-turn text, as one id, also ends a chat choice */
        int32_t *ids = NULL;
        int64_t n = 0;
        if (celer_tokenize(tok, s->tmpl_eos, strlen(s->tmpl_eos), false, &ids, &n, NULL, 0) ==
                CELER_OK &&
            n == 1)
            s->stop_id = ids[0];
        free(ids);
    }
    if (!(s->js = jobs_create(model, tok, &s->cfg.engine, err, err_size)))
        return CELER_STATUS_INVALID_ARGUMENT;
    atomic_store(&s->state, SERVER_READY);
    return CELER_OK;
}

/* Waits up to seconds for the requests under way to be answered; a signal cuts it short. */
static void drain_wait(server *s, double seconds, const sigset_t *sigs) {
    const double end = now_s() + seconds;
    while (atomic_load(&s->live) > 0 && now_s() < end) {
        const struct timespec ts = {0, 50 * 1000000L};
        if (sigtimedwait(sigs, NULL, &ts) > 0) {
            fprintf(stderr, "celer serve: second signal, ending running requests now\n");
            break;
        }
    }
}

int server_run(server *s) {
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    int sig = 0;
    while (sigwait(&sigs, &sig) != 0 || (sig != SIGINT && sig != SIGTERM)) {
    }
    fprintf(stderr, "celer serve: %s, no new connections; letting running requests finish\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM");
    atomic_store(&s->state, SERVER_DRAINING);
    const MHD_socket listen_fd = MHD_quiesce_daemon(s->daemon);
    if (listen_fd != MHD_INVALID_SOCKET) close(listen_fd);
    if (s->js) {
        drain_wait(s, s->cfg.drain_seconds, &sigs);
        jobs_cancel_all(s->js); /* what is left ends now, streams with a final chunk */
        drain_wait(s, 5.0, &sigs);
    }
    MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
    fprintf(stderr, "celer serve: stopped\n");
    return 0;
}

void server_destroy(server *s) {
    if (!s) return;
    if (s->daemon) MHD_stop_daemon(s->daemon);
    jobs_destroy(s->js);
    free(s->tmpl_src);
    free(s->tmpl_bos);
    free(s->tmpl_eos);
    free(s);
}

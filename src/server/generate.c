/*
 * generate.c - the generation endpoints, POST /v1/chat/completions and
 * /v1/completions, once their body is in (http.h).
 *
 * A request is parsed (request.c), its images decoded, its prompt built (chat template,
 * then tokenizer; one image token per image part), submitted as a job (jobs.c) with its
 * images, and answered either as one JSON object when every choice has ended, or as
 * server-sent events while tokens arrive. A client that hangs up is noticed while waiting
 * (its socket reports a hang-up, or a write fails) and its request is cancelled, which
 * frees its KV blocks. Routing, authentication and the body limit happen before this file
 * (http.c).
 */
#define _GNU_SOURCE
#include "server/chat_tools.h"
#include "server/http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define WAIT_SLICE_MS 50 /* how often a waiting thread looks at its client's socket */

static bool fail400(request_error *e, const char *param, const char *msg) {
    return request_fail(e, 400, "invalid_request_error", NULL, param, "%s", msg);
}

static uint64_t random_seed(void) {
    uint64_t s;
    if (getrandom(&s, sizeof s, 0) == (ssize_t)sizeof s) return s;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec;
}

/* ==== Prompts ==== */

/* A chat request's image files decoded into ex->images, in order; a bad image is a 400
 * naming its part, with the decoder's reason. Each file's bytes are freed once decoded. */
static bool decode_images(exchange *ex, request_error *e) {
    server_request *r = &ex->req;
    if (r->n_images == 0) return true;
    if (!(ex->images = calloc((size_t)r->n_images, sizeof *ex->images)))
        return request_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (int32_t k = 0; k < r->n_images; k++) {
        request_image *im = &r->images[k];
        char err[512];
        const celer_status st =
            celer_image_decode(im->data, im->len, im->param, &ex->images[k], err, sizeof err);
        free(im->data);
        im->data = NULL, im->len = 0;
        if (st == CELER_STATUS_OUT_OF_MEMORY)
            return request_fail(e, 500, "server_error", NULL, im->param, "%s", err);
        if (st != CELER_OK)
            return request_fail(e, 400, "invalid_request_error", NULL, im->param, "%s", err);
        ex->n_images = k + 1;
    }
    return true;
}

/* The images' references of this exchange, dropped (the engine holds its own). */
static void release_images(exchange *ex) {
    for (int32_t i = 0; i < ex->n_images; i++) celer_image_free(ex->images[i]);
    free(ex->images);
    ex->images = NULL;
    ex->n_images = 0;
}

/* A chat prompt of a vision-language model holds one image token per image block (one
 * per image part, or Gemma 3's pan-and-scan crops besides), in the parts' order: what the
 * chat template placed must add up. */
static bool check_image_tokens(exchange *ex, const int32_t *ids, int64_t n, request_error *e) {
    const server *s = ex->srv;
    if (s->image_token < 0) return true;
    int64_t found = 0, want = 0;
    for (int64_t i = 0; i < n; i++) found += ids[i] == s->image_token;
    for (int32_t k = 0; k < ex->n_images; k++) {
        int64_t blocks = 1;
        char err[512];
        if (celer_model_image_blocks(s->model, ex->images[k], &blocks, err, sizeof err) != CELER_OK)
            return request_fail(e, 400, "invalid_request_error", NULL, ex->req.images[k].param,
                                "%s", err);
        want += blocks;
    }
    if (found == want) return true;
    return request_fail(
        e, 400, "invalid_request_error", NULL, "messages",
        "messages: the prompt holds %lld image tokens (id %d) for %d image parts of %lld blocks: "
        "the chat template did not place one per image%s",
        (long long)found, s->image_token, ex->n_images, (long long)want,
        found > want ? " (or the text holds the image token)" : "");
}

/* The prompt's ids (malloc'd): chat messages through the template and the tokenizer
 * (without special tokens: the template has them), a completion's text with them, or a
 * completion's ids as given. */
static bool build_prompt(exchange *ex, int32_t **ids, int64_t *n, request_error *e) {
    const server *s = ex->srv;
    server_request *r = &ex->req;
    char err[512];
    *ids = NULL;
    *n = 0;
    if (r->kind == REQUEST_COMPLETION && !r->text) {
        if (!(*ids = malloc(sizeof **ids * (size_t)r->n_ids)))
            return request_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        memcpy(*ids, r->ids, sizeof **ids * (size_t)r->n_ids);
        *n = r->n_ids;
        return true;
    }
    char *prompt = NULL;
    const char *text = r->text;
    size_t len = r->text_len;
    if (r->kind == REQUEST_CHAT) {
        if (!s->tmpl_src)
            return fail400(e, "messages",
                           "the model has no chat template; use /v1/completions with a prompt");
        char *vars, *msgs = NULL;
        if (r->tools_json) { /* the template sees the tools, or a system message does */
            if (!chat_tools_prepare(s->tool_fmt, s->cfg.chat_template_kwargs, r, &msgs, &vars,
                                    &ex->tool_grammar, e))
                return false;
            if (!(ex->tools = json_loads(r->tools_json, 0, NULL))) {
                free(msgs), free(vars);
                return request_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            }
        } else if (!request_template_vars(s->cfg.chat_template_kwargs, r, &vars)) {
            return request_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        }
        const celer_status ts =
            celer_chat_template_render_vars(s->tmpl_src, msgs ? msgs : r->messages_json, vars, 1,
                                            s->tmpl_bos, s->tmpl_eos, &prompt, err, sizeof err);
        free(vars), free(msgs);
        if (ts != CELER_OK)
            return request_fail(e, 400, "invalid_request_error", NULL, "messages",
                                "messages: the chat template failed: %s", err);
        /* the image markers the template wrote, as the model's processor rewrites them */
        char *full;
        size_t full_len;
        const celer_status xs =
            celer_model_image_text(s->model, s->tok, prompt, strlen(prompt), ex->images,
                                   ex->n_images, &full, &full_len, err, sizeof err);
        free(prompt);
        if (xs != CELER_OK)
            return request_fail(e, xs == CELER_STATUS_OUT_OF_MEMORY ? 500 : 400,
                                xs == CELER_STATUS_OUT_OF_MEMORY ? "server_error"
                                                                 : "invalid_request_error",
                                NULL, "messages", "messages: %s", err);
        prompt = full;
        text = prompt, len = full_len;
    }
    const celer_status st =
        celer_tokenize(s->tok, text, len, r->kind != REQUEST_CHAT, ids, n, err, sizeof err);
    free(prompt);
    if (st != CELER_OK)
        return request_fail(e, 400, "invalid_request_error", NULL,
                            r->kind == REQUEST_CHAT ? "messages" : "prompt", "%s", err);
    if (*n == 0) {
        free(*ids);
        *ids = NULL;
        return fail400(e, r->kind == REQUEST_CHAT ? "messages" : "prompt",
                       "the prompt has no tokens");
    }
    if (r->kind == REQUEST_CHAT && !check_image_tokens(ex, *ids, *n, e)) {
        free(*ids);
        *ids = NULL;
        return false;
    }
    return true;
}

/* The engine's refusal as an OpenAI error: the field is the message's first word
 * ("prompt: 5000 tokens leave no room ..."), a full queue is 503. */
static void submit_error(exchange *ex, celer_status st, const char *msg, request_error *e) {
    if (st == CELER_STATUS_BUSY) {
        request_fail(e, 503, "unavailable_error", "queue_full", NULL, "%s; try again later", msg);
        return;
    }
    if (st != CELER_STATUS_INVALID_ARGUMENT) {
        request_fail(e, 500, "server_error", NULL, NULL, "%s", msg);
        return;
    }
    char param[64] = "";
    size_t k = 0;
    while (k < sizeof param - 1 && ((msg[k] >= 'a' && msg[k] <= 'z') || msg[k] == '_')) k++;
    if (k > 0 && msg[k] == ':') memcpy(param, msg, k), param[k] = '\0';
    if (!strcmp(param, "prompt") && ex->req.kind == REQUEST_CHAT) strcpy(param, "messages");
    request_fail(e, 400, "invalid_request_error", NULL, param, "%s", msg);
}

/* ==== Pieces into JSON ==== */

/* Text of one id, special tokens included (malloc'd); "" when it has none. */
static char *token_text(const server *s, int32_t id, size_t *len) {
    char *t = NULL;
    if (celer_detokenize(s->tok, &id, 1, false, &t, len, NULL, 0) != CELER_OK || !t) {
        free(t);
        *len = 0;
        return strdup("");
    }
    return t;
}

/* A piece's log-probabilities: a chat entry, or appended to a legacy object (legacy
 * != NULL; offset is the token's character offset in the choice). *token_len gets the
 * token's length in characters. */
static json_t *piece_logprob(const server *s, const job_piece *p, json_t *legacy, size_t offset,
                             size_t *token_len) {
    char *tops[CELER_MAX_TOP_LOGPROBS] = {0};
    size_t top_lens[CELER_MAX_TOP_LOGPROBS] = {0};
    size_t len = 0;
    char *tok = token_text(s, p->token, &len);
    for (int32_t i = 0; i < p->n_top; i++) tops[i] = token_text(s, p->top_ids[i], &top_lens[i]);
    const openai_logprob lp = {
        tok ? tok : "", tok ? len : 0,  p->logprob, p->n_top, (const char *const *)tops,
        top_lens,       p->top_logprobs};
    json_t *out = NULL;
    if (legacy)
        openai_completion_logprobs_append(legacy, &lp, offset);
    else
        out = openai_chat_logprob(&lp);
    *token_len = tok ? openai_char_count(tok, len) : 0;
    free(tok);
    for (int32_t i = 0; i < p->n_top; i++) free(tops[i]);
    return out;
}

static bool text_append(choice_acc *c, const char *s, size_t n) {
    if (c->len + n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 256;
        while (cap < c->len + n + 1) cap *= 2;
        char *t = realloc(c->text, cap);
        if (!t) return false;
        c->text = t, c->cap = cap;
    }
    memcpy(c->text + c->len, s, n);
    c->len += n;
    c->text[c->len] = '\0';
    return true;
}

/* Usage and the end of a choice, from its final piece. */
static void note_end(exchange *ex, choice_acc *c, const job_piece *p) {
    c->ended = true;
    c->finish = p->finish;
    ex->usage.prompt_tokens = p->prompt_tokens;
    ex->usage.completion_tokens += p->completion_tokens;
    if (p->index == 0) ex->usage.cached_tokens = p->cached_tokens; /* siblings share its blocks */
}

/* Non-streamed: folds pieces into the choices. */
static void collect(exchange *ex, const job_piece *p) {
    const server *s = ex->srv;
    for (; p; p = p->next) {
        if (p->error) {
            if (!ex->error) ex->error = strdup(p->error);
            continue;
        }
        if (p->index < 0 || p->index >= ex->req.n) continue;
        choice_acc *c = &ex->choices[p->index];
        if (p->is_output && ex->req.logprobs && c->logprobs) {
            size_t tl = 0;
            if (ex->meta.chat)
                json_array_append_new(c->logprobs, piece_logprob(s, p, NULL, 0, &tl));
            else
                piece_logprob(s, p, c->logprobs, c->offset, &tl);
            c->offset += tl;
        }
        if (p->text && p->len) text_append(c, p->text, p->len);
        if (p->finish != CELER_FINISH_NONE) note_end(ex, c, p);
    }
}

/* ==== Tool calls ==== */

/* A finished chat choice with tools: its text split into content and calls. */
static json_t *tool_choice_json(exchange *ex, int32_t i) {
    choice_acc *ch = &ex->choices[i];
    tool_calls_result res = {0};
    tool_error te = {{0}};
    if (tool_calls_parse(ex->srv->tool_fmt, ch->text ? ch->text : "", ch->len, ex->tools,
                         ex->tool_seed + (uint64_t)i, &res, &te) != CELER_OK)
        return NULL;
    if (res.malformed && !ex->srv->cfg.quiet)
        fprintf(stderr, "celer serve: %s: a tool call did not parse (%s); sent as content\n",
                ex->id, res.problem);
    json_t *msg = json_pack("{s:s}", "role", "assistant");
    if (msg) {
        json_object_set_new(msg, "content",
                            res.content_len || !res.n_calls
                                ? openai_string(res.content, res.content_len)
                                : json_null());
        if (res.reasoning_len)
            json_object_set_new(msg, "reasoning_content",
                                openai_string(res.reasoning, res.reasoning_len));
        if (res.n_calls)
            json_object_set_new(msg, "tool_calls", chat_tools_calls_json(res.calls, res.n_calls));
    }
    const char *finish = res.n_calls && ch->finish == CELER_FINISH_STOP
                             ? "tool_calls"
                             : openai_finish_reason(ch->finish);
    tool_calls_result_free(&res);
    json_t *lp = ch->logprobs;
    ch->logprobs = NULL; /* stolen */
    return msg ? openai_chat_choice(i, msg, lp, finish) : NULL;
}

/* What a tool stream released, as chunks: content (with logprobs lp, stolen), reasoning,
 * then the calls' deltas. */
static bool tool_stream_chunks(exchange *ex, int32_t i, const tool_stream_out *o, json_t *lp) {
    if (!o) {
        json_decref(lp);
        return false;
    }
    bool ok = true;
    if (o->content_len || lp) {
        json_t *d = json_pack("{s:o}", "content", openai_string(o->content, o->content_len));
        ok = openai_sse_append(&ex->out, &ex->out_len, &ex->out_cap,
                               d ? openai_chat_chunk(&ex->meta, i, d, lp, NULL) : NULL);
    } else {
        json_decref(lp);
    }
    if (ok && o->reasoning_len) {
        json_t *d =
            json_pack("{s:o}", "reasoning_content", openai_string(o->reasoning, o->reasoning_len));
        ok = openai_sse_append(&ex->out, &ex->out_len, &ex->out_cap,
                               d ? openai_chat_chunk(&ex->meta, i, d, NULL, NULL) : NULL);
    }
    if (ok && o->n_deltas) {
        json_t *d =
            json_pack("{s:o}", "tool_calls", chat_tools_deltas_json(o->deltas, o->n_deltas));
        ok = openai_sse_append(&ex->out, &ex->out_len, &ex->out_cap,
                               d ? openai_chat_chunk(&ex->meta, i, d, NULL, NULL) : NULL);
    }
    return ok;
}

/* A streamed piece of a choice with tools: through its tool stream; at the end the rest,
 * and the finish reason ("tool_calls" when it called one). */
static bool tool_stream_piece(exchange *ex, choice_acc *c, const job_piece *p, json_t *lp) {
    bool ok = tool_stream_chunks(
        ex, p->index, tool_stream_push(c->ts, p->text ? p->text : "", p->text ? p->len : 0), lp);
    if (!ok || p->finish == CELER_FINISH_NONE) return ok;
    note_end(ex, c, p);
    ok = tool_stream_chunks(ex, p->index, tool_stream_finish(c->ts), NULL);
    size_t n_calls = 0;
    tool_stream_calls(c->ts, &n_calls);
    if (tool_stream_malformed(c->ts) && !ex->srv->cfg.quiet)
        fprintf(stderr, "celer serve: %s: a tool call did not parse (%s); sent as content\n",
                ex->id, tool_stream_problem(c->ts));
    const char *finish =
        n_calls && p->finish == CELER_FINISH_STOP ? "tool_calls" : openai_finish_reason(p->finish);
    return ok &&
           openai_sse_append(&ex->out, &ex->out_len, &ex->out_cap,
                             openai_chat_chunk(&ex->meta, p->index, json_object(), NULL, finish));
}

/* Streamed: turns pieces into events on ex->out. */
static bool stream_format(exchange *ex, const job_piece *p) {
    const server *s = ex->srv;
    bool ok = true;
    for (; p && ok; p = p->next) {
        if (p->error) {
            request_error e;
            request_fail(&e, 500, "server_error", NULL, NULL, "%s", p->error);
            ok = openai_sse_append(&ex->out, &ex->out_len, &ex->out_cap, openai_error(&e));
            ex->stream_ended = true; /* an error ends the stream, without [DONE] */
            return ok;
        }
        if (p->index < 0 || p->index >= ex->req.n) continue;
        choice_acc *c = &ex->choices[p->index];
        json_t *lp = NULL;
        if (p->is_output && ex->req.logprobs) {
            size_t tl = 0;
            if (ex->meta.chat) {
                lp = json_array();
                if (lp) json_array_append_new(lp, piece_logprob(s, p, NULL, 0, &tl));
            } else if ((lp = openai_completion_logprobs_new())) {
                piece_logprob(s, p, lp, c->offset, &tl);
            }
            c->offset += tl;
        }
        if (c->ts) {
            ok = tool_stream_piece(ex, c, p, lp);
            continue;
        }
        if (p->len > 0 || lp)
            ok = openai_sse_append(&ex->out, &ex->out_len, &ex->out_cap,
                                   openai_chunk(&ex->meta, p->index, false, p->text ? p->text : "",
                                                p->text ? p->len : 0, lp, CELER_FINISH_NONE));
        if (ok && p->finish != CELER_FINISH_NONE) {
            note_end(ex, c, p);
            ok = openai_sse_append(
                &ex->out, &ex->out_len, &ex->out_cap,
                openai_chunk(&ex->meta, p->index, false, NULL, 0, NULL, p->finish));
        }
    }
    return ok;
}

/* The stream's tail once every choice has ended: usage (when asked) and [DONE]. */
static bool stream_finish(exchange *ex) {
    bool ok = true;
    if (ex->req.include_usage)
        ok = openai_sse_append(&ex->out, &ex->out_len, &ex->out_cap,
                               openai_usage_chunk(&ex->meta, &ex->usage));
    if (ok) {
        const char done[] = "data: [DONE]\n\n";
        const size_t n = sizeof done - 1;
        if (ex->out_len + n > ex->out_cap) {
            char *b = realloc(ex->out, ex->out_len + n);
            if (!b) return false;
            ex->out = b, ex->out_cap = ex->out_len + n;
        }
        memcpy(ex->out + ex->out_len, done, n);
        ex->out_len += n;
    }
    ex->stream_ended = true;
    return ok;
}

/* ==== Streaming ==== */

/* MHD's content reader: blocks (this connection has its own thread) until there are
 * bytes to send, the stream ends, or the client hangs up. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    exchange *ex = cls;
    (void)pos;
    for (;;) {
        if (ex->out_off < ex->out_len) {
            size_t n = ex->out_len - ex->out_off;
            if (n > max) n = max;
            memcpy(buf, ex->out + ex->out_off, n);
            ex->out_off += n;
            if (ex->out_off == ex->out_len) ex->out_off = ex->out_len = 0;
            return (ssize_t)n;
        }
        if (ex->stream_ended) {
            job_release(ex->srv->js, ex->job); /* finished: nothing to cancel */
            ex->job = NULL;
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (!ex->job) return MHD_CONTENT_READER_END_WITH_ERROR;
        bool done = false;
        job_piece *p = job_wait(ex->job, WAIT_SLICE_MS, &done);
        bool ok = stream_format(ex, p);
        job_pieces_free(p);
        if (ok && done && !ex->stream_ended) ok = stream_finish(ex);
        if (!ok) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (ex->out_len == 0 && !ex->stream_ended && http_client_gone(ex))
            return MHD_CONTENT_READER_END_WITH_ERROR; /* the completion callback cancels */
    }
}

static void stream_free(void *cls) {
    exchange_unref(cls);
}

static enum MHD_Result stream_start(exchange *ex, struct MHD_Connection *c) {
    bool ok = true;
    /* Chat streams open each choice with the assistant's role. */
    for (int32_t i = 0; ok && ex->meta.chat && i < ex->req.n; i++)
        ok = openai_sse_append(&ex->out, &ex->out_len, &ex->out_cap,
                               openai_chunk(&ex->meta, i, true, "", 0, NULL, CELER_FINISH_NONE));
    struct MHD_Response *r = ok ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
                                                                    stream_read, ex, stream_free)
                                : NULL;
    if (!r) return MHD_NO;
    atomic_fetch_add(&ex->refs, 1); /* the reader's reference, dropped by stream_free */
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    http_add_cors(ex->srv, r);
    ex->status = 200;
    ex->answered = true;
    const enum MHD_Result res = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return res;
}

/* ==== Non-streamed ==== */

static enum MHD_Result answer_whole(exchange *ex, struct MHD_Connection *c) {
    bool done = false;
    while (!done) {
        job_piece *p = job_wait(ex->job, WAIT_SLICE_MS, &done);
        collect(ex, p);
        job_pieces_free(p);
        if (!done && http_client_gone(ex)) {
            ex->client_gone = true;
            job_release(ex->srv->js, ex->job); /* cancels: its blocks go back now */
            ex->job = NULL;
            return MHD_NO;
        }
    }
    job_release(ex->srv->js, ex->job);
    ex->job = NULL;
    if (ex->error) {
        request_error e;
        request_fail(&e, 500, "server_error", NULL, NULL, "the model failed: %s", ex->error);
        return http_respond_error(ex, c, &e) ? MHD_YES : MHD_NO;
    }
    json_t *choices = json_array();
    for (int32_t i = 0; choices && i < ex->req.n; i++) {
        choice_acc *ch = &ex->choices[i];
        if (ex->tools) {
            json_array_append_new(choices, tool_choice_json(ex, i));
            continue;
        }
        json_array_append_new(choices, openai_choice(&ex->meta, i, ch->text ? ch->text : "",
                                                     ch->len, ch->logprobs, ch->finish));
        ch->logprobs = NULL; /* stolen */
    }
    return http_respond_json(ex, c, 200, openai_response(&ex->meta, choices, &ex->usage)) ? MHD_YES
                                                                                          : MHD_NO;
}

/* ==== Entry ==== */

enum MHD_Result generate_handle(exchange *ex, struct MHD_Connection *c) {
    server *s = ex->srv;
    const bool chat = ex->rt == ROUTE_CHAT;
    request_error e;
    const request_limits lim = {s->n_vocab, s->cfg.engine.n_ctx, s->vision, s->model_name};
    if (!request_parse(chat ? REQUEST_CHAT : REQUEST_COMPLETION, ex->body, ex->body_len, &lim,
                       &ex->req, &e))
        return http_respond_error(ex, c, &e) ? MHD_YES : MHD_NO;
    ex->have_req = true;
    free(ex->body); /* parsed: with images, the largest part of the request */
    ex->body = NULL;
    ex->body_len = ex->body_cap = 0;
    server_request *r = &ex->req;
    int32_t *ids;
    int64_t n_ids;
    if (!decode_images(ex, &e) || !build_prompt(ex, &ids, &n_ids, &e))
        return http_respond_error(ex, c, &e) ? MHD_YES : MHD_NO;
    celer_request_params rp = celer_request_default_params();
    rp.prompt = ids;
    rp.n_prompt = n_ids;
    rp.max_tokens = r->max_tokens;
    rp.n = r->n;
    rp.sampling = r->sampling;
    if (!r->seed_given) rp.sampling.seed = random_seed();
    rp.presence_penalty = r->presence_penalty;
    rp.frequency_penalty = r->frequency_penalty;
    rp.bias_ids = r->bias_ids, rp.bias = r->bias, rp.n_bias = r->n_bias;
    rp.stop = (const char *const *)r->stop, rp.n_stop = r->n_stop;
    rp.ignore_eos = r->ignore_eos;
    rp.top_logprobs = r->logprobs ? r->top_logprobs : -1;
    rp.images = ex->images;
    rp.n_images = ex->n_images;
    rp.grammar = ex->tool_grammar ? ex->tool_grammar : r->grammar;
    rp.keep_special = ex->tools != NULL; /* the calls' markers may be special tokens */
    if (ex->tools) ex->tool_seed = random_seed();
    ex->choices = calloc((size_t)r->n, sizeof *ex->choices);
    bool streams_ok = true;
    for (int32_t i = 0; ex->choices && ex->tools && r->stream && i < r->n; i++)
        streams_ok &= (ex->choices[i].ts = tool_stream_create(s->tool_fmt, ex->tools,
                                                              ex->tool_seed + (uint64_t)i)) != NULL;
    if (!ex->choices || !streams_ok) {
        free(ids);
        request_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        return http_respond_error(ex, c, &e) ? MHD_YES : MHD_NO;
    }
    for (int32_t i = 0; i < r->n && r->logprobs && !r->stream; i++)
        ex->choices[i].logprobs = chat ? json_array() : openai_completion_logprobs_new();
    if (atomic_load(&s->state) != SERVER_READY) {
        free(ids);
        request_fail(&e, 503, "unavailable_error", NULL, NULL, "the server is shutting down");
        return http_respond_error(ex, c, &e) ? MHD_YES : MHD_NO;
    }
    char err[512];
    const int32_t stop_id = chat && !r->ignore_eos ? s->stop_id : -1;
    const celer_status st = jobs_submit(s->js, &rp, stop_id, &ex->job, err, sizeof err);
    free(ids);
    /* The prompt as the engine counts it: each image token expands to the image's rows. */
    int64_t n_prompt = rp.n_prompt, rows = 0;
    for (int32_t k = 0; st == CELER_OK && k < ex->n_images; k++)
        if (celer_model_image_positions(s->model, ex->images[k], &rows, err, sizeof err) ==
            CELER_OK)
            n_prompt += rows - 1;
    release_images(ex); /* the engine holds its own references */
    if (st != CELER_OK) {
        submit_error(ex, st, err, &e);
        return http_respond_error(ex, c, &e) ? MHD_YES : MHD_NO;
    }
    ex->usage.prompt_tokens = n_prompt;
    openai_make_id(chat ? "chatcmpl-" : "cmpl-", ex->id, sizeof ex->id);
    ex->meta = (openai_meta){ex->id, (int64_t)time(NULL), s->model_name, chat};
    return r->stream ? stream_start(ex, c) : answer_whole(ex, c);
}

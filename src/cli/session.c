/*
 * session.c - what `celer generate` and `celer run` share: turning a conversation into
 * prompt ids through the model's chat template, and one reply: feeding new prompt ids
 * after what the cache already holds, then sampling and streaming tokens until EOS, the
 * token limit or a full context.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli/session.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int32_t *cli_chat_ids(const celer_model *m, const char *model_path, const celer_tokenizer *tok,
                      const cli_images *im, const char *messages_json, const char *template_kwargs,
                      int64_t *n) {
    char err[512], *prompt, *src, *bos, *eos;
    if (celer_chat_template_load(model_path, &src, &bos, &eos, err, sizeof err) != CELER_OK)
        cli_die("%s", err);
    if (celer_chat_template_render_vars(src, messages_json, template_kwargs, 1, bos, eos, &prompt,
                                        err, sizeof err) != CELER_OK)
        cli_die("%s", err);
    free(src), free(bos), free(eos);
    int32_t *ids = cli_tokenize(m, tok, im, prompt, false, n);
    free(prompt);
    return ids;
}

int32_t *cli_prompt_ids(const celer_model *m, const celer_tokenizer *tok, const char *model_path,
                        const cli_prompt_opts *o, int64_t *n) {
    int32_t *ids;
    if (o->no_template) {
        ids = cli_tokenize(m, tok, o->images, o->prompt, true, n);
    } else {
        json_t *msgs = json_array(), *sys = NULL, *user;
        if (o->images && o->images->n) {
            /* OpenAI-style parts: the images, then the text */
            json_t *parts = json_array();
            for (int i = 0; i < o->images->n; i++)
                json_array_append_new(parts, json_pack("{s:s}", "type", "image"));
            json_t *text = json_pack("{s:s, s:s}", "type", "text", "text", o->prompt);
            if (!text) cli_die("-p: the prompt is not valid UTF-8");
            json_array_append_new(parts, text);
            user = json_pack("{s:s, s:o}", "role", "user", "content", parts);
        } else {
            user = json_pack("{s:s, s:s}", "role", "user", "content", o->prompt);
        }
        if (o->system && !(sys = json_pack("{s:s, s:s}", "role", "system", "content", o->system)))
            cli_die("--system: the text is not valid UTF-8");
        if (!user) cli_die("-p: the prompt is not valid UTF-8");
        if (sys) json_array_append_new(msgs, sys);
        json_array_append_new(msgs, user);
        char *text = json_dumps(msgs, 0);
        json_decref(msgs);
        if (!text) cli_die("out of memory");
        ids = cli_chat_ids(m, model_path, tok, o->images, text, o->template_kwargs, n);
        free(text);
    }
    if (*n == 0) cli_die("-p: the prompt is empty");
    return ids;
}

void cli_session_open(cli_session *s, const cli_model_opts *o, celer_model *m, celer_tokenizer *tok,
                      const celer_sampler_params *sp, int64_t n_ctx) {
    char err[512];
    memset(s, 0, sizeof *s);
    s->model_path = o->model, s->m = m, s->tok = tok, s->sp = *sp, s->n_ctx = n_ctx;
    celer_engine_params ep = celer_engine_default_params();
    ep.n_seq_max = 1;
    ep.n_ctx = n_ctx;
    ep.n_threads = o->n_threads;
    ep.kv_type = o->kv_type;
    ep.device = o->device;
    if (celer_engine_create(m, tok, &ep, &s->eng, err, sizeof err) != CELER_OK) cli_die("%s", err);
    /* The eos_token of tokenizer_config.json stops generation too (chat models name their
     * end-of-turn token there). */
    s->stop = -1;
    char *src = NULL, *bos = NULL, *eos = NULL;
    if (tok &&
        celer_chat_template_load(s->model_path, &src, &bos, &eos, err, sizeof err) == CELER_OK &&
        eos) {
        int32_t *ids;
        int64_t n;
        if (celer_tokenize(tok, eos, strlen(eos), false, &ids, &n, err, sizeof err) == CELER_OK) {
            if (n == 1) s->stop = ids[0];
            free(ids);
        }
    }
    free(src), free(bos), free(eos);
}

void cli_session_close(cli_session *s) {
    celer_engine_destroy(s->eng);
}

/* What the reply loop keeps between engine events. */
typedef struct reply_state {
    const cli_session *s;
    bool print_ids, ignore_eos;
    int32_t *out;
    int64_t produced, cached;
    double t_first;
} reply_state;

static void on_event(void *user, const celer_event *ev) {
    reply_state *r = user;
    if (r->t_first == 0) r->t_first = cli_now();
    const bool ends_at_stop_id =
        ev->finish == CELER_FINISH_STOP && ev->token >= 0 && ev->text_len == 0 &&
        (ev->token == r->s->stop || (!r->ignore_eos && celer_model_is_eos(r->s->m, ev->token)));
    if (ev->token >= 0 && !ends_at_stop_id) {
        if (r->out) r->out[r->produced] = ev->token;
        r->produced++;
        if (r->print_ids) printf(r->produced > 1 ? " %d" : "%d", ev->token);
    }
    if (!r->print_ids) fwrite(ev->text, 1, ev->text_len, stdout);
    fflush(stdout);
    if (ev->finish != CELER_FINISH_NONE) r->cached = ev->cached_tokens;
}

int64_t cli_session_reply(cli_session *s, const int32_t *prompt, int64_t n, int64_t n_predict,
                          bool print_ids, bool ignore_eos, int32_t *out, cli_stats *st) {
    return cli_session_reply_images(s, prompt, n, NULL, n_predict, print_ids, ignore_eos, out, st);
}

int64_t cli_session_reply_images(cli_session *s, const int32_t *prompt, int64_t n,
                                 const cli_images *im, int64_t n_predict, bool print_ids,
                                 bool ignore_eos, int32_t *out, cli_stats *st) {
    char err[512];
    const int64_t n_full = im ? cli_images_expanded(im, s->m, prompt, n) : n;
    if (n_full > s->n_ctx - 1)
        cli_die("the prompt of %lld positions does not fit a context of %lld (pass a larger -c)",
                (long long)n_full, (long long)s->n_ctx);
    celer_request_params rp = celer_request_default_params();
    rp.prompt = prompt;
    rp.n_prompt = n;
    if (im) rp.images = im->img, rp.n_images = im->n;
    rp.max_tokens = n_predict;
    rp.sampling = s->sp;
    rp.ignore_eos = ignore_eos;
    rp.stop_ids = &s->stop;
    rp.n_stop_ids = s->stop >= 0 && !ignore_eos;
    rp.grammar = s->grammar;
    uint64_t id;
    if (celer_engine_submit(s->eng, &rp, &id, err, sizeof err) != CELER_OK) cli_die("%s", err);
    reply_state r = {.s = s, .print_ids = print_ids, .ignore_eos = ignore_eos, .out = out};
    const double t0 = cli_now();
    while (celer_engine_pending(s->eng))
        if (celer_engine_step(s->eng, on_event, &r) != CELER_OK)
            cli_die("%s", celer_engine_last_error(s->eng));
    const double t1 = cli_now();
    st->n_prompt = n_full - r.cached;
    st->t_prefill = r.t_first > 0 ? r.t_first - t0 : t1 - t0;
    st->n_gen = r.produced;
    st->t_decode = r.t_first > 0 ? t1 - r.t_first : 0;
    return r.produced;
}

void cli_stats_print(const cli_stats *st, double t_load) {
    fprintf(stderr, "\nprompt: %lld tokens, %.1f tok/s | generated: %lld tokens, %.1f tok/s",
            (long long)st->n_prompt, st->t_prefill > 0 ? (double)st->n_prompt / st->t_prefill : 0.0,
            (long long)st->n_gen,
            st->t_decode > 0 && st->n_gen > 1 ? (double)(st->n_gen - 1) / st->t_decode : 0.0);
    if (t_load >= 0) fprintf(stderr, " | load %.2f s", t_load);
    fprintf(stderr, "\n");
}

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

int32_t *cli_chat_ids(const char *model_path, const celer_tokenizer *tok, const char *messages_json, int64_t *n) {
    char err[512], *prompt, *src, *bos, *eos;
    int32_t *ids;
    if (celer_chat_template_load(model_path, &src, &bos, &eos, err, sizeof err) != CELER_OK) cli_die("%s", err);
    if (celer_chat_template_render(src, messages_json, 1, bos, eos, &prompt, err, sizeof err) != CELER_OK)
        cli_die("%s", err);
    free(src), free(bos), free(eos);
    if (celer_tokenize(tok, prompt, strlen(prompt), false, &ids, n, err, sizeof err) != CELER_OK) cli_die("%s", err);
    free(prompt);
    return ids;
}

int32_t *cli_prompt_ids(const celer_model *m, const celer_tokenizer *tok, const char *model_path,
                        const cli_prompt_opts *o, int64_t *n) {
    char err[512];
    int32_t *ids;
    (void)m;
    if (o->no_template) {
        if (celer_tokenize(tok, o->prompt, strlen(o->prompt), true, &ids, n, err, sizeof err) != CELER_OK)
            cli_die("%s", err);
    } else {
        json_t *msgs = json_array(), *sys = NULL, *user = json_pack("{s:s, s:s}", "role", "user", "content", o->prompt);
        if (o->system && !(sys = json_pack("{s:s, s:s}", "role", "system", "content", o->system)))
            cli_die("--system: the text is not valid UTF-8");
        if (!user) cli_die("-p: the prompt is not valid UTF-8");
        if (sys) json_array_append_new(msgs, sys);
        json_array_append_new(msgs, user);
        char *text = json_dumps(msgs, 0);
        json_decref(msgs);
        if (!text) cli_die("out of memory");
        ids = cli_chat_ids(model_path, tok, text, n);
        free(text);
    }
    if (*n == 0) cli_die("-p: the prompt is empty");
    return ids;
}

void cli_session_open(cli_session *s, const char *model_path, celer_model *m, celer_context *ctx, celer_tokenizer *tok,
                      const celer_sampler_params *sp, int64_t n_ctx) {
    char err[512];
    memset(s, 0, sizeof *s);
    s->model_path = model_path, s->m = m, s->ctx = ctx, s->tok = tok, s->n_ctx = n_ctx;
    const int64_t v = celer_model_n_vocab(m);
    s->logits = malloc(sizeof(float) * (size_t)v);
    s->cached = malloc(sizeof(int32_t) * (size_t)n_ctx);
    s->smp = celer_sampler_create(sp, v);
    if (!s->logits || !s->cached || !s->smp) cli_die("out of memory");
    if (tok && celer_detok_stream_create(tok, true, &s->ds, err, sizeof err) != CELER_OK) cli_die("%s", err);
    /* The eos_token of tokenizer_config.json stops generation too (chat models name their
     * end-of-turn token there). */
    s->stop = -1;
    char *src = NULL, *bos = NULL, *eos = NULL;
    if (tok && celer_chat_template_load(s->model_path, &src, &bos, &eos, err, sizeof err) == CELER_OK && eos) {
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
    celer_detok_stream_destroy(s->ds);
    celer_sampler_destroy(s->smp);
    free(s->logits);
    free(s->cached);
}

/* Feeds ids[from..n) to the model; the logits of the last row land in s->logits. */
static void feed(cli_session *s, const int32_t *ids, int64_t n) {
    celer_batch b = celer_batch_tokens(ids, n);
    if (celer_forward_last_logits(s->ctx, &b, n - 1, s->logits) != CELER_OK)
        cli_die("%s", celer_context_last_error(s->ctx));
    memcpy(s->cached + s->n_cached, ids, sizeof *ids * (size_t)n);
    s->n_cached += n;
}

int64_t cli_session_reply(cli_session *s, const int32_t *prompt, int64_t n, int64_t n_predict, bool print_ids,
                          bool ignore_eos, int32_t *out, cli_stats *st) {
    char err[512];
    /* Reuse the cached prefix the new prompt shares; otherwise start the sequence over. */
    int64_t keep = 0;
    while (keep < s->n_cached && keep < n && s->cached[keep] == prompt[keep]) keep++;
    if (keep < s->n_cached || keep == n) {
        celer_seq_reset(s->ctx, 0);
        s->n_cached = keep = 0;
    }
    if (n > s->n_ctx - 1)
        cli_die("the prompt of %lld tokens does not fit a context of %lld (pass a larger -c)", (long long)n, (long long)s->n_ctx);
    for (int64_t i = 0; i < n; i++) celer_sampler_accept(s->smp, prompt[i]);
    const double t0 = cli_now();
    feed(s, prompt + keep, n - keep);
    st->n_prompt = n - keep;
    st->t_prefill = cli_now() - t0;
    const double t1 = cli_now();
    int64_t produced = 0;
    while (n_predict < 0 || produced < n_predict) {
        int32_t t = celer_sampler_sample(s->smp, s->logits);
        celer_sampler_accept(s->smp, t);
        if (!ignore_eos && (celer_model_is_eos(s->m, t) || t == s->stop)) break;
        if (out) out[produced] = t;
        produced++;
        if (print_ids) {
            printf(produced > 1 ? " %d" : "%d", t);
        } else {
            const char *text;
            size_t len;
            if (celer_detok_stream_push(s->ds, t, &text, &len, err, sizeof err) != CELER_OK) cli_die("%s", err);
            fwrite(text, 1, len, stdout);
        }
        fflush(stdout);
        if (produced == n_predict || s->n_cached + 1 >= s->n_ctx) break;
        feed(s, &t, 1);
    }
    if (s->ds) {
        const char *text;
        size_t len;
        if (celer_detok_stream_flush(s->ds, &text, &len, err, sizeof err) == CELER_OK) fwrite(text, 1, len, stdout);
    }
    st->n_gen = produced;
    st->t_decode = cli_now() - t1;
    return produced;
}

void cli_stats_print(const cli_stats *st, double t_load) {
    fprintf(stderr, "\nprompt: %lld tokens, %.1f tok/s | generated: %lld tokens, %.1f tok/s",
            (long long)st->n_prompt, st->t_prefill > 0 ? (double)st->n_prompt / st->t_prefill : 0.0,
            (long long)st->n_gen, st->t_decode > 0 && st->n_gen > 1 ? (double)(st->n_gen - 1) / st->t_decode : 0.0);
    if (t_load >= 0) fprintf(stderr, " | load %.2f s", t_load);
    fprintf(stderr, "\n");
}

/*
 * session.h - prompt ids from a conversation, and the streaming reply loop shared by
 * `celer generate` and `celer run`.
 */
#ifndef CELER_CLI_SESSION_H
#define CELER_CLI_SESSION_H

#include "cli/cli.h"

double cli_now(void);

/* Prompt ids of an OpenAI-style messages array rendered by the model's chat template
 * with add_generation_prompt (malloc'd); dies on error. */
int32_t *cli_chat_ids(const char *model_path, const celer_tokenizer *tok, const char *messages_json, int64_t *n);

typedef struct cli_session {
    const char *model_path;
    celer_model *m;
    celer_context *ctx;
    celer_tokenizer *tok; /* NULL: ids only */
    celer_sampler *smp;
    celer_detok_stream *ds;
    float *logits;   /* [v] */
    int32_t *cached; /* [n_ctx] ids in sequence 0 of the cache */
    int64_t n_cached, n_ctx;
    int32_t stop; /* tokenizer_config.json's eos_token, or -1 */
} cli_session;

typedef struct cli_stats {
    int64_t n_prompt, n_gen;
    double t_prefill, t_decode;
} cli_stats;

void cli_session_open(cli_session *s, const char *model_path, celer_model *m, celer_context *ctx, celer_tokenizer *tok,
                      const celer_sampler_params *sp, int64_t n_ctx);
void cli_session_close(cli_session *s);

/* Feeds prompt[n] (reusing what the cache holds of it), then samples up to n_predict
 * tokens (-1: until EOS or the context is full), printing ids or streamed text. The
 * generated ids go to out (if not NULL, capacity n_predict or n_ctx). Returns their
 * count. */
int64_t cli_session_reply(cli_session *s, const int32_t *prompt, int64_t n, int64_t n_predict, bool print_ids,
                          bool ignore_eos, int32_t *out, cli_stats *st);

void cli_stats_print(const cli_stats *st, double t_load);

#endif

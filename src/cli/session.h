/*
 * session.h - prompt ids from a conversation, and the streaming reply shared by
 * `celer generate` and `celer run`: a thin client of the engine (celer.h), which owns
 * sampling, stop rules and the reuse of cached prompt blocks.
 */
#ifndef CELER_CLI_SESSION_H
#define CELER_CLI_SESSION_H

#include "cli/cli.h"

double cli_now(void);

/* Prompt ids of an OpenAI-style messages array rendered by the model's chat template
 * with add_generation_prompt and the extra variables of template_kwargs (a JSON object,
 * or NULL), then tokenized by cli_tokenize with the images of im (may be NULL) (malloc'd);
 * dies on error. */
int32_t *cli_chat_ids(const celer_model *m, const char *model_path, const celer_tokenizer *tok,
                      const cli_images *im, const char *messages_json, const char *template_kwargs,
                      int64_t *n);

typedef struct cli_session {
    const char *model_path;
    celer_model *m;
    celer_engine *eng;    /* one sequence; its prefix cache keeps earlier turns */
    celer_tokenizer *tok; /* NULL: ids only */
    celer_sampler_params sp;
    int64_t n_ctx;
    int32_t stop;        /* tokenizer_config.json's eos_token, or -1 */
    const char *grammar; /* GBNF every reply must follow (celer_request_params.grammar), or NULL */
} cli_session;

typedef struct cli_stats {
    int64_t n_prompt, n_gen;
    double t_prefill, t_decode;
} cli_stats;

/* Creates the session's engine for sequences of up to n_ctx positions; dies on error. */
void cli_session_open(cli_session *s, const cli_model_opts *o, celer_model *m, celer_tokenizer *tok,
                      const celer_sampler_params *sp, int64_t n_ctx);
void cli_session_close(cli_session *s);

/* Feeds prompt[n] (reusing the cached blocks of earlier turns), then samples up to
 * n_predict tokens (-1: until EOS or the context is full), printing ids or streamed text.
 * The generated ids go to out (if not NULL, capacity n_predict or n_ctx); an ending EOS
 * is not among them. Returns their count. */
int64_t cli_session_reply(cli_session *s, const int32_t *prompt, int64_t n, int64_t n_predict,
                          bool print_ids, bool ignore_eos, int32_t *out, cli_stats *st);

/* The same with the images of the prompt's image tokens (im may be NULL). */
int64_t cli_session_reply_images(cli_session *s, const int32_t *prompt, int64_t n,
                                 const cli_images *im, int64_t n_predict, bool print_ids,
                                 bool ignore_eos, int32_t *out, cli_stats *st);

void cli_stats_print(const cli_stats *st, double t_load);

#endif

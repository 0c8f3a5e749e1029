/*
 * cli.h - shared pieces of the celer subcommands: option parsing helpers, opening a
 * model and context from common flags, and failing with one clear line.
 * Only the public API (celer.h) is used here, as an outside program would.
 */
#ifndef CELER_CLI_H
#define CELER_CLI_H

#include "celer.h"

#include <stdbool.h>
#include <stdint.h>

/* Prints "celer: <message>" on stderr and exits 1. */
void cli_die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* "1,2,3" -> ids (malloc'd, caller frees); dies with a message on bad input. */
int32_t *cli_parse_ids(const char *s, int64_t *n);
/* Strict decimal integer; dies naming the flag on bad input. */
int64_t cli_parse_int(const char *flag, const char *s);
double cli_parse_num(const char *flag, const char *s);

/* The flags every model command takes. */
typedef struct cli_model_opts {
    const char *model;
    int32_t n_threads; /* -t */
    int64_t n_ctx;     /* -c, 0 = fit the request */
} cli_model_opts;

/* Consumes argv[*i] (and its value) when it is -m/-t/-c; returns true if it did. */
bool cli_model_flag(cli_model_opts *o, int argc, char **argv, int *i);

/* Opens o->model and a one-sequence context of at least n_ctx positions; dies on error. */
void cli_open(const cli_model_opts *o, int64_t n_ctx, celer_model **m, celer_context **ctx);

/* Writes data[rows, cols] as a float32 little-endian C-order .npy file (version 1.0). */
int npy_write_f32(const char *path, const float *data, int64_t rows, int64_t cols);

int cmd_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);

#endif

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
/* Whether the arguments ask for help (-h, --help); then usage has gone to stdout. A command
 * returns 0 right after. */
bool cli_help(int argc, char **argv, const char *usage);
/* The whole of path, NUL-terminated (*len bytes before the NUL; len may be NULL); malloc'd.
 * Dies naming the file on error. */
char *cli_read_file(const char *path, size_t *len);
/* Strict decimal integer; dies naming the flag on bad input. */
int64_t cli_parse_int(const char *flag, const char *s);
double cli_parse_num(const char *flag, const char *s);

/* The flags every model command takes. */
typedef struct cli_model_opts {
    const char *model;
    int32_t n_threads;   /* -t */
    int64_t n_ctx;       /* -c, 0 = fit the request */
    const char *kv_type; /* --cache-type f16|f32, NULL = the default (f16) */
    const char *device;  /* --device cpu|cuda[:N], NULL = $CELER_DEVICE or cpu */
} cli_model_opts;

/* Consumes argv[*i] (and its value) when it is -m/-t/-c/--cache-type/--device; returns
 * true if it did. */
bool cli_model_flag(cli_model_opts *o, int argc, char **argv, int *i);

/* A -m value: a path that exists, or a model name ORG/NAME[:QUANT][@REV] found in the
 * Hugging Face cache (celer_model_resolve) or else downloaded from the Hub into it
 * (celer_model_pull; not with HF_HUB_OFFLINE=1), as a path in static storage (a command
 * opens one model: the last call's path); dies with one line when neither finds it. */
const char *cli_model_path(const char *arg);

/* celer_pull_progress for the command line: one line per file on stderr, redrawn in place,
 * when stderr is a terminal; nothing otherwise. */
void cli_pull_progress(void *user, const char *file, int64_t done, int64_t total, bool finished);

/* The default model's path (${CELER_CACHE_DIR:-~/.cache/celer}/SmolLM2-135M-Instruct.Q4_1.gguf,
 * where tools/fetch_model.sh puts it) in a static buffer; dies with a hint when absent. */
const char *cli_default_model(void);

/* Opens o->model and a one-sequence context of at least n_ctx positions; dies on error. */
void cli_open(const cli_model_opts *o, int64_t n_ctx, celer_model **m, celer_context **ctx);
celer_model *cli_open_model(const cli_model_opts *o);
celer_context *cli_open_context(const cli_model_opts *o, celer_model *m, int64_t n_ctx);
/* The model's tokenizer: tokenizer.json beside the weights, or the GGUF metadata. */
celer_tokenizer *cli_open_tokenizer(const char *model_path);

/* The KV cache size for a prompt of n_prompt tokens and n_predict more (-1: as many as
 * fit): -c when given (dies if too small), else what the request needs, capped at
 * 4096 or the training context. */
int64_t cli_context_size(const cli_model_opts *o, const celer_model *m, int64_t n_prompt,
                         int64_t n_predict);

/* --image FILE, repeatable: the images of a vision-language prompt, in prompt order. */
#define CLI_MAX_IMAGES 8
typedef struct cli_images {
    const char *path[CLI_MAX_IMAGES];
    celer_image *img[CLI_MAX_IMAGES];
    int n;
} cli_images;

/* Prompt flags: -p/--prompt, --system, --no-chat-template, --chat-template-kwargs. */
typedef struct cli_prompt_opts {
    const char *prompt;
    const char *system;
    bool no_template;
    const cli_images *images;    /* image parts placed before the text of the user turn, or NULL */
    const char *template_kwargs; /* extra template variables, a JSON object, or NULL */
} cli_prompt_opts;

bool cli_prompt_flag(cli_prompt_opts *o, int argc, char **argv, int *i);
/* The value of --chat-template-kwargs: dies unless text is a JSON object (the template's
 * extra variables, {"enable_thinking": false}, as llama-server's flag of that name). */
const char *cli_template_kwargs(const char *text);
/* Sampling flags: --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n, --seed. */
bool cli_sampler_flag(celer_sampler_params *p, int argc, char **argv, int *i);

/* The prompt's token ids (malloc'd): the chat template applied to one user turn (and the
 * system text; an image part per o->images before the text) unless o->no_template, then
 * tokenized (cli_tokenize). Dies on error. */
int32_t *cli_prompt_ids(const celer_model *m, const celer_tokenizer *tok, const char *model_path,
                        const cli_prompt_opts *o, int64_t *n);

bool cli_image_flag(cli_images *im, int argc, char **argv, int *i);
/* Decodes every --image for m; dies when m reads no images or a file is bad. */
void cli_images_load(cli_images *im, const celer_model *m);
void cli_images_free(cli_images *im);
/* The prompt's length once each image token of ids[n] expands to its block's rows (an
 * image takes celer_model_image_blocks tokens); dies when the image tokens and the images
 * do not pair up. */
int64_t cli_images_expanded(const cli_images *im, const celer_model *m, const int32_t *ids,
                            int64_t n);
/* The ids (malloc'd) of text, its image markers first rewritten as m's processor does
 * (celer_model_image_text, with the images of im, which may be NULL); dies on error. */
int32_t *cli_tokenize(const celer_model *m, const celer_tokenizer *tok, const cli_images *im,
                      const char *text, bool add_special, int64_t *n);

/* Writes data[rows, cols] as a float32 little-endian C-order .npy file (version 1.0). */
int npy_write_f32(const char *path, const float *data, int64_t rows, int64_t cols);

int cmd_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_ls(int argc, char **argv);
int cmd_pull(int argc, char **argv);

#endif

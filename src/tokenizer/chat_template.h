/*
 * chat_template.h - chat templates: the Jinja subset that model chat templates use, parsed
 * once and rendered over an OpenAI-style messages array into a prompt string.
 *
 * Rendering follows transformers' environment (trim_blocks and lstrip_blocks on, the
 * sandbox's immutable lists and dicts, raise_exception, strftime_now, a tojson that keeps
 * non-ASCII text) and what apply_chat_template does to the messages first (a message's
 * reasoning, under any of reasoning_content, thinking and reasoning, is given under the
 * first two). A construct, filter, test or method outside the subset is an error that
 * names the template line and column; it is never skipped. Loops, recursion and output
 * size are bounded. Not here: template inheritance, include/import, autoescaping and
 * call blocks. The parser is chat_template_parse.c, the evaluator chat_template.c, and
 * chat_template_load.c finds a model's template (here for directories, tok_gguf.h for
 * .gguf files) and holds the public API of celer.h.
 */
#ifndef CELER_TOKENIZER_CHAT_TEMPLATE_H
#define CELER_TOKENIZER_CHAT_TEMPLATE_H

#include "base/error.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct chat_template chat_template;

typedef struct chat_template_opts {
    bool add_generation_prompt;
    const char *bos_token; /* NULL: undefined in the template */
    const char *eos_token;
    const json_t *vars;    /* an object of extra globals (tools, enable_thinking, ...), or NULL */
    int64_t now;           /* seconds since the epoch for strftime_now; 0 = 2024-07-26 00:00 UTC */
} chat_template_opts;

/* Parses src[len]. On failure *out is NULL and e reads "template line L column C: ...".
 * Free with chat_template_free. */
celer_status chat_template_parse(const char *src, size_t len, chat_template **out, celer_error *e);
void chat_template_free(chat_template *t);

/* Renders t over messages (a JSON array of message objects). *out (NUL-terminated,
 * *out_len bytes) is malloc'd; the caller frees it. A raise_exception in the template
 * fails with its message. A template may be rendered by several threads at once. */
celer_status chat_template_render(const chat_template *t, const json_t *messages,
                                  const chat_template_opts *o, char **out, size_t *out_len,
                                  celer_error *e);

/* The template of a model directory: dir/chat_template.jinja when present, otherwise the
 * chat_template field of dir/tokenizer_config.json (a string, or a list of {name,
 * template} of which "default" is used), with bos_token / eos_token from that file
 * (strings or {"content": ...}). Each out string is malloc'd (NULL when absent); the
 * caller frees them. A missing template is an error naming the directory. */
celer_status chat_template_from_dir(const char *dir, char **template_src, char **bos_token,
                                    char **eos_token, celer_error *e);

#endif

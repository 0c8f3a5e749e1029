/*
 * tok_gguf.h - a tokenizer and a chat template from a GGUF file's tokenizer.* metadata.
 */
#ifndef CELER_TOKENIZER_TOK_GGUF_H
#define CELER_TOKENIZER_TOK_GGUF_H

#include "tokenizer/tokenizer.h"

/* The tokenizer of the GGUF file at path; *out NULL on failure. Free with tok_free. */
celer_status tok_load_gguf(const char *path, tokenizer **out, celer_error *e);

/* The chat template (tokenizer.chat_template) of the GGUF file at path, with the text of
 * its BOS and EOS tokens. Each out string is malloc'd (NULL when absent); the caller
 * frees them. A file without a template is an error naming it. */
celer_status chat_template_from_gguf(const char *path, char **template_src, char **bos_token,
                                     char **eos_token, celer_error *e);

#endif

/*
 * tok_gguf.h - loading a tokenizer from a GGUF file's tokenizer.ggml.* metadata.
 */
#ifndef CELER_TOKENIZER_TOK_GGUF_H
#define CELER_TOKENIZER_TOK_GGUF_H

#include "tokenizer/tokenizer.h"

/* The tokenizer of the GGUF file at path; *out NULL on failure. Free with tok_free. */
celer_status tok_load_gguf(const char *path, tokenizer **out, celer_error *e);

#endif

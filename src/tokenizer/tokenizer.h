/*
 * tokenizer.h - text <-> token ids from a Hugging Face tokenizer.json.
 *
 * Supports the pipelines of the Llama 2/3, Mistral, Qwen2/3 and SmolLM2 tokenizers:
 * added tokens, normalizers (NFC, NFKC, Prepend, Replace, Sequence), pre-tokenizers
 * (Split under PCRE2, ByteLevel, Metaspace, Digits, Sequence), the BPE model with byte
 * fallback, TemplateProcessing / ByteLevel post-processors, and the matching decoders.
 * Anything else in a tokenizer.json is refused at load time with the JSON path of the
 * component, never ignored. WordPiece, Unigram and chat templates are not here.
 *
 * A loaded tokenizer is immutable: several threads may encode and decode at once.
 */
#ifndef CELER_TOKENIZER_TOKENIZER_H
#define CELER_TOKENIZER_TOKENIZER_H

#include "base/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tokenizer tokenizer;

/* path: a tokenizer.json file or a directory holding one. On failure *out is NULL and e
 * names the file and the JSON path at fault. Free with tok_free. */
celer_status tok_load(const char *path, tokenizer **out, celer_error *e);
/* The same from a JSON document in memory; name is used in messages. */
celer_status tok_load_json(const char *json, size_t len, const char *name, tokenizer **out,
                           celer_error *e);
void tok_free(tokenizer *t);

/* text[len] (UTF-8; anything else is an error) -> *ids[*n], malloc'd, caller frees.
 * add_special applies the post-processor (BOS for Llama); added tokens in the text are
 * matched either way, as Hugging Face does. */
celer_status tok_encode(const tokenizer *t, const char *text, size_t len, bool add_special,
                        int32_t **ids, int64_t *n, celer_error *e);

/* ids[n] -> *text (NUL-terminated, *len bytes without the NUL), malloc'd, caller frees.
 * Invalid UTF-8 produced by byte tokens becomes U+FFFD as in Hugging Face. skip_special
 * drops special added tokens. An id outside the vocabulary is an error. */
celer_status tok_decode(const tokenizer *t, const int32_t *ids, int64_t n, bool skip_special,
                        char **text, size_t *len, celer_error *e);

int64_t tok_vocab_size(const tokenizer *t);
/* The id of a token string (added tokens first), or -1. */
int32_t tok_token_to_id(const tokenizer *t, const char *token, size_t len);
/* The token string of id (NUL-terminated, valid until tok_free), or NULL. */
const char *tok_id_to_token(const tokenizer *t, int32_t id);
bool tok_is_special(const tokenizer *t, int32_t id);

/* For every id, the raw bytes it appends to decoded text in the middle of a stream
 * (ByteLevel's byte map undone, U+2581 -> space, byte-fallback <0xAB> -> that byte; a
 * special token or an unused id: 0 bytes): (*bytes)[id][(*len)[id]], not NUL-terminated,
 * for tok_vocab_size(t) ids. What a grammar mask matches tokens against. Free both with
 * tok_vocab_bytes_free. */
celer_status tok_vocab_bytes(const tokenizer *t, char ***bytes, size_t **len, celer_error *e);
void tok_vocab_bytes_free(char **bytes, size_t *len);

/* The tokenizer behind a public handle (celer.h), for the layers above this one. */
struct celer_tokenizer;
const tokenizer *tok_of(const struct celer_tokenizer *t);

/* ==== Streaming detokenizer ==== */

/* Turns ids arriving one at a time into text that never ends inside a UTF-8 sequence:
 * incomplete trailing bytes are held back until a later id completes them. */
typedef struct tok_stream tok_stream;

celer_status tok_stream_create(const tokenizer *t, bool skip_special, tok_stream **out,
                               celer_error *e);
void tok_stream_destroy(tok_stream *s);
/* Adds one id; *text (owned by s, valid until the next call) receives the newly complete
 * text, possibly "" (*len = 0). */
celer_status tok_stream_push(tok_stream *s, int32_t id, const char **text, size_t *len,
                             celer_error *e);
/* Ends the stream: held-back bytes that never completed come out as U+FFFD. */
celer_status tok_stream_flush(tok_stream *s, const char **text, size_t *len, celer_error *e);

#endif

/*
 * celer_tokenizer.c - the public tokenizer API of celer.h over tokenizer.h. Adds
 * nothing but the choice of source (a .gguf file or tokenizer.json) and the translation
 * of errors into the caller's buffer.
 */
#include "tokenizer/tok_gguf.h"
#include "tokenizer/tokenizer.h"

#include <string.h>

#include <stdlib.h>

struct celer_tokenizer {
    tokenizer *t;
};

celer_status celer_tokenizer_open(const char *path, celer_tokenizer **out, char *err,
                                  size_t err_size) {
    celer_error e = {{0}};
    *out = NULL;
    celer_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) {
        error_set(&e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        error_copy(&e, err, err_size);
        return CELER_STATUS_OUT_OF_MEMORY;
    }
    /* A .gguf file carries its tokenizer in its metadata. */
    const size_t n = strlen(path);
    const bool gguf = n > 5 && strcmp(path + n - 5, ".gguf") == 0;
    celer_status st = gguf ? tok_load_gguf(path, &tok->t, &e) : tok_load(path, &tok->t, &e);
    if (st != CELER_OK) {
        free(tok);
        error_copy(&e, err, err_size);
        return st;
    }
    *out = tok;
    return CELER_OK;
}

void celer_tokenizer_close(celer_tokenizer *tok) {
    if (!tok) return;
    tok_free(tok->t);
    free(tok);
}

celer_status celer_tokenize(const celer_tokenizer *tok, const char *text, size_t len,
                            bool add_special, int32_t **ids, int64_t *n, char *err,
                            size_t err_size) {
    celer_error e = {{0}};
    celer_status st = tok_encode(tok->t, text, len, add_special, ids, n, &e);
    if (st != CELER_OK) error_copy(&e, err, err_size);
    return st;
}

celer_status celer_detokenize(const celer_tokenizer *tok, const int32_t *ids, int64_t n,
                              bool skip_special, char **text, size_t *len, char *err,
                              size_t err_size) {
    celer_error e = {{0}};
    celer_status st = tok_decode(tok->t, ids, n, skip_special, text, len, &e);
    if (st != CELER_OK) error_copy(&e, err, err_size);
    return st;
}

int64_t celer_tokenizer_n_vocab(const celer_tokenizer *tok) {
    return tok_vocab_size(tok->t);
}

const tokenizer *tok_of(const celer_tokenizer *tok) {
    return tok->t;
}

/* ==== Streaming detokenization ==== */

struct celer_detok_stream {
    tok_stream *s;
};

celer_status celer_detok_stream_create(const celer_tokenizer *tok, bool skip_special,
                                       celer_detok_stream **out, char *err, size_t err_size) {
    celer_error e = {{0}};
    *out = calloc(1, sizeof **out);
    if (!*out) {
        error_copy(&(celer_error){"out of memory"}, err, err_size);
        return CELER_STATUS_OUT_OF_MEMORY;
    }
    celer_status st = tok_stream_create(tok->t, skip_special, &(*out)->s, &e);
    if (st != CELER_OK) {
        free(*out);
        *out = NULL;
        error_copy(&e, err, err_size);
    }
    return st;
}

void celer_detok_stream_destroy(celer_detok_stream *s) {
    if (!s) return;
    tok_stream_destroy(s->s);
    free(s);
}

celer_status celer_detok_stream_push(celer_detok_stream *s, int32_t id, const char **text,
                                     size_t *len, char *err, size_t err_size) {
    celer_error e = {{0}};
    celer_status st = tok_stream_push(s->s, id, text, len, &e);
    if (st != CELER_OK) error_copy(&e, err, err_size);
    return st;
}

celer_status celer_detok_stream_flush(celer_detok_stream *s, const char **text, size_t *len,
                                      char *err, size_t err_size) {
    celer_error e = {{0}};
    celer_status st = tok_stream_flush(s->s, text, len, &e);
    if (st != CELER_OK) error_copy(&e, err, err_size);
    return st;
}

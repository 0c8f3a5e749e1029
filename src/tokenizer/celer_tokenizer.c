/*
 * celer_tokenizer.c - the public tokenizer API of celer.h over tokenizer.h. Adds
 * nothing but the translation of errors into the caller's buffer.
 */
#include "tokenizer/tokenizer.h"

#include <stdlib.h>

struct celer_tokenizer {
    tokenizer *t;
};

celer_status celer_tokenizer_open(const char *path, celer_tokenizer **out, char *err, size_t err_size) {
    celer_error e = {{0}};
    *out = NULL;
    celer_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) {
        error_set(&e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        error_copy(&e, err, err_size);
        return CELER_STATUS_OUT_OF_MEMORY;
    }
    celer_status st = tok_load(path, &tok->t, &e);
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

celer_status celer_tokenize(const celer_tokenizer *tok, const char *text, size_t len, bool add_special,
                            int32_t **ids, int64_t *n, char *err, size_t err_size) {
    celer_error e = {{0}};
    celer_status st = tok_encode(tok->t, text, len, add_special, ids, n, &e);
    if (st != CELER_OK) error_copy(&e, err, err_size);
    return st;
}

celer_status celer_detokenize(const celer_tokenizer *tok, const int32_t *ids, int64_t n, bool skip_special,
                              char **text, size_t *len, char *err, size_t err_size) {
    celer_error e = {{0}};
    celer_status st = tok_decode(tok->t, ids, n, skip_special, text, len, &e);
    if (st != CELER_OK) error_copy(&e, err, err_size);
    return st;
}

int64_t celer_tokenizer_n_vocab(const celer_tokenizer *tok) { return tok_vocab_size(tok->t); }

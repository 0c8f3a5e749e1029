/*
 * error.h - the three error tiers of docs/architecture.md ("Errors"), below everything else.
 *
 * CELER_ASSERT is for programmer bugs (prints file:line, aborts). Recoverable
 * conditions return a celer_status and leave one detailed line in a celer_error the
 * caller owns. This module does not print anything except on an assertion failure.
 */
#ifndef CELER_BASE_ERROR_H
#define CELER_BASE_ERROR_H

#include "celer.h"

#include <stddef.h>

#define CELER_ERROR_LEN 512

typedef struct celer_error {
    char msg[CELER_ERROR_LEN];
} celer_error;

/* Formats a message into e (if not NULL) and returns s, so callers write
 * `return error_set(e, CELER_STATUS_BAD_FILE, "%s: ...", path);`. */
celer_status error_set(celer_error *e, celer_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Copies e's message into a caller buffer (err may be NULL). */
void error_copy(const celer_error *e, char *err, size_t err_size);

void celer_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

#define CELER_ASSERT(x) ((x) ? (void)0 : celer_assert_fail(#x, __FILE__, __LINE__))

#endif

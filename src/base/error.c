/*
 * error.c - status names, error messages and the assertion handler.
 */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const status_names[CELER_STATUS_COUNT_] = {
    [CELER_OK] = "ok",
    [CELER_STATUS_INVALID_ARGUMENT] = "invalid argument",
    [CELER_STATUS_IO] = "i/o error",
    [CELER_STATUS_BAD_FILE] = "bad file",
    [CELER_STATUS_BAD_CONFIG] = "bad config",
    [CELER_STATUS_UNSUPPORTED] = "unsupported",
    [CELER_STATUS_CONTEXT_FULL] = "context full",
    [CELER_STATUS_OUT_OF_MEMORY] = "out of memory",
    [CELER_STATUS_BUSY] = "busy",
    [CELER_STATUS_NOT_FOUND] = "not found",
    [CELER_STATUS_DEVICE] = "device error",
    [CELER_STATUS_DEVICE_LOST] = "device lost",
    [CELER_STATUS_NETWORK] = "network error",
};

const char *celer_status_str(celer_status s) {
    if ((int)s < 0 || s >= CELER_STATUS_COUNT_) return "unknown status";
    return status_names[s];
}

celer_status error_set(celer_error *e, celer_status s, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return s;
}

void error_copy(const celer_error *e, char *err, size_t err_size) {
    if (!err || err_size == 0) return;
    snprintf(err, err_size, "%s", e->msg);
}

void celer_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "%s:%d: assertion failed: %s\n", file, line, expr);
    abort();
}

/*
 * fault.c - a backend's failure state (backend.h, "Failures"): the first failure wins,
 * and CELER_FAULT_STEP, the test knob that makes a chosen step fail on purpose so the
 * callers' error paths can be checked on any machine.
 *
 * It knows no device: a GPU backend classifies its own errors (sticky or not) and injects
 * a real one of the kind asked; a host backend only marks the step failed.
 */
#include "backend/backend.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void backend_fail(backend_fault *f, celer_status s, bool sticky, const char *fmt, ...) {
    CELER_ASSERT(s != CELER_OK);
    if (f->status != CELER_OK) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->msg, sizeof f->msg, fmt, ap);
    va_end(ap);
    f->status = s;
    f->sticky = sticky;
}

void backend_fault_init(backend_fault *f) {
    f->inject_step = 0;
    const char *v = getenv("CELER_FAULT_STEP");
    if (!v || !*v) return;
    static const char *const kinds[] = {[BACKEND_FAULT_ERROR] = "error", [BACKEND_FAULT_OOM] = "oom",
                                        [BACKEND_FAULT_STICKY] = "sticky"};
    char *end;
    const long long n = strtoll(v, &end, 10);
    int kind = *end ? -1 : BACKEND_FAULT_ERROR;
    for (int k = 0; *end == ':' && k < (int)(sizeof kinds / sizeof *kinds); k++)
        if (!strcmp(end + 1, kinds[k])) kind = k;
    if (n < 1 || kind < 0) {
        fprintf(stderr, "celer: CELER_FAULT_STEP=\"%s\" ignored: expected N[:error|:oom|:sticky], N >= 1\n", v);
        return;
    }
    f->inject_step = n;
    f->inject_kind = (backend_fault_kind)kind;
}

bool backend_fault_step(backend_fault *f) { return ++f->steps == f->inject_step; }

void backend_host_begin(backend *be, int64_t rows) {
    (void)rows;
    backend_fault *f = &be->fault;
    if (!backend_fault_step(f)) return;
    static const celer_status status[] = {[BACKEND_FAULT_ERROR] = CELER_STATUS_DEVICE,
                                          [BACKEND_FAULT_OOM] = CELER_STATUS_OUT_OF_MEMORY,
                                          [BACKEND_FAULT_STICKY] = CELER_STATUS_DEVICE_LOST};
    backend_fail(f, status[f->inject_kind], f->inject_kind == BACKEND_FAULT_STICKY,
                 "cpu (%s): step %lld failed on purpose (CELER_FAULT_STEP)%s", be->kernels, (long long)f->steps,
                 f->inject_kind == BACKEND_FAULT_STICKY ? "; the device is unusable" : "");
}

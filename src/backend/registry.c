/*
 * registry.c - the backend classes built into this binary and the device strings that
 * name them ("cpu", "cuda", "cuda:1").
 */
#include "backend/backend.h"

#include "backend/cpu/backend_cpu.h"
#ifdef CELER_CUDA
#include "backend/cuda/backend_cuda.h"
#endif

#include <stdlib.h>
#include <string.h>

static const backend_class *const classes[] = {
    &backend_cpu_class,
#ifdef CELER_CUDA
    &backend_cuda_class,
#endif
    NULL,
};

const backend_class *const *backend_classes(void) { return classes; }

celer_status backend_find(const char *device, const backend_class **cls, int *index, celer_error *e) {
    if (!device || !*device) device = "cpu";
    const char *colon = strchr(device, ':');
    const size_t len = colon ? (size_t)(colon - device) : strlen(device);
    int i = 0;
    if (colon) {
        char *end;
        const long v = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || *end || v < 0 || v > 1024)
            return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "device \"%s\": expected cpu, cuda or cuda:N", device);
        i = (int)v;
    }
    for (const backend_class *const *c = classes; *c; c++) {
        if (strlen((*c)->name) != len || strncmp((*c)->name, device, len) != 0) continue;
        celer_error why = {{0}};
        const int n = (*c)->device_count(&why);
        if (n == 0)
            return error_set(e, CELER_STATUS_UNSUPPORTED, "device \"%s\": no %s device found%s%s", device,
                             (*c)->name, why.msg[0] ? ": " : "", why.msg);
        if (i >= n)
            return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "device \"%s\": this machine has %d %s device%s",
                             device, n, (*c)->name, n == 1 ? "" : "s");
        *cls = *c;
        *index = i;
        return CELER_OK;
    }
    if (len == 4 && !strncmp(device, "cuda", 4))
        return error_set(e, CELER_STATUS_UNSUPPORTED,
                         "device \"%s\": this build has no CUDA backend (nvcc was not found, or CUDA=0)", device);
    return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "device \"%s\": expected cpu, cuda or cuda:N", device);
}

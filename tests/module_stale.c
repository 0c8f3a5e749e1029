/*
 * module_stale.c - a backend module as another build would leave it, for test_module: its
 * entry point is the real one's, its interface number is not this build's.
 */
#include "backend/module.h"

const backend_module *celer_backend_module(void);

const backend_module *celer_backend_module(void) {
    static const backend_module stale = {CELER_MODULE_ABI + 1u, NULL};
    return &stale;
}

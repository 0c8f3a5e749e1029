/*
 * module.h - what a backend module (build/celer-cuda.so) and the binary that loads it agree
 * on: the one symbol the module exports and the interface number both were built with.
 *
 * The registry dlopen()s a module the first time a device string or a device list names its
 * class (registry.c), calls BACKEND_MODULE_ENTRY and uses the class only when the module's
 * abi equals its own CELER_MODULE_ABI. That number is not written by hand: the Makefile
 * derives it from the text of every header the two sides share (this one, backend.h, the
 * base headers, celer.h) and from the list of functions the binary exports to modules
 * (module.dynlist), so a module from a build with any other interface is refused in one
 * line instead of calling through a struct laid out differently.
 *
 * The module calls back into the binary for the few base functions it uses (error_set,
 * celer_assert_fail, ...): the binary exports exactly those (module.dynlist, checked when the
 * module is linked), so every symbol has one definition in the running process.
 */
#ifndef CELER_BACKEND_MODULE_H
#define CELER_BACKEND_MODULE_H

#include "backend/backend.h"

#include <stdint.h>

#ifndef CELER_MODULE_ABI
#error "CELER_MODULE_ABI comes from the Makefile (a digest of the shared headers)"
#endif

/* The name of the one function a module exports. */
#define BACKEND_MODULE_ENTRY "celer_backend_module"

/* What the entry point returns. abi stays the first field in every build, so a binary can
 * read it from a module of any other build. */
typedef struct backend_module {
    uint32_t abi;             /* CELER_MODULE_ABI of the build that made the module */
    const backend_class *cls; /* the class it holds ("cuda"), static in the module */
} backend_module;

typedef const backend_module *(*backend_module_entry)(void);

#endif

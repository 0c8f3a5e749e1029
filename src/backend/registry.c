/*
 * registry.c - the backend classes this build knows and the device strings that name them
 * ("cpu", "cuda", "cuda:1").
 *
 * The CPU class is built in. The CUDA class lives in a module, celer-cuda.so beside the
 * executable (the directory of /proc/self/exe) or the file $CELER_CUDA_MODULE names, which
 * is dlopen()ed the first time a device string or a device list asks for "cuda": a CPU run
 * never maps it nor any CUDA library. A module that is missing, lacks the entry point or
 * comes from another build (module.h) is one line in the caller's error, never a crash; the
 * outcome is kept, so the module is tried once a process. A loaded module is never closed.
 */
#define _POSIX_C_SOURCE 200809L

#include "backend/backend.h"

#include "backend/cpu/backend_cpu.h"
#include "backend/module.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A class in a module, loaded on first use. */
typedef struct module_class {
    const char *name;         /* its device strings' name: "cuda" */
    const char *label;        /* in messages: "CUDA" */
    const char *file;         /* the module's file name beside the executable; NULL: not built */
    const char *env;          /* the variable naming another path (tests, another build's module) */
    bool tried;               /* under module_lock */
    const backend_class *cls; /* once loaded */
    celer_error why;          /* else why not, one line */
} module_class;

static module_class cuda_module = {
    .name = "cuda",
    .label = "CUDA",
#ifdef CELER_CUDA
    .file = "celer-cuda.so",
#endif
    .env = "CELER_CUDA_MODULE",
};

/* The classes after the host class, in device-list order. */
static module_class *const modules[] = {&cuda_module};
#define N_CLASSES (1 + (int)(sizeof modules / sizeof *modules))

static pthread_mutex_t module_lock = PTHREAD_MUTEX_INITIALIZER;

/* The module's path: $env as given (a bare name made relative to the working directory,
 * not looked up in the library path), else m->file in the executable's directory; false
 * where the executable's path cannot be read or the path is too long. */
static bool module_path(const module_class *m, char *out, size_t size) {
    const char *env = getenv(m->env);
    if (env && *env)
        return snprintf(out, size, "%s%s", strchr(env, '/') ? "" : "./", env) < (int)size;
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0 || n >= (ssize_t)sizeof exe - 1) return false;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash) return false;
    *slash = '\0';
    return snprintf(out, size, "%s/%s", exe, m->file) < (int)size;
}

/* dlerror's message without the path it often starts with (the caller's line names it). */
static const char *dl_reason(const char *path) {
    const char *msg = dlerror();
    if (!msg) return "unknown error";
    const size_t n = strlen(path);
    return !strncmp(msg, path, n) && !strncmp(msg + n, ": ", 2) ? msg + n + 2 : msg;
}

static void module_load(module_class *m) {
    if (!m->file) {
        error_set(&m->why, CELER_STATUS_UNSUPPORTED,
                  "this build has no %s backend (nvcc was not found, or CUDA=0)", m->label);
        return;
    }
    char path[4096];
    if (!module_path(m, path, sizeof path)) {
        error_set(&m->why, CELER_STATUS_UNSUPPORTED,
                  "the %s module %s could not be found: the executable's path is unreadable or too "
                  "long (set %s)",
                  m->label, m->file, m->env);
        return;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        error_set(&m->why, CELER_STATUS_UNSUPPORTED, "the %s module %s could not be loaded: %s",
                  m->label, path, dl_reason(path));
        return;
    }
    backend_module_entry entry;
    /* POSIX's way from dlsym's void * to a function pointer */
    *(void **)&entry = dlsym(h, BACKEND_MODULE_ENTRY);
    if (!entry) {
        error_set(&m->why, CELER_STATUS_UNSUPPORTED, "the %s module %s could not be loaded: %s",
                  m->label, path, dl_reason(path));
        dlclose(h);
        return;
    }
    const backend_module *mod = entry();
    if (!mod || mod->abi != CELER_MODULE_ABI) {
        error_set(&m->why, CELER_STATUS_UNSUPPORTED,
                  "the %s module %s is from another build (interface %u, this binary's %u): "
                  "rebuild both with make",
                  m->label, path, mod ? (unsigned)mod->abi : 0u, (unsigned)CELER_MODULE_ABI);
        dlclose(h);
        return;
    }
    m->cls = mod->cls;
}

const char *backend_class_name(int i) {
    if (i == 0) return backend_cpu_class.name;
    return i > 0 && i < N_CLASSES ? modules[i - 1]->name : NULL;
}

const backend_class *backend_class_get(int i, celer_error *e) {
    CELER_ASSERT(i >= 0 && i < N_CLASSES);
    if (i == 0) return &backend_cpu_class;
    module_class *m = modules[i - 1];
    pthread_mutex_lock(&module_lock);
    if (!m->tried) module_load(m);
    m->tried = true;
    pthread_mutex_unlock(&module_lock);
    if (!m->cls) error_set(e, CELER_STATUS_UNSUPPORTED, "%s", m->why.msg);
    return m->cls;
}

const backend_class *backend_host_class(void) {
    return &backend_cpu_class;
}

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
    const char *name;
    for (int k = 0; (name = backend_class_name(k)); k++) {
        if (strlen(name) != len || strncmp(name, device, len) != 0) continue;
        celer_error why = {{0}};
        const backend_class *c = backend_class_get(k, &why);
        if (!c) return error_set(e, CELER_STATUS_UNSUPPORTED, "device \"%s\": %s", device, why.msg);
        const int n = c->device_count(&why);
        if (n == 0)
            return error_set(e, CELER_STATUS_UNSUPPORTED, "device \"%s\": no %s device found%s%s",
                             device, name, why.msg[0] ? ": " : "", why.msg);
        if (i >= n)
            return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                             "device \"%s\": this machine has %d %s device%s", device, n, name,
                             n == 1 ? "" : "s");
        *cls = c;
        *index = i;
        return CELER_OK;
    }
    return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "device \"%s\": expected cpu, cuda or cuda:N", device);
}

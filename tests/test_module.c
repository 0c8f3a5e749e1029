/*
 * test_module.c - the CUDA backend as a module loaded on first use (src/backend/registry.c):
 * the binary links no CUDA library (ldd), a CPU run maps none of them nor the module
 * (/proc/self/maps), listing devices loads the module but no cuBLAS, and a module that is
 * missing or from another build is one line and a non-zero exit, never a crash. On a
 * machine with a GPU it also checks that the first CUDA context opens cuBLAS.
 */
#define _DEFAULT_SOURCE
#include "harness.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *bin(void) {
    return getenv("CELER_BIN") ? getenv("CELER_BIN") : "build/celer";
}

/* The first line of /proc/self/maps naming any of the needles, in line[size]; false: none. */
static bool mapped(const char *const *needles, char *line, size_t size) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return false;
    bool found = false;
    while (!found && fgets(line, (int)size, f))
        for (const char *const *n = needles; *n && !found; n++) found = strstr(line, *n) != NULL;
    fclose(f);
    return found;
}

static const char *const cuda_libs[] = {"libcuda.", "libcudart", "libcublas", "celer-cuda.so",
                                        NULL};

/* The number of lines of out. */
static int lines_of(const char *out) {
    int n = 0;
    for (const char *p = out; *p; p++) n += *p == '\n';
    return n;
}

static void check_links_no_cuda(void) {
    char cmd[4200], out[8192];
    snprintf(cmd, sizeof cmd, "ldd '%s'", bin());
    if (!CHECK(run_capture(cmd, out, sizeof out) == 0, "ldd %s: %s", bin(), out)) return;
    CHECK(!strstr(out, "libcuda") && !strstr(out, "libcublas"), "%s links a CUDA library:\n%s",
          bin(), out);
}

/* Four greedy tokens of a fixture on device, in this process; then whether any of libs is
 * mapped must equal want. */
static void check_greedy_maps(const char *device, const char *const *libs, bool want) {
    char err[512], line[1024] = "";
    celer_model *m;
    if (!CHECK(celer_model_open(fixture_path("llama3-q4g64"), NULL, &m, err, sizeof err) ==
                   CELER_OK,
               "open: %s", err))
        return;
    celer_context_params p = celer_context_default_params();
    p.n_ctx = 32, p.device = device, p.n_threads = 2;
    celer_context *ctx;
    if (CHECK(celer_context_create(m, &p, &ctx, err, sizeof err) == CELER_OK, "%s context: %s",
              device, err)) {
        const int32_t prompt[] = {1, 2, 3};
        const celer_generate_params g = {.n_predict = 4};
        int32_t out[4];
        int64_t n = 0;
        CHECK(celer_generate_greedy(ctx, prompt, 3, &g, out, &n) == CELER_OK && n == 4,
              "greedy on %s", device);
        celer_context_destroy(ctx);
    }
    celer_model_close(m);
    CHECK(mapped(libs, line, sizeof line) == want, "after a run on %s, %s is%s mapped %s", device,
          libs[0], want ? " not" : "", line);
}

/* `celer generate --device DEVICE` with $CELER_CUDA_MODULE = module (NULL: unset) fails with
 * one line holding needle. */
static void check_refused(const char *module, const char *device, const char *needle) {
    char cmd[8192], out[4096];
    snprintf(cmd, sizeof cmd,
             "%s%s%s '%s' generate -m '%s' --ids 1,2,3 -n 2 --temp 0 --device %s 2>&1 >/dev/null",
             module ? "CELER_CUDA_MODULE='" : "", module ? module : "", module ? "'" : "", bin(),
             fixture_path("llama3-q4g64"), device);
    const int rc = run_capture(cmd, out, sizeof out);
    CHECK(rc == 1 && lines_of(out) == 1 && strstr(out, needle),
          "--device %s with module %s: exit %d, said: %s", device, module ? module : "(beside)", rc,
          out);
}

/* `celer inspect` lists the CPU and, for cuda, its devices or why there are none. */
static void check_inspect(const char *module, const char *needle) {
    char cmd[8192], out[8192];
    snprintf(cmd, sizeof cmd, "%s%s%s '%s' inspect 2>&1", module ? "CELER_CUDA_MODULE='" : "",
             module ? module : "", module ? "'" : "", bin());
    const int rc = run_capture(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "devices:\n  cpu ") && strstr(out, needle),
          "inspect (module %s): exit %d:\n%s", module ? module : "(beside)", rc, out);
}

#ifdef CELER_CUDA
/* The build's own module, loaded in this process: listing devices maps it and no cuBLAS;
 * with a GPU, the first CUDA context opens cuBLAS. */
static void check_module_lists_without_blas(const char *module) {
    static const char *const blas_libs[] = {"libcublas", NULL};
    char name[64], desc[512], line[1024];
    setenv("CELER_CUDA_MODULE", module, 1);
    int cuda = 0;
    for (int i = 0; celer_device_at(i, name, sizeof name, desc, sizeof desc); i++)
        cuda += !strncmp(name, "cuda:", 5);
    bool missing = false;
    for (int i = 0; celer_device_missing_at(i, name, sizeof name, desc, sizeof desc); i++) {
        missing = true;
        CHECK(!strcmp(name, "cuda") && !strstr(desc, "could not be loaded") &&
                  !strstr(desc, "another build"),
              "the build's module: %s: %s", name, desc);
    }
    CHECK(cuda > 0 || missing, "the cuda class is listed");
    const char *const module_only[] = {"celer-cuda.so", NULL};
    CHECK(mapped(module_only, line, sizeof line), "listing devices loaded the module");
    CHECK(!mapped(blas_libs, line, sizeof line), "listing devices mapped %s", line);
    if (!cuda) {
        SKIP("no GPU here (%s): the first CUDA context's cuBLAS is checked on one", desc);
        return;
    }
    check_greedy_maps("cuda", blas_libs, true); /* the first CUDA context opened cuBLAS */
}
#endif

int main(void) {
    check_links_no_cuda();
    check_greedy_maps("cpu", cuda_libs, false);
#ifdef CELER_CUDA
    char dir[4096], module[4200], stale[4200];
    snprintf(dir, sizeof dir, "%s", bin());
    snprintf(module, sizeof module, "%s/celer-cuda.so", dirname(dir));
    snprintf(stale, sizeof stale, "%s/tests/module_stale.so", dir);
    check_refused(
        "/nonexistent/celer-cuda.so", "cuda",
        "device \"cuda\": the CUDA module /nonexistent/celer-cuda.so could not be loaded: ");
    check_refused(stale, "cuda:1", "is from another build (interface ");
    check_refused(fixture_path("llama3-q4g64"), "cuda",
                  "could not be loaded: "); /* a directory, not a module */
    check_inspect("/nonexistent/celer-cuda.so",
                  "\n  cuda     none: the CUDA module /nonexistent/celer-cuda.so");
    check_inspect(NULL, "\n  cuda");
    check_module_lists_without_blas(module);
#else
    check_refused(NULL, "cuda", "this build has no CUDA backend");
    check_inspect(NULL, "\n  cuda     none: this build has no CUDA backend");
#endif
    return harness_done("test_module");
}

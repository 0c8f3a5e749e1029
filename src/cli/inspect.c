/*
 * inspect.c - `celer inspect -m MODEL [-c CTX]`: what a checkpoint holds and what
 * running it costs: architecture, parameters, quantization, weight bytes, KV bytes per
 * token and a memory estimate for a context size; then the devices this machine and build
 * can run it on, and for a device class with none the reason (without -m, only those).
 */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

/* Every device, then each device class with none and why (the CUDA module missing, no
 * driver, no GPU): listing them loads the CUDA module, nothing else here does. */
static void print_devices(void) {
    char name[64], desc[512];
    printf("devices:\n");
    for (int i = 0; celer_device_at(i, name, sizeof name, desc, sizeof desc); i++)
        printf("  %-8s %s\n", name, desc);
    for (int i = 0; celer_device_missing_at(i, name, sizeof name, desc, sizeof desc); i++)
        printf("  %-8s none: %s\n", name, desc);
}

static const char inspect_usage[] =
    "usage: celer inspect [-m MODEL] [-c CTX]   (no model: the devices)";

int cmd_inspect(int argc, char **argv) {
    if (cli_help(argc, argv, inspect_usage)) return 0;
    cli_model_opts o = {0};
    for (int i = 0; i < argc; i++)
        if (!cli_model_flag(&o, argc, argv, &i))
            cli_die("inspect: unknown option %s\n%s", argv[i], inspect_usage);
    if (!o.model) {
        print_devices();
        return 0;
    }
    celer_model *m = cli_open_model(&o);
    const celer_model_info info = celer_model_get_info(m);
    int64_t n_ctx = o.n_ctx ? o.n_ctx : celer_model_n_ctx_train(m);
    if (!o.n_ctx && (n_ctx <= 0 || n_ctx > 4096)) n_ctx = 4096;
    const double mib = 1024.0 * 1024.0;
    printf("model:         %s\n", o.model);
    printf("architecture:  %s\n", celer_model_desc(m));
    char formats[512];
    celer_model_formats(m, formats, sizeof formats);
    printf("formats:       %s\n", formats);
    printf("context:       %lld positions trained\n", (long long)celer_model_n_ctx_train(m));
    printf("parameters:    %.2f M\n", (double)info.n_params / 1e6);
    printf("weights:       %.2f MiB (%.2f bits per parameter)\n", (double)info.weight_bytes / mib,
           8.0 * (double)info.weight_bytes / (double)info.n_params);
    printf("KV cache:      %.1f KiB per token (fp16)\n", (double)info.kv_bytes_per_token / 1024.0);
    printf("memory at -c %lld: %.1f MiB (weights + KV cache)\n", (long long)n_ctx,
           ((double)info.weight_bytes + (double)info.kv_bytes_per_token * (double)n_ctx) / mib);
    print_devices();
    celer_model_close(m);
    return 0;
}

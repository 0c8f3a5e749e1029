/*
 * ls.c - `celer ls`: the models of the Hugging Face cache, one line each, sorted by name:
 * the repository, the short commit refs/main names, the size of that snapshot's files, and
 * the format (the GGUF files with their quant tags, "mlx 4-bit", "safetensors bfloat16").
 * An empty or absent cache prints nothing. It lists; it neither downloads nor deletes.
 */
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>

/* "1.5 GiB" into out[cap]. */
static void human_size(int64_t bytes, char *out, size_t cap) {
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) v /= 1024.0, u++;
    snprintf(out, cap, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
}

static const char ls_usage[] = "usage: celer ls   (models in the Hugging Face cache)";

int cmd_ls(int argc, char **argv) {
    if (cli_help(argc, argv, ls_usage)) return 0;
    if (argc > 0) cli_die("ls: unknown option %s\n%s", argv[0], ls_usage);
    celer_cached_model *m;
    int64_t n;
    char err[512], size[32];
    if (celer_hf_cache_list(&m, &n, err, sizeof err) != CELER_OK) cli_die("%s", err);
    for (int64_t i = 0; i < n; i++) {
        human_size(m[i].bytes, size, sizeof size);
        printf("%-40s %-8.8s %10s  %s\n", m[i].repo, *m[i].revision ? m[i].revision : "-", size,
               m[i].format);
    }
    free(m);
    return 0;
}

/*
 * logits.c - `celer logits -m DIR --ids 1,2,3 [--all] -o out.npy`: float32 logits,
 * [1, vocab] of the last row through forward_last_logits, or [n, vocab] of every row
 * through forward with --all.
 */
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cmd_logits(int argc, char **argv) {
    cli_model_opts o = {0};
    const char *ids_arg = NULL, *out = NULL;
    bool all = false;
    for (int i = 0; i < argc; i++) {
        if (cli_model_flag(&o, argc, argv, &i)) continue;
        if (!strcmp(argv[i], "--ids") && i + 1 < argc) ids_arg = argv[++i];
        else if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--all")) all = true;
        else cli_die("logits: unknown or incomplete option %s\nusage: celer logits -m MODEL --ids 1,2,3 [--all] -o FILE.npy", argv[i]);
    }
    if (!ids_arg || !out) cli_die("logits: --ids and -o are required");
    int64_t n;
    int32_t *ids = cli_parse_ids(ids_arg, &n);
    celer_model *m;
    celer_context *ctx;
    cli_open(&o, n, &m, &ctx);
    const int64_t v = celer_model_n_vocab(m), rows = all ? n : 1;
    float *logits = malloc(sizeof(float) * (size_t)(rows * v));
    if (!logits) cli_die("out of memory");
    celer_batch b = celer_batch_tokens(ids, n);
    celer_status s = all ? celer_forward(ctx, &b, logits) : celer_forward_last_logits(ctx, &b, n - 1, logits);
    if (s != CELER_OK) cli_die("%s", celer_context_last_error(ctx));
    if (npy_write_f32(out, logits, rows, v) != 0) cli_die("%s: cannot write", out);
    free(logits);
    free(ids);
    celer_context_destroy(ctx);
    celer_model_close(m);
    return 0;
}

/*
 * generate.c - `celer generate -m DIR --ids 1,2,3 -n N --temp 0 --print-ids`: greedy
 * continuation of a prompt given as token ids. Text prompts need the tokenizer.
 */
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cmd_generate(int argc, char **argv) {
    cli_model_opts o = {0};
    const char *ids_arg = NULL;
    int64_t n_predict = 16;
    bool print_ids = false, ignore_eos = false;
    for (int i = 0; i < argc; i++) {
        if (cli_model_flag(&o, argc, argv, &i)) continue;
        if (!strcmp(argv[i], "--ids") && i + 1 < argc) ids_arg = argv[++i];
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) n_predict = cli_parse_int("-n", argv[++i]);
        else if (!strcmp(argv[i], "--temp") && i + 1 < argc) {
            if (cli_parse_num("--temp", argv[++i]) != 0.0)
                cli_die("--temp: only 0 (greedy) is available for --ids prompts");
        } else if (!strcmp(argv[i], "--print-ids")) print_ids = true;
        else if (!strcmp(argv[i], "--ignore-eos")) ignore_eos = true;
        else cli_die("generate: unknown or incomplete option %s\nusage: celer generate -m MODEL --ids 1,2,3 [-n N] [--temp 0] [--print-ids] [--ignore-eos]", argv[i]);
    }
    if (!ids_arg) cli_die("generate: --ids is required (text prompts need a tokenizer)");
    if (n_predict < 1) cli_die("-n: expected at least 1 token, found %lld", (long long)n_predict);
    int64_t n;
    int32_t *ids = cli_parse_ids(ids_arg, &n);
    celer_model *m;
    celer_context *ctx;
    cli_open(&o, n + n_predict, &m, &ctx);
    int32_t *out = malloc(sizeof *out * (size_t)n_predict);
    if (!out) cli_die("out of memory");
    celer_generate_params gp = {.seq_id = 0, .n_predict = n_predict, .stop_at_eos = !ignore_eos};
    int64_t n_out;
    if (celer_generate_greedy(ctx, ids, n, &gp, out, &n_out) != CELER_OK)
        cli_die("%s", celer_context_last_error(ctx));
    (void)print_ids; /* ids are the only output until the tokenizer exists */
    for (int64_t i = 0; i < n_out; i++) printf(i ? " %d" : "%d", out[i]);
    printf("\n");
    free(out);
    free(ids);
    celer_context_destroy(ctx);
    celer_model_close(m);
    return 0;
}

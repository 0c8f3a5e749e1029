/*
 * convert.c - `celer convert -m MODEL.gguf -o DIR`: a GGUF file as an MLX-layout
 * checkpoint directory (the weights exactly as celer loads them; Q4_1 becomes MLX
 * affine 4-bit group 32 without loss). The tokenizer is not written.
 */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

static const char convert_usage[] = "usage: celer convert -m MODEL.gguf -o DIR";

int cmd_convert(int argc, char **argv) {
    if (cli_help(argc, argv, convert_usage)) return 0;
    cli_model_opts o = {0};
    const char *out = NULL;
    for (int i = 0; i < argc; i++) {
        if (cli_model_flag(&o, argc, argv, &i)) continue;
        if (!strcmp(argv[i], "-o") && i + 1 < argc)
            out = argv[++i];
        else
            cli_die("convert: unknown or incomplete option %s\n%s", argv[i], convert_usage);
    }
    if (!out) cli_die("convert: -o DIR is required");
    celer_model *m = cli_open_model(&o);
    char err[512];
    if (celer_model_convert(m, out, err, sizeof err) != CELER_OK) cli_die("%s", err);
    printf("%s: %s\n", out, celer_model_desc(m));
    celer_model_close(m);
    return 0;
}

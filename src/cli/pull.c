/*
 * pull.c - `celer pull ORG/NAME[:QUANT][@REV]`: downloads a model from the Hugging Face Hub
 * into the Hugging Face cache (celer_model_pull) and prints the path the name resolves to,
 * the one -m NAME opens. It asks the Hub every time (a newer commit of the revision is
 * fetched; files already cached are not); -m NAME downloads only what the cache lacks.
 */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

static const char usage_text[] =
    "usage: celer pull ORG/NAME[:QUANT][@REV]\n"
    "Downloads a model from the Hugging Face Hub into the Hugging Face cache and prints its\n"
    "path (what -m ORG/NAME[:QUANT][@REV] then opens without the network).\n"
    "  ORG/NAME     a repository: GGUF files (one quant: QUANT, else Q4_K_M, else the only\n"
    "               one; every part of a split; never mmproj) or a checkpoint (config.json,\n"
    "               *.safetensors, tokenizer and template files)\n"
    "  :QUANT       the quant of a GGUF repository (Q8_0, q4_k_m, ...)\n"
    "  @REV         a branch, tag or commit (default main)\n"
    "Environment: HF_ENDPOINT (default https://huggingface.co); HF_TOKEN (else the token\n"
    "file $HF_HOME/token) for gated and private repositories; HF_HUB_CACHE or HF_HOME for\n"
    "the cache; HF_HUB_OFFLINE=1 never touches the network; HF_HUB_DOWNLOAD_TIMEOUT, the\n"
    "seconds a transfer may stall (default 30). An interrupted download resumes on the next\n"
    "pull. Progress is shown on stderr when it is a terminal.\n";

int cmd_pull(int argc, char **argv) {
    if (cli_help(argc, argv, usage_text)) return 0;
    const char *name = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage_text, stdout);
            return 0;
        }
        if (argv[i][0] == '-' || name)
            cli_die("pull: unexpected argument %s\nusage: celer pull ORG/NAME[:QUANT][@REV]",
                    argv[i]);
        name = argv[i];
    }
    if (!name) cli_die("pull: no model name\nusage: celer pull ORG/NAME[:QUANT][@REV]");
    char path[4096], err[512];
    if (celer_model_pull(name, cli_pull_progress, NULL, path, sizeof path, err, sizeof err) !=
        CELER_OK)
        cli_die("%s", err);
    printf("%s\n", path);
    return 0;
}

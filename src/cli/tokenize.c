/*
 * tokenize.c - `celer tokenize -m PATH (--text S | --file F) [--no-add-special] [--json]`
 * prints the ids of a text as Hugging Face tokenizer(text)["input_ids"] gives them, and
 * `celer detokenize -m PATH --ids 1,2,3 [--skip-special]` prints the text of ids.
 * PATH is a directory holding tokenizer.json, or the file itself. No model is loaded.
 */
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char tokenize_usage[] =
    "usage: celer tokenize -m PATH (--text S | --file F) [--no-add-special] [--json]";
static const char detokenize_usage[] =
    "usage: celer detokenize -m PATH --ids 1,2,3 [--skip-special]";

static celer_tokenizer *open_tokenizer(const char *path) {
    char err[512];
    celer_tokenizer *tok;
    if (!path) cli_die("-m PATH is required (a directory holding tokenizer.json, or the file)");
    if (celer_tokenizer_open(path, &tok, err, sizeof err) != CELER_OK) cli_die("%s", err);
    return tok;
}

int cmd_tokenize(int argc, char **argv) {
    if (cli_help(argc, argv, tokenize_usage)) return 0;
    const char *model = NULL, *text = NULL, *file = NULL;
    bool add_special = true, json = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc)
            model = cli_model_path(argv[++i]);
        else if (!strcmp(a, "--text") && i + 1 < argc)
            text = argv[++i];
        else if (!strcmp(a, "--file") && i + 1 < argc)
            file = argv[++i];
        else if (!strcmp(a, "--no-add-special"))
            add_special = false;
        else if (!strcmp(a, "--json"))
            json = true;
        else
            cli_die("tokenize: unknown or incomplete option %s\n%s", a, tokenize_usage);
    }
    if (!text == !file)
        cli_die("tokenize: exactly one of --text and --file is required\n%s", tokenize_usage);
    celer_tokenizer *tok = open_tokenizer(model);
    size_t len;
    char *buf = NULL;
    if (file)
        buf = cli_read_file(file, &len), text = buf;
    else
        len = strlen(text);
    int32_t *ids;
    int64_t n;
    char err[512];
    if (celer_tokenize(tok, text, len, add_special, &ids, &n, err, sizeof err) != CELER_OK)
        cli_die("%s: %s", file ? file : "--text", err);
    if (json) putchar('[');
    for (int64_t i = 0; i < n; i++) printf(i ? (json ? ", %d" : " %d") : "%d", ids[i]);
    puts(json ? "]" : "");
    free(ids), free(buf);
    celer_tokenizer_close(tok);
    return 0;
}

int cmd_detokenize(int argc, char **argv) {
    if (cli_help(argc, argv, detokenize_usage)) return 0;
    const char *model = NULL, *ids_arg = NULL;
    bool skip = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc)
            model = cli_model_path(argv[++i]);
        else if (!strcmp(a, "--ids") && i + 1 < argc)
            ids_arg = argv[++i];
        else if (!strcmp(a, "--skip-special"))
            skip = true;
        else
            cli_die("detokenize: unknown or incomplete option %s\n%s", a, detokenize_usage);
    }
    if (!ids_arg) cli_die("detokenize: --ids is required\n%s", detokenize_usage);
    int64_t n;
    int32_t *ids = cli_parse_ids(ids_arg, &n);
    celer_tokenizer *tok = open_tokenizer(model);
    char *text, err[512];
    size_t len;
    if (celer_detokenize(tok, ids, n, skip, &text, &len, err, sizeof err) != CELER_OK)
        cli_die("--ids: %s", err);
    fwrite(text, 1, len, stdout);
    putchar('\n');
    free(text), free(ids);
    celer_tokenizer_close(tok);
    return 0;
}

/*
 * template.c - `celer template -m MODEL --messages FILE.json [--add-generation-prompt]`
 * prints the prompt that MODEL's chat template makes of a conversation, byte for byte
 * what transformers' apply_chat_template(tokenize=False) gives. MODEL is a directory
 * holding chat_template.jinja or tokenizer_config.json, or a .gguf file; FILE holds an
 * OpenAI-style messages array or an object with a "messages" key. No weights or
 * tokenizer are loaded.
 */
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char template_usage[] = "usage: celer template -m MODEL --messages FILE.json [--add-generation-prompt]";

/* The whole of path, NUL-terminated (malloc'd); dies on error. */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) cli_die("%s: cannot open", path);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) cli_die("out of memory");
    for (size_t k; (k = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += k;
        if (n == cap - 1) {
            char *p = realloc(buf, cap *= 2);
            if (!p) cli_die("out of memory");
            buf = p;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) cli_die("%s: read error", path);
    buf[n] = 0;
    return buf;
}

int cmd_template(int argc, char **argv) {
    const char *model = NULL, *messages = NULL;
    int agp = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc) model = argv[++i];
        else if (!strcmp(a, "--messages") && i + 1 < argc) messages = argv[++i];
        else if (!strcmp(a, "--add-generation-prompt")) agp = 1;
        else cli_die("template: unknown or incomplete option %s\n%s", a, template_usage);
    }
    if (!model) cli_die("template: -m MODEL is required (a directory holding tokenizer_config.json)\n%s", template_usage);
    if (!messages) cli_die("template: --messages FILE.json is required\n%s", template_usage);
    char err[512], *src, *bos, *eos, *out;
    if (celer_chat_template_load(model, &src, &bos, &eos, err, sizeof err) != CELER_OK) cli_die("%s", err);
    char *json = slurp(messages);
    if (celer_chat_template_render(src, json, agp, bos, eos, &out, err, sizeof err) != CELER_OK) {
        if (!strncmp(err, "messages:", 9)) cli_die("%s: %s", messages, err + 10);
        cli_die("%s: %s", model, err);
    }
    fputs(out, stdout);
    free(out), free(json), free(src), free(bos), free(eos);
    return 0;
}

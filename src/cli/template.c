/*
 * template.c - `celer template -m MODEL --messages FILE.json [--add-generation-prompt]
 * [--chat-template-kwargs JSON]` prints the prompt that MODEL's chat template makes of a
 * conversation, byte for byte what transformers' apply_chat_template(tokenize=False)
 * gives. MODEL is a directory holding chat_template.jinja or tokenizer_config.json, or a
 * .gguf file; FILE holds an OpenAI-style messages array, or a request body: an object with
 * "messages" and optionally "tools" (passed to the template as apply_chat_template's
 * tools) and "chat_template_kwargs" (extra template variables, over those of the flag).
 * No weights or tokenizer are loaded.
 */
#include "cli/cli.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char template_usage[] = "usage: celer template -m MODEL --messages FILE.json "
                                     "[--add-generation-prompt] [--chat-template-kwargs JSON]";

/* The template variables of a request body (malloc'd JSON text, or NULL for none): the
 * flag's kwargs, then the body's "chat_template_kwargs" over them and its "tools". Dies
 * naming the file on a body field of the wrong type. */
static char *body_vars(const char *json, const char *path, const char *flag_kwargs) {
    json_t *body = json_loads(json, 0, NULL); /* a parse error is reported by the render */
    json_t *vars = flag_kwargs ? json_loads(flag_kwargs, 0, NULL) : json_object();
    if (!vars) cli_die("out of memory");
    if (json_is_object(body)) {
        const json_t *kw = json_object_get(body, "chat_template_kwargs"),
                     *tools = json_object_get(body, "tools");
        if (kw && !json_is_null(kw) && !json_is_object(kw))
            cli_die("%s: chat_template_kwargs: expected an object", path);
        if (json_is_object(kw)) json_object_update(vars, (json_t *)kw);
        if (tools && !json_is_null(tools) && !json_is_array(tools))
            cli_die("%s: tools: expected an array", path);
        if (json_is_array(tools)) json_object_set(vars, "tools", (json_t *)tools);
    }
    char *text = json_object_size(vars) ? json_dumps(vars, JSON_COMPACT) : NULL;
    json_decref(vars);
    json_decref(body);
    return text;
}

int cmd_template(int argc, char **argv) {
    if (cli_help(argc, argv, template_usage)) return 0;
    const char *model = NULL, *messages = NULL, *kwargs = NULL;
    int agp = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc)
            model = cli_model_path(argv[++i]);
        else if (!strcmp(a, "--messages") && i + 1 < argc)
            messages = argv[++i];
        else if (!strcmp(a, "--add-generation-prompt"))
            agp = 1;
        else if (!strcmp(a, "--chat-template-kwargs") && i + 1 < argc)
            kwargs = cli_template_kwargs(argv[++i]);
        else
            cli_die("template: unknown or incomplete option %s\n%s", a, template_usage);
    }
    if (!model)
        cli_die("template: -m MODEL is required (a directory holding tokenizer_config.json)\n%s",
                template_usage);
    if (!messages) cli_die("template: --messages FILE.json is required\n%s", template_usage);
    char err[512], *src, *bos, *eos, *out;
    if (celer_chat_template_load(model, &src, &bos, &eos, err, sizeof err) != CELER_OK)
        cli_die("%s", err);
    char *json = cli_read_file(messages, NULL), *vars = body_vars(json, messages, kwargs);
    if (celer_chat_template_render_vars(src, json, vars, agp, bos, eos, &out, err, sizeof err) !=
        CELER_OK) {
        if (!strncmp(err, "messages:", 9)) cli_die("%s: %s", messages, err + 10);
        cli_die("%s: %s", model, err);
    }
    fputs(out, stdout);
    free(out), free(vars), free(json), free(src), free(bos), free(eos);
    return 0;
}

/*
 * chat_template_load.c - finding a model's chat template (chat_template.jinja or the
 * chat_template of tokenizer_config.json in a directory; the GGUF metadata through
 * tok_gguf.c) and the public chat template API of celer.h, over the parser and evaluator
 * of chat_template_parse.c and chat_template.c.
 */
#define _DEFAULT_SOURCE
#include "celer.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tok_gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ==== Templates of model directories ==== */

/* The whole of path, NUL-terminated (malloc'd); NULL when it cannot be read. */
static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t n = 0, cap = 1 << 16, k;
    char *buf = malloc(cap);
    while (buf && (k = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        char *grown = n + 1 == cap ? realloc(buf, cap *= 2) : buf;
        if (!grown) free(buf);
        buf = grown;
    }
    if (buf && ferror(f)) free(buf), buf = NULL;
    fclose(f);
    if (buf) buf[n] = 0;
    return buf;
}

static char *dup_token(const json_t *v) {
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? strdup(json_string_value(v)) : NULL;
}

celer_status chat_template_from_dir(const char *dir, char **template_src, char **bos_token, char **eos_token,
                                    celer_error *e) {
    *template_src = *bos_token = *eos_token = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_error_t je;
    json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
    if (!cfg && access(path, F_OK) == 0)
        return error_set(e, CELER_STATUS_BAD_FILE, "%s: line %d column %d: %s", path, je.line, je.column, je.text);
    if (cfg) {
        *bos_token = dup_token(json_object_get(cfg, "bos_token"));
        *eos_token = dup_token(json_object_get(cfg, "eos_token"));
    }
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    *template_src = read_file(path);
    if (!*template_src && cfg) {
        const json_t *ct = json_object_get(cfg, "chat_template");
        if (json_is_array(ct)) {
            size_t i;
            const json_t *x;
            const json_t *found = NULL;
            json_array_foreach(ct, i, x) {
                const json_t *nm = json_object_get(x, "name");
                if (json_is_string(nm) && !strcmp(json_string_value(nm), "default")) found = json_object_get(x, "template");
            }
            ct = found;
        }
        if (json_is_string(ct)) *template_src = strdup(json_string_value(ct));
    }
    json_decref(cfg);
    if (!*template_src) {
        free(*bos_token), free(*eos_token);
        *bos_token = *eos_token = NULL;
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: no chat template (neither chat_template.jinja nor a chat_template field in "
                         "tokenizer_config.json)",
                         dir);
    }
    return CELER_OK;
}

/* ==== Public API (celer.h) ==== */

celer_status celer_chat_template_render(const char *template_src, const char *messages_json,
                                        int add_generation_prompt, const char *bos_token,
                                        const char *eos_token, char **out, char *err, size_t err_size) {
    return celer_chat_template_render_vars(template_src, messages_json, NULL, add_generation_prompt, bos_token,
                                           eos_token, out, err, err_size);
}

/* vars_json parsed into *vars: a JSON object naming none of the variables the other
 * arguments set. */
static celer_status parse_vars(const char *vars_json, json_t **vars, celer_error *e) {
    static const char *const reserved[] = {"messages", "add_generation_prompt", "bos_token", "eos_token"};
    json_error_t je;
    *vars = json_loads(vars_json, JSON_REJECT_DUPLICATES, &je);
    if (!*vars)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "template variables: line %d column %d: %s", je.line,
                         je.column, je.text);
    if (!json_is_object(*vars))
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "template variables: expected a JSON object");
    for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
        if (json_object_get(*vars, reserved[i]))
            return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                             "template variables: \"%s\" is set by its own argument, not here", reserved[i]);
    return CELER_OK;
}

celer_status celer_chat_template_render_vars(const char *template_src, const char *messages_json,
                                             const char *vars_json, int add_generation_prompt,
                                             const char *bos_token, const char *eos_token, char **out, char *err,
                                             size_t err_size) {
    celer_error e = {{0}};
    chat_template *t = NULL;
    json_t *doc = NULL, *vars = NULL;
    *out = NULL;
    celer_status st = CELER_OK;
    if (!template_src || !messages_json) {
        st = error_set(&e, CELER_STATUS_INVALID_ARGUMENT, "template and messages are required");
        goto done;
    }
    json_error_t je;
    doc = json_loads(messages_json, 0, &je);
    if (!doc) {
        st = error_set(&e, CELER_STATUS_INVALID_ARGUMENT, "messages: line %d column %d: %s", je.line, je.column,
                       je.text);
        goto done;
    }
    const json_t *msgs = json_is_object(doc) ? json_object_get(doc, "messages") : doc;
    if (!json_is_array(msgs)) {
        st = error_set(&e, CELER_STATUS_INVALID_ARGUMENT,
                       "messages: expected an array of messages or an object with a \"messages\" array");
        goto done;
    }
    if (vars_json && (st = parse_vars(vars_json, &vars, &e)) != CELER_OK) goto done;
    if ((st = chat_template_parse(template_src, strlen(template_src), &t, &e)) != CELER_OK) goto done;
    chat_template_opts o = {.add_generation_prompt = add_generation_prompt != 0, .bos_token = bos_token,
                            .eos_token = eos_token, .vars = vars};
    st = chat_template_render(t, msgs, &o, out, NULL, &e);
done:
    if (st != CELER_OK) error_copy(&e, err, err_size);
    chat_template_free(t);
    json_decref(doc);
    json_decref(vars);
    return st;
}

celer_status celer_chat_template_load(const char *model_path, char **template_src, char **bos_token,
                                      char **eos_token, char *err, size_t err_size) {
    celer_error e = {{0}};
    const size_t n = strlen(model_path);
    const bool gguf = n > 5 && strcmp(model_path + n - 5, ".gguf") == 0;
    celer_status st = gguf ? chat_template_from_gguf(model_path, template_src, bos_token, eos_token, &e)
                           : chat_template_from_dir(model_path, template_src, bos_token, eos_token, &e);
    if (st != CELER_OK) error_copy(&e, err, err_size);
    return st;
}

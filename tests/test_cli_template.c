/*
 * test_cli_template.c - `celer template` as scripts use it: the prompt of golden
 * conversations through a tokenizer_config.json directory (Qwen3 of tests/tokenizers), a
 * chat_template.jinja directory (which wins over tokenizer_config.json) and a list of
 * named templates (Cohere2's "default"), messages as an array or under "messages", and
 * bad input failing with one `celer: ...` line and exit status 1.
 */
#define _DEFAULT_SOURCE
#include "harness.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *bin(void) { return getenv("CELER_BIN") ? getenv("CELER_BIN") : "build/celer"; }

static char out[1 << 17];

static int run(const char *cmd) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int rc = pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static void write_json(const char *path, json_t *j) {
    json_dump_file(j, path, JSON_INDENT(1));
    json_decref(j);
}

static void write_text(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    fputs(s, f);
    fclose(f);
}

/* Runs the template over conversation case ci of golden_<name>.json and compares. */
static void check_case(const char *name, const char *model, size_t ci, bool wrap, json_t *convs) {
    char gpath[256], msgs[128], cmd[8192];
    snprintf(gpath, sizeof gpath, "tests/templates/golden_%s.json", name);
    json_t *g = json_load_file(gpath, 0, NULL);
    json_t *c = json_array_get(json_object_get(g, "cases"), ci);
    json_t *conv = json_array_get(convs, (size_t)json_integer_value(json_object_get(c, "conversation")));
    snprintf(msgs, sizeof msgs, "/tmp/celer-cli-msgs-%d.json", (int)getpid());
    json_t *m = json_object_get(conv, "messages");
    write_json(msgs, wrap ? json_pack("{sO}", "messages", m) : json_incref(m));
    bool agp = json_is_true(json_object_get(c, "add_generation_prompt"));
    snprintf(cmd, sizeof cmd, "'%s' template -m '%s' --messages %s%s 2>&1", bin(), model, msgs,
             agp ? " --add-generation-prompt" : "");
    int rc = run(cmd);
    const char *want = json_string_value(json_object_get(c, "output"));
    if (want) {
        CHECK(rc == 0 && !strcmp(out, want), "%s case %zu: exit %d, printed [%s], want [%s]", name, ci, rc, out, want);
    } else {
        const char *err = json_string_value(json_object_get(c, "error"));
        CHECK(rc == 1 && !strncmp(out, "celer: ", 7) && strstr(out, err) && strstr(out, "template line"),
              "%s case %zu: exit %d, printed [%s], want the error [%s]", name, ci, rc, out, err);
    }
    unlink(msgs);
    json_decref(g);
}

static void check_fails(const char *what, const char *args, const char *needle) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1 >/dev/null", bin(), args);
    int rc = run(cmd);
    int lines = 0;
    for (char *p = out; *p; p++) lines += *p == '\n';
    CHECK(rc == 1 && !strncmp(out, "celer: ", 7) && strstr(out, needle) && lines >= 1, "%s: exit %d, output: %s",
          what, rc, out);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) free(s), s = NULL;
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

int main(void) {
    json_t *convs = json_load_file("tests/templates/conversations.json", 0, NULL);
    if (!CHECK(json_is_array(convs), "conversations.json")) return harness_done("test_cli_template");
    char qwen3[4096], llama2[4096], dir[] = "/tmp/celer-cli-tmpl-XXXXXX", p[4096], args[8192];
    if (tokenizer_dir("qwen3", qwen3, sizeof qwen3)) {
        /* cases are (conversation * 2 + add_generation_prompt) */
        check_case("qwen3", qwen3, 2, false, convs);
        check_case("qwen3", qwen3, 5, true, convs);
        check_case("qwen3", qwen3, 9, false, convs);
        check_case("qwen3", qwen3, 15, true, convs);
    } else {
        SKIP_REQUIRED("%s", qwen3);
    }
    if (!CHECK(mkdtemp(dir), "mkdtemp")) return harness_done("test_cli_template");

    /* chat_template.jinja beside a tokenizer_config.json whose template must lose */
    char *src = slurp("tests/templates/llama3_2.jinja");
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    write_text(p, src ? src : "");
    free(src);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    write_json(p, json_pack("{s{ss}ssss}", "bos_token", "content", "<|begin_of_text|>", "eos_token", "<|eot_id|>",
                            "chat_template", "WRONG"));
    check_case("llama3_2", dir, 3, true, convs);
    check_case("llama3_2", dir, 8, false, convs);
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    unlink(p);

    /* a list of named templates: "default" is used */
    src = slurp("tests/templates/cohere2.jinja");
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    write_json(p, json_pack("{sss{ss}s[{ssss}{ssss}]}", "bos_token", "<BOS_TOKEN>", "eos_token", "content",
                            "<|END_OF_TURN_TOKEN|>", "chat_template", "name", "rag", "template", "WRONG", "name",
                            "default", "template", src ? src : ""));
    free(src);
    check_case("cohere2", dir, 5, true, convs);
    check_case("cohere2", dir, 16, false, convs); /* roles not alternating: raise_exception */

    /* bad input, through the Cohere2 directory above */
    const char *model = dir;
    char msgs[128];
    snprintf(msgs, sizeof msgs, "/tmp/celer-cli-badmsgs-%d.json", (int)getpid());
    write_text(msgs, "[{\"role\": \"user\", \"content\": ");
    snprintf(args, sizeof args, "template -m '%s' --messages %s", model, msgs);
    check_fails("malformed messages", args, msgs);
    write_text(msgs, "{\"role\": \"user\"}");
    check_fails("messages not an array", args, "messages");
    write_text(msgs, "[]");
    snprintf(args, sizeof args, "template -m '%s' --messages /nonexistent.json", model);
    check_fails("missing messages file", args, "/nonexistent.json");
    snprintf(args, sizeof args, "template --messages %s", msgs);
    check_fails("no model", args, "-m MODEL");
    snprintf(args, sizeof args, "template -m '%s'", model);
    check_fails("no messages", args, "--messages");
    snprintf(args, sizeof args, "template -m '%s' --messages %s --frob", model, msgs);
    check_fails("unknown flag", args, "--frob");
    if (tokenizer_dir("llama2", llama2, sizeof llama2)) {
        snprintf(args, sizeof args, "template -m '%s' --messages %s", llama2, msgs);
        check_fails("no chat template", args, "no chat template");
    } else {
        SKIP_REQUIRED("%s", llama2);
    }
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    write_json(p, json_pack("{ss}", "chat_template", "line 1\n{% for m in messages %}{{ m | wordcount }}"));
    snprintf(args, sizeof args, "template -m %s --messages %s", dir, msgs);
    check_fails("bad template", args, "template line 2 column 1: unclosed 'for' block");
    write_text(p, "{\"chat_template\": ");
    check_fails("malformed tokenizer_config.json", args, "tokenizer_config.json");
    unlink(p);
    unlink(msgs);
    rmdir(dir);
    json_decref(convs);
    return harness_done("test_cli_template");
}

/*
 * test_cli_template.c - `celer template` as scripts use it: the prompt of golden
 * conversations through a tokenizer_config.json directory (Qwen3 of tests/tokenizers), a
 * chat_template.jinja directory (which wins over tokenizer_config.json) and a list of
 * named templates (Cohere2's "default"), messages as an array, under "messages" or in a
 * request body with "tools" and "chat_template_kwargs", extra variables from
 * --chat-template-kwargs (also of `generate` and `run`), and bad input failing with one
 * `celer: ...` line and exit status 1.
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

/* How a case's conversation reaches `celer template`: a messages array; an object with
 * "messages"; a request body with its "tools" and its variables as "chat_template_kwargs";
 * or the array with the variables as --chat-template-kwargs (and tools not given). */
enum { AS_ARRAY, AS_OBJECT, AS_BODY, AS_FLAG };

/* Runs the template over conversation case ci of golden_<name>.json and compares. */
static void check_case(const char *name, const char *model, size_t ci, int as, json_t *convs) {
    char gpath[256], msgs[128], cmd[8192], flag[1024] = "";
    snprintf(gpath, sizeof gpath, "tests/templates/golden_%s.json", name);
    json_t *g = json_load_file(gpath, 0, NULL);
    json_t *c = json_array_get(json_object_get(g, "cases"), ci);
    json_t *conv = json_array_get(convs, (size_t)json_integer_value(json_object_get(c, "conversation")));
    snprintf(msgs, sizeof msgs, "/tmp/celer-cli-msgs-%d.json", (int)getpid());
    json_t *m = json_object_get(conv, "messages"), *vars = json_object_get(conv, "vars");
    json_t *tools = json_object_get(conv, "tools");
    if (as == AS_OBJECT) {
        write_json(msgs, json_pack("{sO}", "messages", m));
    } else if (as == AS_BODY) {
        json_t *body = json_pack("{sO}", "messages", m);
        if (vars) json_object_set(body, "chat_template_kwargs", vars);
        if (tools) json_object_set(body, "tools", tools);
        write_json(msgs, body);
    } else {
        write_json(msgs, json_incref(m));
    }
    if (as == AS_FLAG && vars) {
        char *v = json_dumps(vars, JSON_COMPACT);
        snprintf(flag, sizeof flag, " --chat-template-kwargs '%s'", v);
        free(v);
    }
    bool agp = json_is_true(json_object_get(c, "add_generation_prompt"));
    snprintf(cmd, sizeof cmd, "'%s' template -m '%s' --messages %s%s%s 2>&1", bin(), model, msgs,
             agp ? " --add-generation-prompt" : "", flag);
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

int main(void) {
    json_t *convs = json_load_file("tests/templates/conversations.json", 0, NULL);
    if (!CHECK(json_is_array(convs), "conversations.json")) return harness_done("test_cli_template");
    char qwen3[4096], llama2[4096], dir[] = "/tmp/celer-cli-tmpl-XXXXXX", p[4096], args[8192];
    if (tokenizer_dir("qwen3", qwen3, sizeof qwen3)) {
        /* cases are (conversation * 2 + add_generation_prompt) */
        check_case("qwen3", qwen3, 2, AS_ARRAY, convs);
        check_case("qwen3", qwen3, 5, AS_OBJECT, convs);
        check_case("qwen3", qwen3, 9, AS_ARRAY, convs);
        check_case("qwen3", qwen3, 15, AS_OBJECT, convs);
        check_case("qwen3", qwen3, 21, AS_FLAG, convs);  /* enable_thinking false */
        check_case("qwen3", qwen3, 29, AS_FLAG, convs);  /* enable_thinking true */
        check_case("qwen3", qwen3, 21, AS_BODY, convs);
        check_case("qwen3", qwen3, 23, AS_BODY, convs);  /* tools */
        check_case("qwen3", qwen3, 35, AS_BODY, convs);  /* multi-step tool use, thinking */
    } else {
        SKIP_REQUIRED("%s", qwen3);
    }
    if (!CHECK(mkdtemp(dir), "mkdtemp")) return harness_done("test_cli_template");

    /* chat_template.jinja beside a tokenizer_config.json whose template must lose */
    char *src = read_text_file("tests/templates/llama3_2.jinja");
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    write_text(p, src ? src : "");
    free(src);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    write_json(p, json_pack("{s{ss}ssss}", "bos_token", "content", "<|begin_of_text|>", "eos_token", "<|eot_id|>",
                            "chat_template", "WRONG"));
    check_case("llama3_2", dir, 3, AS_OBJECT, convs);
    check_case("llama3_2", dir, 8, AS_ARRAY, convs);
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    unlink(p);

    /* a list of named templates: "default" is used */
    src = read_text_file("tests/templates/cohere2.jinja");
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    write_json(p, json_pack("{sss{ss}s[{ssss}{ssss}]}", "bos_token", "<BOS_TOKEN>", "eos_token", "content",
                            "<|END_OF_TURN_TOKEN|>", "chat_template", "name", "rag", "template", "WRONG", "name",
                            "default", "template", src ? src : ""));
    free(src);
    check_case("cohere2", dir, 5, AS_OBJECT, convs);
    check_case("cohere2", dir, 16, AS_ARRAY, convs); /* roles not alternating: raise_exception */

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
    /* --chat-template-kwargs and the body's chat_template_kwargs and tools */
    static const struct {
        const char *body, *flag, *needle;
    } refusals[] = {
        {"[{\"role\": \"user\", \"content\": \"hi\"}]", "--chat-template-kwargs '[1]'",
         "--chat-template-kwargs: expected a JSON object"},
        {"[]", "--chat-template-kwargs '{\"a\": '", "--chat-template-kwargs"},
        {"[]", "--chat-template-kwargs '{\"messages\": []}'", "\"messages\" is set by its own argument"},
        {"{\"messages\": [], \"chat_template_kwargs\": 1}", "", "chat_template_kwargs: expected an object"},
        {"{\"messages\": [], \"tools\": {}}", "", "tools: expected an array"},
    };
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
        write_text(msgs, refusals[i].body);
        snprintf(args, sizeof args, "template -m '%s' --messages %s %s", model, msgs, refusals[i].flag);
        check_fails(refusals[i].needle, args, refusals[i].needle);
    }
    /* the body's kwargs over the flag's, and what the template sees of them */
    char jinja[4096];
    snprintf(jinja, sizeof jinja, "%s/chat_template.jinja", dir);
    write_text(jinja, "{{ a }} {{ b }} {{ tools | length }}");
    write_text(msgs, "{\"messages\": [], \"chat_template_kwargs\": {\"b\": 2}, \"tools\": [{}, {}]}");
    snprintf(args, sizeof args, "'%s' template -m '%s' --messages %s --chat-template-kwargs '{\"a\": 1, \"b\": 1}' 2>&1",
             bin(), dir, msgs);
    CHECK(run(args) == 0 && !strcmp(out, "1 2 2"), "kwargs from the flag and the body: %s", out);
    unlink(jinja);

    /* generate and run hand --chat-template-kwargs to the template (which here only says
     * what it got) */
    const char *chat = "tests/server/fixtures/llava-chat";
    char gdir[] = "/tmp/celer-cli-kw-XXXXXX";
    if (CHECK(mkdtemp(gdir), "mkdtemp")) {
        const char *files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                               "preprocessor_config.json"};
        char from[4096], to[4096], cwd[2048];
        if (!getcwd(cwd, sizeof cwd)) cwd[0] = 0;
        for (int i = 0; i < 5; i++) {
            snprintf(from, sizeof from, "%s/%s/%s", cwd, chat, files[i]);
            snprintf(to, sizeof to, "%s/%s", gdir, files[i]);
            CHECK(symlink(from, to) == 0, "symlink %s", to);
        }
        snprintf(to, sizeof to, "%s/chat_template.jinja", gdir);
        write_text(to, "{{ raise_exception('enable_thinking=' ~ enable_thinking) }}");
        static const struct {
            const char *args, *needle; /* args: a format taking the model directory */
        } uses[] = {
            {"generate -m %s -p hi -n 1 --chat-template-kwargs '{\"enable_thinking\": false}'", "enable_thinking=False"},
            {"run %s -p hi -n 1 --chat-template-kwargs '{\"enable_thinking\": true}'", "enable_thinking=True"},
            {"generate -m %s --text hi --chat-template-kwargs '{}'", "only renders -p TEXT"},
            {"generate -m %s -p hi --chat-template-kwargs 5", "expected a JSON object"},
        };
        for (size_t i = 0; i < sizeof uses / sizeof uses[0]; i++) {
            snprintf(args, sizeof args, uses[i].args, gdir);
            check_fails(uses[i].args, args, uses[i].needle);
        }
        for (int i = 0; i < 5; i++) {
            snprintf(to, sizeof to, "%s/%s", gdir, files[i]);
            unlink(to);
        }
        snprintf(to, sizeof to, "%s/chat_template.jinja", gdir);
        unlink(to);
        rmdir(gdir);
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

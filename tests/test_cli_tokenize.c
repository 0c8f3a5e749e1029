/*
 * test_cli_tokenize.c - `celer tokenize` and `celer detokenize` as scripts use them:
 * ids of golden corpus strings through the real tokenizers of tests/tokenizers
 * (directory and file paths, --text and --file, --no-add-special, --json), text back
 * from --ids, and bad input failing with one `celer: ...` line and exit status 1.
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

/* The ids of golden case i as "a b c\n" (or JSON "[a, b, c]\n"). */
static void want_ids(json_t *ids, bool json, char *out, size_t cap) {
    size_t k = 0;
    if (json) k += (size_t)snprintf(out + k, cap - k, "[");
    for (size_t i = 0; i < json_array_size(ids); i++)
        k += (size_t)snprintf(out + k, cap - k, i ? (json ? ", %lld" : " %lld") : "%lld",
                              (long long)json_integer_value(json_array_get(ids, i)));
    snprintf(out + k, cap - k, json ? "]\n" : "\n");
}

static void check_tokenizer(const char *name, json_t *corpus, const size_t *cases, size_t n_cases) {
    char path[4096], gpath[256], cmd[8192], out[16384], want[16384], txt[128];
    if (!tokenizer_dir(name, path, sizeof path)) {
        SKIP_REQUIRED("%s", path);
        return;
    }
    snprintf(gpath, sizeof gpath, "tests/tokenizer/golden_%s.json", name);
    json_t *g = json_load_file(gpath, 0, NULL);
    json_t *gc = json_object_get(g, "cases");
    snprintf(txt, sizeof txt, "/tmp/celer-cli-tok-%d.txt", (int)getpid());
    for (size_t c = 0; c < n_cases; c++) {
        size_t i = cases[c];
        json_t *s = json_array_get(corpus, i), *gi = json_array_get(gc, i);
        FILE *f = fopen(txt, "wb");
        fwrite(json_string_value(s), 1, json_string_length(s), f);
        fclose(f);
        /* --file, directory path, with special tokens */
        snprintf(cmd, sizeof cmd, "'%s' tokenize -m '%s' --file %s", bin(), path, txt);
        int rc = run_capture(cmd, out, sizeof out);
        want_ids(json_object_get(gi, "ids"), false, want, sizeof want);
        CHECK(rc == 0 && !strcmp(out, want), "%s case %zu: tokenize printed \"%s\", want \"%s\"", name, i, out, want);
        if (c > 0) continue; /* each run loads the tokenizer: keep the count small */
        /* file path, --no-add-special, --json */
        snprintf(cmd, sizeof cmd, "'%s' tokenize -m '%s/tokenizer.json' --file %s --no-add-special --json", bin(), path,
                 txt);
        rc = run_capture(cmd, out, sizeof out);
        want_ids(json_object_get(gi, "ids_plain"), true, want, sizeof want);
        CHECK(rc == 0 && !strcmp(out, want), "%s case %zu: --json printed \"%s\", want \"%s\"", name, i, out, want);
        /* detokenize the ids back */
        json_t *ids = json_object_get(gi, "ids");
        if (json_array_size(ids) == 0) continue;
        size_t k = (size_t)snprintf(cmd, sizeof cmd, "'%s' detokenize -m '%s' --ids ", bin(), path);
        for (size_t j = 0; j < json_array_size(ids); j++)
            k += (size_t)snprintf(cmd + k, sizeof cmd - k, j ? ",%lld" : "%lld",
                                  (long long)json_integer_value(json_array_get(ids, j)));
        rc = run_capture(cmd, out, sizeof out);
        snprintf(want, sizeof want, "%s\n", json_string_value(json_object_get(gi, "decoded")));
        CHECK(rc == 0 && !strcmp(out, want), "%s case %zu: detokenize printed \"%s\", want \"%s\"", name, i, out, want);
    }
    unlink(txt);
    json_decref(g);
}

static void check_fails(const char *what, const char *args, const char *needle) {
    char cmd[8192], out[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1 >/dev/null", bin(), args);
    int rc = run_capture(cmd, out, sizeof out);
    int lines = 0;
    for (char *p = out; *p; p++) lines += *p == '\n';
    CHECK(rc == 1 && !strncmp(out, "celer: ", 7) && strstr(out, needle) && lines >= 1,
          "%s: exit %d, output: %s", what, rc, out);
}

int main(void) {
    json_t *corpus = json_load_file("tests/tokenizer/corpus.json", 0, NULL);
    if (!CHECK(json_is_array(corpus), "corpus.json")) return harness_done("test_cli_tokenize");
    /* A handful of cases: plain ASCII, spaces and newlines, emoji, CJK, a special token. */
    size_t cases[16], n = 0;
    const char *pick[] = {"<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", "line1\n\n\nline2\r\n\r\nline3",
                          "👨‍👩‍👧‍👦", "<s>Hello</s>", ""};
    for (size_t p = 0; p < sizeof pick / sizeof pick[0]; p++)
        for (size_t i = 0; i < json_array_size(corpus); i++)
            if (!strcmp(json_string_value(json_array_get(corpus, i)), pick[p])) cases[n++] = i;
    CHECK(n == sizeof pick / sizeof pick[0], "picked %zu cases", n);
    check_tokenizer("llama3_1", corpus, cases, n);
    check_tokenizer("qwen3", corpus, cases, n);
    check_tokenizer("llama2", corpus, cases, n);

    char path[4096], args[8192], out[4096];
    if (tokenizer_dir("llama3_1", path, sizeof path)) {
        snprintf(args, sizeof args, "'%s' tokenize -m '%s' --text 'Hello world' --no-add-special", bin(), path);
        CHECK(run_capture(args, out, sizeof out) == 0 && !strcmp(out, "9906 1917\n"), "--text: %s", out);
    } else {
        SKIP_REQUIRED("%s", path);
    }
    /* The failures below load the small Llama 2 tokenizer, which loads fastest. */
    if (!tokenizer_dir("llama2", path, sizeof path)) {
        SKIP_REQUIRED("%s", path);
        json_decref(corpus);
        return harness_done("test_cli_tokenize");
    }
    snprintf(args, sizeof args, "tokenize -m '%s' --text \"$(printf 'a\\377b')\"", path);
    check_fails("invalid UTF-8", args, "not valid UTF-8");
    snprintf(args, sizeof args, "tokenize -m '%s'", path);
    check_fails("no text", args, "--text");
    snprintf(args, sizeof args, "tokenize -m '%s' --text a --file b", path);
    check_fails("text and file", args, "exactly one");
    snprintf(args, sizeof args, "tokenize -m '%s' --file /nonexistent.txt", path);
    check_fails("missing file", args, "/nonexistent.txt");
    check_fails("no model", "tokenize --text hi", "-m PATH");
    check_fails("missing tokenizer", "tokenize -m /nonexistent --text hi", "/nonexistent");
    snprintf(args, sizeof args, "detokenize -m '%s' --ids 1,x", path);
    check_fails("bad --ids", args, "--ids");
    snprintf(args, sizeof args, "detokenize -m '%s' --ids 1,99999", path);
    check_fails("id past vocab", args, "outside the vocabulary");
    snprintf(args, sizeof args, "tokenize -m '%s' --text hi --frob", path);
    check_fails("unknown flag", args, "--frob");
    /* A malformed tokenizer.json names the file and the position. */
    char bad[64];
    snprintf(bad, sizeof bad, "/tmp/celer-bad-tok-%d.json", (int)getpid());
    FILE *f = fopen(bad, "w");
    fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {", f);
    fclose(f);
    snprintf(args, sizeof args, "tokenize -m %s --text hi", bad);
    check_fails("malformed tokenizer.json", args, bad);
    unlink(bad);
    json_decref(corpus);
    return harness_done("test_cli_tokenize");
}

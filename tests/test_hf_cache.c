/*
 * test_hf_cache.c - models by name on a hand-built Hugging Face cache (refs/main, snapshots
 * linking into blobs/, as huggingface_hub writes it): the quant tag of file names, the file
 * ORG/NAME[:QUANT] picks, the errors of a missing or ambiguous name, a local path winning,
 * the cache root's environment variables, and the listing behind `celer ls`. Needs no
 * Python and no network (tests/hub/ checks the same against a real huggingface_hub).
 */
#define _DEFAULT_SOURCE
#include "harness.h"
#include "io/hf_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];

/* Writes text to root/rel, making the folders on the way. */
static void put(const char *rel, const char *text) {
    char path[1024], cmd[1200];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", path);
    CHECK(system(cmd) == 0, "mkdir for %s", rel);
    FILE *f = fopen(path, "w");
    if (!CHECK(f != NULL, "create %s", path)) return;
    fputs(text, f);
    fclose(f);
}

/* A cached repo models--org--name at commit: each file a blob that the snapshot links to. */
static void repo(const char *dir, const char *commit, const char *const *files, int n,
                 const char *text) {
    char rel[512], blob[512], link[1024], target[512];
    snprintf(rel, sizeof rel, "%s/refs/main", dir);
    put(rel, commit);
    for (int i = 0; i < n; i++) {
        snprintf(blob, sizeof blob, "%s/blobs/b%d", dir, i);
        put(blob, text);
        snprintf(rel, sizeof rel, "%s/snapshots/%s/%s", dir, commit, files[i]);
        put(rel, "");
        snprintf(link, sizeof link, "%s/%s", root, rel);
        unlink(link);
        /* relative, as huggingface_hub makes them: ../../blobs/<id> (one more per folder) */
        int depth = 0;
        for (const char *p = files[i]; *p; p++) depth += *p == '/';
        size_t k = 0;
        for (int d = 0; d < depth + 2; d++)
            k += (size_t)snprintf(target + k, sizeof target - k, "../");
        snprintf(target + k, sizeof target - k, "blobs/b%d", i);
        CHECK(symlink(target, link) == 0, "symlink %s", link);
    }
}

static void expect_path(const char *name, const char *suffix) {
    char path[4096], err[512] = "";
    celer_status s = celer_model_resolve(name, path, sizeof path, err, sizeof err);
    const size_t n = strlen(path), k = strlen(suffix);
    CHECK(s == CELER_OK && n >= k && !strcmp(path + n - k, suffix), "%s -> %s (got %s: %s)", name,
          suffix, s == CELER_OK ? path : celer_status_str(s), err);
}

static void expect_error(const char *name, celer_status want, const char *needle) {
    char path[4096], err[512] = "";
    celer_status s = celer_model_resolve(name, path, sizeof path, err, sizeof err);
    CHECK(s == want && strstr(err, needle) && !strchr(err, '\n'),
          "%s fails with %s naming \"%s\" (got %s: %s)", name, celer_status_str(want), needle,
          celer_status_str(s), err);
}

static void check_tags(void) {
    static const char *const cases[][2] = {
        {"Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Q4_K_M"},
        {"gemma-3-270m-q4_k_m.gguf", "Q4_K_M"},
        {"SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"},
        {"ggml-model-f16.gguf", "F16"},
        {"model-IQ4_XS-00001-of-00003.gguf", "IQ4_XS"},
        {"sub/Qwen3-0.6B-BF16.gguf", "BF16"},
        {"x-UD-Q4_K_XL.gguf", "Q4_K_XL"},
        {"model.gguf", ""},
        {"Q-model.gguf", ""},
    };
    char tag[32];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        hf_gguf_tag(cases[i][0], tag, sizeof tag);
        CHECK(!strcmp(tag, cases[i][1]), "tag of %s: %s, expected \"%s\"", cases[i][0], tag,
              cases[i][1]);
    }
    char r[256], q[32], v[64];
    CHECK(hf_name_parse("org/name:Q8_0", r, sizeof r, q, sizeof q, v, sizeof v) &&
              !strcmp(r, "org/name") && !strcmp(q, "Q8_0") && !strcmp(v, "main"),
          "org/name:Q8_0 parses");
    CHECK(hf_name_parse("org/name", r, sizeof r, q, sizeof q, NULL, 0) && !*q, "org/name parses");
    CHECK(hf_name_parse("org/name:Q8_0@refs/pr/1", r, sizeof r, q, sizeof q, v, sizeof v) &&
              !strcmp(r, "org/name") && !strcmp(q, "Q8_0") && !strcmp(v, "refs/pr/1"),
          "org/name:Q8_0@refs/pr/1 parses");
    CHECK(hf_name_parse("org/name@v1.0", r, sizeof r, q, sizeof q, v, sizeof v) && !*q &&
              !strcmp(v, "v1.0"),
          "org/name@v1.0 parses");
    CHECK(!hf_name_parse("org/name@v1.0", r, sizeof r, q, sizeof q, NULL, 0),
          "a revision is refused where none is asked for");
    static const char *const not_names[] = {"/abs/path",
                                            "a/b/c",
                                            "name",
                                            "./x",
                                            "../x",
                                            "org/",
                                            "/name",
                                            "org/name:",
                                            "o rg/name",
                                            "org/name@",
                                            "org/name@a/../b",
                                            "org/name@/x",
                                            "org/n@a@b",
                                            "org/name@a/",
                                            "org/name@a b",
                                            "@x/y",
                                            "org/name:@main"};
    for (size_t i = 0; i < sizeof not_names / sizeof *not_names; i++)
        CHECK(!hf_name_parse(not_names[i], r, sizeof r, q, sizeof q, v, sizeof v), "%s is no name",
              not_names[i]);
}

int main(void) {
    check_tags();
    snprintf(root, sizeof root, "/tmp/celer-hf-%d", (int)getpid());
    const char *c1 = "0123456789abcdef0123456789abcdef01234567";
    const char *gguf[] = {"tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf", "mmproj-tiny-f16.gguf",
                          "README.md"};
    repo("hub/models--org--tiny-GGUF", c1, gguf, 4, "GGUF....");
    const char *two[] = {"a-Q8_0.gguf", "sub/a-F16.gguf", "b-Q4_K_S.gguf", "b-Q4_K_L.gguf"};
    repo("hub/models--org--two", c1, two, 4, "GGUF");
    const char *one[] = {"only-Q2_K.gguf", "mmproj-model-f16.gguf"};
    repo("hub/models--org--one", c1, one, 2, "GGUF");
    const char *mlx[] = {"config.json", "model.safetensors"};
    repo("hub/models--mlx-community--tiny-4bit", c1, mlx, 2,
         "{\"quantization\": {\"bits\": 4, \"group_size\": 64}}");
    const char *bf16[] = {"config.json", "model.safetensors"};
    repo("hub/models--org--Tiny-bf16", "fedcba9876543210fedcba9876543210fedcba98", bf16, 2,
         "{\"torch_dtype\": \"bfloat16\"}");
    put("hub/models--org--broken/refs/main", "1111111111111111111111111111111111111111");
    put("hub/datasets--org--data/refs/main", c1);
    put("hub/.locks/x", "");

    char hub[512];
    snprintf(hub, sizeof hub, "%s/hub", root);
    setenv("HF_HUB_CACHE", hub, 1);
    expect_path("org/tiny-GGUF",
                "/snapshots/0123456789abcdef0123456789abcdef01234567/tiny-Q4_K_M.gguf");
    expect_path("org/tiny-GGUF:Q8_0", "/tiny-Q8_0.gguf");
    expect_path("org/tiny-GGUF:q8_0", "/tiny-Q8_0.gguf");
    expect_path("org/tiny-GGUF:Q4_K_M", "/tiny-Q4_K_M.gguf");
    expect_path("org/one", "/only-Q2_K.gguf"); /* the only GGUF, the projector aside */
    expect_path("org/two:f16", "/sub/a-F16.gguf");
    expect_path("mlx-community/tiny-4bit", "/snapshots/0123456789abcdef0123456789abcdef01234567");
    expect_error("org/two", CELER_STATUS_INVALID_ARGUMENT, "none is Q4_K_M");
    expect_error("org/two", CELER_STATUS_INVALID_ARGUMENT, "Q8_0, Q4_K_L, Q4_K_S, F16");
    expect_error("org/two:Q4_K", CELER_STATUS_INVALID_ARGUMENT, "ambiguous");
    expect_error("org/two:Q5_K_M", CELER_STATUS_NOT_FOUND, "no GGUF file for quant Q5_K_M");
    expect_error("org/missing", CELER_STATUS_NOT_FOUND, "not in the Hugging Face cache");
    expect_error("org/missing", CELER_STATUS_NOT_FOUND, hub);
    expect_error("org/broken", CELER_STATUS_NOT_FOUND, "incomplete download");
    expect_error("mlx-community/tiny-4bit:Q4_K_M", CELER_STATUS_INVALID_ARGUMENT, "holds none");

    /* revisions: refs/<rev>, a commit hash without a ref, an absent one */
    put("hub/models--org--tiny-GGUF/refs/refs/pr/1", c1);
    expect_path("org/tiny-GGUF:Q8_0@refs/pr/1",
                "/0123456789abcdef0123456789abcdef01234567/tiny-Q8_0.gguf");
    char at_commit[128];
    snprintf(at_commit, sizeof at_commit, "org/tiny-GGUF@%s", c1);
    expect_path(at_commit, "/tiny-Q4_K_M.gguf");
    expect_error("org/tiny-GGUF@v9", CELER_STATUS_NOT_FOUND, "revision v9 is not in the");

    /* a local path wins over the name */
    char cwd[1024], local[1024];
    CHECK(getcwd(cwd, sizeof cwd) != NULL, "getcwd");
    CHECK(chdir(root) == 0, "chdir");
    put("org/tiny-GGUF", "local");
    expect_path("org/tiny-GGUF", "org/tiny-GGUF");
    snprintf(local, sizeof local, "%s/org/tiny-GGUF", root);
    unlink(local);
    expect_path("org/tiny-GGUF", "/tiny-Q4_K_M.gguf");
    CHECK(chdir(cwd) == 0, "chdir back");
    expect_path("/nonexistent/model.gguf", "/nonexistent/model.gguf"); /* for the open to report */

    /* HF_HOME/hub, then HOME/.cache/huggingface/hub */
    unsetenv("HF_HUB_CACHE");
    setenv("HF_HOME", root, 1);
    expect_path("org/tiny-GGUF:Q8_0", "/tiny-Q8_0.gguf");
    unsetenv("HF_HOME");
    char home[512];
    snprintf(home, sizeof home, "%s/home", root);
    setenv("HOME", home, 1);
    char rel[600];
    snprintf(rel, sizeof rel, "home/.cache/huggingface/hub/models--org--one/refs/main");
    put(rel, c1);
    expect_error("org/one", CELER_STATUS_NOT_FOUND, "/home/.cache/huggingface/hub");
    setenv("HF_HUB_CACHE", hub, 1);

    /* the listing */
    celer_cached_model *m;
    int64_t n;
    char err[512];
    CHECK(celer_hf_cache_list(&m, &n, err, sizeof err) == CELER_OK, "list: %s", err);
    static const char *const want[][3] = {
        {"mlx-community/tiny-4bit", "0123456789abcdef0123456789abcdef01234567", "mlx 4-bit"},
        {"org/broken", "", "no snapshot"},
        {"org/one", "0123456789abcdef0123456789abcdef01234567", "gguf: Q2_K (only-Q2_K.gguf)"},
        {"org/Tiny-bf16", "fedcba9876543210fedcba9876543210fedcba98", "safetensors bfloat16"},
        {"org/tiny-GGUF", "0123456789abcdef0123456789abcdef01234567",
         "gguf: Q4_K_M (tiny-Q4_K_M.gguf), Q8_0 (tiny-Q8_0.gguf)"},
        {"org/two", "0123456789abcdef0123456789abcdef01234567",
         "gguf: Q8_0 (a-Q8_0.gguf), Q4_K_L (b-Q4_K_L.gguf), Q4_K_S (b-Q4_K_S.gguf), F16 "
         "(sub/a-F16.gguf)"},
    };
    CHECK(n == 6, "list: %lld models, expected 6", (long long)n);
    for (int64_t i = 0; i < n && i < 6; i++)
        CHECK(!strcmp(m[i].repo, want[i][0]) && !strcmp(m[i].revision, want[i][1]) &&
                  !strncmp(m[i].format, want[i][2], strlen(want[i][2])),
              "list[%lld]: %s %s \"%s\", expected %s %s \"%s\"", (long long)i, m[i].repo,
              m[i].revision, m[i].format, want[i][0], want[i][1], want[i][2]);
    if (n == 6)
        CHECK(m[4].bytes == 4 * 8, "tiny-GGUF: %lld bytes, expected 32 (links followed)",
              (long long)m[4].bytes);
    free(m);
    setenv("HF_HUB_CACHE", "/nonexistent-celer-cache", 1);
    CHECK(celer_hf_cache_list(&m, &n, err, sizeof err) == CELER_OK && n == 0,
          "a missing cache lists nothing");
    free(m);
    setenv("HF_HUB_CACHE", "/etc/passwd", 1);
    CHECK(celer_hf_cache_list(&m, &n, err, sizeof err) == CELER_STATUS_IO &&
              strstr(err, "/etc/passwd"),
          "a cache that is no directory: %s", err);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0, "clean up");
    return harness_done("test_hf_cache");
}

/*
 * test_hf_repo.c - the Hub's model-info answer as the downloader checks it (src/io/hf_repo.c):
 * what parses, what is refused with one line (not JSON, no commit, bad paths, sizes out of
 * range, a malformed LFS entry, a file listed twice), and which files a name picks (one
 * quant with every part of its split, never mmproj; a checkpoint's config, weights and
 * tokenizer files, never other weights). No network, no files.
 */
#include "harness.h"
#include "io/hf_repo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COMMIT "0123456789abcdef0123456789abcdef01234567"
#define SHA    "6bab35ed969d2d496458d5d035059f8d6aa56d026655c72feccf357d9256801e"

/* Parses json; on success the caller frees info. */
static celer_status parse(const char *json, hf_repo_info *info, celer_error *e) {
    return hf_repo_info_parse(json, strlen(json), "org/x", info, e);
}

static void expect_refused(const char *json, const char *needle) {
    hf_repo_info info;
    celer_error e = {{0}};
    celer_status s = parse(json, &info, &e);
    CHECK(s == CELER_STATUS_BAD_FILE && strstr(e.msg, needle) && !strchr(e.msg, '\n') &&
              info.files == NULL,
          "refused (%s): %s", needle, e.msg);
}

/* The paths quant picks from the files of json, joined by ' ', into out[cap]; or the error. */
static celer_status pick(const char *json, const char *quant, char *out, size_t cap) {
    hf_repo_info info;
    celer_error e = {{0}};
    out[0] = 0;
    celer_status s = parse(json, &info, &e);
    if (!CHECK(s == CELER_OK, "parse for a pick: %s", e.msg)) return s;
    int *idx, n;
    s = hf_repo_select(&info, "org/x", quant, &idx, &n, &e);
    if (s == CELER_OK) {
        size_t k = 0;
        for (int i = 0; i < n; i++)
            k += (size_t)snprintf(out + k, cap - k, "%s%s", i ? " " : "", info.files[idx[i]].path);
        free(idx);
    } else {
        snprintf(out, cap, "%s", e.msg);
    }
    hf_repo_info_free(&info);
    return s;
}

static void check_parse(void) {
    hf_repo_info info;
    celer_error e = {{0}};
    const char *ok = "{\"sha\":\"" COMMIT "\",\"siblings\":[{\"rfilename\":\"a-Q8_0.gguf\","
                     "\"size\":10,\"lfs\":{\"sha256\":\"" SHA "\",\"size\":10}},"
                     "{\"rfilename\":\"sub/README.md\"},{\"rfilename\":\".gitattributes\","
                     "\"size\":3,\"lfs\":null}]}";
    CHECK(parse(ok, &info, &e) == CELER_OK, "a listing parses: %s", e.msg);
    CHECK(!strcmp(info.commit, COMMIT) && info.n_files == 3, "commit and %d files", info.n_files);
    if (info.n_files == 3) {
        CHECK(!strcmp(info.files[0].path, "a-Q8_0.gguf") && info.files[0].size == 10 &&
                  !strcmp(info.files[0].sha256, SHA),
              "an LFS file: size and sha256");
        CHECK(info.files[1].size == -1 && !info.files[1].sha256[0], "no size, no LFS");
        CHECK(info.files[2].size == 3 && !info.files[2].sha256[0], "lfs: null is no LFS");
    }
    hf_repo_info_free(&info);

    expect_refused("<html>503</html>", "not the JSON expected");
    expect_refused("[]", "no commit");
    expect_refused("{\"sha\":\"main\",\"siblings\":[]}", "no commit");
    expect_refused("{\"sha\":\"" COMMIT "\"}", "siblings");
    expect_refused("{\"sha\":\"" COMMIT "\",\"siblings\":[3]}", "siblings[0] has no rfilename");
    static const char *const bad_paths[] = {
        "../evil.gguf", "a/../../evil.gguf", "/abs.gguf", "a\\\\b.gguf",
        "a//b.gguf",    "./a.gguf",          "a/",        "",
        "a\\u0001b",    "a\\u0000b"};
    char json[512];
    for (size_t i = 0; i < sizeof bad_paths / sizeof *bad_paths; i++) {
        snprintf(json, sizeof json,
                 "{\"sha\":\"" COMMIT "\",\"siblings\":[{\"rfilename\":\"%s\"}]}", bad_paths[i]);
        expect_refused(json, "org/x");
    }
    expect_refused("{\"sha\":\"" COMMIT "\",\"siblings\":[{\"rfilename\":\"a\",\"size\":-1}]}",
                   "size out of range");
    expect_refused("{\"sha\":\"" COMMIT "\",\"siblings\":[{\"rfilename\":\"a\",\"size\":1e3}]}",
                   "size out of range");
    expect_refused("{\"sha\":\"" COMMIT "\",\"siblings\":[{\"rfilename\":\"a\","
                   "\"size\":2000000000000}]}",
                   "size out of range");
    expect_refused("{\"sha\":\"" COMMIT "\",\"siblings\":[{\"rfilename\":\"a\","
                   "\"lfs\":{\"sha256\":\"abc\"}}]}",
                   "LFS entry");
    expect_refused("{\"sha\":\"" COMMIT "\",\"siblings\":[{\"rfilename\":\"a\",\"size\":4,"
                   "\"lfs\":{\"sha256\":\"" SHA "\",\"size\":5}}]}",
                   "LFS entry");
    expect_refused("{\"sha\":\"" COMMIT "\",\"siblings\":[{\"rfilename\":\"a\"},"
                   "{\"rfilename\":\"a\"}]}",
                   "twice");
    CHECK(hf_path_ok("Q8_0/x-Q8_0.gguf") && hf_path_ok(".gitattributes") && hf_path_ok("...") &&
              !hf_path_ok("..") && !hf_path_ok("a/./b"),
          "hf_path_ok");
}

static void check_select(void) {
    char got[1024];
    const char *gguf = "{\"sha\":\"" COMMIT "\",\"siblings\":["
                       "{\"rfilename\":\"README.md\"},{\"rfilename\":\"x-Q4_K_M.gguf\"},"
                       "{\"rfilename\":\"x-Q8_0.gguf\"},{\"rfilename\":\"mmproj-x-F16.gguf\"},"
                       "{\"rfilename\":\"config.json\"},"
                       "{\"rfilename\":\"Q2_K/x-Q2_K-00002-of-00002.gguf\"},"
                       "{\"rfilename\":\"Q2_K/x-Q2_K-00001-of-00002.gguf\"},"
                       "{\"rfilename\":\"x-Q3_K_M-00001-of-00002.gguf\"}]}";
    CHECK(pick(gguf, "", got, sizeof got) == CELER_OK && !strcmp(got, "x-Q4_K_M.gguf"),
          "default: Q4_K_M (%s)", got);
    CHECK(pick(gguf, "q8_0", got, sizeof got) == CELER_OK && !strcmp(got, "x-Q8_0.gguf"),
          "q8_0 (%s)", got);
    CHECK(pick(gguf, "Q2_K", got, sizeof got) == CELER_OK &&
              !strcmp(got, "Q2_K/x-Q2_K-00001-of-00002.gguf Q2_K/x-Q2_K-00002-of-00002.gguf"),
          "a split: every part, in order (%s)", got);
    CHECK(pick(gguf, "Q3_K_M", got, sizeof got) == CELER_STATUS_NOT_FOUND &&
              strstr(got, "x-Q3_K_M-00002-of-00002.gguf is not in the repository"),
          "a split missing a part (%s)", got);
    CHECK(pick(gguf, "F16", got, sizeof got) == CELER_STATUS_NOT_FOUND &&
              strstr(got, "no GGUF file for quant F16"),
          "mmproj is never the model (%s)", got);
    const char *mlx =
        "{\"sha\":\"" COMMIT "\",\"siblings\":["
        "{\"rfilename\":\"config.json\"},{\"rfilename\":\"model.safetensors\"},"
        "{\"rfilename\":\"model.safetensors.index.json\"},"
        "{\"rfilename\":\"tokenizer.json\"},{\"rfilename\":\"tokenizer.model\"},"
        "{\"rfilename\":\"chat_template.jinja\"},{\"rfilename\":\"merges.txt\"},"
        "{\"rfilename\":\"pytorch_model.bin\"},{\"rfilename\":\"flax_model.msgpack\"},"
        "{\"rfilename\":\"tf_model.h5\"},{\"rfilename\":\"README.md\"},"
        "{\"rfilename\":\"original/model.safetensors\"}]}";
    CHECK(pick(mlx, "", got, sizeof got) == CELER_OK &&
              !strcmp(got, "config.json model.safetensors model.safetensors.index.json "
                           "tokenizer.json tokenizer.model chat_template.jinja merges.txt"),
          "a checkpoint: config, weights, tokenizer and template files (%s)", got);
    CHECK(pick(mlx, "Q4_K_M", got, sizeof got) == CELER_STATUS_NOT_FOUND &&
              strstr(got, "holds none"),
          "a quant of a checkpoint (%s)", got);
    CHECK(pick("{\"sha\":\"" COMMIT "\",\"siblings\":[{\"rfilename\":\"README.md\"}]}", "", got,
               sizeof got) == CELER_STATUS_NOT_FOUND &&
              strstr(got, "neither GGUF files nor config.json"),
          "no model (%s)", got);
}

int main(void) {
    check_parse();
    check_select();
    return harness_done("test_hf_repo");
}

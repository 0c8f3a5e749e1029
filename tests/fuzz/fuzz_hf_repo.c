/*
 * fuzz_hf_repo.c - libFuzzer target for the Hub's model-info answer (src/io/hf_repo.c): the
 * commit and file list a downloader builds cache paths from.
 *
 * The input is the answer's body. A parse must either fail with a one-line message, or
 * give a commit of 40 lower-case hex digits and files whose paths hf_path_ok accepts (no
 * "..", nothing absolute, no backslash or control character), sizes in range and sha256s
 * of 64 hex digits; the file choice for a few quants must then name distinct files of the
 * list, or fail with one line. Never crash, leak, or read past the input (which is not
 * NUL-terminated).
 */
#include "io/hf_repo.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Aborts (a finding) unless msg is one non-empty printable line. */
static void check_message(const char *msg) {
    if (!msg[0]) abort();
    for (const char *p = msg; *p; p++)
        if ((unsigned char)*p < 0x20) abort();
}

/* Whether path stays below the folder it is joined to (checked apart from hf_path_ok). */
static bool path_safe(const char *path) {
    if (!path[0] || path[0] == '/' || strchr(path, '\\')) return false;
    for (const char *p = path;;) {
        const size_t n = strcspn(p, "/");
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && !strncmp(p, "..", 2))) return false;
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)p[i] < 0x20) return false;
        if (!p[n]) return true;
        p += n + 1;
    }
}

static void check_info(const hf_repo_info *info) {
    if (strlen(info->commit) != 40 || strspn(info->commit, "0123456789abcdef") != 40) abort();
    for (int i = 0; i < info->n_files; i++) {
        const hf_file *f = &info->files[i];
        if (!f->path || !path_safe(f->path)) abort();
        if (f->size < -1 || f->size > HF_MAX_FILE_BYTES) abort();
        if (f->sha256[0] &&
            (strlen(f->sha256) != 64 || strspn(f->sha256, "0123456789abcdef") != 64))
            abort();
    }
}

static void check_select(const hf_repo_info *info, const char *quant) {
    int *idx, n;
    celer_error e = {{0}};
    if (hf_repo_select(info, "org/fuzz", quant, &idx, &n, &e) != CELER_OK) {
        check_message(e.msg);
        return;
    }
    for (int i = 0; i < n; i++) {
        if (idx[i] < 0 || idx[i] >= info->n_files) abort();
        for (int j = 0; j < i; j++)
            if (idx[j] == idx[i]) abort();
    }
    free(idx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* The body in a buffer of exactly its size, so reading past it is caught. */
    char *body = malloc(size ? size : 1);
    if (!body) return 0;
    memcpy(body, data, size);
    hf_repo_info info;
    celer_error e = {{0}};
    if (hf_repo_info_parse(body, size, "org/fuzz", &info, &e) == CELER_OK) {
        check_info(&info);
        static const char *const quants[] = {"", "Q4_K_M", "q8_0", "F16"};
        for (size_t i = 0; i < sizeof quants / sizeof *quants; i++) check_select(&info, quants[i]);
        hf_repo_info_free(&info);
    } else {
        check_message(e.msg);
    }
    free(body);
    return 0;
}

/*
 * hf_repo.c - the Hub's model-info answer, checked, and the files a model needs from it (see
 * hf_repo.h). The quant choice is hf_cache's (hf_gguf_choose), so a name picks the same file
 * on the Hub as in the cache.
 */
#define _DEFAULT_SOURCE
#include "io/hf_repo.h"

#include "io/hf_cache.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ==== Checks ==== */

void hf_printable(const char *s, size_t len, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < len && s[i] && k + 1 < cap; i++)
        out[k++] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    if (cap) out[k] = 0;
}

bool hf_path_ok(const char *path) {
    const size_t n = strlen(path);
    if (n == 0 || n > HF_MAX_REL || path[0] == '/') return false;
    for (const char *p = path;;) {
        const size_t k = strcspn(p, "/");
        if (k == 0 || (k == 1 && p[0] == '.') || (k == 2 && p[0] == '.' && p[1] == '.'))
            return false;
        for (size_t i = 0; i < k; i++)
            if ((unsigned char)p[i] < 0x20 || p[i] == 0x7f || p[i] == '\\') return false;
        if (!p[k]) return true;
        p += k + 1;
    }
}

static bool is_hex(const char *s, size_t n) {
    if (strlen(s) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i])) return false;
    return true;
}

/* A size field: absent (-1 into *size), or an integer 0..HF_MAX_FILE_BYTES. */
static bool size_ok(const json_t *v, int64_t *size) {
    if (!v || json_is_null(v)) {
        *size = -1;
        return true;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) > HF_MAX_FILE_BYTES)
        return false;
    *size = (int64_t)json_integer_value(v);
    return true;
}

/* ==== Parsing ==== */

void hf_repo_info_free(hf_repo_info *info) {
    for (int i = 0; i < info->n_files; i++) free(info->files[i].path);
    free(info->files);
    info->files = NULL, info->n_files = 0;
}

static int path_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* One element of "siblings" into f. */
static celer_status sibling_parse(const json_t *s, size_t i, const char *repo, hf_file *f,
                                  celer_error *e) {
    char shown[96];
    const json_t *name = json_object_get(s, "rfilename");
    if (!json_is_object(s) || !json_is_string(name))
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: the Hub's file list is not the JSON expected (siblings[%zu] has no "
                         "rfilename)",
                         repo, i);
    const char *path = json_string_value(name);
    hf_printable(path, json_string_length(name), shown, sizeof shown);
    if (strlen(path) != json_string_length(name) || !hf_path_ok(path))
        return error_set(
            e, CELER_STATUS_BAD_FILE,
            "%s: the Hub's file list names \"%s\", not a relative path celer writes (an "
            "absolute path, \"..\", a backslash or a control character)",
            repo, shown);
    const json_t *lfs = json_object_get(s, "lfs");
    int64_t lfs_size = -1;
    if (!size_ok(json_object_get(s, "size"), &f->size))
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: the Hub's file list gives %s a size out of range", repo, shown);
    if (lfs && !json_is_null(lfs)) {
        const char *sha = json_string_value(json_object_get(lfs, "sha256"));
        if (!json_is_object(lfs) || !sha || !is_hex(sha, 64) ||
            !size_ok(json_object_get(lfs, "size"), &lfs_size) ||
            (lfs_size >= 0 && f->size >= 0 && lfs_size != f->size))
            return error_set(e, CELER_STATUS_BAD_FILE,
                             "%s: the Hub's file list gives %s an LFS entry that is not the JSON "
                             "expected (a sha256 of 64 hex digits and its size)",
                             repo, shown);
        for (int k = 0; k < 64; k++) f->sha256[k] = (char)tolower((unsigned char)sha[k]);
        f->sha256[64] = 0;
        if (f->size < 0) f->size = lfs_size;
    }
    f->path = strdup(path);
    if (!f->path) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    return CELER_OK;
}

/* Fails when two files of info share a path. */
static celer_status duplicates_check(const hf_repo_info *info, const char *repo, celer_error *e) {
    if (info->n_files < 2) return CELER_OK;
    const char **p = malloc(sizeof *p * (size_t)info->n_files);
    if (!p) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < info->n_files; i++) p[i] = info->files[i].path;
    qsort(p, (size_t)info->n_files, sizeof *p, path_cmp);
    celer_status rc = CELER_OK;
    char shown[96];
    for (int i = 1; i < info->n_files && rc == CELER_OK; i++)
        if (!strcmp(p[i - 1], p[i])) {
            hf_printable(p[i], strlen(p[i]), shown, sizeof shown);
            rc = error_set(e, CELER_STATUS_BAD_FILE, "%s: the Hub's file list names %s twice", repo,
                           shown);
        }
    free(p);
    return rc;
}

celer_status hf_repo_info_parse(const char *json, size_t len, const char *repo, hf_repo_info *info,
                                celer_error *e) {
    memset(info, 0, sizeof *info);
    if (len > HF_MAX_LISTING)
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: the Hub's file list is %zu bytes, more than the %d allowed", repo,
                         len, HF_MAX_LISTING);
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    char why[128];
    if (!root) {
        hf_printable(je.text, strlen(je.text), why, sizeof why);
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: the Hub's file list is not the JSON expected (line %d: %s)", repo,
                         je.line, why);
    }
    celer_status rc = CELER_OK;
    const char *sha = json_string_value(json_object_get(root, "sha"));
    const json_t *sib = json_object_get(root, "siblings");
    if (!json_is_object(root) || !sha || strlen(sha) != 40 ||
        strspn(sha, "0123456789abcdef") != 40) {
        rc = error_set(e, CELER_STATUS_BAD_FILE,
                       "%s: the Hub's answer is not the JSON expected (no commit \"sha\" of 40 "
                       "hex digits)",
                       repo);
    } else if (!json_is_array(sib) || json_array_size(sib) > HF_MAX_FILES) {
        rc = error_set(e, CELER_STATUS_BAD_FILE,
                       "%s: the Hub's answer is not the JSON expected (\"siblings\" is not a list "
                       "of at most %d files)",
                       repo, HF_MAX_FILES);
    } else {
        memcpy(info->commit, sha, 41);
        const size_t n = json_array_size(sib);
        info->files = calloc(n ? n : 1, sizeof *info->files);
        if (!info->files) rc = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        for (size_t i = 0; rc == CELER_OK && i < n; i++) {
            rc = sibling_parse(json_array_get(sib, i), i, repo, &info->files[i], e);
            if (rc == CELER_OK) info->n_files++;
        }
        if (rc == CELER_OK) rc = duplicates_check(info, repo, e);
    }
    json_decref(root);
    if (rc != CELER_OK) hf_repo_info_free(info);
    return rc;
}

/* ==== Choosing the files ==== */

static bool ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcasecmp(s + n - k, suffix);
}

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static int find_path(const hf_repo_info *info, const char *path) {
    for (int i = 0; i < info->n_files; i++)
        if (!strcmp(info->files[i].path, path)) return i;
    return -1;
}

/* A top-level file a checkpoint directory needs. */
static bool is_checkpoint_file(const char *path) {
    if (strchr(path, '/')) return false;
    return ends_with(path, ".json") || ends_with(path, ".safetensors") ||
           ends_with(path, ".jinja") || !strcmp(path, "tokenizer.model") ||
           !strcmp(path, "merges.txt") || !strcmp(path, "vocab.txt");
}

/* The GGUF file of info that quant picks, with the other parts of its split, into idx. */
static celer_status gguf_select(const hf_repo_info *info, const hf_gguf_file *g, int n_g,
                                const char *repo, const char *quant, int *idx, int *n,
                                celer_error *e) {
    int pick, part, count;
    celer_status rc = hf_gguf_choose(g, n_g, repo, quant, &pick, e);
    if (rc != CELER_OK) return rc;
    const char *rel = g[pick].rel;
    if (!hf_gguf_shard(rel, &part, &count) || count < 1) {
        idx[(*n)++] = find_path(info, rel);
        return CELER_OK;
    }
    if (count > info->n_files)
        return error_set(e, CELER_STATUS_BAD_FILE,
                         "%s: %s names %d parts, more than the repository's %d files", repo, rel,
                         count, info->n_files);
    char name[HF_MAX_REL + 1];
    const size_t k = strlen(rel) - 19; /* where the part number starts */
    for (int i = 1; i <= count; i++) {
        snprintf(name, sizeof name, "%.*s%05d%s", (int)k, rel, i, rel + k + 5);
        const int j = find_path(info, name);
        if (j < 0)
            return error_set(e, CELER_STATUS_NOT_FOUND,
                             "%s: %s is split in %d parts, but part %s is not in the repository",
                             repo, rel, count, name);
        idx[(*n)++] = j;
    }
    return CELER_OK;
}

celer_status hf_repo_select(const hf_repo_info *info, const char *repo, const char *quant,
                            int **idx, int *n, celer_error *e) {
    *idx = NULL, *n = 0;
    int *out = malloc(sizeof *out * (size_t)(info->n_files ? info->n_files : 1));
    hf_gguf_file *g = malloc(sizeof *g * (size_t)(info->n_files ? info->n_files : 1));
    celer_status rc = CELER_OK;
    if (!out || !g) {
        rc = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    int n_g = 0;
    bool config = false;
    for (int i = 0; i < info->n_files; i++) {
        const char *p = info->files[i].path;
        if (!strcmp(p, "config.json")) config = true;
        if (!hf_gguf_is_model(base_name(p))) continue;
        snprintf(g[n_g].rel, sizeof g[n_g].rel, "%s", p);
        hf_gguf_tag(p, g[n_g].tag, sizeof g[n_g].tag);
        n_g++;
    }
    if (n_g > 1) qsort(g, (size_t)n_g, sizeof *g, hf_gguf_cmp);
    if (n_g > 0) {
        rc = gguf_select(info, g, n_g, repo, quant, out, n, e);
    } else if (*quant) {
        rc = error_set(e, CELER_STATUS_NOT_FOUND,
                       "%s: :%s picks a GGUF file, but the repository holds none", repo, quant);
    } else if (!config) {
        rc = error_set(e, CELER_STATUS_NOT_FOUND,
                       "%s: the repository holds neither GGUF files nor config.json: no model "
                       "celer opens",
                       repo);
    } else {
        for (int i = 0; i < info->n_files; i++)
            if (is_checkpoint_file(info->files[i].path)) out[(*n)++] = i;
    }
out:
    free(g);
    if (rc != CELER_OK) {
        free(out);
        *n = 0;
    } else {
        *idx = out;
    }
    return rc;
}

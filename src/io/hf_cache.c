/*
 * hf_cache.c - models by name in the Hugging Face hub cache (see hf_cache.h): the name
 * grammar, the quant tag of a GGUF file name, choosing the file of a repository, and the
 * listing of every cached repository.
 *
 * The layout is huggingface_hub's: <root>/models--ORG--NAME/{refs/main, snapshots/<commit>/,
 * blobs/}. Only what refs/main names is read (or the one snapshot when refs/ is missing, as
 * a copied cache may have). Downloads are not done here.
 */
#define _DEFAULT_SOURCE
#include "io/hf_cache.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define HF_PATH 4096
/* Folders below a snapshot that are searched for GGUF files (repos keep quants in
 * per-quant folders, one level deep; a little more is allowed). */
#define HF_MAX_DEPTH 4

/* snprintf into out[cap]; false when the text did not fit (a path too long to use). */
static bool fmt(char *out, size_t cap, const char *f, ...) __attribute__((format(printf, 3, 4)));
static bool fmt(char *out, size_t cap, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(out, cap, f, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < cap;
}

/* ==== Names and tags ==== */

void hf_cache_root(char *out, size_t cap) {
    const char *hub = getenv("HF_HUB_CACHE"), *home = getenv("HF_HOME"), *user = getenv("HOME");
    if (hub && *hub)
        snprintf(out, cap, "%s", hub);
    else if (home && *home)
        snprintf(out, cap, "%s/hub", home);
    else
        snprintf(out, cap, "%s/.cache/huggingface/hub", user && *user ? user : ".");
}

static bool name_part_ok(const char *s, size_t n) {
    if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.')) return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("._-", s[i])) return false;
    return true;
}

/* A revision: a branch, tag or commit ("main", "v1.0", "refs/pr/1", a commit hash): parts of
 * name_part_ok's characters joined by '/'. */
static bool rev_ok(const char *s) {
    for (;;) {
        const size_t n = strcspn(s, "/");
        if (!name_part_ok(s, n)) return false;
        if (!s[n]) return true;
        s += n + 1;
    }
}

bool hf_name_parse(const char *s, char *repo, size_t repo_cap, char *quant, size_t quant_cap,
                   char *rev, size_t rev_cap) {
    const char *at = strchr(s, '@');
    const char *end = at ? at : s + strlen(s);
    const char *slash = memchr(s, '/', (size_t)(end - s));
    if (!slash || memchr(slash + 1, '/', (size_t)(end - slash - 1))) return false;
    const char *colon = memchr(slash + 1, ':', (size_t)(end - slash - 1));
    const size_t n_org = (size_t)(slash - s);
    const size_t n_name = (size_t)((colon ? colon : end) - slash - 1);
    const size_t n_quant = colon ? (size_t)(end - colon - 1) : 0;
    if (!name_part_ok(s, n_org) || !name_part_ok(slash + 1, n_name)) return false;
    if (colon && !name_part_ok(colon + 1, n_quant)) return false;
    if (at && (!rev || !rev_ok(at + 1) || strlen(at + 1) >= rev_cap)) return false;
    if (n_org + 1 + n_name >= repo_cap || n_quant >= quant_cap) return false;
    snprintf(repo, repo_cap, "%.*s", (int)(n_org + 1 + n_name), s);
    snprintf(quant, quant_cap, "%.*s", (int)n_quant, colon ? colon + 1 : "");
    if (rev) snprintf(rev, rev_cap, "%s", at ? at + 1 : "main");
    return true;
}

/* Whether the upper-case token t[n] is a quant tag: Q4_K_M, IQ4_XS, TQ1_0, Q8_0, F16, BF16,
 * F32, MXFP4. */
static bool is_tag(const char *t, size_t n) {
    static const char *const plain[] = {"F16", "F32", "BF16", "F64", "MXFP4"};
    for (size_t i = 0; i < sizeof plain / sizeof *plain; i++)
        if (n == strlen(plain[i]) && !memcmp(t, plain[i], n)) return true;
    size_t k = 0;
    if (n > 2 && (!memcmp(t, "IQ", 2) || !memcmp(t, "TQ", 2)))
        k = 2;
    else if (n > 1 && t[0] == 'Q')
        k = 1;
    else
        return false;
    if (!isdigit((unsigned char)t[k])) return false;
    for (; k < n; k++)
        if (!isupper((unsigned char)t[k]) && !isdigit((unsigned char)t[k]) && t[k] != '_')
            return false;
    return true;
}

/* Whether the n bytes at s read "-NNNNN-of-NNNNN" (a split GGUF's shard suffix). */
static bool is_shard_suffix(const char *s, size_t n) {
    return n == 15 && s[0] == '-' && !strncmp(s + 6, "-of-", 4) &&
           strspn(s + 1, "0123456789") == 5 && strspn(s + 10, "0123456789") == 5;
}

void hf_gguf_tag(const char *file, char *tag, size_t cap) {
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    char up[256];
    size_t n = strlen(base);
    if (n >= sizeof up) n = sizeof up - 1;
    for (size_t i = 0; i < n; i++) up[i] = (char)toupper((unsigned char)base[i]);
    up[n] = 0;
    if (n > 5 && !strcmp(up + n - 5, ".GGUF")) n -= 5;
    if (n > 15 && is_shard_suffix(up + n - 15, 15)) n -= 15;
    up[n] = 0;
    tag[0] = 0;
    /* the last '-' or '.' separated token that is a tag */
    size_t end = n;
    while (end > 0) {
        size_t start = end;
        while (start > 0 && up[start - 1] != '-' && up[start - 1] != '.') start--;
        if (is_tag(up + start, end - start)) {
            snprintf(tag, cap, "%.*s", (int)(end - start), up + start);
            return;
        }
        if (start == 0) break;
        end = start - 1;
    }
}

/* ==== One repository ==== */

typedef struct snapshot {
    char dir[HF_PATH]; /* <root>/models--ORG--NAME/snapshots/<commit> */
    char commit[64];
    int64_t bytes; /* every file below dir, links followed */
    hf_gguf_file *gguf;
    int n_gguf, cap_gguf;
    bool has_config;
} snapshot;

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool ends_with_ci(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcasecmp(s + n - k, suffix);
}

static bool contains_ci(const char *s, const char *needle) {
    for (size_t k = strlen(needle); *s; s++)
        if (!strncasecmp(s, needle, k)) return true;
    return false;
}

bool hf_gguf_shard(const char *name, int *part, int *count) {
    const size_t n = strlen(name);
    if (n < 20 || !ends_with_ci(name, ".gguf") || !is_shard_suffix(name + n - 20, 15)) return false;
    *part = atoi(name + n - 19);
    *count = atoi(name + n - 10);
    return true;
}

bool hf_gguf_is_model(const char *name) {
    if (!ends_with_ci(name, ".gguf") || contains_ci(name, "mmproj")) return false;
    const size_t n = strlen(name);
    return n < 20 || !is_shard_suffix(name + n - 20, 15) || !strncmp(name + n - 19, "00001", 5);
}

/* Adds up the files below s->dir/rel and notes the model GGUFs; false when out of memory. */
static bool snapshot_walk(snapshot *s, const char *rel, int depth) {
    char path[HF_PATH];
    if (!fmt(path, sizeof path, "%s%s%s", s->dir, *rel ? "/" : "", rel)) return true;
    DIR *d = opendir(path);
    if (!d) return true;
    bool ok = true;
    for (struct dirent *de; ok && (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        char sub[512], full[HF_PATH];
        if (snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", de->d_name) >=
            (int)sizeof sub)
            continue;
        struct stat st;
        if (!fmt(full, sizeof full, "%s/%s", s->dir, sub) || stat(full, &st) != 0)
            continue; /* a dangling link: an incomplete download */
        if (S_ISDIR(st.st_mode)) {
            if (depth < HF_MAX_DEPTH) ok = snapshot_walk(s, sub, depth + 1);
            continue;
        }
        if (!S_ISREG(st.st_mode)) continue;
        s->bytes += (int64_t)st.st_size;
        if (!*rel && !strcmp(de->d_name, "config.json")) s->has_config = true;
        if (!hf_gguf_is_model(de->d_name)) continue;
        if (s->n_gguf == s->cap_gguf) {
            int cap = s->cap_gguf ? 2 * s->cap_gguf : 8;
            hf_gguf_file *g = realloc(s->gguf, sizeof *g * (size_t)cap);
            if (!g) {
                ok = false;
                break;
            }
            s->gguf = g, s->cap_gguf = cap;
        }
        hf_gguf_file *g = &s->gguf[s->n_gguf++];
        snprintf(g->rel, sizeof g->rel, "%s", sub);
        hf_gguf_tag(de->d_name, g->tag, sizeof g->tag);
    }
    closedir(d);
    return ok;
}

int hf_gguf_cmp(const void *a, const void *b) {
    return strcmp(((const hf_gguf_file *)a)->rel, ((const hf_gguf_file *)b)->rel);
}

static bool is_commit(const char *s) {
    return strlen(s) == 40 && strspn(s, "0123456789abcdef") == 40;
}

/* The snapshot refs/<rev> names in repo_dir: rev itself when it is a commit hash without a
 * ref, or for "main" the one snapshot when refs/main is missing. Returns NOT_FOUND with the
 * reason in e when there is none. */
static celer_status snapshot_open(snapshot *s, const char *repo_dir, const char *repo,
                                  const char *rev, celer_error *e) {
    memset(s, 0, sizeof *s);
    char path[HF_PATH], snap[HF_PATH];
    fmt(path, sizeof path, "%s/refs/%s", repo_dir, rev);
    fmt(snap, sizeof snap, "%s/snapshots/%s", repo_dir, rev);
    FILE *f = fopen(path, "r");
    if (f) {
        size_t n = fread(s->commit, 1, sizeof s->commit - 1, f);
        fclose(f);
        s->commit[n] = 0;
        s->commit[strcspn(s->commit, " \t\r\n")] = 0;
        if (!*s->commit || strchr(s->commit, '/') || !strcmp(s->commit, ".."))
            return error_set(e, CELER_STATUS_BAD_FILE, "%s: expected a commit hash, found \"%s\"",
                             path, s->commit);
    } else if (is_commit(rev) && is_dir(snap)) {
        snprintf(s->commit, sizeof s->commit, "%s", rev);
    } else if (strcmp(rev, "main")) {
        return error_set(e, CELER_STATUS_NOT_FOUND,
                         "%s: revision %s is not in the Hugging Face cache (no refs/%s in %s)",
                         repo, rev, rev, repo_dir);
    } else {
        snprintf(path, sizeof path, "%s/snapshots", repo_dir);
        DIR *d = opendir(path);
        int n = 0;
        for (struct dirent *de; d && (de = readdir(d));)
            if (de->d_name[0] != '.' && n++ == 0)
                fmt(s->commit, sizeof s->commit, "%s", de->d_name);
        if (d) closedir(d);
        if (n != 1)
            return error_set(e, CELER_STATUS_NOT_FOUND,
                             "%s: the Hugging Face cache has no refs/main for it and %d snapshots "
                             "in %s (expected one)",
                             repo, n, repo_dir);
    }
    snprintf(s->dir, sizeof s->dir, "%s/snapshots/%s", repo_dir, s->commit);
    if (!is_dir(s->dir))
        return error_set(e, CELER_STATUS_NOT_FOUND,
                         "%s: refs/%s names commit %s, but %s is missing (an incomplete "
                         "download?)",
                         repo, rev, s->commit, s->dir);
    if (!snapshot_walk(s, "", 0)) {
        free(s->gguf);
        s->gguf = NULL;
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "%s: out of memory", s->dir);
    }
    if (s->n_gguf > 1) qsort(s->gguf, (size_t)s->n_gguf, sizeof *s->gguf, hf_gguf_cmp);
    return CELER_OK;
}

/* "Q4_K_M, Q8_0" (a file's name where it carries no tag) into out[cap]; the n files of idx,
 * or all n_g of g when idx is NULL. */
static void tag_list(const hf_gguf_file *g, int n_g, const int *idx, int n, char *out, size_t cap) {
    size_t k = 0;
    out[0] = 0;
    for (int i = 0; i < (idx ? n : n_g) && k < cap; i++) {
        const hf_gguf_file *f = &g[idx ? idx[i] : i];
        k += (size_t)snprintf(out + k, cap - k, "%s%s", i ? ", " : "", *f->tag ? f->tag : f->rel);
    }
}

celer_status hf_gguf_choose(const hf_gguf_file *g, int n, const char *repo, const char *quant,
                            int *pick, celer_error *e) {
    char list[1024];
    *pick = -1;
    if (!*quant) {
        for (int i = 0; i < n && *pick < 0; i++)
            if (!strcmp(g[i].tag, "Q4_K_M")) *pick = i;
        if (*pick < 0 && n == 1) *pick = 0;
        if (*pick >= 0) return CELER_OK;
        tag_list(g, n, NULL, 0, list, sizeof list);
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "%s: %d GGUF files (%s) and none is Q4_K_M; name one as %s:QUANT", repo, n,
                         list, repo);
    }
    /* the tag itself first, then any file whose name holds it */
    int *hit = malloc(sizeof *hit * (size_t)(n > 0 ? n : 1)), n_hit = 0;
    if (!hit) return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < n; i++)
        if (!strcasecmp(g[i].tag, quant)) hit[n_hit++] = i;
    if (n_hit == 0)
        for (int i = 0; i < n; i++)
            if (contains_ci(g[i].rel, quant)) hit[n_hit++] = i;
    if (n_hit == 1) *pick = hit[0];
    tag_list(g, n, n_hit > 1 ? hit : NULL, n_hit, list, sizeof list);
    free(hit);
    if (n_hit == 0)
        return error_set(e, CELER_STATUS_NOT_FOUND, "%s: no GGUF file for quant %s; found %s", repo,
                         quant, list);
    if (n_hit > 1)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "%s:%s: ambiguous, %d GGUF files match (%s)", repo, quant, n_hit, list);
    return CELER_OK;
}

/* The GGUF of s that quant names ("" = the default) into path[cap]. */
static celer_status gguf_choose(const snapshot *s, const char *repo, const char *quant, char *path,
                                size_t cap, celer_error *e) {
    int pick;
    celer_status rc = hf_gguf_choose(s->gguf, s->n_gguf, repo, quant, &pick, e);
    if (rc != CELER_OK) return rc;
    if (snprintf(path, cap, "%s/%s", s->dir, s->gguf[pick].rel) >= (int)cap)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "%s: path too long", repo);
    return CELER_OK;
}

bool hf_repo_dir(const char *root, const char *repo, char *out, size_t cap) {
    const char *slash = strchr(repo, '/');
    return slash &&
           fmt(out, cap, "%s/models--%.*s--%s", root, (int)(slash - repo), repo, slash + 1);
}

celer_status hf_cache_resolve(const char *name, char *path, size_t cap, celer_error *e) {
    char repo[256], quant[HF_TAG], rev[HF_REV];
    struct stat sb;
    if (!name) return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "no model name given");
    if (stat(name, &sb) == 0 ||
        !hf_name_parse(name, repo, sizeof repo, quant, sizeof quant, rev, sizeof rev)) {
        if (snprintf(path, cap, "%s", name) >= (int)cap)
            return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "%s: path too long", name);
        return CELER_OK;
    }
    return hf_cache_find(name, path, cap, e);
}

celer_status hf_cache_find(const char *name, char *path, size_t cap, celer_error *e) {
    char repo[256], quant[HF_TAG], rev[HF_REV], root[HF_PATH], dir[HF_PATH];
    if (!hf_name_parse(name, repo, sizeof repo, quant, sizeof quant, rev, sizeof rev))
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "%s: not a model name ORG/NAME[:QUANT][@REV]", name);
    hf_cache_root(root, sizeof root);
    if (!hf_repo_dir(root, repo, dir, sizeof dir))
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "%s: path too long", root);
    if (!is_dir(dir))
        return error_set(e, CELER_STATUS_NOT_FOUND,
                         "%s: no such file or directory, and the model %s is not in the Hugging "
                         "Face cache %s (no %s there)",
                         name, repo, root, strrchr(dir, '/') + 1);
    snapshot s;
    celer_status rc = snapshot_open(&s, dir, repo, rev, e);
    if (rc != CELER_OK) return rc;
    if (s.n_gguf > 0) {
        rc = gguf_choose(&s, repo, quant, path, cap, e);
    } else if (*quant) {
        rc = error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                       "%s: :%s picks a GGUF file, but the cached snapshot %s holds none", repo,
                       quant, s.dir);
    } else if (!s.has_config) {
        rc = error_set(e, CELER_STATUS_NOT_FOUND,
                       "%s: the cached snapshot %s holds neither GGUF files nor config.json", repo,
                       s.dir);
    } else if (snprintf(path, cap, "%s", s.dir) >= (int)cap) {
        rc = error_set(e, CELER_STATUS_INVALID_ARGUMENT, "%s: path too long", s.dir);
    }
    free(s.gguf);
    return rc;
}

celer_status celer_model_resolve(const char *name, char *path, size_t path_size, char *err,
                                 size_t err_size) {
    celer_error e = {{0}};
    celer_status s = hf_cache_resolve(name, path, path_size, &e);
    error_copy(&e, err, err_size);
    return s;
}

/* ==== Listing ==== */

/* "mlx 4-bit", "safetensors bfloat16" or "safetensors" from a snapshot's config.json. */
static void config_format(const char *dir, char *out, size_t cap) {
    char path[HF_PATH];
    fmt(path, sizeof path, "%s/config.json", dir);
    json_t *cfg = json_load_file(path, 0, NULL);
    const json_t *q = json_object_get(cfg, "quantization");
    const json_t *bits = json_object_get(q, "bits");
    const char *dtype = json_string_value(json_object_get(cfg, "torch_dtype"));
    if (!dtype) dtype = json_string_value(json_object_get(cfg, "dtype"));
    if (!cfg)
        snprintf(out, cap, "config.json unreadable");
    else if (json_is_integer(bits))
        snprintf(out, cap, "mlx %lld-bit", (long long)json_integer_value(bits));
    else
        snprintf(out, cap, "safetensors%s%s", dtype ? " " : "", dtype ? dtype : "");
    json_decref(cfg);
}

static void lircentry(const char *root, const char *dirname, celer_cached_model *m) {
    memset(m, 0, sizeof *m);
    const char *org = dirname + strlen("models--"), *sep = strstr(org, "--");
    snprintf(m->repo, sizeof m->repo, "%.*s/%s", (int)(sep - org), org, sep + 2);
    char dir[HF_PATH];
    fmt(dir, sizeof dir, "%s/%s", root, dirname);
    snapshot s;
    celer_error e;
    if (snapshot_open(&s, dir, m->repo, "main", &e) != CELER_OK) {
        snprintf(m->format, sizeof m->format, "no snapshot (%s)", e.msg);
        return;
    }
    snprintf(m->revision, sizeof m->revision, "%s", s.commit);
    m->bytes = s.bytes;
    if (s.n_gguf > 0) {
        size_t k = (size_t)snprintf(m->format, sizeof m->format, "gguf:");
        for (int i = 0; i < s.n_gguf && k < sizeof m->format; i++)
            k += (size_t)snprintf(m->format + k, sizeof m->format - k, "%s %s (%s)", i ? "," : "",
                                  *s.gguf[i].tag ? s.gguf[i].tag : "?", s.gguf[i].rel);
    } else if (s.has_config) {
        config_format(s.dir, m->format, sizeof m->format);
    } else {
        snprintf(m->format, sizeof m->format, "no GGUF file, no config.json");
    }
    free(s.gguf);
}

static int model_cmp(const void *a, const void *b) {
    const celer_cached_model *x = a, *y = b;
    int c = strcasecmp(x->repo, y->repo);
    return c ? c : strcmp(x->repo, y->repo);
}

celer_status celer_hf_cache_list(celer_cached_model **models, int64_t *n, char *err,
                                 size_t err_size) {
    celer_error e = {{0}};
    celer_status st = CELER_OK;
    char root[HF_PATH];
    hf_cache_root(root, sizeof root);
    *models = NULL, *n = 0;
    DIR *d = opendir(root);
    if (!d) {
        if (errno != ENOENT)
            st = error_set(&e, CELER_STATUS_IO, "%s: cannot read the Hugging Face cache (%s)", root,
                           strerror(errno));
        error_copy(&e, err, err_size);
        return st;
    }
    int64_t cap = 0;
    for (struct dirent *de; (de = readdir(d));) {
        const char *nm = de->d_name, *sep;
        if (strncmp(nm, "models--", 8) || !(sep = strstr(nm + 8, "--")) || sep == nm + 8 || !sep[2])
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            celer_cached_model *p = realloc(*models, sizeof *p * (size_t)cap);
            if (!p) {
                st = error_set(&e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
                break;
            }
            *models = p;
        }
        lircentry(root, nm, &(*models)[(*n)++]);
    }
    closedir(d);
    if (st != CELER_OK) {
        free(*models);
        *models = NULL, *n = 0;
    } else {
        if (*n > 1) qsort(*models, (size_t)*n, sizeof **models, model_cmp);
    }
    error_copy(&e, err, err_size);
    return st;
}

/*
 * harness.c - check and skip counting, fixture and .npy readers, and the in-repository
 * tokenizers (decompressed into build/tokenizers), whole-file and golden-template readers
 * for the tests.
 */
#define _DEFAULT_SOURCE
#include "harness.h"

#include "tokenizer/chat_template.h"

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int n_pass, n_fail, n_skip;

bool check_(bool ok, const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (ok)
        n_pass++;
    else {
        n_fail++;
        fprintf(stdout, "FAIL %s:%d: ", file, line);
        vfprintf(stdout, fmt, ap);
        fputc('\n', stdout);
    }
    va_end(ap);
    fflush(stdout);
    return ok;
}

/* CI=true (GitHub Actions, GitLab and most others set it so) or CI=1. */
static bool under_ci(void) {
    const char *ci = getenv("CI");
    return ci && (!strcasecmp(ci, "true") || !strcmp(ci, "1"));
}

void skip_(bool required, const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (required && under_ci()) {
        n_fail++;
        fprintf(stdout, "FAIL %s:%d: required under CI: ", file, line);
    } else {
        n_skip++;
        fprintf(stdout, "SKIP %s:%d: ", file, line);
    }
    vfprintf(stdout, fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
    fflush(stdout);
}

int harness_done(const char *name) {
    printf("%s: %d passed, %d failed, %d skipped\n", name, n_pass, n_fail, n_skip);
    return n_fail ? 1 : 0;
}

const char *fixture_root(void) {
    const char *r = getenv("CELER_FIXTURES");
    return r && *r ? r : "tests/fixtures";
}

const char *fixture_path(const char *name) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", fixture_root(), name);
    return buf;
}

/* $env, else name in $CELER_CACHE_DIR or ~/.cache/celer, written to path. */
static const char *cached_model(char *path, size_t cap, const char *env, const char *name) {
    const char *p = getenv(env), *cache = getenv("CELER_CACHE_DIR"), *home = getenv("HOME");
    if (p && *p) return p;
    if (cache && *cache)
        snprintf(path, cap, "%s/%s", cache, name);
    else
        snprintf(path, cap, "%s/.cache/celer/%s", home ? home : ".", name);
    return path;
}

const char *real_model_path(void) {
    static char path[4096];
    return cached_model(path, sizeof path, "CELER_REAL_MODEL", "SmolLM2-135M-Instruct.Q4_1.gguf");
}

const char *real_gemma3_path(void) {
    static char path[4096];
    return cached_model(path, sizeof path, "CELER_GEMMA3_MODEL", "gemma-3-270m-q4_k_m.gguf");
}

float *npy_read_f32(const char *path, int64_t *rows, int64_t *cols) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char pre[10];
    float *data = NULL;
    char header[1024];
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0 || pre[6] != 1) goto out;
    size_t hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
    if (hlen >= sizeof header || fread(header, 1, hlen, f) != hlen) goto out;
    header[hlen] = '\0';
    if (!strstr(header, "'<f4'") || strstr(header, "True")) goto out;
    const char *sh = strstr(header, "'shape': (");
    long long r, c;
    if (!sh || sscanf(sh, "'shape': (%lld, %lld)", &r, &c) != 2) goto out;
    data = malloc(sizeof(float) * (size_t)(r * c));
    if (data && fread(data, sizeof(float), (size_t)(r * c), f) != (size_t)(r * c)) {
        free(data);
        data = NULL;
    }
    *rows = r;
    *cols = c;
out:
    fclose(f);
    return data;
}

static int32_t *ids_from(const json_t *a, int64_t *n) {
    if (!json_is_array(a)) return NULL;
    *n = (int64_t)json_array_size(a);
    int32_t *v = malloc(sizeof *v * (size_t)(*n ? *n : 1));
    for (int64_t i = 0; v && i < *n; i++)
        v[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

int golden_read(const char *dir, int32_t **input, int64_t *n_input, int32_t **greedy,
                int64_t *n_greedy) {
    return golden_read_named(dir, "golden", input, n_input, greedy, n_greedy);
}

int golden_read_named(const char *dir, const char *name, int32_t **input, int64_t *n_input,
                      int32_t **greedy, int64_t *n_greedy) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    json_t *g = json_load_file(path, 0, NULL);
    if (!g) return -1;
    *input = ids_from(json_object_get(g, "input_ids"), n_input);
    *greedy = ids_from(json_object_get(g, "greedy"), n_greedy);
    json_decref(g);
    return *input && *greedy ? 0 : -1;
}

int run_capture(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int rc = pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

double max_abs_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m || d != d) m = d != d ? INFINITY : d;
    }
    return m;
}

double max_abs(const float *a, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fabs((double)a[i]) > m ? fabs((double)a[i]) : m;
    return m;
}

float rand_uniform(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (float)((double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Checkpoint directories under fixture_root(): text ones (vlm false) or vision-language
 * ones (vlm true, those with preprocessor_config.json). */
static int list_fixtures(char **names, int cap, bool vlm) {
    DIR *d = opendir(fixture_root());
    if (!d) return 0;
    int k = 0;
    for (struct dirent *de; (de = readdir(d)) && k < cap;) {
        char path[4200];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", fixture_root(), de->d_name);
        if (de->d_name[0] == '.' || de->d_name[0] == '_' || stat(path, &sb) != 0 ||
            !S_ISDIR(sb.st_mode))
            continue;
        /* a checkpoint: config.json, model.gguf or a split GGUF's first part (vision/ and the
         * like hold other goldens) */
        char ck[4300], pre[4300];
        snprintf(ck, sizeof ck, "%s/config.json", path);
        snprintf(pre, sizeof pre, "%s/preprocessor_config.json", path);
        if (stat(ck, &sb) != 0 && fixture_model_path(path) == path) continue;
        if ((stat(pre, &sb) == 0) == vlm) names[k++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, (size_t)k, sizeof *names, cmp_name);
    return k;
}

int fixture_names(char **names, int cap) {
    return list_fixtures(names, cap, false);
}
int vlm_fixture_names(char **names, int cap) {
    return list_fixtures(names, cap, true);
}

const char *fixture_model_path(const char *dir) {
    static char path[4200];
    struct stat sb;
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    if (stat(path, &sb) == 0) return path;
    DIR *d = opendir(dir); /* a split GGUF: its first part, model-00001-of-NNNNN.gguf */
    for (struct dirent *de; d && (de = readdir(d));) {
        const size_t n = strlen(de->d_name);
        if (n == 25 && !strncmp(de->d_name, "model-00001-of-", 15) &&
            !strcmp(de->d_name + n - 5, ".gguf")) {
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            closedir(d);
            return path;
        }
    }
    if (d) closedir(d);
    return dir;
}

/* ==== Real tokenizers ==== */

#define TOKENIZERS_SRC "tests/tokenizers"
#define TOKENIZERS_OUT "build/tokenizers"

/* dst from src (an .xz file) unless dst is already at least as new; through a temporary
 * file and a rename, so that test programs running at once never see half a file. */
static bool unxz(const char *src, const char *dir, const char *dst, char *why, size_t cap) {
    struct stat s, d;
    if (stat(dst, &d) == 0 && stat(src, &s) == 0 && d.st_mtime >= s.st_mtime) return true;
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s' && xz -dc '%s' > '%s.%d.tmp' && mv -f '%s.%d.tmp' '%s'", dir, src, dst,
             (int)getpid(), dst, (int)getpid(), dst);
    int rc = system(cmd);
    if (rc == 0) return true;
    snprintf(why, cap, "cannot decompress %s into %s (exit %d; is xz-utils installed?)", src, dst,
             WIFEXITED(rc) ? WEXITSTATUS(rc) : -1);
    snprintf(cmd, sizeof cmd, "%s.%d.tmp", dst, (int)getpid());
    remove(cmd);
    return false;
}

bool tokenizer_dir(const char *name, char *out, size_t cap) {
    const char *shared = getenv("CELER_SHARED");
    char path[4200];
    struct stat sb;
    if (shared && *shared) {
        snprintf(out, cap, "%s/tokenizers/%s", shared, name);
        snprintf(path, sizeof path, "%s/tokenizer.json", out);
        if (stat(path, &sb) == 0) return true;
        snprintf(out, cap, "tokenizer %s: %s not found ($CELER_SHARED is set)", name, path);
        return false;
    }
    char src[1024], dir[1024];
    snprintf(src, sizeof src, "%s/%s", TOKENIZERS_SRC, name);
    snprintf(dir, sizeof dir, "%s/%s", TOKENIZERS_OUT, name);
    DIR *d = opendir(src);
    if (!d) {
        snprintf(out, cap, "tokenizer %s: %s not found (run the tests from the repository root)",
                 name, src);
        return false;
    }
    int n = 0;
    bool ok = true;
    for (struct dirent *de; ok && (de = readdir(d));) {
        size_t len = strlen(de->d_name);
        if (len < 4 || strcmp(de->d_name + len - 3, ".xz")) continue;
        char from[1400], to[1400];
        snprintf(from, sizeof from, "%s/%s", src, de->d_name);
        snprintf(to, sizeof to, "%s/%.*s", dir, (int)(len - 3), de->d_name);
        ok = unxz(from, dir, to, out, cap);
        n++;
    }
    closedir(d);
    if (!ok) return false;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (n == 0 || stat(path, &sb) != 0) {
        snprintf(out, cap, "tokenizer %s: no tokenizer.json.xz in %s", name, src);
        return false;
    }
    snprintf(out, cap, "%s", dir);
    return true;
}

const char *harness_device(void) {
    const char *d = getenv("CELER_TEST_DEVICE");
    return d && *d ? d : NULL;
}

celer_context_params harness_context_params(int64_t n_ctx, int32_t n_seq, const char *device) {
    celer_context_params cp = celer_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_seq = n_seq;
    cp.n_threads = 2;
    cp.device = device;
    return cp;
}

char *read_text_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) free(s), s = NULL;
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

char *golden_template_source(const char *src, char *why) {
    char path[4096];
    if (!strncmp(src, "shared:", 7)) {
        if (!tokenizer_dir(src + 7, path, sizeof path)) {
            snprintf(why, 4096, "%s", path);
            return NULL;
        }
        char *t, *bos, *eos;
        celer_error e;
        if (chat_template_from_dir(path, &t, &bos, &eos, &e) != CELER_OK) return NULL;
        free(bos), free(eos);
        return t;
    }
    snprintf(path, sizeof path, "tests/templates/%s", src);
    return read_text_file(path);
}

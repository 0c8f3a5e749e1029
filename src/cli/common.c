/*
 * common.c - option parsing, model opening and .npy output shared by subcommands.
 */
#include "cli/cli.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void cli_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("celer: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

int64_t cli_parse_int(const char *flag, const char *s) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) cli_die("%s: expected an integer, found \"%s\"", flag, s);
    return v;
}

double cli_parse_num(const char *flag, const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) cli_die("%s: expected a number, found \"%s\"", flag, s);
    return v;
}

bool cli_help(int argc, char **argv, const char *usage) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            puts(usage);
            return true;
        }
    return false;
}

char *cli_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) cli_die("%s: cannot open", path);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) cli_die("out of memory");
    for (size_t k; (k = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += k;
        if (n == cap - 1) {
            char *p = realloc(buf, cap *= 2);
            if (!p) cli_die("out of memory");
            buf = p;
        }
    }
    const int bad = ferror(f);
    fclose(f);
    if (bad) cli_die("%s: read error", path);
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

int32_t *cli_parse_ids(const char *s, int64_t *n) {
    int64_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *ids = malloc(sizeof *ids * (size_t)cap);
    if (!ids) cli_die("out of memory");
    *n = 0;
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && *end != ','))
            cli_die("--ids: expected comma-separated non-negative integers, found \"%s\"", s);
        ids[(*n)++] = (int32_t)v;
        if (!*end) break;
        p = end + 1;
    }
    return ids;
}

bool cli_model_flag(cli_model_opts *o, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    const bool model = !strcmp(a, "-m") || !strcmp(a, "--model");
    const bool threads = !strcmp(a, "-t") || !strcmp(a, "--threads");
    const bool ctx = !strcmp(a, "-c") || !strcmp(a, "--ctx-size");
    const bool cache = !strcmp(a, "--cache-type");
    const bool device = !strcmp(a, "--device");
    if (!model && !threads && !ctx && !cache && !device) return false;
    if (*i + 1 >= argc) cli_die("%s: expected a value", a);
    const char *val = argv[++*i];
    if (model) {
        o->model = cli_model_path(val);
    } else if (device) {
        o->device = val;
    } else if (cache) {
        if (strcmp(val, "f16") && strcmp(val, "f32"))
            cli_die("--cache-type: expected f16 or f32, found %s", val);
        o->kv_type = val;
    } else if (threads) {
        int64_t t = cli_parse_int(a, val);
        if (t < 1 || t > 1024)
            cli_die("%s: expected 1 to 1024 threads, found %lld", a, (long long)t);
        o->n_threads = (int32_t)t;
    } else {
        o->n_ctx = cli_parse_int(a, val);
        if (o->n_ctx < 1) cli_die("%s: expected a positive context size", a);
    }
    return true;
}

const char *cli_model_path(const char *arg) {
    static char path[4096]; /* one model a process: the last -m wins */
    char err[512];
    celer_status s = celer_model_resolve(arg, path, sizeof path, err, sizeof err);
    if (s == CELER_STATUS_NOT_FOUND) /* a name not in the cache: from the Hub */
        s = celer_model_pull(arg, cli_pull_progress, NULL, path, sizeof path, err, sizeof err);
    if (s != CELER_OK) cli_die("%s", err);
    return path;
}

/* "12.3 MiB" into out[cap]. */
static void mib(int64_t bytes, char *out, size_t cap) {
    snprintf(out, cap, "%.1f MiB", (double)bytes / (1 << 20));
}

void cli_pull_progress(void *user, const char *file, int64_t done, int64_t total, bool finished) {
    static bool tty = false, checked = false;
    static double last = 0;
    if (!checked) tty = isatty(STDERR_FILENO), checked = true;
    if (!tty) return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const double now = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    if (!finished && now - last < 0.1) return; /* at most ten redraws a second */
    last = now;
    char a[32], b[32], bar[31];
    const int pct = total > 0 ? (int)(100 * done / total) : 100;
    const int fill = pct * 30 / 100;
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = 0;
    mib(done, a, sizeof a);
    mib(total, b, sizeof b);
    fprintf(stderr, "\r\033[K%-40.40s [%s] %3d%% %s / %s%s", file, bar, pct, a, b,
            finished ? "\n" : "");
    fflush(stderr);
}

const char *cli_default_model(void) {
    static char path[4096];
    const char *cache = getenv("CELER_CACHE_DIR"), *home = getenv("HOME");
    if (cache && *cache)
        snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", cache);
    else
        snprintf(path, sizeof path, "%s/.cache/celer/SmolLM2-135M-Instruct.Q4_1.gguf",
                 home ? home : ".");
    if (access(path, R_OK) != 0)
        cli_die("no MODEL given and the default model %s is not there\nHINT: fetch it with `make "
                "model` (tools/fetch_model.sh)",
                path);
    return path;
}

celer_model *cli_open_model(const cli_model_opts *o) {
    char err[512];
    celer_model *m;
    if (!o->model) cli_die("-m MODEL is required (a checkpoint directory or a .gguf file)");
    if (celer_model_open(o->model, NULL, &m, err, sizeof err) != CELER_OK) cli_die("%s", err);
    return m;
}

celer_context *cli_open_context(const cli_model_opts *o, celer_model *m, int64_t n_ctx) {
    char err[512];
    celer_context_params cp = celer_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = o->n_threads;
    cp.kv_type = o->kv_type;
    cp.device = o->device;
    celer_context *ctx;
    if (celer_context_create(m, &cp, &ctx, err, sizeof err) != CELER_OK) cli_die("%s", err);
    return ctx;
}

void cli_open(const cli_model_opts *o, int64_t n_ctx, celer_model **m, celer_context **ctx) {
    *m = cli_open_model(o);
    if (o->n_ctx && o->n_ctx < n_ctx)
        cli_die("-c %lld: the request needs %lld positions", (long long)o->n_ctx, (long long)n_ctx);
    *ctx = cli_open_context(o, *m, o->n_ctx ? o->n_ctx : n_ctx);
}

celer_tokenizer *cli_open_tokenizer(const char *model_path) {
    char err[512];
    celer_tokenizer *tok;
    if (celer_tokenizer_open(model_path, &tok, err, sizeof err) != CELER_OK) cli_die("%s", err);
    return tok;
}

int64_t cli_context_size(const cli_model_opts *o, const celer_model *m, int64_t n_prompt,
                         int64_t n_predict) {
    const int64_t need = n_prompt + (n_predict > 0 ? n_predict : 1);
    if (o->n_ctx) {
        if (o->n_ctx < need)
            cli_die("-c %lld: the prompt of %lld tokens and %lld to generate need %lld positions",
                    (long long)o->n_ctx, (long long)n_prompt,
                    (long long)(n_predict > 0 ? n_predict : 1), (long long)need);
        return o->n_ctx;
    }
    int64_t cap = celer_model_n_ctx_train(m);
    if (cap <= 0 || cap > 4096) cap = 4096;
    if (n_predict > 0) return need;
    if (need > cap)
        cli_die("the prompt of %lld tokens leaves no room in a context of %lld; pass a larger -c",
                (long long)n_prompt, (long long)cap);
    return cap;
}

const char *cli_template_kwargs(const char *text) {
    json_error_t je;
    json_t *v = json_loads(text, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!v) cli_die("--chat-template-kwargs: column %d: %s", je.column, je.text);
    const bool object = json_is_object(v);
    json_decref(v);
    if (!object)
        cli_die("--chat-template-kwargs: expected a JSON object, as {\"enable_thinking\": false}");
    return text;
}

bool cli_prompt_flag(cli_prompt_opts *o, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (!strcmp(a, "--no-chat-template")) {
        o->no_template = true;
        return true;
    }
    const bool prompt = !strcmp(a, "-p") || !strcmp(a, "--prompt"), sys = !strcmp(a, "--system"),
               kwargs = !strcmp(a, "--chat-template-kwargs");
    if (!prompt && !sys && !kwargs) return false;
    if (*i + 1 >= argc) cli_die("%s: expected a value", a);
    if (prompt)
        o->prompt = argv[++*i];
    else if (sys)
        o->system = argv[++*i];
    else
        o->template_kwargs = cli_template_kwargs(argv[++*i]);
    return true;
}

bool cli_sampler_flag(celer_sampler_params *p, int argc, char **argv, int *i) {
    static const char *const flags[] = {"--temp",           "--top-k",         "--top-p", "--min-p",
                                        "--repeat-penalty", "--repeat-last-n", "--seed"};
    int k = -1;
    for (int j = 0; j < 7; j++)
        if (!strcmp(argv[*i], flags[j])) k = j;
    if (k < 0) return false;
    if (*i + 1 >= argc) cli_die("%s: expected a value", argv[*i]);
    const char *a = argv[*i], *v = argv[++*i];
    switch (k) {
    case 0:
        p->temp = (float)cli_parse_num(a, v);
        break;
    case 1:
        p->top_k = (int32_t)cli_parse_int(a, v);
        break;
    case 2:
        p->top_p = (float)cli_parse_num(a, v);
        break;
    case 3:
        p->min_p = (float)cli_parse_num(a, v);
        break;
    case 4:
        p->repeat_penalty = (float)cli_parse_num(a, v);
        break;
    case 5:
        p->repeat_last_n = (int32_t)cli_parse_int(a, v);
        break;
    default:
        p->seed = (uint64_t)cli_parse_int(a, v);
        break;
    }
    if (p->temp < 0 || p->top_k < 0 || p->top_p <= 0 || p->top_p > 1 || p->min_p < 0 ||
        p->min_p > 1 || p->repeat_penalty <= 0 || p->repeat_last_n < 0)
        cli_die("%s %s: out of range (temp >= 0, top-k >= 0, 0 < top-p <= 1, 0 <= min-p <= 1, "
                "repeat-penalty > 0)",
                a, v);
    return true;
}

int npy_write_f32(const char *path, const float *data, int64_t rows, int64_t cols) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    char header[128];
    int len = snprintf(header, sizeof header,
                       "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld, %lld), }",
                       (long long)rows, (long long)cols);
    /* magic (6) + version (2) + header length (2) + header, padded with spaces and a
     * newline to a multiple of 64 bytes. */
    int total = 10 + len + 1;
    int pad = (64 - total % 64) % 64;
    uint16_t hlen = (uint16_t)(len + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hlen & 0xff, f);
    fputc(hlen >> 8, f);
    fwrite(header, 1, (size_t)len, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    size_t count = (size_t)(rows * cols);
    int ok = fwrite(data, sizeof(float), count, f) == count; /* x86-64 is little-endian */
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

/* ==== Images ==== */

bool cli_image_flag(cli_images *im, int argc, char **argv, int *i) {
    if (strcmp(argv[*i], "--image") != 0 || *i + 1 >= argc) return false;
    if (im->n == CLI_MAX_IMAGES) cli_die("--image: at most %d images", CLI_MAX_IMAGES);
    im->path[im->n++] = argv[++*i];
    return true;
}

void cli_images_load(cli_images *im, const celer_model *m) {
    char err[512];
    if (im->n && !celer_model_has_vision(m))
        cli_die("--image: %s reads no images", celer_model_desc(m));
    for (int i = 0; i < im->n; i++)
        if (celer_image_load(im->path[i], &im->img[i], err, sizeof err) != CELER_OK)
            cli_die("%s", err);
}

void cli_images_free(cli_images *im) {
    for (int i = 0; i < im->n; i++) celer_image_free(im->img[i]);
    im->n = 0;
}

int64_t cli_images_expanded(const cli_images *im, const celer_model *m, const int32_t *ids,
                            int64_t n) {
    char err[512];
    const int32_t tok = celer_model_image_token(m);
    int64_t total = n, k = 0, block = 0, found = 0;
    for (int64_t i = 0; tok >= 0 && i < n; i++) {
        if (ids[i] != tok) continue;
        found++;
        if (k == im->n)
            cli_die("the prompt has more image tokens (id %d) than --image files (%d) take", tok,
                    im->n);
        int64_t rows, blocks;
        if (celer_model_image_positions(m, im->img[k], &rows, err, sizeof err) != CELER_OK ||
            celer_model_image_blocks(m, im->img[k], &blocks, err, sizeof err) != CELER_OK)
            cli_die("%s", err);
        total += rows / blocks - 1;
        if (++block == blocks) block = 0, k++;
    }
    if (k != im->n)
        cli_die("%d --image files but %lld image tokens (id %d) in the prompt%s", im->n,
                (long long)found, tok,
                found ? ""
                      : " (with --text, write the image marker of the chat template where the "
                        "image goes)");
    return total;
}

int32_t *cli_tokenize(const celer_model *m, const celer_tokenizer *tok, const cli_images *im,
                      const char *text, bool add_special, int64_t *n) {
    char err[512], *full;
    size_t len;
    int32_t *ids;
    if (celer_model_image_text(m, tok, text, strlen(text), im ? im->img : NULL, im ? im->n : 0,
                               &full, &len, err, sizeof err) != CELER_OK)
        cli_die("%s", err);
    if (celer_tokenize(tok, full, len, add_special, &ids, n, err, sizeof err) != CELER_OK)
        cli_die("%s", err);
    free(full);
    return ids;
}

/*
 * common.c - option parsing, model opening and .npy output shared by subcommands.
 */
#include "cli/cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    if (!model && !threads && !ctx) return false;
    if (*i + 1 >= argc) cli_die("%s: expected a value", a);
    const char *val = argv[++*i];
    if (model) {
        o->model = val;
    } else if (threads) {
        int64_t t = cli_parse_int(a, val);
        if (t < 1 || t > 1024) cli_die("%s: expected 1 to 1024 threads, found %lld", a, (long long)t);
        o->n_threads = (int32_t)t;
    } else {
        o->n_ctx = cli_parse_int(a, val);
        if (o->n_ctx < 1) cli_die("%s: expected a positive context size", a);
    }
    return true;
}

void cli_open(const cli_model_opts *o, int64_t n_ctx, celer_model **m, celer_context **ctx) {
    char err[512];
    if (!o->model) cli_die("-m MODEL is required (a checkpoint directory or a .gguf file)");
    if (celer_model_open(o->model, NULL, m, err, sizeof err) != CELER_OK) cli_die("%s", err);
    celer_context_params cp = celer_context_default_params();
    cp.n_ctx = o->n_ctx ? o->n_ctx : n_ctx;
    cp.n_threads = o->n_threads;
    if (cp.n_ctx < n_ctx)
        cli_die("-c %lld: the request needs %lld positions", (long long)cp.n_ctx, (long long)n_ctx);
    if (celer_context_create(*m, &cp, ctx, err, sizeof err) != CELER_OK) {
        celer_model_close(*m);
        cli_die("%s", err);
    }
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

/*
 * serve.c - `celer serve`: the OpenAI-compatible HTTP server (src/server/server.h).
 *
 * Parses the flags (llama-server's names where they exist), starts listening before the
 * model loads (so /health can say "loading"), opens the model and its tokenizer, and
 * serves until SIGINT or SIGTERM. Everything about requests lives in src/server; this
 * file only turns flags into a server_config.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli/cli.h"
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_text[] =
    "usage: celer serve [-m MODEL] [--host 127.0.0.1] [--port 8080] [-np N] [-c "
    "TOTAL_KV_POSITIONS]\n"
    "       [--ctx-per-seq N] [--batch-tokens N] [--max-queue N] [-t N] [--no-prefix-cache]\n"
    "       [--api-key K[,K2..] | --api-key-file F] [--alias NAME] [--metrics]\n"
    "       [--cors-origin ORIGIN] [--max-body-bytes 8388608] [--chat-template-kwargs JSON]\n"
    "       [--chat-template-file FILE]";

#define MAX_KEYS 256

/* Appends the comma-separated keys of list to keys (each malloc'd). */
static void keys_add_list(const char *list, char **keys, int *n) {
    const char *p = list;
    while (*p) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > 0) {
            if (*n >= MAX_KEYS) cli_die("--api-key: at most %d keys", MAX_KEYS);
            if (!(keys[*n] = strndup(p, len))) cli_die("out of memory");
            (*n)++;
        }
        p += len + (end != NULL);
    }
}

/* One key per line; blank lines and lines starting with # are skipped. */
static void keys_add_file(const char *path, char **keys, int *n) {
    FILE *f = fopen(path, "r");
    if (!f) cli_die("--api-key-file %s: cannot open it", path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ' ||
                           line[len - 1] == '\t'))
            line[--len] = '\0';
        char *k = line;
        while (*k == ' ' || *k == '\t') k++;
        if (!*k || *k == '#') continue;
        if (*n >= MAX_KEYS) cli_die("--api-key-file %s: at most %d keys", path, MAX_KEYS);
        if (!(keys[*n] = strdup(k))) cli_die("out of memory");
        (*n)++;
    }
    free(line);
    fclose(f);
    if (*n == 0) cli_die("--api-key-file %s: no keys in it", path);
}

static int64_t parse_count(const char *flag, const char *v, int64_t lo, int64_t hi) {
    const int64_t x = cli_parse_int(flag, v);
    if (x < lo || x > hi)
        cli_die("%s: expected %lld to %lld, found %lld", flag, (long long)lo, (long long)hi,
                (long long)x);
    return x;
}

int cmd_serve(int argc, char **argv) {
    if (cli_help(argc, argv, usage_text)) return 0;
    cli_model_opts o = {0}; /* -c here is the whole KV pool, in positions */
    char *keys[MAX_KEYS];
    int n_keys = 0;
    int64_t ctx_per_seq = 0;
    char *template_file = NULL;
    server_config cfg = {.host = "127.0.0.1",
                         .port = 8080,
                         .max_body_bytes = 8u << 20,
                         .drain_seconds = 10.0,
                         .engine = celer_engine_default_params()};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (cli_model_flag(&o, argc, argv, &i)) continue;
        const bool flag_only = !strcmp(a, "--metrics") || !strcmp(a, "--no-prefix-cache");
        if (!flag_only && i + 1 >= argc)
            cli_die("serve: unknown or incomplete option %s\n%s", a, usage_text);
        const char *v = flag_only ? NULL : argv[i + 1];
        if (!strcmp(a, "--metrics"))
            cfg.metrics = true;
        else if (!strcmp(a, "--no-prefix-cache"))
            cfg.engine.prefix_cache = false;
        else if (!strcmp(a, "--host"))
            cfg.host = v;
        else if (!strcmp(a, "--port"))
            cfg.port = (int)parse_count(a, v, 0, 65535);
        else if (!strcmp(a, "-np") || !strcmp(a, "--parallel"))
            cfg.engine.n_seq_max = (int32_t)parse_count(a, v, 1, 256);
        else if (!strcmp(a, "--ctx-per-seq"))
            ctx_per_seq = parse_count(a, v, 2, INT32_MAX);
        else if (!strcmp(a, "--batch-tokens") || !strcmp(a, "-b"))
            cfg.engine.batch_tokens = parse_count(a, v, 1, 1 << 20);
        else if (!strcmp(a, "--max-queue"))
            cfg.engine.max_queue = (int32_t)parse_count(a, v, 1, 1 << 20);
        else if (!strcmp(a, "--max-body-bytes"))
            cfg.max_body_bytes = (size_t)parse_count(a, v, 1024, (int64_t)1 << 34);
        else if (!strcmp(a, "--api-key"))
            keys_add_list(v, keys, &n_keys);
        else if (!strcmp(a, "--api-key-file"))
            keys_add_file(v, keys, &n_keys);
        else if (!strcmp(a, "--alias"))
            cfg.alias = v;
        else if (!strcmp(a, "--cors-origin"))
            cfg.cors_origin = v;
        else if (!strcmp(a, "--chat-template-kwargs"))
            cfg.chat_template_kwargs = cli_template_kwargs(v);
        else if (!strcmp(a, "--chat-template-file"))
            cfg.chat_template = template_file = cli_read_file(v, NULL);
        else
            cli_die("serve: unknown option %s\n%s", a, usage_text);
        i += !flag_only;
    }
    if (!o.model) o.model = cli_default_model();
    cfg.model_path = o.model;
    cfg.api_keys = (const char *const *)keys;
    cfg.n_api_keys = n_keys;
    cfg.engine.n_threads = o.n_threads;
    cfg.engine.kv_type = o.kv_type;
    cfg.engine.device = o.device;
    cfg.engine.kv_positions = o.n_ctx;

    char err[512];
    server *s = server_start(&cfg, err, sizeof err);
    if (!s) cli_die("serve: %s", err);
    const bool v6 = strchr(cfg.host, ':') != NULL;
    fprintf(stderr, "celer serve: listening on http://%s%s%s:%d, loading %s\n", v6 ? "[" : "",
            cfg.host, v6 ? "]" : "", server_port(s), o.model);
    celer_model *m = cli_open_model(&o);
    celer_tokenizer *tok = cli_open_tokenizer(o.model);
    /* A sequence may hold the training context, at most 4096 unless asked, and never more
     * than the whole pool. */
    int64_t n_ctx = celer_model_n_ctx_train(m);
    if (n_ctx <= 0 || n_ctx > 4096) n_ctx = 4096;
    if (o.n_ctx && n_ctx > o.n_ctx) n_ctx = o.n_ctx;
    if (ctx_per_seq) n_ctx = ctx_per_seq;
    if (n_ctx < 2) cli_die("serve: -c %lld is too small for one sequence", (long long)o.n_ctx);
    if (server_load(s, m, tok, n_ctx, err, sizeof err) != CELER_OK) cli_die("serve: %s", err);
    fprintf(stderr,
            "celer serve: ready: %s | %d sequences of up to %lld positions, KV pool %lld "
            "positions%s%s\n",
            celer_model_desc(m), cfg.engine.n_seq_max, (long long)n_ctx,
            (long long)(o.n_ctx ? o.n_ctx : n_ctx * cfg.engine.n_seq_max),
            n_keys ? ", API keys required" : "", cfg.metrics ? ", /metrics on" : "");
    const int rc = server_run(s);
    server_destroy(s);
    celer_tokenizer_close(tok);
    celer_model_close(m);
    for (int i = 0; i < n_keys; i++) free(keys[i]);
    free(template_file);
    return rc;
}

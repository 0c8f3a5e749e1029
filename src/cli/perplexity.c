/*
 * perplexity.c - `celer perplexity -m MODEL -f FILE [-c CTX]`: perplexity of a text.
 *
 * The text is tokenized whole (with the tokenizer's BOS), cut into chunks of -c tokens
 * (default 512), and each chunk runs through the all-rows forward from an empty cache;
 * every token after a chunk's first is scored by the row before it. Prints the running
 * value per chunk and the final perplexity with its token count.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli/cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) cli_die("%s: cannot open", path);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (!buf) cli_die("out of memory");
    *len = n;
    return buf;
}

int cmd_perplexity(int argc, char **argv) {
    cli_model_opts o = {0};
    const char *file = NULL;
    for (int i = 0; i < argc; i++) {
        if (cli_model_flag(&o, argc, argv, &i)) continue;
        if (!strcmp(argv[i], "-f") && i + 1 < argc) file = argv[++i];
        else cli_die("perplexity: unknown or incomplete option %s\nusage: celer perplexity -m MODEL -f FILE [-c CTX]", argv[i]);
    }
    if (!file) cli_die("perplexity: -f FILE is required");
    const int64_t c = o.n_ctx ? o.n_ctx : 512;
    if (c < 2) cli_die("-c: a chunk needs at least 2 tokens");
    size_t len;
    char *text = read_file(file, &len), err[512];
    celer_model *m = cli_open_model(&o);
    celer_tokenizer *tok = cli_open_tokenizer(o.model);
    int32_t *ids;
    int64_t n;
    if (celer_tokenize(tok, text, len, true, &ids, &n, err, sizeof err) != CELER_OK) cli_die("%s: %s", file, err);
    if (n < 2) cli_die("%s: fewer than 2 tokens", file);
    celer_context *ctx = cli_open_context(&o, m, c);
    const int64_t v = celer_model_n_vocab(m);
    float *logits = malloc(sizeof(float) * (size_t)(c * v));
    if (!logits) cli_die("out of memory");
    double nll = 0;
    int64_t scored = 0, chunk = 0;
    for (int64_t off = 0; off + 1 < n; off += c, chunk++) {
        const int64_t len_c = n - off < c ? n - off : c;
        celer_seq_reset(ctx, 0);
        celer_batch b = celer_batch_tokens(ids + off, len_c);
        if (celer_forward(ctx, &b, logits) != CELER_OK) cli_die("%s", celer_context_last_error(ctx));
        for (int64_t r = 0; r + 1 < len_c; r++) {
            const float *row = logits + r * v;
            float mx = row[0];
            for (int64_t k = 1; k < v; k++) mx = row[k] > mx ? row[k] : mx;
            double sum = 0;
            for (int64_t k = 0; k < v; k++) sum += exp((double)row[k] - mx);
            nll += log(sum) + mx - row[ids[off + r + 1]];
            scored++;
        }
        fprintf(stderr, "[%lld] %.4f\n", (long long)chunk + 1, exp(nll / (double)scored));
    }
    printf("perplexity: %.4f over %lld tokens (%lld chunks of up to %lld)\n", exp(nll / (double)scored),
           (long long)scored, (long long)chunk, (long long)c);
    free(logits), free(ids), free(text);
    celer_context_destroy(ctx);
    celer_tokenizer_close(tok);
    celer_model_close(m);
    return 0;
}

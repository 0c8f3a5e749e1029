/*
 * sampler_bench.c - how long the sampler takes for one token of a vocabulary-sized row.
 *
 * Two rows: the model's logits after a fixed prompt (the default model's, or MODEL), and a
 * flat row of random logits in [-4, 4] (the sampler's widest case: nearly every token in
 * play). Each is sampled 500 times at OpenAI's defaults with temperature 0.8 (no top-k,
 * top-p or min-p), at temperature 1, with top-p 0.95, and with llama.cpp's defaults (top-k
 * 40, top-p 0.95, min-p 0.05), on one thread; prints ms per token. It does not run the model
 * more than once.
 *
 *     build/tools/sampler_bench MODEL
 */
#define _POSIX_C_SOURCE 200809L
#include "celer.h"
#include "sampling/sampling.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The model's logits after prompt (malloc'd, [*v]); exits on error. */
static float *model_row(const char *path, const char *prompt, int64_t *v) {
    char err[512];
    celer_model *m;
    celer_tokenizer *tok;
    celer_context *ctx;
    if (celer_model_open(path, NULL, &m, err, sizeof err) != CELER_OK ||
        celer_tokenizer_open(path, &tok, err, sizeof err) != CELER_OK) {
        fprintf(stderr, "sampler_bench: %s\n", err);
        exit(1);
    }
    celer_context_params cp = celer_context_default_params();
    cp.n_ctx = 256;
    int32_t *ids;
    int64_t n;
    if (celer_context_create(m, &cp, &ctx, err, sizeof err) != CELER_OK ||
        celer_tokenize(tok, prompt, strlen(prompt), true, &ids, &n, err, sizeof err) != CELER_OK) {
        fprintf(stderr, "sampler_bench: %s\n", err);
        exit(1);
    }
    *v = celer_model_n_vocab(m);
    float *row = malloc(sizeof *row * (size_t)*v);
    const celer_batch b = celer_batch_tokens(ids, n);
    if (!row || celer_forward_last_logits(ctx, &b, n - 1, row) != CELER_OK) {
        fprintf(stderr, "sampler_bench: %s\n", celer_context_last_error(ctx));
        exit(1);
    }
    free(ids);
    celer_context_destroy(ctx);
    celer_tokenizer_close(tok);
    celer_model_close(m);
    return row;
}

static void run(const char *what, const float *row, int64_t v) {
    const struct {
        const char *name;
        float temp, top_p, min_p;
        int32_t top_k;
    } cfg[] = {{"temperature 0.8", 0.8f, 1, 0, 0},
               {"temperature 1.0", 1.0f, 1, 0, 0},
               {"temperature 0.8, top-p 0.95", 0.8f, 0.95f, 0, 0},
               {"llama.cpp's defaults", 0.8f, 0.95f, 0.05f, 40}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        sampler_params p = sampler_default_params();
        p.temp = cfg[c].temp, p.top_p = cfg[c].top_p, p.min_p = cfg[c].min_p;
        p.top_k = cfg[c].top_k, p.seed = 7;
        sampler *s = sampler_create(&p, v);
        if (!s) exit(1);
        const int n = 500;
        int64_t sum = 0;
        const double t0 = now();
        for (int i = 0; i < n; i++) sum += sampler_sample(s, row);
        printf("%-14s %-30s %.3f ms a token (ids sum %lld)\n", what, cfg[c].name,
               (now() - t0) / n * 1e3, (long long)sum);
        sampler_destroy(s);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: sampler_bench MODEL\n");
        return 1;
    }
    int64_t v;
    float *row = model_row(argv[1], "The library opens at nine in the morning and closes at", &v);
    run("model row", row, v);
    uint64_t x = 1;
    for (int64_t i = 0; i < v; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        row[i] = (float)((double)(x >> 40) / (double)(1 << 24)) * 8.0f - 4.0f;
    }
    run("flat row", row, v);
    free(row);
    return 0;
}

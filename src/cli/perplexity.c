/*
 * perplexity.c - `celer perplexity -m MODEL -f FILE [-c CTX] [-t N] [--chunks K]
 * [--compare KERNELS]`: perplexity of a text, and optionally how far one kernel set's
 * next-token distributions lie from another's.
 *
 * The text is tokenized whole (with the tokenizer's BOS), cut into windows of -c tokens
 * (default 512), and each window runs through the all-rows forward from an empty cache;
 * every token after a window's first is scored by the row before it. --chunks K scores
 * only the first K windows. Prints the running value per window and the final perplexity
 * with its token count.
 *
 * --compare NAME runs a second context with kernel set NAME (e.g. ref) over the same
 * windows in the same loop, and adds its perplexity, the KL divergence
 * KL(P_NAME || P_main) per scored position (mean, 99th percentile, max; P is the softmax
 * of a logits row in double precision) and the top-1 agreement. It does not compare
 * against stored logits or another model: both contexts share the one loaded model.
 * --compare-cache-type T gives the second context a T KV cache (f16 or f32), so the same
 * kernels with both cache types measure what the fp16 cache costs.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli/cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define USAGE                                                                                      \
    "celer perplexity -m MODEL -f FILE [-c CTX] [-t N] [--cache-type f16|f32] [--chunks K] "       \
    "[--compare KERNELS "                                                                          \
    "[--compare-cache-type f16|f32]]"

/* log(sum(exp(row[v]))) in double, and the index of the largest logit. */
static double row_logsumexp(const float *row, int64_t v, int64_t *argmax) {
    int64_t best = 0;
    for (int64_t k = 1; k < v; k++) best = row[k] > row[best] ? k : best;
    double sum = 0;
    for (int64_t k = 0; k < v; k++) sum += exp((double)row[k] - row[best]);
    *argmax = best;
    return log(sum) + row[best];
}

/* KL(P || Q) of the softmax distributions of logits p[v] and q[v], given their
 * log-sum-exps; clamped at 0 against rounding. */
static double row_kl(const float *p, double p_lse, const float *q, double q_lse, int64_t v) {
    double kl = 0;
    for (int64_t k = 0; k < v; k++) {
        const double lp = (double)p[k] - p_lse, lq = (double)q[k] - q_lse;
        kl += exp(lp) * (lp - lq);
    }
    return kl > 0 ? kl : 0;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static celer_context *open_kernels(const cli_model_opts *o, celer_model *m, int64_t n_ctx,
                                   const char *kernels, const char *kv_type) {
    char err[512];
    celer_context_params cp = celer_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = o->n_threads;
    cp.kernels = kernels;
    cp.kv_type = kv_type;
    cp.device = "cpu"; /* a CPU kernel set, whatever device the measured context runs on */
    celer_context *ctx;
    if (celer_context_create(m, &cp, &ctx, err, sizeof err) != CELER_OK)
        cli_die("--compare %s: %s", kernels, err);
    return ctx;
}

int cmd_perplexity(int argc, char **argv) {
    if (cli_help(argc, argv, "usage: " USAGE)) return 0;
    cli_model_opts o = {0};
    const char *file = NULL, *compare = NULL, *compare_kv = NULL;
    int64_t max_chunks = 0;
    for (int i = 0; i < argc; i++) {
        if (cli_model_flag(&o, argc, argv, &i)) continue;
        if (!strcmp(argv[i], "-f") && i + 1 < argc)
            file = argv[++i];
        else if (!strcmp(argv[i], "--compare") && i + 1 < argc)
            compare = argv[++i];
        else if (!strcmp(argv[i], "--compare-cache-type") && i + 1 < argc)
            compare_kv = argv[++i];
        else if (!strcmp(argv[i], "--chunks") && i + 1 < argc) {
            max_chunks = cli_parse_int("--chunks", argv[++i]);
            if (max_chunks < 1)
                cli_die("--chunks: expected a positive count, found %lld", (long long)max_chunks);
        } else
            cli_die("perplexity: unknown or incomplete option %s (usage: " USAGE ")", argv[i]);
    }
    if (!file) cli_die("perplexity: -f FILE is required (usage: " USAGE ")");
    const int64_t c = o.n_ctx ? o.n_ctx : 512;
    if (c < 2) cli_die("-c: a window needs at least 2 tokens");
    size_t len;
    char *text = cli_read_file(file, &len), err[512];
    celer_model *m = cli_open_model(&o);
    celer_context *ctx = cli_open_context(&o, m, c);
    if (compare_kv && !compare) cli_die("--compare-cache-type needs --compare KERNELS");
    celer_context *cmp =
        compare ? open_kernels(&o, m, c, compare, compare_kv ? compare_kv : o.kv_type) : NULL;
    celer_tokenizer *tok = cli_open_tokenizer(o.model);
    int32_t *ids;
    int64_t n;
    if (celer_tokenize(tok, text, len, true, &ids, &n, err, sizeof err) != CELER_OK)
        cli_die("%s: %s", file, err);
    if (n < 2) cli_die("%s: fewer than 2 tokens", file);
    const int64_t v = celer_model_n_vocab(m);
    float *logits = malloc(sizeof(float) * (size_t)(c * v));
    float *logits_cmp = cmp ? malloc(sizeof(float) * (size_t)(c * v)) : NULL;
    double *kl = cmp ? malloc(sizeof(double) * (size_t)n) : NULL; /* per scored position */
    if (!logits || (cmp && (!logits_cmp || !kl))) cli_die("out of memory");
    double nll = 0, nll_cmp = 0;
    int64_t scored = 0, chunk = 0, agree = 0;
    for (int64_t off = 0; off + 1 < n && (!max_chunks || chunk < max_chunks); off += c, chunk++) {
        const int64_t len_c = n - off < c ? n - off : c;
        celer_batch b = celer_batch_tokens(ids + off, len_c);
        celer_seq_reset(ctx, 0);
        if (celer_forward(ctx, &b, logits) != CELER_OK)
            cli_die("%s", celer_context_last_error(ctx));
        if (cmp) {
            celer_seq_reset(cmp, 0);
            if (celer_forward(cmp, &b, logits_cmp) != CELER_OK)
                cli_die("%s", celer_context_last_error(cmp));
        }
        for (int64_t r = 0; r + 1 < len_c; r++) {
            const float *row = logits + r * v;
            const int32_t next = ids[off + r + 1];
            int64_t top, top_cmp;
            const double lse = row_logsumexp(row, v, &top);
            nll += lse - row[next];
            if (cmp) {
                const float *row_cmp = logits_cmp + r * v;
                const double lse_cmp = row_logsumexp(row_cmp, v, &top_cmp);
                nll_cmp += lse_cmp - row_cmp[next];
                kl[scored] = row_kl(row_cmp, lse_cmp, row, lse, v);
                agree += top == top_cmp;
            }
            scored++;
        }
        if (cmp)
            fprintf(stderr, "[%lld] %.4f  %s %.4f\n", (long long)chunk + 1,
                    exp(nll / (double)scored), compare, exp(nll_cmp / (double)scored));
        else
            fprintf(stderr, "[%lld] %.4f\n", (long long)chunk + 1, exp(nll / (double)scored));
    }
    printf("perplexity: %.4f over %lld tokens (%lld chunks of up to %lld)\n",
           exp(nll / (double)scored), (long long)scored, (long long)chunk, (long long)c);
    if (cmp) {
        double sum = 0;
        for (int64_t i = 0; i < scored; i++) sum += kl[i];
        qsort(kl, (size_t)scored, sizeof *kl, cmp_double);
        const int64_t p99 = (int64_t)ceil(0.99 * (double)scored) - 1; /* nearest rank */
        printf("kernels: %s, compared with %s\n", celer_context_kernels(ctx),
               celer_context_kernels(cmp));
        printf("perplexity (%s): %.4f\n", celer_context_kernels(cmp),
               exp(nll_cmp / (double)scored));
        printf("KL(%s || %s): mean %.6g  p99 %.6g  max %.6g  over %lld positions\n",
               celer_context_kernels(cmp), celer_context_kernels(ctx), sum / (double)scored,
               kl[p99], kl[scored - 1], (long long)scored);
        printf("top-1 agreement: %.2f%% (%lld of %lld positions)\n",
               100.0 * (double)agree / (double)scored, (long long)agree, (long long)scored);
    }
    free(logits), free(logits_cmp), free(kl), free(ids), free(text);
    celer_context_destroy(cmp);
    celer_context_destroy(ctx);
    celer_tokenizer_close(tok);
    celer_model_close(m);
    return 0;
}

/*
 * generate.c - `celer generate`: a prompt in, a continuation out.
 *
 * -p TEXT is tokenized with the model's tokenizer (tokenizer.json beside the weights,
 * or the GGUF metadata) and, unless --no-chat-template, wrapped as one user turn by the
 * model's chat template; tokens stream to stdout as they are sampled, a speed summary
 * goes to stderr. --ids 1,2,3 gives the prompt as token ids instead and prints ids (the
 * scripted path: with --temp 0 it is exactly greedy decoding). Sampling follows
 * celer.h's chain: --temp, --top-k, --top-p, --min-p, --repeat-penalty, --seed.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char usage_text[] =
    "usage: celer generate -m MODEL (-p TEXT | --ids 1,2,3) [-n N] [--temp T] [--top-k K] [--top-p P]\n"
    "       [--min-p P] [--repeat-penalty R] [--repeat-last-n N] [--seed S] [--system TEXT]\n"
    "       [--no-chat-template] [--print-ids] [--ignore-eos] [-t THREADS] [-c CTX]";

int cmd_generate(int argc, char **argv) {
    cli_model_opts o = {0};
    cli_prompt_opts po = {0};
    const char *ids_arg = NULL;
    int64_t n_predict = -1;
    bool print_ids = false, ignore_eos = false;
    celer_sampler_params sp = celer_sampler_default_params();
    sp.seed = (uint64_t)time(NULL);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (cli_model_flag(&o, argc, argv, &i) || cli_prompt_flag(&po, argc, argv, &i) || cli_sampler_flag(&sp, argc, argv, &i))
            continue;
        if (!strcmp(a, "--ids") && i + 1 < argc) ids_arg = argv[++i];
        else if (!strcmp(a, "-n") && i + 1 < argc) n_predict = cli_parse_int("-n", argv[++i]);
        else if (!strcmp(a, "--print-ids")) print_ids = true;
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = true;
        else cli_die("generate: unknown or incomplete option %s\n%s", a, usage_text);
    }
    if (!ids_arg == !po.prompt) cli_die("generate: give exactly one of -p TEXT and --ids 1,2,3\n%s", usage_text);
    if (n_predict < -1 || n_predict == 0) cli_die("-n: expected a positive count or -1 (until EOS or the context is full)");
    if (ids_arg) print_ids = true;

    const double t0 = now_s();
    celer_model *m = cli_open_model(&o);
    celer_tokenizer *tok = ids_arg ? NULL : cli_open_tokenizer(o.model);
    int64_t n;
    int32_t *ids = ids_arg ? cli_parse_ids(ids_arg, &n) : cli_prompt_ids(m, tok, o.model, &po, &n);
    const int64_t n_ctx = cli_context_size(&o, m, n, n_predict);
    if (n_predict < 0) n_predict = n_ctx - n;
    celer_context *ctx = cli_open_context(&o, m, n_ctx);
    const double t_load = now_s() - t0;

    const int64_t v = celer_model_n_vocab(m);
    float *logits = malloc(sizeof(float) * (size_t)v);
    celer_sampler *smp = celer_sampler_create(&sp, v);
    celer_detok_stream *ds = NULL;
    char err[512];
    if (!logits || !smp) cli_die("out of memory");
    if (tok && celer_detok_stream_create(tok, true, &ds, err, sizeof err) != CELER_OK) cli_die("%s", err);
    for (int64_t i = 0; i < n; i++) celer_sampler_accept(smp, ids[i]);

    const double t1 = now_s();
    celer_batch b = celer_batch_tokens(ids, n);
    if (celer_forward_last_logits(ctx, &b, n - 1, logits) != CELER_OK) cli_die("%s", celer_context_last_error(ctx));
    const double t_prefill = now_s() - t1, t2 = now_s();
    int64_t produced = 0;
    for (; produced < n_predict; produced++) {
        int32_t t = celer_sampler_sample(smp, logits);
        celer_sampler_accept(smp, t);
        if (!ignore_eos && celer_model_is_eos(m, t)) break;
        if (print_ids) {
            printf(produced ? " %d" : "%d", t);
        } else {
            const char *text;
            size_t len;
            if (celer_detok_stream_push(ds, t, &text, &len, err, sizeof err) != CELER_OK) cli_die("%s", err);
            fwrite(text, 1, len, stdout);
        }
        fflush(stdout);
        if (produced + 1 == n_predict) {
            produced++;
            break;
        }
        b = celer_batch_tokens(&t, 1);
        if (celer_forward_last_logits(ctx, &b, 0, logits) != CELER_OK) cli_die("%s", celer_context_last_error(ctx));
    }
    if (ds) {
        const char *text;
        size_t len;
        if (celer_detok_stream_flush(ds, &text, &len, err, sizeof err) == CELER_OK) fwrite(text, 1, len, stdout);
    }
    printf("\n");
    const double t_decode = now_s() - t2;
    if (!print_ids || po.prompt)
        fprintf(stderr, "\nprompt: %lld tokens, %.1f tok/s | generated: %lld tokens, %.1f tok/s | load %.2f s\n",
                (long long)n, (double)n / t_prefill, (long long)produced,
                produced > 1 ? (double)(produced - 1) / t_decode : 0.0, t_load);
    celer_detok_stream_destroy(ds);
    celer_sampler_destroy(smp);
    free(logits);
    free(ids);
    celer_context_destroy(ctx);
    celer_tokenizer_close(tok);
    celer_model_close(m);
    return 0;
}

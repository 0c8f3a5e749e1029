/*
 * generate.c - `celer generate`: a prompt in, a continuation out.
 *
 * -p TEXT is tokenized with the model's tokenizer (tokenizer.json beside the weights,
 * or the GGUF metadata) and, unless --no-chat-template, wrapped as one user turn (after
 * --system) by the model's chat template; tokens stream to stdout as they are sampled
 * and a speed summary goes to stderr. --ids 1,2,3 gives the prompt as token ids instead
 * and prints ids (the scripted path: with --temp 0 it is exactly greedy decoding).
 * --text TEXT is a raw prompt (no chat template), tokenized with the special tokens.
 *
 * Vision-language models take --image FILE (repeatable): with -p the user turn gets an
 * image part per file before the text, as the chat template lays it out; with --text the
 * template's image marker (<image>, Gemma 3's <start_of_image>) marks where each image goes,
 * rewritten as the model's processor does before tokenizing; with --ids the image tokens
 * (one per image block) do.
 * --output-ids prints the generated ids instead of text.
 */
#include "cli/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char usage_text[] = "usage: celer generate -m MODEL (-p TEXT | --text TEXT | --ids "
                                 "1,2,3) [--image FILE]... [-n N]\n"
                                 "       [--temp T] [--top-k K] [--top-p P] [--min-p P] "
                                 "[--repeat-penalty R] [--repeat-last-n N]\n"
                                 "       [--seed S] [--system TEXT] [--chat-template-kwargs JSON] "
                                 "[--no-chat-template] [--output-ids]\n"
                                 "       [--ignore-eos] [-t THREADS] [-c CTX]";

int cmd_generate(int argc, char **argv) {
    cli_model_opts o = {0};
    cli_prompt_opts po = {0};
    cli_images im = {0};
    const char *ids_arg = NULL, *text = NULL;
    int64_t n_predict = -1;
    bool print_ids = false, ignore_eos = false;
    celer_sampler_params sp = celer_sampler_default_params();
    sp.seed = (uint64_t)time(NULL);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (cli_model_flag(&o, argc, argv, &i) || cli_prompt_flag(&po, argc, argv, &i) ||
            cli_sampler_flag(&sp, argc, argv, &i) || cli_image_flag(&im, argc, argv, &i))
            continue;
        if (!strcmp(a, "--ids") && i + 1 < argc)
            ids_arg = argv[++i];
        else if (!strcmp(a, "--text") && i + 1 < argc)
            text = argv[++i];
        else if (!strcmp(a, "-n") && i + 1 < argc)
            n_predict = cli_parse_int("-n", argv[++i]);
        else if (!strcmp(a, "--print-ids") || !strcmp(a, "--output-ids"))
            print_ids = true;
        else if (!strcmp(a, "--ignore-eos"))
            ignore_eos = true;
        else
            cli_die("generate: unknown or incomplete option %s\n%s", a, usage_text);
    }
    if ((ids_arg != NULL) + (po.prompt != NULL) + (text != NULL) != 1)
        cli_die("generate: give exactly one of -p TEXT, --text TEXT and --ids 1,2,3\n%s",
                usage_text);
    if (po.template_kwargs && (!po.prompt || po.no_template))
        cli_die("--chat-template-kwargs: the chat template only renders -p TEXT (not --text, --ids "
                "or --no-chat-template)");
    if (n_predict < -1 || n_predict == 0)
        cli_die("-n: expected a positive count or -1 (until EOS or the context is full)");
    if (ids_arg) print_ids = true;

    const double t0 = cli_now();
    celer_model *m = cli_open_model(&o);
    cli_images_load(&im, m);
    celer_tokenizer *tok = ids_arg ? NULL : cli_open_tokenizer(o.model);
    int64_t n;
    int32_t *ids;
    if (ids_arg) {
        ids = cli_parse_ids(ids_arg, &n);
    } else if (text) {
        ids = cli_tokenize(m, tok, &im, text, true, &n);
        if (n == 0) cli_die("--text: the prompt is empty");
    } else {
        po.images = &im;
        ids = cli_prompt_ids(m, tok, o.model, &po, &n);
    }
    const int64_t n_ctx = cli_context_size(&o, m, cli_images_expanded(&im, m, ids, n), n_predict);

    cli_session s;
    cli_stats st;
    cli_session_open(&s, &o, m, tok, &sp, n_ctx);
    const double t_load = cli_now() - t0;
    cli_session_reply_images(&s, ids, n, &im, n_predict, print_ids, ignore_eos, NULL, &st);
    printf("\n");
    if (!ids_arg) cli_stats_print(&st, t_load);
    cli_session_close(&s);
    cli_images_free(&im);
    free(ids);
    celer_tokenizer_close(tok);
    celer_model_close(m);
    return 0;
}

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
 *
 * Structured output, as llama.cpp's flags: --json-schema takes a JSON Schema inline (an
 * argument that starts with '{') or from a file, --json-schema-file (-jf) from a file,
 * --grammar GBNF and --grammar-file FILE a grammar in llama.cpp's GBNF; the continuation then
 * follows it (celer_request_params.grammar) and ends where its sentence is complete.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char usage_text[] =
    "usage: celer generate -m MODEL (-p TEXT | --text TEXT | --ids "
    "1,2,3) [--image FILE]... [-n N]\n"
    "       [--temp T] [--top-k K] [--top-p P] [--min-p P] "
    "[--repeat-penalty R] [--repeat-last-n N]\n"
    "       [--seed S] [--system TEXT] [--chat-template-kwargs JSON] "
    "[--no-chat-template] [--output-ids]\n"
    "       [--ignore-eos] [--json-schema JSON|FILE] [--json-schema-file "
    "FILE]\n"
    "       [--grammar GBNF] [--grammar-file FILE] [-t THREADS] [-c CTX]";

/* The GBNF of a JSON Schema given inline or as a file (malloc'd); dies naming what the
 * compiler refused. */
static char *schema_grammar(const char *arg, bool file) {
    char *text = file || arg[0] != '{' ? cli_read_file(arg, NULL) : NULL, *gbnf, err[512];
    if (celer_json_schema_to_grammar(text ? text : arg, &gbnf, err, sizeof err) != CELER_OK)
        cli_die("--json-schema%s: %s", file ? "-file" : "", err);
    free(text);
    return gbnf;
}

int cmd_generate(int argc, char **argv) {
    if (cli_help(argc, argv, usage_text)) return 0;
    cli_model_opts o = {0};
    cli_prompt_opts po = {0};
    cli_images im = {0};
    const char *ids_arg = NULL, *text = NULL;
    int64_t n_predict = -1;
    bool print_ids = false, ignore_eos = false;
    char *grammar = NULL;
    int n_grammar = 0;
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
        else if (!strcmp(a, "--json-schema") && i + 1 < argc)
            free(grammar), grammar = schema_grammar(argv[++i], false), n_grammar++;
        else if ((!strcmp(a, "--json-schema-file") || !strcmp(a, "-jf")) && i + 1 < argc)
            free(grammar), grammar = schema_grammar(argv[++i], true), n_grammar++;
        else if (!strcmp(a, "--grammar") && i + 1 < argc)
            free(grammar), grammar = strdup(argv[++i]), n_grammar++;
        else if (!strcmp(a, "--grammar-file") && i + 1 < argc)
            free(grammar), grammar = cli_read_file(argv[++i], NULL), n_grammar++;
        else
            cli_die("generate: unknown or incomplete option %s\n%s", a, usage_text);
    }
    if ((ids_arg != NULL) + (po.prompt != NULL) + (text != NULL) != 1)
        cli_die("generate: give exactly one of -p TEXT, --text TEXT and --ids 1,2,3\n%s",
                usage_text);
    if (po.template_kwargs && (!po.prompt || po.no_template))
        cli_die("--chat-template-kwargs: the chat template only renders -p TEXT (not --text, --ids "
                "or --no-chat-template)");
    if (n_grammar > 1)
        cli_die("generate: give one of --json-schema, --json-schema-file, --grammar and "
                "--grammar-file");
    if (grammar && ids_arg)
        cli_die("generate: a grammar constrains text: give -p or --text, not --ids");
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
    s.grammar = grammar;
    const double t_load = cli_now() - t0;
    cli_session_reply_images(&s, ids, n, &im, n_predict, print_ids, ignore_eos, NULL, &st);
    printf("\n");
    if (!ids_arg) cli_stats_print(&st, t_load);
    cli_session_close(&s);
    free(grammar);
    cli_images_free(&im);
    free(ids);
    celer_tokenizer_close(tok);
    celer_model_close(m);
    return 0;
}

/*
 * logits.c - `celer logits -m DIR (--ids 1,2,3 | --text TEXT) [--image FILE]... [--all] -o
 * out.npy`: float32 logits, [1, vocab] of the last row through forward_last_logits, or [n, vocab]
 * of every row through forward with --all.
 *
 * With --image (vision-language models) each image token of the prompt expands to its
 * block's rows, which go in as embedding rows of the batch; --text writes the chat
 * template's image marker (<image>, Gemma 3's <start_of_image>), rewritten as the model's
 * processor does before tokenizing.
 */
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_text[] = "usage: celer logits -m MODEL (--ids 1,2,3 | --text TEXT) "
                                 "[--image FILE]... [--all] -o FILE.npy";

/* The batch of ids[n] with every image token replaced by its image's rows: *tokens[*rows]
 * (-1 at image rows) and *embd[*rows, d] (NULL without images). */
static void image_batch(celer_context *ctx, const celer_model *m, const cli_images *im,
                        const int32_t *ids, int64_t n, int32_t **tokens, float **embd,
                        int64_t *rows) {
    const int64_t total = cli_images_expanded(im, m, ids, n), d = celer_model_n_embd(m);
    const int32_t tok = celer_model_image_token(m);
    *tokens = malloc(sizeof **tokens * (size_t)total);
    *embd = im->n ? malloc(sizeof **embd * (size_t)(total * d)) : NULL;
    if (!*tokens || (im->n && !*embd)) cli_die("out of memory");
    int64_t at = 0, k = 0, block = 0, blocks = 1, r = 0;
    float *img = NULL; /* the rows of image k, block by block */
    for (int64_t i = 0; i < n; i++) {
        if (!im->n || ids[i] != tok) {
            (*tokens)[at++] = ids[i];
            continue;
        }
        char err[512];
        if (block == 0) {
            if (celer_model_image_positions(m, im->img[k], &r, err, sizeof err) != CELER_OK ||
                celer_model_image_blocks(m, im->img[k], &blocks, err, sizeof err) != CELER_OK)
                cli_die("%s", err);
            free(img);
            if (!(img = malloc(sizeof *img * (size_t)(r * d)))) cli_die("out of memory");
            if (celer_image_encode(ctx, im->img[k], img) != CELER_OK)
                cli_die("%s", celer_context_last_error(ctx));
        }
        const int64_t per = r / blocks;
        memcpy(*embd + at * d, img + block * per * d, sizeof *img * (size_t)(per * d));
        for (int64_t j = 0; j < per; j++) (*tokens)[at++] = -1;
        if (++block == blocks) block = 0, k++;
    }
    free(img);
    *rows = at;
}

int cmd_logits(int argc, char **argv) {
    if (cli_help(argc, argv, usage_text)) return 0;
    cli_model_opts o = {0};
    cli_images im = {0};
    const char *ids_arg = NULL, *text = NULL, *out = NULL;
    bool all = false;
    for (int i = 0; i < argc; i++) {
        if (cli_model_flag(&o, argc, argv, &i) || cli_image_flag(&im, argc, argv, &i)) continue;
        if (!strcmp(argv[i], "--ids") && i + 1 < argc)
            ids_arg = argv[++i];
        else if (!strcmp(argv[i], "--text") && i + 1 < argc)
            text = argv[++i];
        else if (!strcmp(argv[i], "-o") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--all"))
            all = true;
        else
            cli_die("logits: unknown or incomplete option %s\n%s", argv[i], usage_text);
    }
    if (!ids_arg == !text || !out)
        cli_die("logits: -o and exactly one of --ids and --text are required\n%s", usage_text);
    celer_model *m = cli_open_model(&o);
    cli_images_load(&im, m);
    int64_t n;
    int32_t *ids;
    if (ids_arg) {
        ids = cli_parse_ids(ids_arg, &n);
    } else {
        celer_tokenizer *tok = cli_open_tokenizer(o.model);
        ids = cli_tokenize(m, tok, &im, text, true, &n);
        celer_tokenizer_close(tok);
        if (n == 0) cli_die("--text: the prompt is empty");
    }
    const int64_t need = cli_images_expanded(&im, m, ids, n);
    if (o.n_ctx && o.n_ctx < need)
        cli_die("-c %lld: the request needs %lld positions", (long long)o.n_ctx, (long long)need);
    celer_context *ctx = cli_open_context(&o, m, o.n_ctx ? o.n_ctx : need);
    int32_t *tokens;
    float *embd;
    int64_t rows;
    image_batch(ctx, m, &im, ids, n, &tokens, &embd, &rows);
    const int64_t v = celer_model_n_vocab(m), out_rows = all ? rows : 1;
    float *logits = malloc(sizeof(float) * (size_t)(out_rows * v));
    if (!logits) cli_die("out of memory");
    const celer_batch b = {.n = rows, .token = tokens, .embd = embd};
    celer_status s =
        all ? celer_forward(ctx, &b, logits) : celer_forward_last_logits(ctx, &b, rows - 1, logits);
    if (s != CELER_OK) cli_die("%s", celer_context_last_error(ctx));
    if (npy_write_f32(out, logits, out_rows, v) != 0) cli_die("%s: cannot write", out);
    free(logits);
    free(tokens);
    free(embd);
    free(ids);
    cli_images_free(&im);
    celer_context_destroy(ctx);
    celer_model_close(m);
    return 0;
}

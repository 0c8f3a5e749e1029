/*
 * test_contract.c - the model contract (DESIGN.md section 2) and the KV cache.
 *
 * For prompt lengths 1, 7 and 13 (longer than the mistral and cohere2 windows of 8), the
 * three forward_last_logits entry points must equal the full forward's row last_pos,
 * and must NOT equal row last_pos - 1, so a slice shifted by one row is caught. Then:
 * prefill + one decode step equals the full forward of n + 1 tokens; two sequences in
 * one context do not disturb each other; a mixed batch (prefill beside decode) equals
 * separate calls; a sequence rolled back (celer_seq_truncate) and decoded again gives the
 * same rows; a full context is a clean error that changes nothing; the memory a context
 * reports (celer_context_get_memory) holds its KV pools exactly.
 *
 * The vision-language wrapper (every fixture with preprocessor_config.json): a prompt
 * whose image token expands to the image's encoded rows, as a batch mixing token rows and
 * embedding rows; the three entry points equal the full forward's last row, the LM head
 * runs on one row (celer_context_head_rows), and a slice shifted by one row is caught. Where
 * an image block's rows see each other (Gemma 3): the embeddings entry point (no blocks) is
 * held to the forward of the same embedding rows, which the block must change; a forward in
 * steps shorter than the prompt (one row more than the block) equals one step; a block
 * longer than a step is refused.
 *
 * Everything runs on the CPU, then on the device CELER_TEST_DEVICE names (make test-cuda).
 * "Equal" is 1e-6 relative on the CPU, whose products sum in the same order whatever the
 * rows of a call; a GPU's matrix library picks its kernels (and so the order of its sums)
 * by the shape of a call, so there it is 1e-5. On an AMX machine the CPU's 4-bit products
 * of 32 rows and more take bf16 tiles, so the head of such a forward and the head of one
 * row differ by the int8 product's rounding: 1e-4 there (same_for). A shifted slice
 * differs by far more.
 */
#include "harness.h"

#include "backend/ref/backend_ref.h"
#include "models/model.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static celer_model *model;
static int64_t V, D;
static const char *device = "cpu";
static double same = 1e-6; /* relative difference that counts as equal on device */

/* What counts as equal between one row of the head and row of a forward of n rows. */
static double same_for(int64_t n) {
    return !strcmp(device, "cpu") && n >= 32 && celer_kernels_supported("amx") ? 1e-4 : same;
}

static celer_context *ctx_new(int64_t n_ctx, int32_t n_seq) {
    const celer_context_params cp = harness_context_params(n_ctx, n_seq, device);
    celer_context *ctx = NULL;
    char err[512];
    if (celer_context_create(model, &cp, &ctx, err, sizeof err) != CELER_OK)
        CHECK(false, "%s", err);
    return ctx;
}

static double rel_diff(const float *a, const float *ref) {
    return max_abs_diff(a, ref, V) / max_abs(ref, V);
}

static void check_entry_points(const int32_t *ids, int64_t n) {
    const int64_t last = n - 1;
    float *all = malloc(sizeof(float) * (size_t)(n * V)), *row = malloc(sizeof(float) * (size_t)V);
    celer_context *ctx = ctx_new(64, 3);
    celer_batch b = celer_batch_tokens(ids, n);
    CHECK(celer_forward(ctx, &b, all) == CELER_OK, "forward n=%lld", (long long)n);
    celer_seq_reset(ctx, 0);
    const float *want = all + last * V, *shifted = n > 1 ? all + (last - 1) * V : NULL;

    const char *names[3] = {"forward_last_logits", "forward_last_logits_with_sequence_id",
                            "forward_last_logits_with_embeddings_and_sequence_id"};
    float *embd = malloc(sizeof(float) * (size_t)(n * D));
    CHECK(celer_embed_tokens(ctx, ids, n, embd) == CELER_OK, "embed_tokens");
    for (int k = 0; k < 3; k++) {
        celer_status s;
        if (k == 0)
            s = celer_forward_last_logits(ctx, &b, last, row);
        else if (k == 1)
            s = celer_forward_last_logits_with_sequence_id(ctx, &b, 1, last, row);
        else
            s = celer_forward_last_logits_with_embeddings_and_sequence_id(ctx, embd, n, 2, last,
                                                                          row);
        CHECK(s == CELER_OK, "%s n=%lld: %s", names[k], (long long)n,
              celer_context_last_error(ctx));
        double d = rel_diff(row, want);
        CHECK(d <= same_for(n), "%s n=%lld: differs from forward row %lld by %g", names[k],
              (long long)n, (long long)last, d);
        if (shifted) {
            double ds = rel_diff(row, shifted);
            CHECK(ds > same_for(n),
                  "%s n=%lld: also matches row %lld (%g): the shifted-slice check cannot fail",
                  names[k], (long long)n, (long long)(last - 1), ds);
        }
    }
    CHECK(celer_seq_length(ctx, 0) == n && celer_seq_length(ctx, 1) == n &&
              celer_seq_length(ctx, 2) == n,
          "each entry point filled its own sequence");
    /* last_pos inside the batch but not the last row: still that row. */
    if (n > 2) {
        celer_seq_reset(ctx, 1);
        CHECK(celer_forward_last_logits_with_sequence_id(ctx, &b, 1, 1, row) == CELER_OK,
              "last_pos 1");
        CHECK(rel_diff(row, all + V) <= same_for(n), "n=%lld last_pos=1 equals forward row 1",
              (long long)n);
    }
    CHECK(celer_forward_last_logits(ctx, &b, n, row) == CELER_STATUS_INVALID_ARGUMENT,
          "last_pos n is refused");
    free(all), free(row), free(embd);
    celer_context_destroy(ctx);
}

static void check_cache(const int32_t *ids, int64_t n) {
    float *all = malloc(sizeof(float) * (size_t)((n + 1) * V)),
          *row = malloc(sizeof(float) * (size_t)V);
    celer_context *ctx = ctx_new(64, 2);
    celer_batch b = celer_batch_tokens(ids, n + 1);
    CHECK(celer_forward(ctx, &b, all) == CELER_OK, "forward n+1");
    celer_seq_reset(ctx, 0);
    b.n = n;
    CHECK(celer_forward_last_logits(ctx, &b, n - 1, row) == CELER_OK, "prefill");
    celer_batch step = celer_batch_tokens(ids + n, 1);
    CHECK(celer_forward_last_logits(ctx, &step, 0, row) == CELER_OK, "decode");
    double d = rel_diff(row, all + n * V);
    printf("  prefill %lld + 1 decode vs forward of %lld: rel %.3g\n", (long long)n,
           (long long)(n + 1), d);
    CHECK(d <= 1e-5, "prefill+decode differs from full forward by %g", d);
    free(all), free(row);
    celer_context_destroy(ctx);
}

/* Rolling a sequence back (a rejected draft): prefill n tokens, decode the rest of ids[m]
 * one at a time, truncate to keep, decode from there again: each logits row equals the
 * first pass's (the same calls on the same cache rows, so bit for bit on the CPU). keep
 * values cut inside a block and on a block boundary; keeping more than is held is refused
 * and changes nothing. */
static void check_truncate(const int32_t *ids, int64_t n, int64_t m) {
    float *first = malloc(sizeof(float) * (size_t)(m * V)),
          *row = malloc(sizeof(float) * (size_t)V);
    celer_context *ctx = ctx_new(64, 1);
    celer_batch b = celer_batch_tokens(ids, n);
    CHECK(celer_forward_last_logits(ctx, &b, n - 1, first + (n - 1) * V) == CELER_OK, "prefill");
    for (int64_t t = n; t < m; t++) {
        celer_batch step = celer_batch_tokens(ids + t, 1);
        CHECK(celer_forward_last_logits(ctx, &step, 0, first + t * V) == CELER_OK, "decode %lld",
              (long long)t);
    }
    int64_t kept = -1;
    CHECK(celer_seq_truncate(ctx, 0, m + 1, &kept) == CELER_STATUS_INVALID_ARGUMENT &&
              celer_seq_length(ctx, 0) == m,
          "truncate past the end: refused, length %lld", (long long)celer_seq_length(ctx, 0));
    const int64_t keeps[] = {m - 2, 16, n + 1};
    for (int k = 0; k < 3; k++) {
        const int64_t keep = keeps[k];
        CHECK(celer_seq_truncate(ctx, 0, keep, &kept) == CELER_OK && kept == keep &&
                  celer_seq_length(ctx, 0) == keep,
              "truncate to %lld: kept %lld", (long long)keep, (long long)kept);
        double worst = 0;
        for (int64_t t = keep; t < m; t++) {
            celer_batch step = celer_batch_tokens(ids + t, 1);
            CHECK(celer_forward_last_logits(ctx, &step, 0, row) == CELER_OK, "decode %lld again",
                  (long long)t);
            const double d = rel_diff(row, first + t * V);
            worst = d > worst ? d : worst;
        }
        printf("  truncate to %lld of %lld, decode again: rel %.3g\n", (long long)keep,
               (long long)m, worst);
        CHECK(worst <= (strcmp(device, "cpu") ? same : 0.0),
              "after truncating to %lld the logits differ by %g", (long long)keep, worst);
    }
    free(first), free(row);
    celer_context_destroy(ctx);
}

/* Two sequences with different prompts, interleaved, against each run alone. */
static void check_two_sequences(const int32_t *ids, int64_t n) {
    const int64_t na = n, nb = n - 3;
    const int32_t *a = ids, *bb = ids + 3;
    float *ref_a = malloc(sizeof(float) * (size_t)V), *ref_b = malloc(sizeof(float) * (size_t)V);
    float *got = malloc(sizeof(float) * (size_t)(2 * V));
    const int32_t next_a = 11, next_b = 17;
    celer_context *solo = ctx_new(64, 1);
    celer_batch x = celer_batch_tokens(a, na), one;
    celer_forward_last_logits(solo, &x, na - 1, ref_a);
    one = celer_batch_tokens(&next_a, 1);
    celer_forward_last_logits(solo, &one, 0, ref_a);
    celer_seq_reset(solo, 0);
    x = celer_batch_tokens(bb, nb);
    celer_forward_last_logits(solo, &x, nb - 1, ref_b);
    one = celer_batch_tokens(&next_b, 1);
    celer_forward_last_logits(solo, &one, 0, ref_b);
    celer_context_destroy(solo);

    celer_context *ctx = ctx_new(64, 2);
    x = celer_batch_tokens(a, na);
    celer_forward_last_logits_with_sequence_id(ctx, &x, 0, na - 1, got);
    x = celer_batch_tokens(bb, nb);
    celer_forward_last_logits_with_sequence_id(ctx, &x, 1, nb - 1, got);
    one = celer_batch_tokens(&next_b, 1);
    celer_forward_last_logits_with_sequence_id(ctx, &one, 1, 0, got + V);
    one = celer_batch_tokens(&next_a, 1);
    celer_forward_last_logits_with_sequence_id(ctx, &one, 0, 0, got);
    CHECK(rel_diff(got, ref_a) <= same && rel_diff(got + V, ref_b) <= same,
          "two interleaved sequences equal their solo runs (%g, %g)", rel_diff(got, ref_a),
          rel_diff(got + V, ref_b));

    /* One mixed batch: a decode row of sequence 0 beside sequence 1's prefill. */
    celer_seq_reset(ctx, 0);
    celer_seq_reset(ctx, 1);
    x = celer_batch_tokens(a, na);
    celer_forward_last_logits_with_sequence_id(ctx, &x, 0, na - 1, got);
    int32_t tok[64], seq[64];
    int8_t want[64] = {0};
    tok[0] = next_a, seq[0] = 0, want[0] = 1;
    for (int64_t i = 0; i < nb; i++) tok[1 + i] = bb[i], seq[1 + i] = 1;
    want[nb] = 1;
    celer_batch mix = {.n = nb + 1, .token = tok, .seq_id = seq, .logits = want};
    CHECK(celer_batch_decode(ctx, &mix, got) == CELER_OK, "mixed batch: %s",
          celer_context_last_error(ctx));
    float *pre_b = malloc(sizeof(float) * (size_t)V);
    celer_context *s2 = ctx_new(64, 1);
    x = celer_batch_tokens(bb, nb);
    celer_forward_last_logits(s2, &x, nb - 1, pre_b);
    celer_context_destroy(s2);
    CHECK(rel_diff(got, ref_a) <= same && rel_diff(got + V, pre_b) <= same,
          "mixed decode+prefill batch equals separate calls (%g, %g)", rel_diff(got, ref_a),
          rel_diff(got + V, pre_b));
    free(pre_b);

    /* A full context: clean error, nothing changed. */
    celer_context *small = ctx_new(8, 1);
    x = celer_batch_tokens(a, 9);
    celer_status s = celer_forward_last_logits(small, &x, 8, got);
    CHECK(s == CELER_STATUS_CONTEXT_FULL &&
              strstr(celer_context_last_error(small), "context size 8"),
          "9 tokens into n_ctx 8: %s", celer_context_last_error(small));
    CHECK(celer_seq_length(small, 0) == 0, "a refused batch leaves the sequence empty");
    x.n = 8;
    CHECK(celer_forward_last_logits(small, &x, 7, got) == CELER_OK, "8 tokens fit");
    x.n = 1;
    CHECK(celer_forward_last_logits(small, &x, 0, got) == CELER_STATUS_CONTEXT_FULL,
          "a 9th decode step is refused");
    celer_context_destroy(small);
    free(ref_a), free(ref_b), free(got);
    celer_context_destroy(ctx);
}

/* The first index of the largest non-NaN value of row[V] (an independent reference). */
static int32_t row_argmax(const float *row) {
    int32_t best = -1;
    for (int32_t i = 0; i < (int32_t)V; i++)
        if (row[i] == row[i] && (best < 0 || row[i] > row[best])) best = i;
    return best < 0 ? (int32_t)V - 1 : best;
}

/* celer_batch_decode_ids against celer_batch_decode of the same batch in a twin context:
 * ids are the argmax of the logits of every row that wants anything, rows flagged
 * CELER_ROW_LOGITS get those logits; decode rows of two sequences beside a prefill chunk
 * of a third whose last row wants the argmax. */
static void check_decode_ids(const int32_t *ids, int64_t n) {
    celer_context *c[2] = {ctx_new(64, 3), ctx_new(64, 3)};
    float *lg[2] = {malloc(sizeof(float) * (size_t)(3 * V)),
                    malloc(sizeof(float) * (size_t)(3 * V))};
    for (int i = 0; i < 2; i++) {
        celer_batch x = celer_batch_tokens(ids, n);
        celer_forward_last_logits_with_sequence_id(c[i], &x, 0, n - 1, lg[i]);
        x = celer_batch_tokens(ids + 2, n - 2);
        celer_forward_last_logits_with_sequence_id(c[i], &x, 1, n - 3, lg[i]);
    }
    int32_t tok[6] = {11, 17, ids[4], ids[5], ids[6], ids[7]}, seq[6] = {0, 1, 2, 2, 2, 2};
    int8_t flags[6] = {CELER_ROW_LOGITS, CELER_ROW_ARGMAX, 0, 0, 0, CELER_ROW_ARGMAX},
           all[6] = {1, 1, 0, 0, 0, 1};
    const celer_batch b = {.n = 6, .token = tok, .seq_id = seq, .logits = flags};
    const celer_batch ref = {.n = 6, .token = tok, .seq_id = seq, .logits = all};
    int32_t got[3] = {-1, -1, -1};
    CHECK(celer_batch_decode(c[1], &ref, lg[1]) == CELER_OK, "reference batch: %s",
          celer_context_last_error(c[1]));
    CHECK(celer_batch_decode_ids(c[0], &b, lg[0], got) == CELER_OK, "batch with ids: %s",
          celer_context_last_error(c[0]));
    bool ids_ok = true;
    for (int k = 0; k < 3; k++) ids_ok &= got[k] == row_argmax(lg[1] + k * V);
    CHECK(ids_ok, "ids (%d %d %d) are the argmax of the logits rows (%d %d %d)", got[0], got[1],
          got[2], row_argmax(lg[1]), row_argmax(lg[1] + V), row_argmax(lg[1] + 2 * V));
    CHECK(rel_diff(lg[0], lg[1]) <= same, "the logits row flagged CELER_ROW_LOGITS (%g)",
          rel_diff(lg[0], lg[1]));
    CHECK(celer_seq_length(c[0], 2) == 4 && celer_seq_length(c[0], 1) == n - 1,
          "the batch is in the caches as celer_batch_decode puts it");
    CHECK(celer_batch_decode_ids(c[0], &b, lg[0], NULL) == CELER_STATUS_INVALID_ARGUMENT &&
              strstr(celer_context_last_error(c[0]), "ids"),
          "ids NULL refused: %s", celer_context_last_error(c[0]));
    for (int i = 0; i < 2; i++) celer_context_destroy(c[i]), free(lg[i]);
}

/* The first image_* file of fixture dir (a static path), or NULL. */
static const char *fixture_image(const char *dir) {
    static char path[4400];
    static const char *const names[] = {"image_a.png", "image_0.png", "image_wide.png", NULL};
    for (const char *const *n = names; *n; n++) {
        snprintf(path, sizeof path, "%s/%s", dir, *n);
        FILE *f = fopen(path, "rb");
        if (f) {
            fclose(f);
            return path;
        }
    }
    DIR *d = opendir(dir);
    const char *found = NULL;
    for (struct dirent *de; d && (de = readdir(d));)
        if (!strncmp(de->d_name, "image_", 6) &&
            (strstr(de->d_name, ".png") || strstr(de->d_name, ".jpg"))) {
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            found = path;
            break;
        }
    if (d) closedir(d);
    return found;
}

static void check_vlm(const char *name) {
    char err[512];
    const char *dir = fixture_path(name), *img_path = fixture_image(dir);
    celer_image *img = NULL;
    if (!CHECK(img_path != NULL, "%s: no image_* file", name)) return;
    if (!CHECK(celer_model_open(dir, NULL, &model, err, sizeof err) == CELER_OK, "%s", err)) return;
    if (!CHECK(celer_image_load(img_path, &img, err, sizeof err) == CELER_OK, "%s", err)) goto out;
    V = celer_model_n_vocab(model);
    D = celer_model_n_embd(model);
    const int32_t image_tok = celer_model_image_token(model);
    int64_t rows = 0;
    CHECK(celer_model_has_vision(model) && image_tok >= 0, "%s: a vision model with an image token",
          name);
    CHECK(celer_model_image_positions(model, img, &rows, err, sizeof err) == CELER_OK && rows > 0,
          "%s", err);
    /* 3 text rows, the image, 4 text rows */
    const int64_t n = 3 + rows + 4, last = n - 1;
    int32_t *tok = malloc(sizeof *tok * (size_t)n);
    float *embd = calloc((size_t)(n * D), sizeof *embd),
          *all = malloc(sizeof(float) * (size_t)(n * V));
    float *row = malloc(sizeof(float) * (size_t)V),
          *merged = malloc(sizeof(float) * (size_t)(n * D));
    for (int64_t i = 0; i < n; i++) tok[i] = i >= 3 && i < 3 + rows ? -1 : (int32_t)(5 + i % 40);
    celer_context *ctx = ctx_new(n + 8, 3);
    CHECK(celer_image_encode(ctx, img, embd + 3 * D) == CELER_OK, "encode: %s",
          celer_context_last_error(ctx));
    const celer_batch b = {.n = n, .token = tok, .embd = embd};
    CHECK(celer_forward(ctx, &b, all) == CELER_OK, "forward: %s", celer_context_last_error(ctx));
    CHECK(celer_context_head_rows(ctx) == n, "forward ran the head on every row (%lld)",
          (long long)celer_context_head_rows(ctx));
    celer_seq_reset(ctx, 0);
    /* merged input rows for the embeddings entry point: text rows from the table */
    memcpy(merged, embd, sizeof(float) * (size_t)(n * D));
    for (int64_t i = 0; i < n; i++)
        if (tok[i] >= 0)
            CHECK(celer_embed_tokens(ctx, &tok[i], 1, merged + i * D) == CELER_OK, "embed");
    /* Embedding rows alone mark no image block (every row causal, as transformers runs
     * inputs_embeds without token_type_ids): where the model's blocks see each other
     * (Gemma 3), the embeddings entry point is held to the forward of those rows, which the
     * blocks must change. */
    const bool whole = celer_model_image_blocks_whole(model);
    float *all_e = malloc(sizeof(float) * (size_t)(n * V));
    const celer_batch be_rows = {.n = n, .embd = merged};
    memcpy(all_e, all, sizeof(float) * (size_t)(n * V));
    if (whole) {
        CHECK(celer_forward(ctx, &be_rows, all_e) == CELER_OK, "forward of embedding rows: %s",
              celer_context_last_error(ctx));
        celer_seq_reset(ctx, 0);
        CHECK(rel_diff(all_e + last * V, all + last * V) > 1e-4,
              "%s: the image block's rows seeing each other "
              "change the last row",
              name);
    }
    const char *names[3] = {"forward_last_logits", "forward_last_logits_with_sequence_id",
                            "forward_last_logits_with_embeddings_and_sequence_id"};
    for (int k = 0; k < 3; k++) {
        celer_status s =
            k == 0   ? celer_forward_last_logits(ctx, &b, last, row)
            : k == 1 ? celer_forward_last_logits_with_sequence_id(ctx, &b, 1, last, row)
                     : celer_forward_last_logits_with_embeddings_and_sequence_id(ctx, merged, n, 2,
                                                                                 last, row);
        CHECK(s == CELER_OK, "%s %s: %s", name, names[k], celer_context_last_error(ctx));
        const float *ref = k == 2 ? all_e : all;
        const double d = rel_diff(row, ref + last * V), ds = rel_diff(row, ref + (last - 1) * V);
        CHECK(d <= same_for(n), "%s %s: differs from the forward's last row by %g", name, names[k],
              d);
        CHECK(ds > same_for(n),
              "%s %s: also matches row %lld (%g): the shifted-slice check cannot fail", name,
              names[k], (long long)(last - 1), ds);
        CHECK(celer_context_head_rows(ctx) == 1, "%s %s: the head ran on %lld rows, expected 1",
              name, names[k], (long long)celer_context_head_rows(ctx));
    }
    if (whole) { /* steps of rows + 1: cut before the block, never inside; rows - 1: refused */
        celer_context_params cp = harness_context_params(n + 8, 1, device);
        cp.n_batch = rows + 1;
        celer_context *small = NULL;
        float *chunked = malloc(sizeof(float) * (size_t)(n * V));
        if (CHECK(celer_context_create(model, &cp, &small, err, sizeof err) == CELER_OK, "%s",
                  err)) {
            CHECK(celer_forward(small, &b, chunked) == CELER_OK, "forward in steps of %lld: %s",
                  (long long)cp.n_batch, celer_context_last_error(small));
            /* a device's matrix library picks its kernels by the step's shape, and in the
             * fp16 cache a last-bit difference can round a stored value the other way: the
             * bound test_parity gives re-chunked prefill there */
            const double dc = max_abs_diff(chunked, all, n * V) / max_abs(all, n * V),
                         bound = device ? 1e-4 : same;
            CHECK(dc <= bound, "%s: the forward in steps of %lld rows differs by %g", name,
                  (long long)cp.n_batch, dc);
            celer_context_destroy(small);
        }
        cp.n_batch = rows - 1;
        if (rows > 1 && CHECK(celer_context_create(model, &cp, &small, err, sizeof err) == CELER_OK,
                              "%s", err)) {
            CHECK(celer_forward(small, &b, chunked) == CELER_STATUS_INVALID_ARGUMENT &&
                      strstr(celer_context_last_error(small), "image block"),
                  "%s: a block longer than n_batch is refused: %s", name,
                  celer_context_last_error(small));
            CHECK(celer_seq_length(small, 0) == 0, "%s: the refused call changed nothing", name);
            celer_context_destroy(small);
        }
        free(chunked);
    }
    /* the image rows matter: the same prompt with the image rows zeroed differs */
    celer_seq_reset(ctx, 0);
    memset(embd + 3 * D, 0, sizeof(float) * (size_t)(rows * D));
    CHECK(celer_forward_last_logits(ctx, &b, last, row) == CELER_OK, "zeroed image");
    CHECK(rel_diff(row, all + last * V) > 1e-4, "%s: the image rows change the last row", name);
    printf("  %s: %lld image rows, entry points == forward row %lld, head on 1 row\n", name,
           (long long)rows, (long long)last);
    celer_context_destroy(ctx);
    free(tok), free(embd), free(all), free(all_e), free(row), free(merged);
out:
    celer_image_free(img);
    celer_model_close(model);
}

/* celer_context_get_memory: the KV pools are exactly n_seq x n_ctx (in blocks of 16)
 * positions of the model's bytes per token (fp16, the default), twice that for twice the
 * context; the weights and buffers are there and the buffers hold at least the hidden
 * states of a batch. */
static void check_memory(void) {
    const celer_model_info info = celer_model_get_info(model);
    celer_context *a = ctx_new(40, 2), *b = ctx_new(80, 2);
    if (!a || !b) {
        celer_context_destroy(a);
        celer_context_destroy(b);
        return;
    }
    const celer_context_memory ma = celer_context_get_memory(a), mb = celer_context_get_memory(b);
    CHECK(ma.kv == 2 * 48 * info.kv_bytes_per_token,
          "KV bytes %lld, expected %lld (2 x 48 positions)", (long long)ma.kv,
          (long long)(2 * 48 * info.kv_bytes_per_token));
    CHECK(mb.kv == 2 * 80 * info.kv_bytes_per_token,
          "KV bytes %lld, expected %lld (2 x 80 positions)", (long long)mb.kv,
          (long long)(2 * 80 * info.kv_bytes_per_token));
    CHECK(ma.weights > 0 && ma.weights == mb.weights,
          "weights %lld and %lld: one copy for both contexts", (long long)ma.weights,
          (long long)mb.weights);
    const int64_t hidden = 4 * celer_context_n_batch(a) * D;
    CHECK(ma.buffers >= hidden, "buffers %lld below a batch's hidden states (%lld)",
          (long long)ma.buffers, (long long)hidden);
    celer_context_destroy(b);

    /* A backend with memory of its own holds the logits rows a call asked for, grown to
     * the most so far: one row for a last-row call, 9 for a 9-row forward, and no more
     * for a later last-row call. A host backend writes the caller's memory (none). */
    const char *staged = getenv("CELER_CPU_STAGED");
    const bool own =
        strcmp(celer_context_device(a), "cpu") != 0 || (staged && !strcmp(staged, "1"));
    const int64_t row = own ? 4 * V : 0;
    int32_t ids[9];
    for (int i = 0; i < 9; i++) ids[i] = 1 + 7 * i % (int)(V - 1);
    float *all = malloc(sizeof(float) * 9 * (size_t)V);
    if (!CHECK(all != NULL, "out of memory")) goto out;
    const int64_t grown[3] = {row, 9 * row, 9 * row};
    for (int k = 0; k < 3; k++) {
        celer_seq_reset(a, 0);
        const celer_batch bt = celer_batch_tokens(ids, k == 1 ? 9 : 5);
        const celer_status st =
            k == 1 ? celer_forward(a, &bt, all) : celer_forward_last_logits(a, &bt, 4, all);
        const int64_t buffers = celer_context_get_memory(a).buffers;
        CHECK(st == CELER_OK && buffers - ma.buffers == grown[k],
              "call %d: buffers grew by %lld bytes, expected %lld (%s backend)", k,
              (long long)(buffers - ma.buffers), (long long)grown[k], own ? "device" : "host");
    }
out:
    free(all);
    celer_context_destroy(a);
}

static void run_all(void) {
    /* cohere2: parallel blocks, global layers without RoPE, a window of 8, logit_scale */
    const char *names[] = {"mistral-bf16", "qwen2-q4g64", "llama3-q8g32", "cohere2-q4g64"};
    for (int f = 0; f < 4; f++) {
        char err[512];
        if (!CHECK(celer_model_open(fixture_path(names[f]), NULL, &model, err, sizeof err) ==
                       CELER_OK,
                   "%s", err))
            continue;
        V = celer_model_n_vocab(model);
        D = celer_model_n_embd(model);
        int32_t ids[32];
        uint64_t rng = 1234 + (uint64_t)f;
        for (int i = 0; i < 32; i++)
            ids[i] = 3 + (int32_t)((rand_uniform(&rng) + 1.0f) * 0.5f * (float)(V - 4));
        printf("  %s (%s)\n", names[f], device);
        check_entry_points(ids, 1);
        check_entry_points(ids, 7);
        check_entry_points(ids, 13);
        check_cache(ids, 12);
        check_truncate(ids, 7, 24);
        check_two_sequences(ids, 13);
        check_decode_ids(ids, 13);
        check_memory();
        celer_model_close(model);
    }
    char *vlms[64];
    const int nv = vlm_fixture_names(vlms, 64);
    CHECK(nv >= 1, "at least one vision-language fixture (found %d)", nv);
    for (int i = 0; i < nv; i++) {
        check_vlm(vlms[i]);
        free(vlms[i]);
    }
}

/* A backend without an op the model calls is refused before a step, in one line naming
 * the op; so is a model whose layers soft-cap attention on a backend that cannot. */
static void test_backend_check(void) {
    celer_model *m;
    celer_error e = {{0}};
    if (!CHECK(model_open(fixture_path("cohere2-bf16"), sizeof *m, &m, &e) == CELER_OK, "%s",
               e.msg))
        return;
    backend *be = backend_ref_create(1, 256, 64, false);
    CHECK(model_check_backend(m, be, &e) == CELER_OK, "the reference backend runs cohere2: %s",
          e.msg);
    const backend_ops *full = be->ops;
    backend_ops ops = *full;
    ops.layernorm = NULL;
    be->ops = &ops;
    CHECK(model_check_backend(m, be, &e) == CELER_STATUS_UNSUPPORTED &&
              strstr(e.msg, "no layernorm op") && !strchr(e.msg, '\n'),
          "a backend without layernorm is refused for cohere2: \"%s\"", e.msg);
    ops = *full;
    ops.attention_softcap = false;
    m->attn_softcap = true;
    CHECK(model_check_backend(m, be, &e) == CELER_STATUS_UNSUPPORTED && strstr(e.msg, "soft-cap"),
          "soft-capped attention on a backend without it is refused: \"%s\"", e.msg);
    m->attn_softcap = false;
    CHECK(model_check_backend(m, be, &e) == CELER_OK, "and accepted without soft-capping: %s",
          e.msg);
    be->ops = full;
    backend_destroy(be);
    model_close(m);
}

int main(void) {
    test_backend_check();
    run_all();
    if ((device = harness_device())) {
        same = 1e-5;
        run_all();
    }
    return harness_done("test_contract");
}

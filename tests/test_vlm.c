/*
 * test_vlm.c - vision-language fixtures (LLaVA-NeXT and Gemma 3, every checkpoint layout)
 * against transformers' goldens (tools/make_llava_fixtures.py, tools/make_gemma3_fixtures.py):
 * for every image case and kernel set, the images' prompt rows, their encoded rows (tower,
 * projector, LLaVA-NeXT's anyres layout) and the logits of every prompt row within 1e-4 x
 * max|golden| (reference kernels, fp32 KV cache) or 2e-3 (fast kernels, fp16 and fp32 KV),
 * and the 16-token greedy continuation through the engine with the images in the request.
 * Gemma 3's cases hold pan-and-scan crops (an image of several blocks), two images in one
 * prompt, and sliding windows shorter than the prompt (and than an image block); there the
 * greedy continuation is also run in prefill steps of 6 rows (the engine keeps each image
 * block whole), and the case's chat text, rewritten by celer_model_image_text and tokenized,
 * must give Gemma3Processor's ids.
 */
#include "harness.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *kernels = "ref", *kv_type = "f32", *device = "cpu";
static double tol = 1e-4;

typedef struct gen_state {
    int32_t ids[64];
    int n;
} gen_state;

/* What the output lines call the set under test. */
static const char *label(void) {
    return strcmp(device, "cpu") ? device : kernels;
}

static void on_event(void *user, const celer_event *ev) {
    gen_state *g = user;
    if (ev->token >= 0 && g->n < 64) g->ids[g->n++] = ev->token;
}

static int32_t *ids_of(const json_t *arr, int64_t *n) {
    *n = (int64_t)json_array_size(arr);
    int32_t *ids = malloc(sizeof *ids * (size_t)(*n ? *n : 1));
    for (int64_t i = 0; i < *n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
    return ids;
}

/* The greedy continuation of text_ids with imgs[n_img] through the engine, in steps of
 * batch rows. */
static void engine_greedy(celer_model *m, const int32_t *text, int64_t n, celer_image **imgs,
                          int n_img, int64_t batch, gen_state *g) {
    char err[512];
    celer_engine_params ep = celer_engine_default_params();
    ep.n_seq_max = 1;
    ep.n_ctx = 256;
    ep.n_threads = 2;
    ep.kernels = kernels;
    ep.kv_type = kv_type;
    ep.device = device;
    ep.batch_tokens = batch;
    celer_engine *eng;
    if (!CHECK(celer_engine_create(m, NULL, &ep, &eng, err, sizeof err) == CELER_OK, "%s", err))
        return;
    celer_request_params rp = celer_request_default_params();
    rp.prompt = text, rp.n_prompt = n, rp.max_tokens = 16, rp.ignore_eos = true;
    rp.sampling.temp = 0;
    rp.images = imgs, rp.n_images = n_img;
    uint64_t id;
    if (CHECK(celer_engine_submit(eng, &rp, &id, err, sizeof err) == CELER_OK, "submit: %s", err))
        for (int i = 0; i < 1000 && celer_engine_pending(eng); i++)
            if (!CHECK(celer_engine_step(eng, on_event, g) == CELER_OK, "step: %s",
                       celer_engine_last_error(eng)))
                break;
    celer_engine_destroy(eng);
}

#define MAX_IMAGES 4

/* The case's rendered text, its markers rewritten as the processor does, tokenizes to its
 * text_ids (fixtures with a tokenizer and a "text"). */
static void check_text(const char *name, const char *dir, celer_model *m, const json_t *c,
                       celer_image **imgs, int n_img, const int32_t *text_ids, int64_t n_text) {
    const char *text = json_string_value(json_object_get(c, "text"));
    if (!text) return;
    char err[512], *full = NULL;
    size_t len;
    int32_t *ids = NULL;
    int64_t n = 0;
    celer_tokenizer *tok;
    if (!CHECK(celer_tokenizer_open(dir, &tok, err, sizeof err) == CELER_OK, "%s: %s", name, err))
        return;
    if (CHECK(celer_model_image_text(m, tok, text, strlen(text), imgs, n_img, &full, &len, err,
                                     sizeof err) == CELER_OK,
              "%s: image text: %s", name, err) &&
        CHECK(celer_tokenize(tok, full, len, false, &ids, &n, err, sizeof err) == CELER_OK,
              "%s: %s", name, err))
        CHECK(n == n_text && !memcmp(ids, text_ids, sizeof *ids * (size_t)n),
              "%s: the processor's expansion of the text tokenizes to other ids than "
              "Gemma3Processor's",
              name);
    /* one image short: a clear error */
    if (n_img > 0) {
        char *none = NULL;
        CHECK(celer_model_image_text(m, tok, text, strlen(text), imgs, n_img - 1, &none, &len, err,
                                     sizeof err) == CELER_STATUS_INVALID_ARGUMENT &&
                  strstr(err, "markers"),
              "%s: more image markers than images: %s", name, err);
        free(none);
    }
    free(full), free(ids);
    celer_tokenizer_close(tok);
}

static void check_case(const char *name, const char *dir, celer_model *m, const json_t *c) {
    char err[512], path[4400];
    const char *cname = json_string_value(json_object_get(c, "name"));
    /* "image" (one) or "images", with "image_rows" an integer or a list */
    const json_t *files = json_object_get(c, "images"), *grows = json_object_get(c, "image_rows");
    celer_image *imgs[MAX_IMAGES] = {0};
    const int n_img = files ? (int)json_array_size(files) : 1;
    int64_t rows = 0, golden_rows = 0, n_text, n_input, n_greedy, fr, fc, lr, lc;
    if (!CHECK(n_img >= 1 && n_img <= MAX_IMAGES, "%s/%s: 1 to %d images", name, cname, MAX_IMAGES))
        return;
    for (int k = 0; k < n_img; k++) {
        const char *f = json_string_value(files ? json_array_get(files, (size_t)k)
                                                : json_object_get(c, "image"));
        snprintf(path, sizeof path, "%s/%s", dir, f);
        if (!CHECK(celer_image_load(path, &imgs[k], err, sizeof err) == CELER_OK, "%s", err))
            goto out_images;
        int64_t r = 0;
        CHECK(celer_model_image_positions(m, imgs[k], &r, err, sizeof err) == CELER_OK, "%s", err);
        const int64_t want =
            json_integer_value(json_is_array(grows) ? json_array_get(grows, (size_t)k) : grows);
        CHECK(r == want, "%s/%s: image %d: %lld rows, golden %lld", name, cname, k, (long long)r,
              (long long)want);
        rows += r, golden_rows += want;
    }
    const int64_t d = celer_model_n_embd(m), v = celer_model_n_vocab(m);
    int32_t *text = ids_of(json_object_get(c, "text_ids"), &n_text);
    int32_t *input = ids_of(json_object_get(c, "input_ids"), &n_input);
    int32_t *greedy = ids_of(json_object_get(c, "greedy"), &n_greedy);
    snprintf(path, sizeof path, "%s/golden_features_%s.npy", dir, cname);
    float *gf = npy_read_f32(path, &fr, &fc);
    snprintf(path, sizeof path, "%s/golden_logits_%s.npy", dir, cname);
    float *gl = npy_read_f32(path, &lr, &lc);
    if (!CHECK(gf && gl && fr == rows && fc == d && lr == n_input && lc == v,
               "%s/%s: golden shapes", name, cname))
        goto out;
    if (!strcmp(kernels, "ref") && !strcmp(device, "cpu"))
        check_text(name, dir, m, c, imgs, n_img, text, n_text);

    celer_context_params cp = celer_context_default_params();
    cp.n_ctx = n_input + 1;
    cp.n_threads = 2;
    cp.kernels = kernels;
    cp.kv_type = kv_type;
    cp.device = device;
    celer_context *ctx;
    if (!CHECK(celer_context_create(m, &cp, &ctx, err, sizeof err) == CELER_OK, "%s", err))
        goto out;
    /* the batch: text ids, and the images' rows at their tokens, in order */
    const int32_t image_tok = celer_model_image_token(m);
    int32_t *tok = malloc(sizeof *tok * (size_t)n_input);
    float *feats = calloc((size_t)(rows * d), sizeof *feats),
          *embd = calloc((size_t)(n_input * d), sizeof *embd);
    float *logits = malloc(sizeof(float) * (size_t)(n_input * v));
    for (int k = 0, at = 0; k < n_img; k++) {
        int64_t r = 0;
        celer_model_image_positions(m, imgs[k], &r, err, sizeof err);
        CHECK(celer_image_encode(ctx, imgs[k], feats + at * d) == CELER_OK, "encode: %s",
              celer_context_last_error(ctx));
        at += (int)r;
    }
    int64_t used = 0;
    for (int64_t i = 0; i < n_input; i++) {
        tok[i] = input[i] == image_tok ? -1 : input[i];
        if (tok[i] < 0 && used < rows)
            memcpy(embd + i * d, feats + used++ * d, sizeof(float) * (size_t)d);
    }
    CHECK(used == rows, "%s/%s: %lld image tokens in input_ids for %lld rows", name, cname,
          (long long)used, (long long)rows);
    const double df = max_abs_diff(feats, gf, rows * d) / max_abs(gf, rows * d);
    const celer_batch b = {.n = n_input, .token = tok, .embd = embd};
    CHECK(celer_forward(ctx, &b, logits) == CELER_OK, "forward: %s", celer_context_last_error(ctx));
    const double dl = max_abs_diff(logits, gl, n_input * v) / max_abs(gl, n_input * v);
    const double da = max_abs_diff(logits, gl, n_input * v);
    CHECK(df <= tol,
          "%s/%s %s: image rows differ from transformers by %.3g relative (tolerance %g)", name,
          cname, label(), df, tol);
    CHECK(dl <= tol, "%s/%s %s: logits differ from transformers by %.3g relative (tolerance %g)",
          name, cname, label(), dl, tol);
    gen_state g = {0};
    engine_greedy(m, text, n_text, imgs, n_img, 512, &g);
    CHECK(g.n == n_greedy && !memcmp(g.ids, greedy, sizeof *greedy * (size_t)n_greedy),
          "%s/%s %s: greedy continuation through the engine differs from transformers", name, cname,
          label());
    if (celer_model_image_blocks_whole(m)) { /* prefill in steps of 6 rows, cut at image blocks */
        gen_state g6 = {0};
        engine_greedy(m, text, n_text, imgs, n_img, 6, &g6);
        CHECK(g6.n == n_greedy && !memcmp(g6.ids, greedy, sizeof *greedy * (size_t)n_greedy),
              "%s/%s %s: greedy continuation in steps of 6 rows differs from transformers", name,
              cname, label());
    }
    printf("  %-22s %-6s %-4s %-3s KV  %3lld image rows  rows rel %.2e  logits rel %.2e (abs %.2e) "
           " greedy %s\n",
           name, cname, label(), kv_type, (long long)rows, df, dl, da,
           g.n == n_greedy ? "same" : "DIFFERENT");
    free(tok), free(feats), free(embd), free(logits);
    celer_context_destroy(ctx);
out:
    free(text), free(input), free(greedy), free(gf), free(gl);
out_images:
    for (int k = 0; k < n_img; k++) celer_image_free(imgs[k]);
}

int main(void) {
    char *names[64];
    const int n = vlm_fixture_names(names, 64);
    CHECK(n >= 4, "at least 4 vision-language fixtures (found %d)", n);
    /* the CPU's kernel sets, then those of the device under test (CELER_TEST_DEVICE) */
    const char *sets[][3] = {{"ref", "f32", "cpu"},
                             {"auto", "f16", "cpu"},
                             {"auto", "f32", "cpu"},
                             {"auto", "f16", harness_device()},
                             {"auto", "f32", harness_device()}};
    for (int i = 0; i < n; i++) {
        char err[512], path[4400];
        const char *dir = fixture_path(names[i]);
        snprintf(path, sizeof path, "%s/golden.json", dir);
        json_t *gold = json_load_file(path, 0, NULL);
        celer_model *m = NULL;
        if (CHECK(gold != NULL, "%s: golden.json", names[i]) &&
            CHECK(celer_model_open(dir, NULL, &m, err, sizeof err) == CELER_OK, "%s", err)) {
            const json_t *cases = json_object_get(gold, "cases");
            CHECK(json_array_size(cases) >= 2, "%s: at least 2 image cases", names[i]);
            for (int s = 0; s < 5 && sets[s][2]; s++) {
                kernels = sets[s][0], kv_type = sets[s][1], device = sets[s][2],
                tol = s == 0 ? 1e-4 : 2e-3;
                for (size_t k = 0; k < json_array_size(cases); k++)
                    check_case(names[i], dir, m, json_array_get(cases, k));
            }
        }
        celer_model_close(m);
        json_decref(gold);
        free(names[i]);
    }
    return harness_done("test_vlm");
}

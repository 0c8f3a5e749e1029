/*
 * test_vlm.c - vision-language fixtures (LLaVA-NeXT, every checkpoint layout) against
 * transformers' goldens (tools/make_llava_fixtures.py): for every image case and kernel
 * set, the image's prompt rows, its encoded rows (tower, projector, anyres layout) and the
 * logits of every prompt row within 1e-4 x max|golden| (reference kernels, fp32 KV cache)
 * or 2e-3 (fast kernels, fp16 and fp32 KV), and the 16-token greedy continuation through
 * the engine with the image in the request.
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
static const char *label(void) { return strcmp(device, "cpu") ? device : kernels; }

static void on_event(void *user, const celer_event *ev) {
    gen_state *g = user;
    if (ev->token >= 0 && g->n < 64) g->ids[g->n++] = ev->token;
}

static int32_t *ids_of(const json_t *arr, int64_t *n) {
    *n = (int64_t)json_array_size(arr);
    int32_t *ids = malloc(sizeof *ids * (size_t)(*n ? *n : 1));
    for (int64_t i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
    return ids;
}

/* The greedy continuation of text_ids with img through the engine. */
static void engine_greedy(celer_model *m, const int32_t *text, int64_t n, celer_image *img, gen_state *g) {
    char err[512];
    celer_engine_params ep = celer_engine_default_params();
    ep.n_seq_max = 1;
    ep.n_ctx = 256;
    ep.n_threads = 2;
    ep.kernels = kernels;
    ep.kv_type = kv_type;
    ep.device = device;
    celer_engine *eng;
    if (!CHECK(celer_engine_create(m, NULL, &ep, &eng, err, sizeof err) == CELER_OK, "%s", err)) return;
    celer_request_params rp = celer_request_default_params();
    rp.prompt = text, rp.n_prompt = n, rp.max_tokens = 16, rp.ignore_eos = true;
    rp.sampling.temp = 0;
    rp.images = &img, rp.n_images = 1;
    uint64_t id;
    if (CHECK(celer_engine_submit(eng, &rp, &id, err, sizeof err) == CELER_OK, "submit: %s", err))
        for (int i = 0; i < 1000 && celer_engine_pending(eng); i++)
            if (!CHECK(celer_engine_step(eng, on_event, g) == CELER_OK, "step: %s", celer_engine_last_error(eng))) break;
    celer_engine_destroy(eng);
}

static void check_case(const char *name, const char *dir, celer_model *m, const json_t *c) {
    char err[512], path[4400];
    const char *cname = json_string_value(json_object_get(c, "name"));
    snprintf(path, sizeof path, "%s/%s", dir, json_string_value(json_object_get(c, "image")));
    celer_image *img;
    if (!CHECK(celer_image_load(path, &img, err, sizeof err) == CELER_OK, "%s", err)) return;
    const int64_t d = celer_model_n_embd(m), v = celer_model_n_vocab(m);
    int64_t rows = 0, n_text, n_input, n_greedy, fr, fc, lr, lc;
    CHECK(celer_model_image_positions(m, img, &rows, err, sizeof err) == CELER_OK, "%s", err);
    CHECK(rows == json_integer_value(json_object_get(c, "image_rows")), "%s/%s: %lld image rows, golden %lld", name,
          cname, (long long)rows, (long long)json_integer_value(json_object_get(c, "image_rows")));
    int32_t *text = ids_of(json_object_get(c, "text_ids"), &n_text);
    int32_t *input = ids_of(json_object_get(c, "input_ids"), &n_input);
    int32_t *greedy = ids_of(json_object_get(c, "greedy"), &n_greedy);
    snprintf(path, sizeof path, "%s/golden_features_%s.npy", dir, cname);
    float *gf = npy_read_f32(path, &fr, &fc);
    snprintf(path, sizeof path, "%s/golden_logits_%s.npy", dir, cname);
    float *gl = npy_read_f32(path, &lr, &lc);
    if (!CHECK(gf && gl && fr == rows && fc == d && lr == n_input && lc == v, "%s/%s: golden shapes", name, cname))
        goto out;

    celer_context_params cp = celer_context_default_params();
    cp.n_ctx = n_input + 1;
    cp.n_threads = 2;
    cp.kernels = kernels;
    cp.kv_type = kv_type;
    cp.device = device;
    celer_context *ctx;
    if (!CHECK(celer_context_create(m, &cp, &ctx, err, sizeof err) == CELER_OK, "%s", err)) goto out;
    /* the batch: text ids, and the image's rows where its tokens are */
    const int32_t image_tok = celer_model_image_token(m);
    int32_t *tok = malloc(sizeof *tok * (size_t)n_input);
    float *embd = calloc((size_t)(n_input * d), sizeof *embd), *logits = malloc(sizeof(float) * (size_t)(n_input * v));
    int64_t at = 0;
    for (int64_t i = 0; i < n_input; i++) tok[i] = input[i] == image_tok ? -1 : input[i];
    while (at < n_input && input[at] != image_tok) at++;
    CHECK(celer_image_encode(ctx, img, embd + at * d) == CELER_OK, "encode: %s", celer_context_last_error(ctx));
    const double df = max_abs_diff(embd + at * d, gf, rows * d) / max_abs(gf, rows * d);
    const celer_batch b = {.n = n_input, .token = tok, .embd = embd};
    CHECK(celer_forward(ctx, &b, logits) == CELER_OK, "forward: %s", celer_context_last_error(ctx));
    const double dl = max_abs_diff(logits, gl, n_input * v) / max_abs(gl, n_input * v);
    CHECK(df <= tol, "%s/%s %s: image rows differ from transformers by %.3g relative (tolerance %g)", name, cname,
          label(), df, tol);
    CHECK(dl <= tol, "%s/%s %s: logits differ from transformers by %.3g relative (tolerance %g)", name, cname, label(),
          dl, tol);
    gen_state g = {0};
    engine_greedy(m, text, n_text, img, &g);
    CHECK(g.n == n_greedy && !memcmp(g.ids, greedy, sizeof *greedy * (size_t)n_greedy),
          "%s/%s %s: greedy continuation through the engine differs from transformers", name, cname, label());
    printf("  %-22s %-6s %-4s %-3s KV  %3lld image rows  rows rel %.2e  logits rel %.2e  greedy %s\n", name, cname,
           label(), kv_type, (long long)rows, df, dl, g.n == n_greedy ? "same" : "DIFFERENT");
    free(tok), free(embd), free(logits);
    celer_context_destroy(ctx);
out:
    free(text), free(input), free(greedy), free(gf), free(gl);
    celer_image_free(img);
}

int main(void) {
    char *names[64];
    const int n = vlm_fixture_names(names, 64);
    CHECK(n >= 4, "at least 4 vision-language fixtures (found %d)", n);
    /* the CPU's kernel sets, then those of the device under test (CELER_TEST_DEVICE) */
    const char *sets[][3] = {{"ref", "f32", "cpu"}, {"auto", "f16", "cpu"}, {"auto", "f32", "cpu"},
                             {"auto", "f16", harness_device()}, {"auto", "f32", harness_device()}};
    for (int i = 0; i < n; i++) {
        char err[512], path[4400];
        const char *dir = fixture_path(names[i]);
        snprintf(path, sizeof path, "%s/golden.json", dir);
        json_t *gold = json_load_file(path, 0, NULL);
        celer_model *m = NULL;
        if (CHECK(gold != NULL, "%s: golden.json", names[i]) &&
            CHECK(celer_model_open(dir, NULL, &m, err, sizeof err) == CELER_OK, "%s", err)) {
            const json_t *cases = json_object_get(gold, "cases");
            CHECK(json_array_size(cases) >= 3, "%s: at least 3 image cases", names[i]);
            for (int s = 0; s < 5 && sets[s][2]; s++) {
                kernels = sets[s][0], kv_type = sets[s][1], device = sets[s][2], tol = s == 0 ? 1e-4 : 2e-3;
                for (size_t k = 0; k < json_array_size(cases); k++) check_case(names[i], dir, m, json_array_get(cases, k));
            }
        }
        celer_model_close(m);
        json_decref(gold);
        free(names[i]);
    }
    return harness_done("test_vlm");
}

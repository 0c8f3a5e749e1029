/*
 * test_parity.c - every fixture in tests/fixtures against its golden outputs from
 * Hugging Face transformers (fp32 on the dequantized weights), with the reference
 * kernels and with the fast kernels the CPU picks (then on CELER_TEST_DEVICE, make test-cuda): forward logits of all rows within
 * 1e-4 x max|golden| (reference) or 2e-3 x max|golden| (fast: int8 value + residual
 * activations, fp16 KV cache; fp32 cache 2e-3 too), and the identical 16-token greedy
 * continuation. The reference runs with an fp32 KV cache, as transformers does. Each fast
 * set also runs a 200-token prompt on five quantized fixtures against the reference
 * kernels (the goldens' prompts are too short for a device's prefill products), within
 * its path's stated bound (check_long_prompt) and with the same last argmax. Also runs
 * one fixture in
 * chunks of 5 rows and with 1 and 3 threads, which must give the same logits, as must each
 * 200-token prompt in chunks of 40 rows on the CPU (docs/architecture.md, Numerics). A fixture
 * directory without golden.json or golden_logits.npy is a failure, never a quiet pass.
 */
#define _DEFAULT_SOURCE
#include "harness.h"

#include "sampling/sampling.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *kernels = "ref"; /* the kernel set under test */
static const char *kv_type = "f32";  /* and its KV cache type */
static const char *device = "cpu";   /* and where it runs */

/* What the output lines call the set under test. */
static const char *label(void) { return strcmp(device, "cpu") ? device : kernels; }

static celer_context *open_ctx(celer_model *m, int64_t n_ctx, int64_t n_batch, int threads) {
    celer_context_params cp = celer_context_default_params();
    cp.kernels = kernels;
    cp.kv_type = kv_type;
    cp.device = device;
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;
    cp.n_threads = threads;
    celer_context *ctx = NULL;
    char err[512];
    if (celer_context_create(m, &cp, &ctx, err, sizeof err) != CELER_OK) CHECK(false, "context: %s", err);
    return ctx;
}

/* Returns the forward logits [n, v] (malloc'd) or NULL. */
static float *forward_all(celer_model *m, const int32_t *ids, int64_t n, int64_t n_batch, int threads) {
    celer_context *ctx = open_ctx(m, n, n_batch, threads);
    if (!ctx) return NULL;
    float *logits = malloc(sizeof(float) * (size_t)(n * celer_model_n_vocab(m)));
    celer_batch b = celer_batch_tokens(ids, n);
    celer_status s = celer_forward(ctx, &b, logits);
    CHECK(s == CELER_OK, "forward: %s", celer_context_last_error(ctx));
    celer_context_destroy(ctx);
    return logits;
}

/* Both golden files of a fixture are there (a failed check for each one missing). */
static bool goldens_present(const char *name) {
    static const char *const files[] = {"golden.json", "golden_logits.npy"};
    bool ok = true;
    for (int i = 0; i < 2; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", fixture_path(name), files[i]);
        FILE *f = fopen(path, "rb");
        ok &= CHECK(f != NULL, "%s: golden file %s is missing (make fixtures)", name, path);
        if (f) fclose(f);
    }
    return ok;
}

/* The Phi-3 fixtures' original_max_position_embeddings (tests/fixtures/README.md). Past it
 * transformers drops the cache and recomputes the whole sequence with longrope's long
 * factors; celer keeps the keys it cached with the short ones (as vLLM does), so a short
 * prompt's greedy continuation is compared while the sequence fits the original context. */
#define PHI_ORIGINAL_CTX 16

/* The goldens of one prompt: <golden>.json and <golden>_logits.npy; the first n_same
 * greedy tokens must match (all where n_same < 0). */
/* Whether fast kernels' greedy continuation out leaves the golden one only at a tie: at the
 * first step where they differ, the golden token's logit is within twice the logit bound
 * (tol: each of the two logits may be off by it) of the best one, computed on the golden
 * prefix. The steps after a tie are not compared: each continues its own text. */
static bool greedy_tie(celer_model *m, const char *name, const int32_t *ids, int64_t n, const int32_t *golden,
                       const int32_t *out, int64_t n_greedy, double tol) {
    int64_t i = 0;
    while (i < n_greedy && out[i] == golden[i]) i++;
    int32_t *prefix = malloc(sizeof *prefix * (size_t)(n + i));
    memcpy(prefix, ids, sizeof *prefix * (size_t)n);
    memcpy(prefix + n, golden, sizeof *prefix * (size_t)i);
    float *logits = forward_all(m, prefix, n + i, 512, 2);
    bool tie = false;
    if (logits) {
        const int64_t v = celer_model_n_vocab(m);
        const float *row = logits + (n + i - 1) * v;
        const double gap = (double)row[out[i]] - row[golden[i]];
        tie = gap <= 2 * tol;
        printf("    %s: greedy leaves the golden text at step %lld of %lld, by a gap of %.3g (%s 2 x %.3g)\n", name,
               (long long)i, (long long)n_greedy, gap, tie ? "a tie within" : "more than", tol);
    }
    free(logits), free(prefix);
    return tie;
}

static void check_golden(const char *name, const char *golden_name, int64_t n_same) {
    char dir[4096], path[4200], err[512];
    snprintf(dir, sizeof dir, "%s", fixture_path(name));
    int32_t *ids, *greedy;
    int64_t n, n_greedy, rows, cols;
    if (!CHECK(golden_read_named(dir, golden_name, &ids, &n, &greedy, &n_greedy) == 0, "%s: %s.json unreadable", name,
               golden_name))
        return;
    if (n_same >= 0 && n_same < n_greedy) n_greedy = n_same;
    snprintf(path, sizeof path, "%s/%s_logits.npy", dir, golden_name);
    float *golden = npy_read_f32(path, &rows, &cols);
    celer_model *m = NULL;
    celer_status s = CELER_OK;
    if (CHECK(golden, "%s: %s unreadable", name, path) &&
        CHECK((s = celer_model_open(fixture_model_path(dir), NULL, &m, err, sizeof err)) == CELER_OK, "%s: open: %s",
              name, err) &&
        CHECK(rows == n && cols == celer_model_n_vocab(m), "%s: golden shape", name)) {
        float *logits = forward_all(m, ids, n, 512, 2);
        double diff = logits ? max_abs_diff(logits, golden, n * cols) : 1e30, mx = max_abs(golden, n * cols);
        const double tol = strcmp(kernels, "ref") ? 2e-3 : 1e-4;
        printf("  %-22s %-5s %s KV %s max |logit diff| %.3g  (max |golden| %.3g, rel %.2g), %lld greedy\n", name,
               label(), kv_type, golden_name, diff, mx, diff / mx, (long long)n_greedy);
        CHECK(diff <= tol * mx, "%s: %s logits (%s KV) differ by %g (> %g x %g)", name, label(), kv_type, diff, tol, mx);
        free(logits);

        celer_context *ctx = open_ctx(m, n + n_greedy, 512, 2);
        int32_t *out = calloc((size_t)n_greedy, sizeof *out);
        int64_t n_out = 0;
        celer_generate_params gp = {.seq_id = 0, .n_predict = n_greedy, .stop_at_eos = 0};
        s = celer_generate_greedy(ctx, ids, n, &gp, out, &n_out);
        bool same = s == CELER_OK && n_out == n_greedy && memcmp(out, greedy, sizeof *out * (size_t)n_greedy) == 0;
        if (!same && s == CELER_OK && n_out == n_greedy && strcmp(kernels, "ref") != 0)
            same = greedy_tie(m, name, ids, n, greedy, out, n_greedy, tol * mx);
        CHECK(same, "%s: %s greedy continuation (%s KV) differs from golden", name, label(), kv_type);
        if (!same) {
            printf("    got:   ");
            for (int64_t i = 0; i < n_out; i++) printf(" %d", out[i]);
            printf("\n    golden:");
            for (int64_t i = 0; i < n_greedy; i++) printf(" %d", greedy[i]);
            printf("\n");
        }
        free(out);
        celer_context_destroy(ctx);
    }
    celer_model_close(m);
    free(golden), free(ids), free(greedy);
}

static void check_fixture(const char *name) {
    check_golden(name, "golden", -1);
    /* a second prompt where the fixture has one (Phi-3: within the original context) */
    char path[4200];
    snprintf(path, sizeof path, "%s/golden_short.json", fixture_path(name));
    if (access(path, R_OK) == 0) {
        int32_t *ids, *greedy;
        int64_t n, n_greedy;
        if (!CHECK(golden_read_named(fixture_path(name), "golden_short", &ids, &n, &greedy, &n_greedy) == 0,
                   "%s: golden_short.json unreadable", name))
            return;
        free(ids), free(greedy);
        check_golden(name, "golden_short", PHI_ORIGINAL_CTX - n + 1);
    }
}

static void check_chunks_and_threads(const char *name) {
    char dir[4096], err[512];
    snprintf(dir, sizeof dir, "%s", fixture_path(name));
    int32_t *ids, *greedy;
    int64_t n, n_greedy;
    celer_model *m = NULL;
    if (golden_read(dir, &ids, &n, &greedy, &n_greedy) != 0 || celer_model_open(dir, NULL, &m, err, sizeof err) != CELER_OK) {
        CHECK(false, "%s: cannot open", name);
        return;
    }
    const int64_t v = celer_model_n_vocab(m);
    float *a = forward_all(m, ids, n, 512, 1), *b = forward_all(m, ids, n, 5, 3);
    double diff = a && b ? max_abs_diff(a, b, n * v) : 1e30;
    printf("  %-22s %-5s 1 thread/one step vs 3 threads/chunks of 5: %.3g\n", name, label(), diff);
    /* The CPU sums in the same order whatever the chunks; a GPU's matrix library picks its
     * kernels by shape, and in an fp16 cache such a last-bit difference can round a stored
     * value the other way. */
    const double tol = !strcmp(device, "cpu") ? 1e-6 : !strcmp(kv_type, "f16") ? 1e-4 : 1e-5;
    CHECK(diff <= tol * max_abs(a, n * v), "%s: %s chunked/threaded forward differs by %g", name, label(), diff);
    free(a), free(b), free(ids), free(greedy);
    celer_model_close(m);
}

/* A prompt long enough for a device's prefill products (LONG_N rows: the CUDA device
 * multiplies 128 rows and more in fp16, its fast path) against the reference kernels on
 * the CPU over the same ids: every row's logits within the path's bound and the last
 * row's argmax equal (DESIGN.md: a fast path keeps the greedy token and states its
 * error). The bounds, of the largest reference logit: the CPU's int8 activations 2e-3
 * (measured at most 1.4e-3 with an fp16 cache); the CUDA fp16 products (W and x rounded
 * to fp16 once, cuBLAS's tensor-core sums) 4e-3 (measured 1.2e-3 .. 2.5e-3 over these
 * fixtures; SmolLM2's mean KL against the CPU reference is 6e-6, test_real_kl). The
 * fixtures' goldens are prompts of a few tokens, which run the exact products. */
#define LONG_N 200

static void check_long_prompt(const char *name) {
    char dir[4096], err[512];
    snprintf(dir, sizeof dir, "%s", fixture_path(name));
    celer_model *m = NULL;
    if (!CHECK(celer_model_open(fixture_model_path(dir), NULL, &m, err, sizeof err) == CELER_OK, "%s: open: %s", name,
               err))
        return;
    const int64_t v = celer_model_n_vocab(m);
    int32_t ids[LONG_N];
    for (int64_t i = 0; i < LONG_N; i++) ids[i] = (int32_t)((i * 7919 + 13) % v);
    float *got = forward_all(m, ids, LONG_N, 512, 2);
    const char *k0 = kernels, *kv0 = kv_type, *d0 = device;
    kernels = "ref", kv_type = "f32", device = "cpu";
    float *want = forward_all(m, ids, LONG_N, 512, 2);
    kernels = k0, kv_type = kv0, device = d0;
    if (got && want) {
        const double diff = max_abs_diff(got, want, LONG_N * v), mx = max_abs(want, LONG_N * v);
        const float *gl = got + (LONG_N - 1) * v, *wl = want + (LONG_N - 1) * v;
        printf("  %-22s %-5s %s KV  %d-token prompt against ref: max |logit diff| %.3g (rel %.2g)\n", name, label(),
               kv_type, LONG_N, diff, diff / mx);
        const double bound = !strcmp(device, "cpu") ? 2e-3 : 4e-3;
        CHECK(diff <= bound * mx, "%s: %s %d-token logits (%s KV) differ from ref by %g (> %g x %g)", name, label(),
              LONG_N, kv_type, diff, bound, mx);
        CHECK(sampling_argmax(gl, v) == sampling_argmax(wl, v), "%s: %s %d-token last-row argmax differs from ref",
              name, label(), LONG_N);
    }
    /* On the CPU, in chunks of 40 rows on 3 threads: each chunk is long enough for the same
     * products as the single step (the bf16 tiles start at 32 rows), so the same sums. (A
     * device's prefill products change at FAST_FROM_ROWS, by design.) */
    float *chunked = !strcmp(device, "cpu") ? forward_all(m, ids, LONG_N, 40, 3) : NULL;
    if (got && chunked) {
        const double diff = max_abs_diff(got, chunked, LONG_N * v), tol = 1e-6;
        printf("  %-22s %-5s %s KV  %d-token prompt, one step vs chunks of 40: %.3g\n", name, label(), kv_type,
               LONG_N, diff);
        CHECK(diff <= tol * max_abs(got, LONG_N * v), "%s: %s %d-token prompt in chunks of 40 differs by %g", name,
              label(), LONG_N, diff);
    }
    free(chunked);
    free(got), free(want);
    celer_model_close(m);
}

/* A GGUF written from the same values as another fixture (a safetensors one, or the same file
 * before llama.cpp's gguf-split) gives the same logits. */
static void check_same_weights(const char *gguf_name, const char *st_name) {
    char a[4200], b[4200], err[512];
    snprintf(a, sizeof a, "%s", fixture_model_path(fixture_path(gguf_name)));
    snprintf(b, sizeof b, "%s", fixture_model_path(fixture_path(st_name)));
    celer_model *mg = NULL, *ms = NULL;
    int32_t *ids, *greedy;
    int64_t n, ng;
    if (!CHECK(golden_read(fixture_path(st_name), &ids, &n, &greedy, &ng) == 0, "%s: golden.json", st_name)) return;
    if (CHECK(celer_model_open(a, NULL, &mg, err, sizeof err) == CELER_OK, "%s", err) &&
        CHECK(celer_model_open(b, NULL, &ms, err, sizeof err) == CELER_OK, "%s", err)) {
        const int64_t v = celer_model_n_vocab(ms);
        float *x = forward_all(mg, ids, n, 512, 2), *y = forward_all(ms, ids, n, 512, 2);
        double diff = x && y ? max_abs_diff(x, y, n * v) : 1e30;
        printf("  %-22s vs %s: %.3g\n", gguf_name, st_name, diff);
        CHECK(diff <= 1e-6 * max_abs(y, n * v), "%s and %s differ by %g", gguf_name, st_name, diff);
        free(x), free(y);
    }
    celer_model_close(mg);
    celer_model_close(ms);
    free(ids), free(greedy);
}

int main(void) {
    char *names[256];
    int n_all = fixture_names(names, 256), k = 0;
    for (int i = 0; i < n_all; i++) { /* a fixture without goldens fails here and is left out */
        if (goldens_present(names[i])) names[k++] = names[i];
        else free(names[i]);
    }
    CHECK(k >= 12, "at least 12 fixtures with goldens (found %d)", k);
    /* the CPU's kernel sets, then those of the device under test (CELER_TEST_DEVICE) */
    static const char *const long_fixtures[] = {"llama3-q4g64", "mistral-q8g32", "qwen2-gguf-q4_1", "llama-mixed",
                                                "cohere2-q4g64"};
    const char *sets[][3] = {{"ref", "f32", "cpu"}, {"auto", "f16", "cpu"}, {"auto", "f32", "cpu"},
                             {"auto", "f16", harness_device()}, {"auto", "f32", harness_device()}};
    for (int j = 0; j < 5 && sets[j][2]; j++) {
        kernels = sets[j][0];
        kv_type = sets[j][1];
        device = sets[j][2];
        for (int i = 0; i < k; i++) check_fixture(names[i]);
        check_chunks_and_threads("mistral-q4g64");
        if (j > 0)
            for (int i = 0; i < (int)(sizeof long_fixtures / sizeof *long_fixtures); i++)
                check_long_prompt(long_fixtures[i]);
    }
    kernels = "ref";
    device = "cpu";
    kv_type = "f32";
    check_same_weights("llama-tied-gguf-f32", "llama-tied-bf16");
    check_same_weights("llama-tied-gguf-q4_1-split", "llama-tied-gguf-q4_1");
    check_same_weights("qwen2-gguf-f32", "qwen2-bf16");
    check_same_weights("cohere2-gguf-f32", "cohere2-bf16");
    for (int i = 0; i < k; i++) free(names[i]);
    return harness_done("test_parity");
}

/*
 * test_fastpath.c - the fast CPU kernel sets against the scalar reference kernels on
 * every fixture in tests/fixtures (checkpoint directories and *-gguf-* ones).
 *
 * For each fixture and each fast set this CPU supports ("generic", "avx2", "avx512",
 * "amx", and "auto"), with 2 threads:
 * - celer_forward logits of every row of the golden prompt against a "ref" context's:
 *   max |diff| <= 2e-2 x max |ref logit|. The fast path quantizes activations to int8 per
 *   block of 32, so it is not bit-exact; the tolerance bounds that rounding;
 * - the 16-token greedy continuation (stop_at_eos off) identical to the ref context's;
 * - a negative control: the same logits comparison against the ref logits of the prompt
 *   rotated by one token must fail, so a comparison that passes everything is caught.
 * The reference context keeps an fp32 KV cache (the fast sets fp16): a fixture's
 * smallest greedy margin (0.003 of logits near 10) is within fp16 rounding of the cache.
 * Sets the CPU lacks are skipped with a note. The goldens from transformers are
 * test_parity's business; here ref is the oracle.
 */
#define _DEFAULT_SOURCE
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL_REL   2e-2 /* max |fast - ref| <= TOL_REL x max |ref| */
#define N_GREEDY  16
#define N_THREADS 2

static const char *const fast_sets[] = {"generic", "avx2", "avx512", "amx", "auto"};
enum { N_SETS = sizeof fast_sets / sizeof *fast_sets };

static celer_context *open_ctx(celer_model *m, int64_t n_ctx, const char *kernels) {
    celer_context_params cp = celer_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = N_THREADS;
    cp.kernels = kernels;
    /* the oracle keeps its KV cache in fp32, as transformers does; the fast sets run the
     * default fp16 cache */
    if (!strcmp(kernels, "ref")) cp.kv_type = "f32";
    celer_context *ctx = NULL;
    char err[512];
    if (!CHECK(celer_context_create(m, &cp, &ctx, err, sizeof err) == CELER_OK, "context %s: %s",
               kernels, err))
        return NULL;
    return ctx;
}

/* The results of one kernel set on one prompt: logits [n, v] and the greedy ids. */
typedef struct run {
    float *logits;
    int32_t greedy[N_GREEDY];
    int64_t n_greedy;
    char kernels[16]; /* what the context reports it runs */
} run;

/* Runs ids[n] through a fresh context of the named set; false (and a failed check) when
 * something could not run. Greedy is skipped when want_greedy is false. */
static bool run_set(celer_model *m, const char *kernels, const int32_t *ids, int64_t n,
                    bool want_greedy, run *r) {
    memset(r, 0, sizeof *r);
    celer_context *ctx = open_ctx(m, n + N_GREEDY, kernels);
    if (!ctx) return false;
    snprintf(r->kernels, sizeof r->kernels, "%s", celer_context_kernels(ctx));
    r->logits = malloc(sizeof(float) * (size_t)(n * celer_model_n_vocab(m)));
    celer_batch b = celer_batch_tokens(ids, n);
    bool ok = CHECK(r->logits && celer_forward(ctx, &b, r->logits) == CELER_OK, "%s forward: %s",
                    kernels, celer_context_last_error(ctx));
    if (ok && want_greedy) {
        celer_seq_reset(ctx, 0);
        celer_generate_params gp = {.seq_id = 0, .n_predict = N_GREEDY, .stop_at_eos = 0};
        ok = CHECK(celer_generate_greedy(ctx, ids, n, &gp, r->greedy, &r->n_greedy) == CELER_OK,
                   "%s generate: %s", kernels, celer_context_last_error(ctx));
    }
    celer_context_destroy(ctx);
    return ok;
}

/* The one logits comparison of this test: within TOL_REL of max |ref|. */
static bool logits_close(const float *got, const float *ref, int64_t count, double *diff,
                         double *mx) {
    *diff = max_abs_diff(got, ref, count);
    *mx = max_abs(ref, count);
    return *diff <= TOL_REL * *mx;
}

static void print_ids(const char *label, const int32_t *ids, int64_t n) {
    printf("    %-6s", label);
    for (int64_t i = 0; i < n; i++) printf(" %d", ids[i]);
    printf("\n");
}

static void check_fixture(const char *name, const bool *supported) {
    char dir[4096], err[512];
    snprintf(dir, sizeof dir, "%s", fixture_path(name));
    int32_t *ids = NULL, *golden_greedy = NULL;
    int64_t n, n_golden;
    celer_model *m = NULL;
    if (!CHECK(golden_read(dir, &ids, &n, &golden_greedy, &n_golden) == 0 && n >= 2,
               "%s: golden.json", name) ||
        !CHECK(celer_model_open(fixture_model_path(dir), NULL, &m, err, sizeof err) == CELER_OK,
               "%s: open: %s", name, err)) {
        free(ids), free(golden_greedy);
        return;
    }
    const int64_t v = celer_model_n_vocab(m), count = n * v;
    /* The rotated prompt of the negative control: every row sees other tokens. */
    int32_t *rotated = malloc(sizeof *rotated * (size_t)n);
    for (int64_t i = 0; i < n; i++) rotated[i] = ids[(i + 1) % n];
    run ref = {0}, ref_rot = {0};
    bool ok =
        run_set(m, "ref", ids, n, true, &ref) && run_set(m, "ref", rotated, n, false, &ref_rot);
    CHECK(!ok || !strcmp(ref.kernels, "ref"), "%s: the ref context runs %s", name, ref.kernels);
    for (int k = 0; ok && k < N_SETS; k++) {
        run fast;
        if (!supported[k]) continue;
        if (!run_set(m, fast_sets[k], ids, n, true, &fast)) {
            free(fast.logits);
            continue;
        }
        char label[40];
        snprintf(label, sizeof label, strcmp(fast_sets[k], fast.kernels) ? "%s=%s" : "%s",
                 fast_sets[k], fast.kernels);
        CHECK(!strcmp(fast_sets[k], "auto") || !strcmp(fast_sets[k], fast.kernels),
              "%s: context for %s runs %s", name, fast_sets[k], fast.kernels);
        double diff, mx, diff_rot, mx_rot;
        const bool close = logits_close(fast.logits, ref.logits, count, &diff, &mx);
        const bool control_fails =
            !logits_close(fast.logits, ref_rot.logits, count, &diff_rot, &mx_rot);
        int64_t same = 0;
        while (same < fast.n_greedy && same < ref.n_greedy && fast.greedy[same] == ref.greedy[same])
            same++;
        const bool greedy_ok =
            fast.n_greedy == N_GREEDY && ref.n_greedy == N_GREEDY && same == N_GREEDY;
        printf("  %-22s %-11s max |diff| %.3g  max |ref| %.3g  rel %.2g  greedy %lld/%d  control "
               "rel %.2g\n",
               name, label, diff, mx, diff / mx, (long long)same, N_GREEDY, diff_rot / mx_rot);
        CHECK(close, "%s %s: logits differ from ref by %g (> %g x %g)", name, label, diff, TOL_REL,
              mx);
        CHECK(greedy_ok, "%s %s: greedy continuation differs from ref at token %lld", name, label,
              (long long)same);
        if (!greedy_ok) {
            print_ids(label, fast.greedy, fast.n_greedy);
            print_ids("ref", ref.greedy, ref.n_greedy);
        }
        CHECK(control_fails,
              "%s %s: negative control: logits of the rotated prompt pass (%g <= %g x %g)", name,
              label, diff_rot, TOL_REL, mx_rot);
        free(fast.logits);
    }
    free(ref.logits), free(ref_rot.logits), free(rotated);
    celer_model_close(m);
    free(ids), free(golden_greedy);
}

int main(void) {
    bool supported[N_SETS];
    int n_supported = 0;
    for (int k = 0; k < N_SETS; k++) {
        supported[k] = celer_kernels_supported(fast_sets[k]);
        n_supported += supported[k];
        if (!supported[k])
            SKIP("kernel set %s: this CPU lacks the instructions", fast_sets[k]);
    }
    CHECK(supported[0] && supported[N_SETS - 1], "generic and auto are supported everywhere");
    char *names[256];
    const int k = fixture_names(names, 256);
    CHECK(k >= 12, "at least 12 fixtures with goldens (found %d)", k);
    printf(
        "  %d fixtures x %d kernel sets, tolerance %g x max |ref|, %d greedy tokens, %d threads\n",
        k, n_supported, TOL_REL, N_GREEDY, N_THREADS);
    for (int i = 0; i < k; i++) check_fixture(names[i], supported);
    for (int i = 0; i < k; i++) free(names[i]);
    return harness_done("test_fastpath");
}

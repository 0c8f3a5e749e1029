/*
 * test_faults.c - a step that fails on the device becomes a status, never an abort
 * (backend.h "Failures"; celer.h: a failed call changes no sequence).
 *
 * CELER_FAULT_STEP=N[:oom|:sticky] makes the N-th step of each backend created while it is
 * set fail: on the CPU the step is only marked failed; on a GPU (CELER_TEST_DEVICE, make
 * test-cuda) a real CUDA error of that kind happens (a refused launch, an allocation the
 * device cannot give, a store to address 0). Checked, against contexts without a fault:
 * the failed call returns the status with a message and commits no position; after a
 * recoverable failure the same call succeeds and gives the reference logits; a prompt
 * that fails in its second chunk gives its blocks back (a pool of one block takes the
 * retry); after a sticky failure every later call fails with the same message. The
 * engine: a failed step ends every choice of the requests in it with CELER_FINISH_ERROR
 * and the reason, holds no block afterwards, and the next request gives its solo tokens;
 * after a sticky failure later requests fail in turn and the engine drains.
 *
 * On a GPU the sticky case runs last: it leaves the device unusable for this process.
 */
#define _POSIX_C_SOURCE 200809L
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static celer_model *model;
static int64_t V;
static const char *device = "cpu";
static double same = 1e-6; /* relative difference that counts as equal */

static const int32_t prompt[10] = {1, 15, 27, 3, 44, 9, 61, 22, 5, 38};

/* A context made while CELER_FAULT_STEP is fault (NULL: none). */
static celer_context *ctx_new(const char *fault, int64_t n_batch, int64_t kv_positions) {
    if (fault) setenv("CELER_FAULT_STEP", fault, 1);
    celer_context_params cp = harness_context_params(64, 1, device);
    cp.n_batch = n_batch;
    cp.kv_positions = kv_positions;
    celer_context *ctx = NULL;
    char err[512];
    const celer_status s = celer_context_create(model, &cp, &ctx, err, sizeof err);
    unsetenv("CELER_FAULT_STEP");
    CHECK(s == CELER_OK, "%s: context: %s", device, err);
    return s == CELER_OK ? ctx : NULL;
}

static bool close_to(const float *got, const float *want) {
    return max_abs_diff(got, want, V) <= same * max_abs(want, V);
}

static int32_t argmax(const float *l) {
    int32_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (l[i] > l[best]) best = (int32_t)i;
    return best;
}

/* The reference: the last logits of the 7-token prompt (ref[0]), then of each of two
 * greedy decode steps (ref[1], ref[2]), and of the 10-token prompt (ref[3]); tok[0..1]
 * the tokens decoded. */
static float *ref[4];
static int32_t tok[2];

static bool make_reference(void) {
    celer_context *ctx = ctx_new(NULL, 0, 0);
    if (!ctx) return false;
    for (int i = 0; i < 4; i++) ref[i] = malloc(sizeof(float) * (size_t)V);
    celer_batch b = celer_batch_tokens(prompt, 7);
    bool ok = celer_forward_last_logits(ctx, &b, 6, ref[0]) == CELER_OK;
    for (int i = 0; ok && i < 2; i++) {
        tok[i] = argmax(ref[i]);
        b = celer_batch_tokens(&tok[i], 1);
        ok = celer_forward_last_logits(ctx, &b, 0, ref[i + 1]) == CELER_OK;
    }
    celer_seq_reset(ctx, 0);
    b = celer_batch_tokens(prompt, 10);
    ok = ok && celer_forward_last_logits(ctx, &b, 9, ref[3]) == CELER_OK;
    CHECK(ok, "%s: reference: %s", device, celer_context_last_error(ctx));
    celer_context_destroy(ctx);
    return ok;
}

/* The message names the failure: the knob on the CPU, CUDA on a GPU. */
static bool names_failure(const char *msg) {
    return strstr(msg, strcmp(device, "cpu") ? "cuda" : "CELER_FAULT_STEP") != NULL;
}

/* ==== The context API ==== */

/* A device error at the decode step: the call fails and commits nothing; the same call
 * again succeeds with the reference logits, and the one after it too. */
static void test_recoverable(void) {
    celer_context *ctx = ctx_new("2", 0, 0);
    if (!ctx) return;
    float *l = malloc(sizeof(float) * (size_t)V);
    celer_batch b = celer_batch_tokens(prompt, 7);
    CHECK(celer_forward_last_logits(ctx, &b, 6, l) == CELER_OK && close_to(l, ref[0]), "%s: step 1 (prefill)",
          device);
    b = celer_batch_tokens(&tok[0], 1);
    const celer_status s = celer_forward_last_logits(ctx, &b, 0, l);
    const char *msg = celer_context_last_error(ctx);
    CHECK(s == CELER_STATUS_DEVICE && names_failure(msg), "%s: step 2: status %s (%s), expected device error",
          device, celer_status_str(s), msg);
    printf("%s: the failed step said: %s\n", device, msg);
    CHECK(celer_seq_length(ctx, 0) == 7, "%s: a failed step committed positions: length %lld", device,
          (long long)celer_seq_length(ctx, 0));
    CHECK(celer_forward_last_logits(ctx, &b, 0, l) == CELER_OK && close_to(l, ref[1]) &&
              celer_seq_length(ctx, 0) == 8,
          "%s: the step again after a recoverable failure: %s", device, celer_context_last_error(ctx));
    b = celer_batch_tokens(&tok[1], 1);
    CHECK(celer_forward_last_logits(ctx, &b, 0, l) == CELER_OK && close_to(l, ref[2]), "%s: the step after: %s",
          device, celer_context_last_error(ctx));
    free(l);
    celer_context_destroy(ctx);
}

/* A prompt of n tokens (its reference last logits want) in a context made with fault,
 * n_batch and kv_positions: the first call fails with status and commits nothing; the
 * same call again gives want. */
static void fail_then_retry(const char *what, const char *fault, int64_t n_batch, int64_t kv_positions, int64_t n,
                            const float *want, celer_status status) {
    celer_context *ctx = ctx_new(fault, n_batch, kv_positions);
    if (!ctx) return;
    float *l = malloc(sizeof(float) * (size_t)V);
    const celer_batch b = celer_batch_tokens(prompt, n);
    const celer_status s = celer_forward_last_logits(ctx, &b, n - 1, l);
    CHECK(s == status && celer_seq_length(ctx, 0) == 0, "%s: %s: status %s (%s), expected %s; length %lld", device,
          what, celer_status_str(s), celer_context_last_error(ctx), celer_status_str(status),
          (long long)celer_seq_length(ctx, 0));
    CHECK(celer_forward_last_logits(ctx, &b, n - 1, l) == CELER_OK && close_to(l, want) &&
              celer_seq_length(ctx, 0) == n,
          "%s: %s, the call again: %s", device, what, celer_context_last_error(ctx));
    free(l);
    celer_context_destroy(ctx);
}

/* Out of device memory at the first step; then a 10-token prompt in steps of 4 rows that
 * fails in its second step: its first step wrote the cache, but nothing is committed and
 * the pool's one block comes back, so the prompt runs again in the same pool. */
static void test_oom_and_chunks(void) {
    fail_then_retry("out of memory", "1:oom", 0, 0, 7, ref[0], CELER_STATUS_OUT_OF_MEMORY);
    fail_then_retry("second chunk, pool of one block", "2", 4, 16, 10, ref[3], CELER_STATUS_DEVICE);
}

/* A lost device at the decode step: that call and every later one fail with the same
 * message, none commits anything; resetting a sequence (no device work) still works. */
static void test_sticky(void) {
    celer_context *ctx = ctx_new("2:sticky", 0, 0);
    if (!ctx) return;
    float *l = malloc(sizeof(float) * (size_t)V * 2);
    celer_batch b = celer_batch_tokens(prompt, 7);
    CHECK(celer_forward_last_logits(ctx, &b, 6, l) == CELER_OK, "%s: step 1 before the sticky fault", device);
    b = celer_batch_tokens(&tok[0], 1);
    celer_status s = celer_forward_last_logits(ctx, &b, 0, l);
    char first[512];
    snprintf(first, sizeof first, "%s", celer_context_last_error(ctx));
    CHECK(s == CELER_STATUS_DEVICE_LOST && first[0], "%s: sticky step: status %s (%s)", device, celer_status_str(s),
          first);
    printf("%s: the lost device said: %s\n", device, first);
    s = celer_forward_last_logits(ctx, &b, 0, l);
    CHECK(s == CELER_STATUS_DEVICE_LOST && !strcmp(celer_context_last_error(ctx), first),
          "%s: the call after a lost device: status %s (%s)", device, celer_status_str(s),
          celer_context_last_error(ctx));
    s = celer_forward(ctx, &b, l);
    CHECK(s == CELER_STATUS_DEVICE_LOST, "%s: celer_forward after a lost device: %s", device, celer_status_str(s));
    s = celer_embed_tokens(ctx, tok, 2, l);
    CHECK(s == CELER_STATUS_DEVICE_LOST, "%s: celer_embed_tokens after a lost device: %s", device,
          celer_status_str(s));
    CHECK(celer_seq_length(ctx, 0) == 7, "%s: length %lld after failed calls", device,
          (long long)celer_seq_length(ctx, 0));
    CHECK(celer_seq_reset(ctx, 0) == CELER_OK, "%s: seq_reset after a lost device", device);
    b = celer_batch_tokens(prompt, 7);
    CHECK(celer_forward_last_logits(ctx, &b, 6, l) == CELER_STATUS_DEVICE_LOST,
          "%s: a new prompt after a lost device", device);
    free(l);
    celer_context_destroy(ctx);
}

/* ==== The engine ==== */

typedef struct seen {
    uint64_t id[3];
    int32_t ids[3][2][8];
    int n[3][2], ended[3];
    celer_finish_reason finish[3][2];
    char error[3][512];
} seen;

static void on_event(void *user, const celer_event *ev) {
    seen *w = user;
    for (int r = 0; r < 3; r++) {
        if (w->id[r] != ev->request) continue;
        if (ev->token >= 0 && w->n[r][ev->index] < 8) w->ids[r][ev->index][w->n[r][ev->index]++] = ev->token;
        if (ev->finish == CELER_FINISH_NONE) continue;
        w->finish[r][ev->index] = ev->finish;
        w->ended[r]++;
        if (ev->error) snprintf(w->error[r], sizeof w->error[r], "%s", ev->error);
    }
}

static celer_engine *engine_new(const char *fault) {
    if (fault) setenv("CELER_FAULT_STEP", fault, 1);
    celer_engine_params p = celer_engine_default_params();
    p.n_seq_max = 3;
    p.n_ctx = 64;
    p.batch_tokens = 32;
    p.n_threads = 2;
    p.device = device;
    celer_engine *eng = NULL;
    char err[512];
    const celer_status s = celer_engine_create(model, NULL, &p, &eng, err, sizeof err);
    unsetenv("CELER_FAULT_STEP");
    CHECK(s == CELER_OK, "%s: engine: %s", device, err);
    return s == CELER_OK ? eng : NULL;
}

static void submit(celer_engine *eng, seen *w, int r, int64_t n_prompt, int32_t n) {
    celer_request_params rp = celer_request_default_params();
    rp.prompt = prompt;
    rp.n_prompt = n_prompt;
    rp.max_tokens = 4;
    rp.n = n;
    rp.sampling.temp = 0;
    rp.ignore_eos = true;
    char err[512];
    CHECK(celer_engine_submit(eng, &rp, &w->id[r], err, sizeof err) == CELER_OK, "%s: submit: %s", device, err);
}

/* Steps until nothing is pending; the statuses of the failed steps in failed[]. */
static int drain(celer_engine *eng, seen *w, celer_status *failed, int cap) {
    int n = 0;
    for (int i = 0; i < 100 && celer_engine_pending(eng); i++) {
        const celer_status s = celer_engine_step(eng, on_event, w);
        if (s != CELER_OK && n < cap) failed[n++] = s;
    }
    CHECK(!celer_engine_pending(eng), "%s: the engine still has requests after 100 steps", device);
    return n;
}

static void check_no_blocks(celer_engine *eng, const char *what) {
    const celer_engine_stats st = celer_engine_get_stats(eng);
    CHECK(st.running == 0 && st.waiting == 0 && st.kv_blocks_used == 0, "%s: %s: %d running, %lld blocks held",
          device, what, st.running, (long long)st.kv_blocks_used);
}

/* Two choices of request 0 and one of request 1 are in step 2, which fails: every choice
 * ends with ERROR and the reason, nothing is held; request 2 then gives its solo tokens. */
static void test_engine_recoverable(void) {
    seen solo = {0}, w = {0};
    celer_status failed[8];
    celer_engine *eng = engine_new(NULL);
    if (!eng) return;
    submit(eng, &solo, 2, 9, 1);
    drain(eng, &solo, failed, 8);
    celer_engine_destroy(eng);

    if (!(eng = engine_new("2"))) return;
    submit(eng, &w, 0, 5, 2);
    submit(eng, &w, 1, 6, 1);
    CHECK(celer_engine_step(eng, on_event, &w) == CELER_OK, "%s: engine step 1", device);
    const celer_status s = celer_engine_step(eng, on_event, &w);
    CHECK(s == CELER_STATUS_DEVICE && names_failure(celer_engine_last_error(eng)), "%s: engine step 2: %s (%s)",
          device, celer_status_str(s), celer_engine_last_error(eng));
    CHECK(w.ended[0] == 2 && w.finish[0][0] == CELER_FINISH_ERROR && w.finish[0][1] == CELER_FINISH_ERROR &&
              w.ended[1] == 1 && w.finish[1][0] == CELER_FINISH_ERROR,
          "%s: the failed step's requests: %d and %d choices ended (finish %d %d %d)", device, w.ended[0], w.ended[1],
          w.finish[0][0], w.finish[0][1], w.finish[1][0]);
    CHECK(names_failure(w.error[0]) && names_failure(w.error[1]), "%s: the ERROR events' reasons: \"%s\", \"%s\"",
          device, w.error[0], w.error[1]);
    CHECK(!celer_engine_pending(eng), "%s: requests still pending after a failed step", device);
    check_no_blocks(eng, "after a failed step");
    submit(eng, &w, 2, 9, 1);
    CHECK(drain(eng, &w, failed, 8) == 0, "%s: a step after the failure failed: %s", device,
          celer_engine_last_error(eng));
    CHECK(w.ended[2] == 1 && w.finish[2][0] == CELER_FINISH_LENGTH && w.n[2][0] == 4 &&
              !memcmp(w.ids[2][0], solo.ids[2][0], sizeof(int32_t) * 4),
          "%s: the request after the failure differs from its solo run", device);
    check_no_blocks(eng, "drained");
    celer_engine_destroy(eng);
}

/* A lost device at step 2: its request fails; a later request fails at its first step;
 * every step reports DEVICE_LOST and the engine drains. */
static void test_engine_sticky(void) {
    seen w = {0};
    celer_status failed[8];
    celer_engine *eng = engine_new("2:sticky");
    if (!eng) return;
    submit(eng, &w, 0, 5, 1);
    CHECK(celer_engine_step(eng, on_event, &w) == CELER_OK, "%s: sticky engine step 1", device);
    CHECK(celer_engine_step(eng, on_event, &w) == CELER_STATUS_DEVICE_LOST && w.finish[0][0] == CELER_FINISH_ERROR,
          "%s: sticky engine step 2: %s", device, celer_engine_last_error(eng));
    submit(eng, &w, 1, 6, 1);
    const int n = drain(eng, &w, failed, 8);
    CHECK(n == 1 && failed[0] == CELER_STATUS_DEVICE_LOST && w.finish[1][0] == CELER_FINISH_ERROR && w.n[1][0] == 0,
          "%s: a request after a lost device: %d failed steps, finish %d", device, n, w.finish[1][0]);
    check_no_blocks(eng, "after a lost device");
    celer_engine_destroy(eng);
}

/* After a GPU was lost: a new context fails cleanly, at its creation or its first call. */
static void test_new_context_on_lost_device(void) {
    celer_context_params cp = celer_context_default_params();
    cp.n_ctx = 64;
    cp.device = device;
    celer_context *ctx = NULL;
    char err[512] = "";
    if (celer_context_create(model, &cp, &ctx, err, sizeof err) != CELER_OK) {
        CHECK(err[0] != '\0', "%s: a context on the lost device failed without a message", device);
        printf("%s: a new context on the lost device: %s\n", device, err);
        return;
    }
    float *l = malloc(sizeof(float) * (size_t)V);
    const celer_batch b = celer_batch_tokens(prompt, 7);
    const celer_status s = celer_forward_last_logits(ctx, &b, 6, l);
    CHECK(s == CELER_STATUS_DEVICE_LOST, "%s: a new context's first call on the lost device: %s (%s)", device,
          celer_status_str(s), celer_context_last_error(ctx));
    free(l);
    celer_context_destroy(ctx);
}

static void run_all(bool gpu) {
    if (!make_reference()) return;
    test_recoverable();
    test_oom_and_chunks();
    test_engine_recoverable();
    /* a lost GPU stays lost for this process: one sticky test, last (the server suite
     * loses the device in processes of its own) */
    if (!gpu) test_engine_sticky();
    test_sticky();
    if (gpu) test_new_context_on_lost_device();
    for (int i = 0; i < 4; i++) free(ref[i]);
}

int main(void) {
    char err[512];
    const char *path = fixture_model_path(fixture_path("llama3-q4g64"));
    if (!CHECK(celer_model_open(path, NULL, &model, err, sizeof err) == CELER_OK, "%s", err))
        return harness_done("test_faults");
    V = celer_model_n_vocab(model);
    run_all(false);
    if ((device = harness_device())) {
        same = 1e-5;
        run_all(true);
    }
    celer_model_close(model);
    return harness_done("test_faults");
}

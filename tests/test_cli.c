/*
 * test_cli.c - the command line as scripts use it: `celer logits` writes .npy files
 * that match the goldens ([n, vocab] with --all, [1, vocab] of the last row without),
 * `celer generate --print-ids` prints the golden greedy continuation, and bad flags fail
 * with one line.
 */
#define _DEFAULT_SOURCE
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *bin(void) { return getenv("CELER_BIN") ? getenv("CELER_BIN") : "build/celer"; }

static char *ids_str(const int32_t *ids, int64_t n) {
    char *s = malloc((size_t)n * 12 + 1);
    size_t k = 0;
    for (int64_t i = 0; i < n; i++) k += (size_t)sprintf(s + k, i ? ",%d" : "%d", ids[i]);
    s[k] = 0;
    return s;
}

static int run(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int rc = pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static void check_fixture(const char *name) {
    const char *dir = fixture_path(name);
    char d[4096], cmd[8192], out[4096], npy[128], path[4200];
    snprintf(d, sizeof d, "%s", dir);
    int32_t *ids, *greedy;
    int64_t n, ng, rows, cols, r2, c2;
    if (!CHECK(golden_read(d, &ids, &n, &greedy, &ng) == 0, "%s golden", name)) return;
    snprintf(path, sizeof path, "%s/golden_logits.npy", d);
    float *golden = npy_read_f32(path, &rows, &cols);
    char *ids_s = ids_str(ids, n);
    snprintf(npy, sizeof npy, "/tmp/celer-cli-%d.npy", (int)getpid());

    snprintf(cmd, sizeof cmd, "'%s' logits -m '%s' --ids %s --all -o %s -t 2", bin(), d, ids_s, npy);
    CHECK(run(cmd, out, sizeof out) == 0, "%s: logits --all exits 0", name);
    float *all = npy_read_f32(npy, &r2, &c2);
    CHECK(all && r2 == n && c2 == cols, "%s: --all writes [%lld, %lld]", name, (long long)n, (long long)cols);
    if (all && golden && r2 == rows && c2 == cols) {
        double diff = max_abs_diff(all, golden, n * cols);
        CHECK(diff <= 1e-4 * max_abs(golden, n * cols), "%s: --all logits differ by %g", name, diff);
    }
    snprintf(cmd, sizeof cmd, "'%s' logits -m '%s' --ids %s -o %s", bin(), d, ids_s, npy);
    CHECK(run(cmd, out, sizeof out) == 0, "%s: logits exits 0", name);
    float *last = npy_read_f32(npy, &r2, &c2);
    CHECK(last && r2 == 1 && c2 == cols, "%s: last-row logits are [1, vocab]", name);
    if (last && all) {
        double diff = max_abs_diff(last, all + (n - 1) * cols, cols);
        CHECK(diff <= 1e-6 * max_abs(last, cols), "%s: last row equals --all row n-1 (%g)", name, diff);
    }
    unlink(npy);

    snprintf(cmd, sizeof cmd, "'%s' generate -m '%s' --ids %s -n %lld --temp 0 --print-ids --ignore-eos", bin(), d,
             ids_s, (long long)ng);
    CHECK(run(cmd, out, sizeof out) == 0, "%s: generate exits 0", name);
    char want[2048];
    size_t k = 0;
    for (int64_t i = 0; i < ng; i++) k += (size_t)snprintf(want + k, sizeof want - k, i ? " %d" : "%d", greedy[i]);
    snprintf(want + k, sizeof want - k, "\n");
    CHECK(strcmp(out, want) == 0, "%s: generate printed \"%s\", golden \"%s\"", name, out, want);
    free(all), free(last), free(golden), free(ids_s), free(ids), free(greedy);
}

static void check_fails(const char *what, const char *args, const char *needle) {
    char cmd[4096], out[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1 >/dev/null", bin(), args);
    int rc = run(cmd, out, sizeof out);
    int lines = 0;
    for (char *p = out; *p; p++) lines += *p == '\n';
    CHECK(rc == 1 && strstr(out, needle) && lines >= 1, "%s: exit %d, output: %s", what, rc, out);
}

int main(void) {
    check_fixture("llama3-q4g64");
    check_fixture("qwen2-bf16");
    char args[4200];
    snprintf(args, sizeof args, "logits -m '%s' --ids 1,2,x -o /tmp/x.npy", fixture_path("llama3-bf16"));
    check_fails("bad --ids", args, "--ids");
    snprintf(args, sizeof args, "logits -m '%s' --ids 1,99999 -o /tmp/x.npy", fixture_path("llama3-bf16"));
    check_fails("token id past vocab", args, "outside the vocabulary");
    snprintf(args, sizeof args, "generate -m '%s' --ids 1,2 -n 10 -c 4", fixture_path("llama3-bf16"));
    check_fails("context too small", args, "-c 4");
    check_fails("no model", "logits --ids 1 -o /tmp/x.npy", "-m MODEL");
    check_fails("unknown command", "frobnicate", "unknown command");
    return harness_done("test_cli");
}

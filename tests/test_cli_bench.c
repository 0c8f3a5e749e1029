/*
 * test_cli_bench.c - `celer bench` as scripts drive it: the JSON array has one object
 * per test with llama-bench's field names and values that agree with each other (the
 * averages are the means of the samples, tokens per second is tokens over seconds), -d
 * runs every test once per depth with the prefix counted in n_ctx, the markdown table has
 * its header and rows, --memory adds a positive bandwidth, and every bad flag fails with
 * exactly one line. Speeds are never compared: only their presence,
 * sign and arithmetic.
 */
#define _DEFAULT_SOURCE
#include "harness.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *bin(void) {
    return getenv("CELER_BIN") ? getenv("CELER_BIN") : "build/celer";
}

static char out[1 << 17];

/* Runs `celer bench -m FIXTURE ARGS`, stdout into out; returns the exit status. */
static int bench(const char *fixture, const char *args) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' bench -m '%s' %s", bin(), fixture_path(fixture), args);
    return run_capture(cmd, out, sizeof out);
}

static json_t *bench_json(const char *fixture, const char *args, size_t want) {
    int rc = bench(fixture, args);
    json_error_t e;
    json_t *a = json_loads(out, 0, &e);
    if (!CHECK(rc == 0 && json_is_array(a) && json_array_size(a) == want,
               "bench %s: exit %d, %zu objects (want %zu), json error \"%s\"", args, rc,
               json_is_array(a) ? json_array_size(a) : 0, want, a ? "" : e.text)) {
        json_decref(a);
        return NULL;
    }
    return a;
}

static double num(const json_t *o, const char *k) {
    return json_number_value(json_object_get(o, k));
}

/* One test's object at depth n_depth with n_seq sequences: every field present and
 * consistent with the others. */
static void check_result_seq(const json_t *o, int64_t n_prompt, int64_t n_gen, int64_t n_depth, int64_t n_seq,
                             int64_t threads, int64_t reps, bool full_logits) {
    char name[64];
    int len = snprintf(name, sizeof name, n_prompt ? "pp%lld" : "tg%lld",
                       (long long)(n_prompt ? n_prompt : n_gen));
    if (n_seq > 1) len += snprintf(name + len, sizeof name - (size_t)len, " np%lld", (long long)n_seq);
    if (n_depth) snprintf(name + len, sizeof name - (size_t)len, " @ d%lld", (long long)n_depth);
    static const char *const strings[] = {"test", "model_filename", "model_type", "test_time",
                                          "kernels"};
    for (int i = 0; i < 5; i++)
        CHECK(json_string_length(json_object_get(o, strings[i])) > 0,
              "%s: %s is a non-empty string", name, strings[i]);
    CHECK(!strcmp(json_string_value(json_object_get(o, "test")), name), "%s: test names it", name);
    const char *tt = json_string_value(json_object_get(o, "test_time"));
    CHECK(tt && strlen(tt) == 20 && tt[4] == '-' && tt[10] == 'T' && tt[19] == 'Z',
          "%s: test_time %s is ISO 8601", name, tt ? tt : "(none)");
    CHECK(json_integer_value(json_object_get(o, "n_prompt")) == n_prompt &&
              json_integer_value(json_object_get(o, "n_gen")) == n_gen,
          "%s: n_prompt %lld, n_gen %lld", name,
          (long long)json_integer_value(json_object_get(o, "n_prompt")),
          (long long)json_integer_value(json_object_get(o, "n_gen")));
    CHECK(json_is_integer(json_object_get(o, "n_depth")) &&
              json_integer_value(json_object_get(o, "n_depth")) == n_depth,
          "%s: n_depth %lld", name, (long long)json_integer_value(json_object_get(o, "n_depth")));
    CHECK(json_integer_value(json_object_get(o, "n_seq")) == n_seq, "%s: n_seq %lld", name,
          (long long)json_integer_value(json_object_get(o, "n_seq")));
    CHECK(json_integer_value(json_object_get(o, "n_threads")) == threads, "%s: n_threads", name);
    CHECK(json_is_boolean(json_object_get(o, "full_logits")) &&
              json_boolean_value(json_object_get(o, "full_logits")) == full_logits,
          "%s: full_logits is %s", name, full_logits ? "true" : "false");
    CHECK(num(o, "model_size") > 0 && num(o, "model_size") == num(o, "weight_bytes"),
          "%s: model_size", name);
    CHECK(num(o, "model_n_params") > 0 && num(o, "load_ms") > 0 && num(o, "peak_rss_bytes") > 0,
          "%s: params, load_ms, peak_rss_bytes positive", name);
    CHECK(num(o, "n_ctx") >= n_depth + n_prompt + n_gen, "%s: n_ctx %g", name, num(o, "n_ctx"));
    CHECK(json_is_string(json_object_get(o, "device")) && num(o, "device_weight_bytes") > 0 &&
              num(o, "device_kv_bytes") > 0 && num(o, "device_buffer_bytes") > 0,
          "%s: device and its weight, KV and buffer bytes", name);

    const json_t *sns = json_object_get(o, "samples_ns"), *sts = json_object_get(o, "samples_ts");
    if (!CHECK(json_array_size(sns) == (size_t)reps && json_array_size(sts) == (size_t)reps,
               "%s: %lld samples of each", name, (long long)reps))
        return;
    double sum_ns = 0, sum_ts = 0, sq_ts = 0;
    bool consistent = true;
    const double tokens = (double)(n_prompt ? n_prompt : n_gen * n_seq); /* every sequence's tokens */
    for (int64_t k = 0; k < reps; k++) {
        const double ns = json_number_value(json_array_get(sns, (size_t)k));
        const double ts = json_number_value(json_array_get(sts, (size_t)k));
        consistent &= ns > 0 && ts > 0 && fabs(ts - 1e9 * tokens / ns) <= 1e-6 * ts;
        sum_ns += ns, sum_ts += ts;
    }
    CHECK(consistent, "%s: every sample is positive and t/s = tokens / seconds", name);
    const double mean_ts = sum_ts / (double)reps;
    for (int64_t k = 0; k < reps; k++) {
        const double d = json_number_value(json_array_get(sts, (size_t)k)) - mean_ts;
        sq_ts += d * d;
    }
    const double sd_ts = reps > 1 ? sqrt(sq_ts / (double)(reps - 1)) : 0;
    CHECK(num(o, "avg_ts") > 0 && fabs(num(o, "avg_ts") - mean_ts) <= 1e-6 * mean_ts,
          "%s: avg_ts %g is the mean of samples_ts %g", name, num(o, "avg_ts"), mean_ts);
    CHECK(fabs(num(o, "stddev_ts") - sd_ts) <= 1e-6 * mean_ts,
          "%s: stddev_ts %g is their sample stddev %g", name, num(o, "stddev_ts"), sd_ts);
    CHECK(fabs(num(o, "avg_ns") - sum_ns / (double)reps) <= 1,
          "%s: avg_ns is the mean of samples_ns", name);
    CHECK(num(o, "stddev_ns") >= 0, "%s: stddev_ns", name);
}

static void check_result_at(const json_t *o, int64_t n_prompt, int64_t n_gen, int64_t n_depth, int64_t threads,
                            int64_t reps, bool full_logits) {
    check_result_seq(o, n_prompt, n_gen, n_depth, 1, threads, reps, full_logits);
}

static void check_result(const json_t *o, int64_t n_prompt, int64_t n_gen, int64_t threads,
                         int64_t reps, bool full_logits) {
    check_result_at(o, n_prompt, n_gen, 0, threads, reps, full_logits);
}

static void check_json(void) {
    json_t *a = bench_json("llama3-q4g64", "-p 8,16 -n 4 -r 2 -t 1 -o json", 3);
    if (a) {
        check_result(json_array_get(a, 0), 8, 0, 1, 2, false);
        check_result(json_array_get(a, 1), 16, 0, 1, 2, false);
        check_result(json_array_get(a, 2), 0, 4, 1, 2, false);
        CHECK(json_integer_value(json_object_get(json_array_get(a, 0), "n_ctx")) == 20,
              "n_ctx defaults to max(-p) + max(-n)");
        CHECK(!json_object_get(json_array_get(a, 2), "bandwidth_use"),
              "no bandwidth fields without --memory");
    }
    json_decref(a);

    a = bench_json("llama3-q4g64", "-p 8 -n 4 -r 3 -t 1 -o json --full-logits", 2);
    if (a) {
        check_result(json_array_get(a, 0), 8, 0, 1, 3, true);
        check_result(json_array_get(a, 1), 0, 4, 1, 3, false); /* the flag is about prefill */
    }
    json_decref(a);

    /* Depth by depth, ppN then tgN at each; the prefix counts in the default n_ctx. */
    a = bench_json("llama3-q4g64", "-p 8 -n 4 -d 0,6 -r 2 -t 1 -o json", 4);
    if (a) {
        check_result_at(json_array_get(a, 0), 8, 0, 0, 1, 2, false);
        check_result_at(json_array_get(a, 1), 0, 4, 0, 1, 2, false);
        check_result_at(json_array_get(a, 2), 8, 0, 6, 1, 2, false);
        check_result_at(json_array_get(a, 3), 0, 4, 6, 1, 2, false);
        CHECK(json_integer_value(json_object_get(json_array_get(a, 3), "n_ctx")) == 18,
              "n_ctx defaults to max(-d) + max(-p) + max(-n)");
    }
    json_decref(a);
    /* -np: tgN once per count of sequences, each after its own prefix; ppN stays one sequence */
    a = bench_json("llama3-q4g64", "-p 8 -n 4 -np 1,3 -d 0,6 -r 2 -t 1 -o json", 6);
    if (a) {
        check_result_seq(json_array_get(a, 0), 8, 0, 0, 1, 1, 2, false);
        check_result_seq(json_array_get(a, 1), 0, 4, 0, 1, 1, 2, false);
        check_result_seq(json_array_get(a, 2), 0, 4, 0, 3, 1, 2, false);
        check_result_seq(json_array_get(a, 5), 0, 4, 6, 3, 1, 2, false);
    }
    json_decref(a);
    /* -b: the context's rows per step; a prompt longer than that runs in chunks */
    a = bench_json("llama3-q4g64", "-p 8 -n 2 -b 3 -r 1 -t 1 -o json", 2);
    if (a) {
        check_result(json_array_get(a, 0), 8, 0, 1, 1, false);
        check_result(json_array_get(a, 1), 0, 2, 1, 1, false);
        CHECK(json_integer_value(json_object_get(json_array_get(a, 0), "n_batch")) == 3 &&
                  json_integer_value(json_object_get(json_array_get(a, 1), "n_batch")) == 3,
              "-b 3 sets n_batch");
    }
    json_decref(a);
    a = bench_json("llama3-q4g64", "-p 0 -n 2 -r 1 -t 1 -o json", 1);
    if (a)
        CHECK(json_integer_value(json_object_get(json_array_get(a, 0), "n_batch")) == 512, "n_batch defaults to 512");
    json_decref(a);
    /* A cache of exactly depth + the longest test is enough. */
    a = bench_json("llama3-q4g64", "-p 8 -n 0 -d 16 -c 24 -r 1 -t 1 -o json", 1);
    if (a) check_result_at(json_array_get(a, 0), 8, 0, 16, 1, 1, false);
    json_decref(a);

    a = bench_json("qwen2-bf16", "-p 0 -n 3 -r 1 -t 1,2 -c 64 -o json", 2);
    if (a) {
        check_result(json_array_get(a, 0), 0, 3, 1, 1, false);
        check_result(json_array_get(a, 1), 0, 3, 2, 1, false);
        CHECK(json_integer_value(json_object_get(json_array_get(a, 0), "n_ctx")) == 64,
              "-c sets n_ctx");
    }
    json_decref(a);
}

static void check_memory(void) {
    /* Untied head: a decode step reads the weights less (most of) the embedding table. */
    json_t *a = bench_json("llama3-q4g64", "-p 0 -n 4 -r 2 -t 1 -o json --memory", 2);
    if (a) {
        const json_t *tg = json_array_get(a, 0), *mem = json_array_get(a, 1);
        check_result(tg, 0, 4, 1, 2, false);
        CHECK(!strcmp(json_string_value(json_object_get(mem, "test")), "memory") &&
                  json_integer_value(json_object_get(mem, "n_threads")) == 1,
              "the last object is the memory test at 1 thread");
        CHECK(num(mem, "read_bytes_per_s") > 0 && num(mem, "buffer_bytes") > 0,
              "memory bandwidth %g over %g bytes", num(mem, "read_bytes_per_s"),
              num(mem, "buffer_bytes"));
        const double db = num(tg, "decode_bytes_per_token"), wb = num(tg, "weight_bytes");
        CHECK(db > 0 && db < wb, "untied: decode_bytes_per_token %g < weight_bytes %g", db, wb);
        CHECK(fabs(num(tg, "bandwidth_use") -
                   db * num(tg, "avg_ts") / num(mem, "read_bytes_per_s")) <=
                      1e-6 * num(tg, "bandwidth_use") &&
                  num(tg, "bandwidth_use") > 0,
              "bandwidth_use = decode bytes x t/s / read bandwidth");
    }
    json_decref(a);

    /* Tied head: the head reads the whole embedding table, so every weight byte counts. */
    a = bench_json("llama-tied-q4g64", "-p 0 -n 2 -r 1 -t 1 -o json --memory", 2);
    if (a) {
        const json_t *tg = json_array_get(a, 0);
        CHECK(num(tg, "decode_bytes_per_token") == num(tg, "weight_bytes"),
              "tied: decode bytes are all the weights");
    }
    json_decref(a);

    int rc = bench("llama3-q4g64", "-p 4 -n 2 -r 1 -t 1 --memory");
    CHECK(rc == 0 && strstr(out, "memory read bandwidth: ") && strstr(out, "  tg2: "),
          "md --memory prints the bandwidth and a tg line: %s", out);
    const char *bw = strstr(out, "memory read bandwidth: ");
    CHECK(bw && atof(bw + strlen("memory read bandwidth: ")) > 0, "the bandwidth is positive");
}

static void check_md(void) {
    int rc = bench("llama3-q4g64", "-p 8 -n 4 -r 2 -t 1");
    CHECK(rc == 0, "md exits 0");
    CHECK(!strncmp(out, "| model ", 8) && strstr(out, " t/s |") && strstr(out, "| ---"),
          "md header: %s", out);
    int rows = 0;
    for (const char *p = out; (p = strstr(p, "\n| llama")); p++) rows++;
    CHECK(rows == 2, "md has 2 rows, found %d", rows);
    CHECK(strstr(out, " pp8 | ") && strstr(out, " tg4 | "), "md rows pp8 and tg4");
    CHECK(strstr(out, "\nload: ") && strstr(out, "\npeak RSS: ") && strstr(out, "\nmemory on cpu: weights "),
          "md prints load time, the context's memory and peak RSS");
    const char *row = strstr(out, " pp8 | ");
    CHECK(row && strstr(row, " \u00b1 "), "pp8 row has mean \u00b1 stddev");

    rc = bench("llama3-q4g64", "-p 8 -n 0 -r 1 -t 1 --full-logits");
    CHECK(rc == 0 && strstr(out, " pp8 full-logits | ") && !strstr(out, " tg"),
          "md names --full-logits, -n 0 drops tg");

    rc = bench("llama3-q4g64", "-p 0 -n 4 -d 0,6 -r 1 -t 1");
    CHECK(rc == 0 && strstr(out, " tg4 | ") && strstr(out, " tg4 @ d6 | "),
          "md names a depth as llama-bench does: %s", out);

    char cmd[4200];
    snprintf(cmd, sizeof cmd, "'%s' bench --help", bin());
    rc = run_capture(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "-b N") && strstr(out, "512 on the CPU, 2048 on CUDA") && strstr(out, "--full-logits"),
          "--help on stdout, exit 0");
}

/* Exit 1 with exactly one line on stderr, naming needle. */
static void check_fails(const char *what, const char *env, const char *args, const char *needle) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s '%s' bench %s 2>&1 >/dev/null", env, bin(), args);
    int rc = run_capture(cmd, out, sizeof out);
    int lines = 0;
    for (char *p = out; *p; p++) lines += *p == '\n';
    CHECK(rc == 1 && lines == 1 && !strncmp(out, "celer: ", 7) && strstr(out, needle),
          "%s: exit %d, %d lines: %s", what, rc, lines, out);
}

static void check_bad_flags(void) {
    char m[4200], args[4400];
    snprintf(m, sizeof m, "-m '%s'", fixture_path("llama3-q4g64"));
    static const struct {
        const char *what, *args, *needle;
    } bad[] = {
        {"-p abc", "-p abc", "-p"},
        {"-p 8,,16", "-p 8,,16", "-p"},
        {"-n -1", "-n -1", "-n"},
        {"-r 0", "-r 0", "-r"},
        {"-r x", "-r x", "-r"},
        {"-o xml", "-o xml", "-o"},
        {"-t 0", "-t 0", "-t"},
        {"-t missing value", "-t", "-t"},
        {"unknown option", "--frob", "--frob"},
        {"nothing to run", "-p 0 -n 0", "nothing to run"},
        {"-c too small", "-p 8 -n 4 -c 6", "-c 6"},
        {"-c too small for the depth", "-p 8 -n 4 -d 16 -c 20", "-c 20"},
        {"-d -1", "-d -1", "-d"},
        {"-d x", "-d x", "-d"},
        {"-np 0", "-np 0", "-np"},
        {"-np x", "-np x", "-np"},
        {"-b 0", "-b 0", "-b"},
        {"-b x", "-b x", "-b"},
        {"-b too large", "-b 65537", "-b"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "%s %s", m, bad[i].args);
        check_fails(bad[i].what, "", args, bad[i].needle);
    }
    check_fails("no -m", "", "-p 8 -n 4", "-m MODEL");
    check_fails("missing model", "", "-m /nonexistent/model -p 8", "/nonexistent/model");
    snprintf(args, sizeof args, "%s -p 8 -n 0 -r 1 -t 1", m);
    check_fails("unknown CELER_CPU kernel set", "CELER_CPU=nonesuch", args, "nonesuch");
    static const char *const sets[] = {"avx512", "amx"};
    for (int i = 0; i < 2; i++)
        if (!celer_kernels_supported(sets[i])) {
            char env[64];
            snprintf(env, sizeof env, "CELER_CPU=%s", sets[i]);
            check_fails("kernel set this CPU lacks", env, args, sets[i]);
        }
}

int main(void) {
    check_bad_flags();
    check_json();
    check_md();
    check_memory();
    return harness_done("test_cli_bench");
}

/*
 * bench.c - `celer bench`: prompt-processing and generation speed, measured the way
 * llama-bench measures them, so the two tables can be read side by side.
 *
 * ppN: one prefill call over N synthetic token ids from an empty sequence (the LM head
 * runs on the last row only, or on every row with --full-logits). tgN: N decode steps of
 * one token each from an empty cache. With -d D each test starts instead after a D-token
 * prefix is in the cache (prefilled before the clock starts, llama-bench's -d; its
 * table names the test "tg128 @ d2048"). With -np S, tgN runs S sequences side by side
 * (each after its own prefix): every step is one batch of S decode rows, one per sequence,
 * as a server's step over S streams, and t/s counts the tokens of all of them ("tg128
 * np16"). Token ids come from a fixed-seed pseudo-random
 * sequence, so tokenization is never timed and runs are repeatable. Each test has one
 * warm-up run and -r timed runs; everything a run touches is allocated before the clock
 * starts. --memory also measures the machine's memory read bandwidth at the same thread
 * count and how much of it a decode step uses.
 *
 * --image FILE (vision-language models) adds two tests per thread count: the time to
 * encode the image (vision tower, projector, tile layout; celer_image_encode) and ppN+img,
 * a prefill of the image's rows followed by N synthetic ids in one call, counted in rows
 * per second (the image rows are encoded before the clock starts).
 *
 * It does not compare runs, pick winners or check outputs: figures are for side-by-side
 * runs on one machine (docs/benchmarks.md). Only the public API is used.
 */
#define _DEFAULT_SOURCE
#include "cli/cli.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static const char usage_text[] =
    "usage: celer bench -m MODEL [-p 512[,2048..]] [-n 128[,..]] [-np 1[,16..]] [-d 0[,2048..]]\n"
    "                   [-r 5] [-t N[,N..]] [-c CTX] [-b 512] [--full-logits] [-o md|json]\n"
    "                   [--memory] [--image FILE]\n"
    "  -p LIST        prompt lengths: ppN prefills N synthetic ids in one call (default 512)\n"
    "  -n LIST        generation lengths: tgN runs N one-token decode steps (default 128)\n"
    "                 0 turns a kind off (-p 0 -n 128 runs tg128 only)\n"
    "  -np LIST       sequences decoding together in tgN (default 1): each step is one batch\n"
    "                 of a row per sequence; t/s counts every sequence's tokens (\"tg128 np16\")\n"
    "  -d LIST        depths: every test runs once per depth D, after a D-token prefix of\n"
    "                 synthetic ids is in the cache (prefilled untimed, as llama-bench -d;\n"
    "                 default 0, an empty cache)\n"
    "  -r R           timed repetitions per test, after one warm-up run (default 5)\n"
    "  -t LIST        threads (default: the physical cores, %d here)\n"
    "  -c CTX         KV cache positions (default: max(-d) + max(-p) + max(-n))\n"
    "  -b N           rows per step inside the library (the context's n_batch; default the\n"
    "                 device's: 512 on the CPU, 2048 on CUDA): a longer prompt runs in chunks\n"
    "                 of N rows, each through the whole model\n"
    "  --full-logits  prefill computes logits for every prompt row (celer_forward), to A/B\n"
    "                 the last-row LM head\n"
    "  -o md|json     a markdown table (default) or a JSON array with llama-bench's field names\n"
    "  --memory       also measure memory read bandwidth at each thread count, and the share\n"
    "                 of it one decode step's weight reads use\n"
    "  --image FILE   vision-language models: time to encode the image, and ppN+img (the\n"
    "                 image's rows then N ids in one prefill), in rows per second\n"
    "Contexts hold max(-np) sequences and n_batch -b rows. The kernel set\n"
    "comes from CELER_CPU (default auto).\n";

enum {
    BENCH_MAX_BATCH = 65536,
    BENCH_MAX_LEN = 1 << 20,
    BENCH_MAX_REPS = 100000,
    BENCH_MAX_SEQ = 256
};

/* ==== Options ==== */

typedef struct bench_opts {
    cli_model_opts mo;
    int64_t *pp, *tg; /* prompt / generation lengths, zeros dropped */
    int64_t n_pp, n_tg;
    int64_t *depth; /* prefix lengths, zeros kept: d0 is an empty cache */
    int64_t n_depth;
    int64_t *np; /* sequences decoding together in tgN */
    int64_t n_np;
    int64_t *threads;
    int64_t n_threads;
    int64_t reps;
    int64_t n_batch; /* rows per step (-b) */
    bool full_logits, json, memory;
    const char *image;
} bench_opts;

/* "512,2048" -> lengths (malloc'd); zeros are dropped unless keep_zero, as llama-bench
 * skips ppN/tgN of 0 but runs depth 0. */
static int64_t *parse_list(const char *flag, const char *s, int64_t lo, int64_t hi, bool keep_zero,
                           int64_t *n) {
    int64_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int64_t *v = malloc(sizeof *v * (size_t)cap);
    if (!v) cli_die("out of memory");
    *n = 0;
    for (const char *p = s;;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[32];
        if (len == 0 || len >= sizeof item)
            cli_die("%s: expected comma-separated integers, found \"%s\"", flag, s);
        memcpy(item, p, len);
        item[len] = 0;
        char *e;
        const long long x = strtoll(item, &e, 10);
        if (*e || x < lo || x > hi)
            cli_die("%s: expected comma-separated integers from %lld to %lld, found \"%s\"", flag,
                    (long long)lo, (long long)hi, s);
        if (x > 0 || keep_zero) v[(*n)++] = x;
        if (!end) break;
        p = end + 1;
    }
    return v;
}

static void parse_opts(bench_opts *o, int argc, char **argv) {
    const char *pp = "512", *tg = "128", *depth = "0", *np = "1", *threads = NULL, *out = "md";
    o->reps = 5;
    o->n_batch = 0; /* the device's */
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf(usage_text, (int)celer_physical_cores());
            exit(0);
        }
        if (!strcmp(a, "--full-logits")) {
            o->full_logits = true;
            continue;
        }
        if (!strcmp(a, "--memory")) {
            o->memory = true;
            continue;
        }
        if (!strcmp(a, "--image") && i + 1 < argc) {
            o->image = argv[++i];
            continue;
        }
        const bool thr = !strcmp(a, "-t") || !strcmp(a, "--threads");
        if (!thr && cli_model_flag(&o->mo, argc, argv, &i)) continue;
        const bool takes_value = thr || !strcmp(a, "-p") || !strcmp(a, "-n") || !strcmp(a, "-d") ||
                                 !strcmp(a, "-r") || !strcmp(a, "-o") || !strcmp(a, "-np") ||
                                 !strcmp(a, "-b");
        if (!takes_value) cli_die("bench: unknown option %s (see celer bench --help)", a);
        if (i + 1 >= argc) cli_die("%s: expected a value", a);
        const char *v = argv[++i];
        if (thr)
            threads = v;
        else if (!strcmp(a, "-p"))
            pp = v;
        else if (!strcmp(a, "-n"))
            tg = v;
        else if (!strcmp(a, "-d"))
            depth = v;
        else if (!strcmp(a, "-o"))
            out = v;
        else if (!strcmp(a, "-np"))
            np = v;
        else if (!strcmp(a, "-b")) {
            o->n_batch = cli_parse_int(a, v);
            if (o->n_batch < 1 || o->n_batch > BENCH_MAX_BATCH)
                cli_die("-b: expected 1 to %d rows per step, found %s", BENCH_MAX_BATCH, v);
        } else {
            o->reps = cli_parse_int(a, v);
            if (o->reps < 1 || o->reps > BENCH_MAX_REPS)
                cli_die("-r: expected 1 to %d repetitions, found %s", BENCH_MAX_REPS, v);
        }
    }
    if (!strcmp(out, "json"))
        o->json = true;
    else if (strcmp(out, "md"))
        cli_die("-o: expected md or json, found \"%s\"", out);
    o->pp = parse_list("-p", pp, 0, BENCH_MAX_LEN, false, &o->n_pp);
    o->tg = parse_list("-n", tg, 0, BENCH_MAX_LEN, false, &o->n_tg);
    o->depth = parse_list("-d", depth, 0, BENCH_MAX_LEN, true, &o->n_depth);
    o->np = parse_list("-np", np, 1, BENCH_MAX_SEQ, false, &o->n_np);
    if (threads) {
        o->threads = parse_list("-t", threads, 1, 1024, false, &o->n_threads);
    } else {
        o->threads = malloc(sizeof *o->threads);
        if (!o->threads) cli_die("out of memory");
        o->threads[0] = celer_physical_cores();
        o->n_threads = 1;
    }
    if (!o->mo.model) cli_die("-m MODEL is required (a checkpoint directory or a .gguf file)");
    if (o->n_pp + o->n_tg == 0 && !o->memory)
        cli_die("bench: nothing to run (-p and -n are both 0, and no --memory)");
}

/* ==== Timing and statistics ==== */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void iso8601_now(char out[32]) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Mean and sample standard deviation (n - 1; 0 for one value) of x[n]. */
static void mean_stddev(const double *x, int64_t n, double *mean, double *sd) {
    double s = 0, q = 0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    *mean = s / (double)n;
    for (int64_t i = 0; i < n; i++) q += (x[i] - *mean) * (x[i] - *mean);
    *sd = n > 1 ? sqrt(q / (double)(n - 1)) : 0;
}

/* Peak resident memory of this process so far (Linux reports ru_maxrss in KiB). */
static int64_t peak_rss_bytes(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (int64_t)ru.ru_maxrss * 1024 : -1;
}

/* ==== Tests ==== */

typedef struct bench_result {
    int64_t n_prompt, n_gen, n_depth;
    int64_t n_seq; /* sequences of a tgN (1 for ppN) */
    int32_t n_threads;
    const char *kernels; /* static, from the library */
    int64_t n_ctx, n_batch;
    double load_ms;           /* model open + context create */
    celer_context_memory mem; /* what the context held on its device */
    char device[32];
    char test_time[32];
    int64_t *samples_ns; /* [reps] */
    double *samples_ts;  /* [reps] */
} bench_result;

/* Reusable buffers: all sized before any clock starts. */
typedef struct bench_buffers {
    const int32_t *ids; /* synthetic ids: max(-d) for the prefix, then max(p, n) */
    int64_t max_depth;
    float *logits;                /* [max(-np), vocab] */
    int32_t *step_ids, *step_seq; /* [max(-np)]: a step's rows */
    int8_t *step_want;            /* [max(-np)], all set */
    float *all_logits;            /* [max(p), vocab] with --full-logits, else NULL */
} bench_buffers;

static void check(celer_context *ctx, celer_status s) {
    if (s != CELER_OK) cli_die("bench: %s", celer_context_last_error(ctx));
}

/* One run of a test on sequences 0 .. n_seq - 1, each after its n_depth-token prefix
 * (untimed); returns the test's nanoseconds. */
static int64_t bench_run_once(celer_context *ctx, const bench_result *r, const bench_buffers *bb,
                              bool full_logits) {
    for (int32_t s = 0; s < (int32_t)r->n_seq; s++) {
        check(ctx, celer_seq_reset(ctx, s));
        if (!r->n_depth) continue;
        celer_batch b = celer_batch_tokens(bb->ids, r->n_depth);
        check(ctx,
              celer_forward_last_logits_with_sequence_id(ctx, &b, s, r->n_depth - 1, bb->logits));
        if (celer_seq_length(ctx, s) != r->n_depth)
            cli_die("bench: the cache holds %lld positions after a %lld-token prefix",
                    (long long)celer_seq_length(ctx, s), (long long)r->n_depth);
    }
    const int32_t *ids = bb->ids + bb->max_depth; /* the test's ids follow every prefix */
    if (r->n_seq > 1) {
        /* one batch a step: row s is the next id of sequence s, and every row wants logits */
        const int64_t t0 = now_ns();
        for (int64_t i = 0; i < r->n_gen; i++) {
            for (int64_t s = 0; s < r->n_seq; s++) bb->step_ids[s] = ids[i];
            const celer_batch b = {.n = r->n_seq,
                                   .token = bb->step_ids,
                                   .seq_id = bb->step_seq,
                                   .logits = bb->step_want};
            check(ctx, celer_batch_decode(ctx, &b, bb->logits));
        }
        return now_ns() - t0;
    }
    if (r->n_prompt) {
        celer_batch b = celer_batch_tokens(ids, r->n_prompt);
        const int64_t t0 = now_ns();
        if (full_logits)
            check(ctx, celer_forward(ctx, &b, bb->all_logits));
        else
            check(ctx, celer_forward_last_logits(ctx, &b, r->n_prompt - 1, bb->logits));
        return now_ns() - t0;
    }
    /* Like llama-bench's tgN: each step feeds the next synthetic id; nothing is sampled. */
    const int64_t t0 = now_ns();
    for (int64_t i = 0; i < r->n_gen; i++) {
        celer_batch b = celer_batch_tokens(ids + i, 1);
        check(ctx, celer_forward_last_logits(ctx, &b, 0, bb->logits));
    }
    return now_ns() - t0;
}

static void bench_run(celer_context *ctx, bench_result *r, const bench_buffers *bb, int64_t reps,
                      bool full_logits) {
    iso8601_now(r->test_time);
    bench_run_once(ctx, r, bb, full_logits); /* warm-up */
    const int64_t tokens = r->n_prompt ? r->n_prompt : r->n_gen * r->n_seq;
    for (int64_t k = 0; k < reps; k++) {
        r->samples_ns[k] = bench_run_once(ctx, r, bb, full_logits);
        r->samples_ts[k] =
            1e9 * (double)tokens / (double)(r->samples_ns[k] > 0 ? r->samples_ns[k] : 1);
    }
    for (int32_t s = 0; s < (int32_t)r->n_seq; s++) check(ctx, celer_seq_reset(ctx, s));
}

/* ==== Images ==== */

typedef struct image_bench {
    celer_image *img;
    int64_t rows;    /* prompt rows of the image */
    float *embd;     /* [rows + max(p), d]: the image's rows, then room for the text rows */
    int32_t *tokens; /* [rows + max(p)]: -1, then synthetic ids */
    double *samples; /* [reps] */
} image_bench;

/* Encode and ppN+img at one thread count: a markdown row or JSON objects per test. */
static void bench_image(celer_context *ctx, image_bench *ib, const bench_opts *o, float *logits,
                        json_t *arr) {
    const int32_t threads = celer_context_n_threads(ctx);
    double mean, sd;
    check(ctx, celer_image_encode(ctx, ib->img, ib->embd)); /* warm-up, and the rows */
    for (int64_t k = 0; k < o->reps; k++) {
        const int64_t t0 = now_ns();
        check(ctx, celer_image_encode(ctx, ib->img, ib->embd));
        ib->samples[k] = (double)(now_ns() - t0) / 1e6;
    }
    mean_stddev(ib->samples, o->reps, &mean, &sd);
    if (arr)
        json_array_append_new(
            arr, json_pack("{s:s, s:i, s:s, s:I, s:I, s:I, s:f, s:f}", "test", "image_encode",
                           "n_threads", threads, "kernels", celer_context_kernels(ctx),
                           "image_width", (json_int_t)celer_image_width(ib->img), "image_height",
                           (json_int_t)celer_image_height(ib->img), "image_rows",
                           (json_int_t)ib->rows, "avg_ms", mean, "stddev_ms", sd));
    else
        printf("| %lldx%lld | %lld | %d | encode | %.1f ± %.1f ms |\n",
               (long long)celer_image_width(ib->img), (long long)celer_image_height(ib->img),
               (long long)ib->rows, threads, mean, sd);
    for (int64_t p = 0; p < o->n_pp; p++) {
        const int64_t n = ib->rows + o->pp[p];
        const celer_batch b = {.n = n, .token = ib->tokens, .embd = ib->embd};
        for (int64_t k = -1; k < o->reps; k++) { /* k = -1: the warm-up */
            check(ctx, celer_seq_reset(ctx, 0));
            const int64_t t0 = now_ns();
            check(ctx, celer_forward_last_logits(ctx, &b, n - 1, logits));
            const int64_t dt = now_ns() - t0;
            if (k >= 0) ib->samples[k] = 1e9 * (double)n / (double)(dt > 0 ? dt : 1);
        }
        check(ctx, celer_seq_reset(ctx, 0));
        mean_stddev(ib->samples, o->reps, &mean, &sd);
        if (arr)
            json_array_append_new(
                arr, json_pack("{s:s, s:i, s:s, s:I, s:I, s:f, s:f}", "test", "pp+image",
                               "n_threads", threads, "kernels", celer_context_kernels(ctx),
                               "n_prompt", (json_int_t)o->pp[p], "image_rows", (json_int_t)ib->rows,
                               "avg_ts", mean, "stddev_ts", sd));
        else
            printf("| %lldx%lld | %lld | %d | pp%lld+img | %.2f ± %.2f rows/s |\n",
                   (long long)celer_image_width(ib->img), (long long)celer_image_height(ib->img),
                   (long long)ib->rows, threads, (long long)o->pp[p], mean, sd);
    }
}

/* ==== Memory read bandwidth ==== */

typedef struct mem_slice {
    uint64_t *p;
    size_t n;  /* words */
    bool fill; /* first pass: write the slice (pages land where the thread runs) */
    uint64_t sum;
} mem_slice;

static void *mem_worker(void *arg) {
    mem_slice *s = arg;
    if (s->fill) {
        for (size_t i = 0; i < s->n; i++) s->p[i] = i;
        return NULL;
    }
    /* Eight independent accumulators: the loads are never serialized behind one add. */
    const uint64_t *p = s->p;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    size_t i = 0;
    for (; i + 8 <= s->n; i += 8) {
        a0 += p[i], a1 += p[i + 1], a2 += p[i + 2], a3 += p[i + 3];
        a4 += p[i + 4], a5 += p[i + 5], a6 += p[i + 6], a7 += p[i + 7];
    }
    for (; i < s->n; i++) a0 += p[i];
    s->sum = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    return NULL;
}

static volatile uint64_t mem_sink;

/* Runs every slice on its own thread (slice 0 on this one); returns nanoseconds. */
static int64_t mem_pass(mem_slice *sl, pthread_t *tid, int32_t t) {
    const int64_t t0 = now_ns();
    for (int32_t k = 1; k < t; k++)
        if (pthread_create(&tid[k], NULL, mem_worker, &sl[k]) != 0)
            cli_die("--memory: cannot start a thread");
    mem_worker(&sl[0]);
    for (int32_t k = 1; k < t; k++) pthread_join(tid[k], NULL);
    return now_ns() - t0;
}

/* The buffer: at least 1 GiB and 8x the last-level cache, at most a quarter of RAM. */
static size_t mem_buffer_bytes(void) {
    size_t bytes = (size_t)1 << 30;
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (llc > 0 && (size_t)llc * 8 > bytes) bytes = (size_t)llc * 8;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && bytes > (size_t)pages * (size_t)page / 4)
        bytes = (size_t)pages * (size_t)page / 4;
    return bytes & ~(size_t)4095;
}

/* Best of several passes of t threads each summing its slice, in bytes per second. */
static double mem_read_bandwidth(int32_t t, size_t bytes) {
    const size_t words = bytes / sizeof(uint64_t);
    uint64_t *buf = malloc(words * sizeof *buf);
    mem_slice *sl = calloc((size_t)t, sizeof *sl);
    pthread_t *tid = calloc((size_t)t, sizeof *tid);
    if (!buf || !sl || !tid) cli_die("--memory: cannot allocate a %zu MiB buffer", bytes >> 20);
    for (int32_t k = 0; k < t; k++) {
        const size_t lo = words * (size_t)k / (size_t)t, hi = words * (size_t)(k + 1) / (size_t)t;
        sl[k] = (mem_slice){.p = buf + lo, .n = hi - lo, .fill = true};
    }
    mem_pass(sl, tid, t);
    for (int32_t k = 0; k < t; k++) sl[k].fill = false;
    int64_t best = INT64_MAX;
    uint64_t sink = 0;
    for (int pass = 0; pass < 6; pass++) {
        const int64_t ns = mem_pass(sl, tid, t);
        if (pass > 0 && ns < best) best = ns; /* the first read pass is a warm-up */
        for (int32_t k = 0; k < t; k++) sink += sl[k].sum;
    }
    mem_sink = sink; /* keeps the sums, and so the loads, observable */
    free(buf), free(sl), free(tid);
    return (double)(words * sizeof(uint64_t)) * 1e9 / (double)(best > 0 ? best : 1);
}

/* ==== Output ==== */

typedef struct bench_model {
    const char *path, *desc;
    celer_model_info info;
    int64_t n_vocab, n_embd;
    bool tied;
    int64_t decode_bytes; /* weight bytes one decode step reads */
} bench_model;

/* A decode step reads every weight once, except the embedding table, of which it reads
 * one row, unless the LM head is the same table. The public API gives the total only, so
 * an untied table's share is estimated at the model's mean bytes per weight. */
static void model_decode_bytes(bench_model *bm) {
    bm->decode_bytes = bm->info.weight_bytes;
    if (bm->tied || bm->info.n_params <= 0) return;
    const double per_weight = (double)bm->info.weight_bytes / (double)bm->info.n_params;
    bm->decode_bytes -= (int64_t)((double)(bm->n_vocab * bm->n_embd) * per_weight);
}

/* "pp512", "tg128 @ d2048" (llama-bench's names), "pp512 full-logits", "tg128 np16". */
static void test_name(const bench_result *r, bool full_logits, char *out, size_t cap) {
    char depth[32] = "", seqs[32] = "";
    if (r->n_depth) snprintf(depth, sizeof depth, " @ d%lld", (long long)r->n_depth);
    if (r->n_seq > 1) snprintf(seqs, sizeof seqs, " np%lld", (long long)r->n_seq);
    if (r->n_prompt)
        snprintf(out, cap, "pp%lld%s%s", (long long)r->n_prompt, depth,
                 full_logits ? " full-logits" : "");
    else
        snprintf(out, cap, "tg%lld%s%s", (long long)r->n_gen, seqs, depth);
}

static int md_model_width(const bench_model *bm) {
    const int w = (int)strlen(bm->desc);
    return w > 5 ? w : 5;
}

static void md_header(const bench_model *bm) {
    const int w = md_model_width(bm);
    printf("| %-*s | %10s | %10s | %-8s | %7s | %20s | %20s |\n", w, "model", "size", "params",
           "kernels", "threads", "test", "t/s");
    printf("| ");
    for (int i = 0; i < w; i++) putchar('-');
    printf(" | ---------: | ---------: | -------- | ------: | -------------------: | "
           "-------------------: |\n");
    fflush(stdout);
}

static void md_row(const bench_model *bm, const bench_result *r, int64_t reps, bool full_logits) {
    char size[32], params[32], test[64], ts[64];
    const double b = (double)bm->info.weight_bytes;
    if (b >= 1024.0 * 1024 * 1024)
        snprintf(size, sizeof size, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else
        snprintf(size, sizeof size, "%.2f MiB", b / (1024.0 * 1024));
    const double np = (double)bm->info.n_params;
    if (np >= 1e9)
        snprintf(params, sizeof params, "%.2f B", np / 1e9);
    else
        snprintf(params, sizeof params, "%.2f M", np / 1e6);
    test_name(r, full_logits, test, sizeof test);
    double mean, sd;
    mean_stddev(r->samples_ts, reps, &mean, &sd);
    snprintf(ts, sizeof ts, "%.2f \u00b1 %.2f", mean, sd);
    /* "±" is two bytes and one column. */
    printf("| %-*s | %10s | %10s | %-8s | %7d | %20s | %21s |\n", md_model_width(bm), bm->desc,
           size, params, r->kernels, (int)r->n_threads, test, ts);
    fflush(stdout);
}

static json_t *json_result(const bench_model *bm, const bench_result *r, const bench_opts *o,
                           int64_t peak_rss, double read_bps) {
    double avg_ns, sd_ns, avg_ts, sd_ts;
    double *ns = malloc(sizeof *ns * (size_t)o->reps);
    if (!ns) cli_die("out of memory");
    for (int64_t k = 0; k < o->reps; k++) ns[k] = (double)r->samples_ns[k];
    mean_stddev(ns, o->reps, &avg_ns, &sd_ns);
    mean_stddev(r->samples_ts, o->reps, &avg_ts, &sd_ts);
    free(ns);
    char test[64];
    test_name(r, false, test, sizeof test);
    json_t *samples_ns = json_array(), *samples_ts = json_array();
    for (int64_t k = 0; k < o->reps; k++) {
        json_array_append_new(samples_ns, json_integer(r->samples_ns[k]));
        json_array_append_new(samples_ts, json_real(r->samples_ts[k]));
    }
    json_t *j = json_object();
    json_object_set_new(j, "test", json_string(test));
    json_object_set_new(j, "model_filename", json_string(bm->path));
    json_object_set_new(j, "model_type", json_string(bm->desc));
    json_object_set_new(j, "model_size", json_integer(bm->info.weight_bytes));
    json_object_set_new(j, "model_n_params", json_integer(bm->info.n_params));
    json_object_set_new(j, "kernels", json_string(r->kernels));
    json_object_set_new(j, "n_threads", json_integer(r->n_threads));
    json_object_set_new(j, "n_batch", json_integer(r->n_batch));
    json_object_set_new(j, "n_ctx", json_integer(r->n_ctx));
    json_object_set_new(j, "n_prompt", json_integer(r->n_prompt));
    json_object_set_new(j, "n_gen", json_integer(r->n_gen));
    json_object_set_new(j, "n_depth", json_integer(r->n_depth));
    json_object_set_new(j, "n_seq", json_integer(r->n_seq));
    json_object_set_new(j, "full_logits", json_boolean(r->n_prompt && o->full_logits));
    json_object_set_new(j, "test_time", json_string(r->test_time));
    json_object_set_new(j, "avg_ns", json_integer((json_int_t)llround(avg_ns)));
    json_object_set_new(j, "stddev_ns", json_integer((json_int_t)llround(sd_ns)));
    json_object_set_new(j, "avg_ts", json_real(avg_ts));
    json_object_set_new(j, "stddev_ts", json_real(sd_ts));
    json_object_set_new(j, "samples_ns", samples_ns);
    json_object_set_new(j, "samples_ts", samples_ts);
    json_object_set_new(j, "load_ms", json_real(r->load_ms));
    json_object_set_new(j, "peak_rss_bytes", json_integer(peak_rss));
    json_object_set_new(j, "device", json_string(r->device));
    json_object_set_new(j, "device_weight_bytes", json_integer(r->mem.weights));
    json_object_set_new(j, "device_kv_bytes", json_integer(r->mem.kv));
    json_object_set_new(j, "device_buffer_bytes", json_integer(r->mem.buffers));
    json_object_set_new(j, "weight_bytes", json_integer(bm->info.weight_bytes));
    if (o->memory && r->n_gen && r->n_seq == 1) {
        json_object_set_new(j, "decode_bytes_per_token", json_integer(bm->decode_bytes));
        json_object_set_new(
            j, "decode_bytes_basis",
            json_string(bm->tied ? "all weights (the tied LM head reads the embedding table)"
                                 : "weights less the embedding table (estimated at the mean "
                                   "bytes per weight)"));
        json_object_set_new(j, "bandwidth_use",
                            json_real((double)bm->decode_bytes * avg_ts / read_bps));
    }
    return j;
}

/* ==== The command ==== */

/* splitmix64: a fixed-seed id sequence in [0, vocab). */
static int32_t *synthetic_ids(int64_t n, int64_t vocab) {
    int32_t *ids = malloc(sizeof *ids * (size_t)(n > 0 ? n : 1));
    if (!ids) cli_die("out of memory");
    uint64_t x = 0x5eed;
    for (int64_t i = 0; i < n; i++) {
        uint64_t z = (x += 0x9e3779b97f4a7c15u);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
        ids[i] = (int32_t)((z ^ (z >> 31)) % (uint64_t)vocab);
    }
    return ids;
}

static int64_t max_of(const int64_t *v, int64_t n) {
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) m = v[i] > m ? v[i] : m;
    return m;
}

int cmd_bench(int argc, char **argv) {
    if (cli_help(argc, argv, usage_text)) return 0;
    bench_opts o = {0};
    parse_opts(&o, argc, argv);
    const int64_t max_p = max_of(o.pp, o.n_pp), max_n = max_of(o.tg, o.n_tg);
    const int64_t max_d = max_of(o.depth, o.n_depth), max_np = max_of(o.np, o.n_np);
    const int64_t need = max_p > max_n ? max_p : max_n;
    if (o.mo.n_ctx && o.mo.n_ctx < max_d + need)
        cli_die("-c %lld: the longest test needs %lld positions", (long long)o.mo.n_ctx,
                (long long)(max_d + need));
    const int64_t n_ctx =
        o.mo.n_ctx ? o.mo.n_ctx : (max_d + max_p + max_n > 0 ? max_d + max_p + max_n : 1);

    char err[512];
    int64_t t0 = now_ns();
    celer_model *m;
    if (celer_model_open(o.mo.model, NULL, &m, err, sizeof err) != CELER_OK) cli_die("%s", err);
    const double open_ms = (double)(now_ns() - t0) / 1e6;
    bench_model bm = {.path = o.mo.model,
                      .desc = celer_model_desc(m),
                      .info = celer_model_get_info(m),
                      .n_vocab = celer_model_n_vocab(m),
                      .n_embd = celer_model_n_embd(m)};
    bm.tied = strstr(bm.desc, "tied head") != NULL;
    model_decode_bytes(&bm);

    /* Every buffer a timed run touches, before any clock starts. Per thread count the
     * tests run depth by depth, ppN then tgN at each (llama-bench's order). */
    const int64_t per_d = o.n_pp + o.n_tg * o.n_np, per_t = per_d * o.n_depth,
                  n_res = per_t * o.n_threads;
    bench_result *res = calloc((size_t)(n_res > 0 ? n_res : 1), sizeof *res);
    int32_t *ids = synthetic_ids(max_d + need, bm.n_vocab);
    bench_buffers bb = {.ids = ids,
                        .max_depth = max_d,
                        .logits = malloc(sizeof(float) * (size_t)(max_np * bm.n_vocab)),
                        .step_ids = malloc(sizeof(int32_t) * (size_t)max_np),
                        .step_seq = malloc(sizeof(int32_t) * (size_t)max_np),
                        .step_want = malloc((size_t)max_np)};
    if (o.full_logits && max_p)
        bb.all_logits = malloc(sizeof(float) * (size_t)max_p * (size_t)bm.n_vocab);
    if (!res || !bb.logits || !bb.step_ids || !bb.step_seq || !bb.step_want ||
        (o.full_logits && max_p && !bb.all_logits))
        cli_die("out of memory");
    for (int64_t s = 0; s < max_np; s++) bb.step_seq[s] = (int32_t)s, bb.step_want[s] = 1;
    image_bench ib = {0};
    json_t *img_json = o.json && o.image ? json_array() : NULL;
    if (o.image) {
        if (!celer_model_has_vision(m)) cli_die("--image: %s reads no images", bm.desc);
        if (celer_image_load(o.image, &ib.img, err, sizeof err) != CELER_OK) cli_die("%s", err);
        if (celer_model_image_positions(m, ib.img, &ib.rows, err, sizeof err) != CELER_OK)
            cli_die("%s", err);
        const int64_t n = ib.rows + max_p;
        ib.embd = malloc(sizeof(float) * (size_t)(n * bm.n_embd));
        ib.tokens = malloc(sizeof *ib.tokens * (size_t)n);
        ib.samples = malloc(sizeof(double) * (size_t)o.reps);
        if (!ib.embd || !ib.tokens || !ib.samples) cli_die("out of memory");
        for (int64_t i = 0; i < n; i++) ib.tokens[i] = i < ib.rows ? -1 : ids[i - ib.rows];
    }
    const int64_t ctx_len = n_ctx + ib.rows;
    for (int64_t i = 0; i < n_res; i++) {
        res[i].samples_ns = malloc(sizeof(int64_t) * (size_t)o.reps);
        res[i].samples_ts = malloc(sizeof(double) * (size_t)o.reps);
        if (!res[i].samples_ns || !res[i].samples_ts) cli_die("out of memory");
        const int64_t k = i % per_d;
        res[i].n_prompt = k < o.n_pp ? o.pp[k] : 0;
        res[i].n_gen = k < o.n_pp ? 0 : o.tg[(k - o.n_pp) / o.n_np];
        res[i].n_seq = k < o.n_pp ? 1 : o.np[(k - o.n_pp) % o.n_np];
        res[i].n_depth = o.depth[i % per_t / per_d];
    }

    for (int64_t ti = 0; ti < o.n_threads && (n_res || o.image); ti++) {
        celer_context_params cp = celer_context_default_params();
        cp.n_ctx = ctx_len;
        cp.n_seq = (int32_t)max_np;
        cp.n_batch = o.n_batch;
        cp.n_threads = (int32_t)o.threads[ti];
        cp.device = o.mo.device;
        celer_context *ctx;
        t0 = now_ns();
        if (celer_context_create(m, &cp, &ctx, err, sizeof err) != CELER_OK) cli_die("%s", err);
        const double load_ms = open_ms + (double)(now_ns() - t0) / 1e6;
        if (!o.json && ti == 0) md_header(&bm); /* after the kernel set proved usable */
        for (int64_t k = 0; k < per_t; k++) {
            bench_result *r = &res[ti * per_t + k];
            r->n_threads = celer_context_n_threads(ctx);
            r->kernels = celer_context_kernels(ctx);
            r->n_ctx = ctx_len;
            r->n_batch = celer_context_n_batch(ctx);
            r->load_ms = load_ms;
            snprintf(r->device, sizeof r->device, "%s", celer_context_device(ctx));
            bench_run(ctx, r, &bb, o.reps, o.full_logits);
            r->mem = celer_context_get_memory(ctx); /* with the logits rows the runs asked for */
            if (!o.json) md_row(&bm, r, o.reps, o.full_logits);
        }
        if (o.image) {
            if (!o.json && ti == 0)
                printf("\n| image | rows | threads | test | result |\n|---|---:|---:|---|---:|\n");
            bench_image(ctx, &ib, &o, bb.logits, img_json);
        }
        celer_context_destroy(ctx);
    }
    const int64_t peak_rss = peak_rss_bytes(); /* before the bandwidth buffer exists */

    double *read_bps = calloc((size_t)o.n_threads, sizeof *read_bps);
    if (!read_bps) cli_die("out of memory");
    const size_t mem_bytes = mem_buffer_bytes();
    for (int64_t ti = 0; o.memory && ti < o.n_threads; ti++)
        read_bps[ti] = mem_read_bandwidth((int32_t)o.threads[ti], mem_bytes);

    if (o.json) {
        json_t *arr = json_array();
        for (int64_t i = 0; i < n_res; i++)
            json_array_append_new(arr,
                                  json_result(&bm, &res[i], &o, peak_rss, read_bps[i / per_t]));
        for (int64_t ti = 0; o.memory && ti < o.n_threads; ti++)
            json_array_append_new(arr,
                                  json_pack("{s:s, s:I, s:f, s:I}", "test", "memory", "n_threads",
                                            (json_int_t)o.threads[ti], "read_bytes_per_s",
                                            read_bps[ti], "buffer_bytes", (json_int_t)mem_bytes));
        if (img_json) json_array_extend(arr, img_json);
        json_dumpf(arr, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
        putchar('\n');
        json_decref(arr);
    } else {
        if (n_res) putchar('\n');
        for (int64_t ti = 0; n_res && ti < o.n_threads; ti++)
            printf("load: %.1f ms (model open + context create; %lld thread%s, n_ctx %lld, n_batch "
                   "%d)\n",
                   res[ti * per_t].load_ms, (long long)o.threads[ti], o.threads[ti] > 1 ? "s" : "",
                   (long long)ctx_len, (int)res[ti * per_t].n_batch);
        if (n_res) {
            const celer_context_memory *mm =
                &res[per_t - 1].mem; /* after every test of a context */
            const double mib = 1024.0 * 1024;
            printf("memory on %s: weights %.1f + KV cache %.1f + buffers %.1f = %.1f MiB\n",
                   res[0].device, (double)mm->weights / mib, (double)mm->kv / mib,
                   (double)mm->buffers / mib, (double)(mm->weights + mm->kv + mm->buffers) / mib);
            printf("peak RSS: %.1f MiB\n", (double)peak_rss / mib);
        }
        for (int64_t ti = 0; o.memory && ti < o.n_threads; ti++) {
            printf("memory read bandwidth: %.2f GB/s (%lld thread%s, %zu MiB buffer, best of 5 "
                   "passes)\n",
                   read_bps[ti] / 1e9, (long long)o.threads[ti], o.threads[ti] > 1 ? "s" : "",
                   mem_bytes >> 20);
            for (int64_t k = 0; k < per_t; k++) {
                const bench_result *r = &res[ti * per_t + k];
                if (!r->n_gen || r->n_seq > 1) continue;
                double mean, sd;
                char test[64];
                mean_stddev(r->samples_ts, o.reps, &mean, &sd);
                test_name(r, false, test, sizeof test);
                printf("  %s: %.2f MiB per token (%s) x %.2f t/s = %.2f GB/s, %.3f of it\n", test,
                       (double)bm.decode_bytes / (1024.0 * 1024),
                       bm.tied ? "all weights, tied head"
                               : "weights less the embedding table, estimated",
                       mean, (double)bm.decode_bytes * mean / 1e9,
                       (double)bm.decode_bytes * mean / read_bps[ti]);
            }
        }
    }

    for (int64_t i = 0; i < n_res; i++) free(res[i].samples_ns), free(res[i].samples_ts);
    free(res), free(ids), free(bb.logits), free(bb.all_logits), free(read_bps);
    free(bb.step_ids), free(bb.step_seq), free(bb.step_want);
    free(ib.embd), free(ib.tokens), free(ib.samples);
    celer_image_free(ib.img);
    json_decref(img_json);
    free(o.pp), free(o.tg), free(o.depth), free(o.np), free(o.threads);
    celer_model_close(m);
    return 0;
}

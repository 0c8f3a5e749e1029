/*
 * metrics.c - latency histograms and the Prometheus text exposition of /metrics
 * (metrics.h).
 *
 * Names follow Prometheus conventions (base units, _total for counters, _seconds for
 * durations) under the celer_ prefix; bucket bounds are those vLLM uses, so dashboards
 * built for it read these too. Nothing here measures time or reads the engine.
 */
#include "server/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,
                                     0.5,   0.75,  1.0,  2.5,  5.0,  7.5,  10.0, 20.0, 40.0};
static const double itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                    0.3,  0.4,   0.5,  0.75,  1.0, 2.5};
static const double e2e_bounds[] = {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,  2.5,   5.0,  10.0,
                                    15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0};

static void histogram_init(metrics_histogram *h, const double *bounds, int n) {
    memset(h, 0, sizeof *h);
    h->bounds = bounds;
    h->n_bounds = n;
}

void metrics_init(server_metrics *m) {
    memset(m, 0, sizeof *m);
    histogram_init(&m->ttft, ttft_bounds, (int)(sizeof ttft_bounds / sizeof *ttft_bounds));
    histogram_init(&m->itl, itl_bounds, (int)(sizeof itl_bounds / sizeof *itl_bounds));
    histogram_init(&m->e2e, e2e_bounds, (int)(sizeof e2e_bounds / sizeof *e2e_bounds));
}

void metrics_observe(metrics_histogram *h, double seconds) {
    int b = 0;
    while (b < h->n_bounds && seconds > h->bounds[b]) b++;
    h->counts[b]++; /* b == n_bounds: only in +Inf */
    h->count++;
    h->sum += seconds;
}

/* ==== Text exposition ==== */

typedef struct text_buf {
    char *s;
    size_t len, cap;
    bool failed;
} text_buf;

static void put(text_buf *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text_buf *t, const char *fmt, ...) {
    if (t->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const int n = vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        const size_t cap = t->cap * 2 + (size_t)n;
        char *s = realloc(t->s, cap);
        if (!s) {
            t->failed = true;
            return;
        }
        t->s = s, t->cap = cap;
    }
}

static void metric(text_buf *t, const char *name, const char *type, const char *help, double v) {
    put(t, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

static void histogram(text_buf *t, const char *name, const char *help, const metrics_histogram *h) {
    put(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int b = 0; b < h->n_bounds; b++) {
        cum += h->counts[b];
        put(t, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[b], (unsigned long long)cum);
    }
    put(t, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)h->count);
    put(t, "%s_sum %.17g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->count);
}

char *metrics_format(const server_metrics *m, const celer_engine_stats *st) {
    text_buf t = {malloc(4096), 0, 4096, false};
    if (!t.s) return NULL;
    t.s[0] = '\0';
    const double usage =
        st->kv_blocks_total > 0 ? (double)st->kv_blocks_used / (double)st->kv_blocks_total : 0.0;
    metric(&t, "celer_requests_running", "gauge", "Sequences (choices of requests) running.",
           st->running);
    metric(&t, "celer_requests_waiting", "gauge", "Choices waiting in the engine's queue.",
           st->waiting);
    metric(&t, "celer_kv_cache_usage_ratio", "gauge",
           "KV cache blocks held by running sequences, as a fraction of the pool.", usage);
    metric(&t, "celer_prompt_tokens_total", "counter", "Prompt tokens submitted.",
           (double)st->prompt_tokens_total);
    metric(&t, "celer_generation_tokens_total", "counter", "Tokens generated.",
           (double)st->generation_tokens_total);
    metric(&t, "celer_prefix_cache_queries_total", "counter",
           "Prompt positions looked up in the prefix cache.", (double)st->prefix_queries_total);
    metric(&t, "celer_prefix_cache_hits_total", "counter",
           "Prompt positions found in the prefix cache.", (double)st->prefix_hits_total);
    metric(&t, "celer_requests_total", "counter", "Generation requests that finished.",
           (double)m->requests_total);
    metric(&t, "celer_request_failures_total", "counter",
           "Generation requests a failed model step ended.", (double)m->request_failures_total);
    metric(&t, "celer_step_failures_total", "counter", "Model steps that failed (device errors).",
           (double)m->step_failures_total);
    metric(&t, "celer_preemptions_total", "counter",
           "Sequences pre-empted to free KV cache blocks.", (double)st->preemptions_total);
    histogram(&t, "celer_time_to_first_token_seconds", "Time from submission to the first token.",
              &m->ttft);
    histogram(&t, "celer_inter_token_latency_seconds", "Time between two tokens of one choice.",
              &m->itl);
    histogram(&t, "celer_e2e_request_latency_seconds",
              "Time from submission to the end of the last choice.", &m->e2e);
    if (t.failed) {
        free(t.s);
        return NULL;
    }
    return t.s;
}

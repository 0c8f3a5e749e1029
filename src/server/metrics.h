/*
 * metrics.h - the server's Prometheus metrics: latency histograms it observes itself,
 * and the text exposition (format 0.0.4) of those plus the engine's counters and gauges.
 *
 * No locking here: the owner (jobs.c) observes and formats under its own lock.
 */
#ifndef CELER_SERVER_METRICS_H
#define CELER_SERVER_METRICS_H

#include "celer.h"

#include <stdint.h>

#define METRICS_MAX_BUCKETS 24

typedef struct metrics_histogram {
    const double *bounds; /* [n_bounds] upper bounds, ascending; +Inf is implicit */
    int n_bounds;
    uint64_t counts[METRICS_MAX_BUCKETS]; /* per bucket, not cumulative */
    uint64_t count;
    double sum;
} metrics_histogram;

typedef struct server_metrics {
    metrics_histogram ttft;          /* submit -> first token, seconds */
    metrics_histogram itl;           /* between two tokens of one choice */
    metrics_histogram e2e;           /* submit -> last choice ended */
    uint64_t requests_total;         /* requests whose every choice ended */
    uint64_t request_failures_total; /* requests a failed model step ended */
    uint64_t step_failures_total;    /* model steps that failed */
} server_metrics;

void metrics_init(server_metrics *m);
void metrics_observe(metrics_histogram *h, double seconds);

/* The exposition text of m and st (malloc'd, NUL-terminated; the caller frees it), or
 * NULL when out of memory. */
char *metrics_format(const server_metrics *m, const celer_engine_stats *st);

#endif

/*
 * threadpool.h - a persistent pool of worker threads that run one task at a time.
 *
 * threadpool_run(pool, fn, arg) calls fn(arg, ith, nth) on nth threads (the caller is
 * thread 0) and returns when all have finished. Workers spin briefly on the job counter,
 * then sleep on a condition variable, so back-to-back ops of a decode step do not pay
 * for a wake-up each. Uneven work inside fn is balanced with threadpool_chunk.
 */
#ifndef CELER_BASE_THREADPOOL_H
#define CELER_BASE_THREADPOOL_H

#include <stdatomic.h>
#include <stdint.h>

typedef struct threadpool threadpool;
typedef void (*threadpool_fn)(void *arg, int ith, int nth);

/* n_threads >= 1 (1 = no workers). Returns NULL on failure. */
threadpool *threadpool_create(int n_threads);
void threadpool_destroy(threadpool *pool);
int threadpool_size(const threadpool *pool);
void threadpool_run(threadpool *pool, threadpool_fn fn, void *arg);

/* A shared work counter on its own cache line: threads take chunks [*lo, *hi) of
 * [0, total) until it returns 0. Reset to 0 before threadpool_run. */
typedef struct threadpool_counter {
    _Alignas(64) atomic_llong next;
    char pad[64 - sizeof(atomic_llong)];
} threadpool_counter;

int threadpool_chunk(threadpool_counter *c, int64_t total, int64_t chunk, int64_t *lo,
                     int64_t *hi);

/* Online CPUs, at least 1. */
int threadpool_cpu_count(void);

#endif

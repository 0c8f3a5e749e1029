/*
 * threadpool.c - persistent workers, spin-then-block, one job generation at a time.
 */
#define _POSIX_C_SOURCE 200809L
#include "base/threadpool.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#define SPIN_ITERS 20000

struct threadpool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake, done_cv;
    threadpool_fn fn;
    void *arg;
    _Alignas(64) atomic_uint generation; /* bumped once per job */
    _Alignas(64) atomic_int pending;     /* workers still running the current job */
    bool quit;
};

typedef struct worker_arg {
    threadpool *pool;
    int ith;
} worker_arg;

static void *worker_main(void *p) {
    worker_arg wa = *(worker_arg *)p;
    free(p);
    threadpool *pool = wa.pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen &&
               spins < SPIN_ITERS)
            spins++;
        if (g == seen) {
            pthread_mutex_lock(&pool->mu);
            while ((g = atomic_load(&pool->generation)) == seen && !pool->quit)
                pthread_cond_wait(&pool->wake, &pool->mu);
            bool quit = pool->quit;
            pthread_mutex_unlock(&pool->mu);
            if (quit) return NULL;
        }
        seen = g;
        pool->fn(pool->arg, wa.ith, pool->n);
        if (atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool->mu);
            pthread_cond_signal(&pool->done_cv);
            pthread_mutex_unlock(&pool->mu);
        }
    }
}

threadpool *threadpool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    threadpool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->n = n_threads;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done_cv, NULL);
    pool->threads = calloc((size_t)n_threads, sizeof *pool->threads);
    if (!pool->threads) goto fail;
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) goto fail;
        wa->pool = pool;
        wa->ith = i;
        if (pthread_create(&pool->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            goto fail;
        }
        pool->n = i + 1; /* threads started so far, for a clean destroy */
    }
    pool->n = n_threads;
    return pool;
fail:
    threadpool_destroy(pool);
    return NULL;
}

void threadpool_destroy(threadpool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    pool->quit = true;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->n && pool->threads; i++)
        if (pool->threads[i]) pthread_join(pool->threads[i], NULL);
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->done_cv);
    pthread_mutex_destroy(&pool->mu);
    free(pool->threads);
    free(pool);
}

int threadpool_size(const threadpool *pool) { return pool->n; }

void threadpool_run(threadpool *pool, threadpool_fn fn, void *arg) {
    if (pool->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->arg = arg;
    atomic_store(&pool->pending, pool->n - 1);
    pthread_mutex_lock(&pool->mu);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    fn(arg, 0, pool->n);
    int spins = 0;
    while (atomic_load_explicit(&pool->pending, memory_order_acquire) > 0 && spins < SPIN_ITERS)
        spins++;
    if (atomic_load(&pool->pending) > 0) {
        pthread_mutex_lock(&pool->mu);
        while (atomic_load(&pool->pending) > 0) pthread_cond_wait(&pool->done_cv, &pool->mu);
        pthread_mutex_unlock(&pool->mu);
    }
}

int threadpool_chunk(threadpool_counter *c, int64_t total, int64_t chunk, int64_t *lo,
                     int64_t *hi) {
    int64_t start = atomic_fetch_add_explicit(&c->next, chunk, memory_order_relaxed);
    if (start >= total) return 0;
    *lo = start;
    *hi = start + chunk < total ? start + chunk : total;
    return 1;
}

int threadpool_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

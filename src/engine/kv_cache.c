/*
 * kv_cache.c - block pool, free list and per-sequence block tables.
 */
#include "engine/kv_cache.h"

#include <stdlib.h>
#include <string.h>

celer_status kv_cache_create(kv_cache *kv, int64_t n_layer, int64_t kvd, int64_t n_ctx,
                             int32_t n_seq, int64_t block_size, celer_error *e) {
    memset(kv, 0, sizeof *kv);
    kv->n_layer = n_layer;
    kv->kvd = kvd;
    kv->n_ctx = n_ctx;
    kv->n_seq = n_seq;
    kv->block_size = block_size;
    kv->max_blocks = (n_ctx + block_size - 1) / block_size;
    kv->n_blocks = kv->max_blocks * n_seq;
    if (kv->n_blocks * block_size > INT32_MAX)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "KV cache of %lld sequences x %lld positions is too large", (long long)n_seq,
                         (long long)n_ctx);
    const size_t pool = (size_t)(kv->n_blocks * block_size) * (size_t)kvd;
    kv->k = calloc((size_t)n_layer, sizeof *kv->k);
    kv->v = calloc((size_t)n_layer, sizeof *kv->v);
    kv->free_blocks = malloc(sizeof *kv->free_blocks * (size_t)kv->n_blocks);
    kv->tables = calloc((size_t)(kv->max_blocks * n_seq), sizeof *kv->tables);
    kv->len = calloc((size_t)n_seq, sizeof *kv->len);
    if (!kv->k || !kv->v || !kv->free_blocks || !kv->tables || !kv->len) goto oom;
    for (int64_t l = 0; l < n_layer; l++) {
        /* calloc: pages are only touched as positions fill. */
        kv->k[l] = calloc(pool, sizeof(float));
        kv->v[l] = calloc(pool, sizeof(float));
        if (!kv->k[l] || !kv->v[l]) goto oom;
    }
    for (int64_t b = 0; b < kv->n_blocks; b++) kv->free_blocks[b] = (int32_t)(kv->n_blocks - 1 - b);
    kv->n_free = kv->n_blocks;
    return CELER_OK;
oom:
    kv_cache_destroy(kv);
    return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "KV cache: out of memory (%zu bytes per layer)",
                     2 * pool * sizeof(float));
}

void kv_cache_destroy(kv_cache *kv) {
    for (int64_t l = 0; l < kv->n_layer && kv->k && kv->v; l++) {
        free(kv->k[l]);
        free(kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    free(kv->free_blocks);
    free(kv->tables);
    free(kv->len);
    memset(kv, 0, sizeof *kv);
}

static int64_t blocks_for(const kv_cache *kv, int64_t positions) {
    return (positions + kv->block_size - 1) / kv->block_size;
}

celer_status kv_cache_reserve(kv_cache *kv, const int64_t *add, celer_error *e) {
    int64_t need = 0;
    for (int32_t s = 0; s < kv->n_seq; s++) {
        if (!add[s]) continue;
        if (kv->len[s] + add[s] > kv->n_ctx)
            return error_set(e, CELER_STATUS_CONTEXT_FULL,
                             "sequence %d: %lld positions held + %lld new exceed the context size "
                             "%lld",
                             s, (long long)kv->len[s], (long long)add[s], (long long)kv->n_ctx);
        need += blocks_for(kv, kv->len[s] + add[s]) - blocks_for(kv, kv->len[s]);
    }
    if (need > kv->n_free)
        return error_set(e, CELER_STATUS_CONTEXT_FULL,
                         "KV cache pool: %lld blocks needed, %lld free", (long long)need,
                         (long long)kv->n_free);
    for (int32_t s = 0; s < kv->n_seq; s++) {
        int32_t *table = kv->tables + (int64_t)s * kv->max_blocks;
        for (int64_t b = blocks_for(kv, kv->len[s]); b < blocks_for(kv, kv->len[s] + add[s]); b++)
            table[b] = kv->free_blocks[--kv->n_free];
    }
    return CELER_OK;
}

void kv_cache_commit(kv_cache *kv, const int64_t *add) {
    for (int32_t s = 0; s < kv->n_seq; s++) kv->len[s] += add[s];
}

void kv_cache_seq_reset(kv_cache *kv, int32_t seq) {
    int32_t *table = kv->tables + (int64_t)seq * kv->max_blocks;
    for (int64_t b = 0; b < blocks_for(kv, kv->len[seq]); b++) kv->free_blocks[kv->n_free++] = table[b];
    kv->len[seq] = 0;
}

/*
 * kv_cache.h - the paged KV cache: fixed-size blocks of positions from one pool, and a
 * block table per sequence (DESIGN.md section 2).
 *
 * fp32 K and V per layer, [n_blocks * block_size, hk * hd] each. Sized once at creation;
 * appending checks capacity before anything is written, so a full cache is a clean
 * error and never a half-applied step. Knows nothing of models.
 */
#ifndef CELER_ENGINE_KV_CACHE_H
#define CELER_ENGINE_KV_CACHE_H

#include "base/error.h"

#include <stdint.h>

typedef struct kv_cache {
    int64_t n_layer, kvd, block_size, n_blocks;
    int64_t n_ctx;          /* positions per sequence */
    int32_t n_seq;
    int64_t max_blocks;     /* per sequence: ceil(n_ctx / block_size) */
    float **k, **v;         /* [n_layer] pools */
    int32_t *free_blocks;   /* stack of free block ids */
    int64_t n_free;
    int32_t *tables;        /* [n_seq, max_blocks] */
    int64_t *len;           /* [n_seq] positions held */
} kv_cache;

celer_status kv_cache_create(kv_cache *kv, int64_t n_layer, int64_t kvd, int64_t n_ctx,
                             int32_t n_seq, int64_t block_size, celer_error *e);
void kv_cache_destroy(kv_cache *kv);

/* Checks that every sequence s can take add[s] more positions (add is [n_seq]), then
 * takes the blocks they need. Lengths are not changed: see kv_cache_commit. */
celer_status kv_cache_reserve(kv_cache *kv, const int64_t *add, celer_error *e);
/* Advances sequence lengths by add[s] after a step has written its rows. */
void kv_cache_commit(kv_cache *kv, const int64_t *add);

static inline const int32_t *kv_cache_table(const kv_cache *kv, int32_t seq) {
    return kv->tables + (int64_t)seq * kv->max_blocks;
}

static inline int32_t kv_cache_slot(const kv_cache *kv, int32_t seq, int64_t pos) {
    return (int32_t)(kv_cache_table(kv, seq)[pos / kv->block_size] * kv->block_size +
                     pos % kv->block_size);
}

/* Returns seq's blocks to the pool; its length becomes 0. */
void kv_cache_seq_reset(kv_cache *kv, int32_t seq);

#endif

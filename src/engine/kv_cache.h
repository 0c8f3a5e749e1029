/*
 * kv_cache.h - the paged KV cache: fixed-size blocks of positions from one pool shared by
 * every sequence, a block table per sequence, and the prefix cache over full blocks
 * (docs/architecture.md, "The model contract").
 *
 * K and V per layer (fp16 or fp32), [n_blocks * block_size, hk * hd] each, sized once at
 * creation.
 * A block is held by any number of sequences (a refcount). A full block can be published
 * under a chained hash (its parent block's hash and its own tokens); published blocks
 * are read-only, so sequences share them without copies. When the last holder lets go,
 * a published block waits in an LRU list until its memory is needed, and a later prompt
 * with the same tokens attaches it instead of recomputing. Appending checks capacity
 * before anything is written, so a full cache is a clean error and never a half-applied
 * step. Knows nothing of models or requests.
 */
#ifndef CELER_ENGINE_KV_CACHE_H
#define CELER_ENGINE_KV_CACHE_H

#include "backend/backend.h"
#include "base/error.h"

#include <stdbool.h>
#include <stdint.h>

/* Bookkeeping of one pool block. */
typedef struct kv_block {
    int32_t ref;      /* sequences holding the block */
    bool published;   /* in the hash map (and then read-only) */
    uint64_t hash;    /* chained hash of the block's tokens (valid when published) */
    uint64_t extra;   /* what besides token ids the rows depend on (image digests), 0 if nothing */
    int32_t map_next; /* next block in the same hash bucket */
    int32_t lru_prev, lru_next; /* in the LRU list when published and ref == 0 */
} kv_block;

typedef struct kv_cache {
    int64_t n_layer, kvd, block_size, n_blocks;
    int64_t n_ctx; /* positions per sequence */
    int32_t n_seq;
    int64_t max_blocks; /* per sequence: ceil(n_ctx / block_size) */
    int64_t elem_bytes; /* 2 (fp16) or 4 (fp32) */
    void **k, **v;      /* [n_layer] pools, memory of be */
    backend *be;
    kv_block *meta;        /* [n_blocks] */
    int32_t *block_tokens; /* [n_blocks, block_size] tokens of published blocks */
    int32_t *free_blocks;  /* stack of unreferenced, unpublished blocks */
    int64_t n_free;
    int32_t lru_head, lru_tail; /* oldest first; -1 when empty */
    int64_t n_lru;
    int32_t *buckets;  /* [n_buckets] first block of each hash bucket, -1 when empty */
    int64_t n_buckets; /* a power of two */
    int32_t *tables;   /* [n_seq, max_blocks] */
    int64_t *len;      /* [n_seq] positions held */
} kv_cache;

/* n_blocks: the pool; 0 means room for n_seq sequences of n_ctx positions each. The
 * pools are be's memory (be outlives the cache). */
celer_status kv_cache_create(kv_cache *kv, int64_t n_layer, int64_t kvd, int64_t elem_bytes,
                             int64_t n_ctx, int32_t n_seq, int64_t n_blocks, int64_t block_size,
                             backend *be, celer_error *e);
void kv_cache_destroy(kv_cache *kv);

/* Blocks a sequence of len positions holds. */
static inline int64_t kv_cache_blocks_for(const kv_cache *kv, int64_t len) {
    return (len + kv->block_size - 1) / kv->block_size;
}

/* Blocks that can be taken now: free ones plus cached ones that would be evicted. */
static inline int64_t kv_cache_available(const kv_cache *kv) {
    return kv->n_free + kv->n_lru;
}

/* Blocks held by at least one sequence. */
static inline int64_t kv_cache_used(const kv_cache *kv) {
    return kv->n_blocks - kv->n_free - kv->n_lru;
}

/* Checks that every sequence s can take add[s] more positions (add is [n_seq]), then
 * takes the blocks they need (evicting the least recently used cached blocks when no free
 * one is left). Lengths are not changed: see kv_cache_commit. */
celer_status kv_cache_reserve(kv_cache *kv, const int64_t *add, celer_error *e);
/* Advances sequence lengths by add[s] after a step has written its rows. */
void kv_cache_commit(kv_cache *kv, const int64_t *add);
/* Gives back the blocks kv_cache_reserve took for add when the step failed instead: each
 * sequence holds what it held before (cached blocks evicted for it stay evicted). */
void kv_cache_unreserve(kv_cache *kv, const int64_t *add);

static inline const int32_t *kv_cache_table(const kv_cache *kv, int32_t seq) {
    return kv->tables + (int64_t)seq * kv->max_blocks;
}

static inline int32_t kv_cache_slot(const kv_cache *kv, int32_t seq, int64_t pos) {
    return (int32_t)(kv_cache_table(kv, seq)[pos / kv->block_size] * kv->block_size +
                     pos % kv->block_size);
}

/* Lets go of seq's blocks (each goes back to the pool, or to the LRU list when it is
 * published and nobody else holds it); its length becomes 0. */
void kv_cache_seq_reset(kv_cache *kv, int32_t seq);

/* Keeps the first len positions of seq (len <= its length) and lets go of the blocks past
 * them, so a caller can roll back tokens it decided not to keep (a rejected draft). A kept
 * block that is cut in the middle must be writable: one that another sequence also holds
 * is let go too, and the sequence ends at that block's start; one only seq holds leaves
 * the prefix cache, since its tail will be rewritten. Returns the length kept (<= len). */
int64_t kv_cache_seq_truncate(kv_cache *kv, int32_t seq, int64_t len);

/* ==== Prefix cache ==== */

/* The chained hash of a block of tokens[block_size] whose parent block hashed to parent
 * (0 for the first block of a sequence). extra keys what else the block's rows depend on:
 * the digests of the images whose rows it holds (an image's rows all carry the same
 * placeholder id), 0 for a block of text. */
uint64_t kv_cache_hash(const kv_cache *kv, uint64_t parent, const int32_t *tokens, uint64_t extra);

/* The published block with this hash, exactly these tokens[block_size] and extra, or -1. */
int32_t kv_cache_lookup(const kv_cache *kv, uint64_t hash, const int32_t *tokens, uint64_t extra);

/* Appends whole blocks[n] to the empty-or-block-aligned sequence seq, which then holds
 * n * block_size more positions; each block gains a holder. The blocks must be full and
 * never written again (published, or full prompt blocks of a sibling sequence). */
void kv_cache_seq_attach(kv_cache *kv, int32_t seq, const int32_t *blocks, int64_t n);

/* Publishes block index b of seq (which must be full) under hash with its tokens and
 * extra; a block already published under the same key is left as it is. */
void kv_cache_publish(kv_cache *kv, int32_t seq, int64_t b, uint64_t hash, const int32_t *tokens,
                      uint64_t extra);

#endif

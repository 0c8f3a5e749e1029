/*
 * kv_cache.c - block pool, free stack, LRU list of cached blocks, the hash map of
 * published blocks and per-sequence block tables.
 *
 * Every block is in exactly one of three states: free (on the stack), held (ref > 0), or
 * cached (ref == 0, published, in the LRU list). Taking a block prefers a free one and
 * otherwise evicts the oldest cached one (unpublishing it).
 */
#include "engine/kv_cache.h"

#include <stdlib.h>
#include <string.h>

celer_status kv_cache_create(kv_cache *kv, int64_t n_layer, int64_t kvd, int64_t elem_bytes,
                             int64_t n_ctx, int32_t n_seq, int64_t n_blocks, int64_t block_size,
                             backend *be, celer_error *e) {
    memset(kv, 0, sizeof *kv);
    kv->be = be;
    kv->elem_bytes = elem_bytes;
    kv->n_layer = n_layer;
    kv->kvd = kvd;
    kv->n_ctx = n_ctx;
    kv->n_seq = n_seq;
    kv->block_size = block_size;
    kv->max_blocks = (n_ctx + block_size - 1) / block_size;
    kv->n_blocks = n_blocks > 0 ? n_blocks : kv->max_blocks * n_seq;
    kv->lru_head = kv->lru_tail = -1;
    if (kv->n_blocks * block_size > INT32_MAX)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "KV cache of %lld blocks x %lld positions is too large",
                         (long long)kv->n_blocks, (long long)block_size);
    const size_t pool = (size_t)(kv->n_blocks * block_size) * (size_t)kvd;
    kv->n_buckets = 1;
    while (kv->n_buckets < kv->n_blocks) kv->n_buckets *= 2;
    kv->k = calloc((size_t)n_layer, sizeof *kv->k);
    kv->v = calloc((size_t)n_layer, sizeof *kv->v);
    kv->meta = calloc((size_t)kv->n_blocks, sizeof *kv->meta);
    kv->block_tokens = malloc(sizeof *kv->block_tokens * (size_t)(kv->n_blocks * block_size));
    kv->free_blocks = malloc(sizeof *kv->free_blocks * (size_t)kv->n_blocks);
    kv->buckets = malloc(sizeof *kv->buckets * (size_t)kv->n_buckets);
    kv->tables = calloc((size_t)(kv->max_blocks * n_seq), sizeof *kv->tables);
    kv->len = calloc((size_t)n_seq, sizeof *kv->len);
    if (!kv->k || !kv->v || !kv->meta || !kv->block_tokens || !kv->free_blocks || !kv->buckets ||
        !kv->tables || !kv->len)
        goto oom;
    for (int64_t l = 0; l < n_layer; l++) {
        /* on the host, pages are only touched as positions fill */
        kv->k[l] = be->ops->alloc(be, pool * (size_t)elem_bytes);
        kv->v[l] = be->ops->alloc(be, pool * (size_t)elem_bytes);
        if (!kv->k[l] || !kv->v[l]) goto oom;
    }
    for (int64_t b = 0; b < kv->n_blocks; b++) kv->free_blocks[b] = (int32_t)(kv->n_blocks - 1 - b);
    kv->n_free = kv->n_blocks;
    for (int64_t i = 0; i < kv->n_buckets; i++) kv->buckets[i] = -1;
    return CELER_OK;
oom:
    kv_cache_destroy(kv);
    return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "KV cache: out of memory (%zu bytes per layer)",
                     2 * pool * (size_t)elem_bytes);
}

void kv_cache_destroy(kv_cache *kv) {
    for (int64_t l = 0; l < kv->n_layer && kv->k && kv->v; l++) {
        if (kv->k[l]) kv->be->ops->release(kv->be, kv->k[l]);
        if (kv->v[l]) kv->be->ops->release(kv->be, kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    free(kv->meta);
    free(kv->block_tokens);
    free(kv->free_blocks);
    free(kv->buckets);
    free(kv->tables);
    free(kv->len);
    memset(kv, 0, sizeof *kv);
}

/* ==== Block states ==== */

static void lru_remove(kv_cache *kv, int32_t b) {
    kv_block *m = &kv->meta[b];
    if (m->lru_prev >= 0)
        kv->meta[m->lru_prev].lru_next = m->lru_next;
    else
        kv->lru_head = m->lru_next;
    if (m->lru_next >= 0)
        kv->meta[m->lru_next].lru_prev = m->lru_prev;
    else
        kv->lru_tail = m->lru_prev;
    kv->n_lru--;
}

static void lru_push(kv_cache *kv, int32_t b) {
    kv_block *m = &kv->meta[b];
    m->lru_prev = kv->lru_tail;
    m->lru_next = -1;
    if (kv->lru_tail >= 0)
        kv->meta[kv->lru_tail].lru_next = b;
    else
        kv->lru_head = b;
    kv->lru_tail = b;
    kv->n_lru++;
}

static int64_t bucket_of(const kv_cache *kv, uint64_t hash) {
    return (int64_t)(hash & (uint64_t)(kv->n_buckets - 1));
}

static void unpublish(kv_cache *kv, int32_t b) {
    int32_t *link = &kv->buckets[bucket_of(kv, kv->meta[b].hash)];
    while (*link != b) link = &kv->meta[*link].map_next;
    *link = kv->meta[b].map_next;
    kv->meta[b].published = false;
}

/* A block for a sequence to write into (the caller checked availability). */
static int32_t take_block(kv_cache *kv) {
    int32_t b;
    if (kv->n_free > 0) {
        b = kv->free_blocks[--kv->n_free];
    } else {
        b = kv->lru_head;
        lru_remove(kv, b);
        unpublish(kv, b);
    }
    kv->meta[b].ref = 1;
    return b;
}

static void hold_block(kv_cache *kv, int32_t b) {
    if (kv->meta[b].ref++ == 0) lru_remove(kv, b);
}

static void release_block(kv_cache *kv, int32_t b) {
    if (--kv->meta[b].ref > 0) return;
    if (kv->meta[b].published)
        lru_push(kv, b);
    else
        kv->free_blocks[kv->n_free++] = b;
}

/* ==== Sequences ==== */

celer_status kv_cache_reserve(kv_cache *kv, const int64_t *add, celer_error *e) {
    int64_t need = 0;
    for (int32_t s = 0; s < kv->n_seq; s++) {
        if (!add[s]) continue;
        if (kv->len[s] + add[s] > kv->n_ctx)
            return error_set(e, CELER_STATUS_CONTEXT_FULL,
                             "sequence %d: %lld positions held + %lld new exceed the context size "
                             "%lld",
                             s, (long long)kv->len[s], (long long)add[s], (long long)kv->n_ctx);
        need += kv_cache_blocks_for(kv, kv->len[s] + add[s]) - kv_cache_blocks_for(kv, kv->len[s]);
    }
    if (need > kv_cache_available(kv))
        return error_set(e, CELER_STATUS_CONTEXT_FULL,
                         "KV cache pool: %lld blocks needed, %lld available", (long long)need,
                         (long long)kv_cache_available(kv));
    for (int32_t s = 0; s < kv->n_seq; s++) {
        int32_t *table = kv->tables + (int64_t)s * kv->max_blocks;
        for (int64_t b = kv_cache_blocks_for(kv, kv->len[s]);
             b < kv_cache_blocks_for(kv, kv->len[s] + add[s]); b++)
            table[b] = take_block(kv);
    }
    return CELER_OK;
}

void kv_cache_commit(kv_cache *kv, const int64_t *add) {
    for (int32_t s = 0; s < kv->n_seq; s++) kv->len[s] += add[s];
}

void kv_cache_unreserve(kv_cache *kv, const int64_t *add) {
    for (int32_t s = 0; s < kv->n_seq; s++) {
        const int32_t *table = kv_cache_table(kv, s);
        for (int64_t b = kv_cache_blocks_for(kv, kv->len[s]);
             b < kv_cache_blocks_for(kv, kv->len[s] + add[s]); b++)
            release_block(kv, table[b]);
    }
}

void kv_cache_seq_reset(kv_cache *kv, int32_t seq) {
    int32_t *table = kv->tables + (int64_t)seq * kv->max_blocks;
    for (int64_t b = 0; b < kv_cache_blocks_for(kv, kv->len[seq]); b++) release_block(kv, table[b]);
    kv->len[seq] = 0;
}

int64_t kv_cache_seq_truncate(kv_cache *kv, int32_t seq, int64_t len) {
    int32_t *table = kv->tables + (int64_t)seq * kv->max_blocks;
    const int64_t held = kv_cache_blocks_for(kv, kv->len[seq]);
    if (len < 0) len = 0;
    if (len >= kv->len[seq]) return kv->len[seq];
    if (len % kv->block_size) { /* the block holding the cut will be written again */
        const int32_t b = table[len / kv->block_size];
        if (kv->meta[b].ref > 1)
            len -= len % kv->block_size;
        else if (kv->meta[b].published)
            unpublish(kv, b);
    }
    for (int64_t b = kv_cache_blocks_for(kv, len); b < held; b++) release_block(kv, table[b]);
    kv->len[seq] = len;
    return len;
}

/* ==== Prefix cache ==== */

uint64_t kv_cache_hash(const kv_cache *kv, uint64_t parent, const int32_t *tokens, uint64_t extra) {
    /* FNV-1a over the parent hash, extra and the token bytes, then a splitmix64 finish so
     * that the low bits (the bucket) depend on every input bit. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < 8; i++) h = (h ^ ((parent >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    for (int i = 0; extra && i < 8; i++) h = (h ^ ((extra >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    for (int64_t t = 0; t < kv->block_size; t++)
        for (int i = 0; i < 4; i++)
            h = (h ^ (((uint32_t)tokens[t] >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

int32_t kv_cache_lookup(const kv_cache *kv, uint64_t hash, const int32_t *tokens, uint64_t extra) {
    const size_t bytes = sizeof *tokens * (size_t)kv->block_size;
    for (int32_t b = kv->buckets[bucket_of(kv, hash)]; b >= 0; b = kv->meta[b].map_next)
        if (kv->meta[b].hash == hash && kv->meta[b].extra == extra &&
            !memcmp(kv->block_tokens + b * kv->block_size, tokens, bytes))
            return b;
    return -1;
}

void kv_cache_seq_attach(kv_cache *kv, int32_t seq, const int32_t *blocks, int64_t n) {
    int32_t *table = kv->tables + (int64_t)seq * kv->max_blocks;
    const int64_t first = kv->len[seq] / kv->block_size;
    for (int64_t i = 0; i < n; i++) {
        hold_block(kv, blocks[i]);
        table[first + i] = blocks[i];
    }
    kv->len[seq] += n * kv->block_size;
}

void kv_cache_publish(kv_cache *kv, int32_t seq, int64_t b, uint64_t hash, const int32_t *tokens,
                      uint64_t extra) {
    const int32_t blk = kv_cache_table(kv, seq)[b];
    kv_block *m = &kv->meta[blk];
    if (m->published || kv_cache_lookup(kv, hash, tokens, extra) >= 0) return;
    memcpy(kv->block_tokens + blk * kv->block_size, tokens,
           sizeof *tokens * (size_t)kv->block_size);
    m->hash = hash;
    m->extra = extra;
    m->published = true;
    const int64_t bucket = bucket_of(kv, hash);
    m->map_next = kv->buckets[bucket];
    kv->buckets[bucket] = blk;
}

/*
 * test_kv_cache.c - the paged KV cache's block bookkeeping (src/engine/kv_cache.h): rolling a
 * sequence back with kv_cache_seq_truncate. Blocks past the kept length go back (free, or to
 * the LRU list when published); a block cut in the middle that another sequence shares is
 * let go too and the length falls to its start; one held alone leaves the prefix cache, since
 * its tail will be rewritten. The K/V rows themselves are checked through a model in
 * test_contract.c (decoding again after a truncation gives the same logits).
 */
#include "harness.h"

#include "backend/ref/backend_ref.h"
#include "engine/kv_cache.h"

#include <stdio.h>
#include <string.h>

#define BS 4

static int64_t add[2];

/* Grows seq by n positions (reserve + commit, as a step does). */
static void grow(kv_cache *kv, int32_t seq, int64_t n) {
    celer_error e = {{0}};
    add[0] = add[1] = 0;
    add[seq] = n;
    CHECK(kv_cache_reserve(kv, add, &e) == CELER_OK, "reserve %lld: %s", (long long)n, e.msg);
    kv_cache_commit(kv, add);
}

int main(void) {
    backend *be = backend_ref_create(1, 8, 64, false);
    kv_cache kv;
    celer_error e = {{0}};
    if (!CHECK(be && kv_cache_create(&kv, 1, 8, 4, 32, 2, 8, BS, be, &e) == CELER_OK, "create: %s",
               e.msg))
        return harness_done("test_kv_cache");
    int32_t toks[32];
    for (int i = 0; i < 32; i++) toks[i] = 100 + i;

    /* Alone: 10 positions (3 blocks), keep 6, then 8 (nothing to give back), then 0. */
    grow(&kv, 0, 10);
    CHECK(kv.n_free == 5, "10 positions hold 3 of 8 blocks (free %lld)", (long long)kv.n_free);
    CHECK(kv_cache_seq_truncate(&kv, 0, 6) == 6 && kv.len[0] == 6 && kv.n_free == 6,
          "keep 6: length %lld, free %lld", (long long)kv.len[0], (long long)kv.n_free);
    CHECK(kv_cache_seq_truncate(&kv, 0, 8) == 6 && kv.n_free == 6,
          "keeping more than held is a no-op");
    CHECK(kv_cache_seq_truncate(&kv, 0, 0) == 0 && kv.n_free == 8, "keep 0: every block back");

    /* A published block cut in the middle while only seq 0 holds it leaves the cache. */
    grow(&kv, 0, 8);
    const uint64_t h0 = kv_cache_hash(&kv, 0, toks, 0), h1 = kv_cache_hash(&kv, h0, toks + BS, 0);
    kv_cache_publish(&kv, 0, 0, h0, toks, 0);
    kv_cache_publish(&kv, 0, 1, h1, toks + BS, 0);
    CHECK(kv_cache_lookup(&kv, h1, toks + BS, 0) >= 0, "block 1 published");
    CHECK(kv_cache_seq_truncate(&kv, 0, 6) == 6, "keep 6 of 8");
    CHECK(kv_cache_lookup(&kv, h1, toks + BS, 0) < 0 && kv_cache_lookup(&kv, h0, toks, 0) >= 0,
          "the cut block left the prefix cache, the whole one stayed");

    /* Shared blocks: seq 1 attaches seq 0's first block (as a sibling choice does) and grows
     * past it; cutting seq 1 inside the shared block falls back to its start and leaves the
     * block to seq 0. */
    const int32_t shared = kv_cache_table(&kv, 0)[0];
    kv_cache_seq_attach(&kv, 1, &shared, 1);
    grow(&kv, 1, 3);
    CHECK(kv.len[1] == 7 && kv.meta[shared].ref == 2, "seq 1: 7 positions, block shared");
    CHECK(kv_cache_seq_truncate(&kv, 1, 2) == 0 && kv.len[1] == 0,
          "a cut inside a shared block keeps nothing of it (kept %lld)", (long long)kv.len[1]);
    CHECK(kv.meta[shared].ref == 1 && kv_cache_lookup(&kv, h0, toks, 0) == shared,
          "seq 0 still holds the block, still published");
    grow(&kv, 1, 6);
    CHECK(kv_cache_seq_truncate(&kv, 1, 4) == 4 && kv.len[1] == 4,
          "a cut on a block boundary keeps it");

    /* Released published blocks wait in the LRU list, unpublished ones are free. */
    kv_cache_seq_reset(&kv, 1);
    kv_cache_seq_truncate(&kv, 0, 0);
    CHECK(kv.n_lru == 1 && kv.n_free == 7 && kv_cache_used(&kv) == 0,
          "after letting go: %lld cached, %lld free", (long long)kv.n_lru, (long long)kv.n_free);
    kv_cache_destroy(&kv);
    backend_destroy(be);
    return harness_done("test_kv_cache");
}

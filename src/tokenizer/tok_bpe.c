/*
 * tok_bpe.c - the BPE model of Hugging Face `tokenizers` on one pre-tokenized word.
 *
 * The word starts as one symbol per character (continuing_subword_prefix on all but the
 * first, end_of_word_suffix on the last), with byte fallback to <0xNN> tokens and unk
 * (fused when fuse_unk) for characters outside the vocabulary. Merges then run lowest
 * rank first from a binary min-heap keyed by (rank, position), stale entries skipped on
 * pop: O(n log n) per word. Dropout and the word cache are not implemented.
 */
#include "tokenizer/tok_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct symbol {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    size_t len;         /* bytes of the word covered; 0 once merged away */
} symbol;

typedef struct heap_item {
    int32_t rank, pos, new_id;
} heap_item;

static bool item_less(heap_item a, heap_item b) {
    return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
}

static void heap_push(heap_item *h, size_t *n, heap_item x) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!item_less(x, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static heap_item heap_pop(heap_item *h, size_t *n) {
    heap_item top = h[0], x = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && item_less(h[c + 1], h[c])) c++;
        if (!item_less(h[c], x)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = x;
    return top;
}

bool ids_push(int32_t **ids, int64_t *n, int64_t *cap, int32_t id) {
    if (*n == *cap) {
        int64_t c = *cap ? *cap * 2 : 64;
        int32_t *p = realloc(*ids, sizeof *p * (size_t)c);
        if (!p) return false;
        *ids = p, *cap = c;
    }
    (*ids)[(*n)++] = id;
    return true;
}

/* Queues the merge of symbol i with its right neighbour if the pair has one. */
static void queue_pair(const bpe *m, const symbol *sy, int32_t i, heap_item *h, size_t *nh) {
    if (i < 0 || sy[i].next < 0) return;
    uint64_t key = (uint64_t)(uint32_t)sy[i].id << 32 | (uint32_t)sy[sy[i].next].id;
    int32_t k = u64map_get(&m->merges, key);
    if (k >= 0) heap_push(h, nh, (heap_item){m->merge_rank[k], i, m->merge_new[k]});
}

celer_status bpe_word(const bpe *m, const char *w, size_t n, int32_t **ids, int64_t *n_ids,
                      int64_t *cap, celer_error *e) {
    if (n == 0) return CELER_OK;
    if (m->ignore_merges) {
        int32_t id = strmap_get(&m->vocab, w, n);
        if (id >= 0) return ids_push(ids, n_ids, cap, id) ? CELER_OK : error_set(e, CELER_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    celer_status st = CELER_STATUS_OUT_OF_MEMORY;
    /* At most one symbol per byte of a character with its prefix/suffix (byte fallback);
     * the heap gets one entry per initial pair plus at most 2 per merge. */
    size_t max_sy = n * (1 + m->prefix_n) + m->suffix_n;
    symbol *sy = malloc(sizeof *sy * max_sy);
    heap_item *h = malloc(sizeof *h * (3 * max_sy + 1));
    char *tmp = malloc(n + m->prefix_n + m->suffix_n + 1);
    int32_t ns = 0;
    if (!sy || !h || !tmp) goto out;
    int32_t unk_len = -1; /* pending unk symbol length, -1 = none */
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int cl = utf8_next(w + i, n - i, &cp, NULL);
        if (cl == 0) cl = 1; /* words are valid UTF-8; stay safe on a lying input */
        size_t k = 0;
        if (i > 0 && m->prefix) memcpy(tmp, m->prefix, m->prefix_n), k = m->prefix_n;
        memcpy(tmp + k, w + i, (size_t)cl), k += (size_t)cl;
        if (i + (size_t)cl == n && m->suffix) memcpy(tmp + k, m->suffix, m->suffix_n), k += m->suffix_n;
        int32_t id = strmap_get(&m->vocab, tmp, k);
        if (id >= 0) {
            if (unk_len >= 0) sy[ns++] = (symbol){m->unk, -1, -1, (size_t)unk_len}, unk_len = -1;
            sy[ns++] = (symbol){id, -1, -1, (size_t)cl};
        } else {
            bool done = false;
            if (m->byte_fallback) {
                done = true;
                for (size_t b = 0; b < k; b++) done &= m->byte_id[(uint8_t)tmp[b]] >= 0;
                /* As in Hugging Face: the pending unk is not flushed before the bytes. */
                for (size_t b = 0; done && b < k; b++) sy[ns++] = (symbol){m->byte_id[(uint8_t)tmp[b]], -1, -1, 1};
            }
            if (!done && m->unk >= 0) {
                if (unk_len >= 0 && m->fuse_unk) {
                    unk_len += cl;
                } else {
                    if (unk_len >= 0) sy[ns++] = (symbol){m->unk, -1, -1, (size_t)unk_len};
                    unk_len = cl;
                }
            }
        }
        i += (size_t)cl;
    }
    if (unk_len >= 0) sy[ns++] = (symbol){m->unk, -1, -1, (size_t)unk_len};
    for (int32_t i = 0; i < ns; i++) sy[i].prev = i - 1, sy[i].next = i + 1 < ns ? i + 1 : -1;

    size_t nh = 0;
    for (int32_t i = 0; i + 1 < ns; i++) queue_pair(m, sy, i, h, &nh);
    while (nh) {
        heap_item top = heap_pop(h, &nh);
        symbol *a = &sy[top.pos];
        if (a->len == 0 || a->next < 0) continue;
        symbol *b = &sy[a->next];
        uint64_t key = (uint64_t)(uint32_t)a->id << 32 | (uint32_t)b->id;
        int32_t k = u64map_get(&m->merges, key);
        if (k < 0 || m->merge_new[k] != top.new_id) continue; /* stale */
        a->id = top.new_id;
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0) sy[b->next].prev = top.pos;
        queue_pair(m, sy, a->prev, h, &nh);
        queue_pair(m, sy, top.pos, h, &nh);
    }
    for (int32_t i = 0; i < ns; i++)
        if (sy[i].len && !ids_push(ids, n_ids, cap, sy[i].id)) goto out;
    st = CELER_OK;
out:
    free(sy), free(h), free(tmp);
    return st == CELER_OK ? st : error_set(e, st, "out of memory");
}

void bpe_free(bpe *m) {
    free(m->strs), free(m->id_off), free(m->id_len);
    strmap_free(&m->vocab);
    u64map_free(&m->merges);
    free(m->merge_rank), free(m->merge_new), free(m->prefix), free(m->suffix);
    memset(m, 0, sizeof *m);
}

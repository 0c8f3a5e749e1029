/*
 * arena.c - chained blocks, each at least 64 KiB, 64-byte aligned allocations.
 */
#include "base/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_ALIGN 64
#define ARENA_MIN_BLOCK ((size_t)64 * 1024)

struct arena_block {
    arena_block *next;
    size_t cap, used;
    _Alignas(ARENA_ALIGN) unsigned char data[];
};

void *arena_alloc(arena *a, size_t size) {
    size = (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    arena_block *b = a->head;
    if (!b || b->cap - b->used < size) {
        size_t cap = size > ARENA_MIN_BLOCK ? size : ARENA_MIN_BLOCK;
        if (cap > SIZE_MAX - sizeof *b - ARENA_ALIGN) return NULL;
        b = aligned_alloc(ARENA_ALIGN, (sizeof *b + cap + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1));
        if (!b) return NULL;
        b->next = a->head;
        b->cap = cap;
        b->used = 0;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += size;
    a->bytes += size;
    memset(p, 0, size);
    return p;
}

void arena_free(arena *a) {
    while (a->head) {
        arena_block *next = a->head->next;
        free(a->head);
        a->head = next;
    }
    a->bytes = 0;
}

bool arena_block_at(const arena *a, int64_t i, const void **base, size_t *used) {
    const arena_block *b = a->head;
    for (; b && i > 0; i--) b = b->next;
    if (!b || i < 0) return false;
    *base = b->data;
    *used = b->used;
    return true;
}

/*
 * arena.h - a bump allocator for load-time data that lives as long as its owner
 * (norm weights converted to fp32, biases, RoPE tables). Freed all at once.
 */
#ifndef CELER_BASE_ARENA_H
#define CELER_BASE_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct arena_block arena_block;

typedef struct arena {
    arena_block *head;
    size_t bytes; /* total handed out, for memory reports */
} arena;

/* 64-byte aligned, zeroed memory valid until arena_free; NULL when out of memory. */
void *arena_alloc(arena *a, size_t size);
void arena_free(arena *a);

/* Block i of a (0 = the newest): *base and *used bytes handed out from it; false past
 * the last. A backend mirrors an arena block by block. */
bool arena_block_at(const arena *a, int64_t i, const void **base, size_t *used);

#endif

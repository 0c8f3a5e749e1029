/*
 * strmap.h - small open-addressing hash tables for the tokenizer: byte strings to
 * int32 (the vocabulary) and 64-bit keys to an int32 slot (BPE merge pairs).
 *
 * Keys of a strmap are not copied: they must outlive the map (the tokenizer keeps
 * every token string in one buffer). Neither table supports deletion; both grow by
 * doubling at a load factor of 1/2.
 */
#ifndef CELER_TOKENIZER_STRMAP_H
#define CELER_TOKENIZER_STRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct strmap_slot {
    const char *key; /* NULL = empty */
    uint32_t len;
    int32_t value;
} strmap_slot;

typedef struct strmap {
    strmap_slot *slots;
    size_t cap; /* power of two */
    size_t n;
} strmap;

/* Sizes the table for n keys up front (load time, no rehashing); false on OOM. */
bool strmap_reserve(strmap *m, size_t n);
/* Inserts or overwrites key -> value; false on out of memory. */
bool strmap_put(strmap *m, const char *key, size_t len, int32_t value);
/* The value of key, or -1 when absent. */
int32_t strmap_get(const strmap *m, const char *key, size_t len);
void strmap_free(strmap *m);

typedef struct u64map {
    uint64_t *keys; /* UINT64_MAX = empty */
    int32_t *values;
    size_t cap;
    size_t n;
} u64map;

bool u64map_reserve(u64map *m, size_t n);
/* Inserts or overwrites key -> value; false on out of memory. key != UINT64_MAX. */
bool u64map_put(u64map *m, uint64_t key, int32_t value);
int32_t u64map_get(const u64map *m, uint64_t key);
void u64map_free(u64map *m);

#endif

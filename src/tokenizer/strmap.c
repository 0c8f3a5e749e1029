/*
 * strmap.c - the open-addressing tables of strmap.h (linear probing, FNV-1a for
 * strings, a 64-bit mixer for integer keys).
 */
#include "tokenizer/strmap.h"

#include <stdlib.h>
#include <string.h>

static uint64_t hash_bytes(const char *s, size_t len) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static bool strmap_grow_to(strmap *m, size_t cap) {
    strmap_slot *s = calloc(cap, sizeof *s);
    if (!s) return false;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].key) continue;
        size_t j = hash_bytes(m->slots[i].key, m->slots[i].len) & (cap - 1);
        while (s[j].key) j = (j + 1) & (cap - 1);
        s[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = s;
    m->cap = cap;
    return true;
}

static bool strmap_grow(strmap *m) { return strmap_grow_to(m, m->cap ? m->cap * 2 : 64); }

bool strmap_reserve(strmap *m, size_t n) {
    size_t cap = 64;
    while (cap < 2 * n + 2) cap *= 2;
    return cap <= m->cap || strmap_grow_to(m, cap);
}

bool strmap_put(strmap *m, const char *key, size_t len, int32_t value) {
    if ((m->n + 1) * 2 > m->cap && !strmap_grow(m)) return false;
    size_t j = hash_bytes(key, len) & (m->cap - 1);
    while (m->slots[j].key) {
        if (m->slots[j].len == len && !memcmp(m->slots[j].key, key, len)) {
            m->slots[j].value = value;
            return true;
        }
        j = (j + 1) & (m->cap - 1);
    }
    m->slots[j] = (strmap_slot){key, (uint32_t)len, value};
    m->n++;
    return true;
}

int32_t strmap_get(const strmap *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    size_t j = hash_bytes(key, len) & (m->cap - 1);
    while (m->slots[j].key) {
        if (m->slots[j].len == len && !memcmp(m->slots[j].key, key, len)) return m->slots[j].value;
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

void strmap_free(strmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static bool u64map_grow_to(u64map *m, size_t cap) {
    uint64_t *k = malloc(cap * sizeof *k);
    int32_t *v = malloc(cap * sizeof *v);
    if (!k || !v) {
        free(k), free(v);
        return false;
    }
    memset(k, 0xff, cap * sizeof *k);
    for (size_t i = 0; i < m->cap; i++) {
        if (m->keys[i] == UINT64_MAX) continue;
        size_t j = hash_u64(m->keys[i]) & (cap - 1);
        while (k[j] != UINT64_MAX) j = (j + 1) & (cap - 1);
        k[j] = m->keys[i];
        v[j] = m->values[i];
    }
    free(m->keys), free(m->values);
    m->keys = k, m->values = v, m->cap = cap;
    return true;
}

static bool u64map_grow(u64map *m) { return u64map_grow_to(m, m->cap ? m->cap * 2 : 64); }

bool u64map_reserve(u64map *m, size_t n) {
    size_t cap = 64;
    while (cap < 2 * n + 2) cap *= 2;
    return cap <= m->cap || u64map_grow_to(m, cap);
}

bool u64map_put(u64map *m, uint64_t key, int32_t value) {
    if ((m->n + 1) * 2 > m->cap && !u64map_grow(m)) return false;
    size_t j = hash_u64(key) & (m->cap - 1);
    while (m->keys[j] != UINT64_MAX) {
        if (m->keys[j] == key) {
            m->values[j] = value;
            return true;
        }
        j = (j + 1) & (m->cap - 1);
    }
    m->keys[j] = key;
    m->values[j] = value;
    m->n++;
    return true;
}

int32_t u64map_get(const u64map *m, uint64_t key) {
    if (!m->cap) return -1;
    size_t j = hash_u64(key) & (m->cap - 1);
    while (m->keys[j] != UINT64_MAX) {
        if (m->keys[j] == key) return m->values[j];
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

void u64map_free(u64map *m) {
    free(m->keys), free(m->values);
    memset(m, 0, sizeof *m);
}

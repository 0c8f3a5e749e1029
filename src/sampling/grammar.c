/*
 * grammar.c - the grammar matcher and the token mask: a pushdown automaton run over bytes,
 * with every configuration it meets interned and its transitions cached, and a mask that
 * walks the vocabulary's byte trie through that cache.
 *
 * A stack is a persistent list of automaton states, hash-consed: node = (state, parent
 * node), the top node's state being where the next byte is read. A configuration is the
 * sorted set of live top nodes (each a state with byte edges, reached through epsilon
 * moves, calls and returns) plus whether the root rule may end here; configurations are
 * interned to ids, and (configuration, byte class) -> configuration is filled lazily. A
 * second visit of a configuration steps by table lookup, so inside a long string the mask
 * costs one lookup per trie node and the trie walk prunes a subtree at its first dead
 * byte. Nothing recurses over the input: closures use explicit work lists, so a JSON
 * array 10,000 deep is a 10,000-node list, not a deep C stack.
 *
 * Every cache belongs to its matcher (matchers over one grammar run on several threads
 * without locks) and is bounded: past MATCHER_MAX_* the matcher starts afresh from its
 * current configuration. A configuration wider than MATCHER_MAX_WIDTH stacks (a wildly
 * ambiguous grammar) counts as dead rather than growing without bound.
 *
 * Not here: parsing (grammar_parse.c), token strings (the caller's vocabulary), logits.
 */
#include "sampling/grammar_impl.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define NONE              UINT32_MAX
#define MATCHER_MAX_NODES (1u << 21)
#define MATCHER_MAX_CFGS  (1u << 17)
#define MATCHER_MAX_POOL  (1u << 23)
#define MATCHER_MAX_WIDTH (1u << 14)
#define CFG_DEAD          0u /* the empty configuration, interned first */

/* ==== Vocabulary trie ==== */

/* Nodes in depth-first preorder: node i reads byte[i] at depth[i] (1 = first byte), its
 * subtree ends before skip[i], and tok[i] is the first token ending there (tok_next
 * chains tokens with equal bytes). */
struct grammar_vocab {
    int64_t n_vocab;
    uint32_t n_nodes;
    uint8_t *byte;
    uint16_t *depth;
    uint32_t *skip;
    int32_t *tok, *tok_next;
    uint16_t max_depth;
    char *text;       /* every token's bytes */
    size_t *text_off; /* [n_vocab + 1] */
    uint8_t *is_eos;  /* [n_vocab] */
    int32_t *eos;
    int32_t n_eos;
};

typedef struct sort_ctx {
    const char *const *bytes;
    const size_t *len;
} sort_ctx;

static sort_ctx sort_by; /* qsort has no context argument in C11; guarded by sort_lock */

static int cmp_tok(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t lx = sort_by.len[x], ly = sort_by.len[y], l = lx < ly ? lx : ly;
    int c = memcmp(sort_by.bytes[x], sort_by.bytes[y], l);
    if (c) return c;
    return lx < ly ? -1 : lx > ly ? 1 : (x > y) - (x < y);
}

void grammar_vocab_free(grammar_vocab *v) {
    if (!v) return;
    free(v->byte), free(v->depth), free(v->skip), free(v->tok), free(v->tok_next);
    free(v->text), free(v->text_off), free(v->is_eos), free(v->eos);
    free(v);
}

int64_t grammar_vocab_size(const grammar_vocab *v) {
    return v->n_vocab;
}

static pthread_mutex_t sort_lock = PTHREAD_MUTEX_INITIALIZER;

celer_status grammar_vocab_create(const char *const *bytes, const size_t *len, int64_t n_vocab,
                                  const int32_t *eos, int32_t n_eos, grammar_vocab **out,
                                  celer_error *e) {
    *out = NULL;
    if (n_vocab <= 0 || n_vocab > INT32_MAX || n_eos < 0)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "grammar vocabulary: %lld tokens",
                         (long long)n_vocab);
    grammar_vocab *v = calloc(1, sizeof *v);
    int32_t *order = malloc((size_t)n_vocab * sizeof *order);
    uint32_t *path = NULL;
    if (!v || !order) goto oom;
    v->n_vocab = n_vocab;
    v->is_eos = calloc((size_t)n_vocab, 1);
    v->eos = malloc(((size_t)n_eos + 1) * sizeof *v->eos);
    v->text_off = malloc(((size_t)n_vocab + 1) * sizeof *v->text_off);
    v->tok_next = malloc((size_t)n_vocab * sizeof *v->tok_next);
    if (!v->is_eos || !v->eos || !v->text_off || !v->tok_next) goto oom;
    for (int32_t i = 0; i < n_eos; i++) {
        if (eos[i] < 0 || eos[i] >= n_vocab) {
            grammar_vocab_free(v), free(order);
            return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                             "grammar vocabulary: eos id %d is outside %lld tokens", eos[i],
                             (long long)n_vocab);
        }
        v->is_eos[eos[i]] = 1, v->eos[i] = eos[i];
    }
    v->n_eos = n_eos;
    size_t total = 0;
    int64_t n_tok = 0;
    for (int64_t i = 0; i < n_vocab; i++) {
        if (len[i] > 65535) {
            grammar_vocab_free(v), free(order);
            return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                             "grammar vocabulary: token %lld is %zu bytes long (limit 65535)",
                             (long long)i, len[i]);
        }
        v->text_off[i] = total;
        total += len[i];
        v->tok_next[i] = -1;
        if (len[i] && !v->is_eos[i]) order[n_tok++] = (int32_t)i;
    }
    v->text_off[n_vocab] = total;
    v->text = malloc(total + 1);
    if (!v->text) goto oom;
    for (int64_t i = 0; i < n_vocab; i++)
        if (len[i]) memcpy(v->text + v->text_off[i], bytes[i], len[i]);
    pthread_mutex_lock(&sort_lock);
    sort_by = (sort_ctx){bytes, len};
    qsort(order, (size_t)n_tok, sizeof *order, cmp_tok);
    pthread_mutex_unlock(&sort_lock);
    /* nodes: at most the total length */
    size_t cap = total + 1;
    v->byte = malloc(cap), v->depth = malloc(cap * sizeof *v->depth);
    v->skip = malloc(cap * sizeof *v->skip), v->tok = malloc(cap * sizeof *v->tok);
    path = malloc(65537 * sizeof *path);
    if (!v->byte || !v->depth || !v->skip || !v->tok || !path) goto oom;
    uint32_t n = 0;
    size_t depth = 0; /* nodes open on the path: path[0 .. depth) */
    int32_t prev = -1;
    for (int64_t k = 0; k < n_tok; k++) {
        int32_t t = order[k];
        const uint8_t *s = (const uint8_t *)bytes[t];
        size_t lcp = 0;
        if (prev >= 0) {
            const uint8_t *ps = (const uint8_t *)bytes[prev];
            size_t pl = len[prev];
            while (lcp < pl && lcp < len[t] && ps[lcp] == s[lcp]) lcp++;
        }
        while (depth > lcp) v->skip[path[--depth]] = n; /* close what this token leaves */
        if (lcp == len[t]) {                            /* the same bytes as the previous token */
            uint32_t at = path[depth - 1];
            int32_t *link = &v->tok[at];
            while (*link >= 0) link = &v->tok_next[*link];
            *link = t;
        }
        for (size_t d = lcp; d < len[t]; d++) {
            v->byte[n] = s[d], v->depth[n] = (uint16_t)(d + 1), v->tok[n] = -1;
            path[depth++] = n++;
        }
        if (lcp < len[t]) v->tok[n - 1] = t;
        if (len[t] > v->max_depth) v->max_depth = (uint16_t)len[t];
        prev = t;
    }
    while (depth) v->skip[path[--depth]] = n;
    v->n_nodes = n;
    free(path), free(order);
    *out = v;
    return CELER_OK;
oom:
    free(path), free(order);
    grammar_vocab_free(v);
    return error_set(e, CELER_STATUS_OUT_OF_MEMORY,
                     "out of memory building the grammar vocabulary");
}

/* ==== Matcher state ==== */

typedef struct cfg {
    uint32_t off, n; /* nodes cpool[off .. off + n), sorted */
    uint32_t hash;
    uint32_t accept;
} cfg;

struct grammar_matcher {
    const grammar *g;
    const grammar_vocab *v;
    /* nodes: (state, parent), hash-consed in ntab (open addressing, NONE = empty) */
    uint32_t *nstate, *nparent, *ntab, *nmark;
    uint32_t n_nodes, cap_nodes, ntab_mask, stamp;
    /* configurations, hash-consed in ctab; trans[c * n_classes + class] (NONE = unknown) */
    cfg *cfgs;
    uint32_t *cpool, *ctab, *trans;
    uint32_t n_cfgs, cap_cfgs, ctab_mask, n_cpool, cap_cpool;
    /* closure scratch */
    uint32_t *work, *res;
    uint32_t cap_work, cap_res;
    uint32_t *walk; /* [max_depth + 1] configurations along the trie path */
    uint32_t cur;
    bool ended, oom;
};

static uint32_t hash2(uint32_t a, uint32_t b) {
    uint64_t x = ((uint64_t)a << 32 | b) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> 32) ^ (uint32_t)x;
}

static bool grow32(uint32_t **p, uint32_t *cap, uint64_t need) {
    if (need <= *cap) return true;
    uint64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    if (c > UINT32_MAX) return false;
    uint32_t *q = realloc(*p, c * sizeof *q);
    if (!q) return false;
    *p = q, *cap = (uint32_t)c;
    return true;
}

static bool table_rehash(uint32_t **tab, uint32_t *mask, uint32_t n_items, const grammar_matcher *m,
                         bool nodes) {
    uint32_t size = *mask + 1;
    if ((uint64_t)n_items * 2 < size) return true;
    uint32_t ns = size * 2;
    uint32_t *t = malloc((size_t)ns * sizeof *t);
    if (!t) return false;
    memset(t, 0xFF, (size_t)ns * sizeof *t);
    for (uint32_t i = 0; i < n_items; i++) {
        uint32_t h = nodes ? hash2(m->nstate[i], m->nparent[i]) : m->cfgs[i].hash;
        for (uint32_t j = h & (ns - 1);; j = (j + 1) & (ns - 1))
            if (t[j] == NONE) {
                t[j] = i;
                break;
            }
    }
    free(*tab);
    *tab = t, *mask = ns - 1;
    return true;
}

/* The node (state, parent), interned; NONE when out of memory. */
static uint32_t node_get(grammar_matcher *m, uint32_t state, uint32_t parent) {
    uint32_t h = hash2(state, parent);
    for (uint32_t j = h & m->ntab_mask;; j = (j + 1) & m->ntab_mask) {
        uint32_t x = m->ntab[j];
        if (x == NONE) break;
        if (m->nstate[x] == state && m->nparent[x] == parent) return x;
    }
    if (m->n_nodes == m->cap_nodes) {
        uint32_t c = m->cap_nodes;
        if (!grow32(&m->nstate, &c, m->n_nodes + 1ull)) return m->oom = true, NONE;
        c = m->cap_nodes;
        if (!grow32(&m->nparent, &c, m->n_nodes + 1ull)) return m->oom = true, NONE;
        c = m->cap_nodes;
        if (!grow32(&m->nmark, &c, m->n_nodes + 1ull)) return m->oom = true, NONE;
        memset(m->nmark + m->cap_nodes, 0, (size_t)(c - m->cap_nodes) * sizeof *m->nmark);
        m->cap_nodes = c;
    }
    uint32_t id = m->n_nodes++;
    m->nstate[id] = state, m->nparent[id] = parent;
    if (!table_rehash(&m->ntab, &m->ntab_mask, m->n_nodes, m, true)) return m->oom = true, NONE;
    for (uint32_t j = h & m->ntab_mask;; j = (j + 1) & m->ntab_mask)
        if (m->ntab[j] == NONE) {
            m->ntab[j] = id;
            break;
        }
    return id;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The configuration of nodes ids[n] (sorted here, duplicates allowed) and accept. */
static uint32_t cfg_get(grammar_matcher *m, uint32_t *ids, uint32_t n, bool accept) {
    if (n > 1) {
        qsort(ids, n, sizeof *ids, cmp_u32);
        uint32_t k = 1;
        for (uint32_t i = 1; i < n; i++)
            if (ids[i] != ids[k - 1]) ids[k++] = ids[i];
        n = k;
    }
    uint32_t h = accept ? 0x85EBCA6Bu : 0x27D4EB2Fu;
    for (uint32_t i = 0; i < n; i++) h = hash2(h, ids[i]);
    for (uint32_t j = h & m->ctab_mask;; j = (j + 1) & m->ctab_mask) {
        uint32_t x = m->ctab[j];
        if (x == NONE) break;
        const cfg *c = &m->cfgs[x];
        if (c->hash == h && c->n == n && c->accept == accept &&
            !memcmp(m->cpool + c->off, ids, (size_t)n * sizeof *ids))
            return x;
    }
    int nc = m->g->n_classes;
    if (m->n_cfgs == m->cap_cfgs) {
        uint32_t c = m->cap_cfgs ? m->cap_cfgs * 2 : 64;
        cfg *nv = realloc(m->cfgs, (size_t)c * sizeof *nv);
        if (!nv) return m->oom = true, CFG_DEAD;
        m->cfgs = nv;
        uint32_t *t = realloc(m->trans, (size_t)c * (size_t)nc * sizeof *t);
        if (!t) return m->oom = true, CFG_DEAD;
        m->trans = t, m->cap_cfgs = c;
    }
    if (!grow32(&m->cpool, &m->cap_cpool, (uint64_t)m->n_cpool + n)) return m->oom = true, CFG_DEAD;
    uint32_t id = m->n_cfgs++;
    memcpy(m->cpool + m->n_cpool, ids, (size_t)n * sizeof *ids);
    m->cfgs[id] = (cfg){.off = m->n_cpool, .n = n, .hash = h, .accept = accept};
    m->n_cpool += n;
    memset(m->trans + (size_t)id * (size_t)nc, 0xFF, (size_t)nc * sizeof *m->trans);
    if (!table_rehash(&m->ctab, &m->ctab_mask, m->n_cfgs, m, false)) return m->oom = true, CFG_DEAD;
    for (uint32_t j = h & m->ctab_mask;; j = (j + 1) & m->ctab_mask)
        if (m->ctab[j] == NONE) {
            m->ctab[j] = id;
            break;
        }
    return id;
}

/* ==== Closure and steps ==== */

static bool work_push(grammar_matcher *m, uint32_t *top, uint32_t x) {
    if (x == NONE) return false;
    if (m->nmark[x] == m->stamp) return true;
    m->nmark[x] = m->stamp;
    if (!grow32(&m->work, &m->cap_work, *top + 1ull)) return m->oom = true, false;
    m->work[(*top)++] = x;
    return true;
}

/* Follows epsilon moves, calls and returns from the pushed nodes (work[0 .. top)) to the
 * nodes that read a byte; returns the configuration. */
static uint32_t closure(grammar_matcher *m, uint32_t top) {
    const grammar *g = m->g;
    uint32_t n_res = 0;
    bool accept = false;
    while (top) {
        uint32_t x = m->work[--top];
        uint32_t s = m->nstate[x], par = m->nparent[x];
        if (g->flags[s] & GSTATE_BYTES) {
            if (n_res >= MATCHER_MAX_WIDTH) return CFG_DEAD;
            if (!grow32(&m->res, &m->cap_res, n_res + 1ull)) return m->oom = true, CFG_DEAD;
            m->res[n_res++] = x;
        }
        if (g->flags[s] & GSTATE_END) {
            if (par == NONE)
                accept = true;
            else if (!work_push(m, &top, par) && m->oom)
                return CFG_DEAD;
        }
        for (uint32_t i = g->edge_start[s]; i < g->edge_start[s + 1]; i++) {
            const gedge *ed = &g->edges[i];
            uint32_t y;
            if (ed->kind == GE_EPS)
                y = node_get(m, ed->to, par);
            else if (ed->kind == GE_CALL) {
                uint32_t ret = node_get(m, ed->to, par);
                y = ret == NONE ? NONE : node_get(m, g->rules[ed->rule].start, ret);
            } else
                continue;
            if (!work_push(m, &top, y) && m->oom) return CFG_DEAD;
        }
    }
    return cfg_get(m, m->res, n_res, accept);
}

static uint32_t step_slow(grammar_matcher *m, uint32_t c, int cls) {
    const grammar *g = m->g;
    uint8_t b = g->class_byte[cls];
    m->stamp++;
    uint32_t top = 0;
    for (uint32_t i = 0; i < m->cfgs[c].n; i++) {
        uint32_t x = m->cpool[m->cfgs[c].off + i];
        uint32_t s = m->nstate[x];
        for (uint32_t k = g->edge_start[s]; k < g->edge_start[s + 1]; k++) {
            const gedge *ed = &g->edges[k];
            if (ed->kind == GE_BYTE && ed->lo <= b && b <= ed->hi &&
                !work_push(m, &top, node_get(m, ed->to, m->nparent[x])) && m->oom)
                return CFG_DEAD;
        }
    }
    uint32_t r = top ? closure(m, top) : CFG_DEAD;
    m->trans[(size_t)c * (size_t)g->n_classes + (size_t)cls] = r;
    return r;
}

static inline uint32_t step(grammar_matcher *m, uint32_t c, uint8_t byte) {
    int cls = m->g->byte_class[byte];
    uint32_t r = m->trans[(size_t)c * (size_t)m->g->n_classes + (size_t)cls];
    return r != NONE ? r : step_slow(m, c, cls);
}

/* ==== Lifetime ==== */

static void matcher_release(grammar_matcher *m) {
    free(m->nstate), free(m->nparent), free(m->ntab), free(m->nmark);
    free(m->cfgs), free(m->cpool), free(m->ctab), free(m->trans);
    free(m->work), free(m->res), free(m->walk);
}

void grammar_matcher_free(grammar_matcher *m) {
    if (!m) return;
    matcher_release(m);
    free(m);
}

/* Empty stores holding only the dead configuration; false when out of memory. */
static bool matcher_init(grammar_matcher *m, const grammar *g, const grammar_vocab *v) {
    memset(m, 0, sizeof *m);
    m->g = g, m->v = v;
    m->ntab = malloc(64 * sizeof *m->ntab);
    m->ctab = malloc(64 * sizeof *m->ctab);
    m->walk = malloc(((size_t)v->max_depth + 1) * sizeof *m->walk);
    if (!m->ntab || !m->ctab || !m->walk) return false;
    memset(m->ntab, 0xFF, 64 * sizeof *m->ntab);
    memset(m->ctab, 0xFF, 64 * sizeof *m->ctab);
    m->ntab_mask = m->ctab_mask = 63;
    return cfg_get(m, NULL, 0, false) == CFG_DEAD && !m->oom;
}

/* The configuration c of src rebuilt in dst's stores (sharing restored by hash-consing). */
static uint32_t cfg_import(grammar_matcher *dst, const grammar_matcher *src, uint32_t c) {
    uint32_t *memo = malloc(((size_t)src->n_nodes + 1) * sizeof *memo);
    uint32_t *path = NULL, *ids = NULL, cap_path = 0;
    const cfg *cf = &src->cfgs[c];
    ids = malloc(((size_t)cf->n + 1) * sizeof *ids);
    uint32_t r = CFG_DEAD;
    if (!memo || !ids) goto out;
    memset(memo, 0xFF, ((size_t)src->n_nodes + 1) * sizeof *memo);
    for (uint32_t i = 0; i < cf->n; i++) {
        uint32_t x = src->cpool[cf->off + i], n = 0;
        for (uint32_t y = x; y != NONE && memo[y] == NONE; y = src->nparent[y]) {
            if (!grow32(&path, &cap_path, n + 1ull)) goto out;
            path[n++] = y;
        }
        while (n--) {
            uint32_t y = path[n], par = src->nparent[y];
            memo[y] = node_get(dst, src->nstate[y], par == NONE ? NONE : memo[par]);
            if (memo[y] == NONE) goto out;
        }
        ids[i] = memo[x];
    }
    r = cfg_get(dst, ids, cf->n, cf->accept);
out:
    if (r == CFG_DEAD && cf->n + cf->accept) dst->oom = true;
    free(memo), free(path), free(ids);
    return r;
}

grammar_matcher *grammar_matcher_create(const grammar *g, const grammar_vocab *v) {
    grammar_matcher *m = malloc(sizeof *m);
    if (!m) return NULL;
    if (!matcher_init(m, g, v)) goto fail;
    m->stamp++;
    uint32_t top = 0;
    if (!work_push(m, &top, node_get(m, g->rules[g->root].start, NONE))) goto fail;
    m->cur = closure(m, top);
    if (m->oom) goto fail;
    return m;
fail:
    grammar_matcher_free(m);
    return NULL;
}

grammar_matcher *grammar_matcher_clone(const grammar_matcher *src) {
    grammar_matcher *m = malloc(sizeof *m);
    if (!m) return NULL;
    if (!matcher_init(m, src->g, src->v)) goto fail;
    m->cur = cfg_import(m, src, src->cur);
    m->ended = src->ended;
    if (m->oom) goto fail;
    return m;
fail:
    grammar_matcher_free(m);
    return NULL;
}

/* Bounds the caches: past a limit, start afresh from the current configuration. */
static void matcher_trim(grammar_matcher *m) {
    if (m->n_nodes < MATCHER_MAX_NODES && m->n_cfgs < MATCHER_MAX_CFGS &&
        m->n_cpool < MATCHER_MAX_POOL && !m->oom)
        return;
    grammar_matcher fresh;
    if (!matcher_init(&fresh, m->g, m->v)) {
        matcher_release(&fresh);
        return;
    }
    fresh.cur = cfg_import(&fresh, m, m->cur);
    if (fresh.oom) {
        matcher_release(&fresh);
        return;
    }
    fresh.ended = m->ended;
    matcher_release(m);
    *m = fresh;
}

/* ==== Public operations ==== */

bool grammar_matcher_accept_bytes(grammar_matcher *m, const char *s, size_t n) {
    if (m->ended) return false;
    matcher_trim(m);
    uint32_t c = m->cur;
    for (size_t i = 0; i < n && c != CFG_DEAD; i++) c = step(m, c, (uint8_t)s[i]);
    if (c == CFG_DEAD) return false;
    m->cur = c;
    return true;
}

bool grammar_matcher_accept_token(grammar_matcher *m, int32_t id) {
    const grammar_vocab *v = m->v;
    if (m->ended || id < 0 || id >= v->n_vocab) return false;
    if (v->is_eos[id]) {
        if (!m->cfgs[m->cur].accept) return false;
        m->ended = true;
        return true;
    }
    size_t a = v->text_off[id], b = v->text_off[id + 1];
    if (a == b) return false;
    return grammar_matcher_accept_bytes(m, v->text + a, b - a);
}

bool grammar_matcher_can_end(const grammar_matcher *m) {
    return !m->ended && m->cfgs[m->cur].accept;
}

bool grammar_matcher_must_end(const grammar_matcher *m) {
    return m->ended || (m->cfgs[m->cur].accept && m->cfgs[m->cur].n == 0);
}

bool grammar_matcher_mask(grammar_matcher *m, uint32_t *allowed) {
    const grammar_vocab *v = m->v;
    memset(allowed, 0, (size_t)((v->n_vocab + 31) / 32) * sizeof *allowed);
    if (m->ended) return false;
    matcher_trim(m);
    const grammar *g = m->g;
    const uint8_t *byte = v->byte, *cls = g->byte_class;
    const uint16_t *depth = v->depth;
    const int nc = g->n_classes;
    uint32_t *walk = m->walk;
    bool any = false;
    walk[0] = m->cur;
    if (m->cfgs[m->cur].n) {
        /* Performance: this loop is the mask. One cached lookup per trie node; a dead byte
         * skips its whole subtree. */
        for (uint32_t i = 0; i < v->n_nodes;) {
            uint32_t c = walk[depth[i] - 1];
            uint32_t nx = m->trans[(size_t)c * (size_t)nc + cls[byte[i]]];
            if (nx == NONE) nx = step_slow(m, c, cls[byte[i]]);
            if (nx == CFG_DEAD) {
                i = v->skip[i];
                continue;
            }
            walk[depth[i]] = nx;
            for (int32_t t = v->tok[i]; t >= 0; t = v->tok_next[t]) {
                allowed[t >> 5] |= 1u << (t & 31);
                any = true;
            }
            i++;
        }
    }
    if (m->cfgs[m->cur].accept)
        for (int32_t i = 0; i < v->n_eos; i++) {
            allowed[v->eos[i] >> 5] |= 1u << (v->eos[i] & 31);
            any = true;
        }
    return any;
}

/*
 * sampling.c - greedy selection and the sampling chain described in sampling.h.
 */
#include "sampling/sampling.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* The largest value, NaN skipped, then its first index. The first pass keeps 8 running
 * maxima (l > m ? l : m is one packed max instruction, and 8 lanes keep the compares
 * independent): a 128k vocabulary row takes a few tens of microseconds instead of the
 * half millisecond of one compare-and-branch chain, which a server step pays per stream. */
int32_t sampling_argmax(const float *logits, int64_t n) {
    enum { LANES = 8 };
    float m[LANES];
    for (int k = 0; k < LANES; k++) m[k] = -INFINITY;
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) m[k] = logits[i + k] > m[k] ? logits[i + k] : m[k];
    for (; i < n; i++) m[0] = logits[i] > m[0] ? logits[i] : m[0];
    float mx = m[0];
    for (int k = 1; k < LANES; k++) mx = m[k] > mx ? m[k] : mx;
    for (i = 0; i < n; i++)
        if (logits[i] == mx) return (int32_t)i;
    return (int32_t)(n > 0 ? n - 1 : 0); /* every value NaN */
}

typedef struct candidate {
    int32_t id;
    float v; /* logit, then probability */
} candidate;

struct sampler {
    sampler_params p;
    int64_t n_vocab;
    candidate *cand;  /* [n_vocab] */
    int32_t *history; /* ring of repeat_last_n */
    int64_t n_hist, hist_pos;
    uint64_t rng[4];
};

sampler_params sampler_default_params(void) {
    return (sampler_params){.temp = 0.8f,
                            .top_k = 40,
                            .top_p = 0.95f,
                            .min_p = 0.05f,
                            .repeat_penalty = 1.0f,
                            .repeat_last_n = 64,
                            .seed = 0};
}

/* ==== xoshiro256**, seeded by splitmix64 ==== */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(uint64_t *s) {
    const uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 bits. */
static double rng_uniform(uint64_t *s) {
    return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

void sampler_reset(sampler *s) {
    uint64_t x = s->p.seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    s->n_hist = s->hist_pos = 0;
}

sampler *sampler_create(const sampler_params *p, int64_t n_vocab) {
    sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = *p;
    if (s->p.repeat_last_n < 0) s->p.repeat_last_n = 0;
    s->n_vocab = n_vocab;
    s->cand = malloc(sizeof *s->cand * (size_t)n_vocab);
    s->history = malloc(sizeof *s->history * (size_t)(s->p.repeat_last_n ? s->p.repeat_last_n : 1));
    if (!s->cand || !s->history) {
        sampler_destroy(s);
        return NULL;
    }
    sampler_reset(s);
    return s;
}

void sampler_destroy(sampler *s) {
    if (!s) return;
    free(s->cand);
    free(s->history);
    free(s);
}

void sampler_accept(sampler *s, int32_t tok) {
    if (!s->p.repeat_last_n) return;
    s->history[s->hist_pos] = tok;
    s->hist_pos = (s->hist_pos + 1) % s->p.repeat_last_n;
    if (s->n_hist < s->p.repeat_last_n) s->n_hist++;
}

static int cmp_desc(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id - y->id;
}

/* Loads the candidates with penalized logits. */
static void load(sampler *s, const float *logits) {
    for (int64_t i = 0; i < s->n_vocab; i++) s->cand[i] = (candidate){(int32_t)i, logits[i]};
    if (s->p.repeat_penalty == 1.0f) return;
    for (int64_t h = 0; h < s->n_hist; h++) {
        const int32_t t = s->history[h];
        if (t < 0 || t >= s->n_vocab) continue;
        /* A token seen twice is penalized once, as llama.cpp does: mark it. */
        bool seen = false;
        for (int64_t k = 0; k < h && !seen; k++) seen = s->history[k] == t;
        if (seen) continue;
        float *v = &s->cand[t].v;
        *v = *v > 0 ? *v / s->p.repeat_penalty : *v * s->p.repeat_penalty;
    }
}

/* Restores the min-heap (by cmp_desc, so the root is the worst kept) below i. */
static void sift_down(candidate *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t w = i, l = 2 * i + 1, r = l + 1;
        if (l < n && cmp_desc(&h[l], &h[w]) > 0) w = l;
        if (r < n && cmp_desc(&h[r], &h[w]) > 0) w = r;
        if (w == i) return;
        candidate t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Keeps the k best candidates at the front, sorted best first: a heap of k over the
 * rest, O(n log k), then a sort of the k. */
static int64_t keep_top(candidate *c, int64_t n, int64_t k) {
    if (k <= 0 || k >= n) {
        qsort(c, (size_t)n, sizeof *c, cmp_desc);
        return n;
    }
    for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(c, k, i);
    for (int64_t i = k; i < n; i++)
        if (cmp_desc(&c[i], &c[0]) < 0) {
            c[0] = c[i];
            sift_down(c, k, 0);
        }
    qsort(c, (size_t)k, sizeof *c, cmp_desc);
    return k;
}

/* Moves the candidates c[from, n) whose probability is at least floor to the front of that
 * range (in no order); returns the end of them, and adds their probability to *mass. */
static int64_t gather_above(candidate *c, int64_t from, int64_t n, float floor, double *mass) {
    int64_t k = from;
    for (int64_t i = from; i < n; i++)
        if (c[i].v >= floor) {
            *mass += c[i].v;
            const candidate t = c[k];
            c[k++] = c[i];
            c[i] = t;
        }
    return k;
}

/* Runs the chain; leaves c[0..n) as (id, probability), summing to 1, and returns n. The
 * first *sorted of them are the most likely in descending order; the rest, when there are
 * any, follow in no order. Without top-k the probabilities come from one pass over the
 * vocabulary, and only as much of the list is sorted as top-p, min-p and the draw need:
 * the candidates above a probability floor, lowered until they hold that mass. Tokens above
 * a floor all precede those below it in the sorted order, so that head is exactly the
 * sorted list's head. need: the probability mass the sorted head must hold for a draw, or
 * a negative value to sort the whole list. */
static int64_t filter(sampler *s, const float *logits, double need, int64_t *sorted) {
    load(s, logits);
    candidate *c = s->cand;
    int64_t n = s->n_vocab;
    if (s->p.temp <= 0.0f) {
        int64_t best = 0;
        for (int64_t i = 1; i < n; i++)
            if (c[i].v > c[best].v || c[best].v != c[best].v) best = i;
        c[0] = (candidate){c[best].id, 1.0f};
        return *sorted = 1;
    }
    const bool top_k = s->p.top_k > 0 && s->p.top_k < n;
    if (top_k) n = keep_top(c, n, s->p.top_k);
    /* softmax at temperature: each weight once in float, their sum in double */
    const float inv_t = 1.0f / s->p.temp;
    float mx = c[0].v;
    for (int64_t i = 1; !top_k && i < n; i++) mx = c[i].v > mx ? c[i].v : mx;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += c[i].v = expf((c[i].v - mx) * inv_t);
    const float scale = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) c[i].v *= scale;
    int64_t head = n;
    if (!top_k) {
        /* the mass the sorted head must hold: the nucleus, the tokens min-p keeps, or the draw */
        const float top = (float)(1.0 / sum);
        double cover = s->p.top_p < 1.0f ? s->p.top_p : need < 0 ? 2.0 : need;
        float floor = top * 0.05f;
        if (s->p.top_p >= 1.0f && s->p.min_p > 0.0f) floor = s->p.min_p * top, cover = 0;
        double mass = 0;
        head = 0;
        for (;;) {
            head = gather_above(c, head, n, floor, &mass);
            if (mass >= cover || head == n) break;
            floor = floor > 1e-30f ? floor * 0.01f : 0.0f;
        }
        qsort(c, (size_t)head, sizeof *c, cmp_desc);
    }
    if (s->p.top_p < 1.0f) {
        double cum = 0;
        for (int64_t i = 0; i < head; i++) {
            cum += c[i].v;
            if (cum >= s->p.top_p) {
                n = head = i + 1;
                break;
            }
        }
    }
    if (s->p.min_p > 0.0f) {
        const float floor = s->p.min_p * c[0].v;
        int64_t keep = 1;
        while (keep < head && c[keep].v >= floor) keep++;
        n = head = keep;
    }
    double total = 0;
    for (int64_t i = 0; i < n; i++) total += c[i].v;
    for (int64_t i = 0; i < n; i++) c[i].v = (float)(c[i].v / total);
    *sorted = head;
    return n;
}

int64_t sampler_distribution(sampler *s, const float *logits, int32_t *ids, float *probs) {
    int64_t sorted;
    const int64_t n = filter(s, logits, -1.0, &sorted);
    for (int64_t i = 0; i < n; i++) {
        ids[i] = s->cand[i].id;
        probs[i] = s->cand[i].v;
    }
    return n;
}

int32_t sampler_sample(sampler *s, const float *logits) {
    if (s->p.temp <= 0.0f && s->p.repeat_penalty == 1.0f)
        return sampling_argmax(logits, s->n_vocab);
    const double u = rng_uniform(s->rng);
    int64_t sorted;
    const int64_t n = filter(s, logits, u, &sorted);
    /* the first token of the sorted list whose cumulative probability passes u */
    double cum = 0;
    for (int64_t i = 0; i < sorted; i++) {
        cum += s->cand[i].v;
        if (u < cum) return s->cand[i].id;
    }
    if (sorted < n) { /* rounding left u past the head: the rest, in order */
        qsort(s->cand + sorted, (size_t)(n - sorted), sizeof *s->cand, cmp_desc);
        for (int64_t i = sorted; i < n; i++) {
            cum += s->cand[i].v;
            if (u < cum) return s->cand[i].id;
        }
    }
    return s->cand[n - 1].id;
}

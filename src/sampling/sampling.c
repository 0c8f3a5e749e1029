/*
 * sampling.c - greedy selection and the sampling chain described in sampling.h.
 */
#include "sampling/sampling.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

enum { LANES = 8 };

/* The largest of x[n], NaN skipped (-inf when there is none). It keeps 8 running maxima
 * (x > m ? x : m is one packed max instruction, and 8 lanes keep the compares independent):
 * a 128k vocabulary row takes a few tens of microseconds instead of the half millisecond of
 * one compare-and-branch chain, which a server step pays per stream. */
static float max_value(const float *x, int64_t n) {
    float m[LANES];
    for (int k = 0; k < LANES; k++) m[k] = -INFINITY;
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
    for (; i < n; i++) m[0] = x[i] > m[0] ? x[i] : m[0];
    float mx = m[0];
    for (int k = 1; k < LANES; k++) mx = m[k] > mx ? m[k] : mx;
    return mx;
}

/* The index of the largest value, NaN skipped, the first of equal maxima. */
int32_t sampling_argmax(const float *logits, int64_t n) {
    const float mx = max_value(logits, n);
    for (int64_t i = 0; i < n; i++)
        if (logits[i] == mx) return (int32_t)i;
    return (int32_t)(n > 0 ? n - 1 : 0); /* every value NaN */
}

/* w[8] = e^((x[8] - mx) * inv_t), 0 where that exponent is below -30 (and for NaN or -inf);
 * returns their sum. Cephes' expf: e^t = 2^k e^r with k = round(t / ln 2), |r| <= ln 2 / 2, a
 * degree-6 polynomial of r, and 2^k written into the exponent bits; within 2 ulp of expf.
 * Plain float arithmetic over 8 lanes, which the compiler packs into vector instructions: a
 * vocabulary's weights cost a tenth of one expf call each. */
static float weights8(float *restrict w, const float *restrict x, float mx, float inv_t) {
    float t[LANES], r[LANES], sum = 0;
    int32_t k[LANES], keep[LANES];
    for (int j = 0; j < LANES; j++) {
        const float e = (x[j] - mx) * inv_t;
        keep[j] = -(e > -30.0f);
        t[j] = e > -30.0f ? e : -30.0f;
    }
    for (int j = 0; j < LANES; j++) {
        k[j] = (int32_t)(t[j] * 1.44269504f - 0.5f); /* t <= 0: truncation rounds */
        const float kf = (float)k[j];
        r[j] = t[j] - kf * 0.693359375f + kf * 2.12194440e-4f;
    }
    for (int j = 0; j < LANES; j++) {
        const float z = r[j];
        float p = 1.9875691500e-4f;
        p = p * z + 1.3981999507e-3f;
        p = p * z + 8.3334519073e-3f;
        p = p * z + 4.1665795894e-2f;
        p = p * z + 1.6666665459e-1f;
        p = p * z + 5.0000001201e-1f;
        p = p * z * z + z + 1.0f;
        const int32_t bits = (int32_t)((uint32_t)(k[j] + 127) << 23) & keep[j];
        float scale;
        memcpy(&scale, &bits, sizeof scale);
        w[j] = p * scale;
    }
    for (int j = 0; j < LANES; j++) sum += w[j];
    return sum;
}

typedef struct candidate {
    int32_t id;
    float v; /* logit, then probability */
} candidate;

struct sampler {
    sampler_params p;
    int64_t n_vocab;
    candidate *cand;  /* [n_vocab] */
    float *w;         /* [n_vocab] weights relative to the top token's, without top-k */
    float *pen;       /* [n_vocab] logits after the repetition penalty, or NULL (none) */
    float floor_left; /* the tokens under this weight were left out of the sorted head */
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
    s->w = malloc(sizeof *s->w * (size_t)n_vocab);
    if (s->p.repeat_penalty != 1.0f) s->pen = malloc(sizeof *s->pen * (size_t)n_vocab);
    s->history = malloc(sizeof *s->history * (size_t)(s->p.repeat_last_n ? s->p.repeat_last_n : 1));
    if (!s->cand || !s->history || !s->w || (s->p.repeat_penalty != 1.0f && !s->pen)) {
        sampler_destroy(s);
        return NULL;
    }
    sampler_reset(s);
    return s;
}

void sampler_destroy(sampler *s) {
    if (!s) return;
    free(s->cand);
    free(s->w);
    free(s->pen);
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

/* The logits after the repetition penalty: logits itself without one, else s->pen. */
static const float *penalized(sampler *s, const float *logits) {
    if (s->p.repeat_penalty == 1.0f) return logits;
    memcpy(s->pen, logits, sizeof *s->pen * (size_t)s->n_vocab);
    for (int64_t h = 0; h < s->n_hist; h++) {
        const int32_t t = s->history[h];
        if (t < 0 || t >= s->n_vocab) continue;
        /* A token seen twice is penalized once, as llama.cpp does: mark it. */
        bool seen = false;
        for (int64_t k = 0; k < h && !seen; k++) seen = s->history[k] == t;
        if (seen) continue;
        float *v = &s->pen[t];
        *v = *v > 0 ? *v / s->p.repeat_penalty : *v * s->p.repeat_penalty;
    }
    return s->pen;
}

/* The candidates of every id from x[n_vocab]. */
static void load(sampler *s, const float *x) {
    for (int64_t i = 0; i < s->n_vocab; i++) s->cand[i] = (candidate){(int32_t)i, x[i]};
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

/* Appends to c[*at...] the ids whose weight w lies in [lo, hi), adding their weights to
 * *mass. */
static void gather(candidate *c, int64_t *at, const float *w, int64_t n, float lo, float hi,
                   double *mass) {
    for (int64_t i = 0; i < n; i++)
        if (w[i] >= lo && w[i] < hi) {
            c[(*at)++] = (candidate){(int32_t)i, w[i]};
            *mass += w[i];
        }
}

/* Runs the chain; leaves c[0..n) as (id, weight) and returns n; the weights sum to *total,
 * so a token's probability is its weight / *total. The first *sorted of them are the most
 * likely in descending order; the rest, when there are any, follow in no order. Without
 * top-k the weights come from one pass over the vocabulary, relative to the top token's
 * (1), and only as much of the list is sorted as top-p, min-p and the draw need: the
 * candidates above a weight floor, lowered until they hold that mass. Tokens above a floor
 * all precede those below it in the sorted order, so that head is exactly the sorted list's
 * head. A token more than 30 nats below the top (its weight under 1e-13) counts as 0: with a
 * vocabulary of 128k ids such tokens hold under 2e-8 of the mass. need: the probability mass
 * the sorted head must hold for a draw, or a negative value to sort the whole list. */
static int64_t filter(sampler *s, const float *logits, double need, int64_t *sorted,
                      double *total) {
    const float *x = penalized(s, logits);
    candidate *c = s->cand;
    int64_t n = s->n_vocab, head = n;
    if (s->p.temp <= 0.0f) {
        c[0] = (candidate){sampling_argmax(x, n), 1.0f};
        *total = 1;
        return *sorted = 1;
    }
    const bool top_k = s->p.top_k > 0 && s->p.top_k < n;
    const float inv_t = 1.0f / s->p.temp;
    double sum = 0;
    if (top_k) {
        load(s, x);
        n = head = keep_top(c, n, s->p.top_k);
        const float mx = c[0].v;
        for (int64_t i = 0; i < n; i++) {
            const float e = (c[i].v - mx) * inv_t;
            sum += c[i].v = e > -30.0f ? expf(e) : 0.0f;
        }
    } else {
        /* every weight, 8 at a time (the last block padded with -inf, weight 0) */
        const float mx = max_value(x, n);
        int64_t i = 0;
        for (; i + LANES <= n; i += LANES) sum += weights8(s->w + i, x + i, mx, inv_t);
        if (i < n) {
            float pad[LANES], pw[LANES];
            for (int j = 0; j < LANES; j++) pad[j] = i + j < n ? x[i + j] : -INFINITY;
            sum += weights8(pw, pad, mx, inv_t);
            memcpy(s->w + i, pw, sizeof *pw * (size_t)(n - i));
        }
        /* the mass the sorted head must hold: the nucleus, the tokens min-p keeps, or the draw */
        double cover = (s->p.top_p < 1.0f ? s->p.top_p : need < 0 ? 2.0 : need) * sum, mass = 0;
        float floor = 0.05f, above = INFINITY;
        if (s->p.top_p >= 1.0f && s->p.min_p > 0.0f) floor = s->p.min_p, cover = 0;
        head = 0;
        for (;;) {
            gather(c, &head, s->w, n, floor, above, &mass);
            if (mass >= cover || floor == 0.0f) break;
            above = floor;
            floor = floor > 1e-30f ? floor * 0.01f : 0.0f;
        }
        s->floor_left = floor;
        qsort(c, (size_t)head, sizeof *c, cmp_desc);
    }
    *total = sum;
    if (s->p.top_p < 1.0f) {
        double cum = 0;
        for (int64_t i = 0; i < head; i++) {
            cum += c[i].v;
            if (cum >= s->p.top_p * sum) {
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
    if (n < s->n_vocab || top_k) { /* the kept tokens' own sum */
        *total = 0;
        for (int64_t i = 0; i < n; i++) *total += c[i].v;
    }
    *sorted = head;
    return n;
}

int64_t sampler_distribution(sampler *s, const float *logits, int32_t *ids, float *probs) {
    int64_t sorted;
    double total;
    const int64_t n = filter(s, logits, -1.0, &sorted, &total);
    for (int64_t i = 0; i < n; i++) {
        ids[i] = s->cand[i].id;
        probs[i] = (float)(s->cand[i].v / total);
    }
    return n;
}

int32_t sampler_sample(sampler *s, const float *logits) {
    if (s->p.temp <= 0.0f && s->p.repeat_penalty == 1.0f)
        return sampling_argmax(logits, s->n_vocab);
    const double u = rng_uniform(s->rng);
    int64_t sorted;
    double total;
    const int64_t n = filter(s, logits, u, &sorted, &total);
    /* the first token of the sorted list whose cumulative probability passes u */
    const double at = u * total;
    double cum = 0;
    for (int64_t i = 0; i < sorted; i++) {
        cum += s->cand[i].v;
        if (at < cum) return s->cand[i].id;
    }
    if (sorted < n) { /* rounding left u past the head: the rest, in order */
        double ignored = 0;
        int64_t at = sorted;
        gather(s->cand, &at, s->w, s->n_vocab, 0.0f, s->floor_left, &ignored);
        qsort(s->cand + sorted, (size_t)(n - sorted), sizeof *s->cand, cmp_desc);
        for (int64_t i = sorted; i < n; i++) {
            cum += s->cand[i].v;
            if (at < cum) return s->cand[i].id;
        }
    }
    return s->cand[n - 1].id;
}

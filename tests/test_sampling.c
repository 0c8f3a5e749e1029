/*
 * test_sampling.c - the sampling chain on float logits: argmax ties, the distribution
 * left by top-k / top-p / min-p at a temperature (against a double-precision
 * computation), the repetition penalty, draws that follow the distribution, and seeded
 * reproducibility.
 */
#include "harness.h"

#include "sampling/sampling.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define V 37

static float logits[V];

static sampler_params params(float temp, int top_k, float top_p, float min_p) {
    sampler_params p = sampler_default_params();
    p.temp = temp, p.top_k = top_k, p.top_p = top_p, p.min_p = min_p, p.repeat_penalty = 1.0f,
    p.seed = 7;
    return p;
}

/* Reference: softmax at temperature over all V, descending order. */
static void reference(float temp, int32_t *ids, double *probs) {
    for (int i = 0; i < V; i++) ids[i] = i;
    for (int i = 0; i < V; i++)
        for (int j = i + 1; j < V; j++)
            if (logits[ids[j]] > logits[ids[i]]) {
                int32_t t = ids[i];
                ids[i] = ids[j], ids[j] = t;
            }
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)logits[ids[i]] / temp);
    for (int i = 0; i < V; i++) probs[i] = exp((double)logits[ids[i]] / temp) / sum;
}

static void check_filters(void) {
    int32_t rid[V], ids[V];
    double rp[V];
    float probs[V];
    reference(0.7f, rid, rp);

    sampler_params p = params(0.7f, 5, 1.0f, 0.0f);
    sampler *s = sampler_create(&p, V);
    int64_t n = sampler_distribution(s, logits, ids, probs);
    double diff = 0, z = 0;
    for (int i = 0; i < 5; i++) z += rp[i];
    for (int i = 0; i < 5 && n == 5; i++)
        diff = fmax(diff, fabs(probs[i] - rp[i] / z) + (ids[i] != rid[i]));
    CHECK(n == 5 && diff < 1e-6, "top-k 5: %lld kept, max diff %g", (long long)n, diff);
    sampler_destroy(s);

    p = params(0.7f, 0, 0.6f, 0.0f);
    s = sampler_create(&p, V);
    n = sampler_distribution(s, logits, ids, probs);
    int64_t want = 0;
    for (double cum = 0; want < V && cum < 0.6; want++) cum += rp[want];
    z = 0;
    for (int64_t i = 0; i < want; i++) z += rp[i];
    diff = 0;
    for (int64_t i = 0; i < n && n == want; i++)
        diff = fmax(diff, fabs(probs[i] - rp[i] / z) + (ids[i] != rid[i]));
    CHECK(n == want && diff < 1e-6, "top-p 0.6: %lld kept (expected %lld), diff %g", (long long)n,
          (long long)want, diff);
    sampler_destroy(s);

    p = params(0.7f, 0, 1.0f, 0.2f);
    s = sampler_create(&p, V);
    n = sampler_distribution(s, logits, ids, probs);
    want = 0;
    while (want < V && rp[want] >= 0.2 * rp[0]) want++;
    CHECK(n == want, "min-p 0.2: %lld kept (expected %lld)", (long long)n, (long long)want);
    sampler_destroy(s);

    p = params(0.0f, 0, 1.0f, 0.0f);
    s = sampler_create(&p, V);
    CHECK(sampler_sample(s, logits) == rid[0], "temp 0 is the argmax");
    sampler_destroy(s);
}

static void check_penalty(void) {
    int32_t rid[V];
    double rp[V];
    reference(1.0f, rid, rp);
    sampler_params p = params(0.0f, 0, 1.0f, 0.0f);
    p.repeat_penalty = 1e6f;
    p.repeat_last_n = 4;
    sampler *s = sampler_create(&p, V);
    CHECK(sampler_sample(s, logits) == rid[0], "no history: argmax");
    sampler_accept(s, rid[0]);
    CHECK(sampler_sample(s, logits) == rid[1], "a penalized top token gives way to the second");
    for (int i = 0; i < 4; i++) sampler_accept(s, rid[5]); /* pushes rid[0] out of the window */
    CHECK(sampler_sample(s, logits) == rid[0], "the penalty looks only at the last 4 tokens");
    sampler_destroy(s);
}

/* Draws without top-k sort only the head of the list that the draw, top-p or min-p needs
 * (sampling.c, filter): their frequencies must still follow the whole distribution, which
 * at temperature 1 puts a good share of draws past the first head. */
static void check_head_draws(float temp, float top_p, float min_p) {
    sampler_params p = params(temp, 0, top_p, min_p);
    sampler *a = sampler_create(&p, V);
    int32_t ids[V];
    float probs[V];
    const int64_t n = sampler_distribution(a, logits, ids, probs);
    int counts[V] = {0};
    const int draws = 40000;
    for (int i = 0; i < draws; i++) counts[sampler_sample(a, logits)]++;
    double worst = 0;
    int outside = draws;
    for (int64_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)counts[ids[i]] / draws - probs[i]));
        outside -= counts[ids[i]];
    }
    CHECK(outside == 0 && worst < 0.01,
          "temp %.1f top-p %.2f min-p %.2f: draws follow the distribution of %lld tokens (max freq "
          "error %.4f, %d outside)",
          temp, top_p, min_p, (long long)n, worst, outside);
    sampler_destroy(a);
}

static void check_draws(void) {
    check_head_draws(3.0f, 1.0f, 0.0f);
    check_head_draws(1.0f, 0.9f, 0.0f);
    check_head_draws(1.0f, 1.0f, 0.0f);
    check_head_draws(3.0f, 1.0f, 0.3f);
    check_head_draws(0.7f, 1.0f, 0.0f);
    sampler_params p = params(1.0f, 4, 1.0f, 0.0f);
    sampler *a = sampler_create(&p, V), *b = sampler_create(&p, V);
    int32_t ids[V];
    float probs[V];
    const int64_t n = sampler_distribution(a, logits, ids, probs);
    int counts[V] = {0};
    bool same = true;
    const int draws = 20000;
    for (int i = 0; i < draws; i++) {
        int32_t x = sampler_sample(a, logits), y = sampler_sample(b, logits);
        same = same && x == y;
        counts[x]++;
    }
    CHECK(same, "the same seed gives the same draws");
    double worst = 0;
    int outside = draws;
    for (int64_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)counts[ids[i]] / draws - probs[i]));
        outside -= counts[ids[i]];
    }
    CHECK(outside == 0 && worst < 0.015,
          "draws follow the distribution (max freq error %.4f, %d outside)", worst, outside);
    p.seed = 8;
    sampler *c = sampler_create(&p, V);
    sampler_reset(a);
    int differ = 0;
    for (int i = 0; i < 200; i++) differ += sampler_sample(a, logits) != sampler_sample(c, logits);
    CHECK(differ > 0, "another seed gives other draws");
    sampler_destroy(a), sampler_destroy(b), sampler_destroy(c);
}

int main(void) {
    uint64_t rng = 42;
    for (int i = 0; i < V; i++) logits[i] = rand_uniform(&rng) * 4.0f;
    float t[5] = {1, 3, 3, 2, -1};
    CHECK(sampling_argmax(t, 5) == 1, "argmax takes the first of equal maxima");
    float nan_first[3] = {NAN, 1, 0};
    CHECK(sampling_argmax(nan_first, 3) == 1, "NaN never wins");
    /* long rows (the 8-lane pass and its tail) against one compare at a time: the maximum
     * at every position of the last lanes and the tail, NaNs and equal maxima around it */
    enum { L = 1003 };
    static float row[L];
    bool same = true;
    for (int at = L - 20; at < L; at++) {
        for (int i = 0; i < L; i++) row[i] = i % 97 == 5 ? NAN : rand_uniform(&rng);
        row[at] = 2.0f;
        if (at % 3 == 0) row[L - 1] = 2.0f; /* a later equal maximum must not win */
        int best = -1;
        for (int i = 0; i < L; i++)
            if (row[i] == row[i] && (best < 0 || row[i] > row[best])) best = i;
        same &= sampling_argmax(row, L) == best;
    }
    CHECK(same, "argmax of long rows with NaNs is the first largest value");
    float all_nan[9];
    for (int i = 0; i < 9; i++) all_nan[i] = NAN;
    CHECK(sampling_argmax(all_nan, 9) == 8, "a row of NaN gives its last id");
    check_filters();
    check_penalty();
    check_draws();
    return harness_done("test_sampling");
}

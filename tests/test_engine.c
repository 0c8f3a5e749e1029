/*
 * test_engine.c - requests, the scheduler and the prefix cache (celer.h "Engine").
 *
 * The reference for every greedy output is the same prompt run alone through
 * celer_generate_greedy on a fresh context, and for the fixture's own prompt the
 * transformers golden. Checked: one request gives the golden; many requests at once
 * (chunked prefill beside decodes, more requests than sequences) each give their solo
 * text; a repeated prompt attaches cached blocks and gives the same tokens, with the
 * cache on and off; a pool too small for every sequence pre-empts and still gives the
 * same tokens; n choices share the prompt; cancellation returns every block; stop ids;
 * bad requests and a full queue are clean errors; the stop-string scan; and, on the real
 * model, stop strings and logprobs through the tokenizer, and choices held to a grammar
 * (a JSON Schema's, at temperatures up to 1.5: every one valid).
 *
 * Images (the first LLaVA-NeXT and the first Gemma 3 fixture): a prompt's image token
 * expands to the image's rows and gives what the same prompt gives through the context API
 * alone; the same image again attaches its cached blocks; a different image behind the same
 * placeholder ids reuses only the text blocks before it and gives its own tokens. Gemma 3's
 * image blocks (rows that see each other at prefill): a cache block ending inside one, and
 * steps too short for a prompt, which the engine cuts before a block, give the solo tokens;
 * a block longer than a step is refused.
 */
#define _DEFAULT_SOURCE
#include "harness.h"

#include "engine/stop.h"

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_REQ 16
#define MAX_GEN 64

static celer_model *model;

/* What the events said about each request (indexed by submission order). */
typedef struct outcome {
    uint64_t id;
    int32_t ids[4][MAX_GEN];
    int64_t n[4];
    char text[4][1024];
    celer_finish_reason finish[4];
    int64_t prompt_tokens, cached_tokens, completion_tokens[4];
    float logprob_sum[4];
    int ended;
} outcome;

typedef struct run_state {
    outcome out[MAX_REQ];
    int n_req;
} run_state;

static void on_event(void *user, const celer_event *ev) {
    run_state *rs = user;
    for (int i = 0; i < rs->n_req; i++) {
        outcome *o = &rs->out[i];
        if (o->id != ev->request) continue;
        const int c = ev->index;
        if (ev->token >= 0 && o->n[c] < MAX_GEN) o->ids[c][o->n[c]++] = ev->token;
        const size_t have = strlen(o->text[c]);
        if (have + ev->text_len < sizeof o->text[c])
            memcpy(o->text[c] + have, ev->text, ev->text_len);
        o->logprob_sum[c] += ev->logprob;
        if (ev->finish != CELER_FINISH_NONE) {
            o->finish[c] = ev->finish;
            o->prompt_tokens = ev->prompt_tokens;
            o->cached_tokens = ev->cached_tokens;
            o->completion_tokens[c] = ev->completion_tokens;
            o->ended++;
        }
    }
}

static celer_engine *engine_new(const celer_model *m, const celer_tokenizer *tok, int32_t n_seq,
                                int64_t kv_positions, int64_t batch, bool prefix) {
    celer_engine_params p = celer_engine_default_params();
    p.n_seq_max = n_seq;
    p.n_ctx = 128;
    p.kv_positions = kv_positions;
    p.batch_tokens = batch;
    p.n_threads = 2;
    p.prefix_cache = prefix;
    p.max_queue = 8;
    celer_engine *eng = NULL;
    char err[512];
    if (!CHECK(celer_engine_create((celer_model *)m, tok, &p, &eng, err, sizeof err) == CELER_OK,
               "%s", err))
        return NULL;
    return eng;
}

static celer_request_params greedy_request(const int32_t *ids, int64_t n, int64_t max_tokens) {
    celer_request_params rp = celer_request_default_params();
    rp.prompt = ids;
    rp.n_prompt = n;
    rp.max_tokens = max_tokens;
    rp.sampling.temp = 0;
    rp.ignore_eos = true;
    return rp;
}

static void submit(celer_engine *eng, run_state *rs, const celer_request_params *rp) {
    char err[512];
    outcome *o = &rs->out[rs->n_req++];
    memset(o, 0, sizeof *o);
    CHECK(celer_engine_submit(eng, rp, &o->id, err, sizeof err) == CELER_OK, "submit: %s", err);
}

/* Steps until nothing is pending (bounded). */
static void drain(celer_engine *eng, run_state *rs) {
    for (int i = 0; i < 10000 && celer_engine_pending(eng); i++)
        if (!CHECK(celer_engine_step(eng, on_event, rs) == CELER_OK, "step: %s",
                   celer_engine_last_error(eng)))
            return;
    CHECK(!celer_engine_pending(eng), "engine still has requests after 10000 steps");
}

/* ids[n_out] that prompt gives alone, greedily. */
static void solo(const int32_t *prompt, int64_t n, int64_t n_predict, int32_t *out) {
    celer_context_params cp = celer_context_default_params();
    cp.n_ctx = 128;
    cp.n_threads = 2;
    celer_context *ctx;
    char err[512];
    if (!CHECK(celer_context_create(model, &cp, &ctx, err, sizeof err) == CELER_OK, "%s", err))
        return;
    celer_generate_params gp = {.seq_id = 0, .n_predict = n_predict, .stop_at_eos = 0};
    int64_t got = 0;
    CHECK(celer_generate_greedy(ctx, prompt, n, &gp, out, &got) == CELER_OK && got == n_predict,
          "solo greedy");
    celer_context_destroy(ctx);
}

static bool same_ids(const int32_t *a, const int32_t *b, int64_t n) {
    return !memcmp(a, b, sizeof *a * (size_t)n);
}

static void check_idle(celer_engine *eng, const char *what) {
    const celer_engine_stats st = celer_engine_get_stats(eng);
    CHECK(st.running == 0 && st.waiting == 0 && st.kv_blocks_used == 0,
          "%s: idle engine has %d running, %d waiting, %lld blocks held", what, st.running,
          st.waiting, (long long)st.kv_blocks_used);
}

/* ==== Fixture model: token ids only ==== */

static void test_single(const int32_t *input, int64_t n_input, const int32_t *golden,
                        int64_t n_golden) {
    celer_engine *eng = engine_new(model, NULL, 2, 0, 64, true);
    if (!eng) return;
    run_state rs = {0};
    celer_request_params rp = greedy_request(input, n_input, n_golden);
    submit(eng, &rs, &rp);
    drain(eng, &rs);
    const outcome *o = &rs.out[0];
    CHECK(o->n[0] == n_golden && same_ids(o->ids[0], golden, n_golden),
          "one request: not the golden greedy ids");
    CHECK(o->finish[0] == CELER_FINISH_LENGTH && o->completion_tokens[0] == n_golden &&
              o->prompt_tokens == n_input,
          "one request: finish %d, %lld completion tokens, %lld prompt tokens", o->finish[0],
          (long long)o->completion_tokens[0], (long long)o->prompt_tokens);
    check_idle(eng, "after one request");
    celer_engine_destroy(eng);
}

/* Prompts: the golden input and its greedy continuation, cut at several lengths. */
static int64_t make_prompts(const int32_t *base, int64_t n_base, int32_t prompts[][64],
                            int64_t *lens, int count) {
    for (int i = 0; i < count; i++) {
        lens[i] = 3 + (i * 7) % (n_base - 3);
        for (int64_t t = 0; t < lens[i]; t++) prompts[i][t] = base[(t + i) % n_base];
    }
    return count;
}

static void test_concurrent(const int32_t *base, int64_t n_base) {
    enum { N = 10, GEN = 12 };
    int32_t prompts[N][64], want[N][GEN];
    int64_t lens[N];
    make_prompts(base, n_base, prompts, lens, N);
    for (int i = 0; i < N; i++) solo(prompts[i], lens[i], GEN, want[i]);
    /* 4 sequences for 10 requests, 7 rows a step: prefill chunks beside decode rows. */
    celer_engine *eng = engine_new(model, NULL, 4, 0, 7, false);
    if (!eng) return;
    run_state rs = {0};
    for (int i = 0; i < 8; i++) {
        celer_request_params rp = greedy_request(prompts[i], lens[i], GEN);
        submit(eng, &rs, &rp);
    }
    /* The queue holds 8: one more is refused, and is accepted after some steps. */
    celer_request_params rp = greedy_request(prompts[8], lens[8], GEN);
    uint64_t id;
    char err[512];
    CHECK(celer_engine_submit(eng, &rp, &id, err, sizeof err) == CELER_STATUS_BUSY,
          "a full queue must be BUSY");
    for (int i = 0; i < 3; i++) celer_engine_step(eng, on_event, &rs);
    for (int i = 8; i < N; i++) {
        rp = greedy_request(prompts[i], lens[i], GEN);
        submit(eng, &rs, &rp);
    }
    drain(eng, &rs);
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += !(rs.out[i].n[0] == GEN && same_ids(rs.out[i].ids[0], want[i], GEN));
    CHECK(bad == 0, "concurrent: %d of %d requests differ from their solo greedy ids", bad, N);
    check_idle(eng, "after concurrent requests");
    celer_engine_destroy(eng);
}

static void test_prefix_cache(const int32_t *base, int64_t n_base) {
    enum { GEN = 10 };
    int32_t prompt[64], want[GEN];
    const int64_t n = n_base; /* 40 tokens: two full blocks can be reused */
    memcpy(prompt, base, sizeof *prompt * (size_t)n);
    solo(prompt, n, GEN, want);
    for (int on = 0; on < 2; on++) {
        celer_engine *eng = engine_new(model, NULL, 2, 0, 64, on);
        if (!eng) return;
        run_state rs = {0};
        for (int k = 0; k < 2; k++) {
            celer_request_params rp = greedy_request(prompt, n, GEN);
            submit(eng, &rs, &rp);
            drain(eng, &rs);
        }
        const int64_t want_cached = on ? (n - 1) / 16 * 16 : 0;
        CHECK(rs.out[0].cached_tokens == 0,
              "prefix cache %s: first request reports %lld cached tokens", on ? "on" : "off",
              (long long)rs.out[0].cached_tokens);
        CHECK(rs.out[1].cached_tokens == want_cached,
              "prefix cache %s: second request has %lld cached tokens, want %lld",
              on ? "on" : "off", (long long)rs.out[1].cached_tokens, (long long)want_cached);
        for (int k = 0; k < 2; k++)
            CHECK(rs.out[k].n[0] == GEN && same_ids(rs.out[k].ids[0], want, GEN),
                  "prefix cache %s: request %d differs from the solo greedy ids", on ? "on" : "off",
                  k);
        const celer_engine_stats st = celer_engine_get_stats(eng);
        CHECK(!on || (st.prefix_hits_total == want_cached && st.kv_blocks_cached > 0),
              "prefix cache stats: %lld hits, %lld cached blocks", (long long)st.prefix_hits_total,
              (long long)st.kv_blocks_cached);
        check_idle(eng, "after the prefix cache test");
        celer_engine_destroy(eng);
    }
}

static void test_preemption(const int32_t *base, int64_t n_base) {
    enum { N = 3, GEN = 30 };
    int32_t prompts[N][64], want[N][GEN];
    int64_t lens[N] = {20, 25, 30};
    for (int i = 0; i < N; i++) {
        for (int64_t t = 0; t < lens[i]; t++) prompts[i][t] = base[(t + 3 * i) % n_base];
        solo(prompts[i], lens[i], GEN, want[i]);
    }
    /* 8 blocks of 16 = 128 positions; the three need 50, 55 and 60 at the end. */
    for (int on = 0; on < 2; on++) {
        celer_engine *eng = engine_new(model, NULL, 3, 128, 64, on);
        if (!eng) return;
        run_state rs = {0};
        for (int i = 0; i < N; i++) {
            celer_request_params rp = greedy_request(prompts[i], lens[i], GEN);
            submit(eng, &rs, &rp);
        }
        drain(eng, &rs);
        int bad = 0;
        for (int i = 0; i < N; i++)
            bad += !(rs.out[i].n[0] == GEN && same_ids(rs.out[i].ids[0], want[i], GEN));
        const celer_engine_stats st = celer_engine_get_stats(eng);
        CHECK(bad == 0, "pre-emption (prefix cache %d): %d of %d requests differ from solo", on,
              bad, N);
        CHECK(st.preemptions_total > 0, "pre-emption (prefix cache %d): the pool never ran out",
              on);
        check_idle(eng, "after pre-emption");
        celer_engine_destroy(eng);
    }
}

static void test_choices_cancel_stop(const int32_t *input, int64_t n_input, const int32_t *golden) {
    celer_engine *eng = engine_new(model, NULL, 4, 0, 64, false);
    if (!eng) return;
    run_state rs = {0};
    celer_request_params rp = greedy_request(input, n_input, 12);
    rp.n = 3;
    submit(eng, &rs, &rp);
    drain(eng, &rs);
    for (int c = 0; c < 3; c++)
        CHECK(rs.out[0].n[c] == 12 && same_ids(rs.out[0].ids[c], golden, 12),
              "n=3: choice %d is not the golden", c);
    check_idle(eng, "after n=3");

    /* Cancel mid-generation: one CANCELLED event, every block back. */
    rs = (run_state){0};
    rp = greedy_request(input, n_input, 40);
    submit(eng, &rs, &rp);
    for (int i = 0; i < 4; i++) celer_engine_step(eng, on_event, &rs);
    CHECK(celer_engine_get_stats(eng).kv_blocks_used > 0,
          "cancel: the request holds no blocks while running");
    CHECK(celer_engine_cancel(eng, rs.out[0].id) == CELER_OK, "cancel");
    CHECK(celer_engine_get_stats(eng).kv_blocks_used == 0, "cancel: blocks are not back at once");
    celer_engine_step(eng, on_event, &rs);
    CHECK(rs.out[0].ended == 1 && rs.out[0].finish[0] == CELER_FINISH_CANCELLED,
          "cancel: no CANCELLED event");
    CHECK(celer_engine_cancel(eng, 12345) == CELER_STATUS_NOT_FOUND, "cancel of an unknown id");
    check_idle(eng, "after cancel");

    /* A stop id ends the choice with STOP after that token. */
    rs = (run_state){0};
    rp = greedy_request(input, n_input, 16);
    rp.stop_ids = &golden[4];
    rp.n_stop_ids = 1;
    submit(eng, &rs, &rp);
    drain(eng, &rs);
    int64_t first = 0;
    while (golden[first] != golden[4]) first++;
    CHECK(rs.out[0].finish[0] == CELER_FINISH_STOP && rs.out[0].n[0] == first + 1,
          "stop id: finish %d after %lld tokens, want STOP after %lld", rs.out[0].finish[0],
          (long long)rs.out[0].n[0], (long long)first + 1);

    /* Bad requests. */
    char err[512];
    uint64_t id;
    int32_t big[200] = {0};
    rp = greedy_request(big, 128, 4);
    CHECK(celer_engine_submit(eng, &rp, &id, err, sizeof err) == CELER_STATUS_INVALID_ARGUMENT &&
              strstr(err, "128 tokens") && strstr(err, "128 positions"),
          "too long a prompt: %s", err);
    int32_t bad_id = 1 << 20;
    rp = greedy_request(&bad_id, 1, 4);
    CHECK(celer_engine_submit(eng, &rp, &id, err, sizeof err) == CELER_STATUS_INVALID_ARGUMENT &&
              strstr(err, "vocabulary"),
          "token outside the vocabulary: %s", err);
    rp = greedy_request(input, n_input, 0);
    CHECK(celer_engine_submit(eng, &rp, &id, err, sizeof err) == CELER_STATUS_INVALID_ARGUMENT &&
              strstr(err, "max_tokens"),
          "max_tokens 0: %s", err);
    rp = greedy_request(input, n_input, 4);
    const char *stop = "x";
    rp.stop = &stop;
    rp.n_stop = 1;
    CHECK(celer_engine_submit(eng, &rp, &id, err, sizeof err) == CELER_STATUS_INVALID_ARGUMENT,
          "stop strings without a tokenizer: %s", err);
    CHECK(!celer_engine_pending(eng), "refused requests must not be queued");
    celer_engine_destroy(eng);
}

/* ==== Stop-string scan ==== */

static void test_stop_scan(void) {
    const char *stops[] = {"END", "\n\n"};
    bool m;
    CHECK(stop_scan(stops, 2, "abc", 3, 0, &m) == 3 && !m, "no stop: release all");
    CHECK(stop_scan(stops, 2, "abcE", 4, 0, &m) == 3 && !m, "hold a possible stop prefix");
    CHECK(stop_scan(stops, 2, "abcEN", 5, 3, &m) == 3 && !m, "hold a longer prefix");
    CHECK(stop_scan(stops, 2, "abcENX", 6, 3, &m) == 6 && !m, "release once ruled out");
    CHECK(stop_scan(stops, 2, "abcEND!", 7, 3, &m) == 3 && m, "a match ends the text before it");
    CHECK(stop_scan(stops, 2, "a\n\nEND", 6, 0, &m) == 1 && m, "the earliest stop string wins");
    CHECK(stop_scan(stops, 2, "x\n", 2, 0, &m) == 1 && !m, "hold one newline");
    const char *overlap[] = {"aab"};
    CHECK(stop_scan(overlap, 1, "aaa", 3, 0, &m) == 1 && !m,
          "overlapping prefixes: hold the longest");
    CHECK(stop_scan(overlap, 1, "aaab", 4, 1, &m) == 1 && m, "overlapping match found");
}

/* ==== Real model: text, stop strings, logprobs ==== */

/* Eight different prompts at once, 64 rows a step (prefill chunks beside decode rows of
 * other sequences), each give the text they give alone: a row's result never depends on
 * what else is in the batch. */
static void test_real_batched(celer_model *m, celer_tokenizer *tok) {
    enum { N = 8, GEN = 20 };
    static const char *texts[N] = {
        "Write a haiku about the sea.",
        "What is 17 times 23?",
        "Name three primary colors.",
        "Explain photosynthesis in one sentence to a child who is five years old.",
        "Translate 'good morning' into French.",
        "List the days of the week.",
        "Why is the sky blue? Give a short answer.",
        "def fibonacci(n):"};
    int32_t *ids[N];
    int64_t n[N];
    char err[512];
    for (int i = 0; i < N; i++)
        CHECK(celer_tokenize(tok, texts[i], strlen(texts[i]), true, &ids[i], &n[i], err,
                             sizeof err) == CELER_OK,
              "%s", err);
    run_state alone = {0}, together = {0};
    celer_engine *eng = engine_new(m, tok, 1, 0, 64, false);
    for (int i = 0; eng && i < N; i++) {
        celer_request_params rp = greedy_request(ids[i], n[i], GEN);
        submit(eng, &alone, &rp);
        drain(eng, &alone);
    }
    celer_engine_destroy(eng);
    eng = engine_new(m, tok, N, 0, 64, false);
    for (int i = 0; eng && i < N; i++) {
        celer_request_params rp = greedy_request(ids[i], n[i], GEN);
        submit(eng, &together, &rp);
    }
    if (eng) drain(eng, &together);
    celer_engine_destroy(eng);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        const bool same = alone.out[i].n[0] == GEN && together.out[i].n[0] == GEN &&
                          same_ids(alone.out[i].ids[0], together.out[i].ids[0], GEN);
        if (!same)
            printf("  batched \"%s\": \"%s\" alone, \"%s\" together\n", texts[i],
                   alone.out[i].text[0], together.out[i].text[0]);
        bad += !same;
    }
    CHECK(bad == 0, "real model: %d of %d prompts give other tokens in a batch of %d than alone",
          bad, N, N);
    for (int i = 0; i < N; i++) free(ids[i]);
}

/* Whether o is what the schema of test_real_grammar allows: {"name": string of at most 12
 * characters, "age": integer 0..120, optional "tags": at most 3 strings}, nothing else. */
static bool person_valid(const char *text) {
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    bool ok = json_is_object(o) && json_is_string(json_object_get(o, "name")) &&
              json_is_integer(json_object_get(o, "age"));
    if (ok) {
        const json_int_t age = json_integer_value(json_object_get(o, "age"));
        const json_t *tags = json_object_get(o, "tags");
        ok = age >= 0 && age <= 120 && json_string_length(json_object_get(o, "name")) <= 12 &&
             json_object_size(o) == (size_t)(tags ? 3 : 2) &&
             (!tags || (json_is_array(tags) && json_array_size(tags) <= 3));
        for (size_t i = 0; ok && tags && i < json_array_size(tags); i++)
            ok = json_is_string(json_array_get(tags, i));
    }
    json_decref(o);
    return ok;
}

/* Grammar-constrained choices on the real model: a JSON Schema (through
 * celer_json_schema_to_grammar) at temperatures from 0 to 1.5, four choices a request:
 * every choice that stops is valid JSON of the schema (checked here with jansson), none
 * is cut by the length limit this generous; a GBNF alternative ends the choice as soon as
 * nothing can extend it; a malformed grammar is refused at submit, naming its line. */
static void test_real_grammar(celer_model *m, celer_tokenizer *tok) {
    const char *schema =
        "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", "
        "\"maxLength\": 12}, \"age\": {\"type\": \"integer\", \"minimum\": 0, \"maximum\": "
        "120}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\", "
        "\"maxLength\": 8}, \"maxItems\": 3}}, \"required\": [\"name\", \"age\"], "
        "\"additionalProperties\": false}";
    char err[512], *gbnf = NULL;
    if (!CHECK(celer_json_schema_to_grammar(schema, &gbnf, err, sizeof err) == CELER_OK, "%s", err))
        return;
    const char *prompt = "A person described as JSON:";
    int32_t *ids;
    int64_t n;
    CHECK(celer_tokenize(tok, prompt, strlen(prompt), true, &ids, &n, err, sizeof err) == CELER_OK,
          "%s", err);
    celer_engine *eng = engine_new(m, tok, 4, 0, 64, true);
    if (!eng) goto out;
    enum { R = 6 };
    run_state rs = {0};
    for (int i = 0; i < R; i++) {
        celer_request_params rp = celer_request_default_params();
        rp.prompt = ids, rp.n_prompt = n, rp.max_tokens = 100, rp.n = 4;
        rp.sampling.temp = 0.3f * (float)i, rp.sampling.top_k = 0, rp.sampling.top_p = 1;
        rp.sampling.min_p = 0, rp.sampling.seed = 100 + (uint64_t)i;
        rp.grammar = gbnf;
        submit(eng, &rs, &rp);
        drain(eng, &rs); /* the queue holds two requests of four choices */
    }
    int valid = 0, stopped = 0;
    for (int i = 0; i < R; i++)
        for (int c = 0; c < 4; c++) {
            const bool stop = rs.out[i].finish[c] == CELER_FINISH_STOP;
            stopped += stop;
            const bool ok = stop && person_valid(rs.out[i].text[c]);
            valid += ok;
            if (!ok)
                printf("  grammar: temp %.1f choice %d (finish %d): \"%s\"\n", 0.3 * i, c,
                       rs.out[i].finish[c], rs.out[i].text[c]);
        }
    printf("  grammar: %d of %d choices stopped, %d valid\n", stopped, 4 * R, valid);
    CHECK(valid == 4 * R, "grammar: %d of %d choices are valid JSON of the schema", valid, 4 * R);

    run_state yn = {0};
    celer_request_params rp = greedy_request(ids, n, 20);
    rp.ignore_eos = false;
    rp.grammar = "root ::= (\"yes\" | \"no\") \"!\"";
    submit(eng, &yn, &rp);
    drain(eng, &yn);
    CHECK(yn.out[0].finish[0] == CELER_FINISH_STOP &&
              (!strcmp(yn.out[0].text[0], "yes!") || !strcmp(yn.out[0].text[0], "no!")),
          "GBNF yes/no: \"%s\" (finish %d)", yn.out[0].text[0], yn.out[0].finish[0]);

    uint64_t id;
    rp.grammar = "root ::= \"a\"\nitem ::= [a-";
    CHECK(celer_engine_submit(eng, &rp, &id, err, sizeof err) == CELER_STATUS_INVALID_ARGUMENT &&
              strstr(err, "line 2"),
          "a malformed grammar: \"%s\"", err);
    check_idle(eng, "grammar");
    celer_engine_destroy(eng);
out:
    free(ids);
    free(gbnf);
}

static void test_real_text(void) {
    const char *path = real_model_path();
    celer_model *m = NULL;
    celer_tokenizer *tok = NULL;
    char err[512];
    if (celer_model_open(path, NULL, &m, err, sizeof err) != CELER_OK) {
        SKIP_REQUIRED("the real-model engine checks: %s", err);
        return;
    }
    if (!CHECK(celer_tokenizer_open(path, &tok, err, sizeof err) == CELER_OK, "%s", err)) goto out;
    int32_t *ids;
    int64_t n;
    const char *prompt = "The list of the planets of the solar system, in order:";
    CHECK(celer_tokenize(tok, prompt, strlen(prompt), true, &ids, &n, err, sizeof err) == CELER_OK,
          "%s", err);
    celer_engine *eng = engine_new(m, tok, 2, 0, 64, true);
    if (!eng) goto out;
    run_state rs = {0};
    celer_request_params rp = greedy_request(ids, n, 24);
    rp.top_logprobs = 3;
    submit(eng, &rs, &rp);
    drain(eng, &rs);
    const char *full = rs.out[0].text[0];
    char *decoded;
    CHECK(celer_detokenize(tok, rs.out[0].ids[0], rs.out[0].n[0], true, &decoded, NULL, err,
                           sizeof err) == CELER_OK,
          "%s", err);
    CHECK(!strcmp(decoded, full), "event text \"%s\" is not the detokenized ids \"%s\"", full,
          decoded);
    free(decoded);
    CHECK(rs.out[0].logprob_sum[0] < 0 && isfinite(rs.out[0].logprob_sum[0]), "logprobs: sum %g",
          rs.out[0].logprob_sum[0]);
    /* A stop string from the middle of that text, spanning a token boundary. */
    const size_t len = strlen(full);
    if (CHECK(len > 12, "greedy text too short: \"%s\"", full)) {
        char stop[8] = {0}, before[1024] = {0};
        memcpy(stop, full + len / 2, 5);
        const char *at = strstr(full, stop);
        memcpy(before, full, (size_t)(at - full));
        const char *stops[] = {stop};
        run_state rs2 = {0};
        rp = greedy_request(ids, n, 24);
        rp.stop = stops;
        rp.n_stop = 1;
        submit(eng, &rs2, &rp);
        drain(eng, &rs2);
        CHECK(!strcmp(rs2.out[0].text[0], before) && rs2.out[0].finish[0] == CELER_FINISH_STOP,
              "stop \"%s\": got \"%s\" (finish %d), want \"%s\"", stop, rs2.out[0].text[0],
              rs2.out[0].finish[0], before);
        /* The same through the two halves of a step, as a server drives them: the text stage
         * (emit) finds the stop string and sends the final event; a cancellation before the
         * next run adds no second one; that run gives the blocks back. */
        run_state rs4 = {0};
        submit(eng, &rs4, &rp);
        for (int i = 0; i < 64 && !rs4.out[0].ended; i++) {
            celer_engine_run(eng);
            celer_engine_emit(eng, on_event, &rs4);
        }
        CHECK(rs4.out[0].ended == 1 && rs4.out[0].finish[0] == CELER_FINISH_STOP &&
                  !strcmp(rs4.out[0].text[0], before) &&
                  rs4.out[0].completion_tokens[0] == rs2.out[0].completion_tokens[0],
              "run + emit, stop \"%s\": got \"%s\" (finish %d, %lld tokens)", stop,
              rs4.out[0].text[0], rs4.out[0].finish[0], (long long)rs4.out[0].completion_tokens[0]);
        CHECK(celer_engine_cancel(eng, rs4.out[0].id) == CELER_OK,
              "the ended request is there until the next run");
        celer_engine_run(eng);
        celer_engine_emit(eng, on_event, &rs4);
        CHECK(rs4.out[0].ended == 1, "a choice a stop string ended got %d final events",
              rs4.out[0].ended);
    }
    /* A stop string that the end of the text begins but never completes: held back while
     * it could, then released when the length limit ends the choice. */
    if (len > 4) {
        char tail[16];
        snprintf(tail, sizeof tail, "%s\x01", full + len - 3);
        const char *stops[] = {tail};
        run_state rs3 = {0};
        rp = greedy_request(ids, n, 24);
        rp.stop = stops;
        rp.n_stop = 1;
        submit(eng, &rs3, &rp);
        drain(eng, &rs3);
        CHECK(!strcmp(rs3.out[0].text[0], full) && rs3.out[0].finish[0] == CELER_FINISH_LENGTH,
              "held-back text at the length limit: got \"%s\" (finish %d), want \"%s\"",
              rs3.out[0].text[0], rs3.out[0].finish[0], full);
    }
    check_idle(eng, "real model");
    celer_engine_destroy(eng);
    free(ids);
    test_real_batched(m, tok);
    test_real_grammar(m, tok);
out:
    celer_tokenizer_close(tok);
    celer_model_close(m);
}

/* ==== Images ==== */

#define VLM_TEXT_BEFORE 20 /* text ids before the image: one full cache block and some */

/* Greedy ids of ids[n] (one image token, img) through the context API alone. */
static void vlm_solo(celer_model *m, const int32_t *ids, int64_t n, celer_image *img,
                     int64_t n_predict, int32_t *out) {
    char err[512];
    const int32_t image_tok = celer_model_image_token(m);
    const int64_t d = celer_model_n_embd(m), v = celer_model_n_vocab(m);
    int64_t rows = 0;
    CHECK(celer_model_image_positions(m, img, &rows, err, sizeof err) == CELER_OK, "%s", err);
    const int64_t total = n - 1 + rows;
    celer_context_params cp = celer_context_default_params();
    cp.n_ctx = total + n_predict + 1;
    cp.n_threads = 2;
    celer_context *ctx;
    if (!CHECK(celer_context_create(m, &cp, &ctx, err, sizeof err) == CELER_OK, "%s", err)) return;
    int32_t *tok = malloc(sizeof *tok * (size_t)total);
    float *embd = malloc(sizeof(float) * (size_t)(total * d)),
          *logits = malloc(sizeof(float) * (size_t)v);
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] != image_tok) {
            tok[at++] = ids[i];
            continue;
        }
        CHECK(celer_image_encode(ctx, img, embd + at * d) == CELER_OK, "encode: %s",
              celer_context_last_error(ctx));
        for (int64_t j = 0; j < rows; j++) tok[at++] = -1;
    }
    celer_batch b = {.n = total, .token = tok, .embd = embd};
    celer_status s = celer_forward_last_logits(ctx, &b, total - 1, logits);
    for (int64_t i = 0; s == CELER_OK && i < n_predict; i++) {
        int32_t best = 0;
        for (int64_t k = 1; k < v; k++)
            if (logits[k] > logits[best]) best = (int32_t)k;
        out[i] = best;
        b = celer_batch_tokens(&out[i], 1);
        s = celer_forward_last_logits(ctx, &b, 0, logits);
    }
    CHECK(s == CELER_OK, "vlm solo: %s", celer_context_last_error(ctx));
    free(tok), free(embd), free(logits);
    celer_context_destroy(ctx);
}

/* The first two image_* files of dir (sorted), as static paths; false when fewer. */
static bool two_images(const char *dir, char a[4400], char b[4400]) {
    struct dirent **list;
    const int n = scandir(dir, &list, NULL, alphasort);
    int found = 0;
    for (int i = 0; i < n; i++) {
        const char *e = list[i]->d_name;
        if (found < 2 && !strncmp(e, "image_", 6) && (strstr(e, ".png") || strstr(e, ".jpg")))
            snprintf(found++ ? b : a, 4400, "%s/%s", dir, e);
        free(list[i]);
    }
    if (n >= 0) free(list);
    return found == 2;
}

/* The engine on the vision-language fixture dir, the image after text_before ids. A model
 * whose image blocks run whole (Gemma 3) puts text_before = 14: the block straddles the
 * first cache block, so a prompt that shares the image but not what follows attaches a
 * cache block that ends inside the image block, and computes the rest of the block from
 * there; and its prompts also run in steps of 6 rows, which the engine cuts at blocks. */
static void test_images(const char *name) {
    char err[512], pa[4400], pb[4400];
    const char *dir = fixture_path(name);
    celer_model *m = NULL;
    celer_image *ia = NULL, *ib = NULL;
    if (!CHECK(two_images(dir, pa, pb), "%s: two image_* files", name) ||
        !CHECK(celer_model_open(dir, NULL, &m, err, sizeof err) == CELER_OK, "%s", err) ||
        !CHECK(celer_image_load(pa, &ia, err, sizeof err) == CELER_OK, "%s", err) ||
        !CHECK(celer_image_load(pb, &ib, err, sizeof err) == CELER_OK, "%s", err))
        goto out;
    const bool whole = celer_model_image_blocks_whole(m);
    const int64_t before = whole ? 14 : VLM_TEXT_BEFORE, n = before + (whole ? 16 : 6);
    const int32_t image_tok = celer_model_image_token(m);
    int32_t ids[VLM_TEXT_BEFORE + 16], ids_c[VLM_TEXT_BEFORE + 16];
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(3 + (i * 7) % 97);
    ids[before] = image_tok;
    memcpy(ids_c, ids, sizeof ids);
    ids_c[n - 2] = ids[n - 2] + 1; /* request C: the same image, another tail */
    int64_t rows_a = 0;
    CHECK(celer_model_image_positions(m, ia, &rows_a, err, sizeof err) == CELER_OK, "%s", err);
    enum { N_GEN = 8 };
    int32_t want_a[N_GEN], want_b[N_GEN], want_c[N_GEN];
    vlm_solo(m, ids, n, ia, N_GEN, want_a);
    vlm_solo(m, ids, n, ib, N_GEN, want_b);
    vlm_solo(m, ids_c, n, ia, N_GEN, want_c);

    celer_engine *eng = engine_new(m, NULL, 2, 0, 64, true);
    if (!eng) goto out;
    run_state rs = {0};
    celer_request_params rp = greedy_request(ids, n, N_GEN);
    celer_image *imgs[1] = {ia};
    rp.images = imgs, rp.n_images = 1;
    submit(eng, &rs, &rp);
    drain(eng, &rs);
    const outcome *o = &rs.out[0];
    CHECK(o->n[0] == N_GEN && same_ids(o->ids[0], want_a, N_GEN),
          "%s: image A through the engine equals its solo run", name);
    CHECK(o->prompt_tokens == n - 1 + rows_a, "prompt_tokens %lld counts the image rows (%lld)",
          (long long)o->prompt_tokens, (long long)(n - 1 + rows_a));
    submit(eng, &rs, &rp); /* the same image again: its blocks come from the cache */
    drain(eng, &rs);
    o = &rs.out[1];
    const int64_t full = (n - 1 + rows_a - 1) / 16 * 16, text_blocks = before / 16 * 16;
    CHECK(o->cached_tokens == full && same_ids(o->ids[0], want_a, N_GEN),
          "%s: the same image again: %lld cached (expected %lld), same tokens", name,
          (long long)o->cached_tokens, (long long)full);
    imgs[0] = ib; /* another image behind the same ids: only the text blocks before it */
    submit(eng, &rs, &rp);
    drain(eng, &rs);
    o = &rs.out[2];
    CHECK(o->cached_tokens == text_blocks,
          "%s: a different image reuses only the text blocks before it (%lld cached)", name,
          (long long)o->cached_tokens);
    CHECK(o->n[0] == N_GEN && same_ids(o->ids[0], want_b, N_GEN),
          "%s: image B through the engine equals its solo run", name);
    int64_t cached_c = -1;
    if (whole) { /* the same image, another tail: a cache block ends inside the image block */
        imgs[0] = ia;
        rp.prompt = ids_c;
        submit(eng, &rs, &rp);
        drain(eng, &rs);
        o = &rs.out[3];
        cached_c = o->cached_tokens;
        CHECK(cached_c == 16 && before < 16 && before + rows_a > 16,
              "%s: the other tail attaches the block that ends inside the image (%lld cached)",
              name, (long long)cached_c);
        CHECK(o->n[0] == N_GEN && same_ids(o->ids[0], want_c, N_GEN),
              "%s: the rest of the image block computed after the cache equals the solo run", name);
        rp.prompt = ids;
    }
    printf("  %s: image A %lld rows, cached %lld on repeat, %lld with image B, %lld with another "
           "tail; A %s B\n",
           name, (long long)rows_a, (long long)full, (long long)text_blocks, (long long)cached_c,
           same_ids(want_a, want_b, N_GEN) ? "==" : "!=");
    /* bad requests: an image without its token, a token without an image */
    rp.n_images = 0;
    uint64_t id;
    CHECK(celer_engine_submit(eng, &rp, &id, err, sizeof err) == CELER_STATUS_INVALID_ARGUMENT &&
              strstr(err, "image tokens"),
          "an image token without an image: %s", err);
    rp.prompt = ids, rp.n_prompt = before, rp.n_images = 1;
    CHECK(celer_engine_submit(eng, &rp, &id, err, sizeof err) == CELER_STATUS_INVALID_ARGUMENT,
          "an image without its token: %s", err);
    check_idle(eng, "images");
    celer_engine_destroy(eng);
    if (whole) { /* steps of 6 rows: cut before each image block, never inside it */
        eng = engine_new(m, NULL, 1, 0, 6, false);
        if (!eng) goto out;
        run_state rs2 = {0};
        rp = greedy_request(ids, n, N_GEN);
        rp.images = imgs, rp.n_images = 1;
        submit(eng, &rs2, &rp);
        drain(eng, &rs2);
        CHECK(rs2.out[0].n[0] == N_GEN && same_ids(rs2.out[0].ids[0], want_a, N_GEN),
              "%s: prefill in steps of 6 rows equals the solo run", name);
        celer_engine_destroy(eng);
        eng = engine_new(m, NULL, 1, 0, 3, false); /* a block of 4 rows cannot fit a step */
        if (eng) {
            CHECK(celer_engine_submit(eng, &rp, &id, err, sizeof err) ==
                          CELER_STATUS_INVALID_ARGUMENT &&
                      strstr(err, "batch_tokens"),
                  "%s: an image block longer than batch_tokens is refused: %s", name, err);
            celer_engine_destroy(eng);
        }
    }
out:
    celer_image_free(ia);
    celer_image_free(ib);
    celer_model_close(m);
}

int main(void) {
    test_stop_scan();
    const char *dir = fixture_path("llama3-q4g64");
    char err[512];
    int32_t *input = NULL, *golden = NULL;
    int64_t n_input = 0, n_golden = 0;
    if (CHECK(golden_read(dir, &input, &n_input, &golden, &n_golden) == 0, "golden of %s", dir) &&
        CHECK(celer_model_open(fixture_model_path(dir), NULL, &model, err, sizeof err) == CELER_OK,
              "%s", err)) {
        int32_t base[64];
        memcpy(base, input, sizeof *base * (size_t)n_input);
        memcpy(base + n_input, golden, sizeof *base * (size_t)n_golden);
        test_single(input, n_input, golden, n_golden);
        test_concurrent(base, n_input + n_golden);
        test_prefix_cache(base, n_input + n_golden);
        test_preemption(base, n_input + n_golden);
        test_choices_cancel_stop(input, n_input, golden);
        celer_model_close(model);
    }
    free(input);
    free(golden);
    test_real_text();
    /* the first fixture of each vision-language family */
    char *names[64];
    const int nv = vlm_fixture_names(names, 64);
    CHECK(nv >= 2, "vision-language fixtures");
    bool llava = false, gemma3 = false;
    for (int i = 0; i < nv; i++) {
        if (!strncmp(names[i], "llava-", 6) && !llava) llava = true, test_images(names[i]);
        if (!strncmp(names[i], "gemma3-", 7) && !gemma3) gemma3 = true, test_images(names[i]);
        free(names[i]);
    }
    CHECK(llava && gemma3, "a LLaVA-NeXT and a Gemma 3 fixture");
    return harness_done("test_engine");
}

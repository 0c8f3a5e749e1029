/*
 * grammar_bench.c - how long grammar_matcher_mask takes while generating JSON.
 *
 * Loads a tokenizer (a tokenizer.json directory or a .gguf file) and a GBNF grammar
 * (default tests/grammar/json.gbnf), tokenizes a few realistic JSON documents (nested
 * objects, long strings, numbers, arrays), and replays each document's tokens through one
 * matcher, timing the mask before every token on one core: prints p50, p99 and max in
 * microseconds, both wall-clock and this thread's CPU time (which a loaded machine's
 * preemptions do not inflate). It does not sample or run a model: the tokens are the
 * documents' own.
 *
 *     build/tools/grammar_bench TOKENIZER [GRAMMAR.gbnf]
 */
#define _POSIX_C_SOURCE 200809L
#include "sampling/grammar.h"
#include "tokenizer/tok_gguf.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const docs[] = {
    "{\"id\": 18342, \"name\": \"Ada Lovelace\", \"active\": true, \"score\": 97.25, \"tags\": "
    "[\"math\", \"engines\", \"poetry\"], \"address\": {\"street\": \"12 St James's Square\", "
    "\"city\": \"London\", \"zip\": null}}",
    "{\"model\": \"celer\", \"choices\": [{\"index\": 0, \"message\": {\"role\": \"assistant\", "
    "\"content\": \"The Analytical Engine was a proposed mechanical general-purpose computer "
    "designed by English mathematician and computer pioneer Charles Babbage. It was first "
    "described in 1837 as the successor to Babbage's Difference Engine, which was a design for a "
    "simpler mechanical calculator. The Analytical Engine incorporated an arithmetic logic unit, "
    "control flow in the form of conditional branching and loops, and integrated memory, making "
    "it the first design for a general-purpose computer that could be described in modern terms "
    "as Turing-complete.\\nIn other words, the structure of the Analytical Engine was essentially "
    "the same as that which has dominated computer design in the electronic era.\"}, "
    "\"finish_reason\": \"stop\"}], \"usage\": {\"prompt_tokens\": 57, \"completion_tokens\": "
    "133, \"total_tokens\": 190}}",
    "{\"matrix\": [[1, 2, 3], [4.5, -6e12, 7.125], [0, 0, -1]], \"points\": [{\"x\": 0.1, \"y\": "
    "-0.25, \"label\": \"a\"}, {\"x\": 12, \"y\": 3.5E-3, \"label\": \"b\"}, {\"x\": -7, \"y\": "
    "1e2, \"label\": \"c\"}], \"ok\": false, \"note\": \"caf\\u00e9 \xC3\xA9t\xC3\xA9 "
    "\xE6\x97\xA5\xE6\x9C\xAC \\\"quoted\\\" \\\\ end\"}",
    "{\"users\": [\n  {\"id\": 1, \"email\": \"alice@example.com\", \"roles\": [\"admin\", "
    "\"dev\"], "
    "\"profile\": {\"bio\": \"Systems programmer who likes C, compilers and long walks through "
    "large codebases; maintainer of several small libraries.\", \"age\": 34}},\n  {\"id\": 2, "
    "\"email\": \"bob@example.org\", \"roles\": [], \"profile\": {\"bio\": \"\", \"age\": 29}}\n], "
    "\"page\": {\"next\": \"/users?page=2\", \"size\": 2}}",
};

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double clock_us(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}
static double now_us(void) {
    return clock_us(CLOCK_MONOTONIC);
}
static double cpu_us(void) {
    return clock_us(CLOCK_THREAD_CPUTIME_ID);
}

static void report(const char *what, double *t, size_t n) {
    qsort(t, n, sizeof *t, cmp_d);
    printf("mask %s: p50 %.1f us  p99 %.1f us  max %.1f us\n", what, t[n / 2],
           t[(size_t)((double)(n - 1) * 0.99)], t[n - 1]);
}

static char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)sz + 1);
    if (s && fread(s, 1, (size_t)sz, f) != (size_t)sz) free(s), s = NULL;
    fclose(f);
    if (s) s[sz] = 0, *n = (size_t)sz;
    return s;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s TOKENIZER(.json dir | .gguf) [GRAMMAR.gbnf]\n", argv[0]);
        return 2;
    }
    const char *gpath = argc > 2 ? argv[2] : "tests/grammar/json.gbnf";
    celer_error e;
    tokenizer *t;
    size_t pl = strlen(argv[1]);
    celer_status st = pl > 5 && !strcmp(argv[1] + pl - 5, ".gguf") ? tok_load_gguf(argv[1], &t, &e)
                                                                   : tok_load(argv[1], &t, &e);
    if (st != CELER_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    size_t gn;
    char *gsrc = read_file(gpath, &gn);
    grammar *g;
    if (!gsrc || grammar_parse(gsrc, gn, &g, &e) != CELER_OK) {
        fprintf(stderr, "%s: %s\n", gpath, gsrc ? e.msg : "cannot read");
        return 1;
    }
    char **bytes;
    size_t *len;
    double t0 = now_us();
    if (tok_vocab_bytes(t, &bytes, &len, &e) != CELER_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    int64_t n_vocab = tok_vocab_size(t);
    int32_t eos[4];
    int n_eos = 0;
    static const char *eos_names[] = {"<|eot_id|>", "<|end_of_text|>", "<|im_end|>", "</s>"};
    for (int i = 0; i < 4; i++) {
        int32_t id = tok_token_to_id(t, eos_names[i], strlen(eos_names[i]));
        if (id >= 0 && n_eos < 4) eos[n_eos++] = id;
    }
    grammar_vocab *v;
    if (grammar_vocab_create((const char *const *)bytes, len, n_vocab, eos, n_eos, &v, &e) !=
        CELER_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    double t1 = now_us();
    uint32_t *mask = malloc((size_t)((n_vocab + 31) / 32) * sizeof *mask);
    int n_docs = (int)(sizeof docs / sizeof *docs);
    double *times = NULL, *cpu = NULL;
    size_t n_times = 0;
    int refused = 0;
    for (int round = 0; round < 3; round++) {
        for (int d = 0; d < n_docs; d++) {
            int32_t *ids;
            int64_t n;
            if (tok_encode(t, docs[d], strlen(docs[d]), false, &ids, &n, &e) != CELER_OK) {
                fprintf(stderr, "%s\n", e.msg);
                return 1;
            }
            grammar_matcher *m = grammar_matcher_create(g, v);
            times = realloc(times, (n_times + (size_t)n + 1) * sizeof *times);
            cpu = realloc(cpu, (n_times + (size_t)n + 1) * sizeof *cpu);
            for (int64_t i = 0; i <= n; i++) {
                double a = now_us(), ac = cpu_us();
                bool any = grammar_matcher_mask(m, mask);
                cpu[n_times] = cpu_us() - ac;
                times[n_times++] = now_us() - a;
                int32_t id = i < n ? ids[i] : (n_eos ? eos[0] : -1);
                if (id < 0) break;
                if (!any || !(mask[id / 32] >> (id % 32) & 1) ||
                    !grammar_matcher_accept_token(m, id)) {
                    fprintf(stderr, "document %d: token %lld (id %d) refused\n", d, (long long)i,
                            id);
                    refused++;
                    break;
                }
            }
            grammar_matcher_free(m);
            free(ids);
        }
    }
    printf("tokenizer %s: %lld tokens, vocabulary bytes + trie %.0f ms\n", argv[1],
           (long long)n_vocab, (t1 - t0) / 1e3);
    printf("grammar %s, %d documents x 3 rounds (a fresh matcher per document), %zu masks, %d "
           "refused tokens\n",
           gpath, n_docs, n_times, refused);
    report("wall time", times, n_times);
    report("CPU time ", cpu, n_times);
    free(times), free(cpu), free(mask), free(gsrc);
    grammar_matcher_free(NULL);
    grammar_vocab_free(v), grammar_free(g);
    tok_vocab_bytes_free(bytes, len);
    tok_free(t);
    return refused ? 1 : 0;
}

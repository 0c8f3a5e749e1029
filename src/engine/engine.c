/*
 * engine.c - requests, the scheduler step and the prefix cache policy (celer.h, section
 * "Engine").
 *
 * A request has n choices; each choice is one sequence of the engine's context while it
 * runs. A step is plan, run, apply, then the text stage:
 *   - plan: cancelled choices end, then one batch is built: a decode row for each running
 *     choice that has chosen a token, prefill chunks for the rest, new choices admitted
 *     from the queue while sequences, blocks and the token budget allow; each row says
 *     whether its logits are wanted. When the running choices' decode rows do not fit the
 *     pool, the youngest is pre-empted: its blocks go back and it waits at the head of the
 *     queue with its prompt and what it generated so far, to be recomputed (mostly from
 *     the prefix cache).
 *   - run: one forward of the batch.
 *   - apply: each choice is handed its rows of logits; its logits processors and sampler
 *     (sampling/logits_proc.h) choose the token, and the step records an event.
 *   - the text stage (celer_engine_emit): detokenizing, stop strings and the callbacks, on
 *     state of its own, so a server runs it outside its engine lock.
 * The engine does not lock: its owner serializes calls.
 */
#define _POSIX_C_SOURCE 200809L
#include "celer.h"

#include "base/error.h"
#include "engine/context.h"
#include "engine/stop.h"
#include "models/model.h"
#include "sampling/logits_proc.h"
#include "tokenizer/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct request request;

/* One choice of a request: a sequence while it runs. */
typedef struct choice {
    request *req;
    int32_t index;
    int32_t seq;      /* context sequence while running, else -1 */
    int32_t *tokens;  /* [n_ctx] prompt, then generated ids */
    int64_t n_tokens; /* prompt + generated */
    int64_t n_done;   /* positions in the cache (computed or attached) */
    int64_t n_gen;
    int64_t cached; /* prompt positions attached from the cache at first admission */
    bool admitted_once;
    uint64_t order; /* admission order: the youngest is pre-empted first */
    logits_proc *lp;
    celer_finish_reason finish;
    bool reported;       /* its final event is decided (recorded, or sent by the text stage) */
    struct choice *next; /* in the wait queue */
    /* The text stage's own (celer_engine_emit): */
    celer_detok_stream *ds;
    char *text; /* generated text, of which text[0, sent) was released */
    size_t len, cap, sent;
    bool text_done; /* a stop string ended it: the next run retires it */
} choice;

/* The rows of one image block inside a prompt: an image's, or one of its blocks (Gemma 3's
 * pan-and-scan crops), whose rows are the block-th n of the image's. */
typedef struct image_span {
    int64_t start, n; /* prompt positions [start, start + n) */
    celer_image *img; /* a reference held until the request ends */
    int32_t first;    /* the span of the image's first block, which holds its rows */
    int32_t block;    /* this span's place among its image's blocks */
    float *rows;      /* first span: [blocks * n, d] once encoded, else NULL */
} image_span;

/* What the run of a step decided for one choice, for the text stage to detokenize and
 * report: a chosen token, or only the choice's end. */
typedef struct step_event {
    choice *c;
    int32_t token;              /* -1: the event only ends the choice */
    celer_finish_reason finish; /* the run's; the text stage may end it by a stop string */
    bool stop_id;               /* token is an EOS or stop id: it ends the choice, no text */
    float logprob;
    int32_t n_top;
    int32_t top_ids[CELER_MAX_TOP_LOGPROBS];
    float top_lp[CELER_MAX_TOP_LOGPROBS];
} step_event;

struct request {
    uint64_t id;
    celer_request_params p; /* arrays below are the engine's copies; the prompt expanded */
    int32_t *prompt, *bias_ids, *stop_ids;
    image_span *spans; /* [n_spans] in prompt order */
    int32_t n_spans;
    float *bias;
    char **stop;
    grammar *grammar; /* compiled p.grammar, or NULL */
    int32_t *end_ids; /* [n_end] the ids that end a choice (EOS unless ignored, stop ids) */
    int32_t n_end;
    char *error;     /* why a choice ended with CELER_FINISH_ERROR (the first reason), or NULL */
    choice *choices; /* [p.n] */
    int32_t n_open;  /* choices whose final event has not gone out */
    request *next;   /* in the engine's request list */
};

struct celer_engine {
    celer_model *model;
    const celer_tokenizer *tok;
    celer_engine_params p;
    celer_context *ctx;
    kv_cache *kv;
    int64_t v;
    choice **running; /* [n_seq_max] by sequence */
    choice *queue_head, *queue_tail;
    int32_t n_waiting;
    request *requests;
    uint64_t next_id, next_order;
    /* step buffers, sized at creation */
    int32_t *b_token, *b_seq;
    int8_t *b_logits;
    float *b_embd; /* [batch_tokens, d] image rows of the step, or NULL (text models) */
    bool b_has_embd;
    bool blocks_whole;  /* the model's image blocks run whole in one step (Gemma 3) */
    choice **b_owner;   /* [batch_tokens] the choice of each row */
    int64_t *take;      /* [n_seq_max] rows each sequence has in the step */
    float *logits;      /* [n_seq_max, v] the rows that want logits, in batch order */
    int32_t *ids;       /* [n_seq_max] the argmax of each row that wants one */
    step_event *events; /* what the last run decided, for celer_engine_emit */
    int64_t n_events, cap_events;
    grammar_vocab *gvocab; /* the tokens' bytes, made for the first grammar request */
    celer_engine_stats st;
    celer_error err;
};

/* ==== Parameters ==== */

celer_engine_params celer_engine_default_params(void) {
    return (celer_engine_params){.n_seq_max = 4,
                                 .n_ctx = 4096,
                                 .kv_positions = 0,
                                 .batch_tokens = 512,
                                 .max_queue = 256,
                                 .n_threads = 0,
                                 .kernels = NULL,
                                 .prefix_cache = true};
}

celer_request_params celer_request_default_params(void) {
    return (celer_request_params){
        .max_tokens = 16, .n = 1, .sampling = celer_sampler_default_params(), .top_logprobs = -1};
}

/* ==== Creation ==== */

celer_status celer_engine_create(celer_model *model, const celer_tokenizer *tok,
                                 const celer_engine_params *params, celer_engine **out, char *err,
                                 size_t err_size) {
    celer_error e = {{0}};
    celer_status s = CELER_OK;
    celer_engine_params p = params ? *params : celer_engine_default_params();
    *out = NULL;
    if (p.n_seq_max <= 0 || p.n_ctx <= 1 || p.batch_tokens <= 0 || p.max_queue < 0 ||
        p.kv_positions < 0) {
        s = error_set(&e, CELER_STATUS_INVALID_ARGUMENT,
                      "engine: n_seq_max and batch_tokens must be positive, n_ctx > 1, "
                      "kv_positions and max_queue >= 0");
        error_copy(&e, err, err_size);
        return s;
    }
    /* Every running sequence gets at least one decode row per step. */
    if (p.batch_tokens < p.n_seq_max) p.batch_tokens = p.n_seq_max;
    celer_engine *eng = calloc(1, sizeof *eng);
    if (!eng) goto oom;
    eng->model = model;
    eng->tok = tok;
    eng->p = p;
    eng->v = celer_model_n_vocab(model);
    eng->blocks_whole = celer_model_image_blocks_whole(model);
    celer_context_params cp = celer_context_default_params();
    cp.n_ctx = p.n_ctx;
    cp.n_seq = p.n_seq_max;
    cp.kv_positions = p.kv_positions;
    cp.n_batch = p.batch_tokens;
    cp.n_threads = p.n_threads;
    cp.kernels = p.kernels;
    cp.device = p.device;
    cp.kv_type = p.kv_type;
    char cerr[CELER_ERROR_LEN];
    if ((s = celer_context_create(model, &cp, &eng->ctx, cerr, sizeof cerr)) != CELER_OK) {
        error_set(&e, s, "%s", cerr);
        goto fail;
    }
    eng->kv = context_kv(eng->ctx);
    const size_t nb = (size_t)p.batch_tokens, ns = (size_t)p.n_seq_max;
    eng->running = calloc(ns, sizeof *eng->running);
    eng->b_token = malloc(nb * sizeof *eng->b_token);
    eng->b_seq = malloc(nb * sizeof *eng->b_seq);
    eng->b_logits = malloc(nb * sizeof *eng->b_logits);
    eng->b_owner = malloc(nb * sizeof *eng->b_owner);
    eng->take = malloc(ns * sizeof *eng->take);
    eng->logits = malloc(ns * (size_t)eng->v * sizeof *eng->logits);
    eng->ids = malloc(ns * sizeof *eng->ids);
    eng->cap_events = (int64_t)ns;
    eng->events = malloc(ns * sizeof *eng->events);
    if (celer_model_has_vision(model) &&
        !(eng->b_embd = malloc(nb * (size_t)celer_model_n_embd(model) * sizeof *eng->b_embd)))
        goto oom;
    if (!eng->running || !eng->b_token || !eng->b_seq || !eng->b_logits || !eng->b_owner ||
        !eng->take || !eng->logits || !eng->ids || !eng->events)
        goto oom;
    eng->next_id = 1;
    eng->st.kv_blocks_total = eng->kv->n_blocks;
    *out = eng;
    return CELER_OK;
oom:
    s = error_set(&e, CELER_STATUS_OUT_OF_MEMORY, "engine: out of memory");
fail:
    celer_engine_destroy(eng);
    error_copy(&e, err, err_size);
    return s;
}

static void choice_free(choice *c) {
    logits_proc_destroy(c->lp);
    celer_detok_stream_destroy(c->ds);
    free(c->tokens);
    free(c->text);
}

static void spans_free(image_span *spans, int32_t n) {
    for (int32_t i = 0; spans && i < n; i++) {
        celer_image_free(spans[i].img);
        free(spans[i].rows);
    }
    free(spans);
}

static void request_free(request *r) {
    for (int32_t i = 0; r->choices && i < r->p.n; i++) choice_free(&r->choices[i]);
    for (int32_t i = 0; r->stop && i < r->p.n_stop; i++) free(r->stop[i]);
    spans_free(r->spans, r->n_spans);
    grammar_free(r->grammar);
    free(r->end_ids);
    free(r->choices);
    free(r->prompt);
    free(r->bias_ids);
    free(r->bias);
    free(r->stop_ids);
    free(r->stop);
    free(r->error);
    free(r);
}

void celer_engine_destroy(celer_engine *eng) {
    if (!eng) return;
    while (eng->requests) {
        request *r = eng->requests;
        eng->requests = r->next;
        request_free(r);
    }
    celer_context_destroy(eng->ctx);
    free(eng->running);
    free(eng->b_token);
    free(eng->b_seq);
    free(eng->b_logits);
    free(eng->b_owner);
    free(eng->take);
    free(eng->logits);
    free(eng->ids);
    free(eng->events);
    grammar_vocab_free(eng->gvocab);
    free(eng->b_embd);
    free(eng);
}

const char *celer_engine_last_error(const celer_engine *eng) {
    return eng->err.msg;
}

static int32_t running_count(const celer_engine *eng) {
    int32_t n = 0;
    for (int32_t s = 0; s < eng->p.n_seq_max; s++) n += eng->running[s] != NULL;
    return n;
}

bool celer_engine_pending(const celer_engine *eng) {
    /* requests whose every end went out only wait for the next run to free them */
    for (const request *r = eng->requests; r; r = r->next)
        if (r->n_open > 0) return true;
    return false;
}

celer_engine_stats celer_engine_get_stats(const celer_engine *eng) {
    celer_engine_stats st = eng->st;
    st.running = running_count(eng);
    st.waiting = eng->n_waiting;
    st.kv_blocks_used = kv_cache_used(eng->kv);
    st.kv_blocks_cached = eng->kv->n_lru;
    return st;
}

/* ==== Submission ==== */

static void queue_push(celer_engine *eng, choice *c, bool front) {
    c->next = NULL;
    if (!eng->queue_head) {
        eng->queue_head = eng->queue_tail = c;
    } else if (front) {
        c->next = eng->queue_head;
        eng->queue_head = c;
    } else {
        eng->queue_tail->next = c;
        eng->queue_tail = c;
    }
    eng->n_waiting++;
}

static void queue_remove(celer_engine *eng, choice *c) {
    choice **link = &eng->queue_head, *prev = NULL;
    while (*link && *link != c) prev = *link, link = &(*link)->next;
    if (!*link) return;
    *link = c->next;
    if (eng->queue_tail == c) eng->queue_tail = prev;
    eng->n_waiting--;
}

static celer_status check_request(celer_engine *eng, const celer_request_params *p) {
    celer_error *e = &eng->err;
    if (!p->prompt || p->n_prompt <= 0)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "prompt: expected at least one token");
    if (p->n_prompt >= eng->p.n_ctx)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "prompt: %lld tokens leave no room in a context of %lld positions",
                         (long long)p->n_prompt, (long long)eng->p.n_ctx);
    for (int64_t i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= eng->v)
            return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                             "prompt[%lld]: token id %d outside the vocabulary [0, %lld)",
                             (long long)i, p->prompt[i], (long long)eng->v);
    if (kv_cache_blocks_for(eng->kv, p->n_prompt + 1) > eng->kv->n_blocks)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "prompt: %lld tokens do not fit the KV pool of %lld positions",
                         (long long)p->n_prompt,
                         (long long)(eng->kv->n_blocks * eng->kv->block_size));
    if (p->max_tokens < -1 || p->max_tokens == 0)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "max_tokens: expected a positive count or -1, got %lld",
                         (long long)p->max_tokens);
    if (p->n < 1 || p->n > CELER_MAX_CHOICES || (eng->p.max_queue && p->n > eng->p.max_queue))
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "n: expected 1 to %d choices, got %d",
                         eng->p.max_queue && eng->p.max_queue < CELER_MAX_CHOICES
                             ? eng->p.max_queue
                             : CELER_MAX_CHOICES,
                         p->n);
    if (p->top_logprobs < -1 || p->top_logprobs > CELER_MAX_TOP_LOGPROBS)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "top_logprobs: expected -1 to %d, got %d", CELER_MAX_TOP_LOGPROBS,
                         p->top_logprobs);
    if (p->n_bias < 0 || (p->n_bias && (!p->bias_ids || !p->bias)) || p->n_stop_ids < 0 ||
        (p->n_stop_ids && !p->stop_ids) || p->n_stop < 0 || (p->n_stop && !p->stop))
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "request: an array is missing its data");
    for (int32_t i = 0; i < p->n_bias; i++)
        if (p->bias_ids[i] < 0 || p->bias_ids[i] >= eng->v || !isfinite(p->bias[i]))
            return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                             "logit_bias: token id %d outside the vocabulary or a bias that is not "
                             "finite",
                             p->bias_ids[i]);
    for (int32_t i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0])
            return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                             "stop[%d]: expected a non-empty string", i);
    if (p->n_stop && !eng->tok)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "stop: stop strings need the engine to have a tokenizer");
    if (p->grammar && !eng->tok)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "grammar: a grammar needs the engine to have a tokenizer");
    if (eng->p.max_queue && eng->n_waiting + p->n > eng->p.max_queue)
        return error_set(e, CELER_STATUS_BUSY, "the queue is full (%d requests wait)",
                         eng->n_waiting);
    return CELER_OK;
}

static void *dup_array(const void *src, size_t bytes, bool *ok) {
    if (!bytes) return NULL;
    void *d = malloc(bytes);
    if (!d)
        *ok = false;
    else
        memcpy(d, src, bytes);
    return d;
}

static celer_status choice_init(celer_engine *eng, request *r, int32_t i) {
    choice *c = &r->choices[i];
    const celer_sampler_params *sp = &r->p.sampling;
    const logits_proc_params lpp = {.bias_ids = r->bias_ids,
                                    .bias = r->bias,
                                    .n_bias = r->p.n_bias,
                                    .presence_penalty = r->p.presence_penalty,
                                    .frequency_penalty = r->p.frequency_penalty,
                                    .grammar = r->grammar,
                                    .vocab = eng->gvocab,
                                    .end_ids = r->end_ids,
                                    .n_end = r->n_end,
                                    .sampler = {sp->temp, sp->top_k, sp->top_p, sp->min_p,
                                                sp->repeat_penalty, sp->repeat_last_n,
                                                sp->seed + (uint64_t)i}};
    c->req = r;
    c->index = i;
    c->seq = -1;
    c->tokens = malloc(sizeof *c->tokens * (size_t)eng->p.n_ctx);
    c->lp = logits_proc_create(&lpp, eng->v, eng->p.n_ctx);
    if (!c->tokens || !c->lp) return CELER_STATUS_OUT_OF_MEMORY;
    if (eng->tok &&
        celer_detok_stream_create(eng->tok, !r->p.keep_special, &c->ds, NULL, 0) != CELER_OK)
        return CELER_STATUS_OUT_OF_MEMORY;
    memcpy(c->tokens, r->prompt, sizeof *c->tokens * (size_t)r->p.n_prompt);
    c->n_tokens = r->p.n_prompt;
    for (int64_t t = 0; t < r->p.n_prompt; t++) logits_proc_accept_prompt(c->lp, r->prompt[t]);
    return CELER_OK;
}

/* The prompt with each image token expanded to its block's rows (*out malloc'd), and where
 * each block's rows sit (*spans, *n_spans: an image's blocks take its tokens in order). */
static celer_status expand_images(celer_engine *eng, const celer_request_params *p, int32_t **out,
                                  int64_t *n_out, image_span **spans, int32_t *n_spans) {
    celer_error *e = &eng->err;
    *out = NULL, *spans = NULL, *n_spans = 0;
    if (!p->prompt || p->n_prompt <= 0)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "prompt: expected at least one token");
    if (p->n_images < 0 || (p->n_images && !p->images))
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                         "images: expected an array of n_images images");
    const bool vision = celer_model_has_vision(eng->model);
    if (p->n_images && !vision)
        return error_set(e, CELER_STATUS_INVALID_ARGUMENT, "images: %s reads no images",
                         celer_model_desc(eng->model));
    const int32_t tok = celer_model_image_token(eng->model);
    int64_t found = 0, want = 0, n = p->n_prompt;
    for (int64_t i = 0; vision && i < p->n_prompt; i++) found += p->prompt[i] == tok;
    int64_t *rows = calloc((size_t)p->n_images + 1, sizeof *rows),
            *blocks = calloc((size_t)p->n_images + 1, sizeof *blocks);
    celer_status s = CELER_OK;
    if (!rows || !blocks) {
        s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "submit: out of memory");
        goto done;
    }
    for (int32_t k = 0; k < p->n_images; k++) {
        char msg[CELER_ERROR_LEN];
        if (!p->images[k]) {
            s = error_set(e, CELER_STATUS_INVALID_ARGUMENT, "images[%d]: NULL", k);
            goto done;
        }
        if (celer_model_image_positions(eng->model, p->images[k], &rows[k], msg, sizeof msg) !=
                CELER_OK ||
            celer_model_image_blocks(eng->model, p->images[k], &blocks[k], msg, sizeof msg) !=
                CELER_OK) {
            s = error_set(e, CELER_STATUS_INVALID_ARGUMENT, "images[%d]: %s", k, msg);
            goto done;
        }
        want += blocks[k];
        n += rows[k] - blocks[k];
        if (eng->blocks_whole && rows[k] / blocks[k] > eng->p.batch_tokens) {
            s = error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                          "images[%d]: an image block of %lld rows does not fit a step of "
                          "batch_tokens %lld (its rows "
                          "attend to each other in one step)",
                          k, (long long)(rows[k] / blocks[k]), (long long)eng->p.batch_tokens);
            goto done;
        }
    }
    if (found != want) {
        s = error_set(e, CELER_STATUS_INVALID_ARGUMENT,
                      "prompt: %lld image tokens (id %d) for %d images of %lld blocks: expected "
                      "one per block",
                      (long long)found, tok, p->n_images, (long long)want);
        goto done;
    }
    if (!(*spans = calloc((size_t)want + 1, sizeof **spans)) ||
        !(*out = malloc(sizeof **out * (size_t)n))) {
        s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "submit: out of memory");
        goto done;
    }
    int64_t at = 0;
    int32_t k = 0, j = 0, first = 0;
    for (int64_t i = 0; i < p->n_prompt; i++) {
        if (p->prompt[i] != tok || k >= p->n_images) {
            (*out)[at++] = p->prompt[i];
            continue;
        }
        image_span *sp = &(*spans)[*n_spans];
        if (j == 0) first = *n_spans;
        *sp = (image_span){.start = at,
                           .n = rows[k] / blocks[k],
                           .img = celer_image_ref(p->images[k]),
                           .first = first,
                           .block = j};
        ++*n_spans;
        for (int64_t r = 0; r < sp->n; r++) (*out)[at++] = tok;
        if (++j == blocks[k]) j = 0, k++;
    }
    *n_out = n;
done:
    free(rows), free(blocks);
    return s;
}

/* The grammar of r (and the engine's token bytes, the first time) and the ids that end its
 * choices. */
static celer_status request_grammar(celer_engine *eng, request *r) {
    celer_error *e = &eng->err;
    celer_status s = grammar_parse(r->p.grammar, strlen(r->p.grammar), &r->grammar, e);
    if (s != CELER_OK) { /* "grammar line L column C: ...", as "grammar: line L ..." */
        char msg[sizeof e->msg];
        snprintf(msg, sizeof msg, "%s", e->msg);
        const char *at = strncmp(msg, "grammar ", 8) ? msg : msg + 8;
        return error_set(e, s, "grammar: %s", at);
    }
    if (!eng->gvocab) {
        char **bytes;
        size_t *len;
        const tokenizer *t = tok_of(eng->tok);
        if ((s = tok_vocab_bytes(t, &bytes, &len, e)) != CELER_OK) return s;
        /* ids the model has beyond the tokenizer's (padding) have no bytes */
        const int64_t nt = tok_vocab_size(t);
        char **b = calloc((size_t)eng->v, sizeof *b);
        size_t *l = calloc((size_t)eng->v, sizeof *l);
        if (b && l) {
            for (int64_t i = 0; i < eng->v && i < nt; i++) b[i] = bytes[i], l[i] = len[i];
            s = grammar_vocab_create((const char *const *)b, l, eng->v, NULL, 0, &eng->gvocab, e);
        } else {
            s = error_set(e, CELER_STATUS_OUT_OF_MEMORY, "grammar: out of memory");
        }
        free(b), free(l);
        tok_vocab_bytes_free(bytes, len);
        if (s != CELER_OK) return s;
    }
    const int32_t n_eos = r->p.ignore_eos ? 0 : eng->model->n_eos;
    if (!(r->end_ids = malloc(sizeof *r->end_ids * (size_t)(n_eos + r->p.n_stop_ids + 1))))
        return error_set(e, CELER_STATUS_OUT_OF_MEMORY, "grammar: out of memory");
    for (int32_t i = 0; i < n_eos; i++) r->end_ids[r->n_end++] = eng->model->eos[i];
    for (int32_t i = 0; i < r->p.n_stop_ids; i++) r->end_ids[r->n_end++] = r->stop_ids[i];
    return CELER_OK;
}

celer_status celer_engine_submit(celer_engine *eng, const celer_request_params *params,
                                 uint64_t *id, char *err, size_t err_size) {
    int32_t *prompt;
    int64_t n_prompt = 0;
    image_span *spans;
    int32_t n_spans;
    celer_status s = expand_images(eng, params, &prompt, &n_prompt, &spans, &n_spans);
    celer_request_params q = *params;
    q.prompt = prompt, q.n_prompt = n_prompt;
    if (s == CELER_OK) s = check_request(eng, &q);
    if (s != CELER_OK) {
        spans_free(spans, n_spans);
        free(prompt);
        error_copy(&eng->err, err, err_size);
        return s;
    }
    request *r = calloc(1, sizeof *r);
    if (!r) {
        spans_free(spans, n_spans);
        free(prompt);
        goto oom;
    }
    const celer_request_params *p = &q;
    bool ok = true;
    r->p = *p;
    r->spans = spans;
    r->n_spans = n_spans;
    r->prompt = prompt;
    r->bias_ids = dup_array(p->bias_ids, sizeof *p->bias_ids * (size_t)p->n_bias, &ok);
    r->bias = dup_array(p->bias, sizeof *p->bias * (size_t)p->n_bias, &ok);
    r->stop_ids = dup_array(p->stop_ids, sizeof *p->stop_ids * (size_t)p->n_stop_ids, &ok);
    if (p->n_stop && !(r->stop = calloc((size_t)p->n_stop, sizeof *r->stop))) ok = false;
    for (int32_t i = 0; ok && i < p->n_stop; i++) ok = (r->stop[i] = strdup(p->stop[i])) != NULL;
    r->p.prompt = r->prompt, r->p.bias_ids = r->bias_ids, r->p.bias = r->bias, r->p.images = NULL;
    r->p.stop_ids = r->stop_ids, r->p.stop = (const char *const *)r->stop;
    if (!ok) goto oom;
    if (p->grammar && (s = request_grammar(eng, r)) != CELER_OK) {
        request_free(r);
        error_copy(&eng->err, err, err_size);
        return s;
    }
    r->p.grammar = NULL; /* compiled into r->grammar */
    if (!(r->choices = calloc((size_t)p->n, sizeof *r->choices))) goto oom;
    for (int32_t i = 0; i < p->n; i++)
        if (choice_init(eng, r, i) != CELER_OK) goto oom;
    r->id = eng->next_id++;
    r->n_open = p->n;
    r->next = eng->requests;
    eng->requests = r;
    for (int32_t i = 0; i < p->n; i++) queue_push(eng, &r->choices[i], false);
    eng->st.prompt_tokens_total += p->n_prompt;
    *id = r->id;
    eng->err.msg[0] = '\0';
    return CELER_OK;
oom:
    if (r) request_free(r);
    s = error_set(&eng->err, CELER_STATUS_OUT_OF_MEMORY, "submit: out of memory");
    error_copy(&eng->err, err, err_size);
    return s;
}

/* ==== Sequences ==== */

/* Takes c off its sequence; its blocks go back to the pool (or the LRU list). */
static void choice_stop_running(celer_engine *eng, choice *c) {
    if (c->seq < 0) return;
    kv_cache_seq_reset(eng->kv, c->seq);
    eng->running[c->seq] = NULL;
    c->seq = -1;
}

celer_status celer_engine_cancel(celer_engine *eng, uint64_t id) {
    request *r = eng->requests;
    while (r && r->id != id) r = r->next;
    if (!r)
        return error_set(&eng->err, CELER_STATUS_NOT_FOUND, "no request %llu",
                         (unsigned long long)id);
    for (int32_t i = 0; i < r->p.n; i++) {
        choice *c = &r->choices[i];
        if (c->finish != CELER_FINISH_NONE) continue;
        choice_stop_running(eng, c);
        queue_remove(eng, c);
        c->finish = CELER_FINISH_CANCELLED;
    }
    return CELER_OK;
}

/* What block b of r's prompt depends on besides its ids: the digests of the images whose
 * rows it holds, each with its offset and which of the image's blocks they are (0 for
 * text). */
static uint64_t block_extra(const request *r, int64_t b, int64_t bs) {
    uint64_t x = 0;
    for (int32_t i = 0; i < r->n_spans; i++) {
        const image_span *sp = &r->spans[i];
        if (sp->start >= (b + 1) * bs || sp->start + sp->n <= b * bs) continue;
        const uint64_t d = celer_image_digest(sp->img) +
                           (uint64_t)(sp->start - b * bs) * 0x9e3779b97f4a7c15ull +
                           (uint64_t)sp->block * 0xbf58476d1ce4e5b9ull;
        x = (x ^ d) * 0x100000001b3ull + 1;
    }
    return x;
}

/* Gives c a free sequence and attaches whatever prefix of its tokens the cache (or its
 * request's first choice, for sibling choices) already holds. Leaves at least one token
 * to compute, since its row gives the logits to sample from. */
static void choice_admit(celer_engine *eng, choice *c, int32_t seq) {
    kv_cache *kv = eng->kv;
    const int64_t bs = kv->block_size, max_blocks = (c->n_tokens - 1) / bs;
    c->seq = seq;
    c->order = eng->next_order++;
    eng->running[seq] = c;
    const choice *lead = &c->req->choices[0];
    if (c != lead && lead->seq >= 0 && !c->admitted_once) {
        /* The prompt's full blocks of the first choice (written, never written again). */
        kv_cache_seq_attach(kv, seq, kv_cache_table(kv, lead->seq), (c->req->p.n_prompt - 1) / bs);
    } else if (eng->p.prefix_cache) {
        uint64_t h = 0;
        for (int64_t b = 0; b < max_blocks; b++) {
            const uint64_t x = block_extra(c->req, b, bs);
            h = kv_cache_hash(kv, h, c->tokens + b * bs, x);
            const int32_t blk = kv_cache_lookup(kv, h, c->tokens + b * bs, x);
            if (blk < 0) break;
            kv_cache_seq_attach(kv, seq, &blk, 1);
        }
        if (!c->admitted_once) {
            eng->st.prefix_queries_total += max_blocks * bs;
            eng->st.prefix_hits_total += kv->len[seq];
        }
    }
    c->n_done = kv->len[seq];
    if (!c->admitted_once) c->cached = c->n_done;
    c->admitted_once = true;
}

/* Publishes the blocks c filled in the step that took it from `from` to c->n_done. */
static void choice_publish(celer_engine *eng, choice *c, int64_t from) {
    kv_cache *kv = eng->kv;
    const int64_t bs = kv->block_size;
    const int64_t first = from / bs, last = c->n_done / bs; /* full blocks [first, last) */
    if (!eng->p.prefix_cache || first >= last) return;
    uint64_t h = 0;
    for (int64_t b = 0; b < last; b++) {
        const uint64_t x = block_extra(c->req, b, bs);
        h = kv_cache_hash(kv, h, c->tokens + b * bs, x);
        if (b >= first) kv_cache_publish(kv, c->seq, b, h, c->tokens + b * bs, x);
    }
}

/* The youngest running choice, or NULL. */
static choice *youngest_running(celer_engine *eng) {
    choice *y = NULL;
    for (int32_t s = 0; s < eng->p.n_seq_max; s++)
        if (eng->running[s] && (!y || eng->running[s]->order > y->order)) y = eng->running[s];
    return y;
}

static void preempt(celer_engine *eng, choice *c) {
    choice_stop_running(eng, c);
    c->n_done = 0;
    queue_push(eng, c, true);
    eng->st.preemptions_total++;
}

/* ==== Planning a step ==== */

static int64_t blocks_to_grow(const kv_cache *kv, int64_t len, int64_t add) {
    return kv_cache_blocks_for(kv, len + add) - kv_cache_blocks_for(kv, len);
}

/* The image span holding prompt position pos of r, or NULL. */
static image_span *span_at(request *r, int64_t pos) {
    for (int32_t i = 0; i < r->n_spans; i++)
        if (pos >= r->spans[i].start && pos < r->spans[i].start + r->spans[i].n)
            return &r->spans[i];
    return NULL;
}

/* Encodes the images whose rows c's positions [n_done, n_done + k) read and that have
 * no rows yet (into the span of each image's first block). */
static celer_status encode_images(celer_engine *eng, choice *c, int64_t k) {
    request *r = c->req;
    for (int32_t i = 0; i < r->n_spans; i++) {
        const image_span *sp = &r->spans[i];
        image_span *owner = &r->spans[sp->first];
        if (owner->rows || sp->start >= c->n_done + k || sp->start + sp->n <= c->n_done) continue;
        int64_t n;
        char msg[CELER_ERROR_LEN];
        if (celer_model_image_positions(eng->model, sp->img, &n, msg, sizeof msg) != CELER_OK)
            return error_set(&eng->err, CELER_STATUS_INVALID_ARGUMENT, "image %d: %s", sp->first,
                             msg);
        if (!(owner->rows = malloc(sizeof(float) * (size_t)(n * celer_model_n_embd(eng->model)))))
            return error_set(&eng->err, CELER_STATUS_OUT_OF_MEMORY, "image %d: out of memory",
                             sp->first);
        celer_status s = celer_image_encode(eng->ctx, sp->img, owner->rows);
        if (s != CELER_OK) {
            free(owner->rows);
            owner->rows = NULL;
            return error_set(&eng->err, s, "image %d: %s", sp->first,
                             celer_context_last_error(eng->ctx));
        }
    }
    return CELER_OK;
}

/* How many of c's next k rows a step may take: all of them, unless they end inside an image
 * block of a model whose blocks run whole (Gemma 3); then up to the block (or 0: wait for a
 * step with room for the block whose middle c's rows start in, after a prefix-cache hit). */
static int64_t whole_blocks(const celer_engine *eng, request *r, const choice *c, int64_t k) {
    if (!eng->blocks_whole || !r->n_spans || k == 0 || c->n_done + k >= r->p.n_prompt) return k;
    const image_span *sp = span_at(r, c->n_done + k);
    if (!sp || sp->start == c->n_done + k) return k;
    return sp->start > c->n_done ? sp->start - c->n_done : 0;
}

/* Whether c's next token is the argmax of its raw logits: greedy, nothing added to the
 * logits (bias, penalties), no log-probabilities. Its row asks the context for the argmax
 * alone, which a GPU takes where the logits are. */
static bool choice_greedy(const choice *c) {
    return logits_proc_greedy(c->lp) && c->req->p.top_logprobs < 0;
}

/* Appends rows for c's tokens [n_done, n_done + k) to the batch: ids, or an image's rows
 * (encode_images ran first). */
static void add_rows(celer_engine *eng, int64_t *n, choice *c, int64_t k) {
    const int64_t d = celer_model_n_embd(eng->model);
    for (int64_t i = 0; i < k; i++, (*n)++) {
        const int64_t pos = c->n_done + i;
        const image_span *sp = pos < c->req->p.n_prompt ? span_at(c->req, pos) : NULL;
        eng->b_token[*n] = sp ? -1 : c->tokens[pos];
        if (sp) {
            const float *rows = c->req->spans[sp->first].rows + sp->block * sp->n * d;
            memcpy(eng->b_embd + *n * d, rows + (pos - sp->start) * d, sizeof(float) * (size_t)d);
            eng->b_has_embd = true;
        }
        eng->b_seq[*n] = c->seq;
        eng->b_logits[*n] = c->n_done + i != c->n_tokens - 1 ? 0
                            : choice_greedy(c)               ? CELER_ROW_ARGMAX
                                                             : CELER_ROW_LOGITS;
        eng->b_owner[*n] = c;
    }
}

/* Ends c with CELER_FINISH_ERROR for the reason why (its request keeps the first one);
 * its final event goes out with the next events. */
static void choice_fail(celer_engine *eng, choice *c, const char *why) {
    choice_stop_running(eng, c);
    queue_remove(eng, c);
    c->finish = CELER_FINISH_ERROR;
    if (!c->req->error) c->req->error = strdup(why);
}

/* Whether c's next k rows can go into the step: their images are encoded. A failed
 * encoding ends the choice with the engine's last error. */
static bool rows_ready(celer_engine *eng, choice *c, int64_t k) {
    if (!c->req->n_spans || encode_images(eng, c, k) == CELER_OK) return true;
    choice_fail(eng, c, eng->err.msg);
    return false;
}

/* Whether a waiting choice may start now: sibling choices wait until their first choice
 * has computed the prompt they share. */
static bool may_admit(const choice *c) {
    const choice *lead = &c->req->choices[0];
    if (c == lead || c->admitted_once || lead->finish != CELER_FINISH_NONE) return true;
    return lead->seq >= 0 && lead->n_done >= c->req->p.n_prompt;
}

/* Fills the batch; returns its rows. Decode rows of running choices come first (the
 * youngest choices are pre-empted until they fit the pool), then prefill chunks of
 * running choices in admission order, then newly admitted choices, all within the token
 * budget. A new choice is admitted only when its first chunk fits and leaves a block of
 * growth for every running choice. */
static int64_t plan(celer_engine *eng, int64_t *take) {
    kv_cache *kv = eng->kv;
    const int64_t budget = eng->p.batch_tokens;
    int64_t n = 0, avail;
    eng->b_has_embd = false;
    for (;;) {
        int64_t need = 0;
        for (int32_t s = 0; s < eng->p.n_seq_max; s++) {
            const choice *c = eng->running[s];
            if (c && c->n_tokens - c->n_done == 1) need += blocks_to_grow(kv, kv->len[s], 1);
        }
        if (need <= kv_cache_available(kv)) break;
        choice *y = youngest_running(eng);
        if (running_count(eng) > 1) {
            preempt(eng, y);
        } else {
            /* Alone and the pool is full: it cannot grow any further. */
            choice_stop_running(eng, y);
            y->finish = CELER_FINISH_LENGTH;
        }
    }
    avail = kv_cache_available(kv);
    memset(take, 0, sizeof *take * (size_t)eng->p.n_seq_max);
    for (int32_t s = 0; s < eng->p.n_seq_max; s++) {
        choice *c = eng->running[s];
        if (!c || c->n_tokens - c->n_done != 1) continue;
        if (!rows_ready(eng, c, 1)) continue;
        avail -= blocks_to_grow(kv, kv->len[s], 1);
        take[s] = 1;
        add_rows(eng, &n, c, 1);
    }
    /* Prefill chunks, oldest admission first. */
    for (;;) {
        choice *c = NULL;
        for (int32_t s = 0; s < eng->p.n_seq_max; s++) {
            choice *r = eng->running[s];
            if (r && !take[s] && r->n_tokens - r->n_done > 1 && (!c || r->order < c->order)) c = r;
        }
        if (!c || n >= budget) break;
        int64_t k = c->n_tokens - c->n_done;
        if (k > budget - n) k = budget - n;
        while (k > 0 && blocks_to_grow(kv, kv->len[c->seq], k) > avail) k -= 1;
        k = whole_blocks(eng, c->req, c, k);
        if (k == 0) {
            take[c->seq] = -1; /* waits for blocks this step */
            continue;
        }
        if (!rows_ready(eng, c, k)) {
            take[c->seq] = -1;
            continue;
        }
        avail -= blocks_to_grow(kv, kv->len[c->seq], k);
        take[c->seq] = k;
        add_rows(eng, &n, c, k);
    }
    /* New choices from the queue. */
    int32_t n_running = running_count(eng);
    for (choice *c = eng->queue_head, *next; c && n < budget; c = next) {
        next = c->next;
        int32_t seq = 0;
        while (seq < eng->p.n_seq_max && eng->running[seq]) seq++;
        if (seq == eng->p.n_seq_max) break;
        if (!may_admit(c)) continue;
        queue_remove(eng, c);
        choice_admit(eng, c, seq);
        avail = kv_cache_available(kv);
        for (int32_t s = 0; s < eng->p.n_seq_max; s++)
            if (take[s] > 0) avail -= blocks_to_grow(kv, kv->len[s], take[s]);
        int64_t k = c->n_tokens - c->n_done;
        if (k > budget - n) k = budget - n;
        k = whole_blocks(eng, c->req, c, k);
        if (k == 0 || blocks_to_grow(kv, kv->len[seq], k) + n_running > avail) {
            /* Not now: back to the head of the queue, blocks released. */
            choice_stop_running(eng, c);
            c->n_done = 0;
            queue_push(eng, c, true);
            break;
        }
        if (!rows_ready(eng, c, k)) continue;
        n_running++;
        take[seq] = k;
        add_rows(eng, &n, c, k);
    }
    for (int32_t s = 0; s < eng->p.n_seq_max; s++)
        if (take[s] < 0) take[s] = 0;
    return n;
}

/* ==== Apply: each choice's rows ==== */

/* A new event of the step for c (the list grows in whole doublings, rarely: it holds one
 * event per running choice and the ends of the others); NULL when out of memory. */
static step_event *event_new(celer_engine *eng, choice *c) {
    if (eng->n_events == eng->cap_events) {
        const int64_t cap = eng->cap_events * 2;
        step_event *ev = realloc(eng->events, sizeof *ev * (size_t)cap);
        if (!ev) return NULL;
        eng->events = ev, eng->cap_events = cap;
    }
    step_event *ev = &eng->events[eng->n_events++];
    *ev = (step_event){.c = c, .token = -1};
    return ev;
}

/* Decides c's end: off its sequence and out of the queue, its final event recorded (or, out
 * of memory, counted as sent). */
static void choice_end(celer_engine *eng, choice *c, step_event *ev) {
    choice_stop_running(eng, c);
    queue_remove(eng, c);
    if (!ev && (ev = event_new(eng, c))) ev->finish = c->finish;
    c->reported = true;
    c->req->n_open--;
}

/* log-softmax of the raw logits l[v]: the k most likely ids and their log-probabilities
 * into ev; returns the normalizer. */
static float log_normalizer(int64_t v, const float *l, int32_t k, step_event *ev) {
    float mx = l[0];
    for (int64_t i = 1; i < v; i++) mx = l[i] > mx ? l[i] : mx;
    double sum = 0;
    for (int64_t i = 0; i < v; i++) sum += exp((double)l[i] - mx);
    const float lse = mx + (float)log(sum);
    int32_t *top = ev->top_ids;
    for (int32_t j = 0; j < k; j++) top[j] = -1;
    for (int64_t i = 0; i < v; i++) {
        int32_t j = k;
        while (j > 0 && (top[j - 1] < 0 || l[i] > l[top[j - 1]])) j--;
        if (j == k) continue;
        memmove(top + j + 1, top + j, sizeof *top * (size_t)(k - j - 1));
        top[j] = (int32_t)i;
    }
    for (int32_t j = 0; j < k; j++) ev->top_lp[j] = l[top[j]] - lse;
    ev->n_top = k;
    return lse;
}

static bool is_stop_id(const celer_engine *eng, const request *r, int32_t tok) {
    if (!r->p.ignore_eos && celer_model_is_eos(eng->model, tok)) return true;
    for (int32_t i = 0; i < r->p.n_stop_ids; i++)
        if (r->stop_ids[i] == tok) return true;
    return false;
}

/* Hands c the logits rows the step computed for it: rows[n_rows, v] (NULL for a
 * choice_greedy row, whose token is argmax[0]). The plan asks one row of a choice, the one
 * after its last known token; c samples its next token from it and records the event.
 * Log-probabilities are the model's own (before bias and penalties), as OpenAI reports. */
static void choice_apply(celer_engine *eng, choice *c, float *rows, const int32_t *argmax,
                         int64_t n_rows) {
    const request *r = c->req;
    step_event *ev = event_new(eng, c);
    float *l = rows ? rows + (n_rows - 1) * eng->v : NULL;
    int32_t tok = argmax[n_rows - 1];
    if (l) {
        step_event scratch;
        step_event *top = ev ? ev : &scratch;
        const int32_t n_top = r->p.top_logprobs > 0 ? r->p.top_logprobs : 0;
        const float lse = r->p.top_logprobs >= 0 ? log_normalizer(eng->v, l, n_top, top) : 0;
        if ((tok = logits_proc_sample(c->lp, l)) < 0) { /* the grammar leaves no token */
            c->finish = CELER_FINISH_STOP;
            if (ev) ev->finish = c->finish, ev->n_top = 0;
            choice_end(eng, c, ev);
            return;
        }
        if (r->p.top_logprobs >= 0)
            top->logprob = l[tok] - logits_proc_adjustment(c->lp, tok) - lse;
    }
    logits_proc_accept(c->lp, tok);
    c->tokens[c->n_tokens++] = tok;
    c->n_gen++;
    eng->st.generation_tokens_total++;
    if (ev) ev->token = tok;
    const bool stop_id = is_stop_id(eng, r, tok);
    if (ev) ev->stop_id = stop_id;
    if (stop_id || logits_proc_done(c->lp)) /* an end id, or a sentence nothing can extend */
        c->finish = CELER_FINISH_STOP;
    else if ((r->p.max_tokens > 0 && c->n_gen >= r->p.max_tokens) || c->n_tokens >= eng->p.n_ctx)
        c->finish = CELER_FINISH_LENGTH;
    if (ev) ev->finish = c->finish;
    if (c->finish != CELER_FINISH_NONE) choice_end(eng, c, ev);
}

/* Frees requests whose every choice has reported its end. */
static void reap(celer_engine *eng) {
    for (request **link = &eng->requests; *link;) {
        request *r = *link;
        if (r->n_open > 0) {
            link = &r->next;
            continue;
        }
        *link = r->next;
        request_free(r);
    }
}

/* ==== The text stage ==== */

static bool text_append(choice *c, const char *s, size_t n) {
    if (c->len + n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 256;
        while (cap < c->len + n + 1) cap *= 2;
        char *t = realloc(c->text, cap);
        if (!t) return false;
        c->text = t;
        c->cap = cap;
    }
    memcpy(c->text + c->len, s, n);
    c->len += n;
    c->text[c->len] = '\0';
    return true;
}

/* Detokenizes one event's token, matches the stop strings, and reports it. Touches only
 * what the text stage owns (the last group of struct choice), what the run wrote before
 * it, and the request's fixed parameters: never what submit and cancel change. */
static void event_emit(celer_engine *eng, const step_event *se, celer_event_fn fn, void *user) {
    choice *c = se->c;
    const request *r = c->req;
    celer_event ev = {.request = r->id,
                      .index = c->index,
                      .token = se->token,
                      .text = "",
                      .logprob = se->logprob,
                      .n_top = se->n_top,
                      .top_ids = se->top_ids,
                      .top_logprobs = se->top_lp,
                      .finish = se->finish};
    const size_t from = c->sent;
    bool matched = false;
    if (se->token >= 0 && c->ds && !se->stop_id) {
        const char *piece;
        size_t n;
        if (celer_detok_stream_push(c->ds, se->token, &piece, &n, NULL, 0) == CELER_OK)
            text_append(c, piece, n);
        c->sent = stop_scan((const char *const *)r->stop, r->p.n_stop, c->text ? c->text : "",
                            c->len, c->sent, &matched);
        if (matched) {
            ev.finish = CELER_FINISH_STOP;
            c->text_done = !c->reported; /* the run has not ended it: the next one retires it */
        }
    }
    if (se->token >= 0 && ev.finish != CELER_FINISH_NONE && !matched) {
        /* Ended without a stop string, none can complete now: release what was held back,
         * and any bytes the detokenizer still holds. */
        const char *rest;
        size_t n;
        if (c->ds && celer_detok_stream_flush(c->ds, &rest, &n, NULL, 0) == CELER_OK)
            text_append(c, rest, n);
        c->sent = c->len;
    }
    ev.text = c->text ? c->text + from : "";
    ev.text_len = c->sent - from;
    if (ev.finish != CELER_FINISH_NONE) {
        if (ev.finish == CELER_FINISH_ERROR) ev.error = r->error ? r->error : "out of memory";
        ev.prompt_tokens = r->p.n_prompt;
        ev.cached_tokens = c->cached;
        ev.completion_tokens = c->n_gen;
    }
    fn(user, &ev);
}

void celer_engine_emit(celer_engine *eng, celer_event_fn fn, void *user) {
    for (int64_t i = 0; i < eng->n_events; i++) event_emit(eng, &eng->events[i], fn, user);
    eng->n_events = 0;
}

/* ==== The step: plan, run, apply ==== */

/* Ends the choices the text stage ended by a stop string (their final event went out), and
 * records the final events of choices that ended without one (cancelled, out of room while
 * planning, failed); then the requests that are done go. */
static void settle(celer_engine *eng) {
    for (request *r = eng->requests; r; r = r->next)
        for (int32_t i = 0; i < r->p.n; i++) {
            choice *c = &r->choices[i];
            if (c->text_done && !c->reported) {
                if (c->finish == CELER_FINISH_NONE) c->finish = CELER_FINISH_STOP;
                choice_stop_running(eng, c);
                queue_remove(eng, c);
                c->reported = true;
                r->n_open--;
            } else if (c->finish != CELER_FINISH_NONE && !c->reported) {
                choice_end(eng, c, NULL);
            }
        }
}

celer_status celer_engine_run(celer_engine *eng) {
    eng->n_events = 0;
    reap(eng);   /* requests whose last final event the previous step's text stage sent */
    settle(eng); /* ended outside a step: their end goes first */
    int64_t *take = eng->take, n = plan(eng, take);
    /* Prefills that each wait for blocks the others hold: pre-empt the youngest until one
     * can move. */
    while (n == 0 && running_count(eng) > 1) {
        preempt(eng, youngest_running(eng));
        n = plan(eng, take);
    }
    if (n == 0) {
        settle(eng); /* choices planning ended */
        return CELER_OK;
    }
    const celer_batch b = {.n = n,
                           .token = eng->b_token,
                           .embd = eng->b_has_embd ? eng->b_embd : NULL,
                           .seq_id = eng->b_seq,
                           .logits = eng->b_logits};
    celer_status s = celer_batch_decode_ids(eng->ctx, &b, eng->logits, eng->ids);
    if (s != CELER_OK) {
        /* The context kept nothing of the step (celer.h): each request with rows in it
         * fails as a whole, since the step's failure cannot be pinned on one of them. */
        error_set(&eng->err, s, "step: %s", celer_context_last_error(eng->ctx));
        for (int32_t q = 0; q < eng->p.n_seq_max; q++) {
            const choice *c = eng->running[q];
            if (!c || !take[q]) continue;
            request *r = c->req;
            for (int32_t i = 0; i < r->p.n; i++)
                if (r->choices[i].finish == CELER_FINISH_NONE)
                    choice_fail(eng, &r->choices[i], eng->err.msg);
        }
        settle(eng);
        return s;
    }
    for (int32_t q = 0; q < eng->p.n_seq_max; q++) {
        choice *c = eng->running[q];
        if (!c || !take[q]) continue;
        const int64_t from = c->n_done;
        c->n_done += take[q];
        choice_publish(eng, c, from);
    }
    /* Each choice's wanted rows are consecutive in the batch, so in the logits too. */
    for (int64_t r = 0, k = 0; r < n;) {
        if (!eng->b_logits[r]) {
            r++;
            continue;
        }
        choice *c = eng->b_owner[r];
        const bool argmax_only = eng->b_logits[r] == CELER_ROW_ARGMAX;
        const int64_t k0 = k;
        for (; r < n && eng->b_owner[r] == c; r++) k += eng->b_logits[r] != 0;
        if (c->finish == CELER_FINISH_NONE)
            choice_apply(eng, c, argmax_only ? NULL : eng->logits + k0 * eng->v, eng->ids + k0,
                         k - k0);
    }
    settle(eng); /* choices planning ended (out of room) */
    eng->err.msg[0] = '\0';
    return CELER_OK;
}

celer_status celer_engine_step(celer_engine *eng, celer_event_fn fn, void *user) {
    const celer_status s = celer_engine_run(eng);
    celer_engine_emit(eng, fn, user);
    return s;
}

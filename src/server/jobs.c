/*
 * jobs.c - the engine thread, its lock, and the routing of engine events to the jobs
 * that HTTP threads wait on (jobs.h).
 *
 * The engine lock guards the engine. The engine thread holds it while it runs a step
 * (plan, forward, token choice: celer_engine_run); an HTTP thread that wants it announces
 * itself in `waiters`, and the engine thread steps aside (waits on `turn`) before its next
 * step, so a submission or a cancellation waits at most one step. The step's text stage
 * (celer_engine_emit: detokenizing, stop strings, events) runs after the engine thread has
 * let go, under the list lock only, which guards the list of jobs and the metrics. Events
 * of a step are gathered per job and published when the text stage returns, under the
 * job's own small mutex: an HTTP thread draining pieces never contends with the engine,
 * and a step that failed can add its error before anyone sees the job as done. Locks are
 * taken in the order engine, list, job. This file does not format anything for the wire
 * and does not time out requests.
 */
#define _POSIX_C_SOURCE 200809L
#include "server/jobs.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct job {
    uint64_t id;               /* the engine's request id */
    int32_t n_choices, n_open; /* choices, and those whose end has not been seen */
    int32_t stop_id;
    bool ignore_eos, want_logprobs;
    bool failed; /* a choice ended with CELER_FINISH_ERROR */
    double t_submit, t_first;
    double *t_last;                   /* [n_choices] time of each choice's last token */
    job_piece *step_head, *step_tail; /* gathered during a step's text stage (list lock) */
    pthread_mutex_t mu;               /* guards what follows */
    pthread_cond_t cv;
    job_piece *head, *tail; /* published, not yet taken */
    bool finished;          /* every choice's end is published */
    job *next;              /* in jobs.list */
};

struct jobs {
    celer_model *model;
    celer_engine *eng;
    pthread_mutex_t mu;      /* the engine lock: the engine, quit */
    pthread_mutex_t list_mu; /* the list of jobs, n_active, metrics, each job's step pieces */
    pthread_cond_t work;     /* something was submitted or cancelled */
    pthread_cond_t turn;     /* an HTTP thread let go of mu */
    atomic_int waiters;      /* HTTP threads waiting for mu */
    pthread_t thread;
    bool started, quit;
    job *list;
    int n_active;
    server_metrics metrics;
    atomic_bool lost;   /* a step answered CELER_STATUS_DEVICE_LOST: lost_msg says why */
    char lost_msg[512]; /* written once, before lost is set */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* An absolute CLOCK_REALTIME deadline ms milliseconds from now, for timed waits. */
static struct timespec deadline_ms(int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    return ts;
}

/* The big lock, for every thread but the engine's. */
static void jobs_lock(jobs *js) {
    atomic_fetch_add(&js->waiters, 1);
    pthread_mutex_lock(&js->mu);
    atomic_fetch_sub(&js->waiters, 1);
}

static void jobs_unlock(jobs *js) {
    pthread_cond_signal(&js->turn);
    pthread_mutex_unlock(&js->mu);
}

void job_pieces_free(job_piece *p) {
    while (p) {
        job_piece *next = p->next;
        free(p->text);
        free(p->error);
        free(p);
        p = next;
    }
}

/* ==== The engine thread ==== */

static job *job_find(jobs *js, uint64_t id) {
    job *j = js->list;
    while (j && j->id != id) j = j->next;
    return j;
}

static void step_append(job *j, job_piece *p) {
    if (j->step_tail)
        j->step_tail->next = p;
    else
        j->step_head = p;
    j->step_tail = p;
}

/* Turns one engine event into a piece of its job (list lock held). Out of memory, the
 * piece (or its text) is dropped, but the job's bookkeeping still sees the event. */
static void on_event(void *user, const celer_event *ev) {
    jobs *js = user;
    job *j = job_find(js, ev->request);
    if (!j) return; /* released: its client is gone */
    const double t = now_s();
    job_piece *p = calloc(1, sizeof *p);
    if (p) {
        p->index = ev->index;
        p->token = ev->token;
        p->finish = ev->finish;
        if ((p->text = malloc(ev->text_len + 1))) {
            memcpy(p->text, ev->text, ev->text_len);
            p->text[ev->text_len] = '\0';
            p->len = ev->text_len;
        }
        const bool stop_token = ev->finish == CELER_FINISH_STOP && ev->token >= 0 &&
                                ev->text_len == 0 &&
                                (ev->token == j->stop_id ||
                                 (!j->ignore_eos && celer_model_is_eos(js->model, ev->token)));
        p->is_output = ev->token >= 0 && !stop_token;
        if (j->want_logprobs && ev->token >= 0) {
            p->logprob = ev->logprob;
            p->n_top = ev->n_top < CELER_MAX_TOP_LOGPROBS ? ev->n_top : CELER_MAX_TOP_LOGPROBS;
            memcpy(p->top_ids, ev->top_ids, sizeof *p->top_ids * (size_t)p->n_top);
            memcpy(p->top_logprobs, ev->top_logprobs, sizeof *p->top_logprobs * (size_t)p->n_top);
        }
        p->prompt_tokens = ev->prompt_tokens;
        p->cached_tokens = ev->cached_tokens;
        p->completion_tokens = ev->completion_tokens;
        if (ev->finish == CELER_FINISH_ERROR &&
            !(p->error = strdup(ev->error ? ev->error : "the model failed"))) {
            free(p->text);
            free(p); /* without its error the piece would read as a normal end */
            p = NULL;
        }
        if (p) step_append(j, p);
    }
    if (ev->token >= 0 && ev->index >= 0 && ev->index < j->n_choices) {
        if (j->t_first == 0) {
            j->t_first = t;
            metrics_observe(&js->metrics.ttft, t - j->t_submit);
        }
        if (j->t_last[ev->index] > 0) metrics_observe(&js->metrics.itl, t - j->t_last[ev->index]);
        j->t_last[ev->index] = t;
    }
    if (ev->finish != CELER_FINISH_NONE) {
        if (ev->finish == CELER_FINISH_ERROR && !j->failed) {
            j->failed = true;
            js->metrics.request_failures_total++;
        }
        if (--j->n_open == 0) {
            metrics_observe(&js->metrics.e2e, t - j->t_submit);
            js->metrics.requests_total++;
        }
    }
}

/* Hands each job what the step gave it (a failed choice's piece carries the error). */
static void publish(jobs *js) {
    for (job *j = js->list; j; j = j->next) {
        if (!j->step_head && !(j->n_open == 0 && !j->finished)) continue;
        pthread_mutex_lock(&j->mu);
        if (j->step_head) {
            if (j->tail)
                j->tail->next = j->step_head;
            else
                j->head = j->step_head;
            j->tail = j->step_tail;
        }
        j->step_head = j->step_tail = NULL;
        if (j->n_open == 0) j->finished = true;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
    }
}

static void *engine_main(void *arg) {
    jobs *js = arg;
    pthread_mutex_lock(&js->mu);
    while (!js->quit) {
        if (atomic_load(&js->waiters) > 0) {
            const struct timespec ts = deadline_ms(5);
            pthread_cond_timedwait(&js->turn, &js->mu, &ts);
            continue;
        }
        if (!celer_engine_pending(js->eng)) {
            pthread_cond_wait(&js->work, &js->mu);
            continue;
        }
        const celer_status s = celer_engine_run(js->eng);
        char why[512] = "";
        if (s != CELER_OK) snprintf(why, sizeof why, "%s", celer_engine_last_error(js->eng));
        pthread_mutex_unlock(&js->mu);
        pthread_mutex_lock(&js->list_mu);
        celer_engine_emit(js->eng, on_event, js);
        if (s != CELER_OK) {
            js->metrics.step_failures_total++;
            /* a lost device: every later step fails the same way; say it once */
            if (s != CELER_STATUS_DEVICE_LOST || !atomic_load(&js->lost))
                fprintf(stderr, "celer serve: a model step failed (%s): %s\n", celer_status_str(s),
                        why);
            if (s == CELER_STATUS_DEVICE_LOST && !atomic_load(&js->lost)) {
                snprintf(js->lost_msg, sizeof js->lost_msg, "%s", why);
                atomic_store(&js->lost, true);
            }
        }
        publish(js);
        pthread_mutex_unlock(&js->list_mu);
        pthread_mutex_lock(&js->mu);
    }
    pthread_mutex_unlock(&js->mu);
    return NULL;
}

/* ==== Lifetime ==== */

jobs *jobs_create(celer_model *model, const celer_tokenizer *tok, const celer_engine_params *params,
                  char *err, size_t err_size) {
    jobs *js = calloc(1, sizeof *js);
    if (!js) {
        snprintf(err, err_size, "out of memory");
        return NULL;
    }
    js->model = model;
    metrics_init(&js->metrics);
    pthread_mutex_init(&js->mu, NULL);
    pthread_mutex_init(&js->list_mu, NULL);
    pthread_cond_init(&js->work, NULL);
    pthread_cond_init(&js->turn, NULL);
    if (celer_engine_create(model, tok, params, &js->eng, err, err_size) != CELER_OK) goto fail;
    /* The engine thread never takes the process's signals: the main thread waits for them. */
    sigset_t block, old;
    sigfillset(&block);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    const int rc = pthread_create(&js->thread, NULL, engine_main, js);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        snprintf(err, err_size, "cannot start the engine thread: %s", strerror(rc));
        goto fail;
    }
    js->started = true;
    return js;
fail:
    jobs_destroy(js);
    return NULL;
}

void jobs_destroy(jobs *js) {
    if (!js) return;
    if (js->started) {
        jobs_lock(js);
        js->quit = true;
        pthread_cond_broadcast(&js->work);
        jobs_unlock(js);
        pthread_join(js->thread, NULL);
    }
    while (js->list) job_release(js, js->list);
    celer_engine_destroy(js->eng);
    pthread_cond_destroy(&js->turn);
    pthread_cond_destroy(&js->work);
    pthread_mutex_destroy(&js->list_mu);
    pthread_mutex_destroy(&js->mu);
    free(js);
}

/* ==== Jobs ==== */

static void job_free(job *j) {
    job_pieces_free(j->step_head);
    job_pieces_free(j->head);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j->t_last);
    free(j);
}

celer_status jobs_submit(jobs *js, const celer_request_params *rp, int32_t stop_id, job **out,
                         char *err, size_t err_size) {
    *out = NULL;
    job *j = calloc(1, sizeof *j);
    if (j) j->t_last = calloc(rp->n > 0 ? (size_t)rp->n : 1, sizeof *j->t_last);
    if (!j || !j->t_last) {
        if (j) free(j);
        snprintf(err, err_size, "out of memory");
        return CELER_STATUS_OUT_OF_MEMORY;
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->n_choices = j->n_open = rp->n;
    j->stop_id = stop_id;
    j->ignore_eos = rp->ignore_eos;
    j->want_logprobs = rp->top_logprobs >= 0;
    celer_request_params p = *rp;
    if (stop_id >= 0) p.stop_ids = &j->stop_id, p.n_stop_ids = 1;
    jobs_lock(js);
    j->t_submit = now_s();
    const celer_status s = celer_engine_submit(js->eng, &p, &j->id, err, err_size);
    if (s == CELER_OK) {
        pthread_mutex_lock(&js->list_mu);
        j->next = js->list;
        js->list = j;
        js->n_active++;
        pthread_mutex_unlock(&js->list_mu);
        pthread_cond_signal(&js->work);
    }
    jobs_unlock(js);
    if (s != CELER_OK) {
        job_free(j);
        return s;
    }
    *out = j;
    return CELER_OK;
}

job_piece *job_wait(job *j, int timeout_ms, bool *done) {
    pthread_mutex_lock(&j->mu);
    if (!j->head && !j->finished) {
        const struct timespec ts = deadline_ms(timeout_ms);
        int rc = 0;
        while (!j->head && !j->finished && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    }
    job_piece *p = j->head;
    j->head = j->tail = NULL;
    *done = j->finished;
    pthread_mutex_unlock(&j->mu);
    return p;
}

void job_release(jobs *js, job *j) {
    if (!j) return;
    jobs_lock(js);
    pthread_mutex_lock(&js->list_mu);
    if (j->n_open > 0) celer_engine_cancel(js->eng, j->id); /* its blocks go back now */
    for (job **link = &js->list; *link; link = &(*link)->next)
        if (*link == j) {
            *link = j->next;
            js->n_active--;
            break;
        }
    pthread_mutex_unlock(&js->list_mu);
    jobs_unlock(js);
    job_free(j);
}

void jobs_cancel_all(jobs *js) {
    jobs_lock(js);
    pthread_mutex_lock(&js->list_mu);
    for (job *j = js->list; j; j = j->next)
        if (j->n_open > 0) celer_engine_cancel(js->eng, j->id);
    pthread_mutex_unlock(&js->list_mu);
    pthread_cond_signal(&js->work);
    jobs_unlock(js);
}

const char *jobs_lost(jobs *js) {
    return atomic_load(&js->lost) ? js->lost_msg : NULL;
}

char *jobs_metrics(jobs *js) {
    jobs_lock(js);
    const celer_engine_stats st = celer_engine_get_stats(js->eng);
    jobs_unlock(js);
    pthread_mutex_lock(&js->list_mu);
    char *text = metrics_format(&js->metrics, &st);
    pthread_mutex_unlock(&js->list_mu);
    return text;
}

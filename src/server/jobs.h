/*
 * jobs.h - the server's engine: one thread that runs celer_engine_step while anything is
 * pending, behind one lock that also serializes every submission and cancellation, and
 * the jobs (submitted requests) whose events it routes to the HTTP threads waiting on
 * them.
 *
 * An HTTP thread submits a job, then drains its pieces (what each event released) with
 * job_wait until the job is done, and finally releases it. Releasing a job that has not
 * finished cancels its request, so its KV blocks go back at once. Nothing here knows
 * HTTP or JSON; the pieces carry token ids, and the caller turns them into text.
 */
#ifndef CELER_SERVER_JOBS_H
#define CELER_SERVER_JOBS_H

#include "celer.h"
#include "server/metrics.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct jobs jobs;
typedef struct job job;

/* What one engine event released for one choice. */
typedef struct job_piece {
    int32_t index;
    int32_t token;  /* the sampled id, or -1 */
    bool is_output; /* token is part of the completion (not an ending stop id) */
    char *text;     /* released text (malloc'd, may be empty) */
    size_t len;
    float logprob; /* when the job asked for log-probabilities */
    int32_t n_top;
    int32_t top_ids[CELER_MAX_TOP_LOGPROBS];
    float top_logprobs[CELER_MAX_TOP_LOGPROBS];
    celer_finish_reason finish;                              /* NONE while the choice goes on */
    int64_t prompt_tokens, cached_tokens, completion_tokens; /* on the ending piece */
    char *error; /* the choice failed (finish CELER_FINISH_ERROR): why */
    struct job_piece *next;
} job_piece;

/* Starts the engine thread over an engine made with params. The model and tokenizer
 * must outlive the jobs. NULL on failure with err filled. */
jobs *jobs_create(celer_model *model, const celer_tokenizer *tok, const celer_engine_params *params,
                  char *err, size_t err_size);
/* Cancels whatever still runs, stops the thread, destroys the engine. Every job must have
 * been released. */
void jobs_destroy(jobs *js);

/* Submits a request. stop_id (>= 0) is one more id that ends a choice without being part
 * of it (the chat template's end-of-turn token). On failure returns the engine's status
 * (CELER_STATUS_INVALID_ARGUMENT, CELER_STATUS_BUSY, ...) with err filled. */
celer_status jobs_submit(jobs *js, const celer_request_params *rp, int32_t stop_id, job **out,
                         char *err, size_t err_size);

/* Waits up to timeout_ms for pieces and takes all that arrived, in order (a list the
 * caller frees with job_pieces_free; NULL if none). *done is set once every choice has
 * ended and no piece is left. */
job_piece *job_wait(job *j, int timeout_ms, bool *done);
void job_pieces_free(job_piece *p);

/* Unregisters j, cancelling its request if it is still running, and frees it. */
void job_release(jobs *js, job *j);

/* Ends every running job now (shutdown): each choice ends with CELER_FINISH_CANCELLED. */
void jobs_cancel_all(jobs *js);

/* Why the device is lost (a step answered CELER_STATUS_DEVICE_LOST: every later request
 * fails), or NULL while it works. Valid until jobs_destroy; no lock taken. */
const char *jobs_lost(jobs *js);

/* The /metrics text (malloc'd; the caller frees it), or NULL when out of memory. */
char *jobs_metrics(jobs *js);

#endif

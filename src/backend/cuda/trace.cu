/*
 * trace.cu - the host side of trace.h: in a build made with CELER_CUDA_TRACE, the record
 * buffer, and one step's records written to the file CELER_CUDA_TRACE names (the step
 * CELER_CUDA_TRACE_STEP, counted from 1 over the steps a backend ran; 64 where unset).
 * In every other build these calls do nothing.
 *
 * The file: "CELTRACE", then u32 version (1), tag count, record count and record size,
 * then each tag's name in 32 bytes (zero padded), then the records (cuda_trace_rec),
 * little-endian as the device wrote them.
 */
#include "backend/cuda/cuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CELER_CUDA_TRACE

extern "C" {
cudaError_t cuda_trace_bind_affine(cuda_trace_buf *b);
cudaError_t cuda_trace_bind_attention(cuda_trace_buf *b);
cudaError_t cuda_trace_bind_kernels(cuda_trace_buf *b);
cudaError_t cuda_trace_bind_qmat(cuda_trace_buf *b);
}

#define TRACE_CAPACITY (1u << 20) /* records: a decode step of an 8B model takes about 150k */

/* The buffer's header between traced steps: full, so blocks take no record. */
static const cuda_trace_buf trace_closed = {TRACE_CAPACITY, TRACE_CAPACITY, {0, 0}};

static struct {
    bool opened;
    const char *path;
    long target, steps;
    cuda_trace_buf *buf;
} trace;

#define CUDA_TRACE_NAME(tag, name) name,
static const char *const trace_names[CUDA_TRACE_NTAGS] = {CUDA_TRACE_TAGS(CUDA_TRACE_NAME)};
#undef CUDA_TRACE_NAME

void cuda_trace_open(void) {
    if (trace.opened) return;
    trace.opened = true;
    trace.path = getenv("CELER_CUDA_TRACE");
    if (!trace.path || !*trace.path) return;
    const char *step = getenv("CELER_CUDA_TRACE_STEP");
    trace.target = step && *step ? atol(step) : 64;
    if (!CUDA_CHECK(cudaMalloc(&trace.buf,
                               sizeof(cuda_trace_buf) + sizeof(cuda_trace_rec) * TRACE_CAPACITY))) {
        trace.buf = NULL;
        return;
    }
    CUDA_CHECK(cudaMemcpy(trace.buf, &trace_closed, sizeof trace_closed, cudaMemcpyHostToDevice));
    CUDA_CHECK(cuda_trace_bind_affine(trace.buf));
    CUDA_CHECK(cuda_trace_bind_attention(trace.buf));
    CUDA_CHECK(cuda_trace_bind_kernels(trace.buf));
    CUDA_CHECK(cuda_trace_bind_qmat(trace.buf));
}

void cuda_trace_begin(cudaStream_t s) {
    if (trace.buf && trace.steps + 1 == trace.target)
        CUDA_CHECK(cudaMemsetAsync(&trace.buf->next, 0, sizeof(unsigned), s));
}

static void trace_write(const cuda_trace_buf *head, const cuda_trace_rec *recs) {
    FILE *f = fopen(trace.path, "wb");
    if (!f) {
        fprintf(stderr, "celer: trace: cannot write %s\n", trace.path);
        return;
    }
    const unsigned n = head->next < head->capacity ? head->next : head->capacity;
    const uint32_t h[4] = {1, CUDA_TRACE_NTAGS, n, (uint32_t)sizeof(cuda_trace_rec)};
    fwrite("CELTRACE", 1, 8, f);
    fwrite(h, sizeof h, 1, f);
    for (int t = 0; t < CUDA_TRACE_NTAGS; t++) {
        char name[32] = {0};
        strncpy(name, trace_names[t], sizeof name - 1);
        fwrite(name, 1, sizeof name, f);
    }
    fwrite(recs, sizeof *recs, n, f);
    const bool ok = !ferror(f);
    if (fclose(f) != 0 || !ok)
        fprintf(stderr, "celer: trace: writing %s failed\n", trace.path);
    else
        fprintf(stderr, "celer: trace of step %ld: %u block records in %s%s\n", trace.target, n,
                trace.path,
                head->next > head->capacity ? " (the buffer was full: later blocks missing)" : "");
}

void cuda_trace_end(cudaStream_t s) {
    if (!trace.buf || ++trace.steps != trace.target) return;
    CUDA_CHECK(cudaStreamSynchronize(s));
    cuda_trace_buf head;
    CUDA_CHECK(cudaMemcpy(&head, trace.buf, sizeof head, cudaMemcpyDeviceToHost));
    const unsigned n = head.next < head.capacity ? head.next : head.capacity;
    cuda_trace_rec *recs = (cuda_trace_rec *)malloc(sizeof *recs * (n ? n : 1));
    CELER_ASSERT(recs);
    CUDA_CHECK(cudaMemcpy(recs, trace.buf + 1, sizeof *recs * n, cudaMemcpyDeviceToHost));
    trace_write(&head, recs);
    free(recs);
    CUDA_CHECK(cudaMemcpy(trace.buf, &trace_closed, sizeof trace_closed, cudaMemcpyHostToDevice));
}

#endif

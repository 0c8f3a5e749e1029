/*
 * harness.h - a minimal test harness: CHECK counts passes and failures, each test
 * program ends with harness_done, whose last line "NAME: N passed, M failed" the runner
 * (tests/run.sh) adds up. Also small fixture helpers shared by the tests.
 */
#ifndef CELER_TESTS_HARNESS_H
#define CELER_TESTS_HARNESS_H

#include "celer.h"

#include <stdbool.h>
#include <stdint.h>

bool check_(bool ok, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define CHECK(cond, ...) check_((cond), __FILE__, __LINE__, __VA_ARGS__)

/* Prints the summary line; returns the exit status (0 when nothing failed). */
int harness_done(const char *name);

/* The fixture root: $CELER_FIXTURES or tests/fixtures. */
const char *fixture_root(void);
/* "<root>/<name>" in a static buffer. */
const char *fixture_path(const char *name);

/* Names of the fixtures with golden.json under fixture_root(), sorted, into names[cap]
 * (each malloc'd; free them); returns how many. */
int fixture_names(char **names, int cap);
/* A fixture's model: dir/model.gguf when it exists, else dir (a checkpoint directory).
 * Static buffer. */
const char *fixture_model_path(const char *dir);

/* The default model's GGUF: $CELER_REAL_MODEL, else in ${CELER_CACHE_DIR:-~/.cache/celer}
 * (where tools/fetch_model.sh puts it). Static buffer. */
const char *real_model_path(void);

/* Reads a float32 2-D .npy file (malloc'd); NULL on any problem. */
float *npy_read_f32(const char *path, int64_t *rows, int64_t *cols);

/* Reads golden.json of a fixture: input ids and greedy ids (malloc'd). 0 on success. */
int golden_read(const char *dir, int32_t **input, int64_t *n_input, int32_t **greedy,
                int64_t *n_greedy);

/* Runs a shell command, its stdout into out[cap] (NUL-terminated); returns the exit
 * status, or 128 when it died by a signal. */
int run_capture(const char *cmd, char *out, size_t cap);

/* max |a - b| and max |b| over n floats. */
double max_abs_diff(const float *a, const float *b, int64_t n);
double max_abs(const float *a, int64_t n);

/* Deterministic pseudo-random numbers (xorshift), uniform in [-1, 1). */
float rand_uniform(uint64_t *state);

#endif

/*
 * harness.h - a minimal test harness: CHECK counts passes and failures, SKIP and
 * SKIP_REQUIRED count checks that could not run, and each test program ends with
 * harness_done, whose last line "NAME: N passed, M failed, K skipped" the runner
 * (tests/run.sh) adds up. Also small fixture and tokenizer helpers shared by the tests.
 * It does not find or fetch anything outside the repository except the default model
 * (real_model_path), Gemma 3 270M (real_gemma3_path) and an explicit $CELER_SHARED or
 * $CELER_FIXTURES override.
 */
#ifndef CELER_TESTS_HARNESS_H
#define CELER_TESTS_HARNESS_H

#include "celer.h"

#include <stdbool.h>
#include <stdint.h>

bool check_(bool ok, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define CHECK(cond, ...) check_((cond), __FILE__, __LINE__, __VA_ARGS__)

/* Records checks that could not run and prints "SKIP file:line: reason". SKIP is for
 * something legitimately absent (an instruction set this CPU lacks, a sanitizer build);
 * SKIP_REQUIRED for what CI must provide (the real model, tokenizers, goldens): when
 * $CI is "true" it is a failure ("FAIL file:line: required under CI: reason"). */
void skip_(bool required, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define SKIP(...)          skip_(false, __FILE__, __LINE__, __VA_ARGS__)
#define SKIP_REQUIRED(...) skip_(true, __FILE__, __LINE__, __VA_ARGS__)

/* Prints the summary line; returns the exit status (0 when nothing failed). */
int harness_done(const char *name);

/* The device the model tests also run on besides the CPU: $CELER_TEST_DEVICE ("cuda",
 * "cuda:1", set by make test-cuda), or NULL. */
const char *harness_device(void);

/* The parameters the model tests make contexts with: n_ctx positions for each of n_seq
 * sequences on device (NULL: the default), two threads, the rest as default. */
celer_context_params harness_context_params(int64_t n_ctx, int32_t n_seq, const char *device);

/* The fixture root: $CELER_FIXTURES or tests/fixtures. */
const char *fixture_root(void);
/* "<root>/<name>" in a static buffer. */
const char *fixture_path(const char *name);

/* Names of every text checkpoint fixture under fixture_root() (each subdirectory not
 * starting with '.' or '_' that holds config.json or model.gguf, and no
 * preprocessor_config.json), sorted, into names[cap] (each malloc'd; free them); returns
 * how many. A fixture without its goldens is listed too: the tests must fail on it. */
int fixture_names(char **names, int cap);
/* The same for the vision-language fixtures (those with preprocessor_config.json). */
int vlm_fixture_names(char **names, int cap);
/* A fixture's model: dir/model.gguf when it exists, or the first part of a split GGUF
 * (dir/model-00001-of-NNNNN.gguf), else dir (a checkpoint directory). Static buffer. */
const char *fixture_model_path(const char *dir);

/* The default model's GGUF: $CELER_REAL_MODEL, else in ${CELER_CACHE_DIR:-~/.cache/celer}
 * (where tools/fetch_model.sh puts it). Static buffer. */
const char *real_model_path(void);
/* Gemma 3 270M in Q4_K_M (tools/fetch_model.sh gemma3 fetches it): $CELER_GEMMA3_MODEL,
 * else gemma-3-270m-q4_k_m.gguf in $CELER_CACHE_DIR or ~/.cache/celer. */
const char *real_gemma3_path(void);

/* The directory of a real tokenizer (llama2, llama3_1, qwen3) holding tokenizer.json and
 * tokenizer_config.json: $CELER_SHARED/tokenizers/<name> when $CELER_SHARED is set, else
 * build/tokenizers/<name>, decompressed (xz -dc) from the .xz files of
 * tests/tokenizers/<name> on first use and whenever one of those is newer. true with the directory
 * in out[cap]; false with the reason in out[cap]. */
bool tokenizer_dir(const char *name, char *out, size_t cap);

/* A whole file as a NUL-terminated string (malloc'd); NULL when it cannot be read. */
char *read_text_file(const char *path);

/* The chat template a golden file of tests/templates names (malloc'd): "shared:<name>" is
 * the chat template of a real tokenizer (tokenizer_dir), anything else a file of
 * tests/templates. NULL when missing; when the real tokenizer itself is unavailable, the
 * reason is in why[4096]. */
char *golden_template_source(const char *src, char *why);

/* Reads a float32 2-D .npy file (malloc'd); NULL on any problem. */
float *npy_read_f32(const char *path, int64_t *rows, int64_t *cols);

/* Reads golden.json of a fixture: input ids and greedy ids (malloc'd). 0 on success. */
int golden_read(const char *dir, int32_t **input, int64_t *n_input, int32_t **greedy,
                int64_t *n_greedy);
/* The same of <name>.json (golden_short.json: a fixture's second prompt). */
int golden_read_named(const char *dir, const char *name, int32_t **input, int64_t *n_input,
                      int32_t **greedy, int64_t *n_greedy);

/* Runs a shell command, its stdout into out[cap] (NUL-terminated); returns the exit
 * status, or 128 when it died by a signal. */
int run_capture(const char *cmd, char *out, size_t cap);

/* max |a - b| and max |b| over n floats. */
double max_abs_diff(const float *a, const float *b, int64_t n);
double max_abs(const float *a, int64_t n);

/* Deterministic pseudo-random numbers (xorshift), uniform in [-1, 1). */
float rand_uniform(uint64_t *state);

#endif

/*
 * hf_download.h - models by name from the Hugging Face Hub (libcurl) into the Hugging Face
 * cache, written as huggingface_hub writes it, so that each reads what the other fetched
 * (hf_cache.h reads it). The public entry point is celer_model_pull (celer.h).
 *
 * Environment, as huggingface_hub reads it: HF_ENDPOINT (default https://huggingface.co),
 * HF_TOKEN (else the token file: $HF_TOKEN_PATH, $HF_HOME/token, ~/.cache/huggingface/token),
 * HF_HUB_OFFLINE=1 (no network at all), HF_HUB_DOWNLOAD_TIMEOUT (seconds a transfer may stall,
 * default 30), and the cache's HF_HUB_CACHE / HF_HOME.
 */
#ifndef CELER_IO_HF_DOWNLOAD_H
#define CELER_IO_HF_DOWNLOAD_H

#include "base/error.h"

#include <stdbool.h>

/* Whether HF_HUB_OFFLINE is on ("1", "ON", "YES" or "TRUE", any case). */
bool hf_offline(void);

/* Downloads into the cache the files name (ORG/NAME[:QUANT][@REV]) needs (hf_repo_select)
 * at the commit the revision names, then writes refs/<REV>. Files whose blob is there
 * already are not fetched again. progress (may be NULL) hears of each file. One line in e on
 * failure; nothing half-written is ever a blob or a snapshot link. In offline mode it
 * fails at once, touching nothing. */
celer_status hf_download(const char *name, celer_pull_progress progress, void *user,
                         celer_error *e);

#endif

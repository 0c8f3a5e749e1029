/*
 * hf_cache.h - models by name: ORG/NAME and ORG/NAME:QUANT looked up in the Hugging Face
 * hub cache as huggingface_hub writes it (models--ORG--NAME/refs/main holds the commit,
 * snapshots/<commit>/<path> link into blobs/), and the listing behind `celer ls`.
 * The public entry points are celer_model_resolve and celer_hf_cache_list (celer.h).
 * It reads the cache only: it never writes there and never touches the network.
 */
#ifndef CELER_IO_HF_CACHE_H
#define CELER_IO_HF_CACHE_H

#include "base/error.h"

#include <stdbool.h>
#include <stddef.h>

/* The cache root into out[cap]: $HF_HUB_CACHE, else $HF_HOME/hub, else
 * $HOME/.cache/huggingface/hub. */
void hf_cache_root(char *out, size_t cap);

/* Whether s reads as a model name ORG/NAME[:QUANT] (one slash, both parts non-empty of
 * [A-Za-z0-9._-], not "." or ".."); if so the repo ("ORG/NAME") and the quant tag ("" when
 * absent) go into repo[repo_cap] and quant[quant_cap]. */
bool hf_name_parse(const char *s, char *repo, size_t repo_cap, char *quant, size_t quant_cap);

/* The quant tag of a GGUF file name, upper-case ("Llama-3-Q4_K_M-00001-of-00002.gguf" ->
 * "Q4_K_M", "model.f16.gguf" -> "F16"), or "" when the name carries none. */
void hf_gguf_tag(const char *file, char *tag, size_t cap);

/* name -> a path celer_model_open takes: name itself when it exists on disk (or is no
 * model name), else the GGUF file or checkpoint directory of the cached repo. */
celer_status hf_cache_resolve(const char *name, char *path, size_t cap, celer_error *e);

#endif

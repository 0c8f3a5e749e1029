/*
 * hf_cache.h - models by name: ORG/NAME[:QUANT][@REV] looked up in the Hugging Face hub
 * cache as huggingface_hub writes it (models--ORG--NAME/refs/<revision> holds the commit,
 * snapshots/<commit>/<path> link into blobs/), and the listing behind `celer ls`.
 * The public entry points are celer_model_resolve and celer_hf_cache_list (celer.h).
 * It reads the cache only: it never writes there and never touches the network (the
 * downloader, hf_download.h, fills it and shares the name grammar and GGUF choice here).
 */
#ifndef CELER_IO_HF_CACHE_H
#define CELER_IO_HF_CACHE_H

#include "base/error.h"

#include <stdbool.h>
#include <stddef.h>

/* The cache root into out[cap]: $HF_HUB_CACHE, else $HF_HOME/hub, else
 * $HOME/.cache/huggingface/hub. */
void hf_cache_root(char *out, size_t cap);

#define HF_TAG 32  /* a quant tag's buffer */
#define HF_REV 256 /* a revision's buffer */

/* Whether s reads as a model name ORG/NAME[:QUANT][@REV] (one slash, both parts non-empty of
 * [A-Za-z0-9._-], not "." or ".."; REV is such parts joined by '/', "refs/pr/1"); if so the
 * repo ("ORG/NAME"), the quant tag ("" when absent) and the revision ("main" when absent) go
 * into repo[repo_cap], quant[quant_cap] and rev[rev_cap]. With rev NULL a name with @REV is
 * no name. */
bool hf_name_parse(const char *s, char *repo, size_t repo_cap, char *quant, size_t quant_cap,
                   char *rev, size_t rev_cap);

/* "<root>/models--ORG--NAME" of repo "ORG/NAME" into out[cap]; false when it does not fit. */
bool hf_repo_dir(const char *root, const char *repo, char *out, size_t cap);

/* The quant tag of a GGUF file name, upper-case ("Llama-3-Q4_K_M-00001-of-00002.gguf" ->
 * "Q4_K_M", "model.f16.gguf" -> "F16"), or "" when the name carries none. */
void hf_gguf_tag(const char *file, char *tag, size_t cap);

/* ==== Choosing a GGUF file ==== */

/* Whether name ends in "-NNNNN-of-MMMMM.gguf" (a part of a split GGUF); if so its part
 * number and the count of parts into *part and *count. */
bool hf_gguf_shard(const char *name, int *part, int *count);

/* A GGUF file of a repository: its path below the snapshot and its quant tag. */
typedef struct hf_gguf_file {
    char rel[512];
    char tag[HF_TAG];
} hf_gguf_file;

/* Whether a GGUF file name is one the model may be: not a projector (mmproj), not a later
 * shard of a split ("-00002-of-00003.gguf"). */
bool hf_gguf_is_model(const char *name);

/* qsort order of hf_gguf_file by rel. */
int hf_gguf_cmp(const void *a, const void *b);

/* The index into g[n] (model files, sorted by rel) that quant names into *pick: the file
 * whose tag is quant (case-insensitive), else the one whose path holds it; without a quant
 * Q4_K_M, else the only file. One line in e when none or several match. */
celer_status hf_gguf_choose(const hf_gguf_file *g, int n, const char *repo, const char *quant,
                            int *pick, celer_error *e);

/* ==== Resolving ==== */

/* name -> a path celer_model_open takes: name itself when it exists on disk (or is no
 * model name), else the GGUF file or checkpoint directory of the cached repo. */
celer_status hf_cache_resolve(const char *name, char *path, size_t cap, celer_error *e);

/* The same for a model name only (a local path of that name does not count): the file or
 * directory name picks in the cache, or NOT_FOUND with one line naming the cache. */
celer_status hf_cache_find(const char *name, char *path, size_t cap, celer_error *e);

#endif

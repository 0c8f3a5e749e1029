/*
 * hf_repo.h - what the Hugging Face Hub says about a repository, checked before anything is
 * written: its model-info answer (GET /api/models/ORG/NAME/revision/REV: the commit, "sha",
 * and the file list, "siblings") parsed into a plain struct, and the choice of the files a
 * model needs from that list. Pure: no network and no files; the bytes come from the
 * downloader (hf_download.c) or from the fuzz target (tests/fuzz/fuzz_hf_repo.c).
 *
 * Server input is untrusted: a file list that is not the JSON expected, a size out of range,
 * a path that is absolute, climbs with "..", or holds a backslash or a control character is
 * refused with one line, so no later step builds a path from it.
 */
#ifndef CELER_IO_HF_REPO_H
#define CELER_IO_HF_REPO_H

#include "base/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HF_MAX_FILE_BYTES ((int64_t)1 << 40) /* 1 TiB: a larger size is bad server input */
#define HF_MAX_FILES      100000             /* files of one repository */
#define HF_MAX_LISTING    (64 << 20)         /* bytes of a model-info answer */
#define HF_MAX_REL        511                /* bytes of a path in the repository */

typedef struct hf_file {
    char *path;      /* "rfilename": relative, '/'-separated, hf_path_ok */
    int64_t size;    /* bytes; -1 when the list gives none */
    char sha256[65]; /* the LFS object's sha256, lower-case hex; "" for a file kept in git */
} hf_file;

typedef struct hf_repo_info {
    char commit[41]; /* the revision's commit: 40 lower-case hex digits */
    hf_file *files;  /* n_files of them, malloc'd: hf_repo_info_free */
    int n_files;
} hf_repo_info;

/* Parses the model-info answer json[len] (not NUL-terminated) of repo into *info; on error
 * *info holds nothing to free and e one line (repo named, server text made printable). */
celer_status hf_repo_info_parse(const char *json, size_t len, const char *repo, hf_repo_info *info,
                                celer_error *e);
void hf_repo_info_free(hf_repo_info *info);

/* Whether path may name a file below a snapshot: 1 to HF_MAX_REL bytes, relative, parts
 * separated by single '/', no part "." or "..", no backslash, no control character. */
bool hf_path_ok(const char *path);

/* The files of info a model needs, as indices into info->files into *idx (malloc'd, the
 * caller frees it) and *n:
 *   - a repository with GGUF files: the one quant picks (hf_gguf_choose: QUANT, else
 *     Q4_K_M, else the only one), with every part of a split ("-00001-of-00003.gguf"); a
 *     projector (mmproj) never;
 *   - else a checkpoint (config.json at the top): the top-level config.json, *.safetensors,
 *     *.json (index, tokenizer, generation_config), *.jinja, tokenizer.model, merges.txt and
 *     vocab.txt; never other weights (.bin, .pt, .msgpack, .h5, ...).
 * NOT_FOUND when nothing there is a model celer opens, or the quant is absent. */
celer_status hf_repo_select(const hf_repo_info *info, const char *repo, const char *quant,
                            int **idx, int *n, celer_error *e);

/* s made safe to quote in a one-line message: at most cap-1 bytes, control characters and
 * bytes past ASCII as '?'. */
void hf_printable(const char *s, size_t len, char *out, size_t cap);

#endif

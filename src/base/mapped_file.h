/*
 * mapped_file.h - read-only memory maps of whole files.
 *
 * The map is PROT_READ: weights are never written through it (docs/architecture.md, "Weights and families").
 */
#ifndef CELER_BASE_MAPPED_FILE_H
#define CELER_BASE_MAPPED_FILE_H

#include "base/error.h"

#include <stddef.h>
#include <stdint.h>

typedef struct mapped_file {
    const uint8_t *data; /* NULL for an empty file */
    size_t size;
} mapped_file;

/* Maps path read-only. On failure *out is zeroed and e names the path and the reason. */
celer_status mapped_file_open(const char *path, mapped_file *out, celer_error *e);
void mapped_file_close(mapped_file *f);
/* Drops the map's resident pages (MADV_DONTNEED): the map stays valid and later reads
 * fault pages back in from the file. For data that was copied or repacked elsewhere. */
void mapped_file_release(const mapped_file *f);
/* The same for the whole pages inside [p, p + n), when that range lies in f's map. */
void mapped_file_release_range(const mapped_file *f, const void *p, size_t n);

#endif

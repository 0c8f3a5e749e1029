/*
 * mapped_file.c - mmap(2) a file read-only; empty files map to {NULL, 0}.
 */
#define _DEFAULT_SOURCE
#include "base/mapped_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

celer_status mapped_file_open(const char *path, mapped_file *out, celer_error *e) {
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return error_set(e, CELER_STATUS_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return error_set(e, CELER_STATUS_IO, "%s: cannot stat: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return error_set(e, CELER_STATUS_IO, "%s: not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            close(fd);
            return error_set(e, CELER_STATUS_IO, "%s: cannot mmap: %s", path, strerror(err));
        }
        out->data = p;
        out->size = (size_t)st.st_size;
    }
    close(fd);
    return CELER_OK;
}

void mapped_file_close(mapped_file *f) {
    if (f->data) munmap((void *)f->data, f->size);
    f->data = NULL;
    f->size = 0;
}

void mapped_file_release(const mapped_file *f) {
    if (f->data) madvise((void *)f->data, f->size, MADV_DONTNEED);
}

void mapped_file_release_range(const mapped_file *f, const void *p, size_t n) {
    const uintptr_t lo = (uintptr_t)p, base = (uintptr_t)f->data;
    if (!f->data || lo < base || lo - base > f->size || n > f->size - (lo - base)) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = (lo + page - 1) / page * page, b = (lo + n) / page * page;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

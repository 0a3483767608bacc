/* Read-only memory-mapped files (model weights are never copied). */
#ifndef TS_BASE_MMAPFILE_H
#define TS_BASE_MMAPFILE_H

#include <stddef.h>
#include <stdio.h>

#include "base/status.h"

typedef struct {
    const unsigned char *data; /* NULL for an empty file */
    size_t size;
} ts_mmap;

/* Maps path read-only. On error names the file and the reason. */
ts_status ts_mmap_open(const char *path, ts_mmap *out);
void ts_mmap_close(ts_mmap *m);

/* Reads a whole (small) file into a malloc'd, NUL-terminated buffer; refuses files over cap. */
ts_status ts_read_file(const char *path, size_t cap, char **out, size_t *len);

/* Finishes a file written under a temporary name: flushes, fsyncs and closes f, then renames
 * tmp to path. On any failure tmp is removed and the error names it. f is closed either way. */
ts_status ts_file_commit(FILE *f, const char *tmp, const char *path);

#endif

/* Read-only model files in memory: big ones read into huge pages, the rest mapped. */
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

/* A hint that the whole pages of [p, p + n), inside a file opened by ts_mmap_open, will seldom
 * be read again (a backend keeps its own copy of those weights): their memory is given back and
 * what is read there later comes from the file, page by page, with the same bytes. A mapping
 * drops its 4 KiB pages at once; a big file's huge-page copy maps a 2 MiB page from the file again
 * once the ranges asked for cover all of it but 64 KiB (mmapfile.c says why). Returns the bytes
 * given back by this call; 0 for memory that ts_mmap_open did not make. Thread-safe. As with any
 * mapped model, the file must not be rewritten in place while it is open (replace it by a rename).
 */
size_t ts_mmap_release(const void *p, size_t n);

/* For tests and reports: this process's resident memory (VmRSS), in bytes; 0 if unknown. */
size_t ts_rss_bytes(void);

/* Reads a whole (small) file into a malloc'd, NUL-terminated buffer; refuses files over cap. */
ts_status ts_read_file(const char *path, size_t cap, char **out, size_t *len);

/* Finishes a file written under a temporary name: flushes, fsyncs and closes f, then renames
 * tmp to path. On any failure tmp is removed and the error names it. f is closed either way. */
ts_status ts_file_commit(FILE *f, const char *tmp, const char *path);

#endif

#include "base/mmapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

ts_status ts_mmap_open(const char *path, ts_mmap *out) {
    out->data = NULL;
    out->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ts_error(TS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ts_error(TS_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ts_error(TS_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return ts_error(TS_ERR_IO, "%s: cannot mmap: %s", path, strerror(e));
        }
        out->data = p;
        out->size = (size_t)st.st_size;
    }
    close(fd);
    return TS_OK;
}

void ts_mmap_close(ts_mmap *m) {
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

ts_status ts_read_file(const char *path, size_t cap, char **out, size_t *len) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return ts_error(TS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t n = 0, alloc = 4096;
    char *buf = malloc(alloc + 1);
    if (!buf) {
        fclose(f);
        return ts_error(TS_ERR_NOMEM, "%s: out of memory", path);
    }
    for (;;) {
        if (n == alloc) {
            if (alloc >= cap) {
                free(buf);
                fclose(f);
                return ts_error(TS_ERR_FORMAT, "%s: file larger than the %zu-byte limit", path,
                                cap);
            }
            alloc = alloc * 2 > cap ? cap : alloc * 2;
            char *nb = realloc(buf, alloc + 1);
            if (!nb) {
                free(buf);
                fclose(f);
                return ts_error(TS_ERR_NOMEM, "%s: out of memory", path);
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, alloc - n, f);
        n += r;
        if (r == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return ts_error(TS_ERR_IO, "%s: read error", path);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return TS_OK;
}

#include "base/mmapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Big files (weights) are read into anonymous memory backed by transparent huge pages when the
 * kernel allows it: decode streams every weight once per token, and with 4 KiB pages of a
 * file mapping the CPU reads them markedly slower (TLB misses; measured ~17 vs ~25 GB/s on one
 * core). The copy is made read-only afterwards. MAP_FAILED when it cannot be done, so the
 * caller falls back to a plain file mapping. TESSERA_NO_HUGEPAGES=1 keeps the mapping. */
#define TS_MMAP_COPY_MIN ((size_t)64 << 20)

static void *read_into_huge_pages(int fd, size_t size) {
#if defined(MADV_HUGEPAGE)
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return MAP_FAILED;
    if (madvise(p, size, MADV_HUGEPAGE) != 0) {
        munmap(p, size);
        return MAP_FAILED;
    }
    for (size_t off = 0; off < size;) {
        ssize_t r = pread(fd, (char *)p + off, size - off > (1u << 30) ? (1u << 30) : size - off,
                          (off_t)off);
        if (r <= 0) {
            munmap(p, size);
            return MAP_FAILED;
        }
        off += (size_t)r;
    }
    mprotect(p, size, PROT_READ);
    return p;
#else
    (void)fd;
    (void)size;
    return MAP_FAILED;
#endif
}

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
        void *p = MAP_FAILED;
        if ((size_t)st.st_size >= TS_MMAP_COPY_MIN && !getenv("TESSERA_NO_HUGEPAGES"))
            p = read_into_huge_pages(fd, (size_t)st.st_size);
        if (p == MAP_FAILED) p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
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

ts_status ts_file_commit(FILE *f, const char *tmp, const char *path) {
    int e = 0;
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) e = errno;
    if (fclose(f) != 0 && !e) e = errno;
    if (e) {
        unlink(tmp);
        return ts_error(TS_ERR_IO, "%s: write failed: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        e = errno;
        unlink(tmp);
        return ts_error(TS_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(e));
    }
    return TS_OK;
}

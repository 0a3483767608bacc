#include "base/mmapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
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

/* The files ts_mmap_open has open, so that ts_mmap_release can tell which memory is whose. A
 * huge-page copy keeps its file open (fd) to map pages from it again, and gives back whole 2 MiB
 * pages only: one split to give back part of it would leave the rest of its weights on 4 KiB pages,
 * which stream slower (the Gemma 3 270M GGUF, whose regrouped Q4_K and Q6_K weights lie between
 * Q5_0 and Q8_0 ones, decoded 3% slower so). A huge page goes back once the ranges asked for cover
 * all of it but at most MM_GAP bytes: what lies between a model's regrouped weights is mostly
 * their norms and other small tensors, read from the file again page by page. A mapping needs
 * none of this: its 4 KiB pages are dropped as asked. */
#define MM_HUGE ((uintptr_t)2 << 20)
#define MM_GAP  ((size_t)64 << 10)

typedef struct {
    const unsigned char *base;
    size_t size;
    int fd;         /* -1: a file mapping */
    uint8_t *asked; /* copy: a bit a 4 KiB page, set once a release covered it */
    uint8_t *gone;  /* copy: a byte a huge page (from base rounded down), 1 once given back (or
                     * made anew after a failed remap: not tried again) */
} mm_open;

static pthread_mutex_t mm_lock = PTHREAD_MUTEX_INITIALIZER;
static mm_open *mm_files;
static size_t mm_count, mm_cap;

static uintptr_t page_size(void) { return (uintptr_t)sysconf(_SC_PAGESIZE); }

static void mm_entry_free(mm_open *f) {
    if (f->fd >= 0) close(f->fd);
    free(f->asked);
    free(f->gone);
}

/* false: no memory to track the file (it then stays resident, as before: no harm) */
static bool mm_register(const unsigned char *base, size_t size, int fd) {
    mm_open f = {base, size, fd, NULL, NULL};
    if (fd >= 0) {
        const size_t pages = size / page_size() + 1;
        f.asked = calloc(pages / 8 + 1, 1);
        f.gone = calloc(size / MM_HUGE + 2, 1);
        if (!f.asked || !f.gone) {
            free(f.asked), free(f.gone);
            return false;
        }
    }
    pthread_mutex_lock(&mm_lock);
    bool ok = true;
    if (mm_count == mm_cap) {
        size_t cap = mm_cap ? 2 * mm_cap : 8;
        mm_open *g = realloc(mm_files, cap * sizeof *g);
        if (g)
            mm_files = g, mm_cap = cap;
        else
            ok = false;
    }
    if (ok) mm_files[mm_count++] = f;
    pthread_mutex_unlock(&mm_lock);
    if (!ok) free(f.asked), free(f.gone);
    return ok;
}

static void mm_unregister(const unsigned char *base) {
    pthread_mutex_lock(&mm_lock);
    for (size_t i = 0; i < mm_count; i++) {
        if (mm_files[i].base == base) {
            mm_entry_free(&mm_files[i]);
            mm_files[i] = mm_files[--mm_count];
            break;
        }
    }
    pthread_mutex_unlock(&mm_lock);
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
        bool copied = false;
        if ((size_t)st.st_size >= TS_MMAP_COPY_MIN && !getenv("TESSERA_NO_HUGEPAGES")) {
            p = read_into_huge_pages(fd, (size_t)st.st_size);
            copied = p != MAP_FAILED;
        }
        if (p == MAP_FAILED) p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return ts_error(TS_ERR_IO, "%s: cannot mmap: %s", path, strerror(e));
        }
        /* unregistered (no memory for the table), the file stays fully resident: no harm */
        if (mm_register(p, (size_t)st.st_size, copied ? fd : -1) && copied) fd = -1;
        out->data = p;
        out->size = (size_t)st.st_size;
    }
    if (fd >= 0) close(fd);
    return TS_OK;
}

void ts_mmap_close(ts_mmap *m) {
    if (m->data) {
        mm_unregister(m->data);
        munmap((void *)m->data, m->size);
    }
    m->data = NULL;
    m->size = 0;
}

/* The copy's pages [at, at + len) mapped from the file again. MAP_FIXED replaces them in one
 * step; should it fail after taking the old pages away (a kernel may), they are made anew and
 * read from the file, so that the range is never left unmapped. */
static bool remap_from_file(const mm_open *f, unsigned char *at, size_t len) {
    const off_t off = (off_t)(at - f->base);
    if (mmap(at, len, PROT_READ, MAP_PRIVATE | MAP_FIXED, f->fd, off) != MAP_FAILED) return true;
    if (mmap(at, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) ==
        MAP_FAILED) {
        fprintf(stderr, "tessera: fatal: model memory lost while giving pages back\n");
        abort();
    }
    for (size_t done = 0; done < len;) {
        ssize_t r = pread(f->fd, at + done, len - done, off + (off_t)done);
        if (r <= 0) {
            fprintf(stderr, "tessera: fatal: model file unreadable while giving pages back\n");
            abort();
        }
        done += (size_t)r;
    }
    mprotect(at, len, PROT_READ);
    return false;
}

/* The copy's pages that [lo, hi) (whole 4 KiB pages) completes: marked as asked for, then each
 * huge page it touches given back if all of it but MM_GAP bytes has been asked for. The huge
 * pages at the copy's ends, where it does not start or end on one, count as far as they reach. */
static size_t copy_release(mm_open *f, uintptr_t lo, uintptr_t hi) {
    const uintptr_t page = page_size(), b = (uintptr_t)f->base, end = b + f->size;
    for (uintptr_t a = lo; a < hi; a += page) {
        const size_t k = (a - b) / page;
        f->asked[k / 8] |= (uint8_t)(1u << (k % 8));
    }
    size_t given = 0;
    const uintptr_t h0 = b & ~(MM_HUGE - 1);
    for (uintptr_t h = lo & ~(MM_HUGE - 1); h < hi; h += MM_HUGE) {
        uint8_t *gone = &f->gone[(h - h0) / MM_HUGE];
        if (*gone) continue;
        /* u0 < u1: this huge page holds a page of [lo, hi), which lies inside the copy */
        const uintptr_t u0 = h < b ? b : h,
                        u1 = h + MM_HUGE > end ? end & ~(page - 1) : h + MM_HUGE;
        size_t missing = 0;
        for (uintptr_t a = u0; a < u1; a += page) {
            const size_t k = (a - b) / page;
            if (!(f->asked[k / 8] & (1u << (k % 8)))) missing += page;
        }
        if (missing > MM_GAP) continue;
        if (remap_from_file(f, (unsigned char *)u0, u1 - u0)) given += u1 - u0;
        *gone = 1;
    }
    return given;
}

size_t ts_mmap_release(const void *p, size_t n) {
    if (!p || n == 0) return 0;
    const uintptr_t page = page_size();
    const uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1);
    const uintptr_t hi = ((uintptr_t)p + n) & ~(page - 1);
    if (hi <= lo) return 0;
    size_t given = 0;
    pthread_mutex_lock(&mm_lock);
    for (size_t i = 0; i < mm_count; i++) {
        mm_open *f = &mm_files[i];
        const uintptr_t b = (uintptr_t)f->base;
        if (lo < b || hi > b + f->size) continue;
        if (f->fd >= 0)
            given = copy_release(f, lo, hi);
        else if (madvise((void *)lo, hi - lo, MADV_DONTNEED) == 0) /* clean pages of a file */
            given = hi - lo;
        break;
    }
    pthread_mutex_unlock(&mm_lock);
    return given;
}

size_t ts_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
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
